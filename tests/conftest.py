"""pytest set-up shared by all tiers (see tests/README.md)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import support  # noqa: E402

# The slow tier (``-m slow``; ``make test`` deselects it, ``make test-all`` runs it; see tests/README.md).
# Files and tests mark themselves where they can; tests/system/ is slow as a whole.  The entries below put
# tests of files maintained elsewhere into the slow tier from here, by file (every test in it) or by node id,
# until those files carry their own mark.
SLOW_DIRECTORIES = ("tests/system/",)
SLOW_ELSEWHERE = {
    # three trainings through onmt_train (20 steps, and 10 + 10 interrupted and resumed) and translations
    "tests/integration/test_faults.py",
}
# Files whose tests belong to the default tier even where they carry a slow mark: the CPU dry run of the GPU
# check (tools/gpu_check.py --device cpu --tiny), so that the check cannot rot unseen between GPU runs.
DEFAULT_TIER_ELSEWHERE = {
    "tests/integration/test_gpu_check.py",
}


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m selection reads the marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.fspath)).resolve()
        try:
            relative = path.relative_to(support.REPO).as_posix()
        except ValueError:  # a test file outside the repository
            continue
        node = f"{relative}::{item.name}"
        if relative in DEFAULT_TIER_ELSEWHERE or node in DEFAULT_TIER_ELSEWHERE:
            item.own_markers[:] = [mark for mark in item.own_markers if mark.name != "slow"]
            if any(mark.name == "slow" for mark in item.iter_markers()):  # a module or class mark: not undone
                item.warn(pytest.PytestWarning("belongs to the default tier (tests/conftest.py) but a module or "
                                               "class mark makes it slow"))
        elif relative.startswith(SLOW_DIRECTORIES) or relative in SLOW_ELSEWHERE or node in SLOW_ELSEWHERE:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def sample_data():
    """The prepared Tatoeba sample under build/tatoeba (built once with ``make data``)."""
    support.ensure_sample_data()
    return support.TATOEBA


@pytest.fixture(scope="session")
def onmt_active():
    """Import ``onmt`` through the start-up hook and check that onmt-ext is active."""
    import onmt  # noqa: F401
    import onmt_ext.plugin

    assert onmt_ext.plugin.is_active(), "onmt-ext did not load (is the .pth hook installed? run make setup)"
    return True
