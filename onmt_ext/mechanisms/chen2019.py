"""Recurrent positional embeddings, RPEHead and MPRHead (Chen, Wang, Utiyama and Sumita 2019, "chen2019").

A word embedding ``x_j`` (``d_model``) is split into ``x^p_j`` (first ``d_p``) and ``x^r_j`` (last ``d_r``), sec. 3:

* R (eq. 6), ``-chen2019_recurrence``: ``hidden`` (default) projects every state ``h_j = RNN(x^r_j, h_{j-1})`` of
  a stock recurrent layer, ``r_j = tanh(W^r h_j + b^r)``; ``projected`` is eq. 6 as written, ``r_{j-1}`` recurring
  (docs/chen2019.md); source: a BiRNN of ``d_r / 2`` units per direction, target: a forward RNN of ``d_r`` units;
  cell ``rnn``, ``gru``, ``lstm`` or :class:`SRU` (``hidden`` only);
* P: ``p_j = x^p_j + pe_j`` (eq. 2) at size ``d_p``; ``P = x^p`` on a side without position encoding;
* RPEHead (eq. 7-8): ``[P; R]``; MPRHead (eq. 9-11): ``[p^1_j : r^1_j, ..., p^H_j : r^H_j]``.

:class:`RecurrentPositionalEmbeddings` replaces a side's ``embeddings`` (output ``(batch, len, d_model)``),
keeping the stock ``word_lut`` and dropout.  ``chen2019_heads restricted`` makes the first layer's Q/K/V per-head
(:class:`BlockDiagonalLinear`, :class:`HeadwiseNorm`).  On the target side the RNN state ``(batch, 1, units)`` is
decoding state (:mod:`onmt_ext.mechanisms.state`).  Scaling, head projections, padding: docs/chen2019.md.
"""

import math

from dataclasses import dataclass
from typing import List

import torch
import torch.nn as nn

from onmt_ext.runtime import compile as ext_compile
from onmt_ext.mechanisms import initialisation, normalisation
from onmt_ext.options import (EXT_TYPE, model_size, option, options_without_effect, register_mechanism,
                              tensor_parallel_problems)
from onmt_ext.mechanisms.state import DecodingStateModule

# OpenNMT-py is imported inside the functions: importing it while this module initialises would activate
# onmt-ext (onmt_ext._autoload) before this module is whole.

LAYOUTS = ("none", "rpehead", "mprhead")
SCALES = ("embedding", "parts", "none")
INITS = ("glorot", "pytorch")


class SRU(nn.Module):
    """A one-layer simple recurrent unit (Lei et al. 2018) in plain PyTorch, with ``nn.RNN``'s batch-first interface.

    For input ``x_t`` ``(input_size,)`` and cell state ``c_t`` ``(hidden_size,)``::

        x~_t = W x_t,   f_t = sigmoid(W_f x_t + v_f * c_{t-1} + b_f),   r_t = sigmoid(W_r x_t + v_r * c_{t-1} + b_r)
        c_t  = f_t * c_{t-1} + (1 - f_t) * x~_t
        h_t  = r_t * c_t + (1 - r_t) * W_h x_t      (W_h only when input_size != hidden_size; else x_t)

    The four matrix products run for all steps at once; only the elementwise
    recurrence loops over time.  ``forward(x, c0=None)`` maps ``(batch, len,
    input_size)`` to the outputs ``h`` ``(batch, len, hidden_size)`` and the
    final cell state ``(1, batch, hidden_size)``, which continues the sequence
    when passed back as ``c0``.
    """

    def __init__(self, input_size, hidden_size, batch_first=True):
        super().__init__()
        if not batch_first:
            raise ValueError("SRU is batch-first only")
        self.hidden_size = hidden_size
        self.project = input_size != hidden_size
        self.weight = nn.Linear(input_size, (4 if self.project else 3) * hidden_size, bias=False)
        self.recurrent = nn.Parameter(torch.zeros(2, hidden_size))  # v_f, v_r
        self.bias = nn.Parameter(torch.zeros(2, hidden_size))  # b_f, b_r

    def forward(self, x, c0=None):
        parts = self.weight(x).split(self.hidden_size, dim=-1)
        candidate, forget_in, reset_in = parts[:3]
        highway = parts[3] if self.project else x
        c = x.new_zeros(x.size(0), self.hidden_size) if c0 is None else c0[0]
        outputs = []
        for t in range(x.size(1)):
            f = torch.sigmoid(forget_in[:, t] + self.recurrent[0] * c + self.bias[0])
            r = torch.sigmoid(reset_in[:, t] + self.recurrent[1] * c + self.bias[1])
            c = f * c + (1 - f) * candidate[:, t]
            outputs.append(r * c + (1 - r) * highway[:, t])
        return torch.stack(outputs, dim=1), c.unsqueeze(0)


