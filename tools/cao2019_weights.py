#!/usr/bin/env python
"""How many routing weights of cross aggregation are near zero, by iteration count T (cao2019, section 4).

Usage::

    python -m tools.cao2019_weights -model CHECKPOINT [CHECKPOINT ...] -src TEST.src \\
        [--src-subword-model spm.model] [--iterations 1 2 3 4 5] [--thresholds 1e-2 1e-3 1e-6] \\
        [--limit 500] [--out weights.json] [--markdown weights.md]

How it works and why: docs/tools.md (cao2019_weights.py).
"""

import json
import sys
from pathlib import Path

from tools import common, gret_probe
from tools.gret_probe import _read_lines, _subword, encoded_batches, load_model

ROUTINGS = ("vertical", "horizontal")


PROG = "cao2019_weights.py"


def _fail(message):
    gret_probe._fail(message, PROG)


def _layers(model):
    """The cross-aggregation modules of the encoder, keyed by their 1-based layer numbers."""
    from onmt_ext.mechanisms.cao2019 import CrossAggregation

    return {number: layer.self_attn.softmax for number, layer in enumerate(model.encoder.transformer, start=1)
            if isinstance(layer.self_attn.softmax, CrossAggregation)}


def near_zero_shares(model, vocabs, sentences, iterations, thresholds, batch_size=64):
    """Shares of routing weights below each threshold, for the routings the model has: ``{T: {routing: {"all":
    {threshold: share}, "layers": {layer: {threshold: share}}, "weights": n}}}``."""
    from onmt_ext.mechanisms.cao2019 import routing_weights

    layers = _layers(model)
    if not layers:
        _fail("the checkpoint has no cross aggregation (train with -cao2019_vertical and/or -cao2019_horizontal)")
    captured = []
    hooks = [module.register_forward_pre_hook(lambda module, args, number=number: captured.append((number, args[0])))
             for number, module in layers.items()]
    # counts[T][routing][layer] = [weights, below threshold 1, below threshold 2, ...]
    counts = {t: {r: {} for r in ROUTINGS} for t in iterations}
    try:
        for _ in encoded_batches(model, vocabs, sentences, batch_size):
            for number, scores in captured:
                module = layers[number]
                routings = [r for r in ROUTINGS if (module.vertical if r == "vertical" else module.horizontal)]
                for t in iterations:
                    weights = routing_weights(scores.float(), t, module.init, module.factor)
                    for routing in routings:
                        row = counts[t][routing].setdefault(number, [0] * (1 + len(thresholds)))
                        row[0] += weights[routing].numel()
                        for i, threshold in enumerate(thresholds, start=1):
                            row[i] += int((weights[routing] < threshold).sum())
            captured.clear()
    finally:
        for hook in hooks:
            hook.remove()
    result = {}
    for t in iterations:
        result[t] = {}
        for routing, by_layer in counts[t].items():
            if not by_layer:
                continue
            total = [sum(row[i] for row in by_layer.values()) for i in range(1 + len(thresholds))]
            result[t][routing] = {
                "weights": total[0],
                "all": {str(th): total[i] / total[0] for i, th in enumerate(thresholds, start=1)},
                "layers": {str(layer): {str(th): row[i] / row[0] for i, th in enumerate(thresholds, start=1)}
                           for layer, row in sorted(by_layer.items())},
            }
    return result


def markdown(reports, thresholds):
    """One table: a row per checkpoint and T, the share below each threshold for each routing."""
    head = ["checkpoint", "trained T", "T"] + [f"{r} < {th:g}" for r in ROUTINGS for th in thresholds]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 3 + "---:|" * (len(head) - 3)]
    for report in reports:
        for t, by_routing in report["shares"].items():
            cells = [f"`{report['model']}`", str(report["trained_iterations"]),
                     f"**{t}**" if int(t) == report["trained_iterations"] else str(t)]
            for routing in ROUTINGS:
                for th in thresholds:
                    share = by_routing.get(routing, {}).get("all", {}).get(str(th))
                    cells.append("n/a" if share is None else f"{100 * share:.1f}%")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = common.Parser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("-model", required=True, nargs="+", help="checkpoints trained with cross aggregation")
    parser.add_argument("-src", required=True, help="source sentences to encode")
    parser.add_argument("--src-subword-model", help="SentencePiece model applied to the source text")
    parser.add_argument("--iterations", type=common.at_least(1), nargs="+", default=[1, 2, 3, 4, 5],
                        help="values of T")
    parser.add_argument("--thresholds", type=float, nargs="+", default=[1e-2, 1e-3, 1e-6],
                        help="a weight below a threshold counts as near zero")
    parser.add_argument("--limit", type=common.at_least(0), default=500, help="encode only the first N sentences (0: all)")
    parser.add_argument("--out", type=Path, help="write the shares as JSON")
    parser.add_argument("--markdown", type=Path, help="write the table as Markdown")
    args = parser.parse_args(argv)
    if any(not 0 < th < 1 for th in args.thresholds):
        parser.error("--thresholds must lie between 0 and 1")
    sentences = _read_lines(args.src, _subword(args.src_subword_model, prog=PROG), prog=PROG)
    if args.limit:
        sentences = sentences[: args.limit]
    if not sentences:
        _fail(f"-src {args.src}: no sentences")
    iterations = sorted(set(args.iterations))
    reports = []
    for checkpoint in args.model:
        model, vocabs, model_opt = load_model(checkpoint, prog=PROG)
        shares = near_zero_shares(model, vocabs, sentences, iterations, args.thresholds)
        reports.append({"model": str(checkpoint), "trained_iterations": int(model_opt.cao2019_iterations),
                        "sentences": len(sentences), "thresholds": args.thresholds,
                        "shares": {str(t): v for t, v in shares.items()}})
    table = markdown(reports, args.thresholds)
    print(table, end="")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(reports, indent=2) + "\n", encoding="utf-8")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(table, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
