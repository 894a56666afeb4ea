"""li2019 head aggregation: the module, where it is attached, and its option checks."""

import argparse

import pytest
import torch

import support
from onmt_ext import options
from onmt_ext.aggregation import RoutingAggregation

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


@pytest.mark.parametrize("method", ["simple", "em"])
def test_selected_rows_match_the_full_aggregation_forward_and_backward(method):
    """``rows``: the positions in use give what the full aggregation gives there, the others are zero."""
    from onmt_ext.aggregation import aggregate_heads

    torch.manual_seed(0)
    module = RoutingAggregation(heads=4, d_model=16, capsules=16, method=method).double()
    context = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    rows = torch.tensor([0, 1, 2, 5, 6, 10])
    args = (module.input_weight, module.input_bias, module.vote_weight, getattr(module, "beta_a", None),
            getattr(module, "beta_u", None))
    kw = dict(heads=4, capsules=16, method=method, iterations=3)
    full = aggregate_heads(context, *args, **kw).reshape(15, 16)
    part = aggregate_heads(context, *args, rows=rows, **kw).reshape(15, 16)
    torch.testing.assert_close(part[rows], full[rows], atol=1e-12, rtol=1e-10)
    others = torch.ones(15, dtype=torch.bool)
    others[rows] = False
    assert part[others].eq(0).all() and full[others].abs().sum() > 0
    weights = torch.randn(len(rows), 16, dtype=torch.float64)
    grads_full = torch.autograd.grad((full[rows] * weights).sum(), (context, *module.parameters()))
    grads_part = torch.autograd.grad((part[rows] * weights).sum(), (context, *module.parameters()))
    for g_full, g_part in zip(grads_full, grads_part):
        torch.testing.assert_close(g_part, g_full, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("method", ["simple", "em"])
def test_encoder_routing_skips_padding_and_changes_no_real_position(method, sample_data, onmt_active, monkeypatch):
    """The encoder's aggregations see only the unpadded positions; the encoder output there is unchanged."""
    from onmt_ext import aggregation

    monkeypatch.setattr(aggregation, "MIN_SKIPPED_WORK", 1)  # (the smoke model is far too small to skip)
    opt = support.load_train_opts(SMOKE, *EXT, "-li2019_enc_self", method)
    model = support.build_model(opt, support.load_vocabs(opt))
    src, src_len, _ = support.random_batch(support.load_vocabs(opt), [7, 3, 5], [2, 2, 2])
    routed = model.encoder.routing_aggregations
    assert len(routed) == len(model.encoder.transformer)
    seen = []
    original = aggregation.aggregate_heads

    def recording(context, *args, rows=None, **kw):
        seen.append(None if rows is None else rows.tolist())
        return original(context, *args, rows=rows, **kw)

    with torch.no_grad():
        aggregation.aggregate_heads = recording
        try:
            skipped = model.encoder(src, src_len)[0]
        finally:
            aggregation.aggregate_heads = original
        model.encoder.routing_aggregations = ()  # every position, as before this saving
        full = model.encoder(src, src_len)[0]
    real = [b * 7 + t for b, n in enumerate([7, 3, 5]) for t in range(n)]
    assert seen == [real] * len(routed)
    assert all(module.positions is None for module in routed)  # nothing left behind for the next batch
    for b, n in enumerate([7, 3, 5]):
        torch.testing.assert_close(skipped[b, :n], full[b, :n], atol=1e-6, rtol=1e-5)


def test_padding_is_skipped_only_where_that_saves_work():
    from onmt_ext.aggregation import MIN_SKIPPED_WORK, skipping_padding

    small, base = RoutingAggregation(4, 32, 32, "em"), RoutingAggregation(8, 512, 512, "em", iterations=1)
    padding = torch.tensor([[False, False, True], [False, False, False]])
    assert 1 * 5 * 32 * 32 < MIN_SKIPPED_WORK <= 1 * 9 * 512 * 512
    with skipping_padding((small,), padding):
        assert small.positions is None
    with skipping_padding((base,), padding):
        assert base.positions[0] == (2, 3) and base.positions[1].tolist() == [0, 1, 3, 4, 5]
    assert base.positions is None
    with skipping_padding((base,), torch.zeros(2, 3, dtype=torch.bool)):
        assert base.positions is None


def test_compiled_routing_matches_eager_in_training_and_is_off_in_evaluation(monkeypatch):
    """``routing_compile``: the same function, compiled (fused kernels), forward and backward."""
    from onmt_ext import routing

    # float64, so that the comparison does not depend on how the generated code orders its float32 sums (on an
    # AVX2 AMD EPYC one float32 gradient differed by 2e-5; the machine of the earlier sessions passed 1e-5)
    torch.manual_seed(0)
    eager = RoutingAggregation(heads=2, d_model=8, capsules=8, method="em").double()
    fast = RoutingAggregation(heads=2, d_model=8, capsules=8, method="em", compile_routing=True).double()
    fast.load_state_dict(eager.state_dict())
    context = torch.randn(2, 3, 8, dtype=torch.float64)
    out_e, out_f = eager(context), fast(context)
    out_e.square().sum().backward()
    out_f.square().sum().backward()
    torch.testing.assert_close(out_f, out_e, atol=1e-10, rtol=1e-9)
    for p_e, p_f in zip(eager.parameters(), fast.parameters()):
        torch.testing.assert_close(p_f.grad, p_e.grad, atol=1e-10, rtol=1e-9)
    assert routing.compiled(routing.em_routing) is routing.compiled(routing.em_routing)  # built once
    # evaluation and translation stay eager: compiling is never reached
    monkeypatch.setattr(routing, "compiled", lambda fn: pytest.fail("compiled in evaluation"))
    fast.eval()
    with torch.no_grad():
        torch.testing.assert_close(fast(context), eager.eval()(context), atol=1e-10, rtol=1e-9)


def test_a_compile_failure_names_the_option(monkeypatch):
    from onmt_ext import routing

    class FakeBackendError(Exception):
        __module__ = "torch._dynamo.exc"

    def broken(*args, **kwargs):
        raise FakeBackendError("no C++ compiler found")

    monkeypatch.setattr(routing, "compiled", lambda fn: broken)
    module = RoutingAggregation(heads=2, d_model=8, capsules=8, method="simple", compile_routing=True)
    with pytest.raises(RuntimeError, match="-routing_compile.*no C.. compiler found.*-routing_compile false"):
        module(torch.randn(1, 2, 8))


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
                li2019_iterations=3, routing_compile=False, self_attn_type="scaled-dot", parallel_mode="data_parallel", world_size=1)
    base.update(kw)
    return argparse.Namespace(**base)


@pytest.mark.parametrize("kw, message", [
    (dict(li2019_enc_self="em", li2019_enc_layers=[3]), "-li2019_enc_layers [3]: layers are numbered 1..2"),
    (dict(li2019_enc_self="em", li2019_capsules=5), "-li2019_capsules 5: must divide the model size 32"),
    (dict(li2019_enc_self="em", li2019_iterations=0), "-li2019_iterations 0: must be >= 1"),
    (dict(li2019_iterations=5), "-li2019_iterations has no effect while"),
    (dict(routing_compile=True), "-routing_compile has no effect without li2019"),
    (dict(li2019_dec_self="simple", self_attn_type="average"), "needs multi-head decoder self-attention"),
    (dict(encoder_type="transformer", li2019_enc_self="em"), "-li2019_enc_self 'em' has no effect with -encoder_type"),
])
def test_option_checks(kw, message, onmt_active):
    problems = options.check_options(_opt(**kw))
    assert any(message in p for p in problems), problems


def test_defaults_are_clean(onmt_active):
    assert options.check_options(_opt()) == []
