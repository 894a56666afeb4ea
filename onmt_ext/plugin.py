"""Registration of onmt-ext inside the stock OpenNMT-py commands.

:func:`activate`, called once by the start-up hook (:mod:`onmt_ext._autoload`) right after ``onmt`` is imported:

1. registers ``ext_transformer`` with ``register_encoder``/``register_decoder``;
2. adds onmt-ext's options to ``onmt.opts.model_opts`` (YAML, command line, checkpoints);
3. makes the commands' own option parsing strict: an unknown, abbreviated, repeated or invalid key stops
   ``onmt_train``/``onmt_build_vocab``/``onmt_translate`` in one line naming it and the closest valid key;
4. runs onmt-ext's option checks wherever OpenNMT-py validates model options, and refuses a ``-train_from``
   whose architecture or mechanism options differ from the checkpoint's;
5. ends the commands' errors in one line, ``<command>: error: ...`` (exit 2 usage, 1 run time, 130 Ctrl-C).

Every change goes through :mod:`onmt_ext.patches`; :func:`activate` is idempotent and all-or-nothing, and
``ONMT_EXT_DISABLE=1`` prevents all of it.  What each change does to stock behaviour: docs/differences-from-stock.md.
"""

import contextvars
import difflib
import functools
import glob
import importlib
import os
import re
import sys

from onmt_ext import patches
from onmt_ext.patches import FIX, MESSAGE, NEEDED, add_entry, patch

_active = False


def _register_models():
    import onmt.decoders
    import onmt.encoders

    from onmt_ext.options import EXT_TYPE
    from onmt_ext.transformer import ExtTransformerDecoder, ExtTransformerEncoder

    test = "tests/integration/test_plugin_cli.py::test_hook_registers_types_on_first_onmt_import"
    add_entry(onmt.encoders, "str2enc", EXT_TYPE, ExtTransformerEncoder, kind=NEEDED, test=test,
              reason="-encoder_type ext_transformer: the Transformer encoder with onmt-ext's mechanisms")
    add_entry(onmt.decoders, "str2dec", EXT_TYPE, ExtTransformerDecoder, kind=NEEDED, test=test,
              reason="-decoder_type ext_transformer: the Transformer decoder with onmt-ext's mechanisms")


def _extend_model_options():
    import onmt.opts

    patch(onmt.opts, "model_opts", _model_opts, kind=NEEDED,
          reason="adds onmt-ext's options (and -overwrite_checkpoints) to onmt_train, so checkpoints store them",
          test="tests/unit/test_options.py::test_options_reach_the_train_parser_with_defaults")


def _translation_compile():
    """``onmt_translate -ext_compile``: compile the mechanisms' cores for this translation (off by default)."""
    import onmt.bin.translate
    import onmt.model_builder as builder
    import onmt.opts

    for owner in (onmt.opts, onmt.bin.translate):  # onmt_translate's parser calls the name it imported
        patch(owner, "translate_opts", _translate_opts, kind=NEEDED,
              reason="adds -ext_compile to onmt_translate (torch.compile of the mechanisms' cores when translating)",
              test="tests/unit/test_compile.py::test_onmt_translate_compiles_only_when_asked")
    patch(builder, "load_test_model", _load_test_model, kind=NEEDED, order=1,
          reason="onmt_translate's -ext_compile, not the training run's, decides whether translation compiles",
          test="tests/unit/test_compile.py::test_onmt_translate_compiles_only_when_asked")


def _translate_opts(stock, parser, *args, **kwargs):
    stock(parser, *args, **kwargs)
    if not any("-ext_compile" in action.option_strings for action in parser._actions):
        group = parser.add_argument_group("onmt-ext translation")
        from onmt_ext.options import str2bool

        group.add("--ext_compile", "-ext_compile", type=str2bool, nargs="?", const=True, default=False,
                  help="Run the onmt-ext mechanisms' tensor cores through torch.compile while translating (the "
                       "first batches compile); without it translation is eager, whatever training used. As in "
                       "onmt_train: -ext_compile alone or -ext_compile true turns it on, -ext_compile false off.")


def _load_test_model(stock, opt, *args, **kwargs):
    from onmt_ext import compile as ext_compile

    vocabs, model, model_opt = stock(opt, *args, **kwargs)
    ext_compile.enable(model, getattr(opt, "ext_compile", False))
    return vocabs, model, model_opt


