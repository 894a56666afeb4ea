"""The stock commands (``onmt_train``, ``onmt_translate``, ``onmt_build_vocab``) ending every error in one line.

:func:`one_line_errors` wraps each command's ``main`` in :func:`run_main` (its command line is then parsed
strictly, :mod:`onmt_ext.integration.parsing`) and its work function in :func:`_run_command`: a
:class:`~onmt_ext.errors.UserError` or a known error of OpenNMT-py or onmt-ext becomes ``<command>: error: ...``
(exit 2 usage, 1 run time), and Ctrl-C names the last checkpoint and the command that resumes from it (exit
130).  Before running, :func:`_check_machine` refuses a GPU option on a torch without CUDA (several training ranks
run on the CPU instead, :mod:`onmt_ext.runtime.distributed`) and a transform whose package is missing; ``onmt_train``
refuses missing vocabularies and a ``-save_model`` holding another run's checkpoints.
"""

import contextvars
import glob
import multiprocessing
import os
import re
import shlex
import signal
import sys
import time
import warnings

import torch

from onmt_ext.integration import preprocessing
from onmt_ext.runtime import distributed, train_step
from onmt_ext.runtime.compat import MissingPackageError, missing_package_problems, torch_setup_command
from onmt_ext.runtime.corpus import CorpusError, corpora_of, not_a_file
from onmt_ext.errors import UsageError, UserError
from onmt_ext.options import OptionError
from onmt_ext.patches import FIX, MESSAGE, patch, record

# OpenNMT-py (and onmt_ext.mechanisms.clause.split, which imports it) is imported inside the functions: importing it
# while this module initialises would activate onmt-ext (onmt_ext._autoload) before this module is whole.

#: True while the ``main`` of an OpenNMT-py command runs (:func:`run_main`).
_IN_COMMAND = contextvars.ContextVar("onmt_ext_in_command", default=False)


#: The entry point modules of the commands (OpenNMT-py's and onmt_ext_binarize), by command name.
COMMANDS = {"onmt.bin.train": "onmt_train", "onmt.bin.translate": "onmt_translate",
            "onmt.bin.build_vocab": "onmt_build_vocab", "onmt_ext.integration.binarize": "onmt_ext_binarize"}


def main_module():
    """The name of the module that runs as ``__main__`` (runpy gives it a spec: ``python -m onmt.bin.translate``,
    and the console scripts' ``onmt.bin.<command>``), or None."""
    return getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", None)


def _run_as_command():
    """True in ``python -m onmt.bin.<command>``: runpy runs that module as ``__main__``, with its spec."""
    return main_module() in COMMANDS


def in_command():
    """True inside an OpenNMT-py command (its ``main``, or ``python -m onmt.bin.<command>``)."""
    return _IN_COMMAND.get() or _run_as_command()


_ERROR_PREFIX = re.compile(r"^(?:(\S+): )?error: ?")


def _one_line(prog, text):
    """``<prog>: error: ...`` for each line of ``text``.

    A leading ``error:`` or ``<prog>: error:`` is not repeated; another
    command's ``<name>: error:`` (e.g. a transform's) becomes ``<name>:``.
    """
    lines = []
    for line in str(text).strip().splitlines():
        line = line.strip()
        if not line or line == "invalid onmt-ext options:":  # the header of OptionError's list
            continue
        match = _ERROR_PREFIX.match(line)
        if match:
            named = match.group(1)
            line = line[match.end():] if named in (None, prog) else f"{named}: {line[match.end():]}"
        lines.append(f"{prog}: error: {line}")
    return "\n".join(lines)


def _told_errors():
    """The errors that end a command in one line (:func:`_told`): :class:`UserError` and :class:`CorpusError`
    (``SystemExit`` subclasses), and known ``Exception`` types."""
    from onmt.modules.embeddings import SequenceTooLongError

    from onmt_ext.mechanisms.clause.split import ClauseSplitError

    return UserError, CorpusError, SequenceTooLongError, MissingPackageError, ClauseSplitError, OptionError


def _told(error):
    """``(text, exit status)`` of an error that ends a command in one line per problem (:func:`_told_errors`)."""
    if isinstance(error, (UserError, CorpusError)):
        return getattr(error, "message", error.code), getattr(error, "status", 1)
    return str(error), getattr(error, "status", 1)  # ClauseSplitError's: 2 for an option's value


#: Starts what a rank (training or translation) hands its parent through stock's error queue for one line:
#: ``<this> <status>\n<text>``
_RANK_ERROR = "onmt-ext: a rank's error, exit status"


def _rank_error(error):
    """``(text, exit status)`` where ``error`` is stock's ``ErrorHandler`` exception carrying a rank's error told
    by :func:`_tell_parent` (:func:`spawned_rank`, :func:`spawned_translation_rank`); else None."""
    text = str(error)
    start = text.find(_RANK_ERROR)
    if start < 0:
        return None
    status, _, told = text[start + len(_RANK_ERROR):].partition("\n")
    return told, int(status) if status.strip().isdigit() else 1


