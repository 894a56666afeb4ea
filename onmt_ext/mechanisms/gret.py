"""GRET: a global sentence representation from capsules over every encoder layer (Weng et al. 2020, "weng2020").

Encoder (:class:`GlobalRepresentation`), for each layer m with normalised states ``h^m`` ``(batch, len, d)``:
K capsules ``u^m_k = squash(sum_i c_ki W_k h^m_i)`` by simple routing over the unmasked positions (T iterations,
``W_k`` ``(d, d_c)`` shared by the layers); attentive pooling ``ATP(u^m) = sum_k softmax_k(FFN(u^m_k)) u^m_k``
``(batch, d_c)``; ``s^m = GRU(ATP(u^m), s^{m-1})``, ``s^0 = 0``.  ``s^M`` ``(batch, d)`` is the encoder's final
state.  Decoder (:class:`GlobalFusion`): ``g_j = sigmoid(W_g [r_j; s^M] + b_g)``, ``r'_j = r_j + g_j * s^M``
on the decoder output ``r_j`` ``(batch, len, d)``; ``s^M`` is decoding state, reordered with the beam.

Ablations: ``gret_pooling: mean``, ``gret_layers: last``, ``gret_gate: false``.  Our copy of the paper lost its
equations and numbers; what is legible and what we chose: docs/gret.md.  :func:`load_with_new_parameters` lets
``-train_from`` a baseline checkpoint initialise the new tensors (fine-tuning).
"""

from dataclasses import dataclass

import torch
import torch.nn as nn

from onmt_ext.runtime import compile as ext_compile
from onmt_ext.mechanisms import initialisation, normalisation
from onmt_ext.errors import UsageError
from onmt_ext.options import EXT_TYPE, model_size, option, options_without_effect, register_mechanism
from onmt_ext.patches import NEEDED, patch
from onmt_ext.mechanisms.routing import prepare_kernels, simple_routing
from onmt_ext.mechanisms.state import DecodingStateModule

# OpenNMT-py is imported inside the functions: importing it while this module initialises would activate
# onmt-ext (onmt_ext._autoload) before this module is whole.

POOLINGS = ("capsules", "mean")
LAYER_CHOICES = ("all", "last")


