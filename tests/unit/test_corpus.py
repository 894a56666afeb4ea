"""onmt_ext.runtime.corpus, in-process: damaged corpora stop with the file and line.

The same checks through the real commands (onmt_train, onmt_translate) are in
tests/integration/test_corpus_cli.py.
"""

import argparse
import itertools
import sys

import pytest
import yaml

from onmt_ext.runtime import corpus


def _write(path, data):
    path.write_bytes(data)
    return path


def test_scan_counts_lines_including_an_unterminated_last_one(tmp_path):
    assert corpus.scan_file(_write(tmp_path / "a", "一\n二\n三".encode())) == (3, False, 0, ())
    assert corpus.scan_file(_write(tmp_path / "b", b"")) == (0, False, 0, ())
    assert corpus.scan_file(_write(tmp_path / "c", "\ufeffhi\n".encode())) == (1, True, 0, ())


@pytest.mark.parametrize("block", [1 << 24, 3])  # lines and characters cut across blocks too
def test_scan_counts_empty_and_whitespace_only_lines(tmp_path, monkeypatch, block):
    monkeypatch.setattr(corpus, "_BLOCK", block)
    # empty, spaces and a tab, CRLF, an ideographic space, a BOM-only first line, an unterminated last one
    data = "\ufeff\nun\n\n \t\nx\r\n\r\n\u3000\n好\n ".encode()
    scan = corpus.scan_file(_write(tmp_path / "e", data))
    assert (scan.lines, scan.empty, scan.empty_lines) == (9, 6, (1, 3, 4, 6, 7))
    assert corpus.scan_file(_write(tmp_path / "f", b"a\n\n")).empty_lines == (2,)


def _empty_corpus(tmp_path):
    src = _write(tmp_path / "train.zh", "一\n\n三\n四\n  \n".encode())
    tgt = _write(tmp_path / "train.en", b"one\ntwo\n\nfour\n\n")
    return src, tgt


def test_empty_lines_of_a_training_corpus_are_logged_with_their_line_numbers(tmp_path, caplog):
    src, tgt = _empty_corpus(tmp_path)
    with caplog.at_level("WARNING", logger="onmt"):
        corpus._check_data_option({"corpus_1": {"path_src": str(src), "path_tgt": str(tgt)}})
    assert [r.levelname for r in caplog.records] == ["WARNING", "WARNING"]
    assert caplog.records[0].getMessage().startswith(
        f"corpus 'corpus_1': {src} has 2 empty lines (lines 2, 5): pairs with an empty source or target are skipped")
    assert f"{tgt} has 2 empty lines (lines 3, 5)" in caplog.records[1].getMessage()
    with pytest.raises(SystemExit, match=r"train.zh has 2 empty lines \(lines 2, 5\).*-skip_empty_level error"):
        corpus._check_data_option({"corpus_1": {"path_src": str(src), "path_tgt": str(tgt)}}, "error")


def test_pairs_with_an_empty_side_are_skipped_in_training_not_in_translation(onmt_active, tmp_path):
    from onmt.inputters.text_corpus import ParallelCorpus, ParallelCorpusIterator
    from onmt.transforms import TransformPipe

    src, tgt = _empty_corpus(tmp_path)
    pipe = TransformPipe.build_from([])
    pairs = [(e["src"], e["tgt"], e["cid_line_number"])
             for e, _, _ in ParallelCorpusIterator(ParallelCorpus("corpus_1", str(src), str(tgt)), pipe)]
    assert pairs == [(["一"], ["one"], 0), (["四"], ["four"], 3)]  # not <unk> targets, not silent drops
    # the translation corpus keeps every line (dropping one would misalign the output)
    infer = ParallelCorpusIterator(ParallelCorpus("infer", str(src), None), pipe)
    assert [e["cid_line_number"] for e, _, _ in infer] == [0, 1, 2, 3, 4]


