"""Command-line mistakes that stock OpenNMT-py takes silently or ends in a traceback, found before any work.

* :func:`repeated_option_messages`: an option written twice on a command's own command line (argparse
  keeps the last value without a word); called by the strict parse of :mod:`onmt_ext.integration.parsing`.
* :func:`existing_vocab_messages`: ``onmt_build_vocab`` counts the whole sample and only then stops with a
  32-line ``OSError`` traceback when a vocabulary file exists and ``-overwrite`` is not given.
* :func:`empty_count_message`: a sample of which no token was counted on one side (the transforms dropped every
  pair) gave empty vocabularies and exit 0; ``onmt_train`` refused them one command later.
"""

import argparse
import os

from onmt_ext.errors import UsageError
from onmt_ext.patches import FIX, patch

# OpenNMT-py is imported inside the functions: importing it while this module initialises would activate
# onmt-ext (onmt_ext._autoload) before this module is whole.

#: argparse actions that are meant to be given several times.
_REPEATABLE = (argparse._AppendAction, argparse._AppendConstAction, argparse._CountAction)


def repeated_option_messages(parser, argv):
    """One message per option of ``parser`` written more than once in ``argv`` (any of its spellings).

    Args:
        parser: the command's parser (its option strings decide what is an option).
        argv: the command-line words (values that are no option string, such as ``-1``, are skipped).
    Returns:
        ``["-train_steps is given 2 times on the command line (-train_steps 2, -train_steps 1): keep one"]``.
    """
    given = {}
    for i, word in enumerate(argv):
        name = word.split("=", 1)[0]
        action = parser._option_string_actions.get(name) if word.startswith("-") else None
        if action is None or isinstance(action, _REPEATABLE):
            continue
        value = word.split("=", 1)[1] if "=" in word else (argv[i + 1] if i + 1 < len(argv) and action.nargs != 0
                                                           else "")
        given.setdefault(action.dest, []).append(f"{name} {value}".strip())
    return [f"{words[0].split()[0]} is given {len(words)} times on the command line ({', '.join(words)}); "
            "argparse would keep the last value silently: keep one"
            for words in given.values() if len(words) > 1]


def existing_vocab_messages(opts):
    """Messages for vocabulary files that ``onmt_build_vocab`` (``opts``) would stop on after counting."""
    if getattr(opts, "overwrite", False):
        return []
    keys = ("src_vocab",) if getattr(opts, "share_vocab", False) else ("src_vocab", "tgt_vocab")
    return [f"-{key} {getattr(opts, key)}: exists; pass -overwrite to replace it, or choose another path"
            for key in keys if getattr(opts, key, None) and os.path.exists(getattr(opts, key))]


def _build_vocab_checked(stock, opts, *args, **kwargs):
    """``onmt.bin.build_vocab.build_vocab_main``: refuse existing vocabularies before counting."""
    problems = existing_vocab_messages(opts)
    if problems:
        raise UsageError("\n".join(problems))
    return stock(opts, *args, **kwargs)


def empty_count_message(opts, src_counter, tgt_counter):
    """The message when no token of one side of ``opts``'s sample was counted (None otherwise): the vocabulary
    written would be empty, which ``onmt_train`` refuses."""
    empty = [side for side, counter in (("source", src_counter), ("target", tgt_counter)) if not counter]
    if not empty:
        return None
    transforms = ", ".join(getattr(opts, "transforms", None) or []) or "none"
    return (f"no {' and no '.join(empty)} token was counted in the sample (-n_sample {opts.n_sample}): every pair was "
            f"left out by the transforms (-transforms: {transforms}; a corpus may list its own) or has an empty "
            "side, so the vocabulary would be empty: loosen the filters (-src_seq_length, -tgt_seq_length) or check "
            "the corpora; nothing was written")


def _counted_checked(stock, opts, *args, **kwargs):
    """``onmt.bin.build_vocab.build_vocab``: the counts, refused when a side has none."""
    counters = stock(opts, *args, **kwargs)
    message = empty_count_message(opts, counters[0], counters[1])
    if message:
        raise UsageError(message)
    return counters


def install():
    """Register the ``onmt_build_vocab`` checks."""
    from onmt.bin import build_vocab

    patch(build_vocab, "build_vocab_main", _build_vocab_checked, kind=FIX, order=1,  # after the machine check
          reason="rerunning onmt_build_vocab without -overwrite counts the whole sample, then ends in a 32-line "
                 "OSError traceback",
          test="tests/integration/test_checkpoints_cli.py::test_build_vocab_rerun_without_overwrite_gets_one_line")
    patch(build_vocab, "build_vocab", _counted_checked, kind=FIX,
          reason="a sample whose every pair the transforms drop gave empty vocabularies and exit 0; onmt_train "
                 "refused them one command later",
          test="tests/integration/test_checkpoints_cli.py::test_build_vocab_refuses_a_sample_without_tokens")
