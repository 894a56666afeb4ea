"""Binarised training corpora (onmt_ext.runtime.binarized): the batches, in the order, that the text gives."""

import errno
import itertools
import os
import pickle
import shutil
import socket
import subprocess
import sys
import time

import pytest
import torch
import yaml

import support

pytestmark = pytest.mark.usefixtures("onmt_active", "sample_data")

DEMO = support.REPO / "yaml_configs/demo/tatoeba_zhen.yaml"
#: the longest side filtertoolong keeps in these tests (the demo config's is 100)
LONGEST = 40


def _lines(path, count):
    with open(path, encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in itertools.islice(handle, count)]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """Two corpora of the sample's text (sentencepiece runs on it): the first with pairs with an empty side and
    lines that filtertoolong drops, the second repeating some of the first's source lines (stock leaves a repeated
    source out of a training batch) and weighted 2."""
    work = tmp_path_factory.mktemp("binarized")
    zh, en = _lines(support.TATOEBA / "train.zh", 1600), _lines(support.TATOEBA / "train.en", 1600)
    first_src, first_tgt = zh[:1000], en[:1000]
    for line in (3, 40, 41, 700):  # an empty source, an empty target, both, a whitespace-only source
        first_src[line], first_tgt[line] = {3: ("", first_tgt[3]), 40: (first_src[40], ""), 41: ("", ""),
                                            700: ("  ", first_tgt[700])}[line]
    for line in (5, 90, 999):  # too long after sentencepiece
        first_src[line] = " ".join([first_src[line]] * 12)
    second_src = zh[1000:1600] + zh[100:300]
    second_tgt = en[1000:1600] + [f"{line} again" for line in en[100:300]]
    files = {}
    for name, lines in (("one.zh", first_src), ("one.en", first_tgt), ("two.zh", second_src), ("two.en", second_tgt)):
        files[name] = work / name
        files[name].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return work, files


def write_config(work, files, name="config.yaml", **changes):
    """The demo config on the two corpora, with small buckets and batches, and ``-ext_binarized`` under ``work``."""
    config = yaml.safe_load(DEMO.read_text(encoding="utf-8"))
    for key in ("src_vocab", "tgt_vocab", "src_subword_model", "tgt_subword_model"):
        config[key] = str(support.REPO / config[key])
    config["data"] = {"one": {"path_src": str(files["one.zh"]), "path_tgt": str(files["one.en"]), "weight": 1},
                      "two": {"path_src": str(files["two.zh"]), "path_tgt": str(files["two.en"]), "weight": 2},
                      "valid": config["data"]["valid"]}
    config["data"]["valid"] = {key: str(support.REPO / value) for key, value in config["data"]["valid"].items()}
    config.update(save_data=str(work / "samples"), save_model=str(work / "model"), bucket_size=256,
                  batch_size=512, src_seq_length=LONGEST, tgt_seq_length=LONGEST, num_workers=0,
                  ext_binarized=str(work / "bin"))
    config.update(changes)
    path = work / name
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def options(config, *overrides):
    from onmt.utils.parse import ArgumentParser

    opt = support.load_train_opts(config, *overrides)
    ArgumentParser.validate_train_opts(opt)
    return opt


def build(config, *overrides, overwrite=False):
    from onmt_ext.runtime import binarized

    opt = options(config, *overrides)
    return binarized.build(opt, opt.ext_binarized, overwrite=overwrite, say=lambda text: None)


def batches(opt, count, stride=1, offset=0):
    """The first ``count`` training batches of ``opt`` (its data iterator pickled and unpickled, as a spawned data
    worker gets it)."""
    from onmt import train_single
    from onmt.constants import CorpusTask
    from onmt.inputters import dynamic_iterator
    from onmt.inputters.text_corpus import get_corpora
    from onmt.transforms import make_transforms
    from onmt.utils.misc import set_random_seed

    set_random_seed(opt.seed, False)
    _, vocabs, transforms_cls = train_single._init_train(opt)
    data = dynamic_iterator.DynamicDatasetIter.from_opt(
        get_corpora(opt, CorpusTask.TRAIN), make_transforms(opt, transforms_cls, vocabs), vocabs, opt,
        CorpusTask.TRAIN, False, torch.device("cpu"), stride=stride, offset=offset)
    data = pickle.loads(pickle.dumps(data))
    data.num_workers = 0
    data._init_datasets(0)
    return [batch for batch, _ in itertools.islice(data, count)]


