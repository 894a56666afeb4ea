"""Checks of the text files OpenNMT-py reads, so that a damaged corpus stops with a message, not a traceback.

OpenNMT-py 3.5.1 reads a parallel corpus with ``zip`` over the two files and
decodes each line as UTF-8 inside its data iterator.  Three problems then go
by silently or end in a traceback from deep inside the data loader:

* source and target files with **different line counts** are cut to the
  shorter one without a word: the extra lines are lost, and usually every
  pair after a missing line is misaligned;
* a line that is **not UTF-8** raises ``UnicodeDecodeError`` in the loader,
  naming neither the file nor the line;
* a **byte-order mark** at the start of a file stays glued to the first token
  of the first line.

:func:`check_corpus` reads each file once per process (a pass over the raw
bytes with an incremental UTF-8 decoder) and raises :class:`CorpusError`
naming the corpus, the file and the line.  :func:`install` runs it where
OpenNMT-py validates its options, so that ``onmt_build_vocab``,
``onmt_train`` and ``onmt_translate`` stop before building anything (an
error raised later, inside OpenNMT-py's data iterator, would be swallowed by
its ``finally: yield``), and strips a leading byte-order mark when the
corpus is read (logged).  Empty
lines are left to OpenNMT-py's own ``-skip_empty_level`` (default: skip with
a warning).
"""

import codecs
import os

_BOM = "\ufeff"
_BLOCK = 1 << 24
_checked = {}


class CorpusError(SystemExit):
    """A corpus file cannot be used as it is; the message names the corpus, the file and the line."""

    def __init__(self, message):
        super().__init__(f"error: {message}")


def scan_file(path):
    """``(lines, has_bom)`` of a UTF-8 text file; :class:`CorpusError` at the first line that is not UTF-8.

    A last line without a newline counts as a line.
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
    lines, tail_open, has_bom = 0, False, False
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
                decoder.decode(block)
            except UnicodeDecodeError as error:
                line = lines + block.count(b"\n", 0, max(0, error.start)) + 1
                raise CorpusError(f"{path}, line {line}: not UTF-8 ({error.reason}); OpenNMT-py reads UTF-8 "
                                  "only: convert the file (e.g. iconv -f <encoding> -t utf-8)") from None
            lines += block.count(b"\n")
            tail_open = not block.endswith(b"\n")
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            raise CorpusError(f"{path}, line {lines + 1}: ends inside a UTF-8 character (truncated file?)") from None
    return lines + (1 if tail_open else 0), has_bom


def _scan_cached(path):
    stat = os.stat(path)
    key = (os.path.abspath(path), stat.st_size, stat.st_mtime_ns)
    if key not in _checked:
        _checked[key] = scan_file(path)
    return _checked[key]


def check_corpus(name, src, tgt=None):
    """Check one corpus (``src``, and ``tgt`` when given): UTF-8 throughout and the same number of lines.

    Returns ``(lines, bom)`` with ``bom`` True when either file starts with a byte-order mark.
    """
    src_lines, src_bom = _scan_cached(src)
    if tgt is None:
        return src_lines, src_bom
    tgt_lines, tgt_bom = _scan_cached(tgt)
    if src_lines != tgt_lines:
        raise CorpusError(f"corpus {name!r}: {src} has {src_lines} lines but {tgt} has {tgt_lines}; OpenNMT-py "
                          "would silently drop the extra lines and misalign the pairs after a missing one")
    return src_lines, src_bom or tgt_bom


def _starts_with_bom(path):
    with open(path, "rb") as handle:
        return handle.read(3) == codecs.BOM_UTF8


def _strip_bom(example):
    for key in ("src", "tgt", "src_original", "tgt_original"):
        if isinstance(example.get(key), str) and example[key].startswith(_BOM):
            example[key] = example[key][1:]
    return example


def _check_data_option(data):
    """Check every corpus of a ``-data`` value (YAML text or dict) that names files on disk."""
    import yaml

    corpora = yaml.safe_load(data) if isinstance(data, str) else data
    for name, entry in (corpora or {}).items():
        if not isinstance(entry, dict):
            continue
        src_key = "path_src" if entry.get("path_src") else "path_txt"
        src, tgt = entry.get(src_key), entry.get("path_tgt")
        for key, path in ((src_key, src), ("path_tgt", tgt)):
            if path is not None and not os.path.isfile(path):
                raise CorpusError(f"corpus {name!r}: {key} {path}: no such file")
        if src is not None:
            check_corpus(name, src, tgt)


def install():
    """Check corpora when OpenNMT-py validates its options, and strip a leading BOM when it reads them.

    ``ArgumentParser._validate_data`` (``onmt_build_vocab``, ``onmt_train``)
    and ``onmt.bin.translate.translate`` (``onmt_translate``'s ``-src``/``-tgt``)
    run :func:`check_corpus` first, so a bad file stops the command before
    any model is built; ``ParallelCorpus.load`` drops a byte-order mark from
    the first line (logged).  Idempotent.
    """
    from onmt.inputters import text_corpus
    from onmt.utils.logging import logger
    from onmt.utils.parse import ArgumentParser

    stock = text_corpus.ParallelCorpus.load
    if getattr(stock, "_onmt_ext", False):
        return

    def load(self, offset=0, stride=1):
        bom = False
        if isinstance(self.src, (str, os.PathLike)) and os.path.isfile(self.src):
            tgt = self.tgt if isinstance(self.tgt, (str, os.PathLike)) and os.path.isfile(self.tgt) else None
            bom = any(_starts_with_bom(path) for path in (self.src, tgt) if path is not None)
            if bom:
                logger.warning(f"corpus {self.id!r}: byte-order mark at the start of {self.src}"
                               + (f" or {tgt}" if tgt else "") + " removed from the first line")
        for index, example in enumerate(stock(self, offset, stride)):
            yield _strip_bom(example) if bom and index == 0 else example

    load._onmt_ext = True
    text_corpus.ParallelCorpus.load = load

    stock_data = ArgumentParser._validate_data.__func__

    def _validate_data(cls, opt):
        _check_data_option(opt.data)
        return stock_data(cls, opt)

    ArgumentParser._validate_data = classmethod(_validate_data)

    # onmt_translate's own entry point (not validate_translate_opts, which OpenNMT-py also calls with
    # placeholder sources: validation with -valid_metrics, the translation server)
    from onmt.bin import translate as translate_bin

    stock_translate = translate_bin.translate

    def translate(opt):
        src, tgt = getattr(opt, "src", None), getattr(opt, "tgt", None)
        for key, path in (("-src", src), ("-tgt", tgt)):
            if path and path != "-" and not os.path.isfile(path):
                raise CorpusError(f"onmt_translate {key} {path}: no such file")
        if src and src != "-":
            check_corpus("-src/-tgt" if tgt else "-src", src, tgt or None)
        return stock_translate(opt)

    translate._onmt_ext = True
    translate_bin.translate = translate
