"""Cross aggregation of multi-head attention logits (Cao, Zhao and Yu, "cao2019").

The masked scores ``E`` ``(batch, H, L, M)`` become ``softmax(E + Omega_vertical + Omega_horizontal)`` (eq. 9),
with the logit vectors ``e_{l,h}`` ``(M,)`` as votes and simple routing normalised over the inputs (Alg. 1):

* vertical (eq. 10-13): H heads -> L positions; head h receives the ``(L, M)`` output scaled by
  ``Lambda = softmax(W [sum_l B_{1->l}, ..., sum_l B_{H->l}])``, W ``(H, H)`` per layer, zero at the start;
* horizontal (eq. 14): for each query l, positions t <= l -> H heads, all L routings in one call against a
  ``(batch, L, L)`` prefix mask; routing logits start at zero or at the raw logits (eq. 15).

:class:`CrossAggregation` replaces the ``softmax`` of the selected encoder self-attentions (forced onto
``scaled-dot``); :func:`cross_aggregate` is its tensor core.  :class:`CausalCrossAggregation`
(``cao2019_dec_self``, not in the paper) is the decoder variant, with :func:`causal_step` for one decoding step.
Scaling of the logits, padding, cost and the causal variant: docs/cao2019.md.
"""

from dataclasses import dataclass
from typing import List

import torch
import torch.nn as nn
import torch.nn.functional as F

from onmt_ext.runtime import compile as ext_compile
from onmt_ext.mechanisms import initialisation
from onmt_ext.options import (EXT_TYPE, layers_check, option, options_without_effect, register_mechanism,
                              selected_layers, tensor_parallel_problems)
from onmt_ext.mechanisms.routing import (_check_iterations, at_least_float32, coupling_coefficients, prepare_kernels,
                                         simple_routing, without_autocast)
from onmt_ext.mechanisms.state import DecodingStateModule

# OpenNMT-py fills masked scores with -1e18 before the softmax.
_MASKED_BELOW = -1e17
INITS = ("zero", "self")
SCALES = ("model", "head")


class CrossAggregation(nn.Module):
    """``softmax(E + Omega_vertical + Omega_horizontal)`` over the keys (cao2019 eq. 9-15).

    Args:
        heads: H.
        vertical: add the vertical routing output (eq. 10-13).
        horizontal: add the positional horizontal routing output (eq. 14).
        init: ``"zero"`` or ``"self"`` (eq. 15) routing logits of the horizontal routing.
        iterations: routing iterations T.
        scale: ``"head"`` (default: OpenNMT-py's ``1 / sqrt(d / H)`` as
            they come, the stock baseline's scale) or ``"model"`` (eq. 4
            read literally: ``1 / sqrt(d)``, the scores times
            ``1 / sqrt(H)``); :func:`logit_factor`.

    ``forward(scores)`` takes the masked scores ``(batch, H, L, L)`` of a
    self-attention (masked entries at OpenNMT-py's -1e18) and returns the
    attention probabilities ``(batch, H, L, L)``; it replaces
    ``MultiHeadedAttention.softmax``.
    """

    ext_compile = False

    def __init__(self, heads, vertical, horizontal, init="zero", iterations=3, scale="head"):
        super().__init__()
        if not (vertical or horizontal):
            raise ValueError("cross aggregation needs the vertical or the horizontal routing (or both)")
        if init not in INITS or scale not in SCALES:
            raise ValueError(f"init must be one of {INITS} and scale one of {SCALES}, got {init!r}, {scale!r}")
        self.heads, self.vertical, self.horizontal = heads, vertical, horizontal
        self.init, self.iterations = init, iterations
        self.scale, self.factor = scale, logit_factor(scale, heads)
        if vertical:
            self.head_weight = nn.Parameter(torch.zeros(heads, heads))  # W of eq. 13
        initialisation.initialise(self)

    def forward(self, scores):
        prepare_kernels(scores)  # before the core, which -ext_compile traces and a trace cannot import them
        return ext_compile.run(self.ext_compile, cross_aggregate, scores, self.head_weight if self.vertical else None,
                               self.horizontal, self.init, self.iterations, factor=self.factor)


