#!/usr/bin/env python
"""Forward+backward milliseconds of OpenNMT-py's attention call against other SDPA kernels, at Base shapes.

Usage::

    python -m tools.attention_bench [--shapes 1024x32 256x128] [--d-model 512] [--heads 8]
        [--dtype float16|bfloat16|float32] [--dropout 0.1] [--warmup 10] [--repeats 50] [--seed 0]
        [--new-shapes 4] [--device cuda|cpu] [--tiny] [--out PATH]

The three attentions of a Transformer (encoder self, decoder self, context) on random right-padded lengths, each
as OpenNMT-py 3.5.1 calls ``scaled_dot_product_attention`` with the backends onmt-ext gives it ("stock") and as
the other :data:`VARIANTS` (cuDNN; the decoder's ``is_causal`` alone; floors): the median of ``--repeats`` timed
calls (CUDA events; perf_counter on the CPU), the ratio over stock, the host-clock time of a call at a shape not
seen before (a backend's per-shape plan), and the agreement with stock at dropout 0 on the non-padding query rows.
A variant its backend cannot run is "not supported: <reason>".  ``--tiny``: the CPU's dry run.  ``--out``:
PATH.json and PATH.md, rewritten after each attention of each shape.  Method: docs/tools.md (attention_bench.py).
"""

import argparse
import collections
import itertools
import statistics
import time
import warnings

from tools import common

#: default shapes, (sentences B, longest length L): about 32k padded tokens each, short and long sentences
SHAPES = ((1024, 32), (256, 128))
#: ``--tiny``: shapes, d_model, heads, warm-up and timed calls (head dim 64, as Base's)
TINY = {"shapes": ((4, 8), (3, 12)), "d_model": 128, "heads": 2, "warmup": 1, "repeats": 3, "new_shapes": 1}
#: a sentence's length is drawn uniformly from [LOW * L, L]; the first of each batch is L long
LOW = 0.5
#: ``torch.backends.cuda.sdp_kernel``'s arguments in OpenNMT-py 3.5.1's call (onmt/modules/multi_headed_attn.py)
STOCK_KERNEL = {"enable_flash": False, "enable_math": True, "enable_mem_efficient": True}
DTYPES = ("float16", "bfloat16", "float32")
ATTENTIONS = ("encoder self", "decoder self", "context")

#: ``backends``: names of ``torch.nn.attention.SDPBackend`` members, or None for stock's (:data:`STOCK_KERNEL`
#: through ``onmt_ext.runtime.compat.opennmt_sdp_kernel``); ``mask``: "opennmt" (OpenNMT-py's (B, 1, Lq, Lk)
#: mask, inverted in the call as OpenNMT-py does), "keys" (the key padding alone, (B, 1, 1, Lk), not expanded)
#: or None; ``causal``: ``is_causal``; ``floor``: a mask-free bound that ignores key padding (not a candidate).
Variant = collections.namedtuple("Variant", "attention name backends mask causal floor", defaults=(False,))

VARIANTS = (
    Variant("encoder self", "stock", None, "opennmt", False),
    Variant("encoder self", "cuDNN, mask", ("CUDNN_ATTENTION",), "opennmt", False),
    Variant("encoder self", "mem-efficient, key mask (B,1,1,L)", ("EFFICIENT_ATTENTION",), "keys", False),
    Variant("encoder self", "flash, no mask (floor)", ("FLASH_ATTENTION",), None, False, True),
    Variant("decoder self", "stock", None, "opennmt", True),
    Variant("decoder self", "cuDNN, mask", ("CUDNN_ATTENTION",), "opennmt", True),
    Variant("decoder self", "cuDNN, mask without is_causal", ("CUDNN_ATTENTION",), "opennmt", False),
    Variant("decoder self", "flash, is_causal only", ("FLASH_ATTENTION",), None, True),
    Variant("decoder self", "mem-efficient, is_causal only", ("EFFICIENT_ATTENTION",), None, True),
    Variant("decoder self", "cuDNN, is_causal only", ("CUDNN_ATTENTION",), None, True),
    Variant("context", "stock", None, "opennmt", False),
    Variant("context", "cuDNN, mask", ("CUDNN_ATTENTION",), "opennmt", False),
    Variant("context", "mem-efficient, key mask (B,1,1,S)", ("EFFICIENT_ATTENTION",), "keys", False),
    Variant("context", "flash, no mask (floor)", ("FLASH_ATTENTION",), None, False, True),
)

