"""``-ext_compile``: every mechanism's tensor core through ``torch.compile``.

Each mechanism keeps its arithmetic in a pure function of tensors and plain settings (its core: li2019's
:func:`~onmt_ext.mechanisms.li2019.aggregate_heads`, cao2019's :func:`~onmt_ext.mechanisms.cao2019.cross_aggregate` and
:func:`~onmt_ext.mechanisms.cao2019.causal_step`, chen2019's :func:`~onmt_ext.mechanisms.chen2019.recurrent_output`,
clause attention's :func:`~onmt_ext.mechanisms.clause.attention.clause_mix`, GRET's
:func:`~onmt_ext.mechanisms.gret.global_summary` and :func:`~onmt_ext.mechanisms.gret.fuse`, and the directional
softmax).  The module that owns the parameters and decoding state calls its core through :func:`run`; with
``-ext_compile`` the call goes to
``torch.compile(core, dynamic=True, fullgraph=True)``, built once per process and core.

``-ext_compile_layers`` (training only) compiles each whole Transformer encoder and decoder layer, stock or with
mechanisms, for its training passes: :func:`compile_layers`.  Why, and when each recompiles: docs/compile.md.
"""

import logging
import os
import tempfile
import traceback
import warnings
from dataclasses import dataclass
from functools import partial

import torch
from torch.fx.experimental import _config as shape_config

from onmt_ext.runtime.compat import OpenNMTBackends
from onmt_ext.options import AUTO, OPTION_SPECS, AutoBool, option, register_mechanism
from onmt_ext.patches import MESSAGE, record

_COMPILED = {}

#: ``torch.compile``'s backend; the tests swap in ``"aot_eager"`` (the same graphs, forward and backward,
#: without generating code) where they check the wiring rather than Inductor's arithmetic; the GPU check's CPU
#: dry run sets ``"eager"`` (Dynamo's graphs, run eagerly) through ``ONMT_EXT_COMPILE_BACKEND`` (unset: Inductor).
BACKEND = os.environ.get("ONMT_EXT_COMPILE_BACKEND", "").strip() or "inductor"


def compiled(fn, fullgraph=True):
    """``torch.compile(fn, dynamic=True, fullgraph=fullgraph)``, built once per process, ``fn`` and backend."""
    key = (fn, BACKEND, fullgraph)
    if key not in _COMPILED:
        _COMPILED[key] = torch.compile(fn, dynamic=True, fullgraph=fullgraph, backend=BACKEND)
    return _COMPILED[key]


class CompilerFailure(RuntimeError):
    """``torch.compile`` could not compile a core or a layer; the message is one line naming the option."""

    def __init__(self, option, what):
        super().__init__(f"-{option}: {what}; run with -{option} false")
        self.what = what


def _call_compiled(option, fn, call):
    """``call()``; a failure of the compiler (Dynamo or Inductor, which raise many exception types) becomes one
    :class:`CompilerFailure` naming ``option`` and the way back to eager execution; any other exception passes
    unchanged."""
    try:
        return call()
    except Exception as error:
        module = type(error).__module__
        if "dynamo" not in module and "inductor" not in module:
            raise
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise CompilerFailure(option, f"torch.compile could not compile {fn.__qualname__} "
                                      f"({type(error).__name__}: {first_line})") from error


#: Dynamo's settings while it traces a core: a core's int and float arguments (heads, capsules, iterations, the
#: logit factor) are a model's settings, so they are compiled in as constants (a guard each) rather than made
#: symbolic as ``dynamic=True`` does by default; tensor sizes stay dynamic.  A symbolic float compared with a
#: constant also made Dynamo trace li2019's core twice (a restart), and symbolic head and capsule counts run
#: through every index of the routing's views.
CORE_TRACING = {"specialize_int": True, "specialize_float": True}

_PATCHERS = {}


def _patcher(settings):
    """A function that sets Dynamo's ``settings`` (a dict) for this thread and returns the function that undoes it.

    Dynamo reads its settings only when a call compiles, which the caller cannot foresee, so :func:`run` sets them
    around every call, with torch's own lower-cost patcher (the one a ``dynamic=True`` compiled function enters on
    every call), several times cheaper than ``torch._dynamo.config.patch`` (results/bench/compile-time.md).  Where
    a torch lacks it: :func:`_context_patcher`.
    """
    make = getattr(torch._dynamo.config, "_make_closure_patcher", None)
    return _context_patcher(settings) if make is None else make(**settings)


def _context_patcher(settings):
    """:func:`_patcher` through the context manager ``torch._dynamo.config.patch``."""
    def change():
        patch = torch._dynamo.config.patch(**settings)
        patch.__enter__()
        return partial(patch.__exit__, None, None, None)

    return change


