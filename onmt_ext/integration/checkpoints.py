"""Loading checkpoints and ``-train_from``, ``onmt_average_models``: what they would silently lose or misread.

* Loading: :func:`checkpoint_problems` refuses a file that is no checkpoint, or one of an onmt-ext mechanism or
  option value this version lacks (:data:`VERSION_KEY` records the writer); tensors that do not fit get one line.
* :func:`train_from_differences`: a ``-train_from`` run whose architecture or mechanism options
  (:data:`ARCHITECTURE_OPTIONS`) differ from the checkpoint's is refused; adding a mechanism needs
  ``--override_opts``.
* :func:`resume_problems`: a resumed run continues at the checkpoint's step + 1 (step 1 with ``-reset_optim
  all``); a ``-train_steps`` at or below it, or ``<save_model>_step_N.pt`` files of later steps that the run
  would overwrite, are refused (the second unless ``-overwrite_checkpoints``).
* :func:`replaced_tensor_problem`: a mechanism that *replaces* a stock sub-module (li2019) cannot start from a
  checkpoint without it (:func:`vocabulary_problem`: clause attention's changed vocabularies); mechanisms that
  only *add* tensors fine-tune from a baseline (:func:`onmt_ext.mechanisms.gret.load_with_new_parameters`).
* :func:`average_problems`: ``onmt_average_models`` on a missing file, a non-checkpoint, or checkpoints of
  different models; :func:`average` averages tied tensors once (stock: twice).
"""

import argparse
import errno
import os
import sys

import torch

from onmt_ext import __version__
from onmt_ext.integration import preprocessing
from onmt_ext.mechanisms.clause import attention as clause_attention
from onmt_ext.integration.commands import in_command, run_main, same_file, step_checkpoints, writable_file_problems
from onmt_ext.runtime.compile import Compile
from onmt_ext.runtime.corpus import not_a_file
from onmt_ext.errors import UsageError, UserError, user_error
from onmt_ext.options import EXT_TYPE, OPTION_SPECS, choice_problems, validate
from onmt_ext.integration.parsing import train_parser
from onmt_ext.patches import FIX, MESSAGE, NEEDED, patch

# OpenNMT-py is imported inside the functions: importing it while this module initialises would activate
# onmt-ext (onmt_ext._autoload) before this module is whole.

#: Mechanisms that replace a stock sub-module: the onmt-ext module that holds the class -> what it replaces
#: and why the checkpoint's tensors cannot seed it.
REPLACING = {
    "onmt_ext.mechanisms.li2019": (
        "li2019's routing aggregation (-li2019_enc_self/-li2019_dec_self/-li2019_enc_dec) replaces the "
        "attention's output projection final_linear (W^O, eq. 4) by per-head capsule maps (eq. 5-6); no rule "
        "maps W^O onto them and Li et al. (2019) train it from scratch, not from a baseline"),
    "onmt_ext.mechanisms.disan": (
        "DiSAN (-disan_enc) replaces the encoder's self-attention by its directional one, and onmt-ext maps "
        "none of the checkpoint's attention tensors onto it"),
}


# --------------------------------------------------------------------------
# Loading a checkpoint, and -train_from with other options


#: Attribute onmt-ext adds to the saved model options: the version that wrote the checkpoint.
VERSION_KEY = "onmt_ext_version"
#: What onmt-ext records in the options a checkpoint saves, beside the options themselves.
RECORDS = (VERSION_KEY, preprocessing.SEGMENTED_KEY, clause_attention.TAGGER_KEY)
#: Attributes OpenNMT-py 3.5.1 itself sets on the options it saves that are not ``onmt_train`` options
#: (found by reading its sources: train_single, report_manager, loss, parse, inputters).
STOCK_INTERNAL = {"brnn", "data_task", "cuda", "fp32", "gpu", "int8", "model_task", "models", "src", "tgt",
                  "tensorboard_log_dir_dated", "tgt_file_prefix"}
_known_dests = None


def _option_dests():
    """Every option name (``dest``) of ``onmt_train`` with onmt-ext active."""
    global _known_dests
    if _known_dests is None:
        _known_dests = {action.dest for action in train_parser()._actions}
    return _known_dests


