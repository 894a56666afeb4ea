"""``-ext_half_weights``: the Linear layers compute with half-precision copies of their weights, and the optimizer
keeps the float32 parameters, as mixed-precision trainers keep master weights (issue 59, item 4).

Under ``-model_dtype fp16`` OpenNMT-py trains in torch's autocast: each ``nn.Linear`` casts its float32 weight and
bias to float16 in every forward pass, and autograd casts their gradients back in the backward pass, one kernel per
tensor each way (about 400 launches per Transformer Base step).  :class:`HalfWeights` keeps one float16 copy of
those tensors (the *shadows*, one flat buffer), refreshed from the parameters after each optimizer step (a
concatenation and a cast); each such Linear computes with its shadows wherever autocast would have cast to their
dtype, and after each backward pass the shadows' gradients reach the parameters' ``.grad`` as float32 (a
concatenation and a cast or an add).  The arithmetic is autocast's (the same casts, products and sums), so the
parameters after every step are the same to the bit.  Parameters, checkpoints, optimizer state and averaging are
untouched: the shadows are not parameters.  A Linear whose weight is shared (tied embeddings), replaced, changed
since the refresh or read outside autocast computes as stock does.  Layers compiled by ``-ext_compile_layers``
use the shadows in their graphs, checked in eager code before each graph (docs/compile.md).
docs/differences-from-stock.md.
"""

import collections
import functools
from dataclasses import dataclass

import torch
import torch.nn as nn

from onmt_ext.options import option, register_mechanism
from onmt_ext.runtime import compile as ext_compile
from onmt_ext.patches import SPEED, patch, runtime_choice

_TEST = "tests/unit/test_half_weights.py"


def _combination_check(opt):
    """``-ext_half_weights`` needs AMP training (``-model_dtype fp16``, an optimizer other than fusedadam) on CUDA."""
    if not HalfWeightsOptions.from_opt(opt).half_weights:
        return []
    if getattr(opt, "model_dtype", "fp32") != "fp16" or getattr(opt, "optim", "") == "fusedadam":
        return ["-ext_half_weights needs -model_dtype fp16 with an -optim other than fusedadam (torch's autocast "
                "and gradient scaler), which it speeds up"]
    if runtime_choice() == "stock":
        return ["-ext_half_weights is part of onmt-ext's runtime, which ONMT_EXT_RUNTIME=stock switches off; drop "
                "one of the two"]
    return []


@register_mechanism("ext_", combination_check=_combination_check)
@dataclass(frozen=True)
class HalfWeightsOptions:
    """``-ext_half_weights``."""

    half_weights: bool = option(False, "onmt_train with -model_dtype fp16: the Linear layers compute with float16 "
                                "copies of their weights, refreshed once per step, and the optimizer keeps the "
                                "float32 parameters (master weights): the same numbers as autocast's per-layer "
                                "casts in a few kernels per step instead of about two per weight; "
                                "docs/differences-from-stock.md")


def _stamp(module):
    """What ``module``'s parameters are now: each one's identity, storage and version (a host counter)."""
    return tuple((id(p), p.data_ptr(), p._version) for p in (module.weight, module.bias) if p is not None)


class _Shadow:
    """One Linear's shadows in ``dtype``, what they were refreshed from (:func:`_stamp` of ``module`` then), and
    ``live``: whether the check before the compiled layer holding the Linear (:func:`_gate`) last found them
    current.  :meth:`forward`, bound, is the Linear's ``forward`` (a bound method, which Dynamo guards by its code,
    not by its identity as it would a partial: every layer of a kind keeps one graph)."""

    __slots__ = ("module", "dtype", "weight", "bias", "stamp", "live")

    def __init__(self, module, dtype, weight, bias):
        self.module, self.dtype, self.weight, self.bias = module, dtype, weight, bias
        self.stamp, self.live = None, False

    def current(self):
        """True when the module still holds the parameters the shadows were refreshed from, unchanged since."""
        return self.stamp is not None and self.stamp == _stamp(self.module)

    def forward(self, x):
        """``nn.Linear.forward`` with the shadows where autocast would cast the parameters to ``dtype``; inside a
        compiled graph (``-ext_compile_layers``), which cannot trace :meth:`current`, where the check before the
        graph found them current (``live``, a guard of the graph)."""
        kind = self.module.weight.device.type
        if torch.is_autocast_enabled(kind) and torch.get_autocast_dtype(kind) == self.dtype and (
                self.live if torch.compiler.is_compiling() else self.current()):
            return torch.nn.functional.linear(x, self.weight, self.bias)
        return nn.Linear.forward(self.module, x)


def _gate(shadows):
    """A compiled layer's check before its graph runs: whether the ``shadows`` of its Linear layers are all
    current, each one's ``live`` set to that.  False: the layer runs eagerly, where each Linear checks its own;
    the graph never reads stale shadows."""
    current = all(shadow.current() for shadow in shadows)
    for shadow in shadows:
        shadow.live = current
    return current


