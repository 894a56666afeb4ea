#!/usr/bin/env python
"""Summary of ``make demo``: scores, time spent and where the files are.

Usage::

    python -m tools.demo_report --demo-dir build/demo --data-dir build/tatoeba

Scores the demo's translations of the Tatoeba test set against all their
references (multi-reference BLEU, 13a, case-sensitive; chrF) through
:mod:`onmt_ext.integration.evaluation` (sacreBLEU), and reads the training and
translation times that the Makefile recorded (``*.start``/``*.end``).
"""

import sys
from pathlib import Path

from tools import common
from onmt_ext.integration import evaluation


def _seconds(directory, stage):
    """Wall-clock seconds of a Makefile stage, or None if not recorded."""
    try:
        start = int((directory / f"{stage}.start").read_text())
        end = int((directory / f"{stage}.end").read_text())
    except (OSError, ValueError):
        return None
    return end - start


def _minutes(seconds):
    return "not recorded" if seconds is None else f"{seconds // 60} min {seconds % 60:02d} s"


def main(argv=None):
    parser = common.Parser(description=__doc__.split("\n")[0])
    parser.add_argument("--demo-dir", type=Path, required=True)
    parser.add_argument("--data-dir", type=Path, required=True)
    args = parser.parse_args(argv)

    hyp_path = args.demo_dir / "test.hyp.en"
    refs_path = args.data_dir / "test.en.refs.tsv"
    try:
        hyps = evaluation.read_hypotheses(hyp_path)
        refs = evaluation.read_reference_tsv(refs_path)
        evaluation.validate_inputs(hyps, refs, str(hyp_path), str(refs_path))
        bleu = evaluation.nist_bleu(hyps, refs)
        chrf = evaluation.chrf(hyps, refs)
    except evaluation.EvaluationError as error:
        sys.exit(f"demo_report.py: error: {error}")

    n_refs = sum(1 for stream in refs for ref in stream if ref is not None)
    checkpoints = sorted(args.demo_dir.glob("model_step_*.pt"))
    lines = [
        "",
        "================ onmt-ext demo: Tatoeba Chinese -> English ================",
        f"test set        {len(hyps)} sentences, {n_refs} references (multi-reference)",
        f"BLEU            {bleu.score:.2f}   ({bleu.formatted})",
        f"chrF            {chrf.score:.2f}   ({chrf.formatted})",
        f"training        {_minutes(_seconds(args.demo_dir, 'train'))}",
        f"translation     {_minutes(_seconds(args.demo_dir, 'translate'))} (beam 5)",
        f"model           {checkpoints[-1] if checkpoints else 'missing'}",
        f"translations    {hyp_path}",
        f"references      {refs_path}",
        f"logs            {args.demo_dir / 'train.log'}, {args.demo_dir / 'translate.log'}",
        "==========================================================================",
    ]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
