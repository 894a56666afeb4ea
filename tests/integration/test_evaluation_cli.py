"""The evaluation commands in subprocesses: onmt_ext.integration.evaluation against sacreBLEU's command line,
tools/evaluate.py.

Moved out of tests/unit/test_evaluation.py (unit/ runs in-process only): onmt_ext.integration.evaluation's BLEU,
tokenized BLEU, chrF (also with the variable-reference TSV, against complete reference files) and paired bootstrap equal what
``python -m sacrebleu`` reports on the same files, and tools/evaluate.py gives its JSON and text reports (also
without the installed package, and BLEU by source length against a baseline with a plot) and refuses bad input
with exit status 2 and one message, no traceback.  The test corpus, ``_write`` and the ``files`` fixture come from
tests/unit/test_evaluation.py.
"""

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu

import support
from onmt_ext.integration import evaluation as ev
from unit.test_evaluation import HYP_A, HYP_A2, HYP_B, REF1, REF2, SOURCES, _write, files  # noqa: F401 (a fixture)

#: tools/evaluate.py as a command: run from anywhere with the checkout on PYTHONPATH (here from tmp_path)
EVALUATE = ["-m", "tools.evaluate"]


def _checkout_env(*paths):
    """The environment with the checkout (and ``paths``) first on PYTHONPATH."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, (support.REPO, *paths))))


def _sacrebleu_cli(refs, hyps, *options, seed="12345"):
    """Run sacreBLEU's command line and return its standard output."""
    command = [sys.executable, "-m", "sacrebleu", *map(str, refs), "-i", *map(str, hyps), *options]
    env = dict(os.environ, NO_COLOR="1", SACREBLEU_SEED=seed)
    proc = subprocess.run(command, capture_output=True, text=True, encoding="utf-8", env=env, check=True)
    return proc.stdout


def _sacrebleu_json(refs, hyp, *options):
    """sacreBLEU's JSON results (4 decimals) for one system, as a list of dicts."""
    parsed = json.loads(_sacrebleu_cli(refs, [hyp], "-f", "json", "-w", "4", *options))
    return parsed if isinstance(parsed, list) else [parsed]


def _run_evaluate(*args, cwd):
    """Run tools/evaluate.py and return the completed process."""
    return subprocess.run([sys.executable, *EVALUATE, *map(str, args)], cwd=cwd, env=_checkout_env(),
                          capture_output=True, text=True, encoding="utf-8")


# --------------------------------------------------------------------------
# sacreBLEU's command line
# --------------------------------------------------------------------------

def test_nist_bleu_matches_sacrebleu_cli(files):
    result = ev.nist_bleu(HYP_A, [REF1, REF2])
    assert result.signature == f"nrefs:2|case:mixed|eff:no|tok:13a|smooth:exp|version:{sacrebleu.__version__}"
    cli_text = _sacrebleu_cli([files["ref1"], files["ref2"]], [files["hyp_a"]], "-f", "text", "-w", "2")
    assert result.formatted == cli_text.strip()
    (cli,) = _sacrebleu_json([files["ref1"], files["ref2"]], files["hyp_a"])
    assert result.score == pytest.approx(cli["score"], abs=1e-4)


def test_tokenized_bleu_matches_sacrebleu_cli(files):
    result = ev.tokenized_bleu(HYP_A, [REF1, REF2])
    (cli,) = _sacrebleu_json([files["ref1"], files["ref2"]], files["hyp_a"],
                             "--tokenize", "none", "--smooth-method", "none", "--force")
    assert result.score == pytest.approx(cli["score"], abs=1e-4)
    assert result.signature == cli["signature"]
    assert "tok:none|smooth:none" in result.signature


def test_chrf_matches_sacrebleu_cli(files):
    result = ev.chrf(HYP_A, [REF1, REF2])
    (cli,) = _sacrebleu_json([files["ref1"], files["ref2"]], files["hyp_a"], "-m", "chrf")
    assert result.name == "chrF2"
    assert result.score == pytest.approx(cli["score"], abs=1e-4)
    assert result.signature == cli["signature"]