def _model_opts(stock, parser):
    from onmt_ext.options import add_model_options

    stock(parser)
    add_model_options(parser)
    if not any("-overwrite_checkpoints" in action.option_strings for action in parser._actions):
        group = parser.add_argument_group("onmt-ext training")
        group.add("--overwrite_checkpoints", "-overwrite_checkpoints", action="store_true",
                  help="Train into a -save_model that already holds <save_model>_step_N.pt files of another run, or "
                       "of this run's later steps when resuming (they are overwritten step by step); without it "
                       "onmt_train refuses to start.")


# --------------------------------------------------------------------------
# Strict option parsing


def _option_names(parser):
    """All option names a parser accepts, without leading dashes."""
    return {s.lstrip("-") for s in parser._option_string_actions}


_SHARED_CONFIG_NAMES = None


def _shared_config_names():
    """Options of onmt_train and onmt_build_vocab together.

    OpenNMT-py's documented practice is one YAML for both commands, so each of
    them must accept (and ignore) the other's keys; a key known to neither is
    an error.
    """
    global _SHARED_CONFIG_NAMES
    if _SHARED_CONFIG_NAMES is None:
        from onmt.opts import data_prepare_opts, train_opts
        from onmt.utils.parse import ArgumentParser

        names = set()
        for build in (train_opts, lambda p: data_prepare_opts(p, build_vocab_only=True)):
            parser = ArgumentParser()
            build(parser)
            names |= _option_names(parser)
        _SHARED_CONFIG_NAMES = names
    return _SHARED_CONFIG_NAMES


def _config_key_lines(path):
    """Map each top-level key of a YAML config to its 1-based line number."""
    import yaml

    try:
        with open(path, encoding="utf-8") as handle:
            node = yaml.compose(handle)
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return {}
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {key.value: key.start_mark.line + 1 for key, _ in node.value}


def duplicate_key_messages(path):
    """``key 'x' is set 2 times in <path>, lines 3 and 9`` for each mapping key written more than once (any depth).

    PyYAML keeps the last value of a repeated key without a word.
    """
    import yaml

    try:
        with open(path, encoding="utf-8") as handle:
            root = yaml.compose(handle)
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return []
    messages, stack = [], [("", root)]
    while stack:
        prefix, node = stack.pop()
        if isinstance(node, yaml.MappingNode):
            lines = {}
            for key, value in node.value:
                name = f"{prefix}{key.value}"
                lines.setdefault(name, []).append(key.start_mark.line + 1)
                stack.append((f"{name}.", value))
            for name, where in lines.items():
                if len(where) > 1:
                    listed = ", ".join(map(str, where[:-1])) + f" and {where[-1]}"
                    messages.append(f"key '{name}' is set {len(where)} times in {path}, lines {listed}; "
                                    "YAML would keep the last value silently: keep one")
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((prefix, item) for item in node.value)
    return sorted(messages)


def _config_paths(args):
    """Config files named on the command line (``-config``/``--config``)."""
    paths = []
    for i, arg in enumerate(args):
        if arg in ("-config", "--config") and i + 1 < len(args):
            paths.append(args[i + 1])
        elif arg.startswith(("-config=", "--config=")):
            paths.append(arg.split("=", 1)[1])
    return paths


def _config_locations(args):
    """``{key: (config path, line)}`` of the top-level keys of the config files named in ``args`` (first wins)."""
    key_lines = {}
    for path in _config_paths(args):
        for key, line in _config_key_lines(path).items():
            key_lines.setdefault(key, (path, line))
    return key_lines


def _where_set(name, args, key_lines):
    """``in <config>, line N`` when option ``name`` comes from a config file, else ``on the command line``."""
    if name in key_lines and not any(a.lstrip("-").split("=", 1)[0] == name for a in args):
        path, line = key_lines[name]
        return f"in {path}, line {line}"
    return "on the command line"


_ARGUMENT_ERROR = re.compile(r"^argument (\S+): (.*)$", re.S)


def _usage_error(parser, args, message):
    """argparse's ``error`` for a strict parse: one line, without the usage (100 lines for onmt_translate).

    A bad value from a config file names the file and line: ``key 'x' in <config>, line N: invalid choice: ...``.
    """
    match = _ARGUMENT_ERROR.match(message)
    if match:
        name = match.group(1).split("/")[0].lstrip("-")
        where = _where_set(name, args, _config_locations(args))
        if where != "on the command line":
            message = f"key '{name}' {where}: {match.group(2)}"
    parser.exit(2, f"{parser.prog}: error: {' '.join(message.split())}\n")


