"""onmt-ext's model options, their checks, and the typed config built from them.

Each mechanism declares its options once, as a frozen dataclass of :func:`option` fields beside its code, and
:func:`register_mechanism` turns every field into an :class:`OptionSpec` in one list, from which the parser, the
checks, the checkpoint defaults and the docs come.  :func:`add_model_options` adds them to OpenNMT-py's *model*
options: YAML, command line, saved in the checkpoint with ``opt``, restored with their defaults for older
checkpoints.  :func:`check_options` returns every problem with their values or combinations as messages naming
the option.  :class:`ExtConfig` is the one typed object that ``from_opt`` builds and passes down to the modules;
``ExtConfig.of(Li2019)`` gives a mechanism its own options as attributes.
"""

import argparse
import typing
from dataclasses import dataclass, field, fields
from typing import Any, Callable, List, Optional, Tuple

#: ``encoder_type`` / ``decoder_type`` value that selects onmt-ext's Transformer.
EXT_TYPE = "ext_transformer"

GROUP_TITLE = "onmt-ext"


class OptionError(ValueError):
    """An invalid value or combination of onmt-ext options."""


@dataclass(frozen=True)
class OptionSpec:
    """Declaration of one onmt-ext model option.

    Attributes:
        name: option name without dashes (``-name`` / ``--name`` on the CLI).
        type: the Python type of one value (``int``, ``float``, ``str``, ``bool``).
        default: value meaning "mechanism off"; must give exactly vanilla
            OpenNMT-py.
        help: one-line description, with the paper's equation numbers.
        side: ``"encoder"``, ``"decoder"`` or ``"model"``: an option of a side
            only takes effect with ``-{side}_type ext_transformer``.
        choices: allowed values, if the option is an enumeration.
        nargs: ``"*"`` for list-valued options (e.g. layer indices).
        check: ``check(value, opt) -> message or None`` for value ranges that
            depend on other options (e.g. a layer index below ``enc_layers``).
    """

    name: str
    type: type
    default: Any
    help: str
    side: str = "model"
    choices: Optional[Tuple[Any, ...]] = None
    nargs: Optional[str] = None
    check: Optional[Callable[[Any, Any], Optional[str]]] = None


#: All onmt-ext options.  Mechanism modules append to it with
#: :func:`register_options` at import time (before the parser is built).
OPTION_SPECS: List[OptionSpec] = []

#: Checks over several options: ``check(opt) -> list of messages``.
COMBINATION_CHECKS: List[Callable[[Any], List[str]]] = []

#: The order of the mechanisms' options in ``-help``, checks and messages, whatever order their modules are
#: imported in (a test or tool may import any of them first); prefixes not listed follow, as registered.
MECHANISM_ORDER = ("li2019_", "clause_", "cao2019_", "disan_", "gret_", "chen2019_", "ext_layer_", "ext_")
_RANKS: dict = {}


def _rank(key):
    prefix = _RANKS.get(key)
    return MECHANISM_ORDER.index(prefix) if prefix in MECHANISM_ORDER else len(MECHANISM_ORDER)


def register_options(specs, combination_check=None, prefix=None):
    """Add a mechanism's option specs (and optional cross-option check), placed by ``prefix``'s rank."""
    known = {spec.name for spec in OPTION_SPECS}
    for spec in specs:
        if spec.name in known:
            raise ValueError(f"onmt-ext option {spec.name!r} declared twice")
        if spec.side not in ("encoder", "decoder", "model"):
            raise ValueError(f"onmt-ext option {spec.name!r}: bad side {spec.side!r}")
        OPTION_SPECS.append(spec)
        _RANKS[spec.name] = prefix
        known.add(spec.name)
    OPTION_SPECS.sort(key=lambda spec: _rank(spec.name))  # stable: a mechanism's own order is kept
    if combination_check is not None:
        COMBINATION_CHECKS.append(combination_check)
        _RANKS[combination_check] = prefix
        COMBINATION_CHECKS.sort(key=_rank)


#: The mechanisms' typed options classes (see :func:`register_mechanism`), in registration order.
MECHANISM_CONFIGS: list = []


