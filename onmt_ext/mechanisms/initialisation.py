"""The stated initialisation of every parameter the mechanisms add.

OpenNMT-py's ``-param_init_glorot`` goes by a tensor's name: a matrix ``weight`` gets ``xavier_uniform_`` over
the whole tensor, a ``bias`` zeros; anything else (an RNN's ``weight_ih_l0``, a capsule map, a mixing logit)
keeps its constructor's draw, and a 3-D ``weight`` is treated as a convolution kernel.  So each mechanism module
declares a :class:`Rule` per parameter it adds (:data:`RULES`, one function per module class; a stock parameter
inside it, such as chen2019's word look-up, is ``stock``), and :func:`initialise` applies them in the
mechanism's constructor and again right after OpenNMT-py's own initialisation in ``build_model``
(:func:`install`), with ``-param_init a`` too.

Per-paper tables: "Parameters and initialisation" in docs/<paper>.md; ``tests/unit/test_initialisation.py``
fails on a parameter no rule covers and on values that do not fit their rule.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from onmt_ext.mechanisms import routing
from onmt_ext.runtime import compile as ext_compile
from onmt_ext.patches import NEEDED, patch

# OpenNMT-py is imported inside the functions: importing it while this module initialises would activate
# onmt-ext (onmt_ext._autoload) before this module is whole.

KINDS = ("glorot", "zeros", "ones", "uniform", "stock")


@dataclass(frozen=True)
class Rule:
    """How one parameter is initialised.

    ``kind``:

    * ``glorot``: Glorot/Xavier uniform ``U(-b, b)``, ``b = sqrt(6 / (fan_in + fan_out))``, for each
      matrix over the last two dimensions (a tensor ``(H, a, c)`` holds H maps of ``a`` by ``c``); with
      ``blocks = g`` the rows are cut into g stacked maps (the gates of a GRU/LSTM: ``(g * units, in)``).
    * ``zeros`` / ``ones``: the constant.
    * ``uniform``: ``U(-bound, bound)`` (PyTorch's own RNN initialisation, ``bound = 1 / sqrt(units)``).
    * ``stock``: left to OpenNMT-py's initialisation (a stock parameter inside a mechanism module).
    """

    kind: str
    blocks: int = 1
    bound: float = 0.0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"rule kind must be one of {KINDS}, got {self.kind!r}")

    def glorot_bound(self, shape):
        """The Glorot bound of one matrix of a tensor of ``shape``."""
        rows = shape[-2] // self.blocks if len(shape) > 1 else 1
        return math.sqrt(6.0 / (rows + shape[-1]))

    @torch.no_grad()
    def apply(self, tensor):
        """Draw ``tensor`` in place by this rule (``stock``: untouched)."""
        if self.kind == "glorot":
            nn.init.uniform_(tensor, -self.glorot_bound(tensor.shape), self.glorot_bound(tensor.shape))
        elif self.kind == "zeros":
            tensor.zero_()
        elif self.kind == "ones":
            tensor.fill_(1.0)
        elif self.kind == "uniform":
            nn.init.uniform_(tensor, -self.bound, self.bound)

    def describe(self):
        """The rule in words, as in the docs' tables."""
        if self.kind == "glorot":
            return "Glorot uniform" + (f" per gate ({self.blocks} stacked maps)" if self.blocks > 1 else "")
        if self.kind == "uniform":
            return f"U(-{self.bound:.4g}, {self.bound:.4g})"
        return {"zeros": "zeros", "ones": "ones", "stock": "OpenNMT-py's (stock parameter)"}[self.kind]

    def mismatch(self, tensor):
        """Why ``tensor`` cannot have been drawn by this rule (a message), or None.

        Constants must match exactly; a uniform draw must stay inside its bound and, from 64 values on,
        have a standard deviation within 30% of ``bound / sqrt(3)``.
        """
        values = tensor.detach().float()
        if self.kind == "stock":
            return None
        if self.kind in ("zeros", "ones"):
            target = 0.0 if self.kind == "zeros" else 1.0
            return None if bool((values == target).all()) else f"expected all {target}"
        bound = self.glorot_bound(tensor.shape) if self.kind == "glorot" else self.bound
        if values.abs().max() > bound * (1 + 1e-6):
            return f"a value {values.abs().max():.4g} beyond the bound {bound:.4g}"
        if values.numel() >= 64:
            std, expected = values.std().item(), bound / math.sqrt(3)
            if not 0.7 * expected <= std <= 1.3 * expected:
                return f"std {std:.4g}, expected about {expected:.4g}"
        return None


GLOROT, ZEROS, ONES, STOCK = Rule("glorot"), Rule("zeros"), Rule("ones"), Rule("stock")

#: Number of stacked maps in the matrices of PyTorch's recurrent cells.
GATES = {nn.RNN: 1, nn.GRU: 3, nn.LSTM: 4}


def rnn_rules(rnn, init="glorot"):
    """Rules for a one-layer ``nn.RNN``/``nn.GRU``/``nn.LSTM`` (either direction).

    ``glorot``: every gate's input and recurrent map Glorot uniform, biases zero.  ``pytorch``: PyTorch's
    own ``U(-1/sqrt(units), 1/sqrt(units))`` for all of them.
    """
    gates = next(count for cell, count in GATES.items() if isinstance(rnn, cell))
    names = [name for name, _ in rnn.named_parameters()]
    if init == "pytorch":
        rule = Rule("uniform", bound=1.0 / math.sqrt(rnn.hidden_size))
        return {name: rule for name in names}
    return {name: Rule("glorot", blocks=gates) if name.startswith("weight") else ZEROS for name in names}


#: ``"module.Class"`` -> function(module) giving ``{parameter name within the module: Rule}``.
RULES = {}


def register(class_path, rules):
    """Declare ``rules(module)`` for the mechanism class ``class_path`` (``"onmt_ext.module.Class"``)."""
    RULES[class_path] = rules


def _class_path(cls):
    return f"{cls.__module__}.{cls.__qualname__}"


def rules_of(module):
    """The rules ``module`` declares for its own subtree (looked up along its class hierarchy), or None."""
    for cls in type(module).__mro__:
        rules = RULES.get(_class_path(cls))
        if rules is not None:
            return rules(module)
    return None


def declared(model):
    """``{full parameter name: Rule}`` over every mechanism module inside ``model``.

    A mechanism module nested in another declares its own parameters; the outer one does not repeat them.
    """
    out = {}
    for prefix, module in model.named_modules():
        rules = rules_of(module)
        if rules is None:
            continue
        own = dict(module.named_parameters())
        for name, rule in rules.items():
            if name not in own:
                raise KeyError(f"{_class_path(type(module))} declares a rule for {name!r}, which it does not have")
            out[f"{prefix}.{name}" if prefix else name] = rule
    return out


def initialise(model, names=None):
    """Apply the declared rules to ``model``'s mechanism parameters (only those in ``names`` if given)."""
    parameters = dict(model.named_parameters())
    for name, rule in declared(model).items():
        if names is None or name in names:
            rule.apply(parameters[name])


def added_by_mechanism(model, name):
    """True when the parameter or buffer ``name`` lies in a module defined by onmt-ext.

    onmt-ext's encoder and decoder classes (``onmt_ext.integration.transformer``) and post-norm layers
    (``onmt_ext.mechanisms.normalisation``) hold only stock sub-modules, so they do not count.
    """
    parts = name.split(".")[:-1]
    for end in range(len(parts), 0, -1):
        owner = type(model.get_submodule(".".join(parts[:end]))).__module__
        if owner.startswith("onmt_ext.") and owner not in ("onmt_ext.integration.transformer",
                                                           "onmt_ext.mechanisms.normalisation"):
            return True
    return False


def uncovered(model):
    """Names of the parameters a mechanism added that no rule covers."""
    rules = declared(model)
    return [name for name, _ in model.named_parameters() if added_by_mechanism(model, name) and name not in rules]


def install():
    """Re-apply the declared rules after OpenNMT-py's initialisation in ``onmt.model_builder.build_model``
    (and there, with ``-ext_compile_layers``, compile the layers: :func:`onmt_ext.runtime.compile.compile_layers`).

    Only for a fresh model (no checkpoint): OpenNMT-py loads a checkpoint inside ``build_model``, so a
    model built from one is left alone (a baseline checkpoint's missing mechanism tensors are drawn by
    :func:`onmt_ext.mechanisms.gret.load_with_new_parameters` through :func:`initialise`).
    """
    import onmt.model_builder as builder
    import onmt.train_single as train_single

    for module in (builder, train_single):  # onmt_train calls the name train_single imported
        patch(module, "build_model", _build_model_initialised, kind=NEEDED,
              reason="the mechanisms' parameters get their stated initialisation after OpenNMT-py's by-name rule; "
                     "with -ext_compile_layers the built model's layers train compiled",
              test="tests/unit/test_initialisation.py::test_rules_are_reapplied_after_opennmt_glorot_pass")


def _build_model_initialised(stock, model_opt, opt, vocabs, checkpoint, *args, **kwargs):
    model = stock(model_opt, opt, vocabs, checkpoint, *args, **kwargs)
    if checkpoint is None:
        initialise(model)
    if ext_compile.Compile.from_opt(opt).compile_layers:  # this run's option, not the checkpoint's: how it runs
        ext_compile.compile_layers(model)
        parameter = next(model.parameters(), None)
        if parameter is not None:  # cao2019 routes inside a layer's graph, whose trace cannot import the kernels
            routing.prepare_kernels(parameter)
    return model
