#!/usr/bin/env python
"""``make compare``: the five papers' mechanisms side by side on the shipped Chinese->English sample (CPU).

Options: ``--help``; how it works and why: docs/tools.md (compare.py).
"""

import itertools
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections import namedtuple
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tools import common
from tools.common import REPO, fmt
from onmt_ext.runtime import train_log
from onmt_ext.runtime.compat import make_command

CONFIG_DIR = Path("yaml_configs/compare")
LABELS = {
    "baseline": "Transformer (stock OpenNMT-py)",
    "li2019_em": "li2019: EM routing, enc-self",
    "cao2019_cross": "cao2019: cross aggregation",
    "chen2019_mprhead": "chen2019: MPRHead",
    "chen2019_rpehead": "chen2019: RPEHead",
    "clause_ca_rule": "clause attention (rule)",
    "gret": "GRET (weng2020)",
    "combined": "MPRHead + EM routing + GRET",
}
#: Order of the rows; the first is the baseline every other row is tested against.
CONFIGS = tuple(LABELS)
#: What each paper reports for the row's mechanism: (table of tools/reproduce.py, index of its baseline row,
#: index of the mechanism's row, what the rows are) or a sentence where the paper gives no legible number.
PAPER_CLAIMS = {
    "li2019_em": ("li2019-table2", 0, 2, "EM routing on the encoder self-attention, WMT14 En-De, base (Table 2)"),
    "cao2019_cross": ("cao2019-table1", 0, 3, "vertical + horizontal, zero init., WMT17 Zh-En, base (Table 1)"),
    "chen2019_mprhead": ("chen2019-table1", 0, 4, "MPRHead, WMT14 En-De, base (Table 1)"),
    "chen2019_rpehead": ("chen2019-table1", 0, 3, "RPEHead, WMT14 En-De, base (Table 1)"),
    "clause_ca_rule": ("clause-table5", 0, 1, "CA with rule, NiuTrans En-Zh (Table 5; gains said to grow "
                                              "with sentence length)"),
    "gret": "significant gains over the Transformer on four WMT tasks; the BLEU scores of our copy of the "
            "paper are not legible",
    "combined": "no paper combines these mechanisms",
}
TEST_SOURCE = Path("build/tatoeba/test.zh")
TEST_REFS = Path("build/tatoeba/test.en.refs.tsv")
#: Seconds set aside per translation of the whole test set before one has been timed (phase 2 times the
#: baseline's and replaces it); the 600-step models of the earlier fixed-step comparison took 14-26 s.
TRANSLATE_ALLOWANCE = 30.0
#: Share of ``--budget-minutes`` that the estimate may fill when ``--max-steps`` is chosen.
BUDGET_SHARE = 0.9
#: Highest cap ``--max-steps`` is chosen from.
MAX_STEPS_CEILING = 20000
POLL_SECONDS = 5.0


@dataclass
class Run:
    """One (config, seed) run: where it lives and what it measured."""

    config: str
    seed: int
    directory: Path
    train_steps: int
    test_lines: int = None
    train_seconds: float = None
    translate_seconds: float = None

    @property
    def hypotheses(self):
        """The translation, named after the model's steps and the test lines, so a changed run never reuses it."""
        return self.directory / f"test.step{self.train_steps}.{self.test_lines or 'all'}.hyp.en"

    @property
    def train_log(self):
        """OpenNMT-py's ``-log_file`` of the training."""
        return self.directory / "train.log"


def train_command(run, valid_every, report_every, until=None):
    """``onmt_train`` arguments of a run (its config, seed and paths), validating every ``valid_every`` steps: to
    ``run.train_steps`` keeping that checkpoint, or (the plateau search) to ``until`` keeping one per validation."""
    steps, save_every, keep = (until, valid_every, -1) if until else (run.train_steps, run.train_steps, 1)
    return ["onmt_train", "-config", str(CONFIG_DIR / f"{run.config}.yaml"), "-seed", str(run.seed),
            "-save_model", str(run.directory / "model"), "-save_data", str(run.directory / "samples"),
            "-log_file", str(run.train_log), "-overwrite_checkpoints", "-train_steps", str(steps),
            "-valid_steps", str(valid_every), "-save_checkpoint_steps", str(save_every), "-keep_checkpoint", str(keep),
            "-report_every", str(report_every)]


def checkpoint(run, train_steps=None):
    """The checkpoint a run translates: the one of its ``train_steps``."""
    return run.directory / f"model_step_{train_steps or run.train_steps}.pt"


def translate_command(run, source):
    """``onmt_translate`` arguments: beam 4, the model's SentencePiece models and any clause split as in training."""
    from onmt_ext.mechanisms.clause.split import translate_options

    values = common.config_values(f"compare/{run.config}.yaml")
    return ["onmt_translate", "-model", str(checkpoint(run)), "-src", str(source),
            "-output", str(run.hypotheses), "-beam_size", "4", "-batch_size", "64", "-batch_type", "sents",
            "-max_length", "100", *translate_options(values, ("sentencepiece",)),
            "-src_subword_model", values["src_subword_model"], "-tgt_subword_model", values["tgt_subword_model"],
            "-log_file", str(run.directory / "translate.log")]


def _logged(command, threads, log, start=subprocess.Popen):
    """``start`` (Popen or run) the command with ``threads`` threads, its output after its line in the file ``log``."""
    with open(log, "w", encoding="utf-8") as out:
        out.write(f"$ {shlex.join(command)}\n")
        out.flush()
        return start([common.program(command[0]), *command[1:]], env=common.threads_env(threads), stdout=out,
                     stderr=subprocess.STDOUT)


def _execute(command, threads, log):
    """Run a command with its output to ``log``; its wall-clock seconds.  A failure ends the tool."""
    start = time.perf_counter()
    code = _logged(command, threads, log, subprocess.run).returncode
    if code:
        raise SystemExit(f"compare.py: error: {command[0]} failed (exit {code}); see {log}")
    return time.perf_counter() - start


def _fresh_training(run):
    """Remove what an earlier training of the run left (OpenNMT-py appends to an existing log)."""
    run.directory.mkdir(parents=True, exist_ok=True)
    run.train_log.unlink(missing_ok=True)
    for old in run.directory.glob("model_step_*.pt"):
        old.unlink()


