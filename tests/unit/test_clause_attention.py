"""Clause attention in the encoder: clause ids from markers, the mixing of eq. 4-5, padding, options, translation."""

import argparse

import pytest
import torch

import support
from onmt_ext import options
from onmt_ext.mechanisms.clause.attention import ClauseAttention, ClauseStructure, clause_ids, marker_level_table
from onmt_ext.mechanisms.clause.split import MARKERS, clause_ids as token_clause_ids

RULE = "yaml_configs/smoke/clause/transformer_base_wmt16_ende_ca_rule.yaml"


def _levels(tokens):
    """Split level per token: the markers' levels, 0 for words."""
    level_of = {marker: level for level, marker in MARKERS.items()}
    return torch.tensor([[level_of.get(t, 0) for t in tokens]])


def test_clause_ids_match_the_hand_worked_example_and_the_token_version():
    m1, m2, m4 = MARKERS[1], MARKERS[2], MARKERS[4]
    tokens = ["we", "left", m2, "because", "it", "rained", m4, "in", "May", m1, ";", "it", "snowed"]
    expected = [[0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1],
                [0, 0, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2],
                [0, 0, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2],
                [0, 0, 1, 1, 1, 1, 2, 2, 2, 3, 3, 3, 3]]
    assert clause_ids(_levels(tokens), 4)[0].tolist() == expected
    assert token_clause_ids(tokens, 4) == expected
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):  # random marker sequences, a marker in first position included
        levels = torch.randint(0, 7, (1, 12), generator=gen) * (torch.rand(1, 12, generator=gen) < 0.4)
        tokens = [MARKERS[v] if v else "w" for v in levels[0].tolist()]
        assert clause_ids(levels, 6)[0].tolist() == token_clause_ids(tokens, 6)


def test_padding_gets_its_own_id():
    levels = torch.tensor([[0, 1, 0, 0], [0, 0, 0, 0]])
    pad = torch.tensor([[False, False, False, True], [False, False, True, True]])
    assert clause_ids(levels, 1, pad).tolist() == [[[0, 1, 1, -1]], [[0, 0, -1, -1]]]


def _module(level_list, heads=2, mixing="scalar", pad=None, d_model=4):
    levels = torch.tensor([level_list])
    structure = ClauseStructure(torch.arange(7), 2)  # id i has level i (ids 1, 2 are markers of levels 1, 2)
    structure.start(levels[..., None], pad if pad is not None else torch.zeros_like(levels, dtype=torch.bool))
    return ClauseAttention(structure, heads, mixing, d_model), structure


def test_mixing_from_local_to_global_by_hand():
    # tokens: w w M1 w M2 w -> level 1 clauses {0,1} {2..5}; level 2 clauses {0,1} {2,3} {4,5}
    attention, structure = _module([0, 0, 1, 0, 2, 0], heads=1)
    p1, p2 = 0.3, 0.8
    with torch.no_grad():
        attention.mix_logits.copy_(torch.logit(torch.tensor([[p1], [p2]])))
    scores = torch.zeros(1, 1, 6, 6)  # uniform attention inside every block
    out = attention(scores)[0, 0]
    g = torch.full((6,), 1 / 6)
    # query 3: b^1 uniform over {2,3,4,5}, b^2 uniform over {2,3}
    b1 = torch.tensor([0, 0, 1 / 4, 1 / 4, 1 / 4, 1 / 4])
    b2 = torch.tensor([0, 0, 1 / 2, 1 / 2, 0, 0])
    a1 = (1 - p2) * b1 + p2 * b2  # eq. 5, the finest level first
    expected = (1 - p1) * g + p1 * a1  # then the global attention
    torch.testing.assert_close(out[3], expected)
    torch.testing.assert_close(out.sum(-1), torch.ones(6))


def test_extreme_mixing_weights_give_global_or_finest_local_attention():
    attention, structure = _module([0, 3, 1, 0, 2, 0, 1])
    scores = torch.randn(1, 2, 7, 7)
    with torch.no_grad():
        attention.mix_logits.fill_(-60.0)  # p = 0: the global attention
    torch.testing.assert_close(attention(scores), torch.softmax(scores, -1))
    with torch.no_grad():
        attention.mix_logits.fill_(60.0)  # p = 1: the finest level's clause attention
    ids = structure.ids[0, -1]
    local = torch.softmax(scores.masked_fill(ids[:, None] != ids[None, :], -1e18), -1)
    torch.testing.assert_close(attention(scores), local)


