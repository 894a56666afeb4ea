"""Clause attention in the encoder ("Clause Attention based on Signal Words Division", sec. 3.2, eq. 3-5).

Clauses (eq. 3): at level l a marker of the ``clause_split`` transform (:mod:`onmt_ext.mechanisms.clause.split`) of
level <= l opens a clause; :func:`clause_ids` gives ids ``(batch, L, len)`` from the token ids (padding -1).
Attention (eq. 4-5): from the masked scores ``E`` ``(batch, heads, len, len)``, ``g = softmax(E)`` and
``b^l = softmax(E)`` over the keys in the query's clause of level l combine as::

    A_L = b^L,   A_l = (1 - p_{l+1}) b^l + p_{l+1} A_{l+1},   Y = (1 - p_1) g + p_1 A_1

``-clause_mixing``: ``scalar`` ``p_{l,h} = sigmoid(theta_{l,h})``, or ``gate``
``p_{l,h} = sigmoid(w_{l,h} . x_q + c_{l,h})`` from the layer's normalised input; both start at 1/2.
:class:`ClauseAttention` replaces the ``softmax`` of ``MultiHeadedAttention`` (forced onto ``scaled-dot``);
:func:`clause_mix` is its tensor core.  Markers stay in the input as ordinary tokens.  Details: docs/clause.md.
"""

import contextlib
import os
from dataclasses import dataclass
from typing import List

import torch
import torch.nn as nn

from onmt_ext.runtime import compile as ext_compile
from onmt_ext.mechanisms import initialisation
from onmt_ext.errors import UsageError
from onmt_ext.options import (layers_check, option, options_without_effect, register_mechanism,
                              selected_layers, tensor_parallel_problems)
from onmt_ext.patches import NEEDED, patch

# OpenNMT-py (and onmt_ext.mechanisms.clause.split, which imports it) is imported inside the functions: importing it
# while this module initialises would activate onmt-ext (onmt_ext._autoload) before this module is whole.

MIXINGS = ("scalar", "gate")
TRANSFORM = "clause_split"
_MASKED = -1e18  # the fill OpenNMT-py uses for masked scores (scores are float32 there)

# ---------------------------------------------------------------------------
# The vocabularies of the model being built.  The encoder's ``from_opt`` gets
# no vocabulary, but it needs the ids of the markers; :func:`tell_builders_the_vocabs` wraps
# ``onmt.model_builder.build_base_model`` in :func:`building_with`.

_VOCABS = []


@contextlib.contextmanager
def building_with(vocabs):
    """Make ``vocabs`` (OpenNMT-py's vocab dict) visible to modules built inside the block."""
    _VOCABS.append(vocabs)
    try:
        yield
    finally:
        _VOCABS.pop()


def marker_level_table(src_vocab, levels):
    """``(vocab_size,)`` long tensor: the split level of each marker id (<= ``levels``), 0 elsewhere.

    Raises :class:`ValueError` if the vocabulary holds none of the markers.
    """
    from onmt_ext.mechanisms.clause.split import marker_tokens

    ids_to_tokens = src_vocab.ids_to_tokens
    table = torch.zeros(len(ids_to_tokens), dtype=torch.long)
    found = 0
    for level, token in enumerate(marker_tokens(levels), start=1):
        index = src_vocab.lookup_token(token)
        if 0 <= index < len(ids_to_tokens) and ids_to_tokens[index] == token:
            table[index] = level
            found += 1
    if not found:
        raise ValueError(f"-clause_attention: the source vocabulary has no clause marker "
                         f"({', '.join(marker_tokens(levels))}); build it with -transforms listing {TRANSFORM}")
    return table


def _opening(token_levels, levels):
    """``(..., len, L + 1)`` bool: whether each token may open a clause at level 0..L (1 <= its level <= l).

    Level 0 stands for the global attention: nothing opens a clause there, so every token has the id 0.
    """
    limits = torch.arange(levels + 1, device=token_levels.device)
    return (token_levels[..., None] > 0) & (token_levels[..., None] <= limits)


def _ids_from_opening(opening, pad_mask):
    """Clause ids ``(batch, L + 1, len)`` (a view; level 0 all 0) from :func:`_opening`'s ``(batch, len, L + 1)``,
    which it overwrites: a marker in first position opens no clause; padding gets -1 at levels 1..L."""
    opening[:, :1] = False
    ids = opening.cumsum(dim=1).transpose(1, 2)  # cumsum of bools counts in int64
    if pad_mask is not None:
        ids[:, 1:].masked_fill_(pad_mask[:, None, :], -1)
    return ids


