"""Progress of the long commands: ``onmt_translate``'s on stderr, ``onmt_train``'s time left; outputs untouched.

Stock ``onmt_translate`` says nothing until it ends.  :func:`install` wraps ``Translator._translate``, the loop over
the batches, so that inside the command (:func:`onmt_ext.integration.commands.in_command`; not in a tool's or a test's
own translation) each batch it has translated advances :class:`Progress`: a tqdm bar when stderr is a terminal, else
one line after the first batch, then at most one every :data:`INTERVAL` seconds, and one at the end.  The same
loop counts the source lines longer than any the model was trained on (:func:`training_length`): one warning at
the end names them (:class:`LongLines`).  ``onmt_train``'s ``Step n/total`` line ends in the time left
(:class:`TrainingRun`), and a silent training writes a line between reports (:func:`heartbeat`).
"""

import contextvars
import sys
import time

from onmt_ext.patches import MESSAGE, patch

# OpenNMT-py is imported inside the functions: importing it while this module initialises would activate
# onmt-ext (onmt_ext._autoload) before this module is whole.

#: Seconds between two progress lines when stderr is not a terminal (a log file).
INTERVAL = 45
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

    from onmt_ext.runtime.corpus import check_corpus

    corpus = (getattr(infer_iter, "corpora", None) or {}).get(CorpusName.INFER)
    src = getattr(corpus, "src", None)
    if isinstance(src, (list, tuple)):
        return len(src)
    try:
        return check_corpus("-src", src)[0]  # read once per process (the -src check has read it)
    except Exception:  # no file (stdin), or not readable: the count is left out
        return None


def training_length(model_opt):
    """The longest source a checkpoint's options ``model_opt`` trained on, in tokens after its transforms: its
    ``-src_seq_length`` when ``filtertoolong`` was applied to every training corpus; None when not known."""
    from onmt_ext.runtime.corpus import corpora_of

    if model_opt is None:
        return None
    default = list(getattr(model_opt, "transforms", None) or [])
    corpora = [corpus for name, corpus in corpora_of(getattr(model_opt, "data", None)).items()
               if name != "valid" and isinstance(corpus, dict)]  # (text as parsed, or the validated dict)
    lists = [corpus["transforms"] if corpus.get("transforms") is not None else default for corpus in corpora]
    if not all("filtertoolong" in names for names in lists or [default]):
        return None
    limit = getattr(model_opt, "src_seq_length", None)
    return limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None


class LongLines:
    """The source lines of ``src`` longer than ``limit`` tokens (:func:`training_length` of ``model``), counted
    batch by batch and told in one warning at the end."""

    def __init__(self, limit, src, model):
        self.limit, self.src, self.model = limit, src, model
        self.count, self.longest, self.line = 0, 0, None

    def add(self, batch):
        """Count the long lines of one batch (its ``srclen``, and ``cid_line_number`` counted from 0)."""
        lengths = batch["srclen"]
        lines = batch.get("cid_line_number")
        for index, length in enumerate(lengths.tolist() if hasattr(lengths, "tolist") else lengths):
            if length > self.limit:
                self.count += 1
                if length > self.longest:
                    self.longest, self.line = length, (lines[index] + 1 if lines is not None else None)

    def message(self, total):
        """The warning for ``total`` lines translated, or None when none was long."""
        if not self.count:
            return None
        line = f"line {self.line}" if self.line is not None else "one"
        verb = "is" if self.count == 1 else "are"
        return (f"onmt_translate: warning: -src {self.src}: {self.count} of {total} lines {verb} longer than any "
                f"source {self.model} was trained on (its filtertoolong kept -src_seq_length {self.limit} tokens); "
                f"the longest, {line}, has {self.longest} tokens. They were translated as they are, and a model "
                f"translates far beyond its training length poorly: split such lines into sentences of at most "
                f"{self.limit} tokens")


#: The :class:`LongLines` of the ``onmt_translate`` running in this context (None: the length is not known).
_LONG_LINES = contextvars.ContextVar("onmt_ext_long_lines", default=None)


