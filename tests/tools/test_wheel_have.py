"""tools/wheel_have.py: what `make wheelhouse WHEEL_HAVE=<list>` leaves out (issue 36, the lean transfer)."""

import json

from support import REPO


from tools import wheel_have


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def report(**requires):
    """A pip --report with the given Requires-Dist per package."""
    return {"install": [{"metadata": {"name": name.replace("_", "-"), "version": "1", "requires_dist": deps}}
                        for name, deps in requires.items()]}


def test_the_three_list_formats_and_name_spellings(tmp_path):
    freeze = write(tmp_path / "freeze.txt", "# a comment\nPyYAML==6.0.3\n-e git+https://x/y.git#egg=y\n"
                                              "python_dateutil @ file:///w/python_dateutil-2.9.whl\n\n")
    assert wheel_have.read_have(freeze) == {"pyyaml": "6.0.3", "python-dateutil": None}
    pip_list = write(tmp_path / "list.txt", "Package    Version\n---------- -------\nMarkupSafe 3.0.4\n"
                                              "tensorboard_data.server 0.7.2\n")
    assert wheel_have.read_have(pip_list) == {"markupsafe": "3.0.4", "tensorboard-data-server": "0.7.2"}
    conda = write(tmp_path / "conda.txt", "# packages in environment at /opt/conda:\n#\n"
                                            "# Name  Version  Build  Channel\nnumpy  2.5.2  py312h0  conda-forge\n")
    assert wheel_have.read_have(conda) == {"numpy": "2.5.2"}
    # the H100's list that the repository ships
    shipped = wheel_have.read_have(REPO / "tools" / "gpu-machine-packages.txt")
    assert {"numpy", "matplotlib", "tensorboard", "torch", "pyyaml"} <= set(shipped)


def test_unreadable_or_empty_lists_are_one_line_errors(tmp_path, capsys):
    requirements = write(tmp_path / "req.txt", "numpy==2.4.6\n")
    rep = write(tmp_path / "report.json", json.dumps(report(numpy=[])))
    for name, text, message in [("empty.txt", "# nothing\n\n", "lists no packages"),
                                ("bad.txt", "numpy 2\n@@@ 1\n", "bad.txt:2: not a package name and version: '@@@ 1'")]:
        have = write(tmp_path / name, text)
        code = wheel_have.main([str(requirements), "--have", str(have), "--report", str(rep),
                                "--python-version", "3.12", "-o", str(tmp_path / "out.txt"), "--prog", "wheelhouse"])
        assert code == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith("wheelhouse: error: ") and err[0].endswith(message)


def test_the_target_has_what_its_packages_depend_on():
    requires = wheel_have.dependencies(report(
        matplotlib=["contourpy>=1.0.1", "numpy>=1.25", "python-dateutil>=2.7"],
        python_dateutil=["six>=1.5"],
        contourpy=["numpy>=1.25", 'bokeh; extra == "bokeh"'],
        hypothesis=["sortedcontainers<3", 'exceptiongroup>=1; python_version < "3.11"'],
        pytest_xdist=["execnet>=2.1", "pytest>=7"],
    ))
    environment = wheel_have.target_environment("3.12")
    present = wheel_have.on_target({"matplotlib": "3.11.2", "hypothesis": None, "torch": "2.11"}, requires,
                                   environment)
    # extras and markers that do not hold on CPython 3.12 add nothing; what the target lacks stays out
    assert present == {"matplotlib", "contourpy", "numpy", "python-dateutil", "six", "hypothesis",
                       "sortedcontainers", "torch"}
    assert "exceptiongroup" in wheel_have.on_target({"hypothesis": None}, requires,
                                                    wheel_have.target_environment("3.10"))


def test_requirements_left_out_and_setuptools_kept(tmp_path, capsys):
    requirements = write(tmp_path / "req.txt", "contourpy==1.3.3\nmatplotlib==3.11.2\nnumpy==2.4.6\n"
                                                 "setuptools==84.2.1\nsix==1.17.0\ntensorboard==2.21.0\ntqdm==4.70.1\n")
    rep = write(tmp_path / "report.json", json.dumps(report(
        matplotlib=["contourpy", "numpy", "six"], tensorboard=["setuptools>=41", "numpy"], tqdm=[])))
    have = write(tmp_path / "have.txt", "matplotlib 3.11.2\nnumpy 2.5.2\ntensorboard 2.21.0\nsetuptools 68.0\n")
    out = tmp_path / "out.txt"
    assert wheel_have.main([str(requirements), "--have", str(have), "--report", str(rep),
                            "--python-version", "3.12", "-o", str(out)]) == 0
    assert out.read_text().splitlines() == ["setuptools==84.2.1", "tqdm==4.70.1"]
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"== wheel_have.py: left out 5 of 7 requirements: 3 that {have} lists (matplotlib, numpy, tensorboard) "
        "and 2 that those need (contourpy, six)",
        "== wheel_have.py: the target's own versions will be used: numpy 2.5.2 (pin 2.4.6)"]

