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
   ``*.partial-<pid>`` file behind, never a wrong ``.pt``).  ``-save_format
   safetensors`` is refused when the options are parsed
   (:func:`save_format_problems`): its weights file is written by
   safetensors itself, not atomically, and OpenNMT-py 3.5.1 cannot load it
   back (it looks for ``<name>.*.safetensors`` shards).
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
6. OpenNMT-py's ``filtertoolong`` transform drops over-long training pairs
   and counts them only in a ``FilterTooLongStats`` line logged after a full
   pass over a corpus (on a large corpus: never).  :func:`count_filtered_examples`
   logs the first drop as a warning naming ``-src_seq_length`` and
   ``-tgt_seq_length``, and the running count (of the examples the transform
   has seen) after 10, 100, 1000 drops and then every 10,000, per data-loader
   process.  It drops nothing that is to be translated (the
   ``onmt_translate`` source, the ``-valid_metrics`` source): a dropped line
   would misalign the output (without a target, stock OpenNMT-py fails
   there instead).
7. A sequence longer than the sinusoidal ``PositionalEncoding`` (5000
   positions) raises ``SequenceTooLongError`` with "limited to 1" (the size
   of the wrong dimension).  :func:`explain_position_limit` makes the message
   give the length, the limit and what to do, names the source lines in
   ``onmt_translate`` and ends ``onmt_translate`` with that message instead
   of a traceback.
