"""tools/gpu_check/ (``python -m tools.gpu_check``): its CPU dry run measures every row, and its small helpers.

The dry run (``--device cpu --tiny``) trains and translates toy models
through the real console-script code in child processes, so that the GPU
check cannot rot on a machine without a GPU.  The test gives it budgets
far above its defaults, so that a loaded machine slows it without cutting
rows: every row must then be measured, with finite, positive figures.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import torch

import support
from tools import common, timed_runs
from tools.gpu_check import cases, child, cli, meter, plan, properties, report, training, translation

REPO = support.REPO
COMMAND = [sys.executable, "-m", "tools.gpu_check"]  # run from the checkout (cwd=REPO)


def _positive(value):
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    support.ensure_sample_data()
    out = tmp_path_factory.mktemp("gpu-check")
    # far above the parts' dry-run defaults (60, 125, 90 s): a slow machine cuts no row
    budgets = {"a": 150, "b": 600, "c": 240}
    done = subprocess.run([*COMMAND, "--device", "cpu", "--tiny", "--fresh", "ext,stock,bin,layers",
                           "--compile-warmups", "1",  # (none by default in the dry run)
                           "--case-steps", "4",  # (the dry run's default is --steps's 2: here they differ)
                           "--out", str(out),
                           "--work", str(out / "work"), "--commit", "test-commit", "--pack", str(out / "files.tgz"),
                           *[f"--budget-{name}={seconds}" for name, seconds in budgets.items()]],
                          cwd=REPO, capture_output=True, text=True, timeout=sum(budgets.values()) + 120,
                          env=support.cli_env(OMP_NUM_THREADS="1"))
    return done, out


def test_dry_run_writes_every_section(dry_run):  # the default tier: the check must not rot between GPU runs
    done, out = dry_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "cpu-tiny.json").read_text(encoding="utf-8"))
    text = (out / "cpu-tiny.md").read_text(encoding="utf-8")
    assert "| interval tok/s: median (min-max) |" in text
    assert "Baseline, half weights: the baseline with -ext_half_weights (issue 59, item 4), measured" in text
    for heading in ("## Time per part", "## a. Decoding properties", "## b. Training", "## c. Translation",
                    "## Targets (issues 29 and 35)"):
        assert heading in text
    assert report["mode"] == "cpu-tiny" and report["device"]["torch"] == torch.__version__
    assert report["date"] and report["command"].startswith("python -m tools.gpu_check")
    assert (report["commit"], report["commit_from"]) == ("test-commit", "--commit")
    assert report["compile_backend"] == "eager"
    assert set(report["sections"]) == {"a", "b", "c"}
    assert [part["part"] for part in report["parts"]] == ["a", "b fresh", "b eager", "b compiled", "c eager",
                                                         "c compiled"]
    for part in report["parts"]:
        assert part["status"] == "ran" and 0 <= part["seconds"] <= part["budget_s"] + 30, part
    assert report["seconds"] < sum(part["budget_s"] for part in report["parts"]) + 60


def test_dry_run_measures_every_row(dry_run):
    _, out = dry_run
    sections = json.loads((out / "cpu-tiny.json").read_text(encoding="utf-8"))["sections"]
    for run in sections["a"]["runs"]:
        assert run["command"].startswith("ONMT_EXT_TEST_DEVICE=cpu ")
        assert run["status"] == "passed" and run["tests"] == run["passed"] + run["skipped"] and run["passed"] > 0
    assert {run["dtype"] for run in sections["a"]["runs"]} == {"fp32", "bf16"}

    rows = sections["b"]["rows"]
    trained = {(row["case"], row["mode"], row["group"], row["batch_tokens"]) for row in rows}
    tiny, paper = 512, 2048
    assert trained == {
        ("onmt-ext baseline", "eager", plan.FRESH_EXT, tiny),
        ("onmt-ext baseline", "eager", plan.FRESH_EXT, paper),
        (plan.STOCK_LABEL, "eager", plan.FRESH_STOCK, tiny),
        (plan.STOCK_LABEL, "eager", plan.FRESH_STOCK, paper),
        ("onmt-ext baseline", "eager", plan.FRESH_BIN, tiny),
        ("onmt-ext baseline", "eager", plan.FRESH_BIN, paper),
        ("onmt-ext baseline", plan.LAYERS, plan.FRESH_LAYERS, tiny),
        ("onmt-ext baseline", plan.LAYERS, plan.FRESH_LAYERS, paper),
        ("baseline", "eager", plan.IN_PROCESS, tiny),
        ("baseline, again (A/A control)", "eager", plan.IN_PROCESS, tiny),
        (cases.HALF_WEIGHTS.label, "eager", plan.IN_PROCESS, tiny),
        *((case.label, mode, plan.IN_PROCESS, tiny) for case in cases.TINY_MECHANISMS
          for mode in ("eager", "compiled"))}
    # the baseline with -ext_half_weights: fp16 (the smoke baseline's fp32 would refuse it) on the baseline's batches
    half, = [row for row in rows if row["case"] == cases.HALF_WEIGHTS.label]
    assert half["options"]["ext_half_weights"] and half["options"]["model_dtype"] == "fp16"
    assert half["replay_reused"] and half["target"] is None
    baseline_options, = [row["options"] for row in rows if row["case"] == "baseline" and not row.get("repeat_of")]
    built = {training.replay_key(baseline_options)}
    assert sum(row.get("replay_reused", False) for row in rows) >= len(cases.TINY_MECHANISMS)
    for row in rows:
        assert row["status"] == "measured", row
        for key in ("tokens_per_s", "step_ms", "peak_memory_mb", "ratio", "parameters", "first_step_s",
                    "memory_ratio"):
            assert _positive(row[key]), (row["case"], key, row[key])
        assert 0 <= row["data_wait_share"] < 1
        assert row["measured_steps"] == (4 if row["group"] == plan.IN_PROCESS else 8), row["key"]
        speeds = row["interval_tokens_per_s"]  # one per report interval of the measured steps
        assert len(speeds) == row["measured_steps"] // row["options"]["report_every"] and all(map(_positive, speeds))
        assert row["median_interval_tokens_per_s"] == statistics.median(speeds)
        # over time: (last step, tok/s) of each interval, the users' path's after its unmeasured first steps
        every, skipped = row["options"]["report_every"], 2 if row["group"] == plan.IN_PROCESS else 4
        assert row["interval_points"] == [[skipped + every * (number + 1), speed]
                                          for number, speed in enumerate(speeds)]
        # the parts of a run's time: its checkpoint written only where section c may decode it
        assert (row["save_s"] > 0) == (row["group"] == plan.IN_PROCESS and row["mode"] == "eager"
                                       and row.get("run", 1) == 1 and row is not half), (row["key"], row["save_s"])
        assert row["seconds"] > row["save_s"] + (row["profiler_stop_s"] or 0) + row["model_build_s"]
        if row["save_s"]:  # for translation only: the model without the optimiser's state
            saved, = Path(row["options"]["save_model"]).parent.glob("model_step_*.pt")
            assert torch.load(saved, map_location="cpu", weights_only=False)["optim"] is None
        if row.get("run", 1) > 1:  # the baseline's and the A/A control's further runs measure speed only
            assert "busy_share" not in row and row["profiler_stop_s"] is None, row
        else:
            assert 0 < row["busy_share"] <= 1.0 and _positive(row["busy_ms_per_step"])
            assert math.isclose(row["busy_share_unprofiled"], min(1.0, row["busy_ms_per_step"] / row["step_ms"]))
        assert row["command"].startswith("onmt_train -config ") and row["options"]["train_steps"] > 0
        if row["mode"] == "eager":  # counted (0 is the goal of issue 35), with a call site for every read
            assert row["syncs_per_step"] >= 0 and row["sync_steps"] >= 1, row
            assert (row["syncs_per_step"] == row["syncs_per_report_step"] == 0) or row["sync_sites"], row
        if row["group"] == plan.IN_PROCESS:
            assert "replayed" in row["data_path"] and row["replayed_batches"] > 0
            assert row["options"]["num_workers"] == 0
            # a run reuses the batches of an earlier run of the process with the same data options (the untimed
            # first run is the baseline's): rows are in running order
            key = training.replay_key(row["options"])
            assert row["replay_reused"] == (key in built), (row["case"], row["mode"])
            assert row["replay_reused"] == (row["replay_s"] == 0.0), row["replay_s"]
            built.add(key)
        else:
            first = paper if row["mode"] == plan.LAYERS else tiny  # the first run of its fresh process
            assert _positive(row.get("startup_s")) or row["batch_tokens"] != first, row
            assert row["options"]["num_workers"] >= 1 and row["replayed_batches"] is None
    # the in-process baseline runs again after every --train-block cases and last; each case's ratio is over the
    # baseline runs nearest before and after it, and the baseline row shows the median of its runs
    in_process = [row for row in rows if row["group"] == plan.IN_PROCESS]
    repeats = [row for row in in_process if row.get("repeat_of")]
    assert len(repeats) == sum(math.ceil(len([row for row in in_process if row["case"] != "baseline"
                                              and row.get("part", row["mode"]) == part]) / 2)
                               for part in ("eager", "compiled"))
    # the A/A control: three runs spread over the eager part (first of all, its middle, its last), where a cut
    # budget cannot drop them; its median and interval reported, and beside every other ratio of the group when
    # outside its band
    controls = [row for row in in_process if row["control"]]
    assert [row["run"] for row in controls] == [1, 2, 3] and in_process[1] is controls[0]
    eager = [row for row in in_process if row.get("part", row["mode"]) == "eager"]
    assert eager[-2] is controls[-1] and eager[-1].get("repeat_of")
    assert all(row.get("part", row["mode"]) == "compiled" for row in in_process[len(eager):])
    aa = sections["b"]["aa"]
    assert aa["runs"] == 3 and aa["ratios"] == [round(row["ratio"], 4) for row in controls]
    assert math.isclose(aa["median"], statistics.median(row["ratio"] for row in controls))
    assert aa["within"] == (0.97 <= aa["median"] <= 1.03) and aa["coverage"] == 0.75
    for row in in_process:
        if row["reference"] and not row["control"]:
            assert row.get("aa_note") == cases.aa_note(aa), row["key"]
    base = next(row for row in in_process if row["key"] == repeats[0]["repeat_of"])
    runs = [base["runs_tokens_per_s"][0]] + [row["tokens_per_s"] for row in repeats]
    assert base["runs"] == len(runs) and math.isclose(base["tokens_per_s"], statistics.median(runs))
    for row in in_process:
        if row["reference"] == base["key"]:
            before = max((r for r in [base, *repeats] if r["ended"] < row["ended"]), key=lambda r: r["ended"])
            after = min((r for r in repeats if r["ended"] > row["ended"]), key=lambda r: r["ended"])
            assert math.isclose(row["ratio"], row["tokens_per_s"] / math.sqrt(
                (base["runs_tokens_per_s"][0] if before is base else before["tokens_per_s"]) * after["tokens_per_s"]))
    warm = sections["b"]["warm_up"]  # the machine's first training process: stock, untimed, during section a
    assert warm["status"] == "measured" and warm["group"] == plan.WARM_UP, warm
    assert _positive(warm["first_step_s"]) and _positive(warm["startup_s"])
    assert warm["options"]["num_workers"] >= 1 and "overwrite_checkpoints" not in warm["options"]
    ahead = sections["b"]["compile_warm_up"]  # every compiled row's config, compiled ahead while section a ran
    assert [(row["case"], row["mode"]) for row in ahead] == [("onmt-ext baseline", plan.LAYERS)] + [
        (row["case"], row["mode"]) for row in rows if row["mode"] == "compiled"]  # the layers first, small batch
    assert all(row["status"] == "warmed up" and row["steps"] >= 1 for row in ahead), ahead
    for row in rows:  # the profiled steps' operator tables, one file per measured run
        if row.get("run", 1) > 1:  # the baseline's and the A/A control's further runs are not profiled
            continue
        table = out / "profiles" / "cpu-tiny" / f"{training.file_slug(row['key'])}.txt"
        assert "sorted by self_cpu_time_total" in table.read_text(encoding="utf-8"), row["key"]
    with tarfile.open(out / "files.tgz") as archive:  # --pack: the tables and the children's logs in one file
        names = set(archive.getnames())
    assert {f"profiles/cpu-tiny/{path.name}" for path in (out / "profiles" / "cpu-tiny").iterdir()} <= names
    assert {"work/train-in-one-process.log", "work/translate.runs.jsonl", "work/properties-none.xml"} <= names
    stock = [row for row in rows if row["group"] == plan.FRESH_STOCK]
    assert all("ext_compile" not in row["options"] and "overwrite_checkpoints" not in row["options"]
               for row in stock)
    assert all(row["options"]["ext_compile"] for row in rows if row["mode"] == "compiled")
    layers = [row for row in rows if row["mode"] == plan.LAYERS]
    assert [row["batch_tokens"] for row in layers] == [paper, tiny]  # the paper's batch first
    assert all(row["options"]["ext_compile_layers"] and not row["options"].get("ext_compile") for row in layers)
    assert all(row["reference"] == f"{plan.FRESH_STOCK}|{plan.STOCK_LABEL}|eager|{row['batch_tokens']}"
               for row in layers)
    # the binarised rows: the onmt-ext baseline's config and batches, read from the cache that make reproduce-*
    # trains from, filled beforehand: one directory per batch size's corpus, each binarised once
    binarized = [row for row in rows if row["group"] == plan.FRESH_BIN]
    ext = {row["batch_tokens"]: row for row in rows if row["group"] == plan.FRESH_EXT}
    assert [row["batch_tokens"] for row in binarized] == [tiny, paper]
    root = out / "work" / "binarized"
    filled = sorted(path.parent for path in root.glob("*/manifest.json"))
    assert len(filled) == 2, filled
    assert all(json.loads((path / "manifest.json").read_text(encoding="utf-8"))["corpora"]["corpus_1"]["kept"] > 0
               for path in filled)
    log = (out / "work" / "binarize.log").read_text(encoding="utf-8")
    assert log.count("== onmt_ext_binarize -config") == 2 and all(str(path) in log for path in filled)
    for row in binarized:
        options = dict(row["options"])
        assert Path(options.pop("ext_binarized_cache")) == root and "-ext_binarized_cache" in row["data_path"]
        assert row["reference"] == ext[row["batch_tokens"]]["key"]  # its ratio: over the text's, same batches
        mine = {key: value for key, value in options.items() if key not in ("save_model", "save_data", "data")}
        assert mine == {key: value for key, value in ext[row["batch_tokens"]]["options"].items()
                        if key not in ("save_model", "save_data", "data")}
    assert _positive(sections["b"]["binarize_s"])
    assert "work/binarize.log" in names

    c = sections["c"]
    assert {group["key"] for group in c["groups"]} == {"translate-eager", "greedy-eager", "translate-compiled",
                                                       "greedy-compiled"}
    for group in c["groups"]:
        assert group["status"] == "ran", group
        # where the group's time went: its timed runs, less than all of it (seconds: one decimal), and around each
        assert 0 < group["timed_s"] < group["seconds"] + 0.05 and 0 <= group["run_overhead_s"] < group["timed_s"]
        # and it keeps every timed run, each counted in its row's runs
        assert len(group["timed_runs"]) == sum(row.get("runs", 0) for row in c["rows"] if row["group"] == group["key"])
        assert group["command"].startswith("onmt_translate -model ")
        assert "-min_length" in group["command"] and "-max_length" in group["command"]
        assert group["compile"] == ("none (eager)" if group["mode"] == "eager"
                                    else "onmt_translate's -ext_compile option, torch.compile backend eager")
        # greedy comes after beam search in each mode and takes the models beam search loaded (the compiled
        # groups' eager baseline takes the eager groups' engine whole)
        reused = {name.rsplit(" (", 1)[0] for name in group["models_reused"]}
        group_cases = {row["case"] for row in c["rows"] if row["group"] == group["key"]}
        control = "baseline, again (A/A control)"  # in every group, eager (in the compiled ones: their engines)
        assert control in group_cases
        assert reused == (set() if group["search"] == "beam 4" else group_cases if group["mode"] == "eager"
                          else group_cases - {"baseline", control}), group
        # each group's A/A control: one run per pass, its median and interval, and a note beside every other ratio
        # when outside its band
        aa, = [row for row in c["rows"] if row["group"] == group["key"] and row["control"]]
        assert group["aa"]["runs"] == 3 and group["aa"]["ratios"] == aa["run_ratios"]
        assert all(row.get("aa_note") == cases.aa_note(group["aa"]) for row in c["rows"]
                   if row["group"] == group["key"] and row["case"] not in ("baseline", control))
    for row in c["rows"]:
        assert row["status"] == "measured", row
        assert _positive(row["sentences_per_s"]) and row["runs"] >= 1 and _positive(row["ratio"])
        # the report keeps every paired ratio: the ratio can be worked out again from them
        if row.get("ratios"):
            assert len(row["run_ratios"]) == row["ratios"]
            assert math.isclose(row["ratio"], statistics.median(row["run_ratios"]), rel_tol=1e-3)


def test_dry_run_targets_have_issue_35s_rows(dry_run):
    _, out = dry_run
    targets = json.loads((out / "cpu-tiny.json").read_text(encoding="utf-8"))["targets"]
    measures = [row["measure"] for row in targets]
    for words in ("baseline target tok/s, 2048-token batches", "busy share", "over stock OpenNMT-py",
                  "binarised data (-ext_binarized_cache), users' data path", "users' data path over its in-process run",
                  "users' data path, binarised data (-ext_binarized_cache) over its in-process run",
                  "synchronisations per step", "first step after the model is built", "start-up overhead",
                  "training ratio, li2019 EM routing", "peak memory over the baseline's", "decoding ratio (beam 4)"):
        found = [row for row in targets if words in row["measure"]]
        assert found, (words, measures)
        assert all(row["measured"] is not None and row["met"] is None for row in found), found  # not judged
    # the start-up row is onmt-ext's fresh process's start-up less stock's, both at the small batch
    b = json.loads((out / "cpu-tiny.json").read_text(encoding="utf-8"))["sections"]["b"]
    rows, small = {row["key"]: row for row in b["rows"]}, b["batch_tokens"][0]
    ext, stock = rows[f"{plan.FRESH_EXT}|onmt-ext baseline|eager|{small}"], rows[
        f"{plan.FRESH_STOCK}|{plan.STOCK_LABEL}|eager|{small}"]
    overhead, = [row for row in targets if row["measure"].startswith("start-up overhead of onmt-ext over stock")]
    assert overhead["measured"] == pytest.approx(ext["startup_s"] - stock["startup_s"])
    assert overhead["target"] == f"<= {cases.STARTUP_OVERHEAD_TARGET_S:g}"


@pytest.mark.slow
def test_the_fresh_only_run_measures_the_users_path_rows_alone(tmp_path):
    """``--sections b --fresh-only``, the first command of the next GPU session (docs/gpu-check.md): three fresh
    processes, the stock control and the users'-path A/A control among them (the compiled layers' process: in the
    module's dry run, as with it this run would take longer; docs/gpu-check.md), and nothing else, their tables
    packed; the A/A's ratio at each batch reported as such."""
    support.ensure_sample_data()
    done = subprocess.run([*COMMAND, "--device", "cpu", "--tiny", "--sections", "b", "--fresh-only",
                           "--fresh", "ext,stock,aa", "--budget-b", "300", "--out", str(tmp_path),
                           "--work", str(tmp_path / "w"),
                           "--commit", "test-commit", "--pack", str(tmp_path / "files.tgz")],
                          cwd=REPO, capture_output=True, text=True, timeout=420,
                          env=support.cli_env(OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "cpu-tiny.json").read_text(encoding="utf-8"))
    assert set(report["sections"]) == {"b"} and [part["part"] for part in report["parts"]] == ["b fresh"]
    rows = report["sections"]["b"]["rows"]
    assert [row["group"] for row in rows] == [plan.FRESH_EXT] * 2 + [plan.FRESH_STOCK] * 2 + [plan.FRESH_AA] * 2
    assert all(row["status"] == "measured" and _positive(row["tokens_per_s"]) for row in rows)
    aa = {row["batch_tokens"]: row for row in rows if row["group"] == plan.FRESH_AA}
    assert [(entry["batch_tokens"], entry["aa"]["ratios"]) for entry in report["sections"]["b"]["fresh_aa"]] == [
        (batch, [round(aa[batch]["ratio"], 4)]) for batch in (512, 2048)]
    assert "Users' path, A/A control (the onmt-ext baseline again" in (tmp_path / "cpu-tiny.md").read_text(
        encoding="utf-8")
    with tarfile.open(tmp_path / "files.tgz") as archive:
        assert any(name.startswith("profiles/cpu-tiny/") for name in archive.getnames())


