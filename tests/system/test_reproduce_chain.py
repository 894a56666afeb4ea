"""System tier: the whole reproduction chain through `make`, on the CPU, on the shipped WMT14 sample.

``make reproduce-sample`` prepares ``build/data/sample_ende`` (raw, tokenized, cleaned, BPE, vocabulary with
``onmt_build_vocab``), trains the two rows of the ``sample-li2019`` table (a toy stock Transformer and the
same with EM routing), averages each row's last five checkpoints, translates, scores against the baseline
and writes the report.  The models are toys: the test checks the chain, not the BLEU.
"""

import json
import shutil
import subprocess

import support

TIMEOUT = 900


def _make(*args):
    return subprocess.run(["make", "--no-print-directory", *args], cwd=support.REPO, capture_output=True, text=True,
                          timeout=TIMEOUT, env=support.cli_env())


def test_make_reproduce_sample_runs_every_step_and_reports(tmp_path, onmt_active):
    for stale in ("build/data/sample_ende", "build/runs/sample"):
        shutil.rmtree(support.REPO / stale, ignore_errors=True)
    result = _make("reproduce-sample", f"RESULTS_DIR={tmp_path}")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    data = support.REPO / "build/data/sample_ende"
    for name in ("train.bpe.en", "train.bpe.de", "valid.bpe.en", "test.bpe.en", "test.de", "test.tok.de",
                 "vocab.shared", "bpe.codes"):
        assert (data / name).stat().st_size > 0, name
    assert "@@ " in (data / "train.bpe.en").read_text(encoding="utf-8")

    out = tmp_path / "sample" / "sample_ende"
    report = json.loads((out / "sample-li2019.json").read_text(encoding="utf-8"))
    rows = report["rows"]
    assert [row["config"] for row in rows] == ["sample/transformer_tiny_sample_ende_baseline.yaml",
                                              "sample/transformer_tiny_sample_ende_em_enc_self.yaml"]
    for row in rows:
        assert 0.0 <= row["bleu"] <= 100.0 and 0.0 <= row["tok_bleu"] <= 100.0
        assert row["averaged"] == 5 and len(row["checkpoints"]) == 5
        assert row["model"].endswith("average_last5.pt")
        assert "nrefs:1|case:mixed" in row["signature"]
    assert 0.0 <= rows[1]["p_value"] <= 1.0
    statuses = [entry["status"] for entry in report["commands"]]
    assert statuses.count("ran") == 6, statuses  # train, average, translate for each row
    assert (out / "sample-li2019.md").read_text(encoding="utf-8").count("| ") > 4
    assert (out / "sample-li2019.curves.png").stat().st_size > 1000

    # a second run finds everything done and only rescored
    again = _make("reproduce-sample", f"RESULTS_DIR={tmp_path}")
    assert again.returncode == 0, again.stderr[-3000:]
    report = json.loads((out / "sample-li2019.json").read_text(encoding="utf-8"))
    assert all(entry["status"].startswith("skipped") for entry in report["commands"])
