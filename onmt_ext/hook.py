"""Install, remove or inspect the start-up hook that loads onmt-ext into ``onmt``.

Usage::

    python -m onmt_ext.hook install     # write onmt_ext.pth into site-packages
    python -m onmt_ext.hook uninstall   # remove it (stock OpenNMT-py again)
    python -m onmt_ext.hook status      # is it installed, and what it changes in OpenNMT-py

The hook is one line in ``<site-packages>/onmt_ext.pth``.  It imports
:mod:`onmt_ext._autoload` only if ``onmt_ext`` is importable, so a removed
package never breaks Python start-up.  ``ONMT_EXT_DISABLE=1`` switches the
extension off without uninstalling anything.
"""

import argparse
import collections
import os
import sys
import sysconfig
import traceback

from onmt_ext import patches
from onmt_ext.options import EXT_TYPE

# onmt_ext._autoload, onmt and onmt_ext.integration.plugin are imported in print_patches: importing _autoload installs
# the start-up hook (and activates onmt-ext if onmt is already imported), and onmt with plugin take seconds, which
# install and uninstall do without.

PTH_NAME = "onmt_ext.pth"
PTH_LINE = (
    "import importlib.util as _u; "
    "_u.find_spec('onmt_ext') is not None and __import__('onmt_ext._autoload')\n"
)


def pth_path():
    """Path of the hook file in this interpreter's site-packages (purelib)."""
    return os.path.join(sysconfig.get_paths()["purelib"], PTH_NAME)


def install():
    """Write the hook file; returns True if it changed anything."""
    path = pth_path()
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            if handle.read() == PTH_LINE:
                return False
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(PTH_LINE)
    return True


def uninstall():
    """Remove the hook file; returns True if there was one."""
    path = pth_path()
    if os.path.exists(path):
        os.remove(path)
        return True
    return False


#: Where a model of onmt-ext fails to build while onmt-ext is off: OpenNMT-py's registry look-ups, by function.
_BUILDERS = {"build_encoder": "-encoder_type", "build_decoder": "-decoder_type"}


def disabled_extension_message(error, tb):
    """The line for ``error`` (with traceback ``tb``) when it is OpenNMT-py failing to build an onmt-ext model
    because ``ONMT_EXT_DISABLE`` switched onmt-ext off: ``<command>: error: ...``; None for any other error."""
    # _autoload: importing it installs the start-up hook (see above); commands imports torch: only once an error is
    # explained
    from onmt_ext._autoload import DISABLE_ENV
    from onmt_ext.integration.commands import COMMANDS, main_module

    frames = [frame for frame, _ in traceback.walk_tb(tb)]
    last = frames[-1].f_code if frames else None
    if not (isinstance(error, KeyError) and error.args == (EXT_TYPE,) and last is not None
            and last.co_name in _BUILDERS and last.co_filename.endswith(os.path.join("onmt", "model_builder.py"))):
        return None
    side = _BUILDERS[last.co_name]
    checkpoint = next((frame.f_locals["model_path"] for frame in frames if frame.f_code.co_name == "load_test_model"
                       and frame.f_locals.get("model_path")), None)
    checkpoint = checkpoint or next((getattr(frame.f_locals.get("opt"), "train_from", None) for frame in frames
                                     if getattr(frame.f_locals.get("opt"), "train_from", None)), None)
    prog = COMMANDS.get(main_module()) or os.path.basename(sys.argv[0] if sys.argv and sys.argv[0] else "python")
    switch = f"{DISABLE_ENV}={os.environ.get(DISABLE_ENV, '')}"
    if checkpoint:
        return (f"{prog}: error: checkpoint {checkpoint} needs onmt-ext: it was trained with {side} {EXT_TYPE}, "
                f"onmt-ext's model, and {switch} switches onmt-ext off; unset {DISABLE_ENV} to load it")
    return (f"{prog}: error: {side} {EXT_TYPE} is onmt-ext's model, and {switch} switches onmt-ext off; unset "
            f"{DISABLE_ENV} to use it")


