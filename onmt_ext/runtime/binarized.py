"""``-ext_binarized DIR``: training reads its corpora as token ids that ``onmt_ext_binarize`` computed once.

A data worker spends most of its time on each line (read, split, transforms, vocabulary look-up: results/bench/
data-path-2026-11-29.md), again in every epoch. :func:`build` runs stock's pipeline once over every line of the
training corpora and stores, per line, what stock's bucket would hold: nothing (an empty pair), a filtered example,
or the ids of both sides with a number standing for the source text (one number per distinct text across the
corpora, which is all that stock's batches look at). With the option set, ``DynamicDatasetIter.from_opt`` swaps the
training corpora for :class:`BinarizedCorpus` (after checking :func:`fingerprint`), each worker reads its share of
the lines (stock's ``stride``/``offset``) from memory-mapped arrays, and its buckets skip the transforms: the same
examples, buckets, batches and order as from the text (``tests/unit/test_binarized.py``). Only transforms that give
each example the same result every time qualify (:data:`DETERMINISTIC`); validation reads the text as before.
``-ext_binarized_cache ROOT`` names the directory by the fingerprint's digest under ROOT and binarises into it
first when it is not there (:func:`cached`), so that a config needs no separate command.
"""

import contextlib
import copy
import errno
import fcntl
import glob
import hashlib
import json
import multiprocessing
import os
import re
import shutil
import socket
import sys
import time
from dataclasses import dataclass
from importlib import metadata

import numpy as np

from onmt_ext.errors import UsageError, UserError
from onmt_ext.options import option, register_mechanism
from onmt_ext.patches import SPEED, patch, runtime_choice
from onmt_ext.runtime.corpus import check_corpus, corpora_of, share_of

# OpenNMT-py is imported inside the functions: importing it while this module initialises would activate
# onmt-ext (onmt_ext._autoload) before this module is whole.

#: The version of the files' layout (in the fingerprint: training refuses a directory of another version).
FORMAT = 1
MANIFEST = "manifest.json"
#: What one line became: left out before the bucket (an empty side), filtered by a transform, or kept.
ABSENT, FILTERED, KEPT = 0, 1, 2
#: The arrays of one corpus: ``<corpus>.<name>.npy``.
ARRAYS = ("state", "src_offsets", "src_ids", "tgt_offsets", "tgt_ids", "src_key")
#: Stands for the transform pipe in a binarised example's ``(example, transform, corpus)`` triple.
BINARIZED = "onmt_ext_binarized"
#: Lines read per step of a worker's iterator, and per call of stock's ``process`` while building.
CHUNK = 4096
#: Seconds between two progress lines of :func:`build`.
PROGRESS_EVERY = 30
_TEST = "tests/unit/test_binarized.py"


def _log(text):
    from onmt.utils.logging import logger

    logger.info(text)


def _sampling_off(transform):
    """A subword transform (sentencepiece, bpe, onmt_tokenize) that samples no segmentation in training."""
    opts = transform.opts
    return (opts.src_subword_alpha == opts.tgt_subword_alpha == 0
            and opts.src_subword_nbest in (0, 1) and opts.tgt_subword_nbest in (0, 1))


#: Transforms whose result for an example is the same at every call, with the condition for it.
DETERMINISTIC = {
    "filtertoolong": lambda transform: True,
    "prefix": lambda transform: True,
    "suffix": lambda transform: True,
    "clean": lambda transform: True,
    "normalize": lambda transform: True,
    "jieba": lambda transform: True,
    "sentencepiece": _sampling_off,
    "bpe": _sampling_off,
    "onmt_tokenize": _sampling_off,
    # the study's tagger labels a bucket's sentences together, as padded batches: the rule splitter only
    "clause_split": lambda transform: not getattr(transform, "tagger_model", None),
}


def _combination_check(opt):
    options = BinarizedOptions.from_opt(opt)
    if options.binarized and options.binarized_cache:
        return ["-ext_binarized and -ext_binarized_cache both name where the binarised data is: keep one"]
    if (options.binarized or options.binarized_cache) and runtime_choice() == "stock":
        name = "-ext_binarized" if options.binarized else "-ext_binarized_cache"
        return [f"{name} is part of onmt-ext's runtime, which ONMT_EXT_RUNTIME=stock switches off; drop one of "
                "the two"]
    return []


@register_mechanism("ext_", combination_check=_combination_check)
@dataclass(frozen=True)
class BinarizedOptions:
    """``-ext_binarized`` and ``-ext_binarized_cache``."""

    binarized: str = option("", "onmt_train: read the training corpora from this directory, written by "
                            "onmt_ext_binarize with the same config, instead of the text: the same batches with the "
                            "transforms and vocabulary look-ups done once; docs/binarized-data.md")
    binarized_cache: str = option("", "onmt_train: read the training corpora as ids from a directory under this one "
                                  "named by what the ids depend on (corpora, transforms, vocabularies), binarising "
                                  "them there first if it is not there yet; docs/binarized-data.md")


def _training_corpora(opt):
    from onmt.constants import CorpusName

    return {name: entry for name, entry in opt.data.items() if name != CorpusName.VALID}


