"""Checks of the text files OpenNMT-py reads, so that a damaged corpus stops with a message, not a traceback.

:func:`check_corpus` reads each file once per process (one pass over the bytes with an incremental UTF-8 decoder
that also counts empty lines) and raises :class:`CorpusError` naming the corpus, the file and the line, for
source and target files of different line counts and for text that is not UTF-8.  :func:`install` runs it
where OpenNMT-py validates its options, before anything is built, and

* refuses a training corpus too small for the data workers' shares (:func:`check_shares`), and a corpus, share or
  validation set without a pair with text on both sides (:func:`check_pairs`);
* strips a leading byte-order mark when a corpus is read (logged);
* skips, in training, validation and vocabulary corpora, every pair with an empty source or target (one warning
  per file; ``-skip_empty_level error`` stops instead, ``silent`` logs at info level);
* refuses an ``onmt_translate -src`` with empty lines, naming them (a ``-tgt`` with empty lines is a warning);
* passes over a bucket of dropped pairs; names corpora whose every pair is, or a validation without a batch.
What stock OpenNMT-py 3.5.1 does instead: docs/differences-from-stock.md.
"""

import codecs
import os
import re
from typing import NamedTuple, Tuple

import yaml

from onmt_ext.patches import FIX, is_ours, patch

# OpenNMT-py is imported inside the functions: importing it while this module initialises would activate
# onmt-ext (onmt_ext._autoload) before this module is whole.

_BOM = "\ufeff"
_BLOCK = 1 << 24
#: The newline before a whitespace-only line (what ``str.strip`` empties), in ``"\n"`` + complete lines of text.
_BEFORE_EMPTY_LINE = re.compile(r"\n(?=[^\S\n]*\n)")
#: How many line numbers a message lists.
SHOWN_LINES = 5
_checked = {}
#: :func:`_shares_with_text` of files and shares already read, by their keys.
_shares_found = {}
#: Messages already logged in this process (OpenNMT-py validates the data options more than once per run).
_logged = set()


class CorpusError(SystemExit):
    """A corpus file cannot be used as it is; the message names the corpus, the file and the line.

    ``status`` is the exit status the command ends with: 1 (the file's
    content), or 2 for a path that names no file (a usage error).
    """

    def __init__(self, message, status=1):
        super().__init__(f"error: {message}")
        self.message, self.status = message, status


class NoKeptPair(CorpusError, RuntimeError):
    """The transforms drop every training pair that one data worker reads (it would never make a batch), or every
    validation pair (exit 2).

    Also a ``RuntimeError``, so that a DataLoader worker hands it on (torch's worker loop passes Exceptions only);
    the training process rebuilds it as ``NoKeptPair("Caught NoKeptPair ... Original Traceback ...")``
    (``torch._utils.ExceptionWrapper.reraise``), whose last line holds the message, taken back here.
    """

    def __init__(self, message, status=2):
        if message.startswith(f"Caught {type(self).__name__} "):
            message = message.rstrip().rsplit("\n", 1)[-1].partition(": error: ")[2] or message
        super().__init__(message, status)


class FileScan(NamedTuple):
    """What one pass over a text file found.

    Attributes:
        lines: number of lines (a last line without a newline counts).
        has_bom: the file starts with a UTF-8 byte-order mark.
        empty: number of empty or whitespace-only lines (those OpenNMT-py strips to nothing).
        empty_lines: the first :data:`SHOWN_LINES` of them, 1-based.
    """

    lines: int
    has_bom: bool
    empty: int = 0
    empty_lines: Tuple[int, ...] = ()


