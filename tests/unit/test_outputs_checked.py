"""What the commands write and read, checked before anything is opened: an output that is one of the inputs, a
-log_file in a missing directory, vocabulary files of another format, truncated checkpoints, and
onmt_average_models' -output (onmt_ext.integration.commands and checkpoints, in process)."""

import argparse

import pytest
import torch

import support


def _translate_opt(tmp_path, **values):
    base = dict(models=[str(tmp_path / "model.pt")], src=str(tmp_path / "src.zh"), tgt=None,
                output=str(tmp_path / "hyp.en"), log_file="")
    return argparse.Namespace(**{**base, **values})


def _files(tmp_path):
    for name in ("model.pt", "src.zh", "ref.en"):
        (tmp_path / name).write_bytes(b"mine\n")


def test_an_output_that_is_an_input_is_refused(onmt_active, tmp_path):
    from onmt_ext.integration.commands import output_problems

    _files(tmp_path)
    assert output_problems(_translate_opt(tmp_path)) == []
    for key, option in (("models", "-model"), ("src", "-src"), ("tgt", "-tgt")):
        path = str(tmp_path / ("ref.en" if key == "tgt" else "model.pt" if key == "models" else "src.zh"))
        opt = _translate_opt(tmp_path, tgt=str(tmp_path / "ref.en"), output=path)
        problems = output_problems(opt)
        assert len(problems) == 1 and problems[0].startswith(f"-output {path}: is the {option} file"), problems
        # the same file by another name (a relative path, a symbolic link) too
        (tmp_path / f"link_{key}").symlink_to(path)
        assert output_problems(_translate_opt(tmp_path, tgt=str(tmp_path / "ref.en"),
                                              output=str(tmp_path / f"link_{key}")))
        log = output_problems(_translate_opt(tmp_path, tgt=str(tmp_path / "ref.en"), log_file=path))
        assert len(log) == 1 and log[0].startswith(f"-log_file {path}: is the {option} file"), log
    assert (tmp_path / "model.pt").read_bytes() == b"mine\n"  # nothing was opened for writing


def test_a_log_file_in_a_missing_directory_is_refused(onmt_active, tmp_path):
    from onmt_ext.integration.commands import log_file_problems, output_problems

    log = tmp_path / "logs" / "run.log"
    problems = output_problems(_translate_opt(tmp_path, log_file=str(log)))
    assert problems == [f"-log_file {log}: directory {tmp_path / 'logs'} does not exist; create it first"]
    train = argparse.Namespace(log_file=str(log), train_from=None, src_vocab=None, tgt_vocab=None, data={})
    assert log_file_problems(train) == problems
    assert log_file_problems(argparse.Namespace(log_file=str(tmp_path))) == \
        [f"-log_file {tmp_path}: is a directory; give the path of a file in it"]
    (tmp_path / "logs").mkdir()
    assert log_file_problems(train) == [] and log_file_problems(argparse.Namespace(log_file="")) == []
    vocab = tmp_path / "vocab.src"
    vocab.write_text("a\t1\n", encoding="utf-8")
    clash = argparse.Namespace(log_file=str(vocab), src_vocab=str(vocab), tgt_vocab=None, train_from=None,
                               data={"corpus_1": {"path_src": str(tmp_path / "x")}})
    assert log_file_problems(clash) == [f"-log_file {vocab}: is the -src_vocab file; give another -log_file"]
    # onmt_train checks before OpenNMT-py validates the options, while -data is still the config's YAML text
    corpus = tmp_path / "train.en"
    text = argparse.Namespace(log_file=str(corpus), src_vocab=None, tgt_vocab=None, train_from=None,
                              data=f"corpus_1: {{path_src: {tmp_path / 'train.zh'}, path_tgt: {corpus}}}")
    assert log_file_problems(text) == [
        f"-log_file {corpus}: is the -data corpus_1 path_tgt file; give another -log_file"]


