"""``-ext_compile``: every mechanism's tensor core through ``torch.compile``.

Each mechanism keeps its arithmetic in a pure function of tensors and plain settings (its core: li2019's
:func:`~onmt_ext.li2019.aggregate_heads`, cao2019's :func:`~onmt_ext.cao2019.cross_aggregate` and
:func:`~onmt_ext.cao2019.causal_step`, chen2019's :func:`~onmt_ext.chen2019.recurrent_output`,
clause attention's :func:`~onmt_ext.clause_attention.clause_mix`, GRET's :func:`~onmt_ext.gret.global_summary`
and :func:`~onmt_ext.gret.fuse`, and the directional softmax).  The module that owns the parameters and decoding
state calls its core through :func:`run`; with ``-ext_compile`` the call goes to
``torch.compile(core, dynamic=True, fullgraph=True)``, built once per process and core.  Why cores and not
modules, and when it recompiles: docs/compile.md.
"""

import os
from dataclasses import dataclass

import torch

from onmt_ext.options import OPTION_SPECS, option, register_mechanism

_COMPILED = {}

#: ``torch.compile``'s backend; the tests swap in ``"aot_eager"`` (the same graphs, forward and backward,
#: without generating code) where they check the wiring rather than Inductor's arithmetic, and so does the GPU
#: check's CPU dry run through ``ONMT_EXT_COMPILE_BACKEND`` (unset: Inductor).
BACKEND = os.environ.get("ONMT_EXT_COMPILE_BACKEND", "").strip() or "inductor"


def compiled(fn):
    """``torch.compile(fn, dynamic=True, fullgraph=True)``, built once per process, ``fn`` and backend."""
    key = (fn, BACKEND)
    if key not in _COMPILED:
        _COMPILED[key] = torch.compile(fn, dynamic=True, fullgraph=True, backend=BACKEND)
    return _COMPILED[key]


def run(enabled, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, compiled when ``enabled`` (a module's ``ext_compile`` attribute).

    A failure of the compiler (Dynamo or Inductor, which raise many exception
    types) becomes one ``RuntimeError`` naming ``-ext_compile`` and the way
    back to eager execution; any other exception passes unchanged.
    """
    if not enabled:
        return fn(*args, **kwargs)
    try:
        return compiled(fn)(*args, **kwargs)
    except Exception as error:
        module = type(error).__module__
        if "dynamo" not in module and "inductor" not in module:
            raise
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise RuntimeError(f"-ext_compile: torch.compile could not compile {fn.__name__} "
                           f"({type(error).__name__}: {first_line}); run with -ext_compile false") from error


def enable(root, on):
    """Set ``ext_compile`` on every sub-module of ``root`` whose class declares it (the mechanism modules)."""
    for module in root.modules():
        if hasattr(type(module), "ext_compile"):
            module.ext_compile = bool(on)


def _combination_check(opt):
    """``-ext_compile`` needs a mechanism: every mechanism has an option away from its default when on."""
    if not getattr(opt, "ext_compile", False):
        return []
    if any(getattr(opt, spec.name, spec.default) != spec.default for spec in OPTION_SPECS if spec.name != "ext_compile"):
        return []
    return ["-ext_compile has no effect without an onmt-ext mechanism (the stock layers are not compiled)"]


@register_mechanism("ext_", combination_check=_combination_check)
@dataclass(frozen=True)
class Compile:
    """``-ext_compile``."""

    compile: bool = option(False, "run every onmt-ext mechanism's tensor core through torch.compile (dynamic "
                           "shapes, full graph), in training and translation; the first batches compile (seconds to "
                           "minutes); stock layers stay eager")