def test_the_pack_holds_only_the_files_this_run_wrote(tmp_path, capsys):
    """``--pack``: tools/gpu_stage.sh gives every call of a session the same work folder, and a later call's pack
    held an earlier call's logs; only what the run wrote or rewrote after its start goes in."""
    work, profiles = tmp_path / "work", tmp_path / "out" / "profiles" / "cpu-tiny-train-cases"
    profiles.mkdir(parents=True)
    work.mkdir()
    earlier = [work / "properties-none.log", work / "properties-none.xml", work / "train-in-one-process.log",
               work / "train-in-one-process.runs.jsonl", profiles / "old-run.txt", profiles / "rerun.txt"]
    for path in earlier:  # an earlier call's files
        path.write_text("earlier\n", encoding="utf-8")
        os.utime(path, (time.time() - 3600,) * 2)
    args = argparse.Namespace(work=work, profiles=profiles, pack=tmp_path / "out" / "files.tgz")
    before = cli.packed_files(args)
    assert set(before) == set(earlier)
    (work / "train-in-one-process.log").write_text("this run\n", encoding="utf-8")  # rewritten
    (work / "train-in-one-process.runs.jsonl").unlink()
    (work / "train-in-one-process.runs.jsonl").write_text("{}\n", encoding="utf-8")  # removed, written again
    (work / "translate.log").write_text("this run\n", encoding="utf-8")  # new
    (work / "translate.jobs.json").write_text("{}\n", encoding="utf-8")  # (not a log: never packed)
    (profiles / "rerun.txt").write_text("this run\n", encoding="utf-8")
    cli.pack_files(args, before)
    with tarfile.open(args.pack) as archive:
        assert sorted(archive.getnames()) == [
            "profiles/cpu-tiny-train-cases/rerun.txt", "work/train-in-one-process.log",
            "work/train-in-one-process.runs.jsonl", "work/translate.log"]
        assert archive.extractfile("work/train-in-one-process.log").read() == b"this run\n"
    assert "this run's operator tables and logs also in" in capsys.readouterr().out


def test_dry_run_defaults_keep_out_of_results():
    args = cli.parse_args(["--device", "cpu", "--tiny"])
    assert args.out == REPO / "build/gpu-check-tiny"
    assert cli.parse_args([]).out == REPO / "results/gpu"


