"""``-ext_layer_norm``: layer normalisation before each sublayer (OpenNMT-py's) or after it (Vaswani et al.'s).

``pre`` (default) is OpenNMT-py 3.5.1 unchanged: ``x + Dropout(F(LN(x)))`` for each sublayer F, and a final layer
norm on each stack's output.  ``post`` is Vaswani et al. 2017 sec. 3.1, ``LayerNorm(x + Sublayer(x))``:
``x <- LN(x + Dropout(F(x)))`` for each sublayer, and no final layer norm (each stack's ``layer_norm`` becomes
the identity), as THUMT's and fairseq's defaults.  The post-norm layers keep the stock sub-modules and parameter
names; each stock layer norm moves behind its sublayer: encoder ``layer_norm`` (self-attention) and
``feed_forward.layer_norm`` (FFN); decoder ``layer_norm_1``, ``layer_norm_2`` (context attention) and
``feed_forward.layer_norm``.  Mechanisms plug into the sub-modules, so each works with either.  Which paper used
which, and the evidence: docs/normalisation.md.
"""

from dataclasses import dataclass
from functools import lru_cache

import torch.nn as nn

from onmt_ext.options import EXT_TYPE, option, register_mechanism, tensor_parallel_problems

# OpenNMT-py is imported inside the functions: importing it while this module initialises would activate
# onmt-ext (onmt_ext._autoload) before this module is whole.

PLACEMENTS = ("pre", "post")


def _dropped(layer, x):
    """The residual branch's dropout, applied as the stock layers apply it (only for ``dropout_p > 0``)."""
    return layer.dropout(x) if layer.dropout_p > 0 else x


def post_norm_feed_forward(ff, x):
    """``LN(x + Dropout(W_2 Dropout(act(W_1 x))))`` (Vaswani et al. eq. 2 inside a post-norm sublayer).

    ``ff`` is a stock :class:`~onmt.modules.position_ffn.PositionwiseFeedForward` (``ff.layer_norm`` is the LN;
    gated activations multiply by ``W_3 x`` as the stock FFN does); ``x`` ``(batch, len, d)`` to the same shape.
    """
    inter = ff.activation(ff.maybe_ckpt(ff.w_1, x))
    if ff.w_3 is not None:
        inter = inter * ff.maybe_ckpt(ff.w_3, x)
    if ff.dropout_p > 0:
        inter = ff.dropout_1(inter)
    inter = ff.maybe_ckpt(ff.w_2, inter)
    if ff.dropout_p > 0:
        inter = ff.dropout_2(inter)
    return ff.layer_norm(x + inter)


def _encoder_layer_forward(self, layer_in, mask):
    """Post-norm encoder layer: ``h = LN_1(x + Dropout(SelfAttn(x)))``, ``out = LN_2(h + FFN(h))``.

    ``layer_in`` ``(batch, src_len, d)``, ``mask`` ``(batch, 1, src_len, src_len)`` (True at padding); returns
    ``(batch, src_len, d)``.
    """
    context, _ = self.self_attn(layer_in, layer_in, layer_in, mask=mask)
    return post_norm_feed_forward(self.feed_forward, self.layer_norm(layer_in + _dropped(self, context)))


def _decoder_layer_forward(self, layer_in, enc_out, src_pad_mask, tgt_pad_mask, step=None, future=False,
                           return_attn=False):
    """Post-norm decoder layer (the stock ``_forward``'s arguments, masks and returns).

    ``h = LN_1(x + Dropout(SelfAttn(x)))``, ``c = LN_2(h + Dropout(CtxAttn(h, enc_out)))``, ``out = LN_3(c +
    FFN(c))``.  ``layer_in`` ``(batch, T, d)``, ``enc_out`` ``(batch, src_len, d)``, ``src_pad_mask``
    ``(batch, 1, src_len)``, ``tgt_pad_mask`` ``(batch, 1, T)``; returns ``(batch, T, d)`` and the context
    attention ``(batch, heads, T, src_len)`` (or None).  With ``step``, the self-attention's cache holds the keys
    and values of the earlier positions' ``x``, as in the stock layer.
    """
    dec_mask = None
    src_pad_mask = src_pad_mask.unsqueeze(1)  # (B, 1, 1, src_len)
    if layer_in.size(1) > 1:  # as the stock _forward: (B, 1, T, T) and (B, 1, T, src_len)
        dec_mask = self._compute_dec_mask(tgt_pad_mask, future).unsqueeze(1)
        dec_mask = dec_mask.expand(-1, -1, dec_mask.size(3), -1)
        src_pad_mask = src_pad_mask.expand(-1, -1, dec_mask.size(3), -1)
    self_out, _ = self._forward_self_attn(layer_in, dec_mask, step, return_attn=return_attn)
    query = self.layer_norm_1(layer_in + _dropped(self, self_out))
    context, attns = self.context_attn(enc_out, enc_out, query, mask=src_pad_mask, return_attn=return_attn)
    return post_norm_feed_forward(self.feed_forward, self.layer_norm_2(query + _dropped(self, context))), attns


