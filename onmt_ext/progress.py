"""``onmt_translate``'s progress on stderr: sentences translated, rate and time left; the output is not touched.

Stock ``onmt_translate`` says nothing until it ends.  :func:`install` wraps ``Translator._translate``, the loop over
the batches, so that inside the command (:func:`onmt_ext.commands.in_command`; not in a tool's or a test's own
translation) each batch it has translated advances :class:`Progress`: a tqdm bar when stderr is a terminal, else
one line after the first batch, then at most one every :data:`INTERVAL` seconds, and one at the end.
"""

import sys
import time

from onmt_ext.patches import MESSAGE, patch

# OpenNMT-py is imported inside the functions: importing it while this module initialises would activate
# onmt-ext (onmt_ext._autoload) before this module is whole.

#: Seconds between two progress lines when stderr is not a terminal (a log file).
INTERVAL = 60
#: What a progress line (or the bar's text) says, in tqdm's ``bar_format`` fields.
LINE = "{n_fmt}/{total_fmt} sentences ({percentage:.0f}%), {rate_noinv_fmt}, {elapsed} elapsed, about {remaining} left"
_BAR = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} sentences [{elapsed}<{remaining}, {rate_fmt}]"


class Progress:
    """Sentences translated of ``total``, on stderr (see the module docstring); ``prog`` starts each line."""

    def __init__(self, total, prog="onmt_translate", terminal=None):
        from tqdm import tqdm

        self.total, self.prog, self.done, self.shown = total, prog, 0, -1
        self.start = self.last = time.monotonic()
        terminal = sys.stderr.isatty() if terminal is None else terminal
        self.bar = tqdm(total=total, desc=prog, unit=" sentences", file=sys.stderr, bar_format=_BAR,
                        mininterval=1, dynamic_ncols=True) if terminal else None

    def update(self, sentences):
        """``sentences`` more are translated."""
        self.done += sentences
        if self.bar is not None:
            self.bar.update(sentences)
            return
        now = time.monotonic()
        if self.shown < 0 or now - self.last >= INTERVAL:
            self._line(now)

    def close(self, last_line=True):
        """The bar's last state, or (``last_line``) the last line."""
        if self.bar is not None:
            self.bar.close()
        elif last_line and self.shown != self.done:
            self._line(time.monotonic())

    def _line(self, now):
        from tqdm import tqdm

        text = tqdm.format_meter(self.done, self.total, now - self.start, unit=" sentences", bar_format=LINE)
        sys.stderr.write(f"{self.prog}: {' '.join(text.split())}\n")  # tqdm pads the rate
        sys.stderr.flush()
        self.shown, self.last = self.done, now


def source_lines(infer_iter):
    """How many sentences ``infer_iter`` (OpenNMT-py's translation iterator) holds: the lines of its ``-src`` file,
    or the length of its list of sentences; None when neither is known."""
    from onmt.constants import CorpusName

    from onmt_ext.corpus import check_corpus

    corpus = (getattr(infer_iter, "corpora", None) or {}).get(CorpusName.INFER)
    src = getattr(corpus, "src", None)
    if isinstance(src, (list, tuple)):
        return len(src)
    try:
        return check_corpus("-src", src)[0]  # read once per process (the -src check has read it)
    except Exception:  # no file (stdin), or not readable: the count is left out
        return None


class _Counted:
    """``infer_iter`` as it is (its attributes too), each batch counted in ``progress`` once it is translated,
    i.e. when the next one is asked for."""

    def __init__(self, infer_iter, progress):
        self._iter, self._progress = infer_iter, progress

    def __getattr__(self, name):
        return getattr(self._iter, name)

    def __iter__(self):
        previous, ended = 0, False
        try:
            for batch, bucket in self._iter:
                if previous:
                    self._progress.update(previous)
                previous = len(batch["srclen"])
                yield batch, bucket
            self._progress.update(previous)
            ended = True
        finally:  # a translation that failed gets no last line: its error is what matters
            self._progress.close(last_line=ended)


def _translate_with_progress(stock, self, infer_iter, *args, **kwargs):
    """``Translator._translate`` whose batches advance a :class:`Progress` (inside ``onmt_translate`` only)."""
    from onmt_ext.commands import in_command

    if not in_command() or isinstance(infer_iter, list):
        return stock(self, infer_iter, *args, **kwargs)
    return stock(self, _Counted(infer_iter, Progress(source_lines(infer_iter))), *args, **kwargs)


def install():
    """Wrap ``Translator._translate`` (see the module docstring)."""
    from onmt.translate.translator import Translator

    patch(Translator, "_translate", _translate_with_progress, kind=MESSAGE,
          test="tests/integration/test_progress_cli.py::test_translation_shows_its_progress_on_stderr",
          reason="onmt_translate shows no progress until it ends; the sentences translated, the rate and the time "
                 "left go to stderr, the output file is not touched")
