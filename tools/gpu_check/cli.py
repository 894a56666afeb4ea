"""The GPU check: decoding properties, training and translation speed of every mechanism on one CUDA GPU.

Usage: ``python -m tools.gpu_check [--part props|train|decode|all|...] [--cases PAPERS] [--device cuda|cpu]
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
import json
import os
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

from tools import common
from tools.gpu_check.cases import MECHANISMS, REPO, TINY_MECHANISMS
from tools.gpu_check.child import CHILDREN
from tools.gpu_check.plan import (
    BUDGETS, FRESH_BIN, FRESH_DEFAULT, FRESH_NAMES, FRESH_REFERENCE, GRACE_S, PART_STAGES, Schedule, TINY_BUDGETS,
    apply_part, checkpoint_plan, fresh_deadlines, monotonic_now, named_fresh, paper_of, plan_line, run_steps,
    step_plan, training_plan, warm_up_plan,
)
from tools.gpu_check.properties import finish_section_a, start_section_a
from tools.gpu_check.report import markdown, report_name, targets_table
from tools.gpu_check.training import (
    file_slug, prepare_training, run_training_process, section_b_status, start_binarizing, start_compile_warm_up,
    start_warm_up, training_ratios,
)
from tools.gpu_check.translation import section_c, section_c_status, start_section_c

COMMIT_ENV = "ONMT_EXT_COMMIT"


#: the work folder's files that ``--pack`` takes: the child processes' logs, run records and pytest's JUnit files
PACKED_SUFFIXES = (".log", ".jsonl", ".xml")


def file_times(folder, suffixes=None):
    """``{path: modification time in ns}`` of the files in ``folder`` (not its subfolders'), those ending in one
    of ``suffixes`` where given; empty where ``folder`` does not exist."""
    if not folder.is_dir():
        return {}
    return {path: path.stat().st_mtime_ns for path in folder.iterdir()
            if path.is_file() and (suffixes is None or path.suffix in suffixes)}


def packed_files(args):
    """:func:`file_times` of what ``--pack`` takes: the operator tables of this report's name and the work
    folder's logs, run records and JUnit files (:data:`PACKED_SUFFIXES`)."""
    return file_times(args.profiles) | file_times(args.work, PACKED_SUFFIXES)


def pack_files(args, before):
    """``--pack``: the operator tables (as ``profiles/<report name>/...``) and the work files of the child
    processes (``work/...``) in one gzipped tar file, those that this run wrote or rewrote: not in ``before``
    (:func:`packed_files` at the run's start) or modified since.  The work folder is shared by the calls of a
    session (tools/gpu_stage.sh gives each the same), and a later call's pack held an earlier call's logs."""
    args.pack.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(args.pack, "w:gz") as archive:
        for path, modified in sorted(packed_files(args).items()):
            if before.get(path) != modified:
                where = f"profiles/{args.profiles.name}" if path.parent == args.profiles else "work"
                archive.add(path, arcname=f"{where}/{path.name}")
    print(f"== gpu-check: this run's operator tables and logs also in {args.pack}")


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
    parser.add_argument("--fresh", default=",".join(FRESH_DEFAULT),
                        help="which of section b's fresh processes run, in this order: ext (the onmt-ext baseline), "
                             "stock (stock OpenNMT-py), bin (the onmt-ext baseline on binarised data from "
                             "-ext_binarized_cache, binarised while the earlier processes run; its ratio is over "
                             "ext's), aa (the users'-path A/A control: the onmt-ext baseline again, its ratio over "
                             "ext's; both need ext), layers (-ext_compile_layers); bin, aa and layers are off by "
                             f"default, as the default budget has no room for them; default {','.join(FRESH_DEFAULT)}")
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
    relative = [name for name in args.fresh if FRESH_REFERENCE.get(name) == "ext" and "ext" not in args.fresh]
    if relative:  # their rows are there for their ratio over ext's
        parser.error(f"--fresh {','.join(args.fresh)}: {' and '.join(relative)} "
                     f"{'is a ratio' if len(relative) == 1 else 'are ratios'} over the onmt-ext baseline's fresh "
                     f"process; name it too: --fresh ext,{','.join(args.fresh)}")
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
              f"(CUDA build: {torch.version.cuda or 'none'}); `python -m tools.gpu_check --device cpu --tiny` "
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
    started, wall = datetime.datetime.now(datetime.timezone.utc), monotonic_now()
    info = common.device_info(args.device)
    args.profiles = args.out / "profiles" / report_name(info, args)  # the operator tables of the profiled steps
    earlier = packed_files(args)  # an earlier call's files, which --pack leaves out
    print(f"== gpu-check on {info['name']} (torch {info['torch']}, CUDA {info['cuda']}); report into {args.out}",
          flush=True)
    everything = TINY_MECHANISMS if args.tiny else MECHANISMS
    cases = [case for case in everything if paper_of(case) in args.cases]
    planned = plan_line(args, cases, everything)
    print(planned, flush=True)  # before it starts: what will not fit, and the parts that would measure it
    schedule, sections, models, cuda = Schedule(args), {}, {}, args.device == "cuda"
    commit, commit_from = project_commit(args.commit)
    a_began, a_deadline = monotonic_now(), schedule.deadline("a") if "a" in schedule.stages else None
    if "a" in args.sections:
        a_result, a_started = start_section_a(args, args.work)
    began_warm, warm_deadline = monotonic_now(), None  # (without section a, a stage of their own)
    if "b" in args.sections and "b warm-up" in schedule.stages:
        warm_deadline = schedule.deadline("b warm-up")
    checkpoints = "c" in args.sections and "c checkpoints" in schedule.stages  # section c without section b
    if checkpoints:
        began_checkpoints, checkpoints_deadline = monotonic_now(), schedule.deadline("c checkpoints")
    plan = training_plan(args, cases) if "b" in args.sections else checkpoint_plan(args, cases) if checkpoints else []
    if plan:  # the data (SentencePiece'd, clause-split, repeated) and every config, beside section a if it runs
        prepared = monotonic_now()
        repeat_cache = {}
        configs = prepare_training(args, args.work, plan, repeat_cache)
        binarizing = start_binarizing(args.work, plan, configs) if "b" in args.sections else None
    if "b" in args.sections:
        b = sections["b"] = {"title": "training", "rows": [row for _, _, _, rows in plan for row, _, _, _ in rows],
                             "prepare_s": round(monotonic_now() - prepared, 1), "steps_text": _steps_text(args),
                             "batch_tokens": (args.batch_size, args.paper_batch_size),
                             "case_batch_tokens": args.case_batch_size,
                             "sync_kind": "torch's CUDA sync warnings" if cuda else "host reads of tensor values"}
        print(f"== gpu-check b: data and configs prepared in {b['prepare_s']:.0f} s", flush=True)
        # with section a, the warm-up shares its time; without it, its own stage (--part all: a tenth of b's budget)
        if warm_deadline is None:
            warm_deadline = a_deadline if "a" in args.sections else monotonic_now() + 0.1 * args.budget_b
        warm_entry = warm_up_plan(args)
        b["warm_up"] = warm_entry[0]
        warm_thread = start_warm_up(args, args.work, warm_entry, configs, repeat_cache, warm_deadline)
        compile_threads, b["compile_warm_up"] = start_compile_warm_up(args, args.work, plan, configs, warm_deadline)
        b["compile_warm_up_processes"] = len(compile_threads)
    if "a" in args.sections:
        sections["a"] = finish_section_a(a_result, a_started, a_deadline)
        sections["a"].update(budget_s=round(a_deadline - a_began, 1), seconds=round(monotonic_now() - a_began, 1))
        schedule.record("a", a_began, a_deadline, monotonic_now(), sections["a"]["status"])
    if "c" in args.sections:
        sections["c"] = {"title": "translation", "rows": [], "groups": [], "passes": args.translate_passes,
                         "block": args.translate_block, "min_run_s": args.min_run_seconds}
        if not plan or args.fresh_only:
            sections["c"].update(status="not run", reason="--fresh-only" if plan else "section c translates "
                                 "section b's checkpoints; run it with b")
    if "b" in args.sections:
        for thread in [warm_thread, *compile_threads]:
            thread.join(timeout=max(0.0, warm_deadline - monotonic_now()) + GRACE_S + 1)
        if "b warm-up" in schedule.stages:
            schedule.record("b warm-up", began_warm, warm_deadline, monotonic_now(),
                            "ran" if b["warm_up"].get("status") == "measured" else "partly run")
    if "b" in args.sections and "b fresh" in schedule.stages:
        began, deadline = monotonic_now(), schedule.deadline("b fresh", whole=args.fresh_only and args.part == "all")
        fresh = [(group, env, rows) for name, group, env, rows in plan if name == "b fresh"]
        for (group, env, rows), share in zip(fresh, fresh_deadlines(began, deadline, len(fresh))):
            waiting = binarizing.wait(share) if binarizing and group == FRESH_BIN else {}
            for row, _, _, _ in rows if waiting else ():  # (one process trains both rows: neither runs)
                status, reason = waiting.get(row["key"], ("not run", "the data of its process's other row failed"))
                row.update(status=status, reason=reason, log=str(binarizing.log))
            if not waiting:
                run_training_process(args, args.work, group, env, rows, configs, {"fresh": share})
        if binarizing:
            b["binarize_s"] = binarizing.seconds
        fresh_rows = [row for _, _, rows in fresh for row, _, _, _ in rows]
        schedule.record("b fresh", began, deadline, monotonic_now(), section_b_status(fresh_rows))
    translator = None
    if checkpoints:  # section c's checkpoints (section b does not run), while its process starts
        translator = start_section_c(args, args.work)
        (_, group, env, rows), = plan
        run_training_process(args, args.work, group, env, rows, configs, {"eager": checkpoints_deadline})
        schedule.record("c checkpoints", began_checkpoints, checkpoints_deadline, monotonic_now(),
                        "ran" if all(row.get("status") == "trained" for row, *_ in rows) else "partly run")
        models = {case: (configs[row["key"]][0].stem, configs[row["key"]][1], row["options"])
                  for row, case, _, _ in rows if row.get("status") == "trained"}
        sections["c"]["checkpoints"] = {
            "trained": len(models), "of": len(rows), "steps": step_plan(args, *run_steps(args, group))["total"],
            "batch_tokens": args.batch_size, "log": str(args.work / f"train-{file_slug(group)}.log"),
            "failed": {row["case"]: row.get("reason") for row, *_ in rows if row.get("status") != "trained"}}
    if "b" in args.sections and not args.fresh_only:
        (_, group, env, rows), = [entry for entry in plan if entry[0] == "b in-process"]
        if "c" in args.sections:
            translator = start_section_c(args, args.work)
        began, deadlines = monotonic_now(), {mode: schedule.deadline(f"b {mode}") for mode in ("eager", "compiled")}
        try:
            ends = run_training_process(args, args.work, group, env, rows, configs, deadlines)
        except BaseException:
            if translator:
                translator.kill()
            raise
        eager_end = ends["eager"] or min(monotonic_now(), deadlines["eager"])
        for mode, start, end in (("eager", began, eager_end), ("compiled", eager_end, monotonic_now())):
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
        sections["b"].update(training_ratios(sections["b"]["rows"], cuda))
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
        "device": info, "date": started.strftime("%Y-%m-%d %H:%M:%S"), "seconds": round(monotonic_now() - wall, 1),
        "command": "python -m tools.gpu_check " + shlex.join(argv), "commit": commit, "commit_from": commit_from,
        "compile_backend": args.compile_backend or "inductor (onmt-ext's default)",
        "settings": {key: str(value) for key, value in vars(args).items()},
        "part": args.part, "fresh": named_fresh(args), "cases": ", ".join(args.cases),
        "plan": planned.removeprefix("== gpu-check "),
        "parts": schedule.parts, "sections": sections,
    }
    report["targets"] = targets_table(sections, cuda, (args.batch_size, args.paper_batch_size), args.part)
    args.out.mkdir(parents=True, exist_ok=True)
    name = report_name(info, args)
    (args.out / f"{name}.json").write_text(json.dumps(report, indent=1, default=str) + "\n", encoding="utf-8")
    (args.out / f"{name}.md").write_text(markdown(report), encoding="utf-8")
    print(markdown(report))
    print(f"== gpu-check: {args.out / name}.md and .json ({report['seconds']:.0f} s)")
    if args.pack:
        pack_files(args, earlier)
    failed = any(run.get("status") == "failed" for run in sections.get("a", {}).get("runs", []))
    failed |= any(row.get("status") == "failed" for key in "bc" for row in sections.get(key, {}).get("rows", []))
    failed |= any(group.get("status") == "failed" for group in sections.get("c", {}).get("groups", []))
    return 1 if failed else 0