def problems(opt, transforms):
    """Why ``opt``'s training data cannot be binarised (messages; empty: it can). ``transforms``: name -> object."""
    from onmt.constants import ModelTask

    found = []
    if opt.copy_attn:
        found.append("-copy_attn builds a vocabulary per example: train from the text")
    if opt.n_src_feats:
        found.append("-n_src_feats: source features are not binarised: train from the text")
    if getattr(opt, "data_task", ModelTask.SEQ2SEQ) != ModelTask.SEQ2SEQ:
        found.append(f"-data_task {opt.data_task}: only seq2seq data is binarised")
    for name, entry in _training_corpora(opt).items():
        if entry.get("path_txt") or not entry.get("path_tgt") or entry.get("path_align"):
            found.append(f"corpus {name!r}: only parallel corpora (path_src, path_tgt, no path_align) are binarised")
        for transform in entry.get("transforms") or []:
            if transform not in transforms:
                continue
            rule = DETERMINISTIC.get(transform)
            if rule is None or not rule(transforms[transform]):
                found.append(f"corpus {name!r}: transform {transform} may give an example another result at each "
                             "call (sampling, a batch-wise model or a random draw); binarising would fix one: train "
                             "from the text")
    return found


def config_problems(opt):
    """:func:`problems` of a training config that is parsed but not validated (``opt.data`` still its YAML text, as
    ``onmt.utils.parse.ArgumentParser`` leaves it before ``validate_train_opts``), with no file read: each
    transform is made from the options without its warm-up (which loads its models and needs the vocabularies),
    and a corpus without ``transforms`` takes the config's, as validation gives it."""
    from onmt.transforms import get_transforms_cls

    opt = copy.copy(opt)
    opt.data = {name: {**entry, "transforms": list(opt.transforms if entry.get("transforms") is None
                                                   else entry["transforms"])}
                for name, entry in corpora_of(opt.data).items()}
    names = set(opt.transforms).union(*(entry["transforms"] for entry in opt.data.values()))
    return problems(opt, {name: cls(opt) for name, cls in get_transforms_cls(sorted(names)).items()})


def _file_stamp(path):
    status = os.stat(path)
    return {"path": os.path.abspath(path), "bytes": status.st_size, "modified_ns": status.st_mtime_ns}


def _vocab_digest(vocab):
    return hashlib.sha256("\n".join(vocab.ids_to_tokens).encode("utf-8")).hexdigest()


def _transform_options(transforms):
    """The names of the options that the classes of ``transforms`` declare."""
    import configargparse

    parser = configargparse.ArgumentParser(conflict_handler="resolve")
    for transform in transforms.values():
        type(transform).add_options(parser)
    return sorted({action.dest for action in parser._actions if action.dest != "help"})


#: the libraries whose versions the transforms' output may depend on (their tokenisers, models and rules)
LIBRARIES = ("sentencepiece", "pyonmttok", "subword-nmt", "jieba", "spacy")


def _jsonable(value):
    return json.loads(json.dumps(value, default=str))


def _code(transforms):
    """The sha256 of the module that defines each transform's class (onmt-ext's clause splitter keeps its rules
    there), and the versions of :data:`LIBRARIES` (None where not installed)."""
    modules = {}
    for transform in transforms.values():
        module = sys.modules[type(transform).__module__]
        with open(module.__file__, "rb") as source:
            modules[module.__name__] = hashlib.sha256(source.read()).hexdigest()
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {"modules": modules, "versions": versions}


def fingerprint(opt, transforms, vocabs):
    """What the binarised ids depend on, as JSON-able values: every training corpus's files, transforms and other
    settings (all of its entry but its weight, which only mixes), each transform's arguments (its ``repr``) and
    the values of the options its class declares (a file they name: its stamp), the transforms' code and
    libraries (:func:`_code`), and the vocabularies."""
    corpora = {}
    for name, entry in sorted(_training_corpora(opt).items()):
        settings = {key: value for key, value in entry.items()
                    if key not in ("path_src", "path_tgt", "transforms", "weight")}
        corpora[name] = {"src": _file_stamp(entry["path_src"]), "tgt": _file_stamp(entry["path_tgt"]),
                         "transforms": [repr(transforms[t]) for t in entry.get("transforms") or [] if t in transforms],
                         "settings": _jsonable(settings)}
    files, options = {}, {}
    for key in _transform_options(transforms):
        value = getattr(opt, key, None)
        if isinstance(value, str) and os.path.isfile(value):
            files[key] = _file_stamp(value)
        else:
            options[key] = _jsonable(value)
    return {"format": FORMAT, "corpora": corpora, "files": files, "options": options, "code": _code(transforms),
            "vocabs": {side: _vocab_digest(vocabs[side]) for side in ("src", "tgt")},
            "decoder_start_token": vocabs.get("decoder_start_token")}


def _differences(theirs, ours, where=""):
    if isinstance(theirs, dict) and isinstance(ours, dict):
        found = []
        for key in sorted(set(theirs) | set(ours), key=str):
            found += _differences(theirs.get(key), ours.get(key), f"{where}.{key}" if where else str(key))
        return found
    return [] if theirs == ours else [where]


_AGAIN = "binarise again with onmt_ext_binarize ... -overwrite"