def test_single_token_clauses_and_padding():
    pad = torch.tensor([[False] * 5 + [True] * 2])
    attention, structure = _module([0, 1, 1, 0, 2, 0, 0], pad=pad)  # token 1 is a clause of its own
    with torch.no_grad():
        attention.mix_logits.fill_(60.0)
    scores = torch.randn(1, 2, 7, 7).masked_fill(pad[:, None, None, :], -1e18)  # as OpenNMT-py masks them
    out = attention(scores)
    torch.testing.assert_close(out[0, :, 1, 1], torch.ones(2))  # all its weight on itself
    assert torch.all(out[0, :, :5, 5:] == 0)  # no real token attends to padding
    torch.testing.assert_close(out.sum(-1), torch.ones(1, 2, 7))
    assert torch.isfinite(out).all()


def test_gate_mixing_reads_the_query_and_starts_at_one_half():
    torch.manual_seed(0)
    gate, _ = _module([0, 1, 0, 2, 0], mixing="gate", d_model=4)
    scalar, _ = _module([0, 1, 0, 2, 0])
    attention = torch.nn.MultiheadAttention(4, 2)  # any module: the pre-hook only reads its query argument
    query = torch.randn(1, 5, 4, requires_grad=True)
    gate.remember_query(attention, (None, None, query), {})
    scores = torch.randn(1, 2, 5, 5)
    torch.testing.assert_close(gate(scores), scalar(scores))  # zero-initialised gate: p = 1/2, like the scalar
    with torch.no_grad():
        gate.mix_gate.weight.normal_()
    gate(scores).pow(2).sum().backward()
    assert query.grad is not None and query.grad.abs().sum() > 0
    assert gate.mix_gate.weight.grad.abs().sum() > 0


def test_missing_clause_ids_fail_clearly():
    structure = ClauseStructure(torch.zeros(5, dtype=torch.long), 1)
    with pytest.raises(RuntimeError, match="no clause ids"):
        ClauseAttention(structure, 2)(torch.zeros(1, 2, 3, 3))


def test_marker_table_from_the_vocabulary(sample_data, onmt_active):
    opt = support.load_train_opts(RULE)
    vocabs = support.load_vocabs(opt)
    table = marker_level_table(vocabs["src"], 2)
    assert {vocabs["src"].ids_to_tokens[i]: int(table[i]) for i in table.nonzero().flatten().tolist()} == {
        MARKERS[1]: 1, MARKERS[2]: 2}
    stock = support.load_vocabs(support.load_train_opts("yaml_configs/smoke/baseline/transformer_base_wmt14_ende.yaml"))
    with pytest.raises(ValueError, match="no clause marker"):
        marker_level_table(stock["src"], 6)


def test_model_has_clause_attention_in_the_selected_layers_only(sample_data, onmt_active):
    opt = support.load_train_opts(RULE, "-clause_attention_layers", "2", "-clause_mixing", "gate")
    model = support.build_model(opt, support.load_vocabs(opt))
    kinds = [type(layer.self_attn.softmax).__name__ for layer in model.encoder.transformer]
    assert kinds == ["Softmax", "ClauseAttention"]
    assert model.encoder.transformer[1].self_attn.self_attn_type == "scaled-dot"
    names = [n for n, _ in model.named_parameters() if "mix" in n]
    assert names == ["encoder.transformer.1.self_attn.softmax.mix_gate.weight",
                     "encoder.transformer.1.self_attn.softmax.mix_gate.bias"]
    assert not any("level_table" in key for key in model.state_dict())  # rebuilt from the vocabulary


def _opt(**kw):
    base = dict(encoder_type="ext_transformer", decoder_type="ext_transformer", clause_attention=False,
                clause_mixing="scalar", clause_attention_layers=[], enc_layers=2, transforms=["clause_split"])
    base.update(kw)
    return argparse.Namespace(**base)