#: the cores that ``-ext_compile auto`` gave up on in this process (a compiler failure), run eagerly since
_AUTO_FAILED = set()


def _auto_compiles(fn, args):
    """``-ext_compile auto`` for one call: compile a training pass (autograd on) on CUDA tensors."""
    return (fn not in _AUTO_FAILED and torch.is_grad_enabled()
            and any(isinstance(arg, torch.Tensor) and arg.is_cuda for arg in args))


def run(enabled, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, compiled when ``enabled`` (a module's ``ext_compile`` attribute), traced with
    :data:`CORE_TRACING` (inside a compiled layer, the layer's tracing goes on into the core).

    ``enabled`` is ``"auto"`` on the modules of the mechanisms that compile by default (:func:`enable`): then a
    training pass on CUDA compiles, and a compiler failure warns once and runs the core eagerly from then on.
    """
    if enabled == AUTO:
        if torch.compiler.is_compiling() or not _auto_compiles(fn, args):
            return fn(*args, **kwargs)
        try:
            return _compiled_call(fn, args, kwargs)
        except CompilerFailure as error:
            _AUTO_FAILED.add(fn)
            kept = _keep_traceback(error, fn)
            warnings.warn(f"-ext_compile auto: {error.what}; it runs eagerly from now on"
                          + (f" (traceback: {kept})" if kept else ""), stacklevel=2)
            return fn(*args, **kwargs)
    if not enabled:
        return fn(*args, **kwargs)
    return _compiled_call(fn, args, kwargs)


def _keep_traceback(error, fn):
    """Write ``error``'s whole traceback, the compiler's own included, to a new file in the system's temporary
    directory (``onmt_ext_compile_<core>_*.txt``) for the one-line warning of ``-ext_compile auto`` to name;
    returns its path, or None where it could not be written."""
    try:
        handle, path = tempfile.mkstemp(prefix=f"onmt_ext_compile_{fn.__name__}_", suffix=".txt")
        with os.fdopen(handle, "w") as out:
            out.write("".join(traceback.format_exception(error)))
    except OSError:
        return None
    return path


def _compiled_call(fn, args, kwargs):
    """``compiled(fn)(*args, **kwargs)`` under :data:`CORE_TRACING`; a compiler failure as :func:`_call_compiled`."""

    def call():
        if torch.compiler.is_compiling():
            return compiled(fn)(*args, **kwargs)
        key = tuple(sorted(CORE_TRACING.items()))
        if key not in _PATCHERS:
            _PATCHERS[key] = _patcher(dict(key))
        undo = _PATCHERS[key]()
        try:
            return compiled(fn)(*args, **kwargs)
        finally:
            undo()

    return _call_compiled("ext_compile", fn, call)


#: the compiled stock layers see source and target lengths padded up to a multiple of this (:func:`_aligned`)
ALIGN = 8


def _padded(x, dim, length, value):
    """``x`` with dimension ``dim`` filled up at its end to ``length`` with ``value``."""
    extra = length - x.size(dim)
    if extra == 0:
        return x
    fill = list(x.shape)
    fill[dim] = extra
    return torch.cat([x, x.new_full(fill, value)], dim)


def _aligned(encoder, call, *args, **kwargs):
    """``call(*args, **kwargs)`` for a stock encoder or decoder layer, with its lengths padded up to a multiple
    of :data:`ALIGN` and the outputs cut back.

    On CUDA, Inductor's attention guards on whether the mask's key length is a multiple of 8 (PyTorch pull
    request 163083), so batches of both kinds compile the layer twice or more.  Padded positions are masked
    keys (``True`` in OpenNMT-py's pad masks) and extra query rows that are cut off: the real positions' values
    are unchanged up to rounding.  Encoder layer: ``(layer_in (batch, src, dim), mask (batch, 1, src, src))``;
    decoder layer: ``(layer_in (batch, tgt, dim), enc_out (batch, src, dim), src_pad_mask (batch, 1, src),
    tgt_pad_mask (batch, 1, tgt), **kwargs)`` returning ``(out, top_attn, attn_align)``, attentions
    ``(batch, tgt, src)`` or None.
    """
    def up(length):
        return -(-length // ALIGN) * ALIGN

    if encoder:
        layer_in, mask = args
        length = layer_in.size(1)
        full = up(length)
        if full == length:
            return call(layer_in, mask, **kwargs)
        if mask.stride(2) == 0:  # one row for every query (OpenNMT-py's encoder expands it): stay a view, as
            # unpadded batches pass it, or the graph compiled for one layout recompiles for the other
            keys = _padded(mask[:, :, :1], 3, full, True).expand(-1, -1, full, -1)
        else:
            keys = _padded(mask, 3, full, True)  # new rows repeat the first: no query row is fully masked
            keys = torch.cat([keys, keys[:, :, :1].expand(-1, -1, full - length, -1)], 2)
        return call(_padded(layer_in, 1, full, 0.0), keys, **kwargs)[:, :length]
    layer_in, enc_out, src_pad_mask, tgt_pad_mask = args
    tgt, src = layer_in.size(1), enc_out.size(1)
    full_tgt, full_src = up(tgt), up(src)
    if (full_tgt, full_src) == (tgt, src):
        return call(*args, **kwargs)
    out, *attentions = call(_padded(layer_in, 1, full_tgt, 0.0), _padded(enc_out, 1, full_src, 0.0),
                            _padded(src_pad_mask, 2, full_src, True), _padded(tgt_pad_mask, 2, full_tgt, True),
                            **kwargs)
    return (out[:, :tgt], *(None if attn is None else attn[:, :tgt, :src] for attn in attentions))


def _layer_forward(layer, eager, kind, *args, **kwargs):
    """A layer's ``forward``: compiled in training passes (``layer.training``, no decoding ``step``), else
    ``eager``, the layer's own bound ``forward``.  ``kind`` (:func:`_stock_kind`, decided once when the layer is
    wrapped): ``"encoder"`` or ``"decoder"`` for a stock OpenNMT-py layer, whose lengths are padded to a multiple
    of :data:`ALIGN` (:func:`_aligned`); None for a layer with a mechanism module, whose state may depend on the
    length.

    While the compiled layer runs, OpenNMT-py's attention finds :func:`onmt_ext.runtime.compat.opennmt_sdp_kernel` under
    ``torch.backends.cuda.sdp_kernel`` (:class:`~onmt_ext.runtime.compat.OpenNMTBackends`: traceable, where the stock
    generator context manager would split the graph around every attention call), and the compiler gives every
    size its own symbol
    (no "duck sizing": a source as long as the target in the first batch would otherwise make a later batch
    recompile).  A layer's gate (:func:`gate_layer`), if any, is asked first; False: this pass runs ``eager``.
    """
    if not layer.training or kwargs.get("step") is not None:
        return eager(*args, **kwargs)
    gate = layer.__dict__.get(_GATE)
    if gate is not None and not gate():
        return eager(*args, **kwargs)
    fn = type(layer).forward
    graph = partial(compiled(fn, fullgraph=False), layer)
    if kind:
        graph = partial(_aligned, kind == "encoder", graph)
    with OpenNMTBackends(), shape_config.patch(use_duck_shape=False):
        return _call_compiled("ext_compile_layers", fn, lambda: graph(*args, **kwargs))


def _stock_kind(layer, stock):
    """``stock[type(layer)]`` (``"encoder"`` or ``"decoder"``) for an OpenNMT-py layer made of OpenNMT-py and
    torch modules only; None for a layer that holds an onmt-ext mechanism module (onmt-ext keeps OpenNMT-py's
    layer classes)."""
    if any(type(module).__module__.startswith("onmt_ext") for module in layer.modules()):
        return None
    return stock.get(type(layer))


def compile_layers(model):
    """Route the training passes of every Transformer encoder and decoder layer of ``model`` through
    ``torch.compile(type(layer).forward, dynamic=True)``; returns the number of layers.

    The compiled function takes the layer as an argument, so one graph serves every layer of a kind (its
    parameters are inputs) and, with dynamic shapes, every batch.  Validation and decoding (eval mode or a
    decoding ``step``) stay eager.  The layer's ``forward`` becomes an instance attribute: parameters, state
    dict and checkpoints are unchanged.  Graph breaks are allowed (a mechanism's Python-side state splits
    the graph rather than failing it); a module whose class sets ``layer_graph_boundary`` runs outside the
    layer's graph (its own ``-ext_compile`` core, if any, still compiles).  Unless ``TORCH_LOGS`` says
    otherwise, every recompilation is logged with the guard that failed.
    """
    from onmt.decoders.transformer import TransformerDecoderLayer, TransformerDecoderLayerBase
    from onmt.encoders.transformer import TransformerEncoderLayer

    layers = [module for module in model.modules()
              if isinstance(module, (TransformerEncoderLayer, TransformerDecoderLayerBase))]
    stock = {TransformerEncoderLayer: "encoder", TransformerDecoderLayer: "decoder"}
    if layers and not os.environ.get("TORCH_LOGS"):  # each recompilation costs seconds: say when and why
        _log_recompilations()
    for layer in layers:
        if not _wrapped(layer):  # once
            layer.forward = partial(_layer_forward, layer, layer.forward, _stock_kind(layer, stock))
        for module in layer.modules():  # modules that declare they stay out of the layer's graph run on their own
            if getattr(type(module), "layer_graph_boundary", False) and "forward" not in vars(module):
                module.forward = torch.compiler.disable(module.forward)
    return len(layers)


#: the instance attribute that holds a layer's gate (:func:`gate_layer`)
_GATE = "_onmt_ext_graph_gate"


def compiled_layers(model):
    """The layers of ``model`` that :func:`compile_layers` wrapped."""
    return [module for module in model.modules() if _wrapped(module)]


def _wrapped(module):
    """Whether :func:`compile_layers` wrapped ``module``: its instance ``forward`` is our :func:`_layer_forward`."""
    forward = vars(module).get("forward")
    return isinstance(forward, partial) and forward.func is _layer_forward


def gate_layer(layer, gate):
    """Ask ``gate()`` (eager code, no arguments) before each compiled training pass of ``layer``; False: the pass
    runs eagerly.  Host-side checks that the graph cannot trace go here (``-ext_half_weights``' shadows are
    current), so the graph needs no break and every layer of a kind keeps one graph."""
    setattr(layer, _GATE, gate)


def _log_recompilations():
    """``torch._logging.set_logs(recompiles=True)``, recorded in :mod:`onmt_ext.patches` with the undo that puts
    torch's log settings back as they were before the first call (a later call's undo is not recorded again)."""
    internal = torch._logging._internal
    state = internal._get_log_state()
    levels, artifacts = dict(state.log_qname_to_level), set(state.artifact_names)
    loggers = _torch_loggers()
    configs = {name: (logger.level, list(logger.handlers), logger.propagate) for name, logger in loggers.items()}

    def undo():
        now = internal._get_log_state()
        now.clear()
        now.log_qname_to_level.update(levels)
        now.artifact_names.update(artifacts)
        internal._init_logs()
        for name, logger in _torch_loggers().items():  # each torch logger as it was; one made since: as made
            level, handlers, propagate = configs.get(name, (logging.NOTSET, [], True))
            logger.setLevel(level)
            logger.handlers[:] = handlers
            logger.propagate = propagate

    torch._logging.set_logs(recompiles=True)
    record("torch._logging (set_logs recompiles=True)", kind=MESSAGE, undo=undo,
           test="tests/unit/test_patches.py::test_torch_state_changes_are_recorded",
           reason="-ext_compile_layers: torch logs every recompilation of a layer with the guard that failed (each "
                  "costs seconds), unless TORCH_LOGS says otherwise")


def _torch_loggers():
    """``{name: logger}`` of the ``torch`` loggers made so far."""
    return {name: logger for name, logger in logging.root.manager.loggerDict.items()
            if name.startswith("torch") and isinstance(logger, logging.Logger)}


def enable(root, on):
    """Set ``ext_compile`` on every sub-module of ``root`` whose class declares it (the mechanism modules).

    ``on`` is ``True``, ``False`` or ``"auto"``; with ``"auto"`` a module whose class sets ``compile_on_cuda``
    (its compiled core measured faster on a GPU; docs/compile.md) gets ``"auto"`` (:func:`run`), any other
    ``False``.
    """
    for module in root.modules():
        if hasattr(type(module), "ext_compile"):
            automatic = on == AUTO and getattr(type(module), "compile_on_cuda", False)
            module.ext_compile = AUTO if automatic else (on is True)


def compiles_by_default(root):
    """Whether ``-ext_compile auto`` compiles a core of ``root`` on CUDA (some module has ``ext_compile`` "auto")."""
    return any(getattr(module, "ext_compile", None) == AUTO for module in root.modules())


def _combination_check(opt):
    """``-ext_compile`` needs a mechanism: every mechanism has an option away from its default when on."""
    if Compile.from_opt(opt).compile is not True:
        return []
    if any(getattr(opt, spec.name, spec.default) != spec.default for spec in OPTION_SPECS
           if not spec.name.startswith("ext_")):  # ext_layer_norm: no tensor core either
        return []
    return ["-ext_compile has no effect without an onmt-ext mechanism (the stock layers are not compiled; "
            "-ext_compile_layers compiles whole layers)"]


@register_mechanism("ext_", combination_check=_combination_check)
@dataclass(frozen=True)
class Compile:
    """``-ext_compile``."""

    compile: AutoBool = option(AUTO, "run every onmt-ext mechanism's tensor core through torch.compile (dynamic "
                               "shapes, full graph), in training and translation; the first batches compile "
                               "(seconds to minutes); stock layers stay eager. auto (the default): only chen2019's "
                               "and GRET's cores, only in training on CUDA, where compiling measured faster "
                               "(docs/compile.md); false: every core eager")
    compile_layers: bool = option(False, "onmt_train: run each whole Transformer encoder and decoder layer (stock "
                                  "or with mechanisms) through torch.compile for its training passes (dynamic "
                                  "shapes); fewer, fused GPU kernels per step; the first steps compile (about a "
                                  "minute); validation and translation stay eager; docs/compile.md")
