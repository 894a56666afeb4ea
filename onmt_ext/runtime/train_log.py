"""One reader of OpenNMT-py 3.5.1 training logs, shared by the tools.

``onmt_train`` writes the same lines to the console and to ``-log_file``:

* ``Step <n>/<total>; acc: ..; ppl: ..; xent: ..; lr: ..; sents: ..; bsz: ..; <src>/<tgt> tok/s; <t> sec;``
  every ``report_every`` steps: a :class:`StepRecord`;
* ``Validation perplexity: <p>`` and ``Validation accuracy: <a>``, after ``valid stats calculation took: <s> s.``,
  at every ``valid_steps``: a :class:`ValidRecord`;
* ``* number of parameters: <n>`` once, when the model is built.

The validation lines do not name their step: a validation gets the first multiple of k at or after the last
reported step, from the line ``Start training loop and validate every <k> steps...``, or without that line the
last reported step.  A step logged twice (a resumed run appends) keeps its last values.  docs/compare.md.
"""

import re
import statistics
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
_STEP = re.compile(r"Step\s+(\d+)(?:/\s*(\d+))?;\s*acc:\s*([^;]+);\s*ppl:\s*([^;]+);\s*xent:\s*([^;]+);"
                   r"\s*lr:\s*([^;]+);.*?([\d.]+)/\s*([\d.]+) tok/s;\s*([\d.]+) sec;")
_VALID = re.compile(r"Validation (perplexity|accuracy):\s*(\S+)")
_VALID_TIME = re.compile(r"took:\s*([\d.eE+-]+) s\.")
_VALID_EVERY = re.compile(r"Start training loop and validate every (\d+) steps")
_PARAMS = re.compile(r"\* number of parameters: (\d+)")


def _number(text):
    """``float(text)``, or None for text that is not a number (``nan`` stays a float)."""
    try:
        return float(text)
    except ValueError:
        return None


def _time(line):
    match = _TIME.match(line)
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f") if match else None


@dataclass
class StepRecord:
    """One training report: the statistics of the steps since the previous report.

    ``src_tok_s``/``tgt_tok_s`` are tokens per second over the time since
    that report, which includes a validation run in between
    (``after_validation``).  ``seconds`` counts from the start of training;
    ``time`` is the line's timestamp.
    """

    step: int
    total: int
    acc: float
    ppl: float
    xent: float
    lr: float
    src_tok_s: float
    tgt_tok_s: float
    seconds: float
    time: datetime = None
    after_validation: bool = False


@dataclass
class ValidRecord:
    """One validation: perplexity and accuracy on the validation set, and the seconds it took."""

    step: int
    ppl: float = None
    acc: float = None
    seconds: float = None
    time: datetime = None


@dataclass
class TrainLog:
    """The records of one training log, each list sorted by step."""

    steps: list = field(default_factory=list)
    valid: list = field(default_factory=list)
    parameters: int = None
    valid_every: int = None

    def tokens_per_second(self):
        """Mean target tokens/s over the step reports, leaving out the first (start-up) and those that
        include a validation; None without such reports."""
        speeds = [r.tgt_tok_s for r in self.steps[1:] if not r.after_validation] or \
            [r.tgt_tok_s for r in self.steps]
        return statistics.fmean(speeds) if speeds else None

    def seconds_per_step(self):
        """Wall-clock seconds per training step between consecutive reports (timestamps), leaving out the
        first report and the intervals that hold a validation; None with fewer than two such reports."""
        seconds = steps = 0.0
        for before, after in zip(self.steps[1:], self.steps[2:]):
            if after.after_validation or before.time is None or after.time is None or after.step <= before.step:
                continue
            seconds += (after.time - before.time).total_seconds()
            steps += after.step - before.step
        return seconds / steps if steps else None

    def valid_seconds(self):
        """Mean seconds of one validation run, None when none was timed."""
        times = [r.seconds for r in self.valid if r.seconds is not None]
        return statistics.fmean(times) if times else None

    def last_step(self):
        """The highest step reported, 0 before the first report."""
        return max((r.step for r in self.steps), default=0)


def parse(text):
    """The :class:`TrainLog` of the text of an OpenNMT-py training log."""
    steps, valid = {}, {}
    parameters = valid_every = None
    last_step = last_valid = current = valid_seconds = None
    validated_since_report = False
    for line in text.splitlines():
        match = _STEP.search(line)
        if match:
            step = int(match.group(1))
            values = [_number(match.group(k).strip()) for k in range(3, 10)]
            steps[step] = StepRecord(step, int(match.group(2)) if match.group(2) else None, *values, time=_time(line),
                                     after_validation=validated_since_report)
            last_step, validated_since_report, current = step, False, None
            continue
        match = _VALID.search(line)
        if match and match.group(1) == "perplexity":
            step = _validation_step(last_step, last_valid if validated_since_report else None, valid_every)
            current = None
            if step is not None:
                current = valid[step] = ValidRecord(step, _number(match.group(2)), None, valid_seconds, _time(line))
                last_valid, validated_since_report = step, True
            valid_seconds = None
        elif match:
            if current is not None:
                current.acc, current = _number(match.group(2)), None
        elif _VALID_TIME.search(line):
            valid_seconds = _number(_VALID_TIME.search(line).group(1))
        elif _VALID_EVERY.search(line):
            valid_every, validated_since_report = int(_VALID_EVERY.search(line).group(1)), False
        elif _PARAMS.search(line):
            parameters = int(_PARAMS.search(line).group(1))
    return TrainLog([steps[s] for s in sorted(steps)], [valid[s] for s in sorted(valid)], parameters, valid_every)


def _validation_step(last_step, last_valid, valid_every):
    """The step of a validation read after the report of ``last_step`` (None before any) and, with no report
    in between, after the validation of ``last_valid``: the next multiple of ``valid_every`` when the log
    names it, else ``last_step``."""
    if not valid_every:
        return last_step
    step = max(valid_every, -(-(last_step or 0) // valid_every) * valid_every)
    if last_valid is not None and step <= last_valid:
        step = last_valid + valid_every
    return step


def read(path):
    """The :class:`TrainLog` of a log file; an empty one when the file does not exist."""
    path = Path(path)
    if not path.exists():
        return TrainLog()
    return parse(path.read_text(encoding="utf-8", errors="replace"))
