"""The list of changes onmt-ext makes to OpenNMT-py, as ``python -m onmt_ext.hook status`` prints it.

Moved out of tests/unit/test_patches.py (unit/ runs in-process only): the command, run in a subprocess, names
the installed .pth file and the number of patches, then lists that many, each naming the test under tests/ that
covers it (the -train_from fix of ``Trainer.train`` among them).
"""

import subprocess
import sys

import support


def test_hook_status_lists_the_patches():
    result = subprocess.run([sys.executable, "-m", "onmt_ext.hook", "status"], capture_output=True, text=True,
                            cwd=support.REPO, env=support.cli_env(), timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("installed: ") and lines[0].endswith("onmt_ext.pth")
    listed = [line.strip() for line in lines[2:]]
    assert int(lines[1].split()[0]) == len(listed)
    assert any(line.startswith("onmt.trainer.Trainer.train [fix]: -train_from restarts") for line in listed)
    assert all(" (test: tests/" in line for line in listed)
