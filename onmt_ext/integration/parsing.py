"""Strict option parsing of the stock commands: an unknown, abbreviated, repeated or invalid option stops them.

Stock OpenNMT-py drops unknown YAML keys silently, and argparse's prefix matching lets a misspelt key set another
option.  :func:`make_parsing_strict` wraps ``ArgumentParser.parse_known_args`` so that a command parsing its own
command line (or a parser :func:`strict` marked) refuses, in one line each with exit 2 and the closest valid key:
unknown or misspelt options (:func:`unknown_option_messages`, naming the YAML file and line), repeated YAML keys
(:func:`duplicate_key_messages`), YAML keys without a value (:func:`empty_value_messages`) or with a list for one
value (:func:`list_value_messages`), bad corpora of a ``data:`` (:func:`corpus_key_messages`) or ``-data``
(:func:`command_line_data_messages`), stock counts below 1 (:func:`stock_option_problems`), onmt_train options that
stock ignores or asserts on (:func:`training_option_problems`) and onmt-ext's own option checks; a config that YAML
cannot parse for a tab in its indentation gets the file and line (:func:`tab_indentation_hint`).  One YAML may
serve both commands; options it sets for transforms a run does not use get a note (:func:`transform_option_notes`).
:func:`train_parser` and :func:`parse_train_config` parse as ``onmt_train`` does, for onmt-ext's tools and tests.
"""

import argparse
import difflib
import functools
import re
import sys

import yaml

from onmt_ext.integration.command_line import repeated_option_messages
from onmt_ext.integration.commands import in_command
from onmt_ext.integration.preprocessing import transform_defaults
from onmt_ext.runtime.compat import save_format_problems
from onmt_ext.runtime.corpus import (corpora_of, corpus_weight, data_problems, no_training_corpus_message,
                                     weight_problem)
from onmt_ext.options import check_options
from onmt_ext.patches import FIX, NEEDED, patch

# OpenNMT-py is imported inside the functions: importing it while this module initialises would activate
# onmt-ext (onmt_ext._autoload) before this module is whole.

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


