#!/usr/bin/env python
"""Prepare the shipped WMT14 English-German sample for the clause-attention length demo.

Usage::

    python -m tools.prepare_wmt14_sample --data-dir data/wmt14-ende-sample --out-dir build/wmt14_sample \\
        [--vocab 4000] [--test-size 1000]

Writes into ``--out-dir``: ``train.{en,de}``, ``valid.{en,de}`` (copies, one
empty-source training pair dropped), ``test.{en,de}`` (the first
``--test-size`` test pairs) and ``spm.{en,de}.model/.vocab``, SentencePiece
BPE models trained on the (Moses-tokenized) training side of each language
by :func:`prepare_tatoeba.train_spm` (deterministic files).  Subwords are
applied on the fly by OpenNMT-py's ``sentencepiece`` transform, which also
turns output pieces back into tokenized text.
"""

import sys
from pathlib import Path

from tools import common
from tools.prepare_tatoeba import DataError, read_lines, train_spm

LANGS = ("en", "de")


def prepare(data_dir, out_dir, vocab, test_size):
    """Write the files listed in the module docstring; returns ``{split: pairs}``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split in ("train", "valid", "test"):
        sides = [[text for _, text in read_lines(data_dir / f"{split}.{lang}")] for lang in LANGS]
        if len(sides[0]) != len(sides[1]):
            raise DataError(f"{data_dir}/{split}.en and .de have {len(sides[0])} and {len(sides[1])} lines")
        pairs = [(s, t) for s, t in zip(*sides) if s.strip() and t.strip()]
        if split == "test":
            pairs = pairs[:test_size]
        counts[split] = len(pairs)
        for lang, lines in zip(LANGS, zip(*pairs)):
            (out_dir / f"{split}.{lang}").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    for lang in LANGS:
        sentences = [text for _, text in read_lines(out_dir / f"train.{lang}")]
        train_spm(sentences, out_dir / f"spm.{lang}", vocab)
    return counts


def main(argv=None):
    p = common.Parser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--out-dir", type=Path, required=True)
    p.add_argument("--vocab", type=int, default=4000, help="SentencePiece pieces per language (default 4000)")
    p.add_argument("--test-size", type=int, default=1000, help="test pairs kept, from the start (default 1000)")
    args = p.parse_args(argv)
    if args.vocab < 100 or args.test_size < 1:
        p.error("--vocab must be >= 100 and --test-size >= 1")
    try:
        counts = prepare(args.data_dir, args.out_dir, args.vocab, args.test_size)
    except DataError as exc:
        print(f"prepare_wmt14_sample: error: {exc}", file=sys.stderr)
        return 2
    print(f"prepare_wmt14_sample: {counts} pairs -> {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