#: one attention's inputs. ``q``: (B, Lq, H, D), ``k``, ``v``: (B, Lk, H, D), leaves that require gradients (the
#: call transposes them to (B, H, L, D), as OpenNMT-py's projections leave them); ``mask``: OpenNMT-py's bool
#: (B, 1, Lq, Lk), True where masked; ``keys``: (B, 1, 1, Lk), True on padding keys; ``rows``: (B, Lq), True on
#: non-padding query rows; ``grad``: the upstream gradient, (B, H, Lq, D), zero on padding query rows
Problem = collections.namedtuple("Problem", "q k v mask keys rows grad")


def shape(text):
    """An argparse ``type``: ``BxL`` (sentences x longest length) as ``(B, L)``."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(part.isdigit() and int(part) > 0 for part in parts):
        raise argparse.ArgumentTypeError(f"must be BxL with two positive integers, not {text!r}")
    return int(parts[0]), int(parts[1])


def padding(lengths, size, left=False):
    """(B, size) bool, True on the padding positions of sentences of ``lengths`` (B,): at the end as OpenNMT-py
    pads (``sequence_mask``), or, ``left``, at the start."""
    import torch

    positions = torch.arange(size, device=lengths.device)
    return positions < (size - lengths)[:, None] if left else positions >= lengths[:, None]


def opennmt_mask(attention, query_pad, key_pad):
    """OpenNMT-py 3.5.1's mask of ``attention`` for its padding ``query_pad`` (B, Lq) and ``key_pad`` (B, Lk):
    (B, 1, Lq, Lk) bool, True where masked.  Encoder self and context: the key padding expanded over the queries
    (``TransformerEncoder.forward``, ``TransformerDecoder.forward``); decoder self: key padding or future, except
    on rows masked whole (``TransformerDecoderLayerBase._compute_dec_mask``'s patch), materialised."""
    import torch

    batch, queries, keys = query_pad.size(0), query_pad.size(1), key_pad.size(1)
    if attention != "decoder self":
        return key_pad[:, None, None, :].expand(batch, 1, queries, keys)
    future = ~torch.ones(queries, keys, dtype=torch.bool, device=key_pad.device).tril()
    masked = key_pad[:, None, :] | future  # (B, T, T)
    return (masked & ~masked.all(dim=2, keepdim=True)).unsqueeze(1)


def make_problem(attention, batch, length, heads, head_dim, dtype, device, generator, left=False):
    """A :class:`Problem` of ``attention`` for ``batch`` sentences of at most ``length`` tokens (source and
    target lengths drawn apart, uniformly from [LOW * length, length], the first ``length``), values drawn
    from ``generator`` (a CPU ``torch.Generator``) in float32, then moved to ``device`` and ``dtype``.
    ``left``: padding at the start (a deliberate error for the tests: OpenNMT-py pads at the end)."""
    import torch

    def lengths():
        drawn = torch.randint(max(1, int(LOW * length)), length + 1, (batch,), generator=generator)
        drawn[0] = length
        return drawn

    source, target = lengths(), lengths()
    query_lengths = source if attention == "encoder self" else target
    key_lengths = target if attention == "decoder self" else source
    query_pad, key_pad = (padding(lengths, length, left).to(device) for lengths in (query_lengths, key_lengths))

    def leaf(size):
        return torch.randn(size, generator=generator).to(device, dtype).requires_grad_()

    q, k, v = (leaf((batch, length, heads, head_dim)) for _ in range(3))
    grad = torch.randn(batch, heads, length, head_dim, generator=generator)
    grad = grad.to(device, dtype).masked_fill(query_pad[:, None, :, None], 0)
    return Problem(q, k, v, opennmt_mask(attention, query_pad, key_pad), key_pad[:, None, None, :], ~query_pad, grad)


def sub_problem(problem, batch, length):
    """``problem``'s first ``batch`` sentences cut to ``length`` positions, copied on its device into fresh
    contiguous leaves: a right-padded batch of another shape, made without drawing new values on the host."""
    def cut(tensor, *positions):  # sentences on dimension 0, positions on ``positions``
        index = [slice(None)] * tensor.dim()
        index[0] = slice(batch)
        for dim in positions:
            index[dim] = slice(length)
        return tensor[tuple(index)]

    q, k, v = (cut(tensor, 1).detach().clone().requires_grad_() for tensor in problem[:3])
    return Problem(q, k, v, cut(problem.mask, 2, 3), cut(problem.keys, 3), cut(problem.rows, 1),
                   cut(problem.grad, 2).contiguous())


def kernel(variant):
    """The context that selects ``variant``'s backends: stock's as onmt-ext gives them to OpenNMT-py's call."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from onmt_ext.runtime.compat import opennmt_sdp_kernel

    if variant.backends is None:
        return opennmt_sdp_kernel(**STOCK_KERNEL)
    return sdpa_kernel([getattr(SDPBackend, name) for name in variant.backends])


def attend(variant, problem, dropout):
    """``variant``'s ``scaled_dot_product_attention`` call on ``problem``: (B, H, Lq, D)."""
    import torch

    q, k, v = (tensor.transpose(1, 2) for tensor in problem[:3])
    mask = {"opennmt": problem.mask, "keys": problem.keys, None: None}[variant.mask]
    with kernel(variant):
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, None if mask is None else ~mask, dropout, is_causal=variant.causal)