def _composed(path):
    """The YAML node tree of the config file ``path`` (line numbers included), or None where it cannot be read or
    parsed (the stock parse names that)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.compose(handle)
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return None


def _config_key_lines(path):
    """Map each top-level key of a YAML config to its 1-based line number."""
    node = _composed(path)
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {key.value: key.start_mark.line + 1 for key, _ in node.value}


def duplicate_key_messages(path):
    """``key 'x' is set 2 times in <path>, lines 3 and 9`` for each mapping key written more than once (any depth).

    PyYAML keeps the last value of a repeated key without a word.
    """
    messages, stack = [], [("", _composed(path))]
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


_NULL_TAG = "tag:yaml.org,2002:null"


def _has_no_value(node):
    """Whether a YAML value node is null (``key:``, ``key: ~``, ``key: null``) or an empty string (``key: ""``)."""
    return isinstance(node, yaml.ScalarNode) and (node.tag == _NULL_TAG or node.value == "")


def empty_value_messages(path):
    """``key 'gret' in <path>, line N has no value: ...`` for each top-level key of a YAML config written without a
    value (``gret:``, ``gret: ~``, ``gret: null``, ``gret: ""``): configargparse drops such a key without a word, so
    the option keeps its default; also for a key of a ``data:`` corpus with a null value
    (:func:`_empty_corpus_value_messages`)."""
    root = _composed(path)
    if not isinstance(root, yaml.MappingNode):
        return []
    messages = []
    for key, value in root.value:
        if _has_no_value(value):
            messages.append(f"key {key.value!r} in {path}, line {key.start_mark.line + 1} has no value: the option "
                            "would keep its default, or be an empty text, without a word; give a value or delete "
                            "the line")
        elif key.value == "data":
            messages += _empty_corpus_value_messages(value, _in_config(path))
    return messages


def _empty_corpus_value_messages(data, where):
    """``key 'x' in corpus 'c' of <where> has no value: ...`` for each key of a corpus of ``data`` (a ``-data`` YAML
    node; ``where(node)``, :func:`_in_config` or :func:`_on_command_line`, says where) with a null value, which
    OpenNMT-py reads as not given (``transforms:`` gives the top-level -transforms, not none)."""
    messages = []
    for name, entry in data.value if isinstance(data, yaml.MappingNode) else ():
        for inner, setting in entry.value if isinstance(entry, yaml.MappingNode) else ():
            if isinstance(setting, yaml.ScalarNode) and setting.tag == _NULL_TAG:
                none = " ('transforms: []' for none)" if inner.value == "transforms" else ""
                line = "key" if where is _on_command_line else "line"
                messages.append(f"key {inner.value!r} in corpus {name.value!r} of {where(inner)} has no value: "
                                f"OpenNMT-py would read it as not given; give a value{none} or delete the {line}")
    return messages


def _in_config(path):
    """``where(node)`` for a node of the ``data:`` of config ``path``: ``data in <path>, line N``."""
    return lambda node: f"data in {path}, line {node.start_mark.line + 1}"


def _on_command_line(node):
    """``where(node)`` for a node of a ``-data`` given on the command line."""
    return "-data on the command line"


def _takes_a_list(action):
    """Whether configargparse gives an option with ``action`` a YAML list (its test in
    ``convert_item_to_command_line_arg``): an ``append`` action, or ``nargs`` ``+``, ``*`` or above 1."""
    return isinstance(action, argparse._AppendAction) or action.nargs in ("+", "*") or \
        (isinstance(action.nargs, int) and action.nargs > 1)


def list_value_messages(parser, args):
    """``key 'heads' in <config>, line N: takes one value, not a list ([4]); write heads: 4`` for each top-level key
    of the config files in ``args`` that is an option of ``parser`` taking one value (or a switch) and is written
    as a YAML list, unless the command line sets that option (configargparse then drops the key).  configargparse
    says ``heads can't be set to a list '[4]' unless its action type is changed to 'append'...``, naming no file,
    and fails an assertion (a traceback) for a switch."""
    messages, given = [], _command_line_names(args)
    for path in _config_paths(args):
        root = _composed(path)
        for key, value in root.value if isinstance(root, yaml.MappingNode) else ():
            action = parser._option_string_actions.get(f"-{key.value}") or \
                parser._option_string_actions.get(f"--{key.value}")
            if not isinstance(value, yaml.SequenceNode) or action is None or _takes_a_list(action) or \
                    key.value in given:
                continue
            items = [item.value if isinstance(item, yaml.ScalarNode) else "..." for item in value.value]
            fix = f"write {key.value}: {items[0]}" if len(value.value) == 1 and items[0] != "..." else \
                f"give it one value ({key.value}: <value>)"
            messages.append(f"key {key.value!r} in {path}, line {key.start_mark.line + 1}: takes one value, not a "
                            f"list ([{', '.join(items)}]); {fix}")
    return messages


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


def _command_line_names(args):
    """The names (without dashes) of the options written on the command line ``args``."""
    return {a.lstrip("-").split("=", 1)[0] for a in args if a.startswith("-")}


def _where_set(name, args, key_lines):
    """``in <config>, line N`` when option ``name`` comes from a config file, else ``on the command line``."""
    if name in key_lines and name not in _command_line_names(args):
        path, line = key_lines[name]
        return f"in {path}, line {line}"
    return "on the command line"


_ARGUMENT_ERROR = re.compile(r"^argument (\S+): (.*)$", re.S)
#: configargparse's error for a config's switch whose value is no boolean (``tensorboard: maybe``)
_SWITCH_VALUE_ERROR = re.compile(r"Unexpected value for ([\w-]+): (.*)$", re.S)
#: Where PyYAML's error messages point: ``in "<file>", line N, column M``.
_YAML_MARK = re.compile(r'in "([^"]+)", line (\d+), column \d+')


def tab_indentation_hint(message):
    """``; <file>, line N is indented with a tab: ...`` when a config that YAML could not parse (``message``, the
    parse error) has a tab in the indentation of a line it points at, or of a line before them; else ``""``."""
    marks = [(path, int(line)) for path, line in _YAML_MARK.findall(message)]
    for path in dict.fromkeys(path for path, _ in marks):
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                lines = handle.read().splitlines()
        except OSError:
            continue
        pointed = [line for where, line in marks if where == path]
        indented = [number for number, text in enumerate(lines[:max(pointed)], 1)
                    if "\t" in text[:len(text) - len(text.lstrip())]]
        if indented:
            number = next((n for n in indented if n in pointed), indented[0])
            return (f"; {path}, line {number} is indented with a tab: YAML allows only spaces for indentation "
                    "(replace the tab with spaces)")
    return ""


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
        elif match.group(2).startswith("ignored explicit argument"):  # -position_encoding=false
            message = _switch_value_message(parser, f"-{name}", match.group(2).split(" ", 3)[-1])
    elif _SWITCH_VALUE_ERROR.match(message):  # configargparse's, naming no file
        name, rest = _SWITCH_VALUE_ERROR.match(message).groups()
        message = f"key '{name}' {_where_set(name, args, _config_locations(args))}: unexpected value {rest}"
    elif message.startswith("Couldn't parse config file"):  # configargparse's, over PyYAML's error
        message += tab_indentation_hint(message)
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


#: Keys of a corpus entry of ``data:`` that OpenNMT-py 3.5.1 reads (onmt-ext adds none): ``_validate_data`` and
#: ``ParallelCorpus`` read the paths, weight and transforms, the prefix and suffix transforms their strings, and the
#: clean and normalize transforms their per-corpus settings (``_get_opt``).
CORPUS_KEYS = frozenset({
    "path_src", "path_tgt", "path_txt", "path_align", "weight", "transforms",
    "src_prefix", "tgt_prefix", "src_suffix", "tgt_suffix",
    "src_eq_tgt", "same_char", "same_word", "scripts_ok", "scripts_nok", "src_tgt_ratio", "avg_tok_min",
    "avg_tok_max", "langid",
    "src_lang", "tgt_lang", "penn", "norm_quote_commas", "norm_numbers", "pre_replace_unicode_punct",
    "post_remove_control_chars",
})


def _transform_names():
    """The transforms OpenNMT-py knows (with onmt-ext's, once active): those ``-transforms`` and a corpus's
    ``transforms`` may name."""
    from onmt.transforms import AVAILABLE_TRANSFORMS

    return sorted(AVAILABLE_TRANSFORMS)


def unknown_transform_message(name, where):
    """``unknown transform 'x' <where>; did you mean 'y'?`` (the closest known transform, if any)."""
    close = difflib.get_close_matches(str(name), _transform_names(), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else f"; the transforms are {', '.join(_transform_names())}"
    return f"unknown transform {name!r} {where}{hint}"


def _corpus_value_messages(name, entry, where, loader):
    """The bad ``weight`` and ``transforms`` of corpus ``name`` (its YAML node ``entry``) of ``where``: a
    ``transforms`` that is no list, or names no transform (stock: a traceback)."""
    messages = []
    for key, value in entry.value:
        at = f"corpus {name.value!r} of {where(key)}"
        if key.value == "weight" and not _has_no_value(value):
            problem = weight_problem(loader.construct_object(value, deep=True))
            if problem:
                messages.append(f"{at}: {problem}")
        elif key.value == "transforms" and isinstance(value, (yaml.SequenceNode, yaml.ScalarNode)) \
                and not _has_no_value(value):
            items = value.value if isinstance(value, yaml.SequenceNode) else [value]
            if isinstance(value, yaml.ScalarNode):  # (stock reads each letter of the text as a transform)
                messages.append(f"{at}: transforms {value.value!r} is not a list: write transforms: [{value.value}]")
            known = set(_transform_names())
            messages += [unknown_transform_message(item.value, f"in {at}") for item in items
                         if isinstance(item, yaml.ScalarNode) and item.value not in known]
    return messages


def corpus_key_messages(path):
    """``unknown key 'weigth' in corpus 'corpus_1' of data in <path>, line N; did you mean 'weight'?`` and the other
    problems of :func:`data_node_messages` in the ``data:`` of the config file ``path``."""
    root = _composed(path)
    key, data = next(((key, value) for key, value in getattr(root, "value", []) if isinstance(root, yaml.MappingNode)
                      and key.value == "data"), (None, None))
    return data_node_messages(data, _in_config(path), key) if data is not None else []


def command_line_data_messages(text):
    """The problems of :func:`_empty_corpus_value_messages` and :func:`data_node_messages` in a ``-data`` given on
    the command line (YAML text), each naming ``-data on the command line``; none for text that is no YAML (the
    data check of onmt_ext.runtime.corpus names that)."""
    try:
        data = yaml.compose(text) if isinstance(text, str) else None
    except yaml.YAMLError:
        return []
    if data is None:
        return []
    return _empty_corpus_value_messages(data, _on_command_line) + data_node_messages(data, _on_command_line)


def data_node_messages(data, where, key=None):
    """Problems of ``data``, the YAML node of a ``-data`` (``where(node)`` says where a node is: :func:`_in_config`
    or :func:`_on_command_line`; ``key``, the node of the ``data:`` key): a key of a corpus entry that OpenNMT-py
    does not read (:data:`CORPUS_KEYS`; stock ignores it silently), a corpus entry that is not a mapping, a
    ``data`` that is not a mapping, and a corpus ``weight`` or ``transforms`` that :func:`_corpus_value_messages`
    refuses."""
    if not isinstance(data, yaml.MappingNode):
        if _has_no_value(data):
            return []
        return [f"{where(key)}: must be a mapping of corpora, each with path_src, path_tgt and weight (corpus_1: "
                "{path_src: ..., path_tgt: ..., weight: 1}), not a "
                f"{'list' if isinstance(data, yaml.SequenceNode) else 'single value'}"]
    messages, loader = [], yaml.SafeLoader("")
    for name, entry in data.value:
        if isinstance(entry, yaml.MappingNode):
            loader.flatten_mapping(entry)  # a merge key (<<: *anchor) brings the anchor's keys, as safe_load reads
        if not isinstance(entry, yaml.MappingNode):
            messages.append(f"corpus {name.value!r} of {where(name)}: must be a mapping of keys such as path_src, "
                            "path_tgt and weight")
            continue
        for inner, _ in entry.value:
            if inner.value not in CORPUS_KEYS:
                close = difflib.get_close_matches(str(inner.value), sorted(CORPUS_KEYS), n=1, cutoff=0.6)
                hint = (f"; did you mean {close[0]!r}?" if close
                        else f"; a corpus takes {', '.join(sorted(CORPUS_KEYS))}")
                messages.append(f"unknown key {inner.value!r} in corpus {name.value!r} of {where(inner)}{hint}")
        messages += _corpus_value_messages(name, entry, where, loader)
    return messages


def _corpus_locations(args):
    """``{corpus name: "in <config>, line N"}`` for the corpora of the ``data:`` of the config files in ``args``."""
    where = {}
    for path in _config_paths(args):
        root = _composed(path)
        for key, value in root.value if isinstance(root, yaml.MappingNode) else ():
            if key.value == "data" and isinstance(value, yaml.MappingNode):
                for name, _ in value.value:
                    where.setdefault(name.value, f"in {path}, line {name.start_mark.line + 1}")
    return where


def _steps_problems(opt):
    """Lists of values that must match their ``*_steps`` (stock asserts, naming the wrong option for -dropout)."""
    problems = []
    for name, steps in (("dropout", "dropout_steps"), ("attention_dropout", "dropout_steps"),
                        ("accum_count", "accum_steps")):
        values, at = _values(opt, name), _values(opt, steps)
        if hasattr(opt, name) and hasattr(opt, steps) and len(values) != len(at):
            problems.append(f"-{name} has {len(values)} value{'s' * (len(values) != 1)} but -{steps} has {len(at)} "
                            f"({' '.join(map(str, at))}): give one -{name} value per -{steps} value (-{name} value "
                            f"k applies from step -{steps}[k])")
    if getattr(opt, "update_vocab", False):
        if not getattr(opt, "train_from", None):
            problems.append("-update_vocab needs -train_from (it updates the vocabularies of the checkpoint trained "
                            "from)")
        elif getattr(opt, "reset_optim", "none") not in ("states", "all"):
            problems.append(f"-update_vocab needs -reset_optim states or all (got {opt.reset_optim}): the optimizer's "
                            "state does not fit the new vocabularies")
    return problems


def _data_of(opt):
    """``opt.data`` read (YAML text until OpenNMT-py validates it), or None where it is no YAML (the data check of
    onmt_ext.runtime.corpus names that)."""
    try:
        return yaml.safe_load(opt.data) if isinstance(getattr(opt, "data", None), str) else getattr(opt, "data", None)
    except yaml.YAMLError:
        return None


def _data_problems(opt, argv):
    """``-data`` of onmt_train: a corpus with path_src but no path_tgt for a seq2seq model (stock trains a language
    model on the source, ``data_task lm``, without a word), and no training corpus with a weight above 0."""
    data = _data_of(opt)
    corpora = corpora_of(data)
    if data is None and isinstance(getattr(opt, "data", None), str):
        return data_problems(opt.data)[:1]  # (not YAML)
    if not isinstance(data, dict) or any(not isinstance(entry, dict) or weight_problem(entry.get("weight"))
                                         for entry in corpora.values()):
        return []  # (corpus_key_messages and command_line_data_messages name those)
    data_where = _where_set("data", argv, _config_locations(argv))
    where = _corpus_locations(argv) if data_where != "on the command line" else {}
    problems = []
    if getattr(opt, "model_task", "seq2seq") == "seq2seq":
        for name, entry in corpora.items():
            if entry.get("path_src") and not entry.get("path_tgt"):
                problems.append(
                    f"corpus {name!r} of data {where.get(name, 'on the command line')}: path_src without path_tgt: "
                    f"OpenNMT-py would train this -model_task seq2seq model (-encoder_type "
                    f"{getattr(opt, 'encoder_type', '?')}) as a language model on the source alone: give path_tgt")
    if not any(name != "valid" and corpus_weight(entry, name) > 0
               for name, entry in corpora.items()):
        problems.append(no_training_corpus_message(corpora, f" {data_where}"))
    return problems


def training_option_problems(opt, argv):
    """Messages for onmt_train options that stock OpenNMT-py 3.5.1 takes and then ignores, loops on or asserts on
    (empty: none): a negative ``-train_steps`` (no end),
    ``-save_checkpoint_steps`` below 0 (saves every k steps), lists that do not match their steps, ``-update_vocab``
    without ``-train_from`` (:func:`_steps_problems`) and ``-data``'s corpora (:func:`_data_problems`)."""
    if not hasattr(opt, "train_steps"):
        return []
    problems = []
    if isinstance(opt.train_steps, int) and opt.train_steps < 0:
        problems.append(f"-train_steps {opt.train_steps}: must be >= 1 (or 0: no end); OpenNMT-py would train "
                        "for ever")
    save_steps = getattr(opt, "save_checkpoint_steps", 0)
    if isinstance(save_steps, int) and save_steps < 0:
        problems.append(f"-save_checkpoint_steps {save_steps}: must be >= 1, or 0 to save at the end only; "
                        f"OpenNMT-py would save every {-save_steps} step{'s' * (save_steps != -1)}")
    return problems + _steps_problems(opt) + _data_problems(opt, argv)


def training_option_notes(opt, argv):
    """Lines to say of onmt_train options that stock takes on purpose or leaves unused without harm (a shared
    config's leftovers): ``-train_steps 0`` (no end), ``-keep_checkpoint 0`` (no checkpoint),
    ``-tensorboard_log_dir`` without ``-tensorboard`` and ``-early_stopping`` without a ``valid`` corpus."""
    if not hasattr(opt, "train_steps"):
        return []
    notes = []
    if opt.train_steps == 0:
        notes.append("-train_steps 0: the run has no end; stop it with Ctrl-C, or let -early_stopping end it")
    if getattr(opt, "keep_checkpoint", -1) == 0:
        notes.append("-keep_checkpoint 0: this run saves no checkpoint (-1 keeps them all)")
    given = set(_config_locations(argv)) | _command_line_names(argv)
    if "tensorboard_log_dir" in given and not getattr(opt, "tensorboard", False):
        notes.append("-tensorboard_log_dir has no effect without -tensorboard")
    corpora = corpora_of(_data_of(opt))
    if getattr(opt, "early_stopping", 0) > 0 and corpora and "valid" not in corpora:
        notes.append(f"-early_stopping {opt.early_stopping} has no effect without a 'valid' corpus in -data (it "
                     "counts validations that do not improve)")
    return notes


#: Transform options that onmt_build_vocab -learn_subwords reads itself: it learns a -src_subword_type model at
#: -src_subword_model, whatever the transforms.
_READ_BY_LEARN_SUBWORDS = ("src_subword_type", "src_subword_model")


@functools.lru_cache(maxsize=4)
def _options_of_transforms(transforms):
    """``{option: ([transform, ...], default)}`` of the options that the ``(name, class)`` pairs ``transforms`` add."""
    owners = {}
    for name, _ in sorted(transforms):
        for dest, default in transform_defaults(name).items():
            owners.setdefault(dest, ([], default))[0].append(name)
    return owners


def _transforms_used(opt):
    """The transforms a run of onmt_train or onmt_build_vocab applies: ``-transforms`` and each corpus's
    ``transforms`` (None where one of those is no list: the checks name it)."""
    used = set(_values(opt, "transforms"))
    for entry in corpora_of(getattr(opt, "data", None)).values():
        names = entry.get("transforms") if isinstance(entry, dict) else None
        if names is not None and not isinstance(names, list):
            return None
        used.update(map(str, names or ()))
    return used


def transform_option_notes(opt, argv):
    """``-src_seq_length (in c.yaml, line 7) is an option of the filtertoolong transform, which this run does not
    use; it is ignored`` for each transform option that the user set (``argv`` or its config files) to a value
    other than its default, when the run (onmt_train, onmt_build_vocab: those with ``-data``) applies none of the
    transforms that read it.  A shared config carries options for transforms a run does not use: a note, not an
    error.  onmt_translate is left out: without ``-transforms`` it takes the checkpoint's transforms."""
    from onmt.transforms import AVAILABLE_TRANSFORMS

    used = _transforms_used(opt) if hasattr(opt, "data") else None
    if used is None:
        return []
    key_lines = _config_locations(argv)
    given = set(key_lines) | _command_line_names(argv)
    exempt = _READ_BY_LEARN_SUBWORDS if getattr(opt, "learn_subwords", False) else ()
    notes = []
    for name, (owners, default) in sorted(_options_of_transforms(tuple(AVAILABLE_TRANSFORMS.items())).items()):
        if name not in given or used.intersection(owners) or name in exempt or getattr(opt, name, default) == default:
            continue
        of = (f"the {owners[0]} transform, which this run does not use" if len(owners) == 1 else
              f"the {', '.join(owners[:-1])} and {owners[-1]} transforms, none of which this run uses")
        notes.append(f"-{name} ({_where_set(name, argv, key_lines)}) is an option of {of}; it is ignored")
    return notes


_NOTED = set()


def _say_notes(parser, opt, argv):
    """Each of :func:`training_option_notes` and :func:`transform_option_notes` on stderr, once per process (a tool
    may parse several times)."""
    for note in training_option_notes(opt, argv) + transform_option_notes(opt, argv):
        if note not in _NOTED:
            _NOTED.add(note)
            sys.stderr.write(f"{parser.prog}: note: {note}\n")


def _flag_value_messages(parser, argv, unknown):
    """``(messages, leftovers)``: each value written after a switch that takes none (``-position_encoding false``),
    named with the switch; ``leftovers`` is ``unknown`` without those values (argparse leaves them over)."""
    messages, unknown = [], list(unknown)
    for flag, value in zip(argv, argv[1:]):
        action = parser._option_string_actions.get(flag)
        if action is None or action.nargs != 0 or value.startswith("-") or value not in unknown:
            continue
        unknown.remove(value)
        messages.append(_switch_value_message(parser, flag, repr(value)))
    return messages, unknown


def _switch_value_message(parser, flag, value):
    """``-x takes no value (got 'v'): ...`` for ``flag``, a switch of ``parser`` (no arguments) written with
    ``value`` (as shown: quoted); a ``store_true`` switch is told how it turns on, and that it cannot turn off."""
    action = parser._option_string_actions.get(flag)
    if action is not None and action.const is True and action.default is False:  # store_true
        how = (f"write {flag} alone to turn it on; it is off unless given, and the command line cannot turn "
               f"off a '{flag.lstrip('-')}: true' of a config: edit the config")
    else:
        how = f"write {flag} alone"
    return f"{flag} takes no value (got {value}): {how}"


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
                           "max_length", "batch_size", "valid_batch_size")

