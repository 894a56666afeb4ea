#!/usr/bin/env python
"""The GPU check: decoding properties, training and translation speed of every mechanism on one CUDA GPU.

Usage::

    python tools/gpu_check.py [--device cuda|cpu] [--tiny] [--out DIR] [--work DIR] [--sections abc]
        [--budget-a S] [--budget-b S] [--budget-c S] [--batch-size 8192] [--num-workers 2]
        [--warmup-steps N] [--steps N] [--profile-steps N] [--test-sentences N] [--translate-passes N]

Three sections, each with a time budget (a started run is stopped when its
section's budget is spent, and what did not run is listed in the report):

a. the decoding-property suite (tests/integration/test_decoding_properties.py)
   through pytest, on one smoke config per mechanism and combined/all_mechanisms,
   in fp32 and under fp16 and bf16 autocast;
b. training at Transformer-Base (the paper configs on the Tatoeba sample,
   pre-encoded once and repeated so that no epoch ends while measuring): target
   tokens/s, ratio to the baseline, GPU-busy share of the step time, peak memory,
   eager and with ``-ext_compile``, with an A/A control;
c. translation sentences/s, beam 4 and greedy, eager and compiled, every output
   forced to the same length, as ratios to the baseline in the same run.

``--device cpu --tiny`` runs every section at toy size (the smoke configs, a
few steps and sentences) on the CPU, into build/gpu-check-tiny/ by default.
The report is ``<out>/<device name>.md`` and ``.json``; its format is in
docs/gpu-check.md.  Exit status: 0 when the report is written and everything
that ran passed or was measured; 1 when the report is written but a property
test failed or a run failed; 2 when nothing could run (no CUDA device, missing
data, bad arguments).  Targets missed are reported, not failures.
"""

import argparse
import datetime
import json
import math
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402
from bench import Case  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PROPERTY_TEST = "tests/integration/test_decoding_properties.py"
PROPERTY_VARIABLES = ("ONMT_EXT_TEST_DEVICE", "ONMT_EXT_TEST_AUTOCAST", "ONMT_EXT_TEST_CONFIGS")

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
#: Section b and c cases with the targets of issue 29 (section 5): training and decoding ratios to the baseline.
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
         translate_target=0.80, pre_encoded=True),
    Case("cao2019 cross aggregation, enc [1-6]", "cao2019/transformer_base_wmt17_zhen_cross_zero.yaml",
         train_target=0.85, translate_target=0.97, pre_encoded=True),
    Case("chen2019 RPEHead (enc + dec)", "chen2019/transformer_base_nist_zhen_rpehead.yaml",
         train_target=0.93, paper_train=10.5 / 11.7, pre_encoded=True),
    Case("chen2019 MPRHead (enc + dec)", "chen2019/transformer_base_nist_zhen_mprhead.yaml",
         train_target=0.90, paper_train=9.9 / 11.7, pre_encoded=True),
    Case("clause attention, rule, pre-split", "clause/transformer_base_wmt16_ende_ca_rule.yaml",
         train_target=0.93, translate_target=0.97, pre_encoded=True),
    Case("GRET", "gret/transformer_base_wmt17_zhen_gret.yaml", train_target=0.95, translate_target=0.97,
         pre_encoded=True),
)
TINY_MECHANISMS = MECHANISMS[:1]
#: the baseline's own targets (issue 29, section 5)
BASELINE_TOKENS_TARGET = 100_000
BASELINE_BUSY_TARGET = 0.90

#: per-section seconds on a GPU and in the CPU dry mode (the whole GPU run is meant to fit in 8 minutes)
BUDGETS = {"a": 90.0, "b": 290.0, "c": 80.0}
TINY_BUDGETS = {"a": 42.0, "b": 45.0, "c": 22.0}
#: a new run is not started with less than this many seconds of its section's budget left
MIN_START_S = 3.0
#: a compiled run is assumed to take at least this many times as long as its eager twin (it compiles first)
COMPILE_FACTOR = 1.5


def _now():
    return time.monotonic()


class Section:
    """A section's clock: its budget, its start, and whether a new run may still begin."""

    def __init__(self, name, budget):
        self.name, self.budget, self.start = name, budget, _now()

    def left(self):
        return self.budget - (_now() - self.start)

    def elapsed(self):
        return _now() - self.start


# ---------------------------------------------------------------- section a


def property_suite_support():
    """None when the property suite reads ONMT_EXT_TEST_*; otherwise why section a cannot run."""
    texts = [(REPO / name).read_text(encoding="utf-8") for name in (PROPERTY_TEST, "tests/support.py")
             if (REPO / name).exists()]
    missing = [name for name in PROPERTY_VARIABLES if not any(name in text for text in texts)]
    if missing:
        return f"{PROPERTY_TEST} does not read {', '.join(missing)} yet"
    return None


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


