#!/usr/bin/env python
"""``make compare``: the five papers' mechanisms side by side on the shipped Chinese->English sample (CPU).

Usage::

    python tools/compare.py [--seeds 1 2 3] [--jobs 2] [--configs baseline gret ...]
                            [--train-steps N] [--test-lines N] [--out results/compare]

Every config of ``yaml_configs/compare/`` (the stock baseline, one
representative row of each paper and one combination) is trained with each
seed for the same number of steps on the same data, translates the Tatoeba
multi-reference test set (beam 4), and is scored with sacreBLEU through
:mod:`onmt_ext.evaluation`:

* BLEU (13a, case-sensitive, all references) and chrF per run; mean and
  sample standard deviation over the seeds;
* a paired bootstrap test (1000 resamples) of each run against the baseline
  trained with the same seed; the table counts the seeds on which the
  difference is significant (p < 0.05) and says in which direction;
* training tokens per second (target side, from OpenNMT-py's step reports)
  and its ratio to the baseline's, the wall-clock time of each run, and the
  parameter count.

``--jobs 2`` runs two trainings at once with one thread each (on two cores
that is faster than one run with two threads for models this small); the
speed ratios are then measured with the other core busy and are coarser than
``make bench``'s, which measures speed alone and should be preferred for
speed.  Runs whose checkpoint (or translation) exists are not redone.  The
report goes to ``<out>/compare.{json,md,png}`` with the commands that were
run.
"""

import argparse
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIG_DIR = Path("yaml_configs/compare")
#: Order of the rows; the first is the baseline every other row is tested against.
CONFIGS = ("baseline", "li2019_em", "cao2019_cross", "chen2019_mprhead", "clause_ca_rule", "gret", "combined")
LABELS = {
    "baseline": "Transformer (stock OpenNMT-py)",
    "li2019_em": "li2019: EM routing, enc-self",
    "cao2019_cross": "cao2019: cross aggregation",
    "chen2019_mprhead": "chen2019: MPRHead",
    "clause_ca_rule": "clause attention (rule)",
    "gret": "GRET (weng2020)",
    "combined": "MPRHead + EM routing + GRET",
}
TEST_SOURCE = Path("build/tatoeba/test.zh")
TEST_REFS = Path("build/tatoeba/test.en.refs.tsv")
_STEP = re.compile(r"Step\s+(\d+)/\s*\d+;.*?(\d+)/\s*(\d+) tok/s")
_PARAMS = re.compile(r"\* number of parameters: (\d+)")


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
        return self.directory / "train.console.log"


def _config_values(name):
    import yaml

    return yaml.safe_load((REPO / CONFIG_DIR / f"{name}.yaml").read_text(encoding="utf-8"))


