"""The GPU check's report: the device, the report's name, the targets table and the Markdown text of the JSON
report (docs/gpu-check.md says what each part means)."""

import math
import re
import statistics

from tools import timed_runs
from tools.common import fmt
from tools.gpu_check.cases import (
    AA_BAND, BASELINE, BASELINE_BUSY_TARGET, BASELINE_TOKENS_TARGET, FIRST_STEP_TARGET_S, HALF_WEIGHTS, MECHANISMS,
    MEMORY_TARGETS, STARTUP_OVERHEAD_TARGET_S, STOCK_SPEEDUP_TARGET, SYNCS_TARGET, USERS_PATH_TARGET, aa_text,
)
from tools.gpu_check.plan import (
    DECODE_GROUPS, FRESH_BIN, FRESH_EXT, FRESH_LAYERS, FRESH_STOCK, IN_PROCESS, LAYERS, STOCK_LABEL, TABLES_SHARE,
    named_fresh, paper_of, part_command, run_text, warm_up_when,
)


def report_name(info, args):
    """``<GPU model>`` (or ``cpu-tiny``, ``cpu``), then for a part other than ``all`` ``-<part>`` and its fresh
    processes where ``--fresh`` is not the default (``-ext-aa``: :func:`named_fresh`), then ``-<papers>`` unless
    every one ran: the reports of different calls of one part do not overwrite each other."""
    name = ("cpu-tiny" if args.tiny else "cpu") if args.device != "cuda" else (
        re.sub(r"[^A-Za-z0-9.+-]+", "_", info["name"]).strip("_") or "gpu")
    if args.part != "all":
        name += f"-{args.part}" + "".join(f"-{fresh}" for fresh in named_fresh(args) or ())
    if len(args.cases) < len(set(map(paper_of, MECHANISMS))):
        name += "-" + "_".join(args.cases)
    return name


def _met(row):
    if row.get("met") is None:
        return ""
    return " (met)" if row["met"] else " (NOT met)"


def _target(measure, target, measured, at_least=True, why=None):
    met = None if measured is None else (measured >= target if at_least else measured <= target)
    row = {"measure": measure, "target": f"{'>=' if at_least else '<='} {target:g}", "measured": measured, "met": met}
    if measured is None:
        row["reason"] = why or "not measured"
    return row


def _status_text(row):
    """A row's (or section's) ``status``, and ``: <reason>`` when it has one."""
    return row.get("status", "not run") + (f": {row['reason']}" if row.get("reason") else "")


def _plans_beam(part):
    """Whether ``part`` (``--part``) decodes with beam 4, whose rows have targets (greedy's have none)."""
    return part not in DECODE_GROUPS or DECODE_GROUPS[part].startswith("translate-")


