"""Counting host reads of tensor values: each is a host-device synchronisation on a GPU.

A training step that reads a value of a device tensor on the host (``.item()``,
``float(t)``, ``.tolist()``, a tensor passed where a Python number is needed,
as in ``torch.arange(0, lengths.max())``) or runs an operator whose output size
depends on the data (``x[mask]``, ``nonzero``, ``unique``: :data:`HOST_READS`)
waits for the GPU to finish all the work queued before it, so the host can never
run ahead.  :class:`HostReads` counts such reads on any device, the CPU included
(where they cost nothing, but show where a GPU would wait); :func:`cuda_sync_warnings`
records where torch's own sync debug mode reports a synchronisation on a CUDA device.
"""

import traceback
import warnings
from contextlib import ExitStack, contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from onmt_ext.patches import temporarily

#: Tensor methods that copy values to the host without going through an aten operator on a CPU tensor.
_PYTHON_READS = ("tolist", "cpu", "numpy")

_MASKS = (torch.bool, torch.uint8)


def _masks(indices):
    return [i for i in indices or () if isinstance(i, torch.Tensor) and i.dtype in _MASKS]


def _put_by_mask(a):
    """The mask of an ``index_put`` that reads it on the host: a bool (or uint8) index, unless torch turns the put
    into ``masked_fill_`` (no accumulation, one index, a mask, and one value on the CPU: ``x[mask] = 0.5``)."""
    masks = _masks(a["indices"])
    fill = (not a.get("accumulate") and len([i for i in a["indices"] if i is not None]) == len(masks) == 1
            and a["values"].numel() == 1 and a["values"].device.type == "cpu"
            and masks[0].device == a["self"].device)
    return masks[0] if masks and not fill else None


def _to_host(source, device, non_blocking):
    """``source`` when copying it to the CPU from another device makes the host wait (not ``non_blocking``)."""
    cpu = device is not None and torch.device(device).type == "cpu"
    return source if cpu and source.device.type != "cpu" and not non_blocking else None


#: The aten operators that read device data on the host (on CUDA each one waits for the device), by name: of the
#: operator's arguments, by name, the tensor that is read, or None where these arguments read nothing.  A value
#: (``_local_scalar_dense``: ``.item()``, ``float()``, ``bool()``; ``equal``, ``allclose``), or an output size that
#: depends on the data: ``nonzero`` (and ``torch.where(cond)``, ``argwhere``), ``masked_select``, the ``unique``
#: family, ``bincount``, ``histc`` without a range, ``repeat_interleave`` with a tensor of repeats and no
#: ``output_size``, indexing with a bool or uint8 mask (``x[mask]``, and ``x[mask] = v`` unless ``v`` is one value
#: on the CPU, which torch makes a ``masked_fill_``), and a blocking copy of a device tensor to the CPU.
HOST_READS = {
    "_local_scalar_dense": lambda a: a["self"],
    "equal": lambda a: a["self"],
    "allclose": lambda a: a["self"],
    "nonzero": lambda a: a["self"],
    "masked_select": lambda a: a["mask"],
    "_unique": lambda a: a["self"],
    "_unique2": lambda a: a["self"],
    "unique_dim": lambda a: a["self"],
    "unique_consecutive": lambda a: a["self"],
    "unique_dim_consecutive": lambda a: a["self"],
    "bincount": lambda a: a["self"],
    "histc": lambda a: a["self"] if a.get("min", 0) == a.get("max", 0) else None,
    "repeat_interleave": lambda a: a.get("repeats") if a.get("output_size") is None else None,
    "index": lambda a: next(iter(_masks(a["indices"])), None),
    "index_put": _put_by_mask,
    "index_put_": _put_by_mask,
    "_index_put_impl_": _put_by_mask,
    "_to_copy": lambda a: _to_host(a["self"], a.get("device"), a.get("non_blocking")),
    "copy_": lambda a: _to_host(a["src"], a["self"].device, a.get("non_blocking")),
}


def host_read(func, args=(), kwargs=None):
    """``(what, tensor)`` when the aten operator ``func`` called with ``args`` and ``kwargs`` reads ``tensor``'s
    data on the host (:data:`HOST_READS`; ``what`` is the operator's name, ``item`` for ``_local_scalar_dense``),
    else None."""
    name = func.overloadpacket.__name__
    if name not in HOST_READS:
        return None
    named = {argument.name: value for argument, value in zip(func._schema.arguments, args)}
    read = HOST_READS[name]({**named, **(kwargs or {})})
    if not isinstance(read, torch.Tensor):
        return None
    return ("item" if name == "_local_scalar_dense" else name), read


def _in_optimizer():
    """True when a frame of the current stack runs the code of ``torch.optim``."""
    return any("/torch/optim/" in frame.filename.replace("\\", "/") for frame in traceback.extract_stack())