CELLS = {"rnn": nn.RNN, "gru": nn.GRU, "lstm": nn.LSTM, "sru": SRU}
#: what recurs in eq. 6: the RNN's own state (fused layers), or the projected r_{j-1} as the equation writes
RECURRENCES = ("hidden", "projected")


def cell_step(cell, inputs, recurrent, previous, memory=None):
    """One step of a PyTorch ``RNN``/``GRU``/``LSTM`` cell from its two affine maps, PyTorch's gate order.

    ``inputs`` ``(B, gates * units)`` is ``W_ih x_j + b_ih``; ``recurrent`` the same shape, ``W_hh s + b_hh`` of
    the state ``s`` fed back; ``previous`` ``(B, units)`` is that state (GRU's interpolation reads it);
    ``memory``: the LSTM's cell state.  Returns the new output ``(B, units)`` and the LSTM's new cell state
    (None for the others)::

        rnn:  h = tanh(i + g)
        gru:  r = sig(i_r + g_r), z = sig(i_z + g_z), n = tanh(i_n + r * g_n), h = (1 - z) n + z s
        lstm: c = sig(i_f + g_f) c' + sig(i_i + g_i) tanh(i_g + g_g), h = sig(i_o + g_o) tanh(c)
    """
    if cell == "rnn":
        return torch.tanh(inputs + recurrent), None
    if cell == "gru":
        i_r, i_z, i_n = inputs.chunk(3, dim=-1)
        g_r, g_z, g_n = recurrent.chunk(3, dim=-1)
        reset, update = torch.sigmoid(i_r + g_r), torch.sigmoid(i_z + g_z)
        candidate = torch.tanh(i_n + reset * g_n)
        return candidate + update * (previous - candidate), None
    gate_in, gate_forget, gate_cell, gate_out = (inputs + recurrent).chunk(4, dim=-1)
    memory = torch.sigmoid(gate_forget) * memory + torch.sigmoid(gate_in) * torch.tanh(gate_cell)
    return torch.sigmoid(gate_out) * torch.tanh(memory), memory


HEAD_PROJECTIONS = ("full", "restricted")
SIDES = ("enc", "dec")


class EmbeddingScale(nn.Module):
    """OpenNMT-py's ``PositionalEncoding`` without the encoding: ``emb * sqrt(dim)`` (Vaswani et al. sec. 3.4).

    A side listed in ``chen2019_pe_off`` without RPE keeps the embedding scale, as an RPE side does
    (:func:`input_factors`): Table 3 removes the position information only (docs/chen2019.md).
    """

    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, emb, step=None):
        return emb * math.sqrt(self.dim)


