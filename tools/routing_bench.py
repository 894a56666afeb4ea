#!/usr/bin/env python
"""Forward+backward milliseconds and peak memory of li2019's routing: the fused kernels against the PyTorch core.

Usage::

    python -m tools.routing_bench [--shapes base big] [--methods em simple] [--problems 32768] [--iterations 3]
        [--dtype float16|bfloat16|float32] [--warmup 2] [--repeats 5] [--seed 0] [--device cuda|cpu] [--tiny]
        [--out PATH]

One routing of li2019's head aggregation a row (:data:`SHAPES`: Base and Big), EM or simple, each variant
(:data:`VARIANTS`: ``ONMT_EXT_ROUTING_KERNEL`` torch and triton) forward and backward: median milliseconds, peak
memory above the inputs, warm-up seconds, and for the kernels their speed-up over the reference and their
largest differences from it.  A variant out of memory is a row that says so.  ``--tiny``: the CPU's dry run
(Triton's interpreter).  Writes PATH.json and PATH.md with ``--out``.  Method: docs/tools.md (routing_bench.py).
"""

import contextlib
import os
import time

from tools import common
from tools.attention_bench import timed_ms

#: li2019's routed head aggregation, ``(I, O, D)`` = (heads, capsules N, d_model / N), at the paper's two sizes
SHAPES = {"base": (8, 512, 1), "big": (16, 1024, 1)}
METHODS = ("em", "simple")
#: each variant's ONMT_EXT_ROUTING_KERNEL (docs/kernels.md)
VARIANTS = {"PyTorch (reference)": "torch", "fused kernels": "triton"}
#: ``--tiny``: problems, warm-up and timed calls (the kernels run in Triton's interpreter)
TINY = {"problems": 4, "warmup": 1, "repeats": 2}
DTYPES = ("float16", "bfloat16", "float32")


@contextlib.contextmanager
def routing_kernel(choice):
    """``ONMT_EXT_ROUTING_KERNEL=choice`` inside the block, as it was after."""
    from onmt_ext.mechanisms.routing import KERNEL_VARIABLE

    before = os.environ.get(KERNEL_VARIABLE)
    os.environ[KERNEL_VARIABLE] = choice
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(KERNEL_VARIABLE, None)
        else:
            os.environ[KERNEL_VARIABLE] = before


def make_problem(shape, method, problems, dtype, device, seed):
    """The votes ``(P, I, O, D)``, EM's betas (``(O,)``, float32, as li2019 learns them) and the output's
    gradient ``(P, O, D)``, drawn from ``seed``."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    n_in, n_out, n_dim = shape
    votes = torch.randn(problems, n_in, n_out, n_dim, generator=generator).to(device=device, dtype=dtype)
    betas = [0.1 * torch.randn(n_out, generator=generator).to(device) for _ in range(2)] if method == "em" else []
    grad = torch.randn(problems, n_out, n_dim, generator=generator).to(device=device, dtype=dtype)
    return votes, betas, grad


def route(method, votes, betas, iterations):
    """li2019's routing call (onmt_ext.mechanisms.li2019._aggregate_heads): its output ``(P, O, D)``."""
    from onmt_ext.mechanisms.routing import em_routing, simple_routing

    if method == "em":
        return em_routing(votes, iterations, beta_a=betas[0], beta_u=betas[1])[0]
    return simple_routing(votes, iterations, normalize="outputs", weighted_mean=True, need_logits=False)[0]


def forward_backward(method, problem, iterations):
    """One forward and backward pass; returns the output and the votes' gradient (detached)."""
    votes, betas, grad = problem
    votes = votes.detach().requires_grad_()
    betas = [beta.detach().requires_grad_() for beta in betas]
    out = route(method, votes, betas, iterations)
    out.backward(grad)
    return out.detach(), votes.grad


def relative_difference(value, reference):
    """``max |value - reference| / max |reference|``, in float64."""
    reference = reference.double()
    return float((value.double() - reference).abs().max() / reference.abs().max().clamp_min(1e-30))


