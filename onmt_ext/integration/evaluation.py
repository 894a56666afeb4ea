"""Corpus-level MT evaluation on top of sacreBLEU's Python API.

Every score is computed by sacreBLEU (``sacrebleu.metrics.BLEU``, ``CHRF``, ``sacrebleu.significance.PairedTest``);
this module reads the files, checks them and arranges the data in sacreBLEU's layout: ``hyps[i]`` is segment i,
``refs[k][i]`` the k-th reference of segment i.  Segments with fewer references are padded with ``None``
(:func:`read_reference_tsv`), never ``""``, which would be an empty reference (docs/reproduce.md).  Every problem
with the user's input raises :class:`EvaluationError`, naming the file (and line).
"""

import bisect
import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.metrics.base import Metric
from sacrebleu.significance import PairedTest

PathLike = Union[str, "os.PathLike[str]"]
References = List[List[Optional[str]]]

#: Metric keys accepted by :func:`compute_metric` and :func:`paired_bootstrap`.
METRIC_NAMES = ("bleu", "bleu-zh", "tok-bleu", "chrf")

#: Environment variable through which sacreBLEU's ``PairedTest`` takes its seed.
_SEED_VARIABLE = "SACREBLEU_SEED"


class EvaluationError(ValueError):
    """A problem with the evaluation input; the message names the file and line."""


@dataclass(frozen=True)
class MetricResult:
    """One corpus-level score.

    ``metric`` is this module's key (``bleu``, ``tok-bleu``, ``chrf``),
    ``name`` sacreBLEU's name for the score (``BLEU``, ``chrF2``), ``score``
    the unrounded score in [0, 100], ``signature`` sacreBLEU's full
    reproducibility signature and ``formatted`` sacreBLEU's one-line result
    (``name|signature = score ...``, with the n-gram precisions, brevity
    penalty and lengths for BLEU, two decimals), exactly as
    ``sacrebleu -f text -w 2`` prints it.
    """

    metric: str
    name: str
    score: float
    signature: str
    formatted: str


@dataclass(frozen=True)
class BootstrapResult:
    """Outcome of a paired bootstrap resampling test of a system against a baseline.

    ``system_score``/``baseline_score`` are the corpus scores, ``delta`` their
    difference (system minus baseline), ``system_mean``/``system_ci`` and
    ``baseline_mean``/``baseline_ci`` the bootstrap mean and the half-width of
    the 95% confidence interval, ``p_value`` the two-sided p-value of the
    difference, ``marker`` the significance marker of
    :func:`significance_marker` and ``signature`` sacreBLEU's signature
    (including the number of resamples and the seed).
    """

    metric: str
    name: str
    system_score: float
    baseline_score: float
    delta: float
    system_mean: float
    system_ci: float
    baseline_mean: float
    baseline_ci: float
    p_value: float
    marker: str
    n_samples: int
    seed: int
    signature: str


@dataclass(frozen=True)
class LengthBucket:
    """Corpus BLEU (13a) of the segments whose source length is in one bucket.

    ``min_length``/``max_length`` are the inclusive bounds of the source length
    in whitespace tokens (``max_length`` is ``None`` for the open last bucket),
    ``label`` their text form (``0-10``, ``11-20``, ..., ``51+``), ``count`` the
    number of segments; ``score`` and ``signature`` are ``None`` for an empty
    bucket.
    """

    label: str
    min_length: int
    max_length: Optional[int]
    count: int
    score: Optional[float]
    signature: Optional[str]


# --------------------------------------------------------------------------
# Reading files
# --------------------------------------------------------------------------

