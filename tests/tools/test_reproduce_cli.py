"""`make reproduce-<table>` stops before preparing any data when the machine lacks the CUDA devices asked for, or
when a WMT17 Zh-En table's WMT17_EXTRA_DIR lacks its files; DRY_RUN=1 says the same as warnings; the toy
sample table runs on the CPU by default.  Each runs in a scratch copy of what make reads (Makefile, tools/,
yaml_configs/), so that a check that failed to stop could not start preparing data in the repository."""

import shutil
import subprocess

import pytest

import support

#: Eight GPUs (which divide the configs' accum_count 8), the last of which no machine has: CUDA stops counting
#: visible devices at an id that does not exist, so the check stops with or without CUDA.
MANY_GPUS = "0,1,2,3,4,5,6,999"


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkout")
    for path in support.REPO.iterdir():
        if path.is_file():
            shutil.copy2(path, root / path.name)
    for name in ("tools", "yaml_configs"):
        shutil.copytree(support.REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    (root / ".setup-done").touch()
    return root


def _make(root, *args, extra_dir=None, **environment):
    env = support.cli_env(**environment)
    env.pop("WMT17_SMALL_DATA", None)
    env.pop("WMT17_EXTRA_DIR", None)
    if extra_dir:
        env["WMT17_EXTRA_DIR"] = str(extra_dir)
    return subprocess.run(["make", "--no-print-directory", f"VENV={support.REPO / '.venv'}",
                           f"SETUP_STAMP={root / '.setup-done'}", *args], cwd=root, capture_output=True, text=True,
                          timeout=300, env=env)


def test_missing_gpus_and_an_empty_wmt17_extra_dir_stop_the_table_before_its_data(checkout, tmp_path):
    result = _make(checkout, "reproduce-cao2019-table1", f"GPUS={MANY_GPUS}", extra_dir=tmp_path)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    gpus, corpus = [line for line in result.stderr.splitlines() if line.startswith("reproduce.py:")]
    assert gpus.startswith(f"reproduce.py: GPUS={MANY_GPUS} asks for ")
    assert "sees no CUDA device" in gpus or "sees only" in gpus
    assert f"WMT17_EXTRA_DIR={tmp_path} lacks train.zh, train.en" in corpus
    assert not (checkout / "build").exists()


def test_gpus_that_cannot_keep_the_papers_batch_stop_before_the_data(checkout):
    result = _make(checkout, "reproduce-li2019-table2", "GPUS=0,1,2")  # 3 does not divide accum_count 8
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "(3 GPUs) does not divide accum_count 8" in result.stderr and not (checkout / "build").exists()


def test_a_dry_run_warns_the_same_and_prints_the_commands(checkout, tmp_path):
    result = _make(checkout, "reproduce-li2019-table4-wmt17_zhen", f"GPUS={MANY_GPUS}", "DRY_RUN=1",
                   extra_dir=tmp_path)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("reproduce.py: warning: ")]
    assert len(warnings) == 2 and f"GPUS={MANY_GPUS} asks for" in warnings[0] and "WMT17_EXTRA_DIR" in warnings[1]
    assert "-m tools.prepare_data fetch wmt17_zhen" in result.stdout and " onmt_train " in result.stdout
    assert not (checkout / "build").exists()


def test_the_sample_table_runs_on_the_cpu_unless_gpus_are_given(checkout):
    result = _make(checkout, "reproduce-sample-li2019", "DRY_RUN=1")
    assert result.returncode == 0 and "warning" not in result.stderr, result.stderr
    trainings = [line for line in result.stdout.splitlines() if " onmt_train " in line]
    assert len(trainings) == 2 and all(line.startswith("CUDA_VISIBLE_DEVICES= ") for line in trainings)
    assert "-gpu_ranks" not in result.stdout
    assert all(line.endswith(" -ext_binarized_cache build/binarized") for line in trainings)
    text = _make(checkout, "reproduce-sample-li2019", "DRY_RUN=1", "BINARIZED=0")  # from the text
    assert text.returncode == 0 and "-ext_binarized" not in text.stdout and " onmt_train " in text.stdout


