"""PyTorch operators per training step or decoding step, each mechanism against the baseline: a device-free count.

Usage::

    python -m tools.op_count [--cases baseline li2019 ...] [--layers 6] [--decode beam4 greedy] [--out PATH]

Each case's smoke twin (``yaml_configs/smoke/<config>``, the paper's mechanism at toy width) is built at
``--layers`` encoder and decoder layers, with ``-ext_compile false``, and one forward and backward pass on a
fixed batch of 4 sentences of 18-30 tokens is counted below autograd (:func:`counter`, which
tools/routing_memory.py counts with too).  Views and detaches are left out: they launch nothing on a GPU, where
nearly every other operator is one kernel launch, which is what the host must issue per step.  The routing runs
as it would on CUDA when ``TRITON_INTERPRET=1`` and ``ONMT_EXT_ROUTING_KERNEL=triton`` are set (the fused
kernels, one operator each); chen2019's RNN is a loop of operators on the CPU but one cuDNN call on a GPU.
``--decode`` counts translation instead (:func:`decode_count`): the encoder, then each decoding step.
Method and caveats: docs/benchmarks-method.md.
"""

import argparse
import collections
import functools
import os
from pathlib import Path

from tools import common

#: (label, config under yaml_configs/, as gpu-check's cases)
CASES = (
    ("baseline", "baseline/transformer_base_wmt17_zhen.yaml"),
    ("li2019 EM, enc-self 1-6", "li2019/transformer_base_wmt17_zhen_em_enc_self.yaml"),
    ("li2019 Effective Aggregation", "li2019/transformer_base_wmt17_zhen_em_enc_self_layers_1-2.yaml"),
    ("li2019 simple, enc-self 1-6", "li2019/transformer_base_wmt17_zhen_simple_enc_self.yaml"),
    ("li2019 EM on all three", "li2019/transformer_base_wmt17_zhen_em_all.yaml"),
    ("cao2019 cross aggregation", "cao2019/transformer_base_wmt17_zhen_cross_zero.yaml"),
    ("chen2019 RPEHead", "chen2019/transformer_base_nist_zhen_rpehead.yaml"),
    ("chen2019 MPRHead", "chen2019/transformer_base_nist_zhen_mprhead.yaml"),
    ("clause attention, rule", "clause/transformer_base_wmt16_ende_ca_rule.yaml"),
    ("GRET", "gret/transformer_base_wmt17_zhen_gret.yaml"),
)
SOURCE_LENGTHS, TARGET_LENGTHS = (30, 25, 28, 20), (27, 22, 30, 18)
#: ``--decode``'s searches: onmt_translate options, as gpu-check's section c translates (greedy: one beam, top 1)
SEARCHES = {"beam4": ("-beam_size", 4), "greedy": ("-beam_size", 1, "-random_sampling_topk", 1)}
#: decoding steps of every sentence (``-min_length`` = ``-max_length``, ``-max_length_ratio 0``)
DECODE_STEPS = 20


def counted(func):
    """Whether ``func`` (an aten operator overload) is counted: every operator but views and detaches, which
    launch nothing on a GPU; an operator that returns no tensor (``_local_scalar_dense``, ``_foreach_add_``) or a
    list of them (``unsafe_split``) counts too."""
    return not func.is_view and func.overloadpacket.__name__ not in ("detach", "detach_")


def counter():
    """A fresh operator count, the one of this tool and of tools/routing_memory.py: ``with counter() as count:``.

    A ``TorchDispatchMode`` (below autograd); ``count.counts``: a Counter by operator name of those :func:`counted`
    (nearly one kernel launch each); ``count.every``: of every operator, views included; ``count.totals()``:
    ``{"ops": every operator, "launches": those counted}``.
    """
    return _count_class()()


