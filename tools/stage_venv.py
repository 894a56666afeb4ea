#!/usr/bin/env python3
"""Make (or check) a venv that uses the torch of the Python running this script, wherever that torch lives.

Usage, as `make setup SYSTEM_TORCH=1` and `tools/gpu_stage.sh` run it::

    $PYTHON -m tools.stage_venv [--prog NAME] [--var NAME] [--hint TEXT] [--no-torch-hint TEXT]
                                [--allow-without-pip] VENV

How it works and why: docs/tools.md (stage_venv.py).
"""

import json
import os
import shlex
import subprocess
import sys

from tools import common

PTH_NAME = "_onmt_ext_parent_env.pth"

# sys.path without PYTHONPATH, the user's site-packages or the current directory (-I), and where packages go.
_PATHS = ("import json, sys, sysconfig; print(json.dumps({'path': sys.path, 'prefix': sys.prefix, "
          "'base_prefix': sys.base_prefix, 'version': '%d.%d' % sys.version_info[:2], "
          "'purelib': sysconfig.get_paths()['purelib']}))")
_TORCH = ("import json, os, torch; print(json.dumps([os.path.realpath(torch.__file__), torch.__file__, "
          "torch.__version__, torch.version.cuda]))")


class StageError(Exception):
    """A one-line reason why the venv cannot be made or used."""


def _last_line(text):
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else "no message"


def interpreter(python):
    """The isolated sys.path, prefixes, version and purelib of ``python``."""
    result = subprocess.run([python, "-I", "-c", _PATHS], capture_output=True, text=True)
    if result.returncode != 0:
        raise StageError(f"{python} does not run ({_last_line(result.stderr)})")
    return json.loads(result.stdout)


def torch_of(python):
    """(realpath and path of torch/__init__.py, version, CUDA version) as ``python`` imports it; or None and why."""
    result = subprocess.run([python, "-c", _TORCH], capture_output=True, text=True)
    if result.returncode != 0:
        return None, _last_line(result.stderr)
    return tuple(json.loads(result.stdout.strip().splitlines()[-1])), None


def kind_of(info):
    """What kind of environment an interpreter belongs to, for the messages."""
    if os.path.realpath(info["prefix"]) != os.path.realpath(info["base_prefix"]):
        return f"venv {info['prefix']}"
    if os.path.isdir(os.path.join(info["prefix"], "conda-meta")):
        return f"conda environment {info['prefix']}"
    return f"installation {info['prefix']}"


def venv_python(venv):
    return os.path.join(venv, "bin", "python")


def system_site_packages(venv):
    """Whether VENV/pyvenv.cfg says include-system-site-packages = true."""
    with open(os.path.join(venv, "pyvenv.cfg"), encoding="utf-8") as handle:
        for line in handle:
            key, _, value = line.partition("=")
            if key.strip().lower() == "include-system-site-packages":
                return value.strip().lower() == "true"
    return False


def ensure_venv(venv, parent, var, allow_without_pip, hint=None):
    """Create VENV from this interpreter, or check that the existing one fits; returns its interpreter info."""
    hint = hint or f"remove it (rm -r {venv}) or pick another {var}="
    if os.path.exists(os.path.join(venv, "pyvenv.cfg")):
        if not system_site_packages(venv):
            raise StageError(f"{venv} exists without the system's site-packages; {hint}")
        if not os.access(venv_python(venv), os.X_OK):
            raise StageError(f"{venv} has no bin/python; {hint}")
        info = interpreter(venv_python(venv))
        if (info["version"], os.path.realpath(info["base_prefix"])) != (
                parent["version"], os.path.realpath(parent["base_prefix"])):
            raise StageError(f"{venv} was made from Python {info['version']} in {info['base_prefix']}, not from "
                             f"{sys.executable}'s base (Python {parent['version']} in {parent['base_prefix']}); {hint}")
        return info
    if os.path.exists(venv) and (not os.path.isdir(venv) or os.listdir(venv)):
        raise StageError(f"{venv} exists and is not a venv; pick another {var}=")
    command = [sys.executable, "-m", "venv", "--system-site-packages", venv]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0 and allow_without_pip:
        result = subprocess.run(command[:-1] + ["--without-pip", venv], capture_output=True, text=True)
    if result.returncode != 0:
        raise StageError(f"could not create a venv with {sys.executable} ({_last_line(result.stderr)})")
    return interpreter(venv_python(venv))