def _run_command(stock, *args, **kwargs):
    """The stock ``main``/``train``/``translate`` of a command, ending every known error in one line per problem.

    Usage errors exit 2, run-time errors 1; Ctrl-C in ``onmt_train`` names the
    last checkpoint and the command that resumes from it (exit 130).  A rank's
    error reaches here through stock's error queue (:func:`_tell_parent`).
    """
    prog = COMMANDS.get(stock.__module__, os.path.basename(sys.argv[0]))
    try:
        return stock(*args, **kwargs)
    except _told_errors() as error:
        text, status = _told(error)
        sys.stderr.write(_one_line(prog, text) + "\n")
        raise SystemExit(status) from None
    except SystemExit as error:
        if isinstance(error.code, str):  # sys.exit("message") somewhere: one line with the command's name
            sys.stderr.write(_one_line(prog, error.code) + "\n")
            raise SystemExit(1) from None
        raise
    except KeyboardInterrupt:
        _end_interrupted(prog, args)
    except Exception as error:
        _stop_ranks(_ranks_of(error))  # (a rank's error, one-line or not: the others must not outlive it)
        told = _rank_error(error)
        if told:
            sys.stderr.write(_one_line(prog, told[0]) + "\n")
            raise SystemExit(told[1]) from None
        if not _caused_by_interrupt(error):
            raise
        _end_interrupted(prog, args)  # Ctrl-C inside torch.save's writer surfaces as its RuntimeError


#: How long (seconds) the other ranks have to end on stock's Ctrl-C once one has failed (:func:`_stop_ranks`)
_RANKS_GRACE = 10


def _ranks_of(error):
    """The process ids of the ranks that stock's ``ErrorHandler`` stopped with Ctrl-C while raising ``error`` (in
    its ``signal_handler``, a frame of ``error``'s traceback); empty when another raised it."""
    from onmt.utils.distributed import ErrorHandler

    trace, pids = error.__traceback__, []
    while trace is not None:
        handler = trace.tb_frame.f_locals.get("self")
        if isinstance(handler, ErrorHandler):
            pids = list(handler.children_pids)
        trace = trace.tb_next
    return pids


def _stop_ranks(pids):
    """End the ranks ``pids`` (child processes of this one) once one has failed.

    Stock's ``ErrorHandler`` sends each rank Ctrl-C and raises in the parent, which then waits for every rank at
    exit.  A rank can miss that Ctrl-C (seen, rarely: the rank went on, and the parent waited for it for ever); one
    still running after :data:`_RANKS_GRACE` seconds is terminated.
    """
    deadline = time.monotonic() + _RANKS_GRACE
    ranks = [child for child in multiprocessing.active_children() if child.pid in pids]
    for rank in ranks:
        rank.join(max(0.0, deadline - time.monotonic()))
    for rank in ranks:
        if rank.is_alive():
            rank.terminate()
            rank.join(5)
            if rank.is_alive():
                rank.kill()