def test_variable_references_equal_sacrebleu_cli_on_complete_files(tmp_path, files):
    refs = ev.read_reference_tsv(files["tsv"])
    assert len(refs) == 3
    assert [sum(r is not None for r in seg) for seg in zip(*refs)] == [i % 3 + 1 for i in range(12)]
    # Complete reference files: each missing reference replaced by a copy of
    # the segment's first reference, which changes neither BLEU nor chrF.
    complete = [_write(tmp_path / f"full{k}.txt", [r if r is not None else refs[0][i] for i, r in enumerate(stream)])
                for k, stream in enumerate(refs)]
    cli_bleu, cli_chrf = _sacrebleu_json(complete, files["hyp_a"], "-m", "bleu", "chrf")
    (cli_tok,) = _sacrebleu_json(complete, files["hyp_a"], "--tokenize", "none", "--smooth-method", "none", "--force")
    for result, cli in [(ev.nist_bleu(HYP_A, refs), cli_bleu), (ev.chrf(HYP_A, refs), cli_chrf),
                        (ev.tokenized_bleu(HYP_A, refs), cli_tok)]:
        assert result.score == pytest.approx(cli["score"], abs=1e-4), result.metric
        assert result.signature.startswith("nrefs:var|")
    # Scoring against the first reference only gives a different (lower) BLEU.
    assert ev.nist_bleu(HYP_A, refs[:1]).score < cli_bleu["score"] - 1


@pytest.mark.parametrize("metric, options", [("bleu", []), ("chrf", ["-m", "chrf"])])
def test_bootstrap_matches_sacrebleu_cli_paired_bs(files, metric, options):
    before = os.environ.get("SACREBLEU_SEED")
    p_values = {}
    for seed in (12345, 7):
        result = ev.paired_bootstrap(HYP_A, HYP_A2, [REF1, REF2], metric=metric, n_samples=1000, seed=seed)
        text = _sacrebleu_cli([files["ref1"], files["ref2"]], [files["hyp_a"], files["hyp_a2"]],
                              "--paired-bs", "-f", "text", "-w", "4", *options, seed=str(seed))
        (cli_p,) = re.findall(r"\(p = ([0-9.]+)\)", text)
        assert f"{result.p_value:.4f}" == cli_p
        assert f"{result.system_score:.4f} ({result.system_mean:.4f} ± {result.system_ci:.4f})" in text
        assert f"{result.baseline_score:.4f} ({result.baseline_mean:.4f} ± {result.baseline_ci:.4f})" in text
        p_values[seed] = result.p_value
    assert p_values[12345] != p_values[7]  # the seed really reaches sacreBLEU
    assert 0.05 < p_values[12345] < 0.5
    assert os.environ.get("SACREBLEU_SEED") == before


# --------------------------------------------------------------------------
# tools/evaluate.py
# --------------------------------------------------------------------------

