"""onmt_ext.runtime.corpus through the real console scripts: a damaged corpus stops the command with the file and line.

Moved out of tests/unit/test_corpus.py (unit/ runs in-process only): ``onmt_train`` refuses training files of
different lengths, and ``onmt_translate`` a source that is not UTF-8 before it loads a model, each with the files
or the line named and no traceback; ``onmt_train`` names a corpus whose every pair the filters drop, refuses one
whose every pair has an empty side at start-up, and names a validation set that the filters drop entirely (slow).
"""

import pytest

import support


def test_train_refuses_misaligned_files_without_a_traceback(sample_data, onmt_active, tmp_path):
    src = tmp_path / "train.zh"
    lines = (support.TATOEBA / "train.zh").read_text(encoding="utf-8").splitlines()[:50]
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tgt = tmp_path / "train.en"
    tgt.write_text("\n".join((support.TATOEBA / "train.en").read_text(encoding="utf-8").splitlines()[:49]) + "\n",
                   encoding="utf-8")
    config = tmp_path / "bad.yaml"
    base = (support.REPO / "yaml_configs/smoke/baseline/transformer_base_wmt14_ende.yaml").read_text(encoding="utf-8")
    config.write_text(base.replace("path_src: build/tatoeba/train.zh", f"path_src: {src}")
                      .replace("path_tgt: build/tatoeba/train.en", f"path_tgt: {tgt}"), encoding="utf-8")
    result = support.run_cli("onmt_train", "-config", config, "-save_model", tmp_path / "m", "-save_data",
                             tmp_path / "s", "-train_steps", 2, check=False)
    # exit 1: the files exist and the options are right; their content is wrong (docs/troubleshooting.md, "Exit
    # status")
    assert f"{src} has 50 lines but {tgt} has 49" in support.one_error_line(result, "onmt_train", 1)


def test_translate_refuses_a_source_that_is_not_utf8_before_loading_anything(onmt_active, tmp_path):
    bad = tmp_path / "bad.zh"
    bad.write_bytes("你好\n".encode() + "再见\n".encode("gb18030"))
    (tmp_path / "never_read.pt").write_bytes(b"not a checkpoint")  # (read, it would be refused)
    result = support.run_cli("onmt_translate", "-model", tmp_path / "never_read.pt", "-src", bad, "-output",
                             tmp_path / "out", check=False)
    assert f"{bad}, line 2: not UTF-8" in support.one_error_line(result, "onmt_translate", 1)


@pytest.mark.slow  # onmt_train builds its model and starts two data workers
def test_train_names_a_corpus_whose_every_pair_the_filters_drop(sample_data, onmt_active, tmp_path):
    """Stock's data workers end in a ``TypeError`` traceback (a bucket of dropped pairs), or would restart the corpora
    for ever: one line from the worker, through the DataLoader, naming the corpus and the filter's options."""
    config = support.REPO / "yaml_configs/smoke/baseline/transformer_base_wmt14_ende.yaml"
    result = support.run_cli("onmt_train", "-config", config, "-save_model", tmp_path / "m", "-save_data",
                             tmp_path / "s", "-train_steps", 2, "-num_workers", 2, "-src_seq_length", 1,
                             "-tgt_seq_length", 1, check=False, timeout=300)
    assert support.one_error_line(result, "onmt_train", 2).endswith(
        "-src_seq_length 1, -tgt_seq_length 1) drop every pair of data share 0 of 2 (-world_size × -num_workers), so "
        "training would never get a batch: loosen the filters or check the corpus, or use fewer -num_workers")


def _smoke_config(tmp_path, **paths):
    """The smoke config with corpus files replaced: ``train_zh=...`` for ``build/tatoeba/train.zh`` and so on."""
    config = tmp_path / "config.yaml"
    text = (support.REPO / "yaml_configs/smoke/baseline/transformer_base_wmt14_ende.yaml").read_text(encoding="utf-8")
    for key, path in paths.items():
        text = text.replace(f"build/tatoeba/{key.replace('_', '.')}\n", f"{path}\n")
    config.write_text(text, encoding="utf-8")
    return config


@pytest.mark.slow  # onmt_train's start-up
def test_train_refuses_a_corpus_whose_every_pair_has_an_empty_side(sample_data, onmt_active, tmp_path):
    """Pairs with an empty side are skipped; with none left, stock's corpus mixer ends in an ``UnboundLocalError``
    traceback (or ``RuntimeError``, a generator raised ``StopIteration``): one line at start-up instead."""
    src = tmp_path / "train.zh"
    src.write_text("\n" * 30, encoding="utf-8")
    tgt = tmp_path / "train.en"
    tgt.write_text("".join((support.TATOEBA / "train.en").read_text(encoding="utf-8").splitlines(True)[:30]),
                   encoding="utf-8")
    result = support.run_cli("onmt_train", "-config", _smoke_config(tmp_path, train_zh=src, train_en=tgt),
                             "-save_model", tmp_path / "m", "-save_data", tmp_path / "s", "-train_steps", 2,
                             check=False, timeout=120)
    assert support.one_error_line(result, "onmt_train", 1) == (
        f"onmt_train: error: corpus 'corpus_1': no pair has text on both sides ({src}: 30 of 30 lines empty; {tgt}: "
        "0 of 30), and pairs with an empty side are skipped, so training would never get a batch: check the files, "
        "or leave the corpus out (weight 0)")
    assert "number of parameters" not in result.stderr  # before any model is built


@pytest.mark.slow  # onmt_train trains a step and starts a data worker
def test_train_names_a_validation_set_whose_every_pair_the_filters_drop(sample_data, onmt_active, tmp_path):
    """filtertoolong drops every validation pair: stock's first validation gets no batch and its report ends in a
    ``ZeroDivisionError`` traceback; one line instead, from a validation read by a data worker too."""
    lines = (support.TATOEBA / "valid.zh").read_text(encoding="utf-8").splitlines()[:20]
    src = tmp_path / "valid.zh"
    src.write_text("".join(" ".join([line] * 30) + "\n" for line in lines), encoding="utf-8")
    tgt = tmp_path / "valid.en"
    tgt.write_text("".join((support.TATOEBA / "valid.en").read_text(encoding="utf-8").splitlines(True)[:20]),
                   encoding="utf-8")
    result = support.run_cli("onmt_train", "-config", _smoke_config(tmp_path, valid_zh=src, valid_en=tgt),
                             "-save_model", tmp_path / "m", "-save_data", tmp_path / "s", "-train_steps", 2,
                             "-valid_steps", 1, "-src_seq_length", 40, "-num_workers", 1, check=False, timeout=120)
    assert support.one_error_line(result, "onmt_train", 2) == (
        f"onmt_train: error: corpus 'valid' ({src}): its transforms (sentencepiece, filtertoolong: -src_seq_length 40, "
        "-tgt_seq_length 100) drop every pair, so validation gets no batch: loosen the filters, give the validation "
        "set transforms of its own (data: valid: transforms), or check the corpus")