def scan_file(path):
    """:class:`FileScan` of a UTF-8 text file; :class:`CorpusError` at the first line that is not UTF-8.

    A last line without a newline counts as a line.  A line is empty when
    nothing but whitespace (``str.isspace``) is left of it once a leading
    byte-order mark is removed.
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
    lines, tail_open, has_bom = 0, False, False
    text_lines, carry, empty, shown, bom_pending = 0, "", 0, [], True
    try:
        handle = open(path, "rb")
    except OSError as error:
        raise CorpusError(f"cannot read {path}: {error.strerror}") from None
    with handle:
        first = True
        while True:
            block = handle.read(_BLOCK)
            if not block:
                break
            if first:
                has_bom, first = block.startswith(codecs.BOM_UTF8), False
            try:
                text = decoder.decode(block)
            except UnicodeDecodeError as error:
                line = lines + block.count(b"\n", 0, max(0, error.start)) + 1
                raise CorpusError(f"{path}, line {line}: not UTF-8 ({error.reason}); OpenNMT-py reads UTF-8 "
                                  "only: convert the file (e.g. iconv -f <encoding> -t utf-8)") from None
            lines += block.count(b"\n")
            tail_open = not block.endswith(b"\n")
            if bom_pending and text:
                text, bom_pending = (text[1:] if text.startswith(_BOM) else text), False
            text = carry + text
            cut = text.rfind("\n") + 1  # complete lines only; the rest waits for the next block
            complete, carry = text[:cut], text[cut:]
            if carry and not carry.isspace():
                carry = "x"  # that line is not empty; keep no more of it (a file without newlines stays cheap)
            for match in _BEFORE_EMPTY_LINE.finditer("\n" + complete):  # match.start(): where the line starts
                empty += 1
                if len(shown) < SHOWN_LINES:
                    shown.append(text_lines + complete.count("\n", 0, match.start()) + 1)
            text_lines += complete.count("\n")
        try:
            carry += decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            raise CorpusError(f"{path}, line {lines + 1}: ends inside a UTF-8 character (truncated file?)") from None
    if carry and carry.isspace():
        empty += 1
        if len(shown) < SHOWN_LINES:
            shown.append(text_lines + 1)
    return FileScan(lines + (1 if tail_open else 0), has_bom, empty, tuple(shown))


def _file_key(path):
    stat = os.stat(path)
    return os.path.abspath(path), stat.st_size, stat.st_mtime_ns


def _scan_cached(path):
    key = _file_key(path)
    if key not in _checked:
        _checked[key] = scan_file(path)
    return _checked[key]


def check_corpus(name, src, tgt=None):
    """Check one corpus (``src``, and ``tgt`` when given): UTF-8 throughout and the same number of lines.

    Returns ``(lines, bom)`` with ``bom`` True when either file starts with a byte-order mark.
    """
    src_scan = _scan_cached(src)
    if tgt is None:
        return src_scan.lines, src_scan.has_bom
    tgt_scan = _scan_cached(tgt)
    if src_scan.lines != tgt_scan.lines:
        raise CorpusError(f"corpus {name!r}: {src} has {src_scan.lines} lines but {tgt} has {tgt_scan.lines}; "
                          "OpenNMT-py would silently drop the extra lines and misalign the pairs after a missing one")
    return src_scan.lines, src_scan.has_bom or tgt_scan.has_bom


def _line_list(numbers, count):
    """``line 3`` / ``lines 3, 8, 10, …`` for the first line numbers of ``count`` lines."""
    listed = ", ".join(str(number) for number in numbers)
    more = ", …" if count > len(numbers) else ""
    return f"line {listed}" if count == 1 else f"lines {listed}{more}"


def _empty_line_messages(paths):
    """``<file> has N empty line(s) (lines …)`` for each of ``paths`` (None skipped) with empty lines."""
    messages = []
    for path in paths:
        if path is None:
            continue
        scan = _scan_cached(path)
        if scan.empty:
            plural = "s" if scan.empty > 1 else ""
            messages.append(f"{path} has {scan.empty} empty line{plural} ({_line_list(scan.empty_lines, scan.empty)})")
    return messages


def report_empty_lines(name, src, tgt=None, level="warning"):
    """Log the empty lines of a training/validation corpus (``src``, ``tgt``), or refuse them.

    ``level`` is OpenNMT-py's ``-skip_empty_level``: ``"warning"`` logs one
    warning per file with empty lines, ``"silent"`` logs the same at info
    level, ``"error"`` raises :class:`CorpusError`.  The pairs on those lines
    are skipped by the data iterator (see :func:`install`).  Returns the
    messages (empty list: no empty line).
    """
    from onmt.utils.logging import logger

    found = _empty_line_messages((src, tgt))
    if not found:
        return []
    if level == "error":
        raise CorpusError(f"corpus {name!r}: " + "; ".join(found) + " (-skip_empty_level error): remove those "
                          "pairs from both files, or let them be skipped with -skip_empty_level warning")
    messages = [f"corpus {name!r}: {text}: pairs with an empty source or target are skipped (-skip_empty_level "
                "error would stop instead)" for text in found]
    for message in messages:
        if message not in _logged:
            _logged.add(message)
            (logger.info if level == "silent" else logger.warning)(message)
    return messages


def check_translation_source(src, tgt=None):
    """Refuse an ``onmt_translate`` source with empty lines; warn about empty lines in its ``-tgt``.

    OpenNMT-py 3.5.1 leaves a sentence with an empty source out of the
    output, so every later translation would be written on the wrong line:
    :class:`CorpusError` names the file and the lines.  Empty ``-tgt`` lines
    keep the output aligned; their GOLD score is that of an ``<unk>`` target
    (logged as a warning).
    """
    from onmt.utils.logging import logger

    found = _empty_line_messages((src,))
    if found:
        raise CorpusError(f"-src {found[0]}: OpenNMT-py would leave such lines out of the output and "
                          "write every later translation on the wrong line; remove them before translating (e.g. "
                          "grep -v '^[[:space:]]*$') and put empty lines back at those line numbers in the output, "
                          "or put a placeholder token on them")
    for message in _empty_line_messages((tgt,)):
        logger.warning(f"onmt_translate -tgt {message}: their GOLD scores are those of an <unk> target")


def _skip_empty_pairs(stock, self, stream):
    """``ParallelCorpusIterator._process`` that drops the pairs of a training/validation corpus with an empty side.

    The stock iterator has already split each side into tokens, so an empty or
    whitespace-only line is ``[""]``.  The translation corpus (``infer``) is
    left as it is: dropping a pair there would misalign the output.
    """
    from onmt.constants import CorpusName

    skip = self.cid != CorpusName.INFER
    for item in stock(self, stream):
        example = item[0]
        if skip and example.get("tgt") is not None and (example["src"] == [""] or example["tgt"] == [""]):
            continue
        yield item


def _starts_with_bom(path):
    with open(path, "rb") as handle:
        return handle.read(3) == codecs.BOM_UTF8


def _strip_bom(example):
    for key in ("src", "tgt", "src_original", "tgt_original"):
        if isinstance(example.get(key), str) and example[key].startswith(_BOM):
            example[key] = example[key][1:]
    return example


def corpora_of(data):
    """The corpora of a ``-data`` value as a dict: OpenNMT-py holds the YAML text until it validates the options,
    the dict after (empty for None, for text that is not a mapping and for text that is no YAML)."""
    try:
        corpora = yaml.safe_load(data) if isinstance(data, str) else data
    except yaml.YAMLError:  # (data_problems names it)
        return {}
    return corpora if isinstance(corpora, dict) else {}


def _check_data_option(data, skip_empty_level="warning"):
    """Check every corpus of a ``-data`` value (YAML text or dict) that names files on disk.

    Parallel corpora (``path_src``/``path_tgt``) also get their empty lines
    reported at ``skip_empty_level`` (:func:`report_empty_lines`).
    """
    for name, entry in corpora_of(data).items():
        if not isinstance(entry, dict):
            continue
        src_key = "path_src" if entry.get("path_src") else "path_txt"
        src, tgt = entry.get(src_key), entry.get("path_tgt")
        for key, path in ((src_key, src), ("path_tgt", tgt)):
            if path is not None and not os.path.isfile(path):
                raise CorpusError(f"corpus {name!r}: {key} {path}: {not_a_file(path)}", status=2)
        if src is not None:
            check_corpus(name, src, tgt)
            if src_key == "path_src":
                report_empty_lines(name, src, tgt, skip_empty_level)


def _load_without_bom(stock, self, offset=0, stride=1):
    """``ParallelCorpus.load`` that takes a leading byte-order mark off the first example (logged)."""
    from onmt.utils.logging import logger

    bom = False
    if isinstance(self.src, (str, os.PathLike)) and os.path.isfile(self.src):
        tgt = self.tgt if isinstance(self.tgt, (str, os.PathLike)) and os.path.isfile(self.tgt) else None
        marked = [str(path) for path in (self.src, tgt) if path is not None and _starts_with_bom(path)]
        bom = bool(marked)
        if bom:
            message = (f"corpus {self.id!r}: byte-order mark at the start of {' and '.join(marked)} removed from the "
                       "first line")
            if message not in _logged:
                _logged.add(message)
                logger.warning(message)
    for index, example in enumerate(stock(self, offset, stride)):
        # line 0 is the first example of offset 0's share alone (share_of)
        yield _strip_bom(example) if bom and offset == 0 and index == 0 else example


def not_a_file(path, what="file"):
    """Why ``path``, which is no regular file, cannot be read as a ``what``: ``no such <what>``, ``is a directory,
    not a <what>``, or that it is a pipe or a device (/dev/stdin), which onmt-ext cannot read twice."""
    if os.path.isdir(path):
        return f"is a directory, not a {what}"
    if os.path.exists(path):  # a pipe, a terminal, a device: what is read from it once is gone
        return (f"is a pipe or a device, not a regular {what}; onmt-ext reads its input files more than once (it "
                "checks them first), which a pipe cannot give: write it to a file first")
    return f"no such {what}"


def share_of(number, shares):
    """The data share of line ``number`` (0-based; an int or an integer array) among ``shares`` as OpenNMT-py's
    ``ParallelCorpus.load`` deals them: blocks of ``shares`` lines in turn, line i to share ``(i // S) % S``."""
    return (number // shares) % shares


def check_shares(data, world_size, num_workers):
    """Every training corpus of ``data`` (a ``-data`` dict) has a line in each of the ``world_size * num_workers``
    shares that OpenNMT-py's data workers read (:func:`share_of`; share k's first line is line k·S); a
    :class:`CorpusError` in one line where one has none, which stock's corpus mixer meets with an
    ``UnboundLocalError`` traceback."""
    from onmt.constants import CorpusName

    shares = max(1, world_size) * max(1, num_workers)
    for name, entry in corpora_of(data).items():
        src = entry.get("path_src") or entry.get("path_txt") if isinstance(entry, dict) else None
        if shares == 1 or name == CorpusName.VALID or not src or not os.path.isfile(src):
            continue
        lines = _scan_cached(src).lines
        if lines <= (shares - 1) * shares:
            raise CorpusError(
                f"corpus {name!r}: its {lines} lines are too few for {shares} data shares (-world_size {world_size} "
                f"× -num_workers {num_workers}): OpenNMT-py gives each share blocks of {shares} lines in turn, so "
                f"the last share's first line would be line {(shares - 1) * shares + 1}; use fewer -num_workers "
                "(0 reads in the training process) or a larger corpus", status=2)


def _has_text(line, number):
    """Whether the raw ``line`` (bytes) of line ``number`` (0-based) is not empty as :func:`scan_file` counts: some
    text once stripped of whitespace (and of a byte-order mark on line 0)."""
    text = line.decode("utf-8")
    return bool((text[1:] if number == 0 and text.startswith(_BOM) else text).strip())


def _shares_with_text(src, tgt, shares):
    """The data shares (0 to ``shares`` - 1, :func:`share_of`) in which a pair of ``src`` and ``tgt`` (files of as
    many lines) has text on both sides. The files are read only when their empty lines (:func:`scan_file`) could
    fill a share, and only until each share has such a pair."""
    key = (_file_key(src), _file_key(tgt), shares)
    if key in _shares_found:
        return _shares_found[key]
    src_scan, tgt_scan = _scan_cached(src), _scan_cached(tgt)
    cycles, rest = divmod(src_scan.lines, shares * shares)
    smallest = cycles * shares + min(shares, max(0, rest - (shares - 1) * shares))  # the last share's lines
    found = set()
    if src_scan.empty + tgt_scan.empty < smallest:
        found = set(range(shares))
    else:
        with open(src, "rb") as src_lines, open(tgt, "rb") as tgt_lines:
            for number, (source, target) in enumerate(zip(src_lines, tgt_lines)):
                share = share_of(number, shares)
                if share not in found and _has_text(source, number) and _has_text(target, number):
                    found.add(share)
                    if len(found) == shares:
                        break
    _shares_found[key] = found
    return found


def _stock_int(weight):
    """The ``int`` OpenNMT-py makes of a corpus weight (``int(weight)``), or None where that fails."""
    try:
        return int(weight)
    except (TypeError, ValueError, OverflowError):
        return None


def weight_problem(weight):
    """Why ``weight``, a corpus's ``weight`` as YAML reads it, cannot be used (None: it can, or it is not given).

    OpenNMT-py reads a weight with ``int()`` (``1.0`` and ``"2"`` are 1 and 2) and takes a corpus's examples
    ``range(weight)`` times per round: text that is no number ends training in a traceback, a fractional weight
    is cut without a word (2.5 reads as 2, 0.5 as 0) and a negative one reads as 0.
    """
    if weight is None:
        return None
    value = None if isinstance(weight, bool) else _stock_int(weight)
    if value is not None and value >= 0 and not (isinstance(weight, float) and weight != value):
        return None
    cut = f"; OpenNMT-py would read it as {value}" if isinstance(weight, float) and value is not None else ""
    return f"weight {weight!r}: must be a whole number >= 0 (how many of its examples to take per round; 0 leaves " \
           f"the corpus out){cut}"


def corpus_weight(entry, name="?"):
    """A ``-data`` entry's weight as OpenNMT-py reads it (``int``; 1 when not given); :class:`CorpusError` (exit 2)
    naming corpus ``name`` for a weight that :func:`weight_problem` refuses."""
    problem = weight_problem(entry.get("weight"))
    if problem:
        raise CorpusError(f"corpus {name!r}: {problem}", status=2)
    weight = entry.get("weight")
    return 1 if weight is None else int(weight)


def data_problems(data, training=True):
    """Why a ``-data`` value (YAML text or dict) cannot be read, as one-line messages (empty: it can): not a mapping
    of corpora, a corpus that is not a mapping, a bad weight (:func:`weight_problem`), and (``training``) no
    training corpus of weight above 0, where stock fails with an ``AttributeError``, a ``TypeError`` or an
    ``UnboundLocalError`` traceback (a mixer without a corpus never gives a batch)."""
    from onmt.constants import CorpusName

    try:
        corpora = yaml.safe_load(data) if isinstance(data, str) else data
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        at = f" at column {mark.column + 1}" if mark is not None and mark.line == 0 else ""
        return [f"-data {data!r}: not a YAML mapping of corpora ({getattr(error, 'problem', None) or 'unreadable'}"
                f"{at})"]
    if corpora is None:
        return []
    if not isinstance(corpora, dict):
        return [f"-data {corpora!r}: must be a mapping of corpora, each with path_src, path_tgt and weight "
                "(data: {corpus_1: {path_src: ..., path_tgt: ..., weight: 1}, valid: {...}})"]
    problems, training_weights = [], []
    for name, entry in corpora.items():
        if not isinstance(entry, dict):
            problems.append(f"corpus {name!r} of -data: must be a mapping of keys such as path_src, path_tgt and "
                            "weight")
            continue
        problem = weight_problem(entry.get("weight"))
        if problem:
            problems.append(f"corpus {name!r}: {problem}")
        elif name != CorpusName.VALID:
            training_weights.append(corpus_weight(entry, name))
    if training and not problems and not any(weight > 0 for weight in training_weights):
        problems.append(no_training_corpus_message(corpora))
    return problems


def no_training_corpus_message(corpora, where=""):
    """``-data`` (set ``where``, e.g. `` in <config>, line N``) holds no training corpus of weight above 0."""
    from onmt.constants import CorpusName

    named = [name for name in corpora if name != CorpusName.VALID]
    held = (f"its training corpora ({', '.join(map(repr, named))}) all have weight 0" if named
            else "it holds no corpus but 'valid'" if corpora else "it holds no corpus")
    return (f"-data{where}: no training corpus with a weight above 0 ({held}), so training would never get a batch: "
            "add one (corpus_1: {path_src: ..., path_tgt: ..., weight: 1}) or give one a weight above 0")


def check_pairs(data, world_size, num_workers):
    """Where the pairs with an empty side are skipped, every corpus of ``data`` (a ``-data`` dict) that training
    reads (weight above 0) has a pair with text on both sides in each data share (:func:`check_shares`), and the
    validation set one at all: a :class:`CorpusError` in one line where one has none (exit 1 for a corpus,
    2 for a share). Stock's corpus mixer meets such a corpus with an ``UnboundLocalError`` or ``RuntimeError``
    traceback, and a validation set without a batch divides by zero."""
    from onmt.constants import CorpusName

    shares = max(1, world_size) * max(1, num_workers)
    for name, entry in corpora_of(data).items():
        src = entry.get("path_src") if isinstance(entry, dict) else None
        tgt = entry.get("path_tgt") or src if src else None  # (a language model's pairs: the line twice)
        valid = name == CorpusName.VALID
        weight = corpus_weight(entry, name) if isinstance(entry, dict) else 1
        if valid and weight <= 0:
            raise CorpusError(f"corpus {name!r}: weight {weight}: OpenNMT-py reads the validation set "
                              "weight times, so validation would never get a batch: leave its weight out", status=2)
        if not src or not os.path.isfile(src) or not os.path.isfile(tgt) or (not valid and weight <= 0):
            continue
        found = _shares_with_text(src, tgt, 1 if valid else shares)
        if not found:
            scans = [_scan_cached(path) for path in (src, tgt)]
            files = (f"{src}: {scans[0].empty} of {scans[0].lines} lines empty; {tgt}: {scans[1].empty} of "
                     f"{scans[1].lines}" if scans[0].lines else f"{src} and {tgt} are empty")
            what, fix = (("validation", "leave the validation set out") if valid else
                         ("training", "leave the corpus out (weight 0)"))
            raise CorpusError(f"corpus {name!r}: no pair has text on both sides ({files}), and pairs with an empty "
                              f"side are skipped, so {what} would never get a batch: check the files, or {fix}")
        missing = sorted(set(range(shares)) - found) if not valid else []
        if missing:
            fewer = "use fewer -num_workers (0 reads in the training process), or " if num_workers > 1 else ""
            listed = ", ".join(str(share) for share in missing[:SHOWN_LINES]) + (
                ", …" if len(missing) > SHOWN_LINES else "")
            raise CorpusError(
                f"corpus {name!r}: no pair of data share{'s' if len(missing) > 1 else ''} {listed} of {shares} "
                f"(-world_size {world_size} × -num_workers {num_workers}) has text on both sides, and pairs with an "
                f"empty side are skipped, so {'those shares' if len(missing) > 1 else 'that share'} would never make "
                f"a batch: {fewer}check the files ({src}, {tgt})", status=2)


def _bucket_or_empty(stock, task, bucket, **kwargs):
    """``process`` of ``DynamicDatasetIter``: an empty list, not None, for a bucket whose pairs are all dropped."""
    processed = stock(task, bucket, **kwargs)
    return [] if processed is None else processed


def _filters(iterator, name):
    """``sentencepiece, filtertoolong: -src_seq_length 1, -tgt_seq_length 1``: the transforms of corpus ``name``."""
    described = []
    for transform in iterator.corpora_info.get(name, {}).get("transforms") or []:
        found = iterator.transforms.get(transform)
        if transform == "filtertoolong" and found is not None:
            transform += f": -src_seq_length {found.src_seq_length}, -tgt_seq_length {found.tgt_seq_length}"
        described.append(transform)
    return ", ".join(described)


def _kept_or_named(stock, self, tuple_bucket):
    """``DynamicDatasetIter._tuple_to_json_with_tokIDs`` of training, watching for a worker that keeps nothing.

    Until a bucket keeps a pair, it notes per corpus when the line numbers start again (the mixer read the
    corpus through and restarted it). Once every corpus read (weight above 0) has restarted, the transforms drop
    all that this worker reads (its share of the lines): :class:`NoKeptPair` names the corpora and their
    filters (or a source file without text, :func:`_source_text_shares`), where stock would restart the corpora
    for ever, logging each time, and never make a batch.
    """
    bucket = stock(self, tuple_bucket)
    if self.task != "train" or getattr(self, "_ext_kept", False):
        return bucket
    if bucket:
        self._ext_kept = True
        return bucket
    last, restarted = self.__dict__.setdefault("_ext_last_lines", ({}, set()))
    for example, _, name in tuple_bucket:
        number = example["cid_line_number"]
        if number <= last.get(name, -1):
            restarted.add(name)
        last[name] = number
    mixer = getattr(self, "mixer", None)
    weights = getattr(mixer, "weights", None) or dict.fromkeys(self.corpora, 1)
    names = sorted(name for name, weight in weights.items() if weight > 0)  # (a corpus of weight 0 is not read)
    if not names or not restarted.issuperset(names):
        return bucket
    first = getattr(mixer, "iterables", {}).get(names[0])
    stride, offset = getattr(first, "stride", self.stride), getattr(first, "offset", self.offset)
    share = f" of data share {offset} of {stride} (-world_size × -num_workers)" if stride > 1 else ""
    fewer = ", or use fewer -num_workers" if stride > 1 else ""
    texts = {name: _source_text_shares(self, name, stride) for name in names}
    empty = {name: src if src is not None and offset not in found else None for name, (src, found) in texts.items()}
    if len(names) == 1 and empty[names[0]]:
        src, found = texts[names[0]]
        within, fewer = ((f" in data share {offset} of {stride} (-world_size × -num_workers)", fewer)
                         if found else ("", ""))  # (other shares hold text)
        raise NoKeptPair(f"corpus {names[0]!r}: no source line of {src}{within} has text, and OpenNMT-py leaves out a "
                         f"pair with an empty source, so training would never get a batch: check the corpus{fewer}")
    if len(names) == 1:
        raise NoKeptPair(f"corpus {names[0]!r}: its transforms ({_filters(self, names[0])}) drop every pair{share}, "
                         f"so training would never get a batch: loosen the filters or check the corpus{fewer}")
    if any(empty.values()):
        listed = ", ".join(f"{name!r} ({f'no source text in {empty[name]}' if empty[name] else _filters(self, name)})"
                           for name in names)
        raise NoKeptPair(f"corpora {listed}: every pair is left out{share}, so training would never get a batch: "
                         f"check the corpora or loosen the filters{fewer}")
    listed = ", ".join(f"{name!r} ({_filters(self, name)})" for name in names)
    raise NoKeptPair(f"corpora {listed}: their transforms drop every pair{share}, so training would never get a "
                     f"batch: loosen the filters or check the corpora{fewer}")


def _source_text_shares(iterator, name, stride):
    """``(source file of corpus name, the data shares of stride whose lines hold text in it)``; ``(None, None)``
    where it is no file here.  A share without text gives no pair: stock's ``process`` leaves out a pair with an
    empty source (with onmt-ext's runtime :func:`check_pairs` refuses such a corpus at start-up).  Asked once,
    when training stops: the file is read once."""
    src = getattr(iterator.corpora.get(name), "src", None)
    if not isinstance(src, (str, os.PathLike)) or not os.path.isfile(src):
        return None, None
    return src, _shares_with_text(src, src, max(1, stride))


def _skipping_empty_pairs():
    """True when :func:`_skip_empty_pairs` is in place (not under ``ONMT_EXT_RUNTIME=stock``, where a pair with an
    empty side is read as one ``<unk>``)."""
    from onmt.inputters.text_corpus import ParallelCorpusIterator

    return is_ours(ParallelCorpusIterator._process)


def _validate_data(stock, cls, opt):
    problems = data_problems(opt.data, training=getattr(opt, "train_steps", None) is not None)
    if problems:
        raise CorpusError(problems[0], status=2)
    _check_data_option(opt.data, getattr(opt, "skip_empty_level", "warning"))
    # (onmt_build_vocab's options have no data workers, nor training steps: it reads a corpus without pairs well);
    # tensor-parallel ranks read the whole corpus each (train_single's stride 1)
    data_parallel = getattr(opt, "parallel_mode", "data_parallel") == "data_parallel"
    shares = getattr(opt, "world_size", 1) if data_parallel else 1, getattr(opt, "num_workers", 0)
    check_shares(opt.data, *shares)
    if getattr(opt, "train_steps", None) is not None and _skipping_empty_pairs():
        check_pairs(opt.data, *shares)
    return stock(cls, opt)


def _dataset(iterable):
    """The ``DynamicDatasetIter`` under a training/validation iterable (``OnDeviceDatasetIter``, ``DataLoader``),
    or None."""
    for _ in range(4):
        if iterable is None or hasattr(iterable, "corpora_info"):
            return iterable
        inner = getattr(iterable, "data_iter", None)  # (not ``or``: a DataLoader's truth asks its dataset's len)
        iterable = inner if inner is not None else getattr(iterable, "dataset", None)
    return None


def _valid_batches(valid_iter):
    """The batches of ``valid_iter``; a :class:`NoKeptPair` naming the validation corpus and its filters when
    there is none (read through: a data worker's part of the validation set may be empty)."""
    given = False
    for item in valid_iter:
        given = True
        yield item
    if given:
        return
    dataset = _dataset(valid_iter)
    names = sorted(getattr(dataset, "corpora", None) or ["valid"])
    found = getattr(dataset, "corpora", {}).get(names[0])
    where = f" ({found.src})" if isinstance(getattr(found, "src", None), (str, os.PathLike)) else ""
    filters = _filters(dataset, names[0]) if dataset is not None else ""
    dropped = f"its transforms ({filters}) drop every pair" if filters else "no pair reaches a batch"
    raise NoKeptPair(f"corpus {names[0]!r}{where}: {dropped}, so validation gets no batch: loosen the filters, give "
                     "the validation set transforms of its own (data: valid: transforms), or check the corpus")


def _validated(stock, self, valid_iter, *args, **kwargs):
    """``Trainer.validate`` that stops with one line (:func:`_valid_batches`) when the validation set gives no
    batch, where stock's report would divide by zero in its perplexity."""
    return stock(self, _valid_batches(valid_iter), *args, **kwargs)


def _translate_checked(stock, opt, *args, **kwargs):
    """``onmt_translate``'s ``translate(opt)`` after checking ``-src`` (and ``-tgt``)."""
    src, tgt = getattr(opt, "src", None), getattr(opt, "tgt", None)
    for key, path in (("-src", src), ("-tgt", tgt)):
        if path and path != "-" and not os.path.isfile(path):
            raise CorpusError(f"{key} {path}: {not_a_file(path)}", status=2)
    if src and src != "-":
        lines, _ = check_corpus("-src/-tgt" if tgt else "-src", src, tgt or None)
        if lines == 0:
            raise CorpusError(f"-src {src}: the file is empty; there is nothing to translate")
        check_translation_source(src, tgt if tgt and tgt != "-" else None)
    return stock(opt, *args, **kwargs)


def install():
    """Check corpora when OpenNMT-py validates its options; strip a leading BOM and skip empty pairs when reading.

    ``ArgumentParser._validate_data`` (``onmt_build_vocab``, ``onmt_train``)
    runs :func:`check_corpus` and :func:`report_empty_lines` on every corpus,
    and ``onmt.bin.translate.translate`` (``onmt_translate``) runs
    :func:`check_corpus` and :func:`check_translation_source` on its
    ``-src``/``-tgt`` (and refuses an empty ``-src``), so a bad file stops the
    command before any model is built or any output file is created;
    ``ParallelCorpus.load`` drops a byte-order mark from the first line
    (logged); ``ParallelCorpusIterator._process`` skips the training and
    validation pairs with an empty side; ``DynamicDatasetIter``'s ``process``
    gives a bucket of dropped pairs as empty, and its
    ``_tuple_to_json_with_tokIDs`` names a worker that keeps no training pair
    (:func:`_kept_or_named`); ``Trainer.validate`` names a validation set
    that gives no batch (:func:`_valid_batches`).  Idempotent.
    """
    from onmt.bin import translate as translate_bin
    from onmt.inputters import dynamic_iterator, text_corpus
    from onmt.trainer import Trainer
    from onmt.utils.parse import ArgumentParser

    tests = "tests/unit/test_corpus.py::"
    patch(text_corpus.ParallelCorpus, "load", _load_without_bom, kind=FIX, runtime=True, test=tests +
          "test_a_byte_order_mark_is_taken_off_the_first_example",
          reason="a byte-order mark stays glued to the first token of the first line")
    patch(text_corpus.ParallelCorpusIterator, "_process", _skip_empty_pairs, kind=FIX, runtime=True, test=tests +
          "test_pairs_with_an_empty_side_are_skipped_in_training_not_in_translation",
          reason="a pair with an empty target is trained as '<s> <unk> </s>', one with an empty source dropped "
                 "without a word")
    patch(ArgumentParser, "_validate_data", _validate_data, kind=FIX,
          test="tests/integration/test_corpus_cli.py::test_train_refuses_misaligned_files_without_a_traceback",
          reason="reads every corpus once at start-up: files of different lengths are cut to the shorter without a "
                 "word, a non-UTF-8 line ends in a traceback naming no file, empty lines go unreported, a corpus "
                 "too small for the data workers' shares, or (empty pairs skipped) without a pair with text on both "
                 "sides, ends in an UnboundLocalError or RuntimeError")
    patch(dynamic_iterator, "process", _bucket_or_empty, kind=FIX, test=tests +
          "test_a_bucket_whose_pairs_are_all_filtered_is_skipped",
          reason="a bucket whose pairs a transform (filtertoolong) all drops ends training in a TypeError")
    # order 1: inside onmt_ext.runtime.binarized's layer, which reads a binarised bucket without stock
    patch(dynamic_iterator.DynamicDatasetIter, "_tuple_to_json_with_tokIDs", _kept_or_named, kind=FIX, order=1,
          test=tests + "test_training_data_that_the_filters_drop_entirely_is_named_not_looped_on",
          reason="where the transforms drop every pair a data worker reads, stock restarts the corpora for ever "
                 "and never makes a batch")
    patch(Trainer, "validate", _validated, kind=FIX, test=tests +
          "test_a_validation_set_that_the_filters_drop_entirely_is_named",
          reason="a validation set whose every pair the transforms drop gets no batch, and the report ends in a "
                 "ZeroDivisionError")
    # order 1: inside onmt_ext.integration.commands' layer (order 0), which ends a CorpusError in one line
    patch(translate_bin, "translate", _translate_checked, kind=FIX, order=1, test=tests +
          "test_translate_refuses_a_source_with_empty_lines_by_name",
          reason="an empty -src line is left out of the output (every later line shifts); an empty -src file ends "
                 "in an UnboundLocalError after creating an empty output")