def test_translate_refuses_a_source_with_empty_lines_by_name(onmt_active, tmp_path, caplog, capsys):
    import argparse
    import re

    from onmt.bin import translate as translate_bin

    src, tgt = _empty_corpus(tmp_path)
    with pytest.raises(SystemExit) as stop:
        translate_bin.translate(argparse.Namespace(src=str(src), tgt=None))
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert re.fullmatch(rf"onmt_translate: error: -src {re.escape(str(src))} has 2 empty lines \(lines 2, 5\): .*wrong "
                        r"line; remove them.*\n", err), err
    full = _write(tmp_path / "full.zh", "一\n二\n三\n四\n五\n".encode())
    with caplog.at_level("WARNING", logger="onmt"):
        corpus.check_translation_source(str(full), str(tgt))
    assert f"-tgt {tgt} has 2 empty lines (lines 3, 5): their GOLD scores are those of an <unk> target" \
        in caplog.text


def test_a_line_that_is_not_utf8_is_named(tmp_path):
    path = _write(tmp_path / "train.zh", "好\n好\n".encode() + "坏\n".encode("gb18030") + b"ok\n")
    with pytest.raises(SystemExit, match=r"train.zh, line 3: not UTF-8"):
        corpus.scan_file(path)


def test_a_bad_byte_after_the_first_block_gets_the_right_line(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "_BLOCK", 8)
    path = _write(tmp_path / "t", b"aaaa\nbbbb\ncccc\ndd\xffd\n")
    with pytest.raises(SystemExit, match=r"t, line 4: not UTF-8"):
        corpus.scan_file(path)


def test_truncated_multibyte_character_at_the_end(tmp_path):
    path = _write(tmp_path / "t", "ab\n好".encode()[:-1])
    with pytest.raises(SystemExit, match=r"line 2: ends inside a UTF-8 character"):
        corpus.scan_file(path)


def test_different_line_counts_name_both_files(tmp_path):
    src = _write(tmp_path / "train.zh", "一\n二\n三\n".encode())
    tgt = _write(tmp_path / "train.en", b"one\ntwo\n")
    with pytest.raises(SystemExit, match=r"corpus 'corpus_1': .*train.zh has 3 lines but .*train.en has 2"):
        corpus.check_corpus("corpus_1", src, tgt)


def test_a_byte_order_mark_is_taken_off_the_first_example(onmt_active, tmp_path, caplog):
    from onmt.inputters.text_corpus import ParallelCorpus

    src = _write(tmp_path / "s", "\ufeff你好\n再见\n".encode())
    tgt = _write(tmp_path / "t", b"hello\nbye\n")
    with caplog.at_level("WARNING", logger="onmt"):
        examples = list(ParallelCorpus("c", str(src), str(tgt)).load())
    assert [e["src"].strip() for e in examples] == ["你好", "再见"]
    assert examples[0]["src_original"].strip() == "你好"
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"corpus 'c': byte-order mark at the start of {src} removed from the first line"]


def test_only_the_files_first_line_loses_its_byte_order_mark_in_every_share(onmt_active, tmp_path):
    """Each data worker and rank loads a share (stride, offset): the first example of a share other than offset
    0's is not line 0, and a byte-order mark there (files joined by hand) is the line's own, as in one process."""
    from onmt.inputters.text_corpus import ParallelCorpus

    src = _write(tmp_path / "s", "\ufeffa\nb\n\ufeffc\nd\n".encode())
    tgt = _write(tmp_path / "t", b"1\n2\n3\n4\n")
    whole = [e["src"].rstrip("\n") for e in ParallelCorpus("c", str(src), str(tgt)).load()]
    assert whole == ["a", "b", "\ufeffc", "d"]
    shares = [[e["src"].rstrip("\n") for e in ParallelCorpus("c", str(src), str(tgt)).load(offset, 2)]
              for offset in (0, 1)]
    assert shares == [["a", "b"], ["\ufeffc", "d"]]


