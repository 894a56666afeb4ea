"""onmt-ext's encoder/decoder with every mechanism off are the stock Transformer."""

import pytest
import torch
import yaml

import support
from onmt_ext.mechanisms.state import DecodingStateModule, stateful_modules

STOCK = "yaml_configs/smoke/baseline/transformer_base_wmt14_ende.yaml"
EXT = ("-encoder_type", "ext_transformer", "-decoder_type", "ext_transformer")


def _models(sample_data, config=STOCK):
    stock_opt = support.load_train_opts(config)
    ext_opt = support.load_train_opts(config, *EXT)
    vocabs = support.load_vocabs(stock_opt)
    stock = support.build_model(stock_opt, vocabs, seed=3)
    ext = support.build_model(ext_opt, vocabs, seed=4)
    return stock, ext, vocabs


@pytest.mark.parametrize("config, edits", [
    (STOCK, {}),
    (STOCK, {"position_encoding": False, "max_relative_positions": 8}),  # relative positions (Shaw et al.)
    (STOCK, {"self_attn_type": "average"}),  # the average attention network in the decoder
    (STOCK, {"self_attn_type": "scaled-dot"}),
    ("yaml_configs/smoke/chen2019/transformer_base_nist_zhen_baseline.yaml", {}),
], ids=["base", "relative-positions", "average-attention", "scaled-dot", "nist-zhen"])
def test_same_parameters_and_bitwise_same_outputs(sample_data, onmt_active, tmp_path, config, edits):
    """Every mechanism off: the parameters and the outputs (full pass and step by step) of stock's, for stock's
    own variants of the Transformer too (``edits``: options of the config changed)."""
    if edits:
        changed = tmp_path / "config.yaml"
        changed.write_text(yaml.safe_dump({**support.read_yaml(config), **edits}), encoding="utf-8")
        config = changed
    stock, ext, vocabs = _models(sample_data, config)
    from onmt_ext.integration.transformer import ExtTransformerDecoder, ExtTransformerEncoder

    assert isinstance(ext.encoder, ExtTransformerEncoder) and isinstance(ext.decoder, ExtTransformerDecoder)
    stock_state = stock.state_dict()
    assert list(stock_state) == list(ext.state_dict())
    torch.nn.Module.load_state_dict(ext, stock_state)

    src, src_len, tgt = support.random_batch(vocabs, [9, 5, 2], [7, 3, 8], seed=11)
    with torch.no_grad():
        enc_s, dec_s = support.full_forward(stock, src, src_len, tgt)
        enc_e, dec_e = support.full_forward(ext, src, src_len, tgt)
        assert torch.equal(enc_s, enc_e) and torch.equal(dec_s, dec_e)
        # stepwise decoding too
        outs = []
        for model in (stock, ext):
            enc, lens = support.start_decoding(model, src, src_len)
            outs.append(support.decode_steps(model, tgt, enc, lens, 0, tgt.size(1)))
        assert torch.equal(outs[0], outs[1])


class _SourceSummary(DecodingStateModule):
    """Toy stateful module: keeps each sentence's mean encoder state, ``(batch, dim)``."""

    def init_decoding_state(self, src, enc_out, enc_final_hs):
        self.decoding_state = {"summary": enc_out.mean(dim=1), "note": "not a tensor"}


def test_decoder_reorders_state_of_its_modules(sample_data, onmt_active):
    from onmt.utils.misc import tile

    _, ext, vocabs = _models(sample_data)
    ext.decoder.toy = _SourceSummary()
    assert stateful_modules(ext.decoder) == [ext.decoder.toy]

    src, src_len, _ = support.random_batch(vocabs, [4, 6, 3], [2, 2, 2], seed=12)
    with torch.no_grad():
        enc_out, _ = support.start_decoding(ext, src, src_len)
    summary = enc_out.mean(dim=1)
    ext.decoder.map_state(lambda state, dim: tile(state, 2, dim=dim))  # beam tiling
    torch.testing.assert_close(ext.decoder.toy.decoding_state["summary"], tile(summary, 2, 0))
    select = torch.tensor([5, 0, 3])
    ext.decoder.map_state(lambda state, dim: state[select])  # beam search's reordering
    torch.testing.assert_close(ext.decoder.toy.decoding_state["summary"], tile(summary, 2, 0)[select])
    assert ext.decoder.toy.decoding_state["note"] == "not a tensor"

    ext.decoder.toy.decoding_state["summary"].requires_grad_(True)
    ext.decoder.detach_state()
    assert not ext.decoder.toy.decoding_state["summary"].requires_grad


@pytest.mark.parametrize("config", [
    "chen2019/rpehead_all_switches", "chen2019/mprhead_all_switches", "chen2019/transformer_base_wmt14_ende_disan",
    "li2019/em_all_components",
    "li2019/transformer_base_wmt17_zhen_simple_enc_self", "cao2019/dec_self_cross_self",
    "gret/transformer_base_wmt17_zhen_gret", "gret/ablations_all_switches", "combined/all_mechanisms",
    "combined/all_but_cao2019",
])
def test_bf16_model_and_bf16_autocast_give_finite_outputs_close_to_fp32(config, sample_data, onmt_active):
    """Every mechanism in a model held in bfloat16, and under CPU autocast (the model dtypes of training)."""
    opt = support.load_train_opts(f"yaml_configs/smoke/{config}.yaml")
    vocabs = support.load_vocabs(opt)
    model = support.build_model(opt, vocabs, seed=3)
    src, src_len, tgt = support.random_batch(vocabs, [7, 4], [6, 5], seed=1)
    with torch.no_grad():
        _, full = support.full_forward(model, src, src_len, tgt)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, mixed = support.full_forward(model, src, src_len, tgt)
        _, half = support.full_forward(model.to(torch.bfloat16), src, src_len, tgt)
    assert half.dtype == torch.bfloat16
    for out in (mixed, half):
        assert torch.isfinite(out).all()
        # bf16 keeps 8 bits of mantissa: the outputs stay near the fp32 ones, they do not drift away
        assert (out.float() - full).abs().max() < 0.1 * full.abs().max() + 0.1
