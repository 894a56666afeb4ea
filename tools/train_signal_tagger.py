#!/usr/bin/env python
"""Train the signal-word tagger of "CA with study" (clause attention, sec. 3.1 "Signal words model").

Usage::

    python -m tools.train_signal_tagger --lang en --input /work/shared/data/wmt14-ende-sample/train.en \\
        --output build/clause/signal_tagger.en.pt [--max-sentences 5000] [--epochs 6]
    python -m tools.train_signal_tagger --lang zh --input /work/shared/data/tatoeba-zh-en/cmn.txt --column 1 \\
        --output build/clause/signal_tagger.zh.pt

How it works and why: docs/tools.md (train_signal_tagger.py).
"""

import sys
import time

from tools import common
from tools.clause_split_corpus import output_problem


class UsageError(Exception):
    """Bad input file or option; the message names it."""


def read_sentences(path, column=None, limit=None):
    """Token lists of the non-empty lines (or of field ``column``) of ``path``; also the skipped-line count."""
    try:
        with open(path, encoding="utf-8-sig", newline=None) as handle:
            lines = handle.read().split("\n")
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    sentences, skipped = [], 0
    for line in lines:
        if column is not None:
            fields = line.split("\t")
            if len(fields) <= column:
                skipped += bool(line.strip())
                continue
            line = fields[column]
        line = line.strip()
        if not line:
            continue
        sentences.append(line.split(" "))
        if limit and len(sentences) >= limit:
            break
    return sentences, skipped


def silver_data(splitter, sentences, batch_size=256):
    """``(words, labels)`` per sentence: the transform's tagging and the rules' levels (the silver labels)."""
    from onmt_ext.mechanisms.clause.split import rule_levels

    words_all, labels_all = [], []
    for start in range(0, len(sentences), batch_size):
        for _, words in splitter.analyze_batch(sentences[start:start + batch_size]):
            words_all.append(words)
            labels_all.append(rule_levels(words, splitter.lang))
    return words_all, labels_all


def train(words_all, labels_all, lang, buckets=1 << 18, epochs=6, lr=0.05, batch_size=512, seed=1, info=None):
    """Fit the linear tagger on per-word features and labels; returns a :class:`SignalTagger`."""
    import torch

    from onmt_ext.mechanisms.clause.split import N_CLASSES, SignalTagger, feature_ids, signal_features

    rows, targets = [], []
    for words, labels in zip(words_all, labels_all):
        for i, label in enumerate(labels):
            rows.append(feature_ids(signal_features(words, i, lang), buckets))
            targets.append(label)
    if not targets:
        raise UsageError("no words to train on (the input has no non-empty sentence)")
    # One row of feature ids per word, padded with an extra all-zero bucket that is never updated.
    width = max(len(row) for row in rows)
    ids = torch.tensor([row + [buckets] * (width - len(row)) for row in rows], dtype=torch.long)
    target = torch.tensor(targets, dtype=torch.long)
    torch.manual_seed(seed)
    model = torch.nn.EmbeddingBag(buckets + 1, N_CLASSES, mode="sum", padding_idx=buckets, sparse=True)
    torch.nn.init.zeros_(model.weight)
    optim = torch.optim.SparseAdam(list(model.parameters()), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for batch in torch.randperm(len(target), generator=gen).split(batch_size):
            loss = torch.nn.functional.cross_entropy(model(ids[batch]), target[batch])
            optim.zero_grad()
            loss.backward()
            optim.step()
    info = dict(info or {}, words=len(target), epochs=epochs, lr=lr, buckets=buckets, seed=seed)
    return SignalTagger(model.weight.detach()[:buckets].numpy(), lang, info)


def evaluate(tagger, splitter, words_all, labels_all):
    """Agreement of ``tagger`` with the silver labels: detection P/R/F1, level accuracy, same-marker sentences."""
    from onmt_ext.mechanisms.clause.split import select_splits

    tp = fp = fn = level_ok = same = 0
    for words, gold in zip(words_all, labels_all):
        pred = tagger.levels(words)
        for g, p in zip(gold, pred):
            tp += bool(g and p)
            fp += bool(p and not g)
            fn += bool(g and not p)
            level_ok += bool(g and p == g)
        same += select_splits(words, pred, splitter.levels) == select_splits(words, gold, splitter.levels)
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"sentences": len(words_all), "precision": precision, "recall": recall, "f1": f1,
            "level_accuracy": level_ok / (tp + fn) if tp + fn else 0.0,
            "same_markers": same / len(words_all) if words_all else 0.0}


