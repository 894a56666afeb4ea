"""The plug-in, in-process: installing the start-up hook, strict option parsing and checks, and the fixes to
OpenNMT-py and torch (checkpoints, over-long sentences, empty translations, one-line errors).

The start-up hook and registration in fresh interpreters, the log file after the data iterator starts, and the
console scripts refusing unknown options are in tests/integration/test_plugin_cli.py.
"""

import os
import sys

import pytest

import support


def test_hook_install_is_idempotent(tmp_path, monkeypatch):
    from onmt_ext import hook

    monkeypatch.setattr(hook, "pth_path", lambda: str(tmp_path / "onmt_ext.pth"))
    assert hook.install() is True
    assert hook.install() is False
    assert (tmp_path / "onmt_ext.pth").read_text() == hook.PTH_LINE
    assert hook.uninstall() is True
    assert hook.uninstall() is False


# ---------------------------------------------------------------------------
# strict options


def test_option_with_the_wrong_dashes_is_an_error_not_silently_dropped(onmt_active):
    from onmt_ext.integration.parsing import parse_train_config

    # OpenNMT-py writes this flag --override_opts or -override-opts; argparse leaves -override_opts over
    with pytest.raises(SystemExit):
        parse_train_config(support.REPO / "yaml_configs/smoke/baseline/transformer_base_wmt14_ende.yaml",
                           "-override_opts")
    import onmt.opts
    from onmt.utils.parse import ArgumentParser

    parser = ArgumentParser()
    onmt.opts.train_opts(parser)
    from onmt_ext.integration.parsing import _misspelt_dashes

    assert _misspelt_dashes(parser, ["-override_opts"]) == [
        "'-override_opts' is not an option; write --override_opts or -override-opts"]
    assert _misspelt_dashes(parser, ["--no_such_option"]) == []


def test_shared_yaml_with_train_keys_is_accepted_by_build_vocab(onmt_active):
    """One YAML for onmt_build_vocab and onmt_train (OpenNMT-py's documented practice)."""
    from onmt.opts import data_prepare_opts
    from onmt.utils.parse import ArgumentParser

    from onmt_ext.integration.parsing import strict

    parser = strict(ArgumentParser(description="build_vocab.py"))  # as onmt_build_vocab parses
    data_prepare_opts(parser, build_vocab_only=True)
    opt, _ = parser.parse_known_args(["-config", str(support.REPO / "yaml_configs/demo/tatoeba_zhen.yaml")])
    assert opt.src_vocab == "build/tatoeba/vocab.zh"


def _test_models_parser():
    """The parser of OpenNMT-py's own onmt/tests/test_models.py."""
    import onmt.opts
    from onmt.utils.parse import ArgumentParser

    parser = ArgumentParser(description="train.py")
    onmt.opts.model_opts(parser)
    onmt.opts.distributed_opts(parser)
    onmt.opts._add_train_general_opts(parser)
    return parser


def test_other_callers_of_parse_known_args_get_stock_argparse(onmt_active, monkeypatch):
    """Strictness belongs to the commands: a plain parser returns unknown options and takes abbreviations."""
    parser = _test_models_parser()
    opt, unknown = parser.parse_known_args(["-data", "dummy", "-enc_layer", "3", "-no_such_option", "x"])
    assert unknown == ["-no_such_option", "x"]
    # argparse takes -data for -data_type and -enc_layer for -enc_layers, as in stock OpenNMT-py
    assert (opt.data_type, opt.enc_layers, parser.allow_abbrev) == ("dummy", 3, True)
    monkeypatch.setattr("sys.argv", ["script.py", "-no_such_option"])  # its own command line, outside a command
    assert _test_models_parser().parse_known_args()[1] == ["-no_such_option"]