def targets_table(sections, on_gpu, batch_tokens, part="all"):
    """The targets of issues 29 (decoding, training ratios) and 35 (the GPU-bound baseline) that this run planned
    to measure, beside what it measured (met: None off a GPU, where they do not apply).  A target is listed when
    the rows that measure it are among this run's rows, whatever became of them: one not measured says why
    (``reason``: its row's status, or its reference's); the other parts' targets are left to
    :func:`other_parts_text`.  ``batch_tokens``: the small and the paper's batch (section b's, when it ran);
    ``part``: the run's ``--part``."""
    rows = []
    b, c = sections.get("b", {}), sections.get("c")
    train = {row["key"]: row for row in b.get("rows", [])}
    small, paper = b.get("batch_tokens", batch_tokens)
    cases_batch = b.get("case_batch_tokens", small)

    def key(group, case, batch, mode="eager"):
        return f"{group}|{case}|{mode}|{batch}"

    def measured(row_key, field):
        """``(the field of the row where it was measured, else None; why not)``."""
        row = train[row_key]
        if row.get("status") != "measured":
            return None, _status_text(row)
        if row.get(field) is None:
            reference = train.get(row.get("reference") or "")
            if field == "ratio" and reference and reference.get("status") != "measured":
                return None, f"its reference, {reference['case']} ({reference['group']}), {_status_text(reference)}"
            return None, f"its row has no {field}"
        return row[field], None

    def add(measure, target, row_key, field, at_least=True, **extra):
        if row_key in train:  # (a row of this run: planned, whatever became of it)
            value, why = measured(row_key, field)
            rows.append(_target(measure, target, value, at_least, why) | extra)

    ext_case = "onmt-ext baseline"

    def ext(batch):
        return key(FRESH_EXT, ext_case, batch)

    add(f"baseline target tok/s, {paper}-token batches in one pass (the paper's update), the config's model_dtype, "
        "onmt-ext, users' data path", BASELINE_TOKENS_TARGET, ext(paper), "tokens_per_s")
    add(f"baseline target tok/s, {paper}-token batches in one pass, binarised data (-ext_binarized_cache), users' "
        "data path", BASELINE_TOKENS_TARGET, key(FRESH_BIN, ext_case, paper), "tokens_per_s")
    for group, mode, how in ((FRESH_EXT, "eager", ""), (FRESH_LAYERS, LAYERS, ", -ext_compile_layers")):
        if mode == LAYERS:
            add(f"baseline target tok/s, {paper}-token batches in one pass{how}, users' data path",
                BASELINE_TOKENS_TARGET, key(group, ext_case, paper, mode), "tokens_per_s")
        for field, what in (("busy_share", "profiled steps"),
                            ("busy_share_unprofiled", "kernel time of the profiled steps over the unprofiled step")):
            add(f"GPU busy share of the baseline's step{how} ({what}; {paper} tokens)", BASELINE_BUSY_TARGET,
                key(group, ext_case, paper, mode), field)
        for batch in (small, paper):
            row_key = key(group, ext_case, batch, mode)
            if train.get(row_key, {}).get("reference") in train:  # (its ratio's stock row is this run's too)
                add(f"onmt-ext baseline{how} over stock OpenNMT-py, target tok/s, {batch}-token batches, same config "
                    "and run", STOCK_SPEEDUP_TARGET, row_key, "ratio", aa=train[row_key].get("aa_note"))
    in_process = key(IN_PROCESS, BASELINE.label, cases_batch)
    for group, how in ((FRESH_EXT, ""), (FRESH_BIN, ", binarised data (-ext_binarized_cache)")):
        users = key(group, ext_case, cases_batch)
        if users in train and in_process in train:
            (speed, why), (base, base_why) = measured(users, "tokens_per_s"), measured(in_process, "tokens_per_s")
            rows.append(_target(f"baseline's users' data path{how} over its in-process run (replayed batches), "
                                f"target tok/s, {cases_batch}-token batches, same run", USERS_PATH_TARGET,
                                None if speed is None or not base else speed / base, why=why or (
                                    base_why and f"the in-process baseline {base_why}")))
    planned = [ext(batch) for batch in (small, paper) if ext(batch) in train]
    if planned:
        syncs = [measured(row_key, "syncs_per_step") for row_key in planned]
        values = [value for value, _ in syncs if value is not None]
        rows.append(_target("host-device synchronisations per step between report steps (onmt-ext baseline, most "
                            "over its users'-path runs)", SYNCS_TARGET, max(values) if values else None,
                            at_least=False, why=syncs[0][1]))
    add(f"first step after the model is built, s (onmt-ext baseline, {small} tokens, fresh process)",
        FIRST_STEP_TARGET_S, ext(small), "first_step_s", at_least=False)
    stock = key(FRESH_STOCK, STOCK_LABEL, small)
    if ext(small) in train and stock in train:
        (ext_start, why), (stock_start, stock_why) = measured(ext(small), "startup_s"), measured(stock, "startup_s")
        rows.append(_target("start-up overhead of onmt-ext over stock, s (process start to the end of the first "
                            "step)", STARTUP_OVERHEAD_TARGET_S,
                            None if ext_start is None or stock_start is None else ext_start - stock_start,
                            at_least=False, why=why or (stock_why and f"stock's row {stock_why}")))
    for case in MECHANISMS:  # the targets are the default path's: compiled where -ext_compile auto compiles
        mode = "compiled" if case.compiles_by_default else "eager"
        if case.train_target is not None:
            row_key = key(IN_PROCESS, case.label, cases_batch, mode)
            add(f"training ratio, {case.label}, default path: {mode} ({cases_batch} tokens)", case.train_target,
                row_key, "ratio", aa=train.get(row_key, {}).get("aa_note"))
    for case, most in MEMORY_TARGETS:
        add(f"peak memory over the baseline's, {case.label} ({cases_batch} tokens)", most,
            key(IN_PROCESS, case.label, cases_batch), "memory_ratio", at_least=False)
    for row in (c or {}).get("rows", []):
        if row.get("target") is not None:
            rows.append(_target(f"decoding ratio (beam 4), {row['case']}, {row['mode']}", row["target"],
                                row.get("ratio"), why=_status_text(row) if row.get("status") != "measured" else
                                "no ratio (no baseline run on each side of its runs)")
                        | {"interval": row.get("ratio_interval"), "aa": row.get("aa_note")})
    if c and not c.get("rows") and c.get("reason") != "--fresh-only" and _plans_beam(part):  # (never made: say so)
        rows.append({"measure": "decoding ratios (beam 4) of this run's cases (section c)",
                     "target": ">= " + " or ".join(f"{target:g}" for target in sorted(
                         {case.translate_target for case in MECHANISMS if case.translate_target})) + " (by case)",
                     "measured": None, "met": None,
                     "reason": f"section c {_status_text(c)}"})
    if not on_gpu:
        for row in rows:
            row["met"] = None
    return rows