def _validate_model_opts(stock, cls, model_opt):
    stock(cls, model_opt)
    validate(model_opt)
    setattr(model_opt, VERSION_KEY, __version__)  # saved with the checkpoint
    preprocessing.record_training_source(model_opt)  # so is whether its source was segmented Chinese
    clause_attention.record_tagger(model_opt)  # and the contents of the signal tagger that split it


def check_on_model_validation():
    from onmt.utils.parse import ArgumentParser

    patch(ArgumentParser, "validate_model_opts", _validate_model_opts, kind=NEEDED,
          reason="checks onmt-ext's options wherever OpenNMT-py validates model options (also those of a "
                 "checkpoint) and records in the checkpoint the onmt-ext version, whether its source was "
                 "segmented Chinese and its clause tagger's SHA-256",
          test="tests/unit/test_options.py::test_checkpoint_with_invalid_options_fails_on_load")


def checkpoint_problems(path, checkpoint):
    """Why an onmt-ext checkpoint cannot be used by this onmt-ext (empty: it can).

    A checkpoint of ``ext_transformer`` whose saved options include names this
    version does not know, or values of known options outside their choices
    (e.g. a routing method added later), was written by another (newer)
    onmt-ext with a mechanism this one lacks; loading it would either fail
    deep in torch or, worse, silently drop the mechanism.  Stock OpenNMT-py
    checkpoints are not checked (they must simply work).
    """
    opt = checkpoint.get("opt") if isinstance(checkpoint, dict) else None
    if opt is None or "ext_transformer" not in (getattr(opt, "encoder_type", None), getattr(opt, "decoder_type", None)):
        return []
    unknown = sorted(name for name in vars(opt) if name not in _option_dests() and name not in RECORDS
                     and name not in STOCK_INTERNAL and not name.startswith("_"))
    values = choice_problems(opt)
    if not unknown and not values:
        return []
    written = getattr(opt, VERSION_KEY, None)
    what = ([f"options this onmt-ext ({__version__}) does not know: {', '.join(unknown)}"] if unknown else []) + \
        ([f"option values this onmt-ext ({__version__}) does not know: {'; '.join(values)}"] if values else [])
    return [f"checkpoint {path} was written by onmt-ext {written or '(a version that did not record itself)'} "
            f"with {' and '.join(what)}; load it with the onmt-ext version that wrote it"]


def _load_checkpoint(stock, ckpt_path):
    """Load a checkpoint; one line naming the file when it is none, or of an unknown onmt-ext mechanism.

    The errors are also of the type stock raises (:func:`user_error`): callers outside the commands catch what
    they caught before.
    """
    if ckpt_path and not os.path.isfile(ckpt_path) and in_command():  # elsewhere: stock's FileNotFoundError
        raise UsageError(f"{ckpt_path}: {not_a_file(ckpt_path, 'checkpoint file')}")
    try:
        checkpoint = stock(ckpt_path)
    except Exception as error:  # torch.load: UnpicklingError, RuntimeError (zip), EOFError, KeyError, ...
        if isinstance(error, (FileNotFoundError, PermissionError, IsADirectoryError)) or not isinstance(
                error, (torch.serialization.pickle.UnpicklingError, RuntimeError, EOFError, KeyError, AttributeError,
                        ValueError, IndexError, TypeError, OSError)):  # OSError: EINVAL of a truncated zip
            raise
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        if "weights_only" in first or "WeightsUnpickler" in first or len(first) > 160:
            first = type(error).__name__
        if isinstance(error, OSError) and error.errno == errno.EINVAL:  # torch's zip reader on a cut-off file
            first = f"truncated or damaged: {type(error).__name__} {first}"
        raise user_error(f"{ckpt_path} is not an OpenNMT-py checkpoint that this onmt-ext can read ({first}); "
                         "give a <model>_step_N.pt file written by onmt_train", type(error)) from None
    if checkpoint is not None and not (isinstance(checkpoint, dict) and "model" in checkpoint and "opt" in checkpoint):
        raise user_error(f"{ckpt_path} is not an OpenNMT-py checkpoint (no model and options in it); give a "
                         "<model>_step_N.pt file written by onmt_train", ValueError)
    problems = checkpoint_problems(ckpt_path, checkpoint)
    if problems:
        raise user_error("\n".join(problems), ValueError)
    return checkpoint