def test_a_shared_vocabulary_leaves_the_target_vocabulary_unread(onmt_active, tmp_path):
    """With -share_vocab stock reads -src_vocab only: a leftover -tgt_vocab is not judged."""
    from onmt_ext.integration.commands import missing_vocabularies

    good, other = tmp_path / "vocab.txt", tmp_path / "spm.vocab"
    good.write_text("a\t3\n", encoding="utf-8")
    other.write_text("<unk>\t0\n\u2581a\t-1.5\n", encoding="utf-8")
    opt = argparse.Namespace(src_vocab=str(good), tgt_vocab=str(other), share_vocab=True)
    assert missing_vocabularies(opt) == []
    opt.share_vocab = False
    assert len(missing_vocabularies(opt)) == 1


def _vocab_opt(src, tgt=None):
    return argparse.Namespace(src_vocab=str(src), tgt_vocab=str(tgt) if tgt else None)


@pytest.mark.parametrize("content, expected", [
    (b"", "the file is empty"),
    (b"a\t3\n\xff\xfe\x00b\t2\n", "line 2 is not UTF-8 text"),
    ("<unk>\t0\n<s>\t0\n</s>\t0\n\u2581the\t-3.125\n".encode(), "line 4: this looks like a sentencepiece .vocab"),
    ("我 爱 你 。\n他 走 了 。\n".encode(), "line 1 is not `token<TAB>count`"),
    (b"a\t3\nb\t2\n\nc\t1\n", "line 3 is empty"),
    (b"a\t3\nb two\t2\n", "line 2 is not `token<TAB>count`"),
    (b"a\t3\r\nb\t2\r\n", "line 1 ends in a carriage return"),
    (b"a\nb\nc d\n", "line 3 is not a token"),
    ("a\t3\n\t7\n\u3000\t2\n".encode(), "line 2 holds an empty or whitespace token"),  # a corpus' double spaces
    (b"a\t3", "its only line has no newline at its end"),
])
def test_a_vocabulary_of_another_format_is_named_with_its_line(onmt_active, tmp_path, content, expected):
    from onmt_ext.integration.commands import missing_vocabularies

    vocab = tmp_path / "vocab.src"
    vocab.write_bytes(content)
    problems = missing_vocabularies(_vocab_opt(vocab))
    assert len(problems) == 1 and problems[0].startswith(f"-src_vocab {vocab}: {expected}"), problems
    assert "\n" not in problems[0]


def test_valid_vocabularies_are_accepted(onmt_active, sample_data, tmp_path):
    from onmt_ext.integration.commands import missing_vocabularies

    shared = support.REPO.parent / "shared" / "opennmt-py-3.5.1-data"
    paths = [sample_data / "vocab.zh", sample_data / "vocab.en"]
    paths += [shared / name for name in ("vocab-train.src", "vocab-train.tgt", "ggnnsrcvocab.txt", "ggnntgtvocab.txt")]
    plain = tmp_path / "plain"
    plain.write_text("<unk>\n<blank>\n\u2581我\n", encoding="utf-8")  # tokens without counts (stock reads them)
    for path in paths + [plain]:
        assert missing_vocabularies(_vocab_opt(path, path)) == [], path
    assert missing_vocabularies(_vocab_opt(tmp_path / "missing")) == \
        [f"-src_vocab {tmp_path / 'missing'}: no such file (onmt_build_vocab -config <your config> writes it)"]


def _tiny_checkpoint(path):
    opt = argparse.Namespace(encoder_type="transformer", decoder_type="transformer")
    torch.save({"model": {"w": torch.randn(64, 64)}, "generator": {"b": torch.randn(64)}, "opt": opt,
                "vocab": {"src": ["a"]}, "optim": None}, path)