def other_parts_text(report):
    """The line under the targets table on the targets that this run did not plan and other parts measure, each
    with the ``--part`` options that measure it (:func:`part_command`); None when it planned every one.  From the
    report's rows (section b's are its plan), its part and its papers (``cases``)."""
    sections = report["sections"]
    rows = sections.get("b", {}).get("rows", [])
    groups, labels = {row["group"] for row in rows}, {row["case"] for row in rows if row["group"] == IN_PROCESS}
    decoding = [case for case in MECHANISMS if case.translate_target is not None]
    papers = [name.strip() for name in (report.get("cases") or "").split(",") if name.strip()]
    part = report.get("part", "all")
    beam = set()
    if "c" in sections and sections["c"].get("reason") != "--fresh-only":
        beam = {key.split("-")[1] for key in ([DECODE_GROUPS[part]] if part in DECODE_GROUPS
                                              else DECODE_GROUPS.values()) if key.startswith("translate-")}
    others = []  # (what, part, its cases, its --fresh)
    if FRESH_EXT not in groups:
        others.append(("the onmt-ext baseline on the users' path (tok/s, busy share, syncs, first step) and over "
                       "stock OpenNMT-py (speed, start-up)", "train-fresh", MECHANISMS, None))
    elif FRESH_STOCK not in groups:
        others.append(("the onmt-ext baseline over stock OpenNMT-py (speed, start-up)", "train-fresh", MECHANISMS,
                       None))
    if FRESH_BIN not in groups:
        others.append(("the onmt-ext baseline on binarised data", "train-fresh", MECHANISMS, ["ext", "bin"]))
    if FRESH_LAYERS not in groups:
        others.append(("the onmt-ext baseline with -ext_compile_layers", "train-fresh", MECHANISMS,
                       ["stock", "layers"]))
    if not {FRESH_EXT, IN_PROCESS} <= groups:
        others.append(("the users' path over the in-process run", "train", MECHANISMS, None))
    trained = {paper_of(case) for case in MECHANISMS if case.label in labels}
    untrained = [case for case in MECHANISMS if paper_of(case) not in trained]
    if untrained:
        others.append(("the training ratios and peak memory", "train-cases", untrained, None))
    for mode in ("eager", "compiled"):
        left = [case for case in decoding if mode not in beam or (papers and paper_of(case) not in papers)]
        if left:
            others.append((f"the decoding ratios (beam 4), {mode}", f"decode-beam-{mode}", left, None))
    by_command = {}
    for what, name, chosen, fresh in others:
        everything = decoding if name.startswith("decode") else MECHANISMS
        by_command.setdefault(part_command(name, chosen, everything, fresh), []).append(what)
    return "Other parts measure the other targets: " + "; ".join(
        f"{', '.join(whats)}: `{command}`" for command, whats in by_command.items()) + "." if others else None


#: what :func:`tools.timed_runs.control_case` adds to the name of the baseline it repeats
CONTROL_WORDS = timed_runs.control_case(BASELINE).label.removeprefix(BASELINE.label)


def case_text(row):
    """A section b row's case in the report, beside its process (``group``): the users'-path A/A control's
    process already says it is the baseline again as an A/A control, so its case is named by the baseline alone
    (it read "onmt-ext baseline, again (A/A control) (onmt-ext again (A/A control), fresh process)")."""
    if row.get("control") and CONTROL_WORDS.lstrip(", ") in row["group"]:
        return row["case"].removesuffix(CONTROL_WORDS)
    return row["case"]


def _runs_text(runs):
    """`` (runs 1, 2 and 3)`` after the name of a config that several runs of a case trained, `` (run 2)`` after one
    that a further run alone trained, else empty (``runs``: their ``run``, None for a case run once)."""
    numbers = [str(run) for run in runs if run]
    if len(numbers) > 1:
        return f" (runs {', '.join(numbers[:-1])} and {numbers[-1]})"
    return f" (run {numbers[0]})" if numbers and numbers[0] != "1" else ""


