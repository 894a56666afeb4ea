"""The fused clause attention kernel (onmt_ext.kernels.clause_mix) against the tensor code and a reference.

The kernel computes eq. 4-5 of clause attention row by row, from the
clauses' key spans (:meth:`ClauseStructure.spans`).  It is checked three
ways: directly against a masked-softmax reference written here (float64),
through :class:`ClauseAttention` with the kernels on and off (what the
encoder runs), and on the spans themselves.
"""

import pytest
import torch

from onmt_ext import kernels
from onmt_ext.clause_attention import ClauseAttention, ClauseStructure

pytestmark = pytest.mark.skipif(kernels.library() is None, reason="the fused kernels did not build")

LEVELS = 6


def _batch(batch, length, seed, marker_rate=0.25):
    """Random tokens with markers of levels 1-6 (ids 1-6) and padding of random length."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(7, 40, (batch, length), generator=gen)
    markers = torch.rand(batch, length, generator=gen) < marker_rate
    tokens[markers] = torch.randint(1, 7, (int(markers.sum()),), generator=gen)
    lengths = torch.randint(1, length + 1, (batch,), generator=gen)
    lengths[0] = length
    pad = torch.arange(length)[None, :] >= lengths[:, None]
    structure = ClauseStructure(torch.arange(40).masked_fill(torch.arange(40) > 6, 0), LEVELS)
    structure.start(tokens[..., None], pad)
    return structure, pad


def _reference(scores, ids, global_weight, level_weights):
    """``cg softmax(E) + sum_d w_d softmax(E outside the query's clause at level d masked)``, by masking."""
    out = global_weight[..., None] * torch.softmax(scores, -1)
    for d in range(ids.size(1)):
        outside = (ids[:, d, :, None] != ids[:, d, None, :]).unsqueeze(1)
        out = out + level_weights[d][..., None] * torch.softmax(scores.masked_fill(outside, -1e18), -1)
    return out


def test_spans_are_the_clauses_of_the_ids():
    structure, _ = _batch(7, 13, seed=1)
    spans, ids = structure.spans(), structure.ids[:, structure.distinct]
    assert len(structure.distinct) > 1
    positions = torch.arange(13)
    inside = (positions >= spans[..., :1]) & (positions < spans[..., 1:])  # (B, L, len, len)
    torch.testing.assert_close(inside, ids[..., :, None] == ids[..., None, :])
    # nested: each level's span lies inside the coarser level's
    assert (spans[:, 1:, :, 0] >= spans[:, :-1, :, 0]).all() and (spans[:, 1:, :, 1] <= spans[:, :-1, :, 1]).all()


@pytest.mark.parametrize("batch,length,seed", [(5, 9, 0), (3, 17, 1), (4, 1, 2), (2, 40, 3)])
def test_kernel_matches_the_masked_softmax_reference(batch, length, seed):
    structure, pad = _batch(batch, length, seed)
    gen = torch.Generator().manual_seed(seed + 10)
    scores = (3 * torch.randn(batch, 4, length, length, generator=gen, dtype=torch.float64)).masked_fill(
        pad[:, None, None, :], -1e18).requires_grad_()
    cg = torch.rand(batch, 4, length, generator=gen, dtype=torch.float64).requires_grad_()
    levels = len(structure.distinct)
    w = torch.rand(levels, batch, 4, length, generator=gen, dtype=torch.float64).requires_grad_()
    grad = torch.randn(batch, 4, length, length, generator=gen, dtype=torch.float64)
    grad = grad.masked_fill(pad[:, None, :, None], 0)  # padded queries: no gradient (their rows are not compared)
    results = []
    for compute in (lambda *a: kernels.clause_mix(*a[:1], structure.spans(), *a[1:]),
                    lambda *a: _reference(a[0], structure.ids[:, structure.distinct], *a[1:])):
        leaves = [t.detach().clone().requires_grad_() for t in (scores, cg, w)]
        out = compute(*leaves)
        (out * grad).sum().backward()
        results.append([out.detach().masked_fill(pad[:, None, :, None], 0)] + [t.grad for t in leaves])
    for fused, reference in zip(*results):
        torch.testing.assert_close(fused, reference, atol=1e-12, rtol=1e-10)


def test_clause_far_below_the_row_maximum_keeps_its_own_softmax():
    """A clause whose scores lie 200 below the row's maximum: shared exponentials would underflow to 0."""
    structure = ClauseStructure(torch.tensor([0, 1, 0]), 1)
    tokens = torch.tensor([[0, 0, 1, 0, 0]])  # clauses {0, 1} and {2, 3, 4}
    structure.start(tokens[..., None], torch.zeros_like(tokens, dtype=torch.bool))
    scores = torch.randn(1, 1, 5, 5, dtype=torch.float64)
    scores[..., :2] += 200.0
    scores.requires_grad_()
    cg, w = torch.full((1, 1, 5), 0.4, dtype=torch.float64), torch.full((1, 1, 1, 5), 0.6, dtype=torch.float64)
    out = kernels.clause_mix(scores, structure.spans(), cg, w)
    expected = _reference(scores, structure.ids, cg, w)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-10)
    local = torch.softmax(scores[0, 0, 3, 2:], -1).detach()  # query 3 attends inside its clause {2, 3, 4}
    torch.testing.assert_close(out[0, 0, 3, 2:].detach(), 0.6 * local, atol=1e-12, rtol=1e-10)
    grad = torch.randn(1, 1, 5, 5, dtype=torch.float64)
    fused_grad, = torch.autograd.grad((out * grad).sum(), scores)
    reference_grad, = torch.autograd.grad((expected * grad).sum(), scores)
    torch.testing.assert_close(fused_grad, reference_grad, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("mixing", ["scalar", "gate"])
def test_clause_attention_gives_the_same_with_the_kernel_on_and_off(monkeypatch, mixing):
    """What the encoder runs: outputs and every gradient (scores, mixing parameters), real query rows."""
    structure, pad = _batch(6, 11, seed=4)
    attention = ClauseAttention(structure, 4, mixing, d_model=8)
    with torch.no_grad():
        for parameter in attention.parameters():
            parameter.normal_()
    gen = torch.Generator().manual_seed(5)
    query = torch.randn(6, 11, 8, generator=gen)
    scores = torch.randn(6, 4, 11, 11, generator=gen).masked_fill(pad[:, None, None, :], -1e18)
    grad = torch.randn(6, 4, 11, 11, generator=gen).masked_fill(pad[:, None, :, None], 0)
    results = []
    for fused in ("1", "0"):
        monkeypatch.setenv("ONMT_EXT_FUSED", fused)
        attention.zero_grad()
        attention.query = query
        leaf = scores.clone().requires_grad_()
        out = attention(leaf)
        (out * grad).sum().backward()
        results.append([out.detach().masked_fill(pad[:, None, :, None], 0), leaf.grad] +
                       [p.grad for p in attention.parameters()])
    for fused, tensor_code in zip(*results):
        torch.testing.assert_close(fused, tensor_code, atol=1e-6, rtol=1e-5)


def test_kernel_rejects_spans_that_do_not_fit():
    structure, _ = _batch(2, 5, seed=6)
    scores = torch.randn(2, 4, 5, 5)
    levels = len(structure.distinct)
    with pytest.raises(ValueError, match="do not fit"):
        kernels.clause_mix(scores, structure.spans().long(), torch.ones(2, 4, 5), torch.ones(levels, 2, 4, 5))
    with pytest.raises(ValueError, match="do not fit"):
        kernels.clause_mix(scores, structure.spans()[:1], torch.ones(2, 4, 5), torch.ones(levels, 2, 4, 5))
