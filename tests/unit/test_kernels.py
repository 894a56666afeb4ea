"""The fused CPU routing kernels (onmt_ext/kernels.py) against the routing core's tensor code.

Every comparison runs the same public function twice, with the kernels on
and off (``ONMT_EXT_FUSED``), and compares outputs and gradients in float64.
"""

import logging
import re

import pytest
import torch

from onmt_ext import kernels, routing


def _run(monkeypatch, fused, fn, *tensors):
    monkeypatch.setenv("ONMT_EXT_FUSED", "1" if fused else "0")
    leaves = [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]
    outs = fn(*leaves)
    weights = torch.Generator().manual_seed(7)
    loss = sum((o * torch.randn(o.shape, generator=weights, dtype=o.dtype)).sum() for o in outs)
    loss.backward()
    return [o.detach() for o in outs], [t.grad for t in leaves if t.requires_grad]


def _assert_same(monkeypatch, fn, *tensors, atol=1e-10):
    fused_out, fused_grad = _run(monkeypatch, True, fn, *tensors)
    eager_out, eager_grad = _run(monkeypatch, False, fn, *tensors)
    for a, b in zip(fused_out + fused_grad, eager_out + eager_grad):
        torch.testing.assert_close(a, b, atol=atol, rtol=1e-8)


def _randn(*shape, seed=0, grad=True, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype).requires_grad_(grad)


def test_library_builds_and_is_used():
    """The kernels build on this machine, and the routing core takes them for CPU tensors."""
    assert kernels.library() is not None, kernels._state["error"]
    votes = _randn(2, 3, 4, 5, 1, grad=False, dtype=torch.float32)
    assert kernels.simple_routing(votes, None, None, votes.shape[:-2], 3, "outputs", True) is not None
    assert kernels.em_routing(votes, 3, [1.0] * 3, None, None, 1e-4) is not None


def test_kernel_constants_are_the_routing_cores():
    """The C file repeats routing.py's floors and constants (it cannot import them): they must stay equal."""
    source = (kernels.SOURCE_DIR / "routing_kernels.c").read_text(encoding="utf-8")
    defined = dict(re.findall(r"^#define (NORM_EPS|MIN_TOTAL|LOG_2PI|HALF_1_LOG_2PI) (\S+)", source, re.M))
    assert float(defined["NORM_EPS"]) == routing._NORM_EPS
    assert float(defined["MIN_TOTAL"]) == routing._MIN_TOTAL
    assert float(defined["LOG_2PI"]) == pytest.approx(routing._LOG_2PI, rel=1e-15)
    assert float(defined["HALF_1_LOG_2PI"]) == pytest.approx(0.5 * (1.0 + routing._LOG_2PI), rel=1e-15)


@pytest.mark.parametrize("iterations", [1, 3])
@pytest.mark.parametrize("normalize", ["outputs", "inputs"])
@pytest.mark.parametrize("weighted_mean", [False, True])
@pytest.mark.parametrize("dim", [1, 3])
def test_simple_routing_matches_tensor_code(monkeypatch, iterations, normalize, weighted_mean, dim):
    votes = _randn(3, 5, 4, 6, dim)
    _assert_same(monkeypatch, lambda v: routing.simple_routing(v, iterations, normalize=normalize,
                                                               weighted_mean=weighted_mean), votes)


@pytest.mark.parametrize("normalize", ["outputs", "inputs"])
def test_simple_routing_with_mask_and_initial_logits(monkeypatch, normalize):
    mask = torch.rand(3, 5, 4, generator=torch.Generator().manual_seed(1)) > 0.3
    mask[0, 0] = False  # a problem without any input
    votes, init = _randn(3, 5, 4, 6, 2), _randn(3, 5, 4, 6, seed=2)
    _assert_same(monkeypatch, lambda v, i: routing.simple_routing(v, 3, normalize=normalize, weighted_mean=True,
                                                                  mask=mask, init_logits=i), votes, init)


@pytest.mark.parametrize("dim", [1, 3])
@pytest.mark.parametrize("iterations", [1, 2, 3])
def test_em_routing_matches_tensor_code(monkeypatch, dim, iterations):
    votes, beta_a, beta_u = _randn(4, 6, 8, 5, dim), _randn(5, seed=1), _randn(5, seed=2)
    _assert_same(monkeypatch, lambda v, a, u: routing.em_routing(v, iterations, beta_a=a, beta_u=u), votes, beta_a,
                 beta_u)