@functools.lru_cache(maxsize=None)
def _count_class():
    """The class behind :func:`counter`, defined once, when first needed (torch is imported then)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OperatorCount(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.counts, self.every = collections.Counter(), collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            self.every[name] += 1
            if counted(func):
                self.counts[name] += 1
            return func(*args, **(kwargs or {}))

        def totals(self):
            return {"ops": sum(self.every.values()), "launches": sum(self.counts.values())}

    return OperatorCount


def _model_and_batch(config, layers):
    """``(opt, vocabs, model)`` of the smoke twin of ``config`` at ``layers`` layers, built as onmt_train builds
    it, and a fixed batch."""
    import torch
    from onmt.constants import DefaultTokens

    from onmt_ext.mechanisms.clause.split import marker_tokens

    opt, vocabs, model = common.built_model(common.CONFIGS / "smoke" / config, "-enc_layers", str(layers),
                                            "-dec_layers", str(layers), "-ext_compile", "false")
    generator = torch.Generator().manual_seed(1)
    markers = [vocabs["src"][token] for token in marker_tokens() if token in vocabs["src"].ids_to_tokens]

    def ids(side, lengths):
        pad, size = vocabs[side][DefaultTokens.PAD], len(vocabs[side])
        out = torch.full((len(lengths), max(lengths), 1), pad, dtype=torch.long)
        for row, length in enumerate(lengths):
            out[row, :length, 0] = torch.randint(10, size, (length,), generator=generator)
            if side == "src" and markers:  # clause markers at a quarter of the positions, so sentences have clauses
                where = torch.rand(length, generator=generator) < 0.25
                picks = torch.tensor(markers)[torch.randint(len(markers), (length,), generator=generator)]
                out[row, :length, 0] = torch.where(where, picks, out[row, :length, 0])
        return out

    src, tgt = ids("src", SOURCE_LENGTHS), ids("tgt", TARGET_LENGTHS)
    tgt[:, 0, 0] = vocabs["tgt"][DefaultTokens.BOS]
    return (opt, vocabs, model), (src, tgt, torch.tensor(SOURCE_LENGTHS))


def count(config, layers, autocast=False, half_weights=False):
    """``Counter`` of the launching operators of one training forward and backward pass of ``config``'s twin.

    ``autocast``: under the CPU's bfloat16 autocast, which casts as CUDA's float16 autocast of ``-model_dtype
    fp16`` does; ``half_weights``: with ``-ext_half_weights``'s bfloat16 copies (their gradients' collection and
    refresh counted too)."""
    import torch

    from onmt_ext.runtime.half_weights import HalfWeights

    (_, _, model), (src, tgt, lengths) = _model_and_batch(config, layers)
    model.train()
    half = HalfWeights(model, torch.bfloat16) if half_weights else None
    for _ in range(2):  # the first pass builds lazily created state (caches, the kernels' first-use check)
        model.zero_grad(set_to_none=True)
        mode = counter()
        with mode:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast or half_weights):
                out, _ = model(src, tgt, lengths)
            out.float().sum().backward()
            if half is not None:
                half.collect()
                half.refresh()
    return mode.counts


def _translator(model, vocabs, model_opt, search, steps):
    """OpenNMT-py's ``Translator`` of ``model``, as ``onmt_translate`` builds it (less the checkpoint) for
    ``search`` (a key of :data:`SEARCHES`), every output ``steps`` tokens long."""
    import io

    from onmt.bin.translate import _get_parser
    from onmt.translate import GNMTGlobalScorer
    from onmt.translate.translator import Translator

    opt = _get_parser().parse_args([str(word) for word in (
        "-model", "unused", "-src", "unused", "-min_length", steps, "-max_length", steps, "-max_length_ratio", 0,
        *SEARCHES[search])])
    model.eval()  # as load_test_model leaves it; -ext_compile false was built in (translation's default)
    return Translator.from_opt(model, vocabs, opt, model_opt, global_scorer=GNMTGlobalScorer.from_opt(opt),
                               out_file=io.StringIO(), report_score=False)


def decode_count(config, layers, search="beam4", steps=None):
    """The launching operators of translating the fixed sources with ``config``'s twin, untrained (the count does
    not depend on the weights: ``-min_length`` = ``-max_length`` fixes the steps), through ``translate_batch``.

    Returns a dict: ``steps`` (decoder calls), ``encoder`` (the encoder pass), ``loop`` (a Counter of the
    decoding loop: each step's decoder, generator and search, from the first decoder call to the report),
    ``per_step`` (``loop``'s total / ``steps``), ``other`` (the search's set-up and report) and ``total``.
    ``steps``: :data:`DECODE_STEPS` unless given.
    """
    import torch

    steps = steps or DECODE_STEPS
    (opt, vocabs, model), (src, _, lengths) = _model_and_batch(config, layers)
    translator = _translator(model, vocabs, opt, search, steps)
    marks = {}

    def marking(name, method, first=None):
        def wrapped(*args, **kwargs):
            if name == "step":
                marks["steps"] = marks.get("steps", 0) + 1
            if not (first and first in marks):  # a step's mark: the first only (the loop's start)
                marks.setdefault(first or name, collections.Counter(mode.counts))
            result = method(*args, **kwargs)
            if name == "encoder":
                marks["encoded"] = collections.Counter(mode.counts)
            return result
        return wrapped

    translator._run_encoder = marking("encoder", translator._run_encoder)
    translator._decode_and_generate = marking("step", translator._decode_and_generate, first="loop")
    translator.report_results = marking("report", translator.report_results)
    for _ in range(2):  # the first translation builds lazily created state, as the training count's first pass
        marks.clear()
        mode = counter()
        with mode, torch.no_grad():
            translator.translate_batch({"src": src, "srclen": lengths}, attn_debug=False)
    total = sum(mode.counts.values())
    encoder = sum((marks["encoded"] - marks["encoder"]).values())
    loop = marks["report"] - marks["loop"]
    return {"steps": marks["steps"], "encoder": encoder, "loop": loop, "per_step": sum(loop.values()) / marks["steps"],
            "other": total - encoder - sum(loop.values()), "total": total}


def _decode_rows(chosen, layers, searches):
    """The rows of ``--decode``: each case under each search, with the ratio and the excess over the baseline."""
    rows, base = [], {}
    for label, config in chosen:
        for search in searches:
            result = decode_count(config, layers, search)
            per_step, steps = result["per_step"], result["steps"]
            if label == "baseline":
                base[search] = result
            reference = base.get(search)
            excess = collections.Counter({name: (n - reference["loop"][name]) / steps
                                          for name, n in result["loop"].items()}) if reference else None
            rows.append({"case": label, "config": config, "search": search, "steps": steps,
                         "operators_per_step": per_step, "encoder": result["encoder"], "other": result["other"],
                         "total": result["total"], "ratio": per_step / reference["per_step"] if reference else None,
                         "top": [(name, n / steps) for name, n in result["loop"].most_common(8)],
                         "excess_top": [(name, n) for name, n in excess.most_common(6) if n > 0] if excess else None})
            if reference and steps != reference["steps"]:
                raise RuntimeError(f"{label}, {search}: {steps} decoding steps, the baseline {reference['steps']}")
            print(f"{label}, {search}: {steps} steps, {per_step:.1f} operators per step"
                  + (f", {per_step / reference['per_step']:.2f} of the baseline's" if reference else "")
                  + f"; encoder {result['encoder']}, total {result['total']}", flush=True)
    return rows


#: the first line of ``<out>.md``: training's table, ``--decode``'s
TRAIN_HEADER = "| case | operators per step | over the baseline | most frequent |"
DECODE_HEADER = ("| case | search | steps | operators per step | over the baseline | encoder | total | "
                 "most in excess of the baseline, per step |")


def _decode_table(rows):
    """The markdown table of ``--decode``'s rows."""
    lines = [DECODE_HEADER, "|---|---|---:|---:|---:|---:|---:|---|"]
    lines += [f"| {row['case']} | {row['search']} | {row['steps']} | {row['operators_per_step']:.1f} | "
              f"{common.fmt(row['ratio'])} | {row['encoder']} | {row['total']} | "
              f"{', '.join(f'{name} +{n:g}' for name, n in (row['excess_top'] or [])[:4])} |" for row in rows]
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tools.op_count", description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="*", default=[], help="substrings of the case labels (default: all)")
    parser.add_argument("--layers", type=int, default=6, help="encoder and decoder layers (the papers' Base: 6)")
    parser.add_argument("--decode", nargs="+", choices=sorted(SEARCHES),
                        help=f"count translation instead, with these searches: the operators per decoding step "
                             f"({DECODE_STEPS} steps) and of the encoder")
    parser.add_argument("--autocast", action="store_true",
                        help="training under the CPU's bfloat16 autocast (the casts of -model_dtype fp16 on CUDA)")
    parser.add_argument("--half-weights", action="store_true",
                        help="training with -ext_half_weights's copies (implies --autocast)")
    parser.add_argument("--out", help="write <out>.json and <out>.md")
    args = parser.parse_args(argv)
    if args.out:
        _check_out(args.out, DECODE_HEADER if args.decode else TRAIN_HEADER)
    import onmt  # noqa: F401  (the start-up hook activates onmt-ext)
    import torch

    torch.set_num_threads(1)
    chosen = [case for case in CASES if not args.cases or any(text in case[0] for text in args.cases)]
    setting = {"layers": args.layers, "source_lengths": SOURCE_LENGTHS, "target_lengths": TARGET_LENGTHS,
               "routing_kernel": os.environ.get("ONMT_EXT_ROUTING_KERNEL", "auto"),
               "triton_interpret": os.environ.get("TRITON_INTERPRET", ""), "torch": torch.__version__,
               "autocast": args.autocast or args.half_weights, "half_weights": args.half_weights}
    if args.decode:
        rows = _decode_rows(chosen, args.layers, args.decode)
        setting.update(decode=args.decode, steps=DECODE_STEPS, target_lengths=None)
        _write(args.out, setting, rows, _decode_table(rows))
        return 0
    rows, base = [], None
    for label, config in chosen:
        counts = count(config, args.layers, args.autocast, args.half_weights)
        total = sum(counts.values())
        base = total if label == "baseline" else base
        rows.append({"case": label, "config": config, "operators": total,
                     "ratio": total / base if base else None, "top": counts.most_common(6)})
        print(f"{label}: {total} operators" + (f", {total / base:.2f} of the baseline's" if base else ""),
              flush=True)
    lines = [TRAIN_HEADER, "|---|---:|---:|---|"]
    lines += [f"| {row['case']} | {row['operators']} | {common.fmt(row['ratio'])} | "
              f"{', '.join(f'{name} {n}' for name, n in row['top'][:4])} |" for row in rows]
    _write(args.out, setting, rows, lines)
    return 0


def _check_out(out, header):
    """Stop, before counting, with one line if ``<out>.md`` exists and is not this mode's table (its first line
    is not ``header``): a page written by hand (results/bench/ops-per-decoding-step.md) is never replaced."""
    path = Path(f"{out}.md")
    if path.exists() and path.read_text(encoding="utf-8").split("\n", 1)[0] != header:
        raise SystemExit(f"op_count.py: {path} exists and is not a table this command writes (its first line "
                         "differs); choose another --out or remove the file")


def _write(out, setting, rows, lines):
    """``<out>.json`` (the setting and the rows) and ``<out>.md`` (the table ``lines``), when ``out`` is given."""
    if out:
        common.write_outputs(out, {"setting": setting, "rows": rows}, "\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