def option(default, help, *, side="model", choices=None, check=None, name=None):
    """A field of a mechanism's options class that is also the command-line option ``-<prefix><field>``.

    ``name`` replaces the prefixed name (a mechanism's on/off switch, e.g.
    ``-gret``).  The field's annotation gives the option's type: ``bool``,
    ``int``, ``float``, ``str``, or ``List[...]`` for a list (``nargs="*"``,
    default empty).
    """
    metadata = {"help": help, "side": side, "choices": choices, "check": check, "name": name}
    if isinstance(default, list):
        return field(default_factory=list, metadata=metadata)
    return field(default=default, metadata=metadata)


def register_mechanism(prefix, combination_check=None):
    """Class decorator: a frozen dataclass of :func:`option` fields declares a mechanism's options.

    Registers one :class:`OptionSpec` per field (name ``prefix + field``),
    and makes ``ExtConfig.of(cls)`` return the class filled from ``opt``, so
    that mechanism code reads typed attributes (``config.of(Li2019).iterations``).
    ``cls.from_opt(opt)`` builds it alone (for the option checks), ``cls.spec_of[field]`` is a field's spec.
    """

    def register(cls):
        hints, specs = typing.get_type_hints(cls), []
        for item in fields(cls):
            meta, kind = item.metadata, hints[item.name]
            listed = typing.get_origin(kind) in (list, List)
            name = meta["name"] or prefix + item.name
            default = [] if listed else item.default
            specs.append(OptionSpec(name, typing.get_args(kind)[0] if listed else kind, default, meta["help"],
                                    side=meta["side"], choices=meta["choices"], nargs="*" if listed else None,
                                    check=meta["check"]))
        register_options(specs, combination_check=combination_check, prefix=prefix)
        MECHANISM_CONFIGS.append(cls)
        cls.specs = tuple(specs)  # in field order: ``zip(fields(cls), cls.specs)`` pairs each field with its option
        cls.spec_of = {item.name: spec for item, spec in zip(fields(cls), specs)}
        cls.prefix = prefix
        cls.from_opt = classmethod(_options_from_opt)
        return cls

    return register


def _options_from_opt(cls, opt):
    """A mechanism's options class filled from ``opt``; an option ``opt`` lacks (an older checkpoint) gets its
    default, the field's."""
    return cls(**{name: getattr(opt, spec.name, spec.default) for name, spec in cls.spec_of.items()})


def model_size(opt):
    """d_model as OpenNMT-py will use it (``-hidden_size`` overrides ``-enc_hid_size``)."""
    hidden = getattr(opt, "hidden_size", -1)
    return hidden if hidden and hidden > 0 else opt.enc_hid_size


def layer_count(opt, side):
    """Number of layers of ``side`` ("enc"/"dec"); ``-layers`` overrides both."""
    layers = getattr(opt, "layers", -1)
    return layers if layers and layers > 0 else getattr(opt, f"{side}_layers")


def layers_check(side):
    """``OptionSpec.check`` for a 1-based list of ``side``'s layers ("enc"/"dec")."""

    def check(value, opt):
        count = layer_count(opt, side)
        bad = [i for i in value if not 1 <= i <= count]
        return f"layers are numbered 1..{count} (-{side}_layers); got {bad}" if bad else None

    return check


def selected_layers(selected, count):
    """0-based indices of a 1-based layer-list option; empty selects all ``count`` layers."""
    return [i - 1 for i in selected] if selected else list(range(count))


def options_without_effect(opt, specs, reason):
    """``-name has no effect while <reason>`` for each of ``specs`` that ``opt`` sets away from its default."""
    return [f"-{spec.name} has no effect while {reason}" for spec in specs
            if getattr(opt, spec.name, spec.default) != spec.default]


def tensor_parallel_problems(opt, what):
    """A message when ``opt`` shards the heads over GPUs (``-parallel_mode tensor_parallel``), which ``what`` cannot do."""
    if getattr(opt, "parallel_mode", "") == "tensor_parallel" and getattr(opt, "world_size", 1) > 1:
        return [f"{what} does not support -parallel_mode tensor_parallel"]
    return []


#: the value of a tri-state option (:class:`AutoBool`) that leaves the choice to the program
AUTO = "auto"