def clause_ids(token_levels, levels, pad_mask=None):
    """Clause id of every token at every level, ``(batch, levels, len)`` (eq. 3).

    Args:
        token_levels: ``(batch, len)`` split level of each token (0: not a marker).
        levels: L, the number of levels used.
        pad_mask: ``(batch, len)`` True at padding; padded positions get the id -1.
    """
    return _ids_from_opening(_opening(token_levels, levels), pad_mask)[:, 1:]


def level_matrix(levels):
    """The ``(L + 1, 2L)`` matrix ``K`` of :meth:`ClauseAttention.level_weights`: ``log w = K [log p; theta]``.

    Row j < L holds ones at ``log p_1 .. log p_{j+1}`` and -1 at ``theta_{j+1}``; row L ones at every ``log p``.
    """
    rows = torch.arange(levels + 1)[:, None]
    matrix = torch.cat([(torch.arange(levels)[None, :] <= rows).float(),
                        -(torch.arange(levels)[None, :] == rows).float()], dim=1)
    return matrix


class ClauseStructure(nn.Module):
    """The clause ids of the current source batch, shared by the encoder's clause attentions.

    Args:
        level_table: ``(vocab_size,)`` split level of each source id (:func:`marker_level_table`).
        levels: L.

    ``start(src, pad_mask)`` computes, for the batch the encoder is about to read, ``ids`` ``(batch, L, len)``
    in four operators (a vocabulary-sized table of which levels each id opens, indexed once); every layer
    shares them and the :meth:`outside_bias` derived from them on first use, and the scalar level weights of
    every layer, computed together on first use (:meth:`scalar_weights`).  Nothing is read back to the
    host: every level gets its own local softmax, also where a level repeats a coarser level's clauses in every
    sentence of the batch (finding that out would wait for the device at every batch).  The tables are
    non-persistent buffers, rebuilt from the vocabulary whenever the model is built.
    """

    def __init__(self, level_table, levels):
        super().__init__()
        self.levels = levels
        self.register_buffer("level_table", level_table, persistent=False)
        self.register_buffer("opening_table", _opening(level_table, levels), persistent=False)  # (vocab, L + 1)
        self.register_buffer("weight_matrix", level_matrix(levels), persistent=False)  # K, (L + 1, 2L)
        self.ids = None
        self._all_ids = None
        self._outside_bias = None
        self._mixers = []  # the scalar ClauseAttentions of this structure (a list: not sub-modules)
        self._weights = None

    def start(self, src, pad_mask):
        """Set the clause structure from ``src`` ``(batch, len, feats)`` and ``pad_mask`` ``(batch, len)``."""
        self._all_ids = _ids_from_opening(self.opening_table[src[:, :, 0]], pad_mask)  # (batch, L + 1, len)
        self.ids = self._all_ids[:, 1:]
        self._outside_bias = None
        self._weights = None

    def add_mixer(self, attention):
        """Register a scalar-mixing :class:`ClauseAttention`; returns its index for :meth:`scalar_weights`."""
        self._mixers.append(attention)
        self._weights = None
        return len(self._mixers) - 1

    def scalar_weights(self, index):
        """The level weights ``(L + 1, H)`` of scalar mixer ``index``: :meth:`ClauseAttention.level_weights` of
        every mixer at once, ``(L + 1, mixers, H)``, on the first call after :meth:`start` (6 operators and 5 in
        the backward pass, in place of that many per layer); again when a parameter was replaced or changed in
        place (its version, a host counter), or the grad mode changed."""
        params = [mixer.mix_logits for mixer in self._mixers]
        key = (torch.is_grad_enabled(), *(param._version for param in params))
        cached = self._weights
        if cached is None or cached[0] != key or any(a is not b for a, b in zip(cached[1], params)):
            logits = torch.stack(params, dim=1).float()  # (L, mixers, H)
            weights = ClauseAttention.level_weights(logits, self.weight_matrix)  # (L + 1, mixers, H)
            self._weights = cached = key, params, weights.unbind(1)  # one operator back: a stack
        return cached[2][index]

    def outside_bias(self):
        """``(batch, L + 1, len, len)`` score bias per level: -1e18 where the key lies outside the query's clause,
        else (-)0; level 0, the global attention, is 0 everywhere.

        Adding a bias leaves the inside scores exact and, unlike ``masked_fill``, costs no masking pass in the
        backward.  ``outside * -1e18`` is one operator; its -0.0 inside a clause adds as +0.0 does.
        """
        if self._outside_bias is None:
            ids = self._all_ids
            self._outside_bias = (ids[:, :, :, None] != ids[:, :, None, :]) * _MASKED
        return self._outside_bias