class _Counted:
    """``infer_iter`` as it is (its attributes too), each batch counted in ``progress`` once it is translated,
    i.e. when the next one is asked for, and in ``long_lines`` (a :class:`LongLines`, or None)."""

    def __init__(self, infer_iter, progress, long_lines=None):
        self._iter, self._progress, self._long = infer_iter, progress, long_lines

    def __getattr__(self, name):
        return getattr(self._iter, name)

    def __iter__(self):
        previous, ended, total = 0, False, 0
        try:
            for batch, bucket in self._iter:
                if previous:
                    self._progress.update(previous)
                previous = len(batch["srclen"])
                total += previous
                if self._long is not None:
                    self._long.add(batch)
                yield batch, bucket
            self._progress.update(previous)
            ended = True
        finally:  # a translation that failed gets no last line: its error is what matters
            self._progress.close(last_line=ended)
        message = self._long.message(total) if self._long is not None else None
        if message:
            from onmt.utils.logging import logger

            logger.warning(message)


def _translate_with_progress(stock, self, infer_iter, *args, **kwargs):
    """``Translator._translate`` whose batches advance a :class:`Progress` (inside ``onmt_translate`` only)."""
    from onmt_ext.integration.commands import in_command

    if not in_command() or isinstance(infer_iter, list):
        return stock(self, infer_iter, *args, **kwargs)
    counted = _Counted(infer_iter, Progress(source_lines(infer_iter)), _LONG_LINES.get())
    return stock(self, counted, *args, **kwargs)


def _translate_knowing_training_length(stock, opt, *args, **kwargs):
    """``onmt.bin.translate.translate`` with the :class:`LongLines` of its model (when its training length is
    known) for :func:`_translate_with_progress`."""
    from onmt_ext.integration.preprocessing import checkpoint_options

    models = getattr(opt, "models", None) or []
    limit = training_length(checkpoint_options(models[0])) if models else None
    token = _LONG_LINES.set(LongLines(limit, getattr(opt, "src", None), models[0]) if limit else None)
    try:
        return stock(opt, *args, **kwargs)
    finally:
        _LONG_LINES.reset(token)


class TrainingRun:
    """One ``onmt_train`` run's steps against time, from ``first_step`` at ``start`` (its report manager's start
    time), for the time left in its ``Step n/total`` lines and for the lines between them (:func:`heartbeat`)."""

    def __init__(self, first_step, start):
        self.first_step, self.start, self.first_report, self.last_line = first_step, start, None, start

    def left(self, step, num_steps, now):
        """Seconds left to ``num_steps`` at ``step`` (done at ``now``); None when not known.

        Up to the run's first report the rate is that of the steps since its start (data loading included); after
        it, that of the steps since the first report, so that a slow start is soon left out.
        """
        if num_steps <= 0 or step >= num_steps:
            return None
        if self.first_report is None or self.first_report[0] >= step:
            done, seconds = step - self.first_step + 1, now - self.start
        else:
            done, seconds = step - self.first_report[0], now - self.first_report[1]
        return (num_steps - step) * seconds / done if done > 0 and seconds > 0 else None

    def reported(self, step, now):
        """A ``Step`` line was written for ``step`` at ``now``."""
        self.last_line = now
        if self.first_report is None:
            self.first_report = (step, now)


#: The :class:`TrainingRun` of each report manager's start time (one in a process, one more per resume in it).
_RUNS = {}
#: Seconds without a line after which a training step that is not reported writes one (:func:`heartbeat`).
TRAIN_INTERVAL = 45


def eta_text(seconds):
    """``about 12:34 left`` (``1:02:03`` beyond an hour)."""
    from tqdm import tqdm

    return f"about {tqdm.format_interval(seconds)} left"


