"""Fixes that let OpenNMT-py 3.5.1 (which declares ``torch<2.3``) run on current torch.

Everything onmt-ext changes in OpenNMT-py's behaviour for the sake of a newer
torch lives here, so that it is easy to audit and to drop once upstream is
fixed.  :func:`apply` is called by the start-up hook *before* ``onmt`` is
imported, and is idempotent.

1. ``torch.load`` defaults to ``weights_only=True`` since torch 2.6.
   OpenNMT-py checkpoints pickle the training options as an
   ``argparse.Namespace``, which the safe unpickler refuses.  We allow-list
   exactly that class with :func:`torch.serialization.add_safe_globals`
   instead of turning ``weights_only`` off, so loading a checkpoint still
   cannot run arbitrary code.
2. OpenNMT-py imports ``torch.cuda.amp.custom_fwd``/``custom_bwd`` and calls
   ``torch.cuda.amp.autocast``/``GradScaler`` and
   ``torch.backends.cuda.sdp_kernel``, all deprecated.  They still work; the
   ``FutureWarning`` noise they print on every run is filtered (only those
   messages, nothing else).
"""

import argparse
import warnings

# Regular expressions over the warning text (``warnings.filterwarnings`` matches
# them against the start of the message).
_DEPRECATION_MESSAGES = (
    r"`torch\.cuda\.amp\.",
    r"torch\.backends\.cuda\.sdp_kernel\(\) is deprecated",
)

#: Classes that OpenNMT-py checkpoints pickle besides tensors and containers.
SAFE_GLOBALS = (argparse.Namespace,)

_applied = False


def silence_deprecations():
    """Filter the known FutureWarnings caused by OpenNMT-py's old torch API use."""
    for message in _DEPRECATION_MESSAGES:
        warnings.filterwarnings("ignore", message=message, category=FutureWarning)
        warnings.filterwarnings("ignore", message=message, category=DeprecationWarning)


def allow_checkpoint_classes():
    """Allow-list the non-tensor classes in OpenNMT-py checkpoints for ``torch.load``."""
    import torch

    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is not None:  # torch < 2.4 has no safe unpickler to configure
        add(list(SAFE_GLOBALS))


def apply():
    """Apply every fix once (safe to call repeatedly)."""
    global _applied
    if _applied:
        return
    silence_deprecations()
    allow_checkpoint_classes()
    _applied = True