def test_cli_json(tmp_path, files):
    proc = _run_evaluate("--hyp", files["hyp_a"], "--refs", files["ref1"], files["ref2"],
                         "--metrics", "bleu", "chrf", "tok-bleu", "--baseline", files["hyp_b"],
                         "--bootstrap-samples", "200", "--seed", "3", "--by-length", "--src", files["src"],
                         "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    refs = [REF1, REF2]
    assert report["hypotheses"] == {"file": str(files["hyp_a"]), "segments": 12}
    assert report["references"]["refs_per_segment"] == {"min": 2, "max": 2}
    assert list(report["scores"]) == ["bleu", "chrf", "tok-bleu"]
    for key, result in report["scores"].items():
        assert result == dataclasses.asdict(ev.compute_metric(key, HYP_A, refs))
    boot = report["bootstrap"]
    assert (boot["n_samples"], boot["seed"]) == (200, 3)
    assert boot["results"]["bleu"] == dataclasses.asdict(ev.paired_bootstrap(HYP_B, HYP_A, refs, n_samples=200, seed=3))
    assert boot["results"]["chrf"]["marker"] in ("†", "‡")
    assert [b["count"] for b in report["by_length"]["buckets"]] == [7, 2, 1, 1, 0, 1]
    assert report["by_length"]["buckets"][4]["score"] is None


def test_cli_human_output_with_tsv(tmp_path, files):
    proc = _run_evaluate("--hyp", files["hyp_a"], "--ref-tsv", files["tsv"], "--by-length", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    refs = ev.read_reference_tsv(files["tsv"])
    assert "(1-3 per segment)" in out
    assert ev.nist_bleu(HYP_A, refs).formatted in out
    assert ev.chrf(HYP_A, refs).formatted in out
    assert "BLEU|nrefs:var|case:mixed|eff:no|tok:13a|smooth:exp|" in out
    assert "tok-bleu" not in out
    assert re.search(r"^  41-50 +0 +-$", out, re.MULTILINE)
    assert re.search(rf"^  0-10 +7 +{ev.bleu_by_length(HYP_A, refs, SOURCES)[0].score:.2f}$", out, re.MULTILINE)


def test_cli_runs_without_installed_package(tmp_path, files):
    # -S skips the site hooks (and so the editable install of onmt_ext):
    # the command finds onmt_ext in the checkout, beside tools/.
    site_packages = Path(sacrebleu.__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-S", *EVALUATE, "--hyp", files["hyp_a"], "--refs", files["ref1"],
                           "--metrics", "bleu", "--json"],
                          cwd=tmp_path, capture_output=True, text=True, encoding="utf-8",
                          env=_checkout_env(site_packages))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["scores"]["bleu"]["score"] == pytest.approx(ev.nist_bleu(HYP_A, [REF1]).score)


def test_cli_error_unequal_reference_files(tmp_path, files):
    short = _write(tmp_path / "short.txt", REF2[:5])
    proc = _run_evaluate("--hyp", files["hyp_a"], "--refs", files["ref1"], short, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith("evaluate.py: error: reference files have different numbers of lines")
    assert f"{files['ref1']} has 12" in proc.stderr and f"{short} has 5" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_error_hypothesis_length_mismatch(tmp_path, files):
    hyp = _write(tmp_path / "short_hyp.txt", HYP_A[:10])
    proc = _run_evaluate("--hyp", hyp, "--ref-tsv", files["tsv"], cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr == (f"evaluate.py: error: length mismatch: hypothesis file {hyp} has 10 segments, "
                           f"reference TSV {files['tsv']} has 12\n")


def test_cli_error_invalid_utf8_baseline(tmp_path, files):
    baseline = tmp_path / "base.txt"
    baseline.write_bytes(b"fine\n\xff\xfe broken\n")
    proc = _run_evaluate("--hyp", files["hyp_a"], "--refs", files["ref1"], "--baseline", baseline, cwd=tmp_path)
    assert proc.returncode == 2
    assert f"baseline file {baseline}, line 2: invalid UTF-8" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_by_length_needs_sources(tmp_path, files):
    proc = _run_evaluate("--hyp", files["hyp_a"], "--refs", files["ref1"], "--by-length", cwd=tmp_path)
    assert proc.returncode == 2
    assert "evaluate.py: error: --by-length needs the sources" in proc.stderr


def test_cli_by_length_against_a_baseline_with_buckets_and_plot(tmp_path, files):
    plot = tmp_path / "plot.png"
    proc = _run_evaluate("--hyp", files["hyp_a"], "--refs", files["ref1"], "--baseline", files["hyp_b"],
                         "--by-length", "--src", files["src"], "--buckets", "10", "20", "--plot", plot,
                         "--bootstrap-samples", "50", "--names", "base", "sys", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "bleu by source length, sys vs base" in proc.stdout and "21+" in proc.stdout
    assert plot.exists()
    refused = _run_evaluate("--hyp", files["hyp_a"], "--refs", files["ref1"], "--plot", plot, cwd=tmp_path)
    assert refused.returncode == 2 and "--plot" in refused.stderr
