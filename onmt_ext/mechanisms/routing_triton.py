"""Fused routing kernels (Triton): all T iterations of a routing problem in one program.

The arithmetic of :func:`onmt_ext.mechanisms.routing.simple_routing` and :func:`onmt_ext.mechanisms.routing.em_routing`
(the reference and the CPU path).  One program routes one problem.  Where its votes ``(I, O, D)`` fit one block of
:data:`MAX_BLOCK` values, sizes rounded up to powers of two (li2019: ``I = H``, ``O * D = d_model``), it reads them
once and keeps them, the logits or coupling ``(I, O)`` and the capsules ``(O, D)`` on chip through every iteration.
Larger problems of simple routing (GRET, cao2019's vertical routing of long sentences) keep the ``(I, O)`` state on
chip and read the votes in chunks of D, once per iteration (``_chunked_*``).  Float32 inside, the votes' dtype in and
out.  The backward program keeps nothing but the inputs: it recomputes the state before each iteration from the
start and goes back one iteration at a time (T (T + 1) / 2 forward iterations in all); the derivatives are written
next to the forward steps.  Each kernel pair is a ``torch.library`` custom operator with its autograd formula, so
``torch.compile`` keeps it as one call.  Without CUDA they run in Triton's interpreter (the tests;
:data:`SWITCHED_TO_INTERPRETER`).  When the routing core uses them, and what was checked: docs/kernels.md.
"""

import collections
import math
import os
import sys
import warnings
from typing import Optional

import torch

#: True where importing this module switched Triton's interpreter on for the whole process: without CUDA, when
#: neither Triton nor ``TRITON_INTERPRET`` came first (``ONMT_EXT_ROUTING_KERNEL=triton`` on a CPU machine).  The
#: switch is Triton's environment variable, read when Triton is imported, so it also holds for every other Triton
#: kernel of the process (Inductor's) and for child processes; it is announced in one warning (docs/kernels.md).
#: The tests set ``TRITON_INTERPRET=1`` themselves (tests/conftest.py); tools/kernel_resources.py imports Triton
#: first, to compile the kernels without a GPU.
SWITCHED_TO_INTERPRETER = (not torch.cuda.is_available() and "triton" not in sys.modules
                           and "TRITON_INTERPRET" not in os.environ)
if SWITCHED_TO_INTERPRETER:
    os.environ["TRITON_INTERPRET"] = "1"

import triton  # noqa: E402  (after the interpreter's switch)
import triton.language as tl  # noqa: E402

from onmt_ext.mechanisms import routing  # noqa: E402  (the reference: its constants, once)

if SWITCHED_TO_INTERPRETER:
    warnings.warn("onmt-ext: no CUDA device, so the fused routing kernels run in Triton's interpreter, switched on "
                  "for this process (TRITON_INTERPRET=1; docs/kernels.md)")

#: the largest block ``BI * BO * BD`` (sizes rounded up to powers of two) a program holds: one problem's votes, or
#: (simple routing of larger problems) one chunk of them
MAX_BLOCK = 16384
#: the largest ``BI * BO`` whose state a program of simple routing keeps on chip while it reads the votes in chunks
#: of D (:func:`fits`); larger problems stay with the reference
MAX_STATE = 4096

#: the kernels run in Triton's interpreter (on CPU tensors): ``TRITON_INTERPRET=1`` was set before Triton was
#: imported, by the caller or by this module (:data:`SWITCHED_TO_INTERPRETER`)
INTERPRETED = bool(triton.knobs.runtime.interpret)
#: the kernels can run in this process: on CUDA, or in the interpreter
USABLE = INTERPRETED or torch.cuda.is_available()

_kernel = triton.jit


_NEG = tl.constexpr(torch.finfo(torch.float32).min)  # as the reference's masked softmax
_MIN_TOTAL = tl.constexpr(routing._MIN_TOTAL)
_NORM_EPS = tl.constexpr(routing._NORM_EPS)


# ----------------------------------------------------------------------------------------------------------
# shared pieces: loading a problem, softmax


@_kernel
def _problem(V, pid, s_p, s_i, s_o, s_d, Mask, n_in, n_out, n_dim, BI: tl.constexpr, BO: tl.constexpr,
             BD: tl.constexpr, HAS_MASK: tl.constexpr):
    """Problem ``pid``'s votes ``v`` ``[BI, BO, BD]`` in float32, zero outside the problem and on masked inputs;
    ``keep`` ``[BI, 1]`` (1.0 on real, unmasked inputs), ``valid_o`` ``[1, BO]``, ``valid_d`` ``[1, BD]``, and the
    offsets ``i``, ``o``, ``d``."""
    i = tl.arange(0, BI)
    o = tl.arange(0, BO)
    d = tl.arange(0, BD)
    keep = i < n_in
    if HAS_MASK:
        keep = keep & (tl.load(Mask + pid * n_in + i, mask=i < n_in, other=0) != 0)
    inside = keep[:, None, None] & (o[None, :, None] < n_out) & (d[None, None, :] < n_dim)
    # 64-bit offsets: Triton passes a stride below 2**31 as int32, and li2019's transposed votes have s_i = P * O * D
    wide_i, wide_o, wide_d = i.to(tl.int64), o.to(tl.int64), d.to(tl.int64)
    offsets = pid * s_p + wide_i[:, None, None] * s_i + wide_o[None, :, None] * s_o + wide_d[None, None, :] * s_d
    v = tl.load(V + offsets, mask=inside, other=0.0).to(tl.float32)
    return v, keep[:, None].to(tl.float32), (o < n_out)[None, :], (d < n_dim)[None, :], i, o, d


@_kernel
def _softmax(x, valid, AXIS: tl.constexpr):
    """softmax of ``x`` along ``AXIS`` over the ``valid`` entries (0 elsewhere)."""
    x = tl.where(valid, x, _NEG)
    e = tl.exp(x - tl.expand_dims(tl.max(x, axis=AXIS), AXIS))
    return e / tl.expand_dims(tl.sum(e, axis=AXIS), AXIS)


@_kernel
def _softmax_backward(p, g, AXIS: tl.constexpr):
    """The gradient on the scores of ``p = softmax(scores)`` along ``AXIS``, from ``g`` on ``p``."""
    return p * (g - tl.expand_dims(tl.sum(p * g, axis=AXIS), AXIS))


@_kernel
def _od_offsets(pid, n_out, n_dim, o, d):
    """Offsets and bounds of problem ``pid``'s ``[BO, BD]`` tile in a contiguous ``(P, O, D)`` tensor."""
    return pid * n_out * n_dim + o[:, None] * n_dim + d[None, :], (o[:, None] < n_out) & (d[None, :] < n_dim)


@_kernel
def _io_offsets(pid, n_in, n_out, i, o):
    """Offsets and bounds of problem ``pid``'s ``[BI, BO]`` tile in a contiguous ``(P, I, O)`` tensor."""
    return pid * n_in * n_out + i[:, None] * n_out + o[None, :], (i[:, None] < n_in) & (o[None, :] < n_out)