@pytest.fixture(scope="module")
def config(corpora):
    work, files = corpora
    path = write_config(work, files)
    build(path)
    return path


@pytest.mark.parametrize("stride, offset", [(1, 0), (2, 1), (3, 0)])
def test_binarized_batches_are_the_texts_batches(config, stride, offset):
    count = 60  # past the end of the first corpus (an epoch) at every share
    text = batches(options(config, "-ext_binarized", ""), count, stride, offset)
    ours = batches(options(config), count, stride, offset)
    assert len(ours) == len(text) == count
    lines = set()
    for number, (mine, theirs) in enumerate(zip(ours, text)):
        assert set(mine) == set(theirs), number
        for key, value in theirs.items():
            assert torch.equal(mine[key], value) if torch.is_tensor(value) else mine[key] == value, (number, key)
        lines.update(zip(theirs["cid"].tolist(), theirs["cid_line_number"].tolist()))
    assert len(lines) > 1200 // stride  # both corpora, most lines


def test_processes_side_by_side_write_the_same_arrays(corpora, config, tmp_path):
    """Two spawned processes, each a share of every corpus's lines: the arrays and counts of one process."""
    import numpy as np

    from onmt_ext.runtime import binarized

    opt = options(config, "-ext_binarized", str(tmp_path / "two"))
    manifest = binarized.build(opt, opt.ext_binarized, say=lambda text: None, processes=2)
    one = options(config).ext_binarized
    assert manifest == binarized.read_manifest(one)
    for name in ("one", "two"):
        for key in binarized.ARRAYS:
            mine, theirs = (np.load(f"{folder}/{name}.{key}.npy") for folder in (opt.ext_binarized, one))
            assert mine.dtype == theirs.dtype and np.array_equal(mine, theirs), (name, key)


def test_the_manifest_counts_each_kind_of_line(config):
    from onmt_ext.runtime import binarized

    manifest = binarized.read_manifest(options(config).ext_binarized)
    one, two = manifest["corpora"]["one"], manifest["corpora"]["two"]
    assert (one["lines"], one["empty"], one["filtered"], one["kept"]) == (1000, 4, 3, 993)
    assert (two["lines"], two["empty"], two["filtered"], two["kept"]) == (800, 0, 0, 800)


def test_a_current_directory_is_kept_and_another_is_not_overwritten(corpora, config):
    from onmt_ext.errors import UsageError

    work, files = corpora
    manifest = build(config)  # the same data: nothing to do
    assert manifest["corpora"]["one"]["kept"] == 993
    other = write_config(work, files, "other.yaml", tgt_seq_length=LONGEST - 10)
    with pytest.raises(UsageError, match="already holds other files; add -overwrite"):
        build(other)
    assert build(config)["fingerprint"] == manifest["fingerprint"]


@pytest.mark.parametrize("change, differs", [
    ({"src_seq_length": LONGEST - 5}, "corpora.one.transforms"),
    ({"tgt_vocab": "{tatoeba}/vocab.zh", "share_vocab": True}, "vocabs.tgt"),
    ({"src_subword_model": "{tatoeba}/spm.en.model"}, "files.src_subword_model"),
])
def test_training_refuses_data_written_for_other_options(corpora, config, change, differs):
    from onmt_ext.errors import UserError

    work, files = corpora
    change = {key: value.format(tatoeba=support.TATOEBA) if isinstance(value, str) else value
              for key, value in change.items()}
    with pytest.raises(UserError, match=rf"was written for other training data \(.*{differs}.*\); run "
                                        "onmt_ext_binarize"):
        batches(options(write_config(work, files, "changed.yaml", **change)), 1)


