"""The list of changes onmt-ext makes to OpenNMT-py, as ``python -m onmt_ext.hook status`` prints it.

Moved out of tests/unit/test_patches.py (unit/ runs in-process only): the command, run in a subprocess, names
the installed .pth file and the number of patches, then lists that many, each naming the test under tests/ that
covers it (the -train_from fix of ``Trainer.train`` among them).  Each line's first column marks a change of
onmt-ext's runtime (``runtime``) and, under ``ONMT_EXT_RUNTIME=stock``, one that was left out (``skipped``, listed
last): the skipped ones are exactly those marked ``runtime`` without the variable.
"""

import re
import subprocess
import sys

import support

#: a layered target's annotation, which depends on how many of its layers are listed
LAYER = re.compile(r"; layer \d+ of \d+ on this target, 0 runs first")


def _status(**env):
    result = subprocess.run([sys.executable, "-m", "onmt_ext.hook", "status"], capture_output=True, text=True,
                            cwd=support.REPO, env=support.cli_env(**env), timeout=300)
    return result


def _listing(**env):
    """``(header lines, {mark: [change without its layer annotation]})`` of the status listing."""
    result = _status(**env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    marks = {}
    for line in lines[2:]:
        mark, change = line[2:9].strip(), line[11:]
        assert line[:2] == "  " and line[9:11] == "  " and mark in ("", "runtime", "skipped"), line
        marks.setdefault(mark, []).append(LAYER.sub("", change))
    return lines[:2], marks


def test_hook_status_lists_the_patches_and_marks_the_runtime():
    (installed, header), marks = _listing(ONMT_EXT_RUNTIME="")
    assert installed.startswith("installed: ") and installed.endswith("onmt_ext.pth")
    runtime, listed = marks["runtime"], marks[""] + marks["runtime"]
    assert "skipped" not in marks
    assert int(header.split()[0]) == len(listed)
    assert f"; the {len(runtime)} marked 'runtime' are onmt-ext's runtime" in header
    assert any(line.startswith("onmt.trainer.Trainer.train [fix]: -train_from restarts") for line in runtime)
    assert all(" [speed" not in line for line in marks[""])  # every speed change is of the runtime
    assert all(" (test: tests/" in line for line in listed)


def test_hook_status_under_the_stock_runtime_marks_what_it_left_out():
    _, ext = _listing(ONMT_EXT_RUNTIME="")
    (_, header), stock = _listing(ONMT_EXT_RUNTIME="stock")
    assert "runtime" not in stock
    assert sorted(stock["skipped"]) == sorted(ext["runtime"])
    assert sorted(stock[""]) == sorted(ext[""])
    assert int(header.split()[0]) == len(stock[""])
    assert f"ONMT_EXT_RUNTIME=stock left out the {len(stock['skipped'])} of onmt-ext's runtime" in header


def test_hook_status_refuses_an_unknown_runtime_in_one_line():
    result = _status(ONMT_EXT_RUNTIME="fast")
    assert result.returncode == 2 and not result.stdout
    assert result.stderr == "python -m onmt_ext.hook: error: ONMT_EXT_RUNTIME='fast' is not one of ext, stock\n"