def train_command(run, train_steps=None):
    """``onmt_train`` arguments of a run: the compare config with its seed and its own output paths."""
    command = ["onmt_train", "-config", str(CONFIG_DIR / f"{run.config}.yaml"), "-seed", str(run.seed),
               "-save_model", str(run.directory / "model"), "-save_data", str(run.directory / "samples"),
               "-log_file", str(run.directory / "train.log")]
    if train_steps:
        command += ["-train_steps", str(train_steps), "-valid_steps", str(train_steps),
                    "-save_checkpoint_steps", str(train_steps), "-report_every", str(max(1, train_steps // 2))]
    return command


def checkpoint(run, train_steps=None):
    return run.directory / f"model_step_{run.train_steps}.pt"


def translate_command(run, source, train_steps=None):
    """``onmt_translate`` arguments: beam 4 with the model's SentencePiece models and, for clause attention,
    the same on-the-fly clause split as in training."""
    sys.path.insert(0, str(REPO))
    from onmt_ext.clause_split import translate_options

    values = _config_values(run.config)
    return ["onmt_translate", "-model", str(checkpoint(run, train_steps)), "-src", str(source),
            "-output", str(run.hypotheses), "-beam_size", "4", "-batch_size", "64", "-batch_type", "sents",
            "-max_length", "100", *translate_options(values, ("sentencepiece",)),
            "-src_subword_model", values["src_subword_model"], "-tgt_subword_model", values["tgt_subword_model"],
            "-log_file", str(run.directory / "translate.log")]


def _execute(command, threads, log):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    bin_dir = Path(sys.executable).parent
    start = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        out.write(f"$ {shlex.join(command)}\n")
        out.flush()
        result = subprocess.run([str(bin_dir / command[0]), *command[1:]], env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    if result.returncode:
        raise SystemExit(f"compare.py: {command[0]} failed (exit {result.returncode}); see {log}")
    return time.perf_counter() - start


def execute_run(run, threads, source, train_steps=None):
    """Train (unless the checkpoint exists) and translate (unless the output exists) one run."""
    run.directory.mkdir(parents=True, exist_ok=True)
    if not checkpoint(run, train_steps).exists():
        run.train_seconds = _execute(train_command(run, train_steps), threads, run.train_log)
    if run.train_seconds is not None or not run.hypotheses.exists():  # a new model is translated again
        run.translate_seconds = _execute(translate_command(run, source, train_steps), threads,
                                         run.directory / "translate.console.log")
    return run


def training_speed(log_text):
    """Mean target tokens/s over OpenNMT-py's step reports (the first report, with start-up, left out)."""
    speeds = [int(m.group(3)) for m in _STEP.finditer(log_text)]
    speeds = speeds[1:] or speeds
    return statistics.fmean(speeds) if speeds else None


def parameter_count(log_text):
    match = _PARAMS.search(log_text)
    return int(match.group(1)) if match else None


def _mean_sd(values):
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def score(runs, configs, seeds, refs_path, test_lines=None):
    """Per-config summary dicts (BLEU/chrF mean and sd, bootstrap per seed, speed, parameters)."""
    sys.path.insert(0, str(REPO))
    from onmt_ext import evaluation as ev

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
            log_text = run.train_log.read_text(encoding="utf-8", errors="replace") if run.train_log.exists() else ""
            entry = {"seed": seed, "bleu": ev.nist_bleu(hyps[(name, seed)], refs).score,
                     "chrf": ev.chrf(hyps[(name, seed)], refs).score,
                     "tok_per_s": training_speed(log_text), "parameters": parameter_count(log_text),
                     "train_seconds": run.train_seconds, "translate_seconds": run.translate_seconds}
            if name != configs[0]:
                test = ev.paired_bootstrap(hyps[(configs[0], seed)], hyps[(name, seed)], refs)
                entry.update(delta=test.delta, p_value=test.p_value, marker=test.marker)
            per_seed.append(entry)
        bleu, bleu_sd = _mean_sd([e["bleu"] for e in per_seed])
        chrf, chrf_sd = _mean_sd([e["chrf"] for e in per_seed])
        speed, _ = _mean_sd([e["tok_per_s"] for e in per_seed])
        rows.append({"config": name, "label": LABELS.get(name, name), "file": str(CONFIG_DIR / f"{name}.yaml"),
                     "bleu_mean": bleu, "bleu_sd": bleu_sd, "chrf_mean": chrf, "chrf_sd": chrf_sd,
                     "tok_per_s": speed, "parameters": per_seed[0]["parameters"], "seeds": per_seed})
    base = rows[0]
    for row in rows:
        row["speed_ratio"] = (row["tok_per_s"] / base["tok_per_s"]
                              if row["tok_per_s"] and base["tok_per_s"] else None)
        significant = [e for e in row["seeds"] if e.get("p_value") is not None and e["p_value"] < 0.05]
        row["significant_better"] = sum(e["delta"] > 0 for e in significant)
        row["significant_worse"] = sum(e["delta"] < 0 for e in significant)
    return rows


def _fmt(value, digits=2):
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def markdown(report):
    """The Markdown table of a report dict (one row per config)."""
    seeds = report["seeds"]
    lines = [f"# Mechanisms compared on the Tatoeba zh-en sample ({len(seeds)} seeds: {seeds})", "",
             f"{report['train_steps']} training steps each; test set {report['test_sentences']} sentences with "
             "all their references (multi-reference BLEU, 13a, case-sensitive; chrF).  Significance: paired "
             "bootstrap (1000 resamples) against the baseline of the same seed; the column counts the seeds "
             "with p < 0.05, better/worse.  Speed: mean target tokens/s of training relative to the baseline "
             f"({report['jobs']} runs at a time, {report['threads']} thread(s) each: coarser than `make bench`).",
             "", "| config | BLEU (mean ± sd) | chrF (mean ± sd) | seeds sig. better / worse | train speed vs "
             "baseline | parameters |", "|---|---:|---:|---:|---:|---:|"]
    for row in report["rows"]:
        sig = "—" if row is report["rows"][0] else f"{row['significant_better']} / {row['significant_worse']}"
        params = "n/a" if row["parameters"] is None else f"{row['parameters']:,}"
        lines.append(f"| {row['label']} (`{row['file']}`) | {_fmt(row['bleu_mean'])} ± {_fmt(row['bleu_sd'])} | "
                     f"{_fmt(row['chrf_mean'])} ± {_fmt(row['chrf_sd'])} | {sig} | {_fmt(row['speed_ratio'])} | "
                     f"{params} |")
    lines += ["", "Per seed (BLEU; delta and p against the baseline of the same seed):", "",
              "| config | " + " | ".join(f"seed {s}" for s in seeds) + " |",
              "|---|" + "---:|" * len(seeds)]
    for row in report["rows"]:
        cells = []
        for entry in row["seeds"]:
            extra = "" if "p_value" not in entry else \
                f" ({entry['delta']:+.2f}, p {entry['p_value']:.3f}{entry['marker'] and ' ' + entry['marker']})"
            cells.append(f"{entry['bleu']:.2f}{extra}")
        lines.append(f"| {row['config']} | " + " | ".join(cells) + " |")
    lines += ["", f"Wall-clock time of the whole comparison: {report['wall_seconds'] / 60:.1f} min "
                  f"(`{report['command']}`).", ""]
    return "\n".join(lines)


def plot(report, path):
    """Bar chart of mean BLEU with the seed standard deviation, and the speed ratios, to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    right.set_ylabel("training tokens/s relative to the baseline")
    for axis in (left, right):
        axis.tick_params(axis="x", rotation=35)
        for label in axis.get_xticklabels():
            label.set_horizontalalignment("right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS),
                        help="configs of yaml_configs/compare/ to run; the first is the baseline")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (each gets cores/jobs threads)")
    parser.add_argument("--train-steps", type=int, default=None, help="override train_steps (tests)")
    parser.add_argument("--test-lines", type=int, default=None, help="translate only the first N test lines")
    parser.add_argument("--work", type=Path, default=Path("build/compare"))
    parser.add_argument("--out", type=Path, default=Path("results/compare"))
    args = parser.parse_args(argv)
    for name in args.configs:
        if not (REPO / CONFIG_DIR / f"{name}.yaml").exists():
            parser.error(f"--configs: no {CONFIG_DIR / (name + '.yaml')}")
    if args.jobs < 1 or (args.train_steps is not None and args.train_steps < 1) or len(set(args.seeds)) != len(
            args.seeds):
        parser.error("--jobs and --train-steps must be >= 1 and --seeds distinct")
    os.chdir(REPO)
    for needed in (TEST_SOURCE, TEST_REFS):
        if not needed.exists():
            raise SystemExit(f"compare.py: {needed} is missing; run `make data` first")
    source = TEST_SOURCE
    if args.test_lines:
        source = args.work / f"test.first{args.test_lines}.zh"
        source.parent.mkdir(parents=True, exist_ok=True)
        with open(TEST_SOURCE, encoding="utf-8", newline="\n") as handle:
            source.write_text("".join(line for _, line in zip(range(args.test_lines), handle)), encoding="utf-8")
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    steps = args.train_steps or _config_values(args.configs[0])["train_steps"]
    runs = [Run(name, seed, args.work / name / f"seed{seed}", steps, args.test_lines)
            for seed in args.seeds for name in args.configs]
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(lambda run: execute_run(run, threads, source, args.train_steps), runs))
    wall = time.perf_counter() - start
    rows = score(runs, args.configs, args.seeds, TEST_REFS, args.test_lines)
    report = {"seeds": args.seeds, "train_steps": steps, "jobs": args.jobs, "threads": threads,
              "test_sentences": args.test_lines or sum(1 for _ in TEST_SOURCE.open(encoding="utf-8")),
              "wall_seconds": wall, "command": shlex.join(["python", "tools/compare.py", *(argv or sys.argv[1:])]),
              "commands": {f"{r.config}/seed{r.seed}": [shlex.join(train_command(r, args.train_steps)),
                                                       shlex.join(translate_command(r, source, args.train_steps))]
                           for r in runs},
              "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compare.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    text = markdown(report)
    (args.out / "compare.md").write_text(text, encoding="utf-8")
    plot(report, args.out / "compare.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