@pytest.mark.parametrize("kw, message", [
    (dict(clause_mixing="gate"), "-clause_mixing has no effect while -clause_attention is false"),
    (dict(clause_attention=True, encoder_type="transformer"), "has no effect with -encoder_type"),
    (dict(clause_attention=True, transforms=["sentencepiece"]), "list clause_split in -transforms"),
    (dict(clause_attention=True, clause_attention_layers=[3]), "-clause_attention_layers [3]"),
    (dict(clause_attention=True, cao2019_horizontal=True), "cannot be combined with cao2019's cross aggregation"),
    (dict(clause_attention=True, disan_enc=True), "cannot be combined with -disan_enc"),
])
def test_option_checks(kw, message, onmt_active):
    problems = options.check_options(_opt(**kw))
    assert any(message in p for p in problems), problems


def test_translation_must_split_as_training(onmt_active):
    from onmt_ext.mechanisms.clause.attention import translation_split_problems

    trained = argparse.Namespace(clause_attention=True, transforms=["sentencepiece", "clause_split"],
                                 clause_lang="zh", clause_levels=6, clause_tagger_model="")
    same = argparse.Namespace(transforms=["clause_split"], clause_lang="zh", clause_levels=6, clause_tagger_model="")
    assert translation_split_problems(same, trained) == []
    missing = argparse.Namespace(**{**vars(same), "transforms": []})
    assert "translate with the transforms it was trained with" in translation_split_problems(missing, trained)[0]
    other = argparse.Namespace(**{**vars(same), "clause_levels": 2, "clause_tagger_model": "t.pt"})
    problems = translation_split_problems(other, trained)
    assert any("-clause_levels 2" in p for p in problems) and any("-clause_tagger_model" in p for p in problems)
    stock = argparse.Namespace(clause_attention=False)
    assert translation_split_problems(missing, stock) == []
    # an option the checkpoint does not record was trained at its default, which translation has too
    older = argparse.Namespace(**{key: value for key, value in vars(trained).items() if key != "clause_levels"})
    assert translation_split_problems(same, older) == []
    assert any("-clause_levels 6 differs from training (2)" in p
               for p in translation_split_problems(same, argparse.Namespace(**{**vars(trained), "clause_levels": 2})))


def test_translation_must_split_with_the_tagger_of_training(tmp_path, onmt_active):
    """The tagger is checked by the contents it had in training (recorded in the checkpoint), not by its path: a
    copy passes, a file retrained in place since is refused, a file elsewhere with training's contents passes,
    and a tagger that is not here is not compared."""
    from onmt_ext.mechanisms.clause.attention import TAGGER_KEY, record_tagger, translation_split_problems

    tagger, backup, other = tmp_path / "t.pt", tmp_path / "backup.pt", tmp_path / "other.pt"
    tagger.write_bytes(b"weights 1")
    backup.write_bytes(b"weights 1")
    other.write_bytes(b"weights 2")
    trained = argparse.Namespace(clause_attention=True, transforms=["clause_split"], clause_lang="zh",
                                 clause_levels=6, clause_tagger_model=str(tagger))
    record_tagger(trained)  # at training (ArgumentParser.validate_model_opts)
    assert len(getattr(trained, TAGGER_KEY)) == 64
    record_tagger(trained)  # a checkpoint's record is kept

    def problems(path):
        return translation_split_problems(argparse.Namespace(**{**vars(trained), "clause_tagger_model": str(path)}),
                                          trained)

    refused = (f"-clause_tagger_model {str(other)!r} is not the tagger training used: its contents differ from "
               f"those of {str(tagger)!r} when the model was trained")
    assert problems(tagger) == [] and problems(backup) == [] and problems(other) == [refused]
    tagger.write_bytes(b"weights 2")  # retrained in place since: the same path no longer passes
    assert problems(tagger) == [refused.replace(str(other), str(tagger))] and problems(backup) == []
    assert problems(tmp_path / "gone.pt") == []
    rules = argparse.Namespace(**{**vars(trained), "clause_tagger_model": ""})
    delattr(rules, TAGGER_KEY)
    record_tagger(rules)
    assert getattr(rules, TAGGER_KEY) == ""
    stock = argparse.Namespace(clause_attention=False)
    record_tagger(stock)
    assert not hasattr(stock, TAGGER_KEY)


def _reference(scores, ids, p):
    """Eq. 4-5 written out: one masked softmax per level, mixed from the finest level to the global one."""
    mixed = None
    for level in reversed(range(ids.shape[1])):
        outside = (ids[:, level, :, None] != ids[:, level, None, :]).unsqueeze(1)
        local = torch.softmax(scores.masked_fill(outside, -1e18), -1)
        mixed = local if mixed is None else (1 - p[level + 1]) * local + p[level + 1] * mixed
    return (1 - p[0]) * torch.softmax(scores, -1) + p[0] * mixed


