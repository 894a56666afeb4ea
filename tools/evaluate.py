#!/usr/bin/env python
"""Score a system output with sacreBLEU: BLEU, chrF, paired bootstrap, BLEU by source length.

Usage::

    python -m tools.evaluate --hyp out.txt --refs ref1.txt [ref2.txt ...]
    python -m tools.evaluate --hyp out.txt --ref-tsv test.en.refs.tsv
        [--metrics bleu chrf tok-bleu] [--baseline base_out.txt]
        [--bootstrap-samples 1000] [--seed 12345]
        [--by-length [--src src.txt]] [--json]

How it works and why: docs/tools.md (evaluate.py).
"""

import dataclasses
import json
import sys

# Run from the checkout (``python -m tools.evaluate``), onmt_ext is found beside tools/ without being installed:
# only sacrebleu is needed (tests/integration/test_evaluation_cli.py pins it).
from onmt_ext.integration import evaluation as ev
from onmt_ext.integration.preprocessing import SUBWORD_MARK
from tools import common

PROG = "evaluate.py"


def build_parser():
    """Return the command-line parser."""
    description = "Score a system output with sacreBLEU (BLEU, chrF, paired bootstrap, BLEU by length)."
    parser = common.Parser(prog=PROG, description=description)
    parser.add_argument("--hyp", required=True, metavar="FILE", help="system output, one segment per line")
    refs = parser.add_mutually_exclusive_group(required=True)
    refs.add_argument("--refs", nargs="+", metavar="FILE",
                      help="plain reference files, one reference per line (file k = reference k)")
    refs.add_argument("--ref-tsv", metavar="FILE",
                      help="TSV file source<TAB>ref1<TAB>ref2..., variable number of references per line")
    parser.add_argument("--metrics", nargs="+", choices=ev.METRIC_NAMES, default=["bleu", "chrf"],
                        help="metrics to compute (default: bleu chrf)")
    parser.add_argument("--baseline", metavar="FILE",
                        help="baseline output: adds a paired bootstrap test for every selected metric")
    parser.add_argument("--bootstrap-samples", type=common.at_least(1), default=1000, metavar="N",
                        help="bootstrap resamples for --baseline (default: 1000)")
    parser.add_argument("--seed", type=common.at_least(1), default=12345,
                        help="random seed of the bootstrap resampling (default: 12345)")
    parser.add_argument("--by-length", action="store_true",
                        help="also report BLEU per bucket of source length")
    parser.add_argument("--src", metavar="FILE",
                        help="sources for --by-length (default: column 0 of --ref-tsv)")
    parser.add_argument("--buckets", nargs="+", type=common.at_least(1), default=[10, 20, 30, 40, 50], metavar="N",
                        help="--by-length: inclusive upper bounds of the length buckets, increasing "
                             "(default: 10 20 30 40 50; the last bucket is open)")
    parser.add_argument("--plot", metavar="FILE",
                        help="--by-length with --baseline: draw both systems and the difference per bucket")
    parser.add_argument("--names", nargs=2, default=["baseline", "system"], metavar=("BASELINE", "SYSTEM"),
                        help="names of the two systems in the plot and report (default: baseline system)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--allow-subword-markers", action="store_true",
                        help="score hypotheses that still hold subword marks (▁, @@, ￭) instead of refusing them")
    return parser


def refuse_subword_marks(lines, name):
    """:class:`~onmt_ext.integration.evaluation.EvaluationError` when ``lines`` still hold subword marks
    (:data:`SUBWORD_MARK`): output never detokenized, which scores near 0 BLEU without being wrong in any other
    visible way."""
    marked = [i for i, line in enumerate(lines, 1) if SUBWORD_MARK.search(line)]
    if marked:
        mark = SUBWORD_MARK.search(lines[marked[0] - 1]).group(0)
        raise ev.EvaluationError(
            f"{name}, line {marked[0]}: holds the subword mark {mark!r} ({len(marked)} of {len(lines)} lines do): "
            "the translation was not detokenized; translate with the model's -transforms (or without "
            "-transforms: onmt_translate then applies the model's own), or pass --allow-subword-markers")