def _load_state_dict_clearly(stock, self, *args, **kwargs):
    try:
        return stock(self, *args, **kwargs)
    except (ValueError, AssertionError) as error:  # stock: missing/extra keys (ValueError), shapes (assert)
        text = str(error)
        if not (isinstance(error, AssertionError) or "missing key" in text.lower()
                or "extra keys" in text.lower()):
            raise
        raise user_error(f"the checkpoint's tensors do not fit the model built from its options "
                         f"({' '.join(text.split()) or 'a tensor has the wrong shape'}); was it written by another "
                         "version of onmt-ext or OpenNMT-py, or altered?", type(error)) from None


def check_checkpoints():
    """Refuse what is no checkpoint or one of an unknown onmt-ext mechanism; explain state-dict mismatches."""
    import onmt.model_builder as builder
    import onmt.train_single as train_single
    from onmt.models import model_saver
    from onmt.models.model import BaseModel

    for module in (model_saver, builder, train_single):
        patch(module, "load_checkpoint", _load_checkpoint, kind=FIX,
              reason="a file that is no checkpoint ends in a torch traceback that advises weights_only=False; a "
                     "checkpoint of a mechanism this onmt-ext lacks would load without it",
              test="tests/integration/test_user_errors.py::test_a_model_file_that_is_no_checkpoint_is_named")
    patch(BaseModel, "load_state_dict", _load_state_dict_clearly, kind=MESSAGE, order=1,
          reason="tensors that do not fit the model end in an assertion traceback",
          test="tests/integration/test_faults.py::test_a_checkpoint_whose_tensors_do_not_fit_gives_a_clear_error")


#: Stock options that decide the shape of the model (with every onmt-ext option): a resumed run must keep them.
ARCHITECTURE_OPTIONS = (
    "model_type", "encoder_type", "decoder_type", "layers", "enc_layers", "dec_layers", "hidden_size",
    "enc_hid_size", "dec_hid_size", "word_vec_size", "src_word_vec_size", "tgt_word_vec_size", "heads",
    "transformer_ff", "position_encoding", "position_encoding_type", "max_relative_positions", "share_embeddings",
    "share_decoder_embeddings", "self_attn_type", "add_qkvbias", "add_ffnbias", "layer_norm", "norm_eps",
    "pos_ffn_activation_fn", "num_kv", "parallel_residual", "shared_layer_norm", "rotary_interleave",
    "rotary_theta", "rotary_dim", "copy_attn", "global_attention", "self_attn_func",
)


def _normalise(value):
    return list(value) if isinstance(value, tuple) else value


def train_from_differences(opt, model_opt):
    """``(added, differing)`` between the options of a run (``opt``) and of the checkpoint it starts from.

    ``added``: ``(name, value)`` of onmt-ext mechanisms that ``opt`` switches on and the checkpoint does not
    have (its value is the option's "off" default; ``transformer`` becoming ``ext_transformer`` counts too).
    ``differing``: ``(name, run value, checkpoint value)`` of every other architecture or mechanism option that
    differs.
    """
    defaults = {spec.name: spec.default for spec in OPTION_SPECS}
    added, differing = [], []
    for name in ARCHITECTURE_OPTIONS + tuple(defaults):
        if not hasattr(opt, name):
            continue
        mine, theirs = _normalise(getattr(opt, name)), _normalise(getattr(model_opt, name, defaults.get(name)))
        if mine == theirs:
            continue
        if name in defaults and theirs == defaults[name] or \
                name in ("encoder_type", "decoder_type") and (theirs, mine) == ("transformer", EXT_TYPE):
            added.append((name, mine))
        else:
            differing.append((name, mine, theirs))
    return added, differing


