#!/usr/bin/env python
"""Prepare the paper tasks' corpora under ``build/data/<task>/`` (``make data-<task>`` runs the steps in order).

``prepare_data.py STEP TASK`` (``--list``: the tasks) runs one step: ``fetch`` (archives into ``build/downloads/``,
resumed and checked by SHA-256; dev/test sets through sacreBLEU), ``raw`` (text pairs, ``raw/corpora.json``), ``tok``
(sacremoses, jieba for Chinese), ``clean`` (length and ratio filter, ``clean/stats.json``) or ``bpe`` (subword-nmt).
``recipe`` rewrites a step's record of what its output depends on besides its input (settings, tokenizer versions, a
data directory once set) only when it changes, so that make redoes that step and the ones after it.  The data
directories and flags (``NIST_DIR``, ``WMT17_EXTRA_DIR``, ...), how it works and why: docs/data.md.
"""

import argparse
import fcntl
import fnmatch
import functools
import gzip
import hashlib
import html
import json
import os
import re
import shutil
import sys
import tarfile
import urllib.error
import urllib.request
import zipfile
from collections import defaultdict, deque
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from itertools import compress, count, islice, zip_longest
from multiprocessing import Pool
from pathlib import Path

from tools import common

REPO = common.REPO
DOWNLOADS = Path("build/downloads")
DATA = Path("build/data")

#: Progress bars: None shows them when stderr is a terminal, True/False force them on/off (``--[no-]progress``).
PROGRESS = None
#: Lines per job handed to a worker process by tokenization and BPE; the line bar advances per finished job.
CHUNK_LINES = 2000


def bars_shown():
    """Whether progress bars are shown: ``PROGRESS``, or when it is None whether stderr is a terminal."""
    return PROGRESS if PROGRESS is not None else sys.stderr.isatty()


def progress_bar(**kwargs):
    """A tqdm bar on stderr, shown as :func:`bars_shown` says; usable as a context manager."""
    from tqdm import tqdm

    kwargs.setdefault("mininterval", 0.5)
    return tqdm(file=sys.stderr, disable=not bars_shown(), dynamic_ncols=True, **kwargs)


def _byte_bar(desc, total, initial=0):
    return progress_bar(desc=desc, total=total, initial=initial, unit="B", unit_scale=True, unit_divisor=1024)


@dataclass(frozen=True)
class Archive:
    """A file to download: its URL and SHA-256 (None: not pinned)."""

    url: str
    sha256: str = None

    @property
    def filename(self):
        return self.url.rstrip("/").rsplit("/", 1)[-1]


@dataclass(frozen=True, repr=False)
class Parallel:
    """A parallel corpus: ``archive`` (a key of ``ARCHIVES`` or a repository path) and ``member``, the file in a
    tar/zip archive (by path, else by file name), ``{lang}`` in the name; without it the archive is the text.
    A member with ``*``, ``?`` or ``[`` is a pattern matching several files a side (CWMT's corpora), paired in
    sorted order; ``spelled`` says how its names spell a language, e.g. ``(("zh", "c[hn]"),)``."""

    archive: str
    member: str = None
    spelled: tuple = ()

    def __repr__(self):  # the recipes hold it: unchanged for the corpora made before ``spelled`` existed
        return (f"Parallel(archive={self.archive!r}, member={self.member!r}"
                + (f", spelled={self.spelled!r})" if self.spelled else ")"))

    def archives(self, langs):
        """The archive keys/paths this corpus reads for the languages ``langs``."""
        return [self.archive] if self.member else [self.archive.format(lang=lang) for lang in langs]

    def member_of(self, lang):
        """The member (name or pattern) holding the language ``lang``."""
        return self.member.format(lang=dict(self.spelled).get(lang, lang))


@dataclass(frozen=True)
class SacrebleuSet:
    """A dev/test set downloaded and converted to text by sacreBLEU (``sacrebleu -t NAME -l PAIR``)."""

    name: str
    langpair: str


@dataclass(frozen=True)
class LengthSubset:
    """Training pairs of at most ``max_words`` tokenized words a side (before BPE, as the paper filters), a
    paper's own filter (``note`` cites it), written as ``train.<name>.bpe.<lang>``."""

    name: str
    max_words: int
    note: str

    def keeps(self, src, tgt):
        """True for a tokenized pair of at most ``max_words`` words on each side."""
        return max(len(src.split()), len(tgt.split())) <= self.max_words


@dataclass(frozen=True)
class Task:
    """One translation task: languages, training corpora, dev and test sets and preprocessing settings."""

    src: str
    tgt: str
    train: tuple
    valid: object
    test: object
    joint_bpe: bool = True
    merges: int = 32000
    max_len: int = 250
    ratio: float = 1.5
    pretokenized: bool = False
    test_lines: int = None  # keep only the first lines of the test set (the CPU chain test)
    manual: str = ""  # corpora the user must supply, said when a step cannot find them
    notes: tuple = ()
    subsets: tuple = ()  # LengthSubset: a paper's own length filter of the training pairs, before BPE
    #: Corpora beyond ``train`` making the full training data (WMT17's UN and CWMT parts): downloaded, unless the
    #: variable ``extra_dir`` names the user's own copy (``train.<src>``/``train.<tgt>``); ``small_flag``=1: left out.
    extra: tuple = ()
    extra_dir: str = ""
    small_flag: str = ""


#: The rest of WMT17's Zh-En training data, the UN Parallel Corpus v1.0 (en-zh) and the six CWMT corpora WMT17 lists,
#: come from the Hugging Face ``wmt`` datasets, with the SHA-256 sums the ``datasets`` library records (docs/data.md).
HF_WMT = "https://huggingface.co/datasets/wmt"
CWMT_SUMS = {"casia2015": "c939f1528f96c419e9bbffb9caad869616a969e7704ffac896e245a02aff59a9",
             "casict2011": "606adc0ccc5d8fc7c47f8589991286616342a1a379a571ce3038918731ae0182",
             "casict2015": "eef8e25b297c1aff12ab24719247d3588e756d7a4e2c30d4d34fcb4d05ab1050",
             "datum2015": "654afce6731485c40ce856514ab80cd2bfd836126bcaf48cdb911ebc32b021a4",
             "datum2017": "737455c139596f4abf3b1da73bc38932b3ef9534549328eff47d867e29950ed2",
             "neu2017": "5c5ea9ac5cbc43c974bd53796a3a29829800865b6398b52cda0a3854cb0d2e03"}