def test_em_routing_schedule_and_default_betas(monkeypatch):
    votes = _randn(4, 6, 8, 5, 2)
    schedule = routing.linear_inverse_temperature(1.0, 3.0)
    _assert_same(monkeypatch, lambda v: routing.em_routing(v, 3, inverse_temperature=schedule, min_var=1e-3), votes)


def _shared_mask(kind, batch, problems, inputs):
    """Masks of shared-vote problems ``(batch, problems, inputs)``: cao2019's prefixes with padding, or random."""
    if kind == "prefix":  # problem l takes the inputs t <= l that are not padding
        valid = torch.ones(batch, inputs, dtype=torch.bool)
        valid[1, inputs - 3:] = False
        valid[2, 2:] = False
        return torch.ones(problems, inputs, dtype=torch.bool).tril()[None] & valid[:, None, :]
    mask = torch.rand(batch, problems, inputs, generator=torch.Generator().manual_seed(4)) > 0.4  # holes
    mask[0, 0] = False  # a problem without any input
    mask[1, 1] = True  # one with every input
    mask[:, :, 3] = False  # an input masked in every problem (its votes are zeroed)
    return mask


def _count_fused(monkeypatch):
    """Counts the calls of the fused simple routing (so that a comparison cannot pass on the tensor code twice)."""
    calls = []
    apply = kernels._SimpleRouting.apply
    monkeypatch.setattr(kernels._SimpleRouting, "apply", lambda *args: calls.append(1) or apply(*args))
    return calls


@pytest.mark.parametrize("mask_kind", ["prefix", "random"])
@pytest.mark.parametrize("self_init", [False, True])
@pytest.mark.parametrize("logits_grad", [False, True])
@pytest.mark.parametrize("normalize, weighted_mean", [("inputs", False), ("inputs", True), ("outputs", True)])
def test_shared_votes_are_fused_and_match_tensor_code(monkeypatch, mask_kind, self_init, logits_grad, normalize,
                                                      weighted_mean):
    """Shared votes (cao2019's horizontal routing: votes (B, 1, I, O, D) for problems (B, L)) go to the kernel, with
    the same outputs, logits (masked inputs' too) and gradients, with and without a gradient for the logits."""
    batch, problems, inputs, outputs = 3, 6, 7, 4
    mask = _shared_mask(mask_kind, batch, problems, inputs)
    calls = _count_fused(monkeypatch)
    for dim, iterations in ((5, 3), (1, 2), (9, 1)):
        votes = _randn(batch, 1, inputs, outputs, dim, seed=dim) * 2
        tensors = [votes] + ([_randn(batch, problems, inputs, outputs, seed=3)] if self_init else [])

        def fn(v, i=None):
            out, logits = routing.simple_routing(v, iterations, normalize=normalize, weighted_mean=weighted_mean,
                                                 init_logits=i, mask=mask)
            if not logits_grad:  # the logits are checked, but the backward pass gets no gradient for them
                return out, logits.detach()
            return out, logits

        _assert_same(monkeypatch, fn, *tensors)
    assert len(calls) == 3


@pytest.mark.parametrize("keep_state", [True, False])
def test_shared_votes_kernel_matches_tensor_code(monkeypatch, keep_state):
    """The kernel's shared-vote mode called directly, with the backward pass reading the forward pass's saved
    couplings (keep_state) or recomputing them."""
    monkeypatch.setattr(kernels, "_KEEP_STATE", keep_state)
    batch, length, heads, keys = 2, 7, 4, 7
    votes, init = _randn(batch, 1, length, heads, keys), _randn(batch, length, length, heads, seed=3)
    mask = torch.ones(length, length, dtype=torch.bool).tril()[None].repeat(batch, 1, 1)
    mask[1, :, 5:] = False

    def direct(v, i):
        prepared, keep, lead = routing._prepare(v, mask)
        out, logits = kernels._SimpleRouting.apply(prepared.reshape(batch, length, heads, keys), keep.reshape(
            batch, length, length).to(v.dtype), i.reshape(batch, length, length, heads), length, 3, True, False)
        return out.reshape(batch, length, heads, keys), logits.reshape(batch, length, length, heads)

    fused_out, fused_grad = _run(monkeypatch, True, direct, votes, init)
    eager_out, eager_grad = _run(monkeypatch, False, lambda v, i: routing.simple_routing(
        v, 3, normalize="inputs", mask=mask, init_logits=i), votes, init)
    for a, b in zip(fused_out + fused_grad, eager_out + eager_grad):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("init", ["zero", "self"])
