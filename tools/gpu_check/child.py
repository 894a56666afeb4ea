"""The GPU check's child processes (``python -m tools.gpu_check --child KIND ...``): section b's training
process, which trains every in-process row in turn under a :class:`~tools.gpu_check.meter.Meter`, and section
c's translation process, which times every decoding group through OpenNMT-py's inference engine."""

import gc
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

from onmt_ext.patches import temporarily

from tools import common
from tools import timed_runs
from tools.gpu_check.meter import Meter, WarmedUp
from tools.gpu_check.plan import MIN_START_S, PLAN_SHARE, plan_cases, run_costs, warm_another


def _parse_train_options(config, stock):
    """``onmt_train -config`` options as the command parses them; stock OpenNMT-py ignores unknown options
    silently, so here they are an error (the stock row must train only stock options), and so is an onmt-ext
    option (``ext_...``) that this onmt-ext does not know (a row such as the half weights' would otherwise train
    as the baseline)."""
    from onmt.bin.train import _get_parser

    opt, unknown = _get_parser().parse_known_args(["-config", str(config)])
    if unknown and stock:
        raise RuntimeError(f"options unknown to stock OpenNMT-py in {config}: {' '.join(unknown)}")
    ours = [word for word in unknown if word.lstrip("-").startswith("ext_")]
    if ours:
        raise RuntimeError(f"onmt-ext options unknown to this onmt-ext in {config}: {' '.join(ours)}")
    return opt


def _failed(what, error):
    """Reports the exception being handled, ``error``, of ``what`` (a run, a translation): its full traceback into
    the process's log (stderr), which the report names; returns its one-line reason (type and last line)."""
    text = str(error).strip().splitlines()
    print(f"== gpu-check: {what} failed:", file=sys.stderr, flush=True)
    traceback.print_exc()
    return f"{type(error).__name__}: {text[-1] if text else ''}"[:300]


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
    per_weight, last = [], {}  # last: the seconds of the last run of each repeated case (the baseline's)

    def record(entry):
        common.append_json_line(runs_file, entry)

    with Meter(cuda) as meter:  # OpenNMT-py as it was once the runs are done
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
            try:
                meter.begin(job)  # (which closes what a failed run before it left open)
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
                entry = {"key": job["key"], "status": "failed", "traceback": True,
                         "reason": _failed(f"run {job['key']!r}", error)}
            entry["seconds"], entry["ended"] = round(time.monotonic() - start, 1), time.monotonic()
            if entry["status"] in ("measured", "trained"):  # the process's first step (imports, compiling): paid once
                once = (entry.get("first_step_s") or 0.0) if first_run else 0.0
                cost = max(0.0, entry["seconds"] - once)
                per_weight.append(cost / job["weight"])
                last[job.get("repeat_of") or job["key"]] = cost
            first_run = False
            record(entry)
            if cuda:
                torch.cuda.empty_cache()
        tables_s = max((job["tables_s"] for job in jobs), default=0.0)
        last_deadline = max((job["deadline"] for job in jobs), default=0.0)
        meter.write_tables(min(last_deadline, time.monotonic() + tables_s), record)
    Path(result_file).write_text(json.dumps({"done": True}), encoding="utf-8")


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
    was done.  A case whose translation raises is left out of its group's later runs, with its traceback in this
    process's log; the group goes on without it (without its baseline, the group ends).  The process may start
    early: it pays its one-off costs (imports, :func:`_warm_model_building`), then waits for the jobs file, at
    most ``head[3]`` seconds."""
    from onmt import model_builder

    from onmt_ext.runtime import compile as ext_compile

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
    broken = set()  # (group, name) of each case whose translation failed in that group

    def failed(name, group, error, index=None):
        """A case's failed translation (its warm-up's, or timed run ``index``'s): its traceback into this process's
        log, an entry naming the case; the group's other cases go on."""
        broken.add((group, name))
        record({"group": group, "phase": "failed", "name": name, "index": index, "traceback": True,
                "reason": _failed(f"translation of {name!r} in group {group!r}", error)})

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

            with temporarily(model_builder, "load_test_model", shared):  # what build_translator calls
                engines[key] = common.inference_engine(argv)
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
            try:
                warm, _ = once(job, source, key)
                first[job["name"]], wall = once(job, source, key)
            except (Exception, SystemExit) as error:  # this case fails, the group's others go on
                failed(job["name"], key, error)
                if job["name"] == base:
                    break
                continue
            overheads.append(wall - first[job["name"]])
            if job["name"] != base:
                warm_s.append(time.monotonic() - began_warm)
            record({"group": key, "phase": "warmup", "name": job["name"], "seconds": warm,
                    "estimate": first[job["name"]]})
        if base not in first:
            record({"group": key, "phase": "skipped", **(
                {"status": "failed", "reason": "its baseline failed"} if (key, base) in broken
                else {"reason": "budget (spent loading and warming up)"})})
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
            if (key, name) in broken:  # (its earlier run failed: the case's later runs are left out)
                continue
            try:
                seconds, wall = once(by_name[name], repeated, key)
            except (Exception, SystemExit) as error:
                failed(name, key, error, index)
                if name == base:  # (no later ratio could be paired)
                    break
                continue
            record({"group": key, "phase": "timed", "index": index, "name": name, "seconds": seconds,
                    "wall_s": wall})
        record({"group": key, "phase": "end", "seconds": time.monotonic() - began, "ended": time.monotonic()})
    Path(result_file).write_text(json.dumps({"done": True}), encoding="utf-8")


CHILDREN = {"train-many": child_train_many, "translate-many": child_translate_many}