def test_bad_arguments_get_one_line(capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.parse_args(["--device", "cpu", "--tiny", "--steps", "5"])
    assert stopped.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("gpu_check.py: error: --steps, --case-steps and --fresh-warmup-steps must be multiples")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_without_cuda_one_line_and_exit_2():
    done = subprocess.run(COMMAND, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check.py: error: no CUDA device")


def test_busy_time_is_the_union_of_intervals():
    assert meter._merge([]) == 0
    assert meter._merge([(5, 6), (0, 2), (1, 3)]) == 4  # overlapping kernels count once
    assert meter._merge([(0, 10), (2, 3)]) == 10


def test_busy_time_from_raw_events_equals_torchs_events():
    from torch.autograd import DeviceType

    layer = torch.nn.Linear(32, 32)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        for _ in range(3):
            layer(torch.randn(16, 32)).relu().sum().backward()
    old = meter._merge([(event.time_range.start, event.time_range.end) for event in profiler.events()
                            if event.device_type == DeviceType.CPU and event.time_range.end > event.time_range.start])
    assert old > 0 and math.isclose(meter.busy_seconds(profiler, False), old / 1e6, rel_tol=1e-9)


def test_a_run_that_raised_mid_step_leaves_no_sync_window_or_profiler_open_for_the_next(monkeypatch):
    """A run that raises inside a counted, profiled step skips :meth:`Meter.end`; the next run's ``begin`` closes
    what it left open, so that the process's later runs neither run under its window (on the CPU the HostReads
    dispatch mode, on CUDA torch's sync debug mode, here a stand-in that records its exit) nor its profiler."""
    import contextlib

    from torch.utils._python_dispatch import _get_current_dispatch_mode

    from onmt_ext.runtime import hostsync

    job = {"replay": False, "counted": [1, 1], "host_reads": True, "profile": [1, 1]}
    measuring = meter.Meter(cuda=False)
    measuring.begin(job)
    measuring._step_begins(1)  # the run's step 1 fetched its batches ...
    measuring._profile(1, start=True)  # ... and started, then raised: no _step_begins(None), no profiler stop
    left_open = measuring.sync_window.context, measuring.window["profiler"]
    try:
        assert isinstance(_get_current_dispatch_mode(), hostsync.HostReads)
        assert torch.autograd.profiler._is_profiler_enabled
        measuring.begin(job)
        assert _get_current_dispatch_mode() is None and not torch.autograd.profiler._is_profiler_enabled
        assert measuring.sync_window is None and measuring.window == {}
    finally:  # (without the fix: close them here, so that the later tests do not run under them)
        if _get_current_dispatch_mode() is left_open[0]:
            left_open[0].__exit__(None, None, None)
        if torch.autograd.profiler._is_profiler_enabled:
            left_open[1].__exit__(None, None, None)

    exits = []

    @contextlib.contextmanager
    def sync_warnings(skip):
        try:
            yield []
        finally:
            exits.append(skip)

    monkeypatch.setattr(hostsync, "cuda_sync_warnings", sync_warnings)
    window = meter._SyncWindow(cuda=True)
    window.open()
    measuring.sync_window = window
    measuring.begin(job)
    assert exits == [meter.OWN_FILES] and measuring.sync_window is None
    measuring.begin(job)  # (nothing left open: nothing closed twice)
    assert exits == [meter.OWN_FILES]


def test_operator_tables_wait_for_the_last_run_and_the_budget(monkeypatch):
    import types

    written, clock = [], iter([0.0, 0.0, 2.5, 2.5, 2.5])  # the first table takes 2.5 s; the deadline is at 4 s
    monkeypatch.setattr(time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(meter, "write_profile_tables", lambda profiler, *rest: written.append(profiler))
    fake = types.SimpleNamespace(cuda=False, tables=[(f"run {n}", f"profile {n}", None, "") for n in range(3)])
    records = []
    meter.Meter.write_tables(fake, 4.0, records.append)
    assert written == ["profile 0"] and fake.tables == []
    assert [(entry["key"], entry["written"]) for entry in records] == [("run 0", True), ("run 1", False),
                                                                       ("run 2", False)]


def test_junit_counts(tmp_path):
    xml = tmp_path / "report.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="m" name="a"/>'
                   '<testcase classname="m" name="b"><failure message="x"/></testcase>'
                   '<testcase classname="m" name="c"><skipped/></testcase>'
                   '<testcase classname="m" name="d"><error message="y"/></testcase></testsuite></testsuites>')
    counts = properties.junit_counts(xml)
    assert (counts["passed"], counts["failed"], counts["skipped"], counts["errors"], counts["tests"]) == (1, 1, 1, 1, 4)
    assert counts["failures"] == ["m::b", "m::d"]
    # an interrupted run's report ends in a nameless case, the test that was running: not a pass
    xml.write_text('<testsuites><testsuite><testcase classname="m" name="a"/><testcase time="0.000" />'
                   '</testsuite></testsuites>')
    assert properties.junit_counts(xml)["passed"] == 1 and properties.junit_counts(xml)["tests"] == 1


def test_section_a_shares_fp32s_console_checks():
    """On a GPU, fp32's console-script checks (which train and translate through the console scripts, the
    slowest of the suite: the H100's and H200's fp32 runs never finished in section a) are shared among
    --console-shards processes beside its in-process checks; the dry run leaves them out, as before.  On CUDA
    one more process runs the fused routing kernels' tests."""
    gpu = properties.property_processes(cli.parse_args([]))
    suite = cases.PROPERTY_TEST
    assert [(dtype, selection, extra) for dtype, _, selection, extra, _ in gpu] == [
        ("none", [suite, "-m", "not slow"], {}),
        *[("none", [suite, "-m", "slow"], {properties.CONSOLE_SHARD_VARIABLE: f"{k}/6"}) for k in range(6)],
        ("fp16", [suite], {}), ("bf16", [suite], {}),
        ("none", [cases.KERNEL_TEST, "-n", str(cases.KERNEL_TEST_WORKERS)], {})]
    assert len({stem for *_, stem in gpu}) == len(gpu) and gpu[0][-1] == "properties-none"
    tiny = properties.property_processes(cli.parse_args(["--tiny", "--device", "cpu"]))
    assert [(dtype, selection) for dtype, _, selection, _, _ in tiny] == [("none", [suite, "-m", "not slow"]),
                                                                          ("bf16", [suite, "-m", "not slow"])]
    # the kernels' tests run on a GPU only (in the CPU's interpreter they take longer than the dry run's section a)
    assert properties.property_processes(cli.parse_args(["--tiny"]))[-1][2][0] == cases.KERNEL_TEST
    assert len(properties.property_processes(cli.parse_args(["--console-shards", "2", "--device", "cpu"]))) == 5
    with pytest.raises(SystemExit):
        cli.parse_args(["--console-shards", "-1"])


@pytest.mark.slow  # five collections of the suite
def test_console_shares_cover_the_console_checks_once():
    """The suite's ONMT_EXT_TEST_CONSOLE_SHARD=k/n (what section a's shares set): with section a's configs, the
    shares' console-script checks are disjoint and together all of them; a bad value stops the collection."""
    def collected(shard):
        env = {**os.environ, "ONMT_EXT_TEST_CONFIGS": ",".join(cases.PROPERTY_CONFIGS),
               properties.CONSOLE_SHARD_VARIABLE: shard}
        done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                               "-m", "slow", cases.PROPERTY_TEST], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=300)
        return [line for line in done.stdout.splitlines() if "::" in line], done

    everything, _ = collected("")
    shares = [collected(f"{k}/4")[0] for k in range(4)]
    assert len(everything) == 12 and sorted(sum(shares, [])) == sorted(everything)  # 6 representatives x 2
    _, bad = collected("4/4")
    assert bad.returncode != 0 and "ONMT_EXT_TEST_CONSOLE_SHARD='4/4': expected k/n" in bad.stdout


def test_targets_name_the_batch_sizes_without_section_b():
    """A run of section a alone lists no target (they are the other parts', named in one line of its report); rows
    of section b without its batch sizes take them from the options (it wrote "None tokens")."""
    assert report.targets_table({}, False, (512, 2048)) == []
    args = cli.parse_args(["--part", "train-fresh", "--device", "cpu", "--tiny"])
    rows = [row for *_, entries in plan.training_plan(args, []) for row, *_ in entries]
    measures = [row["measure"] for row in report.targets_table({"b": {"rows": rows}}, False, (512, 2048))]
    assert not any("None" in measure for measure in measures), measures
    assert any("2048-token batches" in measure for measure in measures)
    assert any("512 tokens" in measure for measure in measures)


def test_compile_warm_ups_keep_a_papers_rows_together():
    """The compiled rows compiled ahead: a paper's cases in one process, so that li2019's EM rows (one core graph)
    compile it once and load it from the disk cache after; dealt round, EM on the encoder and Effective
    Aggregation compiled it side by side in two processes.  -ext_compile_layers' row goes first."""
    entries = [({}, case, "compiled", None) for case in cases.MECHANISMS]
    layers = ({}, cases.BASELINE, plan.LAYERS, None)
    shares = training.deal_by_paper([*entries, layers], 3)
    papers = [[case.config.split("/")[0] if mode != plan.LAYERS else mode for _, case, mode, _ in share]
              for share in shares]
    assert papers == [[plan.LAYERS, "cao2019", "clause"], ["li2019"] * 4, ["chen2019", "chen2019", "gret"]]
    assert [case for _, case, _, _ in shares[1]] == list(cases.MECHANISMS[:4])  # the plan's order kept
    assert sorted(map(len, training.deal_by_paper(entries, 3))) == [2, 3, 4]
    assert len(training.deal_by_paper(entries[:2], 3)) == 1  # one paper: one process


def test_section_a_times_each_process_to_its_own_exit(tmp_path):
    """finish_section_a: a process's seconds run to its own exit, not to the last one's; a share with no test
    (pytest's status 5) is "empty", not failed; a process past the deadline is stopped."""
    xml = tmp_path / "passed.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="m" name="a"/></testsuite></testsuites>')
    processes = {"passed": "import sys; sys.exit(0)", "empty": "import sys; sys.exit(5)",
                 "slow": "import time; time.sleep(30)", "late": "import time; time.sleep(1.5)"}
    result, started, began = {"runs": []}, [], plan.monotonic_now()
    for name, code in processes.items():
        run = {"dtype": name, "log": "-"}
        child = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
        started.append((run, child, xml if name == "passed" else tmp_path / f"{name}.xml", plan.monotonic_now()))
        result["runs"].append(run)
    properties.finish_section_a(result, started, began + 4.0)
    runs = {run["dtype"]: run for run in result["runs"]}
    assert runs["passed"]["status"] == "passed" and runs["passed"]["passed"] == 1
    assert runs["empty"]["status"] == "empty" and runs["empty"]["tests"] == 0
    assert runs["slow"]["status"] == "stopped" and runs["slow"]["seconds"] >= 3.9
    assert runs["late"]["status"] == "failed" and 1.4 < runs["late"]["seconds"] < runs["slow"]["seconds"]
    assert runs["passed"]["seconds"] < 1.4 and result["status"] == "partly run"


def test_a_stopped_pytest_process_reports_the_tests_it_finished(tmp_path, monkeypatch):
    """Past section a's deadline a pytest process is interrupted, as by Ctrl-C, and its JUnit report of the tests
    it finished is counted (a kill left none: on a GPU, the kernels' tests stopped by the budget would say nothing),
    with xdist's workers too; a process that ignores the interruption is killed after the grace."""
    (tmp_path / "test_some.py").write_text(
        "import os, pathlib, time\n\n\ndef mark(name):\n    pathlib.Path(os.environ['MARK'] + name).touch()\n\n\n"
        "def test_a():\n    mark('a')\n\n\ndef test_b():\n    mark('b')\n\n\n"
        "def test_slow():\n    mark('slow')\n    time.sleep(120)\n")
    monkeypatch.setattr(properties, "STOP_GRACE_S", 30)
    result, started = {"runs": []}, []
    for name, extra in (("serial", []), ("workers", ["-n", "2"])):
        run, xml = {"dtype": name, "log": "-"}, tmp_path / f"{name}.xml"
        # (where this test runs with SIGINT ignored, as in a job bash starts in the background, a plain
        # python -m pytest would ignore it too and never write its report)
        child = subprocess.Popen(properties.pytest_command(["-q", "-p", "no:cacheprovider", *extra, "test_some.py",
                                                            f"--junitxml={xml}"]), cwd=tmp_path, start_new_session=True,
                                 env=dict(os.environ, MARK=str(tmp_path / f"{name}.")),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started.append((run, child, xml, plan.monotonic_now()))
        result["runs"].append(run)
    waited = plan.monotonic_now()
    marks = [tmp_path / f"{name}.{test}" for name in ("serial", "workers") for test in ("a", "b", "slow")]
    while not all(mark.exists() for mark in marks):  # test_a and test_b ran, test_slow is running
        assert plan.monotonic_now() - waited < 120, "the pytest processes did not reach test_slow"
        time.sleep(0.1)
    time.sleep(1.0)  # their reports reach pytest (xdist's controller)
    properties.finish_section_a(result, started, plan.monotonic_now())
    for run in result["runs"]:
        assert run["status"] == "stopped" and (run.get("passed"), run.get("tests")) == (2, 2), run
        assert "2 tests finished" in run["reason"]
    deaf = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGINT, "
                             "signal.SIG_IGN); time.sleep(60)"], start_new_session=True)
    monkeypatch.setattr(properties, "STOP_GRACE_S", 1)
    result = {"runs": [{"dtype": "deaf", "log": "-"}]}
    properties.finish_section_a(result, [(result["runs"][0], deaf, tmp_path / "deaf.xml", plan.monotonic_now())],
                                plan.monotonic_now())
    assert result["runs"][0]["status"] == "stopped" and result["runs"][0]["reason"].startswith("not run: budget")
    assert deaf.poll() is not None


