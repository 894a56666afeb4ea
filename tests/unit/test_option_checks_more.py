"""onmt_train options and config values that stock OpenNMT-py 3.5.1 takes silently (no checkpoint, no end, a key
without a value, a corpus without a target) or meets with a traceback (a bad corpus weight, no training corpus,
an unknown corpus transform, lists that do not match their steps): each refused in one line naming the option,
or the config file, line and corpus; what stock means on purpose or leaves unused without harm, noted."""

from argparse import Namespace

import pytest

import support

SMOKE = support.REPO / "yaml_configs/smoke/foundation/ext_transformer.yaml"
CORPORA = repr({"corpus_1": {"path_src": "a.zh", "path_tgt": "a.en", "weight": 1},
                "valid": {"path_src": "v.zh", "path_tgt": "v.en"}})


def _train_opt(**values):
    """A Namespace with onmt_train's defaults for the options the checks read, and ``values``."""
    defaults = dict(train_steps=2, keep_checkpoint=-1, save_checkpoint_steps=5000, tensorboard=False,
                    tensorboard_log_dir="runs/onmt", early_stopping=0, dropout=[0.3], attention_dropout=[0.1],
                    dropout_steps=[0], accum_count=[1], accum_steps=[0], update_vocab=False, train_from="",
                    reset_optim="none", data=CORPORA, model_task="seq2seq", encoder_type="transformer")
    return Namespace(**{**defaults, **values})


def _problems(argv=(), **values):
    from onmt_ext.integration.parsing import training_option_problems

    return training_option_problems(_train_opt(**values), list(argv))


def test_the_defaults_pass():
    assert _problems() == []
    assert _problems(keep_checkpoint=3, save_checkpoint_steps=0, train_steps=0, early_stopping=2) == []
    assert _problems(keep_checkpoint=0) == []  # stock's "save none", on purpose: a note says it


@pytest.mark.parametrize("values, message", [
    (dict(train_steps=-3), "-train_steps -3: must be >= 1 (or 0: no end); OpenNMT-py would train for ever"),
    (dict(save_checkpoint_steps=-1), "-save_checkpoint_steps -1: must be >= 1, or 0 to save at the end only; "
                                     "OpenNMT-py would save every 1 step"),
    (dict(dropout=[0.1, 0.2]), "-dropout has 2 values but -dropout_steps has 1 (0): give one -dropout value per "
                               "-dropout_steps value (-dropout value k applies from step -dropout_steps[k])"),
    (dict(accum_count=[1, 2]), "-accum_count has 2 values but -accum_steps has 1 (0): give one -accum_count value "
                               "per -accum_steps value (-accum_count value k applies from step -accum_steps[k])"),
    (dict(update_vocab=True), "-update_vocab needs -train_from (it updates the vocabularies of the checkpoint "
                              "trained from)"),
    (dict(update_vocab=True, train_from="m.pt"), "-update_vocab needs -reset_optim states or all (got none): the "
                                                 "optimizer's state does not fit the new vocabularies"),
])
def test_training_options_that_stock_ignores_or_asserts_on_are_named(values, message):
    assert _problems(**values) == [message]


def test_the_dropout_steps_message_names_attention_dropout_too():
    assert _problems(dropout=[0.1, 0.2], attention_dropout=[0.1, 0.2], dropout_steps=[0, 100]) == []
    assert [p.split(":")[0] for p in _problems(dropout_steps=[0, 100])] == [
        "-dropout has 1 value but -dropout_steps has 2 (0 100)",
        "-attention_dropout has 1 value but -dropout_steps has 2 (0 100)"]


def _notes(argv=(), **values):
    from onmt_ext.integration.parsing import training_option_notes

    return training_option_notes(_train_opt(**values), list(argv))


def test_options_stock_leaves_unused_without_harm_are_noted_not_refused(tmp_path):
    """A shared config's leftovers (a -tensorboard_log_dir for runs with -tensorboard, an -early_stopping for runs
    with a validation set) and stock's 0s are said in a note; the run goes on."""
    assert _notes() == [] and _problems(["-tensorboard_log_dir", "X"], early_stopping=2) == []
    assert _notes(["-tensorboard_log_dir", "X"]) == ["-tensorboard_log_dir has no effect without -tensorboard"]
    assert _notes(["-tensorboard_log_dir", "X", "-tensorboard"], tensorboard=True) == []
    config = tmp_path / "c.yaml"
    config.write_text("tensorboard_log_dir: runs/onmt\n")
    assert _notes(["-config", str(config)]) == ["-tensorboard_log_dir has no effect without -tensorboard"]
    assert _notes(early_stopping=2, data=repr({"corpus_1": {"path_src": "a", "path_tgt": "b"}})) == [
        "-early_stopping 2 has no effect without a 'valid' corpus in -data (it counts validations that do not "
        "improve)"]
    assert _notes(train_steps=0, keep_checkpoint=0) == [
        "-train_steps 0: the run has no end; stop it with Ctrl-C, or let -early_stopping end it",
        "-keep_checkpoint 0: this run saves no checkpoint (-1 keeps them all)"]


