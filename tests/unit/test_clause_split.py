"""Clause splitter (clause attention, sec. 3.1-3.2): clause ids, levels, round trip, OpenNMT-py builds, bad input,
study tagger, registration."""

import importlib
import json
import pickle
import textwrap

import numpy as np
import pytest

import support

import onmt_ext.mechanisms.clause.split as cs  # registers the clause_split transform

from tools import train_signal_tagger

CMN = support.REPO / "data" / "tatoeba-zh-en" / "cmn.txt"
M = cs.MARKERS

# Real news sentences of the WMT14 sample (newstest2014, Moses-tokenized; wmt14-ende-sample/test.en lines
# 568, 676, 2, 57, 811, 1457).
WMT = [
    "&quot; They worry about the risk of pregnancy or even how they will handle hygiene , &quot; said Kaplowitz .",
    "I was expecting to see gnashing of teeth and a fight breaking out at the gate .",
    "Actors Orlando Bloom and Model Miranda Kerr want to go their separate ways .",
    "The Vatican wants to know how Catholic parishes around the globe handle sensitive issues like contraception , "
    "divorce and gay couples .",
    "The tribunal also has the power to seize the property of an offender if a fine is not paid .",
    "Though she is infertile , she hopes to become a parent through adoption or gestational surrogacy .",
]


def _tatoeba():
    rows = [line.split("\t") for line in CMN.read_text(encoding="utf-8-sig").splitlines()]
    return [(row[0], row[1]) for row in rows if len(row) >= 3]


@pytest.fixture(scope="module")
def tatoeba():
    """(English, Chinese) pairs of the shipped Tatoeba sample; the later ones are the longer ones."""
    return _tatoeba()


@pytest.fixture(scope="module")
def en():
    return cs.ClauseSplitter("en")


@pytest.fixture(scope="module")
def zh():
    return cs.ClauseSplitter("zh")


# ---------------------------------------------------------------------------
# pure functions


def test_clause_ids_hand_worked_example():
    tokens = ["we", "left", M[2], "because", "it", "rained", M[4], "in", "May", M[1], ";", "it", "snowed"]
    assert cs.clause_ids(tokens, 4) == [
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1],
        [0, 0, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2],
        [0, 0, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2],
        [0, 0, 1, 1, 1, 1, 2, 2, 2, 3, 3, 3, 3],
    ]
    assert cs.clause_ids(tokens, 1) == [[0] * 9 + [1] * 4]
    assert cs.clause_ids([M[3], "who", "knows"], 3) == [[0, 0, 0]] * 3  # a leading marker starts clause 0
    for bad in (0, 7, "2"):
        with pytest.raises(ValueError):
            cs.clause_ids(tokens, bad)


def test_marker_helpers():
    assert len(set(M.values())) == cs.MAX_LEVEL == 6
    assert [cs.marker_level(M[level]) for level in range(1, 7)] == [1, 2, 3, 4, 5, 6]
    assert cs.is_marker(M[5]) and not cs.is_marker("▁" + M[5]) and not cs.is_marker("｟newline｠")
    assert cs.marker_level("to") is None
    assert cs.strip_markers(["a", M[1], ",", M[2], "and", "b"]) == ["a", ",", "and", "b"]
    assert cs.marker_tokens(2) == [M[1], M[2]]


# ---------------------------------------------------------------------------
# signal words and levels on real sentences


def test_english_signal_words_get_their_levels(en):
    got = [" ".join(out) for out in en.split_batch([line.split(" ") for line in WMT])]
    assert got[0] == (f"&quot; They worry {M[4]} about the risk {M[4]} of pregnancy {M[2]} or even {M[3]} how they "
                      f"will handle hygiene {M[1]} , &quot; said Kaplowitz .")
    assert got[1] == (f"I was expecting {M[5]} to see gnashing {M[4]} of teeth {M[2]} and a fight {M[6]} breaking out "
                      f"{M[4]} at the gate .")
    assert got[2] == f"Actors Orlando Bloom {M[2]} and Model Miranda Kerr want {M[5]} to go their separate ways ."
    # "paid" heads the if-clause ("is not paid"): an auxiliary child, so no participle split
    assert got[4] == (f"The tribunal also has the power {M[5]} to seize the property {M[4]} of an offender {M[2]} if a "
                      f"fine is not paid .")
    # sentence-initial "Though" starts the sentence anyway; ", she" is a level-1 split
    assert got[5].startswith(f"Though she is infertile {M[1]} , she hopes {M[5]} to become")


