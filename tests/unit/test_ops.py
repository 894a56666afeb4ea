"""onmt_ext.ops.softmax: torch.softmax up to rounding, with short CPU rows padded."""

import pytest
import torch

from onmt_ext import ops


@pytest.mark.parametrize("size", [1, 3, 4, 9, 14, 15, 16, 23])
@pytest.mark.parametrize("dim", [-1, -2, 1])
def test_equals_torch_softmax_with_its_gradient(size, dim):
    torch.manual_seed(size)
    shape = [3, 5, 6, 7]
    shape[dim] = size
    x = (torch.randn(*shape) * 4).requires_grad_()
    grad = torch.randn(*shape)
    ours = ops.softmax(x, dim)
    (ours_grad,) = torch.autograd.grad(ours, x, grad)
    ref = torch.softmax(x, dim)
    (ref_grad,) = torch.autograd.grad(ref, x, grad)
    assert ours.shape == ref.shape
    torch.testing.assert_close(ours, ref, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ours_grad, ref_grad, atol=1e-6, rtol=1e-5)


def test_masked_rows_as_opennmt_fills_them():
    """Keys at OpenNMT-py's -1e18 get no weight; a row masked everywhere is uniform, as with torch.softmax."""
    scores = torch.randn(2, 3, 9, 9)
    scores[0, :, :, 6:] = -1e18
    scores[1, :, 4] = -1e18
    ours = ops.softmax(scores)
    assert torch.equal(ours[0, :, :, 6:], torch.zeros(3, 9, 3))
    torch.testing.assert_close(ours[1, :, 4], torch.full((3, 9), 1 / 9))
    torch.testing.assert_close(ours, torch.softmax(scores, -1), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_keeps_its_dtype(dtype):
    x = torch.randn(4, 2, 11, 11).to(dtype)
    ours = ops.softmax(x)
    assert ours.dtype == dtype
    torch.testing.assert_close(ours.float(), torch.softmax(x, -1).float(), atol=1e-2, rtol=1e-2)


def test_only_last_dimension_cpu_rows_of_4_to_15_are_padded(monkeypatch):
    padded = []
    pad = ops.F.pad
    monkeypatch.setattr(ops.F, "pad", lambda x, *args, **kwargs: padded.append(x.shape[-1]) or pad(x, *args, **kwargs))
    for size in (3, 4, 15, 16, 40):
        ops.softmax(torch.randn(2, size, size))
        ops.softmax(torch.randn(2, size, 5), dim=1)
        ops.softmax(torch.randn(2, 3, size), dim=2)
    assert padded == [4, 4, 15, 15]
