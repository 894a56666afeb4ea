#!/usr/bin/env python
"""The GPU check: decoding properties, training and translation speed of every mechanism on one CUDA GPU.

Usage: ``python tools/gpu_check.py [--part props|train|decode|all|...] [--cases PAPERS] [--device cuda|cpu]
[--tiny] [--out DIR] [--commit REV] ...`` (``--help`` lists every option; a part fits one 5-minute device call).

a. the decoding-property suite in fp32, fp16 and bf16 at once (pytest processes: fp32's console-script checks
   shared among several on a GPU);
b. training at Transformer-Base: the onmt-ext baseline and stock OpenNMT-py (ONMT_EXT_DISABLE=1) each in a
   fresh process on the users' data path, then the baseline, an A/A control and every mechanism, eager and
   then compiled (-ext_compile), in one process that trains each case in turn;
c. translation sentences/s, beam 4 and greedy, eager and compiled, interleaved with the baseline.
The stages run in the order a, b fresh, b eager, b compiled, c eager, c compiled, each before its deadline; a
line first says which rows will not fit, which are then reported "not run: budget".  ``--device cpu --tiny`` is
the CPU dry run.  The report (<out>/<device>[-<part>].md and .json): docs/gpu-check.md.  Exit status: 0 report
written; 1 written but a test or run failed; 2 nothing could run.
"""

import datetime
import gc
import itertools
import json
import math
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tarfile
import threading
import time
import traceback
import xml.etree.ElementTree as ElementTree
from collections import Counter
from itertools import islice
from pathlib import Path

import yaml

import common
import timed_runs
from common import fmt
from timed_runs import Case

REPO = Path(__file__).resolve().parent.parent
PROPERTY_TEST = "tests/integration/test_decoding_properties.py"
#: the fused routing kernels against their PyTorch reference, on the GPU (a process of section a, CUDA only)
KERNEL_TEST = "tests/unit/test_routing_kernels.py"

#: Section a: one smoke config per mechanism (relative to yaml_configs/smoke/), then every mechanism at once.
PROPERTY_CONFIGS = (
    "li2019/em_all_components.yaml",
    "cao2019/transformer_base_wmt17_zhen_cross_zero.yaml",
    "chen2019/transformer_base_nist_zhen_rpehead.yaml",
    "chen2019/transformer_base_nist_zhen_mprhead.yaml",
    "gret/transformer_base_wmt17_zhen_gret.yaml",
    "clause/transformer_base_wmt16_ende_ca_rule.yaml",
    "combined/all_mechanisms.yaml",
)
TINY_PROPERTY_CONFIGS = ("combined/all_mechanisms.yaml",)
#: autocast dtypes of section a (the suite's ONMT_EXT_TEST_AUTOCAST values)
PROPERTY_DTYPES = ("none", "fp16", "bf16")
TINY_PROPERTY_DTYPES = ("none", "bf16")

BASELINE = Case("baseline", "baseline/transformer_base_wmt17_zhen.yaml", pre_encoded=True)
#: Section b and c cases with the targets of issues 29 and 35: training and decoding ratios to the baseline.
#: Decoding targets apply to the encoder-side mechanisms (0.97) and to EM on all three components (0.80).
MECHANISMS = (
    Case("li2019 EM routing, enc-self [1-6]", "li2019/transformer_base_wmt17_zhen_em_enc_self.yaml",
         train_target=0.80, translate_target=0.97, paper_train=1.20 / 1.92, paper_translate=1.65 / 1.67,
         pre_encoded=True),
    Case("li2019 Effective Aggregation (EM, enc-self [1,2])",
         "li2019/transformer_base_wmt17_zhen_em_enc_self_layers_1-2.yaml",
         train_target=0.93, translate_target=0.97, paper_train=1.67 / 1.92, pre_encoded=True),
    Case("li2019 simple routing, enc-self [1-6]", "li2019/transformer_base_wmt17_zhen_simple_enc_self.yaml",
         train_target=0.80, translate_target=0.97, paper_train=1.23 / 1.92, paper_translate=1.66 / 1.67,
         pre_encoded=True),
    Case("li2019 EM routing on all three components", "li2019/transformer_base_wmt17_zhen_em_all.yaml",
         train_target=0.50, translate_target=0.80, pre_encoded=True),
    Case("cao2019 cross aggregation, enc [1-6]", "cao2019/transformer_base_wmt17_zhen_cross_zero.yaml",
         train_target=0.90, translate_target=0.97, pre_encoded=True),
    Case("chen2019 RPEHead (enc + dec)", "chen2019/transformer_base_nist_zhen_rpehead.yaml",
         train_target=0.93, paper_train=10.5 / 11.7, pre_encoded=True, compiles_by_default=True),
    Case("chen2019 MPRHead (enc + dec)", "chen2019/transformer_base_nist_zhen_mprhead.yaml",
         train_target=0.93, paper_train=9.9 / 11.7, pre_encoded=True, compiles_by_default=True),
    Case("clause attention, rule, pre-split", "clause/transformer_base_wmt16_ende_ca_rule.yaml",
         train_target=0.95, translate_target=0.97, pre_encoded=True),
    Case("GRET", "gret/transformer_base_wmt17_zhen_gret.yaml", train_target=0.95, translate_target=0.97,
         pre_encoded=True, compiles_by_default=True),
)
TINY_MECHANISMS = MECHANISMS
#: the dry run's training corpus: this many of the sample's lines, evenly spread over it (it is sorted by length),
#: since SentencePiece-encoding and clause-splitting all 21,977 took most of its preparation; repeated as varied
#: copies like the GPU run's
TINY_LINES = 2000
#: issue 35's targets for the baseline
BASELINE_TOKENS_TARGET = 100_000
BASELINE_BUSY_TARGET = 0.90
STOCK_SPEEDUP_TARGET = 3.0
SYNCS_TARGET = 0
FIRST_STEP_TARGET_S = 5.0
STARTUP_OVERHEAD_TARGET_S = 1.0
#: peak memory of EM routing over the baseline's: (case, at most)
MEMORY_TARGETS = ((MECHANISMS[0], 2.0), (MECHANISMS[3], 4.0))

#: per-section seconds on a GPU and in the CPU dry run (the whole GPU run fits in 8 minutes: 480 s).  The shares
#: follow the part times of the H100 run in results/gpu/README.md: the users'-path rows and every eager mechanism
#: first; compiled rows, whose compilation did not fit there, get only what the eager parts leave
BUDGETS = {"a": 85.0, "b": 275.0, "c": 120.0}
TINY_BUDGETS = {"a": 22.0, "b": 112.0, "c": 42.0}
#: the parts, in running order, with their shares of their section's budget on a GPU and in the dry run (where
#: starting data workers outweighs everything else); the compiled parts also get what the parts before left
PARTS = (("a", 1.0, 1.0), ("b fresh", 0.50, 0.45), ("b eager", 0.50, 0.27), ("b compiled", 0.0, 0.28),
         ("c eager", 0.85, 0.5), ("c compiled", 0.15, 0.5))
#: a new run is not started with less than this many seconds of its part's budget left
MIN_START_S = 3.0
#: the share of section b's budget that a training process may spend on operator tables after its last run: the
#: time its parts leave otherwise goes to the compiled parts after it (section c's included), and rows come first
TABLES_SHARE = 0.08
#: a child process gets this long after its deadline to write what it has before it is stopped
GRACE_S = 5.0
#: the share of a decoding group's time left that its timed runs are planned to fill (the rest absorbs noise)
PLAN_SHARE = 0.9


def _now():
    return time.monotonic()


#: ``--part``: the sections each part runs and its stages, each ``(stage, share of the section's budget on a GPU,
#: in the dry run, cumulative)``.  A stage ends at most its share after it starts; a cumulative one when every
#: share so far is spent, counted from the check's start, so it also gets what the stages before it left.  The
#: parts other than ``all`` each fit one device call (docs/gpu-check.md, "Parts"); without section a to share
#: their time, the warm-ups (the machine's, the compiled rows' compiled ahead) have a stage of their own.
PART_STAGES = {
    "all": ("abc", tuple((name, gpu, tiny, "compiled" in name) for name, gpu, tiny in PARTS)),
    "props": ("a", (("a", 1.0, 1.0, False),)),
    "train": ("b", (("b warm-up", 0.25, 0.15, False), ("b fresh", 0.4, 0.45, False), ("b eager", 0.35, 0.2, False),
                    ("b compiled", 0.0, 0.2, True))),
    "train-fresh": ("b", (("b warm-up", 0.25, 0.2, False), ("b fresh", 0.75, 0.8, True))),
    "train-cases": ("b", (("b warm-up", 0.25, 0.2, False), ("b eager", 0.4, 0.4, False),
                          ("b compiled", 0.35, 0.4, True))),
    "decode": ("c", (("c checkpoints", 0.5, 0.5, False), ("c eager", 0.5, 0.5, True), ("c compiled", 0.0, 0.0, True))),
}
#: the decoding groups (section c) and the part that runs each alone
DECODE_GROUPS = {"decode-beam-eager": "translate-eager", "decode-greedy-eager": "greedy-eager",
                 "decode-beam-compiled": "translate-compiled", "decode-greedy-compiled": "greedy-compiled"}
PART_STAGES.update({name: PART_STAGES["decode"] for name in DECODE_GROUPS})
#: the split offered when a part does not fit its budget by the plan's estimate (then by --cases, per paper)
SPLITS = {"all": ("props", "train", "decode"), "train": ("train-fresh", "train-cases"), "decode": tuple(DECODE_GROUPS)}
#: each part's budget (section, GPU s, dry-run s): a part fits one device call of at most 5 minutes with the
#: 40 s of staging (tools/gpu_stage.sh) and the check's own start and report
PART_BUDGETS = {"props": ("a", 85.0, 22.0), "train": ("b", 240.0, 125.0), "decode": ("c", 240.0, 90.0)}


class Schedule:
    """The stages' deadlines (monotonic), from ``--part``'s :data:`PART_STAGES`: a stage ends at most its share
    of its section's budget after it starts, a cumulative one when the budgets of every stage so far, its own
    included, are spent from the check's start.  ``parts`` keeps each stage's time."""

    def __init__(self, args):
        self.args, self.start, self.planned, self.parts = args, _now(), 0.0, []
        self.stages = {name: rest for name, *rest in PART_STAGES[args.part][1]}

    def deadline(self, name, whole=False):
        gpu, tiny, cumulative = self.stages[name]
        budget = (1.0 if whole else tiny if self.args.tiny else gpu) * getattr(self.args, f"budget_{name[0]}")
        self.planned += budget
        return self.start + self.planned if cumulative else _now() + budget

    def record(self, name, began, deadline, ended, status):
        self.parts.append({"part": name, "budget_s": round(deadline - began, 1), "seconds": round(ended - began, 1),
                           "status": status})


#: the A/A control's band: on a GPU its median should lie within it, else the report says so beside every ratio
#: of its group
AA_BAND = (0.97, 1.03)


def aa_summary(ratios, band=AA_BAND):
    """The A/A control's ratios summed up: their ``median``, an ``interval`` of the median with its ``coverage``
    (the distribution-free 95% interval from six ratios on, else their range, whose coverage is 1 - 2^(1-n)), and
    whether the median lies ``within`` ``band``; None without a ratio."""
    if not ratios:
        return None
    ordered, count = sorted(ratios), len(ratios)
    interval, coverage = timed_runs.median_interval(ordered), 0.95
    if interval is None:
        interval, coverage = (ordered[0], ordered[-1]), 1 - 2 ** (1 - count)
    median = statistics.median(ordered)
    return {"runs": count, "ratios": [round(ratio, 4) for ratio in ratios], "median": median,
            "interval": list(interval), "coverage": round(coverage, 3), "band": list(band),
            "within": band[0] <= median <= band[1]}


def aa_note(summary):
    """What the report says beside each ratio of a group whose A/A control is outside its band (None: within)."""
    if summary is None:
        return "no A/A run measured"
    if summary["within"]:
        return None
    return f"A/A {summary['median']:.3f}: outside {summary['band'][0]:g}-{summary['band'][1]:g}"


def aa_text(summary):
    """One line on a group's A/A control."""
    if summary is None:
        return "A/A control: no run measured"
    low, high = summary["interval"]
    few = " (fewer than 3 runs)" if summary["runs"] < 3 else ""
    return (f"A/A control: median {summary['median']:.3f} over {summary['runs']} runs{few}, interval "
            f"{low:.3f}-{high:.3f} ({summary['coverage']:.0%} coverage), "
            + ("within" if summary["within"] else "OUTSIDE") + f" {summary['band'][0]:g}-{summary['band'][1]:g}")


def spread(entries, extras):
    """``entries`` with ``extras`` spread evenly among them: the first before all, the last after all (one extra:
    before all).  Places the A/A control's runs across the in-process group."""
    out, count = list(entries), len(extras)
    for number, extra in enumerate(extras):
        out.insert(number + (round(number * len(entries) / (count - 1)) if count > 1 else 0), extra)
    return out


def proportional_shares(estimates):
    """Each item's share of the time left when it starts, so that the time is shared in proportion to
    ``estimates`` (the last item gets all that is left)."""
    return [estimate / sum(estimates[number:]) if sum(estimates[number:]) > 0 else 1.0
            for number, estimate in enumerate(estimates)]


def left_out(stages):
    """The plan's estimate: walks ``stages`` (``(name, budget s, cumulative, [(row label or None, seconds)])``, in
    running order) as :class:`Schedule` and the training processes do; a row that would end after its stage's
    deadline is left out (a later, cheaper one may still fit), a fixed cost (label None) always runs.  Returns
    ``(labels left out, estimated seconds)``."""
    clock = planned = 0.0
    out = []
    for _, budget, cumulative, rows in stages:
        planned += budget
        deadline = planned if cumulative else clock + budget
        for label, seconds in rows:
            if label is not None and clock + seconds > deadline:
                out.append(label)
            else:
                clock += seconds
    return out, clock


#: the plan's costs, seconds: on a GPU from the H200 run of 3fa46b4 (results/gpu/NVIDIA_H200-3fa46b4.json:
#: section a's longest process, preparation, the machine warm-up, compiling ahead (li2019's process), a training
#: process's start to its first step, step times of the users'-path rows, in-process runs at 32,768 tokens,
#: warm-ups of section c's eager and compiled cases; a timed run takes --min-run-seconds); in the dry run from
#: this project's 2-core CPU
COSTS = {
    "cuda": {"props": 60, "prepare": 10, "warm": 35, "ahead": 60, "process": 15, "layers": 40, "checkpoint": 1.5,
             "steps": {"ext": (0.045, 0.07), "stock": (0.2, 0.18), "layers": (0.045, 0.07)}, "case": (3.0, 4.0),
             "baseline": 1.5, "translate_warm": (1.0, 5.0), "translate": 0.0,
             "cases": {"li2019 EM routing, enc-self [1-6]": (6.4, 7.4),
                       "li2019 EM routing on all three components": (19.3, 7.4)}},
    "cpu": {"props": 20, "prepare": 12, "warm": 10, "ahead": 0, "process": 8, "layers": 10, "checkpoint": 0.6,
            "steps": {"ext": (0.05, 0.45), "stock": (0.14, 0.4), "layers": (0.1, 0.6)}, "case": (0.6, 2.0),
            "baseline": 0.5, "translate_warm": (0.5, 1.5), "translate": 0.05, "cases": {}},
}


def _translate_rows(args, cases, compiled, costs):
    """The estimated rows of one decoding group: each candidate's warm-up and timed runs, with its share of the
    baseline's runs; first the baseline's own warm-up and first run (fixed)."""
    run = max(args.min_run_seconds, costs["translate"])
    warm = costs["translate_warm"][compiled]
    candidates = [timed_runs.control_case(BASELINE), *cases]
    rows = [(None, costs["translate_warm"][0] + run)]
    rows += [(f"{case.label}, {'compiled' if compiled and not case.control else 'eager'}",
              (costs["translate_warm"][0] if case.control else warm)
              + args.translate_passes * run * (1 + 1 / args.translate_block) / PLAN_SHARE) for case in candidates]
    return rows