def build_parser():
    p = common.Parser(prog="train_signal_tagger", description=__doc__.split("\n")[0])
    p.add_argument("--lang", choices=["en", "zh"], required=True, help="language of the sentences")
    p.add_argument("--input", required=True, help="one sentence per line (UTF-8)")
    p.add_argument("--column", type=common.at_least(0), default=None,
                   help="take the N-th tab-separated field of each line (0-based; cmn.txt: 0 English, 1 Chinese)")
    p.add_argument("--output", required=True, help="where to write the tagger (a torch file)")
    p.add_argument("--overwrite", action="store_true", help="replace --output if it exists (default: refuse)")
    p.add_argument("--max-sentences", type=common.at_least(1), default=5000, help="use the first N sentences (default 5000)")
    p.add_argument("--epochs", type=common.at_least(1), default=6, help="passes over the training words (default 6)")
    p.add_argument("--lr", type=float, default=0.05, help="Adam learning rate (default 0.05)")
    p.add_argument("--buckets", type=common.at_least(1), default=1 << 18, help="hashed feature buckets (default 2^18)")
    p.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    p.add_argument("--threads", type=common.at_least(1), default=1, help="torch threads (default 1)")
    p.add_argument("--spacy-model", default=None, help="spaCy pipeline for English (default: the transform's)")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        if not args.lr > 0:
            raise UsageError(f"--lr must be positive, got {args.lr}")
        problem = output_problem(args.input, args.output, args.overwrite)
        if problem:
            raise UsageError(problem)
        import torch

        from onmt_ext.mechanisms.clause.split import DEFAULT_SPACY_MODEL, ClauseSplitError, ClauseSplitter

        torch.set_num_threads(args.threads)
        start = time.perf_counter()
        sentences, skipped = read_sentences(args.input, args.column, args.max_sentences)
        if not sentences:
            raise UsageError(f"{args.input}: no non-empty sentence"
                             + (f" in column {args.column}" if args.column is not None else ""))
        try:
            splitter = ClauseSplitter(args.lang, spacy_model=args.spacy_model or DEFAULT_SPACY_MODEL)
        except ClauseSplitError as exc:
            raise UsageError(str(exc).replace("-clause_spacy_model", "--spacy-model")) from None
        words_all, labels_all = silver_data(splitter, sentences)
        tagged = time.perf_counter()
        held = [i for i in range(len(sentences)) if i % 10 == 9]
        fit = [i for i in range(len(sentences)) if i % 10 != 9]
        tagger = train([words_all[i] for i in fit], [labels_all[i] for i in fit], args.lang, args.buckets,
                       args.epochs, args.lr, seed=args.seed,
                       info={"input": str(args.input), "column": args.column, "sentences": len(fit)})
        trained = time.perf_counter()
        scores = evaluate(tagger, splitter, [words_all[i] for i in held], [labels_all[i] for i in held])
        tagger.info["heldout"] = scores
        try:
            tagger.save(args.output)
        except OSError as exc:
            raise UsageError(f"--output {args.output}: cannot write ({exc.strerror or exc})") from None
    except UsageError as exc:
        print(f"train_signal_tagger: error: {exc}", file=sys.stderr)
        return 2
    counts = [0] * 7
    for labels in labels_all:
        for label in labels:
            counts[label] += 1
    print(f"sentences: {len(sentences)} ({len(fit)} train, {len(held)} held out; {skipped} lines skipped)")
    print("silver labels (level: words): " + ", ".join(f"{k}: {counts[k]}" for k in range(7)))
    print(f"held out vs rules: precision {scores['precision']:.4f}  recall {scores['recall']:.4f}  "
          f"F1 {scores['f1']:.4f}  level accuracy {scores['level_accuracy']:.4f}  "
          f"sentences with the rules' markers {scores['same_markers']:.4f}")
    print(f"time: tagging {tagged - start:.1f} s, training {trained - tagged:.1f} s")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