def unknown_option_messages(unknown, valid_names, args):
    """Describe each unknown option: where it was written and what was meant.

    Args:
        unknown: leftovers of ``parse_known_args`` (``--key=value`` for YAML
            keys, raw tokens for the command line).
        valid_names: accepted option names without dashes.
        args: the command-line arguments (to find the config files).
    Returns:
        list of messages, one per unknown option or stray value.
    """
    key_lines = _config_locations(args)
    messages = []
    previous_unknown = False
    for token in unknown:
        if not token.startswith("-"):
            if not previous_unknown:  # the value of an unknown option is not news
                messages.append(f"unexpected value {token!r} (no option takes it)")
            previous_unknown = False
            continue
        name = token.lstrip("-").split("=", 1)[0]
        previous_unknown = name not in valid_names and "=" not in token
        if name in valid_names:
            continue
        where = _where_set(name, args, key_lines)
        close = sorted(n for n in valid_names if n.startswith(name))[:3]  # an abbreviation first
        close = close or difflib.get_close_matches(name, sorted(valid_names), n=1, cutoff=0.6)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        messages.append(f"unknown option '{name}' {where}{hint}")
    return messages


def _misspelt_dashes(parser, unknown):
    """Leftover tokens that name one of this parser's options with the wrong dashes.

    argparse consumes every option string it knows, so a leftover such as
    ``-override_opts`` (OpenNMT-py spells it ``--override_opts`` or
    ``-override-opts``) would otherwise pass as a known name and be dropped.
    """
    messages = []
    for token in unknown:
        name = token.split("=", 1)[0]
        if not name.startswith("-"):
            continue
        action = next((a for s, a in parser._option_string_actions.items() if s.lstrip("-") == name.lstrip("-")),
                      None)
        if action is not None and name not in parser._option_string_actions:
            spellings = " or ".join(action.option_strings)
            messages.append(f"'{name}' is not an option; write {spellings}")
    return messages


#: Counts of stock OpenNMT-py options that 3.5.1 takes without a check and then fails on deep inside (a
#: modulo by zero, an empty range, an index past a list) when they are below 1.
_POSITIVE_STOCK_OPTIONS = ("report_every", "valid_steps", "accum_count", "world_size", "beam_size", "n_best",
                           "max_length")


def stock_option_problems(opt):
    """Messages for stock options that OpenNMT-py 3.5.1 would accept and then crash on (empty: none).

    Each of :data:`_POSITIVE_STOCK_OPTIONS` that ``opt`` has must be at least 1
    (every element, for a list such as ``accum_count``), and ``-n_best`` cannot
    exceed ``-beam_size``: beam search keeps only ``beam_size`` finished
    hypotheses per sentence.
    """
    problems = []
    for name in _POSITIVE_STOCK_OPTIONS:
        value = getattr(opt, name, None)
        values = value if isinstance(value, (list, tuple)) else [] if value is None else [value]
        if any(item < 1 for item in values):
            problems.append(f"-{name} {' '.join(map(str, values))}: must be >= 1")
    n_best, beam_size = getattr(opt, "n_best", None), getattr(opt, "beam_size", None)
    if n_best is not None and beam_size is not None and 1 <= beam_size < n_best:
        problems.append(f"-n_best {n_best}: must be <= -beam_size ({beam_size})")
    return problems


def cuda_problems(opt):
    """One message when ``opt`` asks for a GPU (``-gpu``, ``-gpu_ranks``) that this torch cannot give."""
    import torch

    from onmt_ext.compat import torch_setup_command

    asked = [f"-gpu {opt.gpu}"] if isinstance(getattr(opt, "gpu", None), int) and opt.gpu >= 0 else []
    ranks = getattr(opt, "gpu_ranks", None) or []
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


#: Set on a parser that parses strictly: a command's own, or one that :func:`strict` marked.
_STRICT = "_onmt_ext_strict"
#: True while the ``main`` of an OpenNMT-py command runs (:func:`_run_main`).
_IN_COMMAND = contextvars.ContextVar("onmt_ext_in_command", default=False)


def strict(parser):
    """Make ``parser`` parse strictly, as the commands do (for onmt-ext's own helpers); returns it."""
    setattr(parser, _STRICT, True)
    return parser


def _run_as_command():
    """True in ``python -m onmt.bin.<command>``: runpy runs that module as ``__main__``, with its spec."""
    return getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", None) in COMMANDS


def _parses_strictly(parser, args):
    """Strict: a parser that :func:`strict` marked, or an OpenNMT-py command parsing its own command line."""
    if args is None and _in_command():
        strict(parser)
    return getattr(parser, _STRICT, False)