def link_parent(venv, parent, info):
    """Write (or remove) the .pth file with the entries of the parent's sys.path that VENV lacks.

    Returns the .pth path, or None when VENV sees everything already (plain or conda Python).
    """
    pth = os.path.join(info["purelib"], PTH_NAME)
    if os.path.exists(pth):  # our own file from an earlier run: VENV's sys.path without it
        os.remove(pth)
        info = interpreter(venv_python(venv))
    own = set(info["path"])
    extra = [p for p in parent["path"] if p and p not in own and os.path.exists(p)]
    if not extra:
        return None
    with open(pth, "w", encoding="utf-8") as handle:
        handle.write(f"# written by tools/stage_venv.py: what {sys.executable} ({kind_of(parent)}) has on sys.path\n")
        handle.write("# and this venv would not see; its torch is the one used here.\n")
        handle.writelines(p + "\n" for p in extra)
    return pth


def stage(venv, var="VENV", allow_without_pip=False, hint=None, no_torch_hint=None):
    """Steps 1-4 of docs/tools.md (stage_venv.py); returns the line that says which torch VENV uses.

    ``no_torch_hint``: what else to do when this Python has no torch, after installing torch into it.
    """
    parent = interpreter(sys.executable)
    torch_parent, why = torch_of(sys.executable)
    if torch_parent is None:
        install = f"{shlex.quote(sys.executable)} -m pip install torch"
        raise StageError(f"'import torch' fails with {sys.executable}, the {kind_of(parent)} ({why}); install torch "
                         f"into it ({install}){', or ' + no_torch_hint if no_torch_hint else ''}")
    info = ensure_venv(venv, parent, var, allow_without_pip, hint)
    pth = link_parent(venv, parent, info)
    torch_venv, why = torch_of(venv_python(venv))
    if torch_venv is None:
        raise StageError(f"the venv {venv} does not see the torch of {sys.executable} ({why})")
    if torch_venv[0] != torch_parent[0]:
        raise StageError(f"the venv {venv} imports torch from {os.path.dirname(torch_venv[1])}, not the one of "
                         f"{sys.executable} ({os.path.dirname(torch_parent[1])})")
    _, path, version, cuda = torch_parent
    how = f"through {pth}" if pth else "through its system site-packages"
    return (f"torch {version} (CUDA {cuda or 'none'}) from {os.path.dirname(path)}, the torch of {sys.executable} "
            f"({kind_of(parent)}); {venv} sees it {how}")


def main(argv=None):
    parser = common.Parser(description=__doc__.split("\n")[0])
    parser.add_argument("venv")
    parser.add_argument("--prog", default="stage_venv.py", help="name in front of messages (default %(default)s)")
    parser.add_argument("--var", default="VENV", help="the caller's variable for the venv folder, for hints")
    parser.add_argument("--hint", help="what to do when an existing venv does not fit (default: remove it or "
                        "pick another --var)")
    parser.add_argument("--no-torch-hint", help="what else to do when this Python has no torch (after installing "
                        "torch into it)")
    parser.add_argument("--allow-without-pip", action="store_true",
                        help="create the venv without pip if ensurepip is missing")
    args = parser.parse_args(argv)
    try:
        line = stage(args.venv, args.var, args.allow_without_pip, args.hint, args.no_torch_hint)
    except StageError as error:
        print(f"{args.prog}: error: {error}", file=sys.stderr)
        return 2
    print(f"== {args.prog}: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
