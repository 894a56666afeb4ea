"""``-ext_compile``: every mechanism's tensor core through ``torch.compile``.

Each mechanism keeps its arithmetic in a pure function of tensors (and
plain Python settings): li2019's :func:`~onmt_ext.aggregation.aggregate_heads`,
cao2019's :func:`~onmt_ext.cross_aggregation.cross_aggregate` and its
decoding step, chen2019's :func:`~onmt_ext.recurrent_embedding.recurrent_output`,
clause attention's :func:`~onmt_ext.clause_attention.clause_mix`, GRET's
:func:`~onmt_ext.gret.global_summary` and :func:`~onmt_ext.gret.fuse`, and
the directional softmax.  The module that owns the parameters and the
decoding state calls its core through :func:`run`; with ``-ext_compile`` the
call goes to ``torch.compile(core, dynamic=True, fullgraph=True)`` instead:
Inductor then writes fused Triton kernels on CUDA and C++ on the CPU, for the
forward and (through AOTAutograd) the backward pass.

Why the cores and not the modules: the modules keep Python-side state
(decoding caches, the clause ids of the batch, GRET's observed layers),
which would break a whole-module graph or make it guard on every step; the
cores take only tensors, so one compiled graph serves every layer of a model
(the parameters are arguments, not constants) and, with dynamic shapes,
every batch and length.  Sizes 0 and 1 are specialised by the compiler
(a single-sentence batch or the first decoding step compiles once more).

The compiled function is built once per process and core.  Training under
AMP, translation with the decoding cache and beam search all go through the
same call; grad mode and autocast are part of the compiled graph's guards,
so training and translation each compile their own graph once.
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