def test_a_papers_target_checks_every_table_before_the_first_one_prepares_data(checkout, tmp_path):
    """reproduce-li2019's last table (WMT17 Zh-En) cannot run with an empty WMT17_EXTRA_DIR: the target stops at
    once, not after its first three tables have prepared their data and trained."""
    result = _make(checkout, "reproduce-li2019", "GPUS=cpu", extra_dir=tmp_path)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines()  # (GPUS=cpu's warnings aside: tables on the CPU)
             if line.startswith("reproduce.py:") and not line.startswith("reproduce.py: warning: GPUS=cpu")]
    assert len(lines) == 1 and lines[0].startswith(f"reproduce.py: WMT17_EXTRA_DIR={tmp_path} lacks train.zh")
    assert not (checkout / "build").exists() and "prepare_data" not in result.stdout


def test_two_nodes_through_make_and_node_variables_of_other_tools_left_alone(checkout):
    """NODES=2 with NODE_RANK and MASTER_IP (here from the environment) plans node 1's part; NODE_RANK and
    MASTER_PORT exported for torchrun or SLURM do not touch a one-node table; NODES=2 without NODE_RANK is one
    line (a second node 0 would wait 30 minutes for a node 1)."""
    one = _make(checkout, "reproduce-li2019-table3", "DRY_RUN=1", MASTER_PORT="29500", NODE_RANK="3")
    assert one.returncode == 0 and "-master_port" not in one.stdout and " onmt_train " in one.stdout, one.stderr
    two = _make(checkout, "reproduce-li2019-table3", "DRY_RUN=1", "GPUS=0,1", "NODES=2", NODE_RANK="1",
                MASTER_IP="10.0.0.1")
    assert two.returncode == 0, two.stderr
    assert "# nodes: node 1 of 2, global ranks 2-3 of 4, meeting at 10.0.0.1, ports 10000-10006" in two.stdout
    assert " -world_size 4 -gpu_ranks 2 3 -master_ip 10.0.0.1 -master_port 10000 " in two.stdout
    assert " onmt_translate " not in two.stdout and not (checkout / "build").exists()
    missing = _make(checkout, "reproduce-li2019-table3", "DRY_RUN=1", "GPUS=0,1", "NODES=2", "MASTER_IP=h")
    assert missing.returncode != 0 and "Traceback" not in missing.stderr
    assert "reproduce.py: error: --nodes 2 needs --node-rank" in missing.stderr


@pytest.mark.parametrize("variable, said", [
    ("BINARIZED=no", "BINARIZED=no: set it to 1"), ("BINARIZED=false", "BINARIZED=false: set it to 1"),
    ("GPUS=0 1", "GPUS=0 1: separate the CUDA device ids with commas, e.g. GPUS=0,1"),
    ("WMT17_SMALL_DATA=yes", "WMT17_SMALL_DATA=yes: set it to 1"),
])
def test_a_make_variable_of_another_spelling_is_named_in_one_line_in_a_dry_run_too(checkout, variable, said):
    result = _make(checkout, "reproduce-sample-li2019", "DRY_RUN=1", variable)
    errors = [line for line in result.stderr.splitlines() if "error" in line and "***" not in line]
    assert result.returncode == 2 and errors == [f"make: error: {said}" + errors[0][len(said) + 13:]], result.stderr
    assert " onmt_train " not in result.stdout and not (checkout / "build").exists()


def test_gpus_cpu_on_a_paper_table_is_explained(checkout):
    result = _make(checkout, "reproduce-li2019-table2", "GPUS=cpu", "DRY_RUN=1")
    assert "reproduce.py: warning: GPUS=cpu trains li2019-table2's paper-size models on the CPU" in result.stderr


def test_a_papers_target_warns_of_the_cpu_once_per_table(checkout):
    """GPUS=cpu on a paper's tables: each table's warning once (its checks ran in the paper target, not again in the
    table's own)."""
    result = _make(checkout, "reproduce-li2019", "GPUS=cpu", "DRY_RUN=1")
    warned = [line for line in result.stderr.splitlines() if line.startswith("reproduce.py: warning: GPUS=cpu")]
    assert len(warned) == len(set(warned)) == 4, result.stderr