def evaluate(args):
    """Read the files named in ``args``, compute everything asked for and return the report dict."""
    hyps, hyp_name = ev.read_hypotheses(args.hyp), f"hypothesis file {args.hyp}"
    baseline = ev.read_hypotheses(args.baseline, "baseline file") if args.baseline else None
    base_name = f"baseline file {args.baseline}"
    if not args.allow_subword_markers:
        refuse_subword_marks(hyps, hyp_name)
        if args.baseline:
            refuse_subword_marks(baseline, base_name)
    if args.ref_tsv:
        refs, ref_name = ev.read_reference_tsv(args.ref_tsv), f"reference TSV {args.ref_tsv}"
        ref_report = {"tsv": args.ref_tsv}
    else:
        refs, ref_name = ev.read_references(args.refs), f"reference file(s) {', '.join(args.refs)}"
        ref_report = {"files": args.refs}
    ev.validate_inputs(hyps, refs, hyp_name, ref_name)
    ref_report["refs_per_segment"] = ev.references_per_segment(refs)

    metrics = list(dict.fromkeys(args.metrics))
    report = {
        "hypotheses": {"file": args.hyp, "segments": len(hyps)},
        "references": ref_report,
        "scores": {m: dataclasses.asdict(ev.compute_metric(m, hyps, refs)) for m in metrics},
    }

    if args.baseline:
        ev.validate_inputs(baseline, refs, base_name, ref_name)
        report["bootstrap"] = {
            "baseline": args.baseline, "n_samples": args.bootstrap_samples, "seed": args.seed,
            "results": {m: dataclasses.asdict(ev.paired_bootstrap(baseline, hyps, refs, metric=m,
                                                                  n_samples=args.bootstrap_samples, seed=args.seed))
                        for m in metrics},
        }

    if args.by_length:
        if args.src:
            sources, src_name = ev.read_hypotheses(args.src, "source file"), f"source file {args.src}"
        else:
            sources, src_name = ev.read_sources_from_tsv(args.ref_tsv), f"column 0 of {args.ref_tsv}"
        ev.check_same_length(sources, hyps, src_name, hyp_name)
        metric = "bleu-zh" if "bleu-zh" in metrics else "bleu"
        report["by_length"] = {
            "sources": src_name, "metric": metric,
            "buckets": [dataclasses.asdict(b) for b in ev.bleu_by_length(hyps, refs, sources, args.buckets, metric)],
        }
        if args.baseline:
            comparisons = ev.compare_by_length(baseline, hyps, refs, sources, args.buckets, metric,
                                               args.bootstrap_samples, args.seed)
            report["by_length"]["versus_baseline"] = [dataclasses.asdict(c) for c in comparisons]
            report["by_length"]["names"] = list(args.names)
            if args.plot:
                ev.plot_by_length(comparisons, args.plot, f"{metric} by source length", tuple(args.names))
                report["by_length"]["plot"] = args.plot
    return report


def format_report(report):
    """Render the report dict of :func:`evaluate` as human-readable text."""
    refs = report["references"]
    low, high = refs["refs_per_segment"]["min"], refs["refs_per_segment"]["max"]
    count = str(low) if low == high else f"{low}-{high}"
    ref_files = refs["tsv"] if "tsv" in refs else " ".join(refs["files"])
    lines = [f"hypotheses: {report['hypotheses']['file']} ({report['hypotheses']['segments']} segments)",
             f"references: {ref_files} ({count} per segment)", ""]
    lines += [f"{key:<9}{result['formatted']}" for key, result in report["scores"].items()]

    if "bootstrap" in report:
        boot = report["bootstrap"]
        lines += ["", f"paired bootstrap vs baseline {boot['baseline']} "
                      f"({boot['n_samples']} resamples, seed {boot['seed']}; † p < 0.05, ‡ p < 0.01)",
                  f"  {'metric':<8} {'baseline':>9} {'system':>9} {'(mean ± 95% CI)':>19} {'delta':>8} {'p-value':>8}"]
        for r in boot["results"].values():
            interval = f"({r['system_mean']:.2f} ± {r['system_ci']:.2f})"
            lines.append(f"  {r['metric']:<8} {r['baseline_score']:>9.2f} {r['system_score']:>9.2f} "
                         f"{interval:>19} {r['delta']:>+8.2f} {r['p_value']:>8.4f} {r['marker']}".rstrip())
        lines += [f"  {r['metric']} signature: {r['name']}|{r['signature']}" for r in boot["results"].values()]

    if "by_length" in report:
        by_length = report["by_length"]
        lines += ["", f"BLEU by source length (whitespace tokens of {by_length['sources']})",
                  f"  {'length':<8} {'segments':>8} {'BLEU':>8}"]
        for b in by_length["buckets"]:
            score = "-" if b["score"] is None else f"{b['score']:.2f}"
            lines.append(f"  {b['label']:<8} {b['count']:>8} {score:>8}")
        signatures = {b["signature"] for b in by_length["buckets"] if b["signature"]}
        lines += [f"  signature: BLEU|{s}" for s in sorted(signatures)]
        if "versus_baseline" in by_length:
            base, system = by_length["names"]
            lines += ["", f"{by_length['metric']} by source length, {system} vs {base} (paired bootstrap per "
                          "bucket; † p < 0.05, ‡ p < 0.01)",
                      f"  {'length':<8} {'segments':>8} {base[:10]:>10} {system[:10]:>10} {'delta':>8} {'p-value':>8}"]
            for c in by_length["versus_baseline"]:
                test = c["bootstrap"]
                if test is None:
                    lines.append(f"  {c['label']:<8} {0:>8} {'-':>10} {'-':>10} {'-':>8} {'-':>8}")
                    continue
                lines.append(f"  {c['label']:<8} {c['count']:>8} {test['baseline_score']:>10.2f} "
                             f"{test['system_score']:>10.2f} {test['delta']:>+8.2f} {test['p_value']:>8.4f} "
                             f"{test['marker']}".rstrip())
            if "plot" in by_length:
                lines.append(f"  plot: {by_length['plot']}")
    return "\n".join(lines)


def main(argv=None):
    """Run the command line; return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.src and not args.by_length:
        parser.error("--src is only used with --by-length")
    if args.plot and not (args.by_length and args.baseline):
        parser.error("--plot draws the by-length comparison: it needs --by-length and --baseline")
    if args.by_length and not (args.src or args.ref_tsv):
        parser.error("--by-length needs the sources: give --src (or use --ref-tsv, whose column 0 is the source)")
    try:
        report = evaluate(args)
    except ev.EvaluationError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, ensure_ascii=False, indent=2) if args.json else format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