def part_stages(args, cases, costs):
    """``--part``'s stages as :func:`left_out` walks them: their budgets from :data:`PART_STAGES` and the rows
    the plan will run in each, with their estimated seconds (``costs``: one of :data:`COSTS`)."""
    stages, sections, table = [], args.sections, PART_STAGES[args.part][1]
    rows = {name: [] for name, *_ in table}
    small, paper = args.batch_size, args.paper_batch_size
    if "a" in sections:
        rows["a"].append(("section a's pytest processes", costs["props"]))
    if "b" in sections:
        if "a" not in sections:  # (with section a, both run beside its processes)
            rows["b warm-up" if "b warm-up" in rows else "b fresh"].extend(
                [(None, costs["prepare"]), (None, max(costs["warm"], 0 if args.fresh_only else costs["ahead"]))])
        plan = training_plan(args, cases)
        for name, group, _, entries in plan:
            stage = "b fresh" if name == "b fresh" else "b eager"
            rows[stage].append((None, costs["process"]))
            kind = {FRESH_EXT: "ext", FRESH_STOCK: "stock", FRESH_LAYERS: "layers"}.get(group)
            for row, case, mode, _ in entries:
                label = f"{row['case']}, {row['mode']}, {row['batch_tokens']}" + _run_text(row)
                if kind:
                    steps = step_plan(args, *_run_steps(args, group))["total"]
                    seconds = steps * costs["steps"][kind][row["batch_tokens"] != small]
                    seconds += costs["layers"] if kind == "layers" and row["batch_tokens"] == paper else 0
                elif row.get("run", 1) > 1 or case.control or case == BASELINE:
                    seconds = costs["baseline"]
                else:
                    seconds = costs["cases"].get(case.label, costs["case"])[mode == "compiled"]
                rows["b compiled" if row.get("part", mode) == "compiled" else stage].append((label, seconds))
    if "c" in sections and ("b" in sections or "c checkpoints" in rows):
        if "b" not in sections:
            rows["c checkpoints"] += [(None, costs["prepare"] + costs["process"]),
                                      (None, costs["checkpoint"] * (len(cases) + 2))]
        for key in args.groups:
            search, mode = key.split("-")
            rows[f"c {mode}"] += [(label and f"{label}, {'beam 4' if search == 'translate' else 'greedy'}", seconds)
                                  for label, seconds in _translate_rows(args, cases, mode == "compiled", costs)]
    for name, gpu, tiny, cumulative in table:
        budget = (tiny if args.tiny else gpu) * getattr(args, f"budget_{name[0]}")
        stages.append((name, budget, cumulative, rows[name]))
    return stages


def paper_of(case):
    """A case's paper: its config's directory (li2019, cao2019, chen2019, clause, gret)."""
    return case.config.split("/")[0]


def apply_part(args, part):
    """Sets on ``args`` what ``--part`` ``part`` runs: its sections, which fresh processes and decoding groups,
    and its section's budget (:data:`PART_BUDGETS`) unless one was given."""
    args.part = part
    if part != "all":
        args.sections, args.fresh_only = PART_STAGES[part][0], part == "train-fresh"
        args.fresh = [] if part == "train-cases" else args.fresh or ["ext", "stock"]
        section, gpu, tiny = PART_BUDGETS[part.split("-")[0]]
        if args.given_budgets.get(section) is None:
            setattr(args, f"budget_{section}", tiny if args.tiny else gpu)
    args.groups = [DECODE_GROUPS[part]] if part in DECODE_GROUPS else list(DECODE_GROUPS.values())


def part_command(part, cases, everything):
    papers = list(dict.fromkeys(map(paper_of, cases)))
    return f"--part {part}" + ("" if len(cases) == len(everything) else f" --cases {','.join(papers)}")


def split_parts(args, cases, costs):
    """The parts (``[(part, cases)]``) that measure what ``args``' part does, each fitting its budget by the plan's
    estimate: the part itself, else its :data:`SPLITS`, else its cases shared out by paper; a single paper that
    still does not fit is offered as it is."""
    def fits(part, chosen):
        trial = type(args)(**vars(args))
        apply_part(trial, part)
        return not left_out(part_stages(trial, chosen, costs))[0]

    def split(part, chosen):
        if fits(part, chosen):
            return [(part, chosen)]
        if part in SPLITS:
            return [item for sub in SPLITS[part] for item in split(sub, chosen)]
        papers = [[case for case in chosen if paper_of(case) == name] for name in dict.fromkeys(map(paper_of, chosen))]
        for count in range(2, len(papers) + 1):
            chunks = share_papers(papers, count)
            if all(fits(part, chunk) for chunk in chunks):
                break
        return [(part, chunk) for chunk in chunks] if len(papers) > 1 else [(part, chosen)]

    return split(args.part, cases)


def share_papers(papers, count):
    """``papers`` (each a list of cases, in order) in at most ``count`` consecutive chunks of about as many cases:
    a paper starts a new chunk when the middle of its cases lies past the chunk's even share."""
    total, done, chunks = sum(map(len, papers)), 0, [[]]
    for cases in papers:
        if chunks[-1] and done + len(cases) / 2 > total * len(chunks) / count:
            chunks.append([])
        chunks[-1] += cases
        done += len(cases)
    return chunks


def plan_line(args, cases, everything):
    """The line printed before a part starts: by the plan's estimate (:func:`left_out`), every row fits its
    budget, or which rows will not, and the parts that would measure them (:func:`split_parts`)."""
    costs = COSTS["cuda" if args.device == "cuda" else "cpu"]
    stages = part_stages(args, cases, costs)
    out, seconds = left_out(stages)
    head = f"== gpu-check {part_command(args.part, cases, everything)}: by the plan's estimate"
    if not out:
        return f"{head} every row fits ({seconds:.0f} s of {sum(stage[1] for stage in stages):.0f})"
    offer = " and ".join(part_command(part, chosen, everything) for part, chosen in split_parts(args, cases, costs))
    return (f"{head} {len(out)} row(s) will not fit: {'; '.join(out)}. To measure every row, run instead: {offer}")


# ---------------------------------------------------------------- section a


def junit_counts(path):
    """``{passed, failed, errors, skipped, tests, failures: [test ids]}`` from a pytest JUnit XML file."""
    root = ElementTree.parse(path).getroot()
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "failures": []}
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None:
            counts["failed"] += 1
            counts["failures"].append(name)
        elif case.find("error") is not None:
            counts["errors"] += 1
            counts["failures"].append(name)
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    counts["tests"] = counts["passed"] + counts["failed"] + counts["errors"] + counts["skipped"]
    return counts


#: the suite's variable that shares its console-script checks (5-6) among processes (tests/support.py)
CONSOLE_SHARD_VARIABLE = "ONMT_EXT_TEST_CONSOLE_SHARD"


def property_processes(args):
    """Section a's pytest processes: ``(dtype, share, pytest's selection, extra environment, file stem)`` each.

    The in-process checks (1-4) of every dtype run in one process each; on CUDA one more process runs the fused
    routing kernels' tests (:data:`KERNEL_TEST`) on the GPU.  The console-script checks (5-6) run
    in fp32 only (the suite skips them under autocast); each trains a model through ``onmt_train`` and translates
    through ``onmt_translate``, the slowest checks of the suite (docs/gpu-check.md, section a), so
    ``--console-shards`` processes share them (none: they are left out, as in the dry run).
    """
    dtypes = TINY_PROPERTY_DTYPES if args.tiny else PROPERTY_DTYPES
    shards = args.console_shards
    processes = []
    for dtype in dtypes:
        stem = f"properties-{dtype}"
        if shards and dtype != "none":  # the whole suite: its console-script checks skip themselves
            processes.append((dtype, "", [PROPERTY_TEST], {}, stem))
            continue
        processes.append((dtype, "checks 1-4", [PROPERTY_TEST, "-m", "not slow"], {}, stem))
        if shards:
            processes += [(dtype, f"checks 5-6, share {k + 1} of {shards}", [PROPERTY_TEST, "-m", "slow"],
                           {CONSOLE_SHARD_VARIABLE: f"{k}/{shards}"}, f"{stem}-console-{k + 1}-of-{shards}")
                          for k in range(shards)]
    if args.device == "cuda":
        processes.append(("none", "the fused routing kernels", [KERNEL_TEST], {}, "routing-kernels"))
    return processes


def start_section_a(args, work):
    """Starts section a's pytest processes (:func:`property_processes`), all at once on the one device, each with
    an even share of the CPU threads; returns what :func:`finish_section_a` needs."""
    result = {"title": "decoding properties", "runs": []}
    configs = TINY_PROPERTY_CONFIGS if args.tiny else PROPERTY_CONFIGS
    processes = property_processes(args)
    threads = max(1, (os.cpu_count() or 1) // len(processes))
    started = []
    for dtype, share, selection, extra, stem in processes:
        env = dict(os.environ, ONMT_EXT_TEST_DEVICE=args.device, ONMT_EXT_TEST_AUTOCAST=dtype,
                   ONMT_EXT_TEST_CONFIGS=",".join(configs), OMP_NUM_THREADS=str(threads),
                   MKL_NUM_THREADS=str(threads), **extra)
        xml, log = work / f"{stem}.xml", work / f"{stem}.log"
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *selection, f"--junitxml={xml}"]
        shown = " ".join([f"{name}={value}" for name, value in extra.items()]
                         + [f"ONMT_EXT_TEST_DEVICE={args.device} ONMT_EXT_TEST_AUTOCAST={dtype} "
                            f"ONMT_EXT_TEST_CONFIGS={','.join(configs)} OMP_NUM_THREADS={threads} python -m pytest "
                            f"-q {shlex.join(selection)}".rstrip()])
        run = {"dtype": "fp32" if dtype == "none" else dtype, "share": share, "configs": list(configs),
               "command": shown, "log": str(log)}
        xml.unlink(missing_ok=True)
        with open(log, "w", encoding="utf-8") as out:
            child = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        started.append((run, child, xml, _now()))
        result["runs"].append(run)
    print(f"== gpu-check a: properties, {len(processes)} processes at once ({threads} threads each)", flush=True)
    return result, started


#: pytest's exit status when its selection holds no test (a console share with no representative left)
NO_TESTS = 5


def _finished_run(run, code, xml, seconds):
    """Fills ``run`` from its process's exit status ``code`` and JUnit report ``xml``."""
    run["seconds"] = round(seconds, 1)
    if code == NO_TESTS and (not xml.exists() or junit_counts(xml)["tests"] == 0):
        run.update(status="empty", reason="no test in this share", passed=0, failed=0, errors=0, skipped=0,
                   tests=0, failures=[])
    elif not xml.exists():
        run.update(status="failed", reason=f"pytest exited {code} without a report; see {run['log']}")
    else:
        run.update(junit_counts(xml))
        run["status"] = "passed" if code == 0 and run["tests"] else "failed"


def finish_section_a(result, started, deadline):
    """Waits for section a's processes until the monotonic ``deadline`` (then stops them); each run's seconds are
    its own, to its exit."""
    pending = list(started)
    while pending and _now() < deadline:
        for item in list(pending):
            run, child, xml, began = item
            if child.poll() is not None:
                _finished_run(run, child.returncode, xml, _now() - began)
                pending.remove(item)
        time.sleep(0.1)
    for run, child, xml, began in pending:
        if child.poll() is not None:  # exited since the last look
            _finished_run(run, child.returncode, xml, _now() - began)
            continue
        os.killpg(child.pid, 9)
        child.wait()
        run["seconds"] = round(_now() - began, 1)
        run.update(status="stopped", reason=f"not run: budget (stopped after {run['seconds']} s)")
    if "status" not in result:
        statuses = {run["status"] for run in result["runs"]}
        result["status"] = "ran" if statuses <= {"passed", "failed", "empty"} else "partly run"
    return result


# ---------------------------------------------------------------- section b: training


def _merge(intervals):
    """Total length of the union of ``(start, end)`` intervals."""
    total, current_start, current_end = 0.0, None, None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total


def busy_seconds(profiler, cuda):
    """Seconds during which at least one CUDA kernel (``cuda``) or one CPU operator ran in a finished profile.

    Read from the profiler's raw events: building torch's ``FunctionEvent`` tree first took a second or two per
    profiled run, more than the steps themselves in section b's small runs."""
    from torch.autograd import DeviceType

    wanted = DeviceType.CUDA if cuda else DeviceType.CPU
    intervals = [(event.start_ns(), event.start_ns() + event.duration_ns())
                 for event in profiler.profiler.kineto_results.events()
                 if event.device_type() == wanted and event.duration_ns() > 0]
    return _merge(intervals) / 1e9


def _top_sites(sites, count=5):
    """The ``count`` commonest call sites, as paths from the repository or from site-packages."""
    short = [re.sub(r"^.*/site-packages/", "", site.replace(f"{REPO}/", "")) for site in sites]
    return [[site, number] for site, number in Counter(short).most_common(count)]


class _SyncWindow:
    """Host-device synchronisations between :meth:`open` and :meth:`close`, with their call sites: on CUDA
    torch's sync warnings (onmt_ext.hostsync.cuda_sync_warnings), on the CPU the host's reads of tensor
    values (HostReads), less the optimizer's reads of its CPU step counters (no synchronisation on a GPU)."""

    def __init__(self, cuda):
        from onmt_ext import hostsync

        self.cuda, self.hostsync = cuda, hostsync
        self.context = self.found = None

    def open(self):
        if self.cuda:
            self.context = self.hostsync.cuda_sync_warnings(skip=("/gpu_check.py",))
            self.found = self.context.__enter__()
        else:
            self.context = self.hostsync.HostReads(optimizer_counters=False)
            self.context.__enter__()

    def close(self):
        """``(count, call sites)``."""
        self.context.__exit__(None, None, None)
        if self.found is not None:
            return len(self.found), self.found
        return len(self.context.reads), [where for _, where in self.context.reads]


class _NoOptimiserState:
    """Stands in for a saver's optimiser: its checkpoint gets ``"optim": None``."""

    @staticmethod
    def state_dict():
        return None


_NO_OPTIMISER_STATE = _NoOptimiserState()


class WarmedUp(Exception):
    """Ends a warm-up job's training after its ``stop_after`` steps (raised after a whole step)."""


