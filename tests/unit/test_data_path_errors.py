"""The data path's user errors in one line: binarised data that cannot be written or locked
(onmt_ext.runtime.binarized), a corpus without source text under stock's runtime and the byte-order-mark warning
(onmt_ext.runtime.corpus)."""

import errno
import fcntl
import os

import pytest

import support
from test_binarized import corpora, options, write_config  # noqa: F401 (corpora: a fixture)

pytestmark = pytest.mark.usefixtures("onmt_active", "sample_data")

_FILE_IN_THE_WAY = "a file stands on that path where a directory is needed: choose another directory, and run again$"


@pytest.fixture(scope="module")
def prepared(corpora, tmp_path_factory):  # noqa: F811
    """``(opt, transforms, vocabs)`` of the two test corpora, as ``onmt_train`` makes them."""
    from onmt_ext.runtime import binarized

    _, files = corpora
    return binarized._prepared(options(write_config(tmp_path_factory.mktemp("prepared"), files), "-ext_binarized",
                                       ""))


def _cached(root, prepared):
    from onmt_ext.runtime import binarized

    return binarized.cached(str(root), *prepared, say=lambda text: None)


def _raising(number, text):
    def fail(*args, **kwargs):
        raise OSError(number, text)
    return fail


def test_a_file_system_without_locks_is_named_and_a_filled_cache_is_still_read(prepared, tmp_path, monkeypatch):
    """``flock`` fails where the file system has no locks (Lustre, FUSE: EOPNOTSUPP, ENOLCK): the cache cannot keep
    two writers apart, so it is not written without the lock (one line naming ROOT, the lock file and what to do);
    a directory filled before is read, which needs no lock; another error of ``flock`` (a bug) is not hidden."""
    from onmt_ext.errors import UserError
    from onmt_ext.runtime import binarized

    filled = _cached(tmp_path / "filled", prepared)[0]
    for number, text in ((errno.EOPNOTSUPP, "Operation not supported"), (errno.ENOLCK, "No locks available")):
        monkeypatch.setattr(binarized.fcntl, "flock", _raising(number, text))
        assert _cached(tmp_path / "filled", prepared)[0] == filled
        with pytest.raises(UserError) as stopped:
            _cached(tmp_path / "empty", prepared)
        assert stopped.value.status == 1
        assert stopped.value.message.startswith(f"-ext_binarized_cache {tmp_path / 'empty'}: cannot lock .")
        assert stopped.value.message.endswith(
            f".lock ({text}): its file system does not support the file locks that keep runs sharing the cache "
            "apart; choose a -ext_binarized_cache directory on a local disk, or write the data once with "
            "onmt_ext_binarize -ext_binarized DIR and train with -ext_binarized DIR")
        assert [path.name for path in (tmp_path / "empty").iterdir() if not path.name.endswith(".lock")] == []
    monkeypatch.setattr(binarized.fcntl, "flock", _raising(errno.EBADF, "Bad file descriptor"))
    with pytest.raises(OSError) as raised:
        _cached(tmp_path / "empty", prepared)
    assert not isinstance(raised.value, UserError) and raised.value.errno == errno.EBADF
    assert fcntl.flock is binarized.fcntl.flock  # (the module's own: monkeypatch restores it)


@pytest.mark.parametrize("case", ["under a file", "a file", "no permission", "disk full", "read-only"])
def test_a_cache_that_cannot_be_made_says_why_and_what_to_do(prepared, tmp_path, monkeypatch, case):
    """ROOT of ``-ext_binarized_cache`` that cannot be made or written (tests may run as root, where ``chmod`` stops
    nothing: a path under a file, or the error made): one line naming ROOT, the reason and the fix."""
    from onmt_ext.errors import UserError
    from onmt_ext.runtime import binarized

    (tmp_path / "file").write_text("x", encoding="utf-8")
    root = tmp_path / {"under a file": "file/sub", "a file": "file"}.get(case, "cache")
    reason, advice = {
        "under a file": ("Not a directory", _FILE_IN_THE_WAY),
        "a file": ("File exists", _FILE_IN_THE_WAY),
        "no permission": ("Permission denied", "check the permissions there, or choose another directory, and run "
                                               "again$"),
        "disk full": ("No space left on device", "free space on its file system, or choose a directory on "
                                                 "another, and run again$"),
        "read-only": ("Read-only file system", "its file system is read-only: choose a directory on another, and "
                                               "run again$"),
    }[case]
    number = {"no permission": errno.EACCES, "disk full": errno.ENOSPC, "read-only": errno.EROFS}.get(case)
    if number is not None:
        monkeypatch.setattr(binarized.os, "makedirs", _raising(number, reason))
    with pytest.raises(UserError, match=rf"^-ext_binarized_cache {root}: cannot write there \({reason}\); {advice}"):
        _cached(root, prepared)


