#!/usr/bin/env python
"""Bag-of-words probe of a sentence representation (the probing experiment of GRET, weng2020).

Usage::

    python -m tools.gret_probe -model CHECKPOINT -src TRAIN.src -tgt TRAIN.tgt \\
        -test_src TEST.src -test_tgt TEST.tgt [--kind global|last|average] \\
        [--src-subword-model spm.model --tgt-subword-model spm.model] [--epochs 20] [--out probe.json]

How it works and why: docs/tools.md (gret_probe.py).
"""

import json
import sys
from pathlib import Path

from tools import common

KINDS = ("global", "last", "average")


#: the name in this module's error lines; tools that use its helpers pass their own (``prog=``)
PROG = "gret_probe.py"


def _fail(message, prog=PROG):
    """One line on stderr, ``<prog>: error: <message>``, and exit status 2 (bad input, named in ``message``)."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _reason(error):
    return error.strerror if isinstance(error, OSError) and error.strerror else str(error)


def _read_lines(path, processor, option="-src", prog=PROG):
    """The lines of ``path`` (the value of ``option``), split into tokens or, with ``processor``, subword pieces."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        _fail(f"{option} {path}: cannot read ({_reason(error)})", prog)
    return [line.split() if processor is None else processor.encode(line, out_type=str) for line in lines]


def _subword(path, option="--src-subword-model", prog=PROG):
    if not path:
        return None
    import sentencepiece as spm

    try:
        return spm.SentencePieceProcessor(model_file=str(path))
    except (OSError, RuntimeError) as error:
        _fail(f"{option} {path}: cannot load the SentencePiece model ({error})", prog)


def load_model(checkpoint, option="-model", prog=PROG):
    """The checkpoint's model (eval mode, CPU) and its vocabularies."""
    import onmt  # noqa: F401  (loads onmt-ext through its start-up hook)
    import torch
    from onmt.model_builder import build_base_model
    from onmt.inputters.inputter import dict_to_vocabs
    from onmt.utils.parse import ArgumentParser

    if not Path(checkpoint).is_file():
        _fail(f"{option} {checkpoint}: no checkpoint there", prog)
    state = torch.load(checkpoint, map_location="cpu")
    model_opt = ArgumentParser.ckpt_model_opts(state["opt"])
    ArgumentParser.update_model_opts(model_opt)
    ArgumentParser.validate_model_opts(model_opt)
    vocabs = dict_to_vocabs(state["vocab"])
    model = build_base_model(model_opt, vocabs)
    model.load_state_dict(state, strict=True)
    model.eval()
    return model, vocabs, model_opt


def features(model, vocabs, sentences, kind):
    """One vector per source sentence ``(n, d_model)`` (``kind``: docs/tools.md, gret_probe.py)."""
    import torch

    if kind == "global" and getattr(model.encoder, "gret", None) is None:
        _fail("--kind global needs a GRET checkpoint (trained with -gret true); use last or average for others")
    out = []
    for enc_out, final, lengths in encoded_batches(model, vocabs, sentences):
        if kind == "global":
            vectors = final
        elif kind == "last":
            vectors = enc_out[torch.arange(len(lengths)), lengths - 1]
        else:
            keep = (torch.arange(enc_out.size(1))[None] < lengths[:, None]).unsqueeze(-1).to(enc_out.dtype)
            vectors = (enc_out * keep).sum(1) / lengths[:, None].to(enc_out.dtype)
        out.append(vectors.float())
    return torch.cat(out)


def encoded_batches(model, vocabs, sentences, batch_size=64):
    """``(enc_out (batch, len, d_model), final (GRET's global state (batch, d_model) or None), lengths (batch,))``
    of the encoder, without gradients, per batch of token-list sentences (an empty one: the unknown token)."""
    import torch
    from onmt.constants import DefaultTokens

    src_vocab = vocabs["src"]
    pad = src_vocab[DefaultTokens.PAD]
    with torch.no_grad():
        for start in range(0, len(sentences), batch_size):
            chunk = [s if s else [DefaultTokens.UNK] for s in sentences[start : start + batch_size]]
            lengths = torch.tensor([len(s) for s in chunk])
            src = torch.full((len(chunk), int(lengths.max()), 1), pad, dtype=torch.long)
            for i, tokens in enumerate(chunk):
                src[i, : len(tokens), 0] = torch.tensor(src_vocab(tokens))
            enc_out, final, _ = model.encoder(src, lengths)
            yield enc_out, final, lengths


def special_ids(vocabs):
    """Target ids that are never words: padding, BOS, EOS, unknown."""
    from onmt.constants import DefaultTokens

    vocab = vocabs["tgt"]
    return sorted({vocab[t] for t in (DefaultTokens.PAD, DefaultTokens.BOS, DefaultTokens.EOS, DefaultTokens.UNK)})


