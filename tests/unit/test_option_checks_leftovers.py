"""Option mistakes that stock OpenNMT-py 3.5.1 meets with a traceback or a message naming no file, or passes over
without a word: a bad corpus of a ``-data`` given on the command line (an unknown transform: a ValueError
traceback; an unknown key: ignored), a YAML list for an option that takes one value (configargparse's message,
naming no file and line; an AssertionError for a switch), each refused in one line; and the options of a transform
that the run does not use, noted (ignored by stock)."""

import pytest

import support

SMOKE = support.REPO / "yaml_configs/smoke/foundation/ext_transformer.yaml"
CORPUS = "{corpus_1: {path_src: a.zh, path_tgt: a.en, %s}}"


def _refused(parser, argv, capsys):
    """The messages of a strict parse of ``argv`` that must stop with exit 2, one line each (``<prog>: error:``
    taken off)."""
    with pytest.raises(SystemExit) as raised:
        parser.parse_known_args([str(arg) for arg in argv])
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert all(": error: " in line for line in err.splitlines())
    return [line.split(": error: ", 1)[1] for line in err.splitlines()]


def _vocab_parser():
    from onmt.bin.build_vocab import _get_parser
    from onmt_ext.integration.parsing import strict

    return strict(_get_parser())


VOCAB_ARGS = ["-save_data", "x", "-src_vocab", "v.src", "-tgt_vocab", "v.tgt", "-n_sample", "10"]


@pytest.mark.parametrize("entry, message", [
    ("transforms: [sentencepeice]", "unknown transform 'sentencepeice' in corpus 'corpus_1' of -data on the command "
                                    "line; did you mean 'sentencepiece'?"),
    ("weigth: 1", "unknown key 'weigth' in corpus 'corpus_1' of -data on the command line; did you mean 'weight'?"),
    ("weight: high", "corpus 'corpus_1' of -data on the command line: weight 'high': must be a whole number >= 0 "
                     "(how many of its examples to take per round; 0 leaves the corpus out)"),
    ("transforms: sentencepiece", "corpus 'corpus_1' of -data on the command line: transforms 'sentencepiece' is not "
                                  "a list: write transforms: [sentencepiece]"),
    ("transforms: ", "key 'transforms' in corpus 'corpus_1' of -data on the command line has no value: OpenNMT-py "
                     "would read it as not given; give a value ('transforms: []' for none) or delete the key"),
])
def test_a_bad_corpus_of_a_command_line_data_is_refused_in_one_line(onmt_active, capsys, entry, message):
    """onmt_build_vocab and onmt_train: stock ends the unknown transform in 'ValueError: ... transform not
    supported!' and trains over the unknown key."""
    from onmt_ext.integration.parsing import train_parser

    data = CORPUS % entry
    assert _refused(_vocab_parser(), ["-data", data, *VOCAB_ARGS], capsys) == [message]
    assert _refused(train_parser(), ["-config", SMOKE, "-data", data], capsys) == [message]


def test_the_config_and_the_command_line_data_get_the_same_checks(onmt_active, tmp_path):
    from onmt_ext.integration.parsing import command_line_data_messages, corpus_key_messages

    data = "{corpus_1: {path_src: a, weigth: 1, transforms: [bogus]}, corpus_2: {weight: -1}, valid: [a]}"
    config = tmp_path / "c.yaml"
    config.write_text(f"data: {data}\n")
    assert [m.replace(f"data in {config}, line 1", "-data on the command line") for m in corpus_key_messages(config)] \
        == command_line_data_messages(data) != []
    assert command_line_data_messages("[a, b]") == [
        "-data on the command line: must be a mapping of corpora, each with path_src, path_tgt and weight (corpus_1: "
        "{path_src: ..., path_tgt: ..., weight: 1}), not a list"]
    assert command_line_data_messages("{bad: [") == [] == command_line_data_messages(CORPUS % "weight: 2")


@pytest.mark.parametrize("setting, message", [
    ("heads: [4]", "takes one value, not a list ([4]); write heads: 4"),
    ("heads: [4, 8]", "takes one value, not a list ([4, 8]); give it one value (heads: <value>)"),
    ("tensorboard: [true]", "takes one value, not a list ([true]); write tensorboard: true"),
])
def test_a_list_for_an_option_that_takes_one_value_names_the_file_and_line(onmt_active, capsys, tmp_path, setting,
                                                                            message):
    """configargparse: 'heads can't be set to a list '[4]' unless its action type is changed to 'append' or nargs
    is set to...' (no file, no line); for a switch, an AssertionError traceback."""
    from onmt_ext.integration.parsing import train_parser

    config = tmp_path / "c.yaml"
    name = setting.split(":")[0]
    text = "".join(line for line in SMOKE.read_text().splitlines(True) if not line.startswith(f"{name}:"))
    config.write_text(text + setting + "\n")
    line = text.count("\n") + 1
    assert _refused(train_parser(), ["-config", config], capsys) == [
        f"key '{name}' in {config}, line {line}: {message}"]
    given = ["-heads", "2"] if name == "heads" else ["-tensorboard"]
    train_parser().parse_known_args(["-config", str(config), *given])  # configargparse drops the key: no message


def test_a_switch_whose_value_is_no_boolean_names_the_file_and_line(onmt_active, capsys, tmp_path):
    """configargparse: 'Unexpected value for tensorboard: 'maybe'. Expecting ...', naming no file and line."""
    from onmt_ext.integration.parsing import train_parser

    config = tmp_path / "c.yaml"
    text = "".join(line for line in SMOKE.read_text().splitlines(True) if not line.startswith("tensorboard:"))
    config.write_text(text + "tensorboard: maybe\n")
    assert _refused(train_parser(), ["-config", config], capsys) == [
        f"key 'tensorboard' in {config}, line {text.count(chr(10)) + 1}: unexpected value 'maybe'. Expecting 'true', "
        "'false', 'yes', 'no', 'on', 'off', '1' or '0'"]