def test_gpu_configs_parse_strictly(tmp_path, onmt_active, monkeypatch):
    """Section b's Base configs as a GPU run writes them: the paper's model, the check's batches and workers,
    pre-encoded repeated data, and -ext_compile true on the compiled runs, false on the eager ones."""
    from onmt_ext.integration.parsing import parse_train_config

    def encode(model, path, out, **_):  # a stand-in corpus of 10 lines of 3 pieces: names and counts matter
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("a b c\n" * 10, encoding="utf-8")
        return out

    monkeypatch.setattr(timed_runs, "encode_file", encode)
    monkeypatch.setattr(timed_runs.subprocess, "run", lambda command, check: Path(
        command[command.index("--output") + 1]).write_text("a b c\n" * 10, encoding="utf-8"))
    args = cli.parse_args(["--work", str(tmp_path)])
    total = args.warmup_steps + args.steps + args.profile_steps
    assert plan.step_plan(args)["total"] == total  # on CUDA the sync warnings are counted in the measured steps
    in_process = args.warmup_steps + args.case_steps + args.profile_steps  # fewer: the same replayed batches
    assert in_process < total and plan.step_plan(args, args.case_steps)["total"] == in_process
    longest = args.fresh_warmup_steps + args.steps + args.profile_steps  # the users' path's runs: the longest
    repeat = math.ceil(2 * args.batch_size * longest / 40)  # 40 target tokens per copy, end-of-sentence included
    cache = {}
    for case in (cases.BASELINE, *cases.MECHANISMS):
        paper = support.read_yaml(f"yaml_configs/{case.config}")
        for mode in ("eager",) if case is cases.BASELINE else ("eager", "compiled"):
            replay = case is not cases.BASELINE  # the mechanisms in one process, the baseline on both paths
            steps = args.case_steps if replay else args.steps
            path, _, config = training.training_config(case, mode, args, tmp_path, cache, replay=replay, steps=steps)
            run = in_process if replay else total
            opt = parse_train_config(path)
            # eager pinned (the default, auto, compiles chen2019's and GRET's cores on CUDA); the baseline's default
            assert opt.ext_compile == ("auto" if case is cases.BASELINE else mode == "compiled")
            assert (opt.batch_size, opt.batch_type, opt.num_workers) == (8192, "tokens", 0 if replay else 2)
            assert opt.model_dtype == paper["model_dtype"] == "fp16"
            assert (opt.hidden_size, opt.enc_layers, opt.dec_layers) == (
                paper["hidden_size"], paper["enc_layers"], paper["dec_layers"])
            assert opt.train_steps == run and not opt.train_from
            assert "sentencepiece" not in opt.transforms
            train, valid = config["data"]["corpus_1"], config["data"]["valid"]
            assert train["path_tgt"].endswith(f".x{repeat}") and not valid["path_tgt"].endswith(f".x{repeat}")
            assert Path(train["path_tgt"]).read_text(encoding="utf-8").count("\n") == 10 * repeat
            assert train["path_src"].endswith(f".v{repeat}")  # the sources' copies vary (a batch keeps them all)
            assert valid["path_src"] == train["path_src"].rsplit(".", 1)[0]  # never validated: the training copy
            if opt.clause_attention:
                assert opt.clause_presplit and train["path_src"].endswith(f".clause6.v{repeat}")
    # the baseline with -ext_half_weights: the baseline's config and batches (fp16 already), the option on
    configs = [training.training_config(case, "eager", args, tmp_path, cache, replay=True, steps=args.case_steps,
                                        name=name) for case, name in ((cases.BASELINE, "eager"),
                                                                      (cases.HALF_WEIGHTS, "half_weights"))]
    (_, _, base), (path, _, half) = configs
    opt = parse_train_config(path)
    assert opt.ext_half_weights and opt.model_dtype == "fp16" and opt.optim != "fusedadam"
    assert training.replay_key(half) == training.replay_key(base) and half["save_model"] != base["save_model"]
    assert {key for key in half if half[key] != base.get(key)} == {"ext_half_weights", "save_model", "save_data"}


def test_property_configs_exist():
    for config in (*cases.PROPERTY_CONFIGS, *cases.TINY_PROPERTY_CONFIGS):
        assert (REPO / "yaml_configs/smoke" / config).is_file(), config
    assert "combined/all_mechanisms.yaml" in cases.PROPERTY_CONFIGS


def test_stock_config_holds_stock_options_only(tmp_path, onmt_active, monkeypatch):
    monkeypatch.setattr(timed_runs, "encode_file", lambda model, path, out, **_: (
        out.parent.mkdir(parents=True, exist_ok=True), out.write_text("a b c\n" * 10, encoding="utf-8"), out)[-1])
    args = cli.parse_args(["--work", str(tmp_path)])
    _, _, ext = training.training_config(cases.BASELINE, "eager", args, tmp_path, {}, name="ext")
    path, _, stock = training.training_config(cases.BASELINE, "eager", args, tmp_path, {}, stock=True,
                                               name="stock")
    assert ext["overwrite_checkpoints"] and ext["adam_eps"] == 1e-9
    assert not set(training.EXT_TRAIN_OPTIONS) & set(stock)
    assert support.read_yaml(path) == stock and stock["encoder_type"] == stock["decoder_type"] == "transformer"
    assert {key: value for key, value in ext.items() if key not in ("overwrite_checkpoints", "adam_eps", "save_model",
                                                                    "save_data")} == {
        key: value for key, value in stock.items() if key not in ("save_model", "save_data")}
    with pytest.raises(ValueError, match="no stock OpenNMT-py twin"):
        training.training_config(cases.MECHANISMS[0], "eager", args, tmp_path, {}, stock=True)


def test_the_users_path_aa_control_trains_exts_config_in_a_process_of_its_own(tmp_path, onmt_active, monkeypatch):
    """``--fresh ext,aa`` (issue 57): the A/A control's configs, as prepare_training writes them, are ext's at each
    batch size, only their files (checkpoint, samples) apart; its process gets ext's environment."""
    monkeypatch.setattr(timed_runs, "encode_file", lambda model, path, out, **_: (
        out.parent.mkdir(parents=True, exist_ok=True), out.write_text("a b c\n" * 10, encoding="utf-8"), out)[-1])
    args = cli.parse_args(["--part", "train-fresh", "--fresh", "aa,ext", "--device", "cpu", "--tiny", "--work",
                           str(tmp_path)])
    fresh = plan.training_plan(args, cases.MECHANISMS)
    configs = training.prepare_training(args, tmp_path, fresh, {})
    (_, ext_group, ext_env, ext), (_, aa_group, aa_env, aa) = fresh
    assert (ext_group, aa_group, aa_env) == (plan.FRESH_EXT, plan.FRESH_AA, ext_env)
    for (mine, *_), (theirs, *_) in zip(aa, ext, strict=True):
        (path, _, options), (their_path, _, their_options) = configs[mine["key"]], configs[theirs["key"]]
        assert path != their_path and options["batch_size"] == theirs["batch_tokens"]
        assert set(options) == set(their_options)
        assert {key for key in options if options[key] != their_options[key]} == {"save_model", "save_data"}


def test_commit_is_the_projects_or_unknown(tmp_path, monkeypatch):
    monkeypatch.delenv(cli.COMMIT_ENV, raising=False)
    assert cli.project_commit("abc1234") == ("abc1234", "--commit")
    monkeypatch.setenv(cli.COMMIT_ENV, "def5678")
    assert cli.project_commit() == ("def5678", f"${cli.COMMIT_ENV}")
    monkeypatch.delenv(cli.COMMIT_ENV)
    outer = tmp_path / "outer"  # an exported copy inside another repository: its HEAD is not the project's
    (outer / "project").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(outer)], check=True)
    subprocess.run(["git", "-C", str(outer), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                    "--allow-empty", "-m", "outer"], check=True)
    monkeypatch.setattr(cli, "REPO", outer / "project")
    commit, why = cli.project_commit()
    assert commit is None and "not this project's" in why
    monkeypatch.setattr(cli, "REPO", outer)
    assert cli.project_commit()[0]  # the repository's own root: its HEAD


def test_plan_cases_keeps_priority_and_fits():
    costs = {"aa": 2.0, "slow": 10.0, "fast": 2.0}
    # each pass: the chosen cases, plus the baseline once per 2 of them; one more baseline run at the start
    chosen, estimate = plan.plan_cases(costs, 2.0, ["aa", "slow", "fast"], passes=6, block=2, seconds=40)
    assert chosen == ["aa", "fast"] and estimate == 6 * (2 + 2 + 2) + 2
    assert plan.plan_cases(costs, 2.0, ["aa"], passes=6, block=2, seconds=10) == ([], 0.0)


def test_a_group_warms_up_a_candidate_only_while_its_runs_could_still_fit():
    """The compiled beam-4 group of the c8ab26d H200 run compiled five cases (0.6 to 18 s each) and had no time
    left to time any.  Figures of that kind: the baseline runs the test set in 0.4 s, EM in 0.6 s, so with 2-s runs
    (5 copies) a run costs 2 and 3 s; EM's warm-up took 14.6 s."""
    first, warm, gate = {"B": 0.4, "em": 0.6}, [14.6], plan.warm_another
    assert plan.run_costs(first, 2.0) == (5, {"B": 2.0, "em": 3.0})
    # 40 s left: EM's schedule fits (6 passes of 3 + 2 s, and one more baseline run: 32 s); after another 14.6-s
    # warm-up neither EM's nor a new case's would
    assert not gate(first, "B", warm, passes=6, block=2, min_run_s=2.0, left=40.0)
    assert gate(first, "B", warm, passes=6, block=2, min_run_s=2.0, left=80.0)  # EM and one more fit (44 s)
    # a new case that would fit only by pushing out EM is not warmed either
    assert not gate(first, "B", [1.0], passes=6, block=2, min_run_s=2.0, left=36.0)
    # an eager group, whose warm-ups take a second: a third case while its runs fit (6 copies: runs of 2.1, 2.1,
    # 2.4 s and one more of 2.1 take 67 s with their baseline runs), not when only two cases' do
    eager = {"B": 0.35, "aa": 0.35, "em": 0.4}
    assert gate(eager, "B", [0.7, 0.8], passes=6, block=2, min_run_s=2.0, left=90.0)
    assert not gate(eager, "B", [0.7, 0.8], passes=6, block=2, min_run_s=2.0, left=60.0)
    assert gate({}, "B", [], passes=6, block=2, min_run_s=2.0, left=1.0)
    assert gate({"B": 0.4}, "B", [], passes=6, block=2, min_run_s=2.0, left=30.0)


def test_schedule_blocks_and_nearest_baselines():
    base, a, b, c = "B", "a", "b", "c"
    schedule = timed_runs.translation_schedule([base, a, b, c], base, 2, block=2)
    assert schedule == [base, a, b, base, c, base, c, b, base, a, base]
    runs = [{"name": name} for name in schedule]
    assert (translation._nearest(runs, 2, base, -1), translation._nearest(runs, 2, base, 1)) == (0, 3)
    assert translation._nearest(runs, 10, base, 1) is None


def test_sync_warnings_name_their_call_sites():
    """On CUDA the sync warnings (recorded by onmt_ext.runtime.hostsync.cuda_sync_warnings) keep only their messages;
    record_sync_sites adds where each was issued, and its exit undoes it."""
    import warnings

    from onmt_ext.runtime.hostsync import record_sync_sites

    sites = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stock = warnings._showwarnmsg_impl
        with record_sync_sites(sites, skip=meter.OWN_FILES) as hooked:
            assert hooked
            warnings.warn("called a synchronizing CUDA operation")  # the line below is this one's call site
            line = sys._getframe().f_lineno - 1
            warnings.warn("something else")
        assert warnings._showwarnmsg_impl is stock  # its own exit undoes it
        warnings.warn("called a synchronizing CUDA operation after it")
    assert len(caught) == 3 and sites == [f"{__file__}:{line} (test_sync_warnings_name_their_call_sites)"]