def _strict_parse_known_args(stock, self, args=None, namespace=None, **kwargs):
    if not _parses_strictly(self, args):
        return stock(self, args, namespace, **kwargs)
    # Abbreviations make a misspelled YAML key or option silently set another option.
    self.allow_abbrev = False
    argv = list(sys.argv[1:] if args is None else args)
    problems = [m for path in _config_paths(argv) for m in duplicate_key_messages(path)]
    if args is None:  # the command's own command line (a helper's override list may repeat on purpose)
        from onmt_ext.command_line import repeated_option_messages

        problems += repeated_option_messages(self, argv)
    if problems:
        self.exit(2, "".join(f"{self.prog}: error: {p}\n" for p in problems))
    self.error = functools.partial(_usage_error, self, argv)  # one line, not the usage, for a bad or missing value
    try:
        opt, unknown = stock(self, args, namespace, **kwargs)
    finally:
        del self.error
    names = _option_names(self)
    if names & {"train_steps", "n_sample"}:  # onmt_train / onmt_build_vocab
        names = names | _shared_config_names()
    problems = unknown_option_messages(unknown, names, argv) + _misspelt_dashes(self, unknown)
    if argv:
        problems += stock_option_problems(opt)
    if hasattr(opt, "encoder_type") and argv:
        from onmt_ext.compat import save_format_problems
        from onmt_ext.options import check_options

        problems += check_options(opt) + save_format_problems(opt)
    if problems:
        self.exit(2, "".join(f"{self.prog}: error: {p}\n" for p in problems))
    return opt, [u for u in unknown if u.lstrip("-").split("=", 1)[0] in names]


def _no_abbreviations_when_strict(stock, self, option_string):
    """argparse (3.11) expands ``-beam`` to ``-beam_size`` even with ``allow_abbrev=False``; a strict parse takes
    no abbreviation (every other parser: stock)."""
    return [] if getattr(self, _STRICT, False) else stock(self, option_string)


def _make_parsing_strict():
    from onmt.utils.parse import ArgumentParser

    scope = ("in the commands' own parses (onmt_train, onmt_build_vocab, onmt_translate, also as python -m "
             "onmt.bin.*) and onmt-ext's parse_train_config; every other caller gets stock argparse")
    patch(ArgumentParser, "parse_known_args", _strict_parse_known_args, kind=NEEDED,
          test="tests/unit/test_plugin.py::test_only_the_commands_parse_strictly",
          reason="refuses unknown, misspelled, repeated or invalid options in one line each, instead of ignoring "
                 "them, " + scope)
    patch(ArgumentParser, "_get_option_tuples", _no_abbreviations_when_strict, kind=FIX,
          test="tests/integration/test_user_errors.py::test_abbreviated_options_are_refused_with_a_suggestion",
          reason="argparse takes -beam for -beam_size and -train_step for -train_steps although abbreviations are "
                 "off; refused " + scope)


def _validate_model_opts(stock, cls, model_opt):
    from onmt_ext import __version__
    from onmt_ext.options import validate

    stock(cls, model_opt)
    validate(model_opt)
    setattr(model_opt, VERSION_KEY, __version__)  # saved with the checkpoint


def _check_on_model_validation():
    from onmt.utils.parse import ArgumentParser

    patch(ArgumentParser, "validate_model_opts", _validate_model_opts, kind=NEEDED,
          reason="checks onmt-ext's options wherever OpenNMT-py validates model options (also those of a "
                 "checkpoint) and records the onmt-ext version in the checkpoint",
          test="tests/unit/test_options.py::test_checkpoint_with_invalid_options_fails_on_load")


def _load_state_dict_with_new_parameters(stock, self, *args, **kwargs):
    from onmt_ext.gret import load_with_new_parameters

    return load_with_new_parameters(stock)(self, *args, **kwargs)


def _load_checkpoints_with_new_parameters():
    """Let ``-train_from`` a baseline checkpoint initialise the new tensors of mechanisms (see onmt_ext.gret)."""
    from onmt.models.model import BaseModel

    patch(BaseModel, "load_state_dict", _load_state_dict_with_new_parameters, kind=NEEDED, order=2,
          reason="fine-tuning a mechanism from a baseline checkpoint (GRET) initialises the tensors the baseline "
                 "lacks and logs them",
          test="tests/integration/test_cli_pipeline.py::test_gret_fine_tunes_from_a_baseline_checkpoint")


