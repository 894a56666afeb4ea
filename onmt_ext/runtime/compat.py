"""Fixes of OpenNMT-py 3.5.1 (which declares ``torch<2.3``) for current torch, and of its crashes and data loss.

:func:`apply` is called by the start-up hook *before* ``onmt`` is imported (idempotent); the rest is installed by
:func:`onmt_ext.integration.plugin.activate`, each through :func:`onmt_ext.patches.patch`:

* the ``torch.load`` allow-list (``argparse.Namespace``; ``weights_only`` stays on) and the ``FutureWarning``
  filter for OpenNMT-py's ``torch.cuda.amp``/``sdp_kernel`` calls;
* :func:`keep_log_file`: ``-log_file`` survives the data iterator's ``init_logger()``;
* :func:`atomic_checkpoints` (temporary file, fsync, rename) and :func:`save_format_problems` (no safetensors);
* :func:`resume_data_position`: ``-train_from`` skips the batches its steps already consumed;
* :func:`count_filtered_examples`: ``filtertoolong`` drops are logged, and nothing to be translated is dropped;
* :func:`explain_position_limit`: a clear error beyond the 5000 positions of ``PositionalEncoding``;
* :func:`attention_backends`: OpenNMT-py's GPU attention without cuDNN's (ms per call on new batch shapes);
* :func:`stand_in_for_missing_packages`, :func:`defer_optional_packages`: spaCy, fasttext missing or deferred.
Stock behaviour, reasons and tests of each: docs/differences-from-stock.md.
"""

import argparse
import importlib.util
import itertools
import logging
import os
import shlex
import sys
import types
import warnings

from onmt_ext.patches import FIX, MESSAGE, SPEED, patch, record, temporarily

# OpenNMT-py is imported inside the functions: importing it while this module initialises would run the start-up
# hook (onmt_ext._autoload), which needs this module whole.  torch too: tools import make_command without torch.

# Regular expressions over the warning text (``warnings.filterwarnings`` matches
# them against the start of the message).
_DEPRECATION_MESSAGES = (
    r"`torch\.cuda\.amp\.",
    r"torch\.backends\.cuda\.sdp_kernel\(\) is deprecated",
)

#: Classes that OpenNMT-py checkpoints pickle besides tensors and containers.
SAFE_GLOBALS = (argparse.Namespace,)

#: Optional packages that stock OpenNMT-py imports at module level: name -> (what needs it, pip requirement).
OPTIONAL_PACKAGES = {
    "spacy": ("the terminology transform (and clause_split with -clause_lang en)", "spacy==3.8.18"),
    "fasttext": ("the clean transform", "fasttext-wheel==0.9.2"),
}
#: Transforms that need an optional package: transform name -> package.
TRANSFORM_PACKAGES = {"terminology": "spacy", "clean": "fasttext"}
_PACKAGE_NAMES = {"spacy": "spaCy", "fasttext": "fasttext"}


def silence_deprecations():
    """Filter the known FutureWarnings caused by OpenNMT-py's old torch API use."""
    for message in _DEPRECATION_MESSAGES:
        warnings.filterwarnings("ignore", message=message, category=FutureWarning)
        warnings.filterwarnings("ignore", message=message, category=DeprecationWarning)
    ours = [entry for entry in warnings.filters if entry[0] == "ignore" and entry[1] is not None
            and entry[1].pattern in _DEPRECATION_MESSAGES]

    def undo():
        warnings.filters[:] = [entry for entry in warnings.filters if entry not in ours]
        getattr(warnings, "_filters_mutated", lambda: None)()  # drops the warnings' "already shown" caches

    record("warnings filters (torch.cuda.amp, sdp_kernel)", kind=MESSAGE, undo=undo,
           reason="OpenNMT-py 3.5.1 calls deprecated torch.cuda.amp/sdp_kernel APIs; torch's FutureWarnings about "
                  "them name OpenNMT-py's code, which a user cannot change",
           test="tests/integration/test_plugin_cli.py::test_no_torch_amp_deprecation_noise")