def test_training_refuses_data_written_for_other_corpus_settings_or_code(corpora, config, monkeypatch):
    """A corpus's own settings (those a transform reads from its entry: clean's src_tgt_ratio, the languages),
    the transforms' code (onmt-ext's clause splitter keeps its rules in its module) and their libraries' versions
    are part of what the ids depend on; a corpus's weight, which only mixes, is not."""
    from onmt_ext.errors import UserError
    from onmt_ext.runtime import binarized

    work, _ = corpora
    changed = yaml.safe_load(config.read_text(encoding="utf-8"))
    changed["data"]["one"]["weight"] = 5
    (work / "weight.yaml").write_text(yaml.safe_dump(changed), encoding="utf-8")
    assert len(batches(options(work / "weight.yaml"), 1)) == 1  # the same ids
    changed["data"]["one"]["src_tgt_ratio"] = 2
    (work / "ratio.yaml").write_text(yaml.safe_dump(changed), encoding="utf-8")
    with pytest.raises(UserError, match=r"\(corpora\.one\.settings\.src_tgt_ratio differ\)"):
        batches(options(work / "ratio.yaml"), 1)
    from onmt.transforms import get_transforms_cls

    opt = options(config)
    code = binarized.read_manifest(opt.ext_binarized)["fingerprint"]["code"]
    assert set(code["modules"]) == {cls.__module__ for cls in get_transforms_cls(opt.transforms).values()}
    assert set(code["versions"]) == set(binarized.LIBRARIES) and code["versions"]["sentencepiece"]
    monkeypatch.setattr(binarized, "_code", lambda transforms: {**code, "versions": {**code["versions"],
                                                                                      "sentencepiece": "0"}})
    with pytest.raises(UserError, match=r"\(code\.versions\.sentencepiece differ\)"):
        batches(opt, 1)


def test_a_data_share_without_a_kept_pair_is_refused_not_waited_on(corpora, tmp_path):
    """Where the filters keep no pair of a data worker's share, the worker would never make a batch and the
    corpus mixer would restart the corpora for ever (one log line each time): refused in one line instead."""
    from onmt_ext.errors import UsageError

    _, files = corpora
    config = write_config(tmp_path, files, src_seq_length=1, tgt_seq_length=1)  # every pair is longer
    build(config)
    with pytest.raises(UsageError, match=r"^-ext_binarized: data worker 0 of this rank \(share 0 of the 2 shares "
                                         r"of the training lines\) would read no pair of the corpora \('one', "
                                         r"'two'\) that the filters keep, .*, or use fewer -num_workers$"):
        batches(options(config, "-num_workers", "2"), 1)
    # one share: no worker to name, and fewer workers would not help
    with pytest.raises(UsageError, match=r"^-ext_binarized: training would read no pair of the corpora \('one', "
                                         r"'two'\) that the filters keep, .* and the corpora$"):
        batches(options(config, "-num_workers", "0"), 1)


def test_training_refuses_a_corpus_changed_since(corpora, tmp_path):
    from onmt_ext.errors import UserError

    _, files = corpora
    copies = {name: tmp_path / name for name in files}
    for name, path in files.items():
        copies[name].write_bytes(path.read_bytes())
    config = write_config(tmp_path, copies)
    build(config)
    with open(copies["two.en"], "a", encoding="utf-8") as handle:
        handle.write("one more\n")
    with open(copies["two.zh"], "a", encoding="utf-8") as handle:
        handle.write("再 一 个\n")
    with pytest.raises(UserError, match=r"corpora\.two\.src\.bytes.*differ"):
        batches(options(config), 1)


def test_a_missing_directory_names_the_command(corpora, tmp_path):
    from onmt_ext.errors import UsageError

    _, files = corpora
    with pytest.raises(UsageError, match="no binarised data there; run onmt_ext_binarize -config"):
        batches(options(write_config(tmp_path, files)), 1)