def test_a_corpus_too_small_for_its_data_shares_is_named(tmp_path):
    """With S = world_size x num_workers shares, OpenNMT-py's share k starts at line k·S: a corpus of at most
    (S - 1)·S lines leaves the last share empty, which stock's mixer ends in an UnboundLocalError traceback."""
    def data(lines):
        src = _write(tmp_path / f"s{lines}", "".join(f"{i}\n" for i in range(lines)).encode())
        return {"small": {"path_src": str(src), "path_tgt": str(src)}, "valid": {"path_src": str(tmp_path / "none")}}

    corpus.check_shares(data(3), 1, 2)  # shares 0 and 1: lines 0-1 and 2
    corpus.check_shares(data(2), 1, 0)  # one share: read in the training process
    with pytest.raises(SystemExit) as stopped:
        corpus.check_shares(data(2), 1, 2)
    assert stopped.value.status == 2 and stopped.value.message == (
        "corpus 'small': its 2 lines are too few for 2 data shares (-world_size 1 × -num_workers 2): OpenNMT-py "
        "gives each share blocks of 2 lines in turn, so the last share's first line would be line 3; use fewer "
        "-num_workers (0 reads in the training process) or a larger corpus")
    corpus.check_shares(yaml.safe_dump(data(13)), 2, 2)  # as -data comes (YAML text); 4 shares need 13 lines
    with pytest.raises(SystemExit, match=r"its 12 lines are too few for 4 data shares \(-world_size 2 × "):
        corpus.check_shares(data(12), 2, 2)
    # tensor-parallel ranks each read the whole corpus (stock's stride 1): only the data workers share it
    small = {"small": data(3)["small"]}
    opt = argparse.Namespace(data=small, world_size=2, num_workers=2, parallel_mode="tensor_parallel")
    assert corpus._validate_data(lambda cls, opt: "validated", None, opt) == "validated"
    opt.parallel_mode = "data_parallel"
    with pytest.raises(SystemExit, match=r"its 3 lines are too few for 4 data shares"):
        corpus._validate_data(lambda cls, opt: "validated", None, opt)


def test_missing_corpus_file_is_named(tmp_path):
    with pytest.raises(SystemExit, match=r"corpus 'corpus_1': path_tgt .*nope.en: no such file"):
        corpus._check_data_option({"corpus_1": {"path_src": str(_write(tmp_path / "a", b"x\n")),
                                                "path_tgt": str(tmp_path / "nope.en")}})


def _text_training(tmp_path, src_lines, tgt_lines, **changes):
    """Options of the demo config training on ``src_lines``/``tgt_lines`` (no subwords: filtertoolong alone)."""
    import support

    config = yaml.safe_load((support.REPO / "yaml_configs/demo/tatoeba_zhen.yaml").read_text(encoding="utf-8"))
    src = _write(tmp_path / "train.zh", "".join(f"{line}\n" for line in src_lines).encode())
    tgt = _write(tmp_path / "train.en", "".join(f"{line}\n" for line in tgt_lines).encode())
    config.update(src_vocab=str(support.TATOEBA / "vocab.zh"), tgt_vocab=str(support.TATOEBA / "vocab.en"),
                  transforms=["filtertoolong"], save_data=str(tmp_path / "samples"),
                  save_model=str(tmp_path / "model"), bucket_size=16, batch_size=256, num_workers=0,
                  data={"corpus_1": {"path_src": str(src), "path_tgt": str(tgt), "weight": 1},
                        "valid": {"path_src": str(support.TATOEBA / "valid.zh"),
                                  "path_tgt": str(support.TATOEBA / "valid.en")}})
    config.update(changes)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return _options(path)


def _options(path):
    import support
    from onmt.utils.parse import ArgumentParser

    opt = support.load_train_opts(path)
    ArgumentParser.validate_train_opts(opt)
    return opt


def _batches(opt, count, stride=1, offset=0):
    """The first ``count`` training batches of ``opt`` as a data worker of share ``offset`` of ``stride`` makes
    them (in this process)."""
    import torch
    from onmt import train_single
    from onmt.constants import CorpusTask
    from onmt.inputters import dynamic_iterator
    from onmt.inputters.text_corpus import get_corpora
    from onmt.transforms import make_transforms

    _, vocabs, transforms_cls = train_single._init_train(opt)
    data = dynamic_iterator.DynamicDatasetIter.from_opt(
        get_corpora(opt, CorpusTask.TRAIN), make_transforms(opt, transforms_cls, vocabs), vocabs, opt,
        CorpusTask.TRAIN, False, torch.device("cpu"), stride=stride, offset=offset)
    data.num_workers = 0
    data._init_datasets(0)
    return [batch for batch, _ in itertools.islice(data, count)]


