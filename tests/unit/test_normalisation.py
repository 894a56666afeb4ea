"""``-ext_layer_norm``: ``pre`` is the stock Transformer; ``post`` is Vaswani et al.'s post-norm layer.

The decoding properties of post-norm models (stepwise = teacher-forced, padding, future, beam reordering) run in
tests/integration/test_decoding_properties.py on the post-norm smoke configs.
"""

import argparse

import pytest
import torch
import torch.nn.functional as F

import support

STOCK = "yaml_configs/smoke/baseline/transformer_base_wmt14_ende.yaml"
EXT = ("-encoder_type", "ext_transformer", "-decoder_type", "ext_transformer")
POST = EXT + ("-ext_layer_norm", "post")
FINAL_NORMS = {"encoder.layer_norm.weight", "encoder.layer_norm.bias", "decoder.layer_norm.weight",
               "decoder.layer_norm.bias"}


def _model(*overrides, seed=3):
    opt = support.load_train_opts(STOCK, *overrides)
    vocabs = support.load_vocabs(opt)
    return support.build_model(opt, vocabs, seed=seed), vocabs


def _norm(module, x):
    """A layer norm written out: ``(x - mean) / sqrt(var + eps) * weight + bias`` over the last dimension."""
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, unbiased=False, keepdim=True)
    return (x - mean) / torch.sqrt(var + module.eps) * module.weight + module.bias


def _ffn(ff, x):
    """Vaswani et al. eq. 2 with the stock FFN's weights (ReLU; dropout off)."""
    return F.linear(F.relu(F.linear(x, ff.w_1.weight, ff.w_1.bias)), ff.w_2.weight, ff.w_2.bias)


def _reference_encoder(encoder, src, src_len):
    """Vaswani et al. sec. 3.1 by hand: ``h = LN(x + SelfAttn(x))``, ``out = LN(h + FFN(h))``, no final norm."""
    x = encoder.embeddings(src)
    pad = torch.arange(src.size(1))[None, :] >= src_len[:, None]  # (B, S), True at padding
    mask = pad[:, None, None, :].expand(-1, 1, src.size(1), -1)
    for layer in encoder.transformer:
        x = _norm(layer.layer_norm, x + layer.self_attn(x, x, x, mask=mask)[0])
        x = _norm(layer.feed_forward.layer_norm, x + _ffn(layer.feed_forward, x))
    return x


def _reference_decoder(decoder, tgt, enc_out, src_len):
    """The post-norm decoder by hand: self-attention (causal), context attention, FFN, each ``LN(x + F(x))``."""
    x = decoder.embeddings(tgt)
    length = tgt.size(1)
    future = torch.ones(length, length, dtype=torch.bool).triu(1)
    self_mask = (future[None] | tgt[:, None, :, 0].eq(decoder.embeddings.word_padding_idx))[:, None]
    src_pad = torch.arange(enc_out.size(1))[None, :] >= src_len[:, None]
    ctx_mask = src_pad[:, None, None, :].expand(-1, 1, length, -1)
    for layer in decoder.transformer_layers:
        x = _norm(layer.layer_norm_1, x + layer.self_attn(x, x, x, mask=self_mask)[0])
        x = _norm(layer.layer_norm_2, x + layer.context_attn(enc_out, enc_out, x, mask=ctx_mask)[0])
        x = _norm(layer.feed_forward.layer_norm, x + _ffn(layer.feed_forward, x))
    return x


def test_pre_is_the_stock_model_bit_for_bit(sample_data, onmt_active):
    stock, vocabs = _model()
    pre, _ = _model(*EXT, "-ext_layer_norm", "pre", seed=4)
    assert list(stock.state_dict()) == list(pre.state_dict())
    torch.nn.Module.load_state_dict(pre, stock.state_dict())
    src, src_len, tgt = support.random_batch(vocabs, [9, 5, 2], [7, 3, 8], seed=11)
    with torch.no_grad():
        for got, expected in zip(support.full_forward(pre, src, src_len, tgt),
                                 support.full_forward(stock, src, src_len, tgt)):
            assert torch.equal(got, expected)


def test_post_has_the_stock_parameters_but_the_final_norms(sample_data, onmt_active):
    stock, _ = _model()
    post, _ = _model(*POST)
    assert FINAL_NORMS <= set(stock.state_dict())
    assert list(post.state_dict()) == [name for name in stock.state_dict() if name not in FINAL_NORMS]


