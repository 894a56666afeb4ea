#!/usr/bin/env python
"""Parameter counts of model configs at their full size, and deltas against their baseline.

Usage::

    python tools/param_report.py yaml_configs/li2019/*.yaml [--vocab-size 32000] [--markdown]

Each config is parsed exactly as ``onmt_train`` parses it (strict onmt-ext
options included) and its model is built on PyTorch's ``meta`` device, so no
data, vocabulary file or memory is needed.  The baseline of a config is the
same config with every onmt-ext option at its "off" default and the stock
``transformer`` encoder/decoder: the delta is what the mechanism adds.
Vocabularies are dummies of ``--vocab-size`` entries (shared when the config
shares them); the delta does not depend on it.
"""

import argparse
import sys
from pathlib import Path



def _vocabs(size, shared):
    import pyonmttok
    from onmt.constants import DefaultTokens

    from onmt_ext.clause_split import marker_tokens

    # the clause markers are source specials of the clause_split transform (clause attention looks them up)
    specials = [DefaultTokens.UNK, DefaultTokens.PAD, DefaultTokens.BOS, DefaultTokens.EOS, *marker_tokens()]
    src = pyonmttok.build_vocab_from_tokens([f"w{i}" for i in range(size - len(specials))], special_tokens=specials)
    tgt = src if shared else pyonmttok.build_vocab_from_tokens(
        [f"w{i}" for i in range(size - len(specials))], special_tokens=specials)
    return {"src": src, "tgt": tgt, "data_task": "seq2seq", "decoder_start_token": DefaultTokens.BOS}


def count_parameters(opt, vocab_size):
    """Number of parameters of the model ``opt`` describes (built on the meta device)."""
    import torch
    from onmt.model_builder import build_base_model

    with torch.device("meta"):
        model = build_base_model(opt, _vocabs(vocab_size, opt.share_vocab))
    return sum(p.numel() for p in model.parameters())


def baseline_of(opt):
    """A copy of ``opt`` with every onmt-ext option off and stock model types."""
    import copy

    from onmt_ext.options import OPTION_SPECS

    base = copy.deepcopy(opt)
    for spec in OPTION_SPECS:
        setattr(base, spec.name, spec.default)
    base.encoder_type = "transformer" if opt.encoder_type == "ext_transformer" else opt.encoder_type
    base.decoder_type = "transformer" if opt.decoder_type == "ext_transformer" else opt.decoder_type
    return base


def report(configs, vocab_size, overrides=()):
    """Rows ``(config, parameters, baseline parameters, delta)``; ``overrides`` apply to every config."""
    from onmt_ext.plugin import parse_train_config

    rows = []
    for config in configs:
        # the count needs no device: a config's GPU ranks are dropped so that it parses on a CPU-only torch
        opt = parse_train_config(config, *overrides, "-gpu_ranks", "-world_size", "1")
        total = count_parameters(opt, vocab_size)
        base = count_parameters(baseline_of(opt), vocab_size)
        rows.append((str(config), total, base, total - base))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("configs", nargs="+", type=Path)
    parser.add_argument("--vocab-size", type=int, default=32000, help="entries of each dummy vocabulary")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args(argv)
    missing = [str(c) for c in args.configs if not c.is_file()]
    if missing:
        parser.error(f"no such config: {', '.join(missing)}")
    import onmt  # noqa: F401  (loads onmt-ext through the start-up hook)

    rows = report(args.configs, args.vocab_size)
    if args.markdown:
        print("| config | parameters | baseline | delta |\n|---|---:|---:|---:|")
        for name, total, base, delta in rows:
            print(f"| `{Path(name).name}` | {total / 1e6:.2f}M | {base / 1e6:.2f}M | {delta / 1e6:+.2f}M |")
    else:
        for name, total, base, delta in rows:
            print(f"{name}\t{total}\t{base}\t{delta:+d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
