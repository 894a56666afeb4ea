"""li2019 head aggregation: the module, where it is attached, and its option checks."""

import argparse

import pytest
import torch

import support
from onmt_ext import options
from onmt_ext.mechanisms.li2019 import RoutingAggregation

from tools.op_count import counter as operator_counter
from tools.routing_memory import SavedBytes

SMOKE = "yaml_configs/smoke/baseline/transformer_base_wmt14_ende.yaml"
EXT = ["-encoder_type", "ext_transformer", "-decoder_type", "ext_transformer"]


@pytest.mark.parametrize("method", ["simple", "em"])
def test_module_shapes_and_padding_independence(method):
    torch.manual_seed(0)
    module = RoutingAggregation(heads=4, d_model=16, capsules=8, method=method)
    context = torch.randn(3, 5, 16)
    out = module(context)
    assert out.shape == (3, 5, 16) and torch.isfinite(out).all()
    # each position is aggregated on its own: a prefix gives the same outputs
    torch.testing.assert_close(module(context[:, :2]), out[:, :2])


def test_attached_only_where_selected(sample_data, onmt_active):
    opt = support.load_train_opts(SMOKE, *EXT, "-li2019_enc_self", "em", "-li2019_enc_layers", "2",
                                  "-li2019_enc_dec", "simple")
    model = support.build_model(opt, support.load_vocabs(opt))
    kinds = lambda mods: [type(m).__name__ for m in mods]  # noqa: E731
    assert kinds(layer.self_attn.final_linear for layer in model.encoder.transformer) == ["Linear", "RoutingAggregation"]
    assert kinds(layer.context_attn.final_linear for layer in model.decoder.transformer_layers) == ["RoutingAggregation"] * 2
    assert kinds(layer.self_attn.final_linear for layer in model.decoder.transformer_layers) == ["Linear"] * 2


def _opt(**kw):
    base = dict(encoder_type="ext_transformer", decoder_type="ext_transformer", enc_layers=2, dec_layers=2, layers=-1,
                hidden_size=32, enc_hid_size=32, li2019_enc_self="concat", li2019_dec_self="concat",
                li2019_enc_dec="concat", li2019_enc_layers=[], li2019_dec_layers=[], li2019_capsules=0,
                li2019_iterations=3, li2019_recompute=True, li2019_em_density="product", li2019_em_lambda=[],
                li2019_em_min_var=1e-4, ext_compile=False, self_attn_type="scaled-dot",
                parallel_mode="data_parallel", world_size=1)
    base.update(kw)
    return argparse.Namespace(**base)


@pytest.mark.parametrize("kw, message", [
    (dict(li2019_enc_self="em", li2019_enc_layers=[3]), "-li2019_enc_layers [3]: layers are numbered 1..2"),
    (dict(li2019_enc_self="em", li2019_capsules=5), "-li2019_capsules 5: must divide the model size 32"),
    (dict(li2019_enc_self="em", li2019_iterations=0), "-li2019_iterations 0: must be >= 1"),
    (dict(li2019_iterations=5), "-li2019_iterations has no effect while"),
    (dict(li2019_recompute=False), "-li2019_recompute has no effect while"),
    (dict(li2019_dec_self="em", li2019_enc_layers=[1]),
     "-li2019_enc_layers has no effect while -li2019_enc_self is 'concat'"),
    (dict(li2019_enc_self="em", li2019_dec_layers=[1]),
     "-li2019_dec_layers has no effect while -li2019_dec_self and -li2019_enc_dec are both 'concat'"),
    (dict(ext_compile=True), "-ext_compile has no effect without an onmt-ext mechanism"),
    (dict(li2019_enc_self="em", li2019_em_lambda=[1.0, 2.0, 3.0]), "-li2019_em_lambda [1.0, 2.0, 3.0]: takes at most"),
    (dict(li2019_enc_self="em", li2019_em_lambda=[0.0]), "-li2019_em_lambda [0.0]: must be > 0"),
    (dict(li2019_enc_self="em", li2019_em_min_var=0.0), "-li2019_em_min_var 0.0: must be > 0"),
    (dict(li2019_enc_self="simple", li2019_em_density="sum"),
     "-li2019_em_density has no effect while no component uses EM routing"),
    (dict(li2019_dec_self="simple", self_attn_type="average"), "needs multi-head decoder self-attention"),
    (dict(encoder_type="transformer", li2019_enc_self="em"), "-li2019_enc_self 'em' has no effect with -encoder_type"),
])
def test_option_checks(kw, message, onmt_active):
    problems = options.check_options(_opt(**kw))
    assert any(message in p for p in problems), problems


