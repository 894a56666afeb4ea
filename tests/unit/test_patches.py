"""The patch helper and the list of changes onmt-ext makes to OpenNMT-py, in-process.

The list as ``python -m onmt_ext.hook status`` prints it is checked in tests/integration/test_patches_cli.py.
"""

import ast
import types

import pytest

import support


@pytest.fixture
def fresh_record(monkeypatch):
    """The patch record, emptied for this test (the real one is left as the hook made it)."""
    from onmt_ext import patches

    monkeypatch.setattr(patches, "APPLIED", [])
    monkeypatch.setattr(patches, "_DONE", {})
    return patches


def test_patch_wraps_once_and_keeps_classmethods(fresh_record):
    patches = fresh_record

    class Target:
        @classmethod
        def make(cls, x):
            return (cls.__name__, x)

        def method(self, x):
            return x + 1

    def twice(stock, self, x):
        return 2 * stock(self, x)

    def tagged(stock, cls, x):
        return ("tagged",) + stock(cls, x)

    for _ in range(2):  # a second call changes nothing
        patches.patch(Target, "method", twice, kind=patches.FIX, reason="r", test="t")
        patches.patch(Target, "make", tagged, kind=patches.NEEDED, reason="r2", test="t2")
    assert Target().method(3) == 8
    assert isinstance(vars(Target)["make"], classmethod) and Target.make(5) == ("tagged", "Target", 5)
    listed = patches.applied()
    assert [p.target.rsplit(".", 2)[-2:] for p in listed] == [["Target", "method"], ["Target", "make"]]
    assert listed[0].line().endswith("[fix]: r (test: t)")


def test_patch_needs_a_reason_a_test_and_a_known_kind(fresh_record):
    patches = fresh_record

    module = types.ModuleType("somewhere")
    module.f = lambda: 1
    with pytest.raises(ValueError, match="reason and the test"):
        patches.patch(module, "f", lambda stock: 2, kind=patches.FIX, reason="", test="t")
    with pytest.raises(ValueError, match="kind must be one of"):
        patches.patch(module, "f", lambda stock: 3, kind="cosmetic", reason="r", test="t")
    assert module.f() == 1 and not patches.applied()


def _test_names(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}


def test_every_applied_patch_names_a_test_that_exists(onmt_active):
    from onmt_ext import patches

    listed = patches.applied()
    assert len(listed) >= 20
    missing = []
    for item in listed:
        path, _, name = item.test.partition("::")
        if not (support.REPO / path).is_file() or name not in _test_names(support.REPO / path):
            missing.append(f"{item.target}: {item.test}")
    assert not missing, missing


def test_activating_twice_adds_no_second_wrapper(onmt_active):
    from onmt.trainer import Trainer
    from onmt.utils.parse import ArgumentParser

    from onmt_ext import compat, patches, plugin

    train, parse = Trainer.train, ArgumentParser.parse_known_args
    count = len(patches.applied())
    compat.resume_data_position()
    plugin._make_parsing_strict()
    assert Trainer.train is train and ArgumentParser.parse_known_args is parse
    assert len(patches.applied()) == count


def test_no_patch_bypasses_the_helper():
    """The old "wrap and set a flag" idiom is gone from the modules that patch OpenNMT-py."""
    for name in ("compat", "plugin", "corpus", "_autoload", "hook"):
        text = (support.REPO / "onmt_ext" / f"{name}.py").read_text(encoding="utf-8")
        assert "._onmt_ext = True" not in text, name


def test_every_fix_is_described_in_the_differences_from_stock(onmt_active):
    from onmt_ext import patches

    doc = (support.REPO / "docs" / "differences-from-stock.md").read_text(encoding="utf-8")
    undocumented = [p.target for p in patches.applied() if p.kind != patches.NEEDED and f"`{p.target}`" not in doc]
    assert not undocumented, undocumented