class HalfWeights:
    """The shadows of ``model``'s Linear layers in ``dtype`` (see the module docstring).

    Args:
        model: the model being trained.
        dtype: autocast's dtype (float16 under ``-model_dtype fp16``; the CPU tests use both).

    ``refresh()`` after each optimizer step, ``collect()`` after each backward pass, ``clear()`` with each
    ``zero_grad``; the optimizer wrapper of :func:`install` calls them.  Each layer that
    :func:`~onmt_ext.runtime.compile.compile_layers` wrapped before gets the check of its shadows (:func:`_gate`);
    one wrapped later has none, and its graph computes from the parameters.
    """

    def __init__(self, model, dtype=torch.float16):
        uses = collections.Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
        self.dtype = dtype
        self.modules = [m for m in model.modules() if type(m) is nn.Linear and m.weight.requires_grad
                        and all(uses[id(p)] == 1 for p in (m.weight, m.bias) if p is not None)]
        self.masters = [p for m in self.modules for p in (m.weight, m.bias) if p is not None]
        # the float32 buffer whose views are the .grad of the parameters ``_present`` (indices) after a collect
        self._grads, self._views, self._present = None, [], None
        self.collected = 0  #: backward passes whose gradients came through the shadows
        self.shadows, self._shadows = [], []
        if not self.masters:
            return
        self.flat = torch.empty(sum(p.numel() for p in self.masters), dtype=dtype, device=self.masters[0].device)
        self.shadows = [piece.view_as(p).detach().requires_grad_(True)
                        for piece, p in zip(self.flat.split([p.numel() for p in self.masters]), self.masters)]
        tensors = iter(self.shadows)
        for module in self.modules:
            weight = next(tensors)
            bias = next(tensors) if module.bias is not None else None
            shadow = _Shadow(module, dtype, weight, bias)
            self._shadows.append(shadow)
            module.forward = shadow.forward
        owners = {id(module): shadow for module, shadow in zip(self.modules, self._shadows)}
        for layer in ext_compile.compiled_layers(model):  # -ext_compile_layers: each layer checks before its graph
            shadows = tuple(owners[id(m)] for m in layer.modules() if id(m) in owners)
            if shadows:
                ext_compile.gate_layer(layer, functools.partial(_gate, shadows))
        self.refresh()

    @torch.no_grad()
    def refresh(self):
        """The shadows from the parameters: one concatenation (a float32 temporary the size of the parameters)
        and one cast."""
        if not self.masters:
            return
        self.flat.copy_(torch.cat([p.reshape(-1) for p in self.masters]))
        for module, shadow in zip(self.modules, self._shadows):
            shadow.stamp = _stamp(module)

    def clear(self):
        """Drop the shadows' gradients (``zero_grad``; a batch skipped for lack of memory)."""
        for shadow in self.shadows:
            shadow.grad = None

    @torch.no_grad()
    def collect(self):
        """Move the shadows' gradients to the parameters' ``.grad`` in float32, added to what is there; a
        parameter whose shadows got no gradient (a layer this pass did not use) keeps its ``.grad``."""
        present = [i for i, shadow in enumerate(self.shadows) if shadow.grad is not None]
        if not present:
            return
        grads = [self.shadows[i].grad for i in present]
        targets = [self.masters[i] for i in present]
        self.clear()
        self.collected += 1
        if present == self._present and all(p.grad is view for p, view in zip(targets, self._views)):
            self._grads.add_(torch.cat([g.reshape(-1) for g in grads]))  # accumulating: one add
        elif all(p.grad is None for p in targets):
            self._grads = torch.cat([g.reshape(-1) for g in grads]).to(targets[0].dtype)
            self._views = [piece.view_as(p) for piece, p in zip(self._grads.split([p.numel() for p in targets]),
                                                                 targets)]
            self._present = present
            for p, view in zip(targets, self._views):
                p.grad = view
        else:  # a parameter also read outside its layer's forward already has a gradient of its own
            for p, g in zip(targets, grads):
                if p.grad is None:
                    p.grad = g.to(p.dtype)
                else:
                    p.grad.add_(g)


def _optimizer_from_opt(stock, cls, model, opt, checkpoint=None):
    optimizer = stock(cls, model, opt, checkpoint=checkpoint)
    if HalfWeightsOptions.from_opt(opt).half_weights and optimizer.amp:
        optimizer._onmt_ext_half_weights = HalfWeights(model, torch.float16)
    return optimizer


def _then(action):
    """An Optimizer method's layer: the stock method, then the optimizer's :class:`HalfWeights` ``action``
    (``collect`` after ``backward``, ``refresh`` after ``step``, ``clear`` after ``zero_grad``), if it has one."""

    def layer(stock, self, *args, **kwargs):
        result = stock(self, *args, **kwargs)
        half = getattr(self, "_onmt_ext_half_weights", None)
        if half is not None:
            getattr(half, action)()
        return result

    return layer


def install():
    """Register the changes (idempotent)."""
    from onmt.utils.optimizers import Optimizer

    reason = ("-ext_half_weights: autocast casts every Linear's float32 weight and bias to float16 in each forward "
              "pass and their gradients back in the backward pass, about 400 kernels per Base step; float16 "
              "copies refreshed once per step give the same numbers in a few kernels")
    patch(Optimizer, "from_opt", _optimizer_from_opt, kind=SPEED, order=2, reason=reason,
          test=f"{_TEST}::test_the_trainer_with_half_weights_steps_as_autocast_does")
    for name, action in (("backward", "collect"), ("step", "refresh"), ("zero_grad", "clear")):
        patch(Optimizer, name, _then(action), kind=SPEED, reason=reason,
              test=f"{_TEST}::test_the_trainer_with_half_weights_steps_as_autocast_does")
