"""The one way onmt-ext changes OpenNMT-py: :func:`patch`, :func:`add_entry`, :func:`record`, and the record of them.

A target holds one wrapper; behaviours that several modules add to it are *layers*, composed by their stated
``order`` (0 runs first, outermost) whatever the call order.  Every change is recorded (target, kind, reason,
test) for ``python -m onmt_ext.hook status`` and can be undone: :func:`rollback` leaves OpenNMT-py stock,
:func:`all_or_nothing` undoes a failed block's own changes, :func:`temporarily` swaps an attribute for a block,
:func:`check_version` refuses an unsupported OpenNMT-py.  ``ONMT_EXT_RUNTIME=stock`` skips the *runtime*
(:func:`runtime_choice`): every SPEED change and the FIX changes declared ``runtime=True``.
A wrapper receives the next layer (or the stock callable) first, ``train(stock, self, ...)`` for
``patch(Trainer, "train", train, kind=FIX, reason=..., test=...)``; ``wrap=False`` installs the replacement as it
is (it must be the target's only layer).  Kinds:
:data:`NEEDED` (the extension cannot work without it), :data:`FIX` (a crash or silent data loss of OpenNMT-py
3.5.1), :data:`MESSAGE` (a clearer message only), :data:`SPEED` (a host stall of training, or of every command's
start-up, removed; same data and numbers).  FIX, MESSAGE and SPEED changes: docs/differences-from-stock.md.
"""

import contextlib
import functools
import os
import sys
from dataclasses import dataclass
from typing import Callable, Dict, List, Tuple

#: The extension needs the change (its options, option checks, loading its checkpoints).
NEEDED = "needed"
#: The change fixes a crash or a silent loss or corruption of data of stock OpenNMT-py 3.5.1.
FIX = "fix"
#: The change only improves what a user is told (a one-line error, a clearer message, a warnings filter).
MESSAGE = "message"
#: The change removes a host stall of stock OpenNMT-py's training (or of every command's start-up); same data, same
#: numbers (tested).
SPEED = "speed"
KINDS = (NEEDED, FIX, MESSAGE, SPEED)

#: The environment variable that switches onmt-ext's runtime off (:func:`runtime_choice`).
RUNTIME_VARIABLE = "ONMT_EXT_RUNTIME"
RUNTIME_CHOICES = ("ext", "stock")

#: The OpenNMT-py versions whose internals the patches are written and tested against.
SUPPORTED = ("3.5.1",)


class UnsupportedVersion(RuntimeError):
    """OpenNMT-py's version is not one of :data:`SUPPORTED`; the message is one line."""


class RollbackError(RuntimeError):
    """:func:`rollback` could not undo some changes (it undid all the others); the message names them, one line."""


@dataclass(frozen=True)
class Patch:
    """One change made to OpenNMT-py.

    Attributes:
        target: dotted name of what was replaced, e.g. ``onmt.trainer.Trainer.train``.
        kind: :data:`NEEDED`, :data:`FIX`, :data:`MESSAGE` or :data:`SPEED`.
        reason: one sentence: what stock does wrong or what the extension needs.
        test: the test that covers it, ``tests/<file>.py::<test name>``.
        order: its place among the layers of one target (0 runs first).
        runtime: part of onmt-ext's runtime, which ``ONMT_EXT_RUNTIME=stock`` skips (:func:`runtime_choice`).
    """

    target: str
    kind: str
    reason: str
    test: str
    order: int = 0
    runtime: bool = False

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
#: Runtime changes that ``ONMT_EXT_RUNTIME=stock`` kept out (not applied), in the order they were asked for.
SKIPPED: List[Patch] = []
#: ``(target, identity of the replacement)`` of each applied patch (to make :func:`patch` idempotent).
_DONE: Dict[tuple, object] = {}
#: what each target was before its first patch (as stored: descriptors unresolved), by target name
_ORIGINALS: Dict[str, object] = {}
#: the patched attributes, by target name
_TARGETS: Dict[str, _Target] = {}
#: ``(change, how to undo it)`` of each change, in the order they were made
_JOURNAL: List[Tuple[Patch, Callable[[], None]]] = []
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


def runtime_choice():
    """``ONMT_EXT_RUNTIME``: ``ext`` (unset: onmt-ext's runtime) or ``stock`` (stock OpenNMT-py's data path and
    training step, every mechanism kept: the changes of the runtime are not applied).  The runtime is every SPEED
    change and every FIX declared ``runtime=True``: a change, needed by no mechanism and not a message, to how a
    training run that stock finishes reads, builds, moves or steps on its batches.  Raises ``ValueError`` (one
    line) for any other value."""
    value = os.environ.get(RUNTIME_VARIABLE, "").strip() or RUNTIME_CHOICES[0]
    if value not in RUNTIME_CHOICES:
        raise ValueError(f"{RUNTIME_VARIABLE}={value!r} is not one of {', '.join(RUNTIME_CHOICES)}")
    return value


def _skipped(item):
    """True when ``item`` is of the runtime and ``ONMT_EXT_RUNTIME=stock`` (then listed in :data:`SKIPPED`); a value
    the variable cannot take counts as unset (the commands refuse it while parsing)."""
    try:
        stock = item.runtime and runtime_choice() == "stock"
    except ValueError:
        return False
    if stock and item not in SKIPPED:
        SKIPPED.append(item)
    return stock


