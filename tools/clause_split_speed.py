#!/usr/bin/env python
"""Speed of the ``clause_split`` transform (clause attention, sec. 3.1): sentences per second.

Usage::

    python -m tools.clause_split_speed --lang en --input /work/shared/data/wmt14-ende-sample/test.en
    python -m tools.clause_split_speed --lang zh --input /work/shared/data/tatoeba-zh-en/cmn.txt --column 1 \\
        --limit 5000 [--subword-model build/tatoeba/spm.zh.model] [--tagger-model FILE]

How it works and why: docs/tools.md (clause_split_speed.py).
"""

import sys
import time

from tools import common


def _opts(args):
    import onmt  # noqa: F401  (loads onmt-ext's plug-in when the start-up hook is installed)
    import onmt_ext.mechanisms.clause.split  # noqa: F401  (registers clause_split)
    from onmt_ext.errors import UserError
    from onmt.transforms import AVAILABLE_TRANSFORMS
    from onmt.utils.parse import ArgumentParser

    names = (["sentencepiece"] if args.subword_model else []) + ["clause_split"]
    parser = ArgumentParser(description="clause_split_speed")
    parser.add("-seed", "--seed", type=int, default=-1)
    parser.add("-share_vocab", "--share_vocab", action="store_true")
    parser.add("-transforms", "--transforms", nargs="+", default=names)
    for name in names:
        AVAILABLE_TRANSFORMS[name].add_options(parser)
    argv = ["-clause_lang", args.lang] + ([] if args.levels is None else ["-clause_levels", str(args.levels)])
    if args.tagger_model:
        argv += ["-clause_tagger_model", args.tagger_model]
    if args.spacy_model:
        argv += ["-clause_spacy_model", args.spacy_model]
    if args.subword_model:
        argv += ["-src_subword_model", args.subword_model, "-tgt_subword_model", args.subword_model]
    opts = parser.parse_args(argv)
    try:
        for name in names:
            AVAILABLE_TRANSFORMS[name]._validate_options(opts)
    except UserError as error:  # the exit-code convention of docs/troubleshooting.md: 2 for a usage error
        print(error.message, file=sys.stderr)
        raise SystemExit(error.status) from None
    return opts, {name: AVAILABLE_TRANSFORMS[name] for name in names}


def read_lines(path, column, limit):
    with open(path, encoding="utf-8-sig") as handle:
        lines = handle.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if column is not None:
        lines = [line.split("\t")[column] for line in lines if len(line.split("\t")) > column]
    return lines[:limit] if limit else lines


def main(argv=None):
    p = common.Parser(description=__doc__.split("\n")[0])
    p.add_argument("--lang", choices=["en", "zh"], required=True)
    p.add_argument("--input", required=True, help="one sentence per line (UTF-8)")
    p.add_argument("--column", type=int, default=None, help="N-th tab-separated field (0-based)")
    p.add_argument("--limit", type=int, default=0, help="first N lines only (0: all)")
    p.add_argument("--levels", type=int, help="-clause_levels (default: the transform's)")
    p.add_argument("--tagger-model", default="", help="-clause_tagger_model (default: the rules)")
    p.add_argument("--spacy-model", default="", help="-clause_spacy_model (default: the transform's)")
    p.add_argument("--subword-model", default="", help="SentencePiece model applied first (default: none)")
    p.add_argument("--bucket", type=int, default=256, help="examples per batch_apply call (default 256)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = p.parse_args(argv)
    try:
        lines = read_lines(args.input, args.column, args.limit)
    except (OSError, UnicodeDecodeError) as exc:
        print(f"clause_split_speed: error: {args.input}: cannot read: {exc}", file=sys.stderr)
        return 2
    import torch
    from onmt.transforms import make_transforms

    torch.set_num_threads(args.threads)
    opts, classes = _opts(args)
    t0 = time.perf_counter()
    transforms = make_transforms(opts, classes, None)
    warm = time.perf_counter() - t0
    examples = [{"src": line.strip().split(" "), "tgt": None, "src_original": line.strip().split(" "),
                 "tgt_original": None} for line in lines]
    subword_time = 0.0
    if "sentencepiece" in transforms:
        t0 = time.perf_counter()
        examples = [transforms["sentencepiece"].apply(ex) for ex in examples]
        subword_time = time.perf_counter() - t0
    before = sum(len(ex["src"]) for ex in examples)
    split = transforms["clause_split"]
    t0 = time.perf_counter()
    for start in range(0, len(examples), args.bucket):
        split.batch_apply([(ex, None, "speed") for ex in examples[start:start + args.bucket]])
    elapsed = time.perf_counter() - t0
    from onmt_ext.mechanisms.clause.split import marker_level

    per_level = [0] * 7
    for ex in examples:
        for token in ex["src"]:
            level = marker_level(token)
            if level:
                per_level[level] += 1
    markers = sum(per_level)
    print(f"input: {args.input}" + (f" (column {args.column})" if args.column is not None else "")
          + f", {len(examples)} sentences, {before} tokens" + (" (SentencePiece pieces)" if args.subword_model else ""))
    print(f"transform: {split!r}")
    print(f"warm-up (load taggers): {warm:.2f} s" + (f"; sentencepiece: {subword_time:.2f} s" if subword_time else ""))
    print(f"clause_split: {elapsed:.2f} s = {len(examples) / elapsed:.0f} sentences/s, {before / elapsed:.0f} tokens/s")
    print(f"markers: {markers} ({markers / max(len(examples), 1):.2f} per sentence); by level: "
          + ", ".join(f"{k}: {per_level[k]}" for k in range(1, 7)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
