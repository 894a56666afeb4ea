"""The GPU check's budget scheduler, pure functions of the options and the costs: the parts and their stages
(:data:`PART_STAGES`), the plan's estimate of what fits (:func:`left_out`, :func:`plan_line`), the split offered
when a part does not fit (:func:`split_parts`), section b's rows by process (:func:`training_plan`) and section
c's choice of the cases that fit a group's time (:func:`plan_cases`, :func:`warm_another`)."""

import itertools
import math
import time

from tools import timed_runs
from tools.timed_runs import Case
from tools.gpu_check.cases import BASELINE, HALF_WEIGHTS

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


def monotonic_now():
    """Seconds on the clock that every budget and deadline of the check is measured on (``time.monotonic``)."""
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
PART_BUDGETS = {"props": ("a", 85.0, 60.0), "train": ("b", 240.0, 125.0), "decode": ("c", 240.0, 90.0)}


class Schedule:
    """The stages' deadlines (monotonic), from ``--part``'s :data:`PART_STAGES`: a stage ends at most its share
    of its section's budget after it starts, a cumulative one when the budgets of every stage so far, its own
    included, are spent from the check's start.  ``parts`` keeps each stage's time."""

    def __init__(self, args):
        self.args, self.start, self.planned, self.parts = args, monotonic_now(), 0.0, []
        self.stages = {name: rest for name, *rest in PART_STAGES[args.part][1]}

    def deadline(self, name, whole=False):
        gpu, tiny, cumulative = self.stages[name]
        budget = (1.0 if whole else tiny if self.args.tiny else gpu) * getattr(self.args, f"budget_{name[0]}")
        self.planned += budget
        return self.start + self.planned if cumulative else monotonic_now() + budget

    def record(self, name, began, deadline, ended, status):
        self.parts.append({"part": name, "budget_s": round(deadline - began, 1), "seconds": round(ended - began, 1),
                           "status": status})


def warm_up_when(sections, stages):
    """When section b's preparation and warm-ups (the machine's, the compiled rows' compiled ahead) run, in words,
    for a run of ``sections`` through the stages named ``stages``: beside section a where it runs, else in the
    part's own ``b warm-up`` stage, else (``--part all`` without a) before the fresh processes."""
    if "a" in sections:
        return "during section a"
    if "b warm-up" in stages:
        return "during the b warm-up stage"
    return "before section b's measured runs"


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


def translate_rows(args, cases, compiled, costs):
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
            kind = {FRESH_EXT: "ext", FRESH_STOCK: "stock", FRESH_BIN: "ext", FRESH_AA: "ext",
                    FRESH_LAYERS: "layers"}.get(group)
            for row, case, mode, _ in entries:
                label = f"{row['case']}, {row['mode']}, {row['batch_tokens']}" + run_text(row)
                if kind:
                    steps = step_plan(args, *run_steps(args, group))["total"]
                    seconds = steps * costs["steps"][kind][row["batch_tokens"] != small]
                    seconds += costs["layers"] if kind == "layers" and row["batch_tokens"] == paper else 0
                elif row.get("run", 1) > 1 or case.control or case in (BASELINE, HALF_WEIGHTS):
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
                                  for label, seconds in translate_rows(args, cases, mode == "compiled", costs)]
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
        args.fresh = [] if part == "train-cases" else args.fresh or list(FRESH_DEFAULT)
        section, gpu, tiny = PART_BUDGETS[part.split("-")[0]]
        if args.given_budgets.get(section) is None:
            setattr(args, f"budget_{section}", tiny if args.tiny else gpu)
    args.groups = [DECODE_GROUPS[part]] if part in DECODE_GROUPS else list(DECODE_GROUPS.values())


