"""The patch registry (onmt_ext/patches.py) and the changes onmt-ext makes to OpenNMT-py, in-process.

The registry on made-up targets: one wrapper per target with layers in their stated order, registry entries,
rollback.  On OpenNMT-py itself: every attribute of every ``onmt`` module and class and every entry of its registry
dicts is compared before and after activation, and what differs must be exactly what the registry lists; a failing
middle step of ``activate()`` or an unsupported version leaves all of it stock.  The list as
``python -m onmt_ext.hook status`` prints it is checked in tests/integration/test_patches_cli.py.
"""

import ast
import logging
import sys
import types

import pytest
import torch

import support


@pytest.fixture
def fresh_record(monkeypatch):
    """The patch record, emptied for this test (the real one is left as the hook made it)."""
    from onmt_ext import patches

    for name in ("APPLIED", "_JOURNAL", "SKIPPED"):
        monkeypatch.setattr(patches, name, [])
    for name in ("_DONE", "_ORIGINALS", "_TARGETS"):
        monkeypatch.setattr(patches, name, {})
    return patches


def _made_up_classes():
    class Base:
        def inherited(self, x):
            return [x]

    class Target(Base):
        @classmethod
        def make(cls, x):
            return (cls.__name__, x)

        @staticmethod
        def static(x):
            return x

        def method(self, x):
            return [x]

    return Base, Target


def test_patch_wraps_once_and_keeps_classmethods(fresh_record):
    patches = fresh_record
    _, Target = _made_up_classes()

    def twice(stock, self, x):
        return 2 * stock(self, x)

    def tagged(stock, cls, x):
        return ("tagged",) + stock(cls, x)

    for _ in range(2):  # a second call changes nothing
        patches.patch(Target, "method", twice, kind=patches.FIX, reason="r", test="t")
        patches.patch(Target, "make", tagged, kind=patches.NEEDED, reason="r2", test="t2")
    assert Target().method(3) == [3, 3]
    assert isinstance(vars(Target)["make"], classmethod) and Target.make(5) == ("tagged", "Target", 5)
    listed = patches.applied()
    assert [p.target.rsplit(".", 2)[-2:] for p in listed] == [["Target", "method"], ["Target", "make"]]
    assert listed[0].line().endswith("[fix]: r (test: t)")


def _layer(tag):
    def layer(stock, self, x):
        return [tag] + stock(self, x)

    layer.__code__ = layer.__code__.replace(co_name=f"layer_{tag}")  # a distinct replacement per tag
    return layer


@pytest.mark.parametrize("call_order", [(0, 1, 2), (2, 0, 1), (1, 2, 0)])
def test_layers_of_one_target_compose_in_their_stated_order_whatever_the_call_order(fresh_record, call_order):
    patches = fresh_record
    _, Target = _made_up_classes()
    stock = vars(Target)["method"]
    for order in call_order:
        patches.patch(Target, "method", _layer(f"L{order}"), kind=patches.FIX, reason=f"r{order}", test="t",
                      order=order)
    assert Target().method("x") == ["L0", "L1", "L2", "x"]  # 0 runs first, stock last
    assert vars(Target)["method"].__wrapped_stock__ is stock  # one wrapper, over stock
    assert [line.split("]")[0] for line in patches.lines()] == [
        f"{Target.__module__}.{Target.__qualname__}.method [fix; layer {k} of 3 on this target, 0 runs first"
        for k in range(3)]


def test_layers_that_cannot_be_composed_are_refused(fresh_record):
    patches = fresh_record
    _, Target = _made_up_classes()
    patches.patch(Target, "method", _layer("a"), kind=patches.FIX, reason="r", test="t")
    with pytest.raises(ValueError, match="its own order"):
        patches.patch(Target, "method", _layer("b"), kind=patches.FIX, reason="r", test="t")
    with pytest.raises(ValueError, match="only one"):
        patches.patch(Target, "method", lambda self, x: x, wrap=False, kind=patches.SPEED, reason="r", test="t",
                      order=5)
    assert Target().method(1) == ["a", 1] and len(patches.applied()) == 1