#: Attribute onmt-ext adds to the saved model options: the version that wrote the checkpoint.
VERSION_KEY = "onmt_ext_version"
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


def checkpoint_problems(path, checkpoint):
    """Why an onmt-ext checkpoint cannot be used by this onmt-ext (empty: it can).

    A checkpoint of ``ext_transformer`` whose saved options include names this
    version does not know, or values of known options outside their choices
    (e.g. a routing method added later), was written by another (newer)
    onmt-ext with a mechanism this one lacks; loading it would either fail
    deep in torch or, worse, silently drop the mechanism.  Stock OpenNMT-py
    checkpoints are not checked (they must simply work).
    """
    from onmt_ext.options import choice_problems

    opt = checkpoint.get("opt") if isinstance(checkpoint, dict) else None
    if opt is None or "ext_transformer" not in (getattr(opt, "encoder_type", None), getattr(opt, "decoder_type", None)):
        return []
    unknown = sorted(name for name in vars(opt) if name not in _option_dests() and name != VERSION_KEY
                     and name not in STOCK_INTERNAL and not name.startswith("_"))
    values = choice_problems(opt)
    if not unknown and not values:
        return []
    from onmt_ext import __version__

    written = getattr(opt, VERSION_KEY, None)
    what = ([f"options this onmt-ext ({__version__}) does not know: {', '.join(unknown)}"] if unknown else []) + \
        ([f"option values this onmt-ext ({__version__}) does not know: {'; '.join(values)}"] if values else [])
    return [f"checkpoint {path} was written by onmt-ext {written or '(a version that did not record itself)'} "
            f"with {' and '.join(what)}; load it with the onmt-ext version that wrote it"]


def _load_checkpoint(stock, ckpt_path):
    """Load a checkpoint; one line naming the file when it is none, or of an unknown onmt-ext mechanism.

    The errors are also of the type stock raises (:func:`_user_error`): callers outside the commands catch what
    they caught before.
    """
    if ckpt_path and not os.path.isfile(ckpt_path) and _in_command():  # elsewhere: stock's FileNotFoundError
        raise UsageError(f"{ckpt_path}: no such checkpoint file")
    try:
        checkpoint = stock(ckpt_path)
    except Exception as error:  # torch.load: UnpicklingError, RuntimeError (zip), EOFError, KeyError, ...
        import torch

        if not isinstance(error, (torch.serialization.pickle.UnpicklingError, RuntimeError, EOFError, KeyError,
                                  AttributeError, ValueError, IndexError, TypeError)):
            raise
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        if "weights_only" in first or "WeightsUnpickler" in first or len(first) > 160:
            first = type(error).__name__
        raise _user_error(f"{ckpt_path} is not an OpenNMT-py checkpoint that this onmt-ext can read ({first}); "
                          "give a <model>_step_N.pt file written by onmt_train", type(error)) from None
    if checkpoint is not None and not (isinstance(checkpoint, dict) and "model" in checkpoint and "opt" in checkpoint):
        raise _user_error(f"{ckpt_path} is not an OpenNMT-py checkpoint (no model and options in it); give a "
                          "<model>_step_N.pt file written by onmt_train", ValueError)
    problems = checkpoint_problems(ckpt_path, checkpoint)
    if problems:
        raise _user_error("\n".join(problems), ValueError)
    return checkpoint


def _load_state_dict_clearly(stock, self, *args, **kwargs):
    try:
        return stock(self, *args, **kwargs)
    except (ValueError, AssertionError) as error:  # stock: missing/extra keys (ValueError), shapes (assert)
        text = str(error)
        if not (isinstance(error, AssertionError) or "missing key" in text.lower()
                or "extra keys" in text.lower()):
            raise
        raise _user_error(f"the checkpoint's tensors do not fit the model built from its options "
                          f"({' '.join(text.split()) or 'a tensor has the wrong shape'}); was it written by another "
                          "version of onmt-ext or OpenNMT-py, or altered?", type(error)) from None


def _check_checkpoints():
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
    from onmt_ext.options import EXT_TYPE, OPTION_SPECS

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
    if added and not opt.override_opts:
        listed = ", ".join(f"-{name} {value!r}" for name, value in added)
        raise UsageError(f"-train_from {opt.train_from}: the checkpoint has none of {listed}; to fine-tune them "
                         "from it add --override_opts -reset_optim all, or drop them to resume the checkpoint's model")
    for name, value in added:
        logger.info(f"onmt-ext: fine-tuning adds to the checkpoint's model: -{name} {value!r}")
    return stock(opt, checkpoint)