def _read_lines(path: PathLike, kind: str) -> List[str]:
    """Read a UTF-8 text file as a list of lines.

    The lines are split on ``\\n`` only (so that Unicode line separators inside
    a segment cannot change the number of segments); a line end ``\\r\\n``
    counts as a newline; a leading byte-order mark is removed; nothing else is
    stripped.  A final line without a newline is kept.  ``kind`` names the
    file in error messages (e.g. ``hypothesis file``).
    """
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise EvaluationError(f"{kind} {path}: no such file") from None
    except OSError as exc:
        raise EvaluationError(f"{kind} {path}: cannot read ({exc.strerror})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line_start = data.rfind(b"\n", 0, exc.start) + 1
        line_number = data.count(b"\n", 0, exc.start) + 1
        raise EvaluationError(
            f"{kind} {path}, line {line_number}: invalid UTF-8 "
            f"(byte 0x{data[exc.start]:02x} at byte {exc.start - line_start + 1} of the line)"
        ) from None
    if text.startswith("\ufeff"):
        text = text[1:]
    if not text:
        raise EvaluationError(f"{kind} {path} is empty (0 lines)")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def read_hypotheses(path: PathLike, what: str = "hypothesis file") -> List[str]:
    """Read a system output: one UTF-8 segment per line.

    Returns the list of segments.  Only a leading byte-order mark and the line
    ends (``\\n`` or ``\\r\\n``) are removed.  Raises :class:`EvaluationError`
    for a missing or unreadable file, an empty file (zero lines) and invalid
    UTF-8 (the message gives the line number); ``what`` names the file in the
    message (e.g. ``baseline file``, ``source file`` for other one-segment-
    per-line files).
    """
    return _read_lines(path, what)


def read_references(paths: Union[PathLike, Sequence[PathLike]]) -> References:
    """Read one or more plain reference files (one reference per line).

    ``paths`` is a sequence of files (a single path is accepted too); file *k*
    holds reference *k* of every segment.  Returns the reference streams in
    sacreBLEU's layout: ``refs[k][i]`` is line *i* of file *k*.  All files must
    have the same number of lines, otherwise :class:`EvaluationError` names
    every file with its line count.  Lines are read as by
    :func:`read_hypotheses`.  A file in which half of the lines or more hold
    a tab is a TSV (source and references) given by mistake:
    :class:`EvaluationError` points to :func:`read_reference_tsv`.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if not paths:
        raise EvaluationError("no reference file given")
    streams = [_read_lines(path, "reference file") for path in paths]
    for path, stream in zip(paths, streams):
        tabbed = [number for number, line in enumerate(stream, 1) if "\t" in line]
        if tabbed and len(tabbed) * 2 >= len(stream):  # a TSV of source and references, not plain references
            raise EvaluationError(f"reference file {path}: {len(tabbed)} of its {len(stream)} lines hold a tab "
                                  f"(first: line {tabbed[0]}), so it looks like a source<TAB>references TSV; "
                                  "give it with --ref-tsv, or the scores would count the source as reference text")
    if len({len(stream) for stream in streams}) > 1:
        counts = ", ".join(f"{path} has {len(stream)}" for path, stream in zip(paths, streams))
        raise EvaluationError(f"reference files have different numbers of lines: {counts}")
    return streams


def read_reference_tsv(path: PathLike, skip_columns: int = 1) -> References:
    """Read a multi-reference TSV file with a variable number of references per line.

    Each line is ``source<TAB>ref1<TAB>ref2...``: the first ``skip_columns``
    columns (the source, by default) are not references, every later column is
    one reference.  Empty or whitespace-only reference columns are not
    references.  Every line needs at least one reference, otherwise
    :class:`EvaluationError` names the file and line.

    Returns the reference streams in sacreBLEU's layout, as many streams as the
    largest number of references on a line: ``refs[k][i]`` is the *k*-th
    reference of line *i*, or ``None`` when line *i* has fewer than *k + 1*
    references (sacreBLEU ignores ``None`` references, see the module
    documentation).  Stream 0 is therefore always complete.
    """
    if isinstance(skip_columns, bool) or not isinstance(skip_columns, int) or skip_columns < 0:
        raise EvaluationError(f"skip_columns must be a non-negative integer, not {skip_columns!r}")
    per_line = []
    for number, line in enumerate(_read_lines(path, "reference TSV"), 1):
        refs = [field for field in line.split("\t")[skip_columns:] if field.strip()]
        if not refs:
            raise EvaluationError(
                f"reference TSV {path}, line {number}: no reference "
                f"(expected {skip_columns} non-reference column(s) then at least one reference, tab-separated)"
            )
        per_line.append(refs)
    width = max(len(refs) for refs in per_line)
    return [[refs[k] if k < len(refs) else None for refs in per_line] for k in range(width)]


def read_sources_from_tsv(path: PathLike) -> List[str]:
    """Return column 0 (the source segment) of every line of a reference TSV file.

    The file is read as by :func:`read_reference_tsv`; a line without a tab is
    its own column 0.
    """
    return [line.split("\t", 1)[0] for line in _read_lines(path, "reference TSV")]


# --------------------------------------------------------------------------
# Input checks
# --------------------------------------------------------------------------

def check_same_length(first: Sequence, second: Sequence, first_name: str, second_name: str) -> None:
    """Raise :class:`EvaluationError` unless two parallel lists have the same length.

    The message names both (``first_name``/``second_name``, e.g. the files they
    were read from) and gives both lengths.
    """
    if len(first) != len(second):
        raise EvaluationError(
            f"length mismatch: {first_name} has {len(first)} segments, {second_name} has {len(second)}"
        )


def validate_inputs(hyps: Sequence[str], refs: References,
                    hyps_name: str = "hypotheses", refs_name: str = "references") -> None:
    """Check that hypotheses and reference streams fit together.

    ``hyps`` is a list of segments, ``refs`` a list of reference streams (see
    the module documentation).  Raises :class:`EvaluationError`, naming
    ``hyps_name``/``refs_name``, when there are no hypotheses or no reference
    streams, when the streams or the hypotheses differ in length, or when a
    segment has no reference at all (every stream ``None``).
    """
    if not hyps:
        raise EvaluationError(f"{hyps_name} contains no segment")
    if not refs:
        raise EvaluationError(f"{refs_name} contains no reference stream")
    for k, stream in enumerate(refs[1:], 2):
        check_same_length(stream, refs[0], f"{refs_name} (stream {k})", f"{refs_name} (stream 1)")
    check_same_length(hyps, refs[0], hyps_name, refs_name)
    for i, segment_refs in enumerate(zip(*refs), 1):
        if all(ref is None for ref in segment_refs):
            raise EvaluationError(f"{refs_name}: segment {i} has no reference")


# --------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------

def _make_metric(metric: str) -> Metric:
    """Return a new sacreBLEU metric object for one of :data:`METRIC_NAMES`."""
    if metric == "bleu":
        return BLEU(tokenize="13a", lowercase=False)
    if metric == "bleu-zh":  # Chinese output: sacreBLEU's zh tokenizer (characters), as WMT scores it
        return BLEU(tokenize="zh", lowercase=False)
    if metric == "tok-bleu":
        return BLEU(tokenize="none", smooth_method="none", force=True, lowercase=False)
    if metric == "chrf":
        return CHRF()
    raise EvaluationError(f"unknown metric {metric!r} (choose from {', '.join(METRIC_NAMES)})")


def compute_metric(metric: str, hyps: Sequence[str], refs: References) -> MetricResult:
    """Compute one corpus-level metric through sacreBLEU.

    ``metric`` is one of :data:`METRIC_NAMES` (see :func:`nist_bleu`,
    :func:`tokenized_bleu`, :func:`chrf`); ``hyps`` is a list of segments and
    ``refs`` a list of reference streams, checked by :func:`validate_inputs`.
    """
    scorer = _make_metric(metric)
    validate_inputs(hyps, refs)
    score = scorer.corpus_score(hyps, refs)
    signature = scorer.get_signature().format()
    return MetricResult(
        metric=metric,
        name=score.name,
        score=float(score.score),
        signature=signature,
        formatted=score.format(width=2, signature=signature),
    )


def nist_bleu(hyps: Sequence[str], refs: References) -> MetricResult:
    """Case-sensitive corpus BLEU with the 13a (mteval-v13a) tokenizer.

    This is the NIST-style multi-reference BLEU reported in papers
    (sacreBLEU's default: exponential smoothing, n-grams up to 4, clipping
    against all references of a segment and the closest reference length).
    ``hyps`` is a list of detokenized segments, ``refs`` a list of reference
    streams (``None`` entries allowed, see the module documentation).
    """
    return compute_metric("bleu", hyps, refs)


def tokenized_bleu(hyps: Sequence[str], refs: References) -> MetricResult:
    """Corpus BLEU equivalent to Moses' ``multi-bleu.perl``.

    Case-sensitive, no tokenization (the text is split on whitespace as it is,
    so hypotheses and references must already be tokenized the same way), no
    smoothing, and sacreBLEU's "looks tokenized" warning disabled
    (``force=True``).  Input layout as for :func:`nist_bleu`.
    """
    return compute_metric("tok-bleu", hyps, refs)


def chrf(hyps: Sequence[str], refs: References) -> MetricResult:
    """Corpus chrF2 with sacreBLEU's defaults (character 6-grams, beta 2, case-sensitive).

    With several references each segment is scored against its best
    reference; ``None`` references are ignored, so a segment is scored against
    the references it really has (see the module documentation).  Input layout
    as for :func:`nist_bleu`.
    """
    return compute_metric("chrf", hyps, refs)


# --------------------------------------------------------------------------
# Significance
# --------------------------------------------------------------------------

def significance_marker(p_value: float) -> str:
    """Return the paper convention's marker for a p-value.

    ``"‡"`` for p < 0.01, ``"†"`` for p < 0.05, ``""`` otherwise.  The test is
    two-sided: a marker says the system differs significantly from the
    baseline; the sign of the score difference says in which direction.
    """
    if p_value < 0.01:
        return "‡"
    if p_value < 0.05:
        return "†"
    return ""


@contextlib.contextmanager
def _sacrebleu_seed(seed: int):
    """Set sacreBLEU's seed variable for the duration of the block, then restore it."""
    previous = os.environ.get(_SEED_VARIABLE)
    os.environ[_SEED_VARIABLE] = str(seed)
    try:
        yield
    finally:
        if previous is None:
            del os.environ[_SEED_VARIABLE]
        else:
            os.environ[_SEED_VARIABLE] = previous


def _check_positive_int(value: int, what: str) -> None:
    """Raise :class:`EvaluationError` unless ``value`` is an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise EvaluationError(f"{what} must be a positive integer, not {value!r}")


def paired_bootstrap(baseline_hyps: Sequence[str], system_hyps: Sequence[str], refs: References,
                     metric: str = "bleu", n_samples: int = 1000, seed: int = 12345) -> BootstrapResult:
    """Paired bootstrap resampling test of a system against a baseline.

    Runs sacreBLEU's ``PairedTest`` with ``test_type="bs"`` exactly as
    ``sacrebleu REFS -i BASELINE SYSTEM --paired-bs --paired-bs-n N`` does
    (Koehn 2004 as in Moses' ``bootstrap-hypothesis-difference-significance.pl``):
    ``n_samples`` resamples of the segment indices, shared by both systems,
    drawn from numpy's generator seeded with ``seed`` (passed to sacreBLEU
    through its ``SACREBLEU_SEED`` variable, which is restored afterwards; the
    call is therefore not thread-safe).  ``seed`` must be >= 1 because
    sacreBLEU treats seed 0 as "unseeded".

    ``baseline_hyps`` and ``system_hyps`` are lists of segments and ``refs`` a
    list of reference streams; ``metric`` is one of :data:`METRIC_NAMES`.

    The p-value is sacreBLEU's, except 1.0 when the two corpus scores are
    equal: sacreBLEU counts resampled differences *strictly* greater than the
    observed one, so identical systems would get its minimum 1/(n_samples + 1).
    The marker is :func:`significance_marker`'s.
    """
    _check_positive_int(n_samples, "the number of bootstrap samples")
    _check_positive_int(seed, "the bootstrap seed")
    scorer = _make_metric(metric)
    validate_inputs(baseline_hyps, refs, hyps_name="baseline hypotheses")
    validate_inputs(system_hyps, refs, hyps_name="system hypotheses")
    with _sacrebleu_seed(seed):
        test = PairedTest([("baseline", list(baseline_hyps)), ("system", list(system_hyps))],
                          {metric: scorer}, references=refs, test_type="bs",
                          n_samples=n_samples, n_jobs=1)
        signatures, scores = test()
    (name,) = signatures
    baseline, system = scores[name]
    p_value = 1.0 if system.score == baseline.score else float(system.p_value)
    return BootstrapResult(
        metric=metric,
        name=name,
        system_score=float(system.score),
        baseline_score=float(baseline.score),
        delta=float(system.score - baseline.score),
        system_mean=float(system.mean),
        system_ci=float(system.ci),
        baseline_mean=float(baseline.mean),
        baseline_ci=float(baseline.ci),
        p_value=p_value,
        marker=significance_marker(p_value),
        n_samples=n_samples,
        seed=seed,
        signature=signatures[name].format(),
    )


# --------------------------------------------------------------------------
# Analysis by source length
# --------------------------------------------------------------------------

def _length_ranges(buckets: Sequence[int]) -> List[Tuple[int, Optional[int]]]:
    """Turn bucket upper bounds into inclusive (min, max) length ranges, the last one open."""
    bounds = list(buckets)
    if (not bounds or any(isinstance(b, bool) or not isinstance(b, int) for b in bounds)
            or bounds[0] < 1 or any(a >= b for a, b in zip(bounds, bounds[1:]))):
        raise EvaluationError(f"length buckets must be strictly increasing positive integers, not {buckets!r}")
    lows = [0] + [b + 1 for b in bounds]
    return list(zip(lows, bounds + [None]))


def _bucket_members(sources: Sequence[str], buckets: Sequence[int]):
    """``(ranges, members)``: the inclusive length ranges and the segment indices in each."""
    ranges = _length_ranges(buckets)
    members: List[List[int]] = [[] for _ in ranges]
    bounds = [high for _, high in ranges[:-1]]
    for i, source in enumerate(sources):
        members[bisect.bisect_left(bounds, len(source.split()))].append(i)
    return ranges, members


def _bucket_label(low: int, high: Optional[int]) -> str:
    return f"{low}-{high}" if high is not None else f"{low}+"


def bleu_by_length(hyps: Sequence[str], refs: References, sources: Sequence[str],
                   buckets: Sequence[int] = (10, 20, 30, 40, 50), metric: str = "bleu") -> List[LengthBucket]:
    """Corpus BLEU (as :func:`nist_bleu`, or ``metric``) per bucket of source length.

    The length of a segment is the number of whitespace-separated tokens of
    its source ``sources[i]``.  ``buckets`` are the inclusive upper bounds of
    the buckets: the default gives (0, 10], (10, 20], ..., (40, 50] and
    (50, inf), i.e. lengths 0-10 (an empty source counts in the first bucket),
    11-20, ..., 41-50 and 51+.  ``hyps``, ``refs`` and ``sources`` are parallel
    (segments, reference streams, segments).  Returns one :class:`LengthBucket`
    per bucket, in order; an empty bucket has count 0 and score ``None``.
    """
    validate_inputs(hyps, refs)
    check_same_length(sources, hyps, "sources", "hypotheses")
    ranges, members = _bucket_members(sources, buckets)
    result = []
    for (low, high), indices in zip(ranges, members):
        label = _bucket_label(low, high)
        if not indices:
            result.append(LengthBucket(label, low, high, 0, None, None))
            continue
        bleu = compute_metric(metric, [hyps[i] for i in indices], [[stream[i] for i in indices] for stream in refs])
        result.append(LengthBucket(label, low, high, len(indices), bleu.score, bleu.signature))
    return result


@dataclass(frozen=True)
class LengthComparison:
    """A system against a baseline on the segments of one source-length bucket.

    ``label``, ``min_length``, ``max_length`` and ``count`` as in
    :class:`LengthBucket`; ``bootstrap`` is the :class:`BootstrapResult` of
    the paired bootstrap test on the bucket's segments (its
    ``baseline_score``, ``system_score``, ``delta``, ``p_value`` and
    ``marker``), ``None`` for an empty bucket.
    """

    label: str
    min_length: int
    max_length: Optional[int]
    count: int
    bootstrap: Optional[BootstrapResult]


def compare_by_length(baseline_hyps: Sequence[str], system_hyps: Sequence[str], refs: References,
                      sources: Sequence[str], buckets: Sequence[int] = (10, 20, 30, 40, 50),
                      metric: str = "bleu", n_samples: int = 1000, seed: int = 12345) -> List[LengthComparison]:
    """Per bucket of source length: both systems' scores, the difference and its paired-bootstrap p-value.

    The claim of the clause-attention paper (its Tables 6-9) is about long
    sentences; this splits the test set by source length (buckets as in
    :func:`bleu_by_length`) and runs :func:`paired_bootstrap` on each bucket
    separately (the same ``seed`` in every bucket).
    """
    validate_inputs(baseline_hyps, refs, hyps_name="baseline hypotheses")
    validate_inputs(system_hyps, refs, hyps_name="system hypotheses")
    check_same_length(sources, system_hyps, "sources", "hypotheses")
    ranges, members = _bucket_members(sources, buckets)
    result = []
    for (low, high), indices in zip(ranges, members):
        test = None
        if indices:
            test = paired_bootstrap([baseline_hyps[i] for i in indices], [system_hyps[i] for i in indices],
                                    [[stream[i] for i in indices] for stream in refs], metric=metric,
                                    n_samples=n_samples, seed=seed)
        result.append(LengthComparison(_bucket_label(low, high), low, high, len(indices), test))
    return result


def plot_by_length(comparisons: Sequence[LengthComparison], path: PathLike, title: str = "",
                   names: Tuple[str, str] = ("baseline", "system")) -> None:
    """Write a figure of :func:`compare_by_length`'s result to ``path`` (PNG, PDF or SVG by its suffix).

    Top: the two systems' scores per bucket; bottom: the difference with its
    significance marker; the x axis names each bucket and its segment count.
    """
    import matplotlib  # here: about half a second to import, and only this figure needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [c for c in comparisons if c.bootstrap is not None]
    if not shown:
        raise EvaluationError("no bucket has any segment: nothing to plot")
    x = list(range(len(shown)))
    labels = [f"{c.label}\n({c.count})" for c in shown]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(5.0, 1.1 * len(shown) + 2), 5.5), sharex=True,
                                      gridspec_kw={"height_ratios": [2, 1]})
    metric = shown[0].bootstrap.metric
    for offset, (name, key) in zip((-0.2, 0.2), zip(names, ("baseline_score", "system_score"))):
        top.bar([i + offset for i in x], [getattr(c.bootstrap, key) for c in shown], width=0.4, label=name)
    top.set_ylabel(metric)
    top.legend()
    deltas = [c.bootstrap.delta for c in shown]
    bottom.bar(x, deltas, color=["tab:green" if d >= 0 else "tab:red" for d in deltas])
    for i, c in zip(x, shown):
        if c.bootstrap.marker:
            bottom.annotate(c.bootstrap.marker, (i, c.bootstrap.delta), ha="center",
                            va="bottom" if c.bootstrap.delta >= 0 else "top")
    bottom.axhline(0, color="black", linewidth=0.8)
    bottom.set_ylabel(f"{names[1]} - {names[0]}")
    bottom.set_xticks(x, labels)
    bottom.set_xlabel("source length (tokens), segments in parentheses; \u2020 p < 0.05, \u2021 p < 0.01")
    if title:
        top.set_title(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def references_per_segment(refs: References) -> Dict[str, int]:
    """Return the smallest and largest number of (non-``None``) references of a segment.

    ``refs`` is a list of reference streams; the result is
    ``{"min": ..., "max": ...}``.
    """
    counts = [sum(ref is not None for ref in segment) for segment in zip(*refs)]
    return {"min": min(counts), "max": max(counts)}
