"""Counting host reads of tensor values: each is a host-device synchronisation on a GPU.

A training step that reads a value of a device tensor on the host (``.item()``,
``float(t)``, ``.tolist()``, a tensor passed where a Python number is needed,
as in ``torch.arange(0, lengths.max())``) waits for the GPU to finish all the
work queued before it, so the host can never run ahead.  :class:`HostReads`
counts such reads on any device, the CPU included (where they cost nothing,
but show where a GPU would wait); :func:`cuda_sync_warnings` records where
torch's own sync debug mode reports a synchronisation on a CUDA device.
"""

import traceback
import warnings
from contextlib import ExitStack, contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from onmt_ext.patches import temporarily

#: Tensor methods that copy values to the host without going through an aten operator on a CPU tensor.
_PYTHON_READS = ("tolist", "cpu", "numpy")


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

    ``reads`` lists ``(what, where)``: ``what`` is ``item`` for a scalar read
    (``aten._local_scalar_dense``: ``.item()``, ``float()``, ``int()``,
    ``bool()``, a tensor used as a Python number) or the method name for
    ``.tolist()``, ``.cpu()`` and ``.numpy()``; ``where`` is the caller
    outside torch.  ``device`` limits the count to tensors on that device type
    (``None``: every tensor).  ``optimizer_counters=False`` leaves out the
    scalar reads a ``torch.optim`` optimizer makes of CPU tensors inside its
    own code: its step counters, which stay on the host on a GPU too (unless
    it is fused or capturable), so they are no synchronisation there.
    """

    def __init__(self, device=None, optimizer_counters=True):
        super().__init__()
        self.device = device
        self.optimizer_counters = optimizer_counters
        self.reads = []
        self._undo = None

    def _counts(self, tensor):
        return isinstance(tensor, torch.Tensor) and (self.device is None or tensor.device.type == self.device)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default and self._counts(args[0]) and (
                self.optimizer_counters or args[0].device.type != "cpu" or not _in_optimizer()):
            self.reads.append(("item", caller()))
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        with ExitStack() as swaps:  # each method of _PYTHON_READS counted, only while the mode is active
            for name in _PYTHON_READS:
                stock = getattr(torch.Tensor, name)

                def counted(tensor, *args, _stock=stock, _name=name, **kwargs):
                    if self._counts(tensor):
                        self.reads.append((_name, caller()))
                    return _stock(tensor, *args, **kwargs)

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

    Yields the list that fills with the call site of each (see :func:`caller`; ``skip`` as there).
    """
    sites = []
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught, record_sync_sites(sites, skip) as hooked:
        warnings.simplefilter("always")
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
def record_sync_sites(sites, skip=()):
    """Context, inside ``warnings.catch_warnings(record=True)``: append the call site of every sync warning to
    ``sites`` as it is issued (the recorded warnings keep only their messages); its exit undoes it.

    Yields False on a Python whose warnings module has no such hook (then nothing is appended), else True.
    """
    record = getattr(warnings, "_showwarnmsg_impl", None)
    if record is None:
        yield False
        return

    def with_site(message):
        record(message)
        if _is_sync(message.message):
            sites.append(caller(skip))

    with temporarily(warnings, "_showwarnmsg_impl", with_site):
        yield True