def test_cross_aggregation_horizontal_routing_is_fused(monkeypatch, init):
    """cao2019's cross aggregation on a padded batch: the same attention, gradients and near-zero statistic
    (which reads the routing logits) with the kernels as with the tensor code."""
    from onmt_ext.cross_aggregation import cross_aggregate, routing_weights

    lengths, heads = [9, 4, 7], 3
    scores = _randn(len(lengths), heads, max(lengths), max(lengths), seed=5) * 3
    for b, n in enumerate(lengths):
        scores.data[b, :, :, n:] = -1e18
    weight = _randn(heads, heads, seed=6)
    calls = _count_fused(monkeypatch)
    _assert_same(monkeypatch, lambda s, w: (cross_aggregate(s, w, True, init, 3),), scores, weight)
    assert len(calls) == 2  # the vertical and the horizontal routing
    weights = {}
    for fused in (True, False):
        monkeypatch.setenv("ONMT_EXT_FUSED", "1" if fused else "0")
        weights[fused] = routing_weights(scores.detach(), 3, init)
    for key in ("vertical", "horizontal"):
        torch.testing.assert_close(weights[True][key], weights[False][key], atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("dim", [1, 3])
def test_em_routing_reads_strided_votes_without_a_copy(monkeypatch, dim):
    """Head-major votes ``(I, G, O, D)`` seen as ``(G, I, O, D)`` (li2019's capsule maps) go to the kernel as
    they are; outputs and gradients equal those of the contiguous votes and of the tensor code."""
    head_major = _randn(6, 4, 8, dim)
    votes = head_major.detach().transpose(0, 1)  # (G, I, O, D), inputs 4 * 8 * dim apart
    assert kernels._block_strided(votes).data_ptr() == votes.data_ptr()
    assert kernels._block_strided(votes).stride() == votes.stride()
    beta_a, beta_u = _randn(8, seed=1), _randn(8, seed=2)
    def fn(v, a, u):
        return routing.em_routing(v.transpose(0, 1), 3, beta_a=a, beta_u=u)
    _assert_same(monkeypatch, fn, head_major, beta_a, beta_u)
    contiguous = lambda v, a, u: routing.em_routing(v.transpose(0, 1).contiguous(), 3, beta_a=a, beta_u=u)
    strided, dense = _run(monkeypatch, True, fn, head_major, beta_a, beta_u), \
        _run(monkeypatch, True, contiguous, head_major, beta_a, beta_u)
    for a, b in zip(strided[0] + strided[1], dense[0] + dense[1]):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


def _spy_kernel_calls(monkeypatch):
    """Records ``(entry point, lanes flag)`` for every kernel call (the flag is each entry point's last argument)."""
    calls = []
    real_function = kernels._function

    def spy(name, *rest):
        function = real_function(name, *rest)
        return lambda *args: calls.append((name, bool(args[-1]))) or function(*args)

    monkeypatch.setattr(kernels, "_function", spy)
    return calls


def _assert_kernel_path_matches(monkeypatch, fn, tensors, dtype, calls, routing_name, lanes):
    """``fn`` on ``tensors`` with the kernels (which must have run ``routing_name``'s forward and backward entry
    points with the ``lanes`` flag) against the tensor code on float64 copies: outputs and gradients."""
    fused = _run(monkeypatch, True, fn, *tensors)
    assert calls == [(f"{routing_name}_forward", lanes), (f"{routing_name}_backward", lanes)]
    reference = _run(monkeypatch, False, fn, *[t.detach().double().requires_grad_() for t in tensors])
    tolerance = dict(atol=2e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=1e-11, rtol=1e-9)
    for a, b in zip(fused[0] + fused[1], reference[0] + reference[1]):
        torch.testing.assert_close(a.double(), b, **tolerance)


@pytest.mark.parametrize("lanes", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("groups, dim", [(1, 1), (21, 1), (37, 3), (16, 4)])
@pytest.mark.parametrize("betas", [False, True])
@pytest.mark.parametrize("outputs", [7, 37])
def test_em_kernel_paths_match_tensor_code(monkeypatch, lanes, dtype, groups, dim, betas, outputs):
    """Both EM kernels, forward and backward, whichever the size rule picks: the per-problem one and the
    lane-wise one (16 float32 or 8 float64 problems per tile; 1, 21 and 37 groups leave a partial last tile), on
    head-major strided votes, with and without betas, against the tensor code in float64.  With D = 1 and 37
    outputs the per-problem M-step sums blocks of 32 float32 or 16 float64 outputs in registers
    (``m_sums_d1``) and the rest in its loops."""
    monkeypatch.setattr(kernels, "_lanes", lambda *shape: lanes)
    calls = _spy_kernel_calls(monkeypatch)
    head_major = _randn(5, groups, outputs * dim, dtype=dtype)
    tensors = [head_major] + ([_randn(outputs, seed=1, dtype=dtype), _randn(outputs, seed=2, dtype=dtype)]
                              if betas else [])

    def fn(v, *beta):  # float64 outputs, so that both runs draw the same random loss weights
        return [out.double() for out in routing.em_routing(v.view(5, groups, outputs, dim).transpose(0, 1), 3,
                                                           **dict(zip(("beta_a", "beta_u"), beta)))]

    _assert_kernel_path_matches(monkeypatch, fn, tensors, dtype, calls, "em_routing", lanes)


@pytest.mark.parametrize("lanes", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("problems, dim", [(1, 1), (21, 1), (37, 3)])
@pytest.mark.parametrize("normalize, weighted_mean", [("outputs", True), ("outputs", False), ("inputs", False)])
@pytest.mark.parametrize("masked", [False, True])
def test_simple_kernel_paths_match_tensor_code(monkeypatch, lanes, dtype, problems, dim, normalize, weighted_mean,
                                               masked):
    """Both simple-routing kernels for problems with their own votes, forward and backward: the per-problem
    one and the lane-wise one (partial last tiles at 1, 21 and 37 problems), with a mask (one problem without any
    input) and starting logits or without either, both normalisations, against the tensor code in float64."""
    monkeypatch.setattr(kernels, "_lanes", lambda *shape: lanes)
    calls = _spy_kernel_calls(monkeypatch)
    votes = _randn(problems, 5, 7, dim, dtype=dtype)
    tensors = [votes] + ([_randn(problems, 5, 7, seed=3, dtype=dtype)] if masked else [])
    mask = torch.rand(problems, 5, generator=torch.Generator().manual_seed(1)) > 0.3 if masked else None
    if masked:
        mask[-1] = False

    def fn(v, *init):  # float64 results, so that both runs draw the same random loss weights
        return [r.double() for r in routing.simple_routing(v, 3, normalize=normalize, weighted_mean=weighted_mean,
                                                           mask=mask, init_logits=init[0] if init else None)]

    _assert_kernel_path_matches(monkeypatch, fn, tensors, dtype, calls, "simple_routing", lanes)


@pytest.mark.parametrize("routing_name", ["em", "simple"])
def test_kernels_without_a_graph_skip_autograd_and_give_the_same_outputs(monkeypatch, routing_name):
    """Under ``torch.no_grad`` (translation) the kernels run without an autograd.Function and give bitwise the
    outputs of the graph-recording path; with a gradient wanted for any input (the betas alone too), the
    Function runs and the gradient arrives."""
    monkeypatch.setenv("ONMT_EXT_FUSED", "1")
    function = kernels._EMRouting if routing_name == "em" else kernels._SimpleRouting
    applied = []
    real_apply = function.apply
    monkeypatch.setattr(function, "apply", lambda *args: applied.append(1) or real_apply(*args))
    votes, beta = _randn(6, 4, 32, 1, dtype=torch.float32), _randn(32, seed=1, dtype=torch.float32)

    def run(v, b):
        if routing_name == "em":
            return routing.em_routing(v, 3, beta_a=b, beta_u=b)
        return routing.simple_routing(v, 3, weighted_mean=True)

    recorded = run(votes, beta)
    assert applied == [1] and recorded[0].requires_grad
    with torch.no_grad():
        plain = run(votes, beta)
    assert applied == [1] and not plain[0].requires_grad
    for a, b in zip(recorded, plain):
        assert torch.equal(a.detach(), b)
    if routing_name == "em":  # votes without a gradient, learnt betas: the graph is recorded for the betas
        out, _ = run(votes.detach(), beta)
        out.sum().backward()
        assert applied == [1, 1] and beta.grad is not None and beta.grad.abs().sum() > 0


def test_em_routing_trains_after_a_first_call_under_inference_mode(monkeypatch):
    """The kernels' cached schedule tensor, first made under ``torch.inference_mode``, can still be saved for
    the backward pass of a later training step."""
    monkeypatch.setenv("ONMT_EXT_FUSED", "1")
    monkeypatch.setattr(kernels, "_LAMBDAS", {})
    votes, beta = _randn(5, 4, 8, 1, dtype=torch.float32), _randn(8, seed=1, dtype=torch.float32)
    with torch.inference_mode():
        routing.em_routing(votes, 3, beta_a=beta, beta_u=beta)
    out, _ = routing.em_routing(votes, 3, beta_a=beta, beta_u=beta)
    out.sum().backward()
    assert torch.isfinite(votes.grad).all() and torch.isfinite(beta.grad).all()


def test_lane_rule():
    """The lane-wise kernels take li2019's toy layers (O = 32 capsules of size 1) and small vector capsules; the
    per-problem ones take many scalar capsules (Transformer-Base: O = 512) and large tiles."""
    assert kernels._lanes(4, 32, 1)
    assert kernels._lanes(8, 32, 8)
    assert not kernels._lanes(8, 64, 1)
    assert not kernels._lanes(8, 512, 1)
    assert not kernels._lanes(16, 64, 16)  # a tile of 1.1 MB


@pytest.mark.parametrize("scale", [30.0, 1e3])
def test_floored_exponentials_match_tensor_code(monkeypatch, scale):
    """Votes of magnitude 1e3 drive simple routing's logit differences far below -EXP_FLOOR (80), where the
    kernels clamp the exp's argument and write 0; values and gradients still equal the tensor code's (EM is
    compared at the same scales)."""
    votes, beta_a, beta_u = _randn(4, 6, 8, 5, 1) * scale, _randn(5, seed=1), _randn(5, seed=2)
    _assert_same(monkeypatch, lambda v, a, u: routing.em_routing(v, 3, beta_a=a, beta_u=u), votes, beta_a, beta_u)
    _assert_same(monkeypatch, lambda v: routing.simple_routing(v, 3, weighted_mean=True), votes)
    _assert_same(monkeypatch, lambda v: routing.simple_routing(v, 3, normalize="inputs"), votes)


def test_block_strided_copies_what_the_kernel_cannot_read():
    votes = torch.zeros(5, 4, 3, 2, dtype=torch.float64)
    assert kernels._block_strided(votes).data_ptr() == votes.data_ptr()
    transposed = votes.transpose(2, 3)  # the (O, D) block is not contiguous
    assert kernels._block_strided(transposed).is_contiguous()
    overlapping = torch.zeros(4, 3, 2, dtype=torch.float64).unsqueeze(0).expand(5, 4, 3, 2)  # stride 0 between groups
    assert kernels._block_strided(overlapping).is_contiguous()
    assert kernels._block_strided(overlapping).data_ptr() != overlapping.data_ptr()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_tanh_matches_torch(monkeypatch, dtype):
    x = _randn(3, 70001, dtype=dtype) * 4  # more than one chunk of the kernel's thread split
    monkeypatch.setenv("ONMT_EXT_FUSED", "1")
    fused_in = x.detach().clone().requires_grad_()
    fused = kernels.tanh_(fused_in * 1.0)  # in place on a fresh tensor
    eager_in = x.detach().clone().requires_grad_()
    eager = torch.tanh(eager_in * 1.0)
    grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(3), dtype=dtype)
    fused.backward(grad)
    eager.backward(grad)
    tolerance = dict(atol=1e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-14, rtol=1e-13)
    torch.testing.assert_close(fused, eager, **tolerance)
    torch.testing.assert_close(fused_in.grad, eager_in.grad, **tolerance)
    monkeypatch.setenv("ONMT_EXT_FUSED", "0")  # off: torch.tanh itself
    plain = x.detach() * 1.0
    assert torch.equal(kernels.tanh_(plain), torch.tanh(x.detach()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(3, 700, 70), (2, 5, 20000), (1, 1, 3)])
def test_fused_tanh_with_a_bias_matches_torch(monkeypatch, dtype, shape):
    """``tanh_(x, bias)`` = ``tanh(x + bias.unsqueeze(1))`` for x ``(P, M, K)``: values, the gradients of x and
    of the bias, rows longer than a thread chunk, and the direct call without a graph (in place, no Function)."""
    monkeypatch.setenv("ONMT_EXT_FUSED", "1")
    monkeypatch.setattr(kernels, "_threads", lambda work: 2)  # the row split over two threads
    x = _randn(*shape, dtype=dtype) * 3
    bias = _randn(shape[0], shape[2], seed=5, dtype=dtype)
    grad = torch.randn(shape, generator=torch.Generator().manual_seed(3), dtype=dtype)
    results = []
    for fused in (True, False):
        x_in, bias_in = x.detach().clone().requires_grad_(), bias.detach().clone().requires_grad_()
        out = kernels.tanh_(x_in * 1.0, bias_in) if fused else torch.tanh(x_in + bias_in.unsqueeze(1))
        out.backward(grad)
        results.append((out, x_in.grad, bias_in.grad))
    tolerance = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-12, rtol=1e-12)
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, **tolerance)
    applied = []
    monkeypatch.setattr(kernels._Tanh, "apply", lambda *args: applied.append(args))
    with torch.no_grad():
        plain = x.detach().clone()
        assert kernels.tanh_(plain, bias) is plain and not applied
    assert torch.equal(plain, results[0][0].detach())
    monkeypatch.setenv("ONMT_EXT_FUSED", "0")  # off: the tensor code
    torch.testing.assert_close(kernels.tanh_(x.detach().clone(), bias), results[1][0].detach(), atol=0, rtol=0)


