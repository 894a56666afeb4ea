"""Chinese word segmentation with jieba, as the OpenNMT-py transform ``jieba``.

``transforms: [jieba, sentencepiece, ...]`` segments raw Chinese into words in ``onmt_build_vocab``,
``onmt_train`` and (the checkpoint stores its transforms, :mod:`onmt_ext.integration.preprocessing`) ``onmt_translate``.
:func:`segment` (``jieba.lcut``, HMM on, whitespace dropped) is the cut ``tools/prepare_tatoeba.py`` made of the
shipped sample.  ``-jieba_side`` picks the side(s) (a target keeps its spaces: no reverse step);
``-jieba_keep_segmented`` passes unchanged a line already segmented.  ``python -m onmt_ext.integration.zh_segment <
raw.zh > words.zh`` segments a file.  Details: docs/own-data.md.
"""

import logging
import re
import sys
import tempfile

import onmt.transforms
from onmt.transforms.transform import Transform

from onmt_ext import _autoload
from onmt_ext.patches import NEEDED, add_entry

# jieba is imported where the tokenizer is first built: activation imports this module in every OpenNMT-py command,
# and most of them segment no Chinese.

TRANSFORM_NAME = "jieba"
SIDES = ("src", "tgt", "both")
#: CJK radicals, punctuation, kana, ideographs (with extension A and compatibility) and full-width forms.
_CJK = "\u2e80-\u2fff\u3000-\u303f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef"
#: whitespace between two CJK characters: the mark of a line segmented beforehand
_SEGMENTED = re.compile(f"[{_CJK}]\\s+[{_CJK}]")
_TOKENIZER = None


def tokenizer():
    """jieba's tokenizer with its default dictionary, loaded once per process.

    Its prefix-dictionary cache goes to a temporary directory removed at
    once, so nothing is left behind; jieba's log is kept to warnings.
    """
    global _TOKENIZER
    if _TOKENIZER is None:
        import jieba

        jieba.setLogLevel(logging.WARNING)
        tok = jieba.Tokenizer()
        with tempfile.TemporaryDirectory(prefix="onmt_ext_jieba_") as tmp:
            tok.tmp_dir = tmp
            tok.cache_file = "jieba.cache"
            tok.initialize()
        _TOKENIZER = tok
    return _TOKENIZER


def segment(text):
    """``text`` (str) cut into words by jieba (HMM on): a list of str, no whitespace tokens.

    Removing the spaces of ``" ".join(segment(text))`` gives ``text`` minus its
    whitespace; runs of whitespace in ``text`` count as one word boundary.
    """
    return [piece for word in tokenizer().lcut(text, HMM=True) for piece in word.split()]


def is_segmented(text):
    """True when ``text`` holds whitespace between two CJK characters (a line segmented beforehand)."""
    return _SEGMENTED.search(text) is not None


class JiebaTransform(Transform):
    """OpenNMT-py transform ``jieba``: ``example[side]`` (a token list) re-cut into jieba's words.

    List it before the subword transform (``[jieba, sentencepiece,
    filtertoolong]``), in the config of every command.
    """

    @classmethod
    def add_options(cls, parser):
        """Options of ``jieba`` (group "Transform/Jieba")."""
        group = parser.add_argument_group("Transform/Jieba", description="Chinese word segmentation with jieba; "
                                          "list jieba before the subword transform.")
        group.add("-jieba_side", "--jieba_side", type=str, default="src", choices=list(SIDES),
                  help="The side(s) in Chinese that jieba segments.")
        group.add("-jieba_keep_segmented", "--jieba_keep_segmented", action="store_true",
                  help="Pass unchanged a line that already holds whitespace between two CJK characters "
                       "(a corpus segmented beforehand).")

    def _parse_opts(self):
        side = getattr(self.opts, "jieba_side", "src")
        self.sides = ("src", "tgt") if side == "both" else (side,)
        self.keep_segmented = bool(getattr(self.opts, "jieba_keep_segmented", False))

    def _cut(self, tokens):
        text = " ".join(tokens)
        if self.keep_segmented and is_segmented(text):
            return tokens
        return segment(text)

    def apply(self, example, is_train=False, stats=None, **kwargs):
        """Segment the chosen sides of ``example`` (absent or ``None`` sides are left alone)."""
        for side in self.sides:
            if example.get(side) is not None:
                example[side] = self._cut(example[side])
        return example

    def _repr_args(self):
        return f"side={'+'.join(self.sides)}{', keep_segmented' if self.keep_segmented else ''}"


def install():
    """Register ``jieba`` in OpenNMT-py's transform registry (called by :func:`onmt_ext.integration.plugin.activate`;
    after a re-execution of this module, its new class replaces the old)."""
    add_entry(onmt.transforms, "AVAILABLE_TRANSFORMS", TRANSFORM_NAME, JiebaTransform, kind=NEEDED,
              reason="the jieba transform (Chinese word segmentation, as the demo data was cut) for -transforms",
              test="tests/unit/test_preprocessing.py::test_jieba_cuts_raw_chinese_as_the_shipped_sample_was_cut")


def main(lines=None, out=None):
    """Write each line of ``lines`` (default: standard input) segmented by :func:`segment`, words space-joined."""
    if lines is None:
        sys.stdin.reconfigure(encoding="utf-8")
    if out is None:
        sys.stdout.reconfigure(encoding="utf-8")
    out = out or sys.stdout
    for line in lines if lines is not None else sys.stdin:
        out.write(" ".join(segment(line)) + "\n")


# When importing this module was what imported onmt, the start-up hook waited for it (onmt_ext._autoload)
_autoload.activate_deferred(__name__)

if __name__ == "__main__":
    main()