def forward_backward(variant, problem, dropout):
    """One forward+backward call: the output (B, H, Lq, D) and the gradients of q, k, v (as ``problem``'s)."""
    import torch

    out = attend(variant, problem, dropout)
    return out, torch.autograd.grad(out, problem[:3], problem.grad)


def differences(problem, result, reference):
    """Max abs differences of ``result`` from ``reference`` (two :func:`forward_backward` results on
    ``problem``): ``out`` on the non-padding query rows, ``dq``, ``dk``, ``dv`` everywhere, as floats."""
    (out, grads), (ref_out, ref_grads), rows = result, reference, problem.rows

    def largest(a, b):
        return (a.float() - b.float()).abs().max().item()

    found = {"out": largest(out.transpose(1, 2)[rows], ref_out.transpose(1, 2)[rows])}
    found.update({name: largest(a, b) for name, a, b in zip(("dq", "dk", "dv"), grads, ref_grads)})
    return found


def timed_ms(run, warmup, repeats, cuda):
    """Median milliseconds of ``repeats`` calls of ``run`` after ``warmup`` calls: each between two CUDA events
    (``cuda``) or two ``time.perf_counter`` readings."""
    import torch

    for _ in range(warmup):
        run()
    if not cuda:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            times.append(1000 * (time.perf_counter() - start))
        return statistics.median(times)
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    for start, end in events:
        start.record()
        run()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def wall_ms(run, cuda):
    """Milliseconds of one call of ``run`` by the host's clock, the device idle before and finished after: what a
    call costs with its host work (a backend's plan for a new shape) included."""
    import torch

    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    run()
    if cuda:
        torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - start)


def fresh_shapes(batch, length, seen):
    """Shapes ``(b, l)`` not in ``seen`` (a set, to which each is added as it is given), the nearest to
    ``(batch, length)`` first: ``l`` from ``length`` down, and for each ``b`` from ``batch`` down, so that the
    first many have about as many tokens as the shape measured."""
    for shape in ((b, n) for n in range(length, 0, -1) for b in range(batch, 0, -1)):
        if shape not in seen:
            seen.add(shape)
            yield shape