def allow_checkpoint_classes():
    """Allow-list the non-tensor classes in OpenNMT-py checkpoints for ``torch.load``."""
    import torch

    serialization = torch.serialization
    if getattr(serialization, "add_safe_globals", None) is not None:  # torch < 2.4 has no safe unpickler
        before = serialization.get_safe_globals()

        def undo():
            serialization.clear_safe_globals()
            serialization.add_safe_globals(before)

        serialization.add_safe_globals(list(SAFE_GLOBALS))
        record("torch.serialization safe globals (argparse.Namespace)", kind=FIX, undo=undo,
               reason="stock cannot load its own checkpoints on torch >= 2.6: they pickle their options as an "
                      "argparse.Namespace, which torch.load refuses with weights_only=True; allow-listing that one "
                      "class keeps weights_only on",
               test="tests/unit/test_plugin.py::test_checkpoint_namespace_loads_with_weights_only")


class MissingPackageError(ImportError):
    """An optional package that a transform needs is not installed; the message says which and how to install it."""


def missing_package_message(package, user=None):
    """``the <user> needs <Package> (<python> -m pip install <requirement>)``."""
    what, requirement = OPTIONAL_PACKAGES[package]
    return f"{user or what} needs {_PACKAGE_NAMES[package]} ({install_command(requirement)})"


def install_command(*requirements):
    """``<this interpreter> -m pip install <requirements>``: installs where the running onmt-ext is, from any folder."""
    return " ".join([shlex.quote(sys.executable), "-m", "pip", "install", *map(shlex.quote, requirements)])


def make_command(target, cwd=None):
    """``make [-C <checkout>] [VENV=<this environment>] <target>``, runnable from ``cwd`` (default: here).

    ``-C`` when ``cwd`` is not onmt-ext's checkout, ``VENV=`` when the running environment is not the checkout's
    ``.venv``.  None outside a checkout (onmt-ext installed without its Makefile).
    """
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))  # onmt_ext/runtime/
    if not os.path.isfile(os.path.join(repo, "Makefile")) or not os.path.isfile(
            os.path.join(repo, "tools", "stage_venv.py")):
        return None
    make = "make"
    if os.path.realpath(cwd or os.getcwd()) != repo:
        make += f" -C {shlex.quote(repo)}"
    if os.path.realpath(sys.prefix) != os.path.realpath(os.path.join(repo, ".venv")):
        make += f" VENV={shlex.quote(sys.prefix)}"
    return f"{make} {target}"


def torch_setup_command(cwd=None):
    """A command that puts a CUDA build of torch into the environment running now, runnable from ``cwd``:
    :func:`make_command`'s ``make setup TORCH=... FORCE=1``, or outside a checkout pip of this interpreter.  The
    torch version and index are left for the user to fill in."""
    make = make_command('setup TORCH="torch==<version> --index-url <your CUDA index>" FORCE=1', cwd)
    return make or install_command("--force-reinstall", "torch==<version>") + " --index-url <your CUDA index>"


class _MissingModule(types.ModuleType):
    """Stands in for an optional package that is not installed (see :func:`stand_in_for_missing_packages`).

    Reading any public attribute raises :class:`MissingPackageError`; dunder
    reads (``inspect``, the import system) get ``AttributeError`` as from a
    module that lacks them.
    """

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise MissingPackageError(missing_package_message(self.__name__))


_stand_ins = {}


def _put_stand_ins(store, make, missing, what, **change):
    """Puts ``make(name)`` (kept in ``store``) in ``sys.modules`` for each :data:`OPTIONAL_PACKAGES` name not imported
    yet whose package is ``missing`` (or installed), and records that as ``sys.modules (<names>) <what>`` with
    :func:`~onmt_ext.patches.record`'s ``change``; returns those names."""
    added = [name for name in OPTIONAL_PACKAGES if name not in sys.modules and package_missing(name) == missing]
    for name in added:
        sys.modules[name] = store.setdefault(name, make(name))
    if added:
        record(f"sys.modules ({', '.join(added)}) {what}", **change)
    return added


def stand_in_for_missing_packages():
    """Put a :class:`_MissingModule` under each missing :data:`OPTIONAL_PACKAGES` name while ``onmt`` is imported.

    Returns the names that got a stand-in.  :func:`drop_stand_ins` removes
    them from ``sys.modules`` once ``onmt`` is imported.
    """
    return _put_stand_ins(
        _stand_ins, _MissingModule, True, "while onmt is imported", kind=FIX, undo=drop_stand_ins,
        reason="stock `import onmt` fails without spaCy or fasttext, which only the terminology and clean transforms "
               "use; those transforms are refused in one line instead",
        test="tests/integration/test_user_errors.py::test_onmt_works_without_spacy_and_fasttext")


