#!/usr/bin/env python
"""Where beam-search translation time goes, for checkpoints translated in turn in one process.

Usage::

    python tools/translate_profile.py BASELINE.pt OTHER.pt [...] --src SOURCE [--pairs 8]
        [--output-lengths 5 10 20] [--beam-size 4] [--batch-size 32] [--threads 1] [--count-flops]
        [--json OUT.json] [-- further onmt_translate options, e.g. -transforms sentencepiece ...]

How it works and why: docs/tools.md (translate_profile.py).
"""

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import common
from bench import median_interval

#: The timed parts of a translation: (report name, attribute of the model, method of that attribute).
PARTS = (("encoder", "encoder", "forward"), ("decoder", "decoder", "forward"),
         ("generator", "generator", "forward"), ("map_state", "decoder", "map_state"))
#: The parts that are modules, whose floating-point operations ``--count-flops`` reports: (name, attribute).
COUNTED = tuple((name, attribute) for name, attribute, method in PARTS if method == "forward")
#: The seconds reported per run: the whole run, each timed part, and the rest.
COLUMNS = ("total", *(name for name, _, _ in PARTS), "other")


def _timed(owner, method, totals, name):
    inner = getattr(owner, method)

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            totals[name] += time.perf_counter() - start
            totals[f"{name}_calls"] += 1

    setattr(owner, method, timed)  # an instance attribute: other models are untouched


def build_engine(model, source, options, batch_size, beam_size, totals):
    """OpenNMT-py's inference engine for ``model``, with its parts timed into ``totals``."""
    import onmt  # noqa: F401  (onmt-ext's start-up hook)

    engine = common.inference_engine(["-model", model, "-src", source, "-output", "/dev/null", "-batch_size",
                                      batch_size, "-batch_type", "sents", "-beam_size", beam_size, "-gpu", "-1",
                                      *options])
    for name, attribute, method in PARTS:
        _timed(getattr(engine.translator.model, attribute), method, totals, name)
    return engine


def translate_once(engine, steps, totals):
    """One translation of the source, every output forced to ``steps`` decoding steps; returns its parts."""
    translator = engine.translator
    translator.min_length = translator.max_length = steps
    translator.max_length_ratio = 0
    totals.clear()
    start = time.perf_counter()
    engine.infer_file()
    run = {"total": time.perf_counter() - start, **{name: totals[name] for name, _, _ in PARTS}}
    run["other"] = run["total"] - sum(run[name] for name, _, _ in PARTS)
    run["calls"] = {name: int(totals[f"{name}_calls"]) for name, _, _ in PARTS}
    return run


def count_flops(engine, steps, totals):
    """``{"total", "encoder", "decoder", "generator"}`` floating-point operations of one translation forced to
    ``steps`` steps, by ``FlopCounterMode`` (the engine calls each part directly: a top-level module of the count)."""
    from torch.utils.flop_counter import FlopCounterMode

    model = engine.translator.model
    with FlopCounterMode(display=False) as counter:
        translate_once(engine, steps, totals)
    counts = counter.get_flop_counts()
    flops = {"total": sum(counts.get("Global", {}).values())}
    for name, attribute in COUNTED:
        flops[name] = sum(counts.get(type(getattr(model, attribute)).__name__, {}).values())
    return flops


def flops_report(counts, models):
    """A Markdown table of :func:`count_flops`' results, in GFLOP, with ``models[0]``'s total over each one's."""
    parts = [name for name, _ in COUNTED]
    lines = ["| steps | checkpoint | total GFLOP | " + " | ".join(f"{name} GFLOP" for name in parts)
             + " | ratio of totals |", "|---:|---|" + "---:|" * (len(parts) + 2)]
    for entry in counts:
        first = next(other for other in counts if other["steps"] == entry["steps"] and other["model"] == models[0])
        cells = " | ".join(f"{entry[name] / 1e9:.3f}" for name in ("total", *parts))
        lines.append(f"| {entry['steps']} | {entry['model']} | {cells} | {first['total'] / entry['total']:.3f} |")
    return "\n".join(lines) + "\n"


def summarise(runs, models):
    """Medians per (steps, model) and paired ratios to ``models[0]``; ``runs`` as :func:`main` records them."""
    rows = []
    for steps in sorted({run["steps"] for run in runs}):
        these = [run for run in runs if run["steps"] == steps]
        first = {run["pair"]: run["total"] for run in these if run["model"] == models[0]}
        for model in models:
            own = [run for run in these if run["model"] == model]
            ratios = [first[run["pair"]] / run["total"] for run in own]
            row = {"steps": steps, "model": model,
                   **{column: statistics.median(run[column] for run in own) for column in COLUMNS},
                   "ratio": statistics.median(ratios), "interval": median_interval(ratios)}
            rows.append(row)
    return rows


def report(rows):
    """A Markdown table of :func:`summarise`'s rows."""
    lines = ["| steps | checkpoint | " + " | ".join(f"{column} s" for column in COLUMNS) + " | speed ratio |",
             "|---:|---|" + "---:|" * (len(COLUMNS) + 1)]
    for row in rows:
        interval = f" [{row['interval'][0]:.3f}, {row['interval'][1]:.3f}]" if row["interval"] else ""
        parts = " | ".join(f"{row[column]:.3f}" for column in COLUMNS)
        lines.append(f"| {row['steps']} | {row['model']} | {parts} | {row['ratio']:.3f}{interval} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="+", type=Path, help="checkpoints; ratios are to the first")
    parser.add_argument("--src", type=Path, required=True, help="source file, in the form onmt_translate reads")
    parser.add_argument("--pairs", type=int, default=8, help="alternations per output length")
    parser.add_argument("--output-lengths", type=common.at_least(1), nargs="+", default=[20],
                        help="decoding steps per output")
    parser.add_argument("--beam-size", type=common.at_least(1), default=4)
    parser.add_argument("--batch-size", type=common.at_least(1), default=32, help="sentences per batch")
    parser.add_argument("--threads", type=common.at_least(1), default=1, help="torch CPU threads")
    parser.add_argument("--count-flops", action="store_true",
                        help="also count each checkpoint's floating-point operations (matrix products) per length")
    parser.add_argument("--json", type=Path, help="write every run's parts here")
    args = parser.parse_args(argv)
    for path in (*args.models, args.src):
        if not path.is_file():
            parser.error(f"no such file: {path}")
    if len(args.models) < 2:
        parser.error("give at least two checkpoints (the first is the reference of the ratios)")
    if args.pairs < (0 if args.count_flops else 1):
        parser.error("--pairs must be >= 1 (or 0 with --count-flops: counting only)")
    import torch

    torch.set_num_threads(args.threads)
    names = [str(model) for model in args.models]
    totals = defaultdict(float)
    engines = [build_engine(model, args.src, extra, args.batch_size, args.beam_size, totals)
               for model in args.models]
    runs = []
    for steps in args.output_lengths:
        for pair in range(args.pairs):
            for index in (range(len(engines)) if pair % 2 == 0 else reversed(range(len(engines)))):
                runs.append({"steps": steps, "pair": pair, "model": names[index],
                             **translate_once(engines[index], steps, totals)})
    counts = [{"steps": steps, "model": names[index], **count_flops(engines[index], steps, totals)}
              for steps in args.output_lengths for index in range(len(engines))] if args.count_flops else []
    text = "\n".join(([report(summarise(runs, names))] if runs else []) + ([flops_report(counts, names)] if counts else []))
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "options": extra,
                                         "runs": runs, "flops": counts}, indent=1), encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