def test_chinese_signal_words_get_their_levels(zh):
    # Tatoeba sentences, segmented by jieba as tools/prepare_tatoeba.py does
    cases = {
        "只要 你 方便 ， 我 什么 时候 都 可以 跟 你 见面 。":
            f"只要 你 方便 {M[1]} ， 我 {M[3]} 什么 时候 都 可以 {M[4]} 跟 你 见面 。",
        "春天 和 秋天 ， 你 更 喜欢 哪个 ？": f"春天 {M[2]} 和 秋天 {M[1]} ， 你 更 喜欢 {M[3]} 哪个 ？",
        # jieba flags 可以 as a conjunction; the dictionary keeps it out
        "我 可以 叫 您 汤姆 吗 ?": "我 可以 叫 您 汤姆 吗 ?",
    }
    for source, expected in cases.items():
        assert " ".join(zh.split(source.split(" "))) == expected


def test_levels_option_keeps_coarse_levels_and_finer_levels_refine_coarser(en, tatoeba):
    sentences = [line.split(" ") for line in WMT] + [e.split(" ") for e, _ in tatoeba[-300::15]]
    seen = set()
    for levels in range(1, 7):
        for out in cs.ClauseSplitter("en", levels).split_batch(sentences):
            found = {cs.marker_level(t) for t in out} - {None}
            assert found <= set(range(1, levels + 1))
            seen |= found
    assert seen == {1, 2, 3, 4, 5, 6}
    for tokens in en.split_batch(sentences):
        ids = cs.clause_ids(tokens, 6)
        for level in range(5):  # a boundary at level l is a boundary at level l + 1
            for i in range(1, len(tokens)):
                if ids[level][i] != ids[level][i - 1]:
                    assert ids[level + 1][i] != ids[level + 1][i - 1]


# ---------------------------------------------------------------------------
# round trip, determinism, subword layouts


def test_round_trip_and_determinism_on_real_sentences(en, zh, tatoeba):
    english = [line.split(" ") for line in WMT] + [e.split(" ") for e, _ in tatoeba[-2000::40]]
    chinese = [z.split(" ") for _, z in tatoeba[-2000::40]]  # raw Chinese: one token per space-free run
    # SentencePiece-like pieces of raw Chinese: a spacer on each run, then pieces of 1-2 characters
    pieces = [[("▁" if k == 0 else "") + run[k:k + 2] for run in z.split(" ") for k in range(0, len(run), 2)]
              for _, z in tatoeba[-2000::40]]
    for splitter, batch in ((en, english), (zh, chinese), (zh, pieces)):
        outs = splitter.split_batch(batch)
        assert outs == [splitter.split(tokens) for tokens in batch]  # batch composition changes nothing
        for tokens, out in zip(batch, outs):
            assert cs.strip_markers(out) == tokens
            assert all(not out[i] in M.values() or not out[i + 1] in M.values() for i in range(len(out) - 1))
            assert not cs.is_marker(out[0]) and not cs.is_marker(out[-1])
    assert sum(map(cs.is_marker, (t for out in zh.split_batch(pieces) for t in out))) > 10
    again = cs.ClauseSplitter("en")
    assert again.split_batch(english) == en.split_batch(english)