def test_patch_needs_a_reason_a_test_and_a_known_kind(fresh_record):
    patches = fresh_record

    module = types.ModuleType("somewhere")
    module.f = lambda: 1
    with pytest.raises(ValueError, match="reason and the test"):
        patches.patch(module, "f", lambda stock: 2, kind=patches.FIX, reason="", test="t")
    with pytest.raises(ValueError, match="kind must be one of"):
        patches.patch(module, "f", lambda stock: 3, kind="cosmetic", reason="r", test="t")
    assert module.f() == 1 and not patches.applied()


def test_rollback_restores_every_attribute_and_entry(fresh_record):
    patches = fresh_record
    Base, Target = _made_up_classes()
    module = types.ModuleType("somewhere")
    module.f = lambda: 1
    module.REGISTRY = {"stock": int}
    before = (dict(vars(Target)), dict(vars(Base)), dict(vars(module)), dict(module.REGISTRY))
    undone = []
    patches.patch(Target, "inherited", _layer("i"), kind=patches.FIX, reason="r", test="t")
    patches.patch(Target, "static", lambda stock, x: stock(x) + 1, kind=patches.FIX, reason="r", test="t")
    patches.patch(Target, "method", _layer("a"), kind=patches.FIX, reason="r", test="t", order=1)
    patches.patch(Target, "method", _layer("b"), kind=patches.FIX, reason="r", test="t", order=0)
    patches.patch(module, "f", object(), wrap=False, kind=patches.NEEDED, reason="r", test="t")
    patches.add_entry(module, "REGISTRY", "ours", _made_up_classes, kind=patches.NEEDED, reason="r", test="t")
    patches.record("something else", kind=patches.MESSAGE, reason="r", test="t", undo=lambda: undone.append(1))
    assert Target().inherited(1) == ["i", 1] and Target.static(1) == 2 and module.REGISTRY["ours"]
    with pytest.raises(ValueError, match="not put there by onmt-ext"):
        patches.add_entry(module, "REGISTRY", "stock", float, kind=patches.NEEDED, reason="r", test="t")

    patches.rollback()
    assert (dict(vars(Target)), dict(vars(Base)), dict(vars(module)), dict(module.REGISTRY)) == before
    assert "inherited" not in vars(Target) and undone == [1]
    assert not patches.applied() and not patches.targets() and not patches._DONE


def test_all_or_nothing_rolls_back_and_reraises(fresh_record):
    patches = fresh_record
    _, Target = _made_up_classes()
    stock = vars(Target)["method"]
    with pytest.raises(RuntimeError, match="step 2"):
        with patches.all_or_nothing():
            patches.patch(Target, "method", _layer("a"), kind=patches.FIX, reason="r", test="t")
            raise RuntimeError("step 2")
    assert vars(Target)["method"] is stock and not patches.applied()


def test_all_or_nothing_undoes_only_the_blocks_own_changes(fresh_record):
    patches = fresh_record
    _, Target = _made_up_classes()
    undone = []
    patches.record("before", kind=patches.FIX, reason="r", test="t", undo=lambda: undone.append("before"))
    patches.patch(Target, "method", _layer("a"), kind=patches.FIX, reason="r", test="t")
    kept = patches.applied()
    with pytest.raises(RuntimeError, match="step 2"):
        with patches.all_or_nothing():
            patches.patch(Target, "method", _layer("b"), kind=patches.FIX, reason="r", test="t", order=1)
            patches.record("in the block", kind=patches.FIX, reason="r", test="t", undo=lambda: undone.append("in"))
            raise RuntimeError("step 2")
    assert patches.applied() == kept and undone == ["in"] and Target().method(1) == ["a", 1]