#: Stock model sizes with -1 as their default, "not given": OpenNMT-py applies one only when it is above 0 (to both
#: sides' sizes), so 0 or a value below -1 is silently ignored and the sides' own sizes or defaults train.
_UNSET_OR_POSITIVE_STOCK_OPTIONS = ("hidden_size", "word_vec_size", "layers")
#: Stock model sizes that model building divides by or allocates with, and fails on deep inside when below 1;
#: each with the option that replaces it when that is above 0 (stock's ``update_model_opts``), or None.
_POSITIVE_SIZE_STOCK_OPTIONS = {"heads": None, "transformer_ff": None, "enc_hid_size": "hidden_size",
                                "dec_hid_size": "hidden_size", "src_word_vec_size": "word_vec_size",
                                "tgt_word_vec_size": "word_vec_size"}


#: Stock probabilities (every element, for a list such as ``dropout``) that must be in [0, 1): torch refuses values
#: outside [0, 1] with a traceback, and 1 drops every unit (dropout) or every target word (label_smoothing).
_PROBABILITY_STOCK_OPTIONS = ("dropout", "attention_dropout", "label_smoothing")
#: ``-decay_method`` values whose schedule divides by ``-warmup_steps`` (``warmup_steps ** -1.5``); rsqrt takes
#: ``max(step, warmup_steps)`` and none ignores it, so they take any value.
_WARMUP_DECAY_METHODS = ("noam", "noamwd")