def caller(skip=()):
    """``file:line (function)`` of the innermost frame outside torch, the warnings module, ``contextlib``, this
    module and the files whose paths end in one of ``skip``; when frames inside torch lie between it and the
    read, `` via `` and the outermost of them (a torch context manager's body, say, entered from that line)."""
    skipped = ("/warnings.py", "/contextlib.py", "onmt_ext/runtime/hostsync.py", *skip)
    inside = None
    for frame in reversed(traceback.extract_stack()):
        name = frame.filename.replace("\\", "/")
        if "/torch/" in name:
            inside = frame
        elif not name.endswith(skipped):
            via = f" via {_torch_path(inside.filename)}:{inside.lineno} ({inside.name})" if inside else ""
            return f"{name}:{frame.lineno} ({frame.name}){via}"
    return "unknown"


def _torch_path(filename):
    """``torch/...`` of a file inside torch."""
    name = filename.replace("\\", "/")
    return name[name.rindex("/torch/") + 1:]


class HostReads(TorchDispatchMode):
    """Context manager recording every read of tensor values by the host while it is active.

    ``reads`` lists ``(what, where)``: ``what`` names the aten operator of
    :data:`HOST_READS` (``item`` for a scalar read, ``aten._local_scalar_dense``:
    ``.item()``, ``float()``, ``int()``, ``bool()``, a tensor used as a Python
    number), or the method for ``.tolist()``, ``.cpu()`` and ``.numpy()``;
    ``where`` is the caller outside torch.  ``device`` limits the count to
    tensors on that device type (``None``: every tensor).
    ``optimizer_counters=False`` leaves out the scalar reads a ``torch.optim``
    optimizer makes of CPU tensors inside its own code: its step counters, which
    stay on the host on a GPU too (unless it is fused or capturable), so they are
    no synchronisation there.
    """

    def __init__(self, device=None, optimizer_counters=True):
        super().__init__()
        self.device = device
        self.optimizer_counters = optimizer_counters
        self.reads = []
        self._undo = None
        self._in_method = 0  # inside a method of _PYTHON_READS, counted once as that method

    def _counts(self, tensor):
        return isinstance(tensor, torch.Tensor) and (self.device is None or tensor.device.type == self.device)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        read = None if self._in_method else host_read(func, args, kwargs)
        if read is not None and self._counts(read[1]) and (
                self.optimizer_counters or read[0] != "item" or read[1].device.type != "cpu" or not _in_optimizer()):
            self.reads.append((read[0], caller()))
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        with ExitStack() as swaps:  # each method of _PYTHON_READS counted, only while the mode is active
            for name in _PYTHON_READS:
                stock = getattr(torch.Tensor, name)

                def counted(tensor, *args, _stock=stock, _name=name, **kwargs):
                    if self._counts(tensor):
                        self.reads.append((_name, caller()))
                    self._in_method += 1
                    try:
                        return _stock(tensor, *args, **kwargs)
                    finally:
                        self._in_method -= 1

                swaps.enter_context(temporarily(torch.Tensor, name, counted))
            entered = super().__enter__()
            self._undo = swaps.pop_all()
        return entered

    def __exit__(self, *exc):
        undo, self._undo = self._undo, None
        with undo or ExitStack():
            return super().__exit__(*exc)


@contextmanager
def cuda_sync_warnings(skip=()):
    """Record where torch's sync debug mode (``torch.cuda.set_sync_debug_mode``) warns of a synchronising call.

    Yields the list that fills with the call site of each (see :func:`caller`; ``skip`` as there).  Every other
    warning is shown as it would be outside (a kernel's failed first-use check, a compile fallback).
    """
    sites = []
    previous = torch.cuda.get_sync_debug_mode()
    shown = getattr(warnings, "_showwarnmsg_impl", None)
    with warnings.catch_warnings(record=True) as caught, record_sync_sites(sites, skip, others=shown) as hooked:
        warnings.filterwarnings("always", message=".*synchroniz")  # each sync, not once per line
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield sites
        finally:
            torch.cuda.set_sync_debug_mode(previous)
            if not hooked:  # no call sites on this Python: one "unknown" per warning
                sites.extend("unknown" for w in caught if _is_sync(w.message))


def _is_sync(message):
    return "synchroniz" in str(message)


@contextmanager
def record_sync_sites(sites, skip=(), others=None):
    """Context, inside ``warnings.catch_warnings(record=True)``: append the call site of every sync warning to
    ``sites`` as it is issued (the recorded warnings keep only their messages); ``others``, where given, shows
    every other warning instead of its being recorded; its exit undoes it.

    Yields False on a Python whose warnings module has no such hook (then nothing is appended), else True.
    """
    record = getattr(warnings, "_showwarnmsg_impl", None)
    if record is None:
        yield False
        return

    def with_site(message):
        if not _is_sync(message.message):
            return (others or record)(message)
        record(message)
        sites.append(caller(skip))

    with temporarily(warnings, "_showwarnmsg_impl", with_site):
        yield True
