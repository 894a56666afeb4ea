"""tools/gpu_check.py: its CPU dry run writes a report with every section, and its small helpers.

The dry run (``--device cpu --tiny``) trains and translates toy models
through the real console-script code in child processes, so that the GPU
check cannot rot on a machine without a GPU.  What a section could not fit in
its time budget is reported as such; what ran must give finite, positive
figures.
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import support

REPO = support.REPO
SCRIPT = REPO / "tools/gpu_check.py"
sys.path.insert(0, str(REPO / "tools"))
import gpu_check  # noqa: E402


def _positive(value):
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    support.ensure_sample_data()
    out = tmp_path_factory.mktemp("gpu-check")
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--out", str(out),
                           "--work", str(out / "work")], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=support.cli_env(OMP_NUM_THREADS="1"))
    return done, out


def test_dry_run_writes_every_section(dry_run):  # the default tier: the check must not rot between GPU runs
    done, out = dry_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "cpu-tiny.json").read_text(encoding="utf-8"))
    text = (out / "cpu-tiny.md").read_text(encoding="utf-8")
    for heading in ("## a. Decoding properties", "## b. Training", "## c. Translation", "## Targets"):
        assert heading in text
    assert report["mode"] == "cpu-tiny" and report["device"]["torch"] == torch.__version__
    assert report["date"] and report["command"].startswith("python tools/gpu_check.py")
    assert set(report["sections"]) == {"a", "b", "c"}
    for section in report["sections"].values():
        assert section["status"] in ("ran", "partly run", "not run")
        assert 0 <= section["seconds"] <= section["budget_s"] + 30  # a started run may end just past the budget


def test_dry_run_figures_are_sane(dry_run):
    _, out = dry_run
    sections = json.loads((out / "cpu-tiny.json").read_text(encoding="utf-8"))["sections"]
    for run in sections["a"]["runs"]:
        assert run["command"].startswith("ONMT_EXT_TEST_DEVICE=cpu ")
        assert run["status"] in ("passed", "stopped", "not run"), run  # a failed property is a defect
        if run["status"] == "passed":
            assert run["tests"] == run["passed"] + run["skipped"] > 0 and run["passed"] > 0
    if sections["a"]["status"] == "not run":  # only while the property suite lacks its ONMT_EXT_TEST_* variables
        assert "does not read" in sections["a"]["reason"]
    else:
        assert {run["dtype"] for run in sections["a"]["runs"]} == {"fp32", "bf16"}

    rows = sections["b"]["rows"]
    base = rows[0]
    assert base["case"] == "baseline" and base["status"] == "measured" and base["ratio"] == 1.0
    for row in rows:
        assert row["status"] in ("measured", "not run", "stopped"), row  # not "failed"
        if row["status"] == "measured":
            for key in ("tokens_per_s", "step_ms", "peak_memory_mb", "busy_share", "ratio", "parameters"):
                assert _positive(row[key]), (row["case"], key, row[key])
            assert 0 < row["busy_share"] <= 1.0 and 0 <= row["data_wait_share"] < 1
            assert row["command"].startswith("onmt_train -config ") and row["options"]["train_steps"] > 0
        else:
            assert row["reason"]
    assert {row["mode"] for row in rows} == {"eager", "compiled"}

    c = sections["c"]
    measured = [row for row in c["rows"] if row["status"] == "measured"]
    for group in c["groups"]:  # a run that failed is a defect; one the budget cut short is reported as such
        assert group["status"] in ("ran", "stopped", "not run"), group
        assert group["status"] == "ran" or "time budget" in group["reason"], group
    assert measured or all(group["status"] != "ran" for group in c["groups"]), c
    for row in measured:
        assert _positive(row["sentences_per_s"]) and row["runs"] >= 1
        if "ratio" in row:
            assert _positive(row["ratio"])
    for group in c["groups"]:
        assert group["command"].startswith("onmt_translate -model ")
        assert "-min_length" in group["command"] and "-max_length" in group["command"]


def test_dry_run_defaults_keep_out_of_results():
    args = gpu_check.parse_args(["--device", "cpu", "--tiny"])
    assert args.out == REPO / "build/gpu-check-tiny"
    assert gpu_check.parse_args([]).out == REPO / "results/gpu"


def test_bad_arguments_get_one_line(capsys):
    with pytest.raises(SystemExit) as stopped:
        gpu_check.parse_args(["--device", "cpu", "--tiny", "--steps", "5"])
    assert stopped.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("gpu_check.py: error: --steps must be a multiple of --warmup-steps")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_without_cuda_one_line_and_exit_2():
    done = subprocess.run([sys.executable, str(SCRIPT)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check.py: error: no CUDA device")


def test_busy_time_is_the_union_of_intervals():
    assert gpu_check._merge([]) == 0
    assert gpu_check._merge([(5, 6), (0, 2), (1, 3)]) == 4  # overlapping kernels count once
    assert gpu_check._merge([(0, 10), (2, 3)]) == 10


def test_junit_counts(tmp_path):
    xml = tmp_path / "report.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="m" name="a"/>'
                   '<testcase classname="m" name="b"><failure message="x"/></testcase>'
                   '<testcase classname="m" name="c"><skipped/></testcase>'
                   '<testcase classname="m" name="d"><error message="y"/></testcase></testsuite></testsuites>')
    counts = gpu_check.junit_counts(xml)
    assert (counts["passed"], counts["failed"], counts["skipped"], counts["errors"], counts["tests"]) == (1, 1, 1, 1, 4)
    assert counts["failures"] == ["m::b", "m::d"]


def test_gpu_configs_parse_strictly(tmp_path, onmt_active, monkeypatch):
    """Section b's Base configs as a GPU run writes them: the paper's model, the check's batches and workers,
    pre-encoded repeated data, and -ext_compile on the compiled runs only."""
    from onmt_ext.plugin import parse_train_config

    def encode(model, path, out):  # a stand-in corpus of 10 lines of 3 pieces: the names and counts matter here
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("a b c\n" * 10, encoding="utf-8")
        return out

    monkeypatch.setattr(gpu_check.bench, "encode_file", encode)
    monkeypatch.setattr(gpu_check.bench.subprocess, "run", lambda command, check: Path(
        command[command.index("--output") + 1]).write_text("a b c\n" * 10, encoding="utf-8"))
    args = gpu_check.parse_args(["--work", str(tmp_path)])
    total = args.warmup_steps + args.steps + args.profile_steps
    repeat = math.ceil(2 * args.batch_size * total / 40)  # 40 target tokens per copy, end-of-sentence included
    cache = {}
    for case in (gpu_check.BASELINE, *gpu_check.MECHANISMS):
        paper = support.read_yaml(f"yaml_configs/{case.config}")
        for mode in ("eager",) if case is gpu_check.BASELINE else ("eager", "compiled"):
            path, _, config = gpu_check.training_config(case, mode, args, tmp_path, cache)
            opt = parse_train_config(path)
            assert opt.ext_compile == (mode == "compiled")
            assert (opt.batch_size, opt.batch_type, opt.num_workers) == (8192, "tokens", 2)
            assert opt.model_dtype == paper["model_dtype"] == "fp16"
            assert (opt.hidden_size, opt.enc_layers, opt.dec_layers) == (
                paper["hidden_size"], paper["enc_layers"], paper["dec_layers"])
            assert opt.train_steps == total and not opt.train_from
            assert "sentencepiece" not in opt.transforms
            train, valid = config["data"]["corpus_1"], config["data"]["valid"]
            assert train["path_tgt"].endswith(f".x{repeat}") and not valid["path_tgt"].endswith(f".x{repeat}")
            assert Path(train["path_tgt"]).read_text(encoding="utf-8").count("\n") == 10 * repeat
            if opt.clause_attention:
                assert opt.clause_presplit and train["path_src"].endswith(f".clause.x{repeat}")


def test_property_configs_exist():
    for config in (*gpu_check.PROPERTY_CONFIGS, *gpu_check.TINY_PROPERTY_CONFIGS):
        assert (REPO / "yaml_configs/smoke" / config).is_file(), config
    assert "combined/all_mechanisms.yaml" in gpu_check.PROPERTY_CONFIGS
