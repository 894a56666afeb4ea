"""tools/common.py: the helpers the commands share (in-process)."""

import argparse

import pytest

from tools import common
from tools import compare


@pytest.mark.parametrize("text", ["0", "-3", "x", "1.5", ""])
def test_at_least_refuses_what_is_not_an_integer_at_the_bound(text):
    with pytest.raises(argparse.ArgumentTypeError, match=f"must be an integer >= 1, not {text!r}"):
        common.at_least(1)(text)


def test_at_least_gives_the_integer():
    assert common.at_least(1)("5") == 5 and common.at_least(0)("0") == 0 and common.at_least(6)("6") == 6


def test_a_bad_bound_is_one_line_naming_the_option(capsys):
    with pytest.raises(SystemExit) as exit_info:
        compare.main(["--jobs", "0"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err == "compare.py: error: argument --jobs: must be an integer >= 1, not '0'\n"


def test_config_values_are_parsed_once_and_handed_out_as_new_dicts(tmp_path, monkeypatch):
    import os

    config = tmp_path / "row.yaml"
    config.write_text("data:\n  corpus_1: {path_src: a}\nseed: 1\n", encoding="utf-8")
    monkeypatch.setattr(common, "CONFIGS", tmp_path)
    first = common.config_values("row.yaml")
    first["data"]["corpus_1"]["path_src"] = "changed"  # callers rewrite what they get
    assert common.config_values("row.yaml") == {"data": {"corpus_1": {"path_src": "a"}}, "seed": 1}
    config.write_text("seed: 2\n", encoding="utf-8")
    os.utime(config, ns=(0, config.stat().st_mtime_ns + 10**9))  # a rewritten file is read again
    assert common.config_values("row.yaml") == {"seed": 2}
