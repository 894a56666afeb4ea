"""PyTorch operators per training step, each mechanism against the baseline: a device-free count of launches.

Usage::

    python -m tools.op_count [--cases baseline li2019 ...] [--layers 6] [--out results/bench/ops-per-step]

Each case's smoke twin (``yaml_configs/smoke/<config>``, the paper's mechanism at toy width) is built at
``--layers`` encoder and decoder layers, with ``-ext_compile false``, and one forward and backward pass on a
fixed batch of 4 sentences of 18-30 tokens is counted below autograd (:func:`counter`, which
tools/routing_memory.py counts with too).  Views and detaches are left out: they launch nothing on a GPU, where
nearly every other operator is one kernel launch, which is what the host must issue per step.  The routing runs
as it would on CUDA when ``TRITON_INTERPRET=1`` and ``ONMT_EXT_ROUTING_KERNEL=triton`` are set (the fused
kernels, one operator each); chen2019's RNN is a loop of operators on the CPU but one cuDNN call on a GPU.
Method and caveats: docs/benchmarks-method.md.
"""

import argparse
import collections
import functools
import json
import os

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
    """The smoke twin of ``config`` at ``layers`` layers, built as onmt_train builds it, and a fixed batch."""
    import torch
    from onmt.constants import DefaultTokens

    from onmt_ext.mechanisms.clause.split import marker_tokens

    _, vocabs, model = common.built_model(common.CONFIGS / "smoke" / config, "-enc_layers", str(layers),
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
    return model, (src, tgt, torch.tensor(SOURCE_LENGTHS))


def count(config, layers):
    """``Counter`` of the launching operators of one training forward and backward pass of ``config``'s twin."""
    model, (src, tgt, lengths) = _model_and_batch(config, layers)
    model.train()
    for _ in range(2):  # the first pass builds lazily created state (caches, the kernels' first-use check)
        model.zero_grad(set_to_none=True)
        mode = counter()
        with mode:
            out, _ = model(src, tgt, lengths)
            out.float().sum().backward()
    return mode.counts


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tools.op_count", description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="*", default=[], help="substrings of the case labels (default: all)")
    parser.add_argument("--layers", type=int, default=6, help="encoder and decoder layers (the papers' Base: 6)")
    parser.add_argument("--out", help="write <out>.json and <out>.md")
    args = parser.parse_args(argv)
    import onmt  # noqa: F401  (the start-up hook activates onmt-ext)
    import torch

    torch.set_num_threads(1)
    chosen = [case for case in CASES if not args.cases or any(text in case[0] for text in args.cases)]
    rows, base = [], None
    for label, config in chosen:
        counts = count(config, args.layers)
        total = sum(counts.values())
        base = total if label == "baseline" else base
        rows.append({"case": label, "config": config, "operators": total,
                     "ratio": total / base if base else None, "top": counts.most_common(6)})
        print(f"{label}: {total} operators" + (f", {total / base:.2f} of the baseline's" if base else ""),
              flush=True)
    setting = {"layers": args.layers, "source_lengths": SOURCE_LENGTHS, "target_lengths": TARGET_LENGTHS,
               "routing_kernel": os.environ.get("ONMT_EXT_ROUTING_KERNEL", "auto"),
               "triton_interpret": os.environ.get("TRITON_INTERPRET", ""), "torch": torch.__version__}
    if args.out:
        with open(f"{args.out}.json", "w", encoding="utf-8") as handle:
            json.dump({"setting": setting, "rows": rows}, handle, indent=1)
        lines = ["| case | operators per step | over the baseline | most frequent |", "|---|---:|---:|---|"]
        lines += [f"| {row['case']} | {row['operators']} | {common.fmt(row['ratio'])} | "
                  f"{', '.join(f'{name} {n}' for name, n in row['top'][:4])} |" for row in rows]
        with open(f"{args.out}.md", "w", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
