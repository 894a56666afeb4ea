#!/usr/bin/env python
"""Compile the fused routing kernels for a CUDA GPU on a machine without one, and report what each uses.

Usage::

    python -m tools.kernel_resources [--arch 90] [--dtype fp16] [--shape 8 512 1] [--iterations 3] [--shared]
        [--json F]

Each kernel of ``onmt_ext.mechanisms.routing_triton`` (EM and simple routing, forward and backward, with and
without a mask; for a shape larger than one block, or ``--shared``, the chunked simple-routing kernels) goes
through Triton's whole compiler for ``sm_<arch>`` (Triton IR, LLVM, PTX, ``ptxas``) at the votes' ``(I, O, D)``
shape of one problem (li2019 at Base width by default), with the warps the launcher would give it; ptxas's
registers per thread and spilled bytes are printed.  No GPU runs anything: a compile error or heavy spilling
shows here first (docs/kernels.md).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # the compiled kernels, not the interpreter's

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from onmt_ext.mechanisms import routing_triton  # noqa: E402


def variants(dtype, iterations):
    """(name, kernel, argument types, constexpr values) of every kernel and its mask variant."""
    sizes = {"s_p": "i64", "s_i": "i64", "s_o": "i64", "s_d": "i64", "n_in": "i32", "n_out": "i32",
             "n_dim": "i32", "chi": "fp32", "min_var": "fp32", "V": f"*{dtype}"}
    half = f"*{dtype}"
    em = {**sizes, "Mask": "*i8", "BetaA": "*fp32", "BetaU": "*fp32", "Out": half, "Act": half, "GradOut": half,
          "GradAct": half, "GradVotes": half, "GradBetaA": "*fp32", "GradBetaU": "*fp32"}
    simple = {**sizes, "Mask": "*i8", "Init": "*fp32", "Out": half, "Logits": "*fp32", "GradOut": half,
              "GradLogits": "*fp32", "GradVotes": half, "GradInit": "*fp32"}
    betas = dict(HAS_BETA_A=True, HAS_BETA_U=True)
    plain = dict(INPUTS=False, WEIGHTED=True, HAS_INIT=False, Init=None, HAS_GRAD_LOGITS=False, GradLogits=None,
                 STORE_LOGITS=False, Logits=None, GradInit=None)
    routed = dict(INPUTS=True, WEIGHTED=False, HAS_INIT=True, HAS_GRAD_LOGITS=True, STORE_LOGITS=True)
    out = []
    for masked in (False, True):
        mask = dict(HAS_MASK=masked) if masked else dict(HAS_MASK=False, Mask=None)
        suffix = ", mask" if masked else ""
        out += [(f"EM forward{suffix}", routing_triton._em_forward, em, {**mask, **betas}),
                (f"EM backward{suffix}", routing_triton._em_backward, em, {**mask, **betas}),
                (f"simple forward{suffix}", routing_triton._simple_forward, simple,
                 {**mask, **(routed if masked else plain)}),
                (f"simple backward{suffix}", routing_triton._simple_backward, simple,
                 {**mask, **(routed if masked else plain)})]
    return [(name, kernel, types, {**constants, "ITERATIONS": iterations}) for name, kernel, types, constants in out]


def chunked_variants(dtype, iterations, shared):
    """(name, kernel, argument types, constexpr values) of the chunked simple-routing kernels (problems larger than
    one block): plain and with mask and starting logits, or, ``shared``, votes shared by the mask's problems."""
    half = f"*{dtype}"
    types = {"s_p": "i64", "s_i": "i64", "s_o": "i64", "s_d": "i64", "n_in": "i32", "n_out": "i32",
             "n_dim": "i32", "members": "i32", "V": half, "VKeep": "*i8", "Mask": "*i8", "Init": "*fp32",
             "Out": half, "Logits": "*fp32", "GradOut": half, "GradLogits": "*fp32", "GradVotes": half,
             "Partial": "*fp32", "GradInit": "*fp32"}
    plain = dict(INPUTS=False, WEIGHTED=True, HAS_INIT=False, Init=None, HAS_GRAD_LOGITS=False, GradLogits=None,
                 STORE_LOGITS=False, Logits=None, GradInit=None, HAS_MASK=False, Mask=None, SHARED=False,
                 VKeep=None)
    routed = dict(INPUTS=True, WEIGHTED=False, HAS_INIT=True, HAS_GRAD_LOGITS=True, STORE_LOGITS=True,
                  HAS_MASK=True, SHARED=shared, **({} if shared else {"VKeep": None}))
    settings = [(", shared votes", routed)] if shared else [("", plain), (", mask", routed)]
    out = []
    for suffix, constants in settings:
        for name, kernel in (("forward", routing_triton._chunked_forward),
                             ("backward", routing_triton._chunked_backward)):
            used = {key: value for key, value in {**constants, "ITERATIONS": iterations}.items()
                    if key in kernel.arg_names}
            out.append((f"chunked {name}{suffix}", kernel, types, used))
    return out


