"""tools/op_count.py: it counts the launching operators of a training pass, and sees the fused routing kernels."""

import pytest
import torch

from tools import op_count


def test_views_and_detaches_are_not_counted():
    x = torch.ones(2, 3, requires_grad=True)
    mode = op_count.counter()
    with mode:
        y = (x.view(3, 2).t() * 2).detach().sum()
    assert dict(mode.counts) == {"mul": 1, "sum": 1}, mode.counts
    assert y.item() == 12


@pytest.mark.slow  # about a minute: the kernels run in Triton's interpreter
def test_the_fused_routing_kernels_launch_fewer_operators_than_the_reference(monkeypatch, onmt_active,
                                                                              sample_data):
    """li2019's EM routing through the kernels (one operator per problem, here through Triton's interpreter) is
    fewer operators per training pass than through the PyTorch reference, whose iterations are many operators."""
    config = "li2019/transformer_base_wmt17_zhen_em_enc_self.yaml"
    counts = {}
    for choice in ("torch", "triton"):
        monkeypatch.setenv("ONMT_EXT_ROUTING_KERNEL", choice)
        counts[choice] = sum(op_count.count(config, layers=1).values())
    baseline = sum(op_count.count("baseline/transformer_base_wmt17_zhen.yaml", layers=1).values())
    assert baseline < counts["triton"] < counts["torch"], (baseline, counts)
