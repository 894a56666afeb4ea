"""Whole mechanism modules on extreme inputs: finite outputs and finite gradients.

Each routing module (li2019's RoutingAggregation, simple and EM; cao2019's
CrossAggregation; GRET's GlobalRepresentation) is fed, at toy size (B = 2,
L <= 4, d = 16), with all zeros, values of magnitude 1e4, one-token
sentences, a batch whose second sentence is all padding but its first token,
and random inputs under bfloat16 autocast.  Each case runs forward and
backward and requires every output, input gradient and parameter gradient to
be finite.
"""

import pytest
import torch

from onmt_ext.mechanisms.li2019 import RoutingAggregation
from onmt_ext.mechanisms.cao2019 import CrossAggregation
from onmt_ext.mechanisms.gret import GlobalRepresentation

BATCH, LENGTH, D_MODEL, HEADS = 2, 4, 16, 4
MASKED = -1e18  # OpenNMT-py's fill value for masked attention scores


def _values(case, shape, generator):
    """Input values of ``shape`` for one case (padding is applied by the caller)."""
    if case == "zeros":
        return torch.zeros(shape)
    values = torch.randn(shape, generator=generator)
    return values * 1e4 if case == "magnitude_1e4" else values


def _keep(case, length):
    """``(B, L)`` bool, True at real tokens: the second sentence is one token long in the "padding" case."""
    keep = torch.ones(BATCH, length, dtype=torch.bool)
    if case == "one_token_left":
        keep[1, 1:] = False
    return keep


def _routing_aggregation(method):
    def run(case, generator):
        module = RoutingAggregation(heads=HEADS, d_model=D_MODEL, capsules=D_MODEL, method=method)
        length = 1 if case == "length_1" else LENGTH
        context = _values(case, (BATCH, length, D_MODEL), generator)
        context = context * _keep(case, length)[..., None]  # padded positions carry zeros
        context.requires_grad_(True)
        return module, [context], lambda: module(context)
    return run


def _cross_aggregation(init):
    def run(case, generator):
        module = CrossAggregation(HEADS, vertical=True, horizontal=True, init=init)
        with torch.no_grad():  # W of eq. 13 starts at zero; a random one exercises the head weighting too
            module.head_weight.normal_(generator=generator)
        length = 1 if case == "length_1" else LENGTH
        scores = _values(case, (BATCH, HEADS, length, length), generator)
        padded_keys = ~_keep(case, length)[:, None, None, :]
        scores = scores.masked_fill(padded_keys, MASKED).requires_grad_(True)
        return module, [scores], lambda: module(scores)
    return run


def _global_representation(pooling):
    def run(case, generator):
        layers = 2
        module = GlobalRepresentation(D_MODEL, layers, capsules=4, iterations=3, pooling=pooling)
        length = 1 if case == "length_1" else LENGTH
        keep = _keep(case, length)
        outputs = [_values(case, (BATCH, length, D_MODEL), generator).requires_grad_(True) for _ in range(layers)]

        def forward():  # as ExtTransformerEncoder drives it: start, one observe per layer, summarise
            module.start()
            for output in outputs:
                module.observe(None, None, output)
            return module.summarise(keep)
        return module, outputs, forward
    return run


MODULES = {
    "li2019_simple": _routing_aggregation("simple"),
    "li2019_em": _routing_aggregation("em"),
    "cao2019_zero_init": _cross_aggregation("zero"),
    "cao2019_self_init": _cross_aggregation("self"),
    "gret_capsules": _global_representation("capsules"),
    "gret_mean": _global_representation("mean"),
}
CASES = ["zeros", "magnitude_1e4", "length_1", "one_token_left", "bf16_autocast"]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", MODULES)
def test_outputs_and_gradients_stay_finite(name, case):
    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    module, inputs, forward = MODULES[name](case, generator)
    if case == "bf16_autocast":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = forward()
    else:
        out = forward()
    assert torch.isfinite(out).all(), f"{name} on {case}: non-finite output"
    weights = torch.randn(out.shape, generator=generator)  # a loss whose gradient is not constant
    (out.float() * weights).sum().backward()
    for index, tensor in enumerate(inputs):
        assert tensor.grad is not None and torch.isfinite(tensor.grad).all(), \
            f"{name} on {case}: non-finite gradient of input {index}"
    bad = [p_name for p_name, p in module.named_parameters()
           if p.grad is not None and not torch.isfinite(p.grad).all()]
    assert not bad, f"{name} on {case}: non-finite gradients of {bad}"