def test_only_onmt_train_is_checked():
    from onmt_ext.integration.parsing import training_option_problems

    assert training_option_problems(Namespace(keep_checkpoint=0, beam_size=5), []) == []


def test_a_corpus_without_a_target_is_refused_for_a_seq2seq_model(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("data:\n  corpus_1:\n    path_src: a.zh\n    weight: 1\n  valid:\n    path_src: v.zh\n"
                      "    path_tgt: v.en\n")
    data = repr({"corpus_1": {"path_src": "a.zh", "weight": 1}, "valid": {"path_src": "v.zh", "path_tgt": "v.en"}})
    assert _problems(["-config", str(config)], data=data) == [
        f"corpus 'corpus_1' of data in {config}, line 2: path_src without path_tgt: OpenNMT-py would train this "
        "-model_task seq2seq model (-encoder_type transformer) as a language model on the source alone: give "
        "path_tgt"]
    assert _problems(["-config", str(config)], data=data, model_task="lm") == []


@pytest.mark.parametrize("data, held", [
    ({"corpus_1": {"path_src": "a", "path_tgt": "b", "weight": 0}, "valid": {"path_src": "a", "path_tgt": "b"}},
     "its training corpora ('corpus_1') all have weight 0"),
    ({"valid": {"path_src": "a", "path_tgt": "b"}}, "it holds no corpus but 'valid'"),
])
def test_data_without_a_training_corpus_is_refused(data, held):
    assert _problems(["-data", repr(data)], data=repr(data)) == [
        f"-data on the command line: no training corpus with a weight above 0 ({held}), so training would never "
        "get a batch: add one (corpus_1: {path_src: ..., path_tgt: ..., weight: 1}) or give one a weight above 0"]


def test_keys_without_a_value_are_named_with_the_file_and_line(tmp_path):
    from onmt_ext.integration.parsing import empty_value_messages

    config = tmp_path / "c.yaml"
    config.write_text("li2019_enc_self:\ngret: ~\npos_ffn_activation_fn: \"\"\nlayers: null\nheads: 8\n"
                      "data:\n  corpus_1:\n    path_src: a\n    transforms:\n    weight: 1\n")
    names = [(m.split("'")[1], m.split(", line ")[1].split(" ")[0]) for m in empty_value_messages(config)]
    assert names == [("li2019_enc_self", "1"), ("gret", "2"), ("pos_ffn_activation_fn", "3"), ("layers", "4"),
                     ("transforms", "9")]
    messages = empty_value_messages(config)
    assert messages[0] == (f"key 'li2019_enc_self' in {config}, line 1 has no value: the option would keep its "
                           "default, or be an empty text, without a word; give a value or delete the line")
    assert messages[-1] == (f"key 'transforms' in corpus 'corpus_1' of data in {config}, line 9 has no value: "
                            "OpenNMT-py would read it as not given; give a value ('transforms: []' for none) or "
                            "delete the line")


def test_no_shipped_config_has_a_key_without_a_value():
    from onmt_ext.integration.parsing import empty_value_messages

    configs = [path for suffix in ("*.yaml", "*.yml") for path in (support.REPO / "yaml_configs").rglob(suffix)]
    assert len(configs) > 100
    assert [m for path in configs for m in empty_value_messages(path)] == []


def test_data_that_is_not_a_mapping_is_refused(tmp_path):
    from onmt_ext.integration.parsing import corpus_key_messages

    config = tmp_path / "c.yaml"
    config.write_text("heads: 8\ndata: build/tatoeba/train.zh\n")
    assert corpus_key_messages(config) == [
        f"data in {config}, line 2: must be a mapping of corpora, each with path_src, path_tgt and weight "
        "(corpus_1: {path_src: ..., path_tgt: ..., weight: 1}), not a single value"]


@pytest.mark.parametrize("weight", ["high", "1.5", "-1", "true", "'2.0'"])
def test_a_bad_corpus_weight_is_refused_with_the_file_and_line(tmp_path, weight):
    from onmt_ext.integration.parsing import corpus_key_messages

    config = tmp_path / "c.yaml"
    config.write_text(f"data:\n  corpus_1:\n    path_src: a\n    weight: {weight}\n")
    (message,) = corpus_key_messages(config)
    assert message.startswith(f"corpus 'corpus_1' of data in {config}, line 4: weight ")
    assert ": must be a whole number >= 0 (how many of its examples to take per round; 0 leaves the corpus " \
           "out)" in message
    assert message.endswith("; OpenNMT-py would read it as 1") == (weight == "1.5")


@pytest.mark.parametrize("weight", ["1", "1.0", "'2'", "0"])
def test_a_weight_stock_reads_as_a_whole_number_passes(tmp_path, weight):
    """OpenNMT-py reads a weight with int(): 1.0 and "2" are weights it takes as they are."""
    from onmt_ext.integration.parsing import corpus_key_messages

    config = tmp_path / "c.yaml"
    config.write_text(f"data:\n  corpus_1:\n    path_src: a\n    weight: {weight}\n")
    assert corpus_key_messages(config) == []


def test_an_unknown_corpus_transform_is_named_with_the_closest(onmt_active, tmp_path):
    from onmt_ext.integration.parsing import corpus_key_messages

    config = tmp_path / "c.yaml"
    config.write_text("data:\n  corpus_1:\n    path_src: a\n    transforms: [sentencepeice, filtertoolong]\n")
    assert corpus_key_messages(config) == [f"unknown transform 'sentencepeice' in corpus 'corpus_1' of data in "
                                           f"{config}, line 4; did you mean 'sentencepiece'?"]


def test_corpus_weights_are_checked_where_the_data_is_validated():
    from onmt_ext.runtime.corpus import CorpusError, corpus_weight, data_problems, weight_problem

    assert weight_problem(None) is weight_problem(0) is weight_problem(3) is weight_problem(2.0) is None
    assert weight_problem("2") is None  # (stock's int("2"))
    assert all(weight_problem(bad) for bad in ("high", 1.5, -1, True, "2.0"))
    assert corpus_weight({}) == 1 and corpus_weight({"weight": 0}) == 0 and corpus_weight({"weight": "2"}) == 2
    with pytest.raises(CorpusError) as raised:
        corpus_weight({"weight": "high"}, "corpus_1")
    assert raised.value.status == 2 and raised.value.message.startswith("corpus 'corpus_1': weight 'high': ")
    assert data_problems("build/tatoeba/train.zh")[0].startswith("-data 'build/tatoeba/train.zh': must be a mapping")
    assert data_problems(repr({"valid": {"path_src": "a"}}))[0].startswith("-data: no training corpus")
    assert data_problems(repr({"valid": {"path_src": "a"}}), training=False) == []
    assert data_problems(CORPORA) == []


def test_train_steps_0_and_keep_checkpoint_0_are_noted_once(capsys, monkeypatch):
    from onmt_ext.integration import parsing

    monkeypatch.setattr(parsing, "_NOTED", set())
    parser = Namespace(prog="onmt_train")
    parsing._say_notes(parser, _train_opt(train_steps=0, keep_checkpoint=-1), [])
    parsing._say_notes(parser, _train_opt(train_steps=0, keep_checkpoint=0), [])
    parsing._say_notes(parser, _train_opt(train_steps=5, keep_checkpoint=0), [])
    assert capsys.readouterr().err == (
        "onmt_train: note: -train_steps 0: the run has no end; stop it with Ctrl-C, or let -early_stopping end it\n"
        "onmt_train: note: -keep_checkpoint 0: this run saves no checkpoint (-1 keeps them all)\n")


def test_the_parse_refuses_them_in_one_line_each(onmt_active, capsys, tmp_path):
    from onmt_ext.integration.parsing import train_parser

    config = tmp_path / "c.yaml"
    config.write_text(SMOKE.read_text().replace("    weight: 1\n", "    weight: high\n") + "gret: ~\n")
    with pytest.raises(SystemExit) as raised:
        train_parser().parse_known_args(["-config", str(config), "-keep_checkpoint", "0"])
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1  # (the empty value first: before the stock parse)
    assert f"error: key 'gret' in {config}, line " in err
    config.write_text(SMOKE.read_text().replace("    weight: 1\n", "    weight: high\n"))
    with pytest.raises(SystemExit):
        train_parser().parse_known_args(["-config", str(config), "-train_steps", "-1"])
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 2
    assert "error: -train_steps -1: must be >= 1" in err
    assert f"error: corpus 'corpus_1' of data in {config}, line " in err and "weight 'high'" in err


def test_data_that_is_not_yaml_is_named_not_a_traceback():
    from onmt_ext.runtime.corpus import data_problems

    message = ("-data '{bad: [': not a YAML mapping of corpora (expected the node content, but found '<stream end>' "
               "at column 8)")
    assert data_problems("{bad: [") == [message]
    assert _problems(data="{bad: [") == [message]