class Meter:
    """What section b measures of each training run in a process, through OpenNMT-py's trainer: data waits,
    report statistics, synchronisations per step, the first step's time, a profiled window, peak memory.
    Installed once per process; :meth:`begin` and :meth:`end` frame each run (``job``)."""

    def __init__(self, cuda):
        import torch
        from onmt import train_single
        from onmt import trainer as trainer_module
        from onmt.constants import CorpusTask
        from onmt.models import model_saver

        self.torch, self.cuda, self.job = torch, cuda, None
        meter = self
        trainer_class = trainer_module.Trainer
        accum, accumulate = trainer_class._accum_batches, trainer_class._gradient_accumulation

        def timed_batches(trainer, iterator):
            batches = accum(trainer, iterator)
            while True:
                step = trainer.optim.training_step  # the step whose batches are fetched now
                meter._step_begins(step)
                start = time.perf_counter()
                try:
                    item = next(batches)
                except StopIteration:
                    meter._step_begins(None)
                    return
                meter.waits[step] = time.perf_counter() - start
                yield item

        def measured_step(trainer, *args, **kwargs):
            step = trainer.optim.training_step
            meter._profile(step, start=True)
            out = accumulate(trainer, *args, **kwargs)
            meter._profile(step, start=False)
            if step == 1:
                meter._sync()
                meter.first_step_end, meter.first_step_wall = time.perf_counter(), time.time()
            if step >= meter.job.get("stop_after", step + 1):
                meter._sync()
                raise WarmedUp(step)
            return out

        trainer_class._accum_batches, trainer_class._gradient_accumulation = timed_batches, measured_step
        self.reports, self.parameters, self.replayed_by_key, self.tables = [], {}, {}, []
        common.record_training(self.reports, self.parameters)
        save = model_saver.ModelSaverBase.save

        def timed_save(saver, *args, **kwargs):
            """Section c's checkpoints: the model and its vocabularies without the optimiser's state (a third of
            the bytes; onmt_average_models writes translation checkpoints the same way), for the runs that save."""
            if meter.job["save"]:
                start, optim = time.perf_counter(), saver.optim
                saver.optim = _NO_OPTIMISER_STATE
                try:
                    save(saver, *args, **kwargs)
                finally:
                    saver.optim = optim
                meter.save_s += time.perf_counter() - start

        model_saver.ModelSaverBase.save = timed_save
        build_model, build_iter = train_single.build_model, train_single.build_dynamic_dataset_iter

        def timed_build(*args, **kwargs):
            model = build_model(*args, **kwargs)
            meter._sync()
            meter.model_built = time.perf_counter()
            meter.build_s = meter.model_built - meter.began
            return model

        def replayed_iter(*args, **kwargs):
            """The training batches built ahead of the first step, then replayed from memory."""
            if not meter.job["replay"] or kwargs.get("task", CorpusTask.TRAIN) != CorpusTask.TRAIN:
                return build_iter(*args, **kwargs)
            key, count = meter.job.get("replay_key"), meter.job["batches"]
            if key in meter.replayed_by_key and len(meter.replayed_by_key[key]) >= count:
                items = meter.replayed_by_key[key][:count]  # a case with the same data options built them
                meter.replayed, meter.replay_reused = len(items), True
                return items  # (no data iterator built for nothing)
            built = build_iter(*args, **kwargs)
            start = time.perf_counter()
            items = list(islice(iter(built), count))
            meter._sync()
            meter.replay_s, meter.replayed = time.perf_counter() - start, len(items)
            if key:
                meter.replayed_by_key[key] = items
            return items

        train_single.build_model, train_single.build_dynamic_dataset_iter = timed_build, replayed_iter

    def write_tables(self, deadline, record):
        """The operator tables of the profiled runs, in run order, while the time before ``deadline`` (monotonic)
        seems to hold one more; ``record`` gets ``{"key", "phase": "table", "written"}`` for each.  torch's
        summaries take a second or two per run, so they wait until every run has been measured."""
        cost = 0.0
        while self.tables:
            key, profiler, path, title = self.tables.pop(0)
            written = time.monotonic() + max(cost, MIN_START_S / 3) < deadline
            if written:
                start = time.monotonic()
                write_profile_tables(profiler, self.cuda, path, title)
                cost = time.monotonic() - start
            record({"key": key, "phase": "table", "written": written})

    def _sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def begin(self, job):
        self.job, self.waits, self.began, self.build_s = job, {}, time.perf_counter(), None
        self.reports.clear()
        self.parameters.clear()
        self.model_built = self.first_step_end = self.first_step_wall = None
        self.replay_s, self.replayed, self.window, self.syncs, self.sites = 0.0, None, {}, {}, []
        self.replay_reused, self.save_s, self.profiler_stop_s = False, 0.0, None
        self.sync_window, self.sync_step = None, None
        gc.collect()
        if job["replay"]:  # in one process, what survives (imports, caches) is frozen, so that the next run's
            gc.freeze()  # collection scans only what came since (a full one's cost: docs/gpu-check.md, section c)
        if self.cuda:
            self.torch.cuda.empty_cache()
            self.torch.cuda.reset_peak_memory_stats()
        else:
            try:  # "5": reset the peak resident set of this process (VmHWM)
                Path("/proc/self/clear_refs").write_text("5")
                self.peak_reset = True
            except OSError:
                self.peak_reset = False

    def _step_begins(self, step):
        """Closes the synchronisation window of the step before and opens ``step``'s when it is counted."""
        if self.sync_window is not None:
            count, sites = self.sync_window.close()
            self.sites += sites
            self.syncs[self.sync_step] = count
            self.sync_window = None
        first, last = self.job["counted"]
        reads = self.job["host_reads"]  # HostReads is a dispatch mode, which torch.compile refuses
        if step is not None and (self.cuda or reads) and first <= step <= last:
            self.sync_window, self.sync_step = _SyncWindow(self.cuda), step
            self.sync_window.open()

    def _profile(self, step, start):
        first, count = self.job["profile"]
        if start and step == first and count:
            self._sync()
            activities = [self.torch.profiler.ProfilerActivity.CPU]
            if self.cuda:
                activities.append(self.torch.profiler.ProfilerActivity.CUDA)
            self.window["profiler"] = self.torch.profiler.profile(activities=activities)
            self.window["profiler"].__enter__()
            self.window["start"] = time.perf_counter() - self.waits.get(step, 0.0)  # this step's data wait too
        elif not start and step == first + count - 1 and "profiler" in self.window:
            self._sync()
            self.window["end"] = time.perf_counter()
            self.window["profiler"].__exit__(None, None, None)
            self.profiler_stop_s = time.perf_counter() - self.window["end"]
            if self.job.get("profile_file"):  # written after the process's last run (write_tables)
                self.tables.append((self.job["key"], self.window["profiler"], Path(self.job["profile_file"]),
                                    f"{self.job['key']}: steps {first}-{first + count - 1}"))

    def end(self, t0_wall):
        """The run's figures; ``t0_wall``: when the parent started this process (None: not the first run)."""
        if self.sync_window is not None:
            self._step_begins(None)
        job, every = self.job, self.job["report_every"]
        first, last = job["measure"]
        measured = [r for r in self.reports if first <= r["step"] <= last]
        if not measured:
            raise RuntimeError(f"no training report of steps {first}-{last} (reports at "
                               f"{[r['step'] for r in self.reports]})")
        tokens, seconds = sum(r["tgt_tokens"] for r in measured), sum(r["seconds"] for r in measured)
        steps = measured[-1]["step"] - measured[0]["step"] + every
        waits = [self.waits.get(step, 0.0) for step in range(first, last + 1)]
        between = [count for step, count in self.syncs.items() if step % every]
        at_reports = [count for step, count in self.syncs.items() if not step % every]
        # one figure per report interval too: a recompilation (or any one-off stall) lands in one interval, so the
        # median interval shows the steady speed that the mean over the measured steps hides
        intervals = [r["tgt_tokens"] / r["seconds"] for r in measured if r["seconds"] > 0]
        figures = {
            "tokens_per_s": tokens / seconds, "measured_steps": steps, "step_ms": 1000 * seconds / steps,
            "interval_tokens_per_s": intervals, "measure_steps": job["measure"],
            # over time, (last step, tok/s) per report interval: whether the measured steps reached a plateau
            "interval_points": [[r["step"], r["tgt_tokens"] / r["seconds"]] for r in measured if r["seconds"] > 0],
            "median_interval_tokens_per_s": statistics.median(intervals) if intervals else None,
            "data_wait_share": sum(waits) / seconds, "peak_memory_mb": common.peak_memory_mb(self.cuda),
            "peak_memory_since": "the run" if self.cuda or self.peak_reset else "the process start",
            "parameters": self.parameters.get("total"), "replayed_batches": self.replayed,
            "replay_s": self.replay_s, "replay_reused": self.replay_reused, "model_build_s": self.build_s,
            "save_s": self.save_s, "profiler_stop_s": self.profiler_stop_s,
            "syncs_per_step": statistics.mean(between) if between else None, "sync_steps": len(between),
            "syncs_per_report_step": statistics.mean(at_reports) if at_reports else None,
            "sync_sites": _top_sites(self.sites),
            "sync_kind": "torch CUDA sync warnings" if self.cuda else "host reads of tensor values (HostReads)",
            "sync_counted_steps": job["counted"],
            "sync_sites_from": ("the Python caller of each sync warning" if self.cuda else "the caller of each host "
                                "read" if job["host_reads"] else "not counted (HostReads is a dispatch mode, which "
                                "torch.compile refuses)"),
        }
        if self.model_built is not None and self.first_step_end is not None:
            figures["first_step_s"] = self.first_step_end - self.model_built - self.replay_s
        if t0_wall is not None and self.first_step_wall is not None:
            figures["startup_s"] = self.first_step_wall - t0_wall
        if "end" in self.window:
            wall = self.window["end"] - self.window["start"]
            busy = busy_seconds(self.window["profiler"], self.cuda)
            figures["busy_share"] = busy / wall
            figures["busy_kind"] = "CUDA kernels" if self.cuda else "CPU operators"
            # the profiler slows the host, not the kernels: their time over the unprofiled step's is the busy
            # share of the measured steps, as near as one can tell without profiling them
            figures["busy_ms_per_step"] = 1000 * busy / job["profile"][1]
            figures["busy_share_unprofiled"] = min(1.0, figures["busy_ms_per_step"] / figures["step_ms"])
        return figures


def write_profile_tables(profiler, cuda, path, title):
    """The profiled steps' operators, by self device time (on CUDA) and by self CPU time, top 30 each, into
    ``path``: what to read before making a row faster."""
    averages = profiler.key_averages()
    sorts = ["self_cpu_time_total"]
    if cuda:
        sorts.insert(0, "self_device_time_total" if hasattr(averages[0], "self_device_time_total") else
                     "self_cuda_time_total")
    parts = [f"# {title}"]
    for sort in sorts:
        parts += [f"\n## sorted by {sort}\n", averages.table(sort_by=sort, row_limit=30, max_name_column_width=70)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts) + "\n", encoding="utf-8")


def _parse_train_options(config, stock):
    """``onmt_train -config`` options as the command parses them; stock OpenNMT-py ignores unknown options
    silently, so here they are an error (the stock row must train only stock options)."""
    from onmt.bin.train import _get_parser

    opt, unknown = _get_parser().parse_known_args(["-config", str(config)])
    if unknown and stock:
        raise RuntimeError(f"options unknown to stock OpenNMT-py in {config}: {' '.join(unknown)}")
    return opt


def child_train_many(result_file, head, argv):
    """Section b's training process: trains every job of the jobs file ``head[0]`` in turn through OpenNMT-py's
    own ``onmt_train`` code (``onmt.bin.train.train``), appending each run's figures to ``head[1]`` (JSON lines)
    as it ends.  ``head[2]``: the wall time when the parent started this process; ``head[3]``: the device.  A
    run is not started when the time left before its ``deadline`` (monotonic) is shorter than it is likely to
    take: a further run of the baseline (``repeat_of``) as long as its last run, any other as the longest run
    before it per unit of ``weight``."""
    import torch
    from onmt.bin import train as train_command

    jobs = json.loads(Path(head[0]).read_text(encoding="utf-8"))
    runs_file, t0_wall, cuda = Path(head[1]), float(head[2]), head[3] == "cuda"
    stock = os.environ.get("ONMT_EXT_DISABLE", "") not in ("", "0")
    meter = Meter(cuda)
    per_weight, last = [], {}  # last: the seconds of the last run of each repeated case (the baseline's)

    def record(entry):
        common.append_json_line(runs_file, entry)

    first_run = True
    for job in jobs:
        left = job["deadline"] - time.monotonic()
        estimate = last.get(job.get("repeat_of"), max(per_weight, default=0.0) * job["weight"])
        if left < max(MIN_START_S, estimate):
            record({"key": job["key"], "status": "not run",
                    "reason": f"budget ({left:.0f} s left, about {estimate:.0f} s needed)"})
            continue
        record({"key": job["key"], "phase": "start"})
        start = time.monotonic()
        meter.begin(job)
        try:
            opt = _parse_train_options(job["config"], stock)
            train_command.train(opt)
            if job.get("checkpoint"):  # section c's checkpoint alone: nothing measured
                entry = {"key": job["key"], "status": "trained"}
            else:
                figures = meter.end(t0_wall if first_run else None)
                entry = {"key": job["key"], "status": "warmed up" if job.get("warmup") else "measured",
                         **({} if job.get("warmup") else figures)}
        except WarmedUp as stop:
            entry = {"key": job["key"], "status": "warmed up", "steps": stop.args[0]}
        except (Exception, SystemExit) as error:  # the run fails, the next one starts
            text = str(error).strip().splitlines()
            print(f"== gpu-check: run {job['key']!r} failed:", file=sys.stderr, flush=True)
            traceback.print_exc()  # into the process's log, which the report names
            entry = {"key": job["key"], "status": "failed", "traceback": True,
                     "reason": f"{type(error).__name__}: {text[-1] if text else ''}"[:300]}
        entry["seconds"], entry["ended"] = round(time.monotonic() - start, 1), time.monotonic()
        if entry["status"] in ("measured", "trained"):  # the process's first step (imports, compilation) is paid once
            once = (entry.get("first_step_s") or 0.0) if first_run else 0.0
            cost = max(0.0, entry["seconds"] - once)
            per_weight.append(cost / job["weight"])
            last[job.get("repeat_of") or job["key"]] = cost
        first_run = False
        record(entry)
        if cuda:
            torch.cuda.empty_cache()
    tables_s = max((job["tables_s"] for job in jobs), default=0.0)
    meter.write_tables(min(max((job["deadline"] for job in jobs), default=0.0), time.monotonic() + tables_s), record)
    Path(result_file).write_text(json.dumps({"done": True}), encoding="utf-8")


def _repeat_factor(config, tokens_needed):
    """How many copies of the training corpus an epoch needs to outlast ``tokens_needed`` target tokens."""
    corpus = next(value for key, value in config["data"].items() if key != "valid")
    lines = (REPO / corpus["path_tgt"]).read_text(encoding="utf-8").splitlines()  # pre-encoded: pieces
    tokens = sum(len(line.split()) + 1 for line in lines)  # + the end-of-sentence token
    return max(1, math.ceil(2 * tokens_needed / tokens))  # twice: batches are padded and buckets cut short


def step_plan(args, steps=None, warmup=None):
    """Which training steps measure what (1-based, inclusive): ``measure`` (tokens/s, step time, data wait),
    ``profile`` (first step, count: the busy share), ``counted`` (synchronisations per step: on CUDA the measured
    steps, whose sync warnings cost nothing; on the CPU more steps after the profiled ones, since counting host
    reads slows every operator), ``total``.  ``steps``: the measured steps (default ``--steps``; the in-process
    group's runs: ``--case-steps``) after ``warmup`` unmeasured ones (default ``--warmup-steps``; see
    :func:`_run_steps`)."""
    cuda = args.device == "cuda"
    first, last = (warmup or args.warmup_steps) + 1, (warmup or args.warmup_steps) + (steps or args.steps)
    end = last + args.profile_steps
    counted = [first, last] if cuda else [end + 1, end + args.warmup_steps]
    return {"measure": [first, last], "profile": [last + 1, args.profile_steps], "counted": counted,
            "total": counted[1] if not cuda else end}


class Settings:
    """What section b's configs need from timed_runs.case_config (its ``args``)."""

    def __init__(self, args, batch_size, steps=None, warmup=None):
        self.batch_size = batch_size
        self.warmup_steps = args.warmup_steps  # (the report interval)
        self.steps = step_plan(args, steps, warmup)["total"] - args.warmup_steps  # the steps after the first report
        self.gpu = 0 if args.device == "cuda" else -1


#: onmt-ext's own training options that its configs may hold besides the mechanisms' (stock has none of them)
EXT_TRAIN_OPTIONS = ("overwrite_checkpoints", "adam_eps")


def training_config(case, mode, args, work, repeat_cache, batch_size=None, replay=False, stock=False, name="",
                    steps=None, warmup=None):
    """Writes the config of ``case`` in ``mode`` (eager/compiled); returns (path, checkpoint, options).

    ``replay``: no data workers (the batches are built ahead in the training process); otherwise
    ``--num-workers``, the users' path.  ``stock``: the config without onmt-ext's options, for stock
    OpenNMT-py (a case with a mechanism cannot be one).  ``steps``, ``warmup``: see :func:`step_plan`."""
    batch_size = batch_size or args.batch_size
    settings = Settings(args, batch_size, steps, warmup)
    size, lines = ("smoke", TINY_LINES) if args.tiny else ("paper", None)
    paper = common.config_values(case.config)
    overrides = {"num_workers": 0 if replay else args.num_workers, "report_every": args.warmup_steps,
                 "batch_size": batch_size, "valid_batch_size": batch_size}
    if args.tiny:
        twin = common.config_values(f"smoke/{case.config}")
        overrides.update(enc_layers=twin["enc_layers"], dec_layers=twin["dec_layers"])
    else:
        overrides["model_dtype"] = paper.get("model_dtype", "fp32") if args.device == "cuda" else "fp32"
    overrides["bucket_size"] = max(2048, 2 * batch_size)
    if mode in ("compiled", "eager") and case in MECHANISMS:
        overrides["ext_compile"] = mode == "compiled"  # eager pinned: the default (auto) compiles some on CUDA
    elif mode == LAYERS:
        overrides["ext_compile_layers"] = True
    # one repeated corpus per case and batch size, long enough for the longest run (--steps or --case-steps)
    longest = max(step_plan(args, *_run_steps(args, group))["total"] for group in (IN_PROCESS, FRESH_EXT))
    key = (case.config, batch_size)
    suffix = f"_{name or mode}"
    if key not in repeat_cache:  # the corpus as the case reads it, to count its tokens once
        _, _, plain = timed_runs.case_config(case, size, settings, work, overrides=overrides, suffix=suffix,
                                             lines=lines)
        repeat_cache[key] = _repeat_factor(plain, batch_size * longest)
    path, checkpoint, config = timed_runs.case_config(case, size, settings, work, overrides=overrides,
                                                      suffix=suffix, repeat=repeat_cache[key], lines=lines)
    if stock:  # any other option stock OpenNMT-py does not know fails its run (child_train_many)
        if "ext_transformer" in (config.get("encoder_type"), config.get("decoder_type")) or mode != "eager":
            raise ValueError(f"{case.config} ({mode}) uses onmt-ext: it has no stock OpenNMT-py twin")
        config = {key: value for key, value in config.items() if key not in EXT_TRAIN_OPTIONS}
        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path, checkpoint, config