def logit_factor(scale, heads):
    """The factor from OpenNMT-py's scores (``Q_h K_h^T / sqrt(d / H)``) to the E the routing reads.

    eq. 9-15 use one E throughout: as the votes, as the self-initialised
    routing logits and as the base of ``E_hat``.  ``head`` (default) keeps
    OpenNMT-py's (and Vaswani et al.'s) ``1 / sqrt(d_k)``: eq. 4 restates
    the stock attention of the paper's OpenNMT-py baseline, so with the
    routing outputs at zero the layer is that baseline.  ``model`` reads
    eq. 4's ``sqrt(d)`` as the model size (``1 / sqrt(H)``), which would also
    soften the baseline part of ``E_hat`` (docs/cao2019.md).
    """
    return heads ** -0.5 if scale == "model" else 1.0


def _eq4(scores, factor):
    """E of eq. 4 in (at least) float32 from OpenNMT-py's masked scores; masked entries stay at -1e18."""
    scores = at_least_float32(scores)
    if factor == 1.0:
        return scores
    return torch.where(scores <= _MASKED_BELOW, scores, scores * factor)


@without_autocast
def cross_aggregate(scores, head_weight, horizontal, init, iterations, causal=False, factor=1.0):
    """``softmax(E + Omega_vertical + Omega_horizontal)`` (eq. 9); see :class:`CrossAggregation`.

    Args:
        scores: masked self-attention scores ``(batch, H, L, L)``.
        head_weight: W of eq. 13 ``(H, H)``; None: no vertical routing.
        horizontal: add the positional horizontal routing (eq. 14).
        init: ``"zero"`` or ``"self"`` (eq. 15).
        iterations: T.
        causal: eq. 13's sum over positions runs over l' <= l (decoder
            self-attention; the scores then carry OpenNMT-py's future mask).
        factor: applied to the scores to give eq. 4's E (:func:`logit_factor`).

    Returns:
        attention probabilities ``(batch, H, L, L)`` in the dtype of
        ``scores``.  All of the arithmetic runs in float32 (float64 for
        float64 scores), autocast or not.
    """
    batch, heads, length, keys = scores.shape
    if length != keys or (head_weight is not None and head_weight.size(0) != heads):
        raise ValueError(f"cross aggregation expects self-attention scores (batch, heads, L, L), "
                         f"got {tuple(scores.shape)}")
    energies = _eq4(scores, factor)
    logits, valid = _votes_and_positions(energies)
    total = energies
    if head_weight is not None:
        total = total + vertical_output(logits, valid, at_least_float32(head_weight), iterations, causal)
    if horizontal:
        total = total + horizontal_output(logits, valid, init, iterations)
    return _probabilities(total, scores.dtype)


def _probabilities(total, dtype):
    """``softmax(E_hat)`` over the keys, in the dtype of the scores.

    Callers compute E_hat in float32 with autocast off (:func:`onmt_ext.mechanisms.routing.without_autocast`);
    the attention probabilities go back to the dtype of the scores.
    """
    return torch.softmax(total, dim=-1).to(dtype)


def _votes_and_positions(scores):
    """E with masked keys zeroed (the votes of both routings) ``(B, H, L, L)``; the non-padding positions ``(B, L)``.

    A position is padding when its key is masked for the last query: OpenNMT-py masks padding keys in every row,
    and the last row of a causal mask masks no other key (read from one row: one operator, not three).
    """
    masked = scores <= _MASKED_BELOW
    return scores.masked_fill(masked, 0.0), ~masked[:, 0, -1]


def vertical_output(logits, valid, head_weight, iterations, causal=False):
    """Omega_vertical ``(B, H, L, L)``: heads -> positions routing (eq. 10-11), scaled per head (eq. 12-13).

    With ``causal`` the head weights of position l use the routing logits of
    positions l' <= l only: ``Lambda`` is then ``(B, L, H)``.
    """
    out, routing_logits = simple_routing(logits, iterations, normalize="inputs")  # (B, L, M), (B, H, L)
    routing_logits = routing_logits * valid[:, None, :]
    weight = head_weight.t().to(routing_logits.dtype)
    if causal:
        lam = torch.softmax(routing_logits.cumsum(dim=-1).transpose(1, 2) @ weight, dim=-1)  # (B, L, H)
        return lam.transpose(1, 2)[..., None] * out[:, None]
    lam = torch.softmax(routing_logits.sum(dim=-1) @ weight, dim=-1)  # (B, H)
    return lam[:, :, None, None] * out[:, None]