def test_rollback_goes_on_past_an_undo_that_raises(fresh_record):
    patches = fresh_record
    module = types.ModuleType("somewhere")
    module.f = lambda: 1
    stock, undone = module.f, []

    def broken():
        raise OSError("cannot undo\nsecond line")

    patches.record("first", kind=patches.FIX, reason="r", test="t", undo=lambda: undone.append("first"))
    patches.patch(module, "f", lambda stock: 2, kind=patches.FIX, reason="r", test="t")
    patches.record("second", kind=patches.MESSAGE, reason="r", test="t", undo=broken)
    patches.record("third", kind=patches.FIX, reason="r", test="t", undo=lambda: undone.append("third"))
    with pytest.raises(patches.RollbackError) as raised:
        patches.rollback()
    assert str(raised.value) == "could not undo 1 change(s), the others are undone: second (OSError: cannot undo)"
    assert undone == ["third", "first"] and module.f is stock
    assert not patches.applied() and not patches._JOURNAL and not patches.targets()


def test_a_failed_undo_inside_all_or_nothing_is_raised_caused_by_the_failure(fresh_record):
    patches = fresh_record

    def broken():
        raise OSError("stuck")

    with pytest.raises(patches.RollbackError, match=r"undo 1 change\(s\).*: stuck \(OSError: stuck\)") as raised:
        with patches.all_or_nothing():
            patches.record("stuck", kind=patches.FIX, reason="r", test="t", undo=broken)
            raise RuntimeError("step 2")
    assert isinstance(raised.value.__cause__, RuntimeError) and not patches.applied()


def test_temporarily_restores_exactly_what_it_changed():
    from onmt_ext.patches import temporarily

    Base, Target = _made_up_classes()
    module = types.ModuleType("somewhere")
    module.f = stock = object()
    with temporarily(module, "f", 1) as value:
        assert module.f == value == 1
        with temporarily(module, "f", 2):
            assert module.f == 2
        assert module.f == 1
    assert module.f is stock
    with pytest.raises(ValueError), temporarily(Target, "inherited", 3):  # inherited: restored by deleting
        assert Target.inherited == 3
        raise ValueError("inside")
    assert "inherited" not in vars(Target) and Target.inherited is Base.inherited
    with temporarily(module, "absent", 4):
        assert module.absent == 4
    assert not hasattr(module, "absent")
    with temporarily(module, "f", 5):
        module.f = theirs = object()  # replaced meanwhile: not this block's to undo
    assert module.f is theirs


def test_the_runtime_is_speed_and_declared_fixes_skipped_under_the_stock_runtime(fresh_record, monkeypatch):
    patches = fresh_record
    module = types.ModuleType("somewhere")
    module.speed = module.fix = module.runtime_fix = module.needed = lambda: "stock"
    undone = []

    def apply():
        for name, kind, runtime in (("speed", patches.SPEED, False), ("fix", patches.FIX, False),
                                    ("runtime_fix", patches.FIX, True), ("needed", patches.NEEDED, False)):
            patches.patch(module, name, lambda stock: "ours", kind=kind, runtime=runtime, reason="r", test="t")
        return patches.record("a runtime record", kind=patches.FIX, runtime=True, reason="r", test="t",
                              undo=lambda: undone.append(1))

    monkeypatch.setenv(patches.RUNTIME_VARIABLE, "stock")
    assert apply() is False and undone == [1]  # a skipped record's change is undone at once
    assert [module.speed(), module.fix(), module.runtime_fix(), module.needed()] == ["stock", "ours", "stock", "ours"]
    assert [p.target.split(".")[-1] for p in patches.SKIPPED] == ["speed", "runtime_fix", "a runtime record"]
    assert not any(p.runtime for p in patches.applied())
    patches.rollback()
    assert not patches.SKIPPED
    monkeypatch.setenv(patches.RUNTIME_VARIABLE, " ext ")
    assert apply() is True and undone == [1] and module.speed() == module.runtime_fix() == "ours"
    assert [p.runtime for p in patches.applied()] == [True, False, True, False, True]
    with pytest.raises(ValueError, match="only a FIX or SPEED change can be of the runtime, not a message one"):
        patches.record("m", kind=patches.MESSAGE, runtime=True, reason="r", test="t")
    monkeypatch.setenv(patches.RUNTIME_VARIABLE, "fast")
    with pytest.raises(ValueError, match=r"^ONMT_EXT_RUNTIME='fast' is not one of ext, stock$"):
        patches.runtime_choice()


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

    from onmt_ext.runtime import compat
    from onmt_ext.integration import parsing
    from onmt_ext import patches

    train, parse = Trainer.train, ArgumentParser.parse_known_args
    count = len(patches.applied())
    compat.resume_data_position()
    parsing.make_parsing_strict()
    assert Trainer.train is train and ArgumentParser.parse_known_args is parse
    assert len(patches.applied()) == count