#: Download locations; the statmt.org SHA-256 sums are those of public download scripts (docs/data.md, Checksums).
ARCHIVES = {
    "europarl-v7": Archive("https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz",
                           "0224c7c710c8a063dfd893b0cc0830202d61f4c75c17eb8e31836103d27d96e7"),
    "commoncrawl": Archive("https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz",
                           "c7a74e2ea01ac6c920123108627e35278d4ccb5701e15428ffa34de86fa3a9e5"),
    "nc-v9": Archive("https://www.statmt.org/wmt14/training-parallel-nc-v9.tgz"),
    "nc-v11": Archive("https://data.statmt.org/wmt16/translation-task/training-parallel-nc-v11.tgz"),
    "nc-v12": Archive("https://data.statmt.org/wmt17/translation-task/training-parallel-nc-v12.tgz",
                      "2b45f30ef1d550d302fd17dd3a5cbe19134ccc4c2cf50c2dae534aee600101a2"),
    "europarl-v8": Archive("https://data.statmt.org/wmt16/translation-task/training-parallel-ep-v8.tgz"),
    "setimes2-en-ro": Archive("https://object.pouta.csc.fi/OPUS-SETIMES/v2/moses/en-ro.txt.zip"),  # where WMT16 points
    **{f"iwslt15-en-vi-{name}": Archive(f"https://nlp.stanford.edu/projects/nmt/data/iwslt15.en-vi/{name}")
       for name in (f"{split}.{lang}" for split in ("train", "tst2012", "tst2013") for lang in ("en", "vi"))},
    "un-v1.0-en-zh": Archive(f"{HF_WMT}/uncorpus/resolve/main-zip/UNv1.0.en-zh.zip",  # one zip (the UN's site: two)
                             "97f5ce0892084cdbb2332b52ffcc0299a649ba0a43712d921575fe2b7edfb4b4"),
    **{f"cwmt-{name}": Archive(f"{HF_WMT}/wmt18/resolve/main/cwmt-wmt/{name}.zip", digest)
       for name, digest in CWMT_SUMS.items()},
}
WMT17_FULL = (Parallel("un-v1.0-en-zh", "en-zh/UNv1.0.en-zh.{lang}"),) + tuple(
    Parallel(f"cwmt-{name}", f"{name}/*_{{lang}}.txt", spelled=(("zh", "c[hn]"),)) for name in CWMT_SUMS)

_WMT14_DE_EN = (Parallel("europarl-v7", "training/europarl-v7.de-en.{lang}"),
                Parallel("commoncrawl", "commoncrawl.de-en.{lang}"),
                Parallel("nc-v9", "training/news-commentary-v9.de-en.{lang}"))

#: What ``NIST_DIR`` must hold for ``nist_zhen`` (LDC data cannot be downloaded).
NIST_LAYOUT = """NIST_DIR must hold:
  train.zh, train.en   the LDC training pairs (e.g. LDC2002E18, LDC2003E07, LDC2003E14, LDC2004T07 (Hansards part),
                       LDC2004T08, LDC2005T06; chen2019 uses 1.28M pairs), one sentence per line, in step
  nist06/ nist02/ nist03/ nist04/   each with the source SGML (a file named *src*.sgm) and the references
                       (one SGML file with several sysid, or one *ref*.sgm file per reference)
NIST06 becomes the dev set and NIST02 the test set (test.*); NIST03 and NIST04 are written as
test_nist03.* and test_nist04.* beside them."""

#: What ``WMT17_EXTRA_DIR`` holds when it is set (said when it lacks a file).
WMT17_EXTRA = ("WMT17_EXTRA_DIR, when set, is a directory holding your own copy of the zh-en pairs of the UN "
               "Parallel Corpus v1.0 and of the CWMT corpora, in step, as train.zh and train.en, used instead of "
               "downloading them (docs/data.md)")

#: Readable names of the corpora, for ``raw/corpora.json`` and the reports.
CORPUS_NAMES = {"europarl-v7": "Europarl v7", "commoncrawl": "Common Crawl", "nc-v9": "News Commentary v9",
                "nc-v11": "News Commentary v11", "nc-v12": "News Commentary v12", "europarl-v8": "Europarl v8",
                "setimes2-en-ro": "SETIMES2", "un-v1.0-en-zh": "UN Parallel Corpus v1.0",
                **{f"cwmt-{name}": f"CWMT {name}" for name in CWMT_SUMS}}

TASKS = {
    "wmt14_ende": Task("en", "de", _WMT14_DE_EN, SacrebleuSet("wmt13", "en-de"), SacrebleuSet("wmt14/full", "en-de")),
    "wmt14_deen": Task("de", "en", _WMT14_DE_EN, SacrebleuSet("wmt13", "de-en"), SacrebleuSet("wmt14/full", "de-en")),
    "wmt16_ende": Task("en", "de", _WMT14_DE_EN[:2] + (Parallel("nc-v11", "news-commentary-v11.de-en.{lang}"),),
                       SacrebleuSet("wmt15", "en-de"), SacrebleuSet("wmt16", "en-de")),
    "wmt16_roen": Task("ro", "en", (Parallel("europarl-v8", "europarl-v8.ro-en.{lang}"),
                                    Parallel("setimes2-en-ro", "SETIMES.en-ro.{lang}")),
                       SacrebleuSet("wmt16/dev", "ro-en"), SacrebleuSet("wmt16", "ro-en")),
    "wmt17_zhen": Task("zh", "en", (Parallel("nc-v12", "training/news-commentary-v12.zh-en.{lang}"),),
                       SacrebleuSet("wmt17/dev", "zh-en"), SacrebleuSet("wmt17", "zh-en"),
                       joint_bpe=False, ratio=9.0, extra=WMT17_FULL, extra_dir="WMT17_EXTRA_DIR",
                       small_flag="WMT17_SMALL_DATA", subsets=(  # cao2019's own length filter
                           LengthSubset("lt50", 49, "cao2019 sec. 4.1: pairs with sentences shorter than 50 words"),),
                       notes=("News Commentary v12, the UN Parallel Corpus v1.0 and the six CWMT corpora "
                              "(about 2.3 GB to download); WMT17_SMALL_DATA=1: News Commentary v12 alone",)),
    "wmt15_envi": Task("en", "vi", (Parallel("iwslt15-en-vi-train.{lang}"),),
                       Parallel("iwslt15-en-vi-tst2012.{lang}"), Parallel("iwslt15-en-vi-tst2013.{lang}"),
                       joint_bpe=False, pretokenized=True, ratio=9.0,
                       notes=("IWSLT15 en-vi as released tokenized by the Stanford NLP group; tst2012 dev, "
                              "tst2013 test",)),
    "nist_zhen": Task("zh", "en", (), None, None, joint_bpe=False, ratio=9.0, manual="NIST_DIR"),
    # The clause paper's Table 5 (NiuTrans en-zh): its split is not public in a form we can fetch.
    "niutrans_enzh": Task("en", "zh", (), None, None, joint_bpe=False, ratio=9.0, manual="NIUTRANS_DIR"),
    # The shipped WMT14 sample (already Moses-tokenized), for the CPU test of the whole chain.
    "sample_ende": Task("en", "de", (Parallel("data/wmt14-ende-sample/train.{lang}"),),
                        Parallel("data/wmt14-ende-sample/valid.{lang}"), Parallel("data/wmt14-ende-sample/test.{lang}"),
                        merges=1000, pretokenized=True, test_lines=50),
}