def test_a_sync_inside_a_torch_context_manager_names_the_with_statement_and_the_torch_frame(monkeypatch):
    """A read inside a torch context manager's body is reported at the ``with`` line outside torch (not at
    contextlib's ``__enter__``), with the torch frame that made it."""
    import contextlib
    import traceback

    from onmt_ext.runtime import hostsync

    torch_file = "/venv/lib/python3.12/site-packages/torch/nn/attention/__init__.py"
    stack = [traceback.FrameSummary(__file__, 10, "step"),
             traceback.FrameSummary(contextlib.__file__, 137, "__enter__"),
             traceback.FrameSummary(torch_file, 99, "sdpa_kernel"),
             traceback.FrameSummary("/venv/lib/python3.12/site-packages/torch/cuda/__init__.py", 5, "inner"),
             traceback.FrameSummary(hostsync.__file__, 3, "with_site")]
    monkeypatch.setattr(traceback, "extract_stack", lambda: stack)
    assert hostsync.caller() == f"{__file__}:10 (step) via torch/nn/attention/__init__.py:99 (sdpa_kernel)"


def test_fresh_picks_the_fresh_processes_and_refuses_others(capsys):
    def groups(*extra):
        args = cli.parse_args(["--device", "cpu", "--tiny", "--fresh-only", *extra])
        return [group for _, group, _, _ in plan.training_plan(args, cases.TINY_MECHANISMS)]

    assert groups() == [plan.FRESH_EXT, plan.FRESH_STOCK]  # -ext_compile_layers and binarised data on request
    assert groups("--fresh", "bin,ext") == [plan.FRESH_EXT, plan.FRESH_BIN]
    assert groups("--fresh", "layers,stock, ext") == [plan.FRESH_EXT, plan.FRESH_STOCK,
                                                     plan.FRESH_LAYERS]
    assert groups("--fresh", "aa,layers,ext") == [plan.FRESH_EXT, plan.FRESH_AA, plan.FRESH_LAYERS]
    for wrong in ("ext,fast", "ext,a/a"):
        with pytest.raises(SystemExit) as stopped:
            cli.parse_args(["--device", "cpu", "--tiny", "--fresh", wrong])
        assert stopped.value.code == 2
        assert capsys.readouterr().err == (
            "gpu_check.py: error: --fresh: a comma-separated list of ext, stock, bin, aa, layers\n")  # one line
    for alone, line in (("aa", "aa is a ratio"), ("stock,bin,aa", "bin and aa are ratios")):
        with pytest.raises(SystemExit):  # measured for their ratio over ext's rows, which would be missing
            cli.parse_args(["--device", "cpu", "--tiny", "--part", "train-fresh", "--fresh", alone])
        assert capsys.readouterr().err == (
            f"gpu_check.py: error: --fresh {alone}: {line} over the onmt-ext baseline's fresh process; name it too: "
            f"--fresh ext,{alone}\n")


def test_the_fresh_processes_leave_a_reserve_to_the_later_ones():
    assert plan.fresh_deadlines(10.0, 110.0, 3) == pytest.approx([70.0, 90.0, 110.0])
    assert plan.fresh_deadlines(0.0, 50.0, 1) == [50.0]


def test_the_replay_key_leaves_out_model_options_only():
    base = {"batch_size": 8, "transforms": ["filtertoolong"], "save_model": "a/model", "seed": 1}
    mechanism = dict(base, save_model="b/model", encoder_type="ext_transformer", li2019_enc_self="em",
                     ext_compile=True, ext_half_weights=True)
    assert training.replay_key(mechanism) == training.replay_key(base)
    # model_dtype counts as the batch multiple it gives (OpenNMT-py's iterator: 8 in fp16, else 1)
    assert training.replay_key(dict(base, model_dtype="fp16", batch_size_multiple=1)) == training.replay_key(
        dict(base, model_dtype="fp32")) == training.replay_key(base)
    assert training.replay_key(dict(base, model_dtype="fp16")) == training.replay_key(
        dict(base, batch_size_multiple=8)) != training.replay_key(base)
    half = training.half_weights_overrides("fp32", None)  # the dry run's baseline: the row trains in fp16
    assert training.replay_key(dict(base, **half)) == training.replay_key(base) and half["model_dtype"] == "fp16"
    assert training.half_weights_overrides("fp16", None) == {"ext_half_weights": True}  # a GPU run's baseline
    for other in ({"batch_size": 16}, {"transforms": ["clause_split", "filtertoolong"]}, {"seed": 2},
                  {"some_new_option": 1}):  # anything not known to be the model's counts
        assert training.replay_key(dict(base, **other)) != training.replay_key(base), other


def test_the_mechanisms_train_at_the_case_batch_size_targets_first():
    """On a GPU the in-process group trains at the paper's batch (at 8,192 tokens the H200's replayed baseline
    kept the GPU busy 22% of a step: a ratio there measures host time); the dry run keeps its small batch."""
    assert cli.parse_args([]).case_batch_size == 32768
    assert cli.parse_args(["--device", "cpu", "--tiny"]).case_batch_size == 512
    args = cli.parse_args(["--case-batch-size", "16384"])
    (_, _, _, rows), = [entry for entry in plan.training_plan(args, cases.MECHANISMS)
                        if entry[1] == plan.IN_PROCESS]
    assert {row["batch_tokens"] for row, _, _, _ in rows} == {16384}
    eager = [case for row, case, mode, _ in rows if mode == "eager" and case in cases.MECHANISMS]
    targets = [case.train_target is not None for case in eager]
    assert eager and targets == sorted(targets, reverse=True)  # every case with a target before those without


class FakeMeter:
    """Stands in for gpu_check's Meter: measures nothing and changes nothing."""

    def __init__(self, cuda):
        self.job = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def begin(self, job):
        self.job = job

    def end(self, t0_wall):
        return {}

    def write_tables(self, deadline, record):
        pass


def test_a_further_baseline_run_is_judged_by_the_baselines_own_time(tmp_path, monkeypatch):
    """A repeated baseline run starts when its own last time fits, not the longest case's (which starved the
    baseline runs after li2019 EM in a GPU run); any other run still needs the longest run per weight."""
    clock = [0.0]
    costs = {"base": 5.0, "em": 20.0, "base|run 2": 5.0, "cheap": 4.0}

    def train(opt):
        clock[0] += costs[opt]

    monkeypatch.setattr(child, "Meter", FakeMeter)
    monkeypatch.setattr(child, "_parse_train_options", lambda config, stock: config)
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    from onmt.bin import train as train_command
    monkeypatch.setattr(train_command, "train", train)
    jobs = [{"key": key, "config": key, "weight": 1.0, "deadline": 34.0, "tables_s": 0.0, "repeat_of": repeat}
            for key, repeat in (("base", None), ("em", None), ("base|run 2", "base"), ("cheap", None))]
    (tmp_path / "jobs.json").write_text(json.dumps(jobs), encoding="utf-8")
    runs = tmp_path / "runs.jsonl"
    child.child_train_many(tmp_path / "done.json", [tmp_path / "jobs.json", runs, 0.0, "cpu"], [])
    ended = {entry["key"]: entry for entry in map(json.loads, runs.read_text(encoding="utf-8").splitlines())
             if "phase" not in entry}
    assert ended["base|run 2"]["status"] == "measured"  # 9 s left after the EM case, the baseline took 5
    assert ended["cheap"]["status"] == "not run" and "about 20 s needed" in ended["cheap"]["reason"]


def test_a_failed_run_keeps_its_traceback_in_the_log(tmp_path, monkeypatch, capsys):
    """Issue 57: the H200's cao2019 compile failure left only its last line (an AssertionError pointing to
    opcheck's docs) and no traceback anywhere; a failed run now prints its traceback into the process's log
    (stderr), marks its entry, and the next run goes on."""
    def deep_failure():
        raise AssertionError("expected size 3==3, stride 144==324\nSee https://pytorch.org/docs/stable/library.html")

    def train(opt):
        if opt == "broken":
            deep_failure()

    monkeypatch.setattr(child, "Meter", FakeMeter)
    monkeypatch.setattr(child, "_parse_train_options", lambda config, stock: config)
    from onmt.bin import train as train_command
    monkeypatch.setattr(train_command, "train", train)
    jobs = [{"key": key, "config": key, "weight": 1.0, "deadline": 1e12, "tables_s": 0.0, "repeat_of": None}
            for key in ("broken", "fine")]
    (tmp_path / "jobs.json").write_text(json.dumps(jobs), encoding="utf-8")
    runs = tmp_path / "runs.jsonl"
    child.child_train_many(tmp_path / "done.json", [tmp_path / "jobs.json", runs, 0.0, "cpu"], [])
    ended = {entry["key"]: entry for entry in map(json.loads, runs.read_text(encoding="utf-8").splitlines())
             if "phase" not in entry}
    assert ended["broken"]["status"] == "failed" and ended["broken"]["traceback"] is True
    assert ended["broken"]["reason"] == "AssertionError: See https://pytorch.org/docs/stable/library.html"
    assert ended["fine"]["status"] == "measured"
    log = capsys.readouterr().err
    assert "== gpu-check: run 'broken' failed:" in log and "in deep_failure" in log and "stride 144==324" in log


class FakeEngine:
    """Stands in for OpenNMT-py's inference engine: translates nothing, and raises at the ``fails``-th call of the
    engine of a (model, group) that ``fails`` names."""

    def __init__(self, argv, fails):
        self.where = (argv[argv.index("-model") + 1], argv[argv.index("-group") + 1])
        self.opt, self.calls, self.fails = argparse.Namespace(src=None), 0, fails

    def infer_file(self):
        self.calls += 1
        if self.fails.get(self.where) == self.calls:
            deep_translation_failure(*self.where)


def deep_translation_failure(model, group):
    raise RuntimeError(f"CUDA error in {model}\nCompile with TORCH_USE_CUDA_DSA to enable device-side assertions.")


def test_a_failed_translation_is_its_own_row_and_the_other_cases_are_measured(tmp_path, monkeypatch, capsys):
    """Issue 57: an exception in one translation ended section c's process, and every group and case after it was
    reported failed, none named; now the case that raised is a failed row with its reason and the log that holds
    its traceback (at its warm-up, or at a timed run), and the group's other cases are still measured.  Without its
    baseline a group cannot pair a ratio: its rows say so."""
    fails = {("broken", "translate-eager"): 1, ("late", "greedy-eager"): 3, ("base", "translate-compiled"): 1}
    monkeypatch.setattr(child, "_warm_model_building", lambda: None)
    monkeypatch.setattr(common, "inference_engine", lambda argv: FakeEngine(argv, fails))
    monkeypatch.setattr(child.gc, "collect", lambda: 0)  # (the test process: nothing of the child's to collect)
    monkeypatch.setattr(child.gc, "freeze", lambda: None)
    source = tmp_path / "test.src"
    source.write_text("a b\nc d\n", encoding="utf-8")
    names = {"base": ("baseline", False), "aa": ("baseline, again (A/A control)", True), "broken": ("broken", False),
             "late": ("late", False), "fine": ("fine", False)}
    built = []
    for key in ("translate-eager", "greedy-eager", "translate-compiled"):
        jobs = {"key": key, "compiled": False, "baseline": "base", "passes": 3, "block": 2, "share": 1.0,
                "deadline": time.monotonic() + 600, "sentences": 2, "source": str(source),
                "jobs": [{"name": name, "checkpoint": name, "compiled": False,
                          "argv": ["-model", name, "-group", key], "model_argv": ["-model", name]} for name in names]}
        rows = [{"case": case, "mode": "eager", "search": key, "control": control, "label": name, "group": key,
                 "target": None, "paper": None} for name, (case, control) in names.items()]
        built.append((jobs, {"key": key, "search": key, "mode": "eager"}, rows))
    (tmp_path / "jobs.json").write_text(json.dumps([jobs for jobs, _, _ in built]), encoding="utf-8")
    runs = tmp_path / "runs.jsonl"
    child.child_translate_many(tmp_path / "done.json", [tmp_path / "jobs.json", runs, "0", "10"], [])
    entries = common.read_json_lines(runs)
    args = argparse.Namespace(test_sentences=2, device="cpu")
    status = {}
    for jobs, group, rows in built:
        translation.group_result(args, group, rows, jobs, entries, None, tmp_path / translation.TRANSLATE_LOG)
        status[group["key"]] = group["status"], {row["case"]: row["status"] for row in rows}
        by_case = {row["case"]: row for row in rows}
        if group["key"] == "translate-eager":
            broken = by_case["broken"]
            assert broken["reason"] == ("RuntimeError: Compile with TORCH_USE_CUDA_DSA to enable device-side "
                                        "assertions. (at its warm-up; traceback in translate.log)")
            assert broken["log"] == str(tmp_path / "translate.log") and "ratio" not in broken
            assert group["aa"]["runs"] == 3 and by_case["fine"]["aa_note"] == cases.aa_note(group["aa"])
        if group["key"] == "greedy-eager":
            assert by_case["late"]["reason"].endswith("(at its timed run 1; traceback in translate.log)")
    assert status == {"translate-eager": ("ran", {"baseline": "measured", "baseline, again (A/A control)": "measured",
                                                  "broken": "failed", "late": "measured", "fine": "measured"}),
                      "greedy-eager": ("ran", {"baseline": "measured", "baseline, again (A/A control)": "measured",
                                               "broken": "measured", "late": "failed", "fine": "measured"}),
                      "translate-compiled": ("failed", dict.fromkeys(
                          ["baseline", "baseline, again (A/A control)", "broken", "late", "fine"], "failed"))}
    log = capsys.readouterr().err
    assert "== gpu-check: translation of 'broken' in group 'translate-eager' failed:" in log
    assert "in deep_translation_failure" in log and "CUDA error in late" in log and "CUDA error in base" in log


