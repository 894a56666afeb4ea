"""onmt-ext's own options are read typed, from their mechanism's options class, never by name from ``opt``.

Each default is written once, in the ``option(...)`` field of the class; code outside the options machinery
builds the class (``Li2019.from_opt(opt)``, ``config.of(Li2019)``) instead of ``getattr(opt, "li2019_...", 3)``.
"""

import argparse
import ast
import re
from pathlib import Path

import pytest

import onmt_ext.runtime.compile  # noqa: F401  (every module that declares options: -ext_compile*)
import onmt_ext.integration.transformer  # noqa: F401  (the mechanisms and -ext_layer_norm)
from onmt_ext import options
from onmt_ext.mechanisms.cao2019 import Cao2019
from onmt_ext.mechanisms.li2019 import Li2019

PACKAGE = Path(__file__).resolve().parents[2] / "onmt_ext"

#: What holds options: ``opt``, ``opts``, ``model_opt``, ``self.opts``, ``checkpoint["opt"]``, ``args`` ...
OPTIONS_HOLDER = re.compile(r"^(opts?|args|namespace)$|_opts?$")

#: ``(file, function)`` where reading one of our options by name is the job, each with why.
ALLOWED = {
    # onmt_translate's own -ext_compile (plugin._translate_opts, default false), not the model option of
    # Compile (default auto): a translation compiles only when asked, whatever training used
    ("integration/plugin.py", "_load_test_model"),
}


def _option_names():
    names = {spec.name for spec in options.OPTION_SPECS}
    assert {name.split("_")[0] for name in names} >= {"li2019", "cao2019", "chen2019", "clause", "gret", "disan",
                                                     "ext"}, "the mechanisms' options are not all registered"
    return names


def _holder(node):
    """The name of what ``node`` (the object read from) is: ``opt`` for ``opt``, ``self.opt``, ``ckpt["opt"]``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return str(node.slice.value)
    return ""


def _names_an_option(node, names):
    """Whether ``node``, the name argument of ``getattr``, is or can format one of ``names``."""
    if isinstance(node, ast.Constant):
        return node.value in names
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        pattern = "".join(re.escape(part.value) if isinstance(part, ast.Constant) else r"\w+" for part in node.values)
        return any(re.fullmatch(pattern, name) for name in names)  # f"chen2019_{side}", not f"{side}_type"
    return False


def by_name_reads(tree, names):
    """``(line, function, what)`` of each read of an option in ``names`` by name in ``tree``.

    Found: ``getattr``/``hasattr`` on an options holder (:data:`OPTIONS_HOLDER`) with the option's name,
    ``<holder>.<option>``, and option names listed in a tuple, list or set (read in a loop).
    """
    found = []

    def visit(node, function):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        what = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") \
                and len(node.args) >= 2 and OPTIONS_HOLDER.search(_holder(node.args[0])) \
                and _names_an_option(node.args[1], names):
            what = f"{node.func.id}({ast.unparse(node.args[0])}, {ast.unparse(node.args[1])}, ...)"
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and node.attr in names \
                and OPTIONS_HOLDER.search(_holder(node.value)):
            what = ast.unparse(node)
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            listed = [item.value for item in node.elts if isinstance(item, ast.Constant) and item.value in names]
            what = f"the names {listed}" if listed else None
        if what:
            found.append((node.lineno, function, what))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, None)
    return found


def _reads_in_package():
    names = _option_names()
    return {(path.relative_to(PACKAGE).as_posix(), line, function, what) for path in sorted(PACKAGE.rglob("*.py"))
            for line, function, what in by_name_reads(ast.parse(path.read_text(), str(path)), names)}


def test_no_option_of_ours_is_read_by_name_outside_its_options_class():
    reads = sorted(read for read in _reads_in_package() if read[::2] not in ALLOWED)
    assert not reads, "read the option from its mechanism's options class (Cls.from_opt(opt), config.of(Cls)):\n" \
        + "\n".join(f"onmt_ext/{path}:{line} ({function}): {what}" for path, line, function, what in reads)


def test_every_allowed_place_still_reads_an_option_by_name():
    assert ALLOWED <= {read[::2] for read in _reads_in_package()}, "drop the entries of ALLOWED that read none"


@pytest.mark.parametrize("code, found", [
    ('getattr(opt, "li2019_iterations", 3)', "getattr(opt, 'li2019_iterations', ...)"),
    ('hasattr(self.opts, "gret")', "hasattr(self.opts, 'gret', ...)"),
    ('getattr(model_opt, f"chen2019_{side}", "none")', "getattr(model_opt, f'chen2019_{side}', ...)"),
    ("checkpoint['opt'].cao2019_init", "checkpoint['opt'].cao2019_init"),
    ('any(getattr(opt, n) for n in ("disan_enc", "heads"))', "the names ['disan_enc']"),
    ('getattr(opt, f"{side}_layers", 6)', None),  # a stock option
    ('getattr(self, "gret", None)', None),  # a module's attribute of the same name
    ("module.ext_compile", None),
])
def test_the_scan_finds_reads_by_name(code, found):
    reads = by_name_reads(ast.parse(f"def check(opt):\n    return {code}\n"), _option_names())
    assert reads == ([(2, "check", found)] if found else [])


def test_an_options_class_is_built_from_opt_with_its_defaults():
    opt = argparse.Namespace(li2019_enc_self="em", li2019_capsules=8, cao2019_vertical=True)
    assert Li2019.from_opt(opt) == Li2019(enc_self="em", capsules=8)
    assert Cao2019.from_opt(argparse.Namespace()) == Cao2019()
    assert Li2019.spec_of["iterations"].name == "li2019_iterations"
