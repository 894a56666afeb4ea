"""The one way onmt-ext changes OpenNMT-py: :func:`patch`, :func:`add_entry`, :func:`record`, and the record of them.

A target holds one wrapper; behaviours that several modules add to it are *layers*, composed by their stated
``order`` (0 runs first, outermost) whatever the call order.  Every change is recorded (target, kind, reason,
test) for ``python -m onmt_ext.hook status`` and can be undone: :func:`rollback` leaves OpenNMT-py stock,
:func:`all_or_nothing` rolls back when a step fails, :func:`check_version` refuses an unsupported OpenNMT-py.
A wrapper receives the next layer (or the stock callable) first, ``train(stock, self, ...)`` for
``patch(Trainer, "train", train, kind=FIX, reason=..., test=...)``; ``wrap=False`` installs the replacement as it
is (it must be the target's only layer).  Kinds:
:data:`NEEDED` (the extension cannot work without it), :data:`FIX` (a crash or silent data loss of OpenNMT-py
3.5.1), :data:`MESSAGE` (a clearer message only), :data:`SPEED` (a host stall of training removed, same data and
numbers).  Every FIX, MESSAGE and SPEED change is described in docs/differences-from-stock.md.
"""

import contextlib
import functools
import os
import sys
from dataclasses import dataclass
from typing import Callable, Dict, List

#: The extension needs the change (its options, option checks, loading its checkpoints).
NEEDED = "needed"
#: The change fixes a crash or a silent loss or corruption of data of stock OpenNMT-py 3.5.1.
FIX = "fix"
#: The change only improves what a user is told (a one-line error, a clearer message, a warnings filter).
MESSAGE = "message"
#: The change removes a host stall of stock OpenNMT-py's training; same data, same numbers (tested).
SPEED = "speed"
KINDS = (NEEDED, FIX, MESSAGE, SPEED)
#: Former name of :data:`MESSAGE` (a warnings filter is a message-only change).
QUIET = MESSAGE

#: The OpenNMT-py versions whose internals the patches are written and tested against.
SUPPORTED = ("3.5.1",)


class UnsupportedVersion(RuntimeError):
    """OpenNMT-py's version is not one of :data:`SUPPORTED`; the message is one line."""


@dataclass(frozen=True)
class Patch:
    """One change made to OpenNMT-py.

    Attributes:
        target: dotted name of what was replaced, e.g. ``onmt.trainer.Trainer.train``.
        kind: :data:`NEEDED`, :data:`FIX`, :data:`MESSAGE` or :data:`SPEED`.
        reason: one sentence: what stock does wrong or what the extension needs.
        test: the test that covers it, ``tests/<file>.py::<test name>``.
        order: its place among the layers of one target (0 runs first).
    """

    target: str
    kind: str
    reason: str
    test: str
    order: int = 0

    def line(self, layers=1):
        """One line for ``python -m onmt_ext.hook status`` (``layers``: how many the target has)."""
        layer = f"; layer {self.order} of {layers} on this target, 0 runs first" if layers > 1 else ""
        return f"{self.target} [{self.kind}{layer}]: {self.reason} (test: {self.test})"


@dataclass
class _Target:
    """An attribute that holds one composed wrapper: where it is, what it was, and its layers."""

    owner: object
    attribute: str
    stock: object  # as stored, descriptors unresolved
    owned: bool  # the stock value sat in ``vars(owner)`` (else it was inherited: restored by deleting)
    layers: list  # of (order, replacement, wrap, key)


#: Patches applied in this process, in the order they were applied.
APPLIED: List[Patch] = []
#: ``(target, identity of the replacement)`` of each applied patch (to make :func:`patch` idempotent).
_DONE: Dict[tuple, object] = {}
#: what each target was before its first patch (as stored: descriptors unresolved), by target name
_ORIGINALS: Dict[str, object] = {}
#: the patched attributes, by target name
_TARGETS: Dict[str, _Target] = {}
#: how to undo each change, in the order they were made
_JOURNAL: List[Callable[[], None]] = []
#: where onmt-ext's code lies (see :func:`is_ours`)
_PACKAGE_DIR = os.path.dirname(os.path.abspath(sys.modules[__name__.rpartition(".")[0]].__file__))


