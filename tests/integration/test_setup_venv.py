"""Staging with the machine's torch when that torch lives in a venv or a conda environment (issue 36).

A GPU machine's ``python3`` is often a venv that holds torch.  A venv made from it with
``--system-site-packages`` sees the *base* interpreter's site-packages, not that venv's, so
``tools/gpu_stage.sh`` and ``make setup SYSTEM_TORCH=1`` must add them (tools/stage_venv.py).

The machine is built here from the interpreter that runs the tests, without installing anything:

- ``base``: a copy of the base interpreter (its own prefix, the standard library linked) whose
  site-packages hold a stand-in ``torch`` package, the "other torch" a venv must not pick up;
- ``machine venv``: a venv made from ``base`` whose own site-packages hold the real torch and the project's
  dependencies (links to the entries of the test run's site-packages, onmt-ext left out);
- ``conda-like``: a copy of the base interpreter with those packages in its *own* site-packages and a
  ``conda-meta`` folder, as a conda environment is laid out (its sys.prefix equals sys.base_prefix).

The setup stamp (issue 39): a later ``make setup`` with the same choice, another torch, another PYTHON or
SYSTEM_TORCH, checked with ``make -n`` on a venv folder that holds only a stamp.

The copy of the repository (tracked and new files, ``build/tatoeba`` without the signal tagger) is staged
as it would be on the GPU machine, from a wheelhouse of one small wheel and setuptools.  The slow tier holds
the conda-like case and a fresh venv where pip installs a real torch, for ``make setup SYSTEM_TORCH=1``
against the package index.
"""

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

from support import REPO

VERSION = f"{sys.version_info[0]}.{sys.version_info[1]}"
STANDIN_VERSION = "0.0+base.standin"
PROBE = "onmt_ext_stage_probe"
# what the packages of the test run's site-packages are linked without: onmt-ext itself and its hook
OWN = ("onmt_ext", "__editable__", "_onmt_ext", "__pycache__")

# what a staged venv imports: torch's file and version, the probe wheel's file, and its sys.path
REPORT = ("import json, sys, torch, importlib.util as u; "
          f"probe = u.find_spec('{PROBE}'); "
          "print(json.dumps({'torch': torch.__file__, 'version': torch.__version__, "
          "'probe': probe and probe.origin, 'path': sys.path}))")


def clean_env(**extra):
    """The environment for the staging commands: no PYTHONPATH, no venv or make of the test run."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "GPU_STAGE_ONLY")}
    env.update(extra)
    return env


def run(argv, **kwargs):
    kwargs.setdefault("env", clean_env())
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=600, **kwargs)


def site_packages(prefix):
    return prefix / "lib" / f"python{VERSION}" / "site-packages"


def copy_interpreter(target):
    """A copy of the base interpreter under ``target`` (own prefix; standard library and libpython linked).

    Skips the test where the base interpreter is not laid out as <prefix>/bin/pythonX.Y with
    <prefix>/lib/pythonX.Y, or the copy does not take ``target`` as its prefix.
    """
    base = os.path.realpath(sys.base_prefix)
    executable = os.path.join(base, "bin", f"python{VERSION}")
    stdlib = os.path.join(base, "lib", f"python{VERSION}")
    if not (os.path.isfile(executable) and os.path.isdir(stdlib)):
        pytest.skip(f"the base interpreter {base} is not laid out as bin/python{VERSION} + lib/python{VERSION}")
    (target / "bin").mkdir(parents=True)
    shutil.copy2(executable, target / "bin" / f"python{VERSION}")
    lib = target / "lib"
    (lib / f"python{VERSION}").mkdir(parents=True)
    for name in os.listdir(stdlib):
        if name != "site-packages":
            (lib / f"python{VERSION}" / name).symlink_to(os.path.join(stdlib, name))
    for name in os.listdir(os.path.join(base, "lib")):
        if name.startswith("libpython"):
            (lib / name).symlink_to(os.path.join(base, "lib", name))
    site_packages(target).mkdir()
    python = target / "bin" / f"python{VERSION}"
    prefix = run([python, "-I", "-c", "import sys; print(sys.prefix)"]).stdout.strip()
    if prefix != str(target):
        pytest.skip(f"a copy of {executable} does not take its own folder as its prefix ({prefix!r})")
    return python


def link_packages(target):
    """Link every entry of the test run's site-packages (torch and the dependencies) into ``target``."""
    source = sysconfig.get_paths()["purelib"]
    for name in os.listdir(source):
        if not name.startswith(OWN) and name != "onmt_ext.pth":
            (target / name).symlink_to(os.path.join(source, name))