def _tell_parent(error_queue, rank, error):
    """Hand ``error``, one of :func:`_told_errors`, to the parent through stock's error queue as ``rank R: ...``
    lines after :data:`_RANK_ERROR` and its status (:func:`_rank_error` reads them there).

    The rank ignores Ctrl-C from here on: the parent stops every rank with it once one has failed (stock's
    ``ErrorHandler``), and this one is ending anyway.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # before the parent hears of it and stops the ranks
    text, status = _told(error)
    lines = [f"rank {rank}: {line.strip()}" for line in str(text).strip().splitlines() if line.strip()]
    error_queue.put((rank, f"{_RANK_ERROR} {status}\n" + "\n".join(lines)))


def spawned_rank(process_fn, opt, device_id, error_queue):
    """A training rank's process (``onmt_train -world_size N``): stock's ``spawned_train``, except that an error
    that ends a command in one line (:func:`_told`) goes to the parent through stock's error queue as that line,
    with the rank (:func:`_tell_parent`).

    Stock passes the parent only an ``Exception``'s traceback; a :class:`UserError` is a ``SystemExit``, which its
    ``except`` lets through: the rank printed the message and the parent's run exited 0.  A module function, not a
    patch layer: the spawned process finds its target by name.
    """
    from onmt.utils.distributed import spawned_train

    rank = opt.gpu_ranks[device_id]
    if cpu_half_warning(opt, distributed.cpu_ranks(opt)):  # (a spawned process starts without the parent's filters)
        _quiet_cpu_half()

    def process(*args, **kwargs):
        try:
            return process_fn(*args, **kwargs)
        except _told_errors() as error:
            _tell_parent(error_queue, rank, error)

    try:
        return spawned_train(process, opt, device_id, error_queue)
    except (UserError, CorpusError) as error:  # from multi_init, before process_fn
        _tell_parent(error_queue, rank, error)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


class _TellingQueue:
    """Stock's error queue as :func:`spawned_translation_rank` hands it to stock's ``spawned_infer``: what stock's
    ``except Exception`` puts there while it handles an error of :func:`_told_errors` (a known error, or a
    :class:`UserError` that is also stock's type, :func:`onmt_ext.errors.user_error`) goes as that error's lines
    (:func:`_tell_parent`); anything else as stock put it (its traceback).  Either way the rank is ending: it ignores
    the Ctrl-C with which the parent then stops the ranks (no KeyboardInterrupt traceback of its own)."""

    def __init__(self, queue):
        self.queue = queue

    def put(self, item):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        error = sys.exc_info()[1]  # stock puts inside its except block: the error it handles
        if isinstance(error, _told_errors()):
            return _tell_parent(self.queue, item[0], error)
        return self.queue.put(item)


def spawned_translation_rank(opt, device_id, error_queue, queue_instruct, queue_result):
    """A translation rank's process (``onmt_translate -world_size N``): stock's ``spawned_infer``, except that an
    error that ends a command in one line (:func:`_told`) goes to the parent through stock's error queue as that
    line, with the rank (:func:`_tell_parent`), as in :func:`spawned_rank`.

    Stock's ``except Exception`` lets a :class:`UserError` (a ``SystemExit``) through: the rank printed the message
    and the parent waited for its translation for ever.  The known errors that are an ``Exception`` it caught, and
    the parent ended in their traceback; they reach this queue through :class:`_TellingQueue`.  A module function:
    the spawned process finds its target by name.
    """
    from onmt.utils.distributed import spawned_infer

    try:
        return spawned_infer(opt, device_id, _TellingQueue(error_queue), queue_instruct, queue_result)
    except (UserError, CorpusError) as error:  # SystemExits: stock's except Exception lets them through
        ranks = opt.gpu_ranks
        _tell_parent(error_queue, ranks[device_id] if device_id < len(ranks) else device_id, error)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _replace_rank_target(owner, name, target, *, test, reason):
    """``owner.<name>``, the function that a command's ranks run (found by name in the spawned process), becomes
    ``target``; recorded in the registry, undone by putting stock's back."""
    if getattr(owner, name) is target:
        return
    stock = getattr(owner, name)
    setattr(owner, name, target)
    record(f"{owner.__name__}.{name}", kind=FIX, undo=lambda: setattr(owner, name, stock), test=test, reason=reason)


def run_main(stock, *args, **kwargs):
    """A command's ``main``: its command line is parsed strictly
    (:func:`onmt_ext.integration.parsing._parses_strictly`), its errors end in one line (:func:`_run_command`)."""
    token = _IN_COMMAND.set(True)
    try:
        return _run_command(stock, *args, **kwargs)
    finally:
        _IN_COMMAND.reset(token)


def _caused_by_interrupt(error):
    """True when ``error`` was raised while a KeyboardInterrupt was being handled (its ``__context__`` chain)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return True
        seen.add(id(error))
        error = error.__context__
    return False


def _end_interrupted(prog, args):
    """One line for Ctrl-C (for ``onmt_train``: the last checkpoint and how to resume), exit 130."""
    if prog == "onmt_train" and args and hasattr(args[0], "save_model"):
        sys.stderr.write(f"{prog}: error: {interrupted_message(args[0])}\n")
    else:
        sys.stderr.write(f"{prog}: error: interrupted (Ctrl-C)\n")
    raise SystemExit(130) from None


def step_checkpoints(save_model):
    """``(step, path)`` of the ``<save_model>_step_N.pt`` files, by step."""
    found = []
    for path in glob.glob(glob.escape(save_model) + "_step_*.pt"):
        tail = path[len(save_model) + len("_step_"):-len(".pt")]
        if tail.isdigit():
            found.append((int(tail), path))
    return sorted(found)


def _resume_command(last):
    """The command line of this run with ``-train_from last`` (replacing any ``-train_from``)."""
    argv, words = sys.argv[1:], []
    skip = False
    for word in argv:
        if skip:
            skip = False
            continue
        if word in ("-train_from", "--train_from"):
            skip = True
            continue
        if word.startswith(("-train_from=", "--train_from=")):
            continue
        words.append(word)
    return shlex.join(["onmt_train", *words, "-train_from", last])


def interrupted_message(opt):
    """What to say when ``onmt_train`` with options ``opt`` is interrupted: the last checkpoint and how to resume."""
    checkpoints = step_checkpoints(getattr(opt, "save_model", "model"))
    if not checkpoints:
        return (f"interrupted before the first checkpoint (-save_checkpoint_steps "
                f"{getattr(opt, 'save_checkpoint_steps', '?')}); nothing to resume from")
    step, last = checkpoints[-1]
    return f"interrupted; the last checkpoint is {last} (step {step}); resume with: {_resume_command(last)}"


def cuda_problems(opt, cpu_ranks=False):
    """One message when ``opt`` asks for a GPU (``-gpu``, ``-gpu_ranks``) that this torch cannot give.

    ``cpu_ranks``: several training ranks run as CPU processes (:func:`onmt_ext.runtime.distributed.cpu_ranks`), so
    ``-gpu_ranks`` is no problem.
    """
    asked = [f"-gpu {opt.gpu}"] if isinstance(getattr(opt, "gpu", None), int) and opt.gpu >= 0 else []
    ranks = [] if cpu_ranks else getattr(opt, "gpu_ranks", None) or []
    asked += [f"-gpu_ranks {' '.join(map(str, ranks))}"] if ranks else []
    if not asked or torch.cuda.is_available():
        return []
    if torch.version.cuda is None:
        why = f"this torch ({torch.__version__}) has no CUDA"
        fix = (f"drop it to run on the CPU, or install a CUDA build of torch: {torch_setup_command()} "
               "(SYSTEM_TORCH=1 in place of TORCH= for the machine's own torch; docs/install.md)")
    else:
        why = f"torch {torch.__version__} sees no CUDA device"
        fix = "drop it to run on the CPU, or check the driver and CUDA_VISIBLE_DEVICES"
    return [f"{' and '.join(asked)}: {why}; {fix}"]


def _check_machine(opt, cpu_ranks=False):
    """Refuse (exit 1) a GPU option on a torch without CUDA, and a transform whose package is not installed.

    Run by the commands, not by the option parser: tools parse paper configs
    that name GPUs on machines without one.  ``cpu_ranks``: see :func:`cuda_problems`.
    """
    lacking = cuda_problems(opt, cpu_ranks) + missing_package_problems(opt)
    if lacking:
        raise UserError("\n".join(lacking))


def vocabulary_output_problems(opt):
    """Why ``onmt_build_vocab`` may not write ``-src_vocab``/``-tgt_vocab`` (empty: it may): neither may be a file
    it reads (a corpus, -config, a transform's file); with ``-overwrite`` stock replaces that file by a vocabulary."""
    inputs = [(name, path) for name, path in _training_inputs(opt) if name not in ("-src_vocab", "-tgt_vocab")]
    problems = []
    for key in ("src_vocab", "tgt_vocab"):
        if key == "tgt_vocab" and getattr(opt, "share_vocab", False):  # (stock writes -src_vocab only)
            continue
        problems += _clash_problems(f"-{key}", getattr(opt, key, None), inputs)
    return problems


def _build_vocab_checked(stock, opt, *args, **kwargs):
    """``onmt.bin.build_vocab.build_vocab_main`` after :func:`_check_machine` and
    :func:`vocabulary_output_problems`."""
    problems = vocabulary_output_problems(opt)
    if problems:
        raise UsageError("\n".join(problems))
    _check_machine(opt)
    return stock(opt, *args, **kwargs)


def _vocabulary_line_problem(number, line, counted):
    """Why line ``number`` of a vocabulary file is not one OpenNMT-py reads as meant (None: it is).

    ``counted``: the file has counts (its first line is ``token<whitespace>digits``, as stock decides).
    """
    if line.endswith("\r"):  # (stock's first-line test then sees no count, and reads whole lines as tokens)
        return (f"line {number} ends in a carriage return (Windows line endings); convert the file "
                "(dos2unix) or rebuild it with onmt_build_vocab")
    if not line.strip():
        return f"line {number} is empty; remove it (every line holds one token and its count)"
    if counted and line[:1].isspace():
        return (f"line {number} holds an empty or whitespace token ({line[:40]!r}), which OpenNMT-py cannot read "
                "back: onmt_build_vocab writes one from a corpus with double spaces or other whitespace (U+3000) "
                "between words; clean the corpus and build the vocabulary again")
    fields = line.split(None, 1)  # as stock's _read_vocab_file splits
    if len(fields) == 2 and not fields[1].isdecimal() and _SCORE.fullmatch(fields[1]):
        return (f"line {number}: this looks like a sentencepiece .vocab (scores, not counts: {line[:40]!r}); "
                "use onmt_build_vocab's vocabulary (onmt_build_vocab -config <your config> writes it)")
    if counted and (len(fields) != 2 or not fields[1].isdecimal()):
        return (f"line {number} is not `token<TAB>count` ({line[:40]!r}); use onmt_build_vocab's vocabulary "
                "(onmt_build_vocab -config <your config> writes it)")
    if not counted and len(fields) != 1:
        if number == 1:
            return (f"line 1 is not `token<TAB>count` ({line[:40]!r}): is it a corpus? use onmt_build_vocab's "
                    "vocabulary (onmt_build_vocab -config <your config> writes it)")
        return (f"line {number} is not a token ({line[:40]!r}: whitespace in it), while line 1 has no count; "
                "use onmt_build_vocab's vocabulary (onmt_build_vocab -config <your config> writes it)")
    return None


#: A sentencepiece ``.vocab`` score (a float, mostly negative), where OpenNMT-py expects a count.
_SCORE = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def vocabulary_problem(path):
    """Why OpenNMT-py would misread the vocabulary file ``path`` (None: it reads it as meant).

    Stock ``_read_vocab_file`` reads ``token<TAB>count`` lines (onmt_build_vocab's), or one token per line
    when its first line has no count; it ends in an IndexError on an empty file, a UnicodeDecodeError on a
    binary one, and silently trains on a sentencepiece ``.vocab`` or a corpus.  Every line is split (cheap).
    """
    with open(path, "rb") as handle:
        data = handle.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        number = data.count(b"\n", 0, error.start) + 1
        return (f"line {number} is not UTF-8 text (byte {error.start}); is it a "
                "vocabulary? onmt_build_vocab -config <your config> writes one")
    lines = text.split("\n")[:-1]  # as stock: what follows the last newline is not read
    if not text.strip():
        return "the file is empty; onmt_build_vocab -config <your config> writes the vocabulary"
    if not lines:
        return "its only line has no newline at its end, and OpenNMT-py reads no line without one; add a newline"
    first = lines[0].split(None, 1)
    counted = len(first) == 2 and first[-1].isdigit()
    for number, line in enumerate(lines, 1):
        problem = _vocabulary_line_problem(number, line, counted)
        if problem:
            return problem
    return None


def missing_vocabularies(opt):
    """A message for each of ``-src_vocab``/``-tgt_vocab`` that names no file, or one OpenNMT-py would misread
    (:func:`vocabulary_problem`)."""
    problems, seen = [], set()
    for key, path in (("src_vocab", opt.src_vocab), ("tgt_vocab", opt.tgt_vocab)):
        if not path or (key == "tgt_vocab" and getattr(opt, "share_vocab", False)):  # (stock reads -src_vocab only)
            continue
        if not os.path.isfile(path):
            problems.append(f"-{key} {path}: {not_a_file(path)}" + (
                "" if os.path.isdir(path) else " (onmt_build_vocab -config <your config> writes it)"))
            continue
        if os.path.realpath(path) in seen:  # -share_vocab, or the same file for both
            continue
        seen.add(os.path.realpath(path))
        problem = vocabulary_problem(path)
        if problem:
            problems.append(f"-{key} {path}: {problem}")
    return problems


#: What torch says, twice and without naming the option, when ``-model_dtype fp16`` trains on the CPU.
_CPU_HALF_WARNINGS = (r"torch\.cuda\.amp\.GradScaler is enabled, but CUDA is not available",
                      r"CUDA is not available or torch_xla is imported\. Disabling autocast")


def cpu_half_warning(opt, cpu_ranks=False):
    """The line that replaces torch's warnings when ``-model_dtype fp16`` trains on the CPU (no ``-gpu_ranks``, or
    CPU ranks: :func:`onmt_ext.runtime.distributed.cpu_ranks`): stock then trains in float32, its mixed precision
    being CUDA's; None otherwise."""
    if getattr(opt, "model_dtype", None) != "fp16" or (getattr(opt, "gpu_ranks", None) and not cpu_ranks):
        return None
    if cpu_ranks:
        return ("onmt_train: warning: -model_dtype fp16: these ranks train on the CPU (this torch sees no CUDA "
                "device), in float32 (mixed precision is CUDA's); -model_dtype fp32 says so")
    return ("onmt_train: warning: -model_dtype fp16: this run trains on the CPU, in float32 (mixed precision is "
            "CUDA's); give -gpu_ranks to train on GPUs, or -model_dtype fp32 to say so")


def _quiet_cpu_half():
    """Filter torch's own warnings of ``-model_dtype fp16`` on the CPU in this process (:func:`cpu_half_warning`
    has said it once, naming the option)."""
    for message in _CPU_HALF_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=UserWarning)


def _train_checked(stock, opt, *args, **kwargs):
    """``onmt.bin.train.train``: refuse missing vocabularies and a -save_model that holds another run's files."""
    cpu_ranks = distributed.cpu_ranks(opt)
    _check_machine(opt, cpu_ranks)
    half = cpu_half_warning(opt, cpu_ranks)
    if half:
        sys.stderr.write(half + "\n")
        _quiet_cpu_half()
    problems = train_step.adam_eps_problems(opt) + log_file_problems(opt) + \
        checkpoint_problems([("-train_from", getattr(opt, "train_from", None))]) + directory_problems(opt)
    if not getattr(opt, "train_from", None) or getattr(opt, "update_vocab", False):  # (resumed: the checkpoint's)
        problems += missing_vocabularies(opt)
    if problems:
        raise UsageError("\n".join(problems))
    existing = step_checkpoints(getattr(opt, "save_model", "model"))
    if existing and not getattr(opt, "train_from", None) and not getattr(opt, "overwrite_checkpoints", False):
        shown = ", ".join(path for _, path in existing[:3]) + (", …" if len(existing) > 3 else "")
        raise UsageError(f"-save_model {opt.save_model}: holds checkpoints of another run ({shown}); resume it with "
                         f"-train_from {existing[-1][1]}, or pass -overwrite_checkpoints to train over them, or "
                         "choose another -save_model")
    return _run_command(stock, opt, *args, **kwargs)


def writable_file_problems(option, path):
    """Why ``path``, a file the command would write (``-output``, ``-log_file``), cannot be written (empty: it can).

    Its directory must exist (onmt-ext creates none: a misspelt path would get a tree of its own) and the path
    must not be a directory.
    """
    if not isinstance(path, str) or not path:
        return []
    if os.path.isdir(path):
        return [f"{option} {path}: is a directory; give the path of a file in it"]
    folder = os.path.dirname(path)
    if folder and not os.path.isdir(folder):
        if os.path.exists(folder):
            return [f"{option} {path}: {folder} is not a directory"]
        return [f"{option} {path}: directory {folder} does not exist; create it first"]
    return []


def _blocking_file(path):
    """The nearest existing one of ``path`` and the folders above it, when that is not a directory (None: it is a
    directory, or none of them exists): creating the directory ``path`` would fail on it."""
    path = os.path.normpath(path)
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        path = "" if parent == path else parent
    return path if path and not os.path.isdir(path) else None


def directory_problems(opt):
    """Why ``onmt_train`` cannot create the directories it writes into (empty: it can): that of ``-save_model``'s
    checkpoints and, with ``-tensorboard``, ``-tensorboard_log_dir``, where a path is a file (stock: a
    FileExistsError traceback after building the data and model, or a NotADirectoryError); and a ``-save_model``
    that is a directory (stock writes ``<dir>_step_N.pt`` beside it, or ``<dir>/_step_N.pt``)."""
    problems = []
    save_model = getattr(opt, "save_model", None)
    folder = os.path.dirname(save_model) if isinstance(save_model, str) else ""
    blocking = _blocking_file(folder) if folder else None
    if isinstance(save_model, str) and save_model and os.path.isdir(save_model):
        problems.append(f"-save_model {save_model}: is a directory, but -save_model is the checkpoints' path prefix "
                        f"(<prefix>_step_N.pt, beside the directory or as hidden _step_N.pt in it): give "
                        f"{os.path.join(save_model, 'model')}")
    elif blocking:
        problems.append(f"-save_model {save_model}: {blocking} is a file, not a directory; give a -save_model in a "
                        "directory")
    log_dir = getattr(opt, "tensorboard_log_dir", None)
    blocking = _blocking_file(log_dir) if getattr(opt, "tensorboard", False) and isinstance(log_dir, str) else None
    if blocking:
        where = "is a file" if blocking == os.path.normpath(log_dir) else f"{blocking} is a file"
        problems.append(f"-tensorboard_log_dir {log_dir}: {where}, not a directory; give a directory (onmt_train "
                        "creates it)")
    return problems


def same_file(one, other):
    """True when the paths ``one`` and ``other`` name one file (a link or another spelling too)."""
    if not isinstance(one, (str, os.PathLike)) or not isinstance(other, (str, os.PathLike)) or not one or not other:
        return False
    try:
        return os.path.samefile(one, other)
    except OSError:  # one of them does not exist (yet)
        return os.path.realpath(one) == os.path.realpath(other)


def _clash_problems(option, path, inputs):
    """A message when ``path`` (what ``option`` writes) is one of ``inputs`` (``(option, path)`` pairs)."""
    if not isinstance(path, str) or not path:
        return []
    for name, other in inputs:
        if same_file(path, other):
            return [f"{option} {path}: is the {name} file; give another {option}"]
    return []


#: Option names (suffixes) of a transform that name a file it reads (a subword model or BPE codes, a vocabulary, a
#: translation memory, a tagger): what an output may not be written over
_TRANSFORM_FILE_SUFFIXES = ("_model", "_vocab", "_path")


def transform_file_inputs(opt, transforms):
    """``(option, path)`` of the files that ``transforms`` (names) read, as ``opt`` gives them: each option of theirs
    that names a file (:func:`preprocessing.file_options`) whose value is an existing file."""
    values = ((dest, getattr(opt, dest, None))
              for dest in preprocessing.file_options(transforms or (), _TRANSFORM_FILE_SUFFIXES))
    return [(f"-{dest}", value) for dest, value in values if isinstance(value, str) and value and os.path.isfile(value)]


def _training_inputs(opt):
    """``(option, path)`` of the files ``onmt_train`` reads: -config, -train_from, the vocabularies, the corpora and
    the files of their transforms."""
    inputs = [("-config", getattr(opt, "config", None)), ("-train_from", getattr(opt, "train_from", None)),
              ("-src_vocab", getattr(opt, "src_vocab", None)), ("-tgt_vocab", getattr(opt, "tgt_vocab", None))]
    transforms = list(getattr(opt, "transforms", None) or [])
    for name, corpus in corpora_of(getattr(opt, "data", None)).items():  # (onmt_train checks before validation)
        for key in ("path_src", "path_tgt", "path_align"):
            if isinstance(corpus, dict) and corpus.get(key):
                inputs.append((f"-data {name} {key}", corpus[key]))
        if isinstance(corpus, dict) and isinstance(corpus.get("transforms"), list):
            transforms += corpus["transforms"]
    return inputs + transform_file_inputs(opt, transforms)


def _translation_inputs(opt):
    """``(option, path)`` of the files ``onmt_translate`` reads: -config, -model (each), -src, -tgt and the files of
    the transforms: those of -transforms, or without it those that the first model's training used (which
    onmt-ext applies, :mod:`onmt_ext.integration.preprocessing`)."""
    models = getattr(opt, "models", None) or []
    models = [models] if isinstance(models, str) else list(models)
    inputs = [("-config", getattr(opt, "config", None))] + [("-model", path) for path in models] + \
        [("-src", getattr(opt, "src", None)), ("-tgt", getattr(opt, "tgt", None))]
    transforms = getattr(opt, "transforms", None)
    if transforms:
        return inputs + transform_file_inputs(opt, transforms)
    model_opt = preprocessing.checkpoint_options(models[0]) if models else None
    trained = preprocessing.shaping(getattr(model_opt, "transforms", None)) if model_opt is not None else []
    # (onmt-ext gives opt training's values later, for the options left at their defaults)
    return inputs + transform_file_inputs(opt, trained) + transform_file_inputs(model_opt, trained)


def checkpoint_problems(inputs):
    """One line for each ``(option, path)`` of ``inputs`` whose path is given and names no checkpoint file (the
    loader, which does not know the option, would name only the path)."""
    return [f"{option} {path}: {not_a_file(path, 'checkpoint file')}" for option, path in inputs
            if path and not os.path.isfile(path)]


def log_file_problems(opt, inputs=None):
    """Why ``-log_file`` cannot be written, or would be written into one of ``inputs`` (default: the files
    ``onmt_train`` reads); stock ends in a FileNotFoundError traceback, or appends log lines to the input."""
    log_file = getattr(opt, "log_file", None)
    if not log_file:
        return []
    return (writable_file_problems("-log_file", log_file)
            or _clash_problems("-log_file", log_file, _training_inputs(opt) if inputs is None else inputs))


def output_problems(opt, inputs=None):
    """Why ``onmt_translate`` cannot write its ``-output`` and ``-log_file`` files (empty: it can).

    See :func:`writable_file_problems`; neither may be one of the files it reads (``inputs``, default
    :func:`_translation_inputs`: -model, -src, -tgt, ...; stock empties them) nor the other.  Stock opens ``-output``
    only after loading the model, and ends in a traceback.
    """
    output = getattr(opt, "output", None)
    inputs = _translation_inputs(opt) if inputs is None else inputs
    problems = writable_file_problems("-output", output) or _clash_problems("-output", output, inputs) or \
        stream_output_problems("-output", output)
    return problems + log_file_problems(opt, inputs + [("-output", output)])


def stream_output_problems(option, path):
    """Why ``onmt_translate`` cannot write its ``option`` to ``path``, an existing file that is not a regular file
    (empty: it can, or ``path`` is none such): stock opens it for reading and writing, which needs a file it can
    seek in (/dev/null is one); a pipe or a terminal (/dev/stdout) ends in an io.UnsupportedOperation traceback
    after the model is loaded.  Opened without blocking, nothing written."""
    if not isinstance(path, str) or not path or not os.path.exists(path) or os.path.isfile(path) \
            or os.path.isdir(path):
        return []
    try:
        handle = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # (a pipe without a reader: ENXIO)
    except OSError:
        seekable = False
    else:
        try:
            os.lseek(handle, 0, os.SEEK_CUR)
            seekable = True
        except OSError:  # ESPIPE: a pipe, a terminal
            seekable = False
        finally:
            os.close(handle)
    if seekable:
        return []
    return [f"{option} {path}: is a pipe or a terminal, not a file; onmt_translate writes {option} only into a file "
            "it can seek in: give a file and read it after (cat)"]


def phrase_table_problems(opt):
    """Why ``onmt_translate``'s ``-phrase_table`` would be ignored (empty: it is used, or not given): stock skips a
    file that does not exist without a word, and reads the table only to replace ``<unk>`` (``-replace_unk``)."""
    table = getattr(opt, "phrase_table", "")
    if not table:
        return []
    if not os.path.isfile(table):
        return [f"-phrase_table {table}: {not_a_file(table)}"]
    if not getattr(opt, "replace_unk", False):
        return [f"-phrase_table {table} has no effect without -replace_unk (it replaces <unk> only)"]
    return []


def _translate_checked(stock, opt, *args, **kwargs):
    """``onmt.bin.translate.translate``: one-line errors, a check of ``-output`` (and ``-phrase_table``) before
    anything is loaded, and a warning when every translation is empty."""
    inputs = _translation_inputs(opt)  # (reads the first model's options: once)
    models = [(option, path) for option, path in inputs if option == "-model"]
    problems = checkpoint_problems(models) + output_problems(opt, inputs) + phrase_table_problems(opt)
    if problems:
        raise UsageError("\n".join(problems))
    _check_machine(opt)
    result = _run_command(stock, opt, *args, **kwargs)
    output = getattr(opt, "output", None)
    if output and os.path.isfile(output):
        with open(output, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
        if lines and not any(line.strip() for line in lines):
            from onmt.utils.logging import logger

            logger.warning(f"onmt_translate: every one of the {len(lines)} translations in {output} is empty: is "
                           "the model trained enough (see its validation accuracy), and do -src and -transforms "
                           "match what it was trained on?")
    return result


def one_line_errors():
    from onmt import inference_engine
    from onmt.bin import build_vocab, train, translate

    reason = ("errors a user causes end in one line `<command>: error: ...` (usage: exit 2, run time: exit 1); "
              "the command line is parsed strictly (see parse_known_args)")
    machine = ("-gpu/-gpu_ranks on a torch without CUDA end in a misleading error or an AttributeError; a "
               "transform whose package (spaCy, fasttext) is missing fails deep inside the data loader")
    machine_test = "tests/integration/test_user_errors.py::test_onmt_works_without_spacy_and_fasttext"
    test = "tests/integration/test_user_errors.py::test_a_missing_vocabulary_is_named_in_one_line"
    for module in (train, translate, build_vocab):
        patch(module, "main", run_main, kind=MESSAGE, reason=reason, test=test)
    patch(train, "train", _train_checked, kind=FIX, test="tests/integration/test_user_errors.py::"
          "test_training_into_another_runs_checkpoints_is_refused",
          reason="a missing -src_vocab ends in a long traceback (an empty or binary one too; a sentencepiece .vocab "
                 "or a corpus is trained on as if it were a vocabulary); a -log_file in a missing directory ends in "
                 "a traceback, one that is the -config or a transform's file gets log lines appended; a -save_model "
                 "or -tensorboard_log_dir under a file ends in a traceback after the model is built; training into a "
                 "-save_model of another run "
                 "overwrites its checkpoints silently; Ctrl-C ends in a bare KeyboardInterrupt traceback; "
                 + machine)
    patch(build_vocab, "build_vocab_main", _build_vocab_checked, kind=FIX, test=machine_test,
          reason="a -src_vocab/-tgt_vocab that is a corpus (or the -config, a transform's file) is replaced by a "
                 "vocabulary with -overwrite; " + machine)
    _replace_rank_target(train, "spawned_train", spawned_rank,  # the name onmt_train spawns
                         test="tests/integration/test_user_errors.py::test_a_ranks_error_ends_the_run_in_one_line",
                         reason="a training rank's one-line error (a SystemExit) passes stock's except Exception: "
                                "the rank prints it and the parent's run exits 0; its other known errors reach the "
                                "parent as a traceback")
    _replace_rank_target(inference_engine, "spawned_infer", spawned_translation_rank,  # InferenceEnginePY spawns it
                         test="tests/unit/test_translation_ranks.py::"
                              "test_a_translation_ranks_one_line_error_reaches_the_parent_and_fails_the_run",
                         reason="a translation rank's one-line error (a SystemExit) passes stock's except "
                                "Exception: the rank prints it and the parent waits for its translation for ever; "
                                "its other known errors reach the parent as a traceback")
    # order 0: runs before onmt_ext.runtime.corpus's source checks (order 1), so that their errors end in one line
    patch(translate, "translate", _translate_checked, kind=MESSAGE, order=0,
          test="tests/unit/test_plugin.py::test_all_empty_translations_give_a_warning",
          reason="a translation whose every line is empty ends without a word; an -output in a directory that "
                 "does not exist ends in a FileNotFoundError traceback after the model is loaded; an -output that is "
                 "the -model, -src, -tgt, -config or a transform's file (also one of the checkpoint's transforms) "
                 "empties it (a -log_file appends to it); an -output that is a pipe or a terminal (/dev/stdout) ends "
                 "in an io.UnsupportedOperation traceback; a missing -phrase_table, "
                 "or one without -replace_unk, is ignored without a word; " + machine)