class GlobalRepresentation(nn.Module):
    """The global state ``s^M`` from the encoder's layer outputs (capsules, ATP, layer-wise GRU).

    Args:
        d_model: d.
        layers: M, the number of encoder layers.
        capsules: K.
        capsule_dim: d_c.
        iterations: routing iterations T.
        pooling: ``"capsules"`` or ``"mean"`` (the "no capsules" ablation).
        aggregate: ``"all"`` layers through the GRU, or the ``"last"`` only.
        eps: epsilon of the per-layer layer norms.
        normalise: give each summarised layer a layer norm of its own (False with ``-ext_layer_norm post``,
            whose layers already hand on normalised states).

    Usage: :meth:`observe` is registered as a forward hook on every encoder
    layer; :meth:`summarise` then maps the observed outputs and the
    ``(batch, len)`` mask to ``s^M`` ``(batch, d)``: the layer norms, routing
    and pooling run in :func:`global_summary` (compiled with ``-ext_compile``),
    the GRU over the M layers eager.
    """

    ext_compile = False
    #: ``-ext_compile auto`` (the default) compiles the core in training on CUDA: it measured faster there
    #: (the GPU run that docs/compile.md cites, in results/gpu/)
    compile_on_cuda = True

    def __init__(self, d_model, layers, capsules=4, capsule_dim=None, iterations=3, pooling="capsules",
                 aggregate="all", eps=1e-6, normalise=True):
        super().__init__()
        if pooling not in POOLINGS or aggregate not in LAYER_CHOICES:
            raise ValueError(f"pooling must be one of {POOLINGS} and aggregate one of {LAYER_CHOICES}")
        self.capsules, self.iterations, self.pooling, self.aggregate = capsules, iterations, pooling, aggregate
        self.capsule_dim = capsule_dim or d_model // capsules
        self.used = list(range(layers)) if aggregate == "all" else [layers - 1]
        self.eps = eps
        # one layer norm per summarised layer, applied to all of them at once
        self.norm_weight = nn.Parameter(torch.ones(len(self.used), d_model)) if normalise else None
        self.norm_bias = nn.Parameter(torch.zeros(len(self.used), d_model)) if normalise else None
        pooled = d_model
        if pooling == "capsules":
            self.vote_maps = nn.Parameter(torch.empty(capsules, d_model, self.capsule_dim))  # W_k
            self.pool_scorer = nn.Sequential(nn.Linear(self.capsule_dim, self.capsule_dim), nn.ReLU(),
                                             nn.Linear(self.capsule_dim, 1))
            pooled = self.capsule_dim
        # runs over the layers, s^0 = 0; time-major, as the pooled states come: the batch-first layout
        # made cuDNN copy its input and gradient (the same parameters and arithmetic)
        self.gru = nn.GRU(pooled, d_model)
        self._seen = []
        initialisation.initialise(self)

    def observe(self, layer, args, output):
        """Forward hook of an encoder layer: remember its output ``(batch, len, d)``."""
        self._seen.append(output)

    def start(self):
        """Forget the layer outputs of the previous batch."""
        self._seen = []

    def summarise(self, keep):
        """``s^M`` ``(batch, d)`` from the observed layer outputs; ``keep`` ``(batch, len)`` marks real tokens.

        Every layer is normalised, routed and pooled in one batched pass over
        ``(M, batch, len, d)``; only the GRU steps from layer to layer.
        """
        seen, self._seen = self._seen, []
        if len(seen) <= self.used[-1]:
            raise RuntimeError(f"GRET saw {len(seen)} encoder layer outputs, expected {self.used[-1] + 1}")
        hidden = torch.stack([seen[index] for index in self.used])  # (M, B, L, d)
        scorer = self.pool_scorer if self.pooling == "capsules" else None
        prepare_kernels(hidden)
        pooled = ext_compile.run(
            self.ext_compile, global_summary, hidden, keep, self.norm_weight, self.norm_bias,
            getattr(self, "vote_maps", None), scorer[0].weight if scorer else None, scorer[0].bias if scorer else None,
            scorer[2].weight if scorer else None, scorer[2].bias if scorer else None, eps=self.eps,
            capsules=self.capsules, iterations=self.iterations)  # (M, B, d_c or d)
        _, final = self.gru(pooled)  # over the M layers: (1, B, d)
        return final[0]


def global_summary(hidden, keep, norm_weight, norm_bias, vote_maps, scorer_weight, scorer_bias, score_weight,
                   score_bias, *, eps, capsules, iterations):
    """The GRU's inputs: every summarised layer normalised and pooled, ``(M, batch, d_c)`` or ``(M, batch, d)``.

    Args:
        hidden: the M layer outputs ``(M, batch, len, d)``.
        keep: ``(batch, len)``, True at real tokens.
        norm_weight, norm_bias: the per-layer layer norms ``(M, d)``; None: the states as they are (post-norm
            layers hand on normalised states).
        vote_maps: W_k ``(K, d, d_c)``; None pools by a masked mean (the
            "no capsules" ablation).
        scorer_weight, scorer_bias, score_weight, score_bias: the ATP scorer
            ``Linear(d_c, d_c), ReLU, Linear(d_c, 1)``.
        eps: epsilon of the layer norms.
        capsules: K.  iterations: routing iterations T.

    Every layer is normalised, routed and pooled in one batched pass: votes
    ``W_k h_i`` ``(M, batch, len, K, d_c)``, simple routing over the real
    tokens to K capsules, then attentive pooling over the capsules.
    """
    if norm_weight is not None:
        hidden = torch.nn.functional.layer_norm(hidden, hidden.shape[-1:], eps=eps)
        hidden = torch.addcmul(norm_bias[:, None, None].to(hidden.dtype), hidden,
                               norm_weight[:, None, None].to(hidden.dtype))
    if vote_maps is None:
        weights = keep.to(hidden.dtype).unsqueeze(-1)
        return (hidden * weights).sum(dim=2) / weights.sum(dim=1).clamp(min=1.0)
    capsule_dim = vote_maps.size(-1)
    maps = vote_maps.to(hidden.dtype).transpose(0, 1).reshape(hidden.size(-1), -1)  # (d, K * d_c)
    votes = (hidden @ maps).unflatten(-1, (capsules, capsule_dim))  # W_k h_i: (M, B, I, K, d_c)
    mask = keep.expand(hidden.size(0), *keep.shape)
    capsule_out, _ = simple_routing(votes, iterations, normalize="inputs", mask=mask,
                                    need_logits=False)  # (M, B, K, d_c)
    dtype = capsule_out.dtype
    scores = torch.nn.functional.linear(
        torch.relu(torch.nn.functional.linear(capsule_out, scorer_weight.to(dtype), scorer_bias.to(dtype))),
        score_weight.to(dtype), score_bias.to(dtype))
    attention = torch.softmax(scores.squeeze(-1).float(), dim=-1).to(dtype)
    return (attention.unsqueeze(-1) * capsule_out).sum(dim=2)