class PrepareError(SystemExit):
    """A step cannot go on; the message says what is missing and what to do."""

    def __init__(self, message):
        super().__init__(f"prepare_data.py: {message}")


# ---------------------------------------------------------------- fetch
def sha256_of(path):
    """Hex SHA-256 of a file, read in 1 MB blocks (a byte bar: a WMT archive takes a while to hash)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle, _byte_bar(f"sha256 {Path(path).name}", os.path.getsize(path)) as bar:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
            bar.update(len(block))
    return digest.hexdigest()


def _recorded_sums(downloads):
    sums = downloads / "SHA256SUMS"
    lines = sums.read_text(encoding="utf-8").split("\n") if sums.exists() else []
    return {name: digest for digest, name in (line.split(maxsplit=1) for line in lines if line.strip())}


def _record_sum(downloads, name, digest):
    with open(downloads / ".SHA256SUMS.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        recorded = {**_recorded_sums(downloads), name: digest}
        (downloads / "SHA256SUMS").write_text("".join(f"{d}  {n}\n" for n, d in sorted(recorded.items())),
                                              encoding="utf-8")


def download(archive, downloads, timeout=60):
    """Download ``archive`` into ``downloads/<filename>`` (resuming ``<filename>.part``) unless it is there, and
    check its pinned or first recorded SHA-256 (recording it the first time); return the path."""
    downloads.mkdir(parents=True, exist_ok=True)
    dest = downloads / archive.filename
    with open(downloads / f".{archive.filename}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two `make data-<task>` at once (make -j) wait for each other
        if not dest.exists():
            _fetch(archive, dest, timeout)
        digest = sha256_of(dest)
        expected = archive.sha256 or _recorded_sums(downloads).get(dest.name)
        if expected is None:
            _record_sum(downloads, dest.name, digest)
            print(f"fetch: warning: {dest.name} has no pinned SHA-256; recorded {digest} in "
                  f"{downloads / 'SHA256SUMS'} and later runs check it", file=sys.stderr)
        elif digest != expected:
            bad = dest.with_name(dest.name + ".bad")
            dest.rename(bad)
            raise PrepareError(f"{dest} has SHA-256 {digest}, expected {expected}; moved it to {bad}. "
                               f"Delete it and rerun to download {archive.url} again")
        return dest


def _expected_size(response, have):
    """The complete file's size from the response headers, or None when the server does not say."""
    ranged = response.headers.get("Content-Range")  # bytes START-END/TOTAL
    if getattr(response, "status", None) == 206 and ranged:
        start, total = ranged.split()[-1].split("-")[0], ranged.rsplit("/", 1)[-1]
        if int(start) != have:
            raise PrepareError(f"{response.url}: the server resumed at byte {start}, not {have}; delete "
                               f"the .part file and rerun")
        return int(total) if total.isdigit() else None
    length = response.headers.get("Content-Length")
    return have + int(length) if length and length.isdigit() else None


def _fetch(archive, dest, timeout):
    """Download (or finish) ``archive`` into ``<dest>.part``, renamed to ``dest`` when it has the announced size."""
    part = dest.with_name(dest.name + ".part")
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(archive.url, headers={"Range": f"bytes={have}-"} if have else {})
    print(f"fetch: {archive.url}" + (f" (resuming at byte {have})" if have else ""), file=sys.stderr)
    expected = None
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            if getattr(response, "status", None) != 206:
                have = 0  # the whole file is sent again; else the bar starts at the bytes already in the part file
            expected = _expected_size(response, have)
            with open(part, "ab" if have else "wb") as out, _byte_bar(dest.name, expected, have) as bar:
                for block in iter(lambda: response.read(1 << 20), b""):
                    out.write(block)
                    bar.update(len(block))
    except OSError as error:  # urllib's URLError and HTTPError among them
        if not (getattr(error, "code", None) == 416 and have):  # 416: the part is already complete
            pinned = f" (SHA-256 {archive.sha256})" if archive.sha256 else ""
            raise PrepareError(f"cannot download {archive.url} ({error}). Download it by other means and put it "
                               f"at {dest}{pinned}, then rerun") from None
    size = part.stat().st_size
    if expected is not None and size != expected:
        raise PrepareError(f"{archive.url}: the connection ended at byte {size} of {expected}; rerun to resume "
                           f"({part} is kept)")
    part.rename(dest)


def _sacrebleu_files(test_set):
    """Source and reference files of a sacreBLEU test set (downloaded into ``build/downloads/sacrebleu``)."""
    if "sacrebleu" not in sys.modules:  # sacreBLEU reads $SACREBLEU when it is imported
        os.environ.setdefault("SACREBLEU", str((DOWNLOADS / "sacrebleu").resolve()))
    from sacrebleu import utils
    from sacrebleu.dataset import DATASETS

    try:
        return Path(utils.get_source_file(test_set.name, test_set.langpair)), [
            Path(p) for p in utils.get_reference_files(test_set.name, test_set.langpair)]
    except (SystemExit, Exception) as error:  # sacreBLEU exits on a failed download
        raise PrepareError(
            f"sacreBLEU could not fetch {test_set.name} {test_set.langpair} ({error}; from "
            f"{', '.join(DATASETS[test_set.name].data)}). On a machine with network, run `SACREBLEU=/some/dir "
            f"sacrebleu -t {test_set.name} -l {test_set.langpair} --echo src > /dev/null` and copy "
            f"/some/dir/{test_set.name.split('/')[0]} into {utils.SACREBLEU_DIR}/, then rerun") from None


def _archive_names(task, corpora=None):
    """The ``ARCHIVES`` keys of a task's training ``corpora`` (default: all it may train on) and dev and test sets."""
    corpora = (task.train + task.extra if corpora is None else corpora) + tuple(
        s for s in (task.valid, task.test) if isinstance(s, Parallel))
    return list(dict.fromkeys(name for corpus in corpora for name in corpus.archives((task.src, task.tgt))
                              if name in ARCHIVES))