def check_version(version=None):
    """Raise :class:`UnsupportedVersion` unless ``version`` (default: ``onmt.__version__``) is supported."""
    if version is None:
        import onmt  # here: importing onmt runs the start-up hook, which needs this module whole

        version = getattr(onmt, "__version__", "unknown")
    if version not in SUPPORTED:
        raise UnsupportedVersion(
            f"OpenNMT-py {version} is not supported (onmt-ext is written for {', '.join(SUPPORTED)}); "
            "OpenNMT-py runs stock, without the extension")


def target_name(owner, attribute):
    """Dotted name of ``owner.attribute`` (``owner`` a module or a class)."""
    module = getattr(owner, "__module__", None)
    if isinstance(owner, type) and module:
        return f"{module}.{owner.__qualname__}.{attribute}"
    return f"{getattr(owner, '__name__', type(owner).__name__)}.{attribute}"


def _check(target, kind, reason, test):
    if kind not in KINDS:
        raise ValueError(f"patch {target}: kind must be one of {KINDS}, not {kind!r}")
    if not (reason and test):
        raise ValueError(f"patch {target}: give the reason and the test that covers it")


def _record(item, undo=None):
    """Add ``item`` to :data:`APPLIED` (once) and journal how to take it out again (after ``undo``)."""
    if item in APPLIED:
        return

    def take_out():
        if undo is not None:
            undo()
        if item in APPLIED:
            APPLIED.remove(item)

    APPLIED.append(item)
    _JOURNAL.append(take_out)


def _identity(replacement):
    """What identifies a replacement across calls: a function's code (closures of one factory share it), or the
    type of any other object."""
    return getattr(replacement, "__code__", None) or type(replacement)


def _raw_attribute(owner, attribute):
    """``owner.attribute`` as stored, descriptors unresolved (for a class: from the first of its MRO that has it)."""
    for holder in getattr(owner, "__mro__", (owner,)):
        stored = vars(holder).get(attribute) if hasattr(holder, "__dict__") else None
        if stored is not None:
            return stored
    return getattr(owner, attribute)


def _link(replacement, inner, stock):
    """``replacement`` with ``inner`` as its stock callable, looking like ``stock`` (name, module, signature)."""

    @functools.wraps(stock)
    def layer(*args, **kwargs):
        return replacement(inner, *args, **kwargs)

    return layer


def _install(name):
    """Set the target's attribute to its layers composed over the stock value (or to the stock value, none left)."""
    target = _TARGETS[name]
    layers = sorted(target.layers, key=lambda layer: layer[0])
    if not layers:
        if target.owned:
            setattr(target.owner, target.attribute, target.stock)
        else:
            delattr(target.owner, target.attribute)
        return
    if not layers[0][2]:  # wrap=False: the replacement itself
        new = layers[0][1]
    else:
        raw = target.stock
        descriptor = type(raw) if isinstance(raw, (classmethod, staticmethod)) else None
        stock = call = raw.__func__ if descriptor else raw
        for _, replacement, _, _ in reversed(layers):
            call = _link(replacement, call, stock)
        call.__wrapped_stock__ = stock
        new = descriptor(call) if descriptor else call
    setattr(target.owner, target.attribute, new)


