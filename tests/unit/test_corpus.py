"""onmt_ext.runtime.corpus, in-process: damaged corpora stop with the file and line.

The same checks through the real commands (onmt_train, onmt_translate) are in
tests/integration/test_corpus_cli.py.
"""

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
        f"corpus 'c': byte-order mark at the start of {src} or {tgt} removed from the first line"]


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


def test_missing_corpus_file_is_named(tmp_path):
    with pytest.raises(SystemExit, match=r"corpus 'corpus_1': path_tgt .*nope.en: no such file"):
        corpus._check_data_option({"corpus_1": {"path_src": str(_write(tmp_path / "a", b"x\n")),
                                                "path_tgt": str(tmp_path / "nope.en")}})
