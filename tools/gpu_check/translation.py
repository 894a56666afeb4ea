"""Section c of the GPU check, the parent's side: each decoding group's jobs for the translation process, its
timed runs read back into rows, and the ratios to the interleaved baseline runs."""

import json
import math
import os
import shlex
import statistics

from tools import common
from tools import timed_runs
from tools.gpu_check.cases import BASELINE, aa_note, aa_summary
from tools.gpu_check.plan import COSTS, GRACE_S, MIN_START_S, monotonic_now, proportional_shares, translate_rows


def translation_argv(checkpoint, config, source, args, search, output):
    """``onmt_translate`` arguments of one run (see docs/benchmarks-method.md)."""
    from onmt_ext.mechanisms.clause.split import translate_options

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


def _group_figures(args, group, rows, jobs, runs, stopped, log):
    """Fills ``group`` and its ``rows`` from the child's runs (those of this group); a case whose translation
    failed is its own row, failed, naming ``log``, which holds its traceback."""
    mine = [run for run in runs if run.get("group") == group["key"]]
    failures = {run["name"]: run for run in mine if run["phase"] == "failed"}
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
    base = jobs["baseline"]
    if skipped:
        group.update(status=skipped.get("status", "not run"), reason=skipped["reason"])
    elif base in failures:
        group.update(status="failed", reason="its baseline failed")
    elif ends and plan:
        group["status"] = "ran"
    elif stopped:
        group.update(status=stopped[0], reason=stopped[1])
    else:
        group.update(status="stopped", reason="budget (its share spent)")
    sentences = plan["sentences"] if plan else args.test_sentences
    speeds = [sentences / run["seconds"] for run in timed]
    for row in rows:
        label = row.pop("label")
        own = [index for index, run in enumerate(timed) if run["name"] == label]
        if label in failures:
            failure = failures[label]
            when = "warm-up" if failure.get("index") is None else f"timed run {len(own) + 1}"
            row.update(status="failed", reason=f"{failure['reason']} (at its {when}; traceback in {log.name})",
                       log=str(log), runs=len(own))
            continue
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


def group_result(args, group, rows, jobs, runs, stopped, log):
    """One decoding group's record and rows from the translation process's ``runs`` (:func:`_group_figures`),
    with its A/A control's summary (``group["aa"]``) and, beside every other ratio, its note (:func:`aa_note`)."""
    _group_figures(args, group, rows, jobs, runs, stopped, log)
    aa = [row for row in rows if row.get("control")]  # its paired ratios, in running order
    group["aa"] = aa_summary(aa[0].get("run_ratios") if aa else None)
    for row in rows:
        if row.get("ratio") is not None and row["case"] != BASELINE.label and not row.get("control"):
            row["aa_note"] = aa_note(group["aa"])


#: the translation process's log (in the work folder): its output, and the traceback of every failed translation
TRANSLATE_LOG = "translate.log"
#: the share of its part's time left each group of section c gets (greedy, the last of a part: all of it)
GROUP_SHARES = {"translate": 0.85, "greedy": 1.0}


def start_section_c(args, work):
    """Section c's process, started while section b trains so that its start-up (imports, the first model's
    one-off costs) is paid outside section c's time; it waits for :func:`section_c`'s jobs.  On a GPU it starts
    with section b's in-process group, whose own start-up and untimed first run come before any timed run."""
    jobs_file = work / "translate.jobs.json"
    jobs_file.unlink(missing_ok=True)
    env = {"ONMT_EXT_COMPILE_BACKEND": args.compile_backend} if args.compile_backend else {}
    return common.Child("tools.gpu_check", "translate-many", [], work / TRANSLATE_LOG, args.threads,
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
    began, specs, deadlines = monotonic_now(), [], {}
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
        shares = proportional_shares([sum(seconds for _, seconds in translate_rows(
            args, [case for case in entries if not case.control], compiled, costs)) for _, compiled, entries in specs])
    built = [_translation_group(args, models, source, search, compiled, entries, share,
                                deadlines["compiled" if compiled else "eager"])
             for (search, compiled, entries), share in zip(specs, shares)]
    jobs_file, runs_file = work / "translate.jobs.json", work / "translate.runs.jsonl"
    runs_file.unlink(missing_ok=True)
    stopped, seconds = None, deadlines["compiled"] - monotonic_now()
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
    ended = monotonic_now()
    runs = common.read_json_lines(runs_file)
    for jobs, group, rows in built:
        group_result(args, group, rows, jobs, runs, stopped, work / TRANSLATE_LOG)
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