class RecurrentPositionalEmbeddings(DecodingStateModule):
    """Word embeddings to the RPEHead/MPRHead layer input (eq. 6, 7-11); replaces OpenNMT-py's ``Embeddings``.

    Args:
        embeddings: the stock ``onmt.modules.Embeddings`` of the side (its
            word look-up and dropout are reused; its position encoding, if
            any, is not).
        heads: H.
        d_r: the RPE size ``d_r``.
        layout: ``"rpehead"`` or ``"mprhead"``.
        cell: ``"rnn"``, ``"gru"`` or ``"lstm"``.
        bidirectional: True on the source side (``d_r / 2`` units per
            direction), False on the target side (``d_r`` units).
        position_encoding: add the sinusoidal encoding of size ``d_p`` to P.
        position_encoding_type: OpenNMT-py's ``-position_encoding_type``.
        scale: ``"embedding"``, ``"parts"`` or ``"none"`` (:func:`input_factors`).
        init: ``"glorot"`` or ``"pytorch"``, the RNN's initialisation
            (docs/chen2019.md, "Parameters and initialisation").
        recurrence: ``"hidden"`` or ``"projected"`` (see the module
            docstring).  With ``projected`` on the source side each direction
            has its own ``W^r`` of ``d_r / 2`` (``proj`` forward,
            ``proj_backward``): a full ``W^r`` would feed the backward
            direction's state at ``j - 1``, which depends on ``r_j``, into
            the forward step ``j``.

    ``forward(source, step=None)`` maps token ids ``(batch, len, 1)`` to the
    layer input ``(batch, len, d_model)``.  ``step`` is the position of the
    first token during step-by-step decoding (target side); None is a full
    pass from position 0.  The recurrence runs eager (``hidden``: cuDNN's
    fused RNN on a GPU; ``projected``: a loop over positions); the projection
    of eq. 6 and the layout (:func:`recurrent_output`, or :func:`combine`
    after the loop) are compiled with ``-ext_compile``.
    """

    ext_compile = False
    #: ``-ext_compile auto`` (the default) compiles the core in training on CUDA: it measured faster there
    #: (the GPU run that docs/compile.md cites, in results/gpu/)
    compile_on_cuda = True

    def __init__(self, embeddings, heads, d_r, layout, cell="rnn", bidirectional=False, position_encoding=True,
                 position_encoding_type="SinusoidalInterleaved", scale="embedding", init="glorot",
                 recurrence="hidden"):
        super().__init__()
        if len(embeddings.emb_luts) != 1:
            raise ValueError("recurrent positional embeddings do not support word features (-n_src_feats)")
        d_model = embeddings.embedding_size
        problem = layout_problem(layout, d_model, heads, d_r, bidirectional)
        if problem:
            raise ValueError(problem)
        if cell not in CELLS:
            raise ValueError(f"cell must be one of {tuple(CELLS)}, got {cell!r}")
        if scale not in SCALES or init not in INITS:
            raise ValueError(f"scale must be one of {SCALES} and init one of {INITS}, got {scale!r}, {init!r}")
        problem = recurrence_problem(recurrence, cell)
        if problem:
            raise ValueError(problem)
        self.make_embedding = embeddings.make_embedding
        if "pe" in self.make_embedding._modules:  # P gets its own encoding of size d_p
            del self.make_embedding.pe
        self.word_padding_idx = embeddings.word_padding_idx
        self.word_vec_size = embeddings.word_vec_size
        self.embedding_size = d_model
        self.dropout, self.dropout_p = embeddings.dropout, embeddings.dropout_p
        self.heads, self.d_r, self.d_p, self.layout = heads, d_r, d_model - d_r, layout
        self.cell, self.bidirectional, self.recurrence = cell, bidirectional, recurrence
        self.position_encoding = position_encoding
        from onmt.modules.embeddings import PositionalEncoding

        self.pe = PositionalEncoding(self.d_p, position_encoding_type) if position_encoding else None
        units = d_r // 2 if bidirectional else d_r
        self.rnn = CELLS[cell](d_r, units, batch_first=True)
        self.rnn_backward = CELLS[cell](d_r, units, batch_first=True) if bidirectional else None
        projected = recurrence == "projected"
        self.proj = nn.Linear(units if projected else d_r, units if projected else d_r)  # W^r, b^r of eq. 6
        self.proj_backward = nn.Linear(units, units) if projected and bidirectional else None
        self.scale, self.init = scale, init
        self.p_factor, self.r_factor = input_factors(scale, d_model, d_r, self.pe is not None)
        initialisation.initialise(self)

    @property
    def word_lut(self):
        """The word look-up table (``nn.Embedding``), as on OpenNMT-py's ``Embeddings``."""
        return self.make_embedding[0][0]

    @property
    def emb_luts(self):
        return self.make_embedding[0]

    def load_pretrained_vectors(self, emb_file):
        """OpenNMT-py's ``Embeddings.load_pretrained_vectors`` (into the word look-up)."""
        from onmt.modules.embeddings import Embeddings

        Embeddings.load_pretrained_vectors(self, emb_file)

    def update_dropout(self, dropout):
        self.dropout.p = dropout
        self.dropout_p = dropout

    def forward(self, source, step=None):
        x = self.make_embedding(source)  # (B, L, d_model)
        x_p, x_r = x[..., : self.d_p], x[..., self.d_p:]
        x_p = x_p * self.p_factor if self.p_factor != 1.0 else x_p
        x_r = x_r * self.r_factor if self.r_factor != 1.0 else x_r
        p = self.pe(x_p, step=step) if self.pe is not None else x_p
        if self.bidirectional:
            states = self._bidirectional(x_r, source[..., 0] != self.word_padding_idx)
        else:
            states = self._forward_rnn(x_r, step)
        if self.recurrence == "projected":  # the loop made R itself
            out = ext_compile.run(self.ext_compile, combine, p, states, self.heads, self.layout)
        else:
            out = ext_compile.run(self.ext_compile, recurrent_output, p, states, self.proj.weight, self.proj.bias,
                                  self.heads, self.layout)
        return self.dropout(out) if self.dropout_p > 0 else out

    def _bidirectional(self, x_r, keep):
        """BiRNN states ``(B, L, d_r)`` (R with ``projected``); the backward direction reads each sentence reversed
        within its length."""
        positions = torch.arange(x_r.size(1), device=x_r.device)
        lengths = keep.sum(dim=1, keepdim=True)  # right padding: the first `length` tokens are real
        reverse = lengths - 1 - positions[None]  # (B, L): an involution on the real tokens
        reverse = torch.where(reverse >= 0, reverse, positions[None]).unsqueeze(-1)
        flipped = x_r.gather(1, reverse.expand_as(x_r))
        if self.recurrence == "projected":
            forward_states, _ = self._projected(self.rnn, self.proj, x_r)
            backward_states, _ = self._projected(self.rnn_backward, self.proj_backward, flipped)
        else:
            forward_states, _ = self._recur(self.rnn, x_r)
            backward_states, _ = self._recur(self.rnn_backward, flipped)
        backward_states = backward_states.gather(1, reverse.expand_as(backward_states))
        return torch.cat([forward_states, backward_states], dim=-1)

    def _projected(self, rnn, proj, x_r, state=None):
        """Eq. 6 as written: ``r_j = tanh(W^r f(x^r_j, r_{j-1}) + b^r)`` with ``r_0 = 0`` (footnote 1).

        The cell ``f`` is :func:`cell_step` with ``rnn``'s own weights; an LSTM also carries its cell state.
        ``x_r`` ``(B, L, d_r)``; ``state``: ``(r, c)`` ``(B, units)`` each to continue from (``c`` None but for
        an LSTM), None for ``r_0 = 0``.  Returns R ``(B, L, units)`` and the final ``(r, c)``.  The input maps of
        all positions are one product; the recurrent map, the cell and ``W^r`` run once per position.
        """
        batch, units = x_r.size(0), proj.out_features
        if state is None:
            state = (x_r.new_zeros(batch, units), x_r.new_zeros(batch, units) if self.cell == "lstm" else None)
        r, memory = state
        inputs = torch.nn.functional.linear(x_r, rnn.weight_ih_l0, rnn.bias_ih_l0)  # (B, L, gates * units)
        outputs = []
        for j in range(x_r.size(1)):
            recurrent = torch.nn.functional.linear(r, rnn.weight_hh_l0, rnn.bias_hh_l0)
            h, memory = cell_step(self.cell, inputs[:, j], recurrent, r, memory)
            r = torch.tanh(proj(h))
            outputs.append(r)
        return torch.stack(outputs, dim=1), (r, memory)

    def _recur(self, rnn, x_r, hidden=None):
        """``rnn(x_r, hidden)``, except that under CPU autocast an LSTM runs in its weights' dtype.

        CPU autocast hands ``nn.LSTM`` to oneDNN in bfloat16, and on CPUs without AVX-512 (seen on an AVX2 AMD
        EPYC, torch 2.13) oneDNN refuses it with "could not create a primitive descriptor".  The recurrence is
        ``d_r`` wide, so running it in float32 costs little; GRU and RNN cells, and GPU autocast, are unchanged.
        """
        if self.cell != "lstm" or x_r.device.type != "cpu" or not torch.is_autocast_enabled("cpu"):
            return rnn(x_r, hidden)
        dtype = rnn.weight_ih_l0.dtype
        if hidden is not None:
            hidden = tuple(h.to(dtype) for h in hidden)
        with torch.autocast("cpu", enabled=False):
            return rnn(x_r.to(dtype), hidden)

    def _forward_rnn(self, x_r, step):
        """Forward RNN states ``(B, L, d_r)`` (R with ``projected``); during decoding (``step`` set) it continues
        from the saved state: ``hidden`` the RNN's ``h`` (``projected``: ``r``), ``cell`` an LSTM's ``c``, each
        ``(B, 1, units)``."""
        if self.recurrence == "projected":
            return self._forward_projected(x_r, step)
        if step is None:
            states, _ = self._recur(self.rnn, x_r)
            return states
        saved = None if step == 0 else self.decoding_state.get("hidden")
        if saved is not None:  # stored batch-first for the beam's reordering; the RNN wants (1, B, units)
            saved = saved.transpose(0, 1).contiguous()
            if self.cell == "lstm":
                saved = (saved, self.decoding_state["cell"].transpose(0, 1).contiguous())
        states, final = self._recur(self.rnn, x_r, saved)
        if self.cell == "lstm":
            final, cell_state = final
            self.decoding_state["cell"] = cell_state.transpose(0, 1)
        self.decoding_state["hidden"] = final.transpose(0, 1)  # (B, 1, units)
        return states

    def _forward_projected(self, x_r, step):
        """:meth:`_forward_rnn` for ``projected``: R of the target's forward direction, from ``r_0 = 0`` or, when
        decoding, from the saved ``r`` (and ``c``)."""
        saved = None
        if step is not None and step > 0 and "hidden" in self.decoding_state:
            saved = (self.decoding_state["hidden"][:, 0], self.decoding_state["cell"][:, 0] if self.cell == "lstm"
                     else None)
        r, (last, memory) = self._projected(self.rnn, self.proj, x_r, saved)
        if step is not None:
            self.decoding_state["hidden"] = last.unsqueeze(1)
            if memory is not None:
                self.decoding_state["cell"] = memory.unsqueeze(1)
        return r


