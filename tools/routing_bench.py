#!/usr/bin/env python
"""Forward+backward milliseconds and peak memory of the routing: the fused kernels against the PyTorch core.

Usage::

    python -m tools.routing_bench [--cases li2019-base-em ... gret] [--problems 32768] [--iterations 3]
        [--warps 8 32] [--dtype float16|bfloat16|float32] [--warmup 2] [--repeats 5] [--seed 0]
        [--device cuda|cpu] [--tiny] [--out PATH]

One routing a row (:data:`CASES`: li2019's head aggregation at Base and Big, EM or simple; cao2019's cross
aggregation; GRET's capsules), each variant (:data:`VARIANTS`: ``ONMT_EXT_ROUTING_KERNEL`` torch and triton) forward and
backward: median milliseconds (and of the forward pass alone), peak memory above the inputs, warm-up seconds, and
for the kernels their speed-up over the reference and their largest differences from it.  ``--warps``: more
kernel rows, each with every program at that many warps.  A variant out of memory is a row that says so.
``--tiny``: the CPU's dry run (Triton's interpreter).  Writes PATH.json and PATH.md with ``--out``, again after
each case.  Method: docs/tools.md (routing_bench.py).
"""

import collections
import contextlib
import os
import sys
import time
import warnings
from unittest import mock

import torch

from tools import common
from tools.attention_bench import timed_ms

#: one case's inputs: ``tensors`` (the gradient is taken for each), ``fixed`` (other arguments), and the output's
#: upstream gradient
Problem = collections.namedtuple("Problem", "tensors fixed grad")
#: a routing to time: ``what`` its first input is (the report puts its shape first), ``make(problems, dtype,
#: device, generator)`` its :class:`Problem`, ``run(*tensors, *fixed, iterations)`` its output
Case = collections.namedtuple("Case", "what make run")
#: cao2019's sentences: this many positions each (fewer if there are fewer problems), ``problems // length`` of them
CAO2019_LENGTH = 32
#: ``--tiny``: problems, warm-up and timed calls (the kernels run in Triton's interpreter)
TINY = {"problems": 8, "warmup": 1, "repeats": 2}
DTYPES = ("float16", "bfloat16", "float32")


def _li2019(n_in, n_out, n_dim, method):
    """li2019's head aggregation: ``(I, O, D)`` = (heads, capsules N, d_model / N) per position; EM with its
    learned ``beta_a``/``beta_u`` (drawn small, float32), or simple routing with li2019's weighted mean."""

    def make(problems, dtype, device, generator):
        votes = torch.randn(problems, n_in, n_out, n_dim, generator=generator).to(device=device, dtype=dtype)
        betas = [0.1 * torch.randn(n_out, generator=generator).to(device) for _ in range(2)] if method == "em" else []
        grad = torch.randn(problems, n_out, n_dim, generator=generator).to(device=device, dtype=dtype)
        return Problem([votes, *betas], [], grad)

    def run(votes, *betas, iterations):
        from onmt_ext.mechanisms.routing import em_routing, simple_routing

        if method == "em":
            return em_routing(votes, iterations, beta_a=betas[0], beta_u=betas[1])[0]
        return simple_routing(votes, iterations, normalize="outputs", weighted_mean=True, need_logits=False)[0]

    return Case(f"votes, {method}", make, run)


