"""Registration of onmt-ext inside the stock OpenNMT-py commands.

:func:`activate` is called once by the start-up hook (:mod:`onmt_ext._autoload`)
right after ``onmt`` has been imported.  It

1. registers ``ext_transformer`` in OpenNMT-py's encoder and decoder
   registries (``register_encoder``/``register_decoder``);
2. adds onmt-ext's options to ``onmt.opts.model_opts``, so ``onmt_train``
   accepts them from YAML and the command line, the checkpoint stores them,
   and ``onmt_translate`` restores them (with defaults for older checkpoints);
3. makes option parsing strict: an unknown or misspelled key (YAML or command
   line) stops ``onmt_train``/``onmt_build_vocab``/``onmt_translate`` with a
   message naming it, where it was written, and the closest valid key; invalid
   values or combinations of onmt-ext options stop the run the same way;
4. runs onmt-ext's option checks wherever OpenNMT-py validates model options
   (training, and loading a checkpoint for translation).

Everything is idempotent.  ``ONMT_EXT_DISABLE=1`` prevents all of it.
"""

import difflib
import sys

_active = False


def _register_models():
    from onmt.decoders import register_decoder, str2dec
    from onmt.encoders import register_encoder, str2enc

    from onmt_ext.options import EXT_TYPE
    from onmt_ext.transformer import ExtTransformerDecoder, ExtTransformerEncoder

    if EXT_TYPE not in str2enc:
        register_encoder(EXT_TYPE)(ExtTransformerEncoder)
    if EXT_TYPE not in str2dec:
        register_decoder(EXT_TYPE)(ExtTransformerDecoder)


def _extend_model_options():
    import onmt.opts

    from onmt_ext.options import add_model_options

    stock = onmt.opts.model_opts
    if getattr(stock, "_onmt_ext", False):
        return

    def model_opts(parser):
        stock(parser)
        add_model_options(parser)

    model_opts.__doc__ = stock.__doc__
    model_opts._onmt_ext = True
    onmt.opts.model_opts = model_opts


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


def _config_paths(args):
    """Config files named on the command line (``-config``/``--config``)."""
    paths = []
    for i, arg in enumerate(args):
        if arg in ("-config", "--config") and i + 1 < len(args):
            paths.append(args[i + 1])
        elif arg.startswith(("-config=", "--config=")):
            paths.append(arg.split("=", 1)[1])
    return paths


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
    key_lines = {}
    for path in _config_paths(args):
        for key, line in _config_key_lines(path).items():
            key_lines.setdefault(key, (path, line))
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
        where = "on the command line"
        if name in key_lines and not any(a.lstrip("-").split("=", 1)[0] == name for a in args):
            path, line = key_lines[name]
            where = f"in {path}, line {line}"
        close = difflib.get_close_matches(name, sorted(valid_names), n=1, cutoff=0.6)
        hint = f"; did you mean '{close[0]}'?" if close else ""
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


def _strict_parse_known_args(stock):
    def parse_known_args(self, args=None, namespace=None, **kwargs):
        # Abbreviations make a misspelled YAML key silently set another option.
        self.allow_abbrev = False
        argv = list(sys.argv[1:] if args is None else args)
        opt, unknown = stock(self, args, namespace, **kwargs)
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

    parse_known_args._onmt_ext = True
    return parse_known_args


def _make_parsing_strict():
    from onmt.utils.parse import ArgumentParser

    if getattr(ArgumentParser.parse_known_args, "_onmt_ext", False):
        return
    ArgumentParser.parse_known_args = _strict_parse_known_args(ArgumentParser.parse_known_args)


def _check_on_model_validation():
    from onmt.utils.parse import ArgumentParser

    stock = ArgumentParser.validate_model_opts.__func__
    if getattr(stock, "_onmt_ext", False):
        return

    def validate_model_opts(cls, model_opt):
        from onmt_ext import __version__
        from onmt_ext.options import validate

        stock(cls, model_opt)
        validate(model_opt)
        setattr(model_opt, VERSION_KEY, __version__)  # saved with the checkpoint

    validate_model_opts._onmt_ext = True
    ArgumentParser.validate_model_opts = classmethod(validate_model_opts)


