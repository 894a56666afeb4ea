#!/usr/bin/env python
"""Split a source corpus into clauses once, offline, for training with ``-clause_presplit``.

Usage::

    python tools/clause_split_corpus.py --lang en --input train.bpe.en --output train.bpe.en.clause_rule
        [--levels 6] [--tagger-model FILE] [--subword-model spm.model] [--bucket 256]

How it works and why: docs/tools.md (clause_split_corpus.py).
"""

import argparse
import sys
import time

from clause_split_speed import _opts, read_lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lang", choices=["en", "zh"], required=True, help="-clause_lang")
    p.add_argument("--input", required=True, help="one tokenized (or BPE'd) sentence per line (UTF-8)")
    p.add_argument("--output", required=True, help="where to write the split lines")
    p.add_argument("--levels", type=int, default=6, help="-clause_levels (default 6)")
    p.add_argument("--tagger-model", default="", help="-clause_tagger_model (default: the rules)")
    p.add_argument("--subword-model", default="", help="SentencePiece model applied first (default: none)")
    p.add_argument("--bucket", type=int, default=256, help="sentences per batch_apply call (default 256)")
    args = p.parse_args(argv)
    if args.bucket < 1:
        p.error(f"--bucket must be positive, got {args.bucket}")
    try:
        lines = read_lines(args.input, None, 0)
    except (OSError, UnicodeDecodeError) as exc:
        print(f"clause_split_corpus: error: {args.input}: cannot read: {exc}", file=sys.stderr)
        return 2
    args.column, args.limit = None, 0
    from onmt.transforms import make_transforms

    opts, classes = _opts(args)
    transforms = make_transforms(opts, classes, None)
    examples = [{"src": line.strip().split(" "), "tgt": None, "src_original": None, "tgt_original": None}
                for line in lines]
    if "sentencepiece" in transforms:
        examples = [transforms["sentencepiece"].apply(example) for example in examples]
    split = transforms["clause_split"]
    start = time.perf_counter()
    with open(args.output, "w", encoding="utf-8") as out:
        for first in range(0, len(examples), args.bucket):
            bucket = examples[first:first + args.bucket]
            split.batch_apply([(example, None, "corpus") for example in bucket])
            out.writelines(" ".join(token for token in example["src"] if token) + "\n" for example in bucket)
    seconds = time.perf_counter() - start
    print(f"clause_split_corpus: {len(examples)} lines -> {args.output} in {seconds:.1f} s "
          f"({len(examples) / max(seconds, 1e-9):.0f} sentences/s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