def part_command(part, cases, everything, fresh=None):
    """``--part`` ``part`` as options: with ``--cases`` unless ``cases`` are ``everything``, ``--fresh`` if given."""
    papers = list(dict.fromkeys(map(paper_of, cases)))
    return (f"--part {part}" + ("" if len(cases) == len(everything) else f" --cases {','.join(papers)}")
            + (f" --fresh {','.join(fresh)}" if fresh else ""))


def named_fresh(args):
    """The ``--fresh`` list that a command of ``args``' part must name: its fresh processes where they are not the
    default's (:data:`FRESH_DEFAULT`), in running order, else None (also for a part without any)."""
    if "b" not in args.sections or not args.fresh or set(args.fresh) == set(FRESH_DEFAULT):
        return None
    return [name for name in FRESH_NAMES.values() if name in args.fresh]


def split_parts(args, cases, costs):
    """The parts (``[(part, cases, fresh)]``) that measure what ``args``' part does, each fitting its budget by the
    plan's estimate: the part itself, else its :data:`SPLITS`, else (``train-fresh``) its fresh processes in calls
    (:func:`fresh_chunks`), else its cases shared out by paper; a single paper that still does not fit is offered
    as it is.  ``fresh``: the ``--fresh`` list its command names (:func:`named_fresh`; every call of a split
    ``train-fresh``), or None."""
    def trial_of(part):
        trial = type(args)(**vars(args))
        apply_part(trial, part)
        return trial

    def fits(part, chosen):
        return not left_out(part_stages(trial_of(part), chosen, costs))[0]

    def split(part, chosen):
        if fits(part, chosen):
            return [(part, chosen, named_fresh(trial_of(part)))]
        if part in SPLITS:
            return [item for sub in SPLITS[part] for item in split(sub, chosen)]
        if part == "train-fresh":  # (its rows do not depend on --cases)
            return [(part, chosen, chunk) for chunk in fresh_chunks(trial_of(part), chosen, costs)]
        papers = [[case for case in chosen if paper_of(case) == name] for name in dict.fromkeys(map(paper_of, chosen))]
        for count in range(2, len(papers) + 1):
            chunks = share_papers(papers, count)
            if all(fits(part, chunk) for chunk in chunks):
                break
        return [(part, chunk, None) for chunk in chunks] if len(papers) > 1 else [(part, chosen, None)]

    return split(args.part, cases)


#: the fresh process whose rows a fresh process's ratios are over (``--fresh`` names; the rows' ``reference``)
FRESH_REFERENCE = {"ext": "stock", "layers": "stock", "bin": "ext", "aa": "ext"}


def fresh_chunks(args, cases, costs):
    """``--part train-fresh``'s fresh processes (``args.fresh``) in calls, each process with the one its ratios
    are over (:data:`FRESH_REFERENCE`), as many in a call as fit its budget by the plan's estimate: lists of
    ``--fresh`` names, in running order; a process that does not fit even with its reference alone is offered
    so.  Its rows do not depend on ``--cases``, so the part is split by process, not by paper."""
    def fits(names):
        trial = type(args)(**vars(args))
        trial.fresh = names
        return not left_out(part_stages(trial, cases, costs))[0]

    order = [name for name in FRESH_NAMES.values() if name in args.fresh or name in
             {FRESH_REFERENCE.get(asked) for asked in args.fresh}]
    chunks = []
    for name in (name for name in order if name in args.fresh):
        needed = {name, FRESH_REFERENCE.get(name)}
        for chunk in chunks:
            merged = [other for other in order if other in chunk or other in needed]
            if fits(merged):
                chunk[:] = merged
                break
        else:
            chunks.append([other for other in order if other in needed])
    return chunks


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
    head = f"== gpu-check {part_command(args.part, cases, everything, named_fresh(args))}: by the plan's estimate"
    if not out:
        return f"{head} every row fits ({seconds:.0f} s of {sum(stage[1] for stage in stages):.0f})"
    offer = " and ".join(part_command(part, chosen, everything, fresh)
                         for part, chosen, fresh in split_parts(args, cases, costs))
    return (f"{head} {len(out)} row(s) will not fit: {'; '.join(out)}. To measure every row, run instead: {offer}")