def recurrent_output(p, states, weight, bias, heads, layout):
    """The layer input from P ``(..., d_p)`` and the RNN states ``(..., d_r)``: R = tanh(W^r h + b^r) (eq. 6),
    then :func:`combine`."""
    r = torch.tanh(torch.nn.functional.linear(states, weight.to(states.dtype), bias.to(states.dtype)))
    return combine(p, r, heads, layout)


def input_factors(scale, d_model, d_r, position_encoding):
    """The factors ``(a_p, a_r)`` applied to the looked-up ``x^p`` and ``x^r`` (``-chen2019_scale``).

    OpenNMT-py multiplies a word embedding by ``sqrt(dim)`` inside its
    position encoding (Vaswani et al. sec. 3.4); P's encoding of size
    ``d_p`` does so by ``sqrt(d_p)`` on its own, so ``a_p`` is what is
    applied before it.  ``embedding``: ``x_j`` is scaled as one vector by
    ``sqrt(d_model)`` and then split (sec. 3), so both parts carry
    ``sqrt(d_model)``.  ``parts``: each part as the embedding of a model of
    its own size, ``sqrt(d_p)`` (with the encoding) and ``sqrt(d_r)``.
    ``none``: ``x^r`` unscaled, ``x^p`` as ``parts``.
    """
    d_p = d_model - d_r
    if scale == "embedding":
        return (math.sqrt(d_model / d_p) if position_encoding else math.sqrt(d_model)), math.sqrt(d_model)
    return 1.0, (math.sqrt(d_r) if scale == "parts" else 1.0)