def test_a_truncated_checkpoint_is_named_in_one_line(onmt_active, tmp_path):
    from onmt_ext.errors import UserError
    from onmt_ext.integration.checkpoints import _load_checkpoint

    whole = tmp_path / "model.pt"
    _tiny_checkpoint(whole)
    data = whole.read_bytes()
    stock = lambda path: torch.load(path, map_location="cpu")  # noqa: E731  (stock load_checkpoint's core)
    assert _load_checkpoint(stock, str(whole))["generator"]["b"].shape == (64,)
    for size in (5000, len(data) // 2, len(data) * 99 // 100, len(data) - 1, 100):
        truncated = tmp_path / f"t{size}.pt"
        truncated.write_bytes(data[:size])
        with pytest.raises(UserError) as caught:
            _load_checkpoint(stock, str(truncated))
        message = str(caught.value)
        assert message.startswith(f"{truncated} is not an OpenNMT-py checkpoint") and "\n" not in message, size


def test_average_models_output_is_checked(onmt_active, tmp_path):
    from onmt_ext.integration.checkpoints import average_output_problems

    models = [str(tmp_path / "a.pt"), str(tmp_path / "b.pt")]
    for path in models:
        (tmp_path / path).write_bytes(b"x")
    assert average_output_problems(models, str(tmp_path / "avg.pt")) == []
    assert average_output_problems(models, str(tmp_path / "nodir" / "avg.pt")) == \
        [f"-output {tmp_path / 'nodir' / 'avg.pt'}: directory {tmp_path / 'nodir'} does not exist; create it first"]
    assert average_output_problems(models, models[1]) == \
        [f"-output {models[1]}: is one of -models; give another -output (averaging would overwrite it)"]
    assert average_output_problems(models, str(tmp_path)) == \
        [f"-output {tmp_path}: is a directory; give the path of a file in it"]


def test_a_phrase_table_that_would_be_ignored_is_named(onmt_active, tmp_path):
    """Stock skips a -phrase_table that names no file without a word, and reads one only with -replace_unk."""
    from onmt_ext.integration.commands import phrase_table_problems

    table = tmp_path / "table.txt"
    assert phrase_table_problems(_translate_opt(tmp_path, phrase_table="", replace_unk=False)) == []
    assert phrase_table_problems(_translate_opt(tmp_path, phrase_table=str(table), replace_unk=True)) == [
        f"-phrase_table {table}: no such file"]
    table.write_text("猫|||cat\n", encoding="utf-8")
    assert phrase_table_problems(_translate_opt(tmp_path, phrase_table=str(table), replace_unk=False)) == [
        f"-phrase_table {table} has no effect without -replace_unk (it replaces <unk> only)"]
    assert phrase_table_problems(_translate_opt(tmp_path, phrase_table=str(table), replace_unk=True)) == []


def test_half_precision_on_the_cpu_is_named_once():
    """-model_dtype fp16 without GPU ranks trains in float32: one line names the option, in place of torch's two
    unnamed warnings (GradScaler's and autocast's)."""
    from argparse import Namespace

    from onmt_ext.integration import commands

    line = commands.cpu_half_warning(Namespace(model_dtype="fp16", gpu_ranks=[]))
    assert line.startswith("onmt_train: warning: -model_dtype fp16: this run trains on the CPU, in float32")
    ranks = commands.cpu_half_warning(Namespace(model_dtype="fp16", gpu_ranks=[0, 1]), cpu_ranks=True)
    assert ranks.startswith("onmt_train: warning: -model_dtype fp16: these ranks train on the CPU") and ranks != line
    assert commands.cpu_half_warning(Namespace(model_dtype="fp16", gpu_ranks=[0])) is None
    assert commands.cpu_half_warning(Namespace(model_dtype="fp32", gpu_ranks=[])) is None


def test_a_directory_given_as_a_vocabulary_is_named_so(tmp_path):
    from argparse import Namespace

    from onmt_ext.integration import commands

    assert commands.missing_vocabularies(Namespace(src_vocab=str(tmp_path), tgt_vocab=None)) == [
        f"-src_vocab {tmp_path}: is a directory, not a file"]