class ClauseAttention(nn.Module):
    """Replacement of an attention's softmax: global and clause-local attention mixed (eq. 4-5).

    Args:
        structure (ClauseStructure): where the batch's clause ids are read.
        heads: H.
        mixing: ``"scalar"`` or ``"gate"`` (module docstring).
        d_model: size of the layer input (for ``gate``).

    ``forward(scores)`` maps the masked scores ``(batch, H, len, len)`` to
    the mixed attention probabilities, same shape, through :func:`clause_mix`
    (compiled with ``-ext_compile``).  With ``gate``, a forward pre-hook on
    the attention (:meth:`remember_query`) keeps the query input.
    """

    ext_compile = False
    #: outside ``-ext_compile_layers``'s layer graphs: the batch's clause structure, derived lazily by the first
    #: layer that reads it, would change the graph's guards at every batch (a recompilation each)
    layer_graph_boundary = True

    def __init__(self, structure, heads, mixing="scalar", d_model=None):
        super().__init__()
        if mixing not in MIXINGS:
            raise ValueError(f"mixing must be one of {MIXINGS}, got {mixing!r}")
        levels = structure.levels
        self._structure = [structure]  # shared, not a sub-module (it is registered on the encoder)
        self.heads, self.levels, self.mixing = heads, levels, mixing
        if mixing == "scalar":
            self.mix_logits = nn.Parameter(torch.zeros(levels, heads))
            self._mixer_index = structure.add_mixer(self)
        else:
            self.mix_gate = nn.Linear(d_model, levels * heads)
        initialisation.initialise(self)  # zero logits: every p starts at 1/2
        self.query = None

    def remember_query(self, attention, args, kwargs):
        """Forward pre-hook of the attention: keep its query input ``(batch, len, d_model)``."""
        self.query = kwargs["query"] if "query" in kwargs else args[2]

    def mixing_logits(self):
        """The logits of p in float32, level first: ``(L, H)`` (scalar) or ``(L, batch, len, H)`` (gate)."""
        if self.mixing == "scalar":
            return self.mix_logits.float()
        batch, length, _ = self.query.shape
        return self.mix_gate(self.query).float().view(batch, length, self.levels, self.heads).permute(2, 0, 1, 3)

    def forward(self, scores):
        """Eq. 4-5 unrolled: ``sum_{l=0..L} w_l b^l`` with ``b^0 = g`` and the weights of :meth:`level_weights`."""
        structure = self._structure[0]
        ids = structure.ids
        if ids is None or ids.shape[0] != scores.shape[0] or ids.shape[-1] != scores.shape[-1]:
            raise RuntimeError("clause attention: no clause ids for this batch (the encoder sets them; "
                               "this attention runs only inside ExtTransformerEncoder)")
        if self.mixing == "scalar":
            weights = structure.scalar_weights(self._mixer_index)[None, :, :, None, None]  # (1, L + 1, H, 1, 1)
        else:
            weights = self.level_weights(self.mixing_logits(), structure.weight_matrix)  # (L + 1, batch, len, H)
            weights = weights.permute(1, 0, 3, 2).unsqueeze(-1)  # (batch, L + 1, H, len, 1)
        return ext_compile.run(self.ext_compile, clause_mix, scores, weights, structure.outside_bias())

    @staticmethod
    def level_weights(logits, matrix):
        """Weight ``w_l`` of ``b^l`` in the output (eq. 5 applied from the finest level outwards), ``(L + 1, ...)``
        from the logits ``theta`` of p, ``(L, ...)``, and ``matrix``, :func:`level_matrix`'s ``K``.

        With a_L = b^L and a_l = (1 - p_{l+1}) b^l + p_{l+1} a_{l+1}, the output (1 - p_1) g + p_1 a_1
        gives g = b^0 the weight 1 - p_1, b^l the weight P_l (1 - p_{l+1}) and b^L the weight P_L, where
        P_l = p_1 ... p_l.  In logs, with log(1 - p) = log p - theta, ``log w_l = sum_{k <= l+1} log p_k -
        theta_{l+1}`` (l < L) and ``log w_L = sum_k log p_k``: one product with K, in float32 whatever the
        autocast (no ``cumprod``, whose backward pass on some versions reads a flag back from the device).
        """
        stacked = torch.cat([torch.nn.functional.logsigmoid(logits), logits], dim=0)  # (2L, ...), contiguous
        with torch.autocast(logits.device.type, enabled=False):
            logs = torch.mm(matrix.to(stacked.dtype), stacked.flatten(1))
        return torch.exp(logs).view(logs.shape[:1] + logits.shape[1:])