def test_only_the_commands_parse_strictly(onmt_active, monkeypatch, capsys):
    """onmt_build_vocab's main (the console script) and the module run as ``python -m`` refuse an unknown option;
    the same parse outside them returns it."""
    import types
    from importlib.machinery import ModuleSpec

    from onmt.bin import build_vocab

    argv = ["onmt_build_vocab", "-config", str(support.REPO / "yaml_configs/demo/tatoeba_zhen.yaml"), "-n_sampel", "5"]
    monkeypatch.setattr("sys.argv", argv)
    message = "onmt_build_vocab: error: unknown option 'n_sampel' on the command line; did you mean 'n_sample'?"
    with pytest.raises(SystemExit) as exit_info:
        build_vocab.main()
    assert exit_info.value.code == 2 and capsys.readouterr().err.strip() == message
    assert "-n_sampel" in build_vocab._get_parser().parse_known_args()[1]  # after main: stock again
    main = types.ModuleType("__main__")  # what runpy makes of python -m onmt.bin.build_vocab
    main.__spec__ = ModuleSpec("onmt.bin.build_vocab", None)
    monkeypatch.setitem(sys.modules, "__main__", main)
    with pytest.raises(SystemExit) as exit_info:
        build_vocab._get_parser().parse_known_args()
    assert exit_info.value.code == 2 and capsys.readouterr().err.strip() == message
    assert "-n_sampel" in build_vocab._get_parser().parse_known_args(argv[1:])[1]  # not its command line


def test_unknown_option_messages_unit():
    from onmt_ext.integration.parsing import unknown_option_messages

    messages = unknown_option_messages(["--bogus", "3", "stray"], {"bogus_x", "beam_size"}, ["--bogus", "3"])
    assert messages == [
        "unknown option 'bogus' on the command line; did you mean 'bogus_x'?",
        "unexpected value 'stray' (no option takes it)",
    ]


# ---------------------------------------------------------------------------
# torch.load on current torch


def test_checkpoint_namespace_loads_with_weights_only(tmp_path, onmt_active):
    import argparse

    import torch

    from onmt.models.model_saver import load_checkpoint

    path = tmp_path / "ckpt.pt"
    torch.save({"model": {}, "generator": {}, "opt": argparse.Namespace(num_kv=0), "vocab": {}}, path)
    checkpoint = load_checkpoint(str(path))
    assert isinstance(checkpoint["opt"], argparse.Namespace)


def test_checkpoint_errors_keep_the_stock_exception_types_outside_the_commands(tmp_path, onmt_active):
    """Outside onmt_train/onmt_translate (a library caller), what stock raised is still what is raised: the
    clearer errors are also of the stock type, and a missing file is stock's FileNotFoundError."""
    import torch
    from onmt.models.model import BaseModel
    from onmt.models.model_saver import load_checkpoint

    from onmt_ext.errors import UserError

    with pytest.raises(FileNotFoundError):
        load_checkpoint(str(tmp_path / "absent.pt"))
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(Exception, match="is not an OpenNMT-py checkpoint") as raised:  # stock: UnpicklingError
        load_checkpoint(str(tmp_path / "junk.pt"))
    assert isinstance(raised.value, UserError)
    torch.save({"weights": torch.zeros(1)}, tmp_path / "dict.pt")
    with pytest.raises(KeyError, match="is not an OpenNMT-py checkpoint"):  # stock: KeyError 'opt'
        load_checkpoint(str(tmp_path / "dict.pt"))

    class Model(BaseModel):
        def __init__(self):
            torch.nn.Module.__init__(self)
            self.layer = torch.nn.Linear(2, 2)

    with pytest.raises(ValueError, match="do not fit the model") as raised:  # stock: ValueError (missing keys)
        Model().load_state_dict({"model": {}, "generator": {}})
    assert isinstance(raised.value, UserError)


class _NotAllowed:
    pass


def test_weights_only_is_still_enforced(tmp_path, onmt_active):
    import pickle

    import torch

    path = tmp_path / "evil.pt"
    torch.save({"opt": _NotAllowed()}, path)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path)


