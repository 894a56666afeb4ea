"""The DiSAN-style directional self-attention baseline (chen2019 Table 1): masks, empty rows, gate, padding, options."""

import argparse

import pytest
import torch

import support
from onmt_ext import options
from onmt_ext.mechanisms.disan import DirectionalSoftmax, FusionGate, directional_mask

SMOKE = "yaml_configs/smoke/baseline/transformer_base_wmt14_ende.yaml"
EXT = ["-encoder_type", "ext_transformer", "-decoder_type", "ext_transformer"]


def test_masks_on_a_hand_worked_example_with_padding():
    # 2 heads (one forward, one backward), 4 positions of which the last is padding
    scores = torch.zeros(1, 2, 4, 4)
    scores[..., 3] = -1e18
    probs = DirectionalSoftmax(2)(scores)
    forward = torch.tensor([[0, 0, 0, 0], [1, 0, 0, 0], [.5, .5, 0, 0], [1 / 3, 1 / 3, 1 / 3, 0]])
    backward = torch.tensor([[0, .5, .5, 0], [0, 0, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]])
    torch.testing.assert_close(probs[0, 0], forward)  # query 0 has no earlier key: an all-zero row
    torch.testing.assert_close(probs[0, 1], backward)  # query 2 (last real token) has no later real key
    assert torch.isfinite(probs).all()


def test_directional_mask_halves():
    mask = directional_mask(3, 4)
    assert mask.shape == (4, 3, 3)
    assert torch.equal(mask[0], torch.tensor([[0, 0, 0], [1, 0, 0], [1, 1, 0]], dtype=torch.bool))
    assert torch.equal(mask[3], mask[0].t())
    assert torch.equal(mask[0], mask[1]) and torch.equal(mask[2], mask[3])


class _Echo(torch.nn.Module):
    """A stand-in attention returning a fixed s."""

    def __init__(self, s):
        super().__init__()
        self.s = s
        self.self_attn_type = "scaled-dot"

    def forward(self, key, value, query, mask=None):
        return self.s, None


def test_fusion_gate_saturates_to_the_input_or_the_attention():
    torch.manual_seed(0)
    s, h = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    gate = FusionGate(_Echo(s), 4)
    with torch.no_grad():
        gate.gate_s.weight.zero_()
        gate.gate_h.weight.zero_()
        gate.gate_s.bias.fill_(50.0)
        torch.testing.assert_close(gate(h, h, h)[0], h)  # F = 1: the input passes
        gate.gate_s.bias.fill_(-50.0)
        torch.testing.assert_close(gate(h, h, h)[0], s)  # F = 0: the attention output
    assert gate.self_attn_type == "scaled-dot"  # attributes of the wrapped attention stay visible


def test_encoder_with_disan_ignores_padding_and_a_one_token_sentence_is_finite(sample_data, onmt_active):
    opt = support.load_train_opts(SMOKE, *EXT, "-disan_enc", "true")
    vocabs = support.load_vocabs(opt)
    model = support.build_model(opt, vocabs, seed=2)
    layer = model.encoder.transformer[0]
    assert isinstance(layer.self_attn, FusionGate) and layer.self_attn.attention.self_attn_type == "scaled-dot"
    src, src_len, _ = support.random_batch(vocabs, [6, 1, 4], [2, 2, 2], seed=3)
    with torch.no_grad():
        enc, _, _ = model.encoder(src, src_len)
        assert torch.isfinite(enc).all()
        for b, n in enumerate([6, 1, 4]):
            alone, _, _ = model.encoder(src[b : b + 1, :n], src_len[b : b + 1])
            torch.testing.assert_close(enc[b : b + 1, :n], alone, atol=1e-5, rtol=0)


def test_parameter_delta_at_transformer_base(onmt_active):
    from tools import param_report

    opt = support.load_train_opts("yaml_configs/chen2019/transformer_base_wmt14_ende_disan.yaml")
    delta = param_report.count_parameters(opt, 1000) - param_report.count_parameters(param_report.baseline_of(opt), 1000)
    assert delta == 6 * (2 * 512 * 512 + 512)  # W_1, b, W_2 per layer: 3.15M, against the paper's +0.04M
    opt.disan_fusion_gate = False
    assert param_report.count_parameters(opt, 1000) == param_report.count_parameters(param_report.baseline_of(opt), 1000)


def _opt(**kw):
    base = dict(encoder_type="ext_transformer", decoder_type="ext_transformer", enc_layers=2, dec_layers=2, layers=-1,
                heads=4, disan_enc=False, disan_enc_layers=[], disan_fusion_gate=True, parallel_mode="data_parallel",
                world_size=1, cao2019_vertical=False, cao2019_horizontal=False)
    base.update(kw)
    return argparse.Namespace(**base)


@pytest.mark.parametrize("kw, message", [
    (dict(disan_fusion_gate=False), "-disan_fusion_gate has no effect while -disan_enc is false"),
    (dict(disan_enc=True, heads=3), "-heads 3 is odd"),
    (dict(disan_enc=True, disan_enc_layers=[3]), "-disan_enc_layers [3]: layers are numbered 1..2"),
    (dict(disan_enc=True, cao2019_horizontal=True), "cannot be combined with cao2019"),
    (dict(disan_enc=True, parallel_mode="tensor_parallel", world_size=2), "tensor_parallel"),
    (dict(disan_enc=True, encoder_type="transformer"), "-disan_enc True has no effect with -encoder_type"),
])
def test_option_checks(kw, message, onmt_active):
    problems = options.check_options(_opt(**kw))
    assert any(message in p for p in problems), problems