def section_a(args, clock, work):
    result = {"title": "decoding properties", "budget_s": clock.budget, "runs": []}
    reason = property_suite_support()
    if reason:
        result.update(status="not run", reason=reason)
        return result
    configs = TINY_PROPERTY_CONFIGS if args.tiny else PROPERTY_CONFIGS
    dtypes = TINY_PROPERTY_DTYPES if args.tiny else PROPERTY_DTYPES
    for index, dtype in enumerate(dtypes):
        share = clock.left() / (len(dtypes) - index)  # what is left, shared by the dtypes still to run
        env = dict(os.environ, ONMT_EXT_TEST_DEVICE=args.device, ONMT_EXT_TEST_AUTOCAST=dtype,
                   ONMT_EXT_TEST_CONFIGS=",".join(configs))
        xml = work / f"properties-{dtype}.xml"
        # the dry run leaves out the suite's slow tier (the console-script checks, which train a model first)
        tier = ["-m", "not slow"] if args.tiny else []
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", PROPERTY_TEST, *tier,
                   f"--junitxml={xml}"]
        shown = (f"ONMT_EXT_TEST_DEVICE={args.device} ONMT_EXT_TEST_AUTOCAST={dtype} "
                 f"ONMT_EXT_TEST_CONFIGS={','.join(configs)} python -m pytest -q {PROPERTY_TEST} {shlex.join(tier)}"
                 ).rstrip()
        run = {"dtype": "fp32" if dtype == "none" else dtype, "configs": list(configs), "command": shown}
        if share < MIN_START_S:
            run.update(status="not run", reason="time budget spent")
            result["runs"].append(run)
            continue
        print(f"== gpu-check a: properties, autocast {dtype} ({share:.0f} s at most)", flush=True)
        start = _now()
        log = work / f"properties-{dtype}.log"
        xml.unlink(missing_ok=True)
        with open(log, "w", encoding="utf-8") as out:
            child = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
            try:
                code = child.wait(timeout=share)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, 9)
                child.wait()
                code = None
        run["seconds"] = round(_now() - start, 1)
        run["log"] = str(log)
        if code is None:
            run.update(status="stopped", reason=f"time budget spent after {run['seconds']} s")
        elif not xml.exists():
            run.update(status="failed", reason=f"pytest exited {code} without a report; see {log}")
        else:
            run.update(junit_counts(xml))
            run["status"] = "passed" if code == 0 and run["tests"] else "failed"
        result["runs"].append(run)
    statuses = {run["status"] for run in result["runs"]}
    result["status"] = "ran" if statuses <= {"passed", "failed"} else "partly run"
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


def busy_seconds(events, cuda):
    """Seconds during which at least one CUDA kernel (``cuda``) or one CPU operator ran, from profiler events."""
    from torch.autograd import DeviceType

    wanted = DeviceType.CUDA if cuda else DeviceType.CPU
    intervals = [(event.time_range.start, event.time_range.end) for event in events
                 if event.device_type == wanted and event.time_range.end > event.time_range.start]
    return _merge(intervals) / 1e6


def _instrument_training(first_step, count, cuda):
    """Patches OpenNMT-py's trainer to time the data wait of every step and to profile steps
    ``first_step .. first_step + count - 1`` (wall time, busy time); returns the collecting function."""
    import torch
    from onmt import trainer as trainer_module

    trainer_class = trainer_module.Trainer
    waits, window = [], {}
    accum, accumulate = trainer_class._accum_batches, trainer_class._gradient_accumulation

    def timed_batches(self, iterator):
        batches = accum(self, iterator)
        while True:
            start = time.perf_counter()
            try:
                item = next(batches)
            except StopIteration:
                return
            waits.append(time.perf_counter() - start)
            yield item

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def profiled(self, *args, **kwargs):
        step = self.optim.training_step  # the step this call makes (1-based)
        if step == first_step:
            sync()
            activities = [torch.profiler.ProfilerActivity.CPU]
            if cuda:
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            window["profiler"] = torch.profiler.profile(activities=activities)
            window["profiler"].__enter__()
            window["start"] = time.perf_counter() - (waits[-1] if waits else 0.0)  # this step's data wait too
        out = accumulate(self, *args, **kwargs)
        if step == first_step + count - 1 and "profiler" in window:
            sync()
            window["end"] = time.perf_counter()
            window["profiler"].__exit__(None, None, None)
        return out

    trainer_class._accum_batches = timed_batches
    trainer_class._gradient_accumulation = profiled

    def collect():
        figures = {"data_wait_s": waits}
        if "end" in window:
            wall = window["end"] - window["start"]
            events = window["profiler"].events()
            figures.update(profile_wall_s=wall, profile_busy_s=busy_seconds(events, cuda), profile_steps=count)
        return figures

    return collect


def child_train(result_file, head, argv):
    """bench.child_train with steps timed and profiled; ``head``: the first profiled step, their number, the
    device, and ``save`` or ``nosave`` (a compiled run's checkpoint is not used, so it is not written)."""
    first, count, device, save = int(head[0]), int(head[1]), head[2], head[3]
    if save == "nosave":
        from onmt.models import model_saver

        model_saver.ModelSaverBase.save = lambda self, *args, **kwargs: None
    bench.child_train(result_file, argv, instrument=lambda: _instrument_training(first, count, device == "cuda"))