@_kernel
def _store_grad_votes(GradVotes, pid, g_votes, keep, n_in, n_out, n_dim, i, o, d):
    """The votes' gradient ``[BI, BO, BD]`` of problem ``pid`` into a contiguous ``(P, I, O, D)`` tensor, zero on
    masked inputs (the masking of :func:`_problem`)."""
    inside = (i[:, None, None] < n_in) & (o[None, :, None] < n_out) & (d[None, None, :] < n_dim)
    offsets = ((pid * n_in + i[:, None, None]) * n_out + o[None, :, None]) * n_dim + d[None, None, :]
    tl.store(GradVotes + offsets, (g_votes * keep[:, :, None]).to(GradVotes.dtype.element_ty), mask=inside)


# ----------------------------------------------------------------------------------------------------------
# simple routing (li2019 Alg. 1, eq. 7-8; cao2019 Alg. 1; GRET)


@_kernel
def _coupling(logits, keep, valid_o, INPUTS: tl.constexpr):
    """The coupling from ``logits`` ``B`` ``[BI, BO]``: ``p = softmax(B)`` over the outputs (or, ``INPUTS``, over
    the kept inputs) and ``C = p * keep``.  Returns ``p, C``."""
    if INPUTS:
        p = _softmax(logits, keep > 0, 0)
    else:
        p = _softmax(logits, valid_o, 1)
    return p, p * keep


@_kernel
def _coupling_backward(p, g_coupling, keep, INPUTS: tl.constexpr):
    """Back through :func:`_coupling`: the gradient on the logits from ``g_coupling`` on ``C``."""
    if INPUTS:
        g_logits = _softmax_backward(p, g_coupling * keep, 0)
    else:
        g_logits = _softmax_backward(p, g_coupling * keep, 1)
    return g_logits


@_kernel
def _simple_step(v, logits, keep, valid_o, INPUTS: tl.constexpr, WEIGHTED: tl.constexpr):
    """One iteration of simple routing from ``logits`` ``B`` ``[BI, BO]``.

    ``p = softmax(B)`` over the outputs (or, ``INPUTS``, over the kept inputs); ``C = p * keep``;
    ``T_o = sum_i C_io v_io``; ``S_o = T_o / max(W_o, 1e-6)`` with ``W_o = sum_i C_io`` when ``WEIGHTED``
    (eq. 7), else ``T_o``; ``n_o = sqrt(|S_o|^2 + eps)``, ``f_o = n_o / (n_o^2 + 1)``, ``out_o = f_o S_o``
    (eq. 8); ``B' = B + <v_io, out_o>``.  Returns ``p, C, W, S, n, f, out, B'``.
    """
    p, coupling = _coupling(logits, keep, valid_o, INPUTS)
    total = tl.sum(coupling[:, :, None] * v, axis=0)  # [BO, BD]
    weight = tl.sum(coupling, axis=0)  # [BO]
    if WEIGHTED:
        total = total / tl.maximum(weight, _MIN_TOTAL)[:, None]
    norm = tl.sqrt(tl.sum(total * total, axis=1) + _NORM_EPS)  # [BO]
    factor = norm / (norm * norm + 1.0)
    out = total * factor[:, None]
    return p, coupling, weight, total, norm, factor, out, logits + tl.sum(v * out[None, :, :], axis=2)


@_kernel
def _simple_start(Init, pid, n_in, n_out, i, o, keep, BI: tl.constexpr, BO: tl.constexpr, HAS_INIT: tl.constexpr):
    """The starting logits ``[BI, BO]``: zeros, or ``Init``'s with masked inputs at 0."""
    logits = tl.zeros((BI, BO), dtype=tl.float32)
    if HAS_INIT:
        offsets, inside = _io_offsets(pid, n_in, n_out, i, o)
        logits = tl.load(Init + offsets, mask=inside, other=0.0).to(tl.float32) * keep
    return logits


@_kernel
def _grad_logits_start(GradLogits, pid, n_in, n_out, i, o, BI: tl.constexpr, BO: tl.constexpr,
                       HAS_GRAD_LOGITS: tl.constexpr):
    """The backward pass's start: the final logits' gradient ``[BI, BO]`` in float32 (``GradLogits``'s, or zeros),
    and the offsets and bounds of problem ``pid``'s ``[BI, BO]`` tile (:func:`_io_offsets`)."""
    io_offsets, io_inside = _io_offsets(pid, n_in, n_out, i, o)
    if HAS_GRAD_LOGITS:
        g_logits = tl.load(GradLogits + io_offsets, mask=io_inside, other=0.0).to(tl.float32)
    else:
        g_logits = tl.zeros((BI, BO), dtype=tl.float32)
    return g_logits, io_offsets, io_inside