8. ``import onmt`` imports every OpenNMT-py transform, and the
   ``terminology`` transform imports spaCy at module level.  That import alone
   took about 1.2 s of the 5.3 s of ``import onmt`` (one-off ``python -X
   importtime``, 2026-11-26), in every ``onmt_*`` command and every data-loader
   process, whether or not any transform uses spaCy.  :func:`defer_spacy`
   puts a stand-in module under ``spacy`` in ``sys.modules`` before ``onmt``
   runs: ``import spacy`` then binds the stand-in, and the first attribute
   read from it (``spacy.load`` in the terminology transform's or the clause
   splitter's warm-up, or any import of a submodule) imports spaCy itself and
   is answered by it.  ``importlib.util.LazyLoader`` does not serve here: on
   Python 3.11 the import statement itself reads the module's ``__spec__``,
   which runs a lazy module at once.  Where spaCy is already imported, or
   not installed, nothing changes.
"""

import argparse
import importlib
import importlib.util
import sys
import types
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


class _DeferredModule(types.ModuleType):
    """Stands in for a module in ``sys.modules`` until an attribute is read from it (see :func:`defer_spacy`).

    It carries the module's name, import spec, file and loader, which the
    import statement and ``inspect`` read, and no ``__path__``, so importing a
    submodule reads that attribute and so imports the real package first.
    Any attribute it lacks is looked up in the real module, imported on the
    first such read.
    """

    def __getattr__(self, name):  # only for attributes the stand-in does not have
        real = sys.modules.get(self.__name__)
        if real is None or real is self:
            sys.modules.pop(self.__name__, None)
            try:
                real = importlib.import_module(self.__name__)
            except BaseException:
                sys.modules.setdefault(self.__name__, self)
                raise
        return getattr(real, name)


def defer_spacy():
    """Defer importing spaCy until it is used, in this process (see the module docstring).

    Returns True when the stand-in was installed.
    """
    if "spacy" in sys.modules:
        return False
    spec = importlib.util.find_spec("spacy")
    if spec is None:
        return False
    stand_in = _DeferredModule("spacy")
    # what the import statement and inspect.getmodule (which torch calls when it registers an operator)
    # read from every module in sys.modules; a read of anything else imports spaCy
    stand_in.__spec__, stand_in.__file__, stand_in.__loader__ = spec, spec.origin, spec.loader
    sys.modules["spacy"] = stand_in
    return True


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


def save_format_problems(opt):
    """Messages refusing ``-save_format safetensors`` in the training options ``opt`` (see the module docstring)."""
    if getattr(opt, "save_format", "pytorch") != "safetensors":
        return []
    return ["-save_format safetensors is not supported with onmt-ext: OpenNMT-py 3.5.1 writes the weights file "
            "non-atomically and cannot load the <model>_step_N.safetensors files its trainer writes (it looks for "
            "<model>_step_N.*.safetensors shards); use -save_format pytorch (the default)"]


#: Drop counts of ``filtertoolong`` logged after the first (which is a warning); then every ``_FILTER_LOG_EVERY``.
_FILTER_LOG_AT = (10, 100, 1000)
_FILTER_LOG_EVERY = 10000


def _worker_prefix():
    """``"data-loader worker k: "`` inside a torch DataLoader worker, else ``""``."""
    import torch.utils.data

    info = torch.utils.data.get_worker_info()
    return f"data-loader worker {info.id}: " if info is not None else ""


def count_filtered_examples():
    """Make OpenNMT-py's ``filtertoolong`` log its drops as they happen (see the module docstring).

    The counts live on the transform object, so each data-loader process
    logs its own share.  Idempotent.
    """
    from onmt.constants import CorpusName
    from onmt.transforms.misc import FilterTooLongTransform
    from onmt.utils.logging import logger

    stock = FilterTooLongTransform.apply
    if getattr(stock, "_onmt_ext", False):
        return

    def apply(self, example, is_train=False, stats=None, **kwargs):
        if example.get("cid") == CorpusName.INFER or example.get("tgt") is None:
            if not getattr(self, "_onmt_ext_told_infer", False):
                self._onmt_ext_told_infer = True
                logger.warning("filtertoolong drops nothing that is to be translated (the onmt_translate source, "
                               "the -valid_metrics source): a dropped sentence would put every later translation on "
                               "the wrong line")
            return example
        kept = stock(self, example, is_train=is_train, stats=stats, **kwargs)
        self._onmt_ext_seen = getattr(self, "_onmt_ext_seen", 0) + 1
        if kept is not None:
            return kept
        dropped = self._onmt_ext_dropped = getattr(self, "_onmt_ext_dropped", 0) + 1
        limits = f"-src_seq_length {self.src_seq_length}, -tgt_seq_length {self.tgt_seq_length}"
        if dropped == 1:
            logger.warning(
                f"{_worker_prefix()}filtertoolong: dropped a pair of corpus {example.get('cid')!r} with "
                f"{len(example['src'])} source and {len(example['tgt'])} target tokens ({limits}; a target may "
                f"have at most -tgt_seq_length - 2 tokens, for <s> and </s>); every pair over the limits is left "
                "out of training and counted here; raise the limits to keep such pairs")
        elif dropped in _FILTER_LOG_AT or dropped % _FILTER_LOG_EVERY == 0:
            seen = self._onmt_ext_seen
            logger.info(f"{_worker_prefix()}filtertoolong: {dropped} of {seen} pairs dropped so far "
                        f"({100.0 * dropped / seen:.2f}%; {limits})")
        return None

    apply._onmt_ext = True
    FilterTooLongTransform.apply = apply


def position_limit_message(positions, limit, step=None):
    """What to do about a sequence of ``positions`` tokens (or decoding step) beyond ``limit`` sinusoidal positions."""
    if step is not None:
        return (f"the output reached {positions} tokens, beyond the {limit} positions of the sinusoidal position "
                f"encoding; set onmt_translate -max_length below {limit}")
    return (f"a sequence of {positions} tokens is longer than the {limit} positions of the sinusoidal position "
            f"encoding (onmt.modules.PositionalEncoding, max_len {limit}): split the sentence into shorter ones "
            "(in training, the filtertoolong transform's -src_seq_length/-tgt_seq_length drop such pairs)")


def explain_position_limit():
    """Give ``SequenceTooLongError`` a message that says what to do, and end ``onmt_translate`` with it.

    ``PositionalEncoding.forward`` checks the length itself (the stock check
    reports the size of the wrong dimension); ``Translator._run_encoder``
    adds the 1-based line numbers of the too-long sources of the batch;
    ``onmt.bin.translate.translate`` turns the error into a one-line exit.
    Idempotent.
    """
    from onmt.bin import translate as translate_bin
    from onmt.modules.embeddings import PositionalEncoding, SequenceTooLongError
    from onmt.translate.translator import Translator

    stock_forward = PositionalEncoding.forward
    if getattr(stock_forward, "_onmt_ext", False):
        return

    def forward(self, emb, step=None):
        limit, positions = self.pe.size(0), (step or 0) + emb.size(1)
        if positions > limit:
            error = SequenceTooLongError(position_limit_message(positions, limit, step))
            error.limit = limit
            raise error
        return stock_forward(self, emb, step)

    forward._onmt_ext = True
    PositionalEncoding.forward = forward

    stock_encoder = Translator._run_encoder

    def _run_encoder(self, batch):
        try:
            return stock_encoder(self, batch)
        except SequenceTooLongError as error:
            limit = getattr(error, "limit", None)
            lengths = batch["srclen"].tolist()
            numbers = batch.get("cid_line_number") or list(range(len(lengths)))
            long = sorted((number + 1, length) for number, length in zip(numbers, lengths)
                          if limit is None or length > limit)
            if not long:
                raise
            where = ", ".join(f"line {number} ({length} tokens)" for number, length in long)
            better = SequenceTooLongError(f"source {where}: {error}")
            better.limit = limit
            raise better from None

    _run_encoder._onmt_ext = True
    Translator._run_encoder = _run_encoder

    translate_bin.translate = exit_on_long_sequences(translate_bin.translate)


def exit_on_long_sequences(translate):
    """Wrap ``onmt_translate``'s ``translate(opt)``: a ``SequenceTooLongError`` ends it with its message."""
    from onmt.modules.embeddings import SequenceTooLongError

    def translate_or_exit(opt):
        try:
            return translate(opt)
        except SequenceTooLongError as error:
            raise SystemExit(f"onmt_translate: error: {error}") from None

    translate_or_exit._onmt_ext = True
    return translate_or_exit


def apply():
    """Apply every fix once (safe to call repeatedly)."""
    global _applied
    if _applied:
        return
    silence_deprecations()
    allow_checkpoint_classes()
    defer_spacy()
    _applied = True