def test_every_fix_is_described_in_the_differences_from_stock(onmt_active):
    from onmt_ext import patches

    doc = (support.REPO / "docs" / "differences-from-stock.md").read_text(encoding="utf-8")
    undocumented = [p.target for p in patches.applied() if p.kind != patches.NEEDED and f"`{p.target}`" not in doc]
    assert not undocumented, undocumented


# ---------------------------------------------------------------------------
# OpenNMT-py itself, walked attribute by attribute


#: entry name under every name of its dict -> under the dict's first name (``onmt.opts.AVAILABLE_TRANSFORMS`` is
#: ``onmt.transforms``'s, imported by name); filled by :func:`_onmt_state`
_ALIASES = {}


def _onmt_state():
    """``{name: value}`` of every attribute of every imported ``onmt`` module, of every class defined in one
    (as stored: ``vars``), and of every entry of their module-level dicts (OpenNMT-py's registries)."""
    state, seen, dicts = {}, set(), {}
    for module_name, module in sorted(sys.modules.items()):
        if not (module_name == "onmt" or module_name.startswith("onmt.")) or id(module) in seen:
            continue
        seen.add(id(module))
        for name, value in list(vars(module).items()):
            state[f"{module.__name__}.{name}"] = value
            if isinstance(value, dict) and not name.startswith("__"):
                dicts.setdefault(id(value), (value, []))[1].append(f"{module.__name__}.{name}")
            if isinstance(value, type) and value.__module__ == module.__name__:
                for attribute, stored in list(vars(value).items()):
                    state[f"{value.__module__}.{value.__qualname__}.{attribute}"] = stored
    for mapping, names in dicts.values():
        for key, item in list(mapping.items()):
            state[f"{names[0]}[{key!r}]"] = item
            _ALIASES.update({f"{name}[{key!r}]": f"{names[0]}[{key!r}]" for name in names})
    return state


def _changed(before, after):
    """Names whose value differs (by identity), appeared or disappeared between two :func:`_onmt_state`."""
    return {name for name in before.keys() | after.keys()
            if name not in before or name not in after or before[name] is not after[name]}


@pytest.fixture
def stock_onmt(onmt_active):
    """OpenNMT-py with onmt-ext rolled back (``plugin.deactivate``), and its state then; activated again after."""
    from onmt_ext import patches
    from onmt_ext.integration import plugin

    active = _onmt_state()
    plugin.deactivate()
    try:
        stock = _onmt_state()
        assert not patches.applied() and not plugin.is_active()
        yield active, stock
    finally:
        plugin.activate()
    assert plugin.is_active() and _changed(_onmt_state(), active) <= _registered_targets()


def _registered_targets():
    from onmt_ext import patches

    return {_ALIASES.get(p.target, p.target) for p in patches.applied() if p.target.startswith("onmt.")}


def test_what_activation_changes_in_onmt_is_exactly_what_the_registry_lists(stock_onmt):
    from onmt_ext import patches
    from onmt_ext.integration import plugin

    _, stock = stock_onmt
    plugin.activate()
    live = _onmt_state()
    assert _changed(stock, live) == _registered_targets()
    for name, (owner, attribute, original) in patches.targets().items():
        assert stock.get(name, original) is original and not patches.is_ours(original), name  # absent: inherited


def test_no_onmt_attribute_holds_our_code_unless_the_registry_lists_it(onmt_active):
    """Without a stock snapshot: a function, object or class of onmt-ext inside OpenNMT-py must be registered."""
    from onmt_ext.runtime import compat
    from onmt_ext import patches

    ours = {name for name, value in _onmt_state().items()
            if patches.is_ours(value) and not isinstance(value, (compat._MissingModule, compat._DeferredModule))}
    # the stand-ins for spaCy and fasttext: recorded as what they do, "sys.modules (...)"
    assert ours == _registered_targets()