def _train(run, threads, valid_every, report_every):
    """Train a run from scratch to its ``train_steps``; its wall-clock seconds."""
    _fresh_training(run)
    return _execute(train_command(run, valid_every, report_every), threads, run.directory / "train.console.log")


def trained(run, valid_every):
    """Whether the run's checkpoint exists and its log holds every ``valid_every``: :func:`train_run` reuses it."""
    wanted = set(range(valid_every, run.train_steps + 1, valid_every))
    return checkpoint(run).exists() and wanted <= {r.step for r in train_log.read(run.train_log).valid}


def translated(run):
    """Whether the run's translation exists and is newer than its checkpoint: :func:`translate_run` reuses it."""
    return run.hypotheses.exists() and run.hypotheses.stat().st_mtime >= checkpoint(run).stat().st_mtime


def finished_runs(configs, seeds, work, train_steps, test_lines, valid_every):
    """The ``(config, seed)`` runs under ``work`` that are :func:`trained` to ``train_steps`` and
    :func:`translated`: the ones an invocation reuses."""
    runs = (Run(name, seed, work / name / f"seed{seed}", train_steps, test_lines) for name in configs for seed in seeds)
    return frozenset((run.config, run.seed) for run in runs if trained(run, valid_every) and translated(run))


def train_run(run, threads, valid_every, report_every):
    """Train a run to its ``train_steps`` unless it is :func:`trained`."""
    if not trained(run, valid_every):
        run.train_seconds = _train(run, threads, valid_every, report_every)
    return run


def translate_run(run, threads, source):
    """Translate the test source with a run's checkpoint unless it is :func:`translated`."""
    if not translated(run):
        run.translate_seconds = _execute(translate_command(run, source), threads,
                                         run.directory / "translate.console.log")
    return run


# ---------------------------------------------------------------- The rules


def seed_curves(logs):
    """Validation perplexity of several runs at the steps all of them have validated: ``{step: [ppl, ...]}``."""
    per_run = [{r.step: r.ppl for r in log.valid if r.ppl is not None} for log in logs]
    shared = sorted(set.intersection(*map(set, per_run))) if per_run else []
    return {step: [curve[step] for curve in per_run] for step in shared}


def find_plateau(steps, values, window, tolerance, max_steps):
    """``(s, True)`` for the first step s <= ``max_steps`` of a curve (ascending ``steps``, mean perplexities)
    whose next ``window`` steps, all logged, stay above ``(1 - tolerance)`` times its value; ``(max_steps, False)``
    when there is none; None while the curve is too short to say."""
    for i, step in enumerate(steps):
        if step > max_steps:
            return max_steps, False
        bound = (1.0 - tolerance) * values[i]
        if not any(later <= step + window and value < bound for later, value in zip(steps[i + 1:], values[i + 1:])):
            return (step, True) if steps[-1] >= step + window else None
    return None


def compare_at_steps(baseline, other):
    """The beats-the-baseline rule at every step both curves (``{step: [ppl per seed]}``) have, ``{step: verdict}``:
    "better" when the other's highest perplexity is below the baseline's lowest, "worse" the mirror case, else "tie"."""
    return {step: "better" if max(other[step]) < min(baseline[step]) else
                  "worse" if min(other[step]) > max(baseline[step]) else "tie"
            for step in sorted(set(baseline) & set(other))}


def sustained_from(verdicts, kind):
    """The first step from which every later verdict is ``kind`` (None if the last one is not)."""
    tail = list(itertools.takewhile(lambda step: verdicts[step] == kind, sorted(verdicts, reverse=True)))
    return tail[-1] if tail else None


def verdict_text(verdicts):
    """One sentence naming every step at which a config is apart from the baseline (:func:`compare_at_steps`):
    "beats the baseline from step 1000 on, and earlier at step 200"; a verdict not held to the end lists steps."""
    if not verdicts:
        return "no common validation step"
    steps = sorted(verdicts)
    parts = []
    for kind, words in (("better", "beats the baseline"), ("worse", "behind the baseline")):
        held = [s for s in steps if verdicts[s] == kind]
        start = sustained_from(verdicts, kind)
        if start is not None:
            earlier = [s for s in held if s < start]
            parts.insert(0, f"{words} from step {start} on" + (f", and earlier at {_ranges(earlier, steps)}"
                                                               if earlier else ""))
        elif held:
            parts.append(f"{words} at {_ranges(held, steps)}")
    if not parts:
        return "never apart from the baseline (seed ranges overlap at every step)"
    return "; ".join(parts) + ("; not at the last step" if verdicts[steps[-1]] == "tie" else "")


def looks_verdict(verdicts, seeds):
    """:func:`verdict_text` when the looks allow it: exchangeable runs of ``seeds`` seeds a side fall apart at one
    step, either way, with probability 2 / C(2n, n); over the k steps looked at, Bonferroni bounds the chance of any
    such verdict by k times that.  Above ALPHA, only a count of the steps apart, and no verdict.
    ``(text, {"looks", "per_look_p", "family_p"})``."""
    per_look = 2 / math.comb(2 * seeds, seeds)
    looks = {"looks": len(verdicts), "per_look_p": per_look, "family_p": min(1.0, len(verdicts) * per_look)}
    if not verdicts:
        return verdict_text(verdicts), looks
    if looks["family_p"] < ALPHA:
        return f"{verdict_text(verdicts)} (any step: p <= {looks['family_p']:.3f} over {len(verdicts)} looks)", looks
    apart = {kind: sum(v == kind for v in verdicts.values()) for kind in ("better", "worse")}
    return (f"no verdict ({len(verdicts)} looks x {per_look:.3f} >= {ALPHA}); seed ranges apart at "
            f"{apart['better'] + apart['worse']} of {len(verdicts)} steps: better at {apart['better']}, worse at "
            f"{apart['worse']}", looks)


def _ranges(steps, all_steps):
    """``step 300``, ``steps 100-300`` or ``steps 100-200, 500``: runs of consecutive validation steps."""
    groups = []
    for step in sorted(steps):
        if groups and all_steps.index(step) == all_steps.index(groups[-1][-1]) + 1:
            groups[-1].append(step)
        else:
            groups.append([step])
    text = ", ".join(f"{g[0]}-{g[-1]}" if len(g) > 1 else str(g[0]) for g in groups)
    return ("step " if len(steps) == 1 else "steps ") + text