def _repeat_factor(config, tokens_needed):
    """How many copies of the training corpus an epoch needs to outlast ``tokens_needed`` target tokens."""
    corpus = next(value for key, value in config["data"].items() if key != "valid")
    lines = (REPO / corpus["path_tgt"]).read_text(encoding="utf-8").splitlines()  # pre-encoded: pieces
    tokens = sum(len(line.split()) + 1 for line in lines)  # + the end-of-sentence token
    return max(1, math.ceil(2 * tokens_needed / tokens))  # twice: batches are padded and buckets cut short


class Settings:
    """What section b's configs need from bench.bench_config (its ``args``)."""

    def __init__(self, args):
        self.batch_size = args.batch_size
        self.warmup_steps = args.warmup_steps
        self.steps = args.steps + args.profile_steps  # the profiled steps come last; their reports are not used
        self.gpu = 0 if args.device == "cuda" else -1


def training_config(case, mode, args, work, repeat_cache):
    """Writes the config of ``case`` in ``mode`` (eager/compiled); returns (path, checkpoint, options)."""
    settings = Settings(args)
    size = "smoke" if args.tiny else "paper"
    paper = bench.yaml.safe_load((bench.CONFIGS / case.config).read_text(encoding="utf-8"))
    overrides = {"num_workers": args.num_workers, "report_every": args.warmup_steps}
    if args.tiny:
        twin = bench.yaml.safe_load((bench.CONFIGS / "smoke" / case.config).read_text(encoding="utf-8"))
        overrides.update(enc_layers=twin["enc_layers"], dec_layers=twin["dec_layers"], batch_size=args.batch_size,
                         valid_batch_size=args.batch_size)
    else:
        overrides.update(bucket_size=max(2048, 2 * args.batch_size),
                         model_dtype=paper.get("model_dtype", "fp32") if args.device == "cuda" else "fp32")
    if mode == "compiled":
        overrides["ext_compile"] = True
    total = args.warmup_steps + settings.steps
    key = case.config
    if key not in repeat_cache:  # the corpus as the case reads it, to count its tokens once
        _, _, plain = bench.bench_config(case, size, settings, work, overrides=overrides, suffix=f"_{mode}")
        repeat_cache[key] = _repeat_factor(plain, args.batch_size * total)
    return bench.bench_config(case, size, settings, work, overrides=overrides, suffix=f"_{mode}",
                              repeat=repeat_cache[key])


