#!/usr/bin/env python
"""Parameter counts of model configs at their full size, and deltas against their baseline.

Usage::

    python -m tools.param_report yaml_configs/li2019/*.yaml [--vocab-size 32000] [--markdown]

How it works and why: docs/tools.md (param_report.py).
"""

import copy
import math
import sys
from pathlib import Path

from tools import common

# OpenNMT-py's (share_embeddings, share_decoder_embeddings) per tying: one, two or three (V, d) matrices
TYINGS = {"all": (True, True), "decoder": (False, True), "none": (False, False)}


# config (relative to yaml_configs/) -> (paper's total, paper's vocabulary size, where the paper gives it)
PAPER_TOTALS = {
    "li2019/transformer_base_wmt14_ende_baseline.yaml": (88.0e6, 32000, "li2019 Tables 2-4"),
    "li2019/transformer_base_wmt14_ende_simple_enc_self.yaml": (100.6e6, 32000, "li2019 Table 2 row 3"),
    "li2019/transformer_base_wmt14_ende_em_enc_self.yaml": (100.6e6, 32000, "li2019 Tables 2-3"),
    "li2019/transformer_base_wmt14_ende_em_enc_dec.yaml": (100.6e6, 32000, "li2019 Table 2 row 5"),
    "li2019/transformer_base_wmt14_ende_em_dec_self.yaml": (100.6e6, 32000, "li2019 Table 2 row 6"),
    "li2019/transformer_base_wmt14_ende_em_enc_self_dec_self.yaml": (113.2e6, 32000, "li2019 Table 2 row 7"),
    "li2019/transformer_base_wmt14_ende_em_all.yaml": (125.8e6, 32000, "li2019 Table 2 row 8"),
    "li2019/transformer_base_wmt14_ende_em_enc_self_layers_4-6.yaml": (94.3e6, 32000, "li2019 Table 3"),
    "li2019/transformer_base_wmt14_ende_em_enc_self_layers_1-3.yaml": (94.3e6, 32000, "li2019 Table 3"),
    "li2019/transformer_base_wmt14_ende_em_enc_self_layers_1-2.yaml": (92.2e6, 32000, "li2019 Table 3"),
    "li2019/transformer_base_wmt14_ende_em_enc_self_layers_6.yaml": (90.1e6, 32000, "li2019 Table 3"),
    "li2019/transformer_base_wmt14_ende_em_enc_self_layers_1.yaml": (90.1e6, 32000, "li2019 Table 3"),
    "li2019/transformer_big_wmt14_ende_baseline.yaml": (264e6, 32000, "li2019 Table 4"),
    "li2019/transformer_big_wmt14_ende_em_enc_self_layers_1-2.yaml": (297e6, 32000, "li2019 Table 4"),
    "li2019/transformer_base_wmt17_zhen_baseline.yaml": (108e6, 32000, "li2019 Table 4"),
    "li2019/transformer_base_wmt17_zhen_em_enc_self_layers_1-2.yaml": (112e6, 32000, "li2019 Table 4"),
    "li2019/transformer_big_wmt17_zhen_baseline.yaml": (304e6, 32000, "li2019 Table 4"),
    "li2019/transformer_big_wmt17_zhen_em_enc_self_layers_1-2.yaml": (337e6, 32000, "li2019 Table 4"),
    # chen2019 (sec. 5.1: "the vocabulary size was set as 32K")
    "chen2019/transformer_base_wmt14_ende_baseline.yaml": (97.35e6, 32000, "chen2019 Table 1"),
    "chen2019/transformer_base_wmt14_ende_relative_pe.yaml": (97.42e6, 32000, "chen2019 Table 1"),
    "chen2019/transformer_base_wmt14_ende_disan.yaml": (97.39e6, 32000, "chen2019 Table 1"),
    "chen2019/transformer_base_wmt14_ende_rpehead.yaml": (97.84e6, 32000, "chen2019 Table 1"),
    "chen2019/transformer_base_wmt14_ende_mprhead.yaml": (97.72e6, 32000, "chen2019 Table 1"),
    "chen2019/transformer_big_wmt14_ende_baseline.yaml": (272.6e6, 32000, "chen2019 Table 1"),
    "chen2019/transformer_big_wmt14_ende_mprhead.yaml": (289.1e6, 32000, "chen2019 Table 1"),
    "chen2019/transformer_base_nist_zhen_baseline.yaml": (77.94e6, 32000, "chen2019 Table 2"),
    "chen2019/transformer_base_nist_zhen_relative_pe.yaml": (77.01e6, 32000, "chen2019 Table 2"),
    "chen2019/transformer_base_nist_zhen_rpehead.yaml": (78.04e6, 32000, "chen2019 Table 2"),
    "chen2019/transformer_base_nist_zhen_mprhead.yaml": (78.04e6, 32000, "chen2019 Table 2"),
    "chen2019/transformer_big_nist_zhen_baseline.yaml": (243.7e6, 32000, "chen2019 Table 2"),
    "chen2019/transformer_big_nist_zhen_mprhead.yaml": (245.5e6, 32000, "chen2019 Table 2"),
}


