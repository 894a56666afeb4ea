"""The fused routing kernels (onmt_ext.mechanisms.routing_triton) against the PyTorch routing core, in values and
gradients.

On a machine without CUDA the kernels run in Triton's interpreter on CPU tensors (conftest.py sets
``TRITON_INTERPRET=1`` before Triton is imported); where CUDA is present every test also runs on the GPU, in
Triton's compiled kernels.  The reference is :mod:`onmt_ext.mechanisms.routing` with
``ONMT_EXT_ROUTING_KERNEL=torch``.
"""

import os
import sys
import warnings

import pytest
import torch

from onmt_ext.mechanisms import li2019, routing

triton = pytest.importorskip("triton", reason="the fused routing kernels need Triton (requirements.txt)")
from onmt_ext.mechanisms import routing_triton  # noqa: E402

# the CPU through the interpreter (set on machines without CUDA), the GPU through compiled kernels
DEVICES = (["cpu"] if routing_triton.INTERPRETED else []) + (["cuda"] if torch.cuda.is_available() else [])
if not DEVICES:
    pytest.skip("Triton was imported before TRITON_INTERPRET=1 could be set, and there is no CUDA device",
                allow_module_level=True)
#: the device of the tests that run on one: the GPU where there is one
DEVICE = torch.device(DEVICES[-1])


@pytest.fixture
def kernel(monkeypatch):
    """Route through the kernels on every device (the interpreter on the CPU), each kind checked anew on its
    first use."""
    monkeypatch.setenv(routing.KERNEL_VARIABLE, "triton")
    monkeypatch.setattr(routing, "_TRUSTED", {})


def _reference(monkeypatch, fn, *args, **kwargs):
    with monkeypatch.context() as patch:
        patch.setenv(routing.KERNEL_VARIABLE, "torch")
        return fn(*args, **kwargs)


def _values_and_grads(fn, inputs, seed):
    """``fn(*inputs)``'s tensors and the gradients of a random linear function of them on every input that
    requires grad."""
    outputs = [out for out in fn(*inputs) if out is not None]
    generator = torch.Generator().manual_seed(seed)
    loss = sum((out * torch.randn(out.shape, generator=generator).to(out)).sum() for out in outputs)
    wanted = [x for x in inputs if torch.is_tensor(x) and x.requires_grad]
    return [out.detach() for out in outputs] + list(torch.autograd.grad(loss, wanted))


def _double(x):
    return x.detach().double().requires_grad_(x.requires_grad) if torch.is_tensor(x) else x


def check_against_reference(monkeypatch, run, inputs, seed=0, unit=1e-6):
    """The kernels' outputs and gradients are as close to the float64 reference as the reference in the inputs'
    own precision is: within 4 times its error, or ``unit`` relative to the largest value.

    The routing's sums run in another order in the kernels, and EM's gradients are ill-conditioned where a
    Gaussian has few inputs (1/var), so a fixed tolerance would either fail on rounding or pass a wrong term;
    a wrong derivative term is off by far more than the reference's rounding.
    """
    launches = sum(routing_triton.LAUNCHES.values())
    fused = _values_and_grads(run, inputs, seed)
    assert sum(routing_triton.LAUNCHES.values()) > launches, "the fused kernels did not run"
    # a kernel that fails its first-use check still launches (the check's) and the routing falls back to the
    # reference, whose values then pass below
    assert all(routing._TRUSTED.values()), f"a kernel failed its first-use check: {routing._TRUSTED}"
    same_precision = _reference(monkeypatch, _values_and_grads, run, inputs, seed)
    exact = _reference(monkeypatch, _values_and_grads, run, [_double(x) for x in inputs], seed)
    assert len(fused) == len(same_precision) == len(exact)
    for index, (got, reference, truth) in enumerate(zip(fused, same_precision, exact)):
        assert got.dtype == reference.dtype and got.shape == reference.shape, index
        error = (got.double() - truth).abs().max().item() if got.numel() else 0.0
        reference_error = (reference.double() - truth).abs().max().item() if got.numel() else 0.0
        scale = truth.abs().max().item() if got.numel() else 0.0
        allowed = 4 * reference_error + unit * max(scale, 1.0)
        assert error <= allowed, (f"result {index}: the kernels are {error:.3g} from the float64 reference, the "
                                  f"reference in {got.dtype} {reference_error:.3g} (largest value {scale:.3g})")
    return fused


def _mask(problems, n_in, seed, device):
    """A random input mask ``(problems, I)`` with an all-masked problem and a problem with one input."""
    generator = torch.Generator().manual_seed(seed)
    mask = torch.rand(problems, n_in, generator=generator) > 0.35
    mask[0] = False
    mask[1] = False
    mask[1, n_in - 1] = True
    return mask.to(device)


