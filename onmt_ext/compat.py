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
3. Not a torch matter but an OpenNMT-py 3.5.1 bug that makes training logs
   useless: the dynamic data iterator calls ``init_logger()`` without a file
   each time it (re)opens a corpus, which replaces every handler of the
   ``onmt`` logger and silently drops ``-log_file`` after the first lines (no
   step, validation or checkpoint line reaches the file).
   :func:`keep_log_file` makes that call keep the handlers already set up.
4. OpenNMT-py writes checkpoints with ``torch.save`` straight to
   ``<model>_step_<N>.pt``: a run killed while saving leaves a truncated file
   under the final name, which ``train_from``, ``onmt_average_models`` or a
   "skip what exists" pipeline takes for a good checkpoint.
   :func:`atomic_checkpoints` makes the saver (and ``onmt_average_models``) write to a temporary file in
   the same directory, flush it to disk and rename it into place, so the final
   name only ever holds a complete checkpoint (a killed run may leave a
   ``*.partial-<pid>`` file behind, never a wrong ``.pt``).  Not covered: the
   weights file of ``-save_format safetensors``, written by safetensors itself.
5. ``-train_from`` a checkpoint restores the model, the optimizer and the
   step, but OpenNMT-py then reads the training corpora from their first
   batch again, so a resumed run trains on other batches than the run it
   continues (and sees the first ones twice).  :func:`resume_data_position`
   makes a resumed trainer skip the batches that the steps already done
   consumed (their number follows ``accum_count``/``accum_steps``).  The
   batch order is a function of the seed, so with the same seed and dropout 0
   a run killed at step k and resumed from its step-k checkpoint reaches the
   same parameters as an uninterrupted run.  Skipping means reading (not
   training on) those batches, which takes a while on large corpora; the log
   says how many.  With ``-reset_optim all`` the step restarts at 1 and
   nothing is skipped (fine-tuning, e.g. GRET from a baseline).  With other
   data, or another ``accum_count`` or GPU count than the run being resumed,
   the skip is still made (and logged) but no longer lines up exactly.
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


def keep_log_file():
    """Stop OpenNMT-py's data iterator from dropping the ``-log_file`` handler (see the module docstring).

    Needs ``onmt`` imported; called by :func:`onmt_ext.plugin.activate`.  A
    process whose ``onmt`` logger has no handler yet (a data-loader worker)
    still gets the console handler it asked for.
    """
    import logging

    from onmt.inputters import dynamic_iterator
    from onmt.utils.logging import init_logger

    if getattr(dynamic_iterator.init_logger, "_onmt_ext", False):
        return

    def init_logger_keeping_handlers(log_file=None, *args, **kwargs):
        logger = logging.getLogger("onmt")
        if log_file is None and not args and not kwargs and logger.handlers:
            return logger
        return init_logger(log_file, *args, **kwargs)

    init_logger_keeping_handlers._onmt_ext = True
    dynamic_iterator.init_logger = init_logger_keeping_handlers


def atomic_save(obj, path, *args, **kwargs):
    """``torch.save(obj, path)`` that never leaves a partial file at ``path`` (temporary file, fsync, rename)."""
    import os
    import torch

    if not isinstance(path, (str, os.PathLike)):
        return torch.save(obj, path, *args, **kwargs)  # a file object: the caller owns it
    path = os.fspath(path)
    tmp = f"{path}.partial-{os.getpid()}"
    try:
        with open(tmp, "wb") as handle:
            torch.save(obj, handle, *args, **kwargs)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


class _TorchWithAtomicSave:
    """Stands in for the ``torch`` module inside OpenNMT-py's model saver: ``save`` is :func:`atomic_save`,
    everything else is torch's own."""

    save = staticmethod(atomic_save)

    def __getattr__(self, name):
        import torch

        return getattr(torch, name)


def atomic_checkpoints():
    """Make OpenNMT-py's ``ModelSaver`` and ``onmt_average_models`` write checkpoints atomically (see the
    module docstring)."""
    from onmt.bin import average_models
    from onmt.models import model_saver

    for module in (model_saver, average_models):
        if not isinstance(module.torch, _TorchWithAtomicSave):
            module.torch = _TorchWithAtomicSave()


def batches_consumed(trainer, steps_done):
    """Training batches that steps 1..``steps_done`` of ``trainer`` consumed (``accum_count`` per step)."""
    return sum(trainer._accum_count(step) for step in range(1, steps_done + 1))


def resume_data_position():
    """Make a resumed ``Trainer.train`` skip the batches already trained on (see the module docstring)."""
    import itertools

    from onmt.trainer import Trainer
    from onmt.utils.logging import logger

    stock = Trainer.train
    if getattr(stock, "_onmt_ext", False):
        return

    def train(self, train_iter, train_steps, *args, **kwargs):
        done = self.optim.training_step - 1
        if done > 0 and train_iter is not None:
            skip = batches_consumed(self, done)
            logger.info(f"onmt-ext: resuming at step {done + 1}: skipping the {skip} training batches that "
                        f"steps 1-{done} used, so that training continues where it stopped (exact when the "
                        "data, accum_count and number of GPUs are those of the run being resumed)")
            train_iter = itertools.islice(train_iter, skip, None)
        return stock(self, train_iter, train_steps, *args, **kwargs)

    train._onmt_ext = True
    Trainer.train = train


def apply():
    """Apply every fix once (safe to call repeatedly)."""
    global _applied
    if _applied:
        return
    silence_deprecations()
    allow_checkpoint_classes()
    _applied = True
