"""cao2019 cross aggregation: the module against per-position references, padding, attachment, options."""

import argparse

import pytest
import torch

import support
from onmt_ext import options
from onmt_ext.mechanisms.cao2019 import CausalCrossAggregation, CrossAggregation
from onmt_ext.mechanisms.routing import simple_routing

SMOKE = "yaml_configs/smoke/baseline/transformer_base_wmt17_zhen.yaml"
EXT = ["-encoder_type", "ext_transformer", "-decoder_type", "ext_transformer"]


def _scores(lengths, heads=3, seed=0):
    torch.manual_seed(seed)
    length = max(lengths)
    scores = torch.randn(len(lengths), heads, length, length) * 2
    for b, n in enumerate(lengths):
        scores[b, :, :, n:] = -1e18  # OpenNMT-py's key padding
    return scores


def _reference(module, scores, n):
    """E_hat for one unpadded sentence of length n, one query position at a time (eq. 9-15)."""
    e = scores[:, :, :n, :n] * module.factor  # (1, H, n, n): eq. 4's E from OpenNMT-py's scores
    total = e.clone()
    if module.vertical:
        out, b = simple_routing(e, module.iterations, normalize="inputs")  # heads -> positions
        lam = torch.softmax(b.sum(-1) @ module.head_weight.t(), dim=-1)
        total = total + lam[:, :, None, None] * out[:, None]
    if module.horizontal:
        for l in range(n):  # positions t <= l -> heads
            votes = e[:, :, : l + 1, :].permute(0, 2, 1, 3)  # (1, t, H, M)
            init = e[:, :, l, : l + 1].permute(0, 2, 1) if module.init == "self" else None  # (1, t, H)
            out, _ = simple_routing(votes, module.iterations, normalize="inputs", init_logits=init)
            total[:, :, l, :] = total[:, :, l, :] + out
    return torch.softmax(total, dim=-1)


@pytest.mark.parametrize("vertical, horizontal, init, scale", [
    (True, False, "zero", "model"), (False, True, "zero", "model"), (False, True, "self", "model"),
    (True, True, "zero", "model"), (True, True, "self", "model"), (True, True, "self", "head"),
])
def test_matches_the_per_position_reference_with_padding(vertical, horizontal, init, scale):
    lengths = [6, 4, 1]
    scores = _scores(lengths)
    module = CrossAggregation(3, vertical, horizontal, init, scale=scale)
    if vertical:
        torch.nn.init.normal_(module.head_weight)
    probs = module(scores)
    assert torch.isfinite(probs).all()
    for b, n in enumerate(lengths):
        expected = _reference(module, scores[b : b + 1], n)
        torch.testing.assert_close(probs[b : b + 1, :, :n, :n], expected, atol=1e-5, rtol=1e-5)
        assert probs[b, :, :n, n:].abs().sum() == 0  # padded keys get no attention


def test_default_keeps_stock_scale_and_model_reads_eq_4_literally():
    """OpenNMT-py's scores are Q_h K_h^T / sqrt(d / H); ``model`` reads eq. 4's E as Q_h K_h^T / sqrt(d)."""
    heads = 4
    scores = _scores([5, 3], heads=heads)
    eq4 = scores.masked_fill(scores > -1e17, 0) + scores.masked_fill(scores <= -1e17, 0) / heads ** 0.5
    default, model = CrossAggregation(heads, True, True, "self"), CrossAggregation(heads, True, True, "self",
                                                                                   scale="model")
    assert default.factor == 1.0 and model.factor == 0.5
    torch.testing.assert_close(model(scores), default(eq4), atol=1e-6, rtol=0)
    assert (default(scores) - model(scores)).abs().max() > 1e-2  # the two readings differ


@pytest.mark.parametrize("dec_self", [False, True])
def test_with_the_routing_outputs_at_zero_the_default_layer_is_stocks_attention(dec_self, sample_data, onmt_active,
                                                                                monkeypatch):
    """With cao2019_scale at its option default and both routings' outputs neutralised, E_hat = E must be the
    stock layer's energy: OpenNMT-py's 1 / sqrt(d_k) (issue 37: the old default divided it by sqrt(H) more)."""
    from onmt_ext.mechanisms import cao2019

    monkeypatch.setattr(cao2019, "vertical_output", lambda logits, *a, **k: torch.zeros_like(logits))
    monkeypatch.setattr(cao2019, "horizontal_output", lambda logits, *a, **k: torch.zeros_like(logits))
    extra = ["-cao2019_dec_self", "true"] if dec_self else []
    opt = support.load_train_opts(SMOKE, *EXT, "-cao2019_vertical", "true", "-cao2019_horizontal", "true", *extra)
    assert opt.cao2019_scale == "head"
    model = support.build_model(opt, support.load_vocabs(opt))
    layer = (model.decoder.transformer_layers if dec_self else model.encoder.transformer)[0].self_attn
    assert isinstance(layer.softmax, CrossAggregation)
    scores = _causal_scores(5, heads=opt.heads) if dec_self else _scores([5, 3], heads=opt.heads)
    torch.testing.assert_close(layer.softmax(scores), torch.softmax(scores, dim=-1), atol=1e-6, rtol=0)


