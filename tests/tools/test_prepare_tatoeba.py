"""tools/prepare_tatoeba.py: robust reading, test-set removal, split, segmentation.

The real shipped data (data/tatoeba-zh-en) is prepared once per module with
small SentencePiece vocabularies.  The command itself in a subprocess (its
exit status, and identical outputs across processes and hash seeds) is
tested in tests/tools/test_tool_commands.py.
"""

import logging
import random
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "data" / "tatoeba-zh-en"

from tools import prepare_tatoeba as pt

OUTPUTS = {
    "train.zh", "train.en", "valid.zh", "valid.en", "test.zh", "test.en.refs.tsv", "test.en.ref0",
    "spm.zh.model", "spm.zh.vocab", "spm.en.model", "spm.en.vocab", "stats.json",
}
# Small vocabularies keep the run short; Chinese needs about 2,600 pieces for its
# characters alone at character_coverage 0.9995.
ZH_VOCAB, EN_VOCAB = 3000, 1000


def _lines(path):
    return Path(path).read_text(encoding="utf-8").split("\n")[:-1]


def _nospace(s):
    return "".join(s.split())


# ------------------------------------------------------------------ reading
def test_bom_is_stripped(tmp_path):
    f = tmp_path / "cmn.txt"
    f.write_bytes("\ufeffHi.\t嗨。\tCC-BY a\nRun.\t你用跑的。\tCC-BY b\n".encode("utf-8"))
    pairs, counts = pt.read_pairs(f)
    assert [(p.en, p.zh, p.attribution) for p in pairs] == [("Hi.", "嗨。", "CC-BY a"), ("Run.", "你用跑的。", "CC-BY b")]
    assert counts == {"lines": 2, "pairs": 2, "skipped_empty": 0, "skipped_malformed": 0}


def test_crlf_is_tolerated(tmp_path):
    f = tmp_path / "cmn.txt"
    f.write_bytes("\ufeffHi.\t嗨。\tattr\r\nRun.\t你用跑的。\r\nWait!\t等一下！\tattr\r\n".encode("utf-8"))
    pairs, counts = pt.read_pairs(f)
    assert [(p.en, p.zh) for p in pairs] == [("Hi.", "嗨。"), ("Run.", "你用跑的。"), ("Wait!", "等一下！")]
    assert all("\r" not in p.en + p.zh + p.attribution for p in pairs)
    assert pairs[0].attribution == "attr"
    assert counts["pairs"] == 3


def test_empty_and_malformed_lines_are_skipped_and_counted(tmp_path, caplog):
    f = tmp_path / "cmn.txt"
    f.write_text(
        "Hi.\t嗨。\tattr\n"          # 1 ok
        "\n"                          # 2 empty
        "only one column\n"           # 3 malformed
        "   \t  \n"                    # 4 blank (whitespace only)
        "\t你好。\tattr\n"             # 5 empty English
        "Hello.\t\tattr\n"             # 6 empty Chinese
        "Run.\t你用跑的。\n",          # 7 ok, no attribution
        encoding="utf-8",
    )
    caplog.set_level(logging.INFO, logger="prepare_tatoeba")
    pairs, counts = pt.read_pairs(f)
    assert [p.lineno for p in pairs] == [1, 7]
    assert counts == {"lines": 7, "pairs": 2, "skipped_empty": 2, "skipped_malformed": 3}
    assert "skipped 3 malformed" in caplog.text and "3, 5, 6" in caplog.text
    assert "skipped 2 empty" in caplog.text


def test_invalid_utf8_error_names_file_and_line(tmp_path):
    f = tmp_path / "cmn.txt"
    f.write_bytes("Hi.\t嗨。\n".encode("utf-8") + b"Run.\t\xff\xfe\n" + "Wait!\t等一下！\n".encode("utf-8"))
    with pytest.raises(pt.DataError) as err:
        pt.read_pairs(f)
    assert str(f) in str(err.value)
    assert "line 2" in str(err.value)
    assert "invalid UTF-8" in str(err.value)


