"""``onmt_translate`` preprocesses its source as the checkpoint's training did.

Stock ``onmt_translate`` ignores the transforms stored in the checkpoint:
forgetting ``-transforms sentencepiece`` gives garbage with exit status 0.
:func:`install` wraps ``ArgumentParser._get_all_transform_translate``:

* no ``-transforms``: the model's :data:`SHAPING` transforms (not training-only
  ones such as ``filtertoolong``) are applied with training's options for
  every option left at its default; a file they need that is not here stops
  the command in one line.  A ``-src`` that holds subword pieces already is
  translated as it is.  A model trained on Chinese segmented beforehand (its
  training source holds spaces between words, as recorded at training) also
  gets ``jieba -jieba_keep_segmented`` in front;
* ``-transforms`` given: one warning line per difference from training (the
  transforms, a subword model file, unsegmented Chinese for such a model).
"""

import filecmp
import os
import re
import sys

from onmt_ext.errors import UsageError
from onmt_ext.patches import FIX, patch
from onmt_ext.runtime.corpus import corpora_of, not_a_file

# OpenNMT-py (and onmt_ext.integration.zh_segment, which imports it) is imported inside the functions: importing it
# while this module initialises would activate onmt-ext (onmt_ext._autoload) before this module is whole.  torch too:
# tools (tools/evaluate.py) read SUBWORD_MARK from here without needing torch.

#: Transforms that decide the source tokens a model reads: translation must repeat them.
SHAPING = ("jieba", "sentencepiece", "bpe", "onmt_tokenize", "clause_split")
#: The subword transforms among them.
SUBWORD = ("sentencepiece", "bpe", "onmt_tokenize")
#: What subword segmentation leaves in text: SentencePiece's ▁, BPE's trailing @@, the OpenNMT tokenizer's ￭.
SUBWORD_MARK = re.compile("\u2581|@@(?= |$)|\uffed")
#: Option names (suffixes) that name files read by a shaping transform.
_FILE_SUFFIXES = ("_model", "_vocab")
#: Lines read to judge whether a file is segmented Chinese, and the share of its Chinese lines that must agree.
_SAMPLE_LINES, _SHARE = 1000, 0.9
_HAN = re.compile("[\u3400-\u4dbf\u4e00-\u9fff]")


def segmented_share(path, limit=_SAMPLE_LINES):
    """``(segmented, chinese)`` among the first ``limit`` lines of ``path``: lines with 3 or more Han characters
    (``chinese``) and those of them with whitespace between CJK characters; ``None`` if it cannot be read."""
    from onmt_ext.integration.zh_segment import is_segmented

    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            lines = [line for _, line in zip(range(limit), handle)]
    except (OSError, TypeError):  # not there, or no path at all
        return None
    chinese = [line for line in lines if len(_HAN.findall(line)) >= 3]
    return sum(map(is_segmented, chinese)), len(chinese)