def fetch(task_name, downloads=None):
    """Step ``fetch``: every archive and sacreBLEU set of the task on disk and checked (a user's directory: checked)."""
    task = TASKS[task_name]
    if task.manual:
        _manual_dir(task_name)
        return
    corpora, _ = training_corpora(task_name, current_settings(task_name), checked=True)
    for name in _archive_names(task, corpora):
        download(ARCHIVES[name], downloads or DOWNLOADS)
    for test_set in (task.valid, task.test):
        if isinstance(test_set, SacrebleuSet):
            _sacrebleu_files(test_set)


# ---------------------------------------------------------------- raw
def _decoded(raw, where, bar=None):
    """The lines of the binary stream ``raw`` as text without CR/LF (a BOM dropped); bytes that are not UTF-8 stop
    the step naming ``where`` and the line."""
    for number, line in enumerate(raw, 1):
        if bar is not None:
            bar.update(len(line))
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as error:
            raise PrepareError(f"{where}, line {number}: not UTF-8 ({error.reason} at byte {error.start}); "
                               "convert the file to UTF-8") from None
        yield (text.removeprefix("\ufeff") if number == 1 else text).rstrip("\n").rstrip("\r")


def _open_text(path):
    """Lines of a plain or gzipped UTF-8 text file (:func:`_decoded`)."""
    with open(path, "rb") as raw, (gzip.open(raw) if str(path).endswith(".gz") else nullcontext(raw)) as stream:
        yield from _decoded(stream, path)


def _open_archive(path):
    return zipfile.ZipFile(path) if str(path).endswith(".zip") else tarfile.open(path)


def _archive_files(archive):
    """``{name: (open, size)}`` of the files (not folders) of an open tar or zip archive."""
    if isinstance(archive, zipfile.ZipFile):
        return {info.filename: (functools.partial(archive.open, info), info.file_size)
                for info in archive.infolist() if not info.is_dir()}
    return {info.name: (functools.partial(archive.extractfile, info), info.size)
            for info in archive.getmembers() if info.isfile()}


def _member_names(archive_path, member):
    """``[member]``, or for a pattern the sorted names of the archive's files that match it (none: the step stops)."""
    if not any(character in member for character in "*?["):
        return [member]
    with _open_archive(archive_path) as archive:
        names = list(_archive_files(archive))
    found = sorted(name for name in names if fnmatch.fnmatchcase(name, member))
    if not found:
        raise PrepareError(f"{archive_path} has no member matching {member} (it holds e.g. {names[:10]})")
    return found


def _member_stream(archive_path, member):
    """Lines of one member of a tar or zip archive, read as they are asked for (a BOM dropped, CR/LF stripped): the
    member by its path, else the one file whose name ends in ``/<its file name>``."""
    archive = _open_archive(archive_path)
    files = _archive_files(archive)
    base = member.rsplit("/", 1)[-1]
    found = [member] if member in files else [name for name in files if name == base or name.endswith("/" + base)]
    if len(found) != 1:
        raise PrepareError(f"{archive_path} has {'no' if not found else 'more than one'} member {member} "
                           f"({found or 'it holds e.g. ' + str(list(files)[:10])})")
    open_member, size = files[found[0]]
    with archive, open_member() as raw, _byte_bar(f"extract {base}", size) as bar:
        yield from _decoded(raw, f"{archive_path} ({found[0]})", bar)


def _local(name, downloads):
    """Path of an archive key (in ``downloads``) or of a repository file."""
    path = downloads / ARCHIVES[name].filename if name in ARCHIVES else REPO / name
    if not path.exists():
        raise PrepareError(f"{path} is missing; run the fetch step first (make data-<task>)")
    return path


def corpus_parts(corpus, src, tgt, downloads):
    """``[(where, source lines, target lines)]``: each pair of files of a ``Parallel`` corpus (one, unless its member
    is a pattern), its lines read lazily, ``where`` naming the files for messages."""
    if corpus.member is None:
        paths = [_local(corpus.archive.format(lang=lang), downloads) for lang in (src, tgt)]
        return [(f"{paths[0]} and {paths[1]}", _open_text(paths[0]), _open_text(paths[1]))]
    path = _local(corpus.archive, downloads)
    sides = [_member_names(path, corpus.member_of(lang)) for lang in (src, tgt)]
    if len(sides[0]) != len(sides[1]):
        raise PrepareError(f"{path}: {len(sides[0])} {src} files {sides[0]} but {len(sides[1])} {tgt} files "
                           f"{sides[1]}")
    return [(f"{path} ({a} and {b})", _member_stream(path, a), _member_stream(path, b)) for a, b in zip(*sides)]


def corpus_lines(corpus, src, tgt, downloads):
    """The (source lines, target lines) of a ``Parallel`` corpus, each as a list (dev and test sets)."""
    parts = corpus_parts(corpus, src, tgt, downloads)
    return tuple([line for part in parts for line in part[side]] for side in (1, 2))


@contextmanager
def _text_output(path):
    """A UTF-8 text file written as ``<path>.tmp`` and renamed to ``path`` only when the block ends without error;
    on an error or an interruption the ``.tmp`` file is removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as out:
            yield out
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)


def _append(out, lines):
    """Write ``lines`` (a newline inside one becomes a space) to the open file ``out``; return how many."""
    written = 0
    for written, line in enumerate(lines, 1):
        out.write(line.replace("\n", " ") + "\n")
    return written


def _write_lines(path, lines):
    with _text_output(path) as out:
        _append(out, lines)


def _copy_split(out, directory, split, langs):
    """Stream the plain-text pair ``directory/<split>.<lang>`` of ``langs`` (source, target) into ``out``; the pairs."""
    paths = [directory / f"{split}.{lang}" for lang in langs]
    with _text_output(out / paths[0].name) as src_out, _text_output(out / paths[1].name) as tgt_out:
        return _append_pairs(src_out, tgt_out, f"{paths[0]} and {paths[1].name}", *map(_open_text, paths))


def _append_pairs(src_out, tgt_out, where, src_lines, tgt_lines):
    """Append a corpus's source and target lines to the two open files; return the pairs (unequal sides: stop)."""
    pairs, targets = _append(src_out, src_lines), _append(tgt_out, tgt_lines)
    if pairs != targets:
        raise PrepareError(f"{where}: {pairs} source lines but {targets} target lines")
    return pairs


