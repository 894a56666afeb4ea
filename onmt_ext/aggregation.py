"""Routing-by-agreement aggregation of multi-head attention (li2019).

Li et al. (NAACL 2019) replace the concatenation + linear map that combines
the H heads of multi-head attention (eq. 3-4) with routing between capsules:

* input capsules ``Omega_in_h = f_h(O_h)`` (eq. 5), ``O_h`` ``(dim_per_head,)``
  the output of head h.  The paper only says "a distinct non-linear
  transformation"; here ``f_h(x) = tanh(x W_h + b_h)`` maps each head to
  ``d_model`` dimensions (choice documented in the README's parameter table:
  with this f_h the parameter delta matches the paper's +2.1M per layer);
* votes ``V_{h->n} = Omega_in_h W_{h->n}`` (eq. 6), N output capsules of
  size ``d_model / N`` (N = d_model in the paper);
* simple routing (Alg. 1, eq. 7-8, weighted mean and squash) or EM routing
  (Alg. 2, eq. 9-12) from :mod:`onmt_ext.routing`;
* the N output capsules are concatenated back to ``d_model``.

Where it goes is OpenNMT-py's narrowest hook: the ``final_linear`` of a
``MultiHeadedAttention`` (applied to the concatenated heads after the
attention, on every attention path, including the fused one on GPU and the
key/value cache of step-by-step decoding).  The aggregation works on each
position independently, so it carries no decoding state.

Options (all "off" by default, which leaves OpenNMT-py's model unchanged):
``li2019_enc_self``, ``li2019_dec_self``, ``li2019_enc_dec`` choose
``concat`` (stock), ``simple`` or ``em`` per attention component;
``li2019_enc_layers`` / ``li2019_dec_layers`` restrict it to layers (1-based,
as the paper's tables; empty: all layers); ``li2019_capsules`` is N (0:
d_model); ``li2019_iterations`` is T.
"""

from contextlib import contextmanager
from functools import partial

import torch
import torch.nn as nn

from onmt_ext import kernels
from onmt_ext.options import (OptionSpec, layers_check, model_size, options_without_effect, register_options,
                              selected_layers, tensor_parallel_problems)
from onmt_ext.routing import call_compiled, em_routing, simple_routing

METHODS = ("concat", "simple", "em")


class RoutingAggregation(nn.Module):
    """Combines H attention heads by routing (li2019 eq. 5-12); replaces ``final_linear``.

    Args:
        heads: H.
        d_model: model size d (= H * dim_per_head).
        capsules: N output capsules of size d / N.
        method: ``"simple"`` or ``"em"``.
        iterations: routing iterations T.
        compile_routing: in training, run the routing through
            :func:`onmt_ext.routing.compiled` (``torch.compile``); the
            evaluation/translation path stays eager.

    ``forward(context)`` maps the concatenated heads ``(batch, len, d)`` to
    ``(batch, len, d)``.  Inside :func:`skipping_padding` (the encoder's
    self-attention) only the positions that are not padding are aggregated,
    and the padded ones are set to zero.
    """

    #: ``(batch, len)`` and the flat indices of the positions in use, set by :func:`skipping_padding`.
    positions = None

    def __init__(self, heads, d_model, capsules, method, iterations=3, compile_routing=False):
        super().__init__()
        if method not in ("simple", "em"):
            raise ValueError(f"routing method must be 'simple' or 'em', got {method!r}")
        if d_model % heads or d_model % capsules:
            raise ValueError(f"d_model {d_model} must be divisible by heads {heads} and capsules {capsules}")
        self.heads, self.d_model, self.capsules = heads, d_model, capsules
        self.method, self.iterations, self.compile_routing = method, iterations, compile_routing
        dim_per_head = d_model // heads
        # f_h (eq. 5): one (dim_per_head -> d_model) map per head
        self.input_weight = nn.Parameter(torch.empty(heads, dim_per_head, d_model))
        self.input_bias = nn.Parameter(torch.zeros(heads, d_model))
        # W_{h->n} (eq. 6): per head, d_model -> N capsules of d_model / N
        self.vote_weight = nn.Parameter(torch.empty(heads, d_model, d_model))
        if method == "em":
            self.beta_a = nn.Parameter(torch.zeros(capsules))
            self.beta_u = nn.Parameter(torch.zeros(capsules))
        self.reset_parameters()

    def reset_parameters(self):
        """Glorot-style initialisation of the per-head maps."""
        for weight in (self.input_weight, self.vote_weight):
            fan_in, fan_out = weight.shape[1], weight.shape[2]
            bound = (6.0 / (fan_in + fan_out)) ** 0.5
            nn.init.uniform_(weight, -bound, bound)

    def forward(self, context):
        fast = self.compile_routing and self.training and torch.is_grad_enabled()
        call = partial(call_compiled, aggregate_heads) if fast else aggregate_heads
        rows = None
        # the compiled path keeps every position: a different count each batch would recompile it
        if self.positions is not None and not fast and self.positions[0] == context.shape[:2]:
            rows = self.positions[1]
        return call(context, self.input_weight, self.input_bias, self.vote_weight, getattr(self, "beta_a", None),
                    getattr(self, "beta_u", None), heads=self.heads, capsules=self.capsules, method=self.method,
                    iterations=self.iterations, rows=rows)


