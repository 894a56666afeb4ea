"""Start-up hook that loads onmt-ext into the stock OpenNMT-py commands.

``python -m onmt_ext.hook install`` writes a one-line ``onmt_ext.pth`` into site-packages, which imports this
module at Python start-up; it only installs an import hook.  The first time ``onmt`` is imported, the hook

1. *before* ``onmt`` runs: applies :func:`onmt_ext.runtime.compat.apply` (import-time warnings, the ``torch.load``
   allow-list, stand-ins for a missing spaCy or fasttext, an installed one imported on first use);
2. *after* ``onmt`` has run: calls :func:`onmt_ext.integration.plugin.activate`.

A failure in either step prints one line, with how to switch the extension off, and leaves ``onmt`` stock
(:func:`~onmt_ext.integration.plugin.activate` undoes every change it made); an unsupported OpenNMT-py version is said
in one line.  ``ONMT_EXT_DISABLE=1`` switches the extension off but for the ``torch.load`` allow-list of
``argparse.Namespace``, without which OpenNMT-py 3.5.1 cannot load any checkpoint, and a ``sys.excepthook`` that
says in one line that a model of onmt-ext needs it (:func:`_compatibility_only`).
``python -m onmt_ext.hook status`` lists every change.
"""

import importlib.abc
import importlib.util
import os
import sys

# onmt_ext.runtime.compat and onmt_ext.integration.plugin are imported inside the functions: this module runs at every
# Python start-up, which must stay quick (plugin imports torch) and must not fail (their failures are reported in one
# line).

DISABLE_ENV = "ONMT_EXT_DISABLE"


def disabled():
    """True when the user switched the extension off with ``ONMT_EXT_DISABLE``."""
    return os.environ.get(DISABLE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _report_failure(stage, exc):
    sys.stderr.write(
        f"onmt-ext: could not {stage} ({type(exc).__name__}: {exc}).\n"
        f"onmt-ext: OpenNMT-py continues without the extension; "
        f"set {DISABLE_ENV}=1 to silence this message.\n"
    )


def _before_onmt():
    try:
        from onmt_ext.runtime import compat

        compat.apply()
        compat.stand_in_for_missing_packages()  # only while onmt is imported (see _after_onmt)
        compat.defer_optional_packages()  # the installed ones: imported on first use
    except Exception as exc:  # never break plain OpenNMT-py
        _report_failure("apply the torch compatibility fixes", exc)


def _compatibility_only():
    """With the extension disabled: only let ``torch.load`` read OpenNMT-py checkpoints (their options are an
    ``argparse.Namespace``), and say in one line that a model of onmt-ext needs it
    (:func:`onmt_ext.hook.explain_disabled_extension`); nothing of OpenNMT-py is changed."""
    try:
        from onmt_ext.runtime import compat

        compat.allow_checkpoint_classes()
    except Exception as exc:  # never break plain OpenNMT-py
        _report_failure("allow OpenNMT-py checkpoints in torch.load", exc)
    try:
        from onmt_ext import hook

        hook.explain_disabled_extension()
    except Exception as exc:  # never break plain OpenNMT-py
        _report_failure("install its one-line message for models of onmt-ext", exc)


def _after_onmt():
    global _deferred
    try:
        from onmt_ext.runtime import compat

        compat.drop_stand_ins()  # onmt's modules keep theirs; later imports see the truth
    except Exception as exc:  # never break plain OpenNMT-py
        _report_failure("tidy up after the torch compatibility fixes", exc)
    if _initialising(IMPORTING_ONMT):  # importing one of them imported onmt; activation needs it whole
        _deferred = True
        return
    _activate()


#: onmt-ext's modules that import onmt while they initialise and that activation imports (the models, the
#: transforms it registers): when one of them is what imports onmt, activation waits for its end, where each calls
#: :func:`activate_deferred` (tests/unit/test_plugin.py checks the list and the calls)
IMPORTING_ONMT = ("onmt_ext.integration.transformer", "onmt_ext.mechanisms.clause.split",
                  "onmt_ext.integration.zh_segment")
_deferred = False


def _initialising(names):
    """True while one of the modules ``names`` is being executed by its import."""
    modules = (sys.modules.get(name) for name in names)
    return any(getattr(getattr(module, "__spec__", None), "_initializing", False) for module in modules)


def activate_deferred(caller):
    """The last line of each of :data:`IMPORTING_ONMT` (``caller``, its ``__name__``): the activation that its
    ``import onmt`` postponed, once no other of them is still initialising (the outermost one activates)."""
    global _deferred
    if _deferred and not _initialising([name for name in IMPORTING_ONMT if name != caller]):
        _deferred = False
        _activate()


def _activate():
    try:
        from onmt_ext.integration import plugin

        plugin.activate()  # all or nothing: a failure leaves onmt stock
    except Exception as exc:  # never break plain OpenNMT-py
        if type(exc).__name__ == "UnsupportedVersion":  # onmt_ext.patches': one line says it all
            sys.stderr.write(f"onmt-ext: {exc}; set {DISABLE_ENV}=1 to silence this message.\n")
        else:
            _report_failure("register with OpenNMT-py", exc)


class _HookedLoader(importlib.abc.Loader):
    """Wraps the real loader of ``onmt`` to run our steps around its execution."""

    def __init__(self, loader, finder):
        self._loader, self._finder = loader, finder
        self._only_compatibility = finder.only_compatibility

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        # ``module.__loader__`` is this proxy; give the real one back so that
        # resource readers and tracebacks see the stock loader.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        if self._finder in sys.meta_path:  # onmt is being imported: the finder's work is done
            sys.meta_path.remove(self._finder)
        if self._only_compatibility:
            _compatibility_only()
            self._loader.exec_module(module)
            return
        _before_onmt()
        self._loader.exec_module(module)
        _after_onmt()

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _OnmtFinder(importlib.abc.MetaPathFinder):
    """Wraps the loader of the top-level ``onmt`` package; leaves ``sys.meta_path`` once ``onmt`` is imported
    (a mere ``importlib.util.find_spec("onmt")`` keeps it in place)."""

    _searching = False

    def __init__(self, only_compatibility=False):
        self.only_compatibility = only_compatibility  # ONMT_EXT_DISABLE: the torch.load allow-list, nothing else

    def find_spec(self, fullname, path, target=None):
        if fullname != "onmt" or self._searching:
            return None
        self._searching = True  # the other finders' spec, without coming back here
        try:
            spec = importlib.util.find_spec("onmt")
        finally:
            self._searching = False
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _HookedLoader(spec.loader, self)
        return spec


def install():
    """Arrange for onmt-ext to load with ``onmt`` (disabled: only :func:`_compatibility_only`); idempotent, cheap."""
    off = disabled()
    if "onmt" in sys.modules:  # onmt came first: act now
        if off:
            _compatibility_only()
            return
        _before_onmt()
        _after_onmt()
        return
    if not any(isinstance(f, _OnmtFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _OnmtFinder(only_compatibility=off))


install()
