"""Routing-by-agreement aggregation of multi-head attention (li2019, docs/li2019.md).

Li et al. (NAACL 2019) replace the concatenation + linear map that combines
the H heads (eq. 3-4) with routing between capsules: input capsules
``f_h(O_h) = tanh(O_h W_h + b_h)`` of ``d_model`` values (eq. 5), votes
``V_{h->n}`` for N output capsules of ``d_model / N`` (eq. 6), simple (Alg. 1,
eq. 7-8) or EM (Alg. 2, eq. 9-12) routing from :mod:`onmt_ext.mechanisms.routing`, and
the output capsules concatenated.  :class:`RoutingAggregation` replaces the
``final_linear`` of a ``MultiHeadedAttention``, which every attention path
applies (the decoding cache's too); each position is aggregated on its own.

Options: ``li2019_enc_self``, ``li2019_dec_self``, ``li2019_enc_dec`` (``concat`` = stock, ``simple``, ``em``),
``li2019_enc_layers`` / ``li2019_dec_layers`` (1-based; empty: all), ``li2019_capsules`` (N; 0: d_model),
``li2019_iterations`` (T), ``li2019_recompute`` (default on), EM's open choices ``li2019_em_density``,
``li2019_em_lambda`` and ``li2019_em_min_var`` (docs/li2019.md).
"""

from dataclasses import dataclass
from typing import List

import torch
import torch.nn as nn

from onmt_ext.runtime import compile as ext_compile
from onmt_ext.options import (layers_check, model_size, option, options_without_effect, register_mechanism,
                              selected_layers, tensor_parallel_problems)
from onmt_ext.mechanisms import initialisation
from onmt_ext.mechanisms.routing import (em_routing, linear_inverse_temperature, prepare_kernels,
                                         recompute_in_backward, simple_routing)

METHODS = ("concat", "simple", "em")


class RoutingAggregation(nn.Module):
    """Combines H attention heads by routing (li2019 eq. 5-12); replaces ``final_linear``.

    Args:
        heads: H.
        d_model: model size d (= H * dim_per_head).
        capsules: N output capsules of size d / N.
        method: ``"simple"`` or ``"em"``.
        iterations: routing iterations T.
        recompute: in training, keep only the inputs for the backward pass
            and run the computation again there (see :func:`aggregate_heads`).
        em: EM's choices (:class:`EmChoices`); the defaults: product density,
            lambda 1, variance floor 1e-4.

    ``forward(context)`` maps the concatenated heads ``(batch, len, d)`` to
    ``(batch, len, d)`` through :func:`aggregate_heads` (compiled with
    ``-ext_compile``, see :mod:`onmt_ext.runtime.compile`).
    """

    ext_compile = False
    #: outside ``-ext_compile_layers``'s layer graphs: Dynamo cannot trace the recompute's checkpoint inside
    #: another graph; the core still compiles on its own with ``-ext_compile``
    layer_graph_boundary = True

    def __init__(self, heads, d_model, capsules, method, iterations=3, recompute=True, em=None):
        super().__init__()
        if method not in ("simple", "em"):
            raise ValueError(f"routing method must be 'simple' or 'em', got {method!r}")
        if d_model % heads or d_model % capsules:
            raise ValueError(f"d_model {d_model} must be divisible by heads {heads} and capsules {capsules}")
        self.heads, self.d_model, self.capsules = heads, d_model, capsules
        self.method, self.iterations, self.recompute = method, iterations, bool(recompute)
        self.em = em or EmChoices()
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
        prepare_kernels(context)
        return ext_compile.run(self.ext_compile, aggregate_heads, context, self.input_weight, self.input_bias,
                               self.vote_weight, getattr(self, "beta_a", None), getattr(self, "beta_u", None),
                               heads=self.heads, capsules=self.capsules, method=self.method,
                               iterations=self.iterations, recompute=self.recompute, em=self.em)