def _rules(module):
    """Parameters of :class:`RecurrentPositionalEmbeddings` (docs/chen2019.md, "Parameters and initialisation")."""
    rules = {f"make_embedding.{name}": initialisation.STOCK for name, _ in module.make_embedding.named_parameters()}
    rules.update({"proj.weight": initialisation.GLOROT, "proj.bias": initialisation.ZEROS})
    if module.proj_backward is not None:
        rules.update({"proj_backward.weight": initialisation.GLOROT, "proj_backward.bias": initialisation.ZEROS})
    for name in ("rnn", "rnn_backward"):
        rnn = getattr(module, name)
        if rnn is None:
            continue
        own = sru_rules(rnn, module.init) if isinstance(rnn, SRU) else initialisation.rnn_rules(rnn, module.init)
        rules.update({f"{name}.{key}": rule for key, rule in own.items()})
    return rules


def sru_rules(sru, init="glorot"):
    """:class:`SRU`: the stacked input maps Glorot per map (``pytorch``: ``nn.Linear``'s ``U(-1/sqrt(in),
    1/sqrt(in))``); ``v_f``, ``v_r`` and the biases zero (the gates start without the cell-state term or an offset)."""
    maps = sru.weight.out_features // sru.hidden_size
    weight = (initialisation.Rule("glorot", blocks=maps) if init == "glorot"
              else initialisation.Rule("uniform", bound=1.0 / math.sqrt(sru.weight.in_features)))
    return {"weight.weight": weight, "recurrent": initialisation.ZEROS, "bias": initialisation.ZEROS}


def combine(p, r, heads, layout):
    """The layer input from P ``(..., d_p)`` and R ``(..., d_r)``.

    ``rpehead``: ``[P; R]`` (sec. 4.1).  ``mprhead``: per-head interleaving
    ``[p^1 : r^1, ..., p^H : r^H]`` (eq. 9-10).  Returns ``(..., d_p + d_r)``.
    """
    if layout == "rpehead":
        return torch.cat([p, r], dim=-1)
    lead = p.shape[:-1]
    mixed = torch.cat([p.reshape(*lead, heads, -1), r.reshape(*lead, heads, -1)], dim=-1)  # (..., H, d/H)
    return mixed.reshape(*lead, -1)