#: Multiply-adds of the capsule maps (eq. 5-6) that leaving the padded positions out must save before
#: :func:`skipping_padding` does it.  Gathering the positions in use and scattering the outputs back cost
#: about 13 us per layer at the smoke shapes on one CPU thread (2026-11-26, AMD EPYC with AVX-512, one-off
#: script: index_select 3, new_zeros 2, index_copy_ 8), and there skipping 13.5% padding made a layer slower.
#: A padded position saves (H + 1) d^2 multiply-adds: about 5k at d = 32, 2.4M at Transformer-Base; this
#: bound lies between the two.
MIN_SKIPPED_WORK = 1 << 21


@contextmanager
def skipping_padding(aggregations, padding):
    """Let ``aggregations`` work only on the positions of ``padding`` ``(batch, len)`` (True at padding) that are False.

    The aggregation treats every position on its own, so leaving out the
    padded ones changes no other position's output, and a padded query
    position's output never reaches a real one (its key is masked in every
    attention).  In translation a batch of 32 sentences sorted by length is
    about 14% padding at the bench's 200 Tatoeba test sentences, and 21% at
    its 100.  Nothing is left out when that would save less than
    :data:`MIN_SKIPPED_WORK` multiply-adds per layer: at the smoke sizes the
    gather and scatter cost more than the padding does.
    """
    per_position = (aggregations[0].heads + 1) * aggregations[0].d_model ** 2 if aggregations else 0  # f_h, votes
    # (the first test spares small batches the search for the positions in use, which waits for the device)
    rows = None if padding.numel() * per_position < MIN_SKIPPED_WORK else (~padding).reshape(-1).nonzero()
    if rows is None or (padding.numel() - len(rows)) * per_position < MIN_SKIPPED_WORK:
        yield
        return
    positions = (tuple(padding.shape), rows.squeeze(1))
    for module in aggregations:
        module.positions = positions
    try:
        yield
    finally:
        for module in aggregations:
            module.positions = None


def aggregate_heads(context, input_weight, input_bias, vote_weight, beta_a, beta_u, *, heads, capsules, method,
                    iterations, rows=None):
    """The computation of :class:`RoutingAggregation` on its parameters (eq. 5-12).

    ``context`` ``(batch, len, d)`` holds the H heads side by side; returns
    the N output capsules side by side, ``(batch, len, d)``.  With ``rows``
    ``(R,)``, flat indices into ``batch * len``, only those positions are
    aggregated and the others are zero.  One function, so
    that ``-routing_compile`` compiles the capsule maps together with the
    routing.  The maps run head-major: f_h is one batched product over the
    heads, its bias is added in the in-place tanh's pass
    (:func:`onmt_ext.kernels.tanh_`), and the votes ``(H, B*L, d)`` reach the
    routing as a strided view ``(B*L, H, N, d/N)``, which the EM kernel reads
    without a copy.
    """
    batch, length, d_model = context.shape
    parameters = (input_weight, input_bias, vote_weight, beta_a, beta_u, heads, capsules, method, iterations)
    if rows is None:
        return _aggregate(context.reshape(batch * length, d_model), *parameters).view(batch, length, d_model)
    out = _aggregate(context.reshape(batch * length, d_model).index_select(0, rows), *parameters)
    return out.new_zeros(batch * length, d_model).index_copy_(0, rows, out).view(batch, length, d_model)


def _aggregate(context, input_weight, input_bias, vote_weight, beta_a, beta_u, heads, capsules, method, iterations):
    """:func:`aggregate_heads` on the positions ``context`` ``(positions, d)``; returns ``(positions, d)``."""
    positions, d_model = context.shape
    per_head = context.reshape(positions, heads, -1).transpose(0, 1)  # (H, P, d/H)
    capsules_in = kernels.tanh_(torch.bmm(per_head, input_weight), input_bias)  # eq. 5, (H, P, d)
    votes = torch.bmm(capsules_in, vote_weight)  # eq. 6, (H, P, d)
    votes = votes.view(heads, positions, capsules, -1).transpose(0, 1)  # (P, H, N, d/N)
    if method == "simple":
        out, _ = simple_routing(votes, iterations, normalize="outputs", weighted_mean=True)
    else:
        out, _ = em_routing(votes, iterations, beta_a=beta_a, beta_u=beta_u)
    return out.reshape(positions, d_model)


