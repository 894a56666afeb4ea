"""The plug-in through fresh interpreters and the console scripts: the start-up hook and strict option parsing.

Moved out of tests/unit/test_plugin.py (unit/ runs in-process only): the .pth start-up hook registering onmt-ext's
types on the first ``import onmt``, switched off with ``ONMT_EXT_DISABLE=1`` and leaving plain OpenNMT-py working when
registration fails or the OpenNMT-py version is not supported; spaCy and fasttext imported on first use; no
torch.cuda.amp deprecation warning on importing the commands; the training log file keeping its lines after the data
iterator re-initialises the logger; and ``onmt_train``, ``onmt_build_vocab`` and ``onmt_translate`` refusing
misspelled YAML keys and unknown command-line options with a suggestion.
"""

import subprocess
import sys
import textwrap

import pytest

import support
from onmt_ext.runtime import compat


def _python(code, **env):
    """Run ``code`` in a fresh interpreter of this venv (so the .pth hook runs)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, cwd=support.REPO, env=support.cli_env(**env), timeout=120,
    )


def test_hook_registers_types_on_first_onmt_import():
    result = _python(
        """
        import sys
        assert "torch" not in sys.modules, "the start-up hook must stay cheap"
        import onmt
        from onmt.encoders import str2enc
        from onmt.decoders import str2dec
        import onmt.opts
        print(str2enc["ext_transformer"].__name__, str2dec["ext_transformer"].__name__)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ExtTransformerEncoder", "ExtTransformerDecoder"]


@pytest.mark.parametrize("first", ["onmt_ext.integration.transformer", "onmt_ext.mechanisms.clause.split",
                                   "onmt_ext.integration.zh_segment"])