def _check_train_from_options():
    import onmt.train_single as train_single

    patch(train_single, "_get_model_opts", _model_opts_checked, kind=FIX,
          reason="-train_from silently builds the checkpoint's model when the config's architecture or mechanism "
                 "options differ (a d=32 config trained a d=64 model)",
          test="tests/integration/test_user_errors.py::test_train_from_with_other_architecture_options_is_refused")


# --------------------------------------------------------------------------
# One-line errors of the commands


class UserError(SystemExit):
    """A mistake in the user's input or environment, found at run time: ``<command>: error: ...``, exit 1.

    The command's name is added by the command wrapper (:func:`_run_command`).
    """

    status = 1

    def __init__(self, message):
        super().__init__(message)
        self.message = message


class UsageError(UserError):
    """A mistake in the command line or config (an option or a path that names nothing): exit 2."""

    status = 2


_USER_ERRORS_ALSO = {}


def _user_error(message, stock_type):
    """A :class:`UserError` that is also a ``stock_type`` (what stock raises there), so that code outside the
    commands catches it as before; a plain :class:`UserError` where Python cannot combine the two."""
    if stock_type not in _USER_ERRORS_ALSO:
        try:
            _USER_ERRORS_ALSO[stock_type] = type(f"UserError_{stock_type.__name__}", (UserError, stock_type),
                                                 {"__module__": __name__})
        except TypeError:  # "instance lay-out conflict" (OSError, AttributeError)
            _USER_ERRORS_ALSO[stock_type] = UserError
    return _USER_ERRORS_ALSO[stock_type](message)


def _in_command():
    """True inside an OpenNMT-py command (its ``main``, or ``python -m onmt.bin.<command>``)."""
    return _IN_COMMAND.get() or _run_as_command()


#: The stock entry point modules, by command name.
COMMANDS = {"onmt.bin.train": "onmt_train", "onmt.bin.translate": "onmt_translate",
            "onmt.bin.build_vocab": "onmt_build_vocab"}


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


def _run_command(stock, *args, **kwargs):
    """The stock ``main``/``train``/``translate`` of a command, ending every known error in one line per problem.

    Usage errors exit 2, run-time errors 1; Ctrl-C in ``onmt_train`` names the
    last checkpoint and the command that resumes from it (exit 130).
    """
    from onmt.modules.embeddings import SequenceTooLongError

    from onmt_ext.clause_split import ClauseSplitError
    from onmt_ext.compat import MissingPackageError
    from onmt_ext.corpus import CorpusError
    from onmt_ext.options import OptionError

    prog = COMMANDS.get(stock.__module__, os.path.basename(sys.argv[0]))
    try:
        return stock(*args, **kwargs)
    except (UserError, CorpusError) as error:
        sys.stderr.write(_one_line(prog, getattr(error, "message", error.code)) + "\n")
        raise SystemExit(getattr(error, "status", 1)) from None
    except (SequenceTooLongError, MissingPackageError, ClauseSplitError, OptionError) as error:
        sys.stderr.write(_one_line(prog, error) + "\n")
        raise SystemExit(1) from None
    except SystemExit as error:
        if isinstance(error.code, str):  # sys.exit("message") somewhere: one line with the command's name
            sys.stderr.write(_one_line(prog, error.code) + "\n")
            raise SystemExit(1) from None
        raise
    except KeyboardInterrupt:
        _end_interrupted(prog, args)
    except Exception as error:
        if not _caused_by_interrupt(error):
            raise
        _end_interrupted(prog, args)  # Ctrl-C inside torch.save's writer surfaces as its RuntimeError


def _run_main(stock, *args, **kwargs):
    """A command's ``main``: its command line is parsed strictly (:func:`_parses_strictly`), its errors end in one
    line (:func:`_run_command`)."""
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
    import shlex

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


def _check_machine(opt):
    """Refuse (exit 1) a GPU option on a torch without CUDA, and a transform whose package is not installed.

    Run by the commands, not by the option parser: tools parse paper configs
    that name GPUs on machines without one.
    """
    from onmt_ext.compat import missing_package_problems

    lacking = cuda_problems(opt) + missing_package_problems(opt)
    if lacking:
        raise UserError("\n".join(lacking))


def _build_vocab_checked(stock, opt, *args, **kwargs):
    """``onmt.bin.build_vocab.build_vocab_main`` after :func:`_check_machine`."""
    _check_machine(opt)
    return stock(opt, *args, **kwargs)