def _sentences(problems, generator):
    """``(B, L)`` bool, True at the real tokens of ``B = problems // L`` right-padded sentences of ``L`` =
    :data:`CAO2019_LENGTH` positions (fewer in a dry run: one sentence as long as its positions), of lengths
    uniform in [L/2, L], the first L long."""
    length = min(CAO2019_LENGTH, problems)
    batch = max(1, problems // length)
    lengths = torch.randint(length // 2, length + 1, (batch,), generator=generator)
    lengths[0] = length
    return torch.arange(length)[None, :] < lengths[:, None]


def _cao2019():
    """cao2019's cross aggregation of one self-attention (vertical and horizontal routing, self-initialised):
    masked scores ``(B, 8, L, L)`` of ``B`` right-padded sentences of lengths uniform in [L/2, L]."""

    def make(problems, dtype, device, generator):
        keep = _sentences(problems, generator)  # (B, L) keys
        batch, length = keep.shape
        scores = torch.randn(batch, 8, length, length, generator=generator).masked_fill(~keep[:, None, None], -1e18)
        weight = torch.randn(8, 8, generator=generator)
        grad = torch.randn(batch, 8, length, length, generator=generator)
        return Problem([scores.to(device=device, dtype=dtype), weight.to(device)], [],
                       grad.to(device=device, dtype=dtype))

    def run(scores, weight, iterations):
        from onmt_ext.mechanisms.cao2019 import cross_aggregate

        return cross_aggregate(scores, weight, True, "self", iterations)

    return Case("masked scores (sentences, heads, L, L)", make, run)


def _gret(layers=6, capsules=4, capsule_dim=128):
    """GRET's sentence capsules (gret.global_representation): each of ``layers`` layers' states of each sentence
    vote for ``capsules`` capsules of ``capsule_dim`` values, simple routing over the sentence's real tokens
    (normalised over the inputs), sentences as cao2019's."""

    def make(problems, dtype, device, generator):
        keep = _sentences(problems, generator)
        batch, length = keep.shape
        keep = keep.expand(layers, batch, length)
        votes = torch.randn(layers, batch, length, capsules, capsule_dim, generator=generator)
        grad = torch.randn(layers, batch, capsules, capsule_dim, generator=generator)
        return Problem([votes.to(device=device, dtype=dtype)], [keep.to(device)], grad.to(device=device, dtype=dtype))

    def run(votes, keep, iterations):
        from onmt_ext.mechanisms.routing import simple_routing

        return simple_routing(votes, iterations, normalize="inputs", mask=keep, need_logits=False)[0]

    return Case("votes (layers, sentences, L, K, d_c)", make, run)


#: li2019 at the paper's two sizes; cao2019 and GRET, whose problems grow with the sentence
CASES = {"li2019-base-em": _li2019(8, 512, 1, "em"), "li2019-base-simple": _li2019(8, 512, 1, "simple"),
         "li2019-big-em": _li2019(16, 1024, 1, "em"), "li2019-big-simple": _li2019(16, 1024, 1, "simple"),
         "cao2019": _cao2019(), "gret": _gret()}
#: each variant's ONMT_EXT_ROUTING_KERNEL (docs/kernels.md)
VARIANTS = {"PyTorch (reference)": "torch", "fused kernels": "triton"}
#: ``--warps``' choices: warps per program (Hopper allows up to 32, 1,024 threads)
WARPS = (1, 2, 4, 8, 16, 32)


def routing_kernel(choice):
    """``ONMT_EXT_ROUTING_KERNEL=choice`` inside the block, the environment as it was after."""
    from onmt_ext.mechanisms.routing import KERNEL_VARIABLE

    return mock.patch.dict(os.environ, {KERNEL_VARIABLE: choice})


def forced_warps(warps, asked):
    """Inside the block every routing kernel launches at ``warps`` warps per program instead of the launcher's
    choice; ``asked[warps]`` counts the launches that took it."""
    from onmt_ext.mechanisms import routing_triton

    def chosen(blocks):
        asked[warps] += 1
        return warps

    return mock.patch.object(routing_triton, "_warps", chosen)


def forward_backward(case, problem, iterations, backward=True):
    """One forward and backward pass; returns the output and the first input's gradient (detached).  Without
    ``backward`` the forward pass alone, as training runs it (the inputs requiring their gradient)."""
    tensors = [tensor.detach().requires_grad_() for tensor in problem.tensors]
    out = case.run(*tensors, *problem.fixed, iterations=iterations)
    if not backward:
        return None
    out.backward(problem.grad)
    return out.detach(), tensors[0].grad


def relative_difference(value, reference):
    """``max |value - reference| / max |reference|``, in float64."""
    reference = reference.double()
    return float((value.double() - reference).abs().max() / reference.abs().max().clamp_min(1e-30))


def measure(case, problem, args, choice, warps=None):
    """``(result, outputs)`` of one variant: ``ms``, ``forward_ms``, ``peak_mb`` and ``warmup_s``, or ``failed``;
    ``outputs`` (the output and the first input's gradient of one more call) for the agreement, or None.
    ``warps``: the kernels' warps per program (:func:`forced_warps`; the result's ``warps_launches`` counts the
    launches that took it), None for the launcher's choice."""
    cuda = args.device == "cuda"
    asked = collections.Counter()
    forced = forced_warps(warps, asked) if warps else contextlib.nullcontext()
    with routing_kernel(choice), forced, warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        launched = _launches()
        try:
            start = time.perf_counter()
            for _ in range(args.warmup):
                forward_backward(case, problem, args.iterations)
            if cuda:
                torch.cuda.synchronize()
            warmup_s = time.perf_counter() - start
            if cuda:
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            outputs = forward_backward(case, problem, args.iterations)
            peak_mb = (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else None
            ms = timed_ms(lambda: forward_backward(case, problem, args.iterations), 0, args.repeats, cuda)
            forward_ms = timed_ms(lambda: forward_backward(case, problem, args.iterations, backward=False), 0,
                                  args.repeats, cuda)
        except torch.cuda.OutOfMemoryError as error:
            return {"failed": f"out of memory: {str(error).splitlines()[0]}"}, None
        except Exception as error:  # the kernels do not build or launch at this setting (as --warps may ask)
            if choice != "triton":
                raise
            return {"failed": f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"}, None
    if choice == "triton" and _launches() == launched:  # fell back to PyTorch: the row would time the reference
        said = "; ".join(dict.fromkeys(str(warning.message) for warning in warned
                                       if "onmt-ext" in str(warning.message)))
        return {"failed": "the kernels did not run" + (f": {said}" if said else "")}, None
    result = {"ms": ms, "forward_ms": forward_ms, "peak_mb": peak_mb, "warmup_s": warmup_s}
    return (dict(result, warps=warps, warps_launches=asked[warps]) if warps else result), outputs


def _launches():
    """How many fused routing kernels this process has launched (0 before their module is imported)."""
    kernels = sys.modules.get("onmt_ext.mechanisms.routing_triton")
    return sum(kernels.LAUNCHES.values()) if kernels is not None else 0


def variants(args):
    """``(name, ONMT_EXT_ROUTING_KERNEL, warps or None)`` of each row of a case: :data:`VARIANTS`, then the
    kernels at each of ``--warps``."""
    return ([(name, choice, None) for name, choice in VARIANTS.items()]
            + [(f"fused kernels, {warps} warps", "triton", warps) for warps in args.warps])


def rows_of(args, measured=lambda rows: None):
    """One row per (case, variant), the kernels' with their ratio and agreement; ``measured(rows)`` after each
    case, with the rows so far."""
    dtype = getattr(torch, args.dtype)
    rows = []
    for name in args.cases:
        case = CASES[name]
        problem = case.make(args.problems, dtype, args.device, torch.Generator().manual_seed(args.seed))
        results = {}
        for variant, choice, warps in variants(args):
            result, outputs = measure(case, problem, args, choice, warps)
            results.setdefault(choice, (result, outputs))
            routes = f"({', '.join(map(str, problem.tensors[0].shape))}) {case.what}"
            row = {"case": name, "routes": routes, "variant": variant, **result}
            reference, expected = results["torch"]
            if choice == "triton" and "ms" in result and "ms" in reference:
                row.update(speedup=reference["ms"] / result["ms"],
                           output_difference=relative_difference(outputs[0], expected[0]),
                           gradient_difference=relative_difference(outputs[1], expected[1]))
            rows.append(row)
            print(f"  {name} {variant}: " + (result.get("failed") or f"{result['ms']:.2f} ms"), flush=True)
        del problem, results
        if args.device == "cuda":
            torch.cuda.empty_cache()
        measured(rows)
    return rows


def _cell(row, key, form):
    return form.format(row[key]) if row.get(key) is not None else "—"


def markdown(report):
    """The report as a Markdown page: the setting, then one table row per measured variant."""
    setting, machine = report["setting"], report["machine"]
    lines = [f"# The routing, fused kernels against the PyTorch core: {machine['name']}", "",
             f"torch {machine['torch']}, CUDA {machine['cuda']}, Python {machine['python']}; {setting['problems']:,} "
             f"positions per call, T = {setting['iterations']}, {setting['dtype']} inputs, forward and backward; "
             f"median of {setting['repeats']} calls after {setting['warmup']} ({setting['timer']}). Peak MB: above "
             "the inputs, one call. Differences: the largest, over the reference's largest value. Forward ms: the "
             "forward pass alone.", ""]
    done = list(dict.fromkeys(row["case"] for row in report["rows"]))
    left = [case for case in setting["cases"] if case not in done]
    if left:
        lines += [f"**Partial:** {len(done)} of {len(setting['cases'])} cases measured (the run stopped early or "
                  f"is still running); not measured: {', '.join(left)}.", ""]
    lines += ["| case | routes | variant | ms | forward ms | kernels' speed-up | peak MB | warm-up s | output diff. | "
              "gradient diff. |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in report["rows"]:
        if "failed" in row:
            lines.append(f"| {row['case']} | {row['routes']} | {row['variant']} | {row['failed']} | | | | | | |")
            continue
        lines.append(f"| {row['case']} | {row['routes']} | {row['variant']} | {row['ms']:.2f} | "
                     f"{row['forward_ms']:.2f} | {_cell(row, 'speedup', '{:.2f}')} | "
                     f"{_cell(row, 'peak_mb', '{:,.0f}')} | "
                     f"{row['warmup_s']:.1f} | {_cell(row, 'output_difference', '{:.1e}')} | "
                     f"{_cell(row, 'gradient_difference', '{:.1e}')} |")
    return "\n".join(lines) + "\n"


def parse_args(argv):
    """The options; ``--tiny`` replaces the problems, warm-up and timed calls with :data:`TINY`."""
    parser = common.Parser(prog="routing_bench.py", description=__doc__.split("\n")[0])
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--problems", type=common.at_least(1), default=32768,
                        help="positions per call (default 32768: a 32k-token batch, one attention)")
    parser.add_argument("--iterations", type=common.at_least(1), default=3)
    parser.add_argument("--warps", nargs="+", type=int, choices=WARPS, default=[],
                        help="also time the kernels with every program at each of these warps (default: only the "
                             "launcher's choice)")
    common.add_bench_options(parser, DTYPES, TINY, warmup=2, repeats=5)
    return common.parse_bench_args(parser, argv, TINY)


def main(argv=None):
    args = parse_args(argv)
    if args.device == "cpu":  # the kernels on the CPU: Triton's interpreter, before Triton is first imported
        os.environ.setdefault("TRITON_INTERPRET", "1")
    setting = {"cases": args.cases, "problems": args.problems, "iterations": args.iterations, "warps": args.warps,
               "dtype": args.dtype, "warmup": args.warmup, "repeats": args.repeats, "seed": args.seed,
               "device": args.device, "tiny": args.tiny,
               "timer": "CUDA events" if args.device == "cuda" else "time.perf_counter"}

    def so_far(rows):  # a device call cut short keeps the cases it measured
        if args.out and len(rows) < len(args.cases) * len(variants(args)):
            report = common.bench_report(args, setting, rows)
            common.write_outputs(args.out, report, markdown(report))

    return common.publish_bench(args, setting, rows_of(args, so_far), markdown)


if __name__ == "__main__":
    raise SystemExit(main())