def bags(vocabs, sentences):
    """Target-token id sets (specials and unknown words left out)."""
    specials = set(special_ids(vocabs))
    return [sorted(set(vocabs["tgt"](tokens)) - specials) for tokens in sentences]


def _scores(weight, vectors, embeddings, excluded):
    """Token scores ``(n, V)``; the ``excluded`` (special) ids can never be predicted."""
    scores = weight(vectors) @ embeddings.t()
    scores[:, excluded] = float("-inf")
    return scores


def train_probe(vectors, targets, embeddings, excluded, epochs=20, lr=1e-3, seed=1234):
    """The predictor ``W`` ``(d, d)`` trained on (vector, bag) pairs; ``embeddings`` ``(V, d)`` stays fixed."""
    import torch

    torch.manual_seed(seed)
    weight = torch.nn.Linear(vectors.size(1), embeddings.size(1))
    optimiser = torch.optim.Adam(weight.parameters(), lr=lr)
    usable = [i for i, bag in enumerate(targets) if bag]
    if not usable:
        _fail("no training pair has a target token in the model's vocabulary")
    for _ in range(epochs):
        order = torch.randperm(len(usable)).tolist()
        for start in range(0, len(order), 64):
            index = [usable[i] for i in order[start : start + 64]]
            log_probs = torch.log_softmax(_scores(weight, vectors[index], embeddings, excluded), dim=-1)
            loss = -sum(log_probs[row, targets[i]].mean() for row, i in enumerate(index)) / len(index)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    return weight


def precision_at(weight, vectors, targets, embeddings, excluded, ks):
    """Mean precision at each k over the sentences with a non-empty bag."""
    import torch

    with torch.no_grad():
        scores = _scores(weight, vectors, embeddings, excluded)
    result = {}
    for k in ks:
        top = scores.topk(k, dim=-1).indices.tolist()
        hits = [len(set(row) & set(bag)) / k for row, bag in zip(top, targets) if bag]
        result[k] = sum(hits) / len(hits) if hits else float("nan")
    return result


def main(argv=None):
    parser = common.Parser(description=__doc__.split("\n")[0])
    parser.add_argument("-model", required=True, help="an OpenNMT-py checkpoint")
    parser.add_argument("-src", required=True, help="probe training source text")
    parser.add_argument("-tgt", required=True, help="probe training target text")
    parser.add_argument("-test_src", required=True)
    parser.add_argument("-test_tgt", required=True)
    parser.add_argument("--kind", choices=KINDS, default="global")
    parser.add_argument("--src-subword-model", help="SentencePiece model applied to the source text")
    parser.add_argument("--tgt-subword-model", help="SentencePiece model applied to the target text")
    parser.add_argument("--epochs", type=common.at_least(1), default=20)
    parser.add_argument("--limit", type=int, default=0, help="use only the first N training pairs (0: all)")
    parser.add_argument("--top-k", type=common.at_least(1), nargs="+", default=[1, 5, 10])
    parser.add_argument("--out", type=Path, help="write the result as JSON")
    args = parser.parse_args(argv)
    src_sp, tgt_sp = _subword(args.src_subword_model), _subword(args.tgt_subword_model, "--tgt-subword-model")
    train_src, train_tgt = _read_lines(args.src, src_sp), _read_lines(args.tgt, tgt_sp, "-tgt")
    test_src = _read_lines(args.test_src, src_sp, "-test_src")
    test_tgt = _read_lines(args.test_tgt, tgt_sp, "-test_tgt")
    for a, b, name in ((train_src, train_tgt, "-src/-tgt"), (test_src, test_tgt, "-test_src/-test_tgt")):
        if len(a) != len(b):
            _fail(f"{name} have different line counts ({len(a)} and {len(b)})")
    if args.limit:
        train_src, train_tgt = train_src[: args.limit], train_tgt[: args.limit]
    model, vocabs, _ = load_model(args.model)
    embeddings = model.decoder.embeddings.word_lut.weight.detach().float()
    excluded = special_ids(vocabs)
    weight = train_probe(features(model, vocabs, train_src, args.kind), bags(vocabs, train_tgt), embeddings,
                         excluded, epochs=args.epochs)
    result = precision_at(weight, features(model, vocabs, test_src, args.kind), bags(vocabs, test_tgt), embeddings,
                          excluded, sorted(set(args.top_k)))
    report = {"model": str(args.model), "kind": args.kind, "train_pairs": len(train_src),
              "test_pairs": len(test_src), "precision": {str(k): v for k, v in result.items()}}
    print(f"bag-of-words probe of {args.model} ({args.kind}): " +
          ", ".join(f"P@{k} = {v:.3f}" for k, v in result.items()))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