@_kernel
def _simple_forward(V, s_p, s_i, s_o, s_d, Mask, Init, Out, Logits, n_in, n_out, n_dim,
                    BI: tl.constexpr, BO: tl.constexpr, BD: tl.constexpr, ITERATIONS: tl.constexpr,
                    INPUTS: tl.constexpr, WEIGHTED: tl.constexpr, HAS_MASK: tl.constexpr, HAS_INIT: tl.constexpr,
                    STORE_LOGITS: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    v, keep, valid_o, valid_d, i, o, d = _problem(V, pid, s_p, s_i, s_o, s_d, Mask, n_in, n_out, n_dim, BI, BO, BD,
                                                  HAS_MASK)
    logits = _simple_start(Init, pid, n_in, n_out, i, o, keep, BI, BO, HAS_INIT)
    out = tl.zeros((BO, BD), dtype=tl.float32)
    for _ in range(ITERATIONS):
        _, _, _, _, _, _, out, logits = _simple_step(v, logits, keep, valid_o, INPUTS, WEIGHTED)
    offsets, inside = _od_offsets(pid, n_out, n_dim, o, d)
    tl.store(Out + offsets, out.to(Out.dtype.element_ty), mask=inside)
    if STORE_LOGITS:
        offsets, inside = _io_offsets(pid, n_in, n_out, i, o)
        tl.store(Logits + offsets, logits, mask=inside)


@_kernel
def _simple_backward(V, s_p, s_i, s_o, s_d, Mask, Init, GradOut, GradLogits, GradVotes, GradInit, n_in, n_out,
                     n_dim, BI: tl.constexpr, BO: tl.constexpr, BD: tl.constexpr, ITERATIONS: tl.constexpr,
                     INPUTS: tl.constexpr, WEIGHTED: tl.constexpr, HAS_MASK: tl.constexpr, HAS_INIT: tl.constexpr,
                     HAS_GRAD_LOGITS: tl.constexpr):
    """Gradients of the votes (``GradVotes``, contiguous ``(P, I, O, D)``) and starting logits (``GradInit``)."""
    pid = tl.program_id(0).to(tl.int64)
    v, keep, valid_o, valid_d, i, o, d = _problem(V, pid, s_p, s_i, s_o, s_d, Mask, n_in, n_out, n_dim, BI, BO, BD,
                                                  HAS_MASK)
    start = _simple_start(Init, pid, n_in, n_out, i, o, keep, BI, BO, HAS_INIT)
    g_logits, io_offsets, io_inside = _grad_logits_start(GradLogits, pid, n_in, n_out, i, o, BI, BO, HAS_GRAD_LOGITS)
    offsets, inside = _od_offsets(pid, n_out, n_dim, o, d)
    g_out_last = tl.load(GradOut + offsets, mask=inside, other=0.0).to(tl.float32)
    g_votes = tl.zeros((BI, BO, BD), dtype=tl.float32)
    for back in range(ITERATIONS):
        logits = start
        for _ in range(ITERATIONS - 1 - back):  # the logits before iteration T - 1 - back
            _, _, _, _, _, _, _, logits = _simple_step(v, logits, keep, valid_o, INPUTS, WEIGHTED)
        p, coupling, weight, total, norm, factor, out, _ = _simple_step(v, logits, keep, valid_o, INPUTS,
                                                                        WEIGHTED)
        # B' = B + <v, out>: the agreement's gradients; B's own passes through unchanged
        g_out = tl.sum(g_logits[:, :, None] * v, axis=0) + g_out_last
        g_out_last = g_out_last * 0.0  # only the last iteration's capsules are outputs
        g_votes += g_logits[:, :, None] * out[None, :, :]
        # out = f(n) S, n = sqrt(|S|^2 + eps): dout/dS = f I + f'(n) S S^T / n, f'(n) = (1 - n^2) / (1 + n^2)^2
        square = norm * norm
        slope = (1.0 - square) / ((square + 1.0) * (square + 1.0)) / norm
        g_total = g_out * factor[:, None] + (tl.sum(g_out * total, axis=1) * slope)[:, None] * total
        g_coupling_extra = tl.zeros((BO,), dtype=tl.float32)
        if WEIGHTED:  # S = T / max(W, 1e-6)
            floored = tl.maximum(weight, _MIN_TOTAL)
            g_coupling_extra = tl.where(weight > _MIN_TOTAL, -tl.sum(g_total * total, axis=1) / floored, 0.0)
            g_total = g_total / floored[:, None]
        # T = sum_i C v, W = sum_i C
        g_coupling = tl.sum(g_total[None, :, :] * v, axis=2) + g_coupling_extra[None, :]
        g_votes += coupling[:, :, None] * g_total[None, :, :]
        # C = softmax(B) * keep
        g_logits += _coupling_backward(p, g_coupling, keep, INPUTS)
    _store_grad_votes(GradVotes, pid, g_votes, keep, n_in, n_out, n_dim, i, o, d)
    if HAS_INIT:
        tl.store(GradInit + io_offsets, (g_logits * keep).to(GradInit.dtype.element_ty), mask=io_inside)


# ----------------------------------------------------------------------------------------------------------
# simple routing of problems larger than one block: the votes read in chunks of D, the (I, O) state on chip.
# The chunk loops are ``while`` loops: Triton 3.6's interpreter cannot take a runtime bound in ``range`` with
# NumPy 2 (it converts the bound's one-element array to an int), and compiled Triton takes either.


@_kernel
def _chunk(V, group, s_p, s_i, s_o, s_d, vkeep, n_in, n_out, n_dim, i, o, d):
    """Group ``group``'s votes ``v[:, :, d]`` ``[BI, BO, BD]`` (``d``: one chunk's offsets) in float32, zero outside
    the problem and on the inputs ``vkeep`` ``[BI, 1]`` drops, and where they lie in a contiguous ``(G, I, O, D)``
    tensor.  A group is one problem, or the problems that share its votes (cao2019's horizontal routing)."""
    inside = (vkeep[:, :, None] > 0) & (o[None, :, None] < n_out) & (d[None, None, :] < n_dim)
    wide_i, wide_o, wide_d = i.to(tl.int64), o.to(tl.int64), d.to(tl.int64)  # as in _problem
    v = tl.load(V + group * s_p + wide_i[:, None, None] * s_i + wide_o[None, :, None] * s_o
                + wide_d[None, None, :] * s_d, mask=inside, other=0.0).to(tl.float32)
    flat = ((group * n_in + i[:, None, None]) * n_out + o[None, :, None]) * n_dim + d[None, None, :]
    every = (i[:, None, None] < n_in) & (o[None, :, None] < n_out) & (d[None, None, :] < n_dim)
    return v, flat, every


@_kernel
def _chunked_keeps(Mask, VKeep, pid, group, n_in, i, HAS_MASK: tl.constexpr, SHARED: tl.constexpr):
    """Problem ``pid``'s ``keep`` ``[BI, 1]`` (1.0 on its real, unmasked inputs) and the votes' ``vkeep``: with
    ``SHARED`` votes, 1.0 on the inputs some problem of the group keeps (the reference zeroes the others), else
    ``keep``."""
    keep = i < n_in
    if HAS_MASK:
        keep = keep & (tl.load(Mask + pid * n_in + i, mask=i < n_in, other=0) != 0)
    keep = keep[:, None].to(tl.float32)
    vkeep = keep
    if SHARED:
        vkeep = ((i < n_in) & (tl.load(VKeep + group * n_in + i, mask=i < n_in, other=0) != 0))[:, None].to(tl.float32)
    return keep, vkeep


@_kernel
def _chunked_coupling(logits, keep, valid_o, INPUTS: tl.constexpr, WEIGHTED: tl.constexpr):
    """Step 1 of :func:`_simple_step` on the whole ``[BI, BO]`` logits: ``p``, ``C = p * keep``, ``W = sum_i C`` and
    the divisor of the total, ``max(W, 1e-6)`` with ``WEIGHTED``, else 1."""
    p, coupling = _coupling(logits, keep, valid_o, INPUTS)
    weight = tl.sum(coupling, axis=0)
    if WEIGHTED:
        divisor = tl.maximum(weight, _MIN_TOTAL)
    else:
        divisor = weight * 0.0 + 1.0
    return p, coupling, weight, divisor


@_kernel
def _chunked_step(V, group, s_p, s_i, s_o, s_d, logits, keep, vkeep, valid_o, n_in, n_out, n_dim, i, o,
                  BD: tl.constexpr, INPUTS: tl.constexpr, WEIGHTED: tl.constexpr):
    """One iteration of simple routing (:func:`_simple_step`), D in chunks of ``BD``: ``S_o`` exists one chunk at a
    time, and what later steps need of it is summed over the chunks, ``|S_o|^2`` and ``<v_io, S_o>``;
    ``B' = B + f_o <v_io, S_o>`` (eq. 8 and Alg. 1 line 6).  Returns ``p, C, W, divisor, n, f, B'``."""
    p, coupling, weight, divisor = _chunked_coupling(logits, keep, valid_o, INPUTS, WEIGHTED)
    square = tl.zeros_like(weight)  # [BO]
    agreement = tl.zeros_like(logits)  # [BI, BO]
    start = 0
    while start < n_dim:  # the chunks of D
        v = _chunk(V, group, s_p, s_i, s_o, s_d, vkeep, n_in, n_out, n_dim, i, o, start + tl.arange(0, BD))[0]
        total = tl.sum(coupling[:, :, None] * v, axis=0) / divisor[:, None]  # S [BO, BD]
        square += tl.sum(total * total, axis=1)
        agreement += tl.sum(v * total[None, :, :], axis=2)
        start += BD
    norm = tl.sqrt(square + _NORM_EPS)
    factor = norm / (norm * norm + 1.0)
    return p, coupling, weight, divisor, norm, factor, logits + agreement * factor[None, :]


@_kernel
def _chunked_forward(V, s_p, s_i, s_o, s_d, Mask, VKeep, Init, Out, Logits, members, n_in, n_out, n_dim,
                     BI: tl.constexpr, BO: tl.constexpr, BD: tl.constexpr, ITERATIONS: tl.constexpr,
                     INPUTS: tl.constexpr, WEIGHTED: tl.constexpr, HAS_MASK: tl.constexpr, HAS_INIT: tl.constexpr,
                     STORE_LOGITS: tl.constexpr, SHARED: tl.constexpr):
    """:func:`_simple_forward` with D in chunks of ``BD``; a last pass over the chunks writes ``out = f S``.
    Problem ``pid`` routes the votes of group ``pid // members``."""
    pid = tl.program_id(0).to(tl.int64)
    group = pid // members
    i = tl.arange(0, BI)
    o = tl.arange(0, BO)
    keep, vkeep = _chunked_keeps(Mask, VKeep, pid, group, n_in, i, HAS_MASK, SHARED)
    valid_o = (o < n_out)[None, :]
    logits = _simple_start(Init, pid, n_in, n_out, i, o, keep, BI, BO, HAS_INIT)
    for _ in range(ITERATIONS - 1):
        _, _, _, _, _, _, logits = _chunked_step(V, group, s_p, s_i, s_o, s_d, logits, keep, vkeep, valid_o, n_in,
                                                 n_out, n_dim, i, o, BD, INPUTS, WEIGHTED)
    _, coupling, _, divisor, _, factor, logits = _chunked_step(V, group, s_p, s_i, s_o, s_d, logits, keep, vkeep,
                                                               valid_o, n_in, n_out, n_dim, i, o, BD, INPUTS,
                                                               WEIGHTED)
    start = 0
    while start < n_dim:  # the chunks of D
        d = start + tl.arange(0, BD)
        v = _chunk(V, group, s_p, s_i, s_o, s_d, vkeep, n_in, n_out, n_dim, i, o, d)[0]
        out = tl.sum(coupling[:, :, None] * v, axis=0) * (factor / divisor)[:, None]
        offsets, inside = _od_offsets(pid, n_out, n_dim, o, d)
        tl.store(Out + offsets, out.to(Out.dtype.element_ty), mask=inside)
        start += BD
    if STORE_LOGITS:
        offsets, inside = _io_offsets(pid, n_in, n_out, i, o)
        tl.store(Logits + offsets, logits, mask=inside)


@_kernel
def _chunked_backward(V, s_p, s_i, s_o, s_d, Mask, VKeep, Init, GradOut, GradLogits, GradVotes, Partial, GradInit,
                      members, n_in, n_out, n_dim, BI: tl.constexpr, BO: tl.constexpr, BD: tl.constexpr,
                      ITERATIONS: tl.constexpr, INPUTS: tl.constexpr, WEIGHTED: tl.constexpr, HAS_MASK: tl.constexpr,
                      HAS_INIT: tl.constexpr, HAS_GRAD_LOGITS: tl.constexpr, SHARED: tl.constexpr):
    """:func:`_simple_backward` with D in chunks; one program per group, through its ``members`` problems in turn.
    Going back through an iteration takes two passes over the chunks: the first sums ``r_o = <g_out_o, S_o>`` (the
    squash's gradient needs it whole), the second forms ``g_S``, adds ``sum_d g_T v`` to the coupling's gradient and
    the iteration's part of the votes' gradient to ``Partial`` (float32 ``(G, I, O, D)``), whose sum over the
    iterations and problems the last part writes to ``GradVotes``."""
    group = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BI)
    o = tl.arange(0, BO)
    valid_o = (o < n_out)[None, :]
    member = 0
    while member < members:  # the problems that share the votes
        pid = group * members + member
        keep, vkeep = _chunked_keeps(Mask, VKeep, pid, group, n_in, i, HAS_MASK, SHARED)
        start_logits = _simple_start(Init, pid, n_in, n_out, i, o, keep, BI, BO, HAS_INIT)
        g_logits, io_offsets, io_inside = _grad_logits_start(GradLogits, pid, n_in, n_out, i, o, BI, BO,
                                                             HAS_GRAD_LOGITS)
        for back in range(ITERATIONS):
            logits = start_logits
            for _ in range(ITERATIONS - 1 - back):  # the logits before iteration T - 1 - back
                _, _, _, _, _, _, logits = _chunked_step(V, group, s_p, s_i, s_o, s_d, logits, keep, vkeep, valid_o,
                                                         n_in, n_out, n_dim, i, o, BD, INPUTS, WEIGHTED)
            p, coupling, weight, divisor, norm, factor, _ = _chunked_step(V, group, s_p, s_i, s_o, s_d, logits, keep,
                                                                          vkeep, valid_o, n_in, n_out, n_dim, i, o,
                                                                          BD, INPUTS, WEIGHTED)
            # out = f(n) S: dout/dS = f I + f'(n) S S^T / n, f'(n) = (1 - n^2) / (1 + n^2)^2 (see _simple_backward)
            square = norm * norm
            slope = (1.0 - square) / ((square + 1.0) * (square + 1.0)) / norm
            # pass 1: r_o = sum_d g_out_od S_od, g_out = sum_i g_B' v + (last iteration only) the outputs' gradient
            projection = tl.zeros_like(norm)
            start = 0
            while start < n_dim:  # the chunks of D
                d = start + tl.arange(0, BD)
                v = _chunk(V, group, s_p, s_i, s_o, s_d, vkeep, n_in, n_out, n_dim, i, o, d)[0]
                total = tl.sum(coupling[:, :, None] * v, axis=0) / divisor[:, None]
                offsets, inside = _od_offsets(pid, n_out, n_dim, o, d)
                g_out = tl.sum(g_logits[:, :, None] * v, axis=0) + tl.load(
                    GradOut + offsets, mask=inside & (back == 0), other=0.0).to(tl.float32)
                projection += tl.sum(g_out * total, axis=1)
                start += BD
            # pass 2: g_S = f g_out + r f'(n) / n S; S = T / divisor, T = sum_i C v
            g_coupling = tl.zeros_like(g_logits)
            g_divisor = tl.zeros_like(norm)
            first = (member == 0) & (back == 0)
            last = (member == members - 1) & (back == ITERATIONS - 1)
            start = 0
            while start < n_dim:  # the chunks of D
                d = start + tl.arange(0, BD)
                v, flat, every = _chunk(V, group, s_p, s_i, s_o, s_d, vkeep, n_in, n_out, n_dim, i, o, d)
                total = tl.sum(coupling[:, :, None] * v, axis=0) / divisor[:, None]
                offsets, inside = _od_offsets(pid, n_out, n_dim, o, d)
                g_out = tl.sum(g_logits[:, :, None] * v, axis=0) + tl.load(
                    GradOut + offsets, mask=inside & (back == 0), other=0.0).to(tl.float32)
                g_total = g_out * factor[:, None] + (projection * slope)[:, None] * total
                g_divisor -= tl.sum(g_total * total, axis=1)
                g_total = g_total / divisor[:, None]
                g_coupling += tl.sum(g_total[None, :, :] * v, axis=2)
                # the votes: B' = B + <v, out> gives g_B' out, T = sum_i C v gives C g_T
                g_votes = (g_logits[:, :, None] * (total * factor[:, None])[None, :, :]
                           + coupling[:, :, None] * g_total[None, :, :])
                g_votes += tl.load(Partial + flat, mask=every & ~first, other=0.0)
                if last:
                    tl.store(GradVotes + flat, (g_votes * vkeep[:, :, None]).to(GradVotes.dtype.element_ty),
                             mask=every)
                else:
                    tl.store(Partial + flat, g_votes, mask=every)
                start += BD
            tl.debug_barrier()  # the next pass reads Partial where other threads may have written it
            if WEIGHTED:  # divisor = max(W, 1e-6), W = sum_i C
                g_coupling += tl.where(weight > _MIN_TOTAL, g_divisor / divisor, 0.0)[None, :]
            # C = softmax(B) * keep
            g_logits += _coupling_backward(p, g_coupling, keep, INPUTS)
        if HAS_INIT:
            tl.store(GradInit + io_offsets, (g_logits * keep).to(GradInit.dtype.element_ty), mask=io_inside)
        member += 1