def clause_mix(scores, weights, outside):
    """Global and clause-local attention mixed (eq. 4-5): ``sum_{l=0..L} w_l b^l``, ``b^0 = g = softmax(E)``.

    Args:
        scores: masked scores E ``(batch, H, len, len)``.
        weights: the weight of each level's attention, the global one first (:meth:`ClauseAttention.level_weights`),
            ``(1, L + 1, H, 1, 1)`` or ``(batch, L + 1, H, len, 1)``.
        outside: ``(batch, L + 1, len, len)``, -1e18 where the key lies outside the query's clause, 0 at level 0
            (:meth:`ClauseStructure.outside_bias`).

    The global softmax and the L local ones are one softmax over a stacked ``(batch, L + 1, H, len, len)``
    tensor, and the mix one weighted sum: four operators, whatever the number of levels.  Computed in
    float32; returns float32 probabilities ``(batch, H, len, len)``.
    """
    stacked = torch.softmax(scores.float().unsqueeze(1) + outside.unsqueeze(2), dim=-1)  # b^l: (B, L + 1, H, len, len)
    return (weights * stacked).sum(dim=1)


initialisation.register("onmt_ext.mechanisms.clause.attention.ClauseAttention", lambda m: (
    {"mix_logits": initialisation.ZEROS} if m.mixing == "scalar"
    else {"mix_gate.weight": initialisation.ZEROS, "mix_gate.bias": initialisation.ZEROS}))


def _combination_check(opt):
    if not Clause.from_opt(opt).attention:
        return options_without_effect(opt, Clause.specs[1:], "-clause_attention is false")
    from onmt_ext.mechanisms.clause.split import _transform_lists

    problems = []
    if not any(TRANSFORM in names for _, names in _transform_lists(opt)):
        problems.append(f"-clause_attention reads the markers of the {TRANSFORM} transform: list {TRANSFORM} in "
                        f"-transforms (after the subword transform)")
    return problems + tensor_parallel_problems(opt, "-clause_attention")


@register_mechanism("clause_", combination_check=_combination_check)
@dataclass(frozen=True)
class Clause:
    """Clause attention's options, ``-clause_<field>``."""

    attention: bool = option(False, "clause attention (eq. 4-5): global and clause-local self-attention mixed from "
                             "local to global in the encoder; levels: -clause_levels of the clause_split transform",
                             side="encoder")
    mixing: str = option("scalar", "clause attention: p_l of eq. 5: a learned scalar per level and head (scalar), "
                         "or a gate from the query's hidden state (gate)", side="encoder", choices=MIXINGS)
    attention_layers: List[int] = option([], "clause attention: encoder layers (1-based); empty: all",
                                         side="encoder", check=layers_check("enc"))


def attach_encoder(encoder, config):
    """Give the encoder a :class:`ClauseStructure` and clause attention in the selected layers."""
    clause = config.of(Clause)
    if not clause.attention:
        return
    if not _VOCABS:
        raise RuntimeError("-clause_attention: the encoder must be built by onmt.model_builder.build_base_model "
                           "(with onmt-ext active), which tells it the source vocabulary")
    # split imports OpenNMT-py, which this module may not at its top (see above); here onmt is imported
    from onmt_ext.mechanisms.clause.split import ClauseSplitOptions

    levels = ClauseSplitOptions.levels if config.clause_levels is None else config.clause_levels
    encoder.clause = ClauseStructure(marker_level_table(_VOCABS[-1]["src"], levels), levels)
    attentions = [layer.self_attn for layer in encoder.transformer]
    for i in selected_layers(clause.attention_layers, len(attentions)):
        attention = attentions[i]
        softmax = ClauseAttention(encoder.clause, config.heads, clause.mixing, config.d_model)
        if softmax.mixing == "gate":
            attention.register_forward_pre_hook(softmax.remember_query, with_kwargs=True)
        attention.softmax = softmax
        attention.self_attn_type = "scaled-dot"  # the fused SDPA/flash path never forms the scores