def patch(owner, attribute, replacement, *, kind, reason, test, wrap=True, order=0):
    """Add ``replacement`` to what ``owner.attribute`` does (once) and record why.

    Args:
        owner: the module or class that holds the attribute.
        attribute: its name.
        replacement: with ``wrap`` a function ``replacement(stock, *args, **kwargs)``, where ``stock`` is the
            next layer (or the stock callable); otherwise the new value itself.
        kind: :data:`NEEDED`, :data:`FIX`, :data:`MESSAGE` or :data:`SPEED`.
        reason: what stock does wrong or what the extension needs (one sentence).
        test: ``tests/<file>.py::<test name>`` of the test that covers the change.
        wrap: call ``replacement`` with the stock callable first (default).
        order: place among the layers of this target, 0 runs first (two layers may not share one).
    Returns:
        the object now at ``owner.attribute``.
    Raises:
        ValueError: a bad kind, no reason or test, or a layer that cannot be composed with the others.
    """
    name = target_name(owner, attribute)
    _check(name, kind, reason, test)
    key = (name, _identity(replacement))
    if key in _DONE:
        return _raw_attribute(owner, attribute)
    target = _TARGETS.get(name)
    if target is not None:
        clash = [layer for layer in target.layers if layer[0] == order or not (wrap and layer[2])]
        if clash:
            raise ValueError(f"patch {name}: {getattr(replacement, '__qualname__', replacement)} cannot join "
                             f"{getattr(clash[0][1], '__qualname__', clash[0][1])} (layer {clash[0][0]}): give each "
                             "layer its own order; a wrap=False replacement must be the only one")
    else:
        raw = _raw_attribute(owner, attribute)
        owned = not isinstance(owner, type) or attribute in vars(owner)
        target = _TARGETS[name] = _Target(owner, attribute, raw, owned, [])
        _ORIGINALS[name] = raw
    layer = (order, replacement, wrap, key)
    target.layers.append(layer)
    _install(name)
    _DONE[key] = _raw_attribute(owner, attribute)

    def undo():
        target.layers.remove(layer)
        _DONE.pop(key, None)
        _install(name)
        if not target.layers:
            del _TARGETS[name]
            _ORIGINALS.pop(name, None)

    _record(Patch(name, kind, reason, test, order), undo)
    return _raw_attribute(owner, attribute)


def add_entry(owner, registry, key, value, *, kind, reason, test):
    """Put ``value`` under ``key`` in the dict ``owner.registry`` (an OpenNMT-py registry) and record why.

    Calling it again changes nothing but the value (the class of a re-executed module replaces the old one).
    A key that holds anything not of onmt-ext raises ``ValueError``.
    Returns ``value``.
    """
    mapping = getattr(owner, registry)
    name = f"{target_name(owner, registry)}[{key!r}]"
    _check(name, kind, reason, test)
    if key in mapping and not is_ours(mapping[key]):
        raise ValueError(f"{name}: already holds {mapping[key]!r}, not put there by onmt-ext")
    recorded = (name, "entry") in _DONE
    mapping[key] = _DONE[(name, "entry")] = value
    if recorded:  # again, or the class of a re-executed module
        return value

    def undo():
        mapping.pop(key, None)
        _DONE.pop((name, "entry"), None)

    _record(Patch(name, kind, reason, test), undo)
    return value


def record(target, *, kind, reason, test, undo=None):
    """Record a change that is not an attribute or a registry entry (e.g. a warnings filter); ``undo`` takes it
    back on :func:`rollback`."""
    _check(target, kind, reason, test)
    if not any(p.target == target and p.reason == reason for p in APPLIED):
        _record(Patch(target, kind, reason, test), undo)


def rollback():
    """Undo every change, newest first: each attribute and registry entry is stock again, the record is empty."""
    while _JOURNAL:
        _JOURNAL.pop()()


@contextlib.contextmanager
def all_or_nothing():
    """Run the block's changes as one: when it raises, :func:`rollback` (everything) and re-raise."""
    try:
        yield
    except BaseException:
        rollback()
        raise


def original(owner, attribute):
    """What ``owner.attribute`` was before onmt-ext patched it (itself when it was never patched)."""
    return _ORIGINALS.get(target_name(owner, attribute), _raw_attribute(owner, attribute))


def targets():
    """``{target name: (owner, attribute, stock value as stored)}`` of every patched attribute."""
    return {name: (t.owner, t.attribute, t.stock) for name, t in _TARGETS.items()}


def is_ours(value):
    """True when ``value`` (a function, descriptor, class or other object) is defined in onmt-ext's code."""
    value = getattr(value, "__func__", value)
    code = getattr(value, "__code__", None)
    if code is not None:
        return os.path.abspath(code.co_filename).startswith(_PACKAGE_DIR + os.sep)
    module = getattr(value if isinstance(value, type) else type(value), "__module__", "") or ""
    return module == "onmt_ext" or module.startswith("onmt_ext.")


def applied() -> List[Patch]:
    """The patches applied in this process, in order."""
    return list(APPLIED)


def lines():
    """One line per applied change (:meth:`Patch.line`), the layers of one target together, first first."""
    layers = {}
    for item in APPLIED:
        layers.setdefault(item.target, []).append(item)
    return [item.line(len(group)) for group in layers.values() for item in sorted(group, key=lambda p: p.order)]