# ----------------------------------------------------------------------------------------------------------
# EM routing (li2019 Alg. 2, eq. 9-12)


@_kernel
def _em_m_step(v, coupling, valid_d, beta_a, beta_u, min_var):
    """M-step from the coupling ``C`` ``[BI, BO]``: ``W_o = sum_i C_io``, ``share = C / max(W, 1e-6)``,
    ``mu = sum_i share v``, ``dev = v - mu``, ``var = sum_i share dev^2 + min_var``,
    ``l_o = sum_d log var_od``, ``a_o = beta_a - W_o (beta_u' + l_o / 2)`` with ``beta_u'`` holding chi's
    constant.  Returns ``W, share, mu, dev, dev2, var, l, a``."""
    weight = tl.sum(coupling, axis=0)  # [BO]
    share = coupling / tl.maximum(weight, _MIN_TOTAL)[None, :]
    mean = tl.sum(share[:, :, None] * v, axis=0)  # [BO, BD]
    dev = v - mean[None, :, :]
    dev2 = dev * dev
    var = tl.sum(share[:, :, None] * dev2, axis=0) + min_var
    sum_log_var = tl.sum(tl.where(valid_d, tl.log(var), 0.0), axis=1)  # [BO]
    logit_a = beta_a - weight * (beta_u + 0.5 * sum_log_var)
    return weight, share, mean, dev, dev2, var, sum_log_var, logit_a