def recurrence_problem(recurrence, cell):
    """Why ``recurrence`` cannot run with ``cell`` (a message), or None."""
    if recurrence not in RECURRENCES:
        return f"recurrence must be one of {RECURRENCES}, got {recurrence!r}"
    if recurrence == "projected" and cell == "sru":
        return ("the projected recurrence (eq. 6 as written) needs an rnn, gru or lstm cell: an SRU's recurrent "
                "state is its cell state c, not the output that r replaces")
    return None


def layout_problem(layout, d_model, heads, d_r, bidirectional):
    """Why ``d_r`` does not fit ``layout`` (a message), or None."""
    if layout not in LAYOUTS[1:]:
        return f"layout must be one of {LAYOUTS[1:]}, got {layout!r}"
    if not 0 < d_r < d_model:
        return f"d_r must be between 1 and d_model - 1 = {d_model - 1}, got {d_r}"
    if heads < 1 or d_model % heads:
        return f"needs -heads >= 1 dividing d_model {d_model}, got {heads}"
    head_size = d_model // heads
    if layout == "rpehead" and d_r % head_size:
        return (f"RPEHead needs d_r = t * d_model / heads (whole heads of {head_size}, sec. 4.1), got {d_r}")
    if layout == "mprhead" and (d_r % heads or (d_model - d_r) % heads):
        return f"MPRHead splits P and R over the {heads} heads (eq. 9): d_r and d_model - d_r must divide by {heads}"
    if bidirectional and d_r % 2:
        return f"the source side's bidirectional RNN has d_r / 2 units per direction: d_r must be even, got {d_r}"
    return None


class BlockDiagonalLinear(nn.Module):
    """``y = x W + b`` with W block-diagonal over H blocks: output slice h reads only input slice h.

    Args:
        dim: input and output size (``d_model``).
        blocks: H.
        bias: add a bias (OpenNMT-py's ``-add_qkvbias``).

    ``forward(x)``: ``(..., dim)`` -> ``(..., dim)``.  Parameters: ``weight``
    ``(H, dim / H, dim / H)`` (output by input, per block; each block Glorot
    uniform, so an output has the variance the stock Glorot projection gives
    it) and ``bias`` (zeros).
    """

    def __init__(self, dim, blocks, bias=False):
        super().__init__()
        self.blocks = blocks
        size = dim // blocks
        self.weight = nn.Parameter(torch.empty(blocks, size, size))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None
        initialisation.initialise(self)  # each block Glorot, as the stock full projection

    def forward(self, x):
        lead = x.shape[:-1]
        weight = self.weight.to(x.dtype)  # (a no-op unless the input is half precision)
        y = torch.einsum("...hi,hoi->...ho", x.reshape(*lead, self.blocks, -1), weight).reshape(*lead, -1)
        return y + self.bias.to(y.dtype) if self.bias is not None else y