class _DeferredModule(types.ModuleType):
    """Stands in for an installed optional package while ``onmt`` is imported (see :func:`defer_optional_packages`).

    The first public attribute read imports the package; every read is then the package's.  Dunder reads (the
    import system's) get ``AttributeError`` as from a module that lacks them.
    """

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(_package_of(self), name)


def _package_of(stand_in):
    """The package a :class:`_DeferredModule` stands for, imported (a method would hide the package's attribute of
    its name); the stand-in leaves ``sys.modules`` first, where it still is, so that the real import takes its
    place."""
    if sys.modules.get(stand_in.__name__) is stand_in:
        del sys.modules[stand_in.__name__]
    return importlib.import_module(stand_in.__name__)


_deferred = {}


def _import_deferred():
    """Imports the packages :func:`defer_optional_packages` deferred, as stock ``import onmt`` does."""
    for stand_in in _deferred.values():
        _package_of(stand_in)


def defer_optional_packages():
    """Put a :class:`_DeferredModule` under each installed :data:`OPTIONAL_PACKAGES` name while ``onmt`` is imported.

    Stock ``onmt.transforms`` imports every transform module, and ``terminology``'s ``import spacy`` alone took
    about 1.1 s of the 4.6 s of each command's imports on this project's 2-core CPU.  The transform keeps the stand-in,
    which imports the package when the transform first uses it; :func:`drop_stand_ins` takes it out of
    ``sys.modules`` once ``onmt`` is imported, so that any later ``import`` gets the package itself.  Returns the
    names deferred.
    """
    return _put_stand_ins(
        _deferred, _DeferredModule, False, "imported on first use", kind=SPEED, undo=_import_deferred,
        reason="stock `import onmt` imports spaCy for the terminology transform alone: about 1.1 s of every command's "
               "start-up on a 2-core CPU",
        test="tests/integration/test_plugin_cli.py::test_optional_packages_are_imported_on_first_use")


def drop_stand_ins():
    """Take the stand-ins of :func:`stand_in_for_missing_packages` and :func:`defer_optional_packages` out of
    ``sys.modules`` (the modules keep theirs)."""
    for name, module in itertools.chain(_stand_ins.items(), _deferred.items()):
        if sys.modules.get(name) is module:
            del sys.modules[name]


def package_missing(package):
    """True when the optional ``package`` cannot be imported (a stand-in counts as missing)."""
    if sys.modules.get(package) is _stand_ins.get(package, object()):
        return True
    try:
        return importlib.util.find_spec(package) is None
    except (ImportError, ValueError):
        return True


def missing_package_problems(opt):
    """One message per transform of ``opt.transforms`` whose optional package is not installed."""
    problems = []
    for transform in getattr(opt, "transforms", None) or []:
        package = TRANSFORM_PACKAGES.get(transform)
        if package and package_missing(package):
            problems.append(missing_package_message(package, f"the {transform} transform"))
    if "clause_split" in (getattr(opt, "transforms", None) or []) and getattr(opt, "clause_lang", None) == "en" \
            and package_missing("spacy"):
        problems.append(missing_package_message("spacy", "the clause_split transform with -clause_lang en"))
    return problems


def keep_log_file():
    """Stop OpenNMT-py's data iterator from dropping the ``-log_file`` handler (see the module docstring).

    Needs ``onmt`` imported; called by :func:`onmt_ext.integration.plugin.activate`.  A
    process whose ``onmt`` logger has no handler yet (a data-loader worker)
    still gets the console handler it asked for.
    """
    from onmt.inputters import dynamic_iterator

    patch(dynamic_iterator, "init_logger", _init_logger_keeping_handlers, kind=FIX,
          reason="the data iterator re-initialises the logger without a file, which silently stops -log_file",
          test="tests/integration/test_plugin_cli.py::"
               "test_log_file_keeps_training_lines_after_the_data_iterator_starts")