def compile_kernel(kernel, types, constants, blocks, arch):
    """Triton's compile of ``kernel`` for ``sm_<arch>``; returns the compiled kernel (its ``asm`` has the PTX)."""
    constants = {**constants, "BI": blocks[0], "BO": blocks[1], "BD": blocks[2]}
    signature = {}
    for name in kernel.arg_names:
        signature[name] = "constexpr" if name in constants else types[name]
    source = ASTSource(fn=kernel, signature=signature,
                       constexprs={name: value for name, value in constants.items() if name in kernel.arg_names})
    return triton.compile(source, target=GPUTarget("cuda", arch, 32),
                          options=dict(num_warps=routing_triton._warps(blocks)))


def ptxas_report(ptx, arch):
    """ptxas's registers per thread and spill stores/loads (bytes) for ``ptx``."""
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as handle:
        handle.write(ptx)
    gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
    result = subprocess.run([str(ptxas), "-v", f"--gpu-name={gpu}", handle.name, "-o", os.devnull],
                            capture_output=True, text=True, check=True)
    os.unlink(handle.name)
    text = result.stderr

    def number(pattern):
        found = re.search(pattern, text)
        return int(found.group(1)) if found else None

    return {"registers": number(r"Used (\d+) registers"), "spill_stores": number(r"(\d+) bytes spill stores"),
            "spill_loads": number(r"(\d+) bytes spill loads")}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability x10 (90: H100/H200)")
    parser.add_argument("--dtype", default="fp16", choices=["fp32", "fp16", "bf16"])
    parser.add_argument("--shape", type=int, nargs=3, default=[8, 512, 1], metavar=("I", "O", "D"))
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--shared", action="store_true",
                        help="votes shared by several problems (cao2019's horizontal routing; chunked kernels)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    blocks = tuple(triton.next_power_of_2(size) for size in args.shape)
    if args.shared or blocks[0] * blocks[1] * blocks[2] > routing_triton.MAX_BLOCK:
        if blocks[0] * blocks[1] > routing_triton.MAX_STATE:
            parser.error(f"--shape {' '.join(map(str, args.shape))}: an (I, O) state of {blocks[:2]} exceeds "
                         f"MAX_STATE {routing_triton.MAX_STATE}; the routing core keeps such problems in PyTorch")
        blocks = routing_triton._chunk_blocks(torch.empty(1, *args.shape))  # D read in chunks
        kernels = chunked_variants(args.dtype, args.iterations, args.shared)
    else:
        kernels = variants(args.dtype, args.iterations)
    print(f"sm_{args.arch}, {args.dtype} votes ({', '.join(map(str, args.shape))}), T={args.iterations}, "
          f"{routing_triton._warps(blocks)} warps, Triton {triton.__version__}")
    rows = []
    for name, kernel, types, constants in kernels:
        start = time.perf_counter()
        compiled = compile_kernel(kernel, types, constants, blocks, args.arch)
        row = {"kernel": name, "seconds": round(time.perf_counter() - start, 2),
               **ptxas_report(compiled.asm["ptx"], args.arch)}
        rows.append(row)
        print(f"  {name:24s} {row['registers']:4d} registers, spills {row['spill_stores']} B stored / "
              f"{row['spill_loads']} B loaded per thread ({row['seconds']} s to compile)")
    if args.json:
        args.json.write_text(json.dumps({"arch": args.arch, "dtype": args.dtype, "shape": args.shape,
                                         "iterations": args.iterations, "triton": triton.__version__,
                                         "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
