"""pytest set-up shared by all tiers (see tests/README.md)."""

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