def _values(opt, name):
    """``opt.<name>`` as a list (empty when ``opt`` has no such option or it is None)."""
    value = getattr(opt, name, None)
    return list(value) if isinstance(value, (list, tuple)) else [] if value is None else [value]


def _rank_problems(opt):
    """``onmt_train -world_size N`` (N > 1) with no ``-gpu_ranks``: stock spawns one process per ``-gpu_ranks``
    entry, so none, and exits 0 without training, on GPUs as on CPUs.  ``onmt_translate -world_size N`` spawns N
    ranks on this node, rank k reading ``-gpu_ranks``' entry k: with fewer entries a rank fails inside stock's own
    error handler, and the others wait for it."""
    world_size = getattr(opt, "world_size", 1)
    if not isinstance(world_size, int) or world_size <= 1:
        return []
    if not hasattr(opt, "train_steps"):
        ranks = list(getattr(opt, "gpu_ranks", None) or [])
        if "gpu_ranks" not in vars(opt) or len(ranks) >= world_size:
            return []
        return [f"-world_size {world_size} needs one -gpu_ranks entry per rank in onmt_translate, which runs them "
                f"all on this node (got {len(ranks)}): -gpu_ranks {' '.join(map(str, range(world_size)))}"]
    if opt.gpu_ranks:
        return []
    return [f"-world_size {world_size} needs -gpu_ranks (without them no process trains): give this node's "
            f"ranks, -gpu_ranks {' '.join(map(str, range(world_size)))} on one node (docs/scale-out.md), or drop "
            "-world_size to train in one process"]