def _capsules_check(value, opt):
    if value < 0:
        return "must be >= 0 (0 means d_model)"
    if value and model_size(opt) % value:
        return f"must divide the model size {model_size(opt)}"
    return None


def _combination_check(opt):
    problems = []
    used = any(getattr(opt, name, "concat") != "concat" for name in _COMPONENTS)
    if not used:
        problems += options_without_effect(opt, [s for s in _SPECS if s.name not in _COMPONENTS],
                                           "-li2019_enc_self, -li2019_dec_self and -li2019_enc_dec are all 'concat'")
    if used:
        problems += tensor_parallel_problems(opt, "-li2019_* routing aggregation")
    if getattr(opt, "li2019_dec_self", "concat") != "concat" and getattr(opt, "self_attn_type", "") == "average":
        problems.append("-li2019_dec_self needs multi-head decoder self-attention, not -self_attn_type average")
    return problems


_COMPONENTS = ("li2019_enc_self", "li2019_dec_self", "li2019_enc_dec")

_SPECS = [
    OptionSpec("li2019_enc_self", str, "concat", "li2019: head aggregation of encoder self-attention",
               side="encoder", choices=METHODS),
    OptionSpec("li2019_dec_self", str, "concat", "li2019: head aggregation of decoder self-attention",
               side="decoder", choices=METHODS),
    OptionSpec("li2019_enc_dec", str, "concat", "li2019: head aggregation of encoder-decoder attention",
               side="decoder", choices=METHODS),
    OptionSpec("li2019_enc_layers", int, [], "li2019: encoder layers (1-based) to aggregate by routing; "
               "empty: all", side="encoder", nargs="*", check=layers_check("enc")),
    OptionSpec("li2019_dec_layers", int, [], "li2019: decoder layers (1-based) to aggregate by routing; "
               "empty: all", side="decoder", nargs="*", check=layers_check("dec")),
    OptionSpec("li2019_capsules", int, 0, "li2019: number N of output capsules (0: d_model, the paper's "
               "setting)", check=_capsules_check),
    OptionSpec("li2019_iterations", int, 3, "li2019: routing iterations T",
               check=lambda v, opt: None if v >= 1 else "must be >= 1"),
]

register_options(_SPECS, combination_check=_combination_check)


def _uses_routing(opt):
    return any(getattr(opt, name, "concat") != "concat" for name in _COMPONENTS)


register_options(
    [OptionSpec("routing_compile", bool, False, "compile li2019's head aggregation with torch.compile in training "
                "(fused kernels; the first step compiles for tens of seconds; translation stays eager)")],
    combination_check=lambda opt: [] if not getattr(opt, "routing_compile", False) or _uses_routing(opt) else
    ["-routing_compile has no effect without li2019 routing aggregation (-li2019_enc_self, -li2019_dec_self "
     "or -li2019_enc_dec)"],
)


def _aggregator(config, method):
    capsules = config.option("li2019_capsules") or config.d_model
    return RoutingAggregation(config.heads, config.d_model, capsules, method, config.option("li2019_iterations"),
                              compile_routing=config.option("routing_compile"))


def attach_encoder(encoder, config):
    """Replace ``final_linear`` of the selected encoder self-attentions."""
    method = config.option("li2019_enc_self")
    if method == "concat":
        return
    layers = selected_layers(config.option("li2019_enc_layers"), config.enc_layers)
    for i in layers:
        encoder.transformer[i].self_attn.final_linear = _aggregator(config, method)
    # for skipping_padding (a tuple, so that nn.Module does not register the layers' modules twice)
    encoder.routing_aggregations = tuple(encoder.transformer[i].self_attn.final_linear for i in layers)


def attach_decoder(decoder, config):
    """Replace ``final_linear`` of the selected decoder self- and context attentions."""
    for option, attribute in (("li2019_dec_self", "self_attn"), ("li2019_enc_dec", "context_attn")):
        method = config.option(option)
        if method == "concat":
            continue
        for i in selected_layers(config.option("li2019_dec_layers"), config.dec_layers):
            setattr(getattr(decoder.transformer_layers[i], attribute), "final_linear", _aggregator(config, method))