# ---------------------------------------------------------------------------
# Translation: the source split as in training


#: clause_split options that must be the same at translation as in training.
_SPLIT_OPTIONS = ("lang", "levels")
#: Saved in a checkpoint's options at training: the SHA-256 of the signal tagger its source was split with (""
#: for the rules), so that translation checks the tagger file by content, wherever it is now.
TAGGER_KEY = "onmt_ext_clause_tagger_sha256"


def record_tagger(model_opt):
    """Store the tagger's SHA-256 (:data:`TAGGER_KEY`) in the options of a clause-attention model, unless they hold
    it already (a checkpoint's; one written before the record gets its tagger file as it reads now)."""
    if Clause.from_opt(model_opt).attention and getattr(model_opt, TAGGER_KEY, None) is None:
        from onmt_ext.mechanisms.clause.split import ClauseSplitOptions, tagger_sha256  # imports OpenNMT-py

        setattr(model_opt, TAGGER_KEY, tagger_sha256(ClauseSplitOptions.from_opts(model_opt).tagger_model))


def translation_split_problems(opt, model_opt):
    """Messages when ``opt`` (onmt_translate) would not split the source as ``model_opt`` (training) did."""
    if not Clause.from_opt(model_opt).attention:
        return []
    if TRANSFORM not in (getattr(opt, "transforms", None) or []):
        trained = getattr(model_opt, "transforms", None) or []
        return [f"this model has clause attention: translate with the transforms it was trained with "
                f"(-transforms {' '.join(trained)}) and the same -clause_* options"]
    from onmt_ext.mechanisms.clause.split import ClauseSplitOptions, tagger_sha256  # imports OpenNMT-py

    now, trained = ClauseSplitOptions.from_opts(opt), ClauseSplitOptions.from_opts(model_opt)
    problems = [f"-clause_{name} {getattr(now, name)!r} differs from training ({getattr(trained, name)!r})"
                for name in _SPLIT_OPTIONS if getattr(now, name) != getattr(trained, name)]
    if bool(now.tagger_model) != bool(trained.tagger_model):
        problems.append(f"-clause_tagger_model {now.tagger_model!r}: training used "
                        f"{trained.tagger_model or 'the rules (no tagger)'!r}")
    elif now.tagger_model and getattr(model_opt, TAGGER_KEY, "") and os.path.isfile(now.tagger_model) \
            and tagger_sha256(now.tagger_model) != getattr(model_opt, TAGGER_KEY):
        problems.append(f"-clause_tagger_model {now.tagger_model!r} is not the tagger training used: its contents "
                        f"differ from those of {trained.tagger_model!r} when the model was trained")
    return problems


def _load_test_model_split_checked(stock, opt, *args, **kwargs):
    vocabs, model, model_opt = stock(opt, *args, **kwargs)
    problems = translation_split_problems(opt, model_opt)
    if problems:
        raise UsageError("\n".join(problems))
    return vocabs, model, model_opt


def _build_base_model_with_vocabs(stock, model_opt, vocabs, *args, **kwargs):
    with building_with(vocabs):
        return stock(model_opt, vocabs, *args, **kwargs)


def tell_builders_the_vocabs():
    """Wrap ``build_base_model`` so that clause attention reads its markers' ids while it is built."""
    import onmt.model_builder as builder

    patch(builder, "build_base_model", _build_base_model_with_vocabs, kind=NEEDED,
          reason="clause attention reads the ids of the clause markers from the vocabularies while it is built",
          test="tests/unit/test_clause_attention.py::test_model_has_clause_attention_in_the_selected_layers_only")


def check_translation_split():
    """Refuse to translate with clause attention unless the source is split as in training."""
    import onmt.model_builder as builder

    # order 0: checks what the -ext_compile layer (order 1) returns
    patch(builder, "load_test_model", _load_test_model_split_checked, kind=NEEDED, order=0,
          reason="a clause-attention model must translate a source split as in its training",
          test="tests/unit/test_clause_attention.py::test_translation_must_split_as_training")