def _model_opts_checked(stock, opt, checkpoint=None):
    """``train_single._get_model_opts``, refusing a resumed run whose model options differ from the checkpoint's."""
    if checkpoint is None:
        return stock(opt, checkpoint)
    from onmt.utils.logging import logger
    from onmt.utils.parse import ArgumentParser

    saved = ArgumentParser.ckpt_model_opts(checkpoint["opt"])
    ArgumentParser.update_model_opts(saved)
    added, differing = train_from_differences(opt, saved)
    if differing:
        listed = "; ".join(f"-{name} {mine!r} (checkpoint: {theirs!r})" for name, mine, theirs in differing)
        raise UsageError(f"-train_from {opt.train_from}: these options differ from the checkpoint's: {listed}; "
                         "set them as the checkpoint has them (a resumed model keeps its shape)")
    defaults = {spec.name: spec.default for spec in OPTION_SPECS}
    theirs = {name: getattr(saved, name, defaults.get(name)) for name, _ in added}
    listed = ", ".join(f"-{name} {value!r} (checkpoint: {theirs[name]!r})" for name, value in added)
    if added and not opt.override_opts:
        raise UsageError(f"-train_from {opt.train_from}: the checkpoint was trained without {listed}; to fine-tune "
                         "it with them add --override_opts -reset_optim all (the step count then restarts at 1, and "
                         "-train_steps counts the fine-tuning steps), or drop them to resume the checkpoint's model")
    if added:
        logger.info(f"onmt-ext: fine-tuning the checkpoint's model with {listed}")
    return stock(opt, checkpoint)


def check_train_from_options():
    import onmt.train_single as train_single

    patch(train_single, "_get_model_opts", _model_opts_checked, kind=FIX,
          reason="-train_from silently builds the checkpoint's model when the config's architecture or mechanism "
                 "options differ (a d=32 config trained a d=64 model)",
          test="tests/integration/test_user_errors.py::test_train_from_with_other_architecture_options_is_refused")


# --------------------------------------------------------------------------
# Resuming: steps, checkpoints of later steps, replaced modules


def checkpoint_step(checkpoint):
    """The step at which ``checkpoint`` was saved, or None when it records none (an averaged checkpoint).

    OpenNMT-py stores the *next* step, ``training_step = step + 1``.
    """
    optim = checkpoint.get("optim") if isinstance(checkpoint, dict) else None
    step = optim.get("training_step") if isinstance(optim, dict) else None
    return step - 1 if isinstance(step, int) else None


def resume_problems(opt, checkpoint):
    """Messages for a ``-train_from`` run (``opt``) from ``checkpoint`` that would train nothing or overwrite.

    The run's first step is ``s + 1`` for a checkpoint of step ``s`` (``1`` with ``-reset_optim all`` or a
    checkpoint without optimiser state).  Refused: ``-train_steps <= s`` (unless ``-single_pass``), and
    ``<save_model>_step_N.pt`` files with ``N`` at or after the first step, unless ``-overwrite_checkpoints``.
    """
    step = checkpoint_step(checkpoint)
    if getattr(opt, "reset_optim", "none") == "all":
        step = None
    problems = []
    train_steps = getattr(opt, "train_steps", 0)
    if step is not None and not getattr(opt, "single_pass", False) and train_steps <= step:
        problems.append(f"-train_steps {train_steps}: at or below the step of -train_from {opt.train_from} "
                        f"({step}); a resumed run counts on from it, so give the total (above {step}), or "
                        f"-reset_optim all to fine-tune from step 1")
    first = 1 if step is None else step + 1
    later = [path for number, path in step_checkpoints(getattr(opt, "save_model", "model")) if number >= first]
    if later and not getattr(opt, "overwrite_checkpoints", False):
        shown = ", ".join(later[:3]) + (", …" if len(later) > 3 else "")
        problems.append(f"-save_model {opt.save_model}: holds checkpoints of step {first} or later ({shown}) "
                        f"that this run, starting at step {first}, would overwrite; resume from the last one, "
                        "pass -overwrite_checkpoints to train over them, or choose another -save_model")
    return problems


def _resume_checked(stock, opt, checkpoint=None):
    """``train_single._get_model_opts``: refuse a resumed run that trains nothing or overwrites later steps."""
    if checkpoint is not None:
        problems = resume_problems(opt, checkpoint)
        if problems:
            raise UsageError("\n".join(problems))
        step = checkpoint_step(checkpoint)
        if getattr(opt, "reset_optim", "none") == "all" and step:
            from onmt.utils.logging import logger

            logger.info(f"onmt-ext: -reset_optim all: the step count restarts at 1 (the checkpoint is of step {step}); "
                        f"-train_steps {getattr(opt, 'train_steps', '?')} counts the steps of this run")
    return stock(opt, checkpoint)