def aggregate_heads(context, input_weight, input_bias, vote_weight, beta_a, beta_u, *, heads, capsules, method,
                    iterations, recompute=True, em=None):
    """The computation of :class:`RoutingAggregation` on its parameters (eq. 5-12).

    ``context`` ``(batch, len, d)`` holds the H heads side by side; returns
    the N output capsules side by side, ``(batch, len, d)``.  Every position
    is aggregated on its own (padded ones too: their outputs never reach a
    real position, whose attention masks them).  The maps run head-major:
    f_h is one batched product over the heads ``(H, B*L, d/H) x (H, d/H, d)``
    and the votes ``(H, B*L, d)`` reach the routing as a view
    ``(B*L, H, N, d/N)``.

    With ``recompute`` and grad enabled, the backward pass keeps only the
    arguments and runs this computation again
    (:func:`~onmt_ext.mechanisms.routing.recompute_in_backward`; same gradients, bitwise;
    memory: docs/li2019.md).
    """
    kwargs = dict(heads=heads, capsules=capsules, method=method, iterations=iterations, em=em or EmChoices())
    if recompute:
        return recompute_in_backward(_aggregate_heads, context, input_weight, input_bias, vote_weight, beta_a,
                                     beta_u, **kwargs)
    return _aggregate_heads(context, input_weight, input_bias, vote_weight, beta_a, beta_u, **kwargs)


def _aggregate_heads(context, input_weight, input_bias, vote_weight, beta_a, beta_u, *, heads, capsules, method,
                     iterations, em):
    """:func:`aggregate_heads` itself, every tensor kept for backward."""
    batch, length, d_model = context.shape
    positions = batch * length
    per_head = context.reshape(positions, heads, -1).transpose(0, 1)  # (H, P, d/H)
    capsules_in = torch.tanh(torch.baddbmm(input_bias.unsqueeze(1), per_head, input_weight))  # eq. 5, (H, P, d)
    votes = torch.bmm(capsules_in, vote_weight)  # eq. 6, (H, P, d)
    votes = votes.view(heads, positions, capsules, -1).transpose(0, 1)  # (P, H, N, d/N)
    if method == "simple":
        out, _ = simple_routing(votes, iterations, normalize="outputs", weighted_mean=True, need_logits=False)
    else:
        out, _ = em_routing(votes, iterations, beta_a=beta_a, beta_u=beta_u, density=em.density,
                            inverse_temperature=em.schedule(), min_var=em.min_var)
    return out.reshape(batch, length, d_model)


@dataclass(frozen=True)
class EmChoices:
    """EM routing's choices that li2019 leaves open (NOTES.md; docs/li2019.md), as :func:`em_routing` takes them.

    ``density``: ``"product"`` (Hinton et al.) or ``"sum"`` (eq. 12's text); ``inverse_temperature``: ``()``
    (lambda = 1 throughout), ``(a,)`` (a throughout) or ``(a, b)`` (rising linearly from a to b); ``min_var``: the
    variance floor.  The defaults are the fused kernels' case (docs/kernels.md); any other runs in PyTorch.
    """

    density: str = "product"
    inverse_temperature: tuple = ()
    min_var: float = 1e-4

    def schedule(self):
        """:func:`em_routing`'s ``inverse_temperature``: None (lambda = 1) or a linear schedule."""
        if self.inverse_temperature in ((), (1.0,)):
            return None
        return linear_inverse_temperature(self.inverse_temperature[0], self.inverse_temperature[-1])


def _lambda_check(value, opt):
    if len(value) > 2:
        return "takes at most two values: lambda throughout, or at the first and the last iteration"
    if any(not v > 0 for v in value):
        return "must be > 0"
    return None


def _capsules_check(value, opt):
    if value < 0:
        return "must be >= 0 (0 means d_model)"
    if value and model_size(opt) % value:
        return f"must divide the model size {model_size(opt)}"
    return None


def _combination_check(opt):
    problems = []
    li2019 = Li2019.from_opt(opt)
    used = any(method != "concat" for method in (li2019.enc_self, li2019.dec_self, li2019.enc_dec))
    if not used:
        problems += options_without_effect(opt, Li2019.specs[3:],  # all but the three components
                                           "-li2019_enc_self, -li2019_dec_self and -li2019_enc_dec are all 'concat'")
    if used:
        problems += tensor_parallel_problems(opt, "-li2019_* routing aggregation")
        if li2019.enc_self == "concat":
            problems += options_without_effect(opt, [Li2019.spec_of["enc_layers"]], "-li2019_enc_self is 'concat'")
        if "em" not in (li2019.enc_self, li2019.dec_self, li2019.enc_dec):
            problems += options_without_effect(opt, [Li2019.spec_of[name] for name in ("em_density", "em_lambda",
                                                                                        "em_min_var")],
                                               "no component uses EM routing (-li2019_* em)")
        if li2019.dec_self == "concat" and li2019.enc_dec == "concat":
            problems += options_without_effect(opt, [Li2019.spec_of["dec_layers"]],
                                               "-li2019_dec_self and -li2019_enc_dec are both 'concat'")
    if li2019.dec_self != "concat" and getattr(opt, "self_attn_type", "") == "average":
        problems.append("-li2019_dec_self needs multi-head decoder self-attention, not -self_attn_type average")
    return problems