def standin_torch(target):
    """A stand-in ``torch`` package: what a venv must not import in place of the machine's torch."""
    (target / "torch").mkdir()
    (target / "torch" / "__init__.py").write_text(
        f"import types\n__version__ = {STANDIN_VERSION!r}\nversion = types.SimpleNamespace(cuda=None)\n")


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    """The base interpreter with a stand-in torch, and a venv made from it that holds the real torch."""
    root = tmp_path_factory.mktemp("machine")
    base = copy_interpreter(root / "base")
    standin_torch(site_packages(root / "base"))
    venv = root / "venv"
    made = run([base, "-m", "venv", "--without-pip", venv])
    assert made.returncode == 0, made.stderr
    link_packages(site_packages(venv))
    python = venv / "bin" / "python"
    torch_file = run([python, "-c", "import torch; print(torch.__file__)"]).stdout.strip()
    assert torch_file == str(site_packages(venv) / "torch" / "__init__.py"), torch_file
    return {"base": base, "venv": venv, "python": python, "torch": torch_file}


@pytest.fixture(scope="module")
def repo_copy(tmp_path_factory, sample_data):
    """The repository's tracked and new files, and build/tatoeba without the signal tagger, as transferred."""
    target = tmp_path_factory.mktemp("transfer") / "repo"
    listed = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO)
    assert listed.returncode == 0, listed.stderr
    for name in filter(None, listed.stdout.split("\0")):
        if (REPO / name).is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, target / name)
    shutil.copytree(sample_data, target / "build" / "tatoeba",
                    ignore=shutil.ignore_patterns("signal_tagger.zh.pt"))
    return target