def test_aa_summary_gives_the_median_its_interval_and_the_band():
    """Issue 57: one A/A run (0.911 on the H200) said nothing; three or more give a median and an interval, and a
    median outside 0.97-1.03 is said beside every ratio of its group."""
    inside = cases.aa_summary([1.0, 0.98, 1.02])
    assert inside["median"] == 1.0 and inside["interval"] == [0.98, 1.02] and inside["coverage"] == 0.75
    assert inside["within"] and cases.aa_note(inside) is None and "within 0.97-1.03" in cases.aa_text(inside)
    six = [1.038, 1.061, 1.096, 1.029, 1.074, 0.990]  # the H200's beam-4 A/A of 3fa46b4
    outside = cases.aa_summary(six)
    assert outside["interval"] == list(timed_runs.median_interval(six)) and outside["coverage"] == 0.95
    assert not outside["within"] and cases.aa_note(outside) == "A/A 1.050: outside 0.97-1.03"
    assert "OUTSIDE" in cases.aa_text(outside)
    one = cases.aa_summary([0.911])
    assert one["interval"] == [0.911, 0.911] and one["coverage"] == 0 and "fewer than 3 runs" in cases.aa_text(one)
    assert cases.aa_summary([]) is None and cases.aa_note(None) == "no A/A run measured"


def _decoding_runs(key, base, others, seconds, passes=3, block=2):
    """A decoding group's entries as the translation process writes them: its plan, the timed runs of its
    schedule (each ``seconds[name]`` long), its end."""
    schedule = timed_runs.translation_schedule([base, *others], base, passes, block)
    return [{"group": key, "phase": "plan", "sentences": 100, "estimate_s": 9.0, "chosen": others, "left_s": 30.0,
             "costs": dict.fromkeys([base, *others], 1.0)},
            *[{"group": key, "phase": "timed", "index": index, "name": name, "seconds": seconds[name],
               "wall_s": seconds[name] + 0.01} for index, name in enumerate(schedule)],
            {"group": key, "phase": "end", "seconds": 10.0, "ended": 10.0}]


def test_the_markdown_report_flags_every_ratio_of_a_group_whose_aa_is_outside_its_band():
    """Issue 57: where a group's A/A median lies outside 0.97-1.03 the report says so beside every ratio of that
    group (tables and targets), and beside none of a group whose A/A lies within.  Hand-made measurements go
    through the code that makes the report: section b's in-process rows (A/A 0.90) through training_ratios,
    section c's beam-4 group (A/A 1.06) and greedy group (A/A 1.00) through group_result, then markdown."""
    args = cli.parse_args(["--part", "train-cases", "--device", "cpu", "--tiny"])
    (_, _, _, entries), = plan.training_plan(args, list(cases.MECHANISMS[:2]))
    rows = [row for row, *_ in entries]
    for ended, row in enumerate(rows):  # the baseline's runs 100 tok/s, the A/A's 90, the mechanisms' 80
        speed = 100.0 if row["case"] == cases.BASELINE.label else 90.0 if row["control"] else 80.0
        row.update(status="measured", tokens_per_s=speed, ended=float(ended), peak_memory_mb=100.0)
    b = {"status": "ran", "rows": rows, "batch_tokens": [512, 2048], "case_batch_tokens": 512,
         **training.training_ratios(rows, cuda=False)}
    assert b["aa"]["median"] == pytest.approx(0.9) and not b["aa"]["within"]
    c = {"status": "ran", "groups": [], "rows": []}
    base, aa, case = "baseline (eager)", "baseline, again (A/A control) (eager)", "li2019 EM (eager)"
    for key, search, aa_seconds in (("translate-eager", "beam 4", 1 / 1.06), ("greedy-eager", "greedy", 1.0)):
        group = {"key": key, "search": search, "mode": "eager", "command": "onmt_translate ..."}
        group_rows = [{"case": label.removesuffix(" (eager)"), "mode": "eager", "search": search, "group": key,
                       "control": label == aa, "label": label, "paper": None,
                       "target": 0.97 if label == case and search == "beam 4" else None} for label in (base, aa, case)]
        jobs = {"key": key, "compiled": False, "baseline": base}
        translation.group_result(argparse.Namespace(test_sentences=100, device="cpu"), group, group_rows, jobs,
                                 [{"phase": "meta", "backend": "eager"},
                                  *_decoding_runs(key, base, [aa, case], {base: 1.0, aa: aa_seconds, case: 1.25})],
                                 None, Path("translate.log"))
        c["groups"].append(group)
        c["rows"] += group_rows
    sections = {"b": b, "c": c}
    text = report.markdown({
        "device": {"name": "cpu", "torch": torch.__version__, "cuda": None, "python": "3"}, "date": "2026-11-30",
        "command": "python -m tools.gpu_check", "mode": "cpu-tiny", "seconds": 1.0, "compile_backend": "eager",
        "commit": "test", "settings": {"sections": "bc"}, "parts": [], "sections": sections,
        "targets": report.targets_table(sections, False, [512, 2048])})
    table = [line for line in text.splitlines() if line.startswith("| ")]
    training_note, beam_note = "(A/A 0.900: outside 0.97-1.03)", "(A/A 1.060: outside 0.97-1.03)"
    flagged = [line for line in table if plan.IN_PROCESS in line and line.startswith(
        ("| li2019", f"| {cases.HALF_WEIGHTS.label} |"))]
    assert len(flagged) == 5 and all(training_note in line for line in flagged)  # 2 eager, 2 compiled, half weights
    targets = [line for line in table if line.startswith("| training ratio, li2019")]
    assert len(targets) == 2 and all(training_note in line for line in targets)
    beam = [line for line in table if line.startswith("| li2019 EM | eager | beam 4 |")]
    greedy = [line for line in table if line.startswith("| li2019 EM | eager | greedy |")]
    assert len(beam) == len(greedy) == 1 and beam_note in beam[0] and "A/A" not in greedy[0]
    assert "0.800" in greedy[0]  # (its ratio is there, without a flag)
    decoding_target, = [line for line in table if line.startswith("| decoding ratio (beam 4), li2019 EM")]
    assert beam_note in decoding_target
    controls = [line for line in table if "A/A control" in line.split("|")[1] or line.startswith("| baseline |")]
    assert controls and not any("outside" in line for line in controls)  # (the controls' own rows: no flag)
    assert text.count("outside 0.97-1.03") == len(flagged) + len(targets) + 2


def _users_path_report(fresh, aa_ratios, aa_status="measured"):
    """Section b of ``--part train --fresh <fresh>`` (the dry run's batches, 512 and 2048 tokens) with hand-made
    speeds (stock 100 tok/s, ext 200, bin 190, layers 220; the A/A control ext's times ``aa_ratios[batch]``; in one
    process an A/A within its band) through training_ratios, targets_table and markdown: ``(b, cells of each table
    row, Markdown)``."""
    args = cli.parse_args(["--part", "train", "--fresh", fresh, "--device", "cpu", "--tiny"])
    rows = [row for *_, entries in plan.training_plan(args, list(cases.MECHANISMS[:2])) for row, *_ in entries]
    speeds = {plan.FRESH_STOCK: 100.0, plan.FRESH_EXT: 200.0, plan.FRESH_BIN: 190.0, plan.FRESH_LAYERS: 220.0}
    for ended, row in enumerate(rows):
        if row["group"] == plan.FRESH_AA:
            row.update(status=aa_status, tokens_per_s=200.0 * aa_ratios[row["batch_tokens"]])
        else:
            row.update(status="measured", tokens_per_s=speeds.get(row["group"], 80.0 if row["reference"] and not
                                                                  row["control"] else 100.0))
        row.update(ended=float(ended), peak_memory_mb=100.0)
    b = {"status": "ran", "rows": rows, "batch_tokens": [512, 2048], "case_batch_tokens": 512,
         **training.training_ratios(rows, cuda=False)}
    assert b["aa"]["within"]  # (the in-process group's: flags nothing)
    text = report.markdown({
        "device": {"name": "cpu", "torch": torch.__version__, "cuda": None, "python": "3"}, "date": "2026-11-30",
        "command": "python -m tools.gpu_check", "mode": "cpu-tiny", "seconds": 1.0, "compile_backend": "eager",
        "commit": "test", "settings": {"sections": "b"}, "parts": [], "sections": {"b": b},
        "targets": report.targets_table({"b": b}, False, [512, 2048])})
    cells = [[cell.strip() for cell in line.split("|")[1:-1]] for line in text.splitlines() if line.startswith("| ")]
    return b, cells, text


def test_a_users_path_aa_outside_its_band_flags_the_users_path_ratios_of_its_batch_and_only_those():
    """Issue 57: the users'-path A/A control (``--fresh ...,aa``) is the fresh rows' own: where its ratio at a batch
    lies outside 0.97-1.03, every users'-path ratio at that batch says so (table and targets), and no other ratio;
    within the band nothing is flagged; a run without it says so in one line."""
    note = "A/A 1.100: outside 0.97-1.03"
    b, cells, text = _users_path_report("ext,stock,bin,aa,layers", {512: 1.0, 2048: 1.1})
    assert b["fresh_aa"] == [{"batch_tokens": 512, "aa": cases.aa_summary([1.0])},
                             {"batch_tokens": 2048, "aa": cases.aa_summary([1.1])}]
    assert ("Users' path, A/A control (the onmt-ext baseline again in a fresh process of its own, after the others "
            "but the compiled layers, over ext's; band 0.97-1.03): 512 tokens 1.000, within; 2048 tokens 1.100, "
            "OUTSIDE") in text
    table = [row for row in cells if len(row) == 19]
    flagged = [(row[2], row[4]) for row in table if note in row[7]]
    assert sorted(flagged) == sorted((group, "2048") for group in (plan.FRESH_EXT, plan.FRESH_BIN, plan.FRESH_LAYERS))
    targets = [row[0] for row in cells if len(row) == 4 and note in row[2]]
    assert len(targets) == 2 and all("2048-token batches" in measure and "over stock" in measure for measure in targets)
    assert text.count("outside 0.97-1.03") == len(flagged) + len(targets)  # (the A/A's own row and 512's: none)
    assert {row.get("aa_note") for row in b["rows"] if row["group"] == plan.IN_PROCESS} == {None}

    b, _, text = _users_path_report("ext,stock,bin,aa,layers", {512: 1.02, 2048: 0.98})
    assert "512 tokens 1.020, within; 2048 tokens 0.980, within" in text
    assert "outside" not in text.lower().replace("where outside or not measured", "")
    assert all(row.get("aa_note") is None for row in b["rows"])

    b, _, text = _users_path_report("ext,stock,aa", {512: 1.0, 2048: 1.0}, aa_status="not run")
    assert "512 tokens no run measured; 2048 tokens no run measured" in text
    assert {row["aa_note"] for row in b["rows"] if row["group"] == plan.FRESH_EXT} == {"no A/A run measured"}

    b, _, text = _users_path_report("ext,stock", {})
    assert b["fresh_aa"] is None and "A/A" not in "".join(row.get("aa_note") or "" for row in b["rows"])
    assert "\nUsers' path: no A/A control in this run (`--fresh ...,aa` adds one)" in text