@lru_cache(maxsize=None)
def post_norm_classes():
    """``{stock layer class: its post-norm subclass}`` for OpenNMT-py's encoder and decoder layers."""
    from onmt.decoders.transformer import TransformerDecoderLayer
    from onmt.encoders.transformer import TransformerEncoderLayer

    encoder = type("PostNormEncoderLayer", (TransformerEncoderLayer,),
                   {"forward": _encoder_layer_forward, "__module__": __name__,
                    "__doc__": "OpenNMT-py's encoder layer, normalising after each sublayer (``-ext_layer_norm "
                               "post``)."})
    decoder = type("PostNormDecoderLayer", (TransformerDecoderLayer,),
                   {"_forward": _decoder_layer_forward, "__module__": __name__,
                    "__doc__": "OpenNMT-py's decoder layer, normalising after each sublayer (``-ext_layer_norm "
                               "post``)."})
    return {TransformerEncoderLayer: encoder, TransformerDecoderLayer: decoder}


def _attach(stack, layers, config):
    """With ``post``: every layer of ``layers`` becomes its post-norm class (same sub-modules and parameters),
    and the stack's final ``layer_norm`` the identity."""
    if config.of(Normalisation).norm != "post":
        return
    classes = post_norm_classes()
    for layer in layers:
        if type(layer) not in classes:
            raise ValueError(f"-ext_layer_norm post: no post-norm form of {type(layer).__name__}")
        layer.__class__ = classes[type(layer)]  # only forward differs: the layer keeps its modules and state
    stack.layer_norm = nn.Identity()


def attach_encoder(encoder, config):
    """``-ext_layer_norm post`` in the encoder (runs before the mechanisms attach)."""
    _attach(encoder, encoder.transformer, config)


def attach_decoder(decoder, config):
    """``-ext_layer_norm post`` in the decoder (runs before the mechanisms attach)."""
    _attach(decoder, decoder.transformer_layers, config)


def post_norm(config):
    """True when ``config`` (an :class:`~onmt_ext.options.ExtConfig`) asks for post-norm layers."""
    return config.of(Normalisation).norm == "post"


def _combination_check(opt):
    if Normalisation.from_opt(opt).norm != "post":
        return []
    problems = [f"-ext_layer_norm post needs -{side}_type {EXT_TYPE} (a stock side would stay pre-norm)"
                for side in ("encoder", "decoder") if getattr(opt, f"{side}_type", None) != EXT_TYPE]
    if getattr(opt, "parallel_residual", False):
        problems.append("-ext_layer_norm post does not support -parallel_residual (a pre-norm layout)")
    if getattr(opt, "num_experts", 0):
        problems.append("-ext_layer_norm post does not support -num_experts (mixture-of-experts feed-forward)")
    return problems + tensor_parallel_problems(opt, "-ext_layer_norm post")


@register_mechanism("ext_layer_", combination_check=_combination_check)
@dataclass(frozen=True)
class Normalisation:
    """``-ext_layer_norm``."""

    norm: str = option("pre", "where each Transformer sublayer normalises: pre (OpenNMT-py: x + F(LN(x)), and a "
                       "final layer norm per stack) or post (Vaswani et al. 2017 sec. 3.1: LN(x + F(x)), no final "
                       "layer norm); which paper used which: docs/normalisation.md", choices=PLACEMENTS)
