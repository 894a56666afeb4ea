"""What the commands write and read, checked before anything is opened: an output that is one of the inputs, a
-log_file in a missing directory, vocabulary files of another format, truncated checkpoints, and
onmt_average_models' -output (onmt_ext.integration.commands and checkpoints, in process)."""

import argparse
import os

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


# ---------------------------------------------------------------- the config, transforms' files, streams, folders


def _train_opt(tmp_path, **values):
    base = dict(log_file="", config=None, train_from=None, src_vocab=None, tgt_vocab=None, data={}, transforms=[])
    return argparse.Namespace(**{**base, **values})


def test_the_config_and_the_transforms_files_are_inputs_too(onmt_active, tmp_path):
    """-log_file (and -output) may not be the -config, nor a file a transform reads: stock appends log lines to the
    config (the next run cannot parse it) or to the sentencepiece model, and empties a model given as -output."""
    from onmt_ext.integration.commands import log_file_problems, output_problems

    _files(tmp_path)
    config, spm, tagger, codes = (tmp_path / name for name in ("run.yaml", "spm.zh.model", "tagger.pt", "codes"))
    for path in (config, spm, tagger, codes):
        path.write_bytes(b"mine\n")
    assert log_file_problems(_train_opt(tmp_path, log_file=str(config), config=str(config))) == [
        f"-log_file {config}: is the -config file; give another -log_file"]
    spm_opt = _train_opt(tmp_path, log_file=str(spm), transforms=["sentencepiece"], src_subword_model=str(spm))
    assert log_file_problems(spm_opt) == [f"-log_file {spm}: is the -src_subword_model file; give another -log_file"]
    bpe = _train_opt(tmp_path, log_file=str(codes), data={"c": {"path_src": "x", "transforms": ["bpe"]}},
                     tgt_subword_model=str(codes))  # a corpus's own transforms too
    assert log_file_problems(bpe) == [f"-log_file {codes}: is the -tgt_subword_model file; give another -log_file"]
    tagged = _train_opt(tmp_path, log_file=str(tagger), transforms=["clause_split"], clause_tagger_model=str(tagger))
    assert log_file_problems(tagged) == [
        f"-log_file {tagger}: is the -clause_tagger_model file; give another -log_file"]
    # a transform not in use reads nothing
    assert log_file_problems(_train_opt(tmp_path, log_file=str(spm), src_subword_model=str(spm))) == []
    translate = _translate_opt(tmp_path, config=str(config), log_file=str(config), transforms=[])
    assert output_problems(translate) == [f"-log_file {config}: is the -config file; give another -log_file"]
    translate = _translate_opt(tmp_path, output=str(spm), transforms=["sentencepiece"], src_subword_model=str(spm))
    assert output_problems(translate) == [f"-output {spm}: is the -src_subword_model file; give another -output"]
    assert all(path.read_bytes() == b"mine\n" for path in (config, spm, tagger, codes))


def test_an_output_onto_a_file_of_the_checkpoints_transforms_is_refused(onmt_active, tmp_path):
    """Without -transforms onmt_translate applies the model's training transforms with their files: an -output
    onto the sentencepiece model training recorded would empty it."""
    from onmt_ext.integration.commands import output_problems

    _files(tmp_path)
    spm = tmp_path / "spm.en.model"
    spm.write_bytes(b"mine\n")
    model = tmp_path / "model.pt"
    torch.save({"model": {}, "opt": argparse.Namespace(transforms=["sentencepiece", "filtertoolong"],
                                                       src_subword_model=None, tgt_subword_model=str(spm))}, model)
    opt = _translate_opt(tmp_path, output=str(spm), transforms=[])
    assert output_problems(opt) == [f"-output {spm}: is the -tgt_subword_model file; give another -output"]
    assert output_problems(_translate_opt(tmp_path, transforms=[])) == []


def test_build_vocab_may_not_write_a_vocabulary_onto_a_corpus(onmt_active, tmp_path):
    """onmt_build_vocab -src_vocab <a corpus> -overwrite replaced the corpus by a vocabulary."""
    from onmt_ext.integration.commands import vocabulary_output_problems

    corpus = tmp_path / "train.zh"
    corpus.write_text("我 爱 你\n", encoding="utf-8")
    data = f"corpus_1: {{path_src: {corpus}, path_tgt: {tmp_path / 'train.en'}}}"  # the YAML text, unvalidated
    opt = _train_opt(tmp_path, data=data, src_vocab=str(corpus), tgt_vocab=str(tmp_path / "vocab.en"))
    assert vocabulary_output_problems(opt) == [
        f"-src_vocab {corpus}: is the -data corpus_1 path_src file; give another -src_vocab"]
    opt = _train_opt(tmp_path, data=data, src_vocab=str(tmp_path / "v"), tgt_vocab=str(tmp_path / "train.en"))
    assert vocabulary_output_problems(opt) == [
        f"-tgt_vocab {tmp_path / 'train.en'}: is the -data corpus_1 path_tgt file; give another -tgt_vocab"]
    opt.share_vocab = True  # stock writes -src_vocab alone
    assert vocabulary_output_problems(opt) == []