def test_the_report_names_each_users_path_rows_process_and_the_stage_its_warm_ups_ran_in():
    """``--part train-fresh --fresh ext,bin`` and ``ext,aa``: each users'-path row over time is named by its process
    (bin's rows have ext's case name); the part line names ``--fresh``; the preparation, the machine warm-up and
    the compiled-ahead processes ran in section a only where it ran, else in the part's ``b warm-up`` stage, else
    (``--part all`` without a) before section b's runs."""
    def markdown(fresh, sections="b", parts=("b warm-up", "b fresh")):
        args = cli.parse_args(["--part", "train-fresh", "--fresh", fresh, "--device", "cpu", "--tiny"])
        rows = [row for *_, entries in plan.training_plan(args, []) for row, *_ in entries]
        for ended, row in enumerate(rows):
            row.update(status="measured", tokens_per_s=100.0, ended=float(ended), peak_memory_mb=1.0,
                       measure_steps=[5, 8], interval_points=[[6, 100.0], [8, 110.0]])
        b = {"status": "ran", "rows": rows, "batch_tokens": [512, 2048], "case_batch_tokens": 512, "prepare_s": 3.0,
             "warm_up": {"status": "measured", "batch_tokens": 512, "first_step_s": 1.0, "startup_s": 2.0},
             "compile_warm_up": [{"case": "GRET", "status": "warmed up"}], "compile_warm_up_processes": 1,
             **training.training_ratios(rows, cuda=False)}
        a = {"status": "passed", "seconds": 1.0, "budget_s": 85.0, "runs": []}
        return report.markdown({
            "device": {"name": "cpu", "torch": torch.__version__, "cuda": None, "python": "3"}, "date": "2026-11-30",
            "command": "python -m tools.gpu_check", "mode": "cpu-tiny", "seconds": 1.0, "compile_backend": "eager",
            "commit": "test", "part": "train-fresh", "fresh": plan.named_fresh(args),
            "settings": {"sections": sections, "compile_warmup_steps": 3},
            "parts": [{"part": part, "budget_s": 1.0, "seconds": 1.0, "status": "ran"} for part in parts],
            "sections": {"b": b, **({"a": a} if "a" in sections else {})}, "targets": []})

    for fresh, other in (("ext,bin", plan.FRESH_BIN), ("ext,aa", plan.FRESH_AA)):
        text = markdown(fresh)
        over_time = [line for line in text.splitlines() if line.startswith("- ") and "steps 5-6: 100" in line]
        assert len(over_time) == len(set(over_time)) == 4, over_time
        assert [line.split(" tokens:")[0].rpartition(", ")[2] for line in over_time] == ["512", "2048"] * 2
        assert all(f"({plan.FRESH_EXT}), " in line for line in over_time[:2])
        assert all(f"({other}), " in line for line in over_time[2:])
        assert f"\n- part: train-fresh --fresh {fresh} (sections b; " in text
        assert "section a" not in text
        assert "; data and configs prepared in 3 s, during the b warm-up stage)" in text
        assert "untimed, before them (during the b warm-up stage), so that" in text
        assert "Compiled ahead (1 untimed processes, during the b warm-up stage, the measured rows' " in text
    assert "\n- part: train-fresh (sections b; " in markdown("ext,stock")
    text = markdown("ext,stock", sections="ab", parts=("a", "b fresh"))
    assert text.count("during section a") == 3 and "b warm-up stage" not in text
    text = markdown("ext,stock", parts=("b fresh",))  # (--part all --sections b: no stage of their own)
    assert text.count("before section b's measured runs") == 3 and "section a" not in text


def test_the_compiled_rows_compiled_ahead_say_which_stage_they_share(tmp_path, monkeypatch, capsys):
    """The line that starts the compile warm-ups names section a only where it runs."""
    monkeypatch.setattr(training, "run_training_process", lambda *args: None)
    for argv, when in ((["--part", "train-cases"], "during the b warm-up stage"), ([], "during section a"),
                       (["--sections", "bc"], "before section b's measured runs")):
        args = cli.parse_args([*argv, "--device", "cpu", "--tiny", "--compile-warmups", "1"])
        entries = plan.training_plan(args, list(cases.TINY_MECHANISMS[:1]))
        configs = {row["key"]: (tmp_path / "c.yaml", tmp_path / "m.pt", {}) for *_, rows in entries for row, *_ in rows}
        threads, _ = training.start_compile_warm_up(args, tmp_path, entries, configs, plan.monotonic_now() + 60)
        for thread in threads:
            thread.join()
        assert capsys.readouterr().out == (
            f"== gpu-check b: compiling 1 compiled rows ahead in 1 process(es), untimed, {when}\n")


def test_spread_places_the_aa_runs_across_the_group():
    assert plan.spread(list("abcd"), list("XYZ")) == list("XabYcdZ")
    assert plan.spread(list("abcdef"), list("XY")) == list("XabcdefY")
    assert plan.spread(list("ab"), ["X"]) == list("Xab") and plan.spread(list("ab"), []) == list("ab")
    assert plan.spread(list("abcdefgh"), list("WXYZ")) == list("WabcXdeYfghZ")


def test_the_in_process_plan_spreads_three_aa_runs_and_only_their_first_saves():
    args = cli.parse_args(["--part", "train-cases"])
    (name, group, _, entries), = plan.training_plan(args, cases.MECHANISMS)
    rows = [row for row, *_ in entries]
    controls = [number for number, row in enumerate(rows) if row["control"]]
    assert (name, group) == ("b in-process", plan.IN_PROCESS) and len(controls) == 3
    compiled = [number for number, row in enumerate(rows) if row["mode"] == "compiled"]
    # right after the baseline's first run, amid the eager cases, and last of the eager part (before its last
    # baseline run): none in the compiled part, which a short budget cuts first
    assert controls[0] == 1 and controls[0] + 4 < controls[1] < controls[2] - 4 and controls[2] == compiled[0] - 2
    assert rows[controls[2] + 1].get("repeat_of") and rows[controls[2] + 1]["part"] == "eager"
    assert len({row["key"] for row in rows}) == len(rows)
    assert [rows[number].get("part", "eager") for number in controls] == ["eager"] * 3
    assert all(rows[number]["reference"] == rows[0]["key"] for number in controls)
    assert len(plan.training_plan(cli.parse_args(["--part", "train-cases", "--aa-runs", "5"]),
                                       cases.MECHANISMS)[0][3]) > len(entries)


def test_the_in_process_group_trains_the_baseline_with_half_weights():
    """The baseline with -ext_half_weights (issue 59, item 4): an eager row of the in-process group in every part
    that runs the group, after the cases with a target, its ratio over the baseline's runs, no target, costed as a
    baseline run by the plan."""
    for part in ("all", "train", "train-cases"):
        for extra in ([], ["--device", "cpu", "--tiny"]):
            args = cli.parse_args(["--part", part, *extra])
            (_, _, _, entries), = [entry for entry in plan.training_plan(args, cases.MECHANISMS)
                                   if entry[1] == plan.IN_PROCESS]
            half = [number for number, (_, case, _, _) in enumerate(entries) if case == cases.HALF_WEIGHTS]
            assert len(half) == 1, (part, extra)
            row, _, mode, options = entries[half[0]]
            assert (mode, row["mode"], row.get("part", "eager"), row["target"], options) == (
                "eager", "eager", "eager", None, {"replay": True})
            assert row["reference"] == entries[0][0]["key"] and entries[0][1] == cases.BASELINE
            targeted = [number for number, (_, case, mode, _) in enumerate(entries)
                        if mode == "eager" and case.train_target is not None]
            assert max(targeted) < half[0], part
            label = f"{cases.HALF_WEIGHTS.label}, eager, {args.case_batch_size}"
            costs = plan.COSTS["cpu" if extra else "cuda"]
            stages = {name: rows for name, _, _, rows in plan.part_stages(args, cases.MECHANISMS, costs)}
            assert (label, costs["baseline"]) in stages["b eager"], (part, extra)
    args = cli.parse_args(["--part", "train-fresh"])
    assert all(case != cases.HALF_WEIGHTS for *_, entries in plan.training_plan(args, cases.MECHANISMS)
               for _, case, _, _ in entries)


def test_the_report_says_what_the_half_weights_row_is_and_what_the_dry_run_could_not_check():
    base = {"key": "b", "case": "baseline", "group": plan.IN_PROCESS, "options": {"model_dtype": "fp16"}}
    half = {"key": "h", "case": cases.HALF_WEIGHTS.label, "group": plan.IN_PROCESS, "reference": "b",
            "status": "measured", "ratio": 1.0412, "options": {"model_dtype": "fp16", "ext_half_weights": True}}
    text = report.half_weights_text([base, half], "cuda")
    assert text.startswith("Baseline, half weights: the baseline with -ext_half_weights (issue 59, item 4), "
                           "measured (ratio 1.041): ") and "report-only" in text and "fp32" not in text
    base["options"]["model_dtype"] = "fp32"
    text = report.half_weights_text([base, half], "cpu-tiny")
    assert "The baseline trains in fp32 here" in text and "never used" in text and "need a GPU run" in text
    assert "not the option's" in report.half_weights_text([base, half], "cuda")
    assert report.half_weights_text([base], "cuda") is None


def test_the_plans_estimate_walks_the_stages_like_the_schedule():
    stages = [("a", 10.0, False, [("p", 8.0)]),
              ("eager", 10.0, False, [(None, 3.0), ("x", 4.0), ("big", 5.0), ("y", 2.0)]),
              ("compiled", 0.0, True, [("z", 2.0), ("w", 9.0)])]
    # eager: 8 + 3 + 4 = 15; "big" would end at 20 > 18 (its deadline) and is left out, "y" still fits (17);
    # compiled ends when every budget so far is spent (20): "z" fits (19), "w" does not
    assert plan.left_out(stages) == (["big", "w"], 19.0)
    assert plan.left_out([("s", 1.0, False, [(None, 5.0)])]) == ([], 5.0)  # fixed costs always run


def test_shares_and_papers():
    assert plan.proportional_shares([10.0, 30.0, 60.0]) == pytest.approx([0.1, 1 / 3, 1.0])
    papers = [["em", "ea", "simple", "all"], ["cao"], ["rpe", "mpr"], ["clause"], ["gret"]]
    assert plan.share_papers(papers, 2) == [["em", "ea", "simple", "all", "cao"],
                                                 ["rpe", "mpr", "clause", "gret"]]
    assert plan.share_papers(papers, 1) == [sum(papers, [])]
    assert sum(plan.share_papers(papers, 5), []) == sum(papers, [])


