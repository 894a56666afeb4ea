"""pytest set-up shared by all tiers (see tests/README.md)."""

import collections
import os
from pathlib import Path

import pytest
import torch

import support

# The fused routing kernels (onmt_ext.mechanisms.routing_triton) run on CPU tensors only in Triton's interpreter, which
# Triton chooses when it is imported: set it before any test imports Triton (torch.compile's Inductor does).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The slow tier (``-m slow``; ``make test`` deselects it, ``make test-all`` runs it; see tests/README.md).
# Tests and files mark themselves; tests/system/ is slow as a whole.
SLOW_DIRECTORIES = ("tests/system/",)


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m selection reads the marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        try:
            relative = Path(str(item.fspath)).resolve().relative_to(support.REPO).as_posix()
        except ValueError:  # a test file outside the repository
            continue
        if relative.startswith(SLOW_DIRECTORIES):
            item.add_marker(pytest.mark.slow)


#: The files that take longest in `make test-all` (results/tests/README.md, 2026-11-30), longest first.  The
#: Makefile runs pytest-xdist with ``--dist loadfile --no-loadscope-reorder``: the workers take whole files in
#: item order.  xdist's default order (most tests first) left the one-test files last, and the interpreter's
#: 10-minute kernels run (test_routing_kernels_cli.py) then ran alone at the end while the other worker idled.
LONG_FILES = ("tests/integration/test_decoding_properties.py", "tests/unit/test_compile.py",
              "tests/integration/test_routing_kernels_cli.py", "tests/tools/test_gpu_check.py",
              "tests/unit/test_compile_layers.py", "tests/integration/test_setup_venv.py",
              "tests/system/test_reproduce_chain.py", "tests/system/test_li2019_learns.py")


def _file_of(item):
    return item.nodeid.split("::")[0]


class _LongFilesFirst:
    """Orders the tests of an xdist worker: files in :data:`LONG_FILES`'s order first, then the other files by
    their number of tests, most first (xdist's default order); a file's tests keep their order."""

    @pytest.hookimpl(trylast=True)  # after the -m and -k selections: the files' counts are of the tests that run
    def pytest_collection_modifyitems(self, config, items):
        if not hasattr(config, "workerinput"):  # not an xdist worker: pytest's own order (--failed-first too)
            return
        counts = collections.Counter(_file_of(item) for item in items)
        rank = {name: index for index, name in enumerate(LONG_FILES)}
        files = sorted(counts, key=lambda name: (rank.get(name, len(rank)), -counts[name]))
        order = {name: index for index, name in enumerate(files)}
        items.sort(key=lambda item: order[_file_of(item)])  # stable: in-file order kept


def pytest_configure(config):
    config.pluginmanager.register(_LongFilesFirst(), "onmt-ext-long-files-first")


@pytest.fixture(scope="session")
def sample_data():
    """The prepared Tatoeba sample under build/tatoeba (built once with ``make data``)."""
    support.ensure_sample_data()
    return support.TATOEBA


@pytest.fixture(scope="session")
def onmt_active():
    """Import ``onmt`` through the start-up hook and check that onmt-ext is active."""
    import onmt  # noqa: F401
    import onmt_ext.integration.plugin

    assert onmt_ext.integration.plugin.is_active(), "onmt-ext did not load (is the .pth hook installed? run make setup)"
    return True