def _train_checked(stock, opt, *args, **kwargs):
    """``onmt.bin.train.train``: refuse missing vocabularies and a -save_model that holds another run's files."""
    _check_machine(opt)
    problems = []
    reads_vocabs = not getattr(opt, "train_from", None) or getattr(opt, "update_vocab", False)
    for key in ("src_vocab", "tgt_vocab") if reads_vocabs else ():  # a resumed run takes the checkpoint's
        path = getattr(opt, key, None)
        if path and not os.path.isfile(path):
            problems.append(f"-{key} {path}: no such file (onmt_build_vocab -config <your config> writes it)")
    if problems:
        raise UsageError("\n".join(problems))
    existing = step_checkpoints(getattr(opt, "save_model", "model"))
    if existing and not getattr(opt, "train_from", None) and not getattr(opt, "overwrite_checkpoints", False):
        shown = ", ".join(path for _, path in existing[:3]) + (", …" if len(existing) > 3 else "")
        raise UsageError(f"-save_model {opt.save_model}: holds checkpoints of another run ({shown}); resume it with "
                         f"-train_from {existing[-1][1]}, or pass -overwrite_checkpoints to train over them, or "
                         "choose another -save_model")
    return _run_command(stock, opt, *args, **kwargs)


def _translate_checked(stock, opt, *args, **kwargs):
    """``onmt.bin.translate.translate``: one-line errors, and a warning when every translation is empty."""
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


def _one_line_errors():
    from onmt.bin import build_vocab, train, translate

    reason = ("errors a user causes end in one line `<command>: error: ...` (usage: exit 2, run time: exit 1); "
              "the command line is parsed strictly (see parse_known_args)")
    machine = ("-gpu/-gpu_ranks on a torch without CUDA end in a misleading error or an AttributeError; a "
               "transform whose package (spaCy, fasttext) is missing fails deep inside the data loader")
    machine_test = "tests/integration/test_user_errors.py::test_onmt_works_without_spacy_and_fasttext"
    test = "tests/integration/test_user_errors.py::test_a_missing_vocabulary_is_named_in_one_line"
    for module in (train, translate, build_vocab):
        patch(module, "main", _run_main, kind=MESSAGE, reason=reason, test=test)
    patch(train, "train", _train_checked, kind=FIX, test="tests/integration/test_user_errors.py::"
          "test_training_into_another_runs_checkpoints_is_refused",
          reason="a missing -src_vocab ends in a long traceback; training into a -save_model of another run "
                 "overwrites its checkpoints silently; Ctrl-C ends in a bare KeyboardInterrupt traceback; "
                 + machine)
    patch(build_vocab, "build_vocab_main", _build_vocab_checked, kind=MESSAGE, reason=machine, test=machine_test)
    # order 0: runs before onmt_ext.corpus's source checks (order 1), so that their errors end in one line
    patch(translate, "translate", _translate_checked, kind=MESSAGE, order=0,
          test="tests/unit/test_plugin.py::test_all_empty_translations_give_a_warning",
          reason="a translation whose every line is empty ends without a word; " + machine)


def train_parser():
    """OpenNMT-py's ``onmt_train`` parser (with onmt-ext's options once active), strict as the command's."""
    import onmt.opts
    from onmt.utils.parse import ArgumentParser

    parser = ArgumentParser(description="train.py")
    onmt.opts.train_opts(parser)
    return strict(parser)


def parse_train_config(config, *overrides):
    """Parse a YAML config (plus command-line style ``overrides``) as ``onmt_train`` does.

    Strict parsing applies (a bad option exits with a message naming it);
    the model options are then updated and validated like OpenNMT-py's
    training does.  Returns the ``opt`` namespace.
    """
    from onmt.utils.parse import ArgumentParser

    opt, _ = train_parser().parse_known_args(["-config", str(config), *map(str, overrides)])
    ArgumentParser.update_model_opts(opt)
    ArgumentParser.validate_model_opts(opt)
    return opt


def _build_base_model_with_vocabs(stock, model_opt, vocabs, *args, **kwargs):
    from onmt_ext.clause_attention import building_with

    with building_with(vocabs):
        return stock(model_opt, vocabs, *args, **kwargs)


def _tell_builders_the_vocabs():
    """Wrap ``build_base_model`` so that mechanisms can read the vocabularies (clause markers' ids)."""
    import onmt.model_builder as builder

    patch(builder, "build_base_model", _build_base_model_with_vocabs, kind=NEEDED,
          reason="clause attention reads the ids of the clause markers from the vocabularies while it is built",
          test="tests/unit/test_clause_attention.py::test_model_has_clause_attention_in_the_selected_layers_only")