class HeadwiseNorm(nn.Module):
    """Layer (or RMS) normalisation of each of H slices on its own, with OpenNMT-py's per-dimension affine.

    Args:
        dim: ``d_model``.
        blocks: H.
        eps: ``-norm_eps``.
        kind: ``"standard"`` (LayerNorm: weight and bias) or ``"rms"`` (RMSNorm: weight).

    ``forward(x)``: ``(..., dim)`` -> ``(..., dim)``.
    """

    def __init__(self, dim, blocks, eps=1e-6, kind="standard"):
        super().__init__()
        self.blocks, self.eps, self.kind = blocks, eps, kind
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if kind == "standard" else None

    def forward(self, x):
        lead = x.shape[:-1]
        pieces = x.reshape(*lead, self.blocks, -1).float()
        if self.kind == "standard":
            pieces = pieces - pieces.mean(dim=-1, keepdim=True)
        pieces = pieces * torch.rsqrt(pieces.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        y = pieces.reshape(*lead, -1).to(x.dtype) * self.weight
        return y + self.bias if self.bias is not None else y


def restrict_heads(layer_norm, attention, heads):
    """Make the first layer's self-attention head-restricted (see the module docstring).

    Returns the :class:`HeadwiseNorm` that replaces ``layer_norm``; the Q/K/V
    projections of ``attention`` are replaced in place by
    :class:`BlockDiagonalLinear` maps.
    """
    dim = attention.linear_query.in_features
    for name in ("linear_query", "linear_keys", "linear_values"):
        linear = getattr(attention, name)
        if linear.in_features != linear.out_features:
            raise ValueError("the head-restricted projections need d_model == heads * dim_per_head")
        setattr(attention, name, BlockDiagonalLinear(dim, heads, bias=linear.bias is not None))
    kind = "rms" if not isinstance(layer_norm, nn.LayerNorm) else "standard"
    eps = layer_norm.eps if isinstance(layer_norm, nn.LayerNorm) else getattr(layer_norm, "eps", 1e-6)
    return HeadwiseNorm(dim, heads, eps, kind)


initialisation.register("onmt_ext.mechanisms.chen2019.RecurrentPositionalEmbeddings", _rules)
initialisation.register("onmt_ext.mechanisms.chen2019.BlockDiagonalLinear",
                        lambda m: {"weight": initialisation.GLOROT,
                                   **({"bias": initialisation.ZEROS} if m.bias is not None else {})})
initialisation.register("onmt_ext.mechanisms.chen2019.HeadwiseNorm",
                        lambda m: {"weight": initialisation.ONES,
                                   **({"bias": initialisation.ZEROS} if m.bias is not None else {})})


# ----------------------------------------------------------------------------- options

def _combination_check(opt):
    problems = []
    chen2019 = Chen2019.from_opt(opt)
    used = chen2019.enc != "none" or chen2019.dec != "none"
    if not used:
        problems += options_without_effect(opt, [Chen2019.spec_of[name] for name in ("dim", "rnn", "heads", "scale",
                                                                                   "init", "recurrence")],
                                           "-chen2019_enc and -chen2019_dec are both none")
    dim = chen2019.dim
    for side, bidirectional in (("enc", True), ("dec", False)):
        layout = getattr(chen2019, side)
        if layout == "none":
            continue
        if dim <= 0:
            problems.append(f"-chen2019_{side} {layout} needs the RPE size: set -chen2019_dim (d_r; the paper "
                            "uses 320 for RPEHead and 256 for MPRHead at d_model 512)")
            continue
        d_model = model_size(opt)
        problem = layout_problem(layout, d_model, opt.heads, dim, bidirectional)
        if problem:
            problems.append(f"-chen2019_dim {dim} with -chen2019_{side} {layout}: {problem}")
        pe_on = getattr(opt, "position_encoding", False) and side not in chen2019.pe_off
        if pe_on and (d_model - dim) % 2:
            problems.append(f"-chen2019_dim {dim}: the sinusoidal encoding of P needs an even d_p = d_model - d_r")
    recurrence = recurrence_problem(chen2019.recurrence, chen2019.rnn)
    if used and recurrence:
        problems.append(f"-chen2019_recurrence {chen2019.recurrence} with -chen2019_rnn {chen2019.rnn}: "
                        f"{recurrence}")
    if getattr(opt, "n_src_feats", 0) and chen2019.enc != "none":
        problems.append("-chen2019_enc does not support source word features (-n_src_feats)")
    if chen2019.heads == "restricted":
        if getattr(opt, "parallel_residual", False):
            problems.append("-chen2019_heads restricted does not support -parallel_residual")
        problems += tensor_parallel_problems(opt, "-chen2019_heads restricted")
    pe_off = chen2019.pe_off
    if pe_off and not getattr(opt, "position_encoding", False):
        problems.append(f"-chen2019_pe_off {pe_off} has no effect with -position_encoding false")
    problems += _ext_type_problems(opt, "-chen2019_pe_off", pe_off)
    problems += _scale_without_pe_problems(opt, chen2019)
    return problems


def _ext_type_problems(opt, option, sides):
    """``<option> enc needs -encoder_type ext_transformer`` for each of ``sides`` of a stock model type."""
    kinds = [("encoder" if side == "enc" else "decoder", side) for side in sides]
    return [f"{option} {side} needs -{kind}_type {EXT_TYPE}" for kind, side in kinds
            if getattr(opt, f"{kind}_type", None) != EXT_TYPE]


def _scale_without_pe_problems(opt, chen2019):
    """``-chen2019_scale_without_pe`` names stock sides of onmt-ext's type that have no absolute encoding."""
    problems = []
    sides = chen2019.scale_without_pe
    if sides and getattr(opt, "position_encoding", False):
        problems.append(f"-chen2019_scale_without_pe {sides} has no effect with -position_encoding true, whose "
                        "encoding already scales the embeddings (Table 3's ablations: -chen2019_pe_off)")
    problems += _ext_type_problems(opt, "-chen2019_scale_without_pe", sides)
    for side in sides:
        if getattr(chen2019, side) != "none":
            problems.append(f"-chen2019_scale_without_pe {side} has no effect with -chen2019_{side} "
                            f"{getattr(chen2019, side)}, whose scale is -chen2019_scale")
    return problems


@register_mechanism("chen2019_", combination_check=_combination_check)
@dataclass(frozen=True)
class Chen2019:
    """chen2019's options, ``-chen2019_<field>``."""

    enc: str = option("none", "chen2019: recurrent positional embeddings on the source side (bidirectional RNN): "
                      "rpehead (sec. 4.1) or mprhead (sec. 4.2)", side="encoder", choices=LAYOUTS)
    dec: str = option("none", "chen2019: recurrent positional embeddings on the target side (forward RNN, run step "
                      "by step in decoding): rpehead or mprhead", side="decoder", choices=LAYOUTS)
    dim: int = option(0, "chen2019: d_r, the part of each word embedding read by the RNN (eq. 6); the paper: 320 "
                      "(RPEHead), 256 (MPRHead)")
    rnn: str = option("rnn", "chen2019: the RNN cell of eq. 6", choices=tuple(CELLS))
    recurrence: str = option("hidden", "chen2019: what recurs in eq. 6: hidden (the RNN's own state, projected "
                             "afterwards: fused RNN layers) or projected (eq. 6 as written: r_{j-1} feeds step j, "
                             "one step per position; on the source each direction has its own W^r of d_r / 2; "
                             "rnn, gru or lstm cells)", choices=RECURRENCES)
    heads: str = option("full", "chen2019: full Q/K/V projections (parameter count of the paper's Table 1) or "
                        "restricted (first-layer heads read only their own input slice)", choices=HEAD_PROJECTIONS)
    scale: str = option("embedding", "chen2019: scaling of the looked-up embedding before the split (sec. 3): "
                        "embedding (x_j times sqrt(d_model), then split: x^p and x^r alike), parts (x^p times "
                        "sqrt(d_p), x^r times sqrt(d_r)), none (x^r unscaled)", choices=SCALES)
    init: str = option("glorot", "chen2019: initialisation of the RNN of eq. 6: glorot (every gate's map Glorot "
                       "uniform, biases zero) or pytorch (U(-1/sqrt(units), 1/sqrt(units)))", choices=INITS)
    pe_off: List[str] = option([], "chen2019 Table 3 ablations: sides (enc, dec) without the sinusoidal position "
                               "encoding (stock OpenNMT-py embeddings without it)", choices=SIDES)
    scale_without_pe: List[str] = option([], "chen2019 Tables 1-2, +Relative PE: stock sides (enc, dec) without "
                                         "an absolute position encoding (-position_encoding false, relative "
                                         "positions instead) whose embeddings keep the sqrt(d) scale of Vaswani "
                                         "et al. sec. 3.4, which OpenNMT-py applies with the encoding only",
                                         choices=SIDES)


def _attach(module, config, side, layer_norm_name, layers):
    """Replace ``module.embeddings`` (and restrict the first layer's heads) for ``side``."""
    embeddings = module.embeddings
    chen2019 = config.of(Chen2019)
    layout = getattr(chen2019, side)
    pe_on = embeddings.position_encoding and side not in chen2019.pe_off
    if layout == "none":
        if embeddings.position_encoding and not pe_on:  # Table 3 ablation: no PE; the sqrt(d) scale stays
            embeddings.make_embedding.pe = EmbeddingScale(embeddings.make_embedding.pe.dim)
        elif not embeddings.position_encoding and side in chen2019.scale_without_pe:  # +Relative PE: the scale stays
            embeddings.make_embedding.add_module("scale", EmbeddingScale(embeddings.embedding_size))
        return
    module.embeddings = RecurrentPositionalEmbeddings(
        embeddings, config.heads, chen2019.dim, layout, chen2019.rnn, bidirectional=side == "enc",
        position_encoding=pe_on, position_encoding_type=config.position_encoding_type, scale=chen2019.scale,
        init=chen2019.init, recurrence=chen2019.recurrence)
    if chen2019.heads == "restricted":
        first = layers[0]
        norm = restrict_heads(getattr(first, layer_norm_name), first.self_attn, config.heads)
        if not normalisation.post_norm(config):  # post-norm: the heads read the embeddings, the LN follows them
            setattr(first, layer_norm_name, norm)


def attach_encoder(encoder, config):
    """Source-side RPE (``chen2019_enc``) or, for the Table 3 ablation, the source embeddings without PE."""
    _attach(encoder, config, "enc", "layer_norm", encoder.transformer)


def attach_decoder(decoder, config):
    """Target-side RPE (``chen2019_dec``) or, for the Table 3 ablation, the target embeddings without PE."""
    _attach(decoder, config, "dec", "layer_norm_1", decoder.transformer_layers)
