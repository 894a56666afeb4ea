"""Faults through the real console scripts: interrupted training resumed with ``-train_from``, and determinism.

The model is the toy ``ext_transformer`` smoke config (dropout 0) with two batches per update, so the
resumed run has to skip exactly the batches that steps 1-10 consumed (onmt_ext.runtime.compat.resume_data_position).
"""

import pytest
import torch

import support

pytestmark = pytest.mark.slow  # three trainings through onmt_train (20 steps, 10 + 10 resumed) and translations

CONFIG = "yaml_configs/smoke/foundation/ext_transformer.yaml"
COMMON = ("-accum_count", 2, "-save_checkpoint_steps", 10, "-valid_steps", 100, "-report_every", 5,
          "-dropout", 0, "-attention_dropout", 0, "-seed", 4321)


def _train(out, steps, *extra):
    return support.run_cli("onmt_train", "-config", CONFIG, "-save_data", out / "samples", "-save_model",
                           out / "model", "-train_steps", steps, *COMMON, *extra)


def _params(path):
    checkpoint = torch.load(path)
    return {**checkpoint["model"], **{f"generator.{k}": v for k, v in checkpoint["generator"].items()}}


def _assert_same(first, second):
    a, b = _params(first), _params(second)
    assert a.keys() == b.keys()
    different = [name for name in a if not torch.equal(a[name], b[name])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


def _translate(model, out):
    src = out / "src.zh"
    lines = (support.TATOEBA / "test.zh").read_text(encoding="utf-8").splitlines()[:16]
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    support.run_cli("onmt_translate", "-model", model, "-src", src, "-output", out / "hyp.en", "-beam_size", 3,
                    "-min_length", 4, "-max_length", 20, "-transforms", "sentencepiece",
                    "-src_subword_model", support.TATOEBA / "spm.zh.model",
                    "-tgt_subword_model", support.TATOEBA / "spm.en.model")
    return (out / "hyp.en").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def uninterrupted(sample_data, onmt_active, tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted")
    _train(out, 20)
    return out


@pytest.fixture(scope="module")
def resumed(uninterrupted, tmp_path_factory):
    """A second run with the same seed, killed after its step-10 checkpoint and resumed to step 20."""
    out = tmp_path_factory.mktemp("resumed")
    _train(out, 10)
    (out / "model_step_10.pt").rename(out / "killed_step_10.pt")
    result = _train(out, 20, "-train_from", out / "killed_step_10.pt")
    return out, result.stderr + result.stdout


def test_same_seed_gives_identical_checkpoints(uninterrupted, resumed):
    out, _ = resumed
    _assert_same(out / "killed_step_10.pt", uninterrupted / "model_step_10.pt")  # two runs, one seed


def test_resumed_training_matches_the_uninterrupted_run(uninterrupted, resumed):
    out, log = resumed
    assert "skipping the 20 training batches that steps 1-10 used" in log
    _assert_same(out / "model_step_20.pt", uninterrupted / "model_step_20.pt")


def test_translation_is_deterministic(uninterrupted, tmp_path):
    first = _translate(uninterrupted / "model_step_20.pt", uninterrupted)
    assert first.strip()
    assert _translate(uninterrupted / "model_step_20.pt", tmp_path) == first


def _translate_result(model, tmp_path):
    src = tmp_path / "src.zh"
    src.write_text("你好。\n", encoding="utf-8")
    return support.run_cli("onmt_translate", "-model", model, "-src", src, "-output", tmp_path / "hyp", "-transforms",
                           "sentencepiece", "-src_subword_model", support.TATOEBA / "spm.zh.model",
                           "-tgt_subword_model", support.TATOEBA / "spm.en.model", check=False)


def test_checkpoints_record_the_onmt_ext_version(uninterrupted):
    from onmt_ext import __version__

    assert torch.load(uninterrupted / "model_step_20.pt")["opt"].onmt_ext_version == __version__


def test_a_checkpoint_with_an_unknown_mechanism_is_refused_by_name(uninterrupted, tmp_path):
    checkpoint = torch.load(uninterrupted / "model_step_20.pt")
    checkpoint["opt"].onmt_ext_version = "9.0.0"
    checkpoint["opt"].futuremech_enc = "on"  # a mechanism of a later onmt-ext
    torch.save(checkpoint, tmp_path / "future.pt")
    result = _translate_result(tmp_path / "future.pt", tmp_path)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "written by onmt-ext 9.0.0 with options this onmt-ext" in result.stderr
    assert "does not know: futuremech_enc" in result.stderr


def test_a_checkpoint_whose_tensors_do_not_fit_gives_a_clear_error(uninterrupted, tmp_path):
    checkpoint = torch.load(uninterrupted / "model_step_20.pt")
    checkpoint["model"]["encoder.something_else.weight"] = torch.zeros(2)
    torch.save(checkpoint, tmp_path / "altered.pt")
    result = _translate_result(tmp_path / "altered.pt", tmp_path)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "tensors do not fit the model built from its options" in result.stderr
    assert "encoder.something_else.weight" in result.stderr