def explain_disabled_extension():
    """With ``ONMT_EXT_DISABLE``: a model of onmt-ext that OpenNMT-py cannot build (its uncaught ``KeyError:
    'ext_transformer'``) ends in one line naming the variable (:func:`disabled_extension_message`), exit 1.

    A ``sys.excepthook``: nothing of OpenNMT-py is changed, every other error is printed as before.
    """
    before = sys.excepthook

    def hook(error_type, error, tb):
        try:
            line = disabled_extension_message(error, tb)
        except Exception:  # never hide the error itself
            line = None
        if line is None:
            before(error_type, error, tb)
        else:
            sys.stderr.write(line + "\n")

    def undo():
        if sys.excepthook is hook:
            sys.excepthook = before

    sys.excepthook = hook
    patches.record("sys.excepthook (a model of onmt-ext while ONMT_EXT_DISABLE is set)", kind=patches.MESSAGE, undo=undo,
           reason="with onmt-ext switched off, a checkpoint or config of ext_transformer ends in a traceback "
                  "ending in KeyError: 'ext_transformer'",
           test="tests/integration/test_checkpoints_cli.py::test_disabled_extension_names_itself_for_its_own_model")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m onmt_ext.hook", description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=["install", "uninstall", "status"])
    args = parser.parse_args(argv)
    path = pth_path()
    if args.action == "install":
        print(f"{'installed' if install() else 'already installed'}: {path}")
    elif args.action == "uninstall":
        print(f"{'removed' if uninstall() else 'not installed'}: {path}")
    else:
        try:
            patches.runtime_choice()
        except ValueError as error:  # activation would take it for unset, the commands refuse it: say so first
            print(f"{parser.prog}: error: {error}", file=sys.stderr)
            return 2
        print(f"{'installed' if os.path.exists(path) else 'not installed'}: {path}")
        print_patches()
    return 0


def print_patches(out=None):
    """Print the changes onmt-ext makes to OpenNMT-py, one per line (see :mod:`onmt_ext.patches`).

    Each line starts with a column: ``runtime`` for a change of onmt-ext's runtime (:attr:`patches.Patch.runtime`),
    ``skipped`` for one that ``ONMT_EXT_RUNTIME=stock`` left out (:data:`patches.SKIPPED`, listed last), blank for
    the others.  Imports ``onmt`` through the hook (or activates the extension by hand when the hook is not
    installed, to show what it would change).
    """
    out = out or sys.stdout
    from onmt_ext._autoload import DISABLE_ENV, disabled

    if disabled():
        print(f"{DISABLE_ENV} is set: onmt-ext changes nothing in OpenNMT-py; only torch.load is allowed the "
              "argparse.Namespace of OpenNMT-py checkpoints, so that they load, and a sys.excepthook says in one "
              "line that a model of onmt-ext needs onmt-ext", file=out)
        return
    import onmt  # (the hook, when installed, activates the extension)

    if not patches.applied():
        from onmt_ext.integration import plugin

        if not plugin.is_active():
            try:
                plugin.activate()
            except patches.UnsupportedVersion as error:
                print(f"onmt-ext: {error}", file=out)
                return
    applied, skipped = patches.applied(), list(patches.SKIPPED)
    layers = collections.Counter(item.target for item in applied)
    runtime = {item.line(layers[item.target]) for item in applied if item.runtime}  # patches.lines() writes these
    listed = patches.lines()
    mood = "changes" if os.path.exists(pth_path()) else "changes it would make once installed"
    if skipped:
        which = (f"{patches.RUNTIME_VARIABLE}=stock left out the {len(skipped)} of onmt-ext's runtime, marked "
                 "'skipped' and listed last")
    else:
        which = (f"the {len(runtime)} marked 'runtime' are onmt-ext's runtime, which {patches.RUNTIME_VARIABLE}=stock "
                 "leaves out")
    print(f"{len(listed)} {mood} to OpenNMT-py {onmt.__version__} (target [kind]: reason (test)); {which}; "
          "docs/differences-from-stock.md describes each one that is not needed by the extension itself:", file=out)
    for line in listed:
        print(f"  {'runtime' if line in runtime else '':7}  {line}", file=out)
    left_out = collections.Counter(item.target for item in skipped)
    for item in skipped:
        print(f"  skipped  {item.line(left_out[item.target])}", file=out)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # `... status | head`: the reader stopped early
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