@pytest.mark.parametrize("tokens", [[0, 1, 0, 0, 1, 0], [0, 2, 0, 1, 0, 3], [0, 0, 0, 0, 0, 0]])
def test_levels_with_the_same_clauses_match_the_reference(tokens):
    structure = ClauseStructure(torch.arange(7), 3)
    batch = torch.tensor([tokens, tokens[::-1]])
    structure.start(batch[..., None], torch.zeros_like(batch, dtype=torch.bool))
    attention = ClauseAttention(structure, 2)
    with torch.no_grad():
        attention.mix_logits.normal_()
    scores = torch.randn(2, 2, 6, 6)
    p = torch.sigmoid(attention.mix_logits)[:, None, :, None, None]
    torch.testing.assert_close(attention(scores), _reference(scores, structure.ids, p))


# ---------------------------------------------------------------------------
# The clause attention of commit 2d3ad91 (1517 operators per op_count step), kept as the reference of the
# present one: the same eq. 4-5 in more operators.

def _reference_ids(token_levels, levels, pad_mask):
    opens = torch.stack([(token_levels > 0) & (token_levels <= level) for level in range(1, levels + 1)], dim=1)
    opens[..., 0] = False
    return opens.long().cumsum(dim=-1).masked_fill(pad_mask.unsqueeze(1), -1)


def _reference_attention(scores, ids, logits):
    """``logits`` ``(L, 1, H, 1, 1)`` or ``(L, batch, H, len, 1)`` in float32."""
    outside = ids[:, :, :, None] != ids[:, :, None, :]
    outside = torch.zeros(outside.shape).masked_fill_(outside, -1e18)
    products = torch.exp(torch.cumsum(torch.nn.functional.logsigmoid(logits), dim=0))
    weights = products * torch.cat([torch.sigmoid(-logits[1:]), torch.ones_like(logits[:1])], dim=0)
    scores = scores.float()
    local = torch.softmax(scores.unsqueeze(1) + outside.unsqueeze(2), dim=-1)
    mixed = (weights.movedim(0, 1) * local).sum(dim=1)
    return (1 - torch.sigmoid(logits[0])) * torch.softmax(scores, dim=-1) + mixed


def _reference_logits(attention):
    if attention.mixing == "scalar":
        return attention.mix_logits.float()[:, None, :, None, None]
    batch, length, _ = attention.query.shape
    logits = attention.mix_gate(attention.query).float().view(batch, length, attention.levels, attention.heads)
    return logits.permute(2, 0, 3, 1).unsqueeze(-1)


def _padded_case(mixing, seed=0, lengths=(7, 4, 1), heads=3, levels=3, d_model=6):
    """A batch of odd lengths with padding: token ids 0-5 of levels 0-5 (levels above L open nothing)."""
    gen = torch.Generator().manual_seed(seed)
    length = max(lengths)
    pad = torch.arange(length)[None, :] >= torch.tensor(lengths)[:, None]
    tokens = torch.randint(0, 6, (len(lengths), length), generator=gen) * (torch.rand(len(lengths), length,
                                                                                      generator=gen) < 0.6)
    structure = ClauseStructure(torch.arange(6), levels)
    structure.start(tokens[..., None], pad)
    attention = ClauseAttention(structure, heads, mixing, d_model)
    with torch.no_grad():
        for param in attention.parameters():
            param.copy_(torch.randn(param.shape, generator=gen))
    scores = torch.randn(len(lengths), heads, length, length, generator=gen)
    scores = scores.masked_fill(pad[:, None, None, :], -1e18).requires_grad_(True)  # as OpenNMT-py masks them
    query = torch.randn(len(lengths), length, d_model, generator=gen, requires_grad=True)
    if mixing == "gate":
        attention.remember_query(None, (None, None, query), {})
    return attention, structure, tokens, pad, scores, query


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("mixing", ["scalar", "gate"])
def test_mixing_equals_the_previous_computation_in_values_and_gradients(mixing, autocast):
    attention, structure, tokens, pad, scores, query = _padded_case(mixing)
    assert torch.equal(structure.ids, _reference_ids(tokens, 3, pad))
    inputs = [scores, query, *attention.parameters()] if mixing == "gate" else [scores, *attention.parameters()]
    results = []
    for run in (lambda: attention(scores), lambda: _reference_attention(scores, structure.ids,
                                                                        _reference_logits(attention))):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = run()
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        results.append([out, *torch.autograd.grad((out * weights).sum(), inputs)])
    assert results[0][0].dtype == torch.float32
    for new, old in zip(*results):  # float32 rounding apart: the sums run in another order
        torch.testing.assert_close(new, old, rtol=2e-6, atol=2e-7)