@pytest.mark.parametrize("vertical, horizontal, init", [(True, False, "zero"), (False, True, "self"),
                                                        (True, True, "self")])
def test_routing_runs_in_float32_under_cpu_bf16_autocast(vertical, horizontal, init):
    """Under autocast the routing's einsums and eq. 13's product would run in bfloat16; they must not."""
    scores = _scores([7, 5], heads=4) * 3
    module = CrossAggregation(4, vertical, horizontal, init)
    if vertical:
        torch.nn.init.normal_(module.head_weight)
    reference = module(scores)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = module(scores)
    assert mixed.dtype == torch.float32
    torch.testing.assert_close(mixed, reference, atol=1e-4, rtol=0)
    causal = CausalCrossAggregation(4, vertical, horizontal, init)
    causal.load_state_dict(module.state_dict())
    future = _causal_scores(6, heads=4)
    reference = causal(future)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.testing.assert_close(causal(future), reference, atol=1e-4, rtol=0)
        causal.decoding_state, causal.stepwise = {}, True
        steps = [causal(future[:, :, l : l + 1, : l + 1].contiguous()) for l in range(6)]  # decoding, step l
    for l, step in enumerate(steps):
        assert step.dtype == torch.float32
        torch.testing.assert_close(step[:, :, 0], reference[:, :, l, : l + 1], atol=1e-4, rtol=0)


def test_starts_from_equal_head_weights_and_is_not_the_plain_softmax():
    scores = _scores([5])
    module = CrossAggregation(3, True, True)
    assert torch.equal(module.head_weight, torch.zeros(3, 3))  # Lambda = 1/H at the start
    assert not torch.allclose(module(scores), torch.softmax(scores, -1))


def test_gradients_are_finite_for_large_and_zero_logits():
    for scale in (0.0, 1e4):
        scores = (_scores([5, 3]) * scale).masked_fill(_scores([5, 3]) < -1e17, -1e18).requires_grad_()
        module = CrossAggregation(3, True, True, "self")
        module(scores).square().sum().backward()
        assert torch.isfinite(scores.grad).all() and torch.isfinite(module.head_weight.grad).all()


def _causal_scores(length, heads=3, seed=1):
    torch.manual_seed(seed)
    scores = torch.randn(2, heads, length, length) * 2
    future = torch.ones(length, length, dtype=torch.bool).triu(1)
    return scores.masked_fill(future, -1e18)


@pytest.mark.parametrize("vertical, horizontal, init", [(True, False, "zero"), (False, True, "self"),
                                                       (True, True, "self")])
def test_causal_variant_step_by_step_equals_full_pass_and_ignores_the_future(vertical, horizontal, init):
    length = 6
    scores = _causal_scores(length)
    module = CausalCrossAggregation(3, vertical, horizontal, init)
    if vertical:
        torch.nn.init.normal_(module.head_weight)
    full = module(scores)
    module.init_decoding_state(None, None, None)
    module.stepwise = True
    steps = torch.cat([torch.nn.functional.pad(module(scores[:, :, l : l + 1, : l + 1]), (0, length - l - 1))
                       for l in range(length)], dim=2)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)
    # rows after l do not change row l
    module.stepwise = False
    changed = scores.clone()
    changed[:, :, 4:, :] = torch.randn_like(changed[:, :, 4:, :]).masked_fill(changed[:, :, 4:, :] < -1e17, -1e18)
    torch.testing.assert_close(module(changed)[:, :, :4], full[:, :, :4], atol=1e-6, rtol=1e-6)