class GlobalFusion(DecodingStateModule):
    """Fuses the global state into the decoder output: ``r' = r + g * s`` with a context gate (or ``r + s``).

    Args:
        d_model: d.
        gate: use the context gate ``g = sigmoid(W_g [r; s] + b_g)``.

    ``forward(dec_out)`` maps ``(batch, len, d)`` to ``(batch, len, d)``; the
    global state ``(batch, d)`` is the decoding state ``"global"``, set from
    the encoder's final state by :meth:`init_decoding_state`.  The fusion is
    :func:`fuse` (compiled with ``-ext_compile``).
    """

    ext_compile = False
    #: ``-ext_compile auto`` (the default) compiles the core in training on CUDA: it measured faster there
    #: (the GPU run that docs/compile.md cites, in results/gpu/)
    compile_on_cuda = True

    def __init__(self, d_model, gate=True):
        super().__init__()
        self.gate = nn.Linear(2 * d_model, d_model) if gate else None
        initialisation.initialise(self)

    def init_decoding_state(self, src, enc_out, enc_final_hs):
        if not torch.is_tensor(enc_final_hs) or enc_final_hs.dim() != 2:
            raise RuntimeError("GRET's decoder needs the global state from a GRET encoder (-gret true on "
                               f"-encoder_type {EXT_TYPE}); the encoder returned {type(enc_final_hs).__name__}")
        self.decoding_state = {"global": enc_final_hs}
        if self.gate is not None:  # the global state's part of the gate, W_g[:, d:] s + b_g, once per sentence
            d = enc_final_hs.size(-1)
            self.decoding_state["gate_bias"] = torch.nn.functional.linear(
                enc_final_hs, self.gate.weight[:, d:], self.gate.bias)

    def forward(self, dec_out):
        state = self.decoding_state.get("global")
        if state is None:
            raise RuntimeError("GRET's decoder state is missing: decoder.init_state was not called")
        if self.gate is None:
            return ext_compile.run(self.ext_compile, fuse, dec_out, state, None, None)
        return ext_compile.run(self.ext_compile, fuse, dec_out, state, self.gate.weight,
                               self.decoding_state["gate_bias"])


def fuse(dec_out, state, gate_weight, gate_bias):
    """``r' = r + g * s`` with ``g = sigmoid(W_g[:, :d] r + (W_g[:, d:] s + b_g))``, or ``r + s`` without a gate.

    Args:
        dec_out: the decoder output r ``(batch, len, d)``.
        state: the global state s ``(batch, d)``.
        gate_weight: W_g ``(d, 2d)``, or None (no gate).
        gate_bias: the per-sentence part ``W_g[:, d:] s + b_g`` ``(batch, d)``, computed once per sentence.
    """
    state = state.to(dec_out.dtype).unsqueeze(1).expand_as(dec_out)  # (B, T, d)
    if gate_weight is None:
        return dec_out + state
    d = dec_out.size(-1)
    gate = torch.sigmoid(torch.nn.functional.linear(dec_out, gate_weight[:, :d].to(dec_out.dtype))
                         + gate_bias.to(dec_out.dtype).unsqueeze(1))
    return torch.addcmul(dec_out, gate, state)


# ----------------------------------------------------------------------------- options