def _init_logger_keeping_handlers(stock, log_file=None, *args, **kwargs):
    logger = logging.getLogger("onmt")
    if log_file is None and not args and not kwargs and logger.handlers:
        return logger
    return stock(log_file, *args, **kwargs)


def atomic_save(obj, path, *args, **kwargs):
    """``torch.save(obj, path)`` that never leaves a partial file at ``path`` (temporary file, fsync, rename)."""
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
        patch(module, "torch", _TorchWithAtomicSave(), wrap=False, kind=FIX,
              reason="torch.save writes the checkpoint in place: a run killed while saving leaves a truncated "
                     "file under the final name",
              test="tests/unit/test_plugin.py::test_checkpoints_are_written_atomically")


def batches_consumed(trainer, steps_done):
    """Training batches that steps 1..``steps_done`` of ``trainer`` consumed (``accum_count`` per step)."""
    return sum(trainer._accum_count(step) for step in range(1, steps_done + 1))


def resume_data_position():
    """Make a resumed ``Trainer.train`` skip the batches already trained on (see the module docstring)."""
    from onmt.trainer import Trainer

    patch(Trainer, "train", _train_from_data_position, kind=FIX, runtime=True,
          reason="-train_from restarts the corpora at their first batch: a resumed run trains the first batches "
                 "twice, and a run resumed again and again never reaches the end of its corpus",
          test="tests/integration/test_faults.py::test_resumed_training_matches_the_uninterrupted_run")


def _train_from_data_position(stock, self, train_iter, train_steps, *args, **kwargs):
    from onmt.utils.logging import logger

    done = self.optim.training_step - 1
    if done > 0 and train_iter is not None:
        skip = batches_consumed(self, done)
        logger.info(f"onmt-ext: resuming at step {done + 1}: skipping the {skip} training batches that "
                    f"steps 1-{done} used, so that training continues where it stopped (exact when the "
                    "data, accum_count and number of GPUs are those of the run being resumed)")
        train_iter = itertools.islice(train_iter, skip, None)
    return stock(self, train_iter, train_steps, *args, **kwargs)


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
    from onmt.transforms.misc import FilterTooLongTransform

    patch(FilterTooLongTransform, "apply", _filter_too_long, kind=FIX,
          reason="filtertoolong drops training pairs without a word until a full pass, and drops (or crashes on) "
                 "lines to be translated, which shifts every later translation",
          test="tests/unit/test_plugin.py::test_filtertoolong_logs_its_first_drop_and_the_running_count")


#: ``onmt.constants.CorpusName.INFER`` (a data worker calls :func:`_filter_too_long` for every example: no import
#: there; tests/unit/test_plugin.py checks the value)
_INFER_CORPUS = "infer"


def _filter_too_long(stock, self, example, is_train=False, stats=None, **kwargs):
    if example.get("cid") == _INFER_CORPUS or example.get("tgt") is None:
        if not getattr(self, "_onmt_ext_told_infer", False):
            from onmt.utils.logging import logger

            self._onmt_ext_told_infer = True
            logger.warning("filtertoolong drops nothing that is to be translated (the onmt_translate source, "
                           "the -valid_metrics source): a dropped sentence would put every later translation on "
                           "the wrong line")
        return example
    kept = stock(self, example, is_train=is_train, stats=stats, **kwargs)
    self._onmt_ext_seen = getattr(self, "_onmt_ext_seen", 0) + 1
    if kept is not None:
        return kept
    from onmt.utils.logging import logger

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


def position_limit_message(positions, limit, step=None):
    """What to do about a sequence of ``positions`` tokens (or decoding step) beyond ``limit`` sinusoidal positions."""
    if step is not None:
        return (f"the output reached {positions} tokens, beyond the {limit} positions of the sinusoidal position "
                f"encoding; set onmt_translate -max_length below {limit}")
    return (f"a sequence of {positions} tokens is longer than the {limit} positions of the sinusoidal position "
            f"encoding (onmt.modules.PositionalEncoding, max_len {limit}): split the sentence into shorter ones "
            "(in training, the filtertoolong transform's -src_seq_length/-tgt_seq_length drop such pairs)")


