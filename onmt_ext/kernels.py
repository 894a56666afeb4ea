"""Fused CPU kernels for the routing core and clause attention (``onmt_ext/csrc/routing_kernels.c``).

:func:`onmt_ext.routing.simple_routing` and :func:`onmt_ext.routing.em_routing`
are written as tensor operations: each routing iteration is a few dozen
passes over the whole vote tensor, forward and backward.  At the model sizes
that run on a CPU, those small operations and their autograd bookkeeping
cost more than the arithmetic.  The C kernels here run each routing problem
from start to finish in a few buffers that stay in cache: one call for the
forward pass and one for the backward pass (which recomputes its problem's
iterations and then runs them in reverse).  The arithmetic is the same as the
tensor code's, and the tests compare values and gradients (float64).

When they are used: for tensors on the CPU in float32 or float64 (the
routing core up-casts half precision first), outside ``torch.compile``
tracing (``-routing_compile`` traces the tensor code), when the votes are
either one set per problem or shared by trailing problem dimensions
(see below), and, for EM routing, without a mask, with
the product density and with ``beta_a``/``beta_u`` of shape ``(O,)``.  On GPU,
and whenever the kernels cannot be built, the tensor code runs; the results
are the same up to float rounding.  Double backward is not supported.

Small problems (li2019's toy layers: I = 4 heads, O = 32 scalar capsules)
run lane-wise, 64 bytes of problems at a time with one problem per vector
lane, forward and backward, for EM routing and for simple routing with
unshared votes (see ``_LANES_MAX_BYTES`` for when, and the measurements).

Shared votes (cao2019's horizontal routing: votes ``(B, 1, L, H, M)`` shared
by the L problems of a sentence, problem l over the positions t <= l) have
their own kernel code: a problem visits only the inputs up to its last
unmasked one (masked inputs inside get a zero coupling; the logits of those
past it are their agreements, computed once at the end), the capsule and
input axes are padded with zeros to whole vectors so that every sum runs in
vector registers, and the forward pass keeps each problem's couplings and
sums for the backward pass instead of it recomputing them: T O (I + D + 1)
reals per problem, I and D rounded up to whole vectors, about 1 MB for a toy
layer (B = 50, H = 4, L = 12) and 7.5 MB for B = 40, H = 8, L = 30
(``_KEEP_STATE = False`` recomputes them).  Measured forward + backward on
one thread, ``_votes_and_positions`` and ``horizontal_output`` with
self-initialisation on a padded batch (one-off script): 4.2 against 1.4 ms
before (tensor code) and after for B = 50, H = 4, L = 12; 4.9 against 1.8 ms
for B = 25, H = 4, L = 20; 28.7 against 11.4 ms for B = 40, H = 8, L = 30.
(The first version of this kernel, which visited every input of every
problem, measured 6.3 ms for the toy layer, slower than the tensor code, and
was not dispatched.)

Building: the first use compiles the library with the C compiler (``$CC``,
else ``cc``) into ``$ONMT_EXT_KERNEL_CACHE`` (default
``~/.cache/onmt_ext``), keyed by the sources, the flags and the CPU, so a
shared home directory on different machines keeps one build per kind of CPU.
``make setup`` builds it (``python -m onmt_ext.kernels build``).  A failed
build logs one warning and the tensor code runs.  ``ONMT_EXT_FUSED=0`` turns
the kernels off.
"""

import argparse
import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from math import prod
from pathlib import Path

import torch

logger = logging.getLogger("onmt_ext")

SOURCE_DIR = Path(__file__).resolve().parent / "csrc"
SOURCES = ("routing_kernels.c", "routing_impl.h", "clause_impl.h")
#: Compile flags.  The relaxed-math flags let gcc vectorise the reductions and call glibc's vector exp/log
#: (libmvec, declared by math.h under __FAST_MATH__); -ffast-math itself is not used, because linking a
#: shared library with it sets flush-to-zero for the whole process, and finite-math-only is not assumed.
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros", "-fassociative-math",
         "-freciprocal-math", "-ffinite-math-only", "-D__FAST_MATH__", "-fPIC")