#: the groups of section b's rows: which process trains them and how the batches arrive
FRESH_EXT, FRESH_STOCK, IN_PROCESS = "onmt-ext, fresh process", "stock, fresh process", "in one process"
#: the onmt-ext baseline with its whole layers compiled (-ext_compile_layers), in a fresh process of its own
FRESH_LAYERS, LAYERS = "onmt-ext -ext_compile_layers, fresh process", "layers compiled"
#: the share of the fresh part that each fresh process keeps for every one after it: the onmt-ext and stock
#: baselines (issue 35's targets) take what they need, -ext_compile_layers (off by default) what is left
FRESH_RESERVE = 0.2
#: ``--fresh``'s name of each fresh process
FRESH_NAMES = {FRESH_EXT: "ext", FRESH_STOCK: "stock", FRESH_LAYERS: "layers"}
#: the untimed first training process on the machine (see :func:`warm_up_plan`)
WARM_UP = "machine warm-up, fresh process"
#: the process that trains section c's checkpoints when section b does not run (--part decode)
CHECKPOINTS = "section c's checkpoints, one process"
STOCK_LABEL = "stock OpenNMT-py 3.5.1 (ONMT_EXT_DISABLE=1)"


def _row(case, mode, group, batch, reference, data_path, name, target=None, paper=None):
    return {"key": f"{group}|{case.label}|{mode}|{batch}", "case": case.label, "mode": mode, "group": group,
            "batch_tokens": batch, "data_path": data_path, "reference": reference, "name": name,
            "target": target, "paper": paper, "control": case.control, "config": f"yaml_configs/{case.config}"}


def training_plan(args, cases):
    """Section b's processes and rows: ``[(part, group, environment, [(row, case, mode, config options)])]``: the
    onmt-ext and the stock baseline each in a fresh process, then every case eager and compiled in one."""
    users = f"{args.num_workers} data workers (the users' path)"
    replay = "built ahead, no workers, replayed from memory"
    paper, small = args.paper_batch_size, args.batch_size
    control = timed_runs.control_case(BASELINE)
    stock_case = Case(STOCK_LABEL, BASELINE.config, pre_encoded=True)
    ext_case = Case("onmt-ext baseline", BASELINE.config, pre_encoded=True)
    cases_batch = args.case_batch_size
    base_key = f"{IN_PROCESS}|{BASELINE.label}|eager|{cases_batch}"
    fresh = []
    for group, case, mode, stock in ((FRESH_EXT, ext_case, "eager", False), (FRESH_STOCK, stock_case, "eager", True),
                                     (FRESH_LAYERS, ext_case, LAYERS, False)):
        rows = []
        for batch in ((paper, small) if mode == LAYERS else (small, paper)):  # (layers: the paper's batch first,
            # as the small batch's time, its compilation included, would be the estimate that may skip it)
            reference = f"{FRESH_STOCK}|{STOCK_LABEL}|eager|{batch}" if not stock else None
            name = f"{'stock' if stock else 'ext'}{'_layers' if mode == LAYERS else ''}_{batch}"
            row = _row(case, mode, group, batch, reference, users, name) | {"part": "fresh"}
            rows.append((row, BASELINE, mode, {"batch_size": batch, "stock": stock}))
        if FRESH_NAMES[group] in args.fresh:
            fresh.append(("b fresh", group, {"ONMT_EXT_DISABLE": "1"} if stock else {}, rows))
    if args.fresh_only:
        return fresh
    numbers = itertools.count(2)  # run 1 is the baseline's own row

    def baseline_again(part):
        """One more run of the baseline, so that every case has a baseline run on each side of it."""
        run = next(numbers)
        row = _row(BASELINE, "eager", IN_PROCESS, cases_batch, None, replay, "eager")
        row.update(key=f"{base_key}|run {run}", repeat_of=base_key, part=part, run=run)
        return row, BASELINE, "eager", {"replay": True}

    def interleaved(entries, part):
        out = []
        for number, entry in enumerate(entries):
            if number and not number % args.train_block:
                out.append(baseline_again(part))
            out.append(entry)
        return out + [baseline_again(part)]

    def control_run(run):
        """A run of the A/A control (the baseline under another name), against its neighbouring baseline runs."""
        row = _row(control, "eager", IN_PROCESS, cases_batch, base_key, replay, "eager") | {"run": run}
        if run > 1:
            row["key"] += f"|run {run}"
        return row, control, "eager", {"replay": True}

    cases = sorted(cases, key=lambda case: case.train_target is None)  # the cases with a target first
    first = _row(BASELINE, "eager", IN_PROCESS, cases_batch, None, replay, "eager") | {"run": 1}
    eager = [(_row(case, "eager", IN_PROCESS, cases_batch, base_key, replay, "eager", case.train_target,
                    case.paper_train), case, "eager", {"replay": True}) for case in cases]
    compiled = [(_row(case, "compiled", IN_PROCESS, cases_batch, base_key, replay, "compiled", case.train_target,
                      case.paper_train), case, "compiled", {"replay": True}) for case in cases]
    # the A/A control's runs spread over the group: the first before every case, the last after every compiled one
    order = spread(eager + compiled, [control_run(run) for run in range(1, args.aa_runs + 1)])
    boundary = next((number for number, entry in enumerate(order) if entry[2] == "compiled"), len(order))
    for row, *_ in order[boundary:]:
        row["part"] = "compiled"  # (the A/A runs there: eager runs in the compiled part's time)
    in_process = [(first, BASELINE, "eager", {"replay": True}), *interleaved(order[:boundary], "eager"),
                  *interleaved(order[boundary:], "compiled")]
    return fresh + [("b in-process", IN_PROCESS, {}, in_process)]


def fresh_deadlines(began, deadline, count):
    """The deadline of each of ``count`` fresh processes run in turn in the part from ``began`` to ``deadline``:
    each leaves :data:`FRESH_RESERVE` of the part to every process after it."""
    reserve = FRESH_RESERVE * (deadline - began)
    return [deadline - reserve * (count - 1 - number) for number in range(count)]


def checkpoint_plan(args, cases):
    """Section c's checkpoints when section b does not run (``--part decode``): the baseline, the A/A control and
    every case, eager, each trained for a few steps in one process on built-ahead batches, nothing measured
    (decoding's speed does not depend on the weights: every output has the same forced length)."""
    replay = "built ahead, no workers, replayed from memory"
    rows = [(_row(case, "eager", CHECKPOINTS, args.batch_size, None, replay, "checkpoint"), case, "eager",
             {"replay": True}) for case in (BASELINE, timed_runs.control_case(BASELINE), *cases)]
    return [("c checkpoints", CHECKPOINTS, {}, rows)]


def warm_up_plan(args):
    """The machine's first training process, untimed: stock OpenNMT-py on the small batch through the users'
    path, started while section a runs.  A machine's first training process also loads the CUDA libraries from
    disk and each kernel on first use; without it, the fresh process that happens to run first (onmt-ext's)
    pays that alone and its first step and start-up are not comparable with stock's."""
    case = Case(STOCK_LABEL, BASELINE.config, pre_encoded=True)
    row = _row(case, "eager", WARM_UP, args.batch_size, None, f"{args.num_workers} data workers (the users' path)",
               f"warmup_{args.batch_size}")
    return row, case, "eager", {"batch_size": args.batch_size, "stock": True}


def start_warm_up(args, work, entry, configs, repeat_cache, deadline):
    """Runs the warm-up ``entry`` (:func:`warm_up_plan`) in a thread until the monotonic ``deadline``; returns
    the thread (its row is filled in place when it ends).  ``repeat_cache``: :func:`prepare_training`'s."""
    row, case, mode, extra = entry
    configs[row["key"]] = training_config(case, mode, args, work, repeat_cache, batch_size=extra["batch_size"],
                                          stock=True, name=row["name"], steps=args.warmup_steps,
                                          warmup=args.warmup_steps)
    row["command"], row["options"] = f"onmt_train -config {configs[row['key']][0]}", configs[row["key"]][2]
    thread = threading.Thread(target=run_training_process, daemon=True,
                              args=(args, work, WARM_UP, {"ONMT_EXT_DISABLE": "1"}, [entry], configs,
                                    {"eager": deadline}))
    thread.start()
    return thread


#: the untimed processes that compile the compiled rows' cores ahead (see :func:`start_compile_warm_up`)
COMPILE_WARM_UP = "compile warm-up"


def deal_by_paper(entries, processes):
    """``entries`` (``(row, case, mode, extra)``) shared among ``processes`` lists, a paper's together (its config
    directory), each group to the list with fewest entries: the ``-ext_compile_layers`` rows first, then the
    largest.  A paper's cases share their cores (li2019's EM rows compile one graph), so in one process the first
    case compiles it and the next reuse it; in two they would compile it twice, side by side.
    """
    groups = {}
    for entry in entries:
        _, case, mode, _ = entry
        groups.setdefault(LAYERS if mode == LAYERS else case.config.split("/")[0], []).append(entry)
    shares = [[] for _ in range(min(processes, len(groups)))]
    for name, group in sorted(groups.items(), key=lambda item: (item[0] != LAYERS, -len(item[1]))):  # stable
        min(shares, key=len).extend(group)
    return shares


def start_compile_warm_up(args, work, plan, configs, deadline):
    """Trains every compiled row of ``plan`` for ``--compile-warmup-steps`` steps, untimed, in
    ``--compile-warmups`` processes side by side (a paper's rows in one process: :func:`deal_by_paper`), until
    the monotonic ``deadline`` (while section a runs).  torch.compile keeps what it generates on disk (Inductor's
    FX graph and AOTAutograd caches, and Triton's kernels), so the measured compiled runs of section b load their
    cores instead of compiling them.  Returns ``(threads, rows)``: one row per case, filled in place as its run ends."""
    compiled = [(row, case, mode, extra) for _, _, _, rows in plan for row, case, mode, extra in rows
                if mode == "compiled" or mode == LAYERS and row["batch_tokens"] == args.batch_size]
    compiled.sort(key=lambda entry: entry[2] != LAYERS)  # the layers first (the small batch: the same graphs)
    if not compiled or args.compile_warmups < 1:
        return [], []
    entries = []
    for row, case, mode, extra in compiled:
        mine = dict(row, key=f"{COMPILE_WARM_UP}|{row['key']}", group=COMPILE_WARM_UP, reference=None, target=None)
        configs[mine["key"]] = configs[row["key"]]  # the very config measured later: the same graphs
        entries.append((mine, case, mode, extra))
    shares = deal_by_paper(entries, args.compile_warmups)
    threads = []
    for number, share in enumerate(shares):
        thread = threading.Thread(target=run_training_process, daemon=True,
                                  args=(args, work, f"{COMPILE_WARM_UP} {number + 1}", {}, share, configs,
                                        {"compiled": deadline, "fresh": deadline}, args.compile_warmup_steps))
        thread.start()
        threads.append(thread)
    print(f"== gpu-check b: compiling {len(entries)} compiled rows ahead in {len(shares)} process(es), untimed, "
          "while section a runs", flush=True)
    return threads, [row for row, _, _, _ in entries]


def prepare_training(args, work, plan, cache):
    """Writes every config of ``plan`` (data SentencePiece'd, clause-split and repeated once, the repeat factor
    kept in ``cache``, see :func:`training_config`); returns ``{row key: (path, checkpoint, options)}``."""
    configs = {}
    for _, _, _, rows in plan:
        for row, case, mode, extra in rows:
            configs[row["key"]] = training_config(case, mode, args, work, cache, batch_size=row["batch_tokens"],
                                                  replay=extra.get("replay", False), stock=extra.get("stock", False),
                                                  name=row["name"], steps=_run_steps(args, row["group"])[0],
                                                  warmup=_run_steps(args, row["group"])[1])
            row["command"] = f"onmt_train -config {configs[row['key']][0]}"
            row["options"] = configs[row["key"]][2]
    return configs


def _run_steps(args, group):
    """``(measured steps, unmeasured steps before them)`` of a run in ``group``: ``--case-steps`` in one process
    (the same replayed batches for every case and its neighbouring baseline runs), ``--steps`` after
    ``--fresh-warmup-steps`` on the users' path (data workers), past the warm-up of a fresh process; the machine
    warm-up and section c's checkpoints train only ``--warmup-steps`` twice."""
    if group == IN_PROCESS:
        return args.case_steps, args.warmup_steps
    if group in (WARM_UP, CHECKPOINTS):
        return args.warmup_steps, args.warmup_steps
    return args.steps, args.fresh_warmup_steps


def _slug(text):
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


#: options that shape the model, the optimiser or the output files, not the training batches; every other option
#: is part of :func:`replay_key` (an option left out of this list costs a rebuild, never a wrong batch)
MODEL_ONLY_OPTIONS = {"save_data", "save_model", "encoder_type", "decoder_type", "share_decoder_embeddings",
                      "learning_rate", "learning_rate_decay", "decay_method", "ext_compile", "ext_compile_layers",
                      "gret", "clause_attention", "clause_levels"}
MODEL_ONLY_PREFIXES = ("li2019_", "cao2019_", "chen2019_", "gret_")


def replay_key(options):
    """What decides a run's training batches: its options less :data:`MODEL_ONLY_OPTIONS` (and prefixes), as
    text.  Runs of one process with the same key replay the batches that the first of them built."""
    kept = {key: value for key, value in options.items()
            if key not in MODEL_ONLY_OPTIONS and not key.startswith(MODEL_ONLY_PREFIXES)}
    return json.dumps(kept, sort_keys=True, default=str)


def run_training_process(args, work, group, env, rows, configs, deadlines, stop_after=None):
    """One training process for ``rows`` (see :func:`child_train_many`), each run before the deadline of its
    mode (``deadlines``: mode -> monotonic time); fills the rows in place and returns when each mode's last
    run ended (or None).  ``stop_after``: every run is an untimed warm-up that ends after that many steps."""
    steps = step_plan(args, *_run_steps(args, group))
    jobs = [{"key": row["key"], "config": str(configs[row["key"]][0]), "replay": "replayed" in row["data_path"],
             "replay_key": replay_key(configs[row["key"]][2]),
             "batches": (stop_after or steps["total"]) + 2,
             "save": row["group"] in (IN_PROCESS, CHECKPOINTS) and row["mode"] == "eager" and row.get("run", 1) == 1,
             "repeat_of": row.get("repeat_of"), "checkpoint": row["group"] == CHECKPOINTS,
             "weight": 1 + math.log2(row["batch_tokens"] / args.batch_size) / 4,  # a guess: much is fixed cost
             "measure": steps["measure"], "counted": [1, 0] if row["group"] == CHECKPOINTS else steps["counted"],
             # a further baseline or A/A run measures speed only: no profiled steps (their tables and busy share);
             # section c's checkpoints measure nothing
             "profile": [steps["profile"][0], 0] if row.get("run", 1) > 1 or row["group"] == CHECKPOINTS
             else steps["profile"],
             "host_reads": row["mode"] == "eager", "deadline": deadlines[row.get("part", row["mode"])],
             "report_every": args.warmup_steps, "tables_s": TABLES_SHARE * args.budget_b,
             "profile_file": None if row.get("run", 1) > 1 or row["group"] == CHECKPOINTS
             else str(args.profiles / f"{_slug(row['key'])}.txt")}
            for row, _, _, _ in rows]
    if stop_after:
        for job in jobs:
            job.update(warmup=True, stop_after=stop_after, profile_file=None)
    if group == IN_PROCESS:  # the first run in a process pays one-off costs: an untimed run of the first case's
        # warm-up steps (it also builds the batches that the first case replays)
        jobs.insert(0, dict(jobs[0], key="process warm-up", warmup=True, save=False, profile_file=None,
                            stop_after=args.warmup_steps))
    slug = _slug(group)
    jobs_file, runs_file = work / f"train-{slug}.jobs.json", work / f"train-{slug}.runs.jsonl"
    jobs_file.write_text(json.dumps(jobs), encoding="utf-8")
    runs_file.unlink(missing_ok=True)
    log = work / f"train-{slug}.log"
    stopped, seconds = None, max(deadlines.values()) - _now()
    if seconds < MIN_START_S:
        stopped = "not run: budget"
    else:
        print(f"== gpu-check b: {group}, {len(jobs)} runs in one process ({seconds:.0f} s at most)", flush=True)
        child_env = dict(env)
        if args.compile_backend:
            child_env["ONMT_EXT_COMPILE_BACKEND"] = args.compile_backend
        try:
            common.run_child(Path(__file__).resolve(), "train-many", [], log, args.threads,
                             timeout=seconds + GRACE_S, env=child_env,
                             head=(jobs_file, runs_file, time.time(), args.device))
        except common.ChildFailed as failure:
            stopped = ("stopped: budget" if failure.timed_out else f"failed: {failure}")
    entries = common.read_json_lines(runs_file)
    by_key = {entry["key"]: entry for entry in entries if entry.get("phase") not in ("start", "table")}
    began = {entry["key"] for entry in entries if entry.get("phase") == "start"}
    tables = {entry["key"]: entry["written"] for entry in entries if entry.get("phase") == "table"}
    for row, _, _, _ in rows:
        entry = by_key.get(row["key"])
        if entry:
            row.update({key: value for key, value in entry.items() if key not in ("key", "traceback")})
            if entry.get("traceback"):  # the child printed it into its log (packed with --pack)
                row["reason"] += f" (traceback in {log.name})"
                row["log"] = str(log)
            if row["key"] in tables:
                row["profile_table"] = tables[row["key"]]
        elif row["key"] in began and stopped:
            kind, _, why = stopped.partition(": ")
            row.update(status="stopped" if kind == "stopped" else "failed", reason=why)
        else:
            row.update(status="not run", reason="budget" if not stopped or "budget" in stopped else stopped)
    return {mode: max((entry["ended"] for entry in entries if "ended" in entry and entry["key"] in
                       {row["key"] for row, _, _, _ in rows if row.get("part", row["mode"]) == mode}), default=None)
            for mode in deadlines}