def test_checkpoints_are_written_atomically(tmp_path, monkeypatch, onmt_active):
    """A save interrupted mid-write leaves nothing under the checkpoint's name; a finished one is complete."""
    import torch
    from onmt.models import model_saver

    from onmt_ext.runtime import compat

    target = tmp_path / "model_step_10.pt"
    model_saver.torch.save({"w": torch.arange(5)}, str(target))
    assert torch.load(target)["w"].tolist() == [0, 1, 2, 3, 4]
    assert [p.name for p in tmp_path.iterdir()] == ["model_step_10.pt"]

    real_save = torch.save

    def dies_half_way(obj, handle, *args, **kwargs):
        handle.write(b"PK\x03\x04 half a checkpoint")
        raise KeyboardInterrupt  # the run is killed while saving

    monkeypatch.setattr(torch, "save", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        model_saver.torch.save({"w": torch.zeros(3)}, str(tmp_path / "model_step_20.pt"))
    monkeypatch.setattr(torch, "save", real_save)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model_step_10.pt"]
    assert isinstance(model_saver.torch, compat._TorchWithAtomicSave)
    assert model_saver.torch.load is torch.load  # everything else is torch's own


def test_safetensors_save_format_is_refused_by_name(onmt_active, capsys):
    from onmt_ext.integration.parsing import parse_train_config

    with pytest.raises(SystemExit):
        parse_train_config(support.REPO / "yaml_configs/smoke/baseline/transformer_base_wmt14_ende.yaml",
                           "-save_format", "safetensors")
    err = capsys.readouterr().err
    assert "error: -save_format safetensors is not supported with onmt-ext" in err
    assert "use -save_format pytorch" in err and "Traceback" not in err


@pytest.mark.parametrize("option, values, message", [
    ("report_every", 0, "-report_every 0: must be >= 1"),
    ("valid_steps", 0, "-valid_steps 0: must be >= 1"),
    ("accum_count", [2, 0], "-accum_count 2 0: must be >= 1"),
    ("world_size", 0, "-world_size 0: must be >= 1"),
    ("beam_size", 0, "-beam_size 0: must be >= 1"),
    ("n_best", 0, "-n_best 0: must be >= 1"),
    ("max_length", 0, "-max_length 0: must be >= 1"),
])
def test_stock_counts_below_one_are_refused_by_name(option, values, message):
    from argparse import Namespace

    from onmt_ext.integration.parsing import stock_option_problems

    assert stock_option_problems(Namespace(**{option: values})) == [message]
    assert stock_option_problems(Namespace(**{option: [1, 3] if isinstance(values, list) else 1})) == []


def test_n_best_beyond_the_beam_is_refused():
    from argparse import Namespace

    from onmt_ext.integration.parsing import stock_option_problems

    assert stock_option_problems(Namespace(n_best=3, beam_size=2)) == ["-n_best 3: must be <= -beam_size (2)"]
    assert stock_option_problems(Namespace(n_best=2, beam_size=2)) == []


def test_training_with_report_every_0_stops_at_parsing_with_the_option_named(onmt_active, capsys):
    from onmt_ext.integration.parsing import parse_train_config

    with pytest.raises(SystemExit):  # stock OpenNMT-py 3.5.1 trains, then divides by zero at the first step
        parse_train_config(support.REPO / "yaml_configs/smoke/baseline/transformer_base_wmt14_ende.yaml",
                           "-report_every", "0")
    err = capsys.readouterr().err
    assert "error: -report_every 0: must be >= 1" in err and "Traceback" not in err


# ---------------------------------------------------------------------------
# over-long sentences


def test_filtertoolong_logs_its_first_drop_and_the_running_count(onmt_active, monkeypatch, caplog):
    import argparse

    from onmt.constants import CorpusName
    from onmt.transforms.misc import FilterTooLongTransform

    from onmt_ext.runtime import compat

    assert compat._INFER_CORPUS == CorpusName.INFER
    monkeypatch.setattr(compat, "_FILTER_LOG_AT", (2,))
    transform = FilterTooLongTransform(argparse.Namespace(src_seq_length=3, tgt_seq_length=4))

    def pair(src, tgt, cid="corpus_1"):
        return {"src": ["w"] * src, "tgt": None if tgt is None else ["w"] * tgt, "cid": cid}

    with caplog.at_level("INFO", logger="onmt"):
        kept = [transform.apply(pair(*lengths)) is not None for lengths in ((3, 2), (4, 1), (1, 3), (2, 2))]
        assert transform.apply(pair(9, None, cid="infer")) is not None  # a translation source is never dropped
        assert transform.apply(pair(9, 9, cid="infer")) is not None  # not even with -tgt (the output would shift)
        assert transform.apply(pair(9, None, cid="valid")) is not None  # nor the -valid_metrics source
    assert kept == [True, False, False, True]
    messages = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert messages[0][0] == "WARNING" and messages[0][1].startswith(
        "filtertoolong: dropped a pair of corpus 'corpus_1' with 4 source and 1 target tokens (-src_seq_length 3, "
        "-tgt_seq_length 4;")
    assert messages[1] == ("INFO", "filtertoolong: 2 of 3 pairs dropped so far (66.67%; -src_seq_length 3, "
                                   "-tgt_seq_length 4)")
    assert messages[2][0] == "WARNING" and "drops nothing that is to be translated" in messages[2][1]


def test_a_sequence_beyond_the_position_encoding_gets_a_clear_error(onmt_active, capsys):
    import types

    import torch
    from onmt.modules.embeddings import PositionalEncoding, SequenceTooLongError
    from onmt.translate.translator import Translator

    from onmt_ext.integration import commands

    pe = PositionalEncoding(4, "SinusoidalInterleaved", max_len=3)
    assert pe(torch.zeros(2, 3, 4)).shape == (2, 3, 4)  # within the limit: the stock encoding
    with pytest.raises(SequenceTooLongError, match=r"^a sequence of 5 tokens is longer than the 3 positions .* split "
                                                    r"the sentence"):
        pe(torch.zeros(2, 5, 4))
    with pytest.raises(SequenceTooLongError, match=r"output reached 4 tokens.*-max_length below 3"):
        pe(torch.zeros(2, 1, 4), step=3)
    # onmt_translate: the encoder names the source lines, and the command ends with the message
    fake = types.SimpleNamespace(model=types.SimpleNamespace(
        encoder=lambda src, src_len: pe(torch.zeros(src.size(0), src.size(1), 4))))
    batch = {"src": torch.zeros(2, 5, 1), "srclen": torch.tensor([2, 5]), "cid_line_number": [6, 7]}
    with pytest.raises(SequenceTooLongError) as error:
        Translator._run_encoder(fake, batch)
    assert str(error.value).startswith("source line 8 (5 tokens): a sequence of 5 tokens is longer than the 3")

    def translate(opt):
        raise error.value

    translate.__module__ = "onmt.bin.translate"
    with pytest.raises(SystemExit) as stop:
        commands._run_command(translate, None)
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("onmt_translate: error: source line 8 (5 tokens)") and err.count("\n") == 1


def test_all_empty_translations_give_a_warning(onmt_active, tmp_path, caplog):
    import argparse

    from onmt_ext.integration import commands

    def translate(opt):  # what OpenNMT-py's translate leaves behind when every hypothesis is empty
        with open(opt.output, "w", encoding="utf-8") as handle:
            handle.write(opt.text)

    translate.__module__ = "onmt.bin.translate"
    with caplog.at_level("WARNING", logger="onmt"):
        commands._translate_checked(translate, argparse.Namespace(output=str(tmp_path / "hyp"), text="\n \n\n"))
    assert [r.getMessage() for r in caplog.records] == [
        f"onmt_translate: every one of the 3 translations in {tmp_path / 'hyp'} is empty: is the model trained "
        "enough (see its validation accuracy), and do -src and -transforms match what it was trained on?"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="onmt"):
        commands._translate_checked(translate, argparse.Namespace(output=str(tmp_path / "hyp"), text="\na b\n"))
    assert not caplog.records


def test_errors_become_one_line_per_problem_with_the_command_name():
    from onmt_ext.integration.commands import _one_line

    assert _one_line("onmt_train", "error: a\n  b") == "onmt_train: error: a\nonmt_train: error: b"
    assert _one_line("onmt_train", "onmt_train: error: c") == "onmt_train: error: c"
    assert _one_line("onmt_train", "clause_split: error: d") == "onmt_train: error: clause_split: d"
    assert _one_line("onmt_train", "invalid onmt-ext options:\n  -heads 3: e") == "onmt_train: error: -heads 3: e"


def test_train_from_differences_allow_only_added_mechanisms(onmt_active):
    import argparse

    from onmt_ext.options import OPTION_SPECS
    from onmt_ext.integration.checkpoints import train_from_differences

    defaults = {spec.name: spec.default for spec in OPTION_SPECS}
    checkpoint = argparse.Namespace(**defaults, encoder_type="transformer", decoder_type="transformer",
                                    hidden_size=64, heads=8)
    run = argparse.Namespace(**{**defaults, "gret": True}, encoder_type="ext_transformer",
                             decoder_type="transformer", hidden_size=64, heads=8)
    assert train_from_differences(run, checkpoint) == ([("encoder_type", "ext_transformer"), ("gret", True)], [])
    run.hidden_size, checkpoint.gret = 32, True
    run.gret = False
    assert train_from_differences(run, checkpoint)[1] == [("hidden_size", 32, 64), ("gret", False, True)]


# -------------------------------------------------------------- issue 39: one-line usage errors, -ext_compile


def _translate_parser():
    import onmt.bin.translate

    from onmt_ext.integration.parsing import strict

    return strict(onmt.bin.translate._get_parser())  # as onmt_translate parses its command line


def test_a_missing_required_option_is_one_line_without_the_usage(onmt_active, capsys):
    """argparse prints about 100 lines of usage before "the following arguments are required: --src/-src"."""
    parser = _translate_parser()
    with pytest.raises(SystemExit) as stop:
        parser.parse_known_args(["-model", "m.pt"])
    assert stop.value.code == 2
    assert capsys.readouterr().err == f"{parser.prog}: error: the following arguments are required: --src/-src\n"


def test_a_bad_value_from_a_config_names_the_file_and_line(onmt_active, tmp_path, capsys):
    """A value outside an option's choices, or of the wrong type, in a YAML config: the key, the file and its line;
    on the command line: argparse's own message.  Either way one line."""
    from onmt_ext.integration.parsing import parse_train_config

    text = (support.REPO / "yaml_configs/smoke/foundation/ext_transformer.yaml").read_text(encoding="utf-8")
    config = tmp_path / "bad.yaml"
    config.write_text(text + "li2019_enc_self: bogus\nli2019_capsules: many\n", encoding="utf-8")
    line = len(text.splitlines()) + 1
    with pytest.raises(SystemExit) as stop:
        parse_train_config(config)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"{support.train_parser().prog}: error: key 'li2019_enc_self' in {config}, "
                                f"line {line}: invalid choice: 'bogus' (choose from 'concat', 'simple', 'em')"]
    config.write_text(text + "li2019_capsules: many\n", encoding="utf-8")
    with pytest.raises(SystemExit):
        parse_train_config(config)
    assert f"error: key 'li2019_capsules' in {config}, line {line}: invalid int value: 'many'" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_train_config(config, "-li2019_capsules", "3", "-li2019_enc_self", "bogus")
    assert capsys.readouterr().err.splitlines() == [
        f"{support.train_parser().prog}: error: argument --li2019_enc_self/-li2019_enc_self: invalid choice: "
        "'bogus' (choose from 'concat', 'simple', 'em')"]