def test_a_directory_under_a_file_is_named_with_what_to_do(corpora, tmp_path):  # noqa: F811
    """``onmt_ext_binarize`` with ``-ext_binarized <file>/sub``: the work directory cannot be made beside it."""
    from onmt_ext.errors import UserError
    from onmt_ext.runtime import binarized

    _, files = corpora
    (tmp_path / "file").write_text("x", encoding="utf-8")
    opt = options(write_config(tmp_path, files, ext_binarized=str(tmp_path / "file" / "sub")))
    with pytest.raises(UserError, match=rf"^-ext_binarized {tmp_path}/file/sub: cannot create a directory beside it "
                                        rf"\(Not a directory\); {_FILE_IN_THE_WAY}"):
        binarized.build(opt, opt.ext_binarized, say=lambda text: None)
    assert (tmp_path / "file").read_text(encoding="utf-8") == "x"


def test_a_work_directory_that_its_run_removes_meanwhile_is_passed_over(tmp_path, monkeypatch):
    """Another run removes its old-format work directory between the listing and the look at its age."""
    from onmt_ext.runtime import binarized

    (tmp_path / "bin.partial-123").mkdir()

    def gone(path):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)

    monkeypatch.setattr(binarized.os.path, "getmtime", gone)
    assert binarized._dead_runs(str(tmp_path / "bin")) == []


# ---------------------------------------------------------------- the text path (onmt_ext.runtime.corpus)


def test_a_corpus_without_source_text_is_named_under_stocks_runtime(tmp_path, monkeypatch):
    """Under ``ONMT_EXT_RUNTIME=stock`` pairs with an empty side are read as stock reads them and no check refuses
    them at start-up; stock's ``process`` leaves out each pair with an empty source, so a corpus (or a data share)
    whose source lines are all empty makes no batch. The line names the source file, not the length filter."""
    from onmt.inputters import text_corpus

    from onmt_ext import patches
    from onmt_ext.runtime import corpus
    from test_corpus import _batches, _options, _pairs, _sample, _text_training

    monkeypatch.setattr(text_corpus.ParallelCorpusIterator, "_process",
                        patches.original(text_corpus.ParallelCorpusIterator, "_process"))
    src, tgt = _sample(40)
    opt = _text_training(tmp_path, [" "] * 40, tgt)
    with pytest.raises(corpus.NoKeptPair) as stopped:
        _batches(opt, 1)
    assert stopped.value.status == 2 and stopped.value.message == (
        f"corpus 'corpus_1': no source line of {tmp_path / 'train.zh'} has text, and OpenNMT-py leaves out a pair "
        "with an empty source, so training would never get a batch: check the corpus")
    holes = ["" if (line // 2) % 2 == 1 else text for line, text in enumerate(src)]  # share 1 of 2 empty
    opt = _text_training(tmp_path, holes, tgt)
    assert len(_batches(opt, 1, 2, 0)) == 1
    with pytest.raises(corpus.NoKeptPair, match=r"^error: corpus 'corpus_1': no source line of .*train\.zh in data "
                                                 r"share 1 of 2 \(-world_size × -num_workers\) has text, .* or use "
                                                 "fewer -num_workers$"):
        _batches(_options(tmp_path / "config.yaml"), 1, 2, 1)
    data = {"blank": _pairs(tmp_path, "blank", [" "] * 40, tgt), "long": _pairs(tmp_path, "long", src, tgt),
            "valid": {"path_src": str(support.TATOEBA / "valid.zh"), "path_tgt": str(support.TATOEBA / "valid.en")}}
    with pytest.raises(corpus.NoKeptPair) as stopped:
        _batches(_text_training(tmp_path, src, tgt, data=data, src_seq_length=1), 1)
    assert stopped.value.message == (
        f"corpora 'blank' (no source text in {tmp_path / 'blank.zh'}), 'long' (filtertoolong: -src_seq_length 1, "
        "-tgt_seq_length 100): every pair is left out, so training would never get a batch: check the corpora or "
        "loosen the filters")


@pytest.mark.parametrize("marked", [("src",), ("tgt",), ("src", "tgt")])
def test_the_byte_order_mark_warning_names_the_files_that_have_one(tmp_path, caplog, marked):
    from onmt.inputters.text_corpus import ParallelCorpus

    paths = {}
    for side, text in (("src", "你好\n再见\n"), ("tgt", "hello\nbye\n")):
        paths[side] = tmp_path / f"{'-'.join(marked)}.{side}"
        paths[side].write_bytes(("\ufeff" if side in marked else "").encode() + text.encode())
    with caplog.at_level("WARNING", logger="onmt"):
        examples = list(ParallelCorpus("c", str(paths["src"]), str(paths["tgt"])).load())
    assert [(e["src"].strip(), e["tgt"].strip()) for e in examples] == [("你好", "hello"), ("再见", "bye")]
    named = " and ".join(str(paths[side]) for side in marked)
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"corpus 'c': byte-order mark at the start of {named} removed from the first line"]