def step_plan(args, steps=None, warmup=None):
    """Which training steps measure what (1-based, inclusive): ``measure`` (tokens/s, step time, data wait),
    ``profile`` (first step, count: the busy share), ``counted`` (synchronisations per step: on CUDA the measured
    steps, whose sync warnings cost nothing; on the CPU more steps after the profiled ones, since counting host
    reads slows every operator), ``total``.  ``steps``: the measured steps (default ``--steps``; the in-process
    group's runs: ``--case-steps``) after ``warmup`` unmeasured ones (default ``--warmup-steps``; see
    :func:`run_steps`)."""
    cuda = args.device == "cuda"
    first, last = (warmup or args.warmup_steps) + 1, (warmup or args.warmup_steps) + (steps or args.steps)
    end = last + args.profile_steps
    counted = [first, last] if cuda else [end + 1, end + args.warmup_steps]
    return {"measure": [first, last], "profile": [last + 1, args.profile_steps], "counted": counted,
            "total": counted[1] if not cuda else end}


#: the groups of section b's rows: which process trains them and how the batches arrive
FRESH_EXT, FRESH_STOCK, IN_PROCESS = "onmt-ext, fresh process", "stock, fresh process", "in one process"
#: the onmt-ext baseline with its whole layers compiled (-ext_compile_layers), in a fresh process of its own
FRESH_LAYERS, LAYERS = "onmt-ext -ext_compile_layers, fresh process", "layers compiled"
#: the onmt-ext baseline reading its training corpora binarised from the cache that ``make reproduce-*`` trains
#: from (-ext_binarized_cache, filled beforehand by onmt_ext_binarize: the same batches), in a fresh process of its
#: own, its ratio over the onmt-ext baseline's on the text; on request (``--fresh ext,bin``), as the part's
#: default processes leave it no room
FRESH_BIN = "onmt-ext -ext_binarized_cache, fresh process"
#: the users'-path A/A control (issue 57): the onmt-ext baseline again, ext's config at ext's batches, in a fresh
#: process of its own, its ratio over ext's; on request (``--fresh ext,aa``), as the default processes leave it no room
FRESH_AA = "onmt-ext again (A/A control), fresh process"
#: the share of the fresh part that each fresh process keeps for every one after it: the onmt-ext and stock
#: baselines (issue 35's targets) take what they need, -ext_compile_layers (off by default) what is left
FRESH_RESERVE = 0.2
#: ``--fresh``'s name of each fresh process, in running order.  The A/A control runs after every process but the
#: compiled layers, so that ext and it bracket the processes compared with ext's rows (stock, bin): its ratio then
#: spans the same stretch of the part (the host's drift, the binarising in the background, the page cache warmed
#: by ext's workers), where right after ext it would give only the noise of two neighbouring runs; the compiled
#: layers, the slowest to start, still get what the others leave
FRESH_NAMES = {FRESH_EXT: "ext", FRESH_STOCK: "stock", FRESH_BIN: "bin", FRESH_AA: "aa", FRESH_LAYERS: "layers"}
#: the fresh processes of ``--fresh``'s default (issue 35's targets); the others are left out, as the default budget
#: has no room for them
FRESH_DEFAULT = ["ext", "stock"]
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
    fresh processes that ``--fresh`` names, in :data:`FRESH_NAMES`'s order (each row's ratio over the row at its
    batch of the process :data:`FRESH_REFERENCE` names), then every case eager and compiled in one, with the
    baseline with ``-ext_half_weights`` (:data:`HALF_WEIGHTS`) among the eager ones."""
    users = f"{args.num_workers} data workers (the users' path)"
    replay = "built ahead, no workers, replayed from memory"
    paper, small = args.paper_batch_size, args.batch_size
    control = timed_runs.control_case(BASELINE)
    stock_case = Case(STOCK_LABEL, BASELINE.config, pre_encoded=True)
    ext_case = Case("onmt-ext baseline", BASELINE.config, pre_encoded=True)
    cases_batch = args.case_batch_size
    base_key = f"{IN_PROCESS}|{BASELINE.label}|eager|{cases_batch}"
    # per fresh process: the case its rows are named by, their mode, whether stock OpenNMT-py trains them, whether
    # from binarised data, and the name of their configs (the A/A control: ext's config and batches again)
    processes = {FRESH_EXT: (ext_case, "eager", False, False, "ext"),
                 FRESH_STOCK: (stock_case, "eager", True, False, "stock"),
                 FRESH_BIN: (ext_case, "eager", False, True, "ext_bin"),
                 FRESH_AA: (timed_runs.control_case(ext_case), "eager", False, False, "ext_aa"),
                 FRESH_LAYERS: (ext_case, LAYERS, False, False, "ext_layers")}
    groups = {name: group for group, name in FRESH_NAMES.items()}
    fresh = []
    for group, fresh_name in FRESH_NAMES.items():  # in running order
        case, mode, stock, binarized, name = processes[group]
        over = groups.get(FRESH_REFERENCE.get(fresh_name))  # the process whose rows its ratios are over
        rows = []
        for batch in ((paper, small) if mode == LAYERS else (small, paper)):  # (layers: the paper's batch first,
            # as the small batch's time, its compilation included, would be the estimate that may skip it)
            reference = over and f"{over}|{processes[over][0].label}|{processes[over][1]}|{batch}"
            path = f"{users[:-1]}, -ext_binarized_cache)" if binarized else users
            row = _row(case, mode, group, batch, reference, path, f"{name}_{batch}") | {"part": "fresh"}
            rows.append((row, BASELINE, mode, {"batch_size": batch, "stock": stock, "binarized": binarized}))
        if fresh_name in args.fresh:
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
    # the baseline with -ext_half_weights (no target): after the cases with a target, before those without
    half = _row(HALF_WEIGHTS, "eager", IN_PROCESS, cases_batch, base_key, replay, "half_weights")
    eager.insert(sum(case.train_target is not None for case in cases), (half, HALF_WEIGHTS, "eager", {"replay": True}))
    compiled = [(_row(case, "compiled", IN_PROCESS, cases_batch, base_key, replay, "compiled", case.train_target,
                      case.paper_train), case, "compiled", {"replay": True}) for case in cases]
    # the A/A control's runs spread over the eager part, the first before every case and the last after every
    # eager one: the compiled part gets only what the eager one leaves, so a short budget cuts it first, and an
    # A/A run there was the one such a cut dropped (a compiled case's part is its mode; a further baseline run
    # is told its part by interleaved)
    eager = spread(eager, [control_run(run) for run in range(1, args.aa_runs + 1)])
    in_process = [(first, BASELINE, "eager", {"replay": True}), *interleaved(eager, "eager"),
                  *interleaved(compiled, "compiled")]
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


def run_steps(args, group):
    """``(measured steps, unmeasured steps before them)`` of a run in ``group``: ``--case-steps`` in one process
    (the same replayed batches for every case and its neighbouring baseline runs), ``--steps`` after
    ``--fresh-warmup-steps`` on the users' path (data workers), past the warm-up of a fresh process; the machine
    warm-up and section c's checkpoints train only ``--warmup-steps`` twice."""
    if group == IN_PROCESS:
        return args.case_steps, args.warmup_steps
    if group in (WARM_UP, CHECKPOINTS):
        return args.warmup_steps, args.warmup_steps
    return args.steps, args.fresh_warmup_steps


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


def run_text(row):
    """`` (run n)`` after a row's name when it is a further run of its case (its ``run``), else empty."""
    return f" (run {row['run']})" if row.get("run") else ""