def _neighbour_speed(row, runs):
    """The geometric mean of the target tokens/s of the baseline runs (``runs``: ``(ended, tokens/s)`` in running
    order) nearest before and after ``row`` in its process, or of the one on its only side."""
    before = [speed for ended, speed in runs if ended < row["ended"]]
    after = [speed for ended, speed in runs if ended > row["ended"]]
    sides = before[-1:] + after[:1]
    return math.prod(sides) ** (1 / len(sides)) if sides else None


def training_ratios(rows, cuda):
    """Each measured row's ratio to its reference (tokens/s and peak memory), and whether it meets its target (on a
    GPU only).  A reference with runs again in the same process (the in-process baseline) counts the runs nearest
    before and after the row, so that a drift of the machine's speed over the part cancels; the reference row
    then shows the median of its runs.  Returns the in-process group's A/A summary (:func:`aa_summary`), whose
    note (:func:`aa_note`) each of the group's other ratios gets when it is outside its band."""
    by_key = {row["key"]: row for row in rows}
    runs = {}
    for row in rows:
        origin = row.get("repeat_of", row["key"])
        if row.get("status") == "measured" and row.get("ended") is not None:
            runs.setdefault(origin, []).append((row["ended"], row["tokens_per_s"]))
    for origin, measured in runs.items():
        measured.sort()
        if len(measured) > 1 and by_key[origin].get("status") == "measured":
            speeds = [speed for _, speed in measured]
            by_key[origin].update(runs_tokens_per_s=speeds, runs=len(speeds), tokens_per_s=statistics.median(speeds))
    for row in rows:
        if row.get("status") != "measured":
            continue
        if row.get("repeat_of"):  # a run of the baseline against the baseline's median: the drift over the part
            origin = by_key[row["repeat_of"]]
            row.update(ratio=row["tokens_per_s"] / origin["tokens_per_s"],
                       memory_ratio=row["peak_memory_mb"] / origin["peak_memory_mb"])
            continue
        reference = by_key.get(row["reference"]) if row["reference"] else row
        if reference and reference.get("status") == "measured":
            speed = reference["tokens_per_s"]
            if reference is not row and len(runs.get(reference["key"], [])) > 1:
                speed = _neighbour_speed(row, runs[reference["key"]])
                row["reference_runs"] = "the nearest baseline runs before and after, geometric mean"
            row["ratio"] = row["tokens_per_s"] / speed
            row["memory_ratio"] = row["peak_memory_mb"] / reference["peak_memory_mb"]
            if row["target"] is not None and cuda:  # the targets are for a GPU
                row["met"] = row["ratio"] >= row["target"]
    # the in-process group's A/A control (its runs spread over the group), beside every ratio of the group
    in_process = [row for row in rows if row["group"] == IN_PROCESS and row.get("reference")]
    if not in_process:
        return None
    summary = aa_summary([row["ratio"] for row in in_process if row.get("control") and "ratio" in row])
    for row in in_process:
        if "ratio" in row and not row.get("control") and aa_note(summary):
            row["aa_note"] = aa_note(summary)
    return summary


def section_b_status(rows):
    return "ran" if rows and all(row.get("status") == "measured" for row in rows) else "partly run"


# ---------------------------------------------------------------- section c: translation


def plan_cases(costs, base_cost, candidates, passes, block, seconds):
    """The candidates (in priority order) whose timed runs fit in ``seconds``: each in turn joins when the whole
    schedule with it still fits (a costly case is left out, a cheaper later one may still join).  ``costs``: a
    run's seconds per candidate; each pass runs every chosen case once and the baseline once per ``block``
    cases, plus once at the start.  Returns (chosen, their schedule's estimated seconds)."""
    chosen, estimate = [], 0.0

    def cost(names):
        return passes * (sum(costs[name] for name in names) + math.ceil(len(names) / block) * base_cost) + base_cost

    for name in candidates:
        if cost(chosen + [name]) <= seconds:
            chosen.append(name)
            estimate = cost(chosen)
    return chosen, estimate


def run_costs(first, min_run_s, overhead=0.0):
    """``(copies, costs)``: the test set's copies per timed run, so that the fastest of ``first`` (one run's
    seconds on the test set, per job) takes ``min_run_s`` at least, and each job's estimated seconds per timed
    run, with the ``overhead`` of a run outside its time (the collection before it) added."""
    copies = max(1, math.ceil(min_run_s / min(first.values()))) if min_run_s > 0 else 1
    return copies, {name: seconds * copies + overhead for name, seconds in first.items()}


def warm_another(first, base, warm_s, passes, block, min_run_s, left, overhead=0.0):
    """Whether a group's next candidate is still worth its warm-up (loading, compiling, one run on the test set)
    with ``left`` seconds of the group's time to go.  It is when, after a warm-up as long as the longest of the
    group's candidates so far (``warm_s``, seconds each), the candidate would still join the timed schedule at a
    run as cheap as the baseline's without pushing out any warmed candidate that fits now.  Otherwise its warm-up
    would only take time from the runs of those (a compiled group once spent its whole share compiling five
    cases and timed none).  ``first``: one run's seconds per warmed job, the baseline ``base`` first;
    ``overhead``: as in :func:`run_costs`."""
    if base not in first:
        return True
    _, costs = run_costs(first, min_run_s, overhead)
    candidates = [name for name in first if name != base]
    now, _ = plan_cases(costs, costs[base], candidates, passes, block, PLAN_SHARE * left)
    after = left - max(warm_s, default=0.0)
    later, _ = plan_cases({**costs, None: costs[base]}, costs[base], candidates + [None], passes, block,
                          PLAN_SHARE * after)
    return None in later and set(now) <= set(later)


def _warm_model_building():
    """Pays a process's one-off costs of building its first model before any time is measured: OpenNMT-py
    builds embeddings through ``torch.nn.utils.skip_init``, whose first call imports torch's compiler stack
    (seconds: docs/gpu-check.md, section c), and its inference engine imports the translator."""
    import torch

    import onmt.inference_engine  # noqa: F401
    import onmt.translate.translator  # noqa: F401

    torch.nn.utils.skip_init(torch.nn.Embedding, 2, 2)


def child_translate_many(result_file, head, argv):
    """Section c in one process.  For each group of the jobs file (``head[0]``), within its ``share`` of the time
    left before its part's monotonic ``deadline``: every checkpoint is loaded once through OpenNMT-py's
    inference engine (the group of its other search reuses the model), translates the test set once untimed
    (compiled ones compile then) and once timed; the input is then repeated so that the fastest run takes
    ``head[2]`` seconds at least, the cases that fit are chosen in priority order (:func:`plan_cases`), and the
    timed schedule runs.  Every event is appended to ``head[1]`` (JSON lines) at once, so that a stop keeps what
    was done.  The process may start early: it pays its one-off costs (imports, :func:`_warm_model_building`),
    then waits for the jobs file, at most ``head[3]`` seconds."""
    from onmt import model_builder

    from onmt_ext import compile as ext_compile

    _warm_model_building()
    jobs_file, given_up = Path(head[0]), time.time() + float(head[3])
    while not jobs_file.exists():  # started early (start_section_c): the jobs come once section b has trained
        if time.time() > given_up:
            raise SystemExit(f"no jobs in {jobs_file} after {head[3]} s")
        time.sleep(0.1)
    groups = json.loads(jobs_file.read_text(encoding="utf-8"))
    runs_file, min_run_s = Path(head[1]), float(head[2])
    engines, models = {}, {}
    load_test_model = model_builder.load_test_model

    def record(entry):
        common.append_json_line(runs_file, entry)

    record({"phase": "meta", "backend": ext_compile.BACKEND})

    def engine_for(job, group):
        """The job's engine; engines whose options differ only in the search share one loaded model."""
        key = (job["checkpoint"], job["compiled"], tuple(job["argv"]))
        if key not in engines:
            argv = list(job["argv"]) + (["-ext_compile"] if job["compiled"] else [])
            loaded = (job["checkpoint"], job["compiled"], tuple(job["model_argv"]))

            def shared(*args, **kwargs):
                record({"group": group, "phase": "model", "name": job["name"], "reused": loaded in models})
                if loaded not in models:
                    models[loaded] = load_test_model(*args, **kwargs)
                return models[loaded]

            model_builder.load_test_model = shared  # (what OpenNMT-py's build_translator calls)
            try:
                engine = common.inference_engine(argv)
            finally:
                model_builder.load_test_model = load_test_model
            engines[key] = engine
        return engines[key]

    def once(job, source, group):
        """``(seconds, wall)``: the run's time, and the call's in all (loading the model, the collection)."""
        began = time.perf_counter()
        engine = engine_for(job, group)
        engine.opt.src = str(source)
        # every run starts from the same collector state, outside its time; what survives is frozen (the engines
        # live as long as the process), so that each collection scans only what the runs since made, not the
        # loaded models again (docs/gpu-check.md, section c)
        gc.collect()
        gc.freeze()
        start = time.perf_counter()
        engine.infer_file()
        end = time.perf_counter()
        return end - start, end - began

    for group in groups:
        began = time.monotonic()
        share = (group["deadline"] - began) * group["share"]
        group_deadline, key = began + share, group["key"]
        if share < MIN_START_S:
            record({"group": key, "phase": "skipped", "reason": f"budget ({share:.0f} s left)"})
            continue
        jobs, base = group["jobs"], group["baseline"]
        source, first, warm_s, overheads = Path(group["source"]), {}, [], []
        for job in jobs:  # untimed (compiles), then timed on the test set once: the cost of a run
            left = group_deadline - time.monotonic()
            overhead = statistics.median(overheads) if overheads else 0.0
            if left < 0:
                break
            if not warm_another(first, base, warm_s, group["passes"], group["block"], min_run_s, left, overhead):
                record({"group": key, "phase": "warm-stop", "warmed": len(warm_s),
                        "longest_s": max(warm_s, default=0.0), "left_s": left})
                break
            began_warm = time.monotonic()
            warm, _ = once(job, source, key)
            first[job["name"]], wall = once(job, source, key)
            overheads.append(wall - first[job["name"]])
            if job["name"] != base:
                warm_s.append(time.monotonic() - began_warm)
            record({"group": key, "phase": "warmup", "name": job["name"], "seconds": warm,
                    "estimate": first[job["name"]]})
        if base not in first:
            record({"group": key, "phase": "skipped", "reason": "budget (spent loading and warming up)"})
            continue
        overhead = statistics.median(overheads)
        copies, costs = run_costs(first, min_run_s, overhead)
        candidates = [job["name"] for job in jobs if job["name"] != base and job["name"] in first]
        left = group_deadline - time.monotonic()
        chosen, estimate = plan_cases(costs, costs[base], candidates, group["passes"], group["block"],
                                      PLAN_SHARE * left)
        record({"group": key, "phase": "plan", "copies": copies, "chosen": chosen, "estimate_s": estimate,
                "left_s": left, "costs": costs, "overhead_s": overhead, "sentences": copies * group["sentences"]})
        repeated = timed_runs.repeated_file(source, copies)  # never an earlier run's copy of another test set
        by_name = {job["name"]: job for job in jobs}
        for index, name in enumerate(timed_runs.translation_schedule([base, *chosen], base, group["passes"],
                                                                group["block"])):
            if time.monotonic() > group_deadline:
                break
            seconds, wall = once(by_name[name], repeated, key)
            record({"group": key, "phase": "timed", "index": index, "name": name, "seconds": seconds,
                    "wall_s": wall})
        record({"group": key, "phase": "end", "seconds": time.monotonic() - began, "ended": time.monotonic()})
    Path(result_file).write_text(json.dumps({"done": True}), encoding="utf-8")


def translation_argv(checkpoint, config, source, args, search, output):
    """``onmt_translate`` arguments of one run (see docs/benchmarks-method.md)."""
    from onmt_ext.clause_split import translate_options

    _, _, options = search
    return [str(value) for value in (
        "-model", checkpoint, "-src", source, "-output", output, "-batch_size", args.translate_batch,
        "-batch_type", "sents", "-min_length", args.output_length, "-max_length", args.output_length,
        "-max_length_ratio", 0, "-gpu", 0 if args.device == "cuda" else -1, *translate_options(config), *options)]


def _translation_group(args, models, source, search, compiled, entries, share, deadline):
    """The jobs of one group: the eager baseline and the candidate ``entries`` (in priority order; all eager or
    all ``compiled``) translated with ``search``.  Returns (jobs, the group's record, its rows)."""
    mode, name = ("compiled" if compiled else "eager"), ("beam 4" if search[0] == "translate" else "greedy")
    base_label = f"{BASELINE.label} (eager)"
    by_label = {base_label: (BASELINE, False)}  # (the A/A control runs eager in every group)
    by_label.update({f"{case.label} ({'eager' if case.control else mode})": (case, compiled and not case.control)
                     for case in entries})

    def job(label):
        case, on = by_label[label]
        _, checkpoint, config = models[case]
        return {"name": label, "checkpoint": str(checkpoint), "compiled": on,
                "argv": translation_argv(checkpoint, config, source, args, search, os.devnull),
                "model_argv": translation_argv(checkpoint, config, source, args, (None, None, ()), os.devnull)}

    key = f"{search[0]}-{mode}"
    jobs = {"key": key, "compiled": compiled, "baseline": base_label, "jobs": [job(label) for label in by_label],
            "passes": args.translate_passes, "block": args.translate_block, "share": share, "deadline": deadline,
            "sentences": args.test_sentences, "source": str(source)}
    group = {"key": key, "search": name, "mode": mode,
             "command": "onmt_translate " + shlex.join(jobs["jobs"][0]["argv"]) + " (in one process, -model and "
                        "-src per run)"}
    rows = []
    for label, (case, _) in by_label.items():
        base_mode = "eager (compiled group's reference)" if compiled else "eager"
        rows.append({"case": case.label, "mode": base_mode if label == base_label or case.control else mode,
                     "search": name,
                     "control": case.control, "label": label, "group": key,
                     "target": case.translate_target if name == "beam 4" and label != base_label else None,
                     "paper": case.paper_translate if name == "beam 4" else None})
    return jobs, group, rows


def _compile_description(meta, compiled):
    """One truthful line per group: how the compiled runs were compiled (or that the group is eager)."""
    if not compiled:
        return "none (eager)"
    if meta is None:
        return "-ext_compile (not started)"
    return f"onmt_translate's -ext_compile option, torch.compile backend {meta['backend']}"


