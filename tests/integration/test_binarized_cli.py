"""``onmt_ext_binarize`` then ``onmt_train -ext_binarized`` with two spawned data workers trains as from the text."""

import re
import subprocess

import pytest

import support

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("sample_data")]

CONFIG = "yaml_configs/demo/tatoeba_zhen.yaml"


def _train(tmp_path, name, *extra):
    log = tmp_path / f"{name}.log"
    subprocess.run([str(support.BIN / "onmt_train"), "-config", CONFIG, "-save_model", str(tmp_path / name),
                    "-save_data", str(tmp_path / "samples"), "-train_steps", "30", "-report_every", "10",
                    "-valid_steps", "1000", "-save_checkpoint_steps", "1000", "-num_workers", "2",
                    "-log_file", str(log), *extra],
                   cwd=support.REPO, env=support.cli_env(), check=True, capture_output=True, timeout=600)
    text = log.read_text(encoding="utf-8")
    # each report's step, accuracy, perplexity, cross-entropy, sentences and batch sizes: not its speed
    return re.findall(r"Step (\d+)/ *\d+; (acc: [^;]+; ppl: [^;]+; xent: [^;]+;) lr: [^;]+; (sents: [^;]+; "
                      r"bsz: [^;]+);", text), text


def test_training_from_binarised_data_reports_what_the_text_gives(tmp_path):
    directory = tmp_path / "bin"
    done = subprocess.run([str(support.BIN / "onmt_ext_binarize"), "-config", CONFIG, "-ext_binarized",
                           str(directory), "-save_data", str(tmp_path / "samples")],
                          cwd=support.REPO, env=support.cli_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    text, _ = _train(tmp_path, "text")
    binarized, log = _train(tmp_path, "binarized", "-ext_binarized", str(directory))
    assert len(text) == 3 and binarized == text
    assert f"training corpora read from {directory}, binarised: corpus_1 21,977 lines" in log