def test_directories_that_a_file_blocks_are_refused(onmt_active, tmp_path):
    """A -save_model under a file ended in a FileExistsError traceback after the data and model were built, a
    -tensorboard_log_dir that is a file in a NotADirectoryError; a -save_model that is a directory wrote its
    checkpoints beside it."""
    from onmt_ext.integration.commands import directory_problems

    afile = tmp_path / "afile"
    afile.write_text("x")
    opt = argparse.Namespace(save_model=str(afile / "sub" / "model"), tensorboard=False, tensorboard_log_dir=None)
    assert directory_problems(opt) == [f"-save_model {afile / 'sub' / 'model'}: {afile} is a file, not a directory; "
                                       "give a -save_model in a directory"]
    opt = argparse.Namespace(save_model=str(tmp_path / "new" / "model"), tensorboard=True,
                             tensorboard_log_dir=str(afile))
    assert directory_problems(opt) == [f"-tensorboard_log_dir {afile}: is a file, not a directory; give a directory "
                                       "(onmt_train creates it)"]
    opt.tensorboard = False
    assert directory_problems(opt) == []
    assert directory_problems(argparse.Namespace(save_model="model", tensorboard=True,
                                                 tensorboard_log_dir=str(tmp_path / "runs" / "x"))) == []
    for given in (str(tmp_path), str(tmp_path) + os.sep):  # a directory: stock's checkpoints land beside it
        (problem,) = directory_problems(argparse.Namespace(save_model=given, tensorboard=False))
        assert problem.startswith(f"-save_model {given}: is a directory, but -save_model is the checkpoints' path "
                                  "prefix") and problem.endswith(f"give {os.path.join(given, 'model')}")


def test_an_output_that_cannot_be_seeked_in_is_refused(onmt_active, tmp_path):
    """Stock opens -output for reading and writing: a pipe or a terminal (-output /dev/stdout | head) ended in an
    io.UnsupportedOperation traceback after the model was loaded; /dev/null still works."""
    from onmt_ext.integration.commands import output_problems, stream_output_problems

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert output_problems(_translate_opt(tmp_path, output=str(fifo))) == [
        f"-output {fifo}: is a pipe or a terminal, not a file; onmt_translate writes -output only into a file it can "
        "seek in: give a file and read it after (cat)"]
    read, write = os.pipe()
    try:
        assert stream_output_problems("-output", f"/proc/self/fd/{write}")  # a pipe with a reader: /dev/stdout | head
    finally:
        os.close(read)
        os.close(write)
    assert stream_output_problems("-output", os.devnull) == []
    assert stream_output_problems("-output", str(tmp_path / "hyp")) == []


def test_binarize_checks_its_log_file_first(onmt_active, tmp_path):
    """onmt_ext_binarize -log_file <a directory> ended in an IsADirectoryError traceback."""
    from onmt_ext.errors import UsageError
    from onmt_ext.integration.binarize import binarize

    config = support.REPO / "yaml_configs/smoke/foundation/ext_transformer.yaml"
    with pytest.raises(UsageError) as caught:
        binarize(["-config", str(config), "-ext_binarized", str(tmp_path / "bin"), "-log_file", str(tmp_path)])
    assert caught.value.message == f"-log_file {tmp_path}: is a directory; give the path of a file in it"
    assert not (tmp_path / "bin").exists()


def test_average_models_replaces_only_a_checkpoint(onmt_active, tmp_path):
    """onmt_average_models -output <the user's corpus> replaced it without a word; a checkpoint is still replaced."""
    from onmt_ext.integration.checkpoints import average_output_problems

    models = [str(tmp_path / "a.pt")]
    _tiny_checkpoint(models[0])
    corpus, old = tmp_path / "a.zh", tmp_path / "avg.pt"
    corpus.write_text("我 爱 你\n", encoding="utf-8")
    _tiny_checkpoint(old)
    assert average_output_problems(models, str(corpus)) == [
        f"-output {corpus}: exists and is not an OpenNMT-py checkpoint; give another -output (averaging replaces "
        "only a checkpoint), or remove the file first"]
    assert average_output_problems(models, str(old)) == []
    assert average_output_problems(models, os.devnull) == []  # (a dry run's average, written as stock writes it)


def test_a_pipe_given_as_an_input_file_is_named_as_such(tmp_path):
    """`cat t.zh | onmt_translate -src /dev/stdin` said `no such file`: onmt-ext reads -src more than once (its
    checks, then the translation), which a pipe cannot give."""
    from onmt_ext.runtime.corpus import not_a_file

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert not_a_file(str(fifo)) == ("is a pipe or a device, not a regular file; onmt-ext reads its input files more "
                                     "than once (it checks them first), which a pipe cannot give: write it to a file "
                                     "first")
    assert not_a_file(str(tmp_path / "none")) == "no such file"