def _nearest(timed, index, base, step):
    """The index of the nearest baseline run before (``step`` -1) or after (+1) run ``index``, or None."""
    other = index + step
    while 0 <= other < len(timed):
        if timed[other]["name"] == base:
            return other
        other += step
    return None


def _group_figures(args, group, rows, jobs, runs, stopped):
    """Fills ``group`` and its ``rows`` from the child's runs (those of this group)."""
    mine = [run for run in runs if run.get("group") == group["key"]]
    meta = next((run for run in runs if run.get("phase") == "meta"), None)
    group["compile"] = _compile_description(meta, jobs["compiled"])
    timed = [run for run in mine if run["phase"] == "timed"]
    plan = next((run for run in mine if run["phase"] == "plan"), None)
    ends = [run["seconds"] for run in mine if run["phase"] == "end"]
    group["warmup_s"] = {run["name"]: round(run["seconds"], 2) for run in mine if run["phase"] == "warmup"}
    group["models_reused"] = sorted(run["name"] for run in mine if run["phase"] == "model" and run["reused"])
    group["seconds"] = round(ends[0], 1) if ends else None
    if timed:  # where the group's time went: its timed runs, and around each of them (the collection before it)
        group["timed_runs"] = [[run["name"], round(run["seconds"], 4)] for run in timed]  # in running order
        group["timed_s"] = round(sum(run["seconds"] for run in timed), 2)
        group["run_overhead_s"] = round(statistics.median(run["wall_s"] - run["seconds"] for run in timed), 3)
    if plan:
        group.update(sentences_per_run=plan["sentences"], planned_s=round(plan["estimate_s"], 1),
                     chosen=plan["chosen"])
    skipped = next((run for run in mine if run["phase"] == "skipped"), None)
    warm_stop = next((run for run in mine if run["phase"] == "warm-stop"), None)
    not_warmed = "budget: not warmed up in time"
    if warm_stop:
        not_warmed = (f"budget: not warmed up (with {warm_stop['left_s']:.0f} s left, a warm-up as long as the "
                      f"group's longest, {warm_stop['longest_s']:.1f} s, would leave no room for its runs)")
    if skipped:
        group.update(status="not run", reason=skipped["reason"])
    elif ends and plan:
        group["status"] = "ran"
    elif stopped:
        group.update(status=stopped[0], reason=stopped[1])
    else:
        group.update(status="stopped", reason="budget (its share spent)")
    base = jobs["baseline"]
    sentences = plan["sentences"] if plan else args.test_sentences
    speeds = [sentences / run["seconds"] for run in timed]
    for row in rows:
        label = row.pop("label")
        own = [index for index, run in enumerate(timed) if run["name"] == label]
        if not own:
            if plan and label != base and label not in plan["chosen"]:
                cost = plan["costs"].get(label)
                row.update(status="not run", reason="budget: not chosen for this group (a run takes about "
                                                    f"{cost:.1f} s; {plan['left_s']:.0f} s were left)"
                           if cost else not_warmed)
            else:
                row.update(status=group["status"] if group["status"] in ("failed", "not run") else "not run",
                           reason=group.get("reason", "budget: no timed run"))
            continue
        row.update(status="measured", runs=len(own), sentences_per_s=statistics.median(speeds[i] for i in own),
                   sentences_per_run=sentences)
        if label == base:
            row["ratio"] = 1.0
            continue
        ratios = []
        for index in own:
            before, after = _nearest(timed, index, base, -1), _nearest(timed, index, base, 1)
            if before is not None and after is not None:
                ratios.append(speeds[index] / math.sqrt(speeds[before] * speeds[after]))
        if ratios:
            row["ratio"] = statistics.median(ratios)
            row["ratios"], row["run_ratios"] = len(ratios), [round(ratio, 4) for ratio in ratios]
            interval = timed_runs.median_interval(ratios)
            row["ratio_interval"] = list(interval) if interval else None
            if row["target"] is not None and args.device == "cuda":  # the targets are for a GPU
                row["met"] = row["ratio"] >= row["target"]


#: the share of its part's time left each group of section c gets (greedy, the last of a part: all of it)
GROUP_SHARES = {"translate": 0.85, "greedy": 1.0}


def start_section_c(args, work):
    """Section c's process, started while section b trains so that its start-up (imports, the first model's
    one-off costs) is paid outside section c's time; it waits for :func:`section_c`'s jobs.  On a GPU it starts
    with section b's in-process group, whose own start-up and untimed first run come before any timed run."""
    jobs_file = work / "translate.jobs.json"
    jobs_file.unlink(missing_ok=True)
    env = {"ONMT_EXT_COMPILE_BACKEND": args.compile_backend} if args.compile_backend else {}
    return common.Child(Path(__file__).resolve(), "translate-many", [], work / "translate.log", args.threads,
                        head=(jobs_file, work / "translate.runs.jsonl", args.min_run_seconds,
                              args.budget_b + args.budget_c), env=env)


def section_c(args, schedule, work, models, cases, result, child=None):
    """Section c in one child process (``child``, from :func:`start_section_c`, or started now): the eager groups
    (the A/A control first, then the cases with a decoding target, then the others, as many as fit), then the
    compiled ones, each part before its deadline.  Ratios pair each run with the eager baseline's runs nearest
    before and after it."""
    if BASELINE not in models:
        result.update(status="not run", reason="section b trained no baseline checkpoint")
        if child:
            child.kill()
        return
    source, _, reference_pieces = timed_runs.translation_source(work, args.test_sentences)
    args.output_length = args.output_length or timed_runs.natural_output_length(reference_pieces)
    result.update(output_length=args.output_length, test_sentences=args.test_sentences)
    control = timed_runs.control_case(BASELINE)
    began, specs, deadlines = _now(), [], {}
    for compiled in (False, True):
        mode = "compiled" if compiled else "eager"
        deadlines[mode] = schedule.deadline(f"c {mode}")
        mine = [case for case in cases if case in models]
        if not compiled:
            mine.sort(key=lambda case: case.translate_target is None)
        entries = ([control] if control in models else []) + mine
        specs += [(search, compiled, entries) for search in timed_runs.SEARCHES
                  if f"{search[0]}-{mode}" in args.groups]
    if args.part == "all":
        shares = [GROUP_SHARES[search[0]] for search, _, _ in specs]
    else:  # (one deadline for every group of the part: each its share of the estimates)
        costs = COSTS["cuda" if args.device == "cuda" else "cpu"]
        shares = proportional_shares([sum(seconds for _, seconds in _translate_rows(
            args, [case for case in entries if not case.control], compiled, costs)) for _, compiled, entries in specs])
    built = [_translation_group(args, models, source, search, compiled, entries, share,
                                deadlines["compiled" if compiled else "eager"])
             for (search, compiled, entries), share in zip(specs, shares)]
    jobs_file, runs_file = work / "translate.jobs.json", work / "translate.runs.jsonl"
    runs_file.unlink(missing_ok=True)
    stopped, seconds = None, deadlines["compiled"] - _now()
    if seconds < MIN_START_S:
        stopped = ("not run", "budget")
        if child:
            child.kill()
    else:
        print(f"== gpu-check c: translate, {len(built)} groups in one process ({seconds:.0f} s at most)", flush=True)
        child = child or start_section_c(args, work)
        partial = jobs_file.with_name(jobs_file.name + ".partial")  # the waiting child reads it whole
        partial.write_text(json.dumps([jobs for jobs, _, _ in built]), encoding="utf-8")
        partial.replace(jobs_file)
        try:
            child.finish(timeout=seconds + GRACE_S)
        except common.ChildFailed as failure:
            stopped = ("stopped", "budget") if failure.timed_out else ("failed", str(failure))
    ended = _now()
    runs = common.read_json_lines(runs_file)
    for jobs, group, rows in built:
        _group_figures(args, group, rows, jobs, runs, stopped)
        aa = [row for row in rows if row.get("control")]  # its paired ratios, in running order
        group["aa"] = aa_summary(aa[0].get("run_ratios") if aa else None)
        for row in rows:
            if row.get("ratio") is not None and row["case"] != BASELINE.label and not row.get("control"):
                row["aa_note"] = aa_note(group["aa"])
        # a case without a checkpoint (its training run did not end) is reported, not dropped
        rows += [{"case": case.label, "mode": "eager" if case.control else group["mode"], "search": group["search"],
                  "group": group["key"], "control": case.control, "status": "not run", "reason": "no checkpoint "
                  "(its training run did not end; see section b or the checkpoints' log)",
                  "target": case.translate_target if group["search"] == "beam 4" else None}
                 for case in [control, *cases] if case not in models]
        result["groups"].append(group)
        result["rows"] += rows
    eager_keys = {jobs["key"] for jobs, _, _ in built if not jobs["compiled"]}
    eager_end = max((run["ended"] for run in runs if run.get("group") in eager_keys and "ended" in run),
                    default=min(ended, deadlines["eager"]) if eager_keys else began)
    for mode, start, end in (("eager", began, eager_end), ("compiled", eager_end, ended)):
        statuses = {group["status"] for group in result["groups"] if group["mode"] == mode}
        if statuses or args.part == "all":
            schedule.record(f"c {mode}", start, deadlines[mode], end,
                            "ran" if statuses == {"ran"} else "partly run" if statuses else "not run")


def section_c_status(result):
    measured = [row for row in result["rows"] if row["status"] == "measured"]
    if result.get("status") == "not run":
        return "not run"
    return "ran" if measured and len(measured) == len(result["rows"]) else "partly run"


# ---------------------------------------------------------------- report


def device_info(args):
    import torch

    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()}
    if args.device == "cuda":
        properties = torch.cuda.get_device_properties(0)
        info.update(name=torch.cuda.get_device_name(0), memory_gib=round(properties.total_memory / 2**30, 1),
                    capability=f"{properties.major}.{properties.minor}",
                    cudnn=torch.backends.cudnn.version())
    else:
        info.update(name=f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)")
    return info


def report_name(info, args):
    """``<GPU model>`` (or ``cpu-tiny``, ``cpu``), then ``-<part>`` and ``-<papers>`` unless every one ran."""
    name = ("cpu-tiny" if args.tiny else "cpu") if args.device != "cuda" else (
        re.sub(r"[^A-Za-z0-9.+-]+", "_", info["name"]).strip("_") or "gpu")
    if args.part != "all":
        name += f"-{args.part}"
    if len(args.cases) < len(set(map(paper_of, MECHANISMS))):
        name += "-" + "_".join(args.cases)
    return name


def _met(row):
    if row.get("met") is None:
        return ""
    return " (met)" if row["met"] else " (NOT met)"


def _target(measure, target, measured, at_least=True):
    met = None if measured is None else (measured >= target if at_least else measured <= target)
    return {"measure": measure, "target": f"{'>=' if at_least else '<='} {target:g}", "measured": measured,
            "met": met}


def targets_table(sections, on_gpu, batch_tokens):
    """The targets of issues 29 (decoding, training ratios) and 35 (the GPU-bound baseline) beside what this run
    measured (met: None off a GPU, where they do not apply); ``batch_tokens``: the small and the paper's batch
    (section b's, which names them when it ran)."""
    rows = []
    b, c = sections.get("b", {}), sections.get("c", {})
    train = {row["key"]: row for row in b.get("rows", [])}

    def measured(group, case, batch, field, mode="eager"):
        row = train.get(f"{group}|{case}|{mode}|{batch}", {})
        return row.get(field) if row.get("status") == "measured" else None

    small, paper = b.get("batch_tokens", batch_tokens)
    tokens = measured(FRESH_EXT, "onmt-ext baseline", paper, "tokens_per_s")
    rows.append(_target(f"baseline target tok/s, {paper}-token batches in one pass (the paper's update), the "
                        "config's model_dtype, onmt-ext, users' data path", BASELINE_TOKENS_TARGET, tokens))
    for group, mode, how in ((FRESH_EXT, "eager", ""), (FRESH_LAYERS, LAYERS, ", -ext_compile_layers")):
        if mode == LAYERS:
            rows.append(_target(f"baseline target tok/s, {paper}-token batches in one pass{how}, users' data path",
                                BASELINE_TOKENS_TARGET, measured(group, "onmt-ext baseline", paper, "tokens_per_s",
                                                                 mode)))
        for field, what in (("busy_share", "profiled steps"),
                            ("busy_share_unprofiled", "kernel time of the profiled steps over the unprofiled step")):
            rows.append(_target(f"GPU busy share of the baseline's step{how} ({what}; {paper} tokens)",
                                BASELINE_BUSY_TARGET, measured(group, "onmt-ext baseline", paper, field, mode)))
        for batch in (small, paper):
            ratio = measured(group, "onmt-ext baseline", batch, "ratio", mode)
            if batch == small or ratio is not None:
                rows.append(_target(f"onmt-ext baseline{how} over stock OpenNMT-py, target tok/s, {batch}-token "
                                    "batches, same config and run", STOCK_SPEEDUP_TARGET, ratio))
    syncs = [value for batch in (small, paper)
             if (value := measured(FRESH_EXT, "onmt-ext baseline", batch, "syncs_per_step")) is not None]
    rows.append(_target("host-device synchronisations per step between report steps (onmt-ext baseline, most "
                        "over its users'-path runs)", SYNCS_TARGET, max(syncs) if syncs else None, at_least=False))
    rows.append(_target(f"first step after the model is built, s (onmt-ext baseline, {small} tokens, fresh process)",
                        FIRST_STEP_TARGET_S, measured(FRESH_EXT, "onmt-ext baseline", small, "first_step_s"),
                        at_least=False))
    ext_start = measured(FRESH_EXT, "onmt-ext baseline", small, "startup_s")
    stock_start = measured(FRESH_STOCK, STOCK_LABEL, small, "startup_s")
    overhead = None if ext_start is None or stock_start is None else ext_start - stock_start
    rows.append(_target("start-up overhead of onmt-ext over stock, s (process start to the end of the first step)",
                        STARTUP_OVERHEAD_TARGET_S, overhead, at_least=False))
    cases_batch = b.get("case_batch_tokens", small)
    for case in MECHANISMS:  # the targets are the default path's: compiled where -ext_compile auto compiles
        mode = "compiled" if case.compiles_by_default else "eager"
        key = f"{IN_PROCESS}|{case.label}|{mode}|{cases_batch}"
        if case.train_target is not None and key in train:
            rows.append(_target(f"training ratio, {case.label}, default path: {mode} ({cases_batch} tokens)",
                                case.train_target, measured(IN_PROCESS, case.label, cases_batch, "ratio", mode))
                        | {"aa": train[key].get("aa_note")})
    for case, most in MEMORY_TARGETS:
        if f"{IN_PROCESS}|{case.label}|eager|{cases_batch}" in train:
            rows.append(_target(f"peak memory over the baseline's, {case.label} ({cases_batch} tokens)", most,
                                measured(IN_PROCESS, case.label, cases_batch, "memory_ratio"), at_least=False))
    for row in c.get("rows", []):
        if row.get("target") is not None:
            interval = row.get("ratio_interval")
            rows.append(_target(f"decoding ratio (beam 4), {row['case']}, {row['mode']}", row["target"],
                                row.get("ratio")) | {"interval": interval, "aa": row.get("aa_note")})
    if not on_gpu:
        for row in rows:
            row["met"] = None
    return rows


def _interval_text(interval):
    return "n/a" if not interval else f"{interval[0]:.3f}-{interval[1]:.3f}"


def _run_text(row):
    return f" (run {row['run']})" if row.get("run") else ""


def _interval_speeds(row):
    speeds = row.get("interval_tokens_per_s") or []
    if not speeds:
        return "n/a"
    return f"{fmt(row['median_interval_tokens_per_s'], 0)} ({fmt(min(speeds), 0)}-{fmt(max(speeds), 0)})"


def _over_time_text(row, spans=8):
    """The (step, tok/s) of a row's report intervals in at most ``spans`` spans: each span's steps and median."""
    points = row["interval_points"]
    size = math.ceil(len(points) / spans)
    chunks = [points[start:start + size] for start in range(0, len(points), size)]
    first = row.get("measure_steps", [points[0][0], None])[0]
    texts = []
    for chunk in chunks:
        texts.append(f"steps {first}-{chunk[-1][0]}: {fmt(statistics.median(speed for _, speed in chunk), 0)}")
        first = chunk[-1][0] + 1
    return "; ".join(texts)


def _sites_text(row):
    return "; ".join(f"{site} ×{count}" for site, count in row.get("sync_sites") or []) or "none"