def _load_checkpoints_with_new_parameters():
    """Let ``-train_from`` a baseline checkpoint initialise the new tensors of mechanisms (see onmt_ext.gret)."""
    from onmt.models.model import BaseModel

    from onmt_ext.gret import load_with_new_parameters

    if not getattr(BaseModel.load_state_dict, "_onmt_ext", False):
        BaseModel.load_state_dict = load_with_new_parameters(BaseModel.load_state_dict)
        BaseModel.load_state_dict._onmt_ext = True


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


def _check_checkpoints():
    """Refuse checkpoints of an unknown onmt-ext mechanism, and turn state-dict mismatches into clear errors."""
    import onmt.model_builder as builder
    import onmt.train_single as train_single
    from onmt.models import model_saver
    from onmt.models.model import BaseModel

    stock = model_saver.load_checkpoint
    if getattr(stock, "_onmt_ext", False):
        return

    def load_checkpoint(ckpt_path):
        checkpoint = stock(ckpt_path)
        problems = checkpoint_problems(ckpt_path, checkpoint)
        if problems:
            raise SystemExit("error: " + "\n".join(problems))
        return checkpoint

    load_checkpoint._onmt_ext = True
    for module in (model_saver, builder, train_single):
        module.load_checkpoint = load_checkpoint

    stock_load = BaseModel.load_state_dict

    def load_state_dict(self, *args, **kwargs):
        try:
            return stock_load(self, *args, **kwargs)
        except (ValueError, AssertionError) as error:  # stock: missing/extra keys (ValueError), shapes (assert)
            text = str(error)
            if not (isinstance(error, AssertionError) or "missing key" in text.lower()
                    or "extra keys" in text.lower()):
                raise
            raise SystemExit(f"error: the checkpoint's tensors do not fit the model built from its options "
                             f"({text or 'a tensor has the wrong shape'}); was it written by another version of "
                             "onmt-ext or OpenNMT-py, or altered?") from None

    load_state_dict._onmt_ext = True
    BaseModel.load_state_dict = load_state_dict


def train_parser():
    """OpenNMT-py's ``onmt_train`` parser (with onmt-ext's options once active)."""
    import onmt.opts
    from onmt.utils.parse import ArgumentParser

    parser = ArgumentParser(description="train.py")
    onmt.opts.train_opts(parser)
    return parser


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


def _tell_builders_the_vocabs():
    """Wrap ``build_base_model`` so that mechanisms can read the vocabularies (clause markers' ids)."""
    import onmt.model_builder as builder

    stock = builder.build_base_model
    if getattr(stock, "_onmt_ext", False):
        return

    def build_base_model(model_opt, vocabs):
        from onmt_ext.clause_attention import building_with

        with building_with(vocabs):
            return stock(model_opt, vocabs)

    build_base_model._onmt_ext = True
    builder.build_base_model = build_base_model


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


def _check_translation_split():
    """Refuse to translate with clause attention unless the source is split as in training."""
    import onmt.model_builder as builder

    stock = builder.load_test_model
    if getattr(stock, "_onmt_ext", False):
        return

    def load_test_model(opt, device_id=0, model_path=None):
        vocabs, model, model_opt = stock(opt, device_id, model_path)
        problems = translation_split_problems(opt, model_opt)
        if problems:
            raise SystemExit("".join(f"onmt_translate: error: {p}\n" for p in problems).rstrip("\n"))
        return vocabs, model, model_opt

    load_test_model._onmt_ext = True
    builder.load_test_model = load_test_model


def _register_transforms():
    """Add onmt-ext's data transforms (``clause_split``) to OpenNMT-py's registry."""
    import onmt_ext.clause_split  # noqa: F401  (registers on import)


def activate():
    """Register onmt-ext with the already-imported ``onmt`` package (idempotent)."""
    global _active
    if _active:
        return
    from onmt_ext import compat, corpus

    compat.apply()
    compat.keep_log_file()
    compat.atomic_checkpoints()
    compat.resume_data_position()
    compat.count_filtered_examples()
    compat.explain_position_limit()
    corpus.install()
    _register_models()
    _extend_model_options()
    _make_parsing_strict()
    _check_on_model_validation()
    _load_checkpoints_with_new_parameters()
    _check_checkpoints()
    _register_transforms()
    _tell_builders_the_vocabs()
    _check_translation_split()
    _active = True


def is_active():
    """True once :func:`activate` has run in this process."""
    return _active