def test_causal_variant_reorders_its_state_with_the_beam():
    scores = _causal_scores(4)
    module = CausalCrossAggregation(3, True, True, "self")
    torch.nn.init.normal_(module.head_weight)
    module.init_decoding_state(None, None, None)
    module.stepwise = True
    for l in range(2):
        module(scores[:, :, l : l + 1, : l + 1])
    module.reorder_decoding_state(lambda state, dim: state.index_select(dim, torch.tensor([1, 0])))
    flipped = scores[[1, 0]]
    after = module(flipped[:, :, 2:3, :3])
    module.init_decoding_state(None, None, None)
    for l in range(2):
        module(flipped[:, :, l : l + 1, : l + 1])
    torch.testing.assert_close(after, module(flipped[:, :, 2:3, :3]))


def test_rejects_cross_attention_scores():
    with pytest.raises(ValueError, match="self-attention scores"):
        CrossAggregation(3, True, False)(torch.randn(1, 3, 4, 5))


def test_attached_to_the_selected_layers_on_the_explicit_path(sample_data, onmt_active):
    opt = support.load_train_opts(SMOKE, *EXT, "-cao2019_vertical", "true", "-cao2019_horizontal", "true",
                                  "-cao2019_enc_layers", "2")
    model = support.build_model(opt, support.load_vocabs(opt))
    stock = support.build_model(support.load_train_opts(SMOKE), support.load_vocabs(opt))
    first, second = (layer.self_attn for layer in model.encoder.transformer)
    assert type(first.softmax).__name__ == "Softmax"
    assert first.self_attn_type == stock.encoder.transformer[0].self_attn.self_attn_type
    assert isinstance(second.softmax, CrossAggregation) and second.self_attn_type == "scaled-dot"
    assert sum(p.numel() for p in second.softmax.parameters()) == opt.heads ** 2


def _opt(**kw):
    base = dict(encoder_type="ext_transformer", decoder_type="ext_transformer", enc_layers=2, dec_layers=2, layers=-1,
                cao2019_vertical=False, cao2019_horizontal=False, cao2019_init="zero", cao2019_iterations=3,
                cao2019_enc_layers=[], cao2019_dec_self=False, cao2019_dec_layers=[], ext_compile=False,
                self_attn_type="scaled-dot", parallel_mode="data_parallel", world_size=1, hidden_size=32)
    base.update(kw)
    return argparse.Namespace(**base)


@pytest.mark.parametrize("kw, message", [
    (dict(cao2019_init="self"), "-cao2019_init has no effect while -cao2019_vertical and -cao2019_horizontal"),
    (dict(cao2019_scale="model"), "-cao2019_scale has no effect while -cao2019_vertical and -cao2019_horizontal"),
    (dict(cao2019_vertical=True, cao2019_init="self"), "-cao2019_init applies to the horizontal routing"),
    (dict(cao2019_horizontal=True, cao2019_enc_layers=[3]), "-cao2019_enc_layers [3]: layers are numbered 1..2"),
    (dict(cao2019_horizontal=True, cao2019_iterations=0), "-cao2019_iterations 0: must be >= 1"),
    (dict(cao2019_horizontal=True, parallel_mode="tensor_parallel", world_size=2), "tensor_parallel"),
    (dict(encoder_type="transformer", cao2019_vertical=True), "have no effect with -encoder_type 'transformer'"),
    (dict(cao2019_vertical=True, cao2019_dec_self=True, self_attn_type="average"), "-self_attn_type average"),
    (dict(cao2019_dec_self=True), "-cao2019_dec_self has no effect while"),
    (dict(cao2019_vertical=True, cao2019_dec_layers=[1]), "-cao2019_dec_layers has no effect while -cao2019_dec_self "
     "is false"),
    (dict(decoder_type="transformer", cao2019_vertical=True, cao2019_dec_self=True),
     "-cao2019_dec_self True has no effect with -decoder_type"),
])
def test_option_checks(kw, message, onmt_active):
    problems = options.check_options(_opt(**kw))
    assert any(message in p for p in problems), problems


@pytest.mark.parametrize("kw", [
    dict(cao2019_vertical=True, cao2019_dec_self=True, cao2019_dec_layers=[2], cao2019_enc_layers=[1]),
    dict(cao2019_horizontal=True, cao2019_init="self", cao2019_scale="model", cao2019_iterations=2),
])
def test_options_in_effect_are_accepted(kw, onmt_active):
    assert options.check_options(_opt(**kw)) == []