class AutoBool:
    """Annotation of a tri-state option: :data:`AUTO` (the program decides), ``True`` or ``False``."""


def auto_bool(text):
    """A tri-state option's value: ``"auto"``, or what :func:`str2bool` reads."""
    if isinstance(text, str) and text.strip().lower() == AUTO:
        return AUTO
    try:
        return str2bool(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected auto, true or false, got {text!r}") from None


def str2bool(text):
    """A boolean option's value: true/false, yes/no, on/off or 1/0 (any case)."""
    if isinstance(text, bool):
        return text
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_model_options(parser):
    """Add the onmt-ext argument group to an OpenNMT-py (configargparse) parser.

    A boolean option takes a value (``-gret true``, ``-gret false``) or none (``-gret`` alone: true); a
    tri-state one also takes ``auto``.
    """
    group = parser.add_argument_group(
        GROUP_TITLE,
        f"Options of onmt-ext's mechanisms; they need -encoder_type/-decoder_type {EXT_TYPE}.",
    )
    for spec in OPTION_SPECS:
        kwargs = dict(default=spec.default, help=spec.help)
        kwargs["type"] = {bool: str2bool, AutoBool: auto_bool}.get(spec.type, spec.type)
        if spec.type in (bool, AutoBool) and spec.nargs is None:  # -name alone means true, as a stock flag does
            kwargs.update(nargs="?", const=True)
        if spec.choices is not None:
            kwargs["choices"] = spec.choices
        if spec.nargs is not None:
            kwargs["nargs"] = spec.nargs
        group.add(f"--{spec.name}", f"-{spec.name}", **kwargs)


def _side_size(opt, side):
    """``(option, value)`` of the model size of ``side`` ("encoder"/"decoder"): ``-hidden_size`` overrides both."""
    hidden = getattr(opt, "hidden_size", -1)
    if hidden and hidden > 0:
        return "hidden_size", hidden
    name = "enc_hid_size" if side == "encoder" else "dec_hid_size"
    return name, getattr(opt, name, None)


def head_problems(opt):
    """``-heads`` problems when a side uses onmt-ext's Transformer: ``heads >= 1`` and ``heads`` divides its size.

    OpenNMT-py checks neither; a bad value would otherwise end in a
    ZeroDivisionError or a reshape error from deep inside torch.
    """
    sides = [side for side in ("encoder", "decoder") if getattr(opt, f"{side}_type", None) == EXT_TYPE]
    heads = getattr(opt, "heads", None)
    if not sides or not isinstance(heads, int):
        return []
    if heads < 1:
        return [f"-heads {heads}: must be >= 1"]
    problems = []
    for name, size in dict.fromkeys(_side_size(opt, side) for side in sides):
        if isinstance(size, int) and size % heads:
            problems.append(f"-heads {heads}: must divide -{name} {size} (each head gets {name} / heads dimensions)")
    return problems


def choice_problems(opt):
    """``-name value: not one of ...`` for each onmt-ext option in ``opt`` whose value is not among its choices.

    argparse enforces ``choices`` on the command line and in YAML, but not on
    the options saved in a checkpoint; list-valued options are checked
    element by element.
    """
    problems = []
    for spec in OPTION_SPECS:
        value = getattr(opt, spec.name, None)
        if spec.choices is None or value is None:
            continue
        values = value if spec.nargs and isinstance(value, (list, tuple)) else [value]
        if any(item not in spec.choices for item in values):
            problems.append(f"-{spec.name} {value!r}: not one of {', '.join(map(str, spec.choices))}")
    return problems


def check_options(opt):
    """Return the list of problems with onmt-ext options in ``opt`` (empty: all fine).

    Each message names the option.  Checked: ``-heads`` when onmt-ext's
    Transformer is used (:func:`head_problems`), values outside an option's
    choices (:func:`choice_problems`; argparse does not check saved
    checkpoints), per-option value checks, options set away from their "off"
    default on a side that does not use onmt-ext's Transformer (they would be
    silently ignored), and the mechanisms' combination checks.
    """
    problems = head_problems(opt)
    bad_choices = choice_problems(opt)
    problems += bad_choices
    if bad_choices:  # the checks below may assume known values
        return problems
    for spec in OPTION_SPECS:
        if not hasattr(opt, spec.name):
            continue
        value = getattr(opt, spec.name)
        if value != spec.default and spec.side in ("encoder", "decoder"):
            side_type = getattr(opt, f"{spec.side}_type", None)
            if side_type != EXT_TYPE:
                problems.append(
                    f"-{spec.name} {value!r} has no effect with -{spec.side}_type "
                    f"{side_type!r}; set -{spec.side}_type {EXT_TYPE}"
                )
                continue
        if spec.check is not None:
            message = spec.check(value, opt)
            if message:
                problems.append(f"-{spec.name} {value!r}: {message}")
    problems.extend(softmax_replacer_problems(opt))
    for check in COMBINATION_CHECKS:
        problems.extend(check(opt))
    return problems


#: Mechanisms that replace the softmax of the encoder self-attention (their hook), so no two of them
#: combine: the name messages use, the prefix of the mechanism's options, and the fields that turn it on.
SOFTMAX_REPLACERS = (
    ("-clause_attention", "clause_", ("attention",)),
    ("-disan_enc", "disan_", ("enc",)),
    ("cao2019's cross aggregation", "cao2019_", ("vertical", "horizontal")),
)


def _switched_on(opt, prefix, switches):
    """Whether the registered mechanism of ``prefix`` has one of its boolean fields ``switches`` on in ``opt``."""
    configs = [cls.from_opt(opt) for cls in MECHANISM_CONFIGS if cls.prefix == prefix]
    return any(getattr(config, name) for config in configs for name in switches)


def softmax_replacer_problems(opt):
    """One message per extra mechanism of :data:`SOFTMAX_REPLACERS` switched on beside the first."""
    used = [name for name, prefix, switches in SOFTMAX_REPLACERS if _switched_on(opt, prefix, switches)]
    return [f"{used[0]} cannot be combined with {other}: both replace the softmax of the encoder self-attention"
            for other in used[1:]]


def validate(opt):
    """Raise :class:`OptionError` listing every problem found by :func:`check_options`."""
    problems = check_options(opt)
    if problems:
        raise OptionError("invalid onmt-ext options:\n  " + "\n  ".join(problems))


def _first(value):
    """OpenNMT-py stores dropout as a list (one value per dropout_steps phase)."""
    return value[0] if isinstance(value, (list, tuple)) else value


@dataclass(frozen=True)
class ExtConfig:
    """Typed configuration of onmt-ext's Transformer, built once from ``opt``.

    Holds the stock dimensions the mechanisms need and each mechanism's
    typed options (:meth:`of`), so that modules never read ``opt`` themselves.
    """

    d_model: int
    heads: int
    d_ff: int
    enc_layers: int
    dec_layers: int
    dropout: float
    attention_dropout: float
    encoder_ext: bool
    decoder_ext: bool
    sections: dict = field(default_factory=dict)
    position_encoding_type: str = "SinusoidalInterleaved"
    clause_levels: Optional[int] = None  # the clause_split transform's option; None: its default

    @classmethod
    def from_opt(cls, opt):
        """Validate ``opt`` (raises :class:`OptionError`) and build the config."""
        validate(opt)
        return cls(
            d_model=opt.enc_hid_size,
            heads=opt.heads,
            d_ff=opt.transformer_ff,
            enc_layers=opt.enc_layers,
            dec_layers=opt.dec_layers,
            dropout=float(_first(opt.dropout)),
            attention_dropout=float(_first(opt.attention_dropout)),
            encoder_ext=getattr(opt, "encoder_type", None) == EXT_TYPE,
            decoder_ext=getattr(opt, "decoder_type", None) == EXT_TYPE,
            sections={cls: cls.from_opt(opt) for cls in MECHANISM_CONFIGS},
            position_encoding_type=getattr(opt, "position_encoding_type", "SinusoidalInterleaved"),
            clause_levels=getattr(opt, "clause_levels", None),  # an option of the clause_split transform
        )

    def of(self, cls):
        """The options of the mechanism whose options class is ``cls`` (see :func:`register_mechanism`)."""
        return self.sections[cls]