def horizontal_output(logits, valid, init, iterations):
    """Omega_horizontal ``(B, H, L, L)``: for each l, positions t <= l -> heads routing (eq. 14-15)."""
    votes, mask, init_logits = _horizontal_problem(logits, valid, init)
    out, _ = simple_routing(votes, iterations, normalize="inputs", init_logits=init_logits, mask=mask)
    return out.permute(0, 2, 1, 3)  # (B, L_l, H, M) -> (B, H, L_l, M)


def _horizontal_problem(logits, valid, init):
    """The L routings of eq. 14 as one: votes ``(B, 1, L_t, H, M)`` shared by every query l, the prefix
    mask ``(B, L_l, L_t)`` and the starting logits ``(B, L_l, L_t, H)`` (None for zero initialisation)."""
    votes = logits.permute(0, 2, 1, 3).unsqueeze(1)
    mask = _prefix(logits.size(-2), logits.device)[None] & valid[:, None, :]
    init_logits = logits.permute(0, 2, 3, 1) if init == "self" else None  # alpha^h_{l,t}
    return votes, mask, init_logits


_PREFIXES = {}  # device -> the largest (n, n) lower-triangular bool matrix made so far on it


def _prefix(length, device):
    """The ``(length, length)`` lower-triangular bool matrix (t <= l): a view of one matrix kept per device, made
    again only for a longer length (two operators a layer fewer); built in place under torch.compile."""
    if torch.compiler.is_compiling():
        return torch.ones(length, length, dtype=torch.bool, device=device).tril()
    kept = _PREFIXES.get(device)
    if kept is None or kept.size(0) < length:
        with torch.inference_mode(False):
            kept = _PREFIXES[device] = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    return kept[:length, :length]


def routing_weights(scores, iterations, init="zero", factor=1.0):
    """The coupling coefficients C of iteration T of both routings, for cao2019's near-zero observation.

    Section 4 of the paper reports that with T = 4 or 5 "over half of the
    vote vectors' weights come out to be zero".  This recomputes, from the
    masked scores ``(batch, H, L, L)`` a layer saw, the logits after T - 1
    iterations with the same routing core and turns them into the coupling
    of the T-th iteration (:func:`onmt_ext.mechanisms.routing.coupling_coefficients`).
    Padding is left out: only non-padding query positions, and for the
    horizontal routing only the keys t <= l that are not padding.

    ``factor`` turns the scores into eq. 4's E (:func:`logit_factor`, the
    layer's ``factor`` attribute).

    Returns:
        ``{"vertical": (n,), "horizontal": (n',)}``: every coupling
        coefficient that takes part, flattened (vertical: H per position,
        summing to 1; horizontal: l + 1 inputs per head and position l).
    """
    _check_iterations(iterations)
    logits, valid = _votes_and_positions(_eq4(scores, factor))
    if iterations == 1:
        vertical_logits = logits.new_zeros(logits.shape[:-1])
    else:
        _, vertical_logits = simple_routing(logits, iterations - 1, normalize="inputs")  # (B, H, L)
    vertical = coupling_coefficients(vertical_logits, "inputs").transpose(1, 2)[valid]  # (n, H)
    votes, mask, init_logits = _horizontal_problem(logits, valid, init)
    if iterations == 1:
        horizontal_logits = init_logits if init_logits is not None else votes.new_zeros(mask.shape + votes.shape[-2:-1])
    else:
        _, horizontal_logits = simple_routing(votes, iterations - 1, normalize="inputs", init_logits=init_logits,
                                              mask=mask)
    horizontal = coupling_coefficients(horizontal_logits, "inputs", mask)  # (B, L_l, L_t, H)
    taking_part = (mask & valid[:, :, None])[..., None].expand_as(horizontal)
    return {"vertical": vertical.reshape(-1), "horizontal": horizontal[taking_part]}