def measure(method, problem, args, choice):
    """``(result, outputs)`` of one variant: ``ms``, ``peak_mb`` and ``warmup_s``, or ``failed``; ``outputs``
    (the output and the votes' gradient of one more call) for the agreement, or None."""
    import torch

    cuda = args.device == "cuda"
    with routing_kernel(choice):
        try:
            start = time.perf_counter()
            for _ in range(args.warmup):
                forward_backward(method, problem, args.iterations)
            if cuda:
                torch.cuda.synchronize()
            warmup_s = time.perf_counter() - start
            if cuda:
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            outputs = forward_backward(method, problem, args.iterations)
            peak_mb = (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else None
            ms = timed_ms(lambda: forward_backward(method, problem, args.iterations), 0, args.repeats, cuda)
        except torch.cuda.OutOfMemoryError as error:
            return {"failed": f"out of memory: {str(error).splitlines()[0]}"}, None
    return {"ms": ms, "peak_mb": peak_mb, "warmup_s": warmup_s}, outputs


def rows_of(args):
    """One row per (shape, method, variant), the kernels' with their ratio and agreement."""
    import torch

    dtype = getattr(torch, args.dtype)
    rows = []
    for shape_name in args.shapes:
        shape = SHAPES[shape_name]
        for method in args.methods:
            problem = make_problem(shape, method, args.problems, dtype, args.device, args.seed)
            results = {}
            for name, choice in VARIANTS.items():
                result, outputs = measure(method, problem, args, choice)
                results[choice] = (result, outputs)
                row = {"shape": shape_name, "votes": list(shape), "method": method, "variant": name, **result}
                reference, expected = results["torch"]
                if choice == "triton" and "ms" in result and "ms" in reference:
                    row.update(speedup=reference["ms"] / result["ms"],
                               output_difference=relative_difference(outputs[0], expected[0]),
                               gradient_difference=relative_difference(outputs[1], expected[1]))
                rows.append(row)
                print(f"  {shape_name} {method} {name}: " + (result.get("failed") or f"{result['ms']:.2f} ms"),
                      flush=True)
            del problem, results
            if args.device == "cuda":
                torch.cuda.empty_cache()
    return rows


def _cell(row, key, form):
    return form.format(row[key]) if row.get(key) is not None else "—"


def markdown(report):
    """The report as a Markdown page: the setting, then one table row per measured variant."""
    setting, machine = report["setting"], report["machine"]
    lines = [f"# li2019's routing, fused kernels against the PyTorch core: {machine['name']}", "",
             f"torch {machine['torch']}, CUDA {machine['cuda']}, Python {machine['python']}; {setting['problems']:,} "
             f"problems (positions) per call, T = {setting['iterations']}, {setting['dtype']} votes, forward and "
             f"backward; median of {setting['repeats']} calls after {setting['warmup']} ({setting['timer']}). Peak "
             "MB: above the inputs, one call. Differences: the largest, over the reference's largest value.", "",
             "| shape (I, O, D) | method | variant | ms | kernels' speed-up | peak MB | warm-up s | output diff. | "
             "gradient diff. |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for row in report["rows"]:
        shape = f"{row['shape']} ({', '.join(map(str, row['votes']))})"
        if "failed" in row:
            lines.append(f"| {shape} | {row['method']} | {row['variant']} | {row['failed']} | | | | | |")
            continue
        lines.append(f"| {shape} | {row['method']} | {row['variant']} | {row['ms']:.2f} | "
                     f"{_cell(row, 'speedup', '{:.2f}')} | {_cell(row, 'peak_mb', '{:,.0f}')} | "
                     f"{row['warmup_s']:.1f} | {_cell(row, 'output_difference', '{:.1e}')} | "
                     f"{_cell(row, 'gradient_difference', '{:.1e}')} |")
    return "\n".join(lines) + "\n"


def parse_args(argv):
    """The options; ``--tiny`` replaces the problems, warm-up and timed calls with :data:`TINY`."""
    parser = common.Parser(prog="routing_bench.py", description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=list(SHAPES))
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--problems", type=common.at_least(1), default=32768,
                        help="positions routed per call (default 32768: a 32k-token batch, one attention)")
    parser.add_argument("--iterations", type=common.at_least(1), default=3)
    common.add_bench_options(parser, DTYPES, TINY, warmup=2, repeats=5)
    return common.parse_bench_args(parser, argv, TINY)


def main(argv=None):
    args = parse_args(argv)
    if args.device == "cpu":  # the kernels on the CPU: Triton's interpreter, before Triton is first imported
        os.environ.setdefault("TRITON_INTERPRET", "1")
    setting = {"shapes": args.shapes, "methods": args.methods, "problems": args.problems,
               "iterations": args.iterations, "dtype": args.dtype, "warmup": args.warmup, "repeats": args.repeats,
               "seed": args.seed, "device": args.device, "tiny": args.tiny,
               "timer": "CUDA events" if args.device == "cuda" else "time.perf_counter"}
    return common.publish_bench(args, setting, rows_of(args), markdown)


if __name__ == "__main__":
    raise SystemExit(main())