def _write_set(out, task_name, split, sources, references, numbered):
    """``<split>.<src>`` and its references, each as long: ``<split>.<tgt>`` (a dev set's first reference, or the only
    one unless ``numbered``), else ``<split>.<tgt>0``, ``<split>.<tgt>1``, ..."""
    task = TASKS[task_name]
    for reference in references:
        if len(sources) != len(reference):
            raise PrepareError(f"{split} set of {task_name}: {len(sources)} source lines but {len(reference)} "
                               f"target lines")
    _write_lines(out / f"{split}.{task.src}", sources)
    if split == "valid" or not numbered:
        _write_lines(out / f"{split}.{task.tgt}", references[0])
    else:
        for number, reference in enumerate(references):
            _write_lines(out / f"{split}.{task.tgt}{number}", reference)


def corpus_name(corpus):
    """A readable name of a ``Parallel`` corpus: ``News Commentary v12``, ``data/wmt14-ende-sample/train.*``."""
    return CORPUS_NAMES.get(corpus.archive, corpus.archive.format(lang="*"))


def write_corpora(out, task_name, corpora):
    """``<out>/corpora.json`` of ``corpora``, ``(name, pairs[, extra])`` each: ``{"task", "corpora": [{"name", "pairs",
    "extra" (true for a part of the task's full data beyond ``train``: WMT17's UN and CWMT)}], "pairs"}``."""
    entries = [{"name": name, "pairs": pairs, **({"extra": True} if extra and extra[0] else {})}
               for name, pairs, *extra in corpora]
    document = {"task": task_name, "corpora": entries, "pairs": sum(entry["pairs"] for entry in entries)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "corpora.json").write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")


def extra_dir_missing(task_name, directory):
    """The training files (``train.<src>``, ``train.<tgt>``) that ``directory``, the task's ``extra_dir``, lacks."""
    task = TASKS[task_name]
    return [name for name in (f"train.{task.src}", f"train.{task.tgt}") if not (Path(directory) / name).is_file()]


def raw(task_name, downloads=None, out=None):
    """Step ``raw``: ``raw/{train,valid,test}.<lang>`` (multi-reference tests numbered) of the task."""
    task = TASKS[task_name]
    downloads = downloads or DOWNLOADS
    out = out or DATA / task_name / "raw"
    if task.manual:
        return _manual_raw(task_name, out)
    settings = current_settings(task_name, Path(out).parent)
    corpora, own = training_corpora(task_name, settings, checked=True)
    if settings.get(task.small_flag):
        print(f"raw: note: {task.small_flag}=1: {', '.join(map(corpus_name, corpora))} alone, not the task's full "
              f"training data", file=sys.stderr)
    records = []
    # streamed, pair file by pair file: as lists, WMT17's full data (25M pairs) would take many GB of memory
    with _text_output(out / f"train.{task.src}") as src_out, _text_output(out / f"train.{task.tgt}") as tgt_out:
        for corpus in corpora:
            pairs = sum(_append_pairs(src_out, tgt_out, *part)
                        for part in corpus_parts(corpus, task.src, task.tgt, downloads))
            records.append((corpus_name(corpus), pairs, corpus in task.extra))
        if own:
            pairs = _append_pairs(src_out, tgt_out, f"{task.extra_dir}={own}",
                                  *(_open_text(own / f"train.{lang}") for lang in (task.src, task.tgt)))
            records.append((f"{task.extra_dir} ({own}): UN v1.0 + CWMT", pairs, True))
    write_corpora(out, task_name, records)
    for split, test_set in (("valid", task.valid), ("test", task.test)):
        if isinstance(test_set, SacrebleuSet):
            source, refs = _sacrebleu_files(test_set)
            sources, references = list(_open_text(source)), [list(_open_text(ref)) for ref in refs]
        else:
            sources, *references = corpus_lines(test_set, task.src, task.tgt, downloads)
        if split == "test" and task.test_lines:
            sources, references = sources[:task.test_lines], [r[:task.test_lines] for r in references]
        _write_set(out, task_name, split, sources, references, numbered=len(references) > 1)
    return out


# ---------------------------------------------------------------- the user's own directory (NIST_DIR, NIUTRANS_DIR)
#: The NIST test sets and the files they become.
NIST_SETS = {"nist06": "valid", "nist02": "test", "nist03": "test_nist03", "nist04": "test_nist04"}


def _manual_dir(task_name, directory=None):
    """The directory the task's ``manual`` variable names (or the one the data in ``directory`` were made from:
    :func:`data_settings`), checked to hold what the raw step reads."""
    task = TASKS[task_name]
    variable, nist = task.manual, task.manual == "NIST_DIR"
    if nist:
        names = ["train.zh", "train.en", *NIST_SETS]
    else:
        names = [f"{split}.{lang}" for split in ("train", "valid", "test") for lang in (task.src, task.tgt)]
    value = current_settings(task_name, directory)[variable]
    if not value and nist:
        raise PrepareError("nist_zhen needs the licensed LDC/NIST data: make data-nist_zhen NIST_DIR=/path\n"
                           + NIST_LAYOUT)
    if not value:
        raise PrepareError(f"this task's corpus cannot be downloaded: set {variable}=/path to a directory "
                           f"holding {', '.join(names)} (plain text, one sentence per line, untokenized)")
    missing = [str(Path(value) / name) if nist else name for name in names if not (Path(value) / name).exists()]
    if missing:
        raise PrepareError(f"{variable}={value} lacks {', '.join(missing)}" + ("\n" + NIST_LAYOUT if nist else ""))
    return Path(value)


def _manual_raw(task_name, out):
    """The raw step from the user's directory: its plain-text splits, or NIST's training pairs and SGML test sets."""
    task = TASKS[task_name]
    directory, langs = _manual_dir(task_name, Path(out).parent), (task.src, task.tgt)
    write_corpora(out, task_name, [(f"{task.manual} ({directory})", _copy_split(out, directory, "train", langs))])
    if task.manual == "NIST_DIR":
        for name, split in NIST_SETS.items():
            _write_set(out, task_name, split, *nist_test_set(directory / name), numbered=True)
    else:
        for split in ("valid", "test"):
            _copy_split(out, directory, split, langs)
    return out


def _ids_usable(segments):
    """True when every segment has a seg id and no id repeats within its document."""
    keys = [(docid, segid) for docid, segid, _ in segments]
    return all(segid for _, segid in keys) and len(set(keys)) == len(keys)


