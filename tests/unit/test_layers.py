"""onmt_ext's three layers (docs/layout.md): imports point one way, and no modules import each other in a circle.

Ranks: the foundation (``errors``, ``options``, ``patches``) 0, ``runtime/`` 1, ``mechanisms/`` 2, ``integration/``
3.  A module imports its own rank or lower, at its top and inside its functions.  The entry points ``_autoload``
(the start-up hook) and ``hook`` (its command) may be imported from anywhere: their tops import only the
foundation, and only their functions reach up, to activate or list everything.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "onmt_ext"
RANKS = {"runtime": 1, "mechanisms": 2, "integration": 3}
FOUNDATION = {"onmt_ext", "onmt_ext.errors", "onmt_ext.options", "onmt_ext.patches"}
ENTRY = {"onmt_ext._autoload", "onmt_ext.hook"}


def module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def rank(module):
    if module in FOUNDATION or module in ENTRY:
        return 0
    layer = module.split(".")[1]
    assert layer in RANKS, f"{module}: not in a layer; add it to one of {sorted(RANKS)} or to the foundation"
    return RANKS[layer]


def imports(tree, known):
    """``(line, imported module of onmt_ext, at the top)`` of each import in ``tree``; ``from a import b`` names the
    module ``a.b`` when that is one of ``known``."""
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in known else node.module
                       for alias in node.names]
        else:
            continue
        for target in targets:
            if target == "onmt_ext" or target.startswith("onmt_ext."):
                yield node.lineno, target, id(node) in top


def graph(at_top_only):
    """Module -> the modules of onmt_ext it imports (its top's only, or all)."""
    edges = {}
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        edges[name] = {target for _, target, top in imports(tree, MODULES)
                       if (top or not at_top_only) and target != name}
    return edges


def circles(edges):
    """The strongly connected components of more than one module (Tarjan), each sorted; sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_circle_finder_finds_circles_and_only_them():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}) == []


def test_every_module_is_in_a_layer():
    assert len(MODULES) > 30, PACKAGE
    unplaced = [name for name in MODULES if name not in FOUNDATION | ENTRY and name.split(".")[1] not in RANKS]
    assert not unplaced, f"modules outside the layers: {unplaced}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_point_down(name):
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    own = rank(name)
    upward = [f"line {line}: {target}" for line, target, top in imports(tree, MODULES)
              if rank(target) > own and not (name in ENTRY and not top)]
    if name in ENTRY:  # what imports the entry points gets only the foundation with them
        upward += [f"line {line}: {target} (at the top of an entry point)" for line, target, top
                   in imports(tree, MODULES) if top and target not in FOUNDATION]
    assert not upward, f"{name} (rank {own}) imports upwards: {', '.join(upward)}"


def test_no_modules_import_each_other_in_a_circle():
    """Counting the imports inside functions too, but for the entry points' (they load everything by design)."""
    edges = graph(at_top_only=False)
    for name in ENTRY:
        edges[name] = graph(at_top_only=True)[name]
    assert circles(edges) == []