def paper_claim(config):
    """What the paper of a config reports (one line), from the paper BLEU of tools/reproduce.py's tables."""
    claim = PAPER_CLAIMS.get(config, "")
    if isinstance(claim, str):
        return claim
    from tools import reproduce

    table, base_index, index, what = claim
    base, row = (reproduce.TABLES[table][i].paper_bleu for i in (base_index, index))
    return f"{row - base:+.2f} BLEU ({base:.2f} -> {row:.2f}): {what}"


# ---------------------------------------------------------------- Speed and the estimate


#: What the probe measured for one config: seconds per training step, per validation and to start.
Speed = namedtuple("Speed", "step valid startup")


def reused_probe(previous, configs, all_finished):
    """The :class:`Speed` of each of ``configs`` from the ``previous`` report (its JSON, or None) when
    ``all_finished`` (every run of this invocation is reused, so nothing is estimated) and it probed them all;
    else None, and the probe runs."""
    probed = (previous or {}).get("probe") or {}
    if not all_finished or any(name not in probed for name in configs):
        return None
    return {name: Speed(**probed[name]) for name in configs}


def probe(configs, seed, steps, jobs, threads, work):
    """Train every config ``steps`` steps (``jobs`` at a time) and measure its :class:`Speed`."""
    report_every = max(1, steps // 6)

    def one(name):
        run = Run(name, seed, work / "probe" / name, steps)
        wall = _train(run, threads, steps, report_every)
        log = train_log.read(run.train_log)
        per_step, valid = log.seconds_per_step(), log.valid_seconds() or 0.0
        if per_step is None:
            raise SystemExit(f"compare.py: error: the probe of {name} logged too few step reports; see {run.train_log}")
        return name, Speed(per_step, valid, max(0.0, wall - steps * per_step - valid))

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return dict(pool.map(one, configs))


def schedule_seconds(durations, jobs):
    """Wall-clock seconds of tasks given to ``jobs`` workers in order, each to the first worker free."""
    free = [0.0] * jobs
    for duration in durations:
        free[free.index(min(free))] += duration
    return max(free)


def estimate(speeds, configs, seeds, jobs, plateau_step, window, valid_every, translate_seconds, search=True,
             done=frozenset()):
    """Estimated seconds (``baseline``, ``others``, ``total``) of phases 2-3 for a plateau step: the baseline's
    seeds at once for ``plateau_step + window`` steps, then every other run in ``jobs`` slots, each translating once;
    without the ``search``, every run in the slots for ``plateau_step`` steps but the ``(config, seed)`` runs in
    ``done`` (finished: reused)."""
    baseline = others = 0.0
    if search:  # the baseline's seeds share the cores; their translations then take turns in the slots
        base, steps = speeds[configs[0]], plateau_step + window
        baseline = base.startup + max(1.0, len(seeds) / jobs) * (base.step * steps
                                                                  + base.valid * (steps // valid_every))
        others = math.ceil(len(seeds) / jobs) * translate_seconds
    queued = [speeds[name] for seed in seeds for name in (configs[1:] if search else configs)
              if (name, seed) not in done]
    others += schedule_seconds([speed.startup + speed.step * plateau_step + speed.valid * (plateau_step // valid_every)
                                + translate_seconds for speed in queued], jobs)
    return {"baseline": baseline, "others": others, "total": baseline + others}


def choose_max_steps(speeds, configs, seeds, jobs, window, valid_every, translate_seconds, budget_seconds):
    """The largest multiple of ``valid_every`` (at least ``valid_every``) whose :func:`estimate` with the
    plateau there fits ``budget_seconds``."""
    fitting = itertools.takewhile(
        lambda steps: estimate(speeds, configs, seeds, jobs, steps, window, valid_every, translate_seconds)["total"]
        <= budget_seconds, range(valid_every, MAX_STEPS_CEILING + 1, valid_every))
    return max(fitting, default=valid_every)


def _minutes(seconds):
    return f"{seconds / 60:.0f} min" if seconds >= 600 else f"{seconds / 60:.1f} min"


# ---------------------------------------------------------------- Phase 2: the baseline until its plateau


def _plateau_of(runs, window, tolerance, max_steps):
    """The runs' validation perplexities (:func:`seed_curves`) and :func:`find_plateau`'s decision on their mean."""
    curves = seed_curves([train_log.read(run.train_log) for run in runs])
    steps = sorted(curves)
    return curves, find_plateau(steps, [statistics.fmean(curves[s]) for s in steps], window, tolerance, max_steps)


def baseline_until_plateau(runs, cores, valid_every, report_every, window, tolerance, max_steps):
    """Train the baseline's runs at once until :func:`find_plateau` decides; ``(P, found, seconds)``."""
    decided = _plateau_of(runs, window, tolerance, max_steps)[1] if all(r.train_log.exists() for r in runs) else None
    if decided and all(checkpoint(r, decided[0]).exists() for r in runs):
        print(f"compare.py: the baseline's logs in {runs[0].directory.parent} already decide the plateau", flush=True)
        return decided[0], decided[1], None
    threads = max(1, cores // len(runs))
    processes = []
    start = time.perf_counter()
    try:
        for run in runs:
            _fresh_training(run)
            processes.append(_logged(train_command(run, valid_every, report_every, max_steps + window), threads,
                                     run.directory / "train.console.log"))
        shown, decided = 0, None
        while not decided:
            time.sleep(POLL_SECONDS)
            curves, decided = _plateau_of(runs, window, tolerance, max_steps)
            if curves and max(curves) > shown:
                shown = max(curves)
                print(f"  baseline step {shown}: mean validation perplexity "
                      f"{statistics.fmean(curves[shown]):.2f} ({_minutes(time.perf_counter() - start)})", flush=True)
            if not decided and all(process.poll() is not None for process in processes):
                for run, process in zip(runs, processes):
                    if process.returncode:
                        raise SystemExit(f"compare.py: error: onmt_train failed (exit {process.returncode}); see "
                                         f"{run.directory / 'train.console.log'}")
                decided = _plateau_of(runs, window, tolerance, max_steps)[1]
                if not decided:
                    raise SystemExit("compare.py: error: the baseline's logs end before the plateau rule can "
                                     f"decide; see {runs[0].train_log}")
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
    step = decided[0]
    for run in runs:
        kept = checkpoint(run, step)
        if not kept.exists():
            raise SystemExit(f"compare.py: error: no checkpoint of step {step} in {run.directory}")
        for other in run.directory.glob("model_step_*.pt"):
            if other.name != kept.name:
                other.unlink()
    return step, decided[1], time.perf_counter() - start


# ---------------------------------------------------------------- Scores and the report


def _mean_sd(values):
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def t_test_p(deltas):
    """``(t, two-sided p)`` of the paired t-test of ``deltas`` against mean 0, n - 1 degrees of freedom: Student's
    t tail in closed form for a whole number of degrees (Abramowitz & Stegun 26.7.3-4)."""
    n = len(deltas)
    mean, sd = statistics.fmean(deltas), statistics.stdev(deltas) if n > 1 else 0.0
    if sd == 0:
        return (0.0, 1.0) if mean == 0 or n < 2 else (math.copysign(math.inf, mean), 0.0)
    t, df = mean / sd * math.sqrt(n), n - 1
    theta = math.atan(abs(t) / math.sqrt(df))
    odd, c2, term, series = df % 2, math.cos(theta) ** 2, 1.0, 0.0
    for k in range(1, (df - 1) // 2 + 1 if odd else df // 2 + 1):
        series += term
        term *= c2 * (2 * k if odd else 2 * k - 1) / (2 * k + 1 if odd else 2 * k)
    inside = 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * series) if odd else math.sin(theta) * series
    return t, max(0.0, 1.0 - inside)


def seed_test(baseline_scores, scores):
    """Per-seed differences d_i = scores[i] - baseline_scores[i] with two paired two-sided tests: the exact sign-flip
    permutation test (p: the share of the 2^n sign assignments whose |mean| reaches |mean d|, at least 2 / 2^n) and
    the t-test (:func:`t_test_p`).  ``{"deltas", "mean_delta", "exact_p", "min_p", "t", "t_p", "better", "worse"}``."""
    deltas = [b - a for a, b in zip(baseline_scores, scores, strict=True)]
    observed = abs(statistics.fmean(deltas))
    signs = itertools.product((1, -1), repeat=len(deltas))
    extreme = sum(abs(statistics.fmean(s * d for s, d in zip(sign, deltas))) >= observed - 1e-9 for sign in signs)
    t, t_p = t_test_p(deltas)
    return {"deltas": deltas, "mean_delta": statistics.fmean(deltas), "exact_p": extreme / 2 ** len(deltas),
            "min_p": 2 / 2 ** len(deltas), "t": t, "t_p": t_p, "better": sum(d > 0 for d in deltas),
            "worse": sum(d < 0 for d in deltas)}


def holm(p_values):
    """Holm's step-down adjustment: the k-th smallest of m p values times (m - k + 1), never below an earlier
    one's, at most 1; in the order given."""
    adjusted, running = [None] * len(p_values), 0.0
    for rank, i in enumerate(sorted(range(len(p_values)), key=p_values.__getitem__)):
        running = adjusted[i] = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
    return adjusted


#: The metrics the seeds are tested on, and the level a Holm-adjusted p must be below for a verdict.
METRICS, ALPHA = {"bleu": "BLEU", "chrf": "chrF"}, 0.05


def seed_verdict(tests):
    """One sentence from a row's ``across_seeds`` tests: "better"/"worse" only in the metrics whose Holm-adjusted
    t-test p is below ALPHA, naming them; every metric's mean delta and adjusted p beside."""
    shown = {m: ("better" if t["mean_delta"] > 0 else "worse") for m, t in tests.items() if t["t_p_holm"] < ALPHA}
    numbers = {m: f"{METRICS[m]} ({t['mean_delta']:+.2f}, Holm p {t['t_p_holm']:.3f})" for m, t in tests.items()}
    if not shown:
        return "not shown apart from the baseline in " + " or ".join(numbers.values())
    claims = [f"{kind} than the baseline in {numbers[m]}" for m, kind in shown.items()]
    rest = [numbers[m] for m in tests if m not in shown]
    return "; ".join(claims) + ("; not shown apart in " + " or ".join(rest) if rest else "")


def add_seed_tests(rows):
    """Give every row after the first (the baseline) its :func:`seed_test` per metric against the first, with both
    p values Holm-adjusted over the rows (``across_seeds``: ``{metric: test}``), and its :func:`seed_verdict`."""
    base, others = rows[0]["seeds"], rows[1:]
    for row in others:
        row["across_seeds"] = {metric: seed_test([e[metric] for e in base], [e[metric] for e in row["seeds"]])
                               for metric in METRICS if all(metric in e for e in row["seeds"] + base)}
    for metric in METRICS:
        tests = [row["across_seeds"][metric] for row in others if metric in row["across_seeds"]]
        for key in ("exact_p", "t_p"):
            for test, adjusted in zip(tests, holm([test[key] for test in tests])):
                test[key + "_holm"] = adjusted
    for row in others:
        row["verdict"] = seed_verdict(row["across_seeds"])
    return rows


def score(runs, configs, seeds, refs_path, test_lines, speeds):
    """Per-config summary dicts: BLEU/chrF mean and sd, bootstrap per seed, the probe's speed ratio, parameters."""
    from onmt_ext.integration import evaluation as ev

    refs = ev.read_reference_tsv(refs_path)
    if test_lines:
        refs = [stream[:test_lines] for stream in refs]
    hyps = {(r.config, r.seed): ev.read_hypotheses(r.hypotheses) for r in runs}
    by_key = {(r.config, r.seed): r for r in runs}
    rows = []
    for name in configs:
        per_seed = []
        for seed in seeds:
            run = by_key[(name, seed)]
            log = train_log.read(run.train_log)
            entry = {"seed": seed, "bleu": ev.nist_bleu(hyps[(name, seed)], refs).score,
                     "chrf": ev.chrf(hyps[(name, seed)], refs).score,
                     "tok_per_s": log.tokens_per_second(), "parameters": log.parameters,
                     "train_seconds": run.train_seconds, "translate_seconds": run.translate_seconds}
            if name != configs[0]:
                test = ev.paired_bootstrap(hyps[(configs[0], seed)], hyps[(name, seed)], refs)
                entry.update(delta=test.delta, p_value=test.p_value, marker=test.marker)
            per_seed.append(entry)
        (bleu, bleu_sd), (chrf, chrf_sd) = (_mean_sd([e[key] for e in per_seed]) for key in ("bleu", "chrf"))
        significant = [e for e in per_seed if e.get("p_value") is not None and e["p_value"] < 0.05]
        rows.append({"config": name, "label": LABELS.get(name, name), "file": str(CONFIG_DIR / f"{name}.yaml"),
                     "bleu_mean": bleu, "bleu_sd": bleu_sd, "chrf_mean": chrf, "chrf_sd": chrf_sd,
                     "tok_per_s": _mean_sd([e["tok_per_s"] for e in per_seed])[0],
                     "parameters": per_seed[0]["parameters"], "seeds": per_seed,
                     "speed_ratio": speeds[configs[0]].step / speeds[name].step,
                     "significant_better": sum(e["delta"] > 0 for e in significant),
                     "significant_worse": sum(e["delta"] < 0 for e in significant)})
    return add_seed_tests(rows)


def learning_curves(runs, configs, seeds, last_step):
    """Per config: validation perplexity per seed, mean, min and max at the steps every seed has, and (but the
    baseline) the verdicts of the beats-the-baseline rule up to ``last_step``."""
    by_key = {(r.config, r.seed): r for r in runs}
    curves = {}
    for name in configs:
        per_seed = seed_curves([train_log.read(by_key[(name, seed)].train_log) for seed in seeds])
        steps = sorted(per_seed)
        curves[name] = {"step": steps, "mean": [statistics.fmean(per_seed[s]) for s in steps],
                        "min": [min(per_seed[s]) for s in steps], "max": [max(per_seed[s]) for s in steps],
                        "seeds": {str(seed): [per_seed[s][k] for s in steps] for k, seed in enumerate(seeds)}}
        until_last = {s: ppl for s, ppl in per_seed.items() if s <= last_step}
        if name == configs[0]:
            base = until_last
            continue
        verdicts = compare_at_steps(base, until_last)
        text, looks = looks_verdict(verdicts, len(seeds))
        curves[name].update(verdicts={str(s): v for s, v in verdicts.items()}, verdict=text, paper=paper_claim(name),
                            **looks)
    return curves


def markdown(report):
    """The Markdown report: BLEU table with significance, per seed, and the learning curves when present."""
    seeds = report["seeds"]
    n, others, plateau = len(seeds), len(report["rows"]) - 1, report.get("plateau")
    min_p = 2 / 2 ** n
    lines = [f"# Mechanisms compared on the Tatoeba zh-en sample ({len(seeds)} seeds: {seeds})", ""]
    if plateau and plateau.get("rule"):
        found = (f"plateaued at step {plateau['step']}" if plateau["found"] else
                 f"had not plateaued by step {plateau['max_steps']} (the cap), so every config stops there")
        lines += [f"Every config trained {report['train_steps']} steps: the baseline's mean validation perplexity "
                  f"{found}.  Rule: the plateau step is the first validation step s after which the next "
                  f"{plateau['window']} steps lower the mean validation perplexity over the seeds by less than "
                  f"{plateau['tolerance']:.1%} (validation every {plateau['valid_every']} steps on "
                  f"{plateau['valid_set']}).", ""]
    else:
        lines += [f"{report['train_steps']} training steps each.", ""]
    lines += [f"Test set {report['test_sentences']} sentences with all their references (multi-reference BLEU, "
              "13a, case-sensitive; chrF).  Significance, two ways.  *Per seed*: a paired bootstrap (1000 "
              "resamples of the test sentences, BLEU) against the baseline of the same seed; the column counts the "
              "seeds with p < 0.05, better/worse.  Each such test takes the test sentences as the sample and "
              "ignores the variance between seeds, so this count overstates what the seeds show.  *Across seeds* "
              "(the seeds are the unit of replication), for BLEU and chrF apart: the per-seed differences from the "
              "baseline of the same seed get two paired two-sided tests, an exact sign-flip permutation test (no "
              f"assumption on their distribution; with {n} seeds its smallest possible p is {min_p:.3f}"
              + (", so it cannot reach p < 0.05 with this many seeds; six are the fewest that can" if min_p >= ALPHA
                 else "") + ") and a t-test (which assumes normally distributed differences; "
              f"{n} values cannot check that).  Both are Holm-adjusted over the {others} configs; adjusted, the "
              f"exact test cannot go below {min(1.0, others * min_p):.3f}.  A verdict says better or worse only "
              f"in a metric whose Holm-adjusted t-test p is below {ALPHA}, and names that metric.  Speed: "
              + ("training steps per second of the speed probe (every config alike"
                 + ("; the previous report's, as every run was reused" if report.get("probe_reused") else "") + ") "
                 if report.get("probe") else
                 "mean target tokens/s of training ")
              + f"relative to the baseline ({report['jobs']} runs at a time, {report['threads']} thread(s) each: "
              "coarser than `make bench`).",
              "", "| config | BLEU (mean ± sd) | chrF (mean ± sd) | per seed: sig. better / worse | " + " | ".join(
                  f"across seeds, {name}: mean delta (seeds better / worse); exact p; t-test p (Holm)"
                  for name in METRICS.values()) + " | train speed vs baseline | parameters |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in report["rows"]:
        sig = "—" if row is report["rows"][0] else f"{row['significant_better']} / {row['significant_worse']}"
        tests = row.get("across_seeds") or {}
        across = [f"{t['mean_delta']:+.2f} ({t['better']} / {t['worse']}); {t['exact_p']:.3f}; {t['t_p']:.3f} "
                  f"({t['t_p_holm']:.3f})" if t else "—" for t in map(tests.get, METRICS)]
        params = "n/a" if row["parameters"] is None else f"{row['parameters']:,}"
        lines.append(f"| {row['label']} (`{row['file']}`) | {fmt(row['bleu_mean'])} ± {fmt(row['bleu_sd'])} | "
                     f"{fmt(row['chrf_mean'])} ± {fmt(row['chrf_sd'])} | {sig} | {' | '.join(across)} | "
                     f"{fmt(row['speed_ratio'])} | {params} |")
    verdicts = [f"- {row['config']}: {row['verdict']}" for row in report["rows"] if row.get("verdict")]
    lines += ["", "Verdicts across seeds (t-test, Holm-adjusted):", "", *verdicts] if verdicts else []
    lines += ["", "Per seed (BLEU; delta and p against the baseline of the same seed):", "",
              "| config | " + " | ".join(f"seed {s}" for s in seeds) + " |",
              "|---|" + "---:|" * len(seeds)]
    for row in report["rows"]:
        cells = [f"{e['bleu']:.2f}" + ("" if "p_value" not in e else
                                       f" ({e['delta']:+.2f}, p {e['p_value']:.3f}{e['marker'] and ' ' + e['marker']})")
                 for e in row["seeds"]]
        lines.append(f"| {row['config']} | " + " | ".join(cells) + " |")
    curves = report.get("curves")
    if curves:
        step = report["train_steps"]
        lines += ["", "## Learning curves", "", "![validation perplexity, mean and min-max over the seeds](curves.png)",
                  "", "A config's seed ranges are *apart* from the baseline's at a validation step when its worst "
                  "seed has a lower validation perplexity than the baseline's best seed (*better*), or the mirror "
                  f"case (*worse*).  For exchangeable runs, {n} seeds a side fall apart either way at one step with "
                  f"probability 2/C({2 * n},{n}) = {2 / math.comb(2 * n, n):.3f}.  A column names steps only when "
                  f"that times the number of steps looked at (Bonferroni) is below {ALPHA}; otherwise it counts the "
                  "steps apart and gives no verdict.  \"From step s on\" means at every validation step from s to "
                  "the last one.", "",
                  f"| config | validation ppl at step {step}: mean (min-max) | against the baseline | what the paper "
                  "reports (BLEU, its task) |", "|---|---:|---|---|"]
        for name, curve in curves.items():
            i = curve["step"].index(step) if step in curve["step"] else None
            value = "n/a" if i is None else f"{curve['mean'][i]:.2f} ({curve['min'][i]:.2f}-{curve['max'][i]:.2f})"
            lines.append(f"| {name} | {value} | {curve.get('verdict', '—')} | {curve.get('paper', '—')} |")
    if report.get("estimate_text"):
        lines += ["", f"Estimate printed before the trainings: {report['estimate_text']}"]
    earlier = report.get("earlier_invocations", [])
    own = _invocation_time(report)
    if earlier is None:
        wall = (f"Wall-clock time of this invocation: {own}; it reused {len(report['reused_runs'])} finished runs of "
                "an earlier invocation whose report does not record them, so the whole comparison took longer.")
    elif earlier:
        total = sum(e["wall_seconds"] for e in earlier) + report["wall_seconds"]
        wall = (f"Wall-clock time: {total / 60:.1f} min in {len(earlier) + 1} invocations sharing the runs of the "
                f"work folder: {', then '.join(map(_invocation_time, earlier))}, then {own}, which reused "
                f"{len(report['reused_runs'])} finished runs.")
    else:
        wall = f"Wall-clock time of the whole comparison: {own}."
    return "\n".join(lines + ["", wall, ""])


def _invocation_time(invocation):
    """``12.3 min (`python -m tools.compare ...`)`` for a report or an entry of its ``earlier_invocations``."""
    return f"{invocation['wall_seconds'] / 60:.1f} min (`{invocation['command']}`)"


def earlier_invocations(previous, reused, logs):
    """The earlier invocations whose ``reused`` runs (``config/seedN``) this report includes: those of the
    ``previous`` report when it recorded each with the same log time (``logs``), else None (origin unknown)."""
    if not reused:
        return []
    recorded = (previous or {}).get("run_logs") or {}
    if any(recorded.get(key) != logs[key] for key in reused) or previous.get("earlier_invocations", []) is None:
        return None  # (the previous report did not know all of its own runs' invocations either)
    own = {key: previous[key] for key in ("command", "wall_seconds", "estimate_text") if key in previous}
    return list(previous.get("earlier_invocations") or []) + [own]


def plot(report, path):
    """Bar chart of mean BLEU with the seed standard deviation, and the speed ratios, to ``path``."""
    plt = common.pyplot()
    rows = report["rows"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = [row["config"] for row in rows]
    left.bar(names, [row["bleu_mean"] for row in rows], yerr=[row["bleu_sd"] for row in rows], capsize=4,
             color=["grey"] + ["tab:blue"] * (len(rows) - 1))
    for x, row in enumerate(rows):
        left.plot([x] * len(row["seeds"]), [e["bleu"] for e in row["seeds"]], "k.", markersize=4)
    left.set_ylabel("BLEU (multi-reference)")
    left.set_title(f"Tatoeba zh-en, {report['train_steps']} steps, seeds {report['seeds']}")
    right.bar(names, [row["speed_ratio"] or 0 for row in rows], color=["grey"] + ["tab:orange"] * (len(rows) - 1))
    right.axhline(1.0, color="k", linewidth=0.8)
    right.set_ylabel("training speed (probe steps/s) relative to the baseline" if report.get("probe") else
                     "training tokens/s relative to the baseline")
    for axis in (left, right):
        axis.tick_params(axis="x", rotation=35)
        plt.setp(axis.get_xticklabels(), horizontalalignment="right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_curves(report, path):
    """The learning curves to ``path``: left, validation perplexity (log scale), mean and min-max band over the seeds;
    right, each over the baseline's mean (below 1: lower); a dotted line at the step every config trained to."""
    plt = common.pyplot()
    from matplotlib.ticker import MaxNLocator

    curves = report["curves"]
    names = list(curves)
    base = curves[names[0]]
    base_mean = dict(zip(base["step"], base["mean"]))
    tab10 = plt.get_cmap("tab10")
    colours = [tab10(i) for i in range(10) if i != 7]  # no grey: the baseline's band is grey-black
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    late = []  # the ratios from a quarter of the steps on (the early ones, still falling fast, would squash the range)
    for k, name in enumerate(names):
        curve = curves[name]
        colour = "black" if k == 0 else colours[(k - 1) % len(colours)]
        style = {"color": colour, "linewidth": 1.6 if k == 0 else 1.2, "marker": ".", "markersize": 4, "label": name}
        band = {"color": colour, "alpha": 0.15, "linewidth": 0}
        left.plot(curve["step"], curve["mean"], **style)
        left.fill_between(curve["step"], curve["min"], curve["max"], **band)
        shared = [(i, s) for i, s in enumerate(curve["step"]) if s in base_mean]
        if shared:
            steps = [s for _, s in shared]
            ratio, low, high = ([curve[key][i] / base_mean[s] for i, s in shared] for key in ("mean", "min", "max"))
            right.plot(steps, ratio, **style)
            right.fill_between(steps, low, high, **band)
            late += [v for s, lo, hi in zip(steps, low, high) if s >= report["train_steps"] / 4 for v in (lo, hi)]
    for axis in (left, right):
        axis.axvline(report["train_steps"], color="grey", linestyle=":", linewidth=1)
        axis.annotate(f" step {report['train_steps']}", (report["train_steps"], 1.0),
                      xycoords=("data", "axes fraction"), va="top", fontsize=8, color="grey")
        axis.set_xlabel("training step")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.grid(alpha=0.3)
    left.set_yscale("log")
    left.set_ylabel("validation perplexity (mean, min-max over seeds)")
    left.set_title(f"Tatoeba zh-en validation set, seeds {report['seeds']}")
    right.axhline(1.0, color="black", linewidth=0.8)
    right.set_ylabel("validation perplexity / baseline's mean")
    right.set_title("relative to the baseline (below 1: better)")
    if late:
        right.set_ylim(min(late + [1.0]) * 0.97, max(late + [1.0]) * 1.03)
    left.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- main


def report_only(out):
    """``--report-only``: rewrite ``<out>/compare.json`` and ``compare.md`` with what the current code derives from
    the numbers: the across-seeds tests (:func:`add_seed_tests`) and each curve's verdict from its per-step verdicts."""
    path = Path(out) / "compare.json"
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SystemExit(f"compare.py: error: cannot read {path}: {exc}") from None
    add_seed_tests(report["rows"])
    for curve in (report.get("curves") or {}).values():
        if "verdicts" in curve:
            text, looks = looks_verdict({int(step): kind for step, kind in curve["verdicts"].items()},
                                        len(report["seeds"]))
            curve.update(verdict=text, **looks)
    print(write_report(report, Path(out)))
    return 0


def write_report(report, out):
    """Write ``report`` to ``<out>/compare.json`` and its :func:`markdown` to ``<out>/compare.md``; the Markdown."""
    text = markdown(report)
    (out / "compare.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    (out / "compare.md").write_text(text, encoding="utf-8")
    return text


def main(argv=None):
    parser = common.Parser(prog="compare.py", description=__doc__.split("\n")[0])
    add, positive = parser.add_argument, common.at_least(1)
    add("--seeds", type=int, nargs="+", default=list(range(1, 7)),
        help="seeds of every config (default 1-6: six are the fewest with which the exact test across seeds can "
             "reach p < 0.05; runs of earlier seeds are reused)")
    add("--configs", nargs="+", default=list(CONFIGS),
        help="configs of yaml_configs/compare/ to run; the first is the baseline")
    add("--jobs", type=positive, default=2, help="runs at a time (each gets cores/jobs threads)")
    add("--valid-every", type=positive, default=100, help="validation interval in steps (default 100)")
    add("--plateau-window", type=positive, default=400,
        help="steps after a validation step within which the mean validation perplexity must improve by the tolerance "
             "for training to go on (default 400)")
    add("--plateau-tolerance", type=float, default=0.01,
        help="relative improvement of the mean validation perplexity that counts (default 0.01)")
    add("--max-steps", type=positive, help="cap of the plateau step (default: the largest that fits --budget-minutes)")
    add("--budget-minutes", type=float, default=330.0,
        help="time the run may take; sizes the default --max-steps (default 330: six seeds of eight configs)")
    add("--probe-steps", type=common.at_least(6), default=40,
        help="steps of each config's speed probe, its speed read between step reports (default 40)")
    add("--train-steps", type=positive, help="train every config this many steps, without the plateau search")
    add("--test-lines", type=positive, help="translate only the first N test lines")
    add("--work", type=Path, default=Path("build/compare"))
    add("--out", type=Path, default=Path("results/compare"))
    add("--report-only", action="store_true",
        help="rewrite <out>/compare.{json,md} from <out>/compare.json with the current statistics and wording, "
             "training and translating nothing")
    args = parser.parse_args(argv)
    if args.report_only:
        others = [name for name, value in vars(args).items()
                  if name not in ("report_only", "out") and value != parser.get_default(name)]
        if others:
            parser.error(f"--report-only takes only --out, not --{others[0].replace('_', '-')}")
        return report_only(args.out)
    for name in args.configs:
        if not (REPO / CONFIG_DIR / f"{name}.yaml").exists():
            parser.error(f"--configs: no {CONFIG_DIR / (name + '.yaml')}")
    if len(set(args.configs)) != len(args.configs) or len(set(args.seeds)) != len(args.seeds):
        parser.error("--configs and --seeds must be distinct")
    if not 0 <= args.plateau_tolerance < 1:
        parser.error("--plateau-tolerance must be in [0, 1)")
    if args.budget_minutes <= 0:
        parser.error("--budget-minutes must be > 0")
    for option in ("plateau_window", "max_steps", "train_steps"):
        value = getattr(args, option)
        if value is not None and value % args.valid_every:
            parser.error(f"--{option.replace('_', '-')} must be a multiple of --valid-every ({args.valid_every})")
    here = os.getcwd()
    os.chdir(REPO)
    for needed in (TEST_SOURCE, TEST_REFS, Path("build/tatoeba/valid.zh")):
        if not needed.exists():
            raise SystemExit(f"compare.py: error: {needed} is missing; run `{make_command('data', here)}` first")
    started = time.perf_counter()
    cores = os.cpu_count() or 1
    threads = max(1, cores // args.jobs)
    test_sentences = all_sentences = sum(1 for _ in TEST_SOURCE.open(encoding="utf-8"))
    source = TEST_SOURCE
    if args.test_lines:
        source = args.work / f"test.first{args.test_lines}.zh"
        source.parent.mkdir(parents=True, exist_ok=True)
        with open(TEST_SOURCE, encoding="utf-8", newline="\n") as handle:
            source.write_text("".join(line for _, line in zip(range(args.test_lines), handle)), encoding="utf-8")
        test_sentences = min(test_sentences, args.test_lines)
    report_every = max(1, min(args.valid_every, 100) // 2)
    search = args.train_steps is None
    window = args.plateau_window if search else 0

    # 1. the probe and the estimate
    done = frozenset() if search else finished_runs(args.configs, args.seeds, args.work, args.train_steps,
                                                      args.test_lines, args.valid_every)
    previous = args.out / "compare.json"
    speeds = reused_probe(json.loads(previous.read_text(encoding="utf-8")) if previous.exists() else None,
                          args.configs, len(done) == len(args.configs) * len(args.seeds))
    reused_speeds = speeds is not None
    if reused_speeds:
        print(f"compare.py: every run is finished: the speed probe of {previous} is reported again",
              flush=True)
    else:
        print(f"compare.py: probing the speed of {len(args.configs)} configs ({args.probe_steps} steps each, "
              f"{args.jobs} at a time)", flush=True)
        speeds = probe(args.configs, args.seeds[0], args.probe_steps, args.jobs, threads, args.work)
    for name, speed in speeds.items():
        print(f"  {name}: {speed.step:.3f} s/step, {speed.valid:.1f} s/validation, {speed.startup:.0f} s start-up",
              flush=True)
    translate_allowance = TRANSLATE_ALLOWANCE * test_sentences / all_sentences

    def estimate_at(plateau_step, translate_seconds=translate_allowance):
        return estimate(speeds, args.configs, args.seeds, args.jobs, plateau_step, window, args.valid_every,
                        translate_seconds, search, done)

    budget = args.budget_minutes * 60 - (time.perf_counter() - started)
    max_steps = args.max_steps or args.train_steps or choose_max_steps(
        speeds, args.configs, args.seeds, args.jobs, window, args.valid_every, translate_allowance,
        BUDGET_SHARE * budget)
    worst = estimate_at(max_steps)
    if search:
        half_step = max(args.valid_every, max_steps // 2 // args.valid_every * args.valid_every)
        estimate_text = (f"at most {_minutes(worst['total'])} more (baseline until its plateau, at most "
                         f"{max_steps + window} steps: {_minutes(worst['baseline'])}; the other configs to a plateau "
                         f"at the cap of {max_steps} steps: {_minutes(worst['others'])}); "
                         f"{_minutes(estimate_at(half_step)['total'])} if the plateau is at step {half_step}; "
                         f"translation counted at {translate_allowance:.0f} s per model until the baseline's is timed")
    else:
        estimate_text = (f"about {_minutes(worst['total'])} more ({max_steps} steps per run; "
                         f"{len(done)} of {len(args.configs) * len(args.seeds)} runs finished before, reused)")
    print(f"compare.py: estimate: {estimate_text}" + ("" if reused_speeds else
                                                     f"; the probe took {_minutes(time.perf_counter() - started)}"),
          flush=True)
    if worst["total"] > budget:
        print(f"compare.py: warning: the estimate exceeds --budget-minutes {args.budget_minutes:g}", flush=True)

    # 2. the baseline until its plateau
    steps, plateau = args.train_steps, None
    base_runs = [Run(args.configs[0], seed, args.work / args.configs[0] / f"seed{seed}", steps, args.test_lines)
                 for seed in args.seeds]
    if search:
        print(f"compare.py: training the baseline with seeds {args.seeds} until its plateau (at most "
              f"{max_steps + window} steps)", flush=True)
        steps, found, seconds = baseline_until_plateau(base_runs, cores, args.valid_every, report_every,
                                                       window, args.plateau_tolerance, max_steps)
        for run in base_runs:
            run.train_steps, run.train_seconds = steps, seconds
        plateau = {"rule": "first validation step s with min(v(t), s < t <= s + window) > (1 - tolerance) v(s), "
                           "v the mean validation perplexity over the seeds; the cap if none",
                   "window": window, "tolerance": args.plateau_tolerance, "valid_every": args.valid_every,
                   "max_steps": max_steps, "step": steps, "found": found,
                   "valid_set": str(common.config_values(f"compare/{args.configs[0]}.yaml")["data"]["valid"]
                                    ["path_src"]).rsplit(".", 1)[0] + ".{zh,en}"}
        print(f"compare.py: plateau step {steps}" + ("" if found else f" (the cap: no plateau up to {max_steps})"),
              flush=True)
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            list(pool.map(lambda run: translate_run(run, threads, source), base_runs))
        timed = [run.translate_seconds for run in base_runs if run.translate_seconds]
        rest = estimate_at(steps, statistics.fmean(timed) if timed else translate_allowance)
        print(f"compare.py: the other configs: about {_minutes(rest['others'])} more (less for runs already done)",
              flush=True)

    # 3. the other configs
    others = [Run(name, seed, args.work / name / f"seed{seed}", steps, args.test_lines)
              for seed in args.seeds for name in args.configs[1:]]
    runs = base_runs + others

    def train_and_translate(run):
        return translate_run(train_run(run, threads, args.valid_every, report_every), threads, source)

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(train_and_translate, others if search else runs))
    wall = time.perf_counter() - started
    reused = [f"{run.config}/seed{run.seed}" for run in runs if run.train_seconds is None]
    logs = {f"{run.config}/seed{run.seed}": run.train_log.stat().st_mtime for run in runs}

    # 4. the report
    rows = score(runs, args.configs, args.seeds, TEST_REFS, args.test_lines, speeds)
    curves = learning_curves(runs, args.configs, args.seeds, steps)
    report = {"seeds": args.seeds, "train_steps": steps, "jobs": args.jobs, "threads": threads,
              "test_sentences": test_sentences, "wall_seconds": wall, "estimate_text": estimate_text,
              "command": shlex.join(["python", "-m", "tools.compare", *(sys.argv[1:] if argv is None else argv)]),
              "plateau": plateau, "probe": {name: speed._asdict() for name, speed in speeds.items()},
              "probe_reused": reused_speeds,
              "commands": {f"{r.config}/seed{r.seed}": [
                  shlex.join(train_command(r, args.valid_every, report_every,
                                           max_steps + window if search and r in base_runs else None)),
                  shlex.join(translate_command(r, source))] for r in runs},
              "rows": rows, "curves": curves, "reused_runs": reused, "run_logs": logs}
    report["earlier_invocations"] = earlier_invocations(
        json.loads(previous.read_text(encoding="utf-8")) if previous.exists() else None, reused, logs)
    args.out.mkdir(parents=True, exist_ok=True)
    text = write_report(report, args.out)
    plot(report, args.out / "compare.png")
    plot_curves(report, args.out / "curves.png")
    print(text)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit("compare.py: error: interrupted; finished runs are kept under the --work directory")