def _entry(target, kind, reason, test, order=0, runtime=False):
    """The checked :class:`Patch`: a known kind, a reason and a test; SPEED is always of the runtime, and only
    FIX and SPEED can be."""
    if kind not in KINDS:
        raise ValueError(f"patch {target}: kind must be one of {KINDS}, not {kind!r}")
    if not (reason and test):
        raise ValueError(f"patch {target}: give the reason and the test that covers it")
    if runtime and kind not in (FIX, SPEED):
        raise ValueError(f"patch {target}: only a FIX or SPEED change can be of the runtime, not a {kind} one")
    return Patch(target, kind, reason, test, order, runtime or kind == SPEED)


def _record(item, undo=None):
    """Add ``item`` to :data:`APPLIED` (once) and journal how to take it out again (after ``undo``)."""
    if item in APPLIED:
        return

    def take_out():
        try:
            if undo is not None:
                undo()
        finally:
            if item in APPLIED:
                APPLIED.remove(item)

    APPLIED.append(item)
    _JOURNAL.append((item, take_out))


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


def patch(owner, attribute, replacement, *, kind, reason, test, wrap=True, order=0, runtime=False):
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
        runtime: a FIX of onmt-ext's runtime (SPEED always is): not applied under ``ONMT_EXT_RUNTIME=stock``.
    Returns:
        the object now at ``owner.attribute``.
    Raises:
        ValueError: a bad kind, no reason or test, or a layer that cannot be composed with the others.
    """
    name = target_name(owner, attribute)
    item = _entry(name, kind, reason, test, order, runtime)
    key = (name, _identity(replacement))
    if key in _DONE or _skipped(item):
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

    _record(item, undo)
    return _raw_attribute(owner, attribute)


def add_entry(owner, registry, key, value, *, kind, reason, test):
    """Put ``value`` under ``key`` in the dict ``owner.registry`` (an OpenNMT-py registry) and record why.

    Calling it again changes nothing but the value (the class of a re-executed module replaces the old one).
    A key that holds anything not of onmt-ext raises ``ValueError``.
    Returns ``value``.
    """
    mapping = getattr(owner, registry)
    name = f"{target_name(owner, registry)}[{key!r}]"
    item = _entry(name, kind, reason, test)
    if key in mapping and not is_ours(mapping[key]):
        raise ValueError(f"{name}: already holds {mapping[key]!r}, not put there by onmt-ext")
    recorded = (name, "entry") in _DONE
    mapping[key] = _DONE[(name, "entry")] = value
    if recorded:  # again, or the class of a re-executed module
        return value

    def undo():
        mapping.pop(key, None)
        _DONE.pop((name, "entry"), None)

    _record(item, undo)
    return value


def record(target, *, kind, reason, test, undo=None, runtime=False):
    """Record a change already made that is not an attribute or a registry entry (e.g. a warnings filter);
    ``undo`` takes it back on :func:`rollback`, or at once when it is of the runtime (``runtime``, or SPEED) and
    ``ONMT_EXT_RUNTIME=stock``.  Returns whether the change stays."""
    item = _entry(target, kind, reason, test, runtime=runtime)
    if _skipped(item):
        if undo is not None:
            undo()
        return False
    if not any(p.target == target and p.reason == reason for p in APPLIED):
        _record(item, undo)
    return True


def rollback(mark=0):
    """Undo every change made since :func:`mark` returned ``mark`` (default: all of them), newest first: each
    attribute and registry entry is as it was then, and so is the record.

    An undo that raises does not stop the others: they all run, then :class:`RollbackError` names each change
    whose undo failed (it is out of the record all the same).
    """
    failed = []
    while len(_JOURNAL) > mark:
        item, take_out = _JOURNAL.pop()
        try:
            take_out()
        except Exception as error:
            first = (str(error).strip().splitlines() or [""])[0]
            failed.append(f"{item.target} ({type(error).__name__}: {first})")
    if not mark:
        SKIPPED.clear()
    if failed:
        raise RollbackError(f"could not undo {len(failed)} change(s), the others are undone: {'; '.join(failed)}")


def mark():
    """Where the record stands now: :func:`rollback` of the result undoes only the changes made after this call."""
    return len(_JOURNAL)


@contextlib.contextmanager
def all_or_nothing():
    """Run the block's changes as one: when it raises, undo the changes the block made (those made before it stay)
    and re-raise; an undo that fails raises :class:`RollbackError`, caused by the block's error."""
    start = mark()
    try:
        yield
    except BaseException as error:
        try:
            rollback(start)
        except RollbackError as failed:
            raise failed from error
        raise


class temporarily:  # noqa: N801 (used as a function: ``with temporarily(owner, attribute, value):``)
    """Context: ``owner.attribute`` is ``value`` inside the block; leaving puts back what was stored there (deletes
    the attribute when it was inherited or absent), unless something else replaced ``value`` meanwhile: only what
    this block changed is undone.  Cheap enough for a hot path; one instance per ``with``."""

    __slots__ = ("owner", "attribute", "value", "saved")

    def __init__(self, owner, attribute, value):
        self.owner, self.attribute, self.value = owner, attribute, value

    def __enter__(self):
        self.saved = vars(self.owner).get(self.attribute, _ABSENT)
        setattr(self.owner, self.attribute, self.value)
        return self.value

    def __exit__(self, *exc):
        if vars(self.owner).get(self.attribute, _ABSENT) is self.value:
            if self.saved is _ABSENT:
                delattr(self.owner, self.attribute)
            else:
                setattr(self.owner, self.attribute, self.saved)
        return False


_ABSENT = object()


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
