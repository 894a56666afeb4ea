"""DiSAN-style directional self-attention: the "+DiSAN" baseline of chen2019's Table 1 (after Shen et al. 2018).

In each selected encoder layer (``disan_enc_layers``) the first H/2 heads use the forward mask (query l attends
key t only if t < l) and the others the backward mask (t > l), on top of the padding mask in the scores
``(batch, H, len, len)``; a query with no allowed key gets an all-zero attention row
(:class:`DirectionalSoftmax`, core :func:`directional_softmax`).

Fusion gate (:class:`FusionGate`, ``disan_fusion_gate``): with ``s`` the attention sublayer's output (after W^O)
and ``h`` its layer-normalised input, both ``(batch, len, d)``, ``F = sigmoid(W_1 s + W_2 h + b)`` and the
sublayer returns ``F * h + (1 - F) * s``; it adds ``2 d^2 + d`` parameters per layer.

DiSAN's feature-wise scores, input layer and source2token pooling are not implemented: docs/chen2019.md.
"""

from dataclasses import dataclass
from typing import List

import torch
import torch.nn as nn

from onmt_ext.runtime import compile as ext_compile
from onmt_ext.mechanisms import initialisation
from onmt_ext.options import (layers_check, option, options_without_effect, register_mechanism, selected_layers,
                              tensor_parallel_problems)

_MASKED_BELOW = -1e17  # OpenNMT-py fills masked scores with -1e18


def directional_mask(length, heads, device=None):
    """``(heads, len, len)`` bool, True where query l may attend key t: t < l for the first H/2 heads, t > l after."""
    positions = torch.arange(length, device=device)
    forward = positions[None, :] < positions[:, None]  # key before query
    backward = positions[None, :] > positions[:, None]
    half = heads // 2
    return torch.cat([forward.expand(half, -1, -1), backward.expand(heads - half, -1, -1)])


class DirectionalSoftmax(nn.Module):
    """Softmax over the keys allowed by the directional masks; rows without any allowed key are zero.

    ``forward(scores)`` maps the masked scores ``(batch, H, len, len)`` to
    attention probabilities of the same shape (:func:`directional_softmax`,
    compiled with ``-ext_compile``).
    """

    ext_compile = False

    def __init__(self, heads):
        super().__init__()
        self.heads = heads

    def forward(self, scores):
        return ext_compile.run(self.ext_compile, directional_softmax, scores, self.heads)


def directional_softmax(scores, heads):
    """Softmax of ``scores`` ``(batch, H, len, len)`` over the keys the directional masks allow; empty rows are 0."""
    allowed = directional_mask(scores.size(-1), heads, scores.device) & (scores > _MASKED_BELOW)
    probs = torch.softmax(scores.masked_fill(~allowed, -1e18), dim=-1)
    return probs * allowed.any(dim=-1, keepdim=True)


class FusionGate(nn.Module):
    """Wraps a layer's ``self_attn``: ``F * h + (1 - F) * s`` with ``F = sigmoid(W_1 s + W_2 h + b)``.

    Args:
        attention: the layer's ``MultiHeadedAttention``.
        d_model: d.

    ``forward`` takes the arguments of ``MultiHeadedAttention.forward``
    (``key, value, query, ...``) and returns ``(gated output (batch, len, d),
    attention)``; ``h`` is the query input.
    """

    def __init__(self, attention, d_model):
        super().__init__()
        self.attention = attention
        self.gate_s = nn.Linear(d_model, d_model)  # W_1, b
        self.gate_h = nn.Linear(d_model, d_model, bias=False)  # W_2

    def forward(self, key, value, query, *args, **kwargs):
        s, attn = self.attention(key, value, query, *args, **kwargs)
        h = query.to(s.dtype)
        gate = torch.sigmoid(self.gate_s(s) + self.gate_h(h))
        return torch.lerp(s, h, gate), attn

    def update_dropout(self, dropout):
        self.attention.update_dropout(dropout)

    def __getattr__(self, name):  # attributes OpenNMT-py reads on self_attn (e.g. self_attn_type)
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("attention"), name)


def _combination_check(opt):
    problems = []
    if not Disan.from_opt(opt).enc:
        return options_without_effect(opt, Disan.specs[1:], "-disan_enc is false")
    if getattr(opt, "heads", 2) % 2:
        problems.append(f"-disan_enc splits the heads into forward and backward halves: -heads {opt.heads} is odd")
    return problems + tensor_parallel_problems(opt, "-disan_enc (it assigns a direction to every head)")


def _fusion_gate_rules(module):
    """The gate maps initialise as stock linears; the attention the gate wraps is the stock one."""
    rules = {f"attention.{name}": initialisation.STOCK for name, _ in module.attention.named_parameters()}
    return {**rules, "gate_s.weight": initialisation.GLOROT, "gate_s.bias": initialisation.ZEROS,
            "gate_h.weight": initialisation.GLOROT}


initialisation.register("onmt_ext.mechanisms.disan.FusionGate", _fusion_gate_rules)


@register_mechanism("disan_", combination_check=_combination_check)
@dataclass(frozen=True)
class Disan:
    """The DiSAN baseline's options, ``-disan_<field>``."""

    enc: bool = option(False, "DiSAN-style directional self-attention in the encoder (chen2019's '+DiSAN' "
                       "baseline): forward- and backward-masked heads", side="encoder")
    enc_layers: List[int] = option([], "DiSAN: encoder layers (1-based); empty: all", side="encoder",
                                   check=layers_check("enc"))
    fusion_gate: bool = option(True, "DiSAN: the fusion gate F * h + (1 - F) * s on the attention sublayer",
                               side="encoder")


def attach_encoder(encoder, config):
    """With ``disan_enc``: directional masks (and the fusion gate) in the selected encoder self-attentions."""
    disan = config.of(Disan)
    if not disan.enc:
        return
    layers = encoder.transformer
    for i in selected_layers(disan.enc_layers, len(layers)):
        attention = layers[i].self_attn
        attention.softmax = DirectionalSoftmax(config.heads)
        attention.self_attn_type = "scaled-dot"  # the fused SDPA/flash path never forms the scores
        if disan.fusion_gate:
            layers[i].self_attn = FusionGate(attention, config.d_model)
