"""The commands that serve onmt-ext: data preparation, scoring, the paper tables, the GPU check, benchmarks.

Each runs from the checkout's root as ``python -m tools.<name>`` (``python -m tools.evaluate --help``); they
import one another as a package (``from tools import common``).  What each does: docs/tools.md.
"""