def test_a_layer_costs_few_operators():
    """One layer's clause attention, forward and backward: 8 operators for the weights of the L + 1 levels,
    4 forward and 5 backward for the mix (the softmax included); the previous code took 33 + 11 more."""
    from tools.op_count import counter

    attention, _, _, _, scores, _ = _padded_case("scalar")
    attention(scores)  # the structure's bias, built once per batch, is not the layer's
    mode = counter()
    with mode:
        attention(scores).sum().backward()
    assert sum(mode.counts.values()) - 2 <= 17, mode.counts  # 2: the loss's sum and its gradient


def _layers_sharing_a_structure(count=3, seed=0):
    """``count`` scalar clause attentions on one structure (as in an encoder), random logits, and their scores."""
    attention, structure, _, _, scores, _ = _padded_case("scalar", seed=seed)
    layers = [attention] + [ClauseAttention(structure, attention.heads) for _ in range(count - 1)]
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for layer in layers[1:]:
            layer.mix_logits.copy_(torch.randn(layer.mix_logits.shape, generator=gen))
    return layers, structure, scores


def test_layers_sharing_a_structure_get_their_own_weights_computed_together():
    """The structure computes every scalar layer's level weights in one go (fewer operators per step than one
    computation per layer); each layer's output and each logit's gradient equal the per-layer reference."""
    from tools.op_count import counter

    layers, structure, scores = _layers_sharing_a_structure()
    outs = [layer(scores) for layer in layers]
    gen = torch.Generator().manual_seed(5)
    upstream = [torch.randn(out.shape, generator=gen) for out in outs]  # (a plain sum's gradient is 0: rows sum to 1)
    grads = torch.autograd.grad(sum((out * up).sum() for out, up in zip(outs, upstream)),
                                [layer.mix_logits for layer in layers])
    for layer, out, up, grad in zip(layers, outs, upstream, grads):
        reference = _reference_attention(scores, structure.ids, _reference_logits(layer))
        torch.testing.assert_close(out, reference, rtol=2e-6, atol=2e-7)
        expected, = torch.autograd.grad((reference * up).sum(), [layer.mix_logits])
        assert expected.abs().max() > 1e-2
        torch.testing.assert_close(grad, expected, rtol=2e-6, atol=2e-6)
    counts = []
    for count in (1, 3):
        layers, structure, scores = _layers_sharing_a_structure(count)
        structure.outside_bias()  # built once per batch, not per layer
        mode = counter()
        with mode:
            sum(layer(scores).sum() for layer in layers).backward()
        counts.append(mode.counts)
    for name in ("log_sigmoid_forward", "log_sigmoid_backward", "exp", "mm", "stack", "cat"):  # the weights' own
        assert counts[1][name] == counts[0][name], (name, counts)  # once for the three layers as for one


def test_the_shared_weights_follow_the_parameters_and_the_grad_mode():
    layers, structure, scores = _layers_sharing_a_structure()
    with torch.no_grad():
        layers[1](scores)  # computed without a graph
    out = layers[1](scores)
    assert out.requires_grad and torch.autograd.grad(out.sum(), [layers[1].mix_logits])[0].abs().sum() > 0
    with torch.no_grad():
        layers[2].mix_logits.add_(1.0)  # an optimizer's in-place step
    torch.testing.assert_close(layers[2](scores), _reference_attention(
        scores, structure.ids, _reference_logits(layers[2])), rtol=2e-6, atol=2e-7)
    layers[0].mix_logits = torch.nn.Parameter(torch.full_like(layers[0].mix_logits, 60.0))  # replaced: p = 1
    torch.testing.assert_close(layers[0](scores), _reference_attention(
        scores, structure.ids, _reference_logits(layers[0])), rtol=2e-6, atol=2e-7)