@_kernel
def _em_e_step(dev2, var, sum_log_var, logit_a, keep, valid_o):
    """E-step: ``score_io = log sigmoid(a_o) - l_o / 2 - sum_d dev2_iod / (2 var_od)``; ``p = softmax_o(score)``;
    the new coupling is ``p * keep``.  Returns ``p``."""
    log_a = tl.minimum(logit_a, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(logit_a)))
    score = (log_a - 0.5 * sum_log_var)[None, :] - 0.5 * tl.sum(dev2 / var[None, :, :], axis=2)
    return _softmax(score, valid_o, 1)


@_kernel
def _em_coupling(v, start, keep, valid_o, valid_d, beta_a, beta_u, min_var, steps):
    """The coupling after ``steps`` M- and E-steps from ``start``."""
    coupling = start
    for _ in range(steps):
        _, _, _, _, dev2, var, sum_log_var, logit_a = _em_m_step(v, coupling, valid_d, beta_a, beta_u, min_var)
        coupling = _em_e_step(dev2, var, sum_log_var, logit_a, keep, valid_o) * keep
    return coupling


@_kernel
def _em_m_backward(v, coupling, weight, share, mean, dev, dev2, var, sum_log_var, logit_a, valid_d, beta_u,
                   g_mean, g_logit_a, g_sum_log_var, g_var, g_dev2):
    """Back through :func:`_em_m_step`, given the gradients on its results; returns the gradients on the votes
    and the coupling."""
    # a = beta_a - W (beta_u' + l / 2)
    g_weight = -g_logit_a * (beta_u + 0.5 * sum_log_var)
    g_sum_log_var = g_sum_log_var - 0.5 * weight * g_logit_a
    # l = sum_d log var; var = sum_i share dev^2 + min_var
    g_var = g_var + tl.where(valid_d, g_sum_log_var[:, None] / var, 0.0)
    g_share = tl.sum(g_var[None, :, :] * dev2, axis=2)
    g_dev = 2.0 * dev * (g_dev2 + share[:, :, None] * g_var[None, :, :])
    # dev = v - mu; mu = sum_i share v
    g_mean = g_mean - tl.sum(g_dev, axis=0)
    g_share += tl.sum(g_mean[None, :, :] * v, axis=2)
    g_votes = g_dev + share[:, :, None] * g_mean[None, :, :]
    # share = C / max(W, 1e-6); W = sum_i C
    floored = tl.maximum(weight, _MIN_TOTAL)
    g_weight += tl.where(weight > _MIN_TOTAL, -tl.sum(g_share * coupling, axis=0) / (floored * floored), 0.0)
    return g_votes, g_share / floored[None, :] + g_weight[None, :]


@_kernel
def _em_betas(Beta, o, n_out, BO: tl.constexpr, HAS: tl.constexpr):
    """A beta ``[BO]`` in float32: ``Beta``'s, or zeros."""
    beta = tl.zeros((BO,), dtype=tl.float32)
    if HAS:
        beta = tl.load(Beta + o, mask=o < n_out, other=0.0).to(tl.float32)
    return beta


