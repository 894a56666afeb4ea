"""build_vocab -> train -> average -> translate through the unmodified console scripts.

Runs once with onmt-ext's own model type and once with a stock Transformer
trained while the extension is switched off (a stock model and checkpoint
must keep working unchanged when the extension is loaded).  Every test here
that trains is in the slow tier (tests/README.md); the console scripts' start
and ``python -m`` entry points are in the default tier.
"""

import json
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


@pytest.mark.slow
def test_extension_model_through_stock_commands(sample_data, onmt_active, tmp_path):
    checkpoint, hyps = _pipeline(EXT, tmp_path)
    assert len(hyps) == 12
    assert all("▁" not in h for h in hyps), "translations must come out detokenized"
    saved = torch.load(checkpoint)
    assert saved["opt"].encoder_type == saved["opt"].decoder_type == "ext_transformer"


@pytest.mark.slow
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


@pytest.mark.slow
def test_gret_fine_tunes_from_a_baseline_checkpoint(sample_data, onmt_active, tmp_path):
    """As the paper trains GRET and as yaml_configs/gret/*_gret.yaml do: -train_from the baseline's checkpoint (the
    GRET rows' own baseline, post-norm as they are: docs/normalisation.md)."""
    baseline = "yaml_configs/smoke/gret/transformer_base_wmt14_ende_baseline.yaml"
    support.run_cli("onmt_train", "-config", baseline, "-save_model", tmp_path / "base", "-save_data", tmp_path / "s",
                    "-train_steps", 4, "-save_checkpoint_steps", 4, "-valid_steps", 100)
    result = support.run_cli(
        "onmt_train", "-config", "yaml_configs/smoke/gret/transformer_base_wmt14_ende_gret.yaml",
        "-save_model", tmp_path / "gret", "-save_data", tmp_path / "s", "-train_from", tmp_path / "base_step_4.pt",
        "--override_opts", "-reset_optim", "all", "-train_steps", 3, "-save_checkpoint_steps", 3, "-valid_steps", 100)
    log = result.stdout + result.stderr
    assert "new tensors of onmt-ext mechanisms initialised" in log and "encoder.gret.vote_maps" in log
    base, tuned = torch.load(tmp_path / "base_step_4.pt"), torch.load(tmp_path / "gret_step_3.pt")
    assert tuned["opt"].gret and not hasattr(base["opt"], "gret") or not base["opt"].gret
    assert set(tuned["model"]) - set(base["model"]) == {k for k in tuned["model"] if ".gret." in k}
    src = tmp_path / "src.txt"
    src.write_text("▁我 ▁很 ▁好 。\n", encoding="utf-8")
    support.run_cli("onmt_translate", "-model", tmp_path / "gret_step_3.pt", "-src", src,
                    "-output", tmp_path / "hyp.txt", "-max_length", 5)
    assert len((tmp_path / "hyp.txt").read_text(encoding="utf-8").splitlines()) == 1
    # the bag-of-words probe (tools/gret_probe.py) on that tiny checkpoint and on the baseline's
    pairs = {}
    for name, source in (("train", "train"), ("test", "valid")):
        for lang in ("zh", "en"):
            path = tmp_path / f"{name}.{lang}"
            lines = (support.TATOEBA / f"{source}.{lang}").read_text(encoding="utf-8").splitlines()[:150]
            path.write_text("\n".join(lines) + "\n", encoding="utf-8")
            pairs[name, lang] = path
    probe = ["python", "-m", "tools.gret_probe", "-src", pairs["train", "zh"],
             "-tgt", pairs["train", "en"], "-test_src", pairs["test", "zh"], "-test_tgt", pairs["test", "en"],
             "--src-subword-model", support.TATOEBA / "spm.zh.model",
             "--tgt-subword-model", support.TATOEBA / "spm.en.model", "--epochs", 2]
    support.run_cli(*probe, "-model", tmp_path / "gret_step_3.pt", "--out", tmp_path / "probe.json")
    report = json.loads((tmp_path / "probe.json").read_text(encoding="utf-8"))
    assert report["kind"] == "global" and report["train_pairs"] == report["test_pairs"] == 150
    assert set(report["precision"]) == {"1", "5", "10"}
    failed = support.run_cli(*probe, "-model", tmp_path / "base_step_4.pt", check=False)
    assert failed.returncode != 0 and "--kind global needs a GRET checkpoint" in failed.stderr
    support.run_cli(*probe, "-model", tmp_path / "base_step_4.pt", "--kind", "average")