def test_float32_and_half_inputs_agree(monkeypatch):
    votes = _randn(64, 4, 32, 1, grad=False, dtype=torch.float32) * 3
    for dtype in (torch.float32, torch.bfloat16):
        cast = votes.to(dtype)
        monkeypatch.setenv("ONMT_EXT_FUSED", "1")
        fused = routing.em_routing(cast, 3)[0], routing.simple_routing(cast, 3, weighted_mean=True)[0]
        monkeypatch.setenv("ONMT_EXT_FUSED", "0")
        eager = routing.em_routing(cast, 3)[0], routing.simple_routing(cast, 3, weighted_mean=True)[0]
        for a, b in zip(fused, eager):
            assert a.dtype == dtype
            torch.testing.assert_close(a.float(), b.float(), atol=1e-5 if dtype == torch.float32 else 1e-2, rtol=1e-3)


def test_unsupported_cases_use_the_tensor_code(monkeypatch):
    votes = _randn(3, 4, 5, 2, grad=False, dtype=torch.float32)
    monkeypatch.setenv("ONMT_EXT_FUSED", "0")
    assert kernels.simple_routing(votes, None, None, votes.shape[:-2], 3, "outputs", True) is None
    monkeypatch.setenv("ONMT_EXT_FUSED", "1")
    assert kernels.em_routing(votes, 3, [1.0] * 3, torch.zeros(3, 5), None, 1e-4) is None  # betas not (O,)
    assert kernels.simple_routing(votes.half(), None, None, votes.shape[:-2], 3, "outputs", True) is None
    mask = torch.ones(3, 4, dtype=torch.bool)
    out, _ = routing.em_routing(votes, 3, mask=mask)  # a mask: the tensor code, same result
    torch.testing.assert_close(out, routing.em_routing(votes, 3)[0], atol=1e-6, rtol=1e-5)


def test_failed_build_warns_once_and_falls_back(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("ONMT_EXT_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ONMT_EXT_FUSED", "1")
    monkeypatch.setattr(kernels, "_state", {"loaded": False, "library": None, "error": None})
    with pytest.raises(RuntimeError, match="no-such-compiler"):
        kernels.build()
    with caplog.at_level(logging.WARNING, logger="onmt_ext"):
        votes = _randn(2, 3, 4, 1, grad=False, dtype=torch.float32)
        out, _ = routing.simple_routing(votes, 2)
        routing.simple_routing(votes, 2)
    assert torch.isfinite(out).all()
    warnings = [r for r in caplog.records if "fused CPU kernels are unavailable" in r.getMessage()]
    assert len(warnings) == 1