def _coupling_reference(scores, n, iterations, init):
    """The T-th iteration's couplings of one unpadded sentence, one query position at a time (flattened)."""
    e = scores[:, :, :n, :n]  # (1, H, n, n)

    def logits_before_last(votes, init_logits=None):
        if iterations == 1:
            return init_logits if init_logits is not None else torch.zeros(votes.shape[:-1])
        return simple_routing(votes, iterations - 1, normalize="inputs", init_logits=init_logits)[1]

    vertical = torch.softmax(logits_before_last(e), dim=1)[0].t()  # (n, H), over the heads
    horizontal = []
    for l in range(n):
        votes = e[:, :, : l + 1, :].permute(0, 2, 1, 3)  # (1, t, H, M)
        start = e[:, :, l, : l + 1].permute(0, 2, 1) if init == "self" else None
        horizontal.append(torch.softmax(logits_before_last(votes, start), dim=1)[0].reshape(-1))  # over t
    return vertical.reshape(-1), torch.cat(horizontal)


@pytest.mark.parametrize("iterations, init", [(1, "zero"), (1, "self"), (3, "zero"), (4, "self")])
def test_routing_weights_are_the_couplings_of_the_last_iteration_without_padding(iterations, init):
    from onmt_ext.mechanisms.cao2019 import routing_weights

    lengths = [5, 3]
    scores = _scores(lengths)
    weights = routing_weights(scores, iterations, init)
    expected = [_coupling_reference(scores[b : b + 1], n, iterations, init) for b, n in enumerate(lengths)]
    torch.testing.assert_close(weights["vertical"], torch.cat([v for v, _ in expected]), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights["horizontal"], torch.cat([h for _, h in expected]), atol=1e-5, rtol=1e-5)
    if iterations == 1 and init == "zero":  # uniform: 1/H per head, 1/(l+1) per earlier position
        assert torch.allclose(weights["vertical"], torch.full_like(weights["vertical"], 1 / 3))


def test_near_zero_tool_counts_every_weight_of_every_layer(sample_data, onmt_active):
    from tools import cao2019_weights as tool
    opt = support.load_train_opts(SMOKE, *EXT, "-cao2019_vertical", "true", "-cao2019_horizontal", "true")
    vocabs = support.load_vocabs(opt)
    model = support.build_model(opt, vocabs)
    words = [w for w in vocabs["src"].ids_to_tokens[10:40]]
    sentences = [words[:7], words[7:10], words[10:11]]
    shares = tool.near_zero_shares(model, vocabs, sentences, [1, 3], [1e-2, 1e-6], batch_size=2)
    heads, layers = opt.heads, len(model.encoder.transformer)
    positions = 7 + 3 + 1
    for routing, per_layer in (("vertical", positions * heads), ("horizontal", heads * (28 + 6 + 1))):
        assert shares[1][routing]["weights"] == shares[3][routing]["weights"] == per_layer * layers
        assert set(shares[3][routing]["layers"]) == {str(n) for n in range(1, layers + 1)}
        assert shares[1][routing]["all"] == {"0.01": 0.0, "1e-06": 0.0}  # zero init: uniform weights
    table = tool.markdown([{"model": "m.pt", "trained_iterations": 3, "shares": {str(t): v for t, v in shares.items()}}],
                          [1e-2, 1e-6])
    assert table.count("\n") == 4 and "| `m.pt` | 3 | **3** |" in table


@pytest.mark.parametrize("causal", [False, True])
def test_the_padding_and_prefix_masks_come_in_few_operators(causal):
    """The non-padding positions are read from one row of the masked scores, key padding with or without the
    future mask, and the horizontal routing's prefix mask is a view of one kept matrix: 4 operators a layer
    (8 when the positions were reduced over every row and the prefix was made per call)."""
    from onmt_ext.mechanisms import cao2019
    from tools.op_count import counter

    lengths = [7, 4, 1]
    scores = _scores(lengths)
    if causal:
        scores = scores.masked_fill(torch.ones(7, 7, dtype=torch.bool).triu(1), -1e18)
    expected = torch.arange(7)[None] < torch.tensor(lengths)[:, None]
    cao2019._prefix(9, scores.device)  # a longer one kept before: this call's is a view of it
    mode = counter()
    with mode:
        logits, valid = cao2019._votes_and_positions(scores)
        _, mask, _ = cao2019._horizontal_problem(logits, valid, "zero")
    assert torch.equal(valid, expected)
    assert torch.equal(mask, torch.ones(7, 7, dtype=torch.bool).tril()[None] & expected[:, None, :])
    assert sum(mode.counts.values()) == 4, mode.counts