def _interval_text(interval):
    return "n/a" if not interval else f"{interval[0]:.3f}-{interval[1]:.3f}"


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


def half_weights_text(rows, mode):
    """The report's line on the in-process row of :data:`HALF_WEIGHTS` (``rows``: section b's), or None without
    one: what it is, and what a run whose baseline is not in fp16 (the dry run) could not check."""
    row = next((row for row in rows if row["case"] == HALF_WEIGHTS.label and row["group"] == IN_PROCESS), None)
    if row is None:
        return None
    base = next((other for other in rows if other["key"] == row["reference"]), {})
    text = (f"Baseline, half weights: the baseline with -ext_half_weights (issue 59, item 4), {row['status']}"
            + (f" (ratio {row['ratio']:.3f})" if row.get("ratio") is not None else "")
            + ": its Linear layers compute with float16 copies of their weights, refreshed once per step, and the "
            "optimizer keeps the float32 parameters; the same batches as its neighbouring baseline runs, no target "
            "(report-only).")
    dtype = base.get("options", {}).get("model_dtype")
    if dtype is None or dtype == row.get("options", {}).get("model_dtype"):
        return text
    text += (f" The baseline trains in {dtype} here, so this row trains with -model_dtype fp16 (and the "
             "baseline's batch multiple: the same batches)")
    if mode == "cuda":
        return text + ": its ratio mixes autocast's float16 with the half weights and is not the option's."
    return text + ("; off CUDA autocast stays off, so the float16 copies are refreshed every step but never used: "
                   "this run checks that the option trains through its code path on the same batches, not its "
                   "speed or its numbers (those need a GPU run).")