def _keys(segments, positional):
    """(docid, seg id) of each segment, or (docid, "#<position in the document>") when ``positional``."""
    positions = defaultdict(lambda: count(1))
    return [(docid, f"#{next(positions[docid])}" if positional else segid) for docid, segid, _ in segments]


_DOC = re.compile(r"<doc\b([^>]*)>(.*?)</doc>", re.IGNORECASE | re.DOTALL)
_SEG = re.compile(r"<seg\b([^>]*)>(.*?)</seg>", re.IGNORECASE | re.DOTALL)
_ATTR = re.compile(r"""(\w+)\s*=\s*("([^"]*)"|'([^']*)'|([^\s>]+))""")


def _attrs(text):
    return {m.group(1).lower(): next(g for g in m.groups()[2:] if g is not None) for m in _ATTR.finditer(text)}


def read_sgml(path):
    """``{sysid ("" for a source file): [(docid, segid, text), ...]}`` of a NIST/WMT SGML file, in file order."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise PrepareError(f"{path} is not UTF-8 ({error}); convert it first (e.g. iconv -f gb18030)") from None
    systems = {}
    for doc in _DOC.finditer(text):
        attrs = _attrs(doc.group(1))
        docid, sysid = attrs.get("docid", ""), attrs.get("sysid", "")
        for seg in _SEG.finditer(doc.group(2)):
            segment = " ".join(html.unescape(seg.group(2)).split())
            systems.setdefault(sysid, []).append((docid, _attrs(seg.group(1)).get("id", ""), segment))
    if not systems:
        raise PrepareError(f"{path}: no <doc>/<seg> elements found")
    return systems


def nist_test_set(directory):
    """Source lines and reference line lists of a NIST test-set directory, aligned to the source by (docid, segid)."""
    directory = Path(directory)
    sgms = sorted(directory.glob("*.sgm"))
    src_files = [p for p in sgms if "src" in p.name.lower()]
    ref_files = [p for p in sgms if "ref" in p.name.lower()]
    if len(src_files) != 1 or not ref_files:
        raise PrepareError(f"{directory} must hold one *src*.sgm and at least one *ref*.sgm; found "
                           f"{[p.name for p in sgms]}")
    systems = read_sgml(src_files[0])
    if len(systems) != 1:
        raise PrepareError(f"{src_files[0]} holds {len(systems)} systems; a source file holds one")
    [source] = systems.values()
    references = []
    for ref_file in ref_files:
        for sysid, segments in read_sgml(ref_file).items():
            # segments are matched by (docid, seg id); by (docid, position) when ids are missing or repeated
            positional = not (_ids_usable(source) and _ids_usable(segments))
            by_key = dict(zip(_keys(segments, positional), (text for _, _, text in segments)))
            source_keys = _keys(source, positional)
            missing = [key for key in source_keys if key not in by_key]
            if missing:
                raise PrepareError(f"{ref_file} (sysid {sysid!r}) lacks {len(missing)} source segments, "
                                   f"e.g. docid {missing[0][0]} seg {missing[0][1]}")
            references.append([by_key[key] for key in source_keys])
    return [text for _, _, text in source], references


# ---------------------------------------------------------------- tok
_TOKENIZERS = {}


def _tokenize_line(args):
    lang, line = args
    if lang == "zh":
        import jieba

        jieba.setLogLevel(60)
        return " ".join(word for word in jieba.cut(" ".join(line.split())) if word.strip())
    if lang not in _TOKENIZERS:
        from sacremoses import MosesPunctNormalizer, MosesTokenizer

        _TOKENIZERS[lang] = (MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang))
    normalizer, tokenizer = _TOKENIZERS[lang]
    return tokenizer.tokenize(normalizer.normalize(line), aggressive_dash_splits=True, escape=False,
                              return_str=True)


def _chunk_job(job):
    """Worker side of ``map_lines``: ``function((key, line))`` over one chunk of lines."""
    function, key, lines = job
    return [function((key, line)) for line in lines]


def map_lines(function, key, lines, workers=1, desc=None, total=None):
    """``function((key, line))`` of each of ``lines``, yielded in order, with a line bar (``desc``; ``total`` lines,
    default ``len(lines)`` of a list); in chunks of ``CHUNK_LINES`` over ``workers`` processes when there are several,
    read at most ``4 * workers`` chunks ahead, so that memory does not grow with the corpus (unlike ``Pool.imap``)."""
    total = len(lines) if total is None and isinstance(lines, list) else total
    with progress_bar(desc=desc, total=total, unit=" lines", unit_scale=True) as bar, \
            (Pool(workers) if workers > 1 else nullcontext()) as pool:
        ahead, lines = deque(), iter(lines)  # chunks sent to the pool (or done here), oldest first

        def next_done():
            done = ahead.popleft().get() if pool else ahead.popleft()
            bar.update(len(done))
            return done

        for chunk in iter(lambda: list(islice(lines, CHUNK_LINES)), []):
            job = (function, key, chunk)
            ahead.append(pool.apply_async(_chunk_job, (job,)) if pool else _chunk_job(job))
            if len(ahead) >= (4 * workers if pool else 1):
                yield from next_done()
        while ahead:
            yield from next_done()


def count_lines(path):
    """The newline bytes of a text file, for a line bar's total; None when no bar is shown (no extra read for it)."""
    if not bars_shown():
        return None
    with open(path, "rb") as handle:
        return sum(block.count(b"\n") for block in iter(lambda: handle.read(1 << 20), b""))


def tokenize_lines(lines, lang, workers=1, desc=None, total=None):
    """Tokenized lines (sacremoses for alphabetic languages, jieba for Chinese), in order, as a generator."""
    return map_lines(_tokenize_line, lang, lines, workers, desc or f"tok {lang}", total)


def _split_files(directory):
    """``{name: path}`` of the text files of a step directory (``train.en``, ``test.de0``, ...)."""
    return {p.name: p for p in sorted(directory.iterdir()) if p.is_file() and not p.name.endswith((".tmp", ".json"))}


def tok(task_name, workers=1):
    """Step ``tok``: ``tok/<file>`` for every ``raw/<file>`` (copied as is for a pre-tokenized task)."""
    task = TASKS[task_name]
    base = DATA / task_name
    for name, path in _split_files(base / "raw").items():
        lines = _open_text(path)
        _write_lines(base / "tok" / name, lines if task.pretokenized else tokenize_lines(
            lines, name.split(".", 1)[1].rstrip("0123456789"), workers, desc=f"tok {name}", total=count_lines(path)))