def test_parts_choose_sections_budgets_and_report_names(capsys):
    info = {"name": "NVIDIA H200"}
    for part, sections in (("props", "a"), ("train", "b"), ("train-fresh", "b"), ("train-cases", "b"),
                           ("decode", "c"), ("decode-greedy-compiled", "c"), ("all", "abc")):
        args = cli.parse_args(["--part", part])
        assert args.sections == sections and args.part == part
        assert report.report_name(info, args) == "NVIDIA_H200" + ("" if part == "all" else f"-{part}")
    assert cli.parse_args(["--part", "train-fresh"]).fresh_only
    assert cli.parse_args(["--part", "train-cases"]).fresh == []
    assert cli.parse_args(["--part", "decode-beam-compiled"]).groups == ["translate-compiled"]
    assert cli.parse_args(["--part", "train"]).budget_b == 240 and cli.parse_args([]).budget_b == 275
    assert cli.parse_args(["--part", "train", "--budget-b", "100"]).budget_b == 100
    assert cli.parse_args(["--part", "decode", "--device", "cpu", "--tiny"]).budget_c == 90
    args = cli.parse_args(["--part", "decode-beam-eager", "--cases", "gret,li2019", "--device", "cpu", "--tiny"])
    assert args.cases == ["gret", "li2019"]
    assert report.report_name(info, args) == "cpu-tiny-decode-beam-eager-gret_li2019"
    # a part's calls with other fresh processes than the default's write reports (and tables) of their own
    named = {fresh: report.report_name(info, cli.parse_args(["--part", "train-fresh", "--fresh", fresh]))
             for fresh in ("ext,stock", "stock,ext", "ext,aa", "aa,ext", "ext,bin")}
    assert named == {"ext,stock": "NVIDIA_H200-train-fresh", "stock,ext": "NVIDIA_H200-train-fresh",
                     "ext,aa": "NVIDIA_H200-train-fresh-ext-aa", "aa,ext": "NVIDIA_H200-train-fresh-ext-aa",
                     "ext,bin": "NVIDIA_H200-train-fresh-ext-bin"}
    for argv, name in ((["--part", "train", "--fresh", "bin,ext,stock", "--cases", "gret"], "train-ext-stock-bin-gret"),
                       (["--part", "train-cases", "--fresh", "ext,aa"], "train-cases"),  # (no fresh process)
                       (["--part", "all", "--fresh", "ext,aa"], "")):  # (--part all keeps the GPU's name)
        assert report.report_name(info, cli.parse_args(argv)) == "NVIDIA_H200" + (name and f"-{name}")
    for wrong in (["--part", "train", "--sections", "b"], ["--cases", "li2019,vaswani"], ["--part", "bench"]):
        with pytest.raises(SystemExit):
            cli.parse_args(wrong)
    assert "--cases: a comma-separated list of li2019, cao2019, chen2019, clause, gret" in capsys.readouterr().err


def _rows_of(part, papers, *extra):
    args = cli.parse_args(["--part", part, *extra])
    everything = cases.MECHANISMS
    chosen = [case for case in everything if plan.paper_of(case) in (papers or args.cases)]
    args.cases = list(dict.fromkeys(map(plan.paper_of, chosen)))
    stages = plan.part_stages(args, chosen, plan.COSTS["cuda"])
    return args, chosen, {label for *_, rows in stages for label, _ in rows if label}


def test_a_part_that_does_not_fit_says_which_rows_and_offers_parts_that_measure_them_all():
    """By the plan's estimate on a GPU (the H200 run of 3fa46b4): props and the two halves of train fit 240 s; the
    whole check, train and decode do not, and say so with a split whose parts each fit and together measure every
    row of the part (no row dropped silently)."""
    for part in ("props", "train-fresh", "train-cases"):
        args, chosen, _ = _rows_of(part, None)
        assert "every row fits" in plan.plan_line(args, chosen, cases.MECHANISMS), part
    for part in ("all", "train", "decode", "decode-beam-compiled"):
        args, chosen, rows = _rows_of(part, None)
        line = plan.plan_line(args, chosen, cases.MECHANISMS)
        out, _ = plan.left_out(plan.part_stages(args, chosen, plan.COSTS["cuda"]))
        assert out and f"{len(out)} row(s) will not fit: {'; '.join(out)}. To measure every row, run instead: " in line
        offered = plan.split_parts(args, chosen, plan.COSTS["cuda"])
        assert line.endswith(" and ".join(plan.part_command(p, c, cases.MECHANISMS, f) for p, c, f in offered))
        covered = set()
        for sub, sub_cases, _ in offered:
            sub_args, sub_chosen, sub_rows = _rows_of(sub, [plan.paper_of(case) for case in sub_cases])
            assert not plan.left_out(plan.part_stages(sub_args, sub_chosen, plan.COSTS["cuda"]))[0]
            covered |= sub_rows
        assert rows <= covered | {label for label in rows if "(run " in label}, sorted(rows - covered)
    assert [part for part, _, _ in plan.split_parts(*_rows_of("train", None)[:2], plan.COSTS["cuda"])] == [
        "train-fresh", "train-cases"]


def test_a_fresh_part_that_does_not_fit_is_split_by_process_with_each_ratios_reference():
    """``--part train-fresh``'s rows do not depend on ``--cases``: a split names ``--fresh`` processes, each call
    with the process its ratios are over (ext and layers over stock, bin over ext), as many as fit the budget; the
    compiled layers' process does not fit even beside stock alone, and is offered so."""
    args = cli.parse_args(["--part", "train-fresh", "--fresh", "ext,stock,bin,layers"])
    line = plan.plan_line(args, list(cases.MECHANISMS), cases.MECHANISMS)
    chunks = plan.fresh_chunks(args, list(cases.MECHANISMS), plan.COSTS["cuda"])
    assert chunks == [["ext", "stock"], ["ext", "bin"], ["stock", "layers"]]
    assert line.endswith("run instead: --part train-fresh --fresh ext,stock and --part train-fresh --fresh ext,bin "
                         "and --part train-fresh --fresh stock,layers")
    for chunk in chunks[:2]:
        args.fresh = chunk
        assert "every row fits" in plan.plan_line(args, list(cases.MECHANISMS), cases.MECHANISMS), chunk


def test_the_users_path_runs_skip_their_first_steps():
    """Issue 57: 30 measured steps gave onmt-ext over stock 2.69x at 32k where 400-step runs gave 1.9x: the users'
    path now skips --fresh-warmup-steps (50) and measures --steps (200); the in-process group keeps its own."""
    args = cli.parse_args([])
    assert plan.run_steps(args, plan.FRESH_STOCK) == (200, 50)
    assert plan.step_plan(args, *plan.run_steps(args, plan.FRESH_EXT))["measure"] == [51, 250]
    assert plan.run_steps(args, plan.IN_PROCESS) == (15, 5)
    assert plan.run_steps(args, plan.WARM_UP) == plan.run_steps(args, plan.CHECKPOINTS) == (5, 5)
    row = {"interval_points": [[55 + 5 * n, 1000.0 * n] for n in range(40)], "measure_steps": [51, 250]}
    text = report._over_time_text(row)
    assert text.startswith("steps 51-75: 2000; steps 76-100: 7000;") and text.endswith("steps 226-250: 37000")


def test_a_decode_part_trains_its_checkpoints_without_measuring_them(tmp_path, monkeypatch, capsys):
    """--part decode...: section b does not run, so one process trains the baseline's, the A/A control's and each
    case's checkpoint (status "trained", saved, nothing profiled or counted), and says so as section c's."""
    args = cli.parse_args(["--part", "decode-greedy-eager", "--cases", "gret", "--device", "cpu", "--tiny"])
    (name, group, _, entries), = plan.checkpoint_plan(args, [cases.MECHANISMS[-1]])
    assert (name, group) == ("c checkpoints", plan.CHECKPOINTS)
    assert [case.label for _, case, _, _ in entries] == ["baseline", "baseline, again (A/A control)", "GRET"]
    seen = {}
    monkeypatch.setattr(common, "run_child", lambda *a, head, **k: seen.update(
        jobs=json.loads(Path(head[0]).read_text(encoding="utf-8"))))
    args.profiles = tmp_path / "profiles"
    configs = {row["key"]: (tmp_path / "c.yaml", tmp_path / "m.pt", {}) for row, *_ in entries}
    training.run_training_process(args, tmp_path, group, {}, entries, configs, {"eager": plan.monotonic_now() + 60})
    assert [(job["checkpoint"], job["save"], job["profile"][1], job["profile_file"]) for job in seen["jobs"]] == [
        (True, True, 0, None)] * 3
    assert all(job["counted"][0] > job["counted"][1] for job in seen["jobs"])  # no step counted
    assert "\n== gpu-check c: section c's checkpoints, one process: 3 runs (" in "\n" + capsys.readouterr().out


def test_make_gpu_check_passes_part_through():
    done = subprocess.run(["make", "-n", "--no-print-directory", "gpu-check", "PART=train-fresh",
                           f"SETUP_STAMP={REPO / 'pyproject.toml'}"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert "-m tools.gpu_check --part train-fresh" in done.stdout, done.stdout + done.stderr


@pytest.mark.slow
def test_a_decode_part_measures_every_row_of_its_group(tmp_path):
    """--part decode-greedy-eager --cases gret, the dry run: its checkpoints trained first, then its one group,
    every row measured, in a report of its own name."""
    support.ensure_sample_data()
    done = subprocess.run([*COMMAND, "--device", "cpu", "--tiny", "--part", "decode-greedy-eager",
                           "--cases", "gret", "--budget-c", "200", "--out", str(tmp_path),
                           "--work", str(tmp_path / "w"), "--commit", "test-commit"],
                          cwd=REPO, capture_output=True, text=True, timeout=400,
                          env=support.cli_env(OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "== gpu-check --part decode-greedy-eager --cases gret: by the plan's estimate every row fits" in done.stdout
    report = json.loads((tmp_path / "cpu-tiny-decode-greedy-eager-gret.json").read_text(encoding="utf-8"))
    assert report["part"] == "decode-greedy-eager" and set(report["sections"]) == {"c"}
    assert [part["part"] for part in report["parts"]] == ["c checkpoints", "c eager"]
    c = report["sections"]["c"]
    assert c["checkpoints"]["trained"] == c["checkpoints"]["of"] == 3 and not c["checkpoints"]["failed"]
    assert [group["key"] for group in c["groups"]] == ["greedy-eager"] and c["groups"][0]["aa"]["runs"] == 3
    assert [(row["case"], row["status"]) for row in c["rows"]] == [
        ("baseline", "measured"), ("baseline, again (A/A control)", "measured"), ("GRET", "measured")]


def test_each_case_knows_whether_its_default_path_compiles(sample_data, onmt_active):
    """The targets read the compiled rows of the cases whose cores ``-ext_compile auto`` compiles on CUDA
    (``Case.compiles_by_default``): that must be what the model built from the case's config (its smoke twin)
    does, else a target would be judged on the wrong path."""
    from onmt_ext.runtime import compile as ext_compile

    for case in cases.MECHANISMS:
        opt = support.load_train_opts(f"yaml_configs/smoke/{case.config}")
        model = support.build_model(opt, support.load_vocabs(opt))
        assert ext_compile.compiles_by_default(model) == case.compiles_by_default, case.label


def _private_names_used_across_modules(package):
    """``(module, name, used in)`` of every ``_``-prefixed top-level name of a module of ``package`` (a folder) that
    another of its modules imports or reads as an attribute of the imported module."""
    import ast

    modules = {path.stem: ast.parse(path.read_text(encoding="utf-8")) for path in sorted(package.glob("*.py"))}
    found = set()
    for user, tree in modules.items():
        aliases = {}  # name bound in ``user`` -> module of the package
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tools.gpu_check"):
                owner = node.module.rpartition(".")[2]
                for alias in node.names:
                    if alias.name in modules:
                        aliases[alias.asname or alias.name] = alias.name
                    elif owner in modules and alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.add((owner, alias.name, user))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases \
                    and node.attr.startswith("_") and not node.attr.startswith("__") and aliases[node.value.id] != user:
                found.add((aliases[node.value.id], node.attr, user))
    return sorted(found)


def test_the_modules_use_only_each_others_public_names(tmp_path):
    """A name one module of tools/gpu_check/ uses from another has no ``_``: ``_`` marks a module's own helpers."""
    found = _private_names_used_across_modules(REPO / "tools" / "gpu_check")
    assert not found, "make these public (no leading _): " + ", ".join(f"{a}.{n} (in {u})" for a, n, u in found)
    (tmp_path / "plan.py").write_text("def _now():\n    return 0\n")  # the scan finds both ways of using one
    (tmp_path / "cli.py").write_text("from tools.gpu_check.plan import _now\n")
    (tmp_path / "report.py").write_text("from tools.gpu_check import plan\nplan._now()\n")
    assert _private_names_used_across_modules(tmp_path) == [("plan", "_now", "cli"), ("plan", "_now", "report")]
