"""weng2020 GRET: the global state (capsules, pooling, layer GRU), padding, the fusion gate, fine-tuning, options."""

import argparse
import logging

import pytest
import torch

import support
from onmt_ext import options
from onmt_ext.mechanisms.gret import GlobalFusion, GlobalRepresentation
from onmt_ext.mechanisms.routing import simple_routing, squash

SMOKE = "yaml_configs/smoke/baseline/transformer_base_wmt14_ende.yaml"
EXT = ["-encoder_type", "ext_transformer", "-decoder_type", "ext_transformer"]


def _observed(module, outputs):
    module.start()
    for output in outputs:
        module.observe(None, None, output)


def test_global_state_follows_capsules_pooling_and_the_layer_gru():
    torch.manual_seed(0)
    module = GlobalRepresentation(8, layers=2, capsules=2, iterations=3)
    hidden = [torch.randn(1, 5, 8) for _ in range(2)]
    keep = torch.ones(1, 5, dtype=torch.bool)
    _observed(module, hidden)
    state = module.summarise(keep)
    expected = torch.zeros(1, 8)
    cell = torch.nn.GRUCell(2 * 2, 8)  # the GRU over the layers, one step at a time
    cell.load_state_dict({k.removesuffix("_l0"): v for k, v in module.gru.state_dict().items()})
    for m, h in enumerate(hidden):
        x = torch.nn.functional.layer_norm(h, (8,), module.norm_weight[m], module.norm_bias[m], eps=1e-6)[0]
        votes = torch.stack([x @ module.vote_maps[k] for k in range(2)], dim=1)  # (I, K, d_c)
        b = torch.zeros(5, 2)
        for _ in range(3):  # Alg. 1 written out: c_k = softmax over the positions, squash, agreement
            c = torch.softmax(b, dim=0)
            u = squash((c[..., None] * votes).sum(dim=0))  # (K, d_c)
            b = b + (votes * u[None]).sum(-1)
        a = torch.softmax(module.pool_scorer(u).squeeze(-1), dim=0)
        expected = cell((a[:, None] * u).sum(0, keepdim=True), expected)
    torch.testing.assert_close(state, expected, atol=1e-5, rtol=1e-5)
    capsules, _ = simple_routing(votes[None], 3, normalize="inputs")
    torch.testing.assert_close(capsules[0], u, atol=1e-6, rtol=0)


@pytest.mark.parametrize("pooling, aggregate", [("capsules", "all"), ("mean", "all"), ("capsules", "last")])
def test_global_state_ignores_padding(pooling, aggregate):
    torch.manual_seed(1)
    module = GlobalRepresentation(8, layers=3, capsules=4, pooling=pooling, aggregate=aggregate)
    lengths = [5, 2, 1]
    hidden = [torch.randn(3, 5, 8) for _ in range(3)]
    keep = torch.arange(5)[None] < torch.tensor(lengths)[:, None]
    garbage = [h.masked_fill(~keep[..., None], 1e4) for h in hidden]  # huge values where padded
    _observed(module, garbage)
    batch = module.summarise(keep)
    assert torch.isfinite(batch).all()
    for b, n in enumerate(lengths):
        _observed(module, [h[b : b + 1, :n] for h in hidden])
        torch.testing.assert_close(batch[b : b + 1], module.summarise(keep[b : b + 1, :n]), atol=1e-5, rtol=0)


def test_summarise_complains_when_layers_were_not_observed():
    module = GlobalRepresentation(8, layers=2)
    _observed(module, [torch.randn(1, 3, 8)])
    with pytest.raises(RuntimeError, match="saw 1 encoder layer outputs, expected 2"):
        module.summarise(torch.ones(1, 3, dtype=torch.bool))