def test_a_failing_middle_step_of_activate_leaves_onmt_stock(stock_onmt):
    from onmt_ext.integration import checkpoints, plugin
    from onmt_ext import patches

    _, stock = stock_onmt
    applied_before = []

    def broken():
        applied_before.extend(_registered_targets())
        raise RuntimeError("simulated failure of a middle step")

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(checkpoints, "check_checkpoints", broken)
        with pytest.raises(RuntimeError, match="middle step"):
            plugin.activate()
    assert len(applied_before) >= 20 and "onmt.trainer.Trainer.train" in applied_before  # steps before it ran
    assert _changed(stock, _onmt_state()) == set()
    assert not patches.applied() and not patches.targets() and not plugin.is_active()


def test_an_unsupported_onmt_version_is_refused_before_any_change(stock_onmt):
    import onmt

    from onmt_ext import patches
    from onmt_ext.integration import plugin

    _, stock = stock_onmt
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(onmt, "__version__", "3.6.0")
        with pytest.raises(patches.UnsupportedVersion, match=r"^OpenNMT-py 3\.6\.0 is not supported") as raised:
            plugin.activate()
    assert "\n" not in str(raised.value)
    assert _changed(stock, _onmt_state()) == set()
    assert not patches.applied() and not plugin.is_active()


#: the FIX changes that are part of the runtime (every SPEED change is too), as docs/differences-from-stock.md lists
RUNTIME_FIXES = {"onmt.trainer.Trainer.train", "onmt.inputters.text_corpus.ParallelCorpus.load",
                 "onmt.inputters.text_corpus.ParallelCorpusIterator._process",
                 "data-parallel gradient scale (onmt_ext.runtime.train_step.gradient_accumulation)"}


def test_the_stock_runtime_leaves_out_the_runtime_and_only_it(stock_onmt, monkeypatch):
    """``ONMT_EXT_RUNTIME=stock``: the runtime's changes are not applied (their targets stay stock), every other
    change is, and together they are the changes of onmt-ext's own runtime."""
    from onmt_ext import patches
    from onmt_ext.integration import plugin

    _, stock = stock_onmt
    monkeypatch.setenv(patches.RUNTIME_VARIABLE, "stock")
    plugin.activate()
    kept, skipped = patches.applied(), list(patches.SKIPPED)
    assert _changed(stock, _onmt_state()) == _registered_targets()  # the skipped targets are stock
    assert not any(p.runtime for p in kept) and all(p.runtime for p in skipped)
    plugin.deactivate()
    monkeypatch.delenv(patches.RUNTIME_VARIABLE)
    plugin.activate()
    assert sorted(map(repr, patches.applied())) == sorted(map(repr, kept + skipped)) and not patches.SKIPPED
    runtime = [p for p in patches.applied() if p.runtime]
    assert {p.target for p in runtime if p.kind == patches.FIX} == RUNTIME_FIXES
    assert {p.kind for p in runtime} == {patches.FIX, patches.SPEED}
    assert all(p.runtime for p in patches.applied() if p.kind == patches.SPEED)


def _torch_state():
    """What onmt-ext may change in torch and Python besides OpenNMT-py, by the start of the registry target that
    records it (compared with ``==``; functions and classes by identity)."""
    import logging
    import warnings

    import torch._dynamo.config  # noqa: F401 (torch._dynamo.config below)
    import torch._inductor.config  # noqa: F401
    from torch.fx.experimental import _config as shape_config

    log_state = torch._logging._internal._get_log_state()
    namespaces = {name: {key: value for key, value in vars(owner).items() if not isinstance(value, types.ModuleType)}
                  for name, owner in (("torch", torch), ("torch.Tensor", torch.Tensor),
                                      ("torch.backends.cuda", torch.backends.cuda),
                                      ("torch.serialization", torch.serialization),
                                      ("torch.nn.functional", torch.nn.functional))}
    return {**namespaces,
            "torch.serialization safe globals": set(torch.serialization.get_safe_globals()),
            "warnings filters": list(warnings.filters),
            "sys.excepthook": sys.excepthook,
            "torch._logging": (dict(log_state.log_qname_to_level), set(log_state.artifact_names),
                               {name: (logger.level, len(logger.handlers), logger.propagate)
                                for name, logger in logging.root.manager.loggerDict.items()
                                if name.startswith("torch") and isinstance(logger, logging.Logger)}),
            "torch.set_num_threads": torch.get_num_threads(),
            "torch._dynamo.config": torch._dynamo.config.get_config_copy(),
            "torch._inductor.config": torch._inductor.config.get_config_copy(),
            "torch.fx.experimental._config": shape_config.get_config_copy()}