def markdown(report):
    info, sections = report["device"], report["sections"]
    lines = [f"# gpu-check: {info['name']}", "",
             f"- date (UTC): {report['date']}",
             f"- torch {info['torch']}, CUDA {info['cuda'] or 'none'}, Python {info['python']}"
             + (f", compute capability {info['capability']}, {info['memory_gib']} GiB" if "capability" in info else ""),
             f"- command: `{report['command']}`",
             f"- mode: {report['mode']}; total {report['seconds']:.0f} s; torch.compile backend of the compiled rows: "
             f"{report['compile_backend']}",
             f"- commit: {report.get('commit') or 'unknown'} ({report.get('commit_from', 'not known')})",
             f"- part: {report.get('part', 'all')} (sections {report['settings'].get('sections')}; mechanisms of "
             f"{report.get('cases', 'every paper')})", f"- before it started: {report.get('plan', 'no plan')}", "",
             "## Time per part", "",
             "Parts run in this order; each has its share of its section's budget, and the compiled parts also get "
             "the time the parts before them left.", "",
             "| part | budget s | seconds | status |", "|---|---:|---:|---|"]
    lines += [f"| {part['part']} | {part['budget_s']:.0f} | {part['seconds']:.1f} | {part['status']} |"
              for part in report["parts"]]
    lines.append("")
    a = sections.get("a")
    if a:
        lines += [f"## a. Decoding properties ({a['status']}, {a.get('seconds', 0):.0f} s of {a['budget_s']:.0f}; "
                  "every process at once)", ""]
        if a.get("reason"):
            lines += [f"Not run: {a['reason']}.", ""]
        if a.get("runs"):
            lines += ["| dtype | passed | failed | errors | skipped | seconds | status | command |",
                      "|---|---:|---:|---:|---:|---:|---|---|"]
            for run in a["runs"]:
                dtype = run["dtype"] + (f" ({run['share']})" if run.get("share") else "")
                lines.append(f"| {dtype} | {fmt(run.get('passed'))} | {fmt(run.get('failed'))} | "
                             f"{fmt(run.get('errors'))} | {fmt(run.get('skipped'))} | {fmt(run.get('seconds'), 1)} "
                             f"| {run['status']}{': ' + run['reason'] if run.get('reason') else ''} | "
                             f"`{run['command']}` |")
            failures = [f"- {run['dtype']}: {name}" for run in a["runs"] for name in run.get("failures", [])]
            lines += ([""] + ["Failed tests:"] + failures if failures else []) + [""]
    b = sections.get("b")
    if b:
        lines += [f"## b. Training ({b['status']}, {b.get('seconds', 0):.0f} s; data and configs prepared in "
                  f"{b.get('prepare_s', 0):.0f} s, during section a)", "",
                  f"{b.get('steps_text', '')} Ratios: the onmt-ext baseline's rows over stock OpenNMT-py's at the "
                  "same batch size; every other row over the baseline trained the same way in the same process "
                  "(`ratio` against `vs`). Syncs: per step between report steps over the measured steps "
                  f"({b.get('sync_kind', '')}). First step: from the model built to the end of step 1 (batches "
                  "built ahead not counted); start-up: from the process start to the end of step 1.", "",
                  "Busy share: of the profiled steps; busy ms: kernel (or CPU operator) time per profiled step, "
                  "and over the unprofiled step time (the profiler slows the host, not the kernels).", "",
                  "Interval tok/s: the median over the measured steps' report intervals, with the slowest and "
                  "fastest; a recompilation or another one-off stall slows one interval, which the median leaves "
                  "out and the mean (target tok/s) keeps.", "",
                  "| case | mode | process | data path | batch | target tok/s | interval tok/s: median (min-max) "
                  "| ratio (target) | vs | paper | busy share "
                  "| busy ms (share unprofiled) | data wait | step ms | syncs/step | first step s | start-up s "
                  "| peak MB (ratio) | status |",
                  "|---|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        by_key = {row["key"]: row for row in b["rows"]}
        for row in b["rows"]:
            ratio = fmt(row.get("ratio"), 3) + (f" (>= {row['target']:.2f}){_met(row)}" if row["target"] else "")
            ratio += f" ({row['aa_note']})" if row.get("aa_note") else ""
            vs = by_key[row["reference"]]["case"] if row.get("reference") in by_key else "itself"
            if row.get("reference_runs"):
                vs += " (its runs before and after)"
            case = row["case"]
            if row.get("repeat_of"):
                case, vs = f"{case} (run {row['run']})", "the baseline's median"
            elif row.get("control") and row.get("run"):
                case = f"{case} (run {row['run']})"
            elif row.get("runs", 0) > 1:
                case = f"{case} (median of {row['runs']} runs)"
            peak = fmt(row.get("peak_memory_mb"), 0) + (f" ({row['memory_ratio']:.2f}×)"
                                                         if row.get("memory_ratio") is not None else "")
            lines.append(
                f"| {case} | {row['mode']} | {row['group']} | {row['data_path']} | {row['batch_tokens']} | "
                f"{fmt(row.get('tokens_per_s'), 0)} | {_interval_speeds(row)} | {ratio} | {vs} | "
                f"{fmt(row.get('paper'))} | "
                f"{fmt(row.get('busy_share'))} | {fmt(row.get('busy_ms_per_step'), 1)} "
                f"({fmt(row.get('busy_share_unprofiled'))}) | {fmt(row.get('data_wait_share'), 3)} | "
                f"{fmt(row.get('step_ms'), 1)} "
                f"| {fmt(row.get('syncs_per_step'), 1)} | {fmt(row.get('first_step_s'), 2)} | "
                f"{fmt(row.get('startup_s'), 1)} | {peak} | {row['status']}"
                f"{': ' + row['reason'] if row.get('reason') else ''} |")
        if any(row["group"] == IN_PROCESS for row in b["rows"]):
            lines += ["", f"In one process, {aa_text(b.get('aa'))} (its runs spread over the group; on a GPU its "
                      "median should lie within the band, and where it does not, every ratio of the group says so)."]
        over_time = [f"- {row['case']}, {row['batch_tokens']} tokens: {_over_time_text(row)}" for row in b["rows"]
                     if row.get("part") == "fresh" and row.get("interval_points")]
        if over_time:
            lines += ["", "Users'-path rows over time (target tok/s, the median of the report intervals in each span "
                      "of the measured steps; the first steps were not measured):", "", *over_time]
        warm = b.get("warm_up")
        if warm:
            lines += ["", f"Machine warm-up ({warm['status']}{': ' + warm['reason'] if warm.get('reason') else ''}):"
                      f" stock OpenNMT-py on {warm['batch_tokens']}-token batches in the machine's first training "
                      "process, untimed, before them (beside section a), so that neither measured fresh process pays "
                      "alone for loading the CUDA libraries and kernels. Its first step took "
                      f"{fmt(warm.get('first_step_s'), 2)} s and its start-up {fmt(warm.get('startup_s'), 1)} s."]
        ahead = b.get("compile_warm_up") or []
        if ahead:
            done = [row["case"] for row in ahead if row.get("status") == "warmed up"]
            other = [f"{row['case']} ({row.get('status', 'not run')}"
                     f"{': ' + row['reason'] if row.get('reason') else ''})"
                     for row in ahead if row.get("status") != "warmed up"]
            steps = report["settings"].get("compile_warmup_steps")
            lines += ["", f"Compiled ahead ({b.get('compile_warm_up_processes')} untimed processes while section a "
                      f"ran, the measured rows' own configs, {steps} steps each; the "
                      "measured compiled rows load what torch.compile cached on disk): "
                      f"{', '.join(done) or 'none'}." + (f" Not compiled ahead: {'; '.join(other)}." if other else "")]
        profiled = [row for row in b["rows"] if "profile_table" in row]
        lines += ["", "Operator tables of each measured run's profiled steps: `profiles/<this report's name>/` beside "
                  "this report, written after each training process's last run while its budget lasted (at most "
                  f"{TABLES_SHARE:.0%} of section b's) ({sum(row['profile_table'] for row in profiled)} of "
                  f"{len(profiled)} profiled runs)."]
        lines += ["", "Host-device synchronisation call sites over the counted steps (top 5 per run; on CUDA the "
                  "Python caller of each sync warning):", ""]
        lines += [f"- {row['case']}{_run_text(row)}, {row['mode']}, {row['group']}, {row['batch_tokens']}: "
                  f"{_sites_text(row)}" for row in b["rows"] if row.get("status") == "measured"]
        lines += ["", "Configs trained:", ""]
        lines += [f"- {row['case']}, {row['mode']}, {row['group']}, {row['batch_tokens']}: `{row['command']}`"
                  for row in b["rows"] if row.get("command") and not row.get("repeat_of")]
        lines.append("")
    c = sections.get("c")
    if c:
        lines += [f"## c. Translation ({c['status']}, {c.get('seconds', 0):.0f} s)", ""]
        if c.get("reason"):
            lines += [f"Not run: {c['reason']}.", ""]
        made = c.get("checkpoints")
        if made:
            lines += [f"Checkpoints (section b did not run): {made['trained']} of {made['of']} trained in one process, "
                      f"{made['steps']} steps each at {made['batch_tokens']} tokens, not measured; log "
                      f"`{made['log']}`" + (f"; not trained: {made['failed']}" if made["failed"] else "") + ".", ""]
        if c.get("groups"):
            lines += [f"The test set: {c.get('test_sentences')} sentences spread over the Tatoeba test set, repeated "
                      f"in each group until its fastest run takes {c.get('min_run_s', 0):g} s at least; every output "
                      f"forced to {c.get('output_length')} steps. Each case's run sits between baseline runs "
                      f"(at most {c.get('block')} cases apart), {c.get('passes')} passes; a ratio is the median of "
                      "its runs' speeds over the geometric mean of the nearest baseline runs before and after, with "
                      "a distribution-free 95% interval (six ratios or more). Cases that do not fit a group's "
                      "budget are left out in priority order (A/A control, then the cases with a target).", ""]
        for group in c.get("groups", []):
            lines.append(f"- {group['search']}, {group['mode']}: {group.get('status')}"
                         + (f" ({group['reason']})" if group.get("reason") else "")
                         + f", {fmt(group.get('seconds'), 0)} s ({fmt(group.get('timed_s'), 1)} s timed, "
                           f"{fmt(group.get('planned_s'), 1)} s planned; {fmt(group.get('run_overhead_s'), 2)} s "
                           "around each timed run), "
                           f"{fmt(group.get('sentences_per_run'))} sentences "
                           f"per run, {len(group.get('models_reused', []))} models reused from the other search; "
                           f"compilation: {group['compile']}; {aa_text(group.get('aa'))}; `{group['command']}`")
        if c.get("rows"):
            lines += ["", "| case | mode | search | sent/s | ratio (target) | 95% interval | runs | status |",
                      "|---|---|---|---:|---:|---|---:|---|"]
            for row in c["rows"]:
                ratio = fmt(row.get("ratio"), 3) + (f" (>= {row['target']:.2f}){_met(row)}" if row["target"]
                                                     else "") + (f" ({row['aa_note']})" if row.get("aa_note") else "")
                status = row["status"] + (f": {row['reason']}" if row.get("reason") else "")
                lines.append(f"| {row['case']} | {row['mode']} | {row['search']} | "
                             f"{fmt(row.get('sentences_per_s'), 1)} | {ratio} | "
                             f"{_interval_text(row.get('ratio_interval'))} | {row.get('runs', 0)} | {status} |")
            lines += ["", "The JSON report keeps every timed run in running order (`groups[].timed_runs`) and each "
                      "case's paired ratios (`rows[].run_ratios`). The A/A control's, in running order:", ""]
            lines += [f"- {row['search']}, {row['mode']}: " + ", ".join(f"{ratio:.3f}" for ratio in row["run_ratios"])
                      for row in c["rows"] if row.get("control") and row.get("run_ratios")] or ["- none measured"]
        lines.append("")
    on_gpu = report["mode"] == "cuda"
    lines += ["## Targets (issues 29 and 35)", ""]
    if not on_gpu:
        lines += ["The targets are for one H100/H200; off a GPU they are shown, not judged.", ""]
    lines += ["| measure | target | measured | met |", "|---|---:|---:|---|"]
    for row in report["targets"]:
        met = ("n/a (not a GPU run)" if not on_gpu else "n/a (not measured)") if row["met"] is None else (
            "met" if row["met"] else "NOT met")
        shown = fmt(row["measured"], 3) + (f" [{_interval_text(row['interval'])}]" if "interval" in row else "")
        shown += f" ({row['aa']})" if row.get("aa") else ""
        lines.append(f"| {row['measure']} | {row['target']} | {shown} | {met} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- main

COMMIT_ENV = "ONMT_EXT_COMMIT"


def pack_files(args):
    """``--pack``: the operator tables (as ``profiles/<report name>/...``) and the work logs of the child
    processes (``work/...``) in one gzipped tar file."""
    args.pack.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(args.pack, "w:gz") as archive:
        if args.profiles.is_dir():
            archive.add(args.profiles, arcname=f"profiles/{args.profiles.name}")
        for path in sorted(args.work.iterdir()):
            if path.suffix in (".log", ".jsonl", ".xml"):
                archive.add(path, arcname=f"work/{path.name}")
    print(f"== gpu-check: operator tables and logs also in {args.pack}")


def project_commit(given=None):
    """``(commit, where it came from)``: ``--commit``, else ``$ONMT_EXT_COMMIT``, else git when this repository's
    root is the top of its git work tree (a copy inside another repository would name that one's HEAD), else
    ``(None, why)``."""
    if given:
        return given, "--commit"
    if os.environ.get(COMMIT_ENV, "").strip():
        return os.environ[COMMIT_ENV].strip(), f"${COMMIT_ENV}"

    def git(*words):
        try:
            done = subprocess.run(["git", *words], cwd=REPO, capture_output=True, text=True, timeout=10, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if not top:
        return None, "no --commit, no $ONMT_EXT_COMMIT, and not a git checkout"
    if Path(top).resolve() != REPO.resolve():
        return None, f"no --commit or ${COMMIT_ENV}, and the git repository around it ({top}) is not this project's"
    return git("rev-parse", "--short", "HEAD"), "git rev-parse HEAD of this checkout"


#: options whose default differs on a GPU and in the dry run: (type, GPU default, --tiny default, help)
SIZED_OPTIONS = {
    "batch_size": (int, 8192, 512, "training tokens per step"),
    "paper_batch_size": (int, 32768, 2048, "tokens per step of the baseline's runs at the paper's update, in one pass"),
    "num_workers": (int, 2, 1, "data workers of the users'-path runs (the onmt-ext and stock baselines; --tiny: the "
                               "same code path, one worker process fewer to start per run)"),
    "warmup_steps": (int, 5, 2, "unmeasured first steps; also the report interval"),
    "steps": (int, 200, 8, "measured steps of the users'-path runs (fresh processes), a multiple of --warmup-steps"),
    "fresh_warmup_steps": (int, 50, 4, "unmeasured first steps of the users'-path runs: stock OpenNMT-py's speed still "
                                       "rose well past step 30 (issue 57); a multiple of --warmup-steps"),
    "aa_runs": (int, 3, 3, "runs of the A/A control spread over the in-process group"),
    "case_steps": (int, 15, 2, "measured steps of the in-process runs (the same replayed batches for every case), a "
                               "multiple of --warmup-steps"),
    "profile_steps": (int, 3, 1, "profiled steps after the measured ones"),
    "test_sentences": (int, 200, 16, "translation test set"),
    "translate_passes": (int, 6, 3, "timed runs of each case per group; 6 is the fewest with a 95%% interval"),
    "min_run_seconds": (float, 2.0, 0.0, "the test set is repeated until a timed run takes this long"),
    "console_shards": (int, 6, 0, "section a's processes that share fp32's console-script checks (0: they are left "
                                  "out)"),
    "compile_warmups": (int, 3, 0, "processes that compile the compiled rows ahead, while section a runs (the dry "
                                   "run's eager backend leaves nothing on disk to reuse)"),
}


def parse_args(argv):
    parser = common.Parser(prog="gpu_check.py", description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="toy size: smoke configs, a few steps and sentences")
    parser.add_argument("--out", type=Path, default=None,
                        help="report directory (default results/gpu on CUDA, build/gpu-check-tiny otherwise)")
    parser.add_argument("--work", type=Path, default=None,
                        help="models, data and logs (default build/gpu-check/work; off CUDA build/gpu-check-tiny/work)")
    parser.add_argument("--part", default="all", choices=[*PART_STAGES],
                        help="what to run: props (section a), train (b; train-fresh: its users'-path rows, "
                             "train-cases: its in-process group), decode (c, with checkpoints trained for it; "
                             "decode-beam-eager ...: one group), all (default: every section)")
    parser.add_argument("--cases", default=None,
                        help="the mechanisms of the in-process group and of section c, by paper: a comma-separated "
                             "list of li2019, cao2019, chen2019, clause, gret (default all)")
    parser.add_argument("--sections", default="abc", help="which sections to run (default abc; with --part all)")
    parser.add_argument("--fresh-only", action="store_true",
                        help="section b's users'-path rows only (the fresh processes that --fresh names), with "
                             "all of section b's budget; no section c")
    parser.add_argument("--fresh", default="ext,stock",
                        help="which of section b's fresh processes run, in this order: ext (the onmt-ext baseline), "
                             "stock (stock OpenNMT-py), layers (-ext_compile_layers, off by default in training; "
                             "its compilation does not fit the default budget); default ext,stock")
    parser.add_argument("--commit", default=None,
                        help=f"the project's commit for the report (default ${COMMIT_ENV}, else git when this "
                             "checkout is a repository's root, else unknown)")
    for name in "abc":
        parser.add_argument(f"--budget-{name}", type=float, default=None,
                            help=f"seconds for section {name} (default {BUDGETS[name]:.0f}; --tiny "
                                 f"{TINY_BUDGETS[name]:.0f})")
    for name, (kind, gpu, tiny, text) in SIZED_OPTIONS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None,
                            help=f"{text} (default {gpu:g}; --tiny {tiny:g})")
    parser.add_argument("--case-batch-size", type=int, default=None,
                        help="tokens per step of the in-process group, the mechanisms and their baseline (default "
                             "--paper-batch-size: a GPU-bound baseline; --tiny: --batch-size)")
    parser.add_argument("--translate-batch", type=int, default=32, help="sentences per translation batch")
    parser.add_argument("--translate-block", type=int, default=2,
                        help="case runs between two baseline runs (default 2)")
    parser.add_argument("--output-length", type=int, default=0,
                        help="decoding steps of every output; 0: the references' mean length plus one")
    parser.add_argument("--compile-backend", default=None,
                        help="torch.compile backend of the compiled rows (default: onmt-ext's, Inductor; --device "
                             "cpu --tiny: eager, Dynamo's graphs run by eager PyTorch)")
    parser.add_argument("--train-block", type=int, default=2,
                        help="in-process cases between two runs of the baseline (default 2)")
    parser.add_argument("--compile-warmup-steps", type=int, default=3,
                        help="training steps of each compiled row's warm-up (default 3)")
    parser.add_argument("--pack", type=Path, default=None,
                        help="also write the operator tables and the work logs into this one .tgz file (for "
                             "machines that hand back few files)")
    parser.add_argument("--threads", type=int, default=0,
                        help="OMP threads per child (0, the default: torch's default on CUDA, 1 on the CPU)")
    args = parser.parse_args(argv)
    tiny = args.tiny
    for name, (_, gpu, small, _) in SIZED_OPTIONS.items():
        if getattr(args, name) is None:
            setattr(args, name, small if tiny else gpu)
    if args.case_batch_size is None:
        args.case_batch_size = args.batch_size if tiny else args.paper_batch_size
    args.given_budgets = {name: getattr(args, f"budget_{name}") for name in "abc"}
    for name in "abc":
        if getattr(args, f"budget_{name}") is None:
            setattr(args, f"budget_{name}", (TINY_BUDGETS if tiny else BUDGETS)[name])
    papers = list(dict.fromkeys(map(paper_of, MECHANISMS)))
    args.cases = papers if args.cases is None else [name.strip() for name in args.cases.split(",") if name.strip()]
    if not args.cases or set(args.cases) - set(papers):
        parser.error(f"--cases: a comma-separated list of {', '.join(papers)}")
    if args.part != "all" and (args.sections != "abc" or args.fresh_only):
        parser.error("--sections and --fresh-only go with --part all; a part chooses its own")
    if args.compile_backend is None and args.device == "cpu" and tiny:
        args.compile_backend = "eager"
    if args.threads == 0 and args.device == "cpu":
        args.threads = 1
    if set(args.sections) - set("abc") or not args.sections:
        parser.error(f"--sections {args.sections!r}: use letters from abc")
    args.fresh = [name.strip() for name in args.fresh.split(",") if name.strip()]
    if not args.fresh or set(args.fresh) - set(FRESH_NAMES.values()):
        parser.error(f"--fresh: a comma-separated list of {', '.join(FRESH_NAMES.values())}")
    if min(args.batch_size, args.paper_batch_size, args.case_batch_size, args.warmup_steps, args.steps,
           args.case_steps, args.profile_steps, args.test_sentences, args.translate_passes, args.translate_batch,
           args.translate_block, args.train_block, args.compile_warmup_steps, args.fresh_warmup_steps,
           args.aa_runs) < 1 \
            or min(args.num_workers, args.compile_warmups, args.console_shards, args.output_length,
                   args.min_run_seconds) < 0:
        parser.error("sizes, steps, sentences and passes must be >= 1, --num-workers, --compile-warmups, "
                     "--console-shards, --output-length and --min-run-seconds >= 0")
    if args.steps % args.warmup_steps or args.case_steps % args.warmup_steps or \
            args.fresh_warmup_steps % args.warmup_steps:
        parser.error("--steps, --case-steps and --fresh-warmup-steps must be multiples of --warmup-steps (the report "
                     "interval)")
    apply_part(args, args.part)
    if any(getattr(args, f"budget_{name}") <= 0 for name in "abc"):
        parser.error("budgets must be > 0 seconds")
    if args.out is None:
        args.out = REPO / ("results/gpu" if args.device == "cuda" else "build/gpu-check-tiny")
    if args.work is None:
        args.work = REPO / "build" / ("gpu-check" if args.device == "cuda" else "gpu-check-tiny") / "work"
    return args


CHILDREN = {"train-many": child_train_many, "translate-many": child_translate_many}


def _steps_text(args):
    plan = step_plan(args, args.case_steps)
    counted = ("" if plan["counted"] == plan["measure"] else f", then {args.warmup_steps} steps whose host reads "
               "are counted (counting slows every operator)")
    return (f"Every run: unmeasured first steps ({args.fresh_warmup_steps} on the users' path, past a fresh "
            f"process's warm-up; {args.warmup_steps} in one process), measured steps ({args.steps} on the users' "
            f"path, {args.case_steps} in one process; reports every {args.warmup_steps}), then {args.profile_steps} "
            f"profiled steps (busy share){counted}; the in-process group starts with an untimed run of the "
            f"baseline's {args.warmup_steps} warm-up steps (a process's first run pays one-off costs).")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return common.child_main(argv, CHILDREN)
    args = parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"gpu_check.py: error: no CUDA device visible to torch {torch.__version__} "
              f"(CUDA build: {torch.version.cuda or 'none'}); `python tools/gpu_check.py --device cpu --tiny` "
              "is the CPU dry run", file=sys.stderr)
        return 2
    if not (REPO / "build/tatoeba/vocab.en").exists():
        print("gpu_check.py: error: build/tatoeba is missing; run `make data` first (or carry build/tatoeba)",
              file=sys.stderr)
        return 2
    if args.tiny is False and args.device == "cpu":
        print("gpu_check.py: note: Base size on the CPU takes far longer than the budgets; --tiny is the dry run",
              file=sys.stderr)
    args.work.mkdir(parents=True, exist_ok=True)
    started, wall = datetime.datetime.now(datetime.timezone.utc), _now()
    info = device_info(args)
    args.profiles = args.out / "profiles" / report_name(info, args)  # the operator tables of the profiled steps
    print(f"== gpu-check on {info['name']} (torch {info['torch']}, CUDA {info['cuda']}); report into {args.out}",
          flush=True)
    everything = TINY_MECHANISMS if args.tiny else MECHANISMS
    cases = [case for case in everything if paper_of(case) in args.cases]
    planned = plan_line(args, cases, everything)
    print(planned, flush=True)  # before it starts: what will not fit, and the parts that would measure it
    schedule, sections, models, cuda = Schedule(args), {}, {}, args.device == "cuda"
    commit, commit_from = project_commit(args.commit)
    a_began, a_deadline = _now(), schedule.deadline("a") if "a" in schedule.stages else None
    if "a" in args.sections:
        a_result, a_started = start_section_a(args, args.work)
    began_warm, warm_deadline = _now(), None  # (without section a, a stage of their own)
    if "b" in args.sections and "b warm-up" in schedule.stages:
        warm_deadline = schedule.deadline("b warm-up")
    checkpoints = "c" in args.sections and "c checkpoints" in schedule.stages  # section c without section b
    if checkpoints:
        began_checkpoints, checkpoints_deadline = _now(), schedule.deadline("c checkpoints")
    plan = training_plan(args, cases) if "b" in args.sections else checkpoint_plan(args, cases) if checkpoints else []
    if plan:  # the data (SentencePiece'd, clause-split, repeated) and every config, while section a runs
        prepared = _now()
        repeat_cache = {}
        configs = prepare_training(args, args.work, plan, repeat_cache)
    if "b" in args.sections:
        b = sections["b"] = {"title": "training", "rows": [row for _, _, _, rows in plan for row, _, _, _ in rows],
                             "prepare_s": round(_now() - prepared, 1), "steps_text": _steps_text(args),
                             "batch_tokens": (args.batch_size, args.paper_batch_size),
                             "case_batch_tokens": args.case_batch_size,
                             "sync_kind": "torch's CUDA sync warnings" if cuda else "host reads of tensor values"}
        print(f"== gpu-check b: data and configs prepared in {b['prepare_s']:.0f} s", flush=True)
        # with section a, the warm-up shares its time; without it, its own stage (--part all: a tenth of b's budget)
        if warm_deadline is None:
            warm_deadline = a_deadline if "a" in args.sections else _now() + 0.1 * args.budget_b
        warm_entry = warm_up_plan(args)
        b["warm_up"] = warm_entry[0]
        warm_thread = start_warm_up(args, args.work, warm_entry, configs, repeat_cache, warm_deadline)
        compile_threads, b["compile_warm_up"] = start_compile_warm_up(args, args.work, plan, configs, warm_deadline)
        b["compile_warm_up_processes"] = len(compile_threads)
    if "a" in args.sections:
        sections["a"] = finish_section_a(a_result, a_started, a_deadline)
        sections["a"].update(budget_s=round(a_deadline - a_began, 1), seconds=round(_now() - a_began, 1))
        schedule.record("a", a_began, a_deadline, _now(), sections["a"]["status"])
    if "c" in args.sections:
        sections["c"] = {"title": "translation", "rows": [], "groups": [], "passes": args.translate_passes,
                         "block": args.translate_block, "min_run_s": args.min_run_seconds}
        if not plan or args.fresh_only:
            sections["c"].update(status="not run", reason="--fresh-only" if plan else "section c translates "
                                 "section b's checkpoints; run it with b")
    if "b" in args.sections:
        for thread in [warm_thread, *compile_threads]:
            thread.join(timeout=max(0.0, warm_deadline - _now()) + GRACE_S + 1)
        if "b warm-up" in schedule.stages:
            schedule.record("b warm-up", began_warm, warm_deadline, _now(),
                            "ran" if b["warm_up"].get("status") == "measured" else "partly run")
    if "b" in args.sections and "b fresh" in schedule.stages:
        began, deadline = _now(), schedule.deadline("b fresh", whole=args.fresh_only and args.part == "all")
        fresh = [(group, env, rows) for name, group, env, rows in plan if name == "b fresh"]
        for (group, env, rows), share in zip(fresh, fresh_deadlines(began, deadline, len(fresh))):
            run_training_process(args, args.work, group, env, rows, configs, {"fresh": share})
        fresh_rows = [row for _, _, rows in fresh for row, _, _, _ in rows]
        schedule.record("b fresh", began, deadline, _now(), section_b_status(fresh_rows))
    translator = None
    if checkpoints:  # section c's checkpoints (section b does not run), while its process starts
        translator = start_section_c(args, args.work)
        (_, group, env, rows), = plan
        run_training_process(args, args.work, group, env, rows, configs, {"eager": checkpoints_deadline})
        schedule.record("c checkpoints", began_checkpoints, checkpoints_deadline, _now(),
                        "ran" if all(row.get("status") == "trained" for row, *_ in rows) else "partly run")
        models = {case: (configs[row["key"]][0].stem, configs[row["key"]][1], row["options"])
                  for row, case, _, _ in rows if row.get("status") == "trained"}
        sections["c"]["checkpoints"] = {
            "trained": len(models), "of": len(rows), "steps": step_plan(args, *_run_steps(args, group))["total"],
            "batch_tokens": args.batch_size, "log": str(args.work / f"train-{_slug(group)}.log"),
            "failed": {row["case"]: row.get("reason") for row, *_ in rows if row.get("status") != "trained"}}
    if "b" in args.sections and not args.fresh_only:
        (_, group, env, rows), = [entry for entry in plan if entry[0] == "b in-process"]
        if "c" in args.sections:
            translator = start_section_c(args, args.work)
        began, deadlines = _now(), {mode: schedule.deadline(f"b {mode}") for mode in ("eager", "compiled")}
        try:
            ends = run_training_process(args, args.work, group, env, rows, configs, deadlines)
        except BaseException:
            if translator:
                translator.kill()
            raise
        eager_end = ends["eager"] or min(_now(), deadlines["eager"])
        for mode, start, end in (("eager", began, eager_end), ("compiled", eager_end, _now())):
            schedule.record(f"b {mode}", start, deadlines[mode], end,
                            section_b_status([row for row, _, _, _ in rows if row.get("part", row["mode"]) == mode]))
        models = {case: (configs[row["key"]][0].stem, configs[row["key"]][1], row["options"])
                  for row, case, mode, _ in rows if mode == "eager" and row.get("status") == "measured"
                  and row.get("run", 1) == 1}
    if "c" in args.sections and plan and not args.fresh_only:
        section_c(args, schedule, args.work, models, cases, sections["c"], translator)
    for part in schedule.parts:
        print(f"== gpu-check {part['part']}: {part['status']} in {part['seconds']:.0f} s (budget "
              f"{part['budget_s']:.0f} s)", flush=True)
    if "b" in sections:
        sections["b"]["aa"] = training_ratios(sections["b"]["rows"], cuda)
        sections["b"]["status"] = section_b_status(sections["b"]["rows"])
    for letter in "bc":
        if letter in sections:
            mine = [part for part in schedule.parts if part["part"][0] == letter]
            sections[letter].update(budget_s=round(sum(part["budget_s"] for part in mine), 1),
                                    seconds=round(sum(part["seconds"] for part in mine), 1))
    if "c" in sections:
        sections["c"]["status"] = section_c_status(sections["c"])
    report = {
        "format": 2, "mode": "cuda" if cuda else ("cpu-tiny" if args.tiny else "cpu"),
        "device": info, "date": started.strftime("%Y-%m-%d %H:%M:%S"), "seconds": round(_now() - wall, 1),
        "command": "python tools/gpu_check.py " + shlex.join(argv), "commit": commit, "commit_from": commit_from,
        "compile_backend": args.compile_backend or "inductor (onmt-ext's default)",
        "settings": {key: str(value) for key, value in vars(args).items()},
        "part": args.part, "cases": ", ".join(args.cases), "plan": planned.removeprefix("== gpu-check "),
        "parts": schedule.parts, "sections": sections,
    }
    report["targets"] = targets_table(sections, cuda, (args.batch_size, args.paper_batch_size))
    args.out.mkdir(parents=True, exist_ok=True)
    name = report_name(info, args)
    (args.out / f"{name}.json").write_text(json.dumps(report, indent=1, default=str) + "\n", encoding="utf-8")
    (args.out / f"{name}.md").write_text(markdown(report), encoding="utf-8")
    print(markdown(report))
    print(f"== gpu-check: {args.out / name}.md and .json ({report['seconds']:.0f} s)")
    if args.pack:
        pack_files(args)
    failed = any(run.get("status") == "failed" for run in sections.get("a", {}).get("runs", []))
    failed |= any(row.get("status") == "failed" for key in "bc" for row in sections.get(key, {}).get("rows", []))
    failed |= any(group.get("status") == "failed" for group in sections.get("c", {}).get("groups", []))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