def test_defaults_are_clean(onmt_active):
    assert options.check_options(_opt()) == []


@pytest.mark.parametrize("kw", [
    dict(li2019_enc_self="em", li2019_enc_layers=[1], li2019_capsules=4, li2019_iterations=2),
    dict(li2019_dec_self="em", li2019_dec_layers=[2], li2019_recompute=False),
    dict(li2019_enc_dec="simple", li2019_dec_layers=[1]),
    dict(li2019_enc_self="em", li2019_enc_dec="em", li2019_enc_layers=[2], li2019_dec_layers=[1]),
])
def test_layer_lists_of_a_routed_side_are_accepted(kw, onmt_active):
    assert options.check_options(_opt(**kw)) == []


# ------------------------------------------------------------------ memory: recomputing the routing in backward


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("method, factor", [("simple", 50), ("em", 100)])
def test_training_keeps_only_the_context_for_backward(method, factor, autocast):
    """At Transformer-Base width (H = 8, d = N = 512), the default module saves nothing but its input for backward;
    storing the routing instead saves ``factor`` times more (without autocast 6.75 (simple) and 14 (EM) float32
    tensors of ``(positions, H, N)``, against the context's ``(positions, d)``)."""
    torch.manual_seed(0)
    module = RoutingAggregation(heads=8, d_model=512, capsules=512, method=method)
    context = torch.randn(2, 16, 512, requires_grad=True)
    counts = []
    for recompute, keep in ((True, True), (False, True), (False, False)):
        module.recompute = recompute
        counter = SavedBytes(exclude=list(module.parameters()), keep=keep)
        with counter.hooks(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            assert module(context).requires_grad
        counts.append(counter.total)
    kept, stored, stored_counted_without_keeping = counts
    assert kept <= context.nbytes
    assert stored >= factor * context.nbytes
    assert stored_counted_without_keeping == stored  # what tools/routing_memory.py counts for steps that do not fit


def _run_module(module, context, autocast):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = module(context)
    weights = torch.linspace(-1, 1, out.numel()).view_as(out)
    return out, torch.autograd.grad((out.float() * weights).sum(), [context, *module.parameters()])


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("method", ["simple", "em"])
def test_recomputed_gradients_equal_stored_ones_bitwise(method, autocast):
    """Gradients w.r.t. the context and every parameter, with the routing recomputed in backward and stored."""
    torch.manual_seed(1)
    module = RoutingAggregation(heads=4, d_model=32, capsules=16, method=method)
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name.startswith("beta"):
                param.normal_()
    context = torch.randn(3, 7, 32, requires_grad=True)
    runs = []
    for recompute in (True, False):
        module.recompute = recompute
        runs.append(_run_module(module, context, autocast))
    (out_r, grads_r), (out_s, grads_s) = runs
    assert torch.equal(out_r, out_s)
    assert len(grads_r) == 2 + len(list(module.parameters())) - 1 and all(g.abs().sum() > 0 for g in grads_r)
    assert all(torch.equal(a, b) for a, b in zip(grads_r, grads_s))


@pytest.mark.parametrize("method, most", [("simple", 144), ("em", 219)])
def test_training_pass_launches_few_operators(method, most):
    """A training forward + backward pass of the default module (recomputed in backward, N = d, T = 3) at
    Transformer-Base width launches at most ``most`` kernels in eager mode (200 (simple) and 320 (EM) before the
    routing was fused: results/bench/li2019-ops.md); on a GPU the step is bound by their launches."""
    torch.manual_seed(0)
    module = RoutingAggregation(heads=8, d_model=512, capsules=512, method=method)
    context = torch.randn(1, 2, 512, requires_grad=True)
    with operator_counter() as counter:
        module(context).sum().backward()
    assert counter.totals()["launches"] <= most


def _li2019_model(method, recompute):
    overrides = ["-dropout", "0", "-attention_dropout", "0", "-li2019_recompute", "true" if recompute else "false"]
    if method == "simple":
        overrides += ["-li2019_enc_self", "simple", "-li2019_dec_self", "simple", "-li2019_enc_dec", "simple"]
    opt = support.load_train_opts("yaml_configs/smoke/li2019/em_all_components.yaml", *overrides)
    vocabs = support.load_vocabs(opt)
    return support.build_model(opt, vocabs, seed=4), vocabs


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("method", ["simple", "em"])
def test_model_gradients_with_recompute_equal_stored_ones_bitwise(method, autocast, sample_data, onmt_active):
    """Routing in the encoder self-, decoder self- and encoder-decoder attention, a padded batch: outputs and
    every parameter's gradient are bitwise the same with ``-li2019_recompute`` true (the default) and false."""
    runs = []
    for recompute in (True, False):
        model, vocabs = _li2019_model(method, recompute)
        routers = [m for m in model.modules() if isinstance(m, RoutingAggregation)]
        assert len(routers) == 3 and {(m.method, m.recompute) for m in routers} == {(method, recompute)}
        src, src_len, tgt = support.random_batch(vocabs, [7, 3, 9], [6, 2, 5], seed=5)
        model.train()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            _, out = support.full_forward(model, src, src_len, tgt)
        loss = (out.float() * torch.linspace(-1, 1, out.numel()).view_as(out)).sum()
        runs.append((out, torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)))
    (out_r, grads_r), (out_s, grads_s) = runs
    assert torch.equal(out_r, out_s)
    assert sum(g is not None for g in grads_r) == sum(g is not None for g in grads_s) > 0
    for a, b in zip(grads_r, grads_s):
        assert (a is None and b is None) or torch.equal(a, b)