def test_cli_invalid_utf8_exits_2_without_traceback(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "cmn.txt").write_bytes("\ufeffHi.\t嗨。\tattr\r\n".encode("utf-8") * 3 + b"Bad.\t\xe4\xbd\n")
    (data / "zh2en.multiref.tsv").write_text("嗨。\tHi.\tHello.\n", encoding="utf-8")
    rc = pt.main(["--data-dir", str(data), "--out-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "cmn.txt, line 4: invalid UTF-8" in err
    assert "Traceback" not in err
    # (the same through the command in a subprocess: tests/tools/test_tool_commands.py)


def test_read_multiref(tmp_path):
    f = tmp_path / "refs.tsv"
    f.write_bytes("\ufeff你好。\tHi.\tHello!\r\n\n懂了吗？\tGot it?\tDo you follow?\tDo you understand?\t\n".encode("utf-8"))
    assert pt.read_multiref(f) == [("你好。", ["Hi.", "Hello!"]),
                                   ("懂了吗？", ["Got it?", "Do you follow?", "Do you understand?"])]
    f.write_text("你好。\tHi.\n等一下！\n", encoding="utf-8")
    with pytest.raises(pt.DataError, match="line 2"):
        pt.read_multiref(f)
    f.write_text("你好。\tHi.\n你好。\tHello!\n", encoding="utf-8")
    with pytest.raises(pt.DataError, match="line 2.*line 1"):
        pt.read_multiref(f)


# ------------------------------------------------------- splitting, segmenting
def _pairs(rows):
    return [pt.Pair(en, zh, "", i) for i, (en, zh) in enumerate(rows, start=1)]


def test_split_pairs_removes_test_and_is_order_independent():
    rows = [(f"Sentence {i}.", f"句子{i}。") for i in range(200)]
    rows += [("Hi.", "你好。"), ("Hello.", " 你好。 "), ("Hi.", "你好。"), ("Dup.", "重复。"), ("Dup.", "重复。")]
    pairs = _pairs(rows)
    train, valid, counts = pt.split_pairs(pairs, ["你好。 ", "句子7。"], valid_size=50)
    assert counts["removed_test_pairs"] == 4
    assert counts["remaining_pairs"] == len(pairs) - 4
    assert len(valid) == 50
    assert counts["train"] + counts["valid"] + counts["dropped_valid_copies"] == counts["remaining_pairs"]
    kept = {p.zh.strip() for p in train + valid}
    assert "你好。" not in kept and "句子7。" not in kept
    # valid pairs are distinct and never also in train
    valid_text = [(p.en, p.zh) for p in valid]
    assert len(set(valid_text)) == len(valid_text)
    assert not set(valid_text) & {(p.en, p.zh) for p in train}
    # the choice depends on the pair text only, not on the input order
    shuffled = list(pairs)
    random.Random(3).shuffle(shuffled)
    _, valid2, _ = pt.split_pairs(shuffled, ["你好。", "句子7。"], valid_size=50)
    assert sorted(valid_text) == sorted((p.en, p.zh) for p in valid2)
    with pytest.raises(pt.DataError):
        pt.split_pairs(pairs, [], valid_size=len(pairs))


def test_segment_zh():
    out = pt.segment_zh(["我喜欢吃苹果。", "他是一个 DJ 。", "我喜欢吃苹果。", "  "])
    assert out[0] == out[2]
    assert len(out[0].split()) > 1
    for src, seg in zip(["我喜欢吃苹果。", "他是一个 DJ 。"], out):
        assert _nospace(seg) == _nospace(src)
        assert "  " not in seg and seg == seg.strip()
    assert out[3] == ""


# ----------------------------------------------------------- real shipped data
@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The full tool run once on data/tatoeba-zh-en (small vocabularies to stay fast)."""
    out = tmp_path_factory.mktemp("tatoeba")
    rc = pt.main(["--data-dir", str(DATA), "--out-dir", str(out), "--zh-vocab", str(ZH_VOCAB),
                  "--en-vocab", str(EN_VOCAB)])
    assert rc == 0
    return out


def test_real_data_outputs_and_counts(prepared):
    import json

    assert {p.name for p in prepared.iterdir()} == OUTPUTS
    stats = json.loads((prepared / "stats.json").read_text(encoding="utf-8"))
    assert stats["removed_test_pairs"] == 6177
    assert stats["remaining_pairs"] == 22978
    assert stats["inputs"]["cmn.txt"]["pairs"] == 29155
    assert stats["inputs"]["cmn.txt"]["skipped_empty"] == 1  # the file ends with a blank line
    assert stats["inputs"]["cmn.txt"]["skipped_malformed"] == 0
    s = stats["splits"]
    assert s["valid"] == 1000 and s["test"] == 2601
    assert s["train"] + s["valid"] + stats["dropped_valid_copies"] == 22978
    assert stats["test_references"]["total"] == 6113
    assert stats["test_references"]["per_sentence_histogram"]["2"] == 2030
    for split in ("train", "valid"):
        assert len(_lines(prepared / f"{split}.zh")) == len(_lines(prepared / f"{split}.en")) == s[split]


def test_real_data_no_test_sentence_in_train_or_valid(prepared):
    test_src = {_nospace(line.split("\t")[0]) for line in _lines(DATA / "zh2en.multiref.tsv")}
    assert len(test_src) == 2601
    for name in ("train.zh", "valid.zh"):
        seen = {_nospace(line) for line in _lines(prepared / name)}
        assert not seen & test_src, name
    # the outputs agree with the source: every train/valid Chinese line is segmented source text
    all_src = {_nospace(line.split("\t")[1]) for line in _lines(DATA / "cmn.txt") if "\t" in line}
    assert {_nospace(line) for line in _lines(prepared / "train.zh")} <= all_src


def test_real_data_references(prepared):
    refs = [line.split("\t") for line in _lines(prepared / "test.en.refs.tsv")]
    test_zh = _lines(prepared / "test.zh")
    ref0 = _lines(prepared / "test.en.ref0")
    assert len(refs) == len(test_zh) == len(ref0) == 2601
    assert all(2 <= len(r) - 1 <= 17 for r in refs)
    assert max(len(r) - 1 for r in refs) == 17
    assert sum(len(r) - 1 for r in refs) == 6113
    assert all(r[1] == first for r, first in zip(refs, ref0))
    # column 1 is the original unsegmented source, in test.zh order
    source = [line.split("\t")[0] for line in _lines(DATA / "zh2en.multiref.tsv")]
    assert [r[0] for r in refs] == source
    assert [_nospace(z) for z in test_zh] == [_nospace(s) for s in source]
    assert any(" " in z for z in test_zh)  # segmented


def test_real_data_sentencepiece_models(prepared):
    import sentencepiece as spm

    for lang, size in (("zh", ZH_VOCAB), ("en", EN_VOCAB)):
        sp = spm.SentencePieceProcessor(model_file=str(prepared / f"spm.{lang}.model"))
        assert sp.get_piece_size() == size
        assert len(_lines(prepared / f"spm.{lang}.vocab")) == size
        line = _lines(prepared / f"valid.{lang}")[0]
        assert sp.decode(sp.encode(line)).replace(" ", "") == line.replace(" ", "")