def _train_figures(result, args, cuda):
    """Section b's figures of one run from the child's result."""
    reports = result["reports"]
    measured = reports[1:1 + args.steps // args.warmup_steps]  # after the warm-up's, before the profiled steps

    if not measured:
        raise bench.ChildFailed(f"no training report between the warm-up and the profiled steps ({len(reports)})")
    tokens, seconds = sum(r["tgt_tokens"] for r in measured), sum(r["seconds"] for r in measured)
    first, last = args.warmup_steps, args.warmup_steps + args.steps  # steps first+1 .. last are measured
    waits = result["data_wait_s"][first:last]
    figures = {
        "tokens_per_s": tokens / seconds,
        "measured_steps": args.steps,
        "step_ms": 1000 * seconds / args.steps,
        "data_wait_share": sum(waits) / seconds if waits else None,
        "peak_memory_mb": result["peak_memory_mb"],
        "parameters": result["parameters"],
    }
    if result.get("profile_wall_s"):
        figures["busy_share"] = result["profile_busy_s"] / result["profile_wall_s"]
        figures["busy_kind"] = "CUDA kernels" if cuda else "CPU operators"
    return figures


def section_b(args, clock, work, cases):
    """Trains every case eager (baseline and A/A control first), then every mechanism with -ext_compile."""
    result = {"title": "training", "budget_s": clock.budget, "rows": []}
    cuda = args.device == "cuda"
    control = bench.control_case(BASELINE)
    eager = [(case, "eager") for case in cases]
    # the A/A control right after the baseline; in the dry run after the mechanisms, whose code paths matter more
    plan = [(BASELINE, "eager")] + ([(control, "eager")] + eager if not args.tiny else eager + [(control, "eager")])
    plan += [(case, "compiled") for case in cases]
    # the data (SentencePiece'd, clause-split, repeated) and every config first, outside the training budget
    repeat_cache, models, took, prepared = {}, {}, {}, _now()
    configs = {(case, mode): training_config(case, mode, args, work, repeat_cache) for case, mode in plan}
    result["prepare_s"] = round(_now() - prepared, 1)
    print(f"== gpu-check b: data and configs prepared in {result['prepare_s']:.0f} s", flush=True)
    clock.start = _now()
    for case, mode in plan:
        row = {"case": case.label, "mode": mode, "config": f"yaml_configs/{case.config}",
               "target": case.train_target, "paper": case.paper_train, "control": case.control}
        result["rows"].append(row)
        # a run is not started when it cannot end in time: an eager run takes about as long as the longest one
        # so far, a compiled run longer than its eager twin (it compiles first)
        estimate = (COMPILE_FACTOR * took.get((case, "eager"), 0.0) if mode == "compiled"
                    else max(took.values(), default=0.0))
        if clock.left() < max(MIN_START_S, estimate):
            row.update(status="not run", reason=f"time budget spent ({clock.left():.0f} s left, "
                                                f"about {estimate:.0f} s needed)")
            continue
        path, checkpoint, config = configs[(case, mode)]
        head = (args.warmup_steps + args.steps + 1, args.profile_steps, args.device,
                "save" if mode == "eager" else "nosave")
        row["command"] = f"onmt_train -config {path}"
        row["options"] = config
        print(f"== gpu-check b: train {case.label} ({mode}, {clock.left():.0f} s left)", flush=True)
        start = _now()
        try:
            child = bench.run_child("train", ["-config", path], work / f"{path.stem}.train.log", args.threads,
                                    script=Path(__file__).resolve(), timeout=clock.left(), head=head)
            row.update(_train_figures(child, args, cuda), status="measured")
            if mode == "eager":
                models[case] = (path.stem, checkpoint, config)
        except bench.ChildFailed as failure:
            row.update(status="stopped" if failure.timed_out else "failed", reason=str(failure))
        row["seconds"] = round(_now() - start, 1)
        if row["status"] == "measured":
            took[(case, mode)] = row["seconds"]
    base = next((row for row in result["rows"] if row["case"] == BASELINE.label and row["status"] == "measured"),
                None)
    for row in result["rows"]:
        if base and row["status"] == "measured":
            row["ratio"] = row["tokens_per_s"] / base["tokens_per_s"]
            if row["target"] is not None and cuda:  # the targets are for a GPU
                row["met"] = row["ratio"] >= row["target"]
    result["status"] = "ran" if all(row["status"] == "measured" for row in result["rows"]) else "partly run"
    return result, models


# ---------------------------------------------------------------- section c: translation


def _translate_parser_knows(option):
    from onmt.bin.translate import _get_parser

    return any(f"-{option}" in action.option_strings for action in _get_parser()._actions)


def child_translate_many(result_file, head, argv):
    """Section c in one process: for each group of the jobs file (``head[0]``), a warm-up run of every
    (checkpoint, mode), then the timed schedule.  Every finished run is appended to ``head[1]`` (JSON lines) at
    once, so that a stop at the time budget keeps the runs done.  ``head[2]``: the monotonic deadline.  Each
    group gets an even share of the time left; a compiled group is skipped when its share is shorter than
    COMPILE_FACTOR times the longest eager group."""
    import onmt  # noqa: F401  (onmt-ext's start-up hook)
    from onmt.bin.translate import _get_parser
    from onmt.inference_engine import InferenceEnginePY
    from onmt.utils.parse import ArgumentParser

    from onmt_ext import compile as ext_compile

    groups = json.loads(Path(head[0]).read_text(encoding="utf-8"))
    runs_file, deadline = Path(head[1]), float(head[2])
    cli_compile = _translate_parser_knows("ext_compile")
    engines = {}

    def engine_for(job):
        key = (job["checkpoint"], job["compiled"], tuple(job["argv"]))
        if key not in engines:
            argv = list(job["argv"]) + (["-ext_compile"] if job["compiled"] and cli_compile else [])
            opt = _get_parser().parse_args(argv)
            ArgumentParser.validate_translate_opts(opt)
            ArgumentParser._get_all_transform_translate(opt)
            ArgumentParser._validate_transforms_opts(opt)
            ArgumentParser.validate_translate_opts_dynamic(opt)
            engine = InferenceEnginePY(opt)
            if job["compiled"] and not cli_compile:  # what -ext_compile does when the model is built
                ext_compile.enable(engine.translator.model, True)
            engines[key] = engine
        return engines[key]

    def record(entry):
        with open(runs_file, "a", encoding="utf-8") as out:
            out.write(json.dumps(entry) + "\n")

    def once(job):
        engine = engine_for(job)
        start = time.perf_counter()
        engine.infer_file()
        return time.perf_counter() - start

    eager_seconds = []
    for number, group in enumerate(groups):
        began = time.monotonic()
        share = (deadline - began) / (len(groups) - number)
        if share <= 0 or (group["compiled"] and share < COMPILE_FACTOR * max(eager_seconds, default=0.0)):
            record({"group": group["key"], "phase": "skipped", "share_s": share})
            continue
        group_deadline = began + share
        for phase in ("warmup", "timed"):
            for number_in_phase, job in enumerate(group[phase]):
                if time.monotonic() > group_deadline:
                    break
                record({"group": group["key"], "phase": phase, "index": number_in_phase, "name": job["name"],
                        "seconds": once(job), "cli_compile": cli_compile})
        took = time.monotonic() - began
        record({"group": group["key"], "phase": "end", "seconds": took})
        if not group["compiled"]:
            eager_seconds.append(took)
    Path(result_file).write_text(json.dumps({"done": True}), encoding="utf-8")


def translation_argv(checkpoint, config, source, args, search, output):
    """``onmt_translate`` arguments of one run (see bench.measure_translation)."""
    from onmt_ext.clause_split import translate_options

    _, _, options = search
    return [str(value) for value in (
        "-model", checkpoint, "-src", source, "-output", output, "-batch_size", args.translate_batch,
        "-batch_type", "sents", "-min_length", args.output_length, "-max_length", args.output_length,
        "-max_length_ratio", 0, "-gpu", 0 if args.device == "cuda" else -1, *translate_options(config), *options)]


def _translation_group(args, models, source, search, compiled, entries):
    """The jobs of one group: the eager baseline and ``entries`` (cases, all eager or all ``compiled``)
    translated with ``search``, each warmed up once, then each case's run between two of the baseline's
    (bench.translation_schedule).  Returns (jobs, the group's record, its rows, the baseline's label)."""
    mode, name = ("compiled" if compiled else "eager"), ("beam 4" if search[0] == "translate" else "greedy")
    base_label = f"{BASELINE.label} (eager)"
    by_label = {base_label: (BASELINE, False)}
    by_label.update({f"{case.label} ({mode})": (case, compiled) for case in entries})
    labels = list(by_label)
    schedule = bench.translation_schedule(labels, labels[0], args.translate_passes)

    def job(label):
        case, on = by_label[label]
        _, checkpoint, config = models[case]
        return {"name": label, "checkpoint": str(checkpoint), "compiled": on,
                "argv": translation_argv(checkpoint, config, source, args, search, os.devnull)}

    key = f"{search[0]}-{mode}"
    jobs = {"key": key, "compiled": compiled, "warmup": [job(label) for label in labels],
            "timed": [job(label) for label in schedule]}
    group = {"key": key, "search": name, "mode": mode, "timed_runs": len(schedule),
             "command": "onmt_translate " + shlex.join(jobs["timed"][0]["argv"])
                        + (" -ext_compile" if compiled else "") + " (in one process, -model per run)"}
    rows = []
    for label in labels:
        case, _ = by_label[label]
        base_mode = "eager (compiled group)" if compiled else "eager"
        rows.append({"case": case.label, "mode": base_mode if label == base_label else mode, "search": name,
                     "control": case.control, "label": label,
                     "target": case.translate_target if name == "beam 4" and label != base_label else None,
                     "paper": case.paper_translate if name == "beam 4" else None})
    return jobs, group, rows, base_label


def _group_figures(args, group, rows, base_label, runs, stopped):
    """Fills ``group`` and its ``rows`` from the child's runs (those of this group)."""
    mine = [run for run in runs if run["group"] == group["key"]]
    timed = [run for run in mine if run["phase"] == "timed"]
    group["warmup_s"] = {run["name"]: round(run["seconds"], 2) for run in mine if run["phase"] == "warmup"}
    ends = [run["seconds"] for run in mine if run["phase"] == "end"]
    group["seconds"] = round(ends[0], 1) if ends else None  # None: stopped in its course
    if group["mode"] == "compiled" and mine:
        group["compile_option"] = ("onmt_translate -ext_compile" if any(run.get("cli_compile") for run in mine)
                                   else "onmt_ext.compile.enable on the loaded model (onmt_translate has no "
                                        "-ext_compile)")
    if any(run["phase"] == "skipped" for run in mine):
        group.update(status="not run", reason="time budget spent (its share is shorter than compiling takes)")
    elif len(timed) == group["timed_runs"]:
        group["status"] = "ran"
    elif stopped and not ends:  # the group the child was in when it stopped, or one it never reached
        group.update(status=stopped[0], reason=stopped[1] + (f" ({len(timed)} of {group['timed_runs']} timed runs "
                                                             "done)" if mine else ""))
    else:
        group.update(status="stopped", reason=f"its share of the time budget spent after {len(timed)} of "
                                               f"{group['timed_runs']} timed runs")
    speeds = [args.test_sentences / run["seconds"] for run in timed]
    for row in rows:
        label = row.pop("label")
        own = [index for index, run in enumerate(timed) if run["name"] == label]
        if not own:
            row.update(status="failed" if group["status"] == "failed" else "not run",
                       reason=group.get("reason", "no timed run"))
            continue
        row.update(status="measured", runs=len(own), sentences_per_s=statistics.median(speeds[i] for i in own))
        if label == base_label:
            row["ratio"] = 1.0
            continue
        ratios = [speeds[i] / math.sqrt(speeds[i - 1] * speeds[i + 1]) for i in own if i + 1 < len(timed)]
        if ratios:
            row["ratio"] = statistics.median(ratios)
            interval = bench.median_interval(ratios)
            row["ratio_interval"] = list(interval) if interval else None
            if row["target"] is not None and args.device == "cuda":  # the targets are for a GPU
                row["met"] = row["ratio"] >= row["target"]


def section_c(args, clock, work, models, cases):
    """Translation speed: groups (beam and greedy, eager then compiled) in one child process; ratios are paired
    with the eager baseline's runs beside each run, as in tools/bench.py."""
    result = {"title": "translation", "budget_s": clock.budget, "rows": [], "groups": []}
    if BASELINE not in models:
        result.update(status="not run", reason="section b trained no baseline checkpoint")
        return result
    source, _, reference_pieces = bench._test_source(work, args.test_sentences)
    args.output_length = args.output_length or bench.natural_output_length(reference_pieces)
    result["output_length"], result["test_sentences"] = args.output_length, args.test_sentences
    control = bench.control_case(BASELINE)
    eager = ([control] if control in models else []) + [case for case in cases if case in models]
    plan = [(search, False, eager) for search in bench.SEARCHES]
    plan += [(search, True, [case for case in cases if case in models]) for search in bench.SEARCHES]
    built = [_translation_group(args, models, source, search, compiled, entries)
             for search, compiled, entries in plan if entries]
    jobs_file, runs_file = work / "translate.jobs.json", work / "translate.runs.jsonl"
    jobs_file.write_text(json.dumps([jobs for jobs, _, _, _ in built]), encoding="utf-8")
    runs_file.unlink(missing_ok=True)
    stopped = None
    if clock.left() < MIN_START_S:
        stopped = ("not run", "time budget spent")
    else:
        print(f"== gpu-check c: translate, {len(built)} groups in one process ({clock.left():.0f} s at most)",
              flush=True)
        try:
            bench.run_child("translate-many", [], work / "translate.log", args.threads,
                            script=Path(__file__).resolve(), timeout=clock.left(),
                            head=(jobs_file, runs_file, time.monotonic() + max(1.0, clock.left() - 2)))
        except bench.ChildFailed as failure:
            stopped = ("stopped" if failure.timed_out else "failed", str(failure))
    runs = ([json.loads(line) for line in runs_file.read_text(encoding="utf-8").splitlines()]
            if runs_file.exists() else [])
    for _, group, rows, base_label in built:
        _group_figures(args, group, rows, base_label, runs, stopped)
        result["groups"].append(group)
        result["rows"] += rows
    measured = [row for row in result["rows"] if row["status"] == "measured"]
    result["status"] = "ran" if measured and len(measured) == len(result["rows"]) else "partly run"
    return result


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
    if args.device != "cuda":
        return "cpu-tiny" if args.tiny else "cpu"
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", info["name"]).strip("_") or "gpu"


def _fmt(value, digits=2):
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _met(row):
    if row.get("met") is None:
        return ""
    return " (met)" if row["met"] else " (NOT met)"


def targets_table(sections, on_gpu):
    """Issue 29's targets (section 5) beside what this run measured (met: None off a GPU, where they do not
    apply)."""
    rows = []
    b, c = sections.get("b", {}), sections.get("c", {})
    train = {(row["case"], row["mode"]): row for row in b.get("rows", [])}
    for row in c.get("rows", []):
        if row.get("target") is not None:
            rows.append({"measure": f"decoding (beam 4), {row['case']}, {row['mode']}", "target": row["target"],
                         "measured": row.get("ratio"), "met": row.get("met")})
    for (case, mode), row in train.items():
        if row.get("target") is not None:
            rows.append({"measure": f"training, {case}, {mode}", "target": row["target"],
                         "measured": row.get("ratio"), "met": row.get("met")})
    base = train.get((BASELINE.label, "eager"), {})
    tokens, busy = base.get("tokens_per_s"), base.get("busy_share")
    rows.append({"measure": "baseline training target tokens/s (Base, the config's model_dtype)",
                 "target": BASELINE_TOKENS_TARGET, "measured": tokens,
                 "met": None if tokens is None else tokens >= BASELINE_TOKENS_TARGET})
    rows.append({"measure": "GPU-busy share of the baseline's step time", "target": BASELINE_BUSY_TARGET,
                 "measured": busy, "met": None if busy is None else busy >= BASELINE_BUSY_TARGET})
    if not on_gpu:
        for row in rows:
            row["met"] = None
    return rows


def markdown(report):
    info, sections = report["device"], report["sections"]
    lines = [f"# gpu-check: {info['name']}", "",
             f"- date (UTC): {report['date']}",
             f"- torch {info['torch']}, CUDA {info['cuda'] or 'none'}, Python {info['python']}"
             + (f", compute capability {info['capability']}, {info['memory_gib']} GiB" if "capability" in info else ""),
             f"- command: `{report['command']}`",
             f"- mode: {report['mode']}; total {report['seconds']:.0f} s",
             "- commit: " + (report.get("commit") or "unknown"), ""]
    a = sections.get("a")
    if a:
        lines += [f"## a. Decoding properties ({a['status']}, {a.get('seconds', 0):.0f} s of {a['budget_s']:.0f})", ""]
        if a.get("reason"):
            lines += [f"Not run: {a['reason']}.", ""]
        if a.get("runs"):
            lines += ["| dtype | passed | failed | errors | skipped | seconds | status | command |",
                      "|---|---:|---:|---:|---:|---:|---|---|"]
            for run in a["runs"]:
                lines.append(f"| {run['dtype']} | {_fmt(run.get('passed'))} | {_fmt(run.get('failed'))} | "
                             f"{_fmt(run.get('errors'))} | {_fmt(run.get('skipped'))} | {_fmt(run.get('seconds'), 1)} "
                             f"| {run['status']}{': ' + run['reason'] if run.get('reason') else ''} | "
                             f"`{run['command']}` |")
            failures = [f"- {run['dtype']}: {name}" for run in a["runs"] for name in run.get("failures", [])]
            lines += ([""] + ["Failed tests:"] + failures if failures else []) + [""]
    b = sections.get("b")
    if b:
        lines += [f"## b. Training ({b['status']}, {b.get('seconds', 0):.0f} s of {b['budget_s']:.0f}; data and "
                  f"configs prepared before, in {b.get('prepare_s', 0):.0f} s)", "",
                  "| case | mode | target tok/s | ratio (target) | paper | busy share | data wait | step ms | "
                  "peak MB | status | command |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
        for row in b["rows"]:
            ratio = _fmt(row.get("ratio"), 3) + (f" (>= {row['target']:.2f}){_met(row)}" if row["target"] else "")
            lines.append(
                f"| {row['case']} | {row['mode']} | {_fmt(row.get('tokens_per_s'), 0)} | {ratio} | "
                f"{_fmt(row.get('paper'))} | {_fmt(row.get('busy_share'))} | {_fmt(row.get('data_wait_share'), 3)} | "
                f"{_fmt(row.get('step_ms'), 1)} | {_fmt(row.get('peak_memory_mb'), 0)} | {row['status']}"
                f"{': ' + row['reason'] if row.get('reason') else ''} | "
                f"`{row.get('command', '')}` |")
        lines.append("")
    c = sections.get("c")
    if c:
        lines += [f"## c. Translation ({c['status']}, {c.get('seconds', 0):.0f} s of {c['budget_s']:.0f})", ""]
        if c.get("reason"):
            lines += [f"Not run: {c['reason']}.", ""]
        for group in c.get("groups", []):
            lines.append(f"- {group['search']}, {group['mode']}: {group.get('status')}"
                         + (f" ({group['reason']})" if group.get("reason") else "")
                         + f", {_fmt(group.get('seconds'), 0)} s; `{group['command']}`"
                         + (f"; compiled via {group['compile_option']}" if group.get("compile_option") else ""))
        if c.get("rows"):
            lines += ["", f"{c['test_sentences']} sentences, every output forced to {c['output_length']} steps.", "",
                      "| case | mode | search | sent/s | ratio (target) | 95% interval | runs | status |",
                      "|---|---|---|---:|---:|---|---:|---|"]
            for row in c["rows"]:
                ratio = _fmt(row.get("ratio"), 3) + (f" (>= {row['target']:.2f}){_met(row)}" if row["target"]
                                                     else "")
                interval = row.get("ratio_interval")
                interval = "n/a" if not interval else f"{interval[0]:.3f}-{interval[1]:.3f}"
                status = row["status"] + (f": {row['reason']}" if row.get("reason") else "")
                lines.append(f"| {row['case']} | {row['mode']} | {row['search']} | "
                             f"{_fmt(row.get('sentences_per_s'), 1)} | {ratio} | {interval} | {row.get('runs', 0)} | "
                             f"{status} |")
        lines.append("")
    on_gpu = report["mode"] == "cuda"
    lines += ["## Targets (issue 29, section 5)", ""]
    if not on_gpu:
        lines += ["The targets are for one H100/H200; off a GPU they are shown, not judged.", ""]
    lines += ["| measure | target | measured | met |", "|---|---:|---:|---|"]
    for row in report["targets"]:
        met = ("n/a (not a GPU run)" if not on_gpu else "n/a (not measured)") if row["met"] is None else (
            "met" if row["met"] else "NOT met")
        lines.append(f"| {row['measure']} | {row['target']} | {_fmt(row['measured'], 3)} | {met} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- main


def _commit():
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10, check=False)
        return done.stdout.strip() or None
    except OSError:
        return None


class _Parser(argparse.ArgumentParser):
    """Bad arguments: one line, ``gpu_check.py: error: ...``, exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse_args(argv):
    parser = _Parser(prog="gpu_check.py", description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="toy size: smoke configs, a few steps and sentences")
    parser.add_argument("--out", type=Path, default=None,
                        help="report directory (default results/gpu on CUDA, build/gpu-check-tiny otherwise)")
    parser.add_argument("--work", type=Path, default=None, help="models, data and logs (default build/gpu-check)")
    parser.add_argument("--sections", default="abc", help="which sections to run (default abc)")
    for name in "abc":
        parser.add_argument(f"--budget-{name}", type=float, default=None,
                            help=f"seconds for section {name} (default {BUDGETS[name]:.0f}; --tiny "
                                 f"{TINY_BUDGETS[name]:.0f})")
    parser.add_argument("--batch-size", type=int, default=None, help="training tokens per step (default 8192; "
                                                                     "--tiny 512)")
    parser.add_argument("--num-workers", type=int, default=None,
                        help="training data workers (default 2; --tiny 0, where starting them would take longer "
                             "than the steps)")
    parser.add_argument("--warmup-steps", type=int, default=None, help="unmeasured first steps (default 10; "
                                                                       "--tiny 4); also the report interval")
    parser.add_argument("--steps", type=int, default=None,
                        help="measured steps, a multiple of --warmup-steps (default 30; --tiny 8)")
    parser.add_argument("--profile-steps", type=int, default=None,
                        help="profiled steps after the measured ones (default 5; --tiny 4)")
    parser.add_argument("--test-sentences", type=int, default=None, help="per translation (default 200; --tiny 16)")
    parser.add_argument("--translate-batch", type=int, default=32, help="sentences per translation batch")
    parser.add_argument("--translate-passes", type=int, default=None,
                        help="timed passes over the cases per search (default 3; --tiny 1)")
    parser.add_argument("--output-length", type=int, default=0,
                        help="decoding steps of every output; 0: the references' mean length plus one")
    parser.add_argument("--threads", type=int, default=0,
                        help="OMP threads per child (0, the default: torch's default on CUDA, 1 on the CPU)")
    args = parser.parse_args(argv)
    tiny = args.tiny
    defaults = {"batch_size": (8192, 512), "num_workers": (2, 0), "profile_steps": (5, 4), "warmup_steps": (10, 4),
                "steps": (30, 8), "test_sentences": (200, 16), "translate_passes": (3, 1)}  # (GPU, --tiny)
    for name, (full, small) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, small if tiny else full)
    for name in "abc":
        if getattr(args, f"budget_{name}") is None:
            setattr(args, f"budget_{name}", (TINY_BUDGETS if tiny else BUDGETS)[name])
    if args.threads == 0 and args.device == "cpu":
        args.threads = 1
    if set(args.sections) - set("abc") or not args.sections:
        parser.error(f"--sections {args.sections!r}: use letters from abc")
    if min(args.batch_size, args.warmup_steps, args.steps, args.profile_steps, args.test_sentences,
           args.translate_passes, args.translate_batch) < 1 or args.num_workers < 0 or args.output_length < 0:
        parser.error("sizes, steps, sentences and passes must be >= 1, --num-workers and --output-length >= 0")
    if args.steps % args.warmup_steps:
        parser.error("--steps must be a multiple of --warmup-steps (the report interval)")
    if any(getattr(args, f"budget_{name}") <= 0 for name in "abc"):
        parser.error("budgets must be > 0 seconds")
    if args.out is None:
        args.out = REPO / ("results/gpu" if args.device == "cuda" else "build/gpu-check-tiny")
    if args.work is None:
        args.work = REPO / "build" / ("gpu-check" if args.device == "cuda" else "gpu-check-tiny") / "work"
    return args


CHILDREN = {"train": child_train, "translate-many": child_translate_many}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        kind, result_file = argv[1], argv[2]
        split = argv.index("--")
        import onmt  # noqa: F401  (onmt-ext's start-up hook)

        return CHILDREN[kind](result_file, argv[3:split], argv[split + 1:])
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
    print(f"== gpu-check on {info['name']} (torch {info['torch']}, CUDA {info['cuda']}); report into {args.out}",
          flush=True)
    cases = TINY_MECHANISMS if args.tiny else MECHANISMS
    sections, models = {}, {}
    for name in "abc":
        if name not in args.sections:
            continue
        clock = Section(name, getattr(args, f"budget_{name}"))
        if name == "a":
            sections["a"] = section_a(args, clock, args.work)
        elif name == "b":
            sections["b"], models = section_b(args, clock, args.work, cases)
        elif "b" not in args.sections:
            sections["c"] = {"title": "translation", "budget_s": clock.budget, "status": "not run",
                             "reason": "section c translates section b's checkpoints; run it with b", "rows": []}
        else:
            sections["c"] = section_c(args, clock, args.work, models, cases)
        sections[name]["seconds"] = round(clock.elapsed(), 1)
        print(f"== gpu-check {name}: {sections[name]['status']} in {clock.elapsed():.0f} s "
              f"(budget {clock.budget:.0f} s)", flush=True)
    report = {
        "format": 1, "mode": "cuda" if args.device == "cuda" else ("cpu-tiny" if args.tiny else "cpu"),
        "device": info, "date": started.strftime("%Y-%m-%d %H:%M:%S"), "seconds": round(_now() - wall, 1),
        "command": "python tools/gpu_check.py " + shlex.join(argv), "commit": _commit(),
        "settings": {key: str(value) for key, value in vars(args).items()},
        "sections": sections,
    }
    report["targets"] = targets_table(sections, args.device == "cuda")
    args.out.mkdir(parents=True, exist_ok=True)
    name = report_name(info, args)
    (args.out / f"{name}.json").write_text(json.dumps(report, indent=1, default=str) + "\n", encoding="utf-8")
    (args.out / f"{name}.md").write_text(markdown(report), encoding="utf-8")
    print(markdown(report))
    print(f"== gpu-check: {args.out / name}.md and .json ({report['seconds']:.0f} s)")
    failed = any(run.get("status") == "failed" for run in sections.get("a", {}).get("runs", []))
    failed |= any(row.get("status") == "failed" for key in "bc" for row in sections.get(key, {}).get("rows", []))
    failed |= any(group.get("status") == "failed" for group in sections.get("c", {}).get("groups", []))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