def test_options_that_take_lists_keep_their_lists(onmt_active, tmp_path):
    from onmt_ext.integration.parsing import list_value_messages, train_parser

    config = tmp_path / "c.yaml"
    config.write_text("dropout: [0.1]\ngpu_ranks: [0]\ntransforms: [sentencepiece]\naccum_count: [1, 2]\n"
                      "src_vocab: [a]\nnot_an_option: [1]\n")
    assert list_value_messages(train_parser(), ["-config", str(config)]) == [
        f"key 'src_vocab' in {config}, line 5: takes one value, not a list ([a]); write src_vocab: a"]
    opt, _ = train_parser().parse_known_args(["-config", str(SMOKE)])  # (lists of the shipped config)
    assert opt.dropout == [0.0] and opt.transforms == ["sentencepiece", "filtertoolong"]


def _config(tmp_path, text=None, **replace):
    config = tmp_path / "c.yaml"
    text = SMOKE.read_text() if text is None else text
    for old, new in replace.items():
        assert old in text
        text = text.replace(old, new)
    config.write_text(text)
    return config


def _notes(parser, argv):
    from onmt_ext.integration.parsing import transform_option_notes

    argv = [str(arg) for arg in argv]
    opt, _ = parser.parse_known_args(argv)
    return transform_option_notes(opt, argv)


def test_an_option_of_a_transform_the_run_does_not_use_is_noted(onmt_active, tmp_path):
    from onmt_ext.integration.parsing import train_parser

    config = _config(tmp_path, **{"transforms: [sentencepiece, filtertoolong]": "transforms: [sentencepiece]"})
    line = config.read_text().splitlines().index("src_seq_length: 100") + 1
    unused = "is an option of the filtertoolong transform, which this run does not use; it is ignored"
    assert _notes(train_parser(), ["-config", config]) == [
        f"-src_seq_length (in {config}, line {line}) {unused}", f"-tgt_seq_length (in {config}, line {line + 1}) "
                                                                f"{unused}"]
    assert _notes(train_parser(), ["-config", config, "-src_seq_length", "10", "-jieba_side", "both"]) == [
        "-jieba_side (on the command line) is an option of the jieba transform, which this run does not use; it is "
        "ignored", f"-src_seq_length (on the command line) {unused}", f"-tgt_seq_length (in {config}, line "
                                                                      f"{line + 1}) {unused}"]
    assert _notes(_vocab_parser(), ["-config", config, "-n_sample", "10"])[0].startswith(
        f"-src_seq_length (in {config}, line {line}) is an option of the filtertoolong")
    no_subwords = _config(tmp_path, **{"transforms: [sentencepiece, filtertoolong]": "transforms: [filtertoolong]"})
    assert _notes(train_parser(), ["-config", no_subwords]) == [
        f"-src_subword_model (in {no_subwords}, line 17) is an option of the bpe, onmt_tokenize and sentencepiece "
        "transforms, none of which this run uses; it is ignored", f"-tgt_subword_model (in {no_subwords}, line 18) "
        "is an option of the bpe, onmt_tokenize and sentencepiece transforms, none of which this run uses; it is "
        "ignored"]


def test_no_note_where_the_transform_is_used_or_the_option_not_set(onmt_active, tmp_path):
    from onmt_ext.integration.parsing import train_parser

    assert _notes(train_parser(), ["-config", SMOKE, "-jieba_side", "src"]) == []  # (its default)
    assert _notes(train_parser(), ["-config", SMOKE, "-jieba_side", "both", "-transforms", "jieba", "sentencepiece",
                                   "filtertoolong"]) == []
    in_corpus = _config(tmp_path, **{"transforms: [sentencepiece, filtertoolong]": "transforms: [sentencepiece]",
                                     "    weight: 1\n": "    weight: 1\n    transforms: [filtertoolong]\n"})
    assert _notes(train_parser(), ["-config", in_corpus]) == []
    unset = _config(tmp_path, **{"transforms: [sentencepiece, filtertoolong]": "transforms: [sentencepiece]",
                                 "src_seq_length: 100\n": "", "tgt_seq_length: 100\n": ""})
    assert _notes(train_parser(), ["-config", unset]) == []
    learn = _config(tmp_path, **{"transforms: [sentencepiece, filtertoolong]\n": "",
                                 "src_seq_length: 100\n": "", "tgt_seq_length: 100\n": "",
                                 "tgt_subword_model: build/tatoeba/spm.en.model\n": ""})
    assert _notes(_vocab_parser(), ["-config", learn, "-n_sample", "10", "-learn_subwords"]) == []
    assert len(_notes(_vocab_parser(), ["-config", learn, "-n_sample", "10"])) == 1


def test_notes_are_said_once_on_stderr(onmt_active, tmp_path, capsys, monkeypatch):
    from argparse import Namespace

    from onmt_ext.integration import parsing

    monkeypatch.setattr(parsing, "_NOTED", set())
    opt = Namespace(data="{corpus_1: {path_src: a, path_tgt: b}}", transforms=[], src_seq_length=10)
    for _ in range(2):
        parsing._say_notes(Namespace(prog="onmt_build_vocab"), opt, ["-src_seq_length", "10"])
    assert capsys.readouterr().err == (
        "onmt_build_vocab: note: -src_seq_length (on the command line) is an option of the filtertoolong transform, "
        "which this run does not use; it is ignored\n")
    translate = Namespace(transforms=[], src_seq_length=10)  # (onmt_translate: the checkpoint's transforms)
    assert parsing.transform_option_notes(translate, ["-src_seq_length", "10"]) == []
