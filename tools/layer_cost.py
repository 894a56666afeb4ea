#!/usr/bin/env python
"""Time and peak memory of one encoder layer's forward+backward pass as the sentence length grows.

Usage::

    python -m tools.layer_cost [--lengths 25 50 100 200] [--batch 8] [--d-model 512] [--heads 8]
        [--variants baseline cao2019 clause] [--repeats 3] [--processes 3] [--threads 1] [--gpu -1]

Each (variant, length) times one OpenNMT-py ``TransformerEncoderLayer`` (Transformer-Base sizes by default)
with the variant's mechanism in place (cao2019 cross aggregation, clause attention with ``CLAUSE_LEVELS`` levels
and a marker every ``CLAUSE_EVERY`` tokens, li2019 routing) on ``(batch, L, d)`` inputs in fresh child
processes, keeping the fastest, with the peak memory and the growth exponent of the cost in L.
Method: docs/benchmarks-method.md.
"""

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time

from tools import common


#: ``clause`` variant: one clause marker every this many tokens.
CLAUSE_EVERY = 6
CLAUSE_LEVELS = 6


def _clause_softmax(args, device):
    """Clause attention with its shared structure for ``(batch, L)`` inputs (see the module docstring)."""
    import torch

    from onmt_ext.mechanisms.clause.attention import ClauseAttention, ClauseStructure

    table = torch.tensor([0] + list(range(1, CLAUSE_LEVELS + 1)), device=device)  # id k > 0: a level-k marker
    structure = ClauseStructure(table, CLAUSE_LEVELS)
    positions = torch.arange(args.length, device=device)
    ids = torch.where(positions % CLAUSE_EVERY == CLAUSE_EVERY - 1,
                      1 + (positions // CLAUSE_EVERY) % CLAUSE_LEVELS, torch.zeros_like(positions))
    src = ids.expand(args.batch, -1).unsqueeze(-1)  # (batch, L, 1)
    pad = torch.zeros(args.batch, args.length, dtype=torch.bool, device=device)
    return ClauseAttention(structure, args.heads).to(device), lambda: structure.start(src, pad)


def child(args):
    import torch
    from onmt.encoders.transformer import TransformerEncoderLayer

    from onmt_ext.mechanisms.cao2019 import CrossAggregation

    device = torch.device(f"cuda:{args.gpu}" if args.gpu >= 0 else "cpu")
    torch.manual_seed(0)
    layer = TransformerEncoderLayer(args.d_model, args.heads, 4 * args.d_model, 0.0, 0.0).to(device)
    set_clauses = None
    if args.variant == "cao2019":
        layer.self_attn.softmax = CrossAggregation(args.heads, True, True, "zero", 3).to(device)
        layer.self_attn.self_attn_type = "scaled-dot"
    elif args.variant == "clause":
        layer.self_attn.softmax, set_clauses = _clause_softmax(args, device)
        layer.self_attn.self_attn_type = "scaled-dot"
    elif args.variant.startswith("li2019-"):
        from onmt_ext.mechanisms.li2019 import RoutingAggregation

        method = args.variant.split("-", 1)[1]
        layer.self_attn.final_linear = RoutingAggregation(args.heads, args.d_model, args.d_model, method).to(device)
    x = torch.randn(args.batch, args.length, args.d_model, device=device, requires_grad=True)
    mask = torch.zeros(args.batch, 1, 1, args.length, dtype=torch.bool, device=device)

    def run():
        if set_clauses is not None:
            set_clauses()
        layer(x, mask).sum().backward()
        if device.type == "cuda":
            torch.cuda.synchronize()

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    run()
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    peak = (torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda"
            else (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
    print(json.dumps({"seconds": statistics.median(times), "peak_mb": peak}))


def _exponents(lengths, values):
    """The slopes of log(value) against log(length) between successive lengths, as text (nan where a value is 0)."""
    return ", ".join(f"{math.log(values[i + 1] / values[i]) / math.log(lengths[i + 1] / lengths[i]):.2f}"
                     if values[i] > 0 and values[i + 1] > 0 else "nan" for i in range(len(lengths) - 1))


def main(argv=None):
    parser = common.Parser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[25, 50, 100, 200])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--variants", nargs="+",
                        choices=("baseline", "cao2019", "clause", "li2019-em", "li2019-simple"),
                        default=["baseline", "cao2019", "clause"])
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per process (their median)")
    parser.add_argument("--processes", type=int, default=3,
                        help="fresh processes per (variant, length); the fastest one is reported")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (0: torch's default)")
    parser.add_argument("--gpu", type=int, default=-1)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        import onmt  # noqa: F401  (onmt-ext's start-up hook)

        return child(args)
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {}))
    results = {}
    for variant in args.variants:
        for length in args.lengths:
            command = [sys.executable, "-m", "tools.layer_cost", "--child", "--variant", variant,
                       "--length", str(length), "--batch", str(args.batch), "--d-model", str(args.d_model),
                       "--heads", str(args.heads), "--repeats", str(args.repeats), "--gpu", str(args.gpu)]
            runs = []
            for _ in range(args.processes):
                done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
                if done.returncode:
                    raise SystemExit(f"layer_cost.py: {variant} at L={length} failed:\n{done.stderr[-2000:]}")
                runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            # the fastest process: whole processes are sometimes several times slower here (the host, not the code)
            results[variant, length] = min(runs, key=lambda run: run["seconds"])
    device = f"GPU {args.gpu}" if args.gpu >= 0 else f"CPU, {args.threads or chr(0x2013)} thread(s)"
    print(f"One encoder layer, d={args.d_model}, H={args.heads}, batch {args.batch}, forward+backward, "
          f"median of {args.repeats} passes, fastest of {args.processes} processes; device {device}.\n")
    print("| variant | L | time (ms) | peak memory (MB) |\n|---|---:|---:|---:|")
    for (variant, length), r in results.items():
        print(f"| {variant} | {length} | {1000 * r['seconds']:.1f} | {r['peak_mb']:.0f} |")
    print("\nGrowth exponents (slope of log cost against log L between successive lengths):\n")
    for variant in args.variants:
        in_time, in_memory = (_exponents(args.lengths, [results[variant, n][key] for n in args.lengths])
                              for key in ("seconds", "peak_mb"))
        print(f"- {variant}: time {in_time}; memory {in_memory}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