def users_path_aa_text(users):
    """The report's line on the users'-path A/A control (``users``: :func:`training.users_path_aa`'s), or that this
    run has none."""
    if users is None:
        return ("Users' path: no A/A control in this run (`--fresh ...,aa` adds one), so its ratios' run-to-run noise "
                "is not measured.")
    low, high = AA_BAND
    shown = "; ".join(f"{entry['batch_tokens']} tokens " + (
        "no run measured" if entry["aa"] is None else
        f"{entry['aa']['median']:.3f}, {'within' if entry['aa']['within'] else 'OUTSIDE'}") for entry in users)
    return (f"Users' path, A/A control (the onmt-ext baseline again in a fresh process of its own, after the others "
            f"but the compiled layers, over ext's; band {low:g}-{high:g}): {shown} (where outside or not measured, "
            "every users'-path ratio at that batch says so).")


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
             f"- part: {report.get('part', 'all')}"
             + (f" --fresh {','.join(report['fresh'])}" if report.get("fresh") else "")
             + f" (sections {report['settings'].get('sections')}; mechanisms of {report.get('cases', 'every paper')})",
             f"- before it started: {report.get('plan', 'no plan')}", "",
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
                             f"| {_status_text(run)} | "
                             f"`{run['command']}` |")
            failures = [f"- {run['dtype']}: {name}" for run in a["runs"] for name in run.get("failures", [])]
            lines += ([""] + ["Failed tests:"] + failures if failures else []) + [""]
    b = sections.get("b")
    if b:
        beside = warm_up_when(sections, [part["part"] for part in report["parts"]])
        lines += [f"## b. Training ({b['status']}, {b.get('seconds', 0):.0f} s; data and configs prepared in "
                  f"{b.get('prepare_s', 0):.0f} s, {beside})", "",
                  f"{b.get('steps_text', '')} Ratios: the onmt-ext baseline's rows over stock OpenNMT-py's at the "
                  "same batch size (on binarised data, `-ext_binarized_cache`, and its A/A control's: over the "
                  "onmt-ext baseline's on the text); "
                  "every other row over the baseline trained the same way in the same process "
                  "(`ratio` against `vs`). Syncs: per step between report steps over the measured steps "
                  f"({b.get('sync_kind', '')}). First step: from the model built to the end of step 1 (batches "
                  "built ahead not counted); start-up: from the process start to the end of step 1.", "",
                  "Busy share: of the profiled steps; busy ms: kernel (or CPU operator) time per profiled step, "
                  "and over the unprofiled step time (the profiler slows the host, not the kernels).", "",
                  *([f"Binarised data (`onmt_ext_binarize` into the cache, `work/binarized`, in the background "
                     "while the earlier processes ran): "
                     f"{b['binarize_s']:.0f} s (`work/binarize.log`).", ""] if b.get("binarize_s") is not None
                    else []),
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
            case = case_text(row)
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
                f"{fmt(row.get('startup_s'), 1)} | {peak} | {_status_text(row)} |")
        if any(row["group"] == IN_PROCESS for row in b["rows"]):
            lines += ["", f"In one process, {aa_text(b.get('aa'))} (its runs spread over the group; on a GPU its "
                      "median should lie within the band, and where it does not, every ratio of the group says so)."]
        if any(row.get("part") == "fresh" for row in b["rows"]):
            lines += ["", users_path_aa_text(b.get("fresh_aa"))]
        half = half_weights_text(b["rows"], report["mode"])
        if half:
            lines += ["", half]
        over_time = [f"- {case_text(row)} ({row['group']}), {row['batch_tokens']} tokens: {_over_time_text(row)}"
                     for row in b["rows"] if row.get("part") == "fresh" and row.get("interval_points")]
        if over_time:
            lines += ["", "Users'-path rows over time (target tok/s, the median of the report intervals in each span "
                      "of the measured steps; the first steps were not measured):", "", *over_time]
        warm = b.get("warm_up")
        if warm:
            lines += ["", f"Machine warm-up ({_status_text(warm)}):"
                      f" stock OpenNMT-py on {warm['batch_tokens']}-token batches in the machine's first training "
                      f"process, untimed, before them ({beside}), so that neither measured fresh process pays "
                      "alone for loading the CUDA libraries and kernels. Its first step took "
                      f"{fmt(warm.get('first_step_s'), 2)} s and its start-up {fmt(warm.get('startup_s'), 1)} s."]
        ahead = b.get("compile_warm_up") or []
        if ahead:
            done = [row["case"] for row in ahead if row.get("status") == "warmed up"]
            other = [f"{row['case']} ({_status_text(row)})"
                     for row in ahead if row.get("status") != "warmed up"]
            steps = report["settings"].get("compile_warmup_steps")
            lines += ["", f"Compiled ahead ({b.get('compile_warm_up_processes')} untimed processes, {beside}, the "
                      f"measured rows' own configs, {steps} steps each; the "
                      "measured compiled rows load what torch.compile cached on disk): "
                      f"{', '.join(done) or 'none'}." + (f" Not compiled ahead: {'; '.join(other)}." if other else "")]
        profiled = [row for row in b["rows"] if "profile_table" in row]
        lines += ["", "Operator tables of each measured run's profiled steps: `profiles/<this report's name>/` beside "
                  "this report, written after each training process's last run while its budget lasted (at most "
                  f"{TABLES_SHARE:.0%} of section b's) ({sum(row['profile_table'] for row in profiled)} of "
                  f"{len(profiled)} profiled runs)."]
        lines += ["", "Host-device synchronisation call sites over the counted steps (top 5 per run; on CUDA the "
                  "Python caller of each sync warning):", ""]
        lines += [f"- {case_text(row)}{run_text(row)}, {row['mode']}, {row['group']}, {row['batch_tokens']}: "
                  f"{_sites_text(row)}" for row in b["rows"] if row.get("status") == "measured"]
        lines += ["", "Configs trained:", ""]
        configs = {}  # (the A/A control's runs train one config: named once, with its runs)
        for row in b["rows"]:
            if row.get("command") and not row.get("repeat_of"):
                configs.setdefault((case_text(row), row["mode"], row["group"], row["batch_tokens"], row["command"]),
                                   []).append(row.get("run"))
        lines += [f"- {case}{_runs_text(runs)}, {mode}, {group}, {batch}: `{command}`"
                  for (case, mode, group, batch, command), runs in configs.items()]
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
                status = _status_text(row)
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
    if report["targets"]:
        lines += ["| measure | target | measured | met |", "|---|---:|---:|---|"]
    else:
        lines.append("This run measures none of them.")
    for row in report["targets"]:
        met = "met" if row["met"] else "NOT met"
        if row["measured"] is None:
            met = f"n/a (not measured: {row.get('reason') or 'unknown'})"
        elif row["met"] is None:
            met = "n/a (not a GPU run)"
        shown = fmt(row["measured"], 3) + (f" [{_interval_text(row['interval'])}]" if "interval" in row else "")
        shown += f" ({row['aa']})" if row.get("aa") else ""
        lines.append(f"| {row['measure']} | {row['target']} | {shown} | {met} |")
    elsewhere = other_parts_text(report)
    return "\n".join(lines + (["", elsewhere] if elsewhere else [])) + "\n"
