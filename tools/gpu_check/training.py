"""Section b of the GPU check, the parent's side: each row's training config, the shared data prepared once, the
warm-up and compile-ahead processes, the training processes started and read back, and the ratios to the
baseline."""

import json
import math
import re
import statistics
import subprocess
import sys
import threading
import time

import yaml

from tools import common
from tools import timed_runs
from tools.gpu_check.cases import HALF_WEIGHTS, MECHANISMS, REPO, TINY_LINES, aa_note, aa_summary
from tools.gpu_check.plan import (
    CHECKPOINTS, FRESH_AA, FRESH_EXT, GRACE_S, IN_PROCESS, LAYERS, MIN_START_S, PART_STAGES, TABLES_SHARE, WARM_UP,
    monotonic_now, run_steps, step_plan, warm_up_when,
)


def _repeat_factor(config, tokens_needed):
    """How many copies of the training corpus an epoch needs to outlast ``tokens_needed`` target tokens."""
    corpus = next(value for key, value in config["data"].items() if key != "valid")
    lines = (REPO / corpus["path_tgt"]).read_text(encoding="utf-8").splitlines()  # pre-encoded: pieces
    tokens = sum(len(line.split()) + 1 for line in lines)  # + the end-of-sentence token
    return max(1, math.ceil(2 * tokens_needed / tokens))  # twice: batches are padded and buckets cut short


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
                    steps=None, warmup=None, binarized=False):
    """Writes the config of ``case`` in ``mode`` (eager/compiled); returns (path, checkpoint, options).

    ``replay``: no data workers (the batches are built ahead in the training process); otherwise
    ``--num-workers``, the users' path.  ``stock``: the config without onmt-ext's options, for stock
    OpenNMT-py (a case with a mechanism cannot be one).  ``steps``, ``warmup``: see :func:`step_plan`.
    ``binarized``: the training corpora read from the cache ``-ext_binarized_cache <work>/binarized`` (as
    ``make reproduce-*`` trains), which :func:`start_binarizing` fills beforehand."""
    batch_size = batch_size or args.batch_size
    settings = Settings(args, batch_size, steps, warmup)
    size, lines = ("smoke", TINY_LINES) if args.tiny else ("paper", None)
    paper = common.config_values(case.config)
    twin = common.config_values(f"smoke/{case.config}") if args.tiny else None
    overrides = {"num_workers": 0 if replay else args.num_workers, "report_every": args.warmup_steps,
                 "batch_size": batch_size, "valid_batch_size": batch_size}
    if args.tiny:
        overrides.update(enc_layers=twin["enc_layers"], dec_layers=twin["dec_layers"])
    else:
        overrides["model_dtype"] = paper.get("model_dtype", "fp32") if args.device == "cuda" else "fp32"
    overrides["bucket_size"] = max(2048, 2 * batch_size)
    if mode in ("compiled", "eager") and case in MECHANISMS:
        overrides["ext_compile"] = mode == "compiled"  # eager pinned: the default (auto) compiles some on CUDA
    elif mode == LAYERS:
        overrides["ext_compile_layers"] = True
    if binarized:
        overrides["ext_binarized_cache"] = str(work / "binarized")
    if case == HALF_WEIGHTS:
        source = twin if args.tiny else paper  # the config the row trains; its dtype: the override's, if any
        overrides.update(half_weights_overrides(overrides.get("model_dtype") or source.get("model_dtype", "fp32"),
                                                source.get("batch_size_multiple")))
    # one repeated corpus per case and batch size, long enough for the longest run (--steps or --case-steps)
    longest = max(step_plan(args, *run_steps(args, group))["total"] for group in (IN_PROCESS, FRESH_EXT))
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


