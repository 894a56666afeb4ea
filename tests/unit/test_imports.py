"""Imports of onmt_ext go at the top of each module; one kept inside a function says why where it is.

What can be checked mechanically: no function imports what would cost nothing at the top (the standard library)
or what the top already imports under the same name.
"""

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "onmt_ext"
MODULES = sorted(PACKAGE.rglob("*.py"))


def bindings(node):
    """``(bound name, what it is bound to, imported module)`` of each name an import statement ``node`` binds."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            bound = alias.asname or alias.name.partition(".")[0]
            yield bound, alias.name if alias.asname else bound, alias.name
    else:
        module = "." * node.level + (node.module or "")
        for alias in node.names:
            yield alias.asname or alias.name, f"{module}.{alias.name}", module


def imports_in_functions(tree):
    """The import statements inside the functions (and methods) of ``tree``."""
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(function):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    yield node


def test_the_package_is_found():
    assert len(MODULES) > 10, PACKAGE


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_functions_import_neither_the_standard_library_nor_what_the_top_imports(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {bound: target for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
           for bound, target, _ in bindings(node)}
    late = sorted({f"line {node.lineno}: {module}" for node in imports_in_functions(tree)
                   for bound, target, module in bindings(node)
                   if module.partition(".")[0] in sys.stdlib_module_names or top.get(bound) == target})
    assert not late, f"{path.relative_to(PACKAGE)}: imports to move to the top of the module: {', '.join(late)}"