def opennmt_sdp_kernel(enable_flash=True, enable_math=True, enable_mem_efficient=True, enable_cudnn=False):
    """``torch.backends.cuda.sdp_kernel`` as OpenNMT-py 3.5.1 knew it (torch < 2.3): the attention backends it
    names and not cuDNN's, which later torch adds unless told not to; made through
    ``torch.nn.attention.sdpa_kernel``, which torch.compile traces (the stock generator context manager splits
    a compiled graph)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    wanted = ((enable_flash, SDPBackend.FLASH_ATTENTION), (enable_mem_efficient, SDPBackend.EFFICIENT_ATTENTION),
              (enable_math, SDPBackend.MATH), (enable_cudnn, SDPBackend.CUDNN_ATTENTION))
    return sdpa_kernel([backend for on, backend in wanted if on])


class OpenNMTBackends(temporarily):
    """Context: while inside, ``torch.backends.cuda.sdp_kernel`` is :func:`opennmt_sdp_kernel`, so OpenNMT-py's
    attention gets the backends it names; what was there is back on leaving, whatever happened
    (:class:`onmt_ext.patches.temporarily`)."""

    __slots__ = ()

    def __init__(self):
        import torch

        super().__init__(torch.backends.cuda, "sdp_kernel", opennmt_sdp_kernel)


def _attention_forward(stock, self, *args, **kwargs):
    import torch

    if torch.compiler.is_compiling():  # a compiled layer (onmt_ext.runtime.compile) is inside OpenNMTBackends already
        return stock(self, *args, **kwargs)
    with OpenNMTBackends():
        return stock(self, *args, **kwargs)


def attention_backends():
    """OpenNMT-py's attention on a GPU asks ``torch.backends.cuda.sdp_kernel`` for the flash-less backends it knew;
    later torch also allows cuDNN's attention there, which cost ms of host time per call on new batch shapes.
    Here the call gets :func:`opennmt_sdp_kernel` (memory-efficient or math attention, as under torch < 2.3)."""
    from onmt.modules.multi_headed_attn import MultiHeadedAttention

    patch(MultiHeadedAttention, "forward", _attention_forward, kind=SPEED,
          test="tests/unit/test_compile_layers.py::test_opennmt_attention_gets_the_backends_it_names",
          reason="under later torch (2.11 on the H200) the backends OpenNMT-py 3.5.1 names for its GPU attention "
                 "include cuDNN's, whose calls cost several ms of host time each on the users' data path (new "
                 "batch shapes every step); memory-efficient attention, as under OpenNMT-py's torch < 2.3, computes "
                 "the same attention (torch.backends.cuda.sdp_kernel is swapped inside each call only)")


def explain_position_limit():
    """Give ``SequenceTooLongError`` a message that says what to do (see the module docstring).

    ``PositionalEncoding.forward`` checks the length itself (the stock check
    reports the size of the wrong dimension); ``Translator._run_encoder``
    adds the 1-based line numbers of the too-long sources of the batch;
    the command wrapper (:func:`onmt_ext.integration.commands._run_command`) turns the error into a
    one-line exit.  Idempotent.
    """
    from onmt.modules.embeddings import PositionalEncoding
    from onmt.translate.translator import Translator

    test = "tests/unit/test_plugin.py::test_a_sequence_beyond_the_position_encoding_gets_a_clear_error"
    patch(PositionalEncoding, "forward", _positional_encoding_forward, kind=MESSAGE, test=test,
          reason="a sequence over the 5000 sinusoidal positions ends in a traceback that says 'limited to 1'")
    patch(Translator, "_run_encoder", _run_encoder_naming_lines, kind=MESSAGE, test=test,
          reason="names the source lines that are too long for the position encoding")


def _positional_encoding_forward(stock, self, emb, step=None):
    from onmt.modules.embeddings import SequenceTooLongError

    limit, positions = self.pe.size(0), (step or 0) + emb.size(1)
    if positions > limit:
        error = SequenceTooLongError(position_limit_message(positions, limit, step))
        error.limit = limit
        raise error
    return stock(self, emb, step)


def _run_encoder_naming_lines(stock, self, batch):
    from onmt.modules.embeddings import SequenceTooLongError

    try:
        return stock(self, batch)
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


def apply():
    """Apply the fixes that must precede ``import onmt`` (safe to call repeatedly; the start-up hook also calls
    :func:`stand_in_for_missing_packages` then, and only then)."""
    silence_deprecations()
    allow_checkpoint_classes()