@pytest.mark.parametrize("extra, expected", [([], False), (["-ext_compile"], True), (["-ext_compile", "true"], True),
                                             (["-ext_compile", "false"], False)])
def test_ext_compile_takes_the_same_forms_in_onmt_train_and_onmt_translate(onmt_active, sample_data, extra,
                                                                          expected):
    """-ext_compile alone, or with true/false, in both commands (onmt_train took only a value, onmt_translate
    only the bare flag); another onmt-ext boolean option likewise.  Unset, onmt_train's is auto (docs/compile.md)
    and onmt_translate's off."""
    from onmt_ext.integration.parsing import parse_train_config

    opt, _ = _translate_parser().parse_known_args(["-model", "m.pt", "-src", "s", *extra])
    assert opt.ext_compile is expected
    opt = parse_train_config(support.REPO / "yaml_configs/smoke/gret/ablations_all_switches.yaml", *extra)
    assert opt.ext_compile == (expected if extra else "auto")
    switch = ["-gret_gate"] + extra[1:] if extra else []
    opt = parse_train_config(support.REPO / "yaml_configs/smoke/gret/ablations_all_switches.yaml", *switch)
    assert opt.gret_gate is expected  # the config says false


def test_a_bad_boolean_value_is_named(onmt_active, capsys):
    with pytest.raises(SystemExit):
        _translate_parser().parse_known_args(["-model", "m.pt", "-src", "s", "-ext_compile", "maybe"])
    assert capsys.readouterr().err.endswith(
        "error: argument --ext_compile/-ext_compile: expected true or false, got 'maybe'\n")