def _failure(error, when=""):
    """``not supported<when>: <the first line of error's message>`` (its class name when it has none)."""
    return f"not supported{when}: {(str(error).strip().splitlines() or [type(error).__name__])[0]}"


def measure(variant, problem, args, reference, fresh=tuple):
    """``(row, result)`` of ``variant`` on ``problem``: ``ms`` (the median forward+backward call at
    ``args.dropout``), ``new_shape_ms`` (the median :func:`wall_ms` of one call on each of the problems
    ``fresh()`` gives, whose shapes no call has had before), ``agreement`` with ``reference`` (stock's
    :func:`forward_backward` result at dropout 0, or None) or the ``reason`` it could not run, and
    ``torch_warnings`` (torch's reasons for refusing a backend, each once); ``result``: its own
    :func:`forward_backward` result at dropout 0, or None."""
    row = {"variant": variant.name, "backends": variant.backends or "stock", "mask": variant.mask,
           "is_causal": variant.causal, "floor": variant.floor, "ms": None, "new_shape_ms": None, "new_shapes": [],
           "agreement": None, "reason": None}
    result = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:  # every failure is a row, never a crash
            result = forward_backward(variant, problem, 0.0)
        except Exception as error:
            row["reason"] = _failure(error)
        if result is not None:
            if reference is not None:
                row["agreement"] = differences(problem, result, reference)
            try:
                row["ms"] = timed_ms(lambda: forward_backward(variant, problem, args.dropout), args.warmup,
                                     args.repeats, args.device == "cuda")
            except Exception as error:  # a backend that refuses dropout (the CPU's flash attention)
                row["reason"] = _failure(error, f" at dropout {args.dropout}")
        if row["ms"] is not None:
            times = []
            try:
                for other in fresh():
                    row["new_shapes"].append(f"{other.q.size(0)}x{other.q.size(1)}")
                    times.append(wall_ms(lambda: forward_backward(variant, other, args.dropout),
                                         args.device == "cuda"))
                row["new_shape_ms"] = statistics.median(times) if times else None
            except Exception as error:
                row["reason"] = _failure(error, " at a new shape")
    said = (str(w.message).split(" (Triggered internally")[0].strip() for w in caught)
    row["torch_warnings"] = [text for text in dict.fromkeys(said) if text]
    return row, result


def rows_of(args, measured=lambda rows: None):
    """Every (shape, attention, variant) row, each attention's stock first; ratio over stock filled in.
    ``measured(rows)`` after each attention of each shape, with the rows so far."""
    import torch

    dtype = getattr(torch, args.dtype)
    rows, seen = [], set(args.shapes)
    for batch, length in args.shapes:
        unseen = fresh_shapes(batch, length, seen)
        for attention in ATTENTIONS:
            generator = torch.Generator().manual_seed(args.seed)
            problem = make_problem(attention, batch, length, args.heads, args.d_model // args.heads, dtype,
                                   args.device, generator)
            reference, stock_ms = None, None

            def fresh():  # the next --new-shapes shapes that no call of this run has had
                return (sub_problem(problem, b, n) for b, n in itertools.islice(unseen, args.new_shapes))

            for variant in (v for v in VARIANTS if v.attention == attention):
                row, result = measure(variant, problem, args, reference, fresh)
                if variant.name == "stock":
                    reference, stock_ms = result, row["ms"]
                row.update(shape=f"{batch}x{length}", batch=batch, length=length, attention=attention,
                           query_tokens=int(problem.rows.sum()),
                           ratio=row["ms"] / stock_ms if row["ms"] is not None and stock_ms else None)
                rows.append(row)
            del problem
            if args.device == "cuda":
                torch.cuda.empty_cache()
            measured(rows)
    return rows