def test_a_directory_changed_by_hand_is_named_not_read(corpora, config, tmp_path):
    from onmt_ext.errors import UserError

    _, files = corpora
    copy = tmp_path / "bin"
    shutil.copytree(options(config).ext_binarized, copy)
    changed = write_config(tmp_path, files)
    (copy / "two.tgt_ids.npy").unlink()
    with pytest.raises(UserError, match=r"bin: two\.tgt_ids\.npy missing; binarise again"):
        batches(options(changed), 1)
    (copy / "manifest.json").write_text("{", encoding="utf-8")
    with pytest.raises(UserError, match=r"manifest\.json: damaged"):
        batches(options(changed), 1)
    assert build(changed, overwrite=True)["corpora"]["two"]["kept"] == 800  # -overwrite replaces it


@pytest.mark.parametrize("damage", ["header", "data", "empty"])
def test_a_damaged_array_file_is_named_not_a_traceback(corpora, config, tmp_path, damage):
    """An array file cut short (a copy that stopped, a full disk) under an intact manifest: numpy's ValueError or
    EOFError at the first read becomes one line naming the file; a cache in that state is written again."""
    from onmt_ext.errors import UserError
    from onmt_ext.runtime import binarized

    _, files = corpora
    copy = tmp_path / "bin"
    shutil.copytree(options(config).ext_binarized, copy)
    array = copy / "two.src_ids.npy"
    os.truncate(array, {"header": 100, "data": array.stat().st_size - 40, "empty": 0}[damage])
    with pytest.raises(UserError, match=r"^-ext_binarized .*bin: two\.src_ids\.npy is damaged \(.+\); binarise "
                                        r"again with onmt_ext_binarize \.\.\. -overwrite$"):
        batches(options(write_config(tmp_path, files)), 1)
    assert binarized._current(str(copy), binarized.read_manifest(options(config).ext_binarized)["fingerprint"]) \
        is None  # (what -ext_binarized_cache asks: a damaged directory is written again)