def _record_hash(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory):
    """A wheelhouse of one small pure-Python wheel, and setuptools (as in make wheelhouse's).

    setuptools is the editable install's build dependency: a venv of Python 3.10/3.11 gets setuptools 65 from
    ensurepip, too old for it, so the wheelhouse always brings the pinned one.
    """
    from importlib.metadata import version

    folder = tmp_path_factory.mktemp("wheelhouse")
    fetched = run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                   "-d", folder, f"setuptools=={version('setuptools')}"])
    if fetched.returncode != 0:
        pytest.skip(f"no setuptools wheel from the package index: {fetched.stderr.strip()[-300:]}")
    info = f"{PROBE}-1.0.dist-info"
    files = {
        f"{PROBE}.py": b"VALUE = 1\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {PROBE}\nVersion: 1.0\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test_setup_venv\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in files.items())
    with zipfile.ZipFile(folder / f"{PROBE}-1.0-py3-none-any.whl", "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
        wheel.writestr(f"{info}/RECORD", record + f"{info}/RECORD,,\n")
    return folder


def staged(venv):
    """What the staged venv imports (REPORT)."""
    result = run([venv / "bin" / "python", "-c", REPORT])
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def stage(repo, python, stage_dir, wheels, *args):
    return run(["bash", repo / "tools" / "gpu_stage.sh", *args],
               env=clean_env(PYTHON=str(python), STAGE=str(stage_dir), WHEELS=str(wheels), OUT=str(stage_dir / "out")))


def test_gpu_stage_uses_the_torch_of_a_venv(machine, repo_copy, wheelhouse, tmp_path):
    """PYTHON is a venv holding torch over a base with another torch: the staged venv imports the venv's."""
    result = stage(repo_copy, machine["python"], tmp_path / "stage", wheelhouse, "--stage-only")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"from {os.path.dirname(machine['torch'])}" in result.stdout
    seen = staged(tmp_path / "stage" / "venv")
    assert seen["torch"] == machine["torch"]
    assert seen["version"] != STANDIN_VERSION
    # the wheelhouse's packages are the staged venv's own, and come before the machine venv's
    own = str(site_packages(tmp_path / "stage" / "venv"))
    assert seen["probe"] == os.path.join(own, f"{PROBE}.py")
    assert seen["path"].index(own) < seen["path"].index(str(site_packages(machine["venv"])))
    # the signal tagger was not transferred: staging trains it; the check itself did not run
    tagger = repo_copy / "build" / "tatoeba" / "signal_tagger.zh.pt"
    assert tagger.stat().st_size > 0
    assert not (tmp_path / "stage" / "out").exists()
    # a part without section a (whose tests alone read the tagger) is staged without training it
    tagger.unlink()
    for part in (["--part", "train-cases"], ["--part=decode-beam-eager"], ["--sections", "bc"]):
        result = stage(repo_copy, machine["python"], tmp_path / "stage", wheelhouse, "--stage-only", *part)
        assert result.returncode == 0 and "this part does not need it" in result.stdout, result.stdout
        assert not tagger.exists()


def test_make_setup_system_torch_uses_the_torch_of_a_venv(machine, repo_copy, wheelhouse, tmp_path):
    """`make setup SYSTEM_TORCH=1 PYTHON=<venv python>`: the torch of that venv, named in the output."""
    venv = tmp_path / "venv"
    result = run(["make", "-C", repo_copy, "--no-print-directory", "setup", "SYSTEM_TORCH=1",
                  f"PYTHON={machine['python']}", f"VENV={venv}", f"WHEELS={wheelhouse}"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"torch {staged(venv)['version']} (CUDA none) from {os.path.dirname(machine['torch'])}" in result.stdout
    assert staged(venv)["torch"] == machine["torch"]
    # each step says what it installs, and pip says what it does (issue 39: a minute of silence under pip -q)
    steps = [line for line in result.stdout.splitlines() if line.startswith("== setup: ")]
    assert [line.split()[2] for line in steps if line.split()[2][1:2] == "/"] == ["1/5", "2/5", "3/5", "4/5", "5/5"]
    assert "Requirement already satisfied: " in result.stdout
    # again: one line says it is set up and with what; the other torch (no SYSTEM_TORCH): one line, what to run
    again = run(["make", "-C", repo_copy, "--no-print-directory", "setup", "SYSTEM_TORCH=1",
                 f"PYTHON={machine['python']}", f"VENV={venv}", f"WHEELS={wheelhouse}"])
    assert again.returncode == 0 and again.stdout.splitlines() == [
        f"== setup: {venv} is set up already: SYSTEM_TORCH=1 PYTHON={machine['python']} from {wheelhouse}; "
        "FORCE=1 installs it again"], again.stdout + again.stderr
    other = run(["make", "-C", repo_copy, "--no-print-directory", "setup", f"PYTHON={machine['python']}",
                 f"VENV={venv}", f"WHEELS={wheelhouse}"])
    assert other.returncode == 2 and other.stdout == "", other.stdout + other.stderr
    assert other.stderr.splitlines()[0].endswith(
        f"run make -C {repo_copy} VENV={venv} setup PYTHON={machine['python']} WHEELS={wheelhouse} FORCE=1 "
        f"(it removes {venv} first), or keep it: make -C {repo_copy} VENV={venv} setup PYTHON={machine['python']} "
        "SYSTEM_TORCH=1"), other.stderr
    assert staged(venv)["torch"] == machine["torch"]


@pytest.mark.slow
def test_gpu_stage_with_a_conda_like_python(repo_copy, wheelhouse, tmp_path):
    """A conda environment's packages are its interpreter's own: --system-site-packages sees them, no .pth."""
    env = tmp_path / "conda-env"
    python = copy_interpreter(env)
    (env / "conda-meta").mkdir()
    link_packages(site_packages(env))
    result = stage(repo_copy, python, tmp_path / "stage", wheelhouse, "--stage-only")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"(conda environment {env})" in result.stdout
    assert "through its system site-packages" in result.stdout
    venv = tmp_path / "stage" / "venv"
    assert not list(venv.glob("lib/python*/site-packages/_onmt_ext_parent_env.pth"))
    assert staged(venv)["torch"] == str(site_packages(env) / "torch" / "__init__.py")


def test_errors_are_one_line_and_an_existing_venv_is_kept(machine, repo_copy, wheelhouse, tmp_path):
    """No torch with PYTHON, or a venv of the user's without the system's site-packages: one line, nothing changed."""
    no_torch = tmp_path / "no-torch"
    made = run([machine["base"], "-m", "venv", "--without-pip", no_torch])  # its base's torch is hidden from it
    assert made.returncode == 0, made.stderr
    result = stage(repo_copy, no_torch / "bin" / "python", tmp_path / "stage", wheelhouse, "--stage-only")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"gpu_stage.sh: error: 'import torch' fails with {no_torch}/bin/python, the venv {no_torch} "
        f"(ModuleNotFoundError: No module named 'torch'); install torch into it ({no_torch}/bin/python -m pip "
        "install torch)"]
    # make setup SYSTEM_TORCH=1 also names the other way out (issue 58): a setup that installs torch itself
    venv = tmp_path / "venv"
    result = run(["make", "-C", repo_copy, "--no-print-directory", "setup", "SYSTEM_TORCH=1",
                  f"PYTHON={no_torch}/bin/python", f"VENV={venv}", f"WHEELS={wheelhouse}"], cwd=tmp_path,
                 env=clean_env(PWD=str(tmp_path)))
    assert result.returncode == 2 and not venv.exists()
    assert result.stderr.splitlines()[0] == (
        f"setup: error: 'import torch' fails with {no_torch}/bin/python, the venv {no_torch} (ModuleNotFoundError: "
        f"No module named 'torch'); install torch into it ({no_torch}/bin/python -m pip install torch), or give "
        f"PYTHON= a Python that has torch, or run make -C {repo_copy} VENV={venv} setup without SYSTEM_TORCH=1 (it "
        f"installs torch==2.13.0 into {venv})"), result.stderr

    users = tmp_path / "users-venv"
    made = run([machine["base"], "-m", "venv", "--without-pip", users])
    assert made.returncode == 0, made.stderr
    before = sorted(p.relative_to(users) for p in users.rglob("*"))
    result = run([machine["python"], "-m", "tools.stage_venv", "--prog", "setup", users], cwd=repo_copy)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"setup: error: {users} exists without the system's site-packages; remove it (rm -r {users}) "
        "or pick another VENV="]
    assert sorted(p.relative_to(users) for p in users.rglob("*")) == before


@pytest.mark.slow
def test_make_setup_with_torch_installed_in_a_fresh_venv(machine, repo_copy, tmp_path):
    """A fresh venv where pip installed torch (from the package index) is the PYTHON of make setup SYSTEM_TORCH=1."""
    import torch

    parent = tmp_path / "torch-venv"
    made = run([machine["base"], "-m", "venv", parent])
    assert made.returncode == 0, made.stderr
    pip = run([parent / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
               f"torch=={torch.__version__.split('+')[0]}", "numpy"])
    assert pip.returncode == 0, pip.stderr
    torch_file = run([parent / "bin" / "python", "-c", "import torch; print(torch.__file__)"]).stdout.strip()
    assert torch_file == str(site_packages(parent) / "torch" / "__init__.py")
    venv = tmp_path / "venv"
    result = run(["make", "-C", repo_copy, "--no-print-directory", "setup", "SYSTEM_TORCH=1", "OPTIONAL=0",
                  f"PYTHON={parent}/bin/python", f"VENV={venv}"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert staged(venv)["torch"] == torch_file
    # the project's packages went into the new venv, not into the one that holds torch
    assert (site_packages(venv) / "onmt").is_dir() and not (site_packages(parent) / "onmt").exists()


# ---------------------------------------------------------------- the setup stamp (issue 39), no install

STAMP = "# make setup: ...\npython=python3\nsystem_torch=\ntorch=torch==2.13.0\nwheels=\noptional=1\n"


def make_setup(venv, cwd, *args, dry_run=False):
    """``make -C <checkout> setup VENV=venv ...`` from the folder ``cwd`` (its PWD, as a shell sets it)."""
    return run(["make", "-C", REPO, "--no-print-directory", *(["-n"] if dry_run else []), "setup", f"VENV={venv}",
                *args], cwd=cwd, env=clean_env(PWD=str(cwd)))


@pytest.fixture
def made(tmp_path):
    """A venv folder whose stamp says a plain `make setup` made it (nothing installed in it)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / ".onmt-ext-setup").write_text(STAMP, encoding="utf-8")
    return venv


def test_make_setup_again_says_what_the_venv_was_made_with(made, tmp_path):
    """The same choice: one line, exit 0 (not make's "Nothing to be done"), and nothing changes."""
    result = make_setup(made, tmp_path)
    assert result.returncode == 0 and result.stdout.splitlines() == [
        f"== setup: {made} is set up already: TORCH=torch==2.13.0 PYTHON=python3; FORCE=1 installs it again"], \
        result.stdout + result.stderr
    assert (made / ".onmt-ext-setup").read_text(encoding="utf-8") == STAMP


def test_another_system_torch_or_python_says_what_to_run(made, tmp_path):
    """SYSTEM_TORCH=1 or another PYTHON on a venv made without: one line with the command that re-makes it (from
    the user's folder: make -C), exit 2, the venv and its stamp kept."""
    result = make_setup(made, tmp_path, "SYSTEM_TORCH=1")
    assert result.returncode == 2 and result.stdout == "", result.stdout + result.stderr
    assert result.stderr.splitlines()[0] == (
        f"setup: error: {made} was made with TORCH=torch==2.13.0 PYTHON=python3, not SYSTEM_TORCH=1 PYTHON=python3, "
        f"and must be made again for that: run make -C {REPO} VENV={made} setup SYSTEM_TORCH=1 FORCE=1 (it removes "
        f"{made} first), or keep it: make -C {REPO} VENV={made} setup")
    assert (made / ".onmt-ext-setup").read_text(encoding="utf-8") == STAMP
    result = make_setup(made, REPO, "PYTHON=/opt/other/bin/python3")
    assert result.returncode == 2
    assert f"not TORCH=torch==2.13.0 PYTHON=/opt/other/bin/python3, and must be made again for that: run make " \
           f"VENV={made} setup PYTHON=/opt/other/bin/python3 FORCE=1" in result.stderr.splitlines()[0]
    # FORCE=1 removes the venv and makes it again with the machine's torch
    commands = make_setup(made, tmp_path, "SYSTEM_TORCH=1", "FORCE=1", dry_run=True).stdout.splitlines()
    assert f"rm -rf {made}" in commands
    assert commands.index(f"rm -rf {made}") < next(i for i, c in enumerate(commands) if "-m tools.stage_venv" in c)


def test_another_torch_is_installed_into_the_venv(made, tmp_path):
    """Another TORCH (e.g. a CUDA build from its index): the installed torch is replaced, the venv kept."""
    torch = "torch==2.13.0 --index-url https://download.example/cu130"
    result = make_setup(made, tmp_path, f"TORCH={torch}", dry_run=True)
    commands = result.stdout.splitlines()
    assert not any(c.startswith("rm -rf") for c in commands)
    uninstall = commands.index(f"{made}/bin/python -m pip uninstall -y --disable-pip-version-check torch")
    install = next(i for i, c in enumerate(commands) if c.startswith(f"{made}/bin/python -m pip install")
                   and c.endswith(torch))
    assert uninstall < install
    # first checked (issue 58), and only then is the stamp removed and the old torch uninstalled
    check = next(i for i, c in enumerate(commands) if f"--dry-run --no-deps --ignore-installed {torch}" in c)
    assert check < commands.index(f"rm -f {made}/.onmt-ext-setup") < uninstall
    assert f"'torch={torch}'" in result.stdout  # the new stamp records it


def test_an_impossible_torch_leaves_the_venv_and_its_stamp_as_they_were(made, tmp_path):
    """Issue 58: make setup TORCH="torch==2.99.0" uninstalled the working torch before pip failed, leaving a venv
    without torch and without its stamp.  pip install --dry-run checks the requested torch first; when it fails,
    one line says so and nothing is changed.  Offline: the index (or WHEELS=) is an empty folder, and pip reads no
    configuration."""
    log = tmp_path / "changes.log"
    (made / "bin" / "python").write_text(  # runs the check (it installs nothing), refuses and logs anything else
        f'#!/bin/sh\ncase " $* " in *" --dry-run "*) exec {sys.executable} "$@";; esac\necho "$*" >> {log}\nexit 1\n',
        encoding="utf-8")
    (made / "bin" / "python").chmod(0o755)
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in clean_env(PWD=str(tmp_path)).items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    before = sorted((p.relative_to(made), p.stat().st_mtime_ns) for p in made.rglob("*"))
    for torch, wheels in ((f"torch==2.99.0 --index-url {empty.as_uri()}", []), ("torch==2.99.0", [f"WHEELS={empty}"])):
        result = run(["make", "-C", REPO, "--no-print-directory", "setup", f"VENV={made}", f"TORCH={torch}", *wheels],
                     cwd=tmp_path, env=env)
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stderr.splitlines()[0] == (
            f"setup: error: TORCH={torch} cannot be installed (pip: No matching distribution found for "
            f"torch==2.99.0); {made} and its stamp are unchanged"), result.stderr
        assert not log.exists(), log.read_text(encoding="utf-8")
        assert sorted((p.relative_to(made), p.stat().st_mtime_ns) for p in made.rglob("*")) == before
        assert (made / ".onmt-ext-setup").read_text(encoding="utf-8") == STAMP


def test_a_stamp_without_a_record_installs_again(made, tmp_path):
    """A stamp of an earlier onmt-ext (empty): make setup installs again and writes the record."""
    (made / ".onmt-ext-setup").write_text("", encoding="utf-8")
    commands = make_setup(made, tmp_path, dry_run=True).stdout.splitlines()
    assert any("pip install" in c and c.endswith("torch==2.13.0") for c in commands)
    assert not any(c.startswith("rm -rf") for c in commands)


def test_gpu_check_without_cuda_names_a_setup_command_that_runs_from_here(made, tmp_path):
    """make gpu-check on a torch without CUDA: the setup commands it recommends run from the user's folder."""
    stub = tmp_path / "stub"  # a torch built without CUDA
    (stub / "torch").mkdir(parents=True)
    (stub / "torch" / "__init__.py").write_text(
        "import types\n__version__ = '0+cpu'\nversion = types.SimpleNamespace(cuda=None)\n"
        "cuda = types.SimpleNamespace(is_available=lambda: False)\n", encoding="utf-8")
    (made / "bin" / "python").write_text(f"#!/bin/sh\nPYTHONPATH={stub} exec {sys.executable} -S \"$@\"\n",
                                         encoding="utf-8")
    (made / "bin" / "python").chmod(0o755)
    result = run(["make", "-C", REPO, "--no-print-directory", "gpu-check", f"VENV={made}"], cwd=tmp_path,
                 env=clean_env(PWD=str(tmp_path)))
    assert result.returncode == 2 and result.stderr.splitlines()[0] == (
        f"gpu-check: error: the torch of {made} has no CUDA; install a CUDA build: make -C {REPO} VENV={made} setup "
        "SYSTEM_TORCH=1 FORCE=1 (the machine's torch, PYTHON= the Python that has it) or make -C "
        f'{REPO} VENV={made} setup TORCH="torch==<version> --index-url <your CUDA index>" FORCE=1 (docs/install.md)')
