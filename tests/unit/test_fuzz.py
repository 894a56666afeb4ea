"""Property-based fuzzing (hypothesis) of the routing core and the clause splitter.

Random shapes, masks, magnitudes and sentences; the properties are the ones the mechanisms rely on:
routing outputs and gradients are finite, masked inputs change nothing, the outputs are squashed (norm < 1)
for simple routing and activations are probabilities for EM; the splitter's markers come off to give back
exactly the input tokens, the split is deterministic and the clause ids are well formed.
"""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onmt_ext.mechanisms.clause import split as cs
from onmt_ext.mechanisms.routing import em_routing, simple_routing

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def routing_case(draw):
    batch = draw(st.integers(1, 3))
    n_in = draw(st.integers(1, 7))
    n_out = draw(st.integers(1, 5))
    dim = draw(st.integers(1, 6))
    scale = draw(st.sampled_from([0.0, 1e-6, 1.0, 1e2, 1e4]))
    seed = draw(st.integers(0, 2**16))
    mask = torch.tensor(draw(st.lists(st.lists(st.booleans(), min_size=n_in, max_size=n_in),
                                      min_size=batch, max_size=batch)))
    mask[:, 0] = True  # at least one input takes part
    generator = torch.Generator().manual_seed(seed)
    votes = torch.randn(batch, n_in, n_out, dim, generator=generator, dtype=torch.float64) * scale
    return votes, mask, draw(st.integers(1, 4))


@SETTINGS
@given(routing_case(), st.sampled_from(["outputs", "inputs"]), st.booleans())
def test_simple_routing_is_finite_squashed_and_ignores_masked_inputs(case, normalize, weighted_mean):
    votes, mask, iterations = case
    votes.requires_grad_(True)
    outputs, logits = simple_routing(votes, iterations, normalize=normalize, weighted_mean=weighted_mean, mask=mask)
    assert torch.isfinite(outputs).all() and torch.isfinite(logits).all()
    assert (outputs.norm(dim=-1) < 1.0 + 1e-9).all()
    outputs.sum().backward()
    assert torch.isfinite(votes.grad).all()
    changed = votes.detach().clone()
    changed[~mask] = 1e6  # whatever the masked inputs vote
    again, _ = simple_routing(changed, iterations, normalize=normalize, weighted_mean=weighted_mean, mask=mask)
    torch.testing.assert_close(again, outputs.detach(), rtol=1e-9, atol=1e-12)


@SETTINGS
@given(routing_case())
def test_em_routing_is_finite_with_probability_activations_and_ignores_masked_inputs(case):
    votes, mask, iterations = case
    votes.requires_grad_(True)
    outputs, activations = em_routing(votes, iterations, mask=mask)
    assert torch.isfinite(outputs).all() and torch.isfinite(activations).all()
    assert ((activations >= 0) & (activations <= 1)).all()
    (outputs.sum() + activations.sum()).backward()
    assert torch.isfinite(votes.grad).all()
    changed = votes.detach().clone()
    changed[~mask] = -3e5
    again, again_act = em_routing(changed, iterations, mask=mask)
    torch.testing.assert_close(again, outputs.detach(), rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(again_act, activations.detach(), rtol=1e-7, atol=1e-9)


@pytest.fixture(scope="module")
def zh_splitter():
    return cs.ClauseSplitter("zh", levels=cs.MAX_LEVEL)


@pytest.fixture(scope="module")
def en_splitter():
    return cs.ClauseSplitter("en", levels=cs.MAX_LEVEL)


ZH_WORDS = ["我", "和", "他", "因为", "在", "北京", "但是", "，", "。", "的", "学习", "如果", "把", "书", "给",
            "、", "？", "▁", "▁他", "跟", "所以", "abc", "123", "「", "」"]
EN_WORDS = ["the", "cat", "and", "which", "who", "to", "go", ",", ".", "in", "of", "running", "but", "because",
            "&apos;s", "@-@", "▁to", "▁the", "run@@", "ning", "that", "if", "when", "Paris", "1999", ";", "--"]


def _check_split(splitter, tokens):
    first = splitter.split(tokens)
    assert cs.strip_markers(first) == tokens  # nothing lost, nothing reordered
    assert splitter.split(list(tokens)) == first  # deterministic
    assert splitter.split_batch([tokens, tokens[::-1]])[0] == first  # independent of the batch
    for levels in range(1, cs.MAX_LEVEL + 1):
        ids = cs.clause_ids(first, levels)
        for row in ids:
            assert row == sorted(row)  # clauses are contiguous and in order
            assert all(b - a in (0, 1) for a, b in zip(row, row[1:]))
        for coarse, fine in zip(ids, ids[1:]):  # a finer level only splits clauses further
            assert all(not (c == d and a != b) for a, b, c, d in zip(coarse, coarse[1:], fine, fine[1:]))


@SETTINGS
@given(st.lists(st.sampled_from(ZH_WORDS), max_size=40))
def test_chinese_split_round_trips_and_builds_nested_clauses(zh_splitter, tokens):
    _check_split(zh_splitter, tokens)


@SETTINGS
@given(st.lists(st.sampled_from(EN_WORDS), max_size=40))
def test_english_split_round_trips_and_builds_nested_clauses(en_splitter, tokens):
    _check_split(en_splitter, tokens)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=6).filter(lambda t: not t.isspace() and " " not in t), max_size=15))
def test_arbitrary_unicode_tokens_never_crash_and_round_trip(zh_splitter, tokens):
    tokens = [t for t in tokens if t.strip() == t]
    assert cs.strip_markers(zh_splitter.split(tokens)) == tokens