def test_a_directory_that_cannot_be_read_or_is_a_file_is_named(corpora, config, tmp_path, monkeypatch):
    """An unreadable manifest (permissions; the tests may run as root, so the error is made) and a file named as
    the directory: one line each, not a PermissionError or NotADirectoryError traceback."""
    from onmt_ext.errors import UsageError, UserError
    from onmt_ext.runtime import binarized

    _, files = corpora
    (tmp_path / "file").write_text("x", encoding="utf-8")
    with pytest.raises(UsageError, match=r"^-ext_binarized .*file: not a directory"):
        batches(options(write_config(tmp_path, files, ext_binarized=str(tmp_path / "file"))), 1)
    with pytest.raises(UsageError, match=r"^-ext_binarized .*file: not a directory"):
        build(write_config(tmp_path, files, ext_binarized=str(tmp_path / "file")), overwrite=True)
    assert (tmp_path / "file").read_text(encoding="utf-8") == "x"

    def unreadable(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(binarized, "open", unreadable, raising=False)
    with pytest.raises(UserError, match=r"^-ext_binarized .*: cannot read manifest\.json \(Permission denied\)"):
        batches(options(config), 1)


@pytest.mark.parametrize("cache", [False, True])
def test_a_failed_write_is_named_and_leaves_nothing_behind(corpora, tmp_path, monkeypatch, cache):
    """A full disk (ENOSPC) while the arrays are written: one line naming the directory, the file and what to do,
    and neither the directory nor its work directory left (the cache's lock file alone stays)."""
    from onmt_ext.errors import UserError
    from onmt_ext.runtime import binarized

    _, files = corpora

    def full(path, array):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(binarized.np, "save", full)
    config = write_config(tmp_path, files)
    option = "-ext_binarized_cache" if cache else "-ext_binarized"
    with pytest.raises(UserError, match=rf"^{option} .*: cannot write one\.state\.npy there \(No space left on "
                                        r"device\); free space on its file system, or choose a directory on "
                                        "another, and run again$"):
        if cache:
            opt, transforms, vocabs = binarized._prepared(options(config, "-ext_binarized", ""))
            binarized.cached(str(tmp_path / "cache"), opt, transforms, vocabs, say=lambda text: None)
        else:
            build(config)
    left = sorted(path.name for path in tmp_path.rglob("*") if "partial" in path.name or path.name == "bin")
    assert left == []
    if cache:
        assert [path.name for path in (tmp_path / "cache").iterdir() if not path.name.endswith(".lock")] == []


@pytest.mark.parametrize("overrides, named", [
    (("-src_subword_nbest", "-1", "-src_subword_alpha", "0.1"), "transform sentencepiece"),
    (("-copy_attn",), "-copy_attn"),
])
def test_data_that_differs_at_each_reading_is_refused(corpora, tmp_path, overrides, named):
    from onmt_ext.errors import UsageError

    _, files = corpora
    with pytest.raises(UsageError, match=named):
        build(write_config(tmp_path, files), *overrides)
    assert not (tmp_path / "bin").exists()


def test_the_command_writes_the_directory_and_ends_errors_in_one_line(corpora, tmp_path):
    _, files = corpora
    config = write_config(tmp_path, files)
    command = [str(support.BIN / "onmt_ext_binarize"), "-config", str(config)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "'one': 993 of 1,000 lines kept (3 filtered, 4 with an empty side)" in done.stderr
    assert (tmp_path / "bin" / "manifest.json").is_file()
    failed = subprocess.run(command + ["-ext_binarized", ""], capture_output=True, text=True, timeout=300)
    assert failed.returncode == 2
    assert failed.stderr.strip().splitlines() == [
        "onmt_ext_binarize: error: -ext_binarized: name the directory to write (in the config, where onmt_train "
        "reads it), or -ext_binarized_cache the directory to write under"]


# ---------------------------------------------------------------- -ext_binarized_cache


def test_the_cache_binarises_once_per_data_and_trains_on_the_texts_batches(corpora, config, tmp_path):
    """Training with ``-ext_binarized_cache`` builds ``<root>/<key>`` at its start, then reads it: the batches of
    ``-ext_binarized`` (the text's, tested above); a second start reuses it, and other data gets a directory of its
    own beside it, with the first left as it was."""
    import numpy as np

    from onmt_ext.runtime import binarized

    root = tmp_path / "cache"
    cached = ("-ext_binarized", "", "-ext_binarized_cache", str(root))
    ours = batches(options(config, *cached), 20, 2, 1)
    (key,) = [path for path in root.iterdir() if not path.name.startswith(".")]
    one = options(config).ext_binarized
    assert binarized.read_manifest(key)["fingerprint"] == binarized.read_manifest(one)["fingerprint"]
    for name in ("one", "two"):
        for array in binarized.ARRAYS:
            assert np.array_equal(np.load(key / f"{name}.{array}.npy"), np.load(f"{one}/{name}.{array}.npy"))
    theirs = batches(options(config), 20, 2, 1)
    assert all(torch.equal(mine["tgt"], their["tgt"]) for mine, their in zip(ours, theirs))
    made = (key / "manifest.json").stat().st_mtime_ns
    batches(options(config, *cached), 1)
    assert (key / "manifest.json").stat().st_mtime_ns == made  # current: read, not written again
    work, files = corpora
    shorter = write_config(work, files, "shorter.yaml", src_seq_length=LONGEST - 5)
    batches(options(shorter, *cached), 1)
    keys = sorted(path.name for path in root.iterdir() if not path.name.startswith("."))
    assert len(keys) == 2 and key.name in keys and (key / "manifest.json").stat().st_mtime_ns == made


def test_runs_that_ask_for_the_cache_at_once_binarise_it_once(config, tmp_path, monkeypatch):
    """Two ranks (here threads) start together: the second waits on the lock and reads what the first wrote."""
    import threading
    import time

    from onmt_ext.runtime import binarized

    written, stock = [], binarized._write

    def slow_write(*args, **kwargs):
        written.append(args[3])
        time.sleep(1.0)  # both ask while the first is still writing
        return stock(*args, **kwargs)

    monkeypatch.setattr(binarized, "_write", slow_write)
    opt, transforms, vocabs = binarized._prepared(options(config, "-ext_binarized", ""))
    found = []
    runs = [threading.Thread(target=lambda: found.append(binarized.cached(str(tmp_path), opt, transforms, vocabs,
                                                                          say=lambda text: None)[0]))
            for _ in range(2)]
    for run in runs:
        run.start()
    for run in runs:
        run.join()
    assert len(written) == 1 and found == [written[0]] * 2
    assert binarized.read_manifest(written[0])["corpora"]["one"]["kept"] == 993


def test_the_command_fills_the_cache_and_a_cache_it_cannot_write_is_named(config, tmp_path):
    from onmt_ext.errors import UserError

    root = tmp_path / "cache"
    command = [str(support.BIN / "onmt_ext_binarize"), "-config", str(config), "-ext_binarized", "",
               "-ext_binarized_cache", str(root)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (key,) = [path for path in root.iterdir() if not path.name.startswith(".")]
    assert f"{key} holds these training batches" in done.stderr and (key / "manifest.json").is_file()
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match=r"-ext_binarized_cache .*file: cannot write there \(File exists\)"):
        batches(options(config, "-ext_binarized", "", "-ext_binarized_cache", str(tmp_path / "file")), 1)


def test_a_filled_cache_that_cannot_be_written_is_still_read(config, tmp_path, monkeypatch):
    """A cache filled earlier on a file system that is read-only now (a shared copy): its lock cannot be made,
    and the directory is read as it is."""
    from onmt_ext.runtime import binarized

    opt, transforms, vocabs = binarized._prepared(options(config, "-ext_binarized", ""))
    filled = binarized.cached(str(tmp_path), opt, transforms, vocabs, say=lambda text: None)[0]

    def read_only(path, mode="r", **kwargs):
        if "w" in mode:
            raise PermissionError(13, "Permission denied", path)
        return open(path, mode, **kwargs)

    monkeypatch.setattr(binarized, "open", read_only, raising=False)
    assert binarized.cached(str(tmp_path), opt, transforms, vocabs, say=lambda text: None)[0] == filled
    with pytest.raises(binarized.UserError, match=r"cache-empty: cannot write there \(Permission denied\)"):
        binarized.cached(str(tmp_path / "cache-empty"), opt, transforms, vocabs)


def test_the_cache_and_a_directory_together_are_refused(config, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        options(config, "-ext_binarized_cache", str(tmp_path))
    assert exit_info.value.code == 2
    assert "-ext_binarized and -ext_binarized_cache both name where the binarised data is" in capsys.readouterr().err


@pytest.mark.parametrize("overrides, named", [
    ((), None),
    (("-src_subword_nbest", "-1", "-src_subword_alpha", "0.1"), "transform sentencepiece"),
    (("-transforms", "sentencepiece", "tokendrop"), "transform tokendrop"),
    (("-copy_attn",), "-copy_attn"),
])
def test_a_config_is_judged_before_any_file_is_read(corpora, tmp_path, overrides, named):
    """``config_problems`` (make reproduce-* asks it before the data exists) gives what training would say; a
    corpus without its own ``transforms`` takes the config's, as validation gives it."""
    from onmt_ext.integration.parsing import train_parser
    from onmt_ext.runtime import binarized

    _, files = corpora
    config = write_config(tmp_path, files)
    values = yaml.safe_load(config.read_text(encoding="utf-8"))
    for entry in values["data"].values():
        entry.pop("transforms", None)
    values["src_subword_model"] = str(tmp_path / "absent.model")  # no file is read
    config.write_text(yaml.safe_dump(values), encoding="utf-8")
    opt, _ = train_parser().parse_known_args(["-config", str(config), *overrides])
    found = binarized.config_problems(opt)
    assert (found == []) if named is None else any(named in problem for problem in found), found


# ---------------------------------------------------------------- reading a share, writing the directory


class _Recording:
    """An array that records the size of what each read (``[...]``) of it materialises."""

    def __init__(self, array):
        self.array, self.reads = array, []

    def __len__(self):
        return len(self.array)

    def __getitem__(self, key):
        found = self.array[key]
        self.reads.append(found.size)
        return found


class _Corpus:
    id = "c"

    def __init__(self, arrays):
        self._arrays = arrays

    def arrays(self):
        return self._arrays


@pytest.mark.parametrize("stride, offset", [(1, 0), (2, 1), (4, 1), (5, 3), (64, 7)])
def test_a_share_is_read_line_by_line_whatever_its_stride(monkeypatch, stride, offset):
    """A worker's chunk of lines reads its lines' ids, not the whole span between its first and last line (with S
    shares, S·CHUNK lines): each read is at most the chunk's own ids; the examples are those the arrays hold, in
    stock's order and numbering, with filtered lines (None) and kept lines of no ids among them."""
    import numpy as np

    from onmt_ext.runtime import binarized

    monkeypatch.setattr(binarized, "CHUNK", 8)
    random = np.random.default_rng(stride * 100 + offset)
    lines = 1000
    state = random.choice([binarized.ABSENT, binarized.FILTERED, binarized.KEPT], lines, p=[0.1, 0.2, 0.7])
    arrays = {"state": state.astype(np.int8), "src_key": random.integers(0, 50, lines)}
    for side in ("src", "tgt"):
        lengths = np.where(state == binarized.KEPT, random.integers(0, 6, lines), 0)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        arrays[f"{side}_offsets"] = offsets
        arrays[f"{side}_ids"] = _Recording(random.integers(0, 4000, int(offsets[-1])).astype(np.int32))
    got = [(example and (example["cid_line_number"], example["src"]["src"], example["src"]["src_ids"].tolist(),
                         example["tgt"]["tgt_ids"].tolist()), kind, name)
           for example, kind, name in binarized.BinarizedCorpusIterator(_Corpus(arrays), stride, offset)]
    chosen = [line for line in range(lines) if (line // stride) % stride == offset]

    def ids(side, line):
        offsets = arrays[f"{side}_offsets"]
        return arrays[f"{side}_ids"].array[offsets[line]:offsets[line + 1]].tolist()

    wanted = []
    for position, line in enumerate(chosen):
        if state[line] == binarized.KEPT:
            example = (position * stride + offset, int(arrays["src_key"][line]), ids("src", line), ids("tgt", line))
            wanted.append((example, binarized.BINARIZED, "c"))
        elif state[line] == binarized.FILTERED:
            wanted.append((None, binarized.BINARIZED, "c"))
    assert got == wanted and any(example is None for example, _, _ in got) and len(got) > 8
    for side in ("src", "tgt"):
        limit = max(sum(len(ids(side, line)) for line in chosen[first:first + 8]) for first in range(0, len(chosen), 8))
        assert max(arrays[f"{side}_ids"].reads) <= limit, side


def _partials(folder):
    return sorted(path.name for path in folder.iterdir() if ".partial-" in path.name)


def test_the_work_directory_names_its_host_and_leaves_another_runs_alone(corpora, tmp_path, monkeypatch):
    """On a shared file system two nodes' runs can have one pid: the work directory names the host as well (and is
    made afresh, never emptied), so another node's run writing beside it keeps its directory; a directory of this
    host's killed run (its process gone) is removed, and so is an old-format one (no host) untouched for a day."""
    import subprocess

    from onmt_ext.runtime import binarized

    _, files = corpora
    monkeypatch.setattr(socket, "gethostname", lambda: "node-b")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    others = [f"bin.partial-{os.getpid()}", f"bin.partial-node-a-{os.getpid()}-0000abcd",
              "bin.partial-node-b-1-0000abcd", f"bin.partial-node-b-7-{gone}-0000abcd"]  # (host node-b-7)
    old = f"bin.partial-{gone}"  # an old-format name (no host), untouched for longer than OLD_FORMAT_AGE: goes
    for name in [*others, f"bin.partial-node-b-{gone}-0000abcd", old]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "one.state.npy").write_bytes(b"writing")
    then = time.time() - binarized.OLD_FORMAT_AGE - 60
    os.utime(tmp_path / old, (then, then))
    seen, stock = [], binarized._build_corpus

    def watched(*args, **kwargs):
        seen.append(_partials(tmp_path))
        return stock(*args, **kwargs)

    monkeypatch.setattr(binarized, "_build_corpus", watched)
    build(write_config(tmp_path, files))
    (mine,) = set(seen[0]) - set(others)
    assert mine.startswith(f"bin.partial-node-b-{os.getpid()}-")
    assert _partials(tmp_path) == sorted(others)  # pid 1 lives: its directory is kept; a recent old-format one too
    assert all((tmp_path / name / "one.state.npy").read_bytes() == b"writing" for name in others)


def test_the_cache_removes_what_killed_runs_left_of_its_key(config, tmp_path):
    """Under the cache's lock no other run writes that key: any work directory of the key is what a killed run
    left, and goes; another key's is left alone."""
    from onmt_ext.runtime import binarized

    opt, transforms, vocabs = binarized._prepared(options(config, "-ext_binarized", ""))
    key = binarized.cache_key(binarized.fingerprint(opt, transforms, vocabs))
    stale = [f"{key}.partial-{name}" for name in ("123", "node-a-123-x1", "node-b-9-x2")]
    other = f"{'0' * 16}.partial-node-a-5-x3"
    for name in [*stale, other]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "one.state.npy").write_bytes(b"killed")
    directory = binarized.cached(str(tmp_path), opt, transforms, vocabs, say=lambda text: None)[0]
    assert directory == str(tmp_path / key) and _partials(tmp_path) == [other]


@pytest.mark.parametrize("held", ["corpus", "valid", "vocab", "subword", "other"])
def test_overwrite_never_replaces_a_directory_of_the_users_files(corpora, config, tmp_path, held):
    """-overwrite replaces the whole directory: it is refused, in one line naming a file, where the directory holds
    a file the config reads (a training or validation corpus, a vocabulary, a subword model) or anything else
    that onmt_ext_binarize did not write; everything there is left as it was."""
    from onmt_ext.errors import UsageError

    _, files = corpora
    data = tmp_path / "data"
    data.mkdir()
    kept = data / {"corpus": "one.zh", "valid": "valid.en", "vocab": "vocab.en", "subword": "spm.zh.model",
                   "other": "notes.txt"}[held]
    shutil.copy(files["one.zh"], kept)
    config = yaml.safe_load(open(config, encoding="utf-8"))
    config["ext_binarized"] = str(data)
    if held == "corpus":
        config["data"]["one"]["path_src"] = str(kept)
    elif held == "valid":
        config["data"]["valid"]["path_tgt"] = str(kept)
    elif held == "vocab":
        shutil.copy(config["tgt_vocab"], kept)
        config["tgt_vocab"] = str(kept)
    elif held == "subword":
        shutil.copy(config["src_subword_model"], kept)
        config["src_subword_model"] = str(kept)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    before = kept.read_bytes()
    named = r"which the config reads; -overwrite would delete it" if held != "other" else \
        r"which onmt_ext_binarize did not write; -overwrite replaces only earlier binarised data"
    with pytest.raises(UsageError, match=rf"^-ext_binarized .*data holds .*{kept.name}, {named}"):
        build(path, overwrite=True)
    assert sorted(os.listdir(data)) == [kept.name] and kept.read_bytes() == before
