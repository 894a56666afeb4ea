#!/usr/bin/env python
"""Prepare the shipped Tatoeba Chinese-English sample for OpenNMT-py.

Usage::

    python -m tools.prepare_tatoeba --data-dir data/tatoeba-zh-en --out-dir OUT \\
        [--valid-size 1000] [--zh-vocab 8000] [--en-vocab 8000] [--spm-type bpe]

How it works and why: docs/tools.md (prepare_tatoeba.py).
"""

import collections
import hashlib
import io
import json
import logging
import sys
import time
from pathlib import Path

from tools import common

LOG = logging.getLogger("prepare_tatoeba")

CMN_FILE = "cmn.txt"
MULTIREF_FILE = "zh2en.multiref.tsv"
SPM_TYPES = ("bpe", "unigram", "char", "word")
SPM_SEED = 1234
SPM_THREADS = 2
ZH_CHARACTER_COVERAGE = 0.9995
EN_CHARACTER_COVERAGE = 1.0

Pair = collections.namedtuple("Pair", "en zh attribution lineno")
Pair.__doc__ = "One sentence pair of cmn.txt (fields stripped; lineno is 1-based)."


class DataError(Exception):
    """Invalid input data or options; the message is meant for the user as is."""


# --------------------------------------------------------------------- reading
def read_lines(path):
    """``(lineno, text)`` of each line of a UTF-8 file, BOM and CR removed (by
    :func:`onmt_ext.integration.evaluation.read_hypotheses`); :class:`DataError` names a bad line."""
    from onmt_ext.integration.evaluation import EvaluationError, read_hypotheses

    try:
        return list(enumerate(read_hypotheses(path, "file"), start=1))
    except EvaluationError as exc:
        raise DataError(str(exc)) from None


def read_pairs(path):
    """``(pairs, counts)`` of ``cmn.txt`` (``English<TAB>Chinese[<TAB>attribution]``): :class:`Pair` in file order,
    and ``lines``, ``pairs``, ``skipped_empty`` and ``skipped_malformed`` (fewer than two columns or an empty side;
    logged)."""
    lines = read_lines(path)
    pairs, empty, malformed = [], 0, []
    for lineno, text in lines:
        if not text.strip():
            empty += 1
            continue
        en, zh, attribution = [col.strip() for col in text.split("\t") + ["", ""]][:3]
        if en and zh:
            pairs.append(Pair(en, zh, attribution, lineno))
        else:  # fewer than two columns leaves zh empty
            malformed.append(lineno)
    if empty:
        LOG.info("%s: skipped %d empty line(s)", path, empty)
    if malformed:
        LOG.warning("%s: skipped %d malformed line(s) (fewer than 2 columns or an empty side), e.g. line(s) %s",
                    path, len(malformed), ", ".join(map(str, malformed[:5])))
    counts = {"lines": len(lines), "pairs": len(pairs), "skipped_empty": empty, "skipped_malformed": len(malformed)}
    return pairs, counts


def read_multiref(path):
    """``[(chinese, [references])]`` of the multi-reference test set (``Chinese<TAB>ref1<TAB>ref2...``); a line
    without a reference or Chinese, or a repeated sentence, is a :class:`DataError` (the test set stays as given)."""
    items, seen = [], {}
    for lineno, text in read_lines(path):
        if not text.strip():
            continue
        cols = [c.strip() for c in text.split("\t")]
        zh, refs = cols[0], [c for c in cols[1:] if c]
        if not zh or not refs:
            raise DataError(f"{path}: line {lineno}: expected Chinese<TAB>ref1[<TAB>ref2...], "
                            f"got {len(cols)} column(s) with {len(refs)} non-empty reference(s)")
        if zh in seen:
            raise DataError(f"{path}: line {lineno}: Chinese sentence already listed on line {seen[zh]}")
        seen[zh] = lineno
        items.append((zh, refs))
    if not items:
        raise DataError(f"{path}: no test sentences")
    return items


# ------------------------------------------------------------------- splitting
def pair_hash(pair):
    """Stable MD5 hex digest of a pair's text (English and Chinese), independent of the process."""
    return hashlib.md5(f"{pair.en}\t{pair.zh}".encode("utf-8")).hexdigest()


def split_pairs(pairs, test_zh, valid_size):
    """``(train, valid, counts)``: the pairs whose Chinese is not in ``test_zh``, the ``valid_size`` distinct pairs
    of smallest :func:`pair_hash` as valid (further copies dropped from train), both in input order."""
    test_set = {zh.strip() for zh in test_zh}
    remaining = [p for p in pairs if p.zh.strip() not in test_set]
    removed = len(pairs) - len(remaining)

    keys = {}
    for p in remaining:
        keys.setdefault((p.en, p.zh), pair_hash(p))
    if valid_size >= len(keys):
        raise DataError(f"--valid-size {valid_size} leaves no training data "
                        f"({len(keys)} distinct pairs remain after removing the test sentences)")
    valid_keys = set(sorted(keys, key=lambda k: (keys[k], k))[:valid_size])

    train = [p for p in remaining if (p.en, p.zh) not in valid_keys]
    first = {}  # valid key -> its first pair, in input order
    for p in remaining:
        if (p.en, p.zh) in valid_keys:
            first.setdefault((p.en, p.zh), p)
    valid = list(first.values())
    counts = {"removed_test_pairs": removed, "remaining_pairs": len(remaining), "train": len(train),
              "valid": len(valid), "dropped_valid_copies": len(remaining) - len(train) - len(valid)}
    return train, valid, counts