def _rules(module):
    """Each parameter's initialisation (its ``reset_parameters`` draws the same)."""
    rules = {"input_weight": initialisation.GLOROT, "input_bias": initialisation.ZEROS,
             "vote_weight": initialisation.GLOROT}
    rules.update({name: initialisation.ZEROS for name in ("beta_a", "beta_u") if hasattr(module, name)})
    return rules


initialisation.register("onmt_ext.mechanisms.li2019.RoutingAggregation", _rules)


@register_mechanism("li2019_", combination_check=_combination_check)
@dataclass(frozen=True)
class Li2019:
    """li2019's options, ``-li2019_<field>``."""

    enc_self: str = option("concat", "li2019: head aggregation of encoder self-attention", side="encoder",
                           choices=METHODS)
    dec_self: str = option("concat", "li2019: head aggregation of decoder self-attention", side="decoder",
                           choices=METHODS)
    enc_dec: str = option("concat", "li2019: head aggregation of encoder-decoder attention", side="decoder",
                          choices=METHODS)
    enc_layers: List[int] = option([], "li2019: encoder layers (1-based) to aggregate by routing; empty: all",
                                   side="encoder", check=layers_check("enc"))
    dec_layers: List[int] = option([], "li2019: decoder layers (1-based) to aggregate by routing; empty: all",
                                   side="decoder", check=layers_check("dec"))
    capsules: int = option(0, "li2019: number N of output capsules (0: d_model, the paper's setting)",
                           check=_capsules_check)
    iterations: int = option(3, "li2019: routing iterations T",
                             check=lambda v, opt: None if v >= 1 else "must be >= 1")
    recompute: bool = option(True, "li2019: in training, keep only the routing's inputs for the backward pass and "
                             "run the routing again there (same gradients, a fraction of the memory, one more "
                             "forward pass of the routing); false keeps every routing tensor")
    em_density: str = option("product", "li2019 EM (eq. 12): the density of a vote under an output capsule: product "
                             "of the per-dimension Gaussian densities (Hinton et al.) or their sum (eq. 12's text)",
                             choices=("product", "sum"))
    em_lambda: List[float] = option([], "li2019 EM: the inverse temperature lambda of the activation: none given: 1 "
                                    "throughout; one value: that value throughout; two: rising linearly from the "
                                    "first iteration's to the last's (Hinton et al.'s suggestion)",
                                    check=_lambda_check)
    em_min_var: float = option(1e-4, "li2019 EM: the floor added to every variance (keeps a collapsed capsule's "
                               "densities and gradients finite)",
                               check=lambda v, opt: None if v > 0 else "must be > 0")


def _aggregator(config, method):
    li2019 = config.of(Li2019)
    em = EmChoices(li2019.em_density, tuple(li2019.em_lambda), li2019.em_min_var)
    return RoutingAggregation(config.heads, config.d_model, li2019.capsules or config.d_model, method,
                              li2019.iterations, li2019.recompute, em)


def attach_encoder(encoder, config):
    """Replace ``final_linear`` of the selected encoder self-attentions."""
    li2019 = config.of(Li2019)
    if li2019.enc_self == "concat":
        return
    for i in selected_layers(li2019.enc_layers, config.enc_layers):
        encoder.transformer[i].self_attn.final_linear = _aggregator(config, li2019.enc_self)


def attach_decoder(decoder, config):
    """Replace ``final_linear`` of the selected decoder self- and context attentions."""
    li2019 = config.of(Li2019)
    for method, attribute in ((li2019.dec_self, "self_attn"), (li2019.enc_dec, "context_attn")):
        if method == "concat":
            continue
        for i in selected_layers(li2019.dec_layers, config.dec_layers):
            setattr(getattr(decoder.transformer_layers[i], attribute), "final_linear", _aggregator(config, method))