def test_fusion_gate_and_plain_addition():
    torch.manual_seed(2)
    dec_out, state = torch.randn(2, 3, 4), torch.randn(2, 4)
    plain = GlobalFusion(4, gate=False)
    plain.init_decoding_state(None, None, state)
    torch.testing.assert_close(plain(dec_out), dec_out + state[:, None])
    gated = GlobalFusion(4, gate=True)
    gated.init_decoding_state(None, None, state)
    gate = torch.sigmoid(gated.gate(torch.cat([dec_out, state[:, None].expand(-1, 3, -1)], dim=-1)))
    torch.testing.assert_close(gated(dec_out), dec_out + gate * state[:, None])
    with torch.no_grad():
        gated.gate.weight.zero_()
        gated.gate.bias.fill_(-50.0)  # gate shut: the decoder output passes unchanged
    gated.init_decoding_state(None, None, state)  # (the global state's part of the gate is computed here)
    assert torch.allclose(gated(dec_out), dec_out, atol=1e-12)
    with pytest.raises(RuntimeError, match="needs the global state from a GRET encoder"):
        gated.init_decoding_state(None, None, None)


def test_probe_precision_counts_the_top_k_words_in_each_bag():
    """tools/gret_probe.py's precision at k on scores set by hand: the special ids are never predicted (id 0 scores
    highest in the first row), and a sentence with an empty bag is left out of the mean."""
    from tools import gret_probe

    weight = torch.nn.Linear(4, 4)
    with torch.no_grad():
        weight.weight.copy_(torch.eye(4))
        weight.bias.zero_()
    vectors = torch.tensor([[9.0, 3, 2, 1], [0, 1, 2, 3], [0, 5, 0, 0]])  # the scores, embeddings being the identity
    bags = [[2, 3], [2, 3], []]
    # top 1: {1} and {3}, hits 0 and 1; top 2: {1, 2} and {3, 2}, hits 1/2 and 2/2
    result = gret_probe.precision_at(weight, vectors, bags, torch.eye(4), excluded=[0], ks=[1, 2])
    assert result == pytest.approx({1: 0.5, 2: 0.75})


def test_model_global_state_alone_equals_in_padded_batch(sample_data, onmt_active):
    opt = support.load_train_opts(SMOKE, *EXT, "-gret", "true")
    vocabs = support.load_vocabs(opt)
    model = support.build_model(opt, vocabs, seed=3)
    src, src_len, _ = support.random_batch(vocabs, [7, 4, 9], [2, 2, 2], seed=1)
    with torch.no_grad():
        _, batch, _ = model.encoder(src, src_len)
        for b, n in enumerate([7, 4, 9]):
            _, alone, _ = model.encoder(src[b : b + 1, :n], src_len[b : b + 1])
            torch.testing.assert_close(batch[b : b + 1], alone, atol=1e-5, rtol=0)
    assert batch.shape == (3, opt.hidden_size)


def _checkpoint_of(model):
    """What OpenNMT-py's saver writes: the model without the generator, and the generator apart."""
    state = {k: v.clone() for k, v in model.state_dict().items() if not k.startswith("generator.")}
    return {"model": state, "generator": {k: v.clone() for k, v in model.generator.state_dict().items()}}


def test_a_clause_models_own_checkpoint_loads_strictly_without_new_tensors(sample_data, onmt_active, caplog):
    """Clause attention's marker tables are non-persistent buffers, rebuilt from the vocabulary: a checkpoint
    never holds them, and loading one is no fine-tuning from a baseline (it said "3 new tensors initialised")."""
    config = "yaml_configs/smoke/clause/transformer_base_niutrans_enzh_ca_rule.yaml"
    opt = support.load_train_opts(config)
    vocabs = support.load_vocabs(opt)
    trained = support.build_model(opt, vocabs, seed=4)
    checkpoint = _checkpoint_of(trained)
    model = support.build_model(opt, vocabs, seed=5)
    caplog.set_level(logging.INFO)
    model.load_state_dict(checkpoint)
    assert not [r.getMessage() for r in caplog.records if "new tensors" in r.getMessage()]
    for (name, mine), (_, theirs) in zip(model.state_dict().items(), trained.state_dict().items()):
        assert torch.equal(mine, theirs), name


