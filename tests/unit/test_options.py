"""onmt-ext's option registry: parser, checks, checkpoint defaults, typed config.

The foundation declares no mechanism options yet, so each test registers a
throw-away spec (as a mechanism module does at import time) and removes it.
"""

import argparse
import dataclasses
import subprocess
import sys
from dataclasses import dataclass
from typing import List

import pytest

import support
from onmt_ext import options
from onmt_ext.options import EXT_TYPE, ExtConfig, OptionError, OptionSpec


def _layer_check(value, opt):
    bad = [i for i in value if not 0 <= i < opt.enc_layers]
    return f"layer indices {bad} outside 0..{opt.enc_layers - 1}" if bad else None


def _no_two(opt):
    if getattr(opt, "toy_iters", 0) > 5 and getattr(opt, "toy_layers", []):
        return ["-toy_iters above 5 cannot be combined with -toy_layers"]
    return []


SPECS = [
    OptionSpec("toy_iters", int, 0, "toy mechanism iterations (0: off)", side="encoder",
               check=lambda v, opt: None if v >= 0 else "must be >= 0"),
    OptionSpec("toy_layers", int, [], "toy mechanism layers", side="encoder", nargs="*", check=_layer_check),
    OptionSpec("toy_mode", str, "off", "toy mode", side="decoder", choices=("off", "a", "b")),
    OptionSpec("toy_flag", bool, False, "toy boolean", side="model"),
]


@pytest.fixture
def toy_options(monkeypatch, onmt_active):
    monkeypatch.setattr(options, "OPTION_SPECS", list(options.OPTION_SPECS))
    monkeypatch.setattr(options, "COMBINATION_CHECKS", list(options.COMBINATION_CHECKS))
    monkeypatch.setattr(options, "MECHANISM_CONFIGS", list(options.MECHANISM_CONFIGS))
    options.register_options(SPECS, combination_check=_no_two)
    return SPECS


def _toy_mechanism():
    """A mechanism's typed options class, declared as the mechanism modules declare theirs."""

    @options.register_mechanism("toy2_")
    @dataclass(frozen=True)
    class Toy:
        on: bool = options.option(False, "toy switch", side="encoder", name="toy2")
        layers: List[int] = options.option([], "toy layers", side="decoder", check=_layer_check)
        mode: str = options.option("off", "toy mode", choices=("off", "a"))

    return Toy


def test_a_typed_options_class_declares_its_options(toy_options):
    toy = _toy_mechanism()
    specs = {spec.name: spec for spec in options.OPTION_SPECS}
    assert [spec.name for spec in toy.specs] == ["toy2", "toy2_layers", "toy2_mode"]
    assert (specs["toy2"].type, specs["toy2"].default, specs["toy2"].side, specs["toy2"].nargs) == (
        bool, False, "encoder", None)
    assert (specs["toy2_layers"].type, specs["toy2_layers"].default, specs["toy2_layers"].nargs) == (int, [], "*")
    assert specs["toy2_layers"].check is _layer_check and specs["toy2_mode"].choices == ("off", "a")
    opt = _opt(toy2=True, toy2_layers=[1], toy2_mode="a", enc_hid_size=8, heads=2, transformer_ff=16,
               dec_layers=1, dropout=[0.1], attention_dropout=[0.1])
    typed = ExtConfig.from_opt(opt).of(toy)
    assert isinstance(typed, toy) and (typed.on, typed.layers, typed.mode) == (True, [1], "a")
    with pytest.raises(AttributeError):
        typed.mdoe  # a misspelt option is an attribute error at its first use, not a silent default
    with pytest.raises(dataclasses.FrozenInstanceError):
        typed.mode = "off"


SMOKE = "yaml_configs/smoke/foundation/ext_transformer.yaml"


def test_options_reach_the_train_parser_with_defaults(toy_options, sample_data):
    opt = support.load_train_opts(SMOKE)
    assert (opt.toy_iters, opt.toy_layers, opt.toy_mode, opt.toy_flag) == (0, [], "off", False)
    opt = support.load_train_opts(SMOKE, "-toy_iters", "3", "-toy_layers", "0", "1", "-toy_mode", "b",
                                  "-toy_flag", "true")
    assert (opt.toy_iters, opt.toy_layers, opt.toy_mode, opt.toy_flag) == (3, [0, 1], "b", True)
    config = ExtConfig.from_opt(opt)
    assert config.encoder_ext and config.decoder_ext
    assert (config.d_model, config.heads, config.enc_layers) == (opt.enc_hid_size, opt.heads, opt.enc_layers)


def _opt(**kw):
    base = dict(encoder_type=EXT_TYPE, decoder_type=EXT_TYPE, enc_layers=2, toy_iters=0, toy_layers=[],
                toy_mode="off", toy_flag=False)
    base.update(kw)
    return argparse.Namespace(**base)


def test_value_checks_name_the_option(toy_options):
    assert options.check_options(_opt()) == []
    assert options.check_options(_opt(toy_iters=-1)) == ["-toy_iters -1: must be >= 0"]
    assert options.check_options(_opt(toy_layers=[0, 5])) == ["-toy_layers [0, 5]: layer indices [5] outside 0..1"]


def test_option_on_a_stock_side_is_rejected_not_ignored(toy_options):
    problems = options.check_options(_opt(encoder_type="transformer", toy_iters=2))
    assert problems == [
        "-toy_iters 2 has no effect with -encoder_type 'transformer'; set -encoder_type ext_transformer"
    ]
    # the decoder-side option is fine with a stock encoder
    assert options.check_options(_opt(encoder_type="transformer", toy_mode="a")) == []


