"""onmt_ext.ops.softmax_width: the padded width, and that padding to it changes no softmax."""

import pytest
import torch
import torch.nn.functional as F

from onmt_ext import ops


def test_only_cpu_rows_of_4_to_15_get_a_wider_width():
    assert [ops.softmax_width(n, "cpu") for n in (1, 3, 4, 9, 15, 16, 40)] == [1, 3, 16, 16, 16, 16, 40]
    assert ops.softmax_width(9, torch.device("cpu")) == 16
    assert ops.softmax_width(9, "meta") == 9  # other devices: the real width


@pytest.mark.parametrize("size", [4, 9, 14, 15])
def test_a_softmax_at_the_padded_width_equals_torch_softmax_with_its_gradient(size):
    torch.manual_seed(size)
    x = (torch.randn(3, 5, size) * 4)
    x[0, :, size // 2:] = -1e18  # keys masked as OpenNMT-py masks them
    x[1, 2] = -1e18  # a row masked everywhere: uniform, as with torch.softmax
    x.requires_grad_()
    grad = torch.randn(3, 5, size)
    width = ops.softmax_width(size, x.device)
    ours = torch.softmax(F.pad(x, (0, width - size), value=float("-inf")), -1)[..., :size]
    ref = torch.softmax(x, -1)
    torch.testing.assert_close(ours, ref, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(*(torch.autograd.grad(y, x, grad)[0] for y in (ours, ref)), atol=1e-6, rtol=1e-5)
    assert torch.equal(ours[0, :, size // 2:], torch.zeros(5, size - size // 2))
