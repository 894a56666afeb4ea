"""Module docstrings of onmt_ext stay short: what the module is, its equations and shapes (depth goes in docs/)."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "onmt_ext"
MAX_LINES = 15
MODULES = sorted(PACKAGE.rglob("*.py"))  # the layers' subpackages included


def docstring_lines(path):
    """Lines of the module docstring of ``path`` as written (0 when it has none)."""
    text = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False)
    return len(text.splitlines()) if text else 0


def test_the_package_is_found():
    assert len(MODULES) > 10, PACKAGE


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_docstring_is_at_most_15_lines(path):
    lines = docstring_lines(path)
    assert 0 < lines <= MAX_LINES, f"{path.relative_to(PACKAGE)}: module docstring of {lines} lines (at most {MAX_LINES})"


TOOLS_DIR = PACKAGE.parent / "tools"
TOOLS = sorted(TOOLS_DIR.rglob("*.py"))  # the package tools/, its subpackages (tools/gpu_check/) included


def test_the_tools_are_found():
    assert len(TOOLS) > 20 and TOOLS_DIR / "gpu_check" / "cli.py" in TOOLS, TOOLS_DIR


@pytest.mark.parametrize("path", TOOLS, ids=lambda p: p.relative_to(TOOLS_DIR).as_posix())
def test_tool_docstring_is_at_most_15_lines(path):
    """The commands under tools/ say what they are for and how to call them; how they work is in docs/."""
    lines = docstring_lines(path)
    name = path.relative_to(TOOLS_DIR).as_posix()
    assert 0 < lines <= MAX_LINES, f"tools/{name}: module docstring of {lines} lines (at most {MAX_LINES})"
