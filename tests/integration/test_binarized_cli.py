"""``onmt_ext_binarize`` then ``onmt_train -ext_binarized`` with two spawned data workers trains as from the text; a
damaged directory, or a file in its place, ends either command in one line."""

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


def test_a_damaged_directory_or_a_file_in_its_place_ends_in_one_line(tmp_path):
    """An array cut short under an intact manifest stops onmt_train in one line, exit 1 (numpy's ValueError
    traceback before); a file named as the directory stops onmt_ext_binarize in one line, exit 2, and is kept."""
    directory = tmp_path / "bin"
    done = support.run_cli("onmt_ext_binarize", "-config", support.REPO / CONFIG, "-ext_binarized", directory,
                           "-save_data", tmp_path / "samples")
    assert (directory / "manifest.json").is_file(), done.stderr[-2000:]
    (directory / "corpus_1.tgt_ids.npy").write_bytes((directory / "corpus_1.tgt_ids.npy").read_bytes()[:1000])
    failed = support.run_cli("onmt_train", "-config", support.REPO / CONFIG, "-ext_binarized", directory,
                             "-save_model", tmp_path / "m", "-save_data", tmp_path / "samples", "-train_steps", 1,
                             check=False)
    assert support.one_error_line(failed, "onmt_train", 1) == (
        f"onmt_train: error: -ext_binarized {directory}: corpus_1.tgt_ids.npy is damaged (mmap length is greater "
        "than file size); binarise again with onmt_ext_binarize ... -overwrite")
    (tmp_path / "file").write_text("x", encoding="utf-8")
    failed = support.run_cli("onmt_ext_binarize", "-config", support.REPO / CONFIG, "-ext_binarized",
                             tmp_path / "file", "-save_data", tmp_path / "samples", "-overwrite", check=False)
    assert support.one_error_line(failed, "onmt_ext_binarize", 2).endswith(
        f"-ext_binarized {tmp_path / 'file'}: not a directory; name the directory that onmt_ext_binarize writes "
        "(it makes it)")
    assert (tmp_path / "file").read_text(encoding="utf-8") == "x"
