"""tools/op_count.py: it counts the launching operators of a training pass, and sees the fused routing kernels.

Its counter is tools/routing_memory.py's too (the two once counted 1,628 and 1,616 operators for GRET's pass):
every operator below autograd but views and detaches, operators that return no tensor or a list of them included.
"""

import types

import pytest
import torch

from tools import op_count, routing_memory


def test_views_and_detaches_are_not_counted():
    x = torch.ones(2, 3, requires_grad=True)
    with op_count.counter() as mode:
        y = (x.view(3, 2).t() * 2).detach().sum()
    assert dict(mode.counts) == {"mul": 1, "sum": 1}, mode.counts
    assert mode.totals() == {"ops": sum(mode.every.values()), "launches": 2} and mode.every["view"] == 1
    assert y.item() == 12


def test_operators_that_return_no_tensor_or_a_list_of_them_are_counted():
    x = torch.arange(6.0)
    with op_count.counter() as mode:
        parts = torch.ops.aten.unsafe_split(x, 2)  # a list of tensors (not marked a view)
        torch.ops.aten.promote_types(torch.float16, torch.float32)  # a dtype
    assert dict(mode.counts) == {"unsafe_split": 1, "promote_types": 1} and len(parts) == 3


def test_routing_memory_counts_with_the_same_counter():
    """``python -m tools.routing_memory --measure ops`` reports op_count's totals: under autocast the routing's
    forward pass has a ``promote_types``, which routing_memory's own count used to leave out."""
    assert routing_memory.op_count is op_count  # the one counter, imported
    args = types.SimpleNamespace(sentences=1, length=3, threads=1, device="cpu", capsules=8, iterations=2, repeats=1)
    row = next(row for row in routing_memory.routing_ops(args) if row["autocast"] and not row["recompute"])
    module, context = routing_memory._routing(args, row["method"], args.capsules, iterations=2, recompute=False)
    with op_count.counter() as mode, routing_memory._autocast("cpu"):
        module(context).float().sum()  # as routing_ops runs it
    assert row["forward"] == mode.totals() and mode.counts["promote_types"], (row["forward"], mode.counts)


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