@_kernel
def _em_forward(V, s_p, s_i, s_o, s_d, Mask, BetaA, BetaU, Out, Act, n_in, n_out, n_dim, chi, min_var,
                BI: tl.constexpr, BO: tl.constexpr, BD: tl.constexpr, ITERATIONS: tl.constexpr,
                HAS_MASK: tl.constexpr, HAS_BETA_A: tl.constexpr, HAS_BETA_U: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    v, keep, valid_o, valid_d, i, o, d = _problem(V, pid, s_p, s_i, s_o, s_d, Mask, n_in, n_out, n_dim, BI, BO, BD,
                                                  HAS_MASK)
    beta_a = _em_betas(BetaA, o, n_out, BO, HAS_BETA_A)
    beta_u = _em_betas(BetaU, o, n_out, BO, HAS_BETA_U) + chi
    start = keep * valid_o.to(tl.float32) / n_out
    coupling = _em_coupling(v, start, keep, valid_o, valid_d, beta_a, beta_u, min_var, ITERATIONS - 1)
    _, _, mean, _, _, _, _, logit_a = _em_m_step(v, coupling, valid_d, beta_a, beta_u, min_var)
    act = tl.sigmoid(logit_a)
    offsets, inside = _od_offsets(pid, n_out, n_dim, o, d)
    tl.store(Out + offsets, (act[:, None] * mean).to(Out.dtype.element_ty), mask=inside)
    tl.store(Act + pid * n_out + o, act.to(Act.dtype.element_ty), mask=o < n_out)


@_kernel
def _em_backward(V, s_p, s_i, s_o, s_d, Mask, BetaA, BetaU, GradOut, GradAct, GradVotes, GradBetaA, GradBetaU,
                 n_in, n_out, n_dim, chi, min_var, BI: tl.constexpr, BO: tl.constexpr, BD: tl.constexpr,
                 ITERATIONS: tl.constexpr, HAS_MASK: tl.constexpr, HAS_BETA_A: tl.constexpr,
                 HAS_BETA_U: tl.constexpr):
    """Gradients of the votes (``GradVotes``, contiguous ``(P, I, O, D)``) and, per problem, of the betas
    (``(P, O)`` float32, summed by the caller)."""
    pid = tl.program_id(0).to(tl.int64)
    v, keep, valid_o, valid_d, i, o, d = _problem(V, pid, s_p, s_i, s_o, s_d, Mask, n_in, n_out, n_dim, BI, BO, BD,
                                                  HAS_MASK)
    beta_a = _em_betas(BetaA, o, n_out, BO, HAS_BETA_A)
    beta_u = _em_betas(BetaU, o, n_out, BO, HAS_BETA_U) + chi
    start = keep * valid_o.to(tl.float32) / n_out
    offsets, inside = _od_offsets(pid, n_out, n_dim, o, d)
    g_out = tl.load(GradOut + offsets, mask=inside, other=0.0).to(tl.float32)
    g_act = tl.load(GradAct + pid * n_out + o, mask=o < n_out, other=0.0).to(tl.float32)
    # the last M-step: out = sigmoid(a) mu, act = sigmoid(a)
    coupling = _em_coupling(v, start, keep, valid_o, valid_d, beta_a, beta_u, min_var, ITERATIONS - 1)
    weight, share, mean, dev, dev2, var, sum_log_var, logit_a = _em_m_step(v, coupling, valid_d, beta_a, beta_u,
                                                                           min_var)
    act = tl.sigmoid(logit_a)
    g_logit_a = (tl.sum(g_out * mean, axis=1) + g_act) * act * (1.0 - act)
    g_beta_a = g_logit_a
    g_beta_u = -weight * g_logit_a
    zero_od = tl.zeros((BO, BD), dtype=tl.float32)
    g_votes, g_coupling = _em_m_backward(v, coupling, weight, share, mean, dev, dev2, var, sum_log_var, logit_a,
                                         valid_d, beta_u, g_out * act[:, None], g_logit_a,
                                         tl.zeros((BO,), dtype=tl.float32), zero_od,
                                         tl.zeros((BI, BO, BD), dtype=tl.float32))
    for back in range(1, ITERATIONS):  # iteration T - 1 - back, whose E-step made the coupling of the next
        coupling = _em_coupling(v, start, keep, valid_o, valid_d, beta_a, beta_u, min_var, ITERATIONS - 1 - back)
        weight, share, mean, dev, dev2, var, sum_log_var, logit_a = _em_m_step(v, coupling, valid_d, beta_a,
                                                                               beta_u, min_var)
        p = _em_e_step(dev2, var, sum_log_var, logit_a, keep, valid_o)
        # C' = p * keep, p = softmax_o(score)
        g_score = _softmax_backward(p, g_coupling * keep, 1)
        # score = log sigmoid(a) - l / 2 - sum_d dev2 / (2 var)
        g_log_a = tl.sum(g_score, axis=0)
        g_var = 0.5 * tl.sum(g_score[:, :, None] * dev2, axis=0) / (var * var)
        g_dev2 = -0.5 * g_score[:, :, None] / var[None, :, :]
        g_logit_a = g_log_a * (1.0 - tl.sigmoid(logit_a))
        g_beta_a += g_logit_a
        g_beta_u -= weight * g_logit_a
        step_votes, g_coupling = _em_m_backward(v, coupling, weight, share, mean, dev, dev2, var, sum_log_var,
                                                logit_a, valid_d, beta_u, zero_od, g_logit_a, -0.5 * g_log_a, g_var,
                                                g_dev2)
        g_votes += step_votes
    _store_grad_votes(GradVotes, pid, g_votes, keep, n_in, n_out, n_dim, i, o, d)
    tl.store(GradBetaA + pid * n_out + o, g_beta_a, mask=o < n_out)
    tl.store(GradBetaU + pid * n_out + o, g_beta_u, mask=o < n_out)


# ----------------------------------------------------------------------------------------------------------
# launching


def _blocks(votes):
    return tuple(triton.next_power_of_2(size) for size in votes.shape[-3:])


def _chunk_blocks(votes):
    """The blocks of the chunked simple routing: ``(BI, BO, BD)`` with D's chunk as large as :data:`MAX_BLOCK`
    allows."""
    n_in, n_out, n_dim = _blocks(votes)
    return n_in, n_out, max(1, min(n_dim, MAX_BLOCK // (n_in * n_out)))


def _one_block(votes):
    return math.prod(_blocks(votes)) <= MAX_BLOCK


def _members(votes, mask):
    """How many problems share each problem's votes: 1 where the mask ``(..., I)`` has the votes' leading shape;
    for votes whose last leading dimensions are 1 where the mask's are not (cao2019's horizontal routing: votes
    ``(B, 1, L, H, M)``, mask ``(B, L, L)``), the number of problems those dimensions hold; None otherwise."""
    lead = tuple(votes.shape[:-3])
    problems = lead if mask is None else tuple(mask.shape[:-1])
    if (mask is not None and mask.shape[-1] != votes.shape[-3]) or len(problems) != len(lead):
        return None
    shared = next((dim for dim, (size, wanted) in enumerate(zip(lead, problems)) if size != wanted), len(lead))
    return math.prod(problems[shared:]) if all(size == 1 for size in lead[shared:]) else None


def fits(votes, chunked=False, mask=None):
    """Whether the kernels can route ``votes`` ``(..., I, O, D)`` in this process, on a CUDA device or in Triton's
    interpreter (CPU tensors): one problem fits a program's block (:data:`MAX_BLOCK`), or, with ``chunked`` (simple
    routing), its ``(I, O)`` state fits :data:`MAX_STATE` and the votes are read in chunks of D; votes shared by
    the problems of ``mask`` (:func:`_members`) go to the chunked kernels only."""
    if not (votes.device.type == "cuda" or (INTERPRETED and votes.device.type == "cpu")):
        return False
    members = _members(votes, mask)
    if members is None or (members > 1 and not chunked):
        return False
    blocks = _blocks(votes)
    return (members == 1 and _one_block(votes)) or (chunked and blocks[0] * blocks[1] <= MAX_STATE)


def variant(votes, mask=None):
    """Which compiled kernel routes ``votes`` (with ``mask``): ``("block", (BI, BO, BD))`` or ``("chunked", (BI,
    BO, BD), shared)``.  Problems of one variant run the same compiled code at other sizes, so the first-use check
    of :mod:`onmt_ext.mechanisms.routing` is made once per variant, not once per sentence length."""
    members = _members(votes, mask)
    if members == 1 and _one_block(votes):
        return "block", _blocks(votes)
    return "chunked", _chunk_blocks(votes), members != 1


def _warps(blocks):
    """Warps per program: about 256 block values per warp, 1 to 16 (a first choice, not tuned on a GPU;
    ``python -m tools.routing_bench --warps`` times others).  Triton's interpreter ignores it."""
    return max(1, min(16, triton.next_power_of_2(math.prod(blocks) // 256)))


#: launches per kernel name in this process (the tests' proof that a path ran through the kernels)
LAUNCHES = collections.Counter()


def _grid_call(kernel, votes, before, after, **constants):
    """``kernel[(P,)](votes, strides, *before, I, O, D, *after, BI=..., BO=..., BD=..., **constants)``."""
    LAUNCHES[kernel.fn.__name__] += 1
    blocks = _blocks(votes)
    meta = dict(BI=blocks[0], BO=blocks[1], BD=blocks[2], num_warps=_warps(blocks), **constants)
    if votes.shape[0]:
        kernel[(votes.shape[0],)](votes, *votes.stride(), *before, *votes.shape[1:], *after, **meta)


def _mask_bytes(mask):
    return None if mask is None else mask.to(torch.int8).contiguous()


# the custom operators: votes (P, I, O, D), mask (P, I) bool, init (P, I, O); outputs as the reference's.  Each
# operator and its fake (the shapes torch.compile traces) allocate their outputs through the same function.


def _simple_outputs(votes, need_logits, members):
    """The simple routing's ``out`` ``(P, O, D)`` and ``logits`` ``(P, I, O)`` (float32; empty without
    ``need_logits``), unfilled; ``P`` is ``G * members``."""
    groups, n_in, n_out, n_dim = votes.shape
    problems = groups * members
    return (votes.new_empty(problems, n_out, n_dim),
            votes.new_empty((problems, n_in, n_out) if need_logits else (0,), dtype=torch.float32))


def _simple_gradients(votes, init):
    """The votes' gradient (their dtype) and the starting logits' (float32; empty without them), both contiguous,
    unfilled."""
    return (torch.empty(votes.shape, dtype=votes.dtype, device=votes.device),
            votes.new_empty(init.shape, dtype=torch.float32) if init is not None else votes.new_empty(0))


def _chunked_call(kernel, programs, votes, mask, members, tensors, **constants):
    """``kernel[(programs,)]`` of the chunked simple routing: votes ``(G, I, O, D)``, the problems' mask
    ``(G * members, I)`` and, with ``members > 1``, the votes' own (the inputs some member keeps)."""
    LAUNCHES[kernel.fn.__name__] += 1
    blocks = _chunk_blocks(votes)
    shared = members > 1
    vkeep = mask.view(votes.shape[0], members, -1).any(dim=1).to(torch.int8) if shared else None
    meta = dict(BI=blocks[0], BO=blocks[1], BD=blocks[2], HAS_MASK=mask is not None, SHARED=shared,
                num_warps=_warps(blocks), **constants)
    if programs:
        kernel[(programs,)](votes, *votes.stride(), _mask_bytes(mask), vkeep, *tensors, members, *votes.shape[1:],
                            **meta)


@torch.library.custom_op("onmt_ext::routing_simple", mutates_args=())
def _simple_op(votes: torch.Tensor, mask: Optional[torch.Tensor], init: Optional[torch.Tensor], iterations: int,
               inputs: bool, weighted: bool, need_logits: bool, members: int) -> tuple[torch.Tensor, torch.Tensor]:
    out, logits = _simple_outputs(votes, need_logits, members)
    init = None if init is None else init.contiguous()  # the kernels index it as (P, I, O); a view may not be
    settings = dict(ITERATIONS=iterations, INPUTS=inputs, WEIGHTED=weighted, HAS_INIT=init is not None,
                    STORE_LOGITS=need_logits)
    if members == 1 and _one_block(votes):
        _grid_call(_simple_forward, votes, (_mask_bytes(mask), init, out, logits), (), HAS_MASK=mask is not None,
                   **settings)
    else:
        _chunked_call(_chunked_forward, out.shape[0], votes, mask, members, (init, out, logits), **settings)
    return out, logits


@_simple_op.register_fake
def _simple_fake(votes, mask, init, iterations, inputs, weighted, need_logits, members):
    return _simple_outputs(votes, need_logits, members)


@torch.library.custom_op("onmt_ext::routing_simple_backward", mutates_args=())
def _simple_backward_op(votes: torch.Tensor, mask: Optional[torch.Tensor], init: Optional[torch.Tensor],
                        grad_out: torch.Tensor, grad_logits: Optional[torch.Tensor], iterations: int, inputs: bool,
                        weighted: bool, members: int) -> tuple[torch.Tensor, torch.Tensor]:
    grad_votes, grad_init = _simple_gradients(votes, init)
    tensors = (None if init is None else init.contiguous(), grad_out.contiguous(),
               None if grad_logits is None else grad_logits.contiguous(), grad_votes)
    settings = dict(ITERATIONS=iterations, INPUTS=inputs, WEIGHTED=weighted, HAS_INIT=init is not None,
                    HAS_GRAD_LOGITS=grad_logits is not None)
    if members == 1 and _one_block(votes):
        _grid_call(_simple_backward, votes, (_mask_bytes(mask),) + tensors + (grad_init,), (),
                   HAS_MASK=mask is not None, **settings)
    else:  # the votes' gradient summed over iterations and members in float32: in place where that is its dtype
        partial = grad_votes if votes.dtype == torch.float32 else torch.empty(
            votes.shape if iterations * members > 1 else (0,), dtype=torch.float32, device=votes.device)
        _chunked_call(_chunked_backward, votes.shape[0], votes, mask, members, tensors + (partial, grad_init),
                      **settings)
    return grad_votes, grad_init


@_simple_backward_op.register_fake
def _simple_backward_fake(votes, mask, init, grad_out, grad_logits, iterations, inputs, weighted, members):
    return _simple_gradients(votes, init)


def _simple_setup(ctx, inputs, output):
    votes, mask, init, iterations, normalize_inputs, weighted, need_logits, members = inputs
    ctx.save_for_backward(votes, mask, init)
    ctx.settings = (iterations, normalize_inputs, weighted, need_logits, members)


def _simple_grad(ctx, grad_out, grad_logits):
    votes, mask, init = ctx.saved_tensors
    iterations, normalize_inputs, weighted, need_logits, members = ctx.settings
    grad_votes, grad_init = _simple_backward_op(votes, mask, init, grad_out, grad_logits if need_logits else None,
                                                iterations, normalize_inputs, weighted, members)
    return grad_votes, None, grad_init.to(init.dtype) if init is not None else None, None, None, None, None, None


_simple_op.register_autograd(_simple_grad, setup_context=_simple_setup)


def _em_outputs(votes):
    """EM's ``out`` ``(P, O, D)`` and ``activations`` ``(P, O)``, unfilled."""
    problems, _, n_out, n_dim = votes.shape
    return votes.new_empty(problems, n_out, n_dim), votes.new_empty(problems, n_out)


def _em_gradients(votes, problems):
    """The votes' gradient (contiguous, the votes' dtype) and the betas' ``(problems, O)`` (float32: one row per
    problem, or ``problems=None``: their sums ``(O,)``), unfilled."""
    beta_shape = (votes.shape[2],) if problems is None else (problems, votes.shape[2])
    return (torch.empty(votes.shape, dtype=votes.dtype, device=votes.device),
            votes.new_empty(beta_shape, dtype=torch.float32), votes.new_empty(beta_shape, dtype=torch.float32))


@torch.library.custom_op("onmt_ext::routing_em", mutates_args=())
def _em_op(votes: torch.Tensor, mask: Optional[torch.Tensor], beta_a: Optional[torch.Tensor],
           beta_u: Optional[torch.Tensor], iterations: int, min_var: float) -> tuple[torch.Tensor, torch.Tensor]:
    out, act = _em_outputs(votes)
    _grid_call(_em_forward, votes, (_mask_bytes(mask), beta_a, beta_u, out, act),
               (routing.chi_constant(votes.shape[3]), min_var), ITERATIONS=iterations,
               HAS_MASK=mask is not None, HAS_BETA_A=beta_a is not None, HAS_BETA_U=beta_u is not None)
    return out, act


@_em_op.register_fake
def _em_fake(votes, mask, beta_a, beta_u, iterations, min_var):
    return _em_outputs(votes)


@torch.library.custom_op("onmt_ext::routing_em_backward", mutates_args=())
def _em_backward_op(votes: torch.Tensor, mask: Optional[torch.Tensor], beta_a: Optional[torch.Tensor],
                    beta_u: Optional[torch.Tensor], grad_out: torch.Tensor, grad_act: torch.Tensor, iterations: int,
                    min_var: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    grad_votes, grad_beta_a, grad_beta_u = _em_gradients(votes, votes.shape[0])
    _grid_call(_em_backward, votes,
               (_mask_bytes(mask), beta_a, beta_u, grad_out.contiguous(), grad_act.contiguous(), grad_votes,
                grad_beta_a, grad_beta_u),
               (routing.chi_constant(votes.shape[3]), min_var), ITERATIONS=iterations,
               HAS_MASK=mask is not None, HAS_BETA_A=beta_a is not None, HAS_BETA_U=beta_u is not None)
    return grad_votes, grad_beta_a.sum(0), grad_beta_u.sum(0)


@_em_backward_op.register_fake
def _em_backward_fake(votes, mask, beta_a, beta_u, grad_out, grad_act, iterations, min_var):
    return _em_gradients(votes, None)


def _em_setup(ctx, inputs, output):
    votes, mask, beta_a, beta_u, iterations, min_var = inputs
    ctx.save_for_backward(votes, mask, beta_a, beta_u)
    ctx.settings = (iterations, min_var)


def _em_grad(ctx, grad_out, grad_act):
    votes, mask, beta_a, beta_u = ctx.saved_tensors
    iterations, min_var = ctx.settings
    grad_votes, grad_beta_a, grad_beta_u = _em_backward_op(votes, mask, beta_a, beta_u, grad_out, grad_act,
                                                           iterations, min_var)
    return (grad_votes, None, None if beta_a is None else grad_beta_a.to(beta_a.dtype),
            None if beta_u is None else grad_beta_u.to(beta_u.dtype), None, None)


_em_op.register_autograd(_em_grad, setup_context=_em_setup)


# ----------------------------------------------------------------------------------------------------------
# the routing core's entry points (onmt_ext.mechanisms.routing dispatches here)


def _flat(votes, mask):
    """``votes`` ``(..., I, O, D)`` as ``(P, I, O, D)`` (a view where it can be), ``mask`` as ``(P, I)``."""
    lead = votes.shape[:-3]
    flat = votes.reshape(-1, *votes.shape[-3:])
    return lead, flat, None if mask is None else mask.reshape(-1, mask.shape[-1]).bool()


def simple_routing(votes, iterations, normalize, weighted_mean, init_logits, mask, need_logits):
    """:func:`onmt_ext.mechanisms.routing.simple_routing` through the fused kernels (the caller checked :func:`fits`
    and the arguments).  Returns ``outputs`` ``(..., O, D)`` in ``votes.dtype`` and ``logits`` ``(..., I, O)`` in
    float32 (None without ``need_logits``); ``...`` is the mask's leading shape where votes are shared."""
    members = _members(votes, mask)
    lead = votes.shape[:-3] if mask is None else mask.shape[:-1]
    flat = votes.reshape(-1, *votes.shape[-3:])  # (G, I, O, D)
    flat_mask = None if mask is None else mask.reshape(-1, mask.shape[-1]).bool()
    n_in, n_out, n_dim = flat.shape[1:]
    init = None
    if init_logits is not None:
        init = init_logits.reshape(-1, n_in, n_out).to(torch.promote_types(init_logits.dtype, torch.float32))
    out, logits = _simple_op(flat, flat_mask, init, int(iterations), normalize == "inputs", bool(weighted_mean),
                             bool(need_logits), members)
    return out.view(*lead, n_out, n_dim), logits.view(*lead, n_in, n_out) if need_logits else None


def em_routing(votes, iterations, mask, beta_a, beta_u, min_var):
    """:func:`onmt_ext.mechanisms.routing.em_routing` (product density, constant inverse temperature 1) through the
    fused kernels; ``beta_a``/``beta_u`` are ``(O,)`` or None.  Returns ``outputs`` ``(..., O, D)`` and
    ``activations`` ``(..., O)`` in ``votes.dtype``."""
    lead, flat, flat_mask = _flat(votes, mask)
    n_out, n_dim = flat.shape[2:]
    beta_a, beta_u = (None if beta is None else beta.contiguous() for beta in (beta_a, beta_u))
    out, act = _em_op(flat, flat_mask, beta_a, beta_u, int(iterations), float(min_var))
    return out.view(*lead, n_out, n_dim), act.view(*lead, n_out)