def _sample(count):
    import support

    return ([line.rstrip("\n") for line in (support.TATOEBA / name).open(encoding="utf-8")][:count]
            for name in ("train.zh", "train.en"))


def test_a_bucket_whose_pairs_are_all_filtered_is_skipped(onmt_active, sample_data, tmp_path):
    """Stock's ``process`` gives None for a bucket whose pairs a transform drops, and the iterator then ends in a
    ``TypeError``: the bucket is empty instead, and the next ones make the batches."""
    src, tgt = _sample(100)
    for line in range(40):  # the first buckets of 16: too long
        src[line] = " ".join([src[line]] * 30)
    assert len(_batches(_text_training(tmp_path, src, tgt, src_seq_length=40), 3)) == 3


def test_training_data_that_the_filters_drop_entirely_is_named_not_looped_on(onmt_active, sample_data, tmp_path):
    """Every pair too long: stock's iterator ends in a ``TypeError`` (or, once empty buckets pass, restarts the
    corpora for ever, making no batch): one line instead, once every corpus has been read through, naming the
    corpus and the filter's options; a data share whose pairs are all dropped is named too."""
    src, tgt = _sample(40)
    opt = _text_training(tmp_path, src, tgt, src_seq_length=1, tgt_seq_length=1)
    with pytest.raises(corpus.NoKeptPair) as stopped:
        _batches(opt, 1)
    assert stopped.value.status == 2 and stopped.value.message == (
        "corpus 'corpus_1': its transforms (filtertoolong: -src_seq_length 1, -tgt_seq_length 1) drop every pair, "
        "so training would never get a batch: loosen the filters or check the corpus")
    for line in range(len(src)):  # share 1 of 2 (lines 2, 3, 6, 7, ...: blocks of 2 in turn) too long
        if (line // 2) % 2 == 1:
            src[line] = " ".join([src[line]] * 30)
    assert len(_batches(_text_training(tmp_path, src, tgt, src_seq_length=40), 1, 2, 0)) == 1
    with pytest.raises(corpus.NoKeptPair, match=r"^error: corpus 'corpus_1': its transforms \(filtertoolong: "
                                                 r"-src_seq_length 40, -tgt_seq_length 100\) drop every pair of "
                                                 r"data share 1 of 2 \(-world_size × -num_workers\), .* or use "
                                                 "fewer -num_workers$"):
        _batches(_options(tmp_path / "config.yaml"), 1, 2, 1)


def test_the_error_of_a_data_worker_reaches_the_training_process_as_one_line():
    """torch's DataLoader hands a worker's exception on as its type called with ``Caught … Original Traceback …``
    (``ExceptionWrapper.reraise``), and a worker hands on Exceptions only: the message comes back whole."""
    from torch._utils import ExceptionWrapper

    try:
        raise corpus.NoKeptPair("corpus 'c': its transforms (x) drop every pair")
    except corpus.NoKeptPair:
        wrapped = ExceptionWrapper(sys.exc_info(), where="in DataLoader worker process 0")
    with pytest.raises(corpus.NoKeptPair) as stopped:
        wrapped.reraise()
    assert (stopped.value.message, stopped.value.status) == ("corpus 'c': its transforms (x) drop every pair", 2)


def _pairs(tmp_path, name, src_lines, tgt_lines):
    """Files ``<name>.zh``/``<name>.en`` of ``src_lines``/``tgt_lines``, as a corpus entry of ``-data``."""
    src = _write(tmp_path / f"{name}.zh", "".join(f"{line}\n" for line in src_lines).encode())
    tgt = _write(tmp_path / f"{name}.en", "".join(f"{line}\n" for line in tgt_lines).encode())
    return {"path_src": str(src), "path_tgt": str(tgt)}


def test_a_corpus_whose_every_pair_has_an_empty_side_is_refused_at_start_up(onmt_active, sample_data, tmp_path):
    """Pairs with an empty side are skipped; where that leaves a training corpus read (weight above 0), a data share
    of one, or the validation set without a pair, stock's corpus mixer ends in an ``UnboundLocalError`` or
    ``RuntimeError`` (``StopIteration``) traceback, and validation divides by zero: one line at start-up
    instead (``_validate_data``, before any model is built), naming the corpus, its files and the share."""
    import support

    src, tgt = _sample(40)
    # no line has both sides empty, yet every pair has one: sources 0, 2, ... empty, targets 1, 3, ... blank
    holes = ["" if line % 2 == 0 else text for line, text in enumerate(src)]
    blanks = [" \t" if line % 2 else text for line, text in enumerate(tgt)]
    opt = _text_training(tmp_path, holes, blanks)
    with pytest.raises(corpus.CorpusError) as stopped:
        _batches(opt, 1)
    zh, en = tmp_path / "train.zh", tmp_path / "train.en"
    assert stopped.value.status == 1 and stopped.value.message == (
        f"corpus 'corpus_1': no pair has text on both sides ({zh}: 20 of 40 lines empty; {en}: 20 of 40), and "
        "pairs with an empty side are skipped, so training would never get a batch: check the files, or leave the "
        "corpus out (weight 0)")
    # a corpus of weight 0 is not read: no matter
    valid = {"path_src": str(support.TATOEBA / "valid.zh"), "path_tgt": str(support.TATOEBA / "valid.en")}
    data = {"corpus_1": {**_pairs(tmp_path, "good", src, tgt), "weight": 1},
            "unread": {**_pairs(tmp_path, "holes", holes, blanks), "weight": 0}, "valid": valid}
    assert len(_batches(_text_training(tmp_path, src, tgt, data=data), 1)) == 1
    # a data share: lines 2, 3, 6, 7, ... (share 1 of 2) without a source
    shared = ["" if (line // 2) % 2 == 1 else text for line, text in enumerate(src)]
    opt = _text_training(tmp_path, shared, tgt, num_workers=2)
    with pytest.raises(corpus.CorpusError) as stopped:
        _batches(opt, 1, 2, 1)
    assert stopped.value.status == 2 and stopped.value.message == (
        "corpus 'corpus_1': no pair of data share 1 of 2 (-world_size 1 × -num_workers 2) has text on both sides, "
        "and pairs with an empty side are skipped, so that share would never make a batch: use fewer -num_workers "
        f"(0 reads in the training process), or check the files ({zh}, {en})")
    # the validation set (one share: a data worker's part of it may be empty)
    data = {"corpus_1": {**_pairs(tmp_path, "good", src, tgt), "weight": 1},
            "valid": _pairs(tmp_path, "valid", holes, blanks)}
    with pytest.raises(corpus.CorpusError) as stopped:
        _batches(_text_training(tmp_path, src, tgt, data=data, num_workers=2), 1)
    assert stopped.value.status == 1 and stopped.value.message.startswith(
        f"corpus 'valid': no pair has text on both sides ({tmp_path / 'valid.zh'}: 20 of 40 lines empty; ") and \
        stopped.value.message.endswith("so validation would never get a batch: check the files, or leave the "
                                       "validation set out")
    data["valid"] = {**valid, "weight": 0}  # stock's mixer reads the validation set weight times
    with pytest.raises(corpus.CorpusError, match=r"^error: corpus 'valid': weight 0: OpenNMT-py reads the "):
        _batches(_text_training(tmp_path, src, tgt, data=data), 1)
    # -skip_empty_level error stops at the first empty line, as before
    with pytest.raises(corpus.CorpusError, match=r"\(-skip_empty_level error\): remove those pairs"):
        _batches(_text_training(tmp_path, holes, blanks, skip_empty_level="error"), 1)


def _trainer(opt):
    """A ``Trainer`` of ``opt`` with a small model, its vocabularies and transform classes."""
    import torch
    from onmt import train_single
    from onmt.model_builder import build_model
    from onmt.trainer import build_trainer
    from onmt.utils.optimizers import Optimizer

    _, vocabs, transforms_cls = train_single._init_train(opt)
    torch.manual_seed(1)
    model = build_model(opt, opt, vocabs, None, -1)
    return build_trainer(opt, -1, model, vocabs, Optimizer.from_opt(model, opt)), vocabs, transforms_cls


def test_a_validation_set_that_the_filters_drop_entirely_is_named(onmt_active, sample_data, tmp_path):
    """filtertoolong applies to the validation set too: where it drops every validation pair, stock's validation
    gets no batch and the report divides by zero (``ZeroDivisionError`` in ``Statistics.ppl``). The first
    validation stops with one line naming the corpus, its file and its filters instead; a validation that gets
    batches is stock's."""
    from onmt import train_single
    from onmt.constants import CorpusTask

    src, tgt = _sample(40)
    data = {"corpus_1": {**_pairs(tmp_path, "train", src, tgt), "weight": 1},
            "valid": _pairs(tmp_path, "valid", [" ".join([line] * 30) for line in src[:20]], tgt[:20])}
    opt = _text_training(tmp_path, src, tgt, data=data, src_seq_length=40, hidden_size=16, word_vec_size=16,
                         transformer_ff=32, enc_layers=1, dec_layers=1)
    trainer, vocabs, transforms_cls = _trainer(opt)
    valid_iter = train_single.build_dynamic_dataset_iter(opt, transforms_cls, vocabs, task=CorpusTask.VALID)
    with pytest.raises(corpus.NoKeptPair) as stopped:
        trainer.validate(valid_iter)
    assert stopped.value.status == 2 and stopped.value.message == (
        f"corpus 'valid' ({tmp_path / 'valid.zh'}): its transforms (filtertoolong: -src_seq_length 40, "
        "-tgt_seq_length 100) drop every pair, so validation gets no batch: loosen the filters, give the validation "
        "set transforms of its own (data: valid: transforms), or check the corpus")
    data["valid"] = _pairs(tmp_path, "kept", src[:20], tgt[:20])
    opt = _text_training(tmp_path, src, tgt, data=data, src_seq_length=40, hidden_size=16, word_vec_size=16,
                         transformer_ff=32, enc_layers=1, dec_layers=1)
    trainer, vocabs, transforms_cls = _trainer(opt)
    valid_iter = train_single.build_dynamic_dataset_iter(opt, transforms_cls, vocabs, task=CorpusTask.VALID)
    stats = trainer.validate(valid_iter)
    assert stats.n_words == sum(len(line.split()) + 1 for line in tgt[:20]) and stats.ppl() > 1


@pytest.mark.parametrize("shares", [1, 2, 3, 8])
def test_share_of_deals_lines_as_stock_loads_them(onmt_active, shares):
    """corpus.share_of, which the share checks and the binarised cache read, against stock's ParallelCorpus.load."""
    from onmt.inputters.text_corpus import ParallelCorpus

    from onmt_ext.runtime import binarized

    lines = [f"line {number}" for number in range(3 * shares * shares + 2)]
    for share in range(shares):
        loaded = [int(example["src"].split()[1]) for example in
                  ParallelCorpus("train", lines, lines).load(offset=share, stride=shares)]
        assert loaded == [n for n in range(len(lines)) if corpus.share_of(n, shares) == share]
        assert loaded == binarized._share(len(lines), shares, share).tolist()


def test_a_directory_given_as_a_file_is_named_so(onmt_active, tmp_path):
    """-src, a corpus path, a checkpoint or a transform's model naming a directory: said, not "no such file"."""
    from onmt_ext.integration import checkpoints

    assert corpus.not_a_file(str(tmp_path)) == "is a directory, not a file"
    assert corpus.not_a_file(str(tmp_path / "none"), "checkpoint file") == "no such checkpoint file"
    with pytest.raises(corpus.CorpusError, match=f"corpus 'train': path_src {tmp_path}: is a directory, not a file"):
        corpus._check_data_option({"train": {"path_src": str(tmp_path), "path_tgt": str(tmp_path)}})
    assert checkpoints.average_problems([str(tmp_path)]) == [f"-models {tmp_path}: is a directory, not a checkpoint "
                                                             "file"]