def test_loading_a_baseline_checkpoint_initialises_only_the_new_tensors(sample_data, onmt_active, caplog):
    vocabs = support.load_vocabs(support.load_train_opts(SMOKE))
    baseline = support.build_model(support.load_train_opts(SMOKE), vocabs, seed=4)
    checkpoint = _checkpoint_of(baseline)
    from onmt.model_builder import build_base_model

    # as OpenNMT-py's build_model with -train_from: constructor values, no -param_init pass, then the load
    gret = build_base_model(support.load_train_opts(SMOKE, *EXT, "-gret", "true"), vocabs)
    caplog.set_level(logging.INFO)
    gret.load_state_dict(checkpoint)
    new = {name for name, _ in gret.named_parameters() if ".gret." in name}
    loaded = dict(baseline.named_parameters())
    for name, param in gret.named_parameters():
        if name in new:
            assert name not in loaded
        else:
            assert torch.equal(param, loaded[name]), name
    message = next(r.getMessage() for r in caplog.records if "onmt-ext:" in r.getMessage())
    assert f"{len(new)} new tensors of onmt-ext mechanisms initialised" in message
    assert "encoder.gret.vote_maps" in message and "decoder.gret.gate.weight" in message
    assert torch.count_nonzero(gret.decoder.gret.gate.bias) == 0  # biases start at zero, as -param_init_glorot
    # tensors the Glorot rule does not name keep their constructor's values, as in a model trained from scratch
    assert torch.equal(gret.encoder.gret.norm_weight, torch.ones_like(gret.encoder.gret.norm_weight))
    assert torch.count_nonzero(gret.encoder.gret.norm_bias) == 0


def test_a_checkpoint_missing_stock_tensors_still_fails(sample_data, onmt_active):
    vocabs = support.load_vocabs(support.load_train_opts(SMOKE))
    baseline = support.build_model(support.load_train_opts(SMOKE), vocabs)
    checkpoint = _checkpoint_of(baseline)
    del checkpoint["model"]["encoder.layer_norm.weight"]
    gret = support.build_model(support.load_train_opts(SMOKE, *EXT, "-gret", "true"), vocabs)
    with pytest.raises(SystemExit, match="Missing key in checkpoint: encoder.layer_norm.weight"):
        gret.load_state_dict(checkpoint)


def _opt(**kw):
    base = dict(encoder_type="ext_transformer", decoder_type="ext_transformer", hidden_size=32, gret=False,
                gret_capsules=4,
                gret_iterations=3, gret_capsule_dim=0, gret_pooling="capsules", gret_layers="all", gret_gate=True)
    base.update(kw)
    return argparse.Namespace(**base)


@pytest.mark.parametrize("kw, message", [
    (dict(gret_capsules=8), "-gret_capsules has no effect while -gret is false"),
    (dict(gret_gate=False), "-gret_gate has no effect while -gret is false"),
    (dict(gret=True, decoder_type="transformer"), "-gret needs -decoder_type ext_transformer"),
    (dict(gret=True, gret_iterations=0), "-gret_iterations 0: must be >= 1"),
    (dict(gret=True, gret_capsules=0), "-gret_capsules 0: must be >= 1"),
    (dict(gret=True, gret_pooling="mean", gret_capsule_dim=16), "-gret_capsule_dim has no effect while"),
    (dict(gret=True, gret_pooling="mean", gret_iterations=5),
     "-gret_iterations has no effect while -gret_pooling is mean"),
    (dict(gret=True, gret_pooling="mean", gret_capsules=3), "-gret_capsules has no effect while -gret_pooling is mean"),
    (dict(gret=True, gret_capsules=3), "-gret_capsules 3 does not divide the model size 32"),
])
def test_option_checks(kw, message, onmt_active):
    problems = options.check_options(_opt(**kw))
    assert any(message in p for p in problems), problems


@pytest.mark.parametrize("kw", [
    dict(gret=True),
    dict(gret=True, gret_capsules=3, gret_capsule_dim=8, gret_iterations=2, gret_layers="last", gret_gate=False),
    dict(gret=True, gret_pooling="mean", gret_layers="last", gret_gate=False),
])
def test_options_in_effect_are_accepted(kw, onmt_active):
    assert options.check_options(_opt(**kw)) == []