LIBS = ("-lpthread", "-lmvec", "-lm")
#: Vote elements per extra thread: smaller routings run on the calling thread alone.
_WORK_PER_THREAD = 1 << 16
#: Shared votes: the forward pass keeps each problem's couplings and sums for the backward pass (False: the
#: backward pass recomputes them, with less memory and more time).
_KEEP_STATE = True

_lock = threading.Lock()
_state = {"loaded": False, "library": None, "error": None}


def enabled():
    """False when ``ONMT_EXT_FUSED=0`` switches the kernels off."""
    return os.environ.get("ONMT_EXT_FUSED", "1") != "0"


def _cpu_key():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _compiler():
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or "cc"


def library_path():
    """Where the library for these sources, flags and this CPU is (or will be) cached."""
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update((SOURCE_DIR / name).read_bytes())
    digest.update(" ".join((_compiler(),) + FLAGS + LIBS).encode())
    digest.update(_cpu_key().encode())
    cache = Path(os.environ.get("ONMT_EXT_KERNEL_CACHE") or Path.home() / ".cache" / "onmt_ext")
    return cache / f"routing_kernels-{digest.hexdigest()[:16]}.so"


def build(force=False):
    """Compile the library if it is not cached yet; returns its path (raises ``RuntimeError`` on failure)."""
    target = library_path()
    if target.exists() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(handle)
    command = [_compiler(), *FLAGS, "-shared", "-o", partial, str(SOURCE_DIR / SOURCES[0]), *LIBS]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode:
            raise RuntimeError(f"{' '.join(command)} failed (exit {done.returncode}):\n{done.stderr.strip()}")
        os.replace(partial, target)  # atomic: concurrent processes never load a half-written file
    except OSError as error:
        raise RuntimeError(f"{' '.join(command)} could not run: {error}") from error
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


_POINTER, _INT64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int


def _declare(lib):
    for suffix, scalar in (("f32", ctypes.c_float), ("f64", ctypes.c_double), ("f32_d1", ctypes.c_float),
                           ("f64_d1", ctypes.c_double)):
        getattr(lib, f"simple_routing_forward_{suffix}").argtypes = [_POINTER] * 6 + [_INT64] * 5 + [_INT] * 5
        getattr(lib, f"simple_routing_backward_{suffix}").argtypes = [_POINTER] * 8 + [_INT64] * 5 + [_INT] * 5
        getattr(lib, f"simple_routing_state_size_{suffix}").argtypes = [_INT64] * 3 + [_INT]
        getattr(lib, f"simple_routing_state_size_{suffix}").restype = _INT64
        getattr(lib, f"em_routing_forward_{suffix}").argtypes = [_POINTER] * 4 + [scalar] + [_POINTER] * 2 + \
            [_INT64] * 6 + [_INT] * 3
        getattr(lib, f"em_routing_backward_{suffix}").argtypes = [_POINTER] * 4 + [scalar] + [_POINTER] * 5 + \
            [_INT64] * 6 + [_INT] * 3
        for name in ("simple_routing_forward", "simple_routing_backward", "em_routing_forward", "em_routing_backward"):
            getattr(lib, f"{name}_{suffix}").restype = _INT
    for suffix in ("f32", "f64"):
        getattr(lib, f"tanh_forward_{suffix}").argtypes = [_POINTER] * 2 + [_INT64, _INT]
        getattr(lib, f"tanh_backward_{suffix}").argtypes = [_POINTER] * 3 + [_INT64, _INT]
        getattr(lib, f"tanh_bias_forward_{suffix}").argtypes = [_POINTER] * 2 + [_INT64] * 3 + [_INT]
        getattr(lib, f"clause_mix_forward_{suffix}").argtypes = [_POINTER] * 5 + [_INT64] * 4 + [_INT]
        getattr(lib, f"clause_mix_backward_{suffix}").argtypes = [_POINTER] * 8 + [_INT64] * 4 + [_INT]
        for name in ("tanh_forward", "tanh_backward", "tanh_bias_forward", "clause_mix_forward",
                     "clause_mix_backward"):
            getattr(lib, f"{name}_{suffix}").restype = _INT
    return lib


