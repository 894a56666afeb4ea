"""The one way onmt-ext changes OpenNMT-py: :func:`patch`, and the record of what it changed.

:func:`patch` replaces ``owner.attribute`` once (a second call is a no-op), keeps ``classmethod``/``staticmethod``
descriptors, and records target, kind, reason and test in :data:`APPLIED` for ``python -m onmt_ext.hook status``.
A wrapper (the default) receives the stock callable first; ``wrap=False`` installs the replacement as it is::

    patch(Trainer, "train", train, kind=FIX, reason="...", test="tests/...::test_x")

    def train(stock, self, train_iter, train_steps, **kwargs):
        return stock(self, train_iter, train_steps, **kwargs)

Kinds: :data:`NEEDED` (the extension cannot work without it), :data:`FIX` (a crash or silent data loss of
OpenNMT-py 3.5.1), :data:`QUIET` (a warnings filter), :data:`SPEED` (a host stall of training removed, same data
and numbers).  Every FIX, QUIET and SPEED change is described in docs/differences-from-stock.md.
"""

import functools
from dataclasses import dataclass
from typing import Dict, List

#: The extension needs the change (its options, option checks, loading its checkpoints).
NEEDED = "needed"
#: The change fixes a crash or a silent loss of data of stock OpenNMT-py 3.5.1.
FIX = "fix"
#: The change filters warnings about OpenNMT-py's own code that a user cannot act on.
QUIET = "quiet"
#: The change removes a host stall of stock OpenNMT-py's training; same data, same numbers (tested).
SPEED = "speed"
KINDS = (NEEDED, FIX, QUIET, SPEED)


@dataclass(frozen=True)
class Patch:
    """One change made to OpenNMT-py.

    Attributes:
        target: dotted name of what was replaced, e.g. ``onmt.trainer.Trainer.train``.
        kind: :data:`NEEDED`, :data:`FIX`, :data:`QUIET` or :data:`SPEED`.
        reason: one sentence: what stock does wrong or what the extension needs.
        test: the test that covers it, ``tests/<file>.py::<test name>``.
    """

    target: str
    kind: str
    reason: str
    test: str

    def line(self):
        """One line for ``python -m onmt_ext.hook status``."""
        return f"{self.target} [{self.kind}]: {self.reason} (test: {self.test})"


#: Patches applied in this process, in the order they were applied.
APPLIED: List[Patch] = []
#: ``(target, identity of the replacement)`` of each applied patch (to make :func:`patch` idempotent).
_DONE: Dict[tuple, object] = {}
#: what each target was before its first patch (as stored: descriptors unresolved), by target name
_ORIGINALS: Dict[str, object] = {}


def target_name(owner, attribute):
    """Dotted name of ``owner.attribute`` (``owner`` a module or a class)."""
    module = getattr(owner, "__module__", None)
    if isinstance(owner, type) and module:
        return f"{module}.{owner.__qualname__}.{attribute}"
    return f"{getattr(owner, '__name__', type(owner).__name__)}.{attribute}"


def _record(target, kind, reason, test):
    _check(target, kind, reason, test)
    if not any(p.target == target and p.reason == reason for p in APPLIED):
        APPLIED.append(Patch(target, kind, reason, test))


def _identity(replacement):
    """What identifies a replacement across calls: a function's code (closures of one factory share it), or the
    type of any other object."""
    return getattr(replacement, "__code__", None) or type(replacement)


def _check(target, kind, reason, test):
    if kind not in KINDS:
        raise ValueError(f"patch {target}: kind must be one of {KINDS}, not {kind!r}")
    if not (reason and test):
        raise ValueError(f"patch {target}: give the reason and the test that covers it")


def _raw_attribute(owner, attribute):
    """``owner.attribute`` as stored, descriptors unresolved (for a class: from the first of its MRO that has it)."""
    for holder in getattr(owner, "__mro__", (owner,)):
        stored = vars(holder).get(attribute) if hasattr(holder, "__dict__") else None
        if stored is not None:
            return stored
    return getattr(owner, attribute)


def patch(owner, attribute, replacement, *, kind, reason, test, wrap=True):
    """Replace ``owner.attribute`` with ``replacement`` (once) and record why.

    Args:
        owner: the module or class that holds the attribute.
        attribute: its name.
        replacement: with ``wrap`` a function ``replacement(stock, *args, **kwargs)``;
            otherwise the new value itself.
        kind: :data:`NEEDED`, :data:`FIX`, :data:`QUIET` or :data:`SPEED`.
        reason: what stock does wrong or what the extension needs (one sentence).
        test: ``tests/<file>.py::<test name>`` of the test that covers the change.
        wrap: call ``replacement`` with the stock callable first (default).
    Returns:
        the object now at ``owner.attribute`` (unchanged when this
        replacement was applied to this target already).
    """
    target = target_name(owner, attribute)
    _check(target, kind, reason, test)
    key = (target, _identity(replacement))
    raw = _raw_attribute(owner, attribute)
    if key in _DONE:
        return raw
    if wrap:
        descriptor = type(raw) if isinstance(raw, (classmethod, staticmethod)) else None
        stock = raw.__func__ if descriptor else raw

        @functools.wraps(stock)
        def wrapper(*args, **kwargs):
            return replacement(stock, *args, **kwargs)

        wrapper.__wrapped_stock__ = stock
        new = descriptor(wrapper) if descriptor else wrapper
    else:
        new = replacement
    _ORIGINALS.setdefault(target, raw)
    setattr(owner, attribute, new)
    _DONE[key] = new
    _record(target, kind, reason, test)
    return new


def record(target, *, kind, reason, test):
    """Record a change that is not an attribute replacement (e.g. a warnings filter)."""
    _record(target, kind, reason, test)


def original(owner, attribute):
    """What ``owner.attribute`` was before onmt-ext patched it (itself when it was never patched)."""
    return _ORIGINALS.get(target_name(owner, attribute), _raw_attribute(owner, attribute))


def applied() -> List[Patch]:
    """The patches applied in this process, in order."""
    return list(APPLIED)
