"""build_vocab -> train -> average -> translate through the unmodified console scripts.

Runs once with onmt-ext's own model type and once with a stock Transformer
trained while the extension is switched off (a stock model and checkpoint
must keep working unchanged when the extension is loaded).
"""

import sys

import pytest
import torch

import support

EXT = "yaml_configs/smoke/foundation/ext_transformer.yaml"
STOCK = "yaml_configs/smoke/baseline/transformer_base_wmt14_ende.yaml"


def _pipeline(config, out, train_env=None):
    """Run the four commands; returns (averaged checkpoint, translation lines)."""
    support.run_cli(
        "onmt_build_vocab", "-config", config, "-save_data", out / "samples", "-n_sample", 3000,
        "-src_vocab", out / "vocab.src", "-tgt_vocab", out / "vocab.tgt", "-overwrite",
    )
    support.run_cli(
        "onmt_train", "-config", config, "-save_data", out / "samples", "-save_model", out / "model",
        "-src_vocab", out / "vocab.src", "-tgt_vocab", out / "vocab.tgt",
        "-train_steps", 20, "-save_checkpoint_steps", 10, "-valid_steps", 20, env=train_env,
    )
    support.run_cli(
        "onmt_average_models", "-models", out / "model_step_10.pt", out / "model_step_20.pt", "-output", out / "avg.pt"
    )
    src = out / "src.zh"
    lines = (support.TATOEBA / "test.zh").read_text(encoding="utf-8").splitlines()[:12]
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    support.run_cli(
        "onmt_translate", "-model", out / "avg.pt", "-src", src, "-output", out / "hyp.en", "-beam_size", 3,
        "-max_length", 30, "-transforms", "sentencepiece",
        "-src_subword_model", support.TATOEBA / "spm.zh.model", "-tgt_subword_model", support.TATOEBA / "spm.en.model",
    )
    return out / "avg.pt", (out / "hyp.en").read_text(encoding="utf-8").splitlines()


def test_extension_model_through_stock_commands(sample_data, onmt_active, tmp_path):
    checkpoint, hyps = _pipeline(EXT, tmp_path)
    assert len(hyps) == 12
    assert all("▁" not in h for h in hyps), "translations must come out detokenized"
    saved = torch.load(checkpoint)
    assert saved["opt"].encoder_type == saved["opt"].decoder_type == "ext_transformer"


def test_stock_model_trained_without_extension_works_with_it(sample_data, onmt_active, tmp_path):
    checkpoint, hyps = _pipeline(STOCK, tmp_path, train_env=support.cli_env(ONMT_EXT_DISABLE="1"))
    assert len(hyps) == 12
    assert torch.load(checkpoint)["opt"].encoder_type == "transformer"


def test_python_dash_m_entry_points_load_the_extension(sample_data, tmp_path):
    import subprocess

    result = subprocess.run(
        [sys.executable, "-m", "onmt.bin.train", "-config", EXT, "-train_steps", "0", "-misspelt_option", "1"],
        cwd=support.REPO, capture_output=True, text=True, env=support.cli_env(), timeout=300,
    )
    assert result.returncode == 2
    assert "unknown option 'misspelt_option'" in result.stderr


@pytest.mark.parametrize("command", ["onmt_train", "onmt_translate", "onmt_build_vocab", "onmt_average_models"])
def test_console_scripts_start(command):
    result = support.run_cli(command, "-h")
    assert "usage" in result.stdout
    if command == "onmt_train":  # our options are part of the stock help
        assert "onmt-ext:" in result.stdout and "ext_transformer" in result.stdout