def _representation_rules(module):
    """:class:`GlobalRepresentation`: layer-norm gains one and shifts zero, each capsule map ``W_k`` (d by d_c)
    and the ATP scorer's linears Glorot uniform with zero biases, the GRU Glorot per gate with zero biases."""
    rules = {} if module.norm_weight is None else {"norm_weight": initialisation.ONES,
                                                     "norm_bias": initialisation.ZEROS}
    if module.pooling == "capsules":
        rules["vote_maps"] = initialisation.GLOROT
        rules.update({f"pool_scorer.{i}.{kind}": initialisation.GLOROT if kind == "weight" else initialisation.ZEROS
                      for i in (0, 2) for kind in ("weight", "bias")})
    rules.update({f"gru.{name}": rule for name, rule in initialisation.rnn_rules(module.gru).items()})
    return rules


initialisation.register("onmt_ext.mechanisms.gret.GlobalRepresentation", _representation_rules)
initialisation.register("onmt_ext.mechanisms.gret.GlobalFusion", lambda m: {} if m.gate is None else {
    "gate.weight": initialisation.GLOROT, "gate.bias": initialisation.ZEROS})


def _combination_check(opt):
    problems = []
    gret = Gret.from_opt(opt)
    if not gret.enabled:
        return options_without_effect(opt, Gret.specs[1:], "-gret is false")
    for side in ("encoder", "decoder"):
        if getattr(opt, f"{side}_type", None) != EXT_TYPE:
            problems.append(f"-gret needs -{side}_type {EXT_TYPE} (the encoder builds the global state, the "
                            "decoder fuses it)")
    if gret.pooling == "mean":  # the masked mean: no capsules, no routing
        problems += options_without_effect(opt, [Gret.spec_of[name] for name in ("capsules", "iterations",
                                                                                 "capsule_dim")],
                                           "-gret_pooling is mean")
    elif gret.capsules >= 1 and not gret.capsule_dim and model_size(opt) % gret.capsules:
        problems.append(f"-gret_capsules {gret.capsules} does not divide the model size {model_size(opt)} "
                        "(d_c = d_model / K); set -gret_capsule_dim")
    return problems


def _positive(v, opt):
    return None if v >= 1 else "must be >= 1"


@register_mechanism("gret_", combination_check=_combination_check)
@dataclass(frozen=True)
class Gret:
    """GRET's options: ``-gret`` and ``-gret_<field>``."""

    enabled: bool = option(False, "weng2020 GRET: global state from capsules over every encoder layer, fused into "
                           "the decoder output by a context gate", name="gret")
    capsules: int = option(4, "GRET: capsules K per encoder layer", check=_positive)
    iterations: int = option(3, "GRET: dynamic routing iterations T", check=_positive)
    capsule_dim: int = option(0, "GRET: capsule size d_c (0: d_model / K)",
                              check=lambda v, opt: None if v >= 0 else "must be >= 0 (0: d_model / K)")
    pooling: str = option("capsules", "GRET: capsules with attentive pooling, or mean (the 'no capsules' ablation)",
                          choices=POOLINGS)
    layers: str = option("all", "GRET: all encoder layers through the layer-wise GRU, or the last only (the 'no "
                         "layer aggregation' ablation)", choices=LAYER_CHOICES)
    gate: bool = option(True, "GRET: context gate on the fused global state (false: plain addition, the 'no gate' "
                        "ablation)")


def attach_encoder(encoder, config):
    """With ``gret``: build the global representation and let it observe every encoder layer."""
    gret = config.of(Gret)
    if not gret.enabled:
        return
    encoder.gret = GlobalRepresentation(config.d_model, len(encoder.transformer), gret.capsules,
                                        gret.capsule_dim or None, gret.iterations, gret.pooling, gret.layers,
                                        normalise=not normalisation.post_norm(config))
    for layer in encoder.transformer:
        layer.register_forward_hook(encoder.gret.observe)


def attach_decoder(decoder, config):
    """With ``gret``: the context-gated fusion of the global state into the decoder output."""
    gret = config.of(Gret)
    if gret.enabled:
        decoder.gret = GlobalFusion(config.d_model, gret.gate)


