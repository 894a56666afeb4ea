"""`make wheelhouse WHEEL_HAVE=<list>` against the package index (tests/tools/test_wheel_have.py: the tool)."""

import os
import subprocess

import pytest

from support import REPO


@pytest.mark.slow
def test_the_lean_wheelhouse_of_the_h100_fits_the_transfer(tmp_path, sample_data):
    """The documented command, against the package index: wheels + build/tatoeba without the tagger < 64 MiB."""
    result = subprocess.run(["make", "--no-print-directory", "wheelhouse", "PY=3.12",
                             "WHEEL_HAVE=tools/gpu-machine-packages.txt", f"WHEELHOUSE={tmp_path / 'wheelhouse'}"],
                            cwd=REPO, capture_output=True, text=True, timeout=900,
                            env={k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    wheels = sorted(p.name.split("-")[0].lower() for p in (tmp_path / "wheelhouse").glob("*.whl"))
    for gone in ("numpy", "matplotlib", "tensorboard", "grpcio", "pillow", "pytest", "sacrebleu", "regex"):
        assert gone not in wheels
    for kept in ("opennmt_py", "pyonmttok", "jieba", "setuptools", "configargparse", "pytest_xdist"):
        assert kept in wheels
    size = sum(p.stat().st_size for p in (tmp_path / "wheelhouse").iterdir())
    size += sum(p.stat().st_size for p in sample_data.iterdir() if p.name != "signal_tagger.zh.pt")
    assert size < 56 * 2**20, f"{size / 2**20:.1f} MiB"