# ---------------------------------------------------------------- clean
def keep_pair(src, tgt, max_len, ratio):
    """True when a training pair passes the length filter: both sides 1..max_len tokens, ratio <= ``ratio``."""
    n_src, n_tgt = len(src.split()), len(tgt.split())
    return 0 < n_src <= max_len and 0 < n_tgt <= max_len and max(n_src, n_tgt) <= ratio * min(n_src, n_tgt)


def clean(task_name):
    """Step ``clean``: length- and ratio-filtered training pairs in ``clean/``, counts (and those of the task's
    ``subsets``) in ``clean/stats.json``."""
    task = TASKS[task_name]
    base = DATA / task_name
    pairs_in = kept = 0
    in_subsets = {subset.name: 0 for subset in task.subsets}
    with _text_output(base / "clean" / f"train.{task.src}") as src_out, \
            _text_output(base / "clean" / f"train.{task.tgt}") as tgt_out:
        paths = [base / "tok" / f"train.{lang}" for lang in (task.src, task.tgt)]
        for pairs_in, (src, tgt) in enumerate(zip_longest(*map(_open_text, paths)), 1):
            if src is None or tgt is None:
                raise PrepareError(f"{paths[0]} and {paths[1]} differ in length (line {pairs_in} is in one only); "
                                   f"delete them and rerun make data-{task_name}")
            if keep_pair(src, tgt, task.max_len, task.ratio):
                kept += 1
                src_out.write(src + "\n")
                tgt_out.write(tgt + "\n")
                for subset in task.subsets:
                    in_subsets[subset.name] += subset.keeps(src, tgt)
    stats = {"pairs_in": pairs_in, "pairs_kept": kept, "max_len": task.max_len, "ratio": task.ratio}
    for subset in task.subsets:
        stats.setdefault("subsets", {})[subset.name] = {"pairs": in_subsets[subset.name], "note": subset.note}
        print(f"clean: {in_subsets[subset.name]} of them in {subset.name} ({subset.note})", file=sys.stderr)
    (base / "clean" / "stats.json").write_text(json.dumps(stats, indent=1) + "\n", encoding="utf-8")
    print(f"clean: kept {kept} of {pairs_in} training pairs of {task_name}", file=sys.stderr)


# ---------------------------------------------------------------- bpe
_BPE = {}


def _apply_line(args):
    codes, line = args
    if codes not in _BPE:
        from subword_nmt.apply_bpe import BPE

        with open(codes, encoding="utf-8") as handle:
            _BPE[codes] = BPE(handle)
    return _BPE[codes].process_line(line)


def apply_bpe(lines, codes, workers=1, desc=None, total=None):
    """BPE-segmented lines (subword-nmt, ``@@`` separator) with the codes file ``codes``, as a generator."""
    return map_lines(_apply_line, str(codes), lines, workers, desc or f"bpe {Path(codes).name}", total)


def learn_bpe(inputs, codes, merges, workers=1):
    """Learn ``merges`` BPE operations with subword-nmt over the files ``inputs`` into ``codes`` (its own tqdm
    bar swapped for ``progress_bar``, which follows ``PROGRESS``)."""
    from subword_nmt import learn_bpe as module

    joined = codes.with_name(codes.name + ".input")
    _write_lines(joined, (line for path in inputs for line in _open_text(path)))

    def merges_bar(iterable, *args, **kwargs):  # closed at the end: learning may stop before the last merge
        return bars.enter_context(progress_bar(iterable=iterable, desc=f"learn {codes.name}", unit=" merges"))

    stock_bar, module.tqdm = module.tqdm, merges_bar
    try:
        with ExitStack() as bars, open(joined, encoding="utf-8") as infile, open(codes, "w", encoding="utf-8") as out:
            module.learn_bpe(infile, out, merges, num_workers=workers)
    finally:
        module.tqdm = stock_bar
    joined.unlink()


def bpe(task_name, workers=1, merges=None):
    """Step ``bpe``: codes learned on the cleaned training data, then ``<split>.bpe.<lang>`` and the references."""
    task = TASKS[task_name]
    base = DATA / task_name
    merges = merges or task.merges
    recipe = recipes(task_name, _recorded_recipe(base, "raw"), merges=merges)["bpe"]
    if _recorded_recipe(base, "bpe") != recipe:  # --merges: recorded, so that a later make redoes the step
        _write_recipe(base, "bpe", recipe)
    train = {lang: base / "clean" / f"train.{lang}" for lang in (task.src, task.tgt)}
    codes = {lang: base / ("bpe.codes" if task.joint_bpe else f"bpe.codes.{lang}") for lang in train}
    for path in dict.fromkeys(codes.values()):  # one codes file learned on both languages, or one for each
        learn_bpe([train[lang] for lang in train if codes[lang] == path], path, merges, workers)
    for lang, path in train.items():
        _write_lines(base / f"train.bpe.{lang}", apply_bpe(_open_text(path), codes[lang], workers,
                                                            desc=f"bpe train.{lang}", total=count_lines(path)))
    for subset in task.subsets:  # its pairs' lines of train.bpe.*: BPE'd once, with the whole corpus's codes
        keep = bytearray(subset.keeps(s, t) for s, t in zip(_open_text(train[task.src]), _open_text(train[task.tgt])))
        for lang in train:
            _write_lines(base / f"train.{subset.name}.bpe.{lang}",
                         compress(_open_text(base / f"train.bpe.{lang}"), keep))
    for name, path in _split_files(base / "tok").items():
        split, lang = name.split(".", 1)
        if split == "train":
            continue
        plain = lang.rstrip("0123456789")
        if plain == task.src or split == "valid":
            _write_lines(base / f"{split}.bpe.{lang}", apply_bpe(_open_text(path), codes[plain], workers,
                                                                 desc=f"bpe {name}", total=count_lines(path)))
        if plain == task.tgt and split != "valid":  # references: tokenized (multi-bleu) and raw (sacreBLEU)
            shutil.copyfile(path, base / f"{split}.tok.{lang}")
            if task.pretokenized:  # released tokenized (and HTML-escaped): detokenize for sacreBLEU
                from sacremoses import MosesDetokenizer

                detok = MosesDetokenizer(lang=plain)
                _write_lines(base / f"{split}.{lang}",
                             [detok.detokenize(line.split()) for line in _open_text(base / "raw" / name)])
            else:
                shutil.copyfile(base / "raw" / name, base / f"{split}.{lang}")


# ---------------------------------------------------------------- recipes
#: Raised by hand when a step's code changes what it writes for the same input and settings.
STEP_VERSIONS = {"fetch": 1, "raw": 1, "tok": 1, "clean": 1, "bpe": 1}