def test_subword_conventions_put_markers_between_whole_words(en):
    # SentencePiece (spacer), pyonmttok joiners, subword-nmt "@@", a bare spacer, a case-markup placeholder
    assert en.split(["▁He", "▁left", "▁because", "▁it", "▁rain", "ed", "▁."]) == [
        "▁He", "▁left", M[2], "▁because", "▁it", "▁rain", "ed", "▁."]
    assert en.split(["He", "left", "￭,", "｟mrk_case_modifier_C｠", "although", "it", "rain￭", "ed", "￭."]) == [
        "He", "left", M[1], "￭,", "｟mrk_case_modifier_C｠", "although", "it", "rain￭", "ed", "￭."]
    assert en.split(["He", "stay@@", "ed", "in", "Ber@@", "lin", "."]) == ["He", "stay@@", "ed", M[4], "in",
                                                                           "Ber@@", "lin", "."]
    assert en.split(["▁He", "▁left", "▁", ",", "▁and", "▁we", "▁stayed"]) == [
        "▁He", "▁left", M[1], "▁", ",", "▁and", "▁we", "▁stayed"]
    # raw text with punctuation glued to words: a split at the glued comma goes after the token
    assert en.split("He left, although it rained.".split(" ")) == ["He", "left,", M[1], "although", "it", "rained."]


# ---------------------------------------------------------------------------
# the transform as onmt_build_vocab, onmt_train and onmt_translate build it


def _config(tmp_path, transforms, lang, lines, extra=""):
    (tmp_path / "src.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "tgt.txt").write_text("\n".join("x" for _ in lines) + "\n", encoding="utf-8")
    for side in ("src", "tgt"):
        (tmp_path / f"vocab.{side}").write_text("x\t1\n", encoding="utf-8")
    config = tmp_path / "config.yaml"
    config.write_text(textwrap.dedent(f"""\
        save_data: {tmp_path}/run/sample
        src_vocab: {tmp_path}/vocab.src
        tgt_vocab: {tmp_path}/vocab.tgt
        data:
          corpus_1:
            path_src: {tmp_path}/src.txt
            path_tgt: {tmp_path}/tgt.txt
            weight: 1
        transforms: [{", ".join(transforms)}]
        clause_lang: {lang}
        """) + extra, encoding="utf-8")
    return config


def _pipes(config, translate_args):
    """The transform pipe of ``config`` built by the build_vocab, train and translate code paths."""
    from onmt.bin import build_vocab, train, translate
    from onmt.transforms import TransformPipe, get_transforms_cls, make_transforms
    from onmt.utils.parse import ArgumentParser

    pipes = {}
    opts, _ = build_vocab._get_parser().parse_known_args(["-config", str(config)])
    ArgumentParser.validate_prepare_opts(opts, build_vocab_only=True)
    pipes["build_vocab"] = (opts, opts.data["corpus_1"]["transforms"])
    opts, _ = train._get_parser().parse_known_args(["-config", str(config)])
    ArgumentParser.validate_prepare_opts(opts)
    pipes["train"] = (opts, opts.data["corpus_1"]["transforms"])
    opts = translate._get_parser().parse_args(["-model", "m.pt", "-src", "s.txt", *translate_args])
    ArgumentParser._get_all_transform_translate(opts)
    ArgumentParser._validate_transforms_opts(opts)
    ArgumentParser.validate_translate_opts_dynamic(opts)
    pipes["translate"] = (opts, opts.transforms)
    built = {}
    for name, (opts, order) in pipes.items():
        transforms = make_transforms(opts, get_transforms_cls(opts._all_transform), None)
        built[name] = TransformPipe.build_from([transforms[t] for t in order])
    return built


def _run(pipe, lines, batch=True):
    examples = [{"src": line.strip().split(" "), "tgt": None, "src_original": line.strip().split(" "),
                 "tgt_original": None} for line in lines]
    if batch:
        return [ex["src"] for ex, _, _ in pipe.batch_apply([(ex, pipe, "c") for ex in examples])]
    return [pipe.apply(ex)["src"] for ex in examples]


def test_onmt_tokenize_pipeline_is_the_same_in_build_vocab_train_and_translate(tmp_path, tatoeba):
    lines = WMT + [e for e, _ in tatoeba[-1500::60]]
    kwargs = "{'mode': 'aggressive', 'joiner_annotate': True, 'case_markup': True}"
    config = _config(tmp_path, ["onmt_tokenize", "clause_split"], "en", lines,
                     f'src_onmttok_kwargs: "{kwargs}"\ntgt_onmttok_kwargs: "{kwargs}"\n')
    pipes = _pipes(config, ["-transforms", "onmt_tokenize", "clause_split", "-clause_lang", "en",
                            "-src_onmttok_kwargs", kwargs, "-tgt_onmttok_kwargs", kwargs])
    reference = _run(pipes["build_vocab"], lines)
    for name in ("train", "translate"):
        assert _run(pipes[name], lines) == reference, name
    assert _run(pipes["translate"], lines, batch=False) == reference
    revived = pickle.loads(pickle.dumps(pipes["train"]))  # as DataLoader workers and build_vocab's pool get it
    assert _run(revived, lines) == reference
    tokenized = _run(type(pipes["train"]).build_from(pipes["train"].transforms[:1]), lines)
    assert [cs.strip_markers(out) for out in reference] == tokenized
    assert sum(map(cs.is_marker, (t for out in reference for t in out))) > 2 * len(lines)
    stats = pipes["build_vocab"].stats()
    assert f"ClauseSplitStats(sentences={len(lines)}" in stats


@pytest.fixture(scope="module")
def zh_spm(tmp_path_factory):
    """A small SentencePiece model trained on the raw Chinese of the Tatoeba sample (about a second)."""
    import sentencepiece as spm

    path = tmp_path_factory.mktemp("spm") / "zh"
    sentences = [z for _, z in _tatoeba()[::5]]
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_prefix=str(path), vocab_size=3000,
                                   model_type="bpe", character_coverage=0.9995, minloglevel=2, num_threads=1)
    return f"{path}.model"