def _mechanism_of(model, name):
    """The Python module (``onmt_ext.<name>``) of the onmt-ext mechanism module of ``model`` that holds the path
    of tensor ``name``, or None when the path lies in stock modules only."""
    parts = name.split(".")[:-1]
    for end in range(len(parts), 0, -1):
        try:
            owner = type(model.get_submodule(".".join(parts[:end]))).__module__
        except AttributeError:  # the path goes on below what the model has
            continue
        if owner.startswith("onmt_ext.") and owner != "onmt_ext.integration.transformer":
            return owner
    return None


def replaced_tensor_problem(model, checkpoint):
    """Why ``checkpoint``'s tensors cannot seed ``model`` because a mechanism replaced their module, or None.

    Applies when every tensor of the checkpoint that the model lacks lies where the model now has an
    onmt-ext mechanism module (any other mismatch is left to the stock error).
    """
    names = set(checkpoint["model"]) | {f"generator.{k}" for k in (checkpoint.get("generator") or {})}
    own = {name for name, _ in model.named_parameters(remove_duplicate=False)}  # tied generator.weight too
    own |= {name for name, _ in model.named_buffers(remove_duplicate=False)}
    extra = sorted(names - own)
    kinds = {_mechanism_of(model, name) for name in extra}
    if not extra or None in kinds:
        return None
    what = "; ".join(REPLACING.get(kind, f"{kind} replaces a stock module") for kind in sorted(kinds))
    shown = ", ".join(extra[:2]) + (f" and {len(extra) - 2} more" if len(extra) > 2 else "")
    return (f"this model cannot be fine-tuned from a checkpoint without its mechanism: {what}; the checkpoint's "
            f"{shown} have no place in it. Train it from scratch (without -train_from), or resume a checkpoint "
            "that has the mechanism")


def vocabulary_problem(model, checkpoint):
    """Why ``checkpoint``'s tensors do not fit ``model`` when only the vocabulary sizes differ, or None.

    With ``-train_from``, OpenNMT-py rebuilds the vocabularies from ``-src_vocab``/``-tgt_vocab`` when the
    transforms differ from the checkpoint's, e.g. ``clause_split`` added for clause attention (its clause
    markers are new words): the embedding and generator rows then no longer match.
    """
    shapes = {name: tuple(t.shape) for name, t in model.named_parameters(remove_duplicate=False)}
    saved = {**checkpoint["model"], **{f"generator.{k}": v for k, v in (checkpoint.get("generator") or {}).items()}}
    differing = {name: (tuple(saved[name].shape)[0], shapes[name][0]) for name in saved
                 if name in shapes and tuple(saved[name].shape) != shapes[name]}
    if not differing or any(tuple(saved[name].shape)[1:] != shapes[name][1:] or not
                            ("emb_luts" in name or name.startswith("generator.")) for name in differing):
        return None
    sizes = {("source" if name.startswith("encoder.") else "target"): size for name, size in differing.items()}
    shown = "; ".join(f"{side}: {theirs} words in the checkpoint, {mine} here" for side, (theirs, mine) in
                      sorted(sizes.items()))
    return (f"the vocabularies differ from the checkpoint's ({shown}): OpenNMT-py rebuilds them when -transforms "
            "differ from the checkpoint's (clause_split adds its clause markers), and onmt-ext maps no word "
            "embeddings across vocabularies; train with the checkpoint's transforms, or from scratch (the clause "
            "attention paper describes no fine-tuning from a baseline)")


def _load_state_dict_checked(stock, self, checkpoint, *args, strict=True, **kwargs):
    """``BaseModel.load_state_dict``: one true line when a mechanism replaced the checkpoint's module or the
    vocabularies differ."""
    if strict and isinstance(checkpoint, dict) and "model" in checkpoint:
        problem = replaced_tensor_problem(self, checkpoint) or vocabulary_problem(self, checkpoint)
        if problem:
            raise UserError(problem)
    return stock(self, checkpoint, *args, strict=strict, **kwargs)


# --------------------------------------------------------------------------
# onmt_average_models