def test_the_torch_setup_command_runs_from_where_the_user_is(tmp_path, monkeypatch):
    """The command that -gpu's error recommends: make -C <checkout> from another folder, VENV= for another venv;
    a missing package: pip of the Python that runs onmt-ext."""
    from onmt_ext.runtime import compat

    repo = os.path.realpath(support.REPO)
    monkeypatch.setattr(sys, "prefix", os.path.join(repo, ".venv"))
    wanted = 'setup TORCH="torch==<version> --index-url <your CUDA index>" FORCE=1'
    assert compat.torch_setup_command(cwd=repo) == f"make {wanted}"
    assert compat.torch_setup_command(cwd=tmp_path) == f"make -C {repo} {wanted}"
    assert compat.make_command("data", cwd=tmp_path) == f"make -C {repo} data"  # the tools' "run make data first"
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "my venv"))
    assert compat.torch_setup_command(cwd=repo) == f"make VENV='{tmp_path}/my venv' {wanted}"
    assert compat.install_command("spacy==3.8.18") == f"{sys.executable} -m pip install spacy==3.8.18"


def test_every_module_that_imports_onmt_as_it_loads_hands_activation_on_at_its_end():
    """A module of onmt_ext whose top level imports OpenNMT-py may be what triggers the start-up hook; activation
    then needs it whole: it is in ``_autoload.IMPORTING_ONMT`` and its last statement (before a ``__main__`` block)
    is ``_autoload.activate_deferred(__name__)``."""
    import ast

    from onmt_ext import _autoload

    importing, without_the_call = set(), []
    for path in sorted((support.REPO / "onmt_ext").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = [alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names]
        names += [node.module for node in tree.body if isinstance(node, ast.ImportFrom) and node.module]
        if not any(name == "onmt" or name.startswith("onmt.") for name in names):
            continue
        importing.add(".".join(path.relative_to(support.REPO).with_suffix("").parts))
        body = [node for node in tree.body if not (isinstance(node, ast.If) and "__main__" in ast.unparse(node.test))]
        if ast.unparse(body[-1]) != "_autoload.activate_deferred(__name__)":
            without_the_call.append(path.name)
    assert importing == set(_autoload.IMPORTING_ONMT) and not without_the_call, (importing, without_the_call)