def test_sentencepiece_pipeline_on_raw_chinese(tmp_path, tatoeba, zh_spm):
    lines = [z for _, z in tatoeba[-3000::50]]
    spm_opts = f"src_subword_model: {zh_spm}\ntgt_subword_model: {zh_spm}\n"
    config = _config(tmp_path, ["sentencepiece", "clause_split"], "zh", lines, spm_opts)
    pipes = _pipes(config, ["-transforms", "sentencepiece", "clause_split", "-clause_lang", "zh",
                            "-src_subword_model", zh_spm, "-tgt_subword_model", zh_spm])
    reference = _run(pipes["build_vocab"], lines)
    for name in ("train", "translate"):
        assert _run(pipes[name], lines) == reference, name
    pieces = _run(type(pipes["train"]).build_from(pipes["train"].transforms[:1]), lines)
    assert [cs.strip_markers(out) for out in reference] == pieces
    levels = {cs.marker_level(t) for out in reference for t in out} - {None}
    assert {1, 2, 4} <= levels


# ---------------------------------------------------------------------------
# bad input


def test_bad_inputs_do_not_crash_and_round_trip(en, zh, tatoeba):
    words = " ".join(WMT).split(" ")
    thousand = (words * (1000 // len(words) + 1))[:1000]
    no_signal = "Actors Orlando Bloom".split(" ")
    cases = [[""], ["", ""], thousand, no_signal, ["a", "", "", "b", ",", "and", "c"], ["x" * (cs.MAX_TEXT_CHARS + 1)],
             [z for _, z in tatoeba[-50:-40]], "&amp; &apos; &#124; &quot;".split(" ")]
    for splitter in (en, zh):  # each language also gets the other one's text
        outs = splitter.split_batch(cases + [[e] for e, _ in tatoeba[-50:-40]])
        for tokens, out in zip(cases, outs):
            assert cs.strip_markers(out) == tokens
        assert outs[0] == [""] and outs[1] == ["", ""] and outs[3] == no_signal
        assert outs[5] == cases[5]  # too long for the tagger: left unsplit
    long_out = en.split(thousand)
    assert 100 < sum(map(cs.is_marker, long_out)) < 500
    assert en.split(long_out) == long_out  # already split: unchanged (idempotent)


def test_source_features_follow_the_markers(en):
    transform = cs.ClauseSplitTransform.__new__(cs.ClauseSplitTransform)
    transform.splitter, transform.presplit = en, False
    example = {"src": ["He", "left", "because", "it", "rained"], "tgt": None,
               "src_feats": [["A", "B", "C", "D", "E"]]}
    transform.apply(example)
    assert example["src"] == ["He", "left", M[2], "because", "it", "rained"]
    assert example["src_feats"] == [["A", "B", "C", "C", "D", "E"]]


def _opts(tmp_path, *args):
    from onmt.bin import build_vocab

    config = _config(tmp_path, ["clause_split"], "en", ["a"])
    opts, _ = build_vocab._get_parser().parse_known_args(["-config", str(config), *map(str, args)])
    return opts


def _validation_error(opts):
    from onmt.utils.parse import ArgumentParser

    with pytest.raises(SystemExit) as error:
        ArgumentParser.validate_prepare_opts(opts, build_vocab_only=True)
    return str(error.value)


def test_bad_options_and_files_give_clear_errors(tmp_path, capsys):
    assert "-clause_levels must be an integer in 1..6, got 0" in _validation_error(_opts(tmp_path, "-clause_levels",
                                                                                        "0"))
    missing = tmp_path / "missing.pt"
    assert f"-clause_tagger_model {missing}: file not found" in _validation_error(
        _opts(tmp_path, "-clause_tagger_model", missing))
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"\x80\x04garbage")
    assert f"-clause_tagger_model {corrupt}: not a readable tagger file" in _validation_error(
        _opts(tmp_path, "-clause_tagger_model", corrupt))
    import torch

    torch.save({"weight": torch.zeros(3, 3)}, tmp_path / "other.pt")
    assert "not a signal-word tagger" in _validation_error(_opts(tmp_path, "-clause_tagger_model",
                                                                 tmp_path / "other.pt"))
    message = _validation_error(_opts(tmp_path, "-transforms", "clause_split", "sentencepiece"))
    assert "put clause_split before sentencepiece" in message and "Traceback" not in message
    assert "-clause_spacy_model 'no_such_pipeline'" in _validation_error(
        _opts(tmp_path, "-clause_spacy_model", "no_such_pipeline"))
    with pytest.raises(SystemExit):
        _opts(tmp_path, "-clause_lang", "fr")
    assert "argument -clause_lang/--clause_lang: invalid choice: 'fr'" in capsys.readouterr().err
    with pytest.raises(cs.ClauseSplitError, match="-clause_spacy_model 'no_such_pipeline'"):
        cs.ClauseSplitter("en", spacy_model="no_such_pipeline")
    with pytest.raises(cs.ClauseSplitError, match="-clause_lang"):
        cs.ClauseSplitter("fr")


# ---------------------------------------------------------------------------
# "CA with study": the trained tagger


def test_study_tagger_trains_loads_and_splits(tmp_path, tatoeba, en, capsys):
    corpus = tmp_path / "en.txt"
    corpus.write_text("\n".join(e for e, _ in tatoeba[-4000::10]) + "\n", encoding="utf-8")  # 400 sentences
    model = tmp_path / "tagger.pt"
    assert train_signal_tagger.main(["--lang", "en", "--input", str(corpus), "--output", str(model),
                                     "--epochs", "4"]) == 0
    report = capsys.readouterr().out
    assert "sentences: 400 (360 train, 40 held out" in report and f"wrote {model}" in report
    tagger = cs.SignalTagger.load(model)
    assert tagger.lang == "en" and tagger.info["heldout"]["f1"] > 0.9

    opts = _opts(tmp_path, "-clause_tagger_model", model)
    from onmt.transforms import make_transforms
    from onmt.utils.parse import ArgumentParser

    ArgumentParser.validate_prepare_opts(opts, build_vocab_only=True)
    study = make_transforms(opts, {"clause_split": cs.AVAILABLE_TRANSFORMS["clause_split"]}, None)["clause_split"]
    assert repr(study).endswith(f"tagger=study:{model})")
    sentences = [line.split(" ") for line in WMT] + [e.split(" ") for e, _ in tatoeba[-3995::100]]
    examples = [{"src": list(tokens), "tgt": None} for tokens in sentences]
    study.batch_apply([(ex, study, "c") for ex in examples])
    outs = [ex["src"] for ex in examples]
    assert [cs.strip_markers(out) for out in outs] == sentences
    rules = en.split_batch(sentences)
    assert sum(out == rule for out, rule in zip(outs, rules)) >= 0.8 * len(sentences)

    assert "was trained for 'en', but -clause_lang is 'zh'" in _validation_error(
        _opts(tmp_path, "-clause_tagger_model", model, "-clause_lang", "zh"))
    assert train_signal_tagger.main(["--lang", "en", "--input", str(tmp_path / "nope.txt"),
                                     "--output", str(tmp_path / "other.pt")]) == 2
    assert f"{tmp_path / 'nope.txt'}: cannot read" in capsys.readouterr().err
    assert train_signal_tagger.main(["--lang", "en", "--input", str(corpus), "--output", str(model)]) == 2
    assert "already exists; add --overwrite" in capsys.readouterr().err  # the tagger trained above is kept


# ---------------------------------------------------------------------------
# the transform's options: each default written once, in ClauseSplitOptions


def test_the_transform_options_come_from_their_class_with_its_defaults():
    """The parser's -clause_* options are ClauseSplitOptions' fields, with their defaults and help; what reads them
    (the transform, its checks, translate_options) builds the class, so an option left out gets that default."""
    from dataclasses import fields

    from onmt.bin import build_vocab

    options = cs.ClauseSplitOptions
    actions = build_vocab._get_parser()._option_string_actions
    declared = {action.dest: action for name, action in actions.items() if name.startswith("-clause_")}
    assert set(declared) == {options.PREFIX + item.name for item in fields(options)}
    for item in fields(options):
        action = declared[options.PREFIX + item.name]
        assert (action.default, action.help) == (item.default, item.metadata["help"])
        assert action.const is True if item.type is bool else action.type is item.type
    defaults = options()
    assert options.from_opts(_Namespace()) == options.from_opts({}) == defaults
    assert options.from_opts(_Namespace(**{dest: a.default for dest, a in declared.items()})) == defaults
    assert cs.ClauseSplitter.__init__.__defaults__ == (defaults.lang, defaults.levels, None, defaults.spacy_model)
    assert cs.ClauseSplitTransform.get_specials(_Namespace()) == (cs.marker_tokens(defaults.levels), [])
    assert cs.translate_options({"clause_attention": True}) == [
        "-transforms", "clause_split", "-clause_lang", defaults.lang, "-clause_levels", str(defaults.levels)]
    assert cs.translate_options({"clause_attention": True, "clause_lang": "zh", "clause_levels": 2,
                                 "clause_tagger_model": "t.pt"}, ("sentencepiece",)) == [
        "-transforms", "sentencepiece", "clause_split", "-clause_lang", "zh", "-clause_levels", "2",
        "-clause_tagger_model", "t.pt"]
    transform = cs.ClauseSplitTransform(_Namespace(clause_levels=3, clause_presplit=True))
    assert (transform.lang, transform.levels, transform.tagger_model, transform.spacy_model, transform.presplit) == (
        defaults.lang, 3, defaults.tagger_model, defaults.spacy_model, True)


def test_no_clause_split_option_is_read_by_name_outside_its_class():
    """split.py names no -clause_* option as a string or attribute (``getattr(opts, "clause_lang", "en")``,
    ``config.get("clause_levels", 6)``, ``opts.clause_presplit``): each read goes through ClauseSplitOptions."""
    import ast
    from dataclasses import fields

    names = {cs.ClauseSplitOptions.PREFIX + item.name for item in fields(cs.ClauseSplitOptions)}
    tree = ast.parse(open(cs.__file__, encoding="utf-8").read(), cs.__file__)
    found = [(node.lineno, ast.unparse(node)) for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and node.value in names
             or isinstance(node, ast.Attribute) and node.attr in names]
    assert not found, "read it from ClauseSplitOptions.from_opts(opts):\n" + "\n".join(
        f"{cs.__file__}:{line}: {what}" for line, what in found)


# ---------------------------------------------------------------------------
# registration (keep last: it re-executes the module)


def test_registered_with_options_and_reimport_is_harmless():
    from onmt.bin import build_vocab, translate
    from onmt.transforms import AVAILABLE_TRANSFORMS

    assert AVAILABLE_TRANSFORMS["clause_split"] is cs.ClauseSplitTransform
    for parser in (build_vocab._get_parser(), translate._get_parser()):
        for action in parser._actions:
            if any(s.startswith("-clause_") for s in action.option_strings):
                assert action.help
        assert {"-clause_lang", "-clause_levels", "-clause_tagger_model", "-clause_spacy_model"} <= set(
            parser._option_string_actions)
    assert cs.ClauseSplitTransform.get_specials(_Namespace(clause_levels=3)) == ([M[1], M[2], M[3]], [])
    before, registered = dict(cs.__dict__), AVAILABLE_TRANSFORMS["clause_split"]
    try:
        module = importlib.reload(cs)
        module.install()  # would raise OpenNMT-py's "Cannot register duplicate transform"
        assert AVAILABLE_TRANSFORMS["clause_split"] is module.ClauseSplitTransform is not registered
    finally:  # give later tests the objects they imported
        cs.__dict__.clear()
        cs.__dict__.update(before)
        cs.install()
    assert AVAILABLE_TRANSFORMS["clause_split"] is registered


def test_a_presplit_record_knows_its_tagger_by_content(tmp_path):
    """presplit_checks: the record's tagger is the run's when their contents agree, by whatever path; a tagger file
    changed since the split, or the rules where a tagger split the file, is a problem naming the file."""
    tagger = tmp_path / "tagger.pt"
    cs.SignalTagger(np.zeros((8, 7)), "zh").save(tagger)
    split = tmp_path / "train.zh.clause"
    split.write_text("a b\n", encoding="utf-8")
    record = cs.split_record(cs.ClauseSplitOptions(lang="zh", levels=3, tagger_model=str(tagger)))
    assert record["spacy_model"] == "" and len(record["tagger_sha256"]) == 64
    (tmp_path / ("train.zh.clause" + cs.RECORD_SUFFIX)).write_text(json.dumps(record), encoding="utf-8")

    def checks(**options):
        options = {"clause_presplit": True, "clause_lang": "zh", "clause_levels": 3, **options}
        return cs.presplit_checks(_Namespace(transforms=["clause_split"], data={"c": {"path_src": str(split)}},
                                             **options))

    other = tmp_path / "copy" / "tagger.pt"
    other.parent.mkdir()
    other.write_bytes(tagger.read_bytes())
    assert checks(clause_tagger_model=str(tagger)) == checks(clause_tagger_model=str(other)) == ([], [])
    problems, _ = checks()
    assert len(problems) == 1 and f"was split with -clause_tagger_model {str(tagger)!r}" in problems[0][1]
    cs.SignalTagger(np.ones((8, 7)), "zh").save(tagger)
    problems, _ = checks(clause_tagger_model=str(tagger))
    assert len(problems) == 1 and f"{split} was split by an earlier content of -clause_tagger_model" in problems[0][1]
    assert cs.presplit_checks(_Namespace(transforms=["clause_split"], data={"c": {"path_src": str(split)}})) == (
        [], [])  # without -clause_presplit, nothing is read


class _Namespace:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)