def test_post_equals_the_hand_written_post_norm_transformer(sample_data, onmt_active):
    post, vocabs = _model(*POST)
    src, src_len, tgt = support.random_batch(vocabs, [9, 5, 2], [7, 3, 8], seed=11)
    with torch.no_grad():
        enc_out, dec_out = support.full_forward(post, src, src_len, tgt)
        torch.testing.assert_close(enc_out, _reference_encoder(post.encoder, src, src_len))
        keep = tgt[:, :, 0].ne(post.decoder.embeddings.word_padding_idx)  # padded target rows are never read
        reference = _reference_decoder(post.decoder, tgt, enc_out, src_len)
        torch.testing.assert_close(dec_out[keep], reference[keep])
        # and the pre-norm model with the same weights differs
        pre, _ = _model(*EXT)
        torch.nn.Module.load_state_dict(pre, post.state_dict(), strict=False)
        assert not torch.allclose(support.full_forward(pre, src, src_len, tgt)[0], enc_out, atol=1e-3)


def test_post_trains_every_parameter(sample_data, onmt_active):
    """No parameter is left out of the graph (a stray final norm would idle under DDP)."""
    post, vocabs = _model(*POST)
    post.train()
    src, src_len, tgt = support.random_batch(vocabs, [6, 4], [5, 5], seed=2)
    _, dec_out = support.full_forward(post, src, src_len, tgt)
    post.generator(dec_out).sum().backward()
    assert [name for name, p in post.named_parameters() if p.grad is None or not p.grad.any()] == []


def test_mechanisms_fit_post_norm_layers(sample_data, onmt_active):
    """chen2019's restricted heads keep whole layer norms (nothing is in front of the heads); GRET reads the
    post-norm states without a norm of its own."""
    from onmt_ext.mechanisms.chen2019 import HeadwiseNorm

    args = ("-chen2019_enc", "mprhead", "-chen2019_dec", "mprhead", "-chen2019_dim", "16", "-chen2019_heads",
            "restricted", "-gret", "true")
    pre, _ = _model(*EXT, *args)
    post, _ = _model(*POST, *args)
    assert isinstance(pre.encoder.transformer[0].layer_norm, HeadwiseNorm)
    assert isinstance(pre.decoder.transformer_layers[0].layer_norm_1, HeadwiseNorm)
    assert type(post.encoder.transformer[0].layer_norm) is torch.nn.LayerNorm
    assert type(post.decoder.transformer_layers[0].layer_norm_1) is torch.nn.LayerNorm
    assert pre.encoder.gret.norm_weight is not None and post.encoder.gret.norm_weight is None
    assert not any(name.startswith("encoder.gret.norm_") for name in post.state_dict())


def _opt(**values):
    base = dict(encoder_type="ext_transformer", decoder_type="ext_transformer", heads=4, enc_hid_size=32,
                dec_hid_size=32, hidden_size=-1, ext_layer_norm="post")
    return argparse.Namespace(**{**base, **values})


@pytest.mark.parametrize("values, message", [
    (dict(decoder_type="transformer"),
     "-ext_layer_norm post needs -decoder_type ext_transformer (a stock side would stay pre-norm)"),
    (dict(parallel_residual=True), "-ext_layer_norm post does not support -parallel_residual (a pre-norm layout)"),
    (dict(num_experts=4),
     "-ext_layer_norm post does not support -num_experts (mixture-of-experts feed-forward)"),
    (dict(parallel_mode="tensor_parallel", world_size=2),
     "-ext_layer_norm post does not support -parallel_mode tensor_parallel"),
    (dict(ext_layer_norm="pre", ext_compile=True),
     "-ext_compile has no effect without an onmt-ext mechanism (the stock layers are not compiled; "
     "-ext_compile_layers compiles whole layers)"),
    (dict(ext_compile=True),
     "-ext_compile has no effect without an onmt-ext mechanism (the stock layers are not compiled; "
     "-ext_compile_layers compiles whole layers)"),
])
def test_post_norm_combinations_that_cannot_work_are_named(values, message, onmt_active):
    from onmt_ext import options

    assert options.check_options(_opt(**values)) == [message]


def test_post_norm_alone_is_a_valid_configuration(onmt_active):
    from onmt_ext import options

    assert options.check_options(_opt()) == []
