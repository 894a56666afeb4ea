#!/usr/bin/env python
"""Split a source corpus into clauses once, offline, for training with ``-clause_presplit``.

Usage::

    python -m tools.clause_split_corpus --lang en --input train.bpe.en --output train.bpe.en.clause_rule
        [--levels 6] [--tagger-model FILE] [--spacy-model NAME] [--subword-model spm.model] [--bucket 256] [--jobs 1]

Beside the output, ``<output>.clause_split.json`` records the options it was split with; training with
``-clause_presplit`` checks them against its own.  How it works and why: docs/tools.md (clause_split_corpus.py).
"""

import json
import multiprocessing
import os
import sys
import time

from tools import common
from tools.clause_split_speed import _opts, read_lines


def output_problem(source, output, overwrite=True):
    """Why ``--output`` ``output`` cannot be written for ``--input`` ``source`` (one line naming the option), or
    None: it is the input file (the same file, by any path), a directory, in a directory that does not exist, or,
    without ``overwrite``, an existing file (``--overwrite`` replaces it)."""
    if os.path.isdir(output):
        return f"--output {output}: is a directory; name the file to write"
    if os.path.exists(output) and os.path.exists(source) and os.path.samefile(source, output):
        return f"--output {output}: is the --input file, which it would replace; choose another path"
    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(parent):
        return f"--output {output}: no directory {parent}; create it first or choose another path"
    if not overwrite and os.path.lexists(output):
        return f"--output {output}: already exists; add --overwrite to replace it, or choose another path"
    return None


def main(argv=None):
    p = common.Parser(description=__doc__.split("\n")[0])
    p.add_argument("--lang", choices=["en", "zh"], required=True, help="-clause_lang")
    p.add_argument("--input", required=True, help="one tokenized (or BPE'd) sentence per line (UTF-8)")
    p.add_argument("--output", required=True, help="where to write the split lines")
    p.add_argument("--levels", type=int, default=6, help="-clause_levels (default 6)")
    p.add_argument("--tagger-model", default="", help="-clause_tagger_model (default: the rules)")
    p.add_argument("--spacy-model", default="", help="-clause_spacy_model (default: the transform's)")
    p.add_argument("--subword-model", default="", help="SentencePiece model applied first (default: none)")
    p.add_argument("--bucket", type=int, default=256, help="sentences per batch_apply call (default 256)")
    p.add_argument("--jobs", type=int, default=1,
                   help="processes splitting buckets at once, forked once the splitter is loaded (default 1)")
    args = p.parse_args(argv)
    for name in ("bucket", "jobs"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be positive, got {getattr(args, name)}")
    problem = output_problem(args.input, args.output)
    if problem:
        print(f"clause_split_corpus: error: {problem}", file=sys.stderr)
        return 2
    try:
        lines = read_lines(args.input, None, 0)
    except (OSError, UnicodeDecodeError) as exc:
        print(f"clause_split_corpus: error: {args.input}: cannot read: {exc}", file=sys.stderr)
        return 2
    args.column, args.limit = None, 0
    from onmt.transforms import make_transforms
    from onmt_ext.mechanisms.clause.split import RECORD_SUFFIX, ClauseSplitOptions, split_record

    opts, classes = _opts(args)
    record = args.output + RECORD_SUFFIX  # how the output was split; an old one goes first, as it may not hold
    if os.path.lexists(record):
        os.remove(record)
    transforms = make_transforms(opts, classes, None)
    global _TRANSFORMS
    _TRANSFORMS = transforms
    buckets = [lines[first:first + args.bucket] for first in range(0, len(lines), args.bucket)]
    start = time.perf_counter()
    try:
        _write(args, buckets)
        with open(record, "w", encoding="utf-8") as out:
            json.dump(split_record(ClauseSplitOptions.from_opts(opts), args.subword_model), out, indent=1)
            out.write("\n")
    except OSError as exc:
        print(f"clause_split_corpus: error: --output {args.output}: cannot write ({exc.strerror or exc})",
              file=sys.stderr)
        return 2
    seconds = time.perf_counter() - start
    print(f"clause_split_corpus: {len(lines)} lines -> {args.output} in {seconds:.1f} s "
          f"({len(lines) / max(seconds, 1e-9):.0f} sentences/s)", file=sys.stderr)
    return 0


def _write(args, buckets):
    """Write the split of ``buckets`` to ``args.output``, in ``args.jobs`` processes."""
    with open(args.output, "w", encoding="utf-8") as out:
        if args.jobs == 1 or len(buckets) < 2:
            for bucket in buckets:
                out.write(_split_bucket(bucket))
        else:  # fork: the workers inherit the loaded splitter (its models and dictionaries) instead of loading it
            with multiprocessing.get_context("fork").Pool(min(args.jobs, len(buckets))) as pool:
                for text in pool.imap(_split_bucket, buckets):
                    out.write(text)


#: the transforms of :func:`main` (SentencePiece if asked for, then clause_split), which forked workers inherit
_TRANSFORMS = {}


def _split_bucket(lines):
    """The split of ``lines`` (one bucket), as the text written for them."""
    examples = [{"src": line.strip().split(" "), "tgt": None, "src_original": None, "tgt_original": None}
                for line in lines]
    if "sentencepiece" in _TRANSFORMS:
        examples = [_TRANSFORMS["sentencepiece"].apply(example) for example in examples]
    _TRANSFORMS["clause_split"].batch_apply([(example, None, "corpus") for example in examples])
    return "".join(" ".join(token for token in example["src"] if token) + "\n" for example in examples)


if __name__ == "__main__":
    sys.exit(main())