class CausalCrossAggregation(CrossAggregation, DecodingStateModule):
    """Cross aggregation in decoder self-attention (the causal variant; see the module docstring).

    Same arguments as :class:`CrossAggregation`.  ``forward(scores)`` takes
    the masked scores ``(batch, H, L, L)`` of a full (teacher-forced) pass, or
    ``(batch, H, 1, l + 1)`` for decoding step l when ``stepwise`` is set by
    the decoder; it returns the attention probabilities of the same shape.
    Decoding state: ``rows`` ``(batch, H, l, l)``, the masked logits of the
    earlier steps (zero where masked), and ``routing_sum`` ``(batch, H)``, the
    running sum of eq. 13.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)  # CrossAggregation's; the MRO also runs DecodingStateModule's
        self.stepwise = False

    def forward(self, scores):
        head_weight = self.head_weight if self.vertical else None
        prepare_kernels(scores)
        if not self.stepwise:
            return ext_compile.run(self.ext_compile, cross_aggregate, scores, head_weight, self.horizontal, self.init,
                                   self.iterations, causal=True, factor=self.factor)
        if scores.size(2) != 1:
            raise ValueError(f"step-by-step cross aggregation expects one query, got scores {tuple(scores.shape)}")
        previous = self.decoding_state.get("rows")
        if previous is None:
            previous = scores.new_zeros(scores.size(0), scores.size(1), 0, scores.size(-1))
        routing_sum = self.decoding_state.get("routing_sum")
        if routing_sum is None:
            routing_sum = scores.new_zeros(scores.size(0), scores.size(1), dtype=torch.float32)
        probabilities, rows, routing_sum = ext_compile.run(
            self.ext_compile, causal_step, scores, previous, routing_sum, head_weight, self.horizontal, self.init,
            self.iterations, factor=self.factor)
        self.decoding_state["rows"] = rows
        if head_weight is not None:
            self.decoding_state["routing_sum"] = routing_sum
        return probabilities


@without_autocast
def causal_step(scores, previous, routing_sum, head_weight, horizontal, init, iterations, factor=1.0):
    """One decoding step of :class:`CausalCrossAggregation`: the last row of the full causal pass.

    Args:
        scores: masked scores of step l ``(batch, H, 1, l + 1)``.
        previous: masked logits of the earlier steps ``(batch, H, l, M')``,
            zero where masked (``M' <= l + 1`` keys).
        routing_sum: running sum of eq. 13 over the earlier steps ``(batch, H)``.
        head_weight, horizontal, init, iterations, factor: as :func:`cross_aggregate`.

    Returns:
        the attention probabilities ``(batch, H, 1, l + 1)``, the rows (of E, eq. 4, at least float32) with
        this step's appended ``(batch, H, l + 1, l + 1)`` and the new running
        sum ``(batch, H)`` (unchanged without the vertical routing).
    """
    energies = _eq4(scores, factor)
    row = energies.masked_fill(energies <= _MASKED_BELOW, 0.0)  # (B, H, 1, M)
    keys = row.size(-1)
    rows = torch.cat([F.pad(previous.to(row.dtype), (0, keys - previous.size(-1))), row], dim=2)
    total = energies
    if head_weight is not None:
        out, routing_logits = simple_routing(row, iterations, normalize="inputs")  # (B, 1, M), (B, H, 1)
        routing_sum = routing_logits[..., 0] + at_least_float32(routing_sum)
        lam = torch.softmax(routing_sum @ head_weight.t().to(routing_sum.dtype), dim=-1)  # (B, H)
        total = total + lam[:, :, None, None] * out[:, None]
    if horizontal:
        votes = rows.permute(0, 2, 1, 3)  # (B, t = l + 1, H, M)
        init_logits = row[:, :, 0, :].permute(0, 2, 1) if init == "self" else None  # alpha^h_{l,t}: (B, t, H)
        out, _ = simple_routing(votes, iterations, normalize="inputs", init_logits=init_logits)  # (B, H, M)
        total = total + out[:, :, None, :]
    return _probabilities(total, scores.dtype), rows, routing_sum


initialisation.register("onmt_ext.mechanisms.cao2019.CrossAggregation",
                        lambda m: {"head_weight": initialisation.ZEROS} if m.vertical else {})


def _combination_check(opt):
    problems = []
    cao2019 = Cao2019.from_opt(opt)
    used = cao2019.vertical or cao2019.horizontal
    if used and getattr(opt, "encoder_type", None) != EXT_TYPE and not cao2019.dec_self:
        problems.append(f"-cao2019_vertical/-cao2019_horizontal have no effect with -encoder_type "
                        f"{getattr(opt, 'encoder_type', None)!r} and -cao2019_dec_self false; set -encoder_type "
                        f"{EXT_TYPE}")
    if cao2019.dec_self and getattr(opt, "self_attn_type", "") == "average":
        problems.append("-cao2019_dec_self needs multi-head decoder self-attention, not -self_attn_type average")
    if not used:
        return problems + options_without_effect(opt, Cao2019.specs[2:], "-cao2019_vertical and "
                                                 "-cao2019_horizontal are both false")
    if not cao2019.dec_self:
        problems += options_without_effect(opt, [Cao2019.spec_of["dec_layers"]], "-cao2019_dec_self is false")
    if cao2019.init != Cao2019.init and not cao2019.horizontal:  # set away from its default
        problems.append("-cao2019_init applies to the horizontal routing; it has no effect without "
                        "-cao2019_horizontal true")
    return problems + tensor_parallel_problems(opt, "-cao2019_* cross aggregation (it routes across all heads)")


@register_mechanism("cao2019_", combination_check=_combination_check)
@dataclass(frozen=True)
class Cao2019:
    """cao2019's options, ``-cao2019_<field>``."""

    vertical: bool = option(False, "cao2019: vertical routing (heads -> positions) of the encoder self-attention "
                            "logits (and decoder self-attention with -cao2019_dec_self)")
    horizontal: bool = option(False, "cao2019: positional horizontal routing (positions t <= l -> heads) of the "
                              "encoder self-attention logits (and decoder self-attention with -cao2019_dec_self)")
    init: str = option("zero", "cao2019: initial logits of the horizontal routing: zero, or self (the raw "
                       "attention logits, eq. 15)", choices=INITS)
    scale: str = option("head", "cao2019: scale of the attention logits E the routing reads and adds to: head "
                        "(OpenNMT-py's Q_h K_h^T / sqrt(d / H), the baseline's) or model (eq. 4 read literally, "
                        "/ sqrt(d))", choices=SCALES)
    iterations: int = option(3, "cao2019: routing iterations T",
                             check=lambda v, opt: None if v >= 1 else "must be >= 1")
    enc_layers: List[int] = option([], "cao2019: encoder layers (1-based) with cross aggregation; empty: all",
                                   side="encoder", check=layers_check("enc"))
    dec_self: bool = option(False, "cao2019: also in decoder self-attention (a causal variant; not in the paper)",
                            side="decoder")
    dec_layers: List[int] = option([], "cao2019: decoder layers (1-based) with -cao2019_dec_self; empty: all",
                                   side="decoder", check=layers_check("dec"))


def _attach(attentions, selected, module_class, cao2019, heads):
    for i in selected_layers(selected, len(attentions)):
        attention = attentions[i]
        attention.softmax = module_class(heads, cao2019.vertical, cao2019.horizontal, cao2019.init,
                                         cao2019.iterations, cao2019.scale)
        # the fused SDPA/flash path on GPU never forms the scores: take the explicit one
        attention.self_attn_type = "scaled-dot"


def attach_encoder(encoder, config):
    """Replace the softmax of the selected encoder self-attentions and force their explicit path."""
    cao2019 = config.of(Cao2019)
    if cao2019.vertical or cao2019.horizontal:
        _attach([layer.self_attn for layer in encoder.transformer], cao2019.enc_layers, CrossAggregation, cao2019,
                config.heads)


def attach_decoder(decoder, config):
    """With ``cao2019_dec_self``: the causal variant in the selected decoder self-attentions."""
    cao2019 = config.of(Cao2019)
    if (cao2019.vertical or cao2019.horizontal) and cao2019.dec_self:
        _attach([layer.self_attn for layer in decoder.transformer_layers], cao2019.dec_layers,
                CausalCrossAggregation, cao2019, config.heads)