def _load_lazily(path):
    """``torch.load`` of ``path`` on the CPU, memory-mapped where the format allows (only names and shapes are
    read)."""
    try:
        return torch.load(path, map_location="cpu", mmap=True)
    except RuntimeError:  # the legacy (non-zip) format cannot be memory-mapped
        return torch.load(path, map_location="cpu")


def _signature(checkpoint):
    """``(architecture and mechanism options, {tensor name: shape})`` of a checkpoint."""
    opt = checkpoint["opt"]
    defaults = {spec.name: spec.default for spec in OPTION_SPECS}
    options = {name: getattr(opt, name, defaults.get(name)) for name in ARCHITECTURE_OPTIONS + tuple(defaults)}
    for spec in Compile.specs:  # how it runs, not what it is
        options.pop(spec.name, None)
    shapes = {f"model.{k}": tuple(v.shape) for k, v in checkpoint["model"].items()}
    shapes.update({f"generator.{k}": tuple(v.shape) for k, v in (checkpoint.get("generator") or {}).items()})
    return options, shapes


def average_problems(paths):
    """Messages for ``onmt_average_models -models paths`` that stock would end in a traceback (empty: none).

    Every file must exist and be an OpenNMT-py checkpoint, and all must be of one model: the same
    architecture and mechanism options and the same tensor names and shapes as the first.
    """
    missing = [path for path in paths if not os.path.isfile(path)]
    if missing:
        return [f"-models {path}: {not_a_file(path, 'checkpoint file')}" for path in missing]
    problems, first = [], None
    for path in paths:
        try:
            checkpoint = _load_lazily(path)
        except Exception as error:  # UnpicklingError, RuntimeError (zip), EOFError, ...
            problems.append(f"-models {path}: not an OpenNMT-py checkpoint ({type(error).__name__})")
            continue
        if not (isinstance(checkpoint, dict) and {"model", "generator", "opt"} <= set(checkpoint)):
            problems.append(f"-models {path}: not an OpenNMT-py checkpoint (no model, generator and options)")
            continue
        options, shapes = _signature(checkpoint)
        if first is None:
            first = (path, options, shapes)
            continue
        differing = [f"-{name} {value!r} (in {first[0]}: {first[1][name]!r})"
                     for name, value in options.items() if value != first[1][name]]
        if differing:
            problems.append(f"-models {path}: another model than {first[0]}: {'; '.join(differing)}; average "
                            "checkpoints of one run")
        elif shapes != first[2]:
            odd = sorted(set(shapes) ^ set(first[2])) or sorted(k for k in shapes if shapes[k] != first[2][k])
            problems.append(f"-models {path}: its tensors differ from those of {first[0]} ({odd[0]}"
                            f"{' and more' if len(odd) > 1 else ''}); average checkpoints of one run")
    return problems


def average(model_files, fp32=False):
    """The mean of the checkpoints ``model_files`` in stock ``onmt_average_models``' layout (``optim`` None).

    The running mean ``m_i = (i m_{i-1} + x_i) / (i + 1)`` is taken once per *stored* tensor: a tied pair
    (``-share_decoder_embeddings``: the generator's weight and the target embeddings share storage) is
    one tensor.  Stock updates it once per name, so its tied weights came out as ``a/4 + 3b/4`` for two
    checkpoints.
    """
    final = None
    for i, path in enumerate(model_files):
        checkpoint = torch.load(path, map_location="cpu")
        parts = {"model": checkpoint["model"], "generator": checkpoint["generator"] or {}}
        if fp32:
            parts = {part: {k: v.float() for k, v in tensors.items()} for part, tensors in parts.items()}
        if final is None:
            final = {"vocab": checkpoint["vocab"], "opt": checkpoint["opt"], "optim": None, **parts}
            continue
        done = set()
        for part in ("model", "generator"):
            for key, tensor in final[part].items():
                where = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
                if where not in done:
                    done.add(where)
                    tensor.mul_(i).add_(parts[part][key]).div_(i + 1)
    return final


def _average_checked(stock, model_files, fp32=False):
    """``onmt.bin.average_models.average_models``: :func:`average_problems`, then :func:`average` (stock's loop
    averages tied tensors twice)."""
    problems = average_problems(model_files)
    if problems:  # a missing file is a usage error (exit 2); files that cannot be averaged, a run-time one (exit 1)
        missing = not all(os.path.isfile(path) for path in model_files)  # (average_problems: then those alone)
        raise (UsageError if missing else UserError)("\n".join(problems))
    return average(model_files, fp32)