def load_with_new_parameters(stock_load):
    """Wrap OpenNMT-py's ``BaseModel.load_state_dict`` to accept checkpoints that lack onmt-ext's new parameters.

    When a strict load would fail only because tensors of onmt-ext mechanism
    modules are missing from the checkpoint (fine-tuning a mechanism from a
    baseline, as GRET is trained), the checkpoint's tensors are loaded, the
    missing ones are initialised as in a model trained from scratch (each by
    its stated rule, see :func:`_initialise`), and both lists are
    logged.  Non-persistent buffers, which no checkpoint holds, are left as built, without a word.  Any other
    missing tensor still fails as in stock OpenNMT-py.
    """

    def load_state_dict(self, checkpoint, *args, strict=True, **kwargs):
        if not strict or "model" not in checkpoint:
            return stock_load(self, checkpoint, *args, strict=strict, **kwargs)
        names = set(checkpoint["model"]) | {f"generator.{k}" for k in (checkpoint.get("generator") or {})}
        problem = layer_norm_problem({name for name, _ in _tensors(self)}, names)
        if problem:
            raise UsageError(problem)
        never_saved = _never_saved(self)
        missing = [name for name, _ in _tensors(self) if name not in names]
        saved_missing = [name for name in missing if name not in never_saved]
        new = [name for name in saved_missing if initialisation.added_by_mechanism(self, name)]
        if not missing or len(new) != len(saved_missing):
            return stock_load(self, checkpoint, *args, strict=strict, **kwargs)
        if new:
            _initialise(self, new)
            from onmt.utils.logging import logger

            loaded = len(list(_tensors(self))) - len(never_saved) - len(new)
            logger.info("onmt-ext: %d tensors loaded from the checkpoint; %d new tensors of onmt-ext mechanisms "
                        "initialised: %s", loaded, len(new), ", ".join(new))
        return stock_load(self, checkpoint, *args, strict=False, **kwargs)

    return load_state_dict


#: the stacks' final layer norms, which pre-norm models have and post-norm ones lack (docs/normalisation.md)
_FINAL_NORMS = ("encoder.layer_norm.weight", "decoder.layer_norm.weight")


def layer_norm_problem(model_names, checkpoint_names):
    """One line when the checkpoint's ``-ext_layer_norm`` differs from the model's, else None.

    Told by the stacks' final layer norms (:data:`_FINAL_NORMS`), which only pre-norm has.  Stock would fail on
    missing or extra keys without naming the option (``pre`` to ``post`` fine-tuning of GRET included).
    """
    mine, theirs = (["pre" if name in names else "post" for name in _FINAL_NORMS]
                    for names in (model_names, checkpoint_names))
    if mine == theirs or len(set(mine)) > 1 or len(set(theirs)) > 1:  # one stack stock pre-norm: not this case
        return None
    mine, theirs = mine[0], theirs[0]
    has = "has" if theirs == "pre" else "lacks"
    return (f"-ext_layer_norm {mine}: the checkpoint was trained with -ext_layer_norm {theirs} (it {has} the final "
            f"layer norms encoder.layer_norm and decoder.layer_norm); fine-tune with -ext_layer_norm {theirs}, the "
            "checkpoint's placement (docs/normalisation.md)")


def _tensors(model):
    yield from model.named_parameters()
    yield from model.named_buffers()


def _never_saved(model):
    """The names of ``model``'s non-persistent buffers, which no checkpoint holds (clause attention's marker
    tables, rebuilt from the vocabulary); OpenNMT-py's strict load asks the checkpoint for them all the same."""
    return {f"{prefix}.{name}" if prefix else name for prefix, module in model.named_modules()
            for name, _ in module.named_buffers(recurse=False) if name in module._non_persistent_buffers_set}


def _initialise(model, names):
    """Initialise the new tensors ``names`` as a fresh model has them: each by its stated rule
    (:mod:`onmt_ext.mechanisms.initialisation`); buffers keep the value their constructor gave them."""
    initialisation.initialise(model, set(names))


def _load_state_dict_with_new_parameters(stock, self, *args, **kwargs):
    return load_with_new_parameters(stock)(self, *args, **kwargs)


def load_checkpoints_with_new_parameters():
    """Let ``-train_from`` a baseline checkpoint initialise the new tensors of mechanisms
    (:func:`load_with_new_parameters`)."""
    from onmt.models.model import BaseModel

    patch(BaseModel, "load_state_dict", _load_state_dict_with_new_parameters, kind=NEEDED, order=2,
          reason="fine-tuning a mechanism from a baseline checkpoint (GRET) initialises the tensors the baseline "
                 "lacks and logs them",
          test="tests/integration/test_cli_pipeline.py::test_gret_fine_tunes_from_a_baseline_checkpoint")