def model_size_problems(opt):
    """Stock model sizes out of range (empty: none): each of :data:`_UNSET_OR_POSITIVE_STOCK_OPTIONS` -1 or at least
    1, and each of :data:`_POSITIVE_SIZE_STOCK_OPTIONS` at least 1 unless the option that replaces it is given."""
    problems = []
    for name, replaced_by in _POSITIVE_SIZE_STOCK_OPTIONS.items():
        value = getattr(opt, name, None)
        if isinstance(value, int) and value < 1 and not getattr(opt, replaced_by or "", -1) > 0:
            problems.append(f"-{name} {value}: must be >= 1")
    for name in _UNSET_OR_POSITIVE_STOCK_OPTIONS:
        value = getattr(opt, name, None)
        if isinstance(value, int) and value != -1 and value < 1:
            problems.append(f"-{name} {value}: must be >= 1, or -1 (its default) to keep the encoder's and "
                            "decoder's own values; OpenNMT-py would ignore it")
    return problems


def stock_option_problems(opt):
    """Messages for stock options that OpenNMT-py 3.5.1 would accept and then crash on (empty: none).

    The model sizes of :func:`model_size_problems`; each of
    :data:`_POSITIVE_STOCK_OPTIONS` that ``opt`` has must be at least 1 (every
    element, for a list such as ``accum_count``); and ``-n_best`` cannot
    exceed ``-beam_size``: beam search keeps only ``beam_size`` finished
    hypotheses per sentence; nor ``-min_length`` ``-max_length``, and
    ``onmt_build_vocab -n_sample`` other than -1 or above 1 asserts.  Each of :data:`_PROBABILITY_STOCK_OPTIONS` must be
    in [0, 1); ``-learning_rate`` cannot be negative (torch's optimizers refuse
    it); ``-warmup_steps`` must be at least 1 with a ``-decay_method`` of
    :data:`_WARMUP_DECAY_METHODS` (a division by zero at the first step);
    ``onmt_train -world_size`` above 1 needs ``-gpu_ranks`` (:func:`_rank_problems`).
    """
    problems = model_size_problems(opt)
    for name in _POSITIVE_STOCK_OPTIONS:
        values = _values(opt, name)
        if any(item < 1 for item in values):
            problems.append(f"-{name} {' '.join(map(str, values))}: must be >= 1")
    n_best, beam_size = getattr(opt, "n_best", None), getattr(opt, "beam_size", None)
    if n_best is not None and beam_size is not None and 1 <= beam_size < n_best:
        problems.append(f"-n_best {n_best}: must be <= -beam_size ({beam_size})")
    min_length, max_length = getattr(opt, "min_length", None), getattr(opt, "max_length", None)
    if isinstance(min_length, int) and isinstance(max_length, int) and 1 <= max_length < min_length:
        problems.append(f"-min_length {min_length}: must be <= -max_length ({max_length})")
    n_sample = getattr(opt, "n_sample", None)
    if isinstance(n_sample, int) and n_sample != -1 and n_sample < 2 and not hasattr(opt, "train_steps"):
        problems.append(f"-n_sample {n_sample}: give -1 to read every line, or a number of lines above 1 "
                        "(onmt_build_vocab asserts)")
    for name in _PROBABILITY_STOCK_OPTIONS:
        values = _values(opt, name)
        if any(not 0 <= item < 1 for item in values):
            problems.append(f"-{name} {' '.join(map(str, values))}: must be >= 0 and < 1 (each value)")
    if any(item < 0 for item in _values(opt, "learning_rate")):
        problems.append(f"-learning_rate {opt.learning_rate}: must be >= 0")
    decay_method = getattr(opt, "decay_method", None)
    if decay_method in _WARMUP_DECAY_METHODS and any(item < 1 for item in _values(opt, "warmup_steps")):
        problems.append(f"-warmup_steps {opt.warmup_steps}: must be >= 1 with -decay_method {decay_method} "
                        "(its schedule divides by it)")
    return problems + _rank_problems(opt)