def _not_a_directory(option, directory):
    return UsageError(f"{option} {directory}: not a directory; name the directory that onmt_ext_binarize writes "
                      "(it makes it)")


def read_manifest(directory, option="-ext_binarized"):
    """The manifest of a binarised directory, or None when it has none; a :class:`UserError` when it cannot be
    read, is not JSON, or a corpus's arrays are missing or damaged (:func:`map_arrays`): a directory changed by
    hand, a copy cut short; a :class:`UsageError` for a file in its place. ``option`` names it in messages."""
    path = os.path.join(directory, MANIFEST)
    try:
        with open(path, encoding="utf-8") as handle:
            manifest = json.load(handle)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise _not_a_directory(option, directory) from None
    except OSError as error:
        raise UserError(f"{option} {directory}: cannot read {MANIFEST} ({error.strerror}); check the permissions "
                        f"there, or {_AGAIN}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UserError(f"{path}: damaged ({error}); {_AGAIN}") from None
    missing = [f"{name}.{key}.npy" for name in manifest.get("corpora", {}) for key in ARRAYS
               if not os.path.isfile(os.path.join(directory, f"{name}.{key}.npy"))]
    if missing:
        raise UserError(f"{option} {directory}: {', '.join(missing[:3])} missing; {_AGAIN}")
    for name, counts in manifest.get("corpora", {}).items():
        map_arrays(directory, name, counts, option)
    return manifest


def map_arrays(directory, name, counts=None, option="-ext_binarized"):
    """Corpus ``name``'s arrays (:data:`ARRAYS`) in ``directory``, memory-mapped (read as they are used); a
    :class:`UserError` naming the file that cannot be read or is cut short, or (with the manifest's ``counts``)
    whose length is not the one written."""
    arrays = {}
    for key in ARRAYS:
        path = os.path.join(directory, f"{name}.{key}.npy")
        try:
            arrays[key] = np.load(path, mmap_mode="r")
        except OSError as error:
            raise UserError(f"{option} {directory}: cannot read {os.path.basename(path)} ({error.strerror}); check "
                            f"the permissions there, or {_AGAIN}") from None
        except (ValueError, EOFError) as error:  # numpy's for a header or data cut short
            raise UserError(f"{option} {directory}: {os.path.basename(path)} is damaged ({error}); {_AGAIN}") from None
    if counts and all(isinstance(counts.get(key), int) for key in ("lines", "src_tokens", "tgt_tokens")):
        lines, tokens = counts["lines"], {side: counts[f"{side}_tokens"] for side in ("src", "tgt")}
        wanted = {"state": lines, "src_key": lines, "src_offsets": lines + 1, "tgt_offsets": lines + 1,
                  "src_ids": tokens["src"], "tgt_ids": tokens["tgt"]}
        for key, length in wanted.items():
            if arrays[key].shape != (length,) or (key.endswith("_ids") and int(
                    arrays[f"{key[:3]}_offsets"][-1]) != length):
                raise UserError(f"{option} {directory}: {name}.{key}.npy is damaged (shape {arrays[key].shape}, "
                                f"manifest.json counts {length}); {_AGAIN}")
    return arrays


def check(directory, opt, transforms, vocabs):
    """The manifest of ``directory`` if it holds ``opt``'s training data as it is now; else a :class:`UserError`
    naming what differs and the command that rebuilds it."""
    manifest = read_manifest(directory, "-ext_binarized")
    again = f"run onmt_ext_binarize -config <this config> (-ext_binarized {directory}) again"
    if manifest is None:
        raise UsageError(f"-ext_binarized {directory}: no binarised data there; run onmt_ext_binarize -config "
                         f"<this config> first")
    differ = _differences(manifest.get("fingerprint"), fingerprint(opt, transforms, vocabs))
    if differ:
        shown = ", ".join(differ[:3]) + (f" and {len(differ) - 3} more" if len(differ) > 3 else "")
        raise UserError(f"-ext_binarized {directory} was written for other training data ({shown} differ); {again}")
    return manifest


def _share(lines, stride, offset):
    """The line numbers (0-based, in order) that stock's ``ParallelCorpus.load`` reads at ``stride``/``offset``."""
    numbers = np.arange(lines)
    return numbers[share_of(numbers, stride) == offset]


def _binarize_share(name, corpus, transforms, opt, vocabs, lines, stride=1, offset=0, say=None):
    """One share of a corpus's lines (stock's ``stride``/``offset``) through stock's pipeline
    (``ParallelCorpusIterator``, ``process``, ``numericalize``): per line of the share its state and both sides'
    lengths, the kept lines' ids in order, and a 128-bit digest of each kept line's source text."""
    from onmt.constants import CorpusTask
    from onmt.inputters.text_corpus import build_corpora_iters
    from onmt.inputters.text_utils import numericalize, process

    chosen = _share(lines, stride, offset)
    state = np.full(len(chosen), ABSENT, dtype=np.int8)
    lengths = {side: np.zeros(len(chosen), dtype=np.int64) for side in ("src", "tgt")}
    ids, digests, chunk = {"src": [], "tgt": []}, [], []
    iterator = build_corpora_iters({name: corpus}, transforms, opt.data, skip_empty_level=opt.skip_empty_level,
                                   stride=stride, offset=offset)[name]
    start = last = time.monotonic()

    def flush():
        for example, _, _ in chunk:
            state[(example["cid_line_number"] - offset) // stride] = FILTERED
        for example in process(CorpusTask.TRAIN, chunk) or []:
            example = numericalize(vocabs, example)
            position = (example["cid_line_number"] - offset) // stride
            state[position] = KEPT
            digests.append(hashlib.blake2b(example["src"]["src"].encode("utf-8"), digest_size=16).digest())
            for side in ("src", "tgt"):
                found = example[side][f"{side}_ids"]
                lengths[side][position] = len(found)
                ids[side].append(np.asarray(found, dtype=np.int32))
        chunk.clear()

    for item in iterator:
        chunk.append(item)
        if len(chunk) == CHUNK:
            done = chunk[-1][0]["cid_line_number"] + 1
            flush()
            now = time.monotonic()
            if say is not None and now - last >= PROGRESS_EVERY:
                say(f"corpus {name!r}: {done:,}/{lines:,} lines ({100 * done / max(lines, 1):.0f}%), "
                    f"{now - start:.0f} s")
                last = now
    flush()
    return {"lines": chosen, "state": state, "src_lengths": lengths["src"], "tgt_lengths": lengths["tgt"],
            "src_ids": np.concatenate(ids["src"]) if ids["src"] else np.zeros(0, dtype=np.int32),
            "tgt_ids": np.concatenate(ids["tgt"]) if ids["tgt"] else np.zeros(0, dtype=np.int32),
            "digests": b"".join(digests)}


def _merge(lines, shares, keys):
    """One corpus's arrays (:data:`ARRAYS`) from the results of :func:`_binarize_share` that cover its ``lines``
    lines; ``keys`` numbers the distinct source texts across corpora, in the order of the lines."""
    out = {"state": np.full(lines, ABSENT, dtype=np.int8), "src_key": np.full(lines, -1, dtype=np.int64)}
    for share in shares:
        out["state"][share["lines"]] = share["state"]
    for side in ("src", "tgt"):
        lengths = np.zeros(lines, dtype=np.int64)
        for share in shares:
            lengths[share["lines"]] = share[f"{side}_lengths"]
        offsets = np.zeros(lines + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.zeros(int(offsets[-1]), dtype=np.int32)
        for share in shares:  # each kept line's ids from the share's run of ids to the line's place
            kept = share["lines"][share["state"] == KEPT]
            counts = lengths[kept]
            into = np.repeat(offsets[kept] - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))
            flat[into] = share[f"{side}_ids"]
        out[f"{side}_offsets"], out[f"{side}_ids"] = offsets, flat
    kept = np.concatenate([share["lines"][share["state"] == KEPT] for share in shares])
    digests = [share["digests"][16 * i:16 * i + 16] for share in shares for i in range(len(share["digests"]) // 16)]
    for index in np.argsort(kept, kind="stable").tolist():
        out["src_key"][kept[index]] = keys.setdefault(digests[index], len(keys))
    return out


#: a pool process's state (:func:`_start_process`): the options, vocabularies, transforms and corpora
_PROCESS = {}


def _start_process(opt, vocabs, transforms):
    """A pool process's start: the parent's options, vocabularies and transforms (pickled as stock pickles them
    for its data workers), and the training corpora."""
    try:  # (an initializer that raises makes the pool start processes again and again: the task raises instead)
        from onmt.constants import CorpusTask
        from onmt.inputters.text_corpus import get_corpora

        _PROCESS.update(opt=opt, vocabs=vocabs, transforms=transforms, corpora=get_corpora(opt, CorpusTask.TRAIN))
    except Exception as error:  # noqa: BLE001
        _PROCESS["error"] = error


def _share_in_process(task):
    name, lines, stride, offset = task
    state = _PROCESS
    if "error" in state:
        raise state["error"]
    return _binarize_share(name, state["corpora"][name], state["transforms"], state["opt"], state["vocabs"], lines,
                           stride, offset)


#: lines per process below which a corpus is binarised in the command's own process
LINES_PER_PROCESS = 100_000


def process_count(lines, asked=0):
    """How many processes binarise ``lines`` lines: ``asked`` if above 0, else one per
    :data:`LINES_PER_PROCESS` lines, at most the CPUs this process may use (and 16)."""
    if asked > 0:
        return asked
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cpus, 16, lines // LINES_PER_PROCESS))


def _build_corpus(name, corpus, transforms, opt, vocabs, keys, say, processes=0):
    """The arrays of one corpus (:data:`ARRAYS`): in this process, or in ``processes`` spawned ones
    (:func:`process_count`), each a share of the lines as stock's data workers take them; the same arrays."""
    lines, _ = check_corpus(name, corpus.src, corpus.tgt)  # (counted when the options were validated: cached)
    count = process_count(lines, processes)
    if count == 1:
        return _merge(lines, [_binarize_share(name, corpus, transforms, opt, vocabs, lines, say=say)], keys)
    shares, start, last, results = 4 * count, time.monotonic(), time.monotonic(), []
    say(f"corpus {name!r}: {lines:,} lines in {shares} shares, {count} processes")
    with multiprocessing.get_context("spawn").Pool(count, initializer=_start_process,
                                                      initargs=(opt, vocabs, transforms)) as pool:
        for result in pool.imap_unordered(_share_in_process, [(name, lines, shares, k) for k in range(shares)]):
            results.append(result)
            now = time.monotonic()
            if now - last >= PROGRESS_EVERY or len(results) == shares:
                say(f"corpus {name!r}: {len(results)}/{shares} shares, {now - start:.0f} s")
                last = now
    return _merge(lines, results, keys)


def build(opt, directory, overwrite=False, say=_log, processes=0):
    """Binarise ``opt``'s training corpora into ``directory`` (see the module docstring) in ``processes``
    processes (0: :func:`process_count`); returns the manifest.

    A directory that already holds this data is left as it is; one holding anything else is replaced only with
    ``overwrite`` (OpenNMT-py's ``-overwrite``). The files are written beside it and moved in when complete.
    """
    opt, transforms, vocabs = _prepared(opt)
    wanted = fingerprint(opt, transforms, vocabs)
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise _not_a_directory("-ext_binarized", directory)
    manifest = _current(directory, wanted)
    if manifest is not None:
        say(f"{directory} already holds this config's training data, binarised: nothing to do")
        return manifest
    with _writing("-ext_binarized", directory, "read it"):
        held = os.path.exists(directory) and os.listdir(directory)
    if held and not overwrite:
        raise UsageError(f"-ext_binarized {directory} already holds other files; add -overwrite to replace them")
    if held:
        _check_replaceable(opt, directory)
    return _write(opt, transforms, vocabs, directory, wanted, say, processes)


def _read_files(opt):
    """The files that ``opt`` reads, as real paths: every option value that names an existing file (the corpora of
    every ``data:`` entry, validation included, the vocabularies, the subword models, ...)."""
    values = [value for value in vars(opt).values() if isinstance(value, str)]
    for corpus in (getattr(opt, "data", None) or {}).values():
        values += [value for value in (corpus or {}).values() if isinstance(value, str)] if isinstance(
            corpus, dict) else []
    return sorted({os.path.realpath(value) for value in values if value and os.path.isfile(value)})


def _check_replaceable(opt, directory):
    """A :class:`UsageError` unless ``directory`` holds only what :func:`build` writes (its manifest and ``*.npy``
    array files, no folder): ``-overwrite`` replaces the whole directory, so it never deletes a user's files, above
    all a file that ``opt`` reads (a corpus, a vocabulary, a subword model)."""
    root = os.path.realpath(directory)
    inside = [path for path in _read_files(opt) if os.path.commonpath([root, path]) == root]
    if inside:
        raise UsageError(f"-ext_binarized {directory} holds {inside[0]}, which the config reads; -overwrite would "
                         "delete it: choose a directory of its own for the binarised data")
    with _writing("-ext_binarized", directory, "read it"):
        foreign = sorted(name for name in os.listdir(directory) if not (
            (name == MANIFEST or name.endswith(".npy")) and os.path.isfile(os.path.join(directory, name))
            and not os.path.islink(os.path.join(directory, name))))
    if foreign:
        raise UsageError(f"-ext_binarized {directory} holds {foreign[0]}, which onmt_ext_binarize did not write; "
                         "-overwrite replaces only earlier binarised data (manifest.json, *.npy): move it away "
                         "or choose another directory")


def _prepared(opt):
    """``(opt, transforms, vocabs)`` of a new training as ``onmt_train`` makes them, once :func:`problems` finds
    nothing; else a :class:`UsageError`."""
    from onmt import train_single
    from onmt.transforms import make_transforms

    if getattr(opt, "train_from", ""):
        raise UsageError("onmt_ext_binarize reads the data of a new training; drop -train_from")
    _, vocabs, transforms_cls = train_single._init_train(opt)
    transforms = make_transforms(opt, transforms_cls, vocabs)
    found = problems(opt, transforms)
    if found:
        raise UsageError("; ".join(found))
    return opt, transforms, vocabs


def _current(directory, wanted):
    """The manifest of ``directory`` if it holds the data of fingerprint ``wanted``; None if it does not (also
    when it is missing or damaged)."""
    try:
        manifest = read_manifest(directory) if os.path.isdir(directory) else None
    except UserError:
        return None
    return manifest if manifest is not None and manifest.get("fingerprint") == wanted else None


def cache_key(wanted):
    """The name of the directory of fingerprint ``wanted`` under ``-ext_binarized_cache``: 16 hex digits of its
    SHA-256 (64 bits: a chance of about 10^-19 that two data sets of one cache share a name)."""
    return hashlib.sha256(json.dumps(wanted, sort_keys=True).encode("utf-8")).hexdigest()[:16]


def build_cached(opt, root, say=_log, processes=0):
    """:func:`cached` for ``onmt_ext_binarize``: the directory under ``root`` for ``opt``'s training data."""
    opt, transforms, vocabs = _prepared(opt)
    return cached(root, opt, transforms, vocabs, say, processes)[0]


def cached(root, opt, transforms, vocabs, say=_log, processes=0):
    """``(directory, manifest)``: the directory under ``root`` that holds ``opt``'s training data binarised,
    :func:`build` into it first if it does not yet (or is damaged), and its manifest, which is current. Processes
    that ask for it at once (ranks, two runs) wait on a lock beside it: the first binarises, the others read. A
    directory filled before is read without the lock (a current directory is never rewritten), so a cache that is
    read-only now, or on a file system without locks (:data:`_NO_LOCKS`), is read too. Only ``root/<key>``, its lock
    file and its work directory while it is written are touched."""
    wanted = fingerprint(opt, transforms, vocabs)
    key = cache_key(wanted)
    directory = os.path.join(root, key)
    manifest = _current(directory, wanted)
    if manifest is not None:
        return directory, manifest
    try:
        os.makedirs(root, exist_ok=True)
        lock = open(os.path.join(root, f".{key}.lock"), "w", encoding="utf-8")
    except OSError as error:
        raise UserError(f"-ext_binarized_cache {root}: cannot write there ({error.strerror or error}); "
                        f"{_advice(error)}") from None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError as error:
            if error.errno not in _NO_LOCKS:
                raise
            raise UserError(f"-ext_binarized_cache {root}: cannot lock {os.path.basename(lock.name)} ("
                            f"{error.strerror or error}): its file system does not support the file locks that keep "
                            "runs sharing the cache apart; choose a -ext_binarized_cache directory on a local disk, or "
                            "write the data once with onmt_ext_binarize -ext_binarized DIR and train with "
                            "-ext_binarized DIR") from None
        manifest = _current(directory, wanted)  # (another run may have filled it while this one waited)
        if manifest is None:
            say(f"-ext_binarized_cache: binarising the training corpora into {directory}, once for this data")
            manifest = _write(opt, transforms, vocabs, directory, wanted, say, processes, "-ext_binarized_cache",
                              stale=glob.glob(glob.escape(directory) + ".partial-*"))  # (no other writer: locked)
    return directory, manifest


@contextlib.contextmanager
def _writing(option, directory, what):
    """An ``OSError`` inside (a full disk, a read-only file system, permissions) as a :class:`UserError`:
    ``<option> <directory>: cannot <what> (<reason>); <what to do>``."""
    try:
        yield
    except OSError as error:
        raise UserError(f"{option} {directory}: cannot {what} ({error.strerror or error}); {_advice(error)}") from None


#: ``flock``'s errors where the file system has no locks (Lustre without ``-o flock``: ENOSYS; FUSE: EOPNOTSUPP;
#: NFS without its lock service: ENOLCK); its others (EBADF, EINVAL) are a bug here and are raised as they are
_NO_LOCKS = (errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOLCK, errno.ENOSYS)


def _advice(error):
    """What to do about ``error``, an ``OSError`` of writing binarised data."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free space on its file system, or choose a directory on another, and run again"
    if error.errno in (errno.ENOTDIR, errno.EEXIST):
        return "a file stands on that path where a directory is needed: choose another directory, and run again"
    if error.errno == errno.EROFS:
        return "its file system is read-only: choose a directory on another, and run again"
    return "check the permissions there, or choose another directory, and run again"


def _work_prefix(directory):
    """``<directory>.partial-<host>-``: the start of the names of the work directories of this host's runs."""
    return f"{directory.rstrip(os.sep)}.partial-{socket.gethostname()}-"


#: Seconds after which an old-format work directory ``<directory>.partial-<pid>`` (no host in its name: written
#: by onmt-ext before it named the host) counts as a killed run's, whichever host made it
OLD_FORMAT_AGE = 24 * 3600


def _untouched_for(path, seconds):
    """Whether ``path`` was last modified more than ``seconds`` ago (False where it is gone: its run removed it)."""
    try:
        return time.time() - os.path.getmtime(path) > seconds
    except FileNotFoundError:
        return False


def _dead_runs(directory):
    """The work directories beside ``directory`` that runs of this host left when they were killed (their process
    is gone): ``<directory>.partial-<host>-<pid>-<random>``; and old-format ones, ``<directory>.partial-<pid>``,
    untouched for :data:`OLD_FORMAT_AGE` (their host is unknown, so their process cannot be asked)."""
    old = f"{directory.rstrip(os.sep)}.partial-"
    found = [path for path in glob.glob(glob.escape(old) + "*") if re.fullmatch(r"\d+", path[len(old):])
             and _untouched_for(path, OLD_FORMAT_AGE)]
    prefix = _work_prefix(directory)
    for path in glob.glob(glob.escape(prefix) + "*"):
        run = re.fullmatch(r"(\d+)-[0-9a-f]{8}", path[len(prefix):])  # (not a host whose name goes on: node-1)
        if run is None or int(run.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(run.group(1)), 0)
        except ProcessLookupError:
            found.append(path)
        except OSError:  # (alive, another user's)
            pass
    return found


def _write(opt, transforms, vocabs, directory, wanted, say, processes, option="-ext_binarized", stale=None):
    """Binarise ``opt``'s training corpora into ``directory`` (replacing what is there) under fingerprint
    ``wanted``; returns the manifest. The files are written in a new work directory beside it,
    ``<directory>.partial-<host>-<pid>-<random>`` (unique on a file system that several hosts share), moved in
    when complete, and removed on failure; ``stale`` (default: :func:`_dead_runs`) lists earlier runs' work
    directories to remove first. An ``OSError`` becomes a :class:`UserError` naming the file (``option``)."""
    from onmt.constants import CorpusTask
    from onmt.inputters.text_corpus import get_corpora

    corpora = get_corpora(opt, CorpusTask.TRAIN)
    for path in _dead_runs(directory) if stale is None else stale:
        shutil.rmtree(path, ignore_errors=True)
    work = f"{_work_prefix(directory)}{os.getpid()}-{os.urandom(4).hex()}"
    with _writing(option, directory, "create a directory beside it"):
        os.makedirs(work)
    keys, counts = {}, {}
    try:
        for name in sorted(corpora):
            arrays = _build_corpus(name, corpora[name], transforms, opt, vocabs, keys, say, processes)
            for key in ARRAYS:
                with _writing(option, directory, f"write {name}.{key}.npy there"):
                    np.save(os.path.join(work, f"{name}.{key}.npy"), arrays[key])
            states = np.bincount(arrays["state"], minlength=3)
            counts[name] = {"lines": int(len(arrays["state"])), "kept": int(states[KEPT]),
                            "filtered": int(states[FILTERED]), "empty": int(states[ABSENT]),
                            "src_tokens": int(len(arrays["src_ids"])), "tgt_tokens": int(len(arrays["tgt_ids"]))}
            say(f"corpus {name!r}: {counts[name]['kept']:,} of {counts[name]['lines']:,} lines kept "
                f"({counts[name]['filtered']:,} filtered, {counts[name]['empty']:,} with an empty side)")
        manifest = {"fingerprint": wanted, "corpora": counts}
        with _writing(option, directory, f"write {MANIFEST} there"):
            with open(os.path.join(work, MANIFEST), "w", encoding="utf-8") as handle:
                json.dump(manifest, handle, indent=1)
        with _writing(option, directory, "replace it"):
            if os.path.exists(directory):
                shutil.rmtree(directory)
            os.replace(work, directory)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return manifest


class BinarizedCorpus:
    """A training corpus as :func:`build` stored it; the arrays are mapped when a worker first reads them."""

    def __init__(self, name, directory):
        self.id, self.directory, self._arrays = name, directory, None

    def arrays(self):
        if self._arrays is None:
            self._arrays = map_arrays(self.directory, self.id)
        return self._arrays

    def __getstate__(self):  # to a spawned worker: the paths, not the mappings
        return {"id": self.id, "directory": self.directory, "_arrays": None}

    def __str__(self):
        return f"{type(self).__name__}({self.id}, {self.directory})"


def _gather(offsets, ids, lines):
    """``(block, starts, ends)``: the ids of ``lines`` (ascending line numbers) read at once, and each line's
    start and end in ``block``. Only those lines' ids are read: with S shares a chunk's lines lie in runs of S
    among S² lines, and the span from its first line to its last would be S times its own ids."""
    starts, ends = offsets[lines], offsets[lines + 1]
    lengths = ends - starts
    inside = np.cumsum(lengths)
    total = int(inside[-1]) if len(lines) else 0
    if total and int(ends[-1]) - int(starts[0]) == total:  # no gap (one share): one slice
        block = np.array(ids[int(starts[0]):int(ends[-1])])
    else:  # position j of the block: ids[j + (start - start in the block) of its line]
        block = np.asarray(ids[np.repeat(starts - (inside - lengths), lengths) + np.arange(total)])
    return block, (inside - lengths).tolist(), inside.tolist()


class BinarizedCorpusIterator:
    """``ParallelCorpusIterator`` of a :class:`BinarizedCorpus`: stock's lines for ``stride``/``offset`` (with
    their ``cid_line_number``), as ``(example, BINARIZED, corpus)``, the example None where a transform filtered
    the line; a line with an empty side is not yielded, as in stock."""

    def __init__(self, corpus, stride=1, offset=0):
        self.cid, self.corpus, self.stride, self.offset = corpus.id, corpus, stride, offset

    def __iter__(self):
        arrays = self.corpus.arrays()
        state, key = arrays["state"], arrays["src_key"]
        src_offsets, src_ids = arrays["src_offsets"], arrays["src_ids"]
        tgt_offsets, tgt_ids = arrays["tgt_offsets"], arrays["tgt_ids"]
        chosen = _share(len(state), self.stride, self.offset)  # stock's ParallelCorpus.load
        for first in range(0, len(chosen), CHUNK):
            part = chosen[first:first + CHUNK]
            numbers = (np.arange(first, first + len(part)) * self.stride + self.offset).tolist()
            states, keys = state[part].tolist(), key[part].tolist()
            (src, src_starts, src_ends), (tgt, tgt_starts, tgt_ends) = (
                _gather(offsets, ids, part) for offsets, ids in ((src_offsets, src_ids), (tgt_offsets, tgt_ids)))
            for number, kind, text, a, b, c, d in zip(numbers, states, keys, src_starts, src_ends, tgt_starts,
                                                       tgt_ends):
                if kind == KEPT:
                    yield ({"src": {"src": text, "src_ids": src[a:b]}, "tgt": {"tgt_ids": tgt[c:d]},
                            "cid": self.cid, "cid_line_number": number}, BINARIZED, self.cid)
                elif kind == FILTERED:
                    yield None, BINARIZED, self.cid


def _from_binarized(stock, cls, corpora, transforms, vocabs, opt, task, *args, **kwargs):
    """``DynamicDatasetIter.from_opt``: with ``-ext_binarized``, the training corpora become
    :class:`BinarizedCorpus` once :func:`check` has found the directory current; with ``-ext_binarized_cache``,
    once :func:`cached` has found or written it."""
    options = BinarizedOptions.from_opt(opt)
    if (options.binarized or options.binarized_cache) and task == "train":
        found = problems(opt, transforms)
        if found:
            raise UsageError(f"-ext_binarized{'_cache' if options.binarized_cache else ''}: " + "; ".join(found))
        if options.binarized:
            directory, manifest = options.binarized, check(options.binarized, opt, transforms, vocabs)
        else:  # (found current or written under the lock: no second check)
            directory, manifest = cached(options.binarized_cache, opt, transforms, vocabs)
        _log(f"training corpora read from {directory}, binarised: " + ", ".join(
            f"{name} {entry['kept']:,} lines" for name, entry in sorted(manifest["corpora"].items())))
        corpora = {name: BinarizedCorpus(name, directory) for name in corpora}
        _check_worker_shares(corpora, kwargs.get("stride", 1), kwargs.get("offset", 0), opt.num_workers)
    return stock(cls, corpora, transforms, vocabs, opt, task, *args, **kwargs)


def _check_worker_shares(corpora, stride, offset, num_workers):
    """A :class:`UsageError` where one of this rank's data workers (``num_workers`` of them, or the training
    process itself) would read no kept line of any corpus: every line of its share empty or filtered, it would
    never make a batch, and stock's mixer would restart the corpora for ever, logging each time."""
    workers = max(1, num_workers)
    shares = stride * workers  # a worker's share, as DynamicDatasetIter._init_datasets deals them
    for worker in range(workers):
        share = offset * workers + worker
        kept = sum(int(np.count_nonzero(state[_share(len(state), shares, share)] == KEPT))
                   for state in (corpus.arrays()["state"] for corpus in corpora.values()))
        if not kept:
            names = ", ".join(repr(name) for name in corpora)
            who = (f"data worker {worker} of this rank (share {share} of the {shares} shares of the training lines)"
                   if shares > 1 else "training")
            fewer = ", or use fewer -num_workers" if workers > 1 else ""
            raise UsageError(f"-ext_binarized: {who} would read no pair of the corpora ({names}) that the filters "
                             "keep, so it would never make a batch: check the length filters (-src_seq_length, "
                             f"-tgt_seq_length) and the corpora{fewer}")


def _binarized_iterators(stock, corpora, transforms, corpora_info, skip_empty_level="warning", stride=1, offset=0):
    """``build_corpora_iters``: a :class:`BinarizedCorpusIterator` for each :class:`BinarizedCorpus`."""
    text = {name: corpus for name, corpus in corpora.items() if not isinstance(corpus, BinarizedCorpus)}
    iterators = stock(text, transforms, corpora_info, skip_empty_level=skip_empty_level, stride=stride,
                      offset=offset) if text else {}
    return {name: iterators[name] if name in text else BinarizedCorpusIterator(corpus, stride, offset)
            for name, corpus in corpora.items()}


def _bucket_from_ids(stock, self, tuple_bucket):
    """``DynamicDatasetIter._tuple_to_json_with_tokIDs`` of a binarised bucket: stock's ``process`` order (grouped
    by corpus in order of first appearance, filtered examples left out) without transforms or look-ups."""
    if not tuple_bucket or tuple_bucket[0][1] != BINARIZED:
        return stock(self, tuple_bucket)
    grouped = {}
    for example, _, name in tuple_bucket:
        group = grouped.setdefault(name, [])
        if example is not None:
            group.append(example)
    return [example for group in grouped.values() for example in group]


def install():
    """Register the three changes (idempotent)."""
    from onmt.inputters import dynamic_iterator

    patch(dynamic_iterator.DynamicDatasetIter, "from_opt", _from_binarized, kind=SPEED, test=f"{_TEST}::"
          "test_binarized_batches_are_the_texts_batches",
          reason="-ext_binarized: the training corpora are read as the ids onmt_ext_binarize stored")
    patch(dynamic_iterator, "build_corpora_iters", _binarized_iterators, kind=SPEED, test=f"{_TEST}::"
          "test_binarized_batches_are_the_texts_batches",
          reason="-ext_binarized: a binarised corpus is iterated from its arrays, in stock's shares of lines")
    patch(dynamic_iterator.DynamicDatasetIter, "_tuple_to_json_with_tokIDs", _bucket_from_ids, kind=SPEED,
          test=f"{_TEST}::test_binarized_batches_are_the_texts_batches",
          reason="stock transforms, joins, splits and looks up every token of every line again in each epoch, "
                 "most of a data worker's time")
