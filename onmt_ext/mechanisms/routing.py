"""Routing by agreement between capsules: the one routing core of onmt-ext.

Pure tensor functions shared by the three capsule papers: li2019's head
aggregation, cao2019's cross aggregation of attention logits and GRET's
sentence capsules.  ``votes`` is ``(..., I, O, D)``, the vote of input
capsule ``i`` for output capsule ``o``; leading dimensions (batch, positions,
...) are routed independently in one vectorised pass.  ``mask`` is
``(..., I)`` bool, True where input ``i`` takes part.

Numerics: at least float32, also under autocast (votes up-cast, autocast off
inside, outputs cast back); masked votes zeroed, norms and variances floored,
EM densities in log space.  Memory: :func:`recompute_in_backward` (docs/li2019.md).
Speed: on CUDA the fused kernels of :mod:`onmt_ext.mechanisms.routing_triton` route the problems they cover
(one program per problem; :func:`kernel_choice`, docs/kernels.md).
"""

import contextlib
import functools
import importlib
import math
import os
import sys
import threading
import warnings

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

_NORM_EPS = 1e-12  # inside the square root of squash()
_NORM_EPS_ROOT = math.sqrt(_NORM_EPS)
_MIN_TOTAL = 1e-6  # floor of coupling totals used as denominators
_LOG_2PI = math.log(2.0 * math.pi)


def chi_constant(n_dim):
    """The part of EM's cost ``chi_o`` that is the same for every capsule: ``D (1 + log 2 pi) / 2`` per unit of
    ``S_o`` (:func:`em_routing`, where it joins ``beta_u``; the fused kernels take it as it is)."""
    return 0.5 * n_dim * (1.0 + _LOG_2PI)


def squash(s, dim=-1):
    """Squashing non-linearity, li2019 eq. 8 (Sabour et al. 2017).

    ``squash(s) = |s|^2 / (1 + |s|^2) * s / |s|`` along ``dim``; any shape.
    Written as ``s / (n + 1/n)`` with ``n = sqrt(|s|^2 + eps)``, which is
    0 at ``s = 0`` with a finite gradient.
    """
    if s.shape[dim] == 1:
        return _squash_scalar(s, s.new_full((), _NORM_EPS_ROOT))
    norm = torch.sqrt((s * s).sum(dim=dim, keepdim=True) + _NORM_EPS)
    return s / (norm + norm.reciprocal())


def _squash_scalar(s, eps_root):
    """:func:`squash` of capsules of one value (li2019 with N = d): ``n = hypot(s, sqrt(eps))``, one operator.

    ``eps_root`` is ``sqrt(eps)`` as a 0-dim tensor of ``s``'s dtype and
    device, made once per routing.
    """
    norm = torch.hypot(s, eps_root)
    return s / (norm + norm.reciprocal())


def _prepare(votes, mask):
    """Up-cast votes to at least float32 and zero masked inputs.

    Returns ``(votes, keep, lead)``: ``keep`` is the mask in ``v``'s dtype
    ``(..., I, 1)`` (None without a mask) and ``lead`` the leading shape of
    the routing problems.  ``votes`` may broadcast against ``mask``: votes
    ``(B, 1, I, O, D)`` with a mask ``(B, L, I)`` route L problems over the
    same votes (cao2019's horizontal routing) without copying them L times.
    Such shared votes are zeroed where their input is masked in *every*
    problem; elsewhere the zero coupling keeps them out, so they must be finite.
    """
    if votes.dim() < 3:
        raise ValueError(f"votes must be (..., I, O, D), got shape {tuple(votes.shape)}")
    v = at_least_float32(votes)
    if mask is None:
        return v, None, tuple(v.shape[:-2])
    lead = tuple(votes.shape[:-2])
    try:
        broadcast = torch.broadcast_shapes(lead, tuple(mask.shape))
    except RuntimeError:
        broadcast = None
    if broadcast != tuple(mask.shape) or len(lead) != mask.dim():
        raise ValueError(f"mask must be (..., I) = {lead} (or a shape the votes broadcast to), "
                         f"got {tuple(mask.shape)}")
    keep = mask.bool()
    shared = [dim for dim, size in enumerate(lead) if size == 1 and mask.shape[dim] > 1]
    keep_votes = keep.any(dim=shared, keepdim=True) if shared else keep
    v = v.masked_fill(~keep_votes[..., None, None], 0.0)
    return v, keep[..., None].to(v.dtype), tuple(mask.shape)