def library():
    """The loaded kernels (``ctypes.CDLL``), built on first use; None when off or unavailable."""
    if not enabled():
        return None
    if not _state["loaded"]:
        with _lock:
            if not _state["loaded"]:
                try:
                    _state["library"] = _declare(ctypes.CDLL(str(build())))
                except (RuntimeError, OSError) as error:
                    _state["error"] = str(error)
                    logger.warning("onmt-ext: the fused CPU kernels are unavailable, routing and clause attention "
                                   "run as tensor operations (slower on the CPU, same results): %s", error)
                _state["loaded"] = True
    return _state["library"]


def usable(tensor):
    """True when the kernels can take ``tensor``: on the CPU, float32 or float64, not under ``torch.compile``
    tracing, and the library is built (or builds now)."""
    return (tensor.device.type == "cpu" and tensor.dtype in (torch.float32, torch.float64)
            and not torch.compiler.is_compiling() and library() is not None)


def _ptr(tensor):
    return None if tensor is None else ctypes.c_void_p(tensor.data_ptr())


def _threads(work):
    return max(1, min(torch.get_num_threads(), work // _WORK_PER_THREAD))


def _suffix(dtype):
    return "f32" if dtype == torch.float32 else "f64"


def _function(name, dtype, dim):
    """The entry point for ``dtype``; the one compiled for capsules of size 1 when ``dim`` is 1."""
    return getattr(library(), f"{name}_{_suffix(dtype)}{'_d1' if dim == 1 else ''}")


def _check(status, name):
    if status:
        raise MemoryError(f"onmt-ext fused routing kernel {name}: could not allocate its working buffers")


#: The routing kernels run lane-wise, 64 bytes of problems at a time with one problem per vector lane
#: (``em_forward_lanes`` and the others in ``csrc/routing_impl.h``), when the outputs are few (O <= 32) or the
#: capsules are vectors (D >= 4), and a tile's votes and couplings, ``I O (D + 1)`` vectors of 64 bytes, take
#: at most this many bytes.  Measured on one thread (one-off scripts, float32, votes head-major for EM),
#: per-problem code against lane-wise code:
#:
#: * EM forward: li2019's toy layer (448 problems of I = 4, O = 32, D = 1) 450 against 216 us; I = 4, O = 8,
#:   D = 4: 777 against 133 us; I = 8, O = 32, D = 8 (200 problems): 1375 against 823 us.  With D = 1 the
#:   per-problem code was as fast or faster from O = 64 on (I = 8, 400 problems: 869 against 845 us at
#:   O = 64, 1335 against 1894 at O = 128; 13.6 against 20.7 ms at Transformer-Base, O = 512, 1024 problems).
#: * Simple routing (weighted mean), forward and forward + backward: the toy layer 339 / 928 against
#:   219 / 641 us; I = 8, O = 32, D = 8: 1083 / 4529 against 710 / 2672 us; O = 64, D = 1: 761 / 2220 against
#:   780 / 2286 us; Base: 14.2 / 40.9 against 19.1 / 56.8 ms.
_LANES_MAX_BYTES = 256 * 1024


def _lanes(inputs, outputs, dim):
    """True when routing problems of this size run lane-wise (see ``_LANES_MAX_BYTES``)."""
    return (outputs <= 32 or dim >= 4) and inputs * outputs * (dim + 1) * 64 <= _LANES_MAX_BYTES


def _records_graph(*tensors):
    """True when autograd is on and one of ``tensors`` (None allowed) wants a gradient: then a kernel runs
    through its ``autograd.Function``; otherwise (translation, ``torch.no_grad``) its forward pass is called
    directly, without the Function's bookkeeping (about 25 us per toy li2019 layer)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _simple_forward(votes, keep, init, problems, iterations, normalize_inputs, weighted_mean, keep_state=False):
    """The simple-routing kernel's forward pass: ``(outputs (G, S, O, D), logits (G, S, I, O), settings, state)``;
    ``state`` (what the backward pass would recompute) only when ``keep_state``."""
    groups, inputs, outputs, dim = votes.shape
    out = votes.new_empty(groups, problems, outputs, dim)
    logits = votes.new_empty(groups, problems, inputs, outputs)
    settings = (groups, problems, inputs, outputs, dim, iterations, int(normalize_inputs), int(weighted_mean))
    state = None
    if keep_state:
        size = _function("simple_routing_state_size", votes.dtype, dim)(inputs, outputs, dim, iterations)
        state = votes.new_empty(groups * problems * size)
    status = _function("simple_routing_forward", votes.dtype, dim)(
        _ptr(votes), _ptr(keep), _ptr(init), _ptr(out), _ptr(logits), _ptr(state), *settings,
        _threads(votes.numel() * problems), problems == 1 and _lanes(inputs, outputs, dim))
    _check(status, "simple_routing_forward")
    return out, logits, settings, state


class _SimpleRouting(torch.autograd.Function):
    """Fused :func:`onmt_ext.routing.simple_routing` on prepared votes ``(G, I, O, D)``, S problems per group.

    With shared votes (S > 1) and a gradient to compute, the forward pass keeps each problem's couplings and
    sums for the backward pass (the kernel's ``state``) instead of the backward pass recomputing them.
    """

    @staticmethod
    def forward(ctx, votes, keep, init, problems, iterations, normalize_inputs, weighted_mean):
        keep_state = problems > 1 and _KEEP_STATE and (ctx.needs_input_grad[0] or ctx.needs_input_grad[2])
        out, logits, settings, state = _simple_forward(votes, keep, init, problems, iterations, normalize_inputs,
                                                       weighted_mean, keep_state)
        ctx.save_for_backward(votes, keep, init)
        ctx.settings, ctx.state = settings, state
        ctx.set_materialize_grads(False)
        return out, logits

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out, grad_logits):
        votes, keep, init = ctx.saved_tensors
        grad_votes = torch.zeros_like(votes)
        grad_init = torch.empty_like(init) if init is not None and ctx.needs_input_grad[2] else None
        contiguous = [None if g is None else g.contiguous() for g in (grad_out, grad_logits)]
        status = _function("simple_routing_backward", votes.dtype, votes.size(-1))(
            _ptr(votes), _ptr(keep), _ptr(init), _ptr(contiguous[0]), _ptr(contiguous[1]), _ptr(ctx.state),
            _ptr(grad_votes), _ptr(grad_init), *ctx.settings, _threads(votes.numel() * ctx.settings[1]),
            ctx.settings[1] == 1 and _lanes(*votes.shape[1:]))
        _check(status, "simple_routing_backward")
        ctx.state = None
        return grad_votes, None, grad_init, None, None, None, None


def _em_forward(votes, beta_a, beta_u, lambdas, min_var, iterations):
    """The EM kernel's forward pass: ``(outputs (G, O, D), activations (G, O), settings)``."""
    groups, inputs, outputs, dim = votes.shape
    out = votes.new_empty(groups, outputs, dim)
    act = votes.new_empty(groups, outputs)
    settings = (groups, inputs, outputs, dim, votes.stride(0), votes.stride(1), iterations)
    status = _function("em_routing_forward", votes.dtype, dim)(
        _ptr(votes), _ptr(beta_a), _ptr(beta_u), _ptr(lambdas), min_var, _ptr(out), _ptr(act), *settings,
        _threads(votes.numel()), _lanes(inputs, outputs, dim))
    _check(status, "em_routing_forward")
    return out, act, settings


class _EMRouting(torch.autograd.Function):
    """Fused :func:`onmt_ext.routing.em_routing` (no mask, product density) on votes ``(G, I, O, D)``.

    The votes may be strided between groups and between inputs (each input's ``(O, D)`` block contiguous), as
    the head-major votes of li2019's capsule maps are; their gradient gets the same strides.
    """

    @staticmethod
    def forward(ctx, votes, beta_a, beta_u, lambdas, min_var, iterations):
        out, act, settings = _em_forward(votes, beta_a, beta_u, lambdas, min_var, iterations)
        ctx.save_for_backward(votes, beta_a, beta_u, lambdas)
        ctx.min_var, ctx.settings = min_var, settings
        ctx.set_materialize_grads(False)
        return out, act

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out, grad_act):
        votes, beta_a, beta_u, lambdas = ctx.saved_tensors
        groups, _, outputs = ctx.settings[:3]
        grad_votes = torch.empty_strided(votes.shape, votes.stride(), dtype=votes.dtype)  # all written by the kernel
        grad_beta_a, grad_beta_u = votes.new_empty(groups, outputs), votes.new_empty(groups, outputs)
        contiguous = [None if g is None else g.contiguous() for g in (grad_out, grad_act)]
        status = _function("em_routing_backward", votes.dtype, votes.size(-1))(
            _ptr(votes), _ptr(beta_a), _ptr(beta_u), _ptr(lambdas), ctx.min_var, _ptr(contiguous[0]),
            _ptr(contiguous[1]), _ptr(grad_votes), _ptr(grad_beta_a), _ptr(grad_beta_u), *ctx.settings,
            _threads(votes.numel()), _lanes(*votes.shape[1:]))
        _check(status, "em_routing_backward")
        return (grad_votes, None if beta_a is None else grad_beta_a.sum(0),
                None if beta_u is None else grad_beta_u.sum(0), None, None, None)


def _groups(votes_lead, lead):
    """``(G, S)`` when votes ``votes_lead`` serve problems ``lead`` as G groups of S problems, else None.

    The votes may be shared only along trailing problem dimensions (size 1
    in ``votes_lead``), as in cao2019's horizontal routing: votes
    ``(B, 1)`` for problems ``(B, L)`` give G = B, S = L.
    """
    if len(votes_lead) != len(lead):
        return None
    split = next((k for k, (a, b) in enumerate(zip(votes_lead, lead)) if a != b), len(lead))
    if any(size != 1 for size in votes_lead[split:]):
        return None
    return prod(lead[:split]), prod(lead[split:])


def simple_routing(v, keep, init_logits, lead, iterations, normalize, weighted_mean):
    """The fused :func:`onmt_ext.routing.simple_routing` after its ``_prepare``, or None where it does not apply.

    Args:
        v: prepared votes ``(..., I, O, D)`` (at least float32, masked votes zeroed).
        keep: ``(..., I, 1)`` float mask or None.
        init_logits: ``(..., I, O)`` or None.
        lead: the problems' leading shape followed by I.

    Returns:
        ``(outputs (..., O, D), logits (..., I, O))`` in ``v.dtype``, or None.
    """
    if not usable(v):
        return None
    sizes = _groups(tuple(v.shape[:-3]), tuple(lead[:-1]))
    if sizes is None:
        return None
    groups, problems = sizes
    inputs, outputs, dim = v.shape[-3:]
    votes = v.reshape(groups, inputs, outputs, dim).contiguous()
    if keep is not None:
        keep = keep.to(v.dtype).reshape(groups, problems, inputs).contiguous()
    if init_logits is not None:
        init_logits = init_logits.to(v.dtype).reshape(groups, problems, inputs, outputs).contiguous()
    arguments = (votes, keep, init_logits, problems, int(iterations), normalize == "inputs", bool(weighted_mean))
    if _records_graph(votes, init_logits):
        out, logits = _SimpleRouting.apply(*arguments)
    else:
        out, logits = _simple_forward(*arguments)[:2]
    return out.reshape(tuple(lead[:-1]) + (outputs, dim)), logits.reshape(tuple(lead) + (outputs,))


def _block_strided(votes):
    """``votes`` ``(G, I, O, D)`` itself when each ``(O, D)`` block is contiguous and blocks do not overlap, else a
    contiguous copy: the EM kernel takes any strides between groups and inputs (head-major votes need no copy)."""
    outputs, dim = votes.shape[2:]
    blocks = (outputs * dim == 1 or (votes.stride(3) == 1 or dim == 1) and (votes.stride(2) == dim or outputs == 1))
    if not blocks:
        return votes.contiguous()
    extents = sorted((votes.stride(k), votes.shape[k]) for k in (0, 1) if votes.shape[k] > 1)
    covered = outputs * dim  # each stride must step past everything the smaller ones reach
    for stride, size in extents:
        if stride < covered:
            return votes.contiguous()
        covered = stride * (size - 1) + covered
    return votes


def _beta(beta, outputs, dtype):
    """A beta as a contiguous ``(O,)`` tensor, None for None; False when its shape is not per output."""
    if beta is None:
        return None
    if beta.dim() > 1 or beta.numel() not in (1, outputs):
        return False
    if beta.dtype == dtype and beta.shape == (outputs,) and beta.is_contiguous():
        return beta  # li2019's learnt betas: used as they are
    return beta.to(dtype).expand(outputs).contiguous()


_LAMBDAS = {}  # (schedule values, dtype) -> tensor: the same few schedules, every call


def _lambdas(values, dtype):
    key = (tuple(values), dtype)
    if key not in _LAMBDAS:
        with torch.inference_mode(False):  # a normal tensor even when first made under inference_mode, so that
            _LAMBDAS[key] = torch.tensor(values, dtype=dtype)  # a later training step can save it for backward
    return _LAMBDAS[key]


def em_routing(v, iterations, lambdas, beta_a, beta_u, min_var):
    """The fused :func:`onmt_ext.routing.em_routing` (no mask, product density), or None where it does not apply.

    Args:
        v: votes ``(..., I, O, D)``, at least float32.
        lambdas: the inverse temperature of each iteration (T floats).
        beta_a, beta_u: None or tensors of shape ``(O,)`` or ``(1,)`` (else None is returned).

    Returns:
        ``(outputs (..., O, D), activations (..., O))`` in ``v.dtype``, or None.
    """
    if not usable(v):
        return None
    inputs, outputs, dim = v.shape[-3:]
    beta_a, beta_u = _beta(beta_a, outputs, v.dtype), _beta(beta_u, outputs, v.dtype)
    if beta_a is False or beta_u is False:
        return None
    lead = tuple(v.shape[:-3])
    votes = _block_strided(v.reshape(prod(lead), inputs, outputs, dim))
    lambdas = _lambdas(lambdas, v.dtype)
    arguments = (votes, beta_a, beta_u, lambdas, float(min_var), int(iterations))
    if _records_graph(votes, beta_a, beta_u):
        out, act = _EMRouting.apply(*arguments)
    else:
        out, act, _ = _em_forward(*arguments)
    return out.reshape(lead + (outputs, dim)), act.reshape(lead + (outputs,))


def _tanh_forward(x, bias):
    """The in-place tanh kernel on ``x`` (``+ bias`` first when given, see :func:`tanh_`); returns ``x``."""
    library_, suffix, threads = library(), _suffix(x.dtype), _threads(x.numel())
    if bias is None:
        status = getattr(library_, f"tanh_forward_{suffix}")(_ptr(x), _ptr(x), x.numel(), threads)
    else:
        status = getattr(library_, f"tanh_bias_forward_{suffix}")(_ptr(x), _ptr(bias), x.numel(), x.size(2),
                                                                  x.size(1), threads)
    _check(status, "tanh_forward")
    return x


class _Tanh(torch.autograd.Function):
    """Fused in-place ``torch.tanh(x [+ bias])`` of a contiguous tensor; the backward pass reads the output."""

    @staticmethod
    def forward(ctx, x, bias):
        _tanh_forward(x, bias)
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)
        return x

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        grad = grad.contiguous()
        grad_x = torch.empty_like(y)
        status = getattr(library(), f"tanh_backward_{_suffix(y.dtype)}")(_ptr(y), _ptr(grad), _ptr(grad_x), y.numel(),
                                                                           _threads(y.numel()))
        _check(status, "tanh_backward")
        return grad_x, (grad_x.sum(1) if ctx.needs_input_grad[1] else None)


def tanh_(x, bias=None):
    """``torch.tanh(x)``, or ``torch.tanh(x + bias.unsqueeze(1))`` with ``x`` ``(P, M, K)`` and ``bias``
    ``(P, K)``, computed in place in ``x`` with glibc's vector tanh where the kernels take ``x``.

    ``torch.tanh`` runs at about 3 ns per float32 element on this CPU, seven times ``torch.sigmoid``; for
    li2019's capsule maps (eq. 5, ``(H, B*L, d)`` per layer) that was 11 of a Base layer's 227 ms.  The bias
    is added inside the same pass, so that the map before it can be a plain ``bmm`` rather than a ``baddbmm``,
    which first writes the broadcast bias into its whole output (at Transformer-Base, about 0.5 ms of the
    15 ms that one layer's aggregation takes for a batch of 224 tokens).  ``x`` must be a fresh tensor that no
    other autograd node needs (a matrix product's output); elsewhere, or where the kernels do not apply, the
    result is ``torch.tanh(x)`` or ``torch.tanh(x.add_(bias.unsqueeze(1)))``.  Without a graph to record
    (:func:`_records_graph`) the kernel is called directly.
    """
    fused = usable(x) and x.is_contiguous() and (bias is None or (
        x.dim() == 3 and x.numel() > 0 and bias.shape == (x.size(0), x.size(2)) and bias.dtype == x.dtype
        and bias.is_contiguous()))
    if not fused:
        return torch.tanh(x) if bias is None else torch.tanh(x.add_(bias.unsqueeze(1)))
    if _records_graph(x, bias):
        return _Tanh.apply(x, bias)
    return _tanh_forward(x, bias)


class _ClauseMix(torch.autograd.Function):
    """Fused clause attention mix (:func:`clause_mix`)."""

    @staticmethod
    def forward(ctx, scores, spans, global_weight, level_weights):
        batch, heads, length, _ = scores.shape
        out = torch.empty_like(scores)
        settings = (batch, heads, length, spans.size(1))
        work = scores.numel() * (1 + spans.size(1))
        status = getattr(library(), f"clause_mix_forward_{_suffix(scores.dtype)}")(
            _ptr(scores), _ptr(spans), _ptr(global_weight), _ptr(level_weights), _ptr(out), *settings, _threads(work))
        _check(status, "clause_mix_forward")
        ctx.save_for_backward(scores, spans, global_weight, level_weights)
        ctx.settings, ctx.work = settings, work
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        scores, spans, global_weight, level_weights = ctx.saved_tensors
        grad_scores = torch.empty_like(scores)
        grad_global, grad_levels = torch.empty_like(global_weight), torch.empty_like(level_weights)
        status = getattr(library(), f"clause_mix_backward_{_suffix(scores.dtype)}")(
            _ptr(scores), _ptr(spans), _ptr(global_weight), _ptr(level_weights), _ptr(grad_out.contiguous()),
            _ptr(grad_scores), _ptr(grad_global), _ptr(grad_levels), *ctx.settings, _threads(ctx.work))
        _check(status, "clause_mix_backward")
        return grad_scores, None, grad_global, grad_levels


def clause_mix(scores, spans, global_weight, level_weights):
    """Eq. 4-5 of clause attention in one pass per row, or None where the kernels do not apply.

    ``y = global_weight * softmax(scores) + sum_d level_weights[d] * softmax(scores over span d)``, row by
    row (see :meth:`onmt_ext.clause_attention.ClauseAttention.forward`).

    Args:
        scores: masked scores ``(batch, H, len, len)``, float32 or float64.
        spans: ``(batch, Dd, len, 2)`` int32, the keys ``[s, e)`` of each query's clause at each of the Dd
            levels mixed, coarse to fine: clauses are contiguous (``e > s``) and nested, each level's span
            inside the coarser level's (:meth:`onmt_ext.clause_attention.ClauseStructure.spans`).
        global_weight: ``(batch, H, len)`` (broadcastable), the weight of the global softmax.
        level_weights: ``(Dd, batch, H, len)`` (broadcastable), the weight of each local softmax.

    Returns:
        the probabilities ``(batch, H, len, len)`` in ``scores.dtype``, or None.
    """
    if not usable(scores):
        return None
    batch, heads, length, keys = scores.shape
    if keys != length or spans.shape != (batch, spans.size(1), length, 2) or spans.dtype != torch.int32:
        raise ValueError(f"clause_mix: scores {tuple(scores.shape)} and spans {tuple(spans.shape)} "
                         f"({spans.dtype}) do not fit")
    levels = spans.size(1)
    global_weight = global_weight.to(scores.dtype).expand(batch, heads, length).contiguous()
    level_weights = level_weights.to(scores.dtype).expand(levels, batch, heads, length).contiguous()
    return _ClauseMix.apply(scores.contiguous(), spans.contiguous(), global_weight, level_weights)


def main(argv=None):
    """``python -m onmt_ext.kernels build|status``."""
    parser = argparse.ArgumentParser(prog="python -m onmt_ext.kernels", description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=["build", "status"])
    args = parser.parse_args(argv)
    if args.action == "build":
        try:
            print(f"built: {build()}")
        except RuntimeError as error:
            print(f"onmt-ext: could not build the fused CPU kernels; routing and clause attention will run as "
                  f"tensor operations: {error}", file=sys.stderr)
            return 1
        return 0
    path = library_path()
    print(f"{'built' if path.exists() else 'not built'}: {path}; {'enabled' if enabled() else 'disabled (ONMT_EXT_FUSED=0)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