def markdown(report):
    """The report as markdown: the machine, the settings, which attentions of which shapes are not measured yet
    (a run stopped early, or its report written after each attention), and one table row per measured variant."""
    where, setting = report["machine"], report["setting"]
    lines = [f"# Attention kernels, forward+backward of one call ({where['name']})", "",
             f"torch {where['torch']} (CUDA {where['cuda']}, cuDNN {where.get('cudnn')}); {setting['dtype']}, "
             f"d_model {setting['d_model']}, {setting['heads']} heads of {setting['head_dim']}, dropout "
             f"{setting['dropout']} in the timed calls; median of {setting['repeats']} calls after "
             f"{setting['warmup']} warm-up calls ({setting['timer']}); lengths uniform in [{LOW} L, L], padded at "
             f"the end.  New shape: the median host-clock time of one call at each of {setting['new_shapes']} "
             f"shapes no call had before (a backend's per-shape plan included; training's batches vary in "
             f"shape).  Differences: max abs from stock at dropout 0, the output on non-padding query rows, the "
             f"gradients with no upstream gradient on padding rows.  Floor rows ignore key padding: their "
             f"differences are expected.", ""]
    done = {(row["shape"], row["attention"]) for row in report["rows"]}
    left = [f"{shape} {attention}" for shape in setting["shapes"] for attention in ATTENTIONS
            if (shape, attention) not in done]
    if left:
        lines += [f"**Partial:** {len(done)} of {len(done) + len(left)} attentions measured (the run stopped early "
                  f"or is still running); not measured: {', '.join(left)}.", ""]
    lines += ["| shape | attention | variant | ms | over stock | new shape ms | out | dq | dk | dv |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in report["rows"]:
        why = next((text for text in row["torch_warnings"] if not text.endswith(":")), None)
        timing = (row["reason"] + (f" (torch: {why})" if why else "") if row["reason"]
                  else common.fmt(row["ms"], 3))
        agreement = [common.fmt((row["agreement"] or {}).get(name), 6) if row["variant"] != "stock" else "-"
                     for name in ("out", "dq", "dk", "dv")]
        lines.append(f"| {row['shape']} | {row['attention']} | {row['variant']} | {timing} | "
                     f"{common.fmt(row['ratio'])} | {common.fmt(row['new_shape_ms'], 3)} | {' | '.join(agreement)} |")
    return "\n".join(lines) + "\n"


def parse_args(argv):
    """The options; ``--tiny`` replaces the shapes, width, heads, warm-up and timed calls with :data:`TINY`."""
    parser = common.Parser(prog="attention_bench.py", description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", type=shape, nargs="+", default=list(SHAPES), metavar="BxL",
                        help="sentences x longest length (default: 1024x32 256x128)")
    parser.add_argument("--d-model", type=common.at_least(1), default=512)
    parser.add_argument("--heads", type=common.at_least(1), default=8)
    parser.add_argument("--dropout", type=float, default=0.1, help="attention dropout of the timed calls (Base's)")
    parser.add_argument("--new-shapes", type=common.at_least(0), default=4,
                        help="calls at shapes not seen before, per variant (their median host-clock ms)")
    common.add_bench_options(parser, DTYPES, TINY, warmup=10, repeats=50)
    args = common.parse_bench_args(parser, argv, TINY)
    if args.d_model % args.heads:
        parser.error(f"--d-model {args.d_model} is not a multiple of --heads {args.heads}")
    return args


def main(argv=None):
    args = parse_args(argv)
    setting = {"shapes": [f"{b}x{n}" for b, n in args.shapes], "d_model": args.d_model, "heads": args.heads,
               "head_dim": args.d_model // args.heads, "dtype": args.dtype, "dropout": args.dropout,
               "warmup": args.warmup, "repeats": args.repeats, "new_shapes": args.new_shapes, "seed": args.seed,
               "device": args.device,
               "lengths": f"uniform in [{LOW} L, L], padded at the end", "tiny": args.tiny,
               "timer": "CUDA events" if args.device == "cuda" else "time.perf_counter"}

    def so_far(rows):  # a device call cut short keeps the attentions it measured
        if args.out and len(rows) < len(args.shapes) * len(VARIANTS):
            report = common.bench_report(args, setting, rows)
            common.write_outputs(args.out, report, markdown(report))

    return common.publish_bench(args, setting, rows_of(args, so_far), markdown)


if __name__ == "__main__":
    raise SystemExit(main())