def half_weights_overrides(dtype, multiple):
    """The options that make the baseline :data:`HALF_WEIGHTS`'s row, from the baseline's ``model_dtype`` and
    ``batch_size_multiple`` there: ``-ext_half_weights`` needs ``-model_dtype fp16``, which a GPU run's baseline has.
    Where the baseline trains in another dtype (the dry run's smoke config: fp32), the row trains in fp16 with the
    baseline's batch multiple (OpenNMT-py's default is 8 in fp16, else 1), so that it replays the baseline's
    batches; off CUDA autocast stays off, so its float16 copies are refreshed every step but never used."""
    if dtype == "fp16":
        return {"ext_half_weights": True}
    return {"ext_half_weights": True, "model_dtype": "fp16", "batch_size_multiple": multiple or 1}


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
    the monotonic ``deadline`` (beside section a, or in a part's ``b warm-up`` stage).  torch.compile keeps what it
    generates on disk (Inductor's FX graph and AOTAutograd caches, and Triton's kernels), so the measured compiled
    runs of section b load their cores instead of compiling them.  Returns ``(threads, rows)``: one row per case,
    filled in place as its run ends."""
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
    when = warm_up_when(args.sections, [name for name, *_ in PART_STAGES[args.part][1]])
    print(f"== gpu-check b: compiling {len(entries)} compiled rows ahead in {len(shares)} process(es), untimed, "
          f"{when}", flush=True)
    return threads, [row for row, _, _, _ in entries]


def prepare_training(args, work, plan, cache):
    """Writes every config of ``plan`` (data SentencePiece'd, clause-split and repeated once, the repeat factor
    kept in ``cache``, see :func:`training_config`); returns ``{row key: (path, checkpoint, options)}``."""
    configs = {}
    for _, _, _, rows in plan:
        for row, case, mode, extra in rows:
            steps, warmup = run_steps(args, row["group"])
            configs[row["key"]] = training_config(case, mode, args, work, cache, batch_size=row["batch_tokens"],
                                                  replay=extra.get("replay", False), stock=extra.get("stock", False),
                                                  binarized=extra.get("binarized", False), name=row["name"],
                                                  steps=steps, warmup=warmup)
            row["command"] = f"onmt_train -config {configs[row['key']][0]}"
            row["options"] = configs[row["key"]][2]
    return configs


class Binarizing:
    """``onmt_ext_binarize`` of every binarised row's config of a plan (it fills their ``-ext_binarized_cache``),
    one config after the other in a thread (started by :func:`start_binarizing` while the earlier processes run).
    ``failed``: row key -> (status, reason) once the thread has ended."""

    def __init__(self, work, rows, configs):
        self.log = work / "binarize.log"
        self.jobs = [(row["key"], configs[row["key"]][0]) for row in rows]
        self.failed, self.seconds = {}, None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        began = time.monotonic()
        with open(self.log, "w", encoding="utf-8") as log:
            for key, config in self.jobs:
                log.write(f"== onmt_ext_binarize -config {config}\n")
                log.flush()
                done = subprocess.run([sys.executable, "-m", "onmt_ext.integration.binarize", "-config", str(config)],
                                      cwd=REPO, stdout=log, stderr=subprocess.STDOUT, check=False)
                if done.returncode:
                    self.failed[key] = ("failed", f"onmt_ext_binarize failed (exit {done.returncode}; its output in "
                                                  f"{self.log.name})")
        self.seconds = round(time.monotonic() - began, 1)

    def wait(self, deadline):
        """Wait until the monotonic ``deadline`` at most; returns ``{row key: (status, reason)}`` for each row whose
        data is not ready (failed, or still binarising)."""
        self.thread.join(timeout=max(0.0, deadline - monotonic_now()))
        if self.thread.is_alive():
            return {key: ("not run", f"budget: its data was still being binarised ({self.log.name})")
                    for key, _ in self.jobs}
        return dict(self.failed)


def start_binarizing(work, plan, configs):
    """A started :class:`Binarizing` for the rows of ``plan`` whose config reads binarised data, or None."""
    rows = [row for _, _, _, entries in plan for row, _, _, _ in entries
            if configs[row["key"]][2].get("ext_binarized_cache")]
    if not rows:
        return None
    binarizing = Binarizing(work, rows, configs)
    binarizing.thread.start()
    print(f"== gpu-check b: binarising the data of {len(rows)} rows (-ext_binarized_cache) in the background",
          flush=True)
    return binarizing


def file_slug(text):
    """``text`` as a piece of a file name: lower case, each run of other characters than a-z and 0-9 one ``-``."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


#: options that shape the model, the optimiser or the output files, not the training batches; every other option
#: is part of :func:`replay_key` (an option left out of this list costs a rebuild, never a wrong batch)
MODEL_ONLY_OPTIONS = {"save_data", "save_model", "encoder_type", "decoder_type", "share_decoder_embeddings",
                      "learning_rate", "learning_rate_decay", "decay_method", "ext_compile", "ext_compile_layers",
                      "gret", "clause_attention", "clause_levels", "ext_half_weights"}
MODEL_ONLY_PREFIXES = ("li2019_", "cao2019_", "chen2019_", "gret_")


def replay_key(options):
    """What decides a run's training batches: its options less :data:`MODEL_ONLY_OPTIONS` (and prefixes), as
    text, ``model_dtype`` as the batch multiple it gives by default (OpenNMT-py's iterator: 8 in fp16, else 1).
    Runs of one process with the same key replay the batches that the first of them built."""
    kept = {key: value for key, value in options.items()
            if key not in MODEL_ONLY_OPTIONS and not key.startswith(MODEL_ONLY_PREFIXES)}
    dtype = kept.pop("model_dtype", "fp32")
    if kept.get("batch_size_multiple") is None:
        kept["batch_size_multiple"] = 8 if dtype == "fp16" else 1
    return json.dumps(kept, sort_keys=True, default=str)


def run_training_process(args, work, group, env, rows, configs, deadlines, stop_after=None):
    """One training process for ``rows`` (see :func:`child_train_many`), each run before the deadline of its
    mode (``deadlines``: mode -> monotonic time); fills the rows in place and returns when each mode's last
    run ended (or None).  ``stop_after``: every run is an untimed warm-up that ends after that many steps."""
    steps = step_plan(args, *run_steps(args, group))
    jobs = [{"key": row["key"], "config": str(configs[row["key"]][0]), "replay": "replayed" in row["data_path"],
             "replay_key": replay_key(configs[row["key"]][2]),
             "batches": (stop_after or steps["total"]) + 2,
             # a checkpoint for section c: each eager case's first run (section c decodes no half-weights row)
             "save": row["group"] in (IN_PROCESS, CHECKPOINTS) and row["mode"] == "eager" and row.get("run", 1) == 1
             and case != HALF_WEIGHTS,
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
             else str(args.profiles / f"{file_slug(row['key'])}.txt")}
            for row, case, _, _ in rows]
    if stop_after:
        for job in jobs:
            job.update(warmup=True, stop_after=stop_after, profile_file=None)
    if group == IN_PROCESS:  # the first run in a process pays one-off costs: an untimed run of the first case's
        # warm-up steps (it also builds the batches that the first case replays)
        jobs.insert(0, dict(jobs[0], key="process warm-up", warmup=True, save=False, profile_file=None,
                            stop_after=args.warmup_steps))
    slug = file_slug(group)
    jobs_file, runs_file = work / f"train-{slug}.jobs.json", work / f"train-{slug}.runs.jsonl"
    jobs_file.write_text(json.dumps(jobs), encoding="utf-8")
    runs_file.unlink(missing_ok=True)
    log = work / f"train-{slug}.log"
    stopped, seconds = None, max(deadlines.values()) - monotonic_now()
    if seconds < MIN_START_S:
        stopped = "not run: budget"
    else:
        section = "c" if group == CHECKPOINTS else "b"
        print(f"== gpu-check {section}: {group}: {len(jobs)} run{'s' * (len(jobs) != 1)} ({seconds:.0f} s at most)",
              flush=True)
        child_env = dict(env)
        if args.compile_backend:
            child_env["ONMT_EXT_COMPILE_BACKEND"] = args.compile_backend
        try:
            common.run_child("tools.gpu_check", "train-many", [], log, args.threads,
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
    then shows the median of its runs.  Returns ``{"aa": the in-process group's A/A summary (:func:`aa_summary`;
    None without that group), "fresh_aa": the users' path's, per batch size (:func:`users_path_aa`)}``; each ratio
    of a group whose A/A is outside its band gets its note (:func:`note_group`)."""
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
    summary = note_group(in_process) if in_process else None
    return {"aa": summary, "fresh_aa": users_path_aa(rows)}


def note_group(group):
    """The A/A summary (:func:`aa_summary`) of the control rows among ``group`` (one group's rows with a
    reference); each other ratio of the group gets its note (:func:`aa_note`) when the summary is outside its band
    or has no measured run."""
    summary = aa_summary([row["ratio"] for row in group if row.get("control") and "ratio" in row])
    note = aa_note(summary)
    for row in group:
        if note and "ratio" in row and not row.get("control"):
            row["aa_note"] = note
    return summary


def users_path_aa(rows):
    """The users'-path A/A control (``--fresh ...,aa``: the onmt-ext baseline again in a fresh process, its ratio
    over ext's): ``[{"batch_tokens", "aa": its summary}]``, one per batch size, each flagging the users'-path ratios
    of its batch (:func:`note_group`: a batch's noise need not be the other's); None where it was not planned.  One
    ratio per batch size, so each summary's interval is that ratio."""
    fresh = [row for row in rows if row.get("part") == "fresh" and row.get("reference")]
    if not any(row["group"] == FRESH_AA for row in fresh):
        return None
    return [{"batch_tokens": batch, "aa": note_group([row for row in fresh if row["batch_tokens"] == batch])}
            for batch in sorted({row["batch_tokens"] for row in fresh})]


def section_b_status(rows):
    return "ran" if rows and all(row.get("status") == "measured" for row in rows) else "partly run"