def at_least_float32(tensor):
    """``tensor`` in float32, or unchanged if it is float32 or float64 already."""
    if tensor.dtype in (torch.float32, torch.float64):
        return tensor
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))


def without_autocast(fn):
    """Run ``fn(tensor, ...)`` with autocast off on ``tensor``'s device (the routing promises float32 arithmetic).

    Under ``torch.autocast`` the matrix products inside ``einsum`` would
    otherwise run in fp16/bf16 even on float32 inputs.
    """

    @functools.wraps(fn)
    def wrapper(tensor, *args, **kwargs):
        if tensor.device.type not in ("cpu", "cuda"):
            return fn(tensor, *args, **kwargs)
        with torch.autocast(tensor.device.type, enabled=False):
            return fn(tensor, *args, **kwargs)

    return wrapper


def recompute_in_backward(fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, keeping only ``args`` for the backward pass, which runs ``fn`` again.

    Where grad mode is on and a tensor argument requires grad, ``fn`` runs
    under ``torch.utils.checkpoint`` (non-reentrant): the tensors that ``fn``'s
    operations save for backward are dropped and made again by a second
    forward pass of ``fn`` when the backward pass reaches it, under the
    autocast state of the first.  The arithmetic is the same, so outputs and
    gradients are bitwise those of ``fn`` itself (``tests/unit/test_routing.py``).
    Elsewhere (inference, step-by-step decoding, ``torch.no_grad``) it is
    ``fn(*args, **kwargs)``, with nothing added.  ``fn`` must be
    deterministic: no dropout or other random draws.  Dynamo traces it (the
    checkpoint becomes a recomputed region of the compiled graph).
    """
    if torch.is_grad_enabled() and any(torch.is_tensor(a) and a.requires_grad for a in args):
        return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=False, **kwargs)
    return fn(*args, **kwargs)


#: the environment variable that chooses the routing's implementation (:func:`kernel_choice`)
KERNEL_VARIABLE = "ONMT_EXT_ROUTING_KERNEL"
KERNEL_CHOICES = ("auto", "torch", "triton")


def kernel_choice():
    """``ONMT_EXT_ROUTING_KERNEL``: ``auto`` (unset: the fused Triton kernels for CUDA tensors, this module's
    PyTorch code elsewhere), ``torch`` (this module's code everywhere: the reference, for debugging) or
    ``triton`` (the kernels on every device; without CUDA through Triton's interpreter, for tests).  Problems
    the kernels do not cover (:func:`_fused_kernels`) run this module's code under every choice."""
    value = os.environ.get(KERNEL_VARIABLE, "").strip() or "auto"
    if value not in KERNEL_CHOICES:
        raise ValueError(f"{KERNEL_VARIABLE}={value!r} is not one of {', '.join(KERNEL_CHOICES)}")
    return value


_KERNEL_MODULE = "onmt_ext.mechanisms.routing_triton"
_KERNELS = []  # the error that stopped their import


def _fused_kernels(votes, mask=None, init_logits=None, chunked=False):
    """:mod:`onmt_ext.mechanisms.routing_triton` where :func:`kernel_choice` and the call allow it, else None.

    The kernels take votes ``(..., I, O, D)`` in float32, float16 or bfloat16 whose ``(I, O, D)`` fits one
    program, or with ``chunked`` (simple routing) whose ``(I, O)`` does, the votes then read in chunks of D
    (:func:`onmt_ext.mechanisms.routing_triton.fits`), with a mask ``(..., I)`` of the votes' own leading shape
    (or, ``chunked``, votes shared by the mask's problems, as cao2019's horizontal routing has them) and starting
    logits of the mask's shape and O.
    """
    choice = kernel_choice()
    if choice == "torch" or (choice == "auto" and not _on_cuda(votes)):
        return None
    if votes.dim() < 3 or votes.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return None
    problems = tuple(votes.shape[:-2]) if mask is None else tuple(mask.shape)
    if problems != tuple(votes.shape[:-2]) and not chunked:
        return None
    if init_logits is not None and tuple(init_logits.shape) != problems + (votes.shape[-2],):
        return None
    kernels = sys.modules.get(_KERNEL_MODULE) or _load_kernels()
    return kernels if kernels is not None and kernels.fits(votes, chunked, mask) else None


def prepare_kernels(tensor):
    """Import the fused kernels where routing on ``tensor``'s device would use them: a module calls it with its
    input before its core, which ``-ext_compile`` traces, and a trace cannot import them."""
    if _KERNEL_MODULE not in sys.modules and (_on_cuda(tensor) or kernel_choice() == "triton"):
        _load_kernels()


def _on_cuda(tensor):
    """Whether ``tensor`` is on a CUDA device, where ``auto`` routes through the kernels (one place, which the
    tests replace to take that choice on a machine without CUDA)."""
    return tensor.device.type == "cuda"


def _load_kernels():
    """Import :mod:`onmt_ext.mechanisms.routing_triton`, once; None without Triton (one warning), or inside
    ``torch.compile``'s trace, which cannot import (:func:`prepare_kernels`)."""
    if _KERNELS or torch.compiler.is_compiling():
        return None
    try:
        return importlib.import_module(_KERNEL_MODULE)
    except ImportError as error:  # a CUDA torch without Triton
        warnings.warn(f"onmt-ext: the fused routing kernels need Triton ({error}); routing runs unfused")
        _KERNELS.append(error)
        return None


_TRUSTED = {}


def _kernels_trusted(kind, votes, fused, reference, extras, variant):
    """Whether the fused kernels may route ``votes`` as ``kind`` (the method and its settings, ``(method, ((name,
    value), ...))``): checked once per kind, compiled kernel ``variant`` (its block sizes:
    :func:`onmt_ext.mechanisms.routing_triton.variant`), dtype and device, on its first eager call, at that
    call's shape.  Keyed by variant, not by shape: GRET's and cao2019's problems grow with the sentence, and a
    check per length would read values back to the host in training steps long after the first.

    The check routes 3 random problems of that shape through ``fused`` and ``reference`` (callables of
    ``(votes, *extras())``, ``extras()`` the other inputs of 3 random problems, or None) and compares
    outputs and gradients with the reference in float64: the kernels may be no further from it than 4 times
    the reference in the votes' dtype, or the dtype's rounding.  A kernel that fails to compile or to agree is
    named in one warning and the routing runs unfused for that call's kind.  Inside ``torch.compile``'s trace
    nothing can run, and the kernels are used unchecked.
    """
    key = (kind, variant, votes.dtype, votes.device.type)
    if key not in _TRUSTED:
        if torch.compiler.is_compiling():
            return True
        method, settings = kind
        problem = (f"{method} ({', '.join(f'{name}={value}' for name, value in settings)}) routing of "
                   f"({', '.join(map(str, votes.shape[-3:]))}) votes in {votes.dtype} on {votes.device.type}")
        failure = _isolated(_kernel_disagreement, votes, fused, reference, extras, device=votes.device)
        if failure:
            warnings.warn(f"onmt-ext: the fused kernel for {problem} failed its first-use check ({failure}); this "
                          f"routing runs unfused (docs/kernels.md)")
        _TRUSTED[key] = failure is None
    return _TRUSTED[key]


def _isolated(check, *args, device=None):
    """``check(*args)`` in a thread of its own, with grad mode on and autocast off (thread-local states): the
    caller's autograd context (a checkpoint's saved-tensor hooks, no_grad, autocast) sees nothing of it.  On a
    CUDA ``device`` the thread makes it current, as the caller's thread has it (a new thread's is GPU 0, where
    Triton would launch the kernels of a rank on another GPU).  Returns its result, or the first line of what
    it raised."""
    result = {}

    def target():
        try:
            with torch.enable_grad(), _current(device):
                result["value"] = check(*args)
        except Exception as error:  # a kernel that does not compile on this device, or its launch
            text = str(error).strip()
            result["value"] = f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"

    thread = threading.Thread(target=target, name="onmt-ext routing kernel check")
    thread.start()
    thread.join()
    return result["value"]


def _current(device):
    """Context: ``device`` is the thread's current CUDA device (nothing for another device or None)."""
    return torch.cuda.device(device) if device is not None and device.type == "cuda" else contextlib.nullcontext()


def _kernel_disagreement(votes, fused, reference, extras):
    """What :func:`_kernels_trusted` found wrong, or None."""
    generator = torch.Generator().manual_seed(0)
    sample = torch.randn(3, *votes.shape[-3:], generator=generator)
    unit = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}.get(votes.dtype, 1e-5)
    runs = []
    others = extras()
    for fn, dtype in ((fused, votes.dtype), (reference, votes.dtype), (reference, torch.float64)):
        inputs = [x if x is None else x.to(votes.device, dtype if x.is_floating_point() else x.dtype)
                  .requires_grad_(x.is_floating_point()) for x in [sample, *others]]
        outputs = [out for out in fn(*inputs) if out is not None]
        weights = torch.Generator().manual_seed(1)
        loss = sum((out * torch.randn(out.shape, generator=weights).to(out)).sum() for out in outputs)
        floating = [x for x in inputs if x is not None and x.requires_grad]
        runs.append([out.detach() for out in outputs] + list(torch.autograd.grad(loss, floating)))
    for index, (got, reference_value, truth) in enumerate(zip(*runs)):
        error = (got.double() - truth).abs().max().item()
        allowed = 4 * (reference_value.double() - truth).abs().max().item() + unit * max(truth.abs().max().item(), 1)
        if not error <= allowed:
            return f"result {index} is {error:.3g} from the float64 reference, {allowed:.3g} allowed"
    return None


def _positive(total):
    """A coupling total as a denominator, floored at ``_MIN_TOTAL``.

    Exact for every output that receives any real coupling; an output with
    (almost) none gets a zero mean instead of 0/0, and finite gradients (a
    floor near the float32 ``tiny`` would square to 0 in the backward pass).
    ``threshold(x, m, m)`` is ``max(x, m)``; its backward pass is one
    operator (``clamp_min``'s is three).
    """
    return F.threshold(total, _MIN_TOTAL, _MIN_TOTAL)


def _weighted_sum(coupling, v):
    """``sum_i C_io V_iod`` -> ``(..., O, D)``.

    A broadcast product and sum, unless the votes are shared across leading
    dimensions (cao2019's horizontal routing: votes ``(B, 1, I, O, D)``
    against couplings ``(B, L, I, O)``), where ``einsum``'s batched matrix
    products avoid forming the product L times.  Measured forward + backward
    on one CPU thread, the product is 2-3 times faster than ``einsum`` for
    the unshared shapes of li2019 (D = 1 to 32), cao2019's vertical routing
    and GRET (D = 8 to 128), and several times slower for shared votes.
    """
    if coupling.shape != v.shape[:-1]:
        return torch.einsum("...io,...iod->...od", coupling, v)
    return (coupling.unsqueeze(-1) * v).sum(dim=-3)


def _agreement(v, outputs):
    """``<V_io, out_o>`` -> ``(..., I, O)`` (Alg. 1 line 6); the choice of :func:`_weighted_sum`."""
    if v.shape[-1] == 1:
        return (v * outputs.unsqueeze(-3)).squeeze(-1)
    if v.shape[:-3] != outputs.shape[:-2]:
        return torch.einsum("...iod,...od->...io", v, outputs)
    return (v * outputs.unsqueeze(-3)).sum(dim=-1)


def _sum_last(x):
    """``x.sum(-1)``, a view where the last dimension has one element (li2019's default N = d: D = 1)."""
    return x.squeeze(-1) if x.shape[-1] == 1 else x.sum(dim=-1)


def _check_iterations(iterations):
    if int(iterations) != iterations or iterations < 1:
        raise ValueError(f"routing iterations must be an integer >= 1, got {iterations!r}")


def _coupling(logits, normalize, keep, dropped=None):
    """Step 1 of :func:`simple_routing`: ``C`` ``(..., I, O)`` from the logits, zero where ``keep`` is 0.

    ``dropped`` is ``keep == 0``, where the caller has it already.
    """
    if normalize == "outputs":
        coupling = torch.softmax(logits, dim=-1)
    else:
        if keep is not None and dropped is None:
            dropped = keep == 0
        scores = logits if keep is None else logits.masked_fill(dropped, torch.finfo(logits.dtype).min)
        coupling = torch.softmax(scores.transpose(-1, -2), dim=-1).transpose(-1, -2)
    return coupling if keep is None else coupling * keep


@without_autocast
def coupling_coefficients(logits, normalize="outputs", mask=None):
    """The coupling ``C`` that routing logits ``B`` ``(..., I, O)`` give (step 1 of :func:`simple_routing`).

    ``C = softmax(B)`` over the outputs (``normalize="outputs"``) or over the
    unmasked inputs (``"inputs"``); masked inputs ``mask`` ``(..., I)`` get 0.
    With the logits :func:`simple_routing` returns after ``T - 1``
    iterations, this is the coupling its T-th iteration uses; cao2019's
    near-zero statistic reads it this way.  Returns ``(..., I, O)`` in at
    least float32.
    """
    if normalize not in ("outputs", "inputs"):
        raise ValueError(f"normalize must be 'outputs' or 'inputs', got {normalize!r}")
    logits = at_least_float32(logits)
    return _coupling(logits, normalize, None if mask is None else mask.bool()[..., None].to(logits.dtype))


@without_autocast
def simple_routing(votes, iterations=3, *, normalize="outputs", weighted_mean=False, init_logits=None, mask=None,
                   need_logits=True):
    """Iterative dynamic routing (li2019 Alg. 1, eq. 7-8; cao2019 Alg. 1; GRET).

    One iteration, with routing logits ``B`` ``(..., I, O)``:

    1. coupling ``C = softmax(B)`` over the outputs of each input
       (``normalize="outputs"``: Sabour et al. 2017, li2019) or over the
       unmasked inputs of each output (``normalize="inputs"``: cao2019,
       GRET); masked inputs get ``C = 0``;
    2. ``S_o = sum_i C_io V_io``, divided by ``sum_i C_io`` when
       ``weighted_mean`` (li2019 eq. 7);
    3. ``out_o = squash(S_o)`` (eq. 8);
    4. ``B += <V_io, out_o>`` (agreement, Alg. 1 line 6).

    Args:
        votes: ``(..., I, O, D)``.
        iterations: number of iterations T >= 1.
        normalize: ``"outputs"`` or ``"inputs"`` (see above).
        weighted_mean: divide by the total coupling of each output (eq. 7).
        init_logits: ``(..., I, O)`` starting logits (zeros when None), e.g.
            cao2019's self-initialisation (eq. 15).
        mask: ``(..., I)`` bool, True where the input takes part.
        need_logits: False when the caller discards the logits (the fused
            kernels then neither write them nor take their gradient).

    Returns:
        ``outputs`` ``(..., O, D)`` of the last iteration, in ``votes.dtype``,
        and ``logits`` ``(..., I, O)`` after the last update, in at least
        float32 (agreements of large votes exceed the half-precision range);
        None without ``need_logits``.
    """
    _check_iterations(iterations)
    if normalize not in ("outputs", "inputs"):
        raise ValueError(f"normalize must be 'outputs' or 'inputs', got {normalize!r}")
    kernels = _fused_kernels(votes, mask, init_logits, chunked=True)
    if kernels is not None:
        # votes shared by the mask's problems (cao2019's horizontal routing) are checked as 3 groups of 2 problems
        shared = mask is not None and tuple(mask.shape) != tuple(votes.shape[:-2])
        members = (2,) if shared else ()

        def fused(votes, *extras):
            return kernels.simple_routing(votes, iterations, normalize, weighted_mean, *extras, need_logits)

        def reference(votes, *extras):
            return _simple_routing(votes, iterations, normalize, weighted_mean, *extras, need_logits)

        def extras():
            n_in, n_out = votes.shape[-3:-1]
            sample = torch.Generator().manual_seed(2)
            return [None if init_logits is None else torch.randn(3, *members, n_in, n_out, generator=sample),
                    None if mask is None else torch.rand(3, *members, n_in, generator=sample) > 0.3]

        def grouped(fn):
            return (lambda votes, *extras: fn(votes.unsqueeze(1), *extras)) if shared else fn

        kind = ("simple", (("normalize", normalize), ("weighted_mean", bool(weighted_mean)), ("T", iterations),
                           ("init_logits", init_logits is not None), ("mask", mask is not None),
                           ("need_logits", bool(need_logits)), ("shared", shared)))
        variant = kernels.variant(votes, mask)
        if _kernels_trusted(kind, votes, grouped(fused), grouped(reference), extras, variant):
            return fused(votes, init_logits, mask)
    return _simple_routing(votes, iterations, normalize, weighted_mean, init_logits, mask, need_logits)


def _simple_routing(votes, iterations, normalize, weighted_mean, init_logits, mask, need_logits):
    """:func:`simple_routing` in PyTorch (the reference)."""
    v, keep, lead = _prepare(votes, mask)
    n_in, n_out = v.shape[-3], v.shape[-2]
    logits_shape = lead + (n_out,)
    if init_logits is not None and init_logits.shape != logits_shape:
        raise ValueError(f"init_logits must be (..., I, O) = {tuple(logits_shape)}, got {tuple(init_logits.shape)}")
    dropped = None if keep is None else keep == 0
    # logits None: zero logits without a mask, so the first coupling is uniform (see below) and never formed
    logits = None
    if init_logits is not None:
        logits = init_logits.to(v.dtype)
        if keep is not None:
            logits = logits.masked_fill(dropped, 0.0)
    elif keep is not None or (normalize == "outputs" and weighted_mean and n_in / n_out < _MIN_TOTAL):
        logits = v.new_zeros(logits_shape)
    eps_root = v.new_full((), _NORM_EPS_ROOT) if v.shape[-1] == 1 else None
    for _ in range(int(iterations)):
        if logits is None:
            # C = 1/O (outputs) or 1/I (inputs) for every input: S is the mean of the votes, or
            # their sum / O for unweighted "outputs" (the total I/O of eq. 7 is above its floor)
            total = v.sum(dim=-3) / n_out if normalize == "outputs" and not weighted_mean else v.mean(dim=-3)
        else:
            coupling = _coupling(logits, normalize, keep, dropped)
            total = _weighted_sum(coupling, v)
            if weighted_mean:
                total = total / _positive(coupling.sum(dim=-2)).unsqueeze(-1)
        outputs = squash(total) if eps_root is None else _squash_scalar(total, eps_root)
        agreement = _agreement(v, outputs)
        logits = agreement if logits is None else logits + agreement
    return outputs.to(votes.dtype), logits if need_logits else None


def linear_inverse_temperature(start=1.0, end=1.0):
    """EM schedule: lambda rises linearly from ``start`` (first iteration) to ``end`` (last)."""

    def schedule(iteration, iterations):
        if iterations == 1:
            return end
        return start + (end - start) * iteration / (iterations - 1)

    return schedule


@without_autocast
def em_routing(
    votes,
    iterations=3,
    *,
    mask=None,
    beta_a=None,
    beta_u=None,
    inverse_temperature=None,
    min_var=1e-4,
    density="product",
):
    """EM routing (li2019 Alg. 2, eq. 9-12; Hinton et al. 2018).

    Output capsules are Gaussians fitted to the votes.  Coupling ``C`` starts
    at ``1/O`` for every unmasked input; each iteration runs

    * M-step (eq. 10-11 and the activation): with ``S_o = sum_i C_io``,
      ``mu_o = sum_i C_io V_io / S_o``,
      ``var_o = sum_i C_io (V_io - mu_o)^2 / S_o + min_var``,
      ``chi_o = sum_d (log sigma_od + (1 + log 2 pi) / 2) * S_o``,
      ``A_o = logistic(lambda_t (beta_a - beta_u * S_o - chi_o))``;
    * E-step (eq. 12, skipped after the last M-step): ``C_io`` proportional
      to ``A_o P_io`` over the outputs ``o``, with ``P_io`` the Gaussian
      density of ``V_io`` under output ``o``.

    The output is ``A_o * mu_o`` (eq. 9).

    Choices (discussed in docs/li2019.md), each an argument:

    * ``density="product"``: ``P`` is the product of the per-dimension
      densities (a diagonal Gaussian, Hinton et al.), i.e. a sum of
      log-densities.  ``"sum"`` takes eq. 12's text literally (a sum of
      per-dimension densities, computed as a log-sum-exp).  Everything is
      in log space: ``log C = log A + log P - logsumexp``.
    * ``min_var``: floor added to every variance, so that a collapsed
      Gaussian (all votes equal) keeps finite densities and gradients.
    * ``inverse_temperature``: ``schedule(t, T) -> lambda_t``; the default
      :func:`linear_inverse_temperature` keeps ``lambda = 1``.  A rising
      schedule (``linear_inverse_temperature(1, 3)``) follows Hinton's
      suggestion.
    * ``beta_a``, ``beta_u``: tensors broadcastable to ``(..., O)`` (e.g.
      learnable ``(O,)`` parameters); zeros when None.

    Args:
        votes: ``(..., I, O, D)``.
        iterations: number of EM iterations T >= 1.
        mask: ``(..., I)`` bool, True where the input takes part.

    Returns:
        ``outputs`` ``(..., O, D)`` and ``activations`` ``(..., O)``, in
        ``votes.dtype``.
    """
    _check_iterations(iterations)
    if density not in ("product", "sum"):
        raise ValueError(f"density must be 'product' or 'sum', got {density!r}")
    if not min_var > 0:
        raise ValueError(f"min_var must be > 0, got {min_var!r}")
    n_out = votes.shape[-2] if votes.dim() >= 3 else None
    kernels = None
    if inverse_temperature is None and density == "product" and all(
            beta is None or tuple(beta.shape) == (n_out,) for beta in (beta_a, beta_u)):
        kernels = _fused_kernels(votes, mask)
    if kernels is not None:
        def fused(votes, mask, beta_a, beta_u):
            return kernels.em_routing(votes, iterations, mask, beta_a, beta_u, min_var)

        def reference(votes, mask, beta_a, beta_u):
            return _em_routing(votes, iterations, mask, beta_a, beta_u, None, min_var, density)

        def extras():
            sample = torch.Generator().manual_seed(3)
            return [None if mask is None else torch.rand(3, votes.shape[-3], generator=sample) > 0.3,
                    *(None if beta is None else torch.randn(n_out, generator=sample) for beta in (beta_a, beta_u))]

        kind = ("EM", (("T", iterations), ("min_var", min_var), ("mask", mask is not None),
                       ("beta_a", beta_a is not None), ("beta_u", beta_u is not None)))
        if _kernels_trusted(kind, votes, fused, reference, extras, kernels.variant(votes)):
            return fused(votes, mask, beta_a, beta_u)
    return _em_routing(votes, iterations, mask, beta_a, beta_u, inverse_temperature, min_var, density)


def _em_routing(votes, iterations, mask, beta_a, beta_u, inverse_temperature, min_var, density):
    """:func:`em_routing` in PyTorch (the reference)."""
    schedule = inverse_temperature or linear_inverse_temperature()
    v, keep, lead = _prepare(votes, mask)
    n_in, n_out, n_dim = v.shape[-3], v.shape[-2], v.shape[-1]
    # chi_o = (sum_d log var_od / 2 + D (1 + log 2 pi) / 2) S_o: the constant joins beta_u once
    beta_a = 0.0 if beta_a is None else beta_a.to(v.dtype)
    beta_u = v.new_zeros(()) if beta_u is None else beta_u.to(v.dtype)
    beta_u = (beta_u + chi_constant(n_dim)).expand(*lead[:-1], n_out)
    if torch.is_tensor(beta_a):
        beta_a = beta_a.expand(*lead[:-1], n_out)
    coupling = None  # without a mask: C = 1/O everywhere, S_o = I/O, never formed (first M-step below)
    if keep is not None or n_in / n_out < _MIN_TOTAL:
        coupling = (v.new_ones(()) / n_out if keep is None else keep / n_out).expand(*lead, n_out)
    for t in range(int(iterations)):
        # M-step
        if coupling is None:
            weight = n_in / n_out  # S_o, above its floor
            mean = v.mean(dim=-3)  # (..., O, D)
            dev2 = (v - mean.unsqueeze(-3)).square()  # (..., I, O, D)
            var = dev2.mean(dim=-3) + min_var
        else:
            weight = coupling.sum(dim=-2)  # (..., O)
            share = coupling / _positive(weight).unsqueeze(-2)  # C_io / S_o
            mean = _weighted_sum(share, v)  # (..., O, D)
            dev2 = (v - mean.unsqueeze(-3)).square()  # (..., I, O, D)
            var = _weighted_sum(share, dev2) + min_var
        log_var = torch.log(var)
        sum_log_var = _sum_last(log_var)  # (..., O)
        logit_a = beta_a - weight * torch.add(beta_u, sum_log_var, alpha=0.5)  # beta_a - beta_u S_o - chi_o
        inverse_temperature = schedule(t, int(iterations))
        if inverse_temperature != 1:
            logit_a = inverse_temperature * logit_a
        if t == int(iterations) - 1:
            break
        # E-step: log C_io = log A_o + log P_io - logsumexp_o(...); the terms of log P_io that are the
        # same for every o (-D log(2 pi) / 2) leave the softmax unchanged and are left out
        log_a = F.logsigmoid(logit_a)
        if density == "product":
            # sum_d of the per-dimension log-densities; sum_d log var_od / 2 on the small (..., O) tensor
            score = torch.add(torch.sub(log_a, sum_log_var, alpha=0.5).unsqueeze(-2),
                              _sum_last(dev2 / var.unsqueeze(-3)), alpha=-0.5)
        else:
            log_dens = -0.5 * (log_var.unsqueeze(-3) + dev2 / var.unsqueeze(-3))  # (..., I, O, D)
            score = log_a.unsqueeze(-2) + torch.logsumexp(log_dens, dim=-1)
        coupling = torch.softmax(score, dim=-1)
        if keep is not None:
            coupling = coupling * keep
    activations = torch.sigmoid(logit_a)
    outputs = activations[..., None] * mean
    return outputs.to(votes.dtype), activations.to(votes.dtype)