#: clause_split options that must be the same at translation as in training.
_SPLIT_OPTIONS = ("clause_lang", "clause_levels")


def translation_split_problems(opt, model_opt):
    """Messages when ``opt`` (onmt_translate) would not split the source as ``model_opt`` (training) did."""
    from onmt_ext.clause_split import TRANSFORM_NAME

    if not getattr(model_opt, "clause_attention", False):
        return []
    if TRANSFORM_NAME not in (getattr(opt, "transforms", None) or []):
        trained = getattr(model_opt, "transforms", None) or []
        return [f"this model has clause attention: translate with the transforms it was trained with "
                f"(-transforms {' '.join(trained)}) and the same -clause_* options"]
    problems = [f"-{name} {getattr(opt, name, None)!r} differs from training ({getattr(model_opt, name, None)!r})"
                for name in _SPLIT_OPTIONS if getattr(opt, name, None) != getattr(model_opt, name, None)]
    if bool(getattr(opt, "clause_tagger_model", "")) != bool(getattr(model_opt, "clause_tagger_model", "")):
        problems.append(f"-clause_tagger_model {getattr(opt, 'clause_tagger_model', '')!r}: training used "
                        f"{getattr(model_opt, 'clause_tagger_model', '') or 'the rules (no tagger)'!r}")
    return problems


def _load_test_model_split_checked(stock, opt, *args, **kwargs):
    vocabs, model, model_opt = stock(opt, *args, **kwargs)
    problems = translation_split_problems(opt, model_opt)
    if problems:
        raise UsageError("\n".join(problems))
    return vocabs, model, model_opt


def _check_translation_split():
    """Refuse to translate with clause attention unless the source is split as in training."""
    import onmt.model_builder as builder

    # order 0: checks what the -ext_compile layer (order 1) returns
    patch(builder, "load_test_model", _load_test_model_split_checked, kind=NEEDED, order=0,
          reason="a clause-attention model must translate a source split as in its training",
          test="tests/unit/test_clause_attention.py::test_translation_must_split_as_training")


def _register_transforms():
    """Add onmt-ext's data transforms (``clause_split``, ``jieba``) to OpenNMT-py's registry."""
    for name in ("clause_split", "zh_segment"):
        module = sys.modules.get(f"onmt_ext.{name}")
        if module is not None and not hasattr(module, "install"):
            continue  # its import of onmt activated onmt-ext: it registers itself at its end, once this is active
        importlib.import_module(f"onmt_ext.{name}").install()


def activate():
    """Register onmt-ext with the already-imported ``onmt`` package: all of it or, when a step fails (or
    OpenNMT-py's version is not :data:`onmt_ext.patches.SUPPORTED`), nothing: every change undone, the error
    re-raised.  Idempotent."""
    global _active
    if _active:
        return
    with patches.all_or_nothing():
        patches.check_version()
        _activate()
    _active = True


def deactivate():
    """Undo every change onmt-ext made to OpenNMT-py (:func:`onmt_ext.patches.rollback`): stock again."""
    global _active
    patches.rollback()
    _active = False


def _activate():
    from onmt_ext import batches, checkpoints, command_line, compat, corpus, initialisation, preprocessing, train_step

    compat.apply()
    compat.keep_log_file()
    compat.atomic_checkpoints()
    compat.resume_data_position()
    compat.count_filtered_examples()
    compat.explain_position_limit()
    corpus.install()
    batches.install()  # training batches: tensors only, copied to the GPU without waiting
    train_step.install()  # the training step: no host-device synchronisation between reports
    _register_models()
    _extend_model_options()
    _translation_compile()
    _make_parsing_strict()
    _check_on_model_validation()
    _load_checkpoints_with_new_parameters()
    _check_checkpoints()
    _check_train_from_options()
    checkpoints.install()  # resuming, fine-tuning a replaced module, onmt_average_models (after _check_checkpoints)
    command_line.install()
    _register_transforms()
    _tell_builders_the_vocabs()
    initialisation.install()  # the mechanisms' stated initialisation, after OpenNMT-py's own
    _check_translation_split()
    preprocessing.install()  # onmt_translate repeats (or checks) the checkpoint's source preprocessing
    _one_line_errors()


def is_active():
    """True once :func:`activate` has run in this process."""
    return _active