def test_capsules_not_dividing_the_model_size_fail_at_option_validation(capsys, onmt_active):
    """One line naming the option from option validation, not a ValueError from inside model building; with mean
    pooling (no capsules) only "no effect" is said, not the divisibility."""
    for pooling, message in (("capsules", "-gret_capsules 3 does not divide the model size 32"),
                             ("mean", "-gret_capsules has no effect while -gret_pooling is mean")):
        with pytest.raises(SystemExit) as exit_info:
            support.load_train_opts(SMOKE, *EXT, "-gret", "true", "-gret_capsules", "3", "-gret_pooling", pooling)
        assert exit_info.value.code == 2
        errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
        assert len(errors) == 1 and message in errors[0], errors


def _reference_summary(module, hidden, keep):
    """The global state as commit 2d3ad91 computed it (a batch-first GRU over the transposed pooled states)."""
    hidden = torch.stack(hidden)
    hidden = torch.nn.functional.layer_norm(hidden, hidden.shape[-1:], eps=module.eps)
    hidden = torch.addcmul(module.norm_bias[:, None, None].to(hidden.dtype), hidden,
                           module.norm_weight[:, None, None].to(hidden.dtype))
    maps = module.vote_maps.to(hidden.dtype).transpose(0, 1).reshape(hidden.size(-1), -1)
    votes = (hidden @ maps).unflatten(-1, (module.capsules, module.capsule_dim))
    capsules, _ = simple_routing(votes, module.iterations, normalize="inputs",
                                 mask=keep.expand(hidden.size(0), *keep.shape), need_logits=False)
    scores = module.pool_scorer(capsules)
    attention = torch.softmax(scores.squeeze(-1).float(), dim=-1).to(capsules.dtype)
    pooled = (attention.unsqueeze(-1) * capsules).sum(dim=2)
    gru = torch.nn.GRU(module.gru.input_size, module.gru.hidden_size, batch_first=True)
    gru.load_state_dict(module.gru.state_dict())
    return gru(pooled.transpose(0, 1))[1][0], list(gru.parameters())


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_global_state_equals_the_previous_computation_in_values_and_gradients(autocast):
    torch.manual_seed(5)
    module = GlobalRepresentation(8, layers=3, capsules=2, iterations=3)
    lengths = [7, 4, 1]  # odd lengths, padded
    keep = torch.arange(7)[None] < torch.tensor(lengths)[:, None]
    hidden = [torch.randn(3, 7, 8, requires_grad=True) for _ in range(3)]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        _observed(module, hidden)
        state = module.summarise(keep)
        reference, gru = _reference_summary(module, hidden, keep)
    weights = torch.randn(state.shape)
    others = [p for name, p in module.named_parameters() if not name.startswith("gru.")]
    new = torch.autograd.grad((state * weights).sum(), hidden + others + list(module.gru.parameters()))
    old = torch.autograd.grad((reference * weights).sum(), hidden + others + gru)
    assert torch.equal(state, reference)  # the same arithmetic: bitwise
    for a, b in zip(new, old):
        assert torch.equal(a, b)


@pytest.mark.parametrize("baseline, fine_tuned", [("pre", "post"), ("post", "pre")])
def test_fine_tuning_across_layer_norm_placements_names_the_option(baseline, fine_tuned, sample_data, onmt_active):
    from onmt.model_builder import build_base_model
    from onmt_ext.errors import UsageError

    vocabs = support.load_vocabs(support.load_train_opts(SMOKE))
    base = support.build_model(support.load_train_opts(SMOKE, *EXT, "-ext_layer_norm", baseline), vocabs)
    gret = build_base_model(support.load_train_opts(SMOKE, *EXT, "-gret", "true", "-ext_layer_norm", fine_tuned),
                            vocabs)
    with pytest.raises(UsageError, match=f"-ext_layer_norm {fine_tuned}: the checkpoint was trained with "
                                         f"-ext_layer_norm {baseline} .*; fine-tune with -ext_layer_norm {baseline}"):
        gret.load_state_dict(_checkpoint_of(base))
