"""tools/common.py: the helpers the commands share (in-process)."""

import argparse

import pytest

import common
import compare


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
