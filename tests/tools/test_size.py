"""tools/ stays smaller than the product it serves (issue 38): a newcomer reads onmt_ext/ first.

The count is the issue's own: every line of ``tools/*.py`` and ``tools/*.sh`` against ``onmt_ext/*.py``.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def lines(paths):
    return sum(len(path.read_text(encoding="utf-8").splitlines()) for path in paths)


def test_tools_are_smaller_than_the_package():
    tools = lines([*REPO.glob("tools/*.py"), *REPO.glob("tools/*.sh")])
    package = lines(REPO.glob("onmt_ext/*.py"))
    assert package > 1000, "onmt_ext/ not found"
    assert tools < package, (f"tools/ has {tools} lines against onmt_ext/'s {package}: simplify tools/ (or move what "
                             "is a library back into one) before adding to it")