def test_translation_does_not_recompute(sample_data, onmt_active, monkeypatch):
    """Without grad (step-by-step decoding, ``onmt_translate``) the routing runs once, outside any checkpoint."""

    def refuse(*args, **kwargs):
        raise AssertionError("checkpoint used without grad")

    model, vocabs = _li2019_model("em", True)
    src, src_len, tgt = support.random_batch(vocabs, [5, 4], [4, 4], seed=6)
    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", refuse)
    with torch.no_grad():
        _, full = support.full_forward(model, src, src_len, tgt)
        enc_out, lengths = support.start_decoding(model, src, src_len)
        stepwise = support.decode_steps(model, tgt, enc_out, lengths, 0, tgt.size(1))
    torch.testing.assert_close(stepwise, full, atol=1e-5, rtol=0)


def test_em_choices_reach_the_routing(sample_data, onmt_active, monkeypatch):
    """NOTES.md asks for EM's open choices to be configurable: each -li2019_em_* option reaches every EM router, and
    the router passes it to the routing core (whose arguments are tested in test_routing.py)."""
    from onmt_ext.mechanisms import li2019
    from onmt_ext.mechanisms.routing import linear_inverse_temperature

    opt = support.load_train_opts(SMOKE, *EXT, "-li2019_enc_self", "em", "-li2019_enc_dec", "simple",
                                  "-li2019_em_density", "sum", "-li2019_em_lambda", "1", "3",
                                  "-li2019_em_min_var", "0.01")
    model = support.build_model(opt, support.load_vocabs(opt))
    routers = [m for m in model.modules() if isinstance(m, RoutingAggregation)]
    assert {m.em for m in routers if m.method == "em"} == {li2019.EmChoices("sum", (1.0, 3.0), 0.01)}
    assert li2019.EmChoices().schedule() is None and li2019.EmChoices(inverse_temperature=(1.0,)).schedule() is None
    torch.manual_seed(0)
    context, module = torch.randn(2, 3, 16), RoutingAggregation(heads=4, d_model=16, capsules=8, method="em")
    with torch.no_grad():
        default = module(context)
        module.em = li2019.EmChoices("sum", (1.0, 3.0), 0.01)
        calls, core = [], li2019.em_routing
        monkeypatch.setattr(li2019, "em_routing", lambda *args, **kwargs: calls.append(kwargs) or core(*args, **kwargs))
        chosen = module(context)
    [kwargs] = calls
    assert kwargs["density"] == "sum" and kwargs["min_var"] == 0.01
    expected = linear_inverse_temperature(1.0, 3.0)
    assert [kwargs["inverse_temperature"](t, 3) for t in range(3)] == [expected(t, 3) for t in range(3)] == [1, 2, 3]
    assert not torch.allclose(chosen, default)