def _torch_changes(before, after):
    """The keys of two :func:`_torch_state` whose values differ (a torch logger made in between, as made, is no
    change: ``logging.getLogger`` makes one on first use)."""
    fresh = (logging.NOTSET, 0, True)

    def same(key):
        if key != "torch._logging":
            return before[key] == after[key]
        (*head, old), (*new_head, new) = before[key], after[key]
        return head == new_head and {name: old.get(name, fresh) for name in {**old, **new}} == {
            name: new.get(name, fresh) for name in {**old, **new}}

    return {key for key in before if not same(key)}


def _torch_targets(state):
    """The keys of ``state`` (a :func:`_torch_state`) that an applied change of the registry names."""
    from onmt_ext import patches

    return {key for key in state if any(p.target.split(" (")[0] == key for p in patches.applied())}


def _run_attention():
    """One forward of OpenNMT-py's (patched) attention on the CPU."""
    from onmt.modules.multi_headed_attn import MultiHeadedAttention

    x = torch.randn(2, 3, 8)
    MultiHeadedAttention(2, 8, dropout=0.0, is_decoder=False, attn_type="self")(x, x, x)


def test_torch_state_changes_are_recorded(stock_onmt, monkeypatch):
    """What activation and ``-ext_compile_layers`` change in torch (the ``torch.load`` allow-list, warnings filters,
    torch's log settings, Dynamo's and Inductor's configuration, torch's functions) is what the registry lists, and
    rollback puts all of it back; OpenNMT-py's attention puts ``torch.backends.cuda.sdp_kernel`` back itself."""
    import onmt.encoders.transformer

    from onmt_ext.runtime import compile as ext_compile
    from onmt_ext.integration import plugin

    monkeypatch.delenv("TORCH_LOGS", raising=False)
    before = _torch_state()
    plugin.activate()
    after = _torch_state()
    assert _torch_changes(before, after) == _torch_targets(after) == {"torch.serialization safe globals",
                                                                      "warnings filters"}
    _run_attention()
    assert _torch_changes(after, _torch_state()) == set()
    layers = torch.nn.ModuleList([onmt.encoders.transformer.TransformerEncoderLayer(8, 2, 16, 0.0, 0.0)])
    assert ext_compile.compile_layers(layers) == 1
    compiled = _torch_state()
    assert _torch_changes(after, compiled) == {"torch._logging"} and "torch._logging" in _torch_targets(compiled)
    plugin.deactivate()
    assert _torch_changes(before, _torch_state()) == set()


def test_a_failed_activation_keeps_what_was_applied_before_it(stock_onmt):
    """The start-up hook applies the ``torch.load`` allow-list and the warnings filters before ``onmt`` runs; an
    activation whose middle step fails undoes its own changes only: torch, OpenNMT-py and the record are as
    before it."""
    from onmt_ext.integration import checkpoints, plugin
    from onmt_ext.runtime import compat
    from onmt_ext import patches

    _, stock = stock_onmt
    compat.apply()  # what the hook does before onmt is imported
    before, applied = _torch_state(), patches.applied()
    assert {"torch.serialization safe globals", "warnings filters"} <= _torch_targets(before)

    def broken():
        raise RuntimeError("simulated failure of a middle step")

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(checkpoints, "check_checkpoints", broken)
        with pytest.raises(RuntimeError, match="middle step"):
            plugin.activate()
    assert _torch_changes(before, _torch_state()) == set() and patches.applied() == applied
    assert _changed(stock, _onmt_state()) == set() and not plugin.is_active()
