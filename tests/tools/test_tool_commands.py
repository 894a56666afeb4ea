"""The repository's own commands in subprocesses: exit statuses, outputs, and what a fresh process changes.

Moved out of tests/unit (which runs in-process only): tools/prepare_tatoeba.py's clean exit on bad input and
its identical outputs in a process with another hash seed, tools/clause_split_corpus.py against the
clause_split transform, and the dry run of `make reproduce-<table>`.
"""

import filecmp
import json
import os
import random
import subprocess
import sys

import support

import onmt_ext.mechanisms.clause.split as cs  # registers the clause_split transform

from tools import prepare_tatoeba as pt
from tools import reproduce

REPO = support.REPO
# what tools/prepare_tatoeba.py writes into --out-dir
OUTPUTS = {
    "train.zh", "train.en", "valid.zh", "valid.en", "test.zh", "test.en.refs.tsv", "test.en.ref0",
    "spm.zh.model", "spm.zh.vocab", "spm.en.model", "spm.en.vocab", "stats.json",
}


# ---------------------------------------------------------------- tools/prepare_tatoeba.py
def test_prepare_tatoeba_exits_2_on_invalid_utf8_with_one_clean_message(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "cmn.txt").write_bytes("\ufeffHi.\t嗨。\tattr\r\n".encode("utf-8") * 3 + b"Bad.\t\xe4\xbd\n")
    (data / "zh2en.multiref.tsv").write_text("嗨。\tHi.\tHello.\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "tools.prepare_tatoeba", "--data-dir", str(data),
                           "--out-dir", str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2
    assert "line 4: invalid UTF-8" in proc.stderr and "Traceback" not in proc.stderr


def _synthetic_corpus(data_dir):
    """A small deterministic zh-en corpus with a BOM, CRLF, a blank and a malformed line, and a test set."""
    rng = random.Random(11)
    subj = [("我", "I"), ("你", "You"), ("他", "He"), ("我们", "We"), ("汤姆", "Tom")]
    verb = [("喜欢", "like"), ("看见", "see"), ("想要", "want"), ("买", "buy"), ("画", "draw")]
    obj = [("苹果", "apples"), ("猫", "cats"), ("书", "books"), ("狗", "dogs"), ("花", "flowers"), ("鱼", "fish")]
    lines = []
    for i in range(400):
        (zs, es), (zv, ev), (zo, eo) = rng.choice(subj), rng.choice(verb), rng.choice(obj)
        lines.append(f"{es} {ev} {eo}.\t{zs}{zv}{zo}。\tCC-BY 2.0 (France) Attribution: synthetic #{i}")
    lines[5] = "malformed line without a tab"
    lines[9] = ""
    (data_dir / "cmn.txt").write_bytes(("\ufeff" + "\r\n".join(lines) + "\r\n").encode("utf-8"))
    test = [f"{zs}{zv}{zo}。\t{es} {ev} {eo}.\t{es} {ev} some {eo}."
            for (zs, es), (zv, ev), (zo, eo) in [(subj[0], verb[0], obj[0]), (subj[4], verb[3], obj[2])]]
    (data_dir / "zh2en.multiref.tsv").write_text("\n".join(test) + "\n", encoding="utf-8")


def test_two_runs_give_identical_outputs(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    _synthetic_corpus(data)
    args = ["--data-dir", str(data), "--valid-size", "40", "--zh-vocab", "60", "--en-vocab", "60"]
    a, b = tmp_path / "a", tmp_path / "b"
    assert pt.main(args + ["--out-dir", str(a)]) == 0
    # second run in a fresh process with a different hash seed, into another directory
    env = dict(os.environ, PYTHONHASHSEED="12345")
    proc = subprocess.run([sys.executable, "-m", "tools.prepare_tatoeba", *args, "--out-dir", str(b)],
                          cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "summary:" in proc.stdout
    before = {p.name: p.read_bytes() for p in a.iterdir()}
    assert set(before) == OUTPUTS
    _, mismatch, errors = filecmp.cmpfiles(a, b, sorted(OUTPUTS), shallow=False)
    assert not mismatch and not errors
    assert {p.name for p in b.iterdir()} == OUTPUTS
    # rerun into the first directory: overwritten with identical content, nothing else left behind
    assert pt.main(args + ["--out-dir", str(a)]) == 0
    assert {p.name: p.read_bytes() for p in a.iterdir()} == before

    stats = json.loads(before["stats.json"])
    assert stats["inputs"]["cmn.txt"]["skipped_malformed"] == 1
    assert stats["inputs"]["cmn.txt"]["skipped_empty"] == 1
    assert stats["splits"]["valid"] == 40
    assert stats["removed_test_pairs"] > 0  # the synthetic test sentences do occur in the corpus
    test_src = {"我喜欢苹果。", "汤姆买书。"}
    for name in ("train.zh", "valid.zh"):
        assert not {"".join(z.split()) for z in (a / name).read_text(encoding="utf-8").splitlines()} & test_src


# ---------------------------------------------------------------- tools/clause_split_corpus.py
def test_clause_split_corpus_refuses_a_bad_option_by_the_exit_code_convention(tmp_path):
    """A clause_split option the transform refuses is a usage error: one line, exit 2 (docs/troubleshooting.md)."""
    source = tmp_path / "src.en"
    source.write_text("one line\n", encoding="utf-8")
    for option, value, said in (("--levels", "99", "-clause_levels must be an integer in 1..6, got 99"),
                                ("--tagger-model", str(tmp_path / "none.pt"), "file not found")):
        done = subprocess.run([sys.executable, "-m", "tools.clause_split_corpus", "--lang", "en", "--input", source,
                               "--output", tmp_path / "out", option, value], cwd=REPO, capture_output=True, text=True)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and said in done.stderr, done.stderr
        assert done.stderr.startswith("clause_split: error: ") and not (tmp_path / "out").exists()


def test_presplit_corpus_equals_the_transform_on_the_fly(tmp_path, sample_data):
    """tools/clause_split_corpus.py writes what the transform inserts (with --jobs too); -clause_presplit passes
    it through."""
    lines = (sample_data / "train.zh").read_text(encoding="utf-8").splitlines()[-300:] + [""]  # segmented Chinese
    source = tmp_path / "src.zh"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "src.zh.clause"
    subprocess.run([sys.executable, "-m", "tools.clause_split_corpus", "--lang", "zh",
                    "--input", source, "--output", out, "--levels", "4"], cwd=REPO, check=True, capture_output=True)
    written = out.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(written) == len(lines) and written[-1] == ""
    record = json.loads((tmp_path / ("src.zh.clause" + cs.RECORD_SUFFIX)).read_text(encoding="utf-8"))
    assert record == cs.split_record(cs.ClauseSplitOptions(lang="zh", levels=4))  # what -clause_presplit checks
    on_the_fly = cs.ClauseSplitTransform.__new__(cs.ClauseSplitTransform)
    on_the_fly.splitter, on_the_fly.presplit = cs.ClauseSplitter("zh", 4), False
    expected = []
    for line in lines:
        example = {"src": line.split(" "), "tgt": None}
        on_the_fly.apply(example)
        expected.append(" ".join(token for token in example["src"] if token))
    assert written == expected and any(cs.is_marker(t) for line in written for t in line.split())
    forked = tmp_path / "src.zh.clause.jobs"  # buckets split by forked processes: the same lines, in order
    subprocess.run([sys.executable, "-m", "tools.clause_split_corpus", "--lang", "zh",
                    "--input", source, "--output", forked, "--levels", "4", "--jobs", "3", "--bucket", "64"],
                   cwd=REPO, check=True, capture_output=True)
    assert forked.read_text(encoding="utf-8") == out.read_text(encoding="utf-8")
    passing = cs.ClauseSplitTransform.__new__(cs.ClauseSplitTransform)
    passing.splitter, passing.presplit = None, True
    stats = cs.ClauseSplitStats(0, 0)
    for line in written:
        example = {"src": line.split(" "), "tgt": None}
        passing.apply(example, stats=stats)
        assert " ".join(example["src"]) == line
    assert stats.sentences == len(lines) and stats.markers == sum(
        cs.is_marker(t) for line in written for t in line.split())


# ---------------------------------------------------------------- make reproduce-<table> DRY_RUN=1
def test_make_dry_run_prints_the_data_preparation_and_every_row(tmp_path):
    """`make reproduce-<table> DRY_RUN=1` prints the data steps (make -n) and every row's commands, runs nothing."""
    result = subprocess.run(["make", "--no-print-directory", "reproduce-cao2019-table1", "DRY_RUN=1",
                             f"RESULTS_DIR={tmp_path}"], cwd=reproduce.REPO, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    if not (reproduce.REPO / "build/data/wmt17_zhen/.vocab").exists():  # prepared data: nothing left to print
        for step in ("fetch", "raw", "tok", "clean", "bpe"):
            assert f"-m tools.prepare_data {step} wmt17_zhen" in out
        assert "onmt_build_vocab -config yaml_configs/baseline/transformer_base_wmt17_zhen.yaml" in out
    rows = len(reproduce.TABLES["cao2019-table1"])
    assert out.count("CUDA_VISIBLE_DEVICES=0 onmt_train ") == rows
    assert out.count("CUDA_VISIBLE_DEVICES=0 onmt_average_models ") == rows
    assert out.count("CUDA_VISIBLE_DEVICES=0 onmt_translate ") == rows
    assert not any(tmp_path.iterdir())  # nothing written


# ---------------------------------------------------------------- outputs the clause tools refuse to write
def _tool(module, *argv):
    return subprocess.run([sys.executable, "-m", module, *map(str, argv)], cwd=REPO, capture_output=True, text=True)


def test_clause_split_corpus_names_an_output_it_cannot_write_or_that_is_its_input(tmp_path):
    """An --output in a missing directory is one line, not a FileNotFoundError traceback; the --input file itself
    (by any path) is refused, not replaced."""
    source = tmp_path / "src.en"
    source.write_text("one line\n", encoding="utf-8")
    (tmp_path / "link.en").symlink_to(source)
    for output, said in ((tmp_path / "nodir" / "x", "no directory"), (source, "is the --input file"),
                         (tmp_path / "link.en", "is the --input file")):
        done = _tool("tools.clause_split_corpus", "--lang", "en", "--input", source, "--output", output)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith(f"clause_split_corpus: error: --output {output}: {said}"), done.stderr
    assert source.read_text(encoding="utf-8") == "one line\n" and not (tmp_path / "nodir").exists()


def test_train_signal_tagger_refuses_an_existing_output_without_overwrite(tmp_path):
    """An existing --output (its own --input above all) is not silently replaced: one line, exit 2, before any
    tagging; --overwrite replaces another file, but never the input."""
    source = tmp_path / "src.en"
    source.write_text("The cat sat because it was tired .\n", encoding="utf-8")
    kept = tmp_path / "tagger.pt"
    kept.write_bytes(b"mine")
    for output, extra, said in ((kept, (), "already exists; add --overwrite"),
                                (source, (), "is the --input file"), (source, ("--overwrite",), "is the --input file"),
                                (tmp_path / "nodir" / "t.pt", ("--overwrite",), "no directory")):
        done = _tool("tools.train_signal_tagger", "--lang", "en", "--input", source, "--output", output, *extra)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith(f"train_signal_tagger: error: --output {output}: {said}"), done.stderr
    assert kept.read_bytes() == b"mine" and source.read_text(encoding="utf-8").startswith("The cat")
