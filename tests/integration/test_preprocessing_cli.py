"""Preprocessing mismatches through the real commands (issue 39, item 1): onmt_translate without -transforms applies
the model's own or names the missing file in one line; tools/evaluate.py refuses output with subword marks.

The toy model is the foundation smoke config with random weights (built in-process, saved as onmt_train does); no
training.  The in-process tests of onmt_ext.integration.preprocessing are in tests/unit/test_preprocessing.py.
"""

import subprocess
import sys

import pytest
import torch

import support

CONFIG = "yaml_configs/smoke/foundation/ext_transformer.yaml"
SPM = ("-src_subword_model", support.TATOEBA / "spm.zh.model", "-tgt_subword_model", support.TATOEBA / "spm.en.model")


@pytest.fixture(scope="module")
def toy_model(sample_data, onmt_active, tmp_path_factory):
    """A checkpoint of the smoke model with random weights, trained (as its options say) with sentencepiece."""
    from onmt.inputters.inputter import vocabs_to_dict

    opt = support.load_train_opts(CONFIG)
    vocabs = support.load_vocabs(opt)
    model = support.build_model(opt, vocabs, seed=3)
    path = tmp_path_factory.mktemp("toy") / "model_step_1.pt"
    state = model.state_dict()
    torch.save({"model": {k: v for k, v in state.items() if not k.startswith("generator.")},
                "generator": {k[len("generator."):]: v for k, v in state.items() if k.startswith("generator.")},
                "vocab": vocabs_to_dict(vocabs), "opt": opt, "optim": None}, path)
    return path


def _translate(model, src, out, *extra, check=True):
    return support.run_cli("onmt_translate", "-model", model, "-src", src, "-output", out, "-max_length", 8,
                           "-beam_size", 2, *extra, check=check)


def test_raw_chinese_without_transforms_is_translated_as_its_segmented_form(toy_model, tmp_path):
    """The issue's case: raw Chinese, no -transforms, a model trained on the sample's jieba-segmented Chinese with
    sentencepiece.  The translation is that of the segmented sentences with the transforms given."""
    lines = 3
    raw, segmented = tmp_path / "raw.zh", tmp_path / "segmented.zh"
    tsv = (support.REPO / "data/tatoeba-zh-en/zh2en.multiref.tsv").read_text(encoding="utf-8").splitlines()
    raw.write_text("".join(line.split("\t")[0] + "\n" for line in tsv[:lines]), encoding="utf-8")
    segmented.write_text("\n".join((support.TATOEBA / "test.zh").read_text(encoding="utf-8").splitlines()[:lines])
                         + "\n", encoding="utf-8")
    given = _translate(toy_model, segmented, tmp_path / "given.en", "-transforms", "sentencepiece", *SPM)
    assert "warning" not in given.stderr
    forgotten = _translate(toy_model, raw, tmp_path / "forgotten.en")
    assert "onmt_translate: applying the model's preprocessing: -transforms jieba sentencepiece" in forgotten.stderr
    output = (tmp_path / "forgotten.en").read_text(encoding="utf-8")
    assert output == (tmp_path / "given.en").read_text(encoding="utf-8")
    assert "\u2581" not in output and len(output.splitlines()) == lines


def test_a_subword_model_missing_here_is_named_in_one_line(toy_model, tmp_path):
    opt = torch.load(toy_model, weights_only=True, mmap=True)["opt"]
    opt.src_subword_model = str(tmp_path / "gone" / "spm.zh.model")
    moved = tmp_path / "model_step_1.pt"
    torch.save({"model": {}, "generator": {}, "opt": opt}, moved)
    (tmp_path / "src.zh").write_text("我 很 高兴 。\n", encoding="utf-8")
    result = _translate(moved, tmp_path / "src.zh", tmp_path / "out.en", check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("onmt_translate: error: ")]
    assert len(errors) == 1, result.stderr[-3000:]
    assert f"-src_subword_model {opt.src_subword_model} (from training): no such file" in errors[0]
    assert not (tmp_path / "out.en").exists()


def test_given_subword_transforms_without_their_models_name_trainings_in_one_line(toy_model, tmp_path):
    """Issue 58: -transforms sentencepiece without -src_subword_model ended in a traceback from inside sentencepiece
    ("Either model_file or model_proto must be specified"); one line names training's files, before any model is
    built.  A given model file that is not there is named too."""
    src = tmp_path / "src.zh"
    src.write_text("我 很 高兴 。\n", encoding="utf-8")
    zh, en = support.TATOEBA / "spm.zh.model", support.TATOEBA / "spm.en.model"
    opt = torch.load(toy_model, weights_only=True, mmap=True)["opt"]
    assert (opt.src_subword_model, opt.tgt_subword_model) == ("build/tatoeba/spm.zh.model",
                                                              "build/tatoeba/spm.en.model")
    result = _translate(toy_model, src, tmp_path / "out.en", "-transforms", "sentencepiece", check=False)
    assert support.one_error_line(result, "onmt_translate", 2) == (
        "onmt_translate: error: -transforms sentencepiece needs -src_subword_model and -tgt_subword_model; the model "
        "was trained with -src_subword_model build/tatoeba/spm.zh.model -tgt_subword_model "
        "build/tatoeba/spm.en.model: pass them, or leave out -transforms to apply the model's own")
    assert "model_proto" not in result.stderr and "Loading checkpoint" not in result.stderr
    result = _translate(toy_model, src, tmp_path / "out.en", "-transforms", "sentencepiece", "-src_subword_model", zh,
                        check=False)
    assert support.one_error_line(result, "onmt_translate", 2).endswith(
        "needs -tgt_subword_model; the model was trained with -tgt_subword_model build/tatoeba/spm.en.model: pass it, "
        "or leave out -transforms to apply the model's own")
    result = _translate(toy_model, src, tmp_path / "out.en", "-transforms", "sentencepiece", "-src_subword_model",
                        tmp_path / "spm.zh.model", "-tgt_subword_model", en, check=False)
    assert support.one_error_line(result, "onmt_translate", 2) == (
        f"onmt_translate: error: -src_subword_model {tmp_path / 'spm.zh.model'}: no such file (the model was trained "
        "with build/tatoeba/spm.zh.model)")
    assert not (tmp_path / "out.en").exists()


@pytest.mark.parametrize("marked", ["▁I ▁am ▁happy .", "I am hap@@ py ."])
def test_evaluate_refuses_output_with_subword_marks(tmp_path, marked):
    (tmp_path / "hyp").write_text(f"It works .\n{marked}\n", encoding="utf-8")
    (tmp_path / "ref").write_text("It works .\nI am happy .\n", encoding="utf-8")
    command = [sys.executable, "-m", "tools.evaluate", "--hyp", tmp_path / "hyp", "--refs", tmp_path / "ref"]
    result = subprocess.run(command, cwd=support.REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and result.stdout == ""
    assert result.stderr.startswith(f"evaluate.py: error: hypothesis file {tmp_path / 'hyp'}, line 2: holds the "
                                    "subword mark")
    allowed = subprocess.run(command + ["--allow-subword-markers"], cwd=support.REPO, capture_output=True,
                             text=True, timeout=120)
    assert allowed.returncode == 0 and "BLEU" in allowed.stdout
