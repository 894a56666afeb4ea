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
                li2019_iterations=3, ext_compile=False, self_attn_type="scaled-dot", parallel_mode="data_parallel",
                world_size=1)
    base.update(kw)
    return argparse.Namespace(**base)


@pytest.mark.parametrize("kw, message", [
    (dict(li2019_enc_self="em", li2019_enc_layers=[3]), "-li2019_enc_layers [3]: layers are numbered 1..2"),
    (dict(li2019_enc_self="em", li2019_capsules=5), "-li2019_capsules 5: must divide the model size 32"),
    (dict(li2019_enc_self="em", li2019_iterations=0), "-li2019_iterations 0: must be >= 1"),
    (dict(li2019_iterations=5), "-li2019_iterations has no effect while"),
    (dict(ext_compile=True), "-ext_compile has no effect without an onmt-ext mechanism"),
    (dict(li2019_dec_self="simple", self_attn_type="average"), "needs multi-head decoder self-attention"),
    (dict(encoder_type="transformer", li2019_enc_self="em"), "-li2019_enc_self 'em' has no effect with -encoder_type"),
])
def test_option_checks(kw, message, onmt_active):
    problems = options.check_options(_opt(**kw))
    assert any(message in p for p in problems), problems


def test_defaults_are_clean(onmt_active):
    assert options.check_options(_opt()) == []