def heartbeat(run, step, num_steps, report_every, now):
    """The line for ``step`` when the run has been silent for :data:`TRAIN_INTERVAL` seconds (slow steps, a loaded
    machine) and ``step`` gets no ``Step`` line of its own and is not the last; else None."""
    if now - run.last_line < TRAIN_INTERVAL or step % report_every == 0 or 0 < num_steps <= step:
        return None
    run.last_line = now
    seconds = run.left(step, num_steps, now)
    left = f", {eta_text(seconds)}" if seconds is not None else ""
    total = f"/{num_steps}" if num_steps > 0 else ""
    following = (step // report_every + 1) * report_every
    return f"onmt-ext: at step {step}{total}{left} (the next report is at step {following})"


def _start_report_manager_noting_step(stock, self, *args, **kwargs):
    """``Trainer._start_report_manager``, at the start of ``Trainer.train``: the run's first step is noted."""
    result = stock(self, *args, **kwargs)
    manager = getattr(self, "report_manager", None)
    if manager is not None and getattr(manager, "start_time", -1) >= 0:
        _RUNS[manager.start_time] = TrainingRun(self.optim.training_step, manager.start_time)
    return result


def _report_or_heartbeat(stock, self, step, num_steps, *args, **kwargs):
    """``Trainer._maybe_report_training`` (after every step), with a :func:`heartbeat` line when one is due."""
    result = stock(self, step, num_steps, *args, **kwargs)
    manager = getattr(self, "report_manager", None)
    run = _RUNS.get(getattr(manager, "start_time", None))
    line = heartbeat(run, step, num_steps, manager.report_every, time.time()) if run is not None else None
    if line:
        from onmt.utils.logging import logger

        logger.info(line)
    return result


class _Suffixed:
    """``logger`` whose ``info`` lines end in ``suffix``."""

    def __init__(self, logger, suffix):
        self._logger, self._suffix = logger, suffix

    def info(self, message, *args, **kwargs):
        kwargs.setdefault("stacklevel", 2)  # the record names the caller (statistics.py), as before
        self._logger.info(f"{message}{self._suffix}", *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._logger, name)


def _output_with_time_left(stock, self, step, num_steps, learning_rate, start, *args, **kwargs):
    """``Statistics.output``: the ``Step n/total`` line, ending in the time left when its run is known."""
    import onmt.utils.statistics as statistics

    run, now = _RUNS.get(start), time.time()
    seconds = run.left(step, num_steps, now) if run is not None else None
    if run is not None:
        run.reported(step, now)
    if seconds is None:
        return stock(self, step, num_steps, learning_rate, start, *args, **kwargs)
    logger = statistics.logger
    statistics.logger = _Suffixed(logger, f" {eta_text(seconds)};")
    try:
        return stock(self, step, num_steps, learning_rate, start, *args, **kwargs)
    finally:
        statistics.logger = logger


def install():
    """Wrap ``Translator._translate``, ``translate`` and the training report (see the module docstring)."""
    from onmt.bin import translate
    from onmt.trainer import Trainer
    from onmt.translate.translator import Translator
    from onmt.utils.statistics import Statistics

    patch(Translator, "_translate", _translate_with_progress, kind=MESSAGE,
          test="tests/integration/test_progress_cli.py::test_translation_shows_its_progress_on_stderr",
          reason="onmt_translate shows no progress until it ends; the sentences translated, the rate and the time "
                 "left go to stderr, the output file is not touched")
    patch(translate, "translate", _translate_knowing_training_length, kind=MESSAGE, order=2,
          test="tests/integration/test_progress_cli.py::test_lines_longer_than_training_get_one_warning",
          reason="a source line many times longer than any the model was trained on is translated without a word")
    test = "tests/unit/test_progress.py::test_the_training_report_ends_in_the_time_left"
    reason = "onmt_train's Step n/total line gives the seconds since the start but not the time left"
    patch(Trainer, "_start_report_manager", _start_report_manager_noting_step, kind=MESSAGE, test=test,
          reason=reason)
    patch(Statistics, "output", _output_with_time_left, kind=MESSAGE, test=test, reason=reason)
    patch(Trainer, "_maybe_report_training", _report_or_heartbeat, kind=MESSAGE,
          test="tests/unit/test_progress.py::test_a_silent_training_writes_a_line_between_reports",
          reason="with slow steps (a loaded machine, a large model) -report_every steps can take many minutes, "
                 "with nothing written in between")