def test_combination_check(toy_options):
    assert options.check_options(_opt(toy_iters=6, toy_layers=[1])) == [
        "-toy_iters above 5 cannot be combined with -toy_layers"
    ]
    with pytest.raises(OptionError, match="cannot be combined"):
        options.validate(_opt(toy_iters=6, toy_layers=[1]))


def test_cli_reports_invalid_values_cleanly(toy_options, sample_data, capsys):
    parser = support.train_parser()
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_known_args(["-config", str(support.REPO / SMOKE), "-toy_layers", "7"])
    assert exit_info.value.code == 2
    assert "error: -toy_layers [7]: layer indices [7] outside 0..1" in capsys.readouterr().err


def test_bad_choice_is_an_argparse_error(toy_options, sample_data, capsys):
    with pytest.raises(SystemExit):
        support.train_parser().parse_known_args(["-config", str(support.REPO / SMOKE), "-toy_mode", "c"])
    assert "invalid choice: 'c'" in capsys.readouterr().err


def test_older_checkpoint_gets_defaults(toy_options):
    from onmt.utils.parse import ArgumentParser

    old = argparse.Namespace(encoder_type="transformer", enc_layers=6)
    restored = ArgumentParser.ckpt_model_opts(old)
    assert (restored.toy_iters, restored.toy_mode) == (0, "off")
    assert restored.enc_layers == 6


def test_checkpoint_with_invalid_options_fails_on_load(toy_options, sample_data):
    from onmt.utils.parse import ArgumentParser

    opt = support.load_train_opts(SMOKE)
    opt.toy_layers = [9]
    with pytest.raises(OptionError, match="-toy_layers"):
        ArgumentParser.validate_model_opts(opt)


@pytest.mark.parametrize("kw, problems", [
    (dict(heads=0, hidden_size=32), ["-heads 0: must be >= 1"]),
    (dict(heads=-2, hidden_size=32, encoder_type="transformer"), ["-heads -2: must be >= 1"]),
    (dict(heads=5, hidden_size=-1, enc_hid_size=30, dec_hid_size=32),
     ["-heads 5: must divide -dec_hid_size 32 (each head gets dec_hid_size / heads dimensions)"]),
    (dict(heads=3, hidden_size=32, encoder_type="transformer", decoder_type="transformer"), []),  # stock: not ours
    (dict(heads=4, hidden_size=32), []),
])
def test_heads_are_checked_for_the_ext_transformer(toy_options, kw, problems):
    assert options.check_options(_opt(**kw)) == problems


def test_values_outside_the_choices_are_problems_not_only_argparse_errors(toy_options):
    assert options.check_options(_opt(toy_mode="c")) == ["-toy_mode 'c': not one of off, a, b"]


def test_a_checkpoint_with_an_unknown_option_value_is_refused_by_name(onmt_active):
    from onmt_ext.integration.checkpoints import checkpoint_problems

    opt = argparse.Namespace(encoder_type=EXT_TYPE, decoder_type=EXT_TYPE, li2019_enc_self="em2",
                             chen2019_pe_off=["enc", "both"], onmt_ext_version="9.0.0")
    assert checkpoint_problems("future.pt", {"opt": opt}) == [
        "checkpoint future.pt was written by onmt-ext 9.0.0 with option values this onmt-ext "
        f"({__import__('onmt_ext').__version__}) does not know: -li2019_enc_self 'em2': not one of concat, simple, "
        "em; -chen2019_pe_off ['enc', 'both']: not one of enc, dec; load it with the onmt-ext version that wrote it"]
    opt.li2019_enc_self, opt.chen2019_pe_off = "em", ["enc"]
    assert checkpoint_problems("known.pt", {"opt": opt}) == []


def _option_order_after_importing(first):
    code = (f"import onmt_ext.mechanisms.{first}, onmt_ext.integration.transformer\n"
            "from onmt_ext import options\n"
            "print(' '.join(spec.name for spec in options.OPTION_SPECS))\n"
            "print(' '.join(check.__module__ for check in options.COMBINATION_CHECKS))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return done.stdout


def test_the_options_order_does_not_depend_on_which_mechanism_is_imported_first():
    """CI's workers import the mechanisms in different orders; messages listing several options must not."""
    orders = {first: _option_order_after_importing(first) for first in ("chen2019", "li2019", "gret")}
    assert len(set(orders.values())) == 1, orders
    names = orders["li2019"].split("\n")[0].split()
    assert names[0].startswith("li2019_") and names[-5:] == ["ext_compile", "ext_compile_layers", "ext_binarized",
                                                             "ext_binarized_cache", "ext_half_weights"]


def test_duplicate_declaration_is_refused(toy_options):
    with pytest.raises(ValueError, match="declared twice"):
        options.register_options([OptionSpec("toy_iters", int, 0, "again")])


def test_mechanisms_that_replace_the_same_softmax_are_refused_once_per_extra_mechanism():
    from onmt_ext.options import softmax_replacer_problems

    opt = argparse.Namespace(clause_attention=True, disan_enc=True, cao2019_vertical=False, cao2019_horizontal=True)
    assert softmax_replacer_problems(opt) == [
        "-clause_attention cannot be combined with -disan_enc: both replace the softmax of the encoder self-attention",
        "-clause_attention cannot be combined with cao2019's cross aggregation: both replace the softmax of the "
        "encoder self-attention"]
    assert softmax_replacer_problems(argparse.Namespace(cao2019_vertical=True, cao2019_horizontal=True)) == []