def _version(package):
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def data_settings(task_name, previous_raw=None):
    """What the environment says about a task's data: ``{variable: value}`` of the data directory its raw step reads
    (``extra_dir`` or ``manual``) and of its small-data flag (1, 0 or unset; anything else stops the step).
    The directory counts once set: left unset later, the one the data were made from (``previous_raw``, the raw
    step's earlier recipe) stands, so that a later ``make`` without it keeps the data.  The flag counts when set."""
    task = TASKS[task_name]
    settings = {}
    variable = task.extra_dir or task.manual
    if variable:
        value = os.environ.get(variable)
        settings[variable] = str(Path(value).resolve()) if value else (previous_raw or {}).get(variable, "")
    if task.small_flag:
        value = os.environ.get(task.small_flag, "")
        if value not in ("", "0", "1"):
            raise PrepareError(f"{task.small_flag}={value}: set it to 1 (the small data, on purpose) or 0, or unset it")
        settings[task.small_flag] = value == "1"
        if settings[task.small_flag] and os.environ.get(task.extra_dir):
            raise PrepareError(f"{task.small_flag}=1 leaves out the pairs {task.extra_dir} holds: unset one of them")
    return settings


def current_settings(task_name, directory=None):
    """:func:`data_settings` against the raw step's recorded recipe in ``directory`` (default the task's)."""
    return data_settings(task_name, _recorded_recipe(Path(directory or DATA / task_name), "raw"))


def training_corpora(task_name, settings, checked=False):
    """``(corpora, own)``: the ``Parallel`` corpora a task trains on under ``settings`` (:func:`data_settings`),
    and the directory of the user's own copy of its ``extra`` corpora, or None (``checked``: one lacking a training
    file stops the step, naming it)."""
    task = TASKS[task_name]
    if not task.extra or settings.get(task.small_flag):
        return task.train, None
    if not settings.get(task.extra_dir):
        return task.train + task.extra, None
    own = Path(settings[task.extra_dir])
    missing = extra_dir_missing(task_name, own) if checked else []
    if missing:
        raise PrepareError(f"{task.extra_dir}={own} lacks {', '.join(missing)}: {WMT17_EXTRA}")
    return task.train, own


def _recorded_recipe(directory, step):
    try:
        return json.loads((directory / f".recipe.{step}").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def recipes(task_name, previous_raw=None, merges=None):
    """What each step of ``task_name`` writes depends on besides its input files: ``{step: {name: value}}``; the
    raw step's holds :func:`data_settings` (``previous_raw``: its earlier recipe); ``merges``: the bpe step's
    when not the task's (``--merges``)."""
    task = TASKS[task_name]
    packages = {"jieba" if lang == "zh" else "sacremoses" for lang in (task.src, task.tgt)}  # as _tokenize_line
    tokenizers = {} if task.pretokenized else {package: _version(package) for package in packages}
    settings = data_settings(task_name, previous_raw)
    corpora, _ = training_corpora(task_name, settings)
    steps = {
        "fetch": {"archives": _archive_names(task, corpora), "sets": [repr(task.valid), repr(task.test)]},
        "raw": {"train": repr(corpora), "valid": repr(task.valid), "test": repr(task.test),
                "test_lines": task.test_lines, **settings},
        "tok": {"src": task.src, "tgt": task.tgt, "pretokenized": task.pretokenized, **tokenizers},
        "clean": {"max_len": task.max_len, "ratio": task.ratio, "subsets": repr(task.subsets)},
        "bpe": {"joint_bpe": task.joint_bpe, "merges": merges or task.merges, "subsets": repr(task.subsets),
                "subword-nmt": _version("subword-nmt"),
                **({"sacremoses": _version("sacremoses")} if task.pretokenized else {})},  # detokenized references
    }
    return {step: {"version": STEP_VERSIONS[step], **settings} for step, settings in steps.items()}


def write_recipes(task_name, directory=None):
    """Write ``<directory>/.recipe.<step>`` for every step whose recipe differs from the recorded one (or has none),
    saying why on stderr when that step had been done; leave the others untouched (make compares their times)."""
    directory = Path(directory or DATA / task_name)
    for step, recipe in recipes(task_name, _recorded_recipe(directory, "raw")).items():
        before = _recorded_recipe(directory, step)
        if before == recipe:
            continue
        if (directory / f".{step}").exists():
            why = ("it has no recorded recipe (made by an earlier onmt-ext)" if before is None else
                   "its " + ", ".join(key for key in sorted(set(recipe) | set(before))
                                      if recipe.get(key) != before.get(key)) + " changed")
            print(f"prepare_data.py: {directory}: step {step} is redone with the steps after it: {why}",
                  file=sys.stderr)
        _write_recipe(directory, step, recipe)


def _write_recipe(directory, step, recipe):
    _write_lines(directory / f".recipe.{step}", json.dumps(recipe, indent=1, sort_keys=True).splitlines())


STEPS = {"fetch": fetch, "raw": raw, "tok": tok, "clean": clean, "bpe": bpe, "recipe": write_recipes}


def main(argv=None):
    parser = common.Parser(description=__doc__.split("\n")[0])
    parser.add_argument("step", nargs="?", choices=list(STEPS))
    parser.add_argument("task", nargs="?", choices=sorted(TASKS))
    parser.add_argument("--workers", type=common.at_least(1), default=os.cpu_count() or 1,
                        help="processes for tokenization and BPE (default: every CPU)")
    parser.add_argument("--merges", type=int, default=None, help="BPE merges (default: the task's, 32000)")
    parser.add_argument("--list", action="store_true", help="list the tasks and their sources")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="progress bars on stderr (default: only when stderr is a terminal)")
    args = parser.parse_args(argv)
    global PROGRESS
    PROGRESS = args.progress
    if args.list or not args.step:
        for name, task in TASKS.items():
            if task.manual:
                how = f"from {task.manual} (cannot be downloaded)"
            elif not _archive_names(task) and not any(isinstance(s, SacrebleuSet) for s in (task.valid, task.test)):
                how = "shipped in this repository"
            else:
                how = "downloaded"
            print(f"{name}: {task.src}->{task.tgt}; {how}" + "".join(f"; {note}" for note in task.notes))
        return 0
    if not args.task:
        parser.error("a task is needed")
    os.chdir(REPO)
    if args.merges is not None and args.step != "bpe":
        parser.error(f"--merges is an option of the bpe step, not of {args.step}")
    options = {"tok": {"workers": args.workers}, "bpe": {"workers": args.workers, "merges": args.merges}}
    STEPS[args.step](args.task, **options.get(args.step, {}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