def holds_subword_marks(path, limit=_SAMPLE_LINES):
    """True when one of the first ``limit`` lines of ``path`` holds a :data:`SUBWORD_MARK` (text encoded
    beforehand, translated as it is); False also when it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return any(SUBWORD_MARK.search(line) for _, line in zip(range(limit), handle))
    except (OSError, TypeError):
        return False


#: Saved in a checkpoint's options at training: :func:`trained_on_segmented_chinese` then ("": it was not), so that
#: translation knows without the training source (which may be gone, or on another machine).
SEGMENTED_KEY = "onmt_ext_segmented_source"


def record_training_source(model_opt):
    """Store :func:`trained_on_segmented_chinese` in ``model_opt`` (kept when already there, as in a checkpoint)."""
    if getattr(model_opt, SEGMENTED_KEY, None) is None:
        setattr(model_opt, SEGMENTED_KEY, trained_on_segmented_chinese(model_opt) or "")


def trained_on_segmented_chinese(model_opt):
    """The training source file of ``model_opt`` when it is Chinese segmented beforehand (else ``None``): as
    recorded at training (:data:`SEGMENTED_KEY`), or, for a checkpoint without the record, as that file reads now."""
    recorded = getattr(model_opt, SEGMENTED_KEY, None)
    if recorded is not None:
        return recorded or None
    for name, corpus in corpora_of(getattr(model_opt, "data", None)).items():  # (text as parsed, or a dict)
        path = corpus.get("path_src") if name != "valid" and isinstance(corpus, dict) else None
        share = segmented_share(path) if path else None
        if share and share[1] and share[0] >= _SHARE * share[1]:
            return path
    return None


def checkpoint_options(path):
    """The options stored in checkpoint ``path`` (tensors memory-mapped, not read); ``None`` if it cannot be read.

    What cannot be read is left to the stock loading, which names the file.
    """
    import torch

    if not path or not os.path.isfile(path):
        return None
    try:
        checkpoint = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception:  # not a zip checkpoint, not a checkpoint at all: the stock loader says so
        return None
    return checkpoint.get("opt") if isinstance(checkpoint, dict) else None


def transform_attribute(name, attribute):
    """A transform's tuple ``attribute`` (``training_files_options``, ``not_file_options``; empty when the transform
    or the attribute is unknown)."""
    from onmt.transforms import AVAILABLE_TRANSFORMS

    return tuple(getattr(AVAILABLE_TRANSFORMS.get(name), attribute, ()))


def file_options(names, suffixes=_FILE_SUFFIXES):
    """The options of the transforms ``names`` that name a file they read (ending in ``suffixes``), each once, in
    order; not those a transform lists as ``not_file_options`` (``-clause_spacy_model``: a package's name)."""
    options = {}
    for name in names:
        skipped = transform_attribute(name, "not_file_options")
        options.update(dict.fromkeys(dest for dest in transform_defaults(name)
                                     if dest.endswith(suffixes) and dest not in skipped))
    return list(options)


def transform_defaults(name):
    """``{dest: default}`` of the options transform ``name`` adds (empty for an unknown transform)."""
    from onmt.transforms import AVAILABLE_TRANSFORMS
    from onmt.utils.parse import ArgumentParser

    cls = AVAILABLE_TRANSFORMS.get(name)
    if cls is None:
        return {}
    parser = ArgumentParser(add_help=False)
    cls.add_options(parser)
    return {action.dest: action.default for action in parser._actions}


def shaping(transforms):
    """The shaping transforms of a list of transform names, in order."""
    return [name for name in (transforms or []) if name in SHAPING]


def _flag(name, value):
    return f"-{name} {value}"


def adopt_training(opt, model_opt, only=None):
    """Give ``opt`` (no ``-transforms``) the shaping transforms of ``model_opt`` and their options, but those of
    training's files (``-clause_presplit``: this source is split on the fly).

    ``only``: these of them alone (a source cut into subwords already takes the ones after the subword
    transform).  Returns ``(transforms, copied, missing)``: the transforms now in
    ``opt.transforms``, ``{option: value}`` taken from training, and one
    message per file option whose file is not here.
    """
    transforms = [name for name in shaping(getattr(model_opt, "transforms", None)) if only is None or name in only]
    copied, missing = {}, []
    for name in transforms:
        kept = transform_attribute(name, "training_files_options")  # (e.g. -clause_presplit: of training's files)
        for dest, default in transform_defaults(name).items():
            if dest in kept or not hasattr(model_opt, dest) or getattr(opt, dest, default) != default:
                continue  # of training's files, unknown to the checkpoint, or set by the user
            value = getattr(model_opt, dest)
            if value != default:
                copied[dest] = value
            setattr(opt, dest, value)
    for dest in sorted(file_options(transforms)):
        value = getattr(opt, dest, None)
        if isinstance(value, str) and value and not os.path.isfile(value):
            origin = " (from training)" if dest in copied else ""
            missing.append(f"{_flag(dest, value)}{origin}: {not_a_file(value)}")
    opt.transforms = transforms
    return transforms, copied, missing


def mismatches(opt, model_opt):
    """Why the given ``-transforms`` would not shape the source as training did (empty: they would)."""
    given, trained = shaping(opt.transforms), shaping(getattr(model_opt, "transforms", None))
    if given != trained:
        return [f"-transforms {' '.join(opt.transforms)}: the model was trained with -transforms "
                f"{' '.join(model_opt.transforms)}, so its source was shaped by "
                f"{' '.join(trained) or 'none of ' + ', '.join(SHAPING)}, not by {' '.join(given) or 'nothing'}"]
    problems = []
    for dest in sorted(file_options(given)):
        mine, theirs = getattr(opt, dest, None), getattr(model_opt, dest, None)
        if not (isinstance(mine, str) and isinstance(theirs, str)):
            continue
        if mine != theirs and os.path.isfile(mine) and os.path.isfile(theirs) \
                and not filecmp.cmp(mine, theirs, shallow=False):
            problems.append(f"{_flag(dest, mine)} differs from the file the model was trained with ({theirs})")
    return problems


#: Subword transforms that load a model file for each side (``onmt_translate`` shares no vocabulary: both).
_NEED_MODELS = ("sentencepiece", "bpe")


def subword_model_problems(opt, model_opt=None):
    """Why the given ``-transforms`` cannot load their subword models (empty: they can).

    ``sentencepiece`` and ``bpe`` need ``-src_subword_model`` and ``-tgt_subword_model`` (stock ends in a
    traceback from inside the tokenizer); the message names the files of training (``model_opt``).
    """
    given = [name for name in (opt.transforms or []) if name in _NEED_MODELS]
    if not given:
        return []
    dests = ("src_subword_model", "tgt_subword_model")
    trained = {dest: getattr(model_opt, dest, None) for dest in dests
               if given[0] in (getattr(model_opt, "transforms", None) or []) and getattr(model_opt, dest, None)}
    own = ", or leave out -transforms to apply the model's own" if shaping(getattr(model_opt, "transforms", None)) \
        else ""
    missing = [dest for dest in dests if not getattr(opt, dest, None)]
    if missing:
        named = " and ".join(f"-{dest}" for dest in missing)
        if all(dest in trained for dest in missing):
            return [f"-transforms {given[0]} needs {named}; the model was trained with "
                    f"{' '.join(_flag(dest, trained[dest]) for dest in missing)}: pass "
                    f"{'them' if len(missing) > 1 else 'it'}{own}"]
        return [f"-transforms {given[0]} needs {named}: give the {given[0]} model{'s' if len(missing) > 1 else ''} "
                f"that training used{own}"]
    return [f"{_flag(dest, getattr(opt, dest))}: {not_a_file(getattr(opt, dest))}"
            + (f" (the model was trained with {trained[dest]})" if dest in trained else "")
            for dest in dests if not os.path.isfile(getattr(opt, dest))]


def _adopted(opt, model_opt, model, only=None):
    """:func:`adopt_training` from checkpoint ``model``, refused in one line where a file it names is not here;
    ``(transforms, the copied options as flags)``."""
    transforms, copied, missing = adopt_training(opt, model_opt, only)
    if missing:
        raise UsageError(f"{model} was trained with -transforms {' '.join(model_opt.transforms)}; its source must be "
                         f"preprocessed the same way, but {'; '.join(missing)} (give -transforms "
                         f"{' '.join(transforms)} with the files' paths here)")
    return transforms, "".join(f" {_flag(k, v)}" for k, v in copied.items())


def _transforms_of_training(stock, cls, opt):
    """``ArgumentParser._get_all_transform_translate``: training's shaping transforms, or a check of the given ones."""
    model = (getattr(opt, "models", None) or [None])[0]
    model_opt = checkpoint_options(model)
    problems = subword_model_problems(opt, model_opt) if opt.transforms else []
    if problems:
        raise UsageError("\n".join(problems))
    if model_opt is None:
        return stock(cls, opt)
    trained = " ".join(getattr(model_opt, "transforms", None) or [])
    subwords = any(name in SUBWORD for name in trained.split())
    words = trained_on_segmented_chinese(model_opt) if subwords and "jieba" not in trained.split() else None
    if not opt.transforms and shaping(model_opt.transforms) and holds_subword_marks(opt.src):
        later = [name for name in shaping(model_opt.transforms) if name not in SUBWORD and name != "jieba"]
        skipped = [name for name in shaping(model_opt.transforms) if name not in later]
        transforms, options = _adopted(opt, model_opt, model, later) if later else ([], "")
        said = f": translated without the model's -transforms {' '.join(skipped)}" if skipped else ""
        said += f"; applying its -transforms {' '.join(transforms)}{options}" if transforms else ""
        sys.stderr.write(f"onmt_translate: -src {opt.src} holds subword pieces already{said}\n")
    elif not opt.transforms and shaping(model_opt.transforms):
        transforms, options = _adopted(opt, model_opt, model)
        if words:
            opt.transforms, opt.jieba_keep_segmented = ["jieba", *transforms], True
            options += (f" -jieba_keep_segmented (its training source {words} is Chinese segmented into words; "
                        "lines segmented already pass unchanged)")
        sys.stderr.write(f"onmt_translate: applying the model's preprocessing: -transforms "
                         f"{' '.join(opt.transforms)}{options}\n")
    elif opt.transforms:
        problems = mismatches(opt, model_opt) if shaping(model_opt.transforms) else []
        share = segmented_share(opt.src) if words and "jieba" not in opt.transforms else None
        if share and share[1] and 2 * share[0] < share[1]:  # most of its Chinese lines are not segmented
            problems.append(f"-src {opt.src}: {share[1] - share[0]} of its first {share[1]} Chinese lines are not "
                            f"segmented into words, but the model's training source {words} is: add jieba "
                            "in front of -transforms (with -jieba_keep_segmented), or segment the input with "
                            "python -m onmt_ext.integration.zh_segment")
        for problem in problems:
            sys.stderr.write(f"onmt_translate: warning: {problem}\n")
    return stock(cls, opt)


def install():
    """Wrap the choice of the translation's transforms (see the module docstring)."""
    from onmt.utils.parse import ArgumentParser

    patch(ArgumentParser, "_get_all_transform_translate", _transforms_of_training, kind=FIX,
          reason="onmt_translate ignores the transforms the checkpoint was trained with: without -transforms a "
                 "subword or segmented model translates unprocessed text into garbage, exit status 0",
          test="tests/unit/test_preprocessing.py::test_missing_transforms_are_taken_from_the_checkpoint")