def _is_checkpoint(path):
    """True when ``path`` holds an OpenNMT-py checkpoint (a dict with a model and options; read lazily)."""
    try:
        checkpoint = _load_lazily(path)
    except Exception:  # UnpicklingError, RuntimeError (zip), EOFError, ...: no checkpoint
        return False
    return isinstance(checkpoint, dict) and {"model", "opt"} <= set(checkpoint)


def average_output_problems(models, output):
    """Why ``onmt_average_models`` cannot write ``-output`` (empty: it can): its directory must exist (stock: a
    FileNotFoundError traceback after averaging), it must not be one of ``-models``, and an existing regular file
    there must be a checkpoint (stock replaces whatever is there: a corpus, a config)."""
    problems = writable_file_problems("-output", output)
    if not problems and any(same_file(output, path) for path in models or ()):
        problems = [f"-output {output}: is one of -models; give another -output (averaging would overwrite it)"]
    if not problems and os.path.isfile(output) and not _is_checkpoint(output):  # (/dev/null: written as by stock)
        problems = [f"-output {output}: exists and is not an OpenNMT-py checkpoint; give another -output (averaging "
                    "replaces only a checkpoint), or remove the file first"]
    return problems


def _average_arguments(argv):
    """``(models, output)`` of an ``onmt_average_models`` command line as stock's parser reads it, or None."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    parser.add_argument("-models", "-m", nargs="+", default=[])
    parser.add_argument("-output", "-o")
    try:
        known, _ = parser.parse_known_args(argv)
    except (argparse.ArgumentError, SystemExit):  # stock's own parser says what is wrong
        return None
    return known.models, known.output


def _average_main(stock, *args, **kwargs):
    """``onmt.bin.average_models.main``: its errors in one line (:func:`run_main`), and its ``-output`` checked
    (:func:`average_output_problems`) before any checkpoint is read."""
    def checked():
        arguments = _average_arguments(sys.argv[1:])
        problems = average_output_problems(*arguments) if arguments and arguments[1] else []
        if problems:
            raise UsageError("\n".join(problems))
        return stock(*args, **kwargs)

    return run_main(checked)


def install():
    """Register the checks (the ``load_state_dict`` check as the first layer, before :func:`check_checkpoints`' and
    GRET's)."""
    import onmt.train_single as train_single
    from onmt.bin import average_models
    from onmt.models.model import BaseModel

    patch(train_single, "_get_model_opts", _resume_checked, kind=FIX, order=1,  # after the options' check
          reason="-train_from with -train_steps at or below the checkpoint's step trains one step and exits 0; a "
                 "resumed run overwrites the same run's checkpoints of later steps without a word",
          test="tests/integration/test_checkpoints_cli.py::test_a_resumed_run_never_overwrites_later_checkpoints")
    # order 0: before check_checkpoints' and GRET's
    patch(BaseModel, "load_state_dict", _load_state_dict_checked, kind=FIX, order=0,
          reason="fine-tuning li2019 (or DiSAN, or clause attention) from a checkpoint without it ends in 'was it "
                 "written by another version ... or altered?' although the mechanism replaced the checkpoint's "
                 "final_linear (clause_split: the vocabularies were rebuilt)",
          test="tests/integration/test_checkpoints_cli.py::test_li2019_from_a_baseline_says_why_in_one_line")
    patch(average_models, "average_models", _average_checked, kind=FIX,
          reason="a missing file, a non-checkpoint or checkpoints of different models end in a FileNotFoundError "
                 "or KeyError traceback (or average unrelated tensors); tied weights (-share_decoder_embeddings) "
                 "are averaged twice, so the target embeddings and generator come out wrong",
          test="tests/integration/test_checkpoints_cli.py::test_average_models_mistakes_get_one_line")
    patch(average_models, "main", _average_main, kind=FIX,
          reason="onmt_average_models' errors end in one line; an -output in a missing directory ends in a "
                 "FileNotFoundError traceback after averaging, and an -output that is one of -models overwrites it",
          test="tests/integration/test_user_errors.py::test_outputs_onto_inputs_and_broken_files_get_one_line")