def environment_problems():
    """Messages for onmt-ext's environment variables with a value they cannot take (empty: none)."""
    from onmt_ext import patches
    from onmt_ext.mechanisms import routing

    problems = []
    for choice, default, doc in ((routing.kernel_choice, "auto", "docs/kernels.md"),
                                 (patches.runtime_choice, "ext", "docs/troubleshooting.md")):
        try:
            choice()
        except ValueError as error:
            problems.append(f"{error}; unset it ({default}) or set one of those ({doc})")
    return problems


#: Set on a parser that parses strictly: a command's own, or one that :func:`strict` marked.
_STRICT = "_onmt_ext_strict"


def strict(parser):
    """Make ``parser`` parse strictly, as the commands do (for onmt-ext's own helpers); returns it."""
    setattr(parser, _STRICT, True)
    return parser


def _parses_strictly(parser, args):
    """Strict: a parser that :func:`strict` marked, or an OpenNMT-py command parsing its own command line."""
    if args is None and in_command():
        strict(parser)
    return getattr(parser, _STRICT, False)


#: Keys that only a training config sets: onmt_translate given such a config says so once, not per key
_TRAINING_ONLY_KEYS = ("data", "save_model", "train_steps")


def training_config_messages(leftovers, names, argv):
    """One line when a command that trains nothing (onmt_translate: no ``data`` among its ``names``) was given a
    training config, whose every training key would otherwise be an unknown option of its own line."""
    if "data" in names:
        return []
    keys = [key for key in (item.lstrip("-").split("=", 1)[0] for item in leftovers) if key in _TRAINING_ONLY_KEYS]
    configs = _config_paths(argv)
    if not keys or not configs:
        return []
    return [f"-config {configs[0]} is a training config (it sets {', '.join(dict.fromkeys(keys))}): this command "
            "takes its own options (-model, -src, -output, the search); give them on the command line or in a "
            "config of their own"]