def _vocabs(size, shared):
    import pyonmttok
    from onmt.constants import DefaultTokens

    from onmt_ext.mechanisms.clause.split import marker_tokens

    # the clause markers are source specials of the clause_split transform (clause attention looks them up)
    specials = [DefaultTokens.UNK, DefaultTokens.PAD, DefaultTokens.BOS, DefaultTokens.EOS, *marker_tokens()]
    words = [f"w{i}" for i in range(size - len(specials))]
    src = pyonmttok.build_vocab_from_tokens(words, special_tokens=specials)
    tgt = src if shared else pyonmttok.build_vocab_from_tokens(words, special_tokens=specials)
    return {"src": src, "tgt": tgt, "data_task": "seq2seq", "decoder_start_token": DefaultTokens.BOS}


def _options(config, *overrides):
    """``config``'s options as ``onmt_train`` parses them, without GPU ranks (the count needs no device, so a config
    naming GPUs parses on a CPU-only torch)."""
    from onmt_ext.integration.parsing import parse_train_config

    return parse_train_config(config, *overrides, "-gpu_ranks", "-world_size", "1")


def count_parameters(opt, vocab_size):
    """Number of parameters of the model ``opt`` describes (built on the meta device)."""
    import torch
    from onmt.model_builder import build_base_model

    with torch.device("meta"):
        model = build_base_model(opt, _vocabs(vocab_size, opt.share_vocab))
    return sum(p.numel() for p in model.parameters())


def baseline_of(opt):
    """A copy of ``opt`` with every mechanism off: the paper's baseline row.  The Transformer's own onmt-ext options
    (``-ext_*``: its layer-norm placement) are kept, and with them onmt-ext's model types; where they are all at
    their defaults, the types are stock's."""
    from onmt_ext.options import OPTION_SPECS

    base = copy.deepcopy(opt)
    for spec in OPTION_SPECS:
        if not spec.name.startswith("ext_"):
            setattr(base, spec.name, spec.default)
    if all(getattr(base, spec.name, spec.default) == spec.default for spec in OPTION_SPECS):
        base.encoder_type = "transformer" if opt.encoder_type == "ext_transformer" else opt.encoder_type
        base.decoder_type = "transformer" if opt.decoder_type == "ext_transformer" else opt.decoder_type
    return base


def tying_of(opt):
    """The name in ``TYINGS`` of the tying ``opt`` sets (``"embeddings"``: source and target only)."""
    pair = (bool(opt.share_embeddings), bool(opt.share_decoder_embeddings))
    return next((name for name, tying in TYINGS.items() if tying == pair), "embeddings")


def with_tying(opt, tying):
    """A copy of ``opt`` with the embedding tying ``tying`` (a key of ``TYINGS``)."""
    tied = copy.deepcopy(opt)
    tied.share_embeddings, tied.share_decoder_embeddings = TYINGS[tying]
    tied.share_vocab = bool(opt.share_vocab or tied.share_embeddings)  # OpenNMT-py ties only a shared vocabulary
    return tied


def vocab_entries(opt):
    """Entries a side that training will use: the config's cap, else the built vocabulary file's lines plus
    OpenNMT-py's four specials, else None (no cap and no vocabulary built yet)."""
    if opt.src_vocab_size:
        return opt.src_vocab_size
    path = common.REPO / opt.src_vocab
    return sum(1 for _ in path.open(encoding="utf-8")) + 4 if path.is_file() else None


def closest_range(lines, paper, tying):
    """``(low, high)``: the vocabulary sizes V (entries a side) at which ``tying`` has the total closest to ``paper``,
    each tying's total being ``a + b V`` (``lines``: {tying: (a, b)}); two tyings swap at V = (2 paper - a1 - a2) /
    (b1 + b2), where the paper's total lies midway.  None when it is never the closest."""
    cuts = sorted({(2 * paper - a1 - a2) / (b1 + b2) for a1, b1 in lines.values() for a2, b2 in lines.values()
                   if b1 + b2} | {0})
    mids = [(x + y) / 2 for x, y in zip(cuts, cuts[1:] + [cuts[-1] * 2 + 1])]
    won = [m for m in mids if m > 0 and min(lines, key=lambda t: abs(lines[t][0] + lines[t][1] * m - paper)) == tying]
    if not won:
        return None
    return max([c for c in cuts if c < min(won)], default=0), min([c for c in cuts if c > max(won)], default=math.inf)