def test_importing_a_module_that_imports_onmt_first_still_activates(first):
    # it imports onmt, whose hook activates onmt-ext, which needs the module whole: activation waits for its end
    result = _python(
        f"""
        import {first}
        from onmt.encoders import str2enc
        from onmt.transforms import AVAILABLE_TRANSFORMS
        from onmt_ext.integration import plugin, transformer, zh_segment
        from onmt_ext.mechanisms.clause import split
        print(plugin.is_active(), str2enc["ext_transformer"] is transformer.ExtTransformerEncoder,
              AVAILABLE_TRANSFORMS["clause_split"] is split.ClauseSplitTransform,
              AVAILABLE_TRANSFORMS["jieba"] is zh_segment.JiebaTransform)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True"] * 4 and "could not" not in result.stderr, result.stderr


def test_hook_survives_a_lookup_of_onmt_before_its_import():
    # pytest and other tools look packages up (importlib.util.find_spec) without importing them
    result = _python(
        """
        import importlib.util
        assert importlib.util.find_spec("onmt") is not None
        import onmt, onmt_ext.integration.plugin
        print(onmt_ext.integration.plugin.is_active())
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True"]


def test_hook_can_be_switched_off():
    result = _python(
        "import onmt; from onmt.encoders import str2enc; print('ext_transformer' in str2enc)",
        ONMT_EXT_DISABLE="1",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


#: the optional packages installed here, whose import the start-up hook defers to their first use
DEFERRED = [name for name in compat.OPTIONAL_PACKAGES if not compat.package_missing(name)]
#: the start-up hook's changes that stay whatever happens to the activation (docs/differences-from-stock.md)
KEPT = "warnings filters (torch.cuda.amp, sdp_kernel)|torch.serialization safe globals (argparse.Namespace)" + (
    f"|sys.modules ({', '.join(DEFERRED)}) imported on first use" if DEFERRED else "")


@pytest.mark.parametrize("runtime", ["ext", "stock", "disabled"])
def test_optional_packages_are_imported_on_first_use(runtime):
    """``import onmt`` leaves spaCy's (and fasttext's) import to the terminology (clean) transform's first use of
    it; under ``ONMT_EXT_RUNTIME=stock`` and ``ONMT_EXT_DISABLE=1`` it imports them as stock does."""
    if "spacy" not in DEFERRED:
        pytest.skip("spaCy is not installed (make setup installs it)")
    env = {"stock": {"ONMT_EXT_RUNTIME": "stock"}, "disabled": {"ONMT_EXT_DISABLE": "1"}}.get(runtime, {})
    result = _python(
        """
        import sys
        import onmt
        from onmt.transforms import terminology
        print("spacy.language" in sys.modules, "spacy" in sys.modules)
        load = terminology.spacy.load  # the transform's first use
        import spacy
        print("spacy.language" in sys.modules, load is spacy.load, sys.modules["spacy"] is spacy)
        """, **env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    first, then = result.stdout.splitlines()
    assert first == ("False False" if runtime == "ext" else "True True")
    assert then == "True True True"


def test_failing_registration_leaves_plain_onmt_working():
    """A step in the middle of activate() fails: the steps before it are undone, OpenNMT-py runs stock."""
    result = _python(
        """
        import onmt_ext.integration.checkpoints, onmt_ext.integration.plugin
        def broken():
            raise RuntimeError("simulated bug")
        onmt_ext.integration.checkpoints.check_checkpoints = broken
        import onmt, onmt.bin.translate, onmt.trainer
        from onmt.encoders import str2enc
        from onmt_ext import patches
        print("transformer" in str2enc, "ext_transformer" in str2enc, "|".join(p.target for p in patches.applied()),
              patches.is_ours(onmt.trainer.Trainer.train), patches.is_ours(onmt.bin.translate.translate), sep="\\n")
        """
    )
    assert result.returncode == 0, result.stderr
    # what the start-up hook applied before activation stays, as under ONMT_EXT_DISABLE=1 (the torch.load
    # allow-list and the warnings filters): the failed activation undoes its own changes only
    assert result.stdout.splitlines() == ["True", "False", KEPT, "False", "False"]
    assert "onmt-ext: could not register with OpenNMT-py (RuntimeError: simulated bug)" in result.stderr
    assert "ONMT_EXT_DISABLE=1" in result.stderr


def test_an_unsupported_onmt_version_is_said_in_one_line_and_changes_nothing():
    result = _python(
        """
        from onmt_ext import patches
        patches.SUPPORTED = ("3.4.0",)
        import onmt
        from onmt.encoders import str2enc
        print("ext_transformer" in str2enc, "|".join(p.target for p in patches.applied()), sep="\\n")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["False", KEPT]
    ours = [line for line in result.stderr.splitlines() if "onmt-ext" in line]
    assert ours == ["onmt-ext: OpenNMT-py 3.5.1 is not supported (onmt-ext is written for 3.4.0); OpenNMT-py runs "
                    "stock, without the extension; set ONMT_EXT_DISABLE=1 to silence this message."]


def test_no_torch_amp_deprecation_noise():
    result = subprocess.run(
        [sys.executable, "-W", "always", "-c", "import onmt, onmt.bin.train, onmt.bin.translate"],
        capture_output=True, text=True, env=support.cli_env(), timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "torch.cuda.amp" not in result.stderr


def test_log_file_keeps_training_lines_after_the_data_iterator_starts(tmp_path):
    """OpenNMT-py 3.5.1's data iterator re-initialises the logger without the file; onmt-ext keeps the file."""
    log = tmp_path / "train.log"
    result = _python(
        f"""
        import onmt
        from onmt.utils.logging import init_logger
        from onmt.inputters import dynamic_iterator
        logger = init_logger({str(log)!r})
        logger.info("before")
        dynamic_iterator.init_logger().info("corpora loaded")  # what the iterator does on every corpus pass
        logger.info("Step 100/200")
        """
    )
    assert result.returncode == 0, result.stderr
    lines = log.read_text().splitlines()
    assert [line.split("] ", 1)[1] for line in lines] == ["before", "corpora loaded", "Step 100/200"]
    assert result.stderr.count("Step 100/200") == 1  # console still once, not duplicated


# ---------------------------------------------------------------------------
# strict options


def _write(path, text):
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return path


@pytest.fixture
def bad_config(tmp_path):
    return _write(
        tmp_path / "bad.yaml",
        """
        save_data: build/x
        src_vocab: build/tatoeba/vocab.zh
        data:
          corpus_1:
            path_src: build/tatoeba/train.zh
            path_tgt: build/tatoeba/train.en
        enc_layer: 2
        heads: 4
        trian_steps: 10
        """,
    )


def test_train_rejects_misspelled_yaml_keys_with_line_and_suggestion(bad_config):
    result = support.run_cli("onmt_train", "-config", bad_config, check=False)
    assert result.returncode == 2
    assert f"unknown option 'enc_layer' in {bad_config}, line 7; did you mean 'enc_layers'?" in result.stderr
    assert f"unknown option 'trian_steps' in {bad_config}, line 9; did you mean 'train_steps'?" in result.stderr
    assert "Traceback" not in result.stderr


def test_build_vocab_rejects_unknown_command_line_option(bad_config):
    result = support.run_cli("onmt_build_vocab", "-config", bad_config, "-n_sampel", "5", check=False)
    assert result.returncode == 2
    assert "unknown option 'n_sampel' on the command line; did you mean 'n_sample'?" in result.stderr


def test_translate_rejects_unknown_option():
    result = support.run_cli("onmt_translate", "-model", "m.pt", "-src", "x", "-beam_sise", "4", check=False)
    assert result.returncode == 2
    assert "unknown option 'beam_sise' on the command line; did you mean 'beam_size'?" in result.stderr