def _strict_parse_known_args(stock, self, args=None, namespace=None, **kwargs):
    if not _parses_strictly(self, args):
        return stock(self, args, namespace, **kwargs)
    # Abbreviations make a misspelled YAML key or option silently set another option.
    self.allow_abbrev = False
    argv = list(sys.argv[1:] if args is None else args)
    problems = [m for path in _config_paths(argv) for m in duplicate_key_messages(path) + empty_value_messages(path)]
    problems += list_value_messages(self, argv)
    if args is None:  # the command's own command line (a helper's override list may repeat on purpose)
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
    problems, leftovers = _flag_value_messages(self, argv, unknown)
    problems += training_config_messages(leftovers, names, argv) or \
        unknown_option_messages(leftovers, names, argv) + _misspelt_dashes(self, leftovers)
    if "data" in names:  # onmt_train / onmt_build_vocab
        problems += [m for path in _config_paths(argv) for m in corpus_key_messages(path)]
        if "data" in _command_line_names(argv):
            problems += command_line_data_messages(opt.data)
    if argv:
        problems += stock_option_problems(opt) + training_option_problems(opt, argv) + environment_problems()
    if hasattr(opt, "encoder_type") and argv:  # (onmt-ext's checks read the sizes: not with sizes out of range)
        problems += ([] if model_size_problems(opt) else check_options(opt)) + save_format_problems(opt)
    if problems:
        self.exit(2, "".join(f"{self.prog}: error: {p}\n" for p in problems))
    if args is None:
        _say_notes(self, opt, argv)
    return opt, [u for u in unknown if u.lstrip("-").split("=", 1)[0] in names]


def _no_abbreviations_when_strict(stock, self, option_string):
    """argparse (3.11) expands ``-beam`` to ``-beam_size`` even with ``allow_abbrev=False``; a strict parse takes
    no abbreviation (every other parser: stock)."""
    return [] if getattr(self, _STRICT, False) else stock(self, option_string)


def make_parsing_strict():
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