# ---------------------------------------------------------------- segmentation
def segment_zh(sentences):
    """Chinese sentences as words joined by spaces, as the ``jieba`` transform cuts them
    (:func:`onmt_ext.integration.zh_segment.segment`); repeated sentences are segmented once."""
    from onmt_ext.integration.zh_segment import segment

    segmented = {s: " ".join(segment(s)) for s in dict.fromkeys(sentences)}
    return [segmented[s] for s in sentences]


# ----------------------------------------------------------------- sentencepiece
def encode_file(model, source, target, limit=None, spread=False):
    """Write the lines of ``source`` (the first ``limit``; with ``spread``, ``limit`` lines evenly spaced over the
    file, which keeps a length-sorted corpus's lengths) to ``target`` as the pieces of the SentencePiece
    ``model`` joined by spaces (read without a subword transform); returns ``target``."""
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=str(model))
    lines = Path(source).read_text(encoding="utf-8").splitlines()
    if spread and limit and limit < len(lines):
        lines = [lines[index * len(lines) // limit] for index in range(limit)]
    lines = lines[:limit]
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    Path(target).write_text("".join(" ".join(processor.encode(line, out_type=str)) + "\n" for line in lines),
                            encoding="utf-8")
    return Path(target)


def train_spm(sentences, model_prefix, vocab_size, model_type="bpe", character_coverage=1.0):
    """Train SentencePiece on every sentence (fixed seed and threads, written from memory so that the same
    sentences give identical files) into ``PREFIX.model`` and ``PREFIX.vocab`` (SentencePiece's format:
    ``piece<TAB>score`` as ``%g`` per line); returns the two paths."""
    import sentencepiece as spm

    spm.set_random_generator_seed(SPM_SEED)
    writer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=writer, vocab_size=vocab_size,
                                       model_type=model_type, character_coverage=character_coverage,
                                       input_sentence_size=0, shuffle_input_sentence=False, num_threads=SPM_THREADS,
                                       minloglevel=2)
    except RuntimeError as exc:
        raise DataError(f"SentencePiece training of {Path(model_prefix).name} failed: {exc}") from None
    model_path, vocab_path = Path(f"{model_prefix}.model"), Path(f"{model_prefix}.vocab")
    _write_bytes(model_path, writer.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=writer.getvalue())
    vocab = "".join(f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n" for i in range(sp.get_piece_size()))
    _write_bytes(vocab_path, vocab.encode("utf-8"))
    return model_path, vocab_path


# ----------------------------------------------------------------------- output
def _write_bytes(path, data):
    """Write ``data`` to ``path`` through a temporary file beside it, renamed when complete."""
    tmp = Path(path).with_name(f".{Path(path).name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def _write_lines(path, lines):
    """Write one line per item (UTF-8, LF line ends); an item containing a line break is an error."""
    broken = next((line for line in lines if "\n" in line or "\r" in line), None)
    if broken is not None:
        raise DataError(f"internal error: line break inside a line for {path}: {broken!r}")
    _write_bytes(path, "".join(f"{line}\n" for line in lines).encode("utf-8"))


def _md5_file(path):
    return hashlib.md5(Path(path).read_bytes()).hexdigest()


# ------------------------------------------------------------------------- main
def build_parser():
    """The command-line parser."""
    p = common.Parser(prog="prepare_tatoeba.py",
                      description="Split, segment and build SentencePiece models for the Tatoeba zh-en sample.")
    p.add_argument("--data-dir", required=True, type=Path,
                   help=f"directory holding {CMN_FILE} and {MULTIREF_FILE}")
    p.add_argument("--out-dir", required=True, type=Path, help="output directory (created if missing)")
    p.add_argument("--valid-size", type=common.at_least(0), default=1000, help="validation pairs (default: 1000)")
    p.add_argument("--zh-vocab", type=common.at_least(1), default=8000,
                   help="Chinese SentencePiece vocabulary size (default: 8000)")
    p.add_argument("--en-vocab", type=common.at_least(1), default=8000,
                   help="English SentencePiece vocabulary size (default: 8000)")
    p.add_argument("--spm-type", choices=SPM_TYPES, default="bpe", help="SentencePiece model type (default: bpe)")
    return p


def _setup_logging():
    """Progress messages go to stdout as plain lines (once, even if main() runs several times)."""
    LOG.setLevel(logging.INFO)
    if not LOG.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("[prepare_tatoeba] %(message)s"))
        LOG.addHandler(handler)


def prepare(data_dir, out_dir, valid_size, zh_vocab, en_vocab, spm_type):
    """Run the whole preparation (``data_dir``, ``out_dir``: Paths); returns the statistics in ``stats.json``."""
    t0 = time.monotonic()
    cmn_path, ref_path = data_dir / CMN_FILE, data_dir / MULTIREF_FILE

    LOG.info("reading %s", cmn_path)
    pairs, read_counts = read_pairs(cmn_path)
    LOG.info("  %d pairs from %d lines (%d empty, %d malformed skipped)", read_counts["pairs"],
             read_counts["lines"], read_counts["skipped_empty"], read_counts["skipped_malformed"])
    LOG.info("reading %s", ref_path)
    test = read_multiref(ref_path)
    n_refs = [len(refs) for _, refs in test]
    LOG.info("  %d test sentences, %d references (%d to %d per sentence)",
             len(test), sum(n_refs), min(n_refs), max(n_refs))
    test_set = {zh for zh, _ in test}
    unmatched = len(test_set - {p.zh for p in pairs})
    if unmatched:
        LOG.warning("  %d test sentence(s) do not occur in %s", unmatched, CMN_FILE)

    train, valid, split_counts = split_pairs(pairs, test_set, valid_size)
    LOG.info("removed %d pairs whose Chinese is a test sentence, %d remain",
             split_counts["removed_test_pairs"], split_counts["remaining_pairs"])
    LOG.info("split: %d train, %d valid (%d further copies of valid pairs dropped from train)",
             split_counts["train"], split_counts["valid"], split_counts["dropped_valid_copies"])
    # Invariant, cheap to check: no test source in train or valid.
    leaked = [p.lineno for p in train + valid if p.zh.strip() in test_set]
    if leaked:
        raise RuntimeError(f"test sentences leaked into train/valid (lines {leaked[:5]})")

    LOG.info("segmenting Chinese with jieba")
    t = time.monotonic()
    train_zh = segment_zh([p.zh for p in train])
    valid_zh = segment_zh([p.zh for p in valid])
    test_zh = segment_zh([zh for zh, _ in test])
    LOG.info("  done in %.1f s", time.monotonic() - t)

    out_dir.mkdir(parents=True, exist_ok=True)
    LOG.info("writing the splits to %s", out_dir)
    _write_lines(out_dir / "train.zh", train_zh)
    _write_lines(out_dir / "train.en", [p.en for p in train])
    _write_lines(out_dir / "valid.zh", valid_zh)
    _write_lines(out_dir / "valid.en", [p.en for p in valid])
    _write_lines(out_dir / "test.zh", test_zh)
    _write_lines(out_dir / "test.en.refs.tsv", ["\t".join([zh] + refs) for zh, refs in test])
    _write_lines(out_dir / "test.en.ref0", [refs[0] for _, refs in test])

    spm_stats = {}
    for lang, sents, size, coverage in (("zh", train_zh, zh_vocab, ZH_CHARACTER_COVERAGE),
                                        ("en", [p.en for p in train], en_vocab, EN_CHARACTER_COVERAGE)):
        LOG.info("training spm.%s (%s, vocabulary %d, character coverage %g) on the train split",
                 lang, spm_type, size, coverage)
        t = time.monotonic()
        try:
            train_spm(sents, out_dir / f"spm.{lang}", size, spm_type, coverage)
        except DataError as exc:
            raise DataError(f"{exc} (adjust --{lang}-vocab or --spm-type)") from None
        LOG.info("  done in %.1f s", time.monotonic() - t)
        spm_stats[lang] = {"model_type": spm_type, "vocab_size": size, "character_coverage": coverage,
                           "seed": SPM_SEED, "num_threads": SPM_THREADS}

    stats = {
        "inputs": {CMN_FILE: {"md5": _md5_file(cmn_path), **read_counts},
                   MULTIREF_FILE: {"md5": _md5_file(ref_path), "sentences": len(test)}},
        **{key: split_counts[key] for key in ("removed_test_pairs", "remaining_pairs", "dropped_valid_copies")},
        "splits": {"train": len(train), "valid": len(valid), "test": len(test)},
        "test_references": {"total": sum(n_refs),
                            "per_sentence_histogram": {str(k): n_refs.count(k) for k in sorted(set(n_refs))}},
        "valid_size_requested": valid_size,
        "segmentation": {"zh": "jieba.lcut HMM=True, space-joined", "en": "raw text"},
        "sentencepiece": spm_stats,
    }
    _write_bytes(out_dir / "stats.json", (json.dumps(stats, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))

    LOG.info("summary: %d pairs read, %d skipped lines, %d removed (test Chinese), "
             "train %d / valid %d / test %d (%d refs); outputs in %s; %.1f s",
             read_counts["pairs"], read_counts["skipped_empty"] + read_counts["skipped_malformed"],
             split_counts["removed_test_pairs"], len(train), len(valid), len(test), sum(n_refs),
             out_dir, time.monotonic() - t0)
    return stats


def main(argv=None):
    """Command-line entry point; returns the exit status (0 ok, 2 invalid input)."""
    args = build_parser().parse_args(argv)
    _setup_logging()
    try:
        prepare(**vars(args))
    except (DataError, OSError) as exc:  # OSError: e.g. the output directory is not writable
        print(f"prepare_tatoeba.py: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, DataError) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