def paper_match(configs):
    """Rows ``(config, source, paper total, config's tying, {tying: total at V}, closest at V, V, where V comes from,
    {tying: (low, high) of closest_range})`` for the configs of ``PAPER_TOTALS``: V is the vocabulary the config
    trains with (:func:`vocab_entries`), else the paper's; a config not in PAPER_TOTALS is an error."""
    rows = []
    for config in configs:
        key = Path(config).resolve().relative_to(common.CONFIGS).as_posix()
        if key not in PAPER_TOTALS:
            raise SystemExit(f"{config}: no paper total for this config (tools/param_report.py PAPER_TOTALS)")
        paper, vocab, source = PAPER_TOTALS[key]
        opt = _options(config)
        real = vocab_entries(opt)
        size, origin = (real, "the config's vocabulary") if real else (vocab, "the paper's: no cap, none built")
        at = {v: {t: count_parameters(with_tying(opt, t), v) for t in TYINGS} for v in (size, size + 1000)}
        lines = {t: (at[size][t] - size * (at[size + 1000][t] - at[size][t]) / 1000,
                     (at[size + 1000][t] - at[size][t]) / 1000) for t in TYINGS}
        closest = min(at[size], key=lambda tying: abs(at[size][tying] - paper))
        ranges = {t: closest_range(lines, paper, t) for t in TYINGS}
        rows.append((str(config), source, paper, tying_of(opt), at[size], closest, size, origin, ranges))
    return rows


def report(configs, vocab_size, overrides=()):
    """Rows ``(config, parameters, baseline parameters, delta)``; ``overrides`` apply to every config."""
    rows = []
    for config in configs:
        opt = _options(config, *overrides)
        total = count_parameters(opt, vocab_size)
        base = count_parameters(baseline_of(opt), vocab_size)
        rows.append((str(config), total, base, total - base))
    return rows


def main(argv=None):
    parser = common.Parser(description=__doc__.split("\n")[0])
    parser.add_argument("configs", nargs="*", type=Path, help="with --paper, default: every config of PAPER_TOTALS")
    parser.add_argument("--vocab-size", type=int, default=32000, help="entries of each dummy vocabulary")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--paper", action="store_true",
                        help="totals at the paper's vocabulary under each embedding tying against the paper's count")
    args = parser.parse_args(argv)
    if args.paper and not args.configs:
        args.configs = [common.CONFIGS / key for key in PAPER_TOTALS]
    if not args.configs:
        parser.error("name at least one config (or --paper)")
    missing = [str(c) for c in args.configs if not c.is_file()]
    if missing:
        parser.error(f"no such config: {', '.join(missing)}")
    import onmt  # noqa: F401  (loads onmt-ext through the start-up hook)

    if args.paper:
        return _print_paper_match(paper_match(args.configs), args.markdown)
    rows = report(args.configs, args.vocab_size)
    if args.markdown:
        print("| config | parameters | baseline | delta |\n|---|---:|---:|---:|")
    for name, total, base, delta in rows:
        print(f"| `{Path(name).name}` | {total / 1e6:.2f}M | {base / 1e6:.2f}M | {delta / 1e6:+.2f}M |" if args.markdown
              else f"{name}\t{total}\t{base}\t{delta:+d}")
    return 0


def _print_paper_match(rows, markdown):
    """Prints the rows of :func:`paper_match`; returns 1 when a config's tying is not the closest."""
    names = list(TYINGS)
    if markdown:
        print("| config | paper | paper's total | vocabulary | " + " | ".join(f"tying `{n}`" for n in names)
              + " | closest | config | config's tying closest for |\n|---|---|---:|---|" + "---:|" * len(names)
              + "---|---|---|")
    for config, source, paper, tying, totals, closest, size, origin, ranges in rows:
        cells = [f"{totals[n] / 1e6:.2f}M ({(totals[n] - paper) / paper:+.1%})" for n in names]
        verdict = tying if tying == closest else f"{tying} (differs)"
        span = "never" if ranges[tying] is None else "{:,.0f} to {:,.0f} entries".format(*ranges[tying])
        cells = [config if not markdown else f"`{Path(config).name}`", source, f"{paper / 1e6:.2f}M",
                 f"{size:,} ({origin})", *cells, closest, verdict, span]
        print(f"| {' | '.join(cells)} |" if markdown else "\t".join(cells))
    return int(any(row[3] != row[5] for row in rows))


if __name__ == "__main__":
    sys.exit(main())