SIMPLE_CASES = [
    # (I, O, D, T, normalize, weighted_mean, mask, init, need_logits)
    (8, 16, 1, 3, "outputs", True, False, False, False),  # li2019's shape at toy width (N = d)
    (3, 5, 4, 1, "outputs", True, False, False, True),
    (5, 3, 3, 2, "outputs", False, True, True, True),
    (6, 4, 5, 4, "inputs", False, True, False, True),  # GRET's normalisation
    (7, 2, 8, 3, "inputs", True, True, True, True),
    (1, 1, 1, 5, "inputs", False, False, True, True),
    (4, 9, 2, 3, "outputs", True, True, False, False),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", SIMPLE_CASES, ids=lambda c: "I{}-O{}-D{}-T{}-{}-w{:d}-m{:d}-i{:d}-l{:d}".format(*c))
def test_simple_routing_equals_the_reference(case, device, kernel, monkeypatch):
    n_in, n_out, n_dim, iterations, normalize, weighted, masked, with_init, need_logits = case
    generator = torch.Generator().manual_seed(sum(case[:4]))
    problems = 5
    votes = (2 * torch.randn(problems, n_in, n_out, n_dim, generator=generator)).to(device).requires_grad_()
    init = torch.randn(problems, n_in, n_out, generator=generator).to(device).requires_grad_() if with_init else None
    mask = _mask(problems, n_in, 1, device) if masked else None

    def run(votes, init):
        return routing.simple_routing(votes, iterations, normalize=normalize, weighted_mean=weighted,
                                      init_logits=init, mask=mask, need_logits=need_logits)

    results = check_against_reference(monkeypatch, run, (votes, init), seed=3)
    assert len(results) == (2 if need_logits else 1) + (2 if with_init else 1)


EM_CASES = [
    # (I, O, D, T, mask, betas)
    (8, 16, 1, 3, False, True),  # li2019's shape at toy width
    (3, 5, 1, 1, False, True),
    (4, 3, 4, 2, True, True),
    (5, 4, 3, 4, True, False),
    (6, 6, 2, 3, True, True),
    (2, 7, 5, 3, False, False),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", EM_CASES, ids=lambda c: "I{}-O{}-D{}-T{}-m{:d}-b{:d}".format(*c))
def test_em_routing_equals_the_reference(case, device, kernel, monkeypatch):
    n_in, n_out, n_dim, iterations, masked, betas = case
    generator = torch.Generator().manual_seed(sum(case[:4]))
    problems = 5
    votes = torch.randn(problems, n_in, n_out, n_dim, generator=generator).to(device).requires_grad_()
    beta_a = torch.randn(n_out, generator=generator).to(device).requires_grad_() if betas else None
    beta_u = torch.randn(n_out, generator=generator).to(device).requires_grad_() if betas else None
    mask = _mask(problems, n_in, 2, device) if masked else None

    def run(votes, beta_a, beta_u):
        return routing.em_routing(votes, iterations, mask=mask, beta_a=beta_a, beta_u=beta_u)

    check_against_reference(monkeypatch, run, (votes, beta_a, beta_u), seed=4)


# problems larger than one block: simple routing reads the votes in chunks of D.  MAX_BLOCK lowered to 64 makes
# small problems (which the interpreter routes fast) span several chunks, the last one partial.
SLOW = pytest.mark.slow
CHUNKED_CASES = [
    # (I, O, D, T, normalize, weighted_mean, mask, init, need_logits)
    (5, 3, 7, 3, "inputs", False, True, False, False),  # GRET's call
    pytest.param((3, 7, 9, 3, "inputs", False, False, False, True), marks=SLOW),  # cao2019's vertical routing
    (5, 3, 7, 2, "outputs", True, True, True, True),
    (6, 2, 9, 1, "outputs", False, False, True, True),
    (3, 5, 3, 4, "inputs", True, True, True, True),
    pytest.param((7, 4, 5, 2, "outputs", False, True, False, False), marks=SLOW),
]


def _chunked(monkeypatch, block=64):
    monkeypatch.setattr(routing_triton, "MAX_BLOCK", block)
    return sum(routing_triton.LAUNCHES[name] for name in ("_chunked_forward", "_chunked_backward"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CHUNKED_CASES, ids=lambda c: "I{}-O{}-D{}-T{}-{}-w{:d}-m{:d}-i{:d}-l{:d}".format(*c))
def test_chunked_simple_routing_equals_the_reference(case, device, kernel, monkeypatch):
    n_in, n_out, n_dim, iterations, normalize, weighted, masked, with_init, need_logits = case
    before = _chunked(monkeypatch)
    generator = torch.Generator().manual_seed(sum(case[:4]))
    problems = 3
    votes = (2 * torch.randn(problems, n_in, n_out, n_dim, generator=generator)).to(device).requires_grad_()
    assert not routing_triton.fits(votes) and routing_triton.fits(votes, chunked=True)
    init = torch.randn(problems, n_in, n_out, generator=generator).to(device).requires_grad_() if with_init else None
    mask = _mask(problems, n_in, 1, device) if masked else None

    def run(votes, init):
        return routing.simple_routing(votes, iterations, normalize=normalize, weighted_mean=weighted,
                                      init_logits=init, mask=mask, need_logits=need_logits)

    check_against_reference(monkeypatch, run, (votes, init), seed=3)
    assert _chunked(monkeypatch) > before + 2  # the first-use check's pair and the routing's


@pytest.mark.parametrize("device", DEVICES)
def test_chunked_half_precision_votes(device, kernel, monkeypatch):
    """bf16 votes over T = 3: the votes' gradient is summed over the iterations in a float32 buffer."""
    _chunked(monkeypatch)
    generator = torch.Generator().manual_seed(13)
    votes = torch.randn(3, 5, 3, 6, generator=generator).to(device, torch.bfloat16).requires_grad_()
    mask = _mask(3, 5, 4, device)

    def run(votes):
        return routing.simple_routing(votes, 3, normalize="inputs", mask=mask, need_logits=False)

    check_against_reference(monkeypatch, run, (votes,), seed=14, unit=2.0**-8)


SHARED_CASES = [
    # (I, O, D, members, T, normalize, weighted_mean, init, need_logits)
    (5, 3, 7, 3, 3, "inputs", False, True, True),  # cao2019's horizontal routing, eq. 15's self initialisation
    pytest.param((4, 2, 5, 3, 2, "inputs", False, False, False), marks=SLOW),
    (3, 4, 6, 2, 1, "outputs", True, True, True),
    pytest.param((6, 3, 3, 3, 4, "outputs", False, False, True), marks=SLOW),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", SHARED_CASES, ids=lambda c: "I{}-O{}-D{}-Q{}-T{}-{}-w{:d}-i{:d}-l{:d}".format(*c))
def test_shared_votes_route_in_the_chunked_kernels(case, device, kernel, monkeypatch):
    """Votes ``(G, 1, I, O, D)`` routed by Q problems each against a mask ``(G, Q, I)`` (an all-masked problem,
    an input no problem keeps), as cao2019's horizontal routing has them; their gradient sums over the Q.

    ``unit`` is 4e-6: T = 3 from random starting logits makes gradients of 50 from weights of 1, where the
    kernels' sums in another order were once 1.02 times the 1e-6 bound (a scan of 8 seeds: 0.5-6 times the
    reference's float32 error, as rounding goes; a wrong term is off by far more)."""
    n_in, n_out, n_dim, members, iterations, normalize, weighted, with_init, need_logits = case
    before = _chunked(monkeypatch)
    generator = torch.Generator().manual_seed(sum(case[:5]))
    groups = 2
    votes = (2 * torch.randn(groups, 1, n_in, n_out, n_dim, generator=generator)).to(device).requires_grad_()
    init = (torch.randn(groups, members, n_in, n_out, generator=generator).to(device).requires_grad_()
            if with_init else None)
    mask = _mask(groups * members, n_in, 3, device).view(groups, members, n_in)
    mask[1, :, 0] = False

    def run(votes, init):
        return routing.simple_routing(votes, iterations, normalize=normalize, weighted_mean=weighted,
                                      init_logits=init, mask=mask, need_logits=need_logits)

    check_against_reference(monkeypatch, run, (votes, init), seed=17, unit=4e-6)
    assert _chunked(monkeypatch) > before + 2


#: every kind of routing the kernels take, as their callers call it: (method, normalize, weighted_mean, starting
#: logits, layout); layout "block" (one program's block), "chunked" (MAX_BLOCK lowered) or "shared" (cao2019's
#: horizontal votes)
KINDS = {
    "li2019-simple": ("simple", "outputs", True, False, "block"),
    "cao2019-vertical": ("simple", "inputs", False, False, "block"),
    "gret-init": ("simple", "inputs", False, True, "block"),
    "li2019-em": ("em", None, False, False, "block"),
    "chunked-outputs": ("simple", "outputs", True, True, "chunked"),
    "chunked-inputs": ("simple", "inputs", False, False, "chunked"),
    "cao2019-horizontal": ("simple", "inputs", False, True, "shared"),
}


def _padding(problems, n_in, generator, device):
    """A padding mask ``(problems, I)``: each problem keeps a random prefix of its inputs, the first none."""
    lengths = torch.randint(1, n_in + 1, (problems,), generator=generator)
    lengths[0] = 0
    return (torch.arange(n_in)[None, :] < lengths[:, None]).to(device)


@pytest.mark.parametrize("kind, iterations", [
    pytest.param(kind, iterations, marks=SLOW) if KINDS[kind][-1] != "block" and iterations > 1 else (kind, iterations)
    for kind in KINDS for iterations in (1, 2, 3, 6)])
def test_every_kind_at_every_iteration_count(kind, iterations, kernel, monkeypatch):
    """Each kind of routing at T = 1, 2 (cao2019's routing weights route T - 1 times), 3 and 6, on a seeded random
    shape with odd sizes and a padding mask, in values and gradients.  The chunked kinds above T = 1 take the
    interpreter 5-30 s each (slow tier)."""
    method, normalize, weighted, with_init, layout = KINDS[kind]
    generator = torch.Generator().manual_seed(100 * list(KINDS).index(kind) + iterations)

    def odd(low, high):
        return 2 * int(torch.randint(low, high + 1, (1,), generator=generator)) + 1

    if layout == "block":
        n_in, n_out, n_dim = odd(1, 3), odd(1, 2), odd(0, 1)
    else:  # the interpreter's time grows with the chunks and, for the backward pass, T (T + 1) / 2
        n_in, n_out, n_dim = odd(1, 2), 3, odd(2, 3)
        _chunked(monkeypatch)
    groups, members = (2, 3) if layout == "shared" else (3, 1)
    votes = (2 * torch.randn(groups, 1, n_in, n_out, n_dim, generator=generator)).to(DEVICE)
    votes = (votes if layout == "shared" else votes[:, 0]).requires_grad_()
    mask = _padding(groups * members, n_in, generator, DEVICE)
    mask = mask.view(groups, members, n_in) if layout == "shared" else mask
    if layout != "block":
        assert not routing_triton.fits(votes, mask=mask) and routing_triton.fits(votes, chunked=True, mask=mask)
    init = (torch.randn(*mask.shape, n_out, generator=generator).to(DEVICE).requires_grad_()
            if with_init else None)
    betas = [torch.randn(n_out, generator=generator).to(DEVICE).requires_grad_() for _ in range(2)]

    def run(votes, init, beta_a, beta_u):
        if method == "em":
            return routing.em_routing(votes, iterations, mask=mask, beta_a=beta_a, beta_u=beta_u)
        return routing.simple_routing(votes, iterations, normalize=normalize, weighted_mean=weighted,
                                      init_logits=init, mask=mask)

    check_against_reference(monkeypatch, run, (votes, init, *(betas if method == "em" else (None, None))),
                            seed=iterations, unit=4e-6)


@pytest.mark.parametrize("layout, method", [("block", "simple-outputs"), ("block", "simple-inputs"), ("block", "em"),
                                            ("chunked", "simple-outputs"), ("chunked", "simple-inputs")])
def test_kernels_keep_only_their_inputs_for_backward(layout, method, kernel, monkeypatch):
    """What the routing holds between the forward and the backward pass (the part of peak memory that grows with
    the batch): the kernels, one-block and chunked, save their inputs only (votes, mask, EM's betas); the
    reference saves its masked copy of the votes, the coupling of every iteration and more.  (EM has no chunked
    kernel: a problem larger than a block routes in the reference.)"""
    if layout == "chunked":
        _chunked(monkeypatch)
    votes = torch.randn(3, 6, 3, 7, device=DEVICE, requires_grad=True)
    mask = _mask(3, 6, 5, DEVICE)
    betas = [torch.zeros(3, device=DEVICE, requires_grad=True) for _ in range(2)]

    def route():
        if method == "em":
            return routing.em_routing(votes, 2, mask=mask, beta_a=betas[0], beta_u=betas[1])
        return routing.simple_routing(votes, 2, normalize=method.split("-")[1], mask=mask, need_logits=False)

    def saved_bytes():
        held = {}

        def pack(tensor):
            held[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            route()
        return sum(held.values())

    route()  # the first-use check
    fused = saved_bytes()
    reference = _reference(monkeypatch, saved_bytes)
    assert fused == votes.numel() * 4 + mask.numel() + (2 * 3 * 4 if method == "em" else 0), fused
    assert reference > 2 * fused, (fused, reference)


def test_gret_and_cao2019_vertical_take_the_chunked_kernel_for_40_tokens(kernel, monkeypatch):
    """At their defaults (GRET: K = 4, d_c = 128; cao2019: H = 8) a 40-token sentence is a problem larger than one
    block (64 x 4 x 128 and 8 x 64 x 64 values): it routes in the chunked kernels, as the reference does."""
    from onmt_ext.mechanisms import cao2019, gret

    torch.manual_seed(2)
    length, d_model, capsule_dim = 40, 8, 128
    hidden = torch.randn(1, 1, length, d_model, device=DEVICE)
    keep = torch.ones(1, length, dtype=torch.bool, device=DEVICE)
    keep[0, -3:] = False
    weights = [torch.randn(*shape, device=DEVICE) / 4 for shape in
               [(4, d_model, capsule_dim), (capsule_dim, capsule_dim), (capsule_dim,), (1, capsule_dim), (1,)]]
    scores = torch.randn(1, 8, length, length, device=DEVICE)
    head_weight = torch.randn(8, 8, device=DEVICE)

    def run():
        return (gret.global_summary(hidden, keep, None, None, *weights, eps=1e-6, capsules=4, iterations=3),
                cao2019.vertical_output(scores, torch.ones(1, length, dtype=torch.bool, device=DEVICE), head_weight,
                                        3))

    before = routing_triton.LAUNCHES["_chunked_forward"]
    fused = run()
    assert routing_triton.LAUNCHES["_chunked_forward"] >= before + 4  # each routing and its first-use check
    for got, want in zip(fused, _reference(monkeypatch, run)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_cao2019_horizontal_takes_the_chunked_kernel_for_40_tokens(kernel, monkeypatch):
    """cao2019's horizontal routing of a 40-token sentence (H = 8, eq. 15's self initialisation, padding): the L
    problems of a sentence share its votes ``(L, H, L)`` and route in the chunked kernels."""
    from onmt_ext.mechanisms import cao2019

    torch.manual_seed(3)
    length = 40
    scores = torch.randn(1, 8, length, length, device=DEVICE)
    valid = torch.ones(1, length, dtype=torch.bool, device=DEVICE)
    valid[0, -2:] = False

    def run():
        return (cao2019.horizontal_output(scores, valid, "self", 3),)

    before = routing_triton.LAUNCHES["_chunked_forward"]
    fused = run()
    assert routing_triton.LAUNCHES["_chunked_forward"] >= before + 2  # the routing and its first-use check
    for got, want in zip(fused, _reference(monkeypatch, run)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_chunked_routing_at_gret_size_equals_the_reference(kernel, monkeypatch):
    """GRET's routing of 40 tokens at its real size (no lowered block), values and gradients (slow in the
    interpreter)."""
    generator = torch.Generator().manual_seed(15)
    votes = torch.randn(2, 40, 4, 128, generator=generator).to(DEVICE).requires_grad_()
    mask = _mask(2, 40, 6, DEVICE)
    mask[0] = True

    def run(votes):
        return routing.simple_routing(votes, 3, normalize="inputs", mask=mask, need_logits=False)

    before = routing_triton.LAUNCHES["_chunked_backward"]
    check_against_reference(monkeypatch, run, (votes,), seed=16)
    assert routing_triton.LAUNCHES["_chunked_backward"] > before


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("method", ["simple", "em"])
def test_half_precision_votes_route_in_float32(method, dtype, device, kernel, monkeypatch):
    """fp16/bf16 in and out, float32 inside, as the reference: the two differ by the output's rounding."""
    generator = torch.Generator().manual_seed(7)
    votes = torch.randn(6, 4, 8, 2, generator=generator).to(device, dtype).requires_grad_()

    def run(votes):
        if method == "simple":
            return routing.simple_routing(votes, 3, normalize="outputs", weighted_mean=True, need_logits=False)
        return routing.em_routing(votes, 3)

    check_against_reference(monkeypatch, run, (votes,), seed=5, unit=2.0**-8 if dtype == torch.bfloat16 else 2.0**-11)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", ["simple", "em"])
def test_li2019_aggregation_through_the_kernels(method, device, kernel, monkeypatch):
    """li2019's core as its module calls it: strided votes (a view of the head-major products), the
    recomputing backward pass, gradients on every parameter."""
    torch.manual_seed(0)
    module = li2019.RoutingAggregation(heads=4, d_model=16, capsules=8, method=method, iterations=3).to(device)
    if method == "em":
        with torch.no_grad():
            module.beta_a.normal_()
            module.beta_u.normal_()
    context = torch.randn(3, 5, 16, device=device, requires_grad=True)
    params = dict(module.named_parameters())

    def run(context, *values):
        arguments = dict(zip(params, values))
        return (torch.func.functional_call(module, arguments, (context,)),)

    check_against_reference(monkeypatch, run, [context, *params.values()], seed=6)


def test_the_kernels_take_the_votes_as_they_lie(kernel, monkeypatch):
    """A transposed, non-contiguous view routes as its contiguous copy, and its gradient has the view's shape."""
    generator = torch.Generator().manual_seed(8)
    base = torch.randn(4, 6, 3, 5, generator=generator).to(DEVICE).requires_grad_()  # (H, P, N, D)
    votes = base.transpose(0, 1)  # (P, H, N, D), as li2019 makes them
    assert not votes.is_contiguous()
    fused = _values_and_grads(lambda b: routing.em_routing(b.transpose(0, 1), 2), (base,), seed=9)
    copy = base.detach().transpose(0, 1).contiguous().requires_grad_()
    contiguous = _values_and_grads(lambda v: routing.em_routing(v, 2), (copy,), seed=9)
    for got, want in zip(fused, contiguous[:2] + [contiguous[2].transpose(0, 1)]):
        torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_strided_starting_logits_and_masks(kernel, monkeypatch):
    """cao2019's decoding step passes its votes and starting logits as permuted views: the kernels read every
    input as it lies (the starting logits were once read as if contiguous)."""
    generator = torch.Generator().manual_seed(11)
    rows = torch.randn(3, 4, 5, 6, generator=generator).to(DEVICE)  # (B, H, t, M)
    votes = rows.permute(0, 2, 1, 3).requires_grad_()  # (B, t, H, M), not contiguous
    init = rows[:, :, :, 0].permute(0, 2, 1).detach().requires_grad_()  # (B, t, H), not contiguous
    mask = (torch.rand(3, 4, 5, generator=generator) > 0.3).to(DEVICE)[:, 0]  # (B, t), not contiguous
    assert not (votes.is_contiguous() or init.is_contiguous() or mask.is_contiguous())

    def run(votes, init):
        return routing.simple_routing(votes, 3, normalize="inputs", init_logits=init, mask=mask)

    check_against_reference(monkeypatch, run, (votes, init), seed=12)


def test_leading_dimensions_and_empty_batches(kernel):
    votes = torch.randn(2, 3, 4, 5, 2, device=DEVICE)
    out, act = routing.em_routing(votes, 2)
    assert out.shape == (2, 3, 5, 2) and act.shape == (2, 3, 5)
    out, logits = routing.simple_routing(votes[:, :0], 2)
    assert out.shape == (2, 0, 5, 2) and logits.shape == (2, 0, 4, 5)


def _kernels_not_yet_imported(monkeypatch):
    """As in a fresh process: the kernels' module is not imported until :func:`routing.prepare_kernels` (eager
    code) imports it; inside a trace :func:`routing._load_kernels` returns None, as it does there."""
    load = routing._load_kernels

    def first_import():
        if not torch.compiler.is_compiling():
            sys.modules[routing._KERNEL_MODULE] = routing_triton
        return load()

    monkeypatch.delitem(sys.modules, routing._KERNEL_MODULE)
    monkeypatch.setattr(routing, "_load_kernels", first_import)


#: ``torch.compile``'s backends of the compiled cores' tests: ``aot_eager`` (Dynamo's and AOTAutograd's graphs run
#: as traced: the eager kernels' values exactly) and, in the slow tier, Inductor, which generates code (C++ on the
#: CPU) for the arithmetic around the kernels' operators, as on a GPU, where its sums may round otherwise.
BACKENDS = ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)]


def _same_as_eager(backend):
    """The tolerance of a compiled core against the eager kernels under ``backend``."""
    return {"atol": 0, "rtol": 0} if backend == "aot_eager" else {"rtol": 1e-5, "atol": 1e-6}


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_core_keeps_the_kernel_as_one_call(backend, kernel, monkeypatch):
    """``-ext_compile``: the custom operators trace into a full graph (dynamic shapes) and give the eager
    kernels' values and gradients; Dynamo's graph holds the operator, not the routing's arithmetic.  In a process
    that had not imported the kernels, li2019's module imports them before its compiled core, which launches them
    (forward and backward) from its first call on."""
    _kernels_not_yet_imported(monkeypatch)
    monkeypatch.setattr(li2019.RoutingAggregation, "ext_compile", True)
    from onmt_ext.runtime import compile as ext_compile
    monkeypatch.setattr(ext_compile, "BACKEND", backend)
    monkeypatch.setattr(ext_compile, "_COMPILED", {})
    torch._dynamo.reset()
    torch.manual_seed(1)
    module = li2019.RoutingAggregation(heads=2, d_model=8, capsules=8, method="em", iterations=2).to(DEVICE)
    kernels = ("_em_forward", "_em_backward")
    for length in (3, 4):
        context = torch.randn(2, length, 8, device=DEVICE, requires_grad=True)
        before = {name: routing_triton.LAUNCHES[name] for name in kernels}
        compiled = _values_and_grads(lambda c: (module(c),), (context,), seed=10)
        assert all(routing_triton.LAUNCHES[name] > before[name] for name in kernels), routing_triton.LAUNCHES
        module.ext_compile = False
        eager = _values_and_grads(lambda c: (module(c),), (context,), seed=10)
        module.ext_compile = True
        for got, want in zip(compiled, eager):
            torch.testing.assert_close(got, want, **_same_as_eager(backend))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(li2019.aggregate_heads)(
        torch.randn(2, 3, 8, device=DEVICE), module.input_weight, module.input_bias, module.vote_weight, module.beta_a,
        module.beta_u, heads=2, capsules=8, method="em", iterations=2, recompute=False)
    graphs = [str(graph.graph) for graph in explained.graphs]
    assert explained.graph_break_count == 0
    assert any("onmt_ext.routing_em" in graph for graph in graphs), graphs


@pytest.mark.slow
@pytest.mark.parametrize("causal, backend", [(False, "aot_eager"), (True, "aot_eager"), (True, "inductor")],
                         ids=["encoder", "decoder", "decoder-inductor"])
def test_compiled_cao2019_core_routes_in_the_kernels(causal, backend, kernel, monkeypatch):
    """cao2019 with ``-ext_compile``: its module imports the kernels before its compiled core (as li2019's and
    GRET's do), so both routings of the core's graph run in them, vertical in the one-block kernel, horizontal
    (shared votes) in the chunked one, at two lengths, with the eager kernels' values and gradients and the
    PyTorch code's (the decoder variant's full pass and a decoding step too).  Under Inductor only the decoder,
    whose graph holds both routings too: the encoder's is already the slowest of these tests (docs/kernels.md)."""
    from onmt_ext.mechanisms import cao2019
    from onmt_ext.runtime import compile as ext_compile

    _kernels_not_yet_imported(monkeypatch)
    monkeypatch.setattr(ext_compile, "BACKEND", backend)
    monkeypatch.setattr(ext_compile, "_COMPILED", {})
    torch._dynamo.reset()
    torch.manual_seed(4)
    heads = 2
    module = (cao2019.CausalCrossAggregation if causal else cao2019.CrossAggregation)(
        heads, vertical=True, horizontal=True, init="self", iterations=2).to(DEVICE)
    with torch.no_grad():
        module.head_weight.normal_()
    weight = module.head_weight
    kernels = ("_simple_forward", "_simple_backward", "_chunked_forward", "_chunked_backward")

    def run(scores, weight):
        module.ext_compile = True
        return (module(scores),)

    def eager(scores, weight):
        module.ext_compile = False
        return (module(scores),)

    for length in (5, 6):
        scores = torch.randn(2, heads, length, length, device=DEVICE)
        masked = torch.zeros(2, 1, length, length, dtype=torch.bool, device=DEVICE)
        masked[1, ..., -2:] = True  # padding
        if causal:
            masked = masked | torch.ones(length, length, dtype=torch.bool, device=DEVICE).triu(1)
        scores = scores.masked_fill(masked, -1e18).requires_grad_()
        before = {name: routing_triton.LAUNCHES[name] for name in kernels}
        compiled = _values_and_grads(run, (scores, weight), seed=18)
        assert all(routing_triton.LAUNCHES[name] > before[name] for name in kernels), routing_triton.LAUNCHES
        for got, want in zip(compiled, _values_and_grads(eager, (scores, weight), seed=18)):
            torch.testing.assert_close(got, want, **_same_as_eager(backend))
        for got, want in zip(compiled, _reference(monkeypatch, _values_and_grads, eager, (scores, weight), seed=18)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert ext_compile._COMPILED, "the core did not compile"
    if causal:  # a decoding step: the one-block kernel routes both routings of one query
        module.stepwise = True
        module.ext_compile = True
        module.decoding_state = {}
        before = routing_triton.LAUNCHES["_simple_forward"]
        with torch.no_grad():
            for step in range(3):
                module(torch.randn(2, heads, 1, step + 1, device=DEVICE))
        assert routing_triton.LAUNCHES["_simple_forward"] >= before + 6


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_gret_core_routes_in_the_kernels(backend, kernel, monkeypatch):
    """GRET with ``-ext_compile``: its module imports the kernels before its compiled core (global_summary), so
    the core's routing runs in them in a process that had not imported them, at two lengths with padding, with
    the eager kernels' values and gradients and the PyTorch code's."""
    from onmt_ext.mechanisms import gret
    from onmt_ext.runtime import compile as ext_compile

    _kernels_not_yet_imported(monkeypatch)
    monkeypatch.setattr(ext_compile, "BACKEND", backend)
    monkeypatch.setattr(ext_compile, "_COMPILED", {})
    torch._dynamo.reset()
    torch.manual_seed(6)
    module = gret.GlobalRepresentation(8, layers=2, capsules=2, iterations=3).to(DEVICE)
    params = [p for name, p in module.named_parameters() if not name.startswith("gru.")]
    kernels = ("_simple_forward", "_simple_backward")

    def summary(compiled, keep):
        def run(*hidden_and_params):
            module.ext_compile = compiled
            module.start()
            for output in hidden_and_params[:2]:
                module.observe(None, None, output)
            return (module.summarise(keep),)
        return run

    for length in (5, 6):
        hidden = [torch.randn(2, length, 8, device=DEVICE, requires_grad=True) for _ in range(2)]
        keep = torch.ones(2, length, dtype=torch.bool, device=DEVICE)
        keep[1, -2:] = False  # padding
        before = {name: routing_triton.LAUNCHES[name] for name in kernels}
        compiled = _values_and_grads(summary(True, keep), (*hidden, *params), seed=19)
        assert all(routing_triton.LAUNCHES[name] > before[name] for name in kernels), routing_triton.LAUNCHES
        for got, want in zip(compiled, _values_and_grads(summary(False, keep), (*hidden, *params), seed=19)):
            torch.testing.assert_close(got, want, **_same_as_eager(backend))
        reference = _reference(monkeypatch, _values_and_grads, summary(False, keep), (*hidden, *params), seed=19)
        for got, want in zip(compiled, reference):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert ext_compile._COMPILED, "the core did not compile"


# ----------------------------------------------------------------------------------------------------------
# which path the routing core takes


def _forbid_kernels(monkeypatch):
    """Make every call of the kernels fail, and return the list of those calls."""
    calls = []

    def refuse(*args, **kwargs):
        calls.append(args)
        raise AssertionError("the fused kernels were called")

    monkeypatch.setattr(routing_triton, "simple_routing", refuse)
    monkeypatch.setattr(routing_triton, "em_routing", refuse)
    return calls


def test_auto_keeps_cpu_tensors_on_the_reference(monkeypatch):
    monkeypatch.delenv(routing.KERNEL_VARIABLE, raising=False)
    monkeypatch.setattr(routing, "_TRUSTED", {})
    assert routing.kernel_choice() == "auto"
    calls = _forbid_kernels(monkeypatch)
    routing.em_routing(torch.randn(3, 4, 5, 1), 2)
    routing.simple_routing(torch.randn(3, 4, 5, 1), 2)
    assert calls == []


def _as_if_on_cuda(monkeypatch):
    """Make the routing core take every tensor for a CUDA tensor, so that its choice for CUDA is tested on a
    machine without one (the kernels then run in the interpreter)."""
    monkeypatch.setattr(routing, "_on_cuda", lambda tensor: True)


def test_auto_takes_the_kernels_for_cuda_tensors(monkeypatch):
    """``auto`` (unset) routes CUDA tensors through the kernels, each kind checked on first use, then used."""
    monkeypatch.delenv(routing.KERNEL_VARIABLE, raising=False)
    monkeypatch.setattr(routing, "_TRUSTED", {})
    calls = []
    for name in ("simple_routing", "em_routing"):
        monkeypatch.setattr(routing_triton, name, lambda *args, fn=getattr(routing_triton, name), name=name:
                            calls.append(name) or fn(*args))
    votes = torch.randn(3, 4, 5, 2, device=DEVICE)
    if DEVICE.type == "cpu":
        assert routing._fused_kernels(votes) is None  # the CPU: the reference
    _as_if_on_cuda(monkeypatch)
    assert routing._fused_kernels(votes) is routing_triton
    for _ in range(2):
        routing.em_routing(votes, 2)
        routing.simple_routing(votes, 2, normalize="inputs")
    assert calls.count("em_routing") == calls.count("simple_routing") == 1 + 2  # the first-use check, the calls
    assert all(routing._TRUSTED.values()) and len(routing._TRUSTED) == 2


def test_torch_choice_keeps_every_device_on_the_reference(monkeypatch):
    monkeypatch.setenv(routing.KERNEL_VARIABLE, "torch")
    monkeypatch.setattr(routing, "_TRUSTED", {})
    calls = _forbid_kernels(monkeypatch)
    _as_if_on_cuda(monkeypatch)  # where ``auto`` would take the kernels
    votes = torch.randn(3, 4, 5, 1, device=DEVICES[-1])
    routing.em_routing(votes, 2)
    routing.simple_routing(votes, 2, normalize="inputs")
    assert calls == []


def test_calls_the_kernels_do_not_cover_stay_on_the_reference(kernel, monkeypatch):
    calls = _forbid_kernels(monkeypatch)
    too_big = torch.randn(1, 16, 64, 32, device=DEVICE)  # 32,768 block values > MAX_BLOCK
    assert not routing_triton.fits(too_big)
    routing.em_routing(too_big, 1)  # EM has no chunked kernel
    large_state = torch.randn(1, 128, 64, 4, device=DEVICE)  # I x O = 8,192 > MAX_STATE
    assert not routing_triton.fits(large_state, chunked=True)
    routing.simple_routing(large_state, 1)
    routing.simple_routing(torch.randn(3, 4, 5, 2, dtype=torch.float64, device=DEVICE), 2)  # float64
    shared = torch.randn(1, 2, 4, 3, 2, device=DEVICE)  # votes shared along a leading dimension that is not the last
    routing.simple_routing(shared, 2, normalize="inputs", mask=torch.ones(3, 2, 4, dtype=torch.bool, device=DEVICE))
    votes = torch.randn(3, 4, 5, 1, device=DEVICE)
    routing.em_routing(votes, 2, inverse_temperature=routing.linear_inverse_temperature(1, 3))
    routing.em_routing(votes, 2, density="sum")
    routing.em_routing(votes, 2, beta_a=torch.zeros(3, 5, device=DEVICE))  # per-problem betas
    assert calls == []
    with pytest.warns(UserWarning, match="failed its first-use check"):
        routing.em_routing(votes, 2)  # and the forbidding works
    assert len(calls) == 1


@pytest.mark.parametrize("fault", ["wrong", "raises"])
def test_a_kernel_that_fails_its_first_use_check_is_named_once_and_not_used(fault, kernel, monkeypatch):
    """A kernel whose values are off (or that does not compile on the device) is checked once, named in one
    warning, and the routing gives the reference's results."""
    right = routing_triton.em_routing
    calls = []

    def faulty(votes, *args):
        calls.append(votes.shape)
        if fault == "raises":
            raise RuntimeError("PTX assembly aborted\nsecond line")
        out, act = right(votes, *args)
        return out * 1.01, act

    monkeypatch.setattr(routing_triton, "em_routing", faulty)
    votes = torch.randn(4, 3, 5, 2, device=DEVICE)
    with pytest.warns(UserWarning, match="fused kernel for EM .* routing of \\(3, 5, 2\\) votes in torch.float32 on "
                      f"{DEVICE.type} failed its first-use check") as caught:
        out, _ = routing.em_routing(votes, 2)
    assert len(caught) == 1
    if fault == "raises":
        assert "RuntimeError: PTX assembly aborted)" in str(caught[0].message)
    else:
        assert "result 0 is" in str(caught[0].message)
    torch.testing.assert_close(out, _reference(monkeypatch, routing.em_routing, votes, 2)[0], atol=0, rtol=0)
    checked = len(calls)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        routing.em_routing(torch.randn(2, 3, 5, 2, device=DEVICE), 2)
    assert len(calls) == checked  # not called again


def test_a_right_kernel_passes_its_check_silently_once(kernel, monkeypatch):
    calls = []
    right = routing_triton.simple_routing

    def counted(*args):
        calls.append(1)
        return right(*args)

    monkeypatch.setattr(routing_triton, "simple_routing", counted)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            routing.simple_routing(torch.randn(2, 4, 3, 1, device=DEVICE), 3, need_logits=False)
    assert len(calls) == 1 + 3  # the check's one call, then every routing


def test_a_wrong_choice_is_named(monkeypatch):
    monkeypatch.setenv(routing.KERNEL_VARIABLE, "cuda")
    with pytest.raises(ValueError, match="ONMT_EXT_ROUTING_KERNEL='cuda' is not one of auto, torch, triton"):
        routing.em_routing(torch.randn(3, 4, 5, 1), 2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the switch is for machines without CUDA")
def test_the_interpreter_switch_is_announced():
    """Without CUDA, importing the kernels before Triton (and before ``TRITON_INTERPRET``) turns Triton's
    interpreter on for the process, and says so in one warning."""
    import subprocess
    import sys

    import support

    script = ("import os, warnings\n"
              "with warnings.catch_warnings(record=True) as caught:\n"
              "    warnings.simplefilter('always')\n"
              "    from onmt_ext.mechanisms import routing_triton as kernels\n"
              "print(os.environ.get('TRITON_INTERPRET'), kernels.SWITCHED_TO_INTERPRETER, kernels.INTERPRETED,\n"
              "      sum('switched on for this process' in str(w.message) for w in caught))\n")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=support.REPO, env=env,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[-2] == "1 True True 1", result.stdout


# ----------------------------------------------------------------------------------------------------------
# the real compiler


@pytest.mark.parametrize("shape, kernels", [
    ([], 8),  # li2019 at Base: the one-block kernels, EM and simple, with and without a mask
    (["--shape", "40", "4", "128"], 4),  # GRET's 40 tokens: chunked forward and backward, plain and masked
    (["--shape", "40", "8", "40", "--shared"], 2),  # cao2019's horizontal routing at L = 40
], ids=["li2019", "gret-chunked", "cao2019-shared"])
def test_the_kernels_compile_for_a_hopper_gpu(tmp_path, shape, kernels):
    """Triton's whole compiler (not the interpreter, which is lenient: it missed a loop-carried variable of the
    chunked backward that this caught) builds every kernel for sm_90, through ptxas, on this machine without a
    GPU (tools/kernel_resources.py)."""
    import json
    import subprocess
    import sys

    import support

    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    report = tmp_path / "kernels.json"
    result = subprocess.run([sys.executable, "-m", "tools.kernel_resources", "--arch", "90", "--dtype", "bf16",
                             *shape, "--json", str(report)], capture_output=True, text=True, cwd=support.REPO,
                            env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(report.read_text())["rows"]
    assert len(rows) == kernels
    assert all(0 < row["registers"] <= 255 for row in rows), rows


def test_the_first_use_check_runs_on_the_votes_gpu(kernel, monkeypatch):
    """The check runs in a thread of its own, whose current CUDA device is GPU 0 whatever the caller's; Triton
    launches on the current device, so a rank on ``cuda:1`` would check its kernels on GPU 0 with GPU 1's
    memory.  The thread makes the votes' device current (CUDA's device context faked here, as on the CPU)."""
    import threading

    entered = []

    class Device:
        def __init__(self, device):
            self.device = device

        def __enter__(self):
            entered.append((threading.current_thread().name, self.device))

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(torch.cuda, "device", Device)
    gpu = torch.device("cuda", 1)
    assert routing._isolated(lambda: threading.current_thread().name, device=gpu) == "onmt-ext routing kernel check"
    assert entered == [("onmt-ext routing kernel check", gpu)]
    seen = []
    monkeypatch.setattr(routing, "_isolated", lambda check, *args, device: seen.append(device))
    routing.simple_routing(torch.randn(2, 5, 4, 3, device=DEVICE), 2, normalize="inputs")
    assert seen == [DEVICE]  # the check is given the votes' device


def test_one_first_use_check_serves_every_length_of_a_compiled_variant(kernel, monkeypatch):
    """GRET's and cao2019's problems grow with the sentence: a check per length would read values back to the
    host in training steps long after the first, so the check is made once per compiled kernel variant."""
    checks = []
    check = routing._kernel_disagreement
    monkeypatch.setattr(routing, "_kernel_disagreement", lambda *args: checks.append(args[0].shape) or check(*args))
    for length in (5, 7, 8):  # one block of 8 inputs
        routing.simple_routing(torch.randn(2, length, 4, 3, device=DEVICE), 2, normalize="inputs")
    assert len(checks) == 1
    routing.simple_routing(torch.randn(2, 9, 4, 3, device=DEVICE), 2, normalize="inputs")  # a block of 16
    assert len(checks) == 2
    assert routing_triton.variant(torch.randn(2, 5, 4, 3)) == routing_triton.variant(torch.randn(2, 8, 4, 3))
