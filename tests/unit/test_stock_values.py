"""Stock options with values OpenNMT-py 3.5.1 takes and then fails on (a torch traceback, a division by zero, no
checkpoint, no training), typos inside a ``data:`` corpus entry, and a value after a switch: each refused in one
line naming the option (and the file and line of a config key)."""

from argparse import Namespace

import pytest

import support

SMOKE = support.REPO / "yaml_configs/smoke/li2019/em_all_components.yaml"


@pytest.mark.parametrize("option, value, message", [
    ("dropout", [1.5], "-dropout 1.5: must be >= 0 and < 1 (each value)"),
    ("dropout", [0.1, -0.1], "-dropout 0.1 -0.1: must be >= 0 and < 1 (each value)"),
    ("dropout", [1.0], "-dropout 1.0: must be >= 0 and < 1 (each value)"),
    ("attention_dropout", [1.5], "-attention_dropout 1.5: must be >= 0 and < 1 (each value)"),
    ("label_smoothing", 1.5, "-label_smoothing 1.5: must be >= 0 and < 1 (each value)"),
    ("label_smoothing", -0.1, "-label_smoothing -0.1: must be >= 0 and < 1 (each value)"),
    ("learning_rate", -1.0, "-learning_rate -1.0: must be >= 0"),
    ("batch_size", 0, "-batch_size 0: must be >= 1"),
    ("valid_batch_size", 0, "-valid_batch_size 0: must be >= 1"),
    ("heads", 0, "-heads 0: must be >= 1"),
    ("transformer_ff", 0, "-transformer_ff 0: must be >= 1"),
    ("enc_hid_size", 0, "-enc_hid_size 0: must be >= 1"),
    ("hidden_size", 0, "-hidden_size 0: must be >= 1, or -1 (its default) to keep the encoder's and decoder's own "
                       "values; OpenNMT-py would ignore it"),
    ("layers", -3, "-layers -3: must be >= 1, or -1 (its default) to keep the encoder's and decoder's own values; "
                   "OpenNMT-py would ignore it"),
    ("n_sample", 0, "-n_sample 0: give -1 to read every line, or a number of lines above 1 (onmt_build_vocab "
                    "asserts)"),
    ("n_sample", 1, "-n_sample 1: give -1 to read every line, or a number of lines above 1 (onmt_build_vocab "
                    "asserts)"),
    ("n_sample", -2, "-n_sample -2: give -1 to read every line, or a number of lines above 1 (onmt_build_vocab "
                     "asserts)"),
])
def test_impossible_stock_values_are_refused_by_name(option, value, message):
    from onmt_ext.integration.parsing import stock_option_problems

    assert stock_option_problems(Namespace(**{option: value})) == [message]


@pytest.mark.parametrize("option, value", [
    ("dropout", [0.0, 0.3]), ("attention_dropout", [0.1]), ("label_smoothing", 0.0), ("label_smoothing", 0.1),
    ("learning_rate", 0.0), ("learning_rate", 2.0), ("keep_checkpoint", -1), ("keep_checkpoint", -5),
    ("keep_checkpoint", 0), ("keep_checkpoint", 3),  # (0: stock saves none, on purpose)
    ("hidden_size", -1), ("hidden_size", 512), ("word_vec_size", -1), ("layers", 6), ("heads", 8),
])
def test_possible_stock_values_pass(option, value):
    from onmt_ext.integration.parsing import stock_option_problems

    assert stock_option_problems(Namespace(**{option: value})) == []


@pytest.mark.parametrize("method", ["noam", "noamwd"])
def test_no_warmup_is_refused_where_the_schedule_divides_by_it(method):
    from onmt_ext.integration.parsing import stock_option_problems

    assert stock_option_problems(Namespace(decay_method=method, warmup_steps=0)) == [
        f"-warmup_steps 0: must be >= 1 with -decay_method {method} (its schedule divides by it)"]
    assert stock_option_problems(Namespace(decay_method=method, warmup_steps=1)) == []


@pytest.mark.parametrize("method", ["rsqrt", "none"])
def test_no_warmup_passes_where_the_schedule_takes_it(method):
    """rsqrt takes max(step, warmup_steps); none ignores it."""
    from onmt_ext.integration.parsing import stock_option_problems

    assert stock_option_problems(Namespace(decay_method=method, warmup_steps=0)) == []


def test_training_on_several_ranks_without_ranks_is_refused():
    """Stock spawns one process per -gpu_ranks entry: none, and exits 0 without training (on GPUs too)."""
    from onmt_ext.integration.parsing import stock_option_problems

    (message,) = stock_option_problems(Namespace(train_steps=2, world_size=2, gpu_ranks=[]))
    assert message.startswith("-world_size 2 needs -gpu_ranks") and "-gpu_ranks 0 1" in message
    assert stock_option_problems(Namespace(train_steps=2, world_size=2, gpu_ranks=[0])) == []  # one of two nodes
    assert stock_option_problems(Namespace(train_steps=2, world_size=1, gpu_ranks=[])) == []



@pytest.mark.parametrize("ranks", [[], [0]])
def test_translation_ranks_need_one_gpu_rank_each(ranks):
    """onmt_translate -world_size N spawns N ranks on this node, rank k on -gpu_ranks' entry k: with fewer, a rank
    failed inside stock's own error handler and the others waited for it."""
    from onmt_ext.integration.parsing import stock_option_problems

    assert stock_option_problems(Namespace(beam_size=5, world_size=2, gpu_ranks=ranks)) == [
        f"-world_size 2 needs one -gpu_ranks entry per rank in onmt_translate, which runs them all on this node (got "
        f"{len(ranks)}): -gpu_ranks 0 1"]
    assert stock_option_problems(Namespace(beam_size=5, world_size=2, gpu_ranks=[0, 1])) == []
    assert stock_option_problems(Namespace(beam_size=5, world_size=2, gpu_ranks=[0, 1, 2])) == []  # (2 read)
    assert stock_option_problems(Namespace(beam_size=5, world_size=1, gpu_ranks=[])) == []


def _refused(onmt_active, capsys, *args):
    from onmt_ext.integration.parsing import train_parser

    with pytest.raises(SystemExit) as raised:
        train_parser().parse_known_args(list(map(str, args)))
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_the_parse_refuses_an_impossible_dropout(onmt_active, capsys):
    err = _refused(onmt_active, capsys, "-config", SMOKE, "-dropout", "1.5")
    assert "error: -dropout 1.5: must be >= 0 and < 1" in err


def test_typos_inside_a_corpus_entry_are_refused_with_the_file_and_line(onmt_active, capsys, tmp_path):
    config = tmp_path / "typo.yaml"
    config.write_text(SMOKE.read_text().replace("    weight: 1\n", "    weigth: 5\n    transform: [filtertoolong]\n",
                                                1))
    line = config.read_text().splitlines().index("    weigth: 5") + 1
    err = _refused(onmt_active, capsys, "-config", config)
    assert (f"unknown key 'weigth' in corpus 'corpus_1' of data in {config}, line {line}; did you mean 'weight'?"
            in err)
    assert (f"unknown key 'transform' in corpus 'corpus_1' of data in {config}, line {line + 1}; did you mean "
            "'transforms'?" in err)


def test_a_corpus_entry_that_is_not_a_mapping_is_refused(tmp_path):
    from onmt_ext.integration.parsing import corpus_key_messages

    config = tmp_path / "c.yaml"
    config.write_text("data:\n  corpus_1: train.txt\n")
    assert corpus_key_messages(config) == [f"corpus 'corpus_1' of data in {config}, line 2: must be a mapping of "
                                           "keys such as path_src, path_tgt and weight"]


def test_every_shipped_config_has_only_known_corpus_keys():
    from onmt_ext.integration.parsing import corpus_key_messages

    roots = [support.REPO / "yaml_configs", support.REPO.parent / "shared/opennmt-py-3.5.1-data"]
    configs = [path for root in roots for suffix in ("*.yaml", "*.yml") for path in root.rglob(suffix)]
    assert len(configs) > 100
    assert [m for path in configs for m in corpus_key_messages(path)] == []


def test_stock_corpus_keys_pass(tmp_path):
    """The per-corpus settings of the prefix, suffix, clean and normalize transforms are keys of a corpus."""
    from onmt_ext.integration.parsing import corpus_key_messages

    config = tmp_path / "c.yaml"
    config.write_text("data:\n  c:\n    path_txt: a\n    path_align: b\n    src_prefix: x\n    tgt_suffix: y\n"
                      "    src_lang: en\n    penn: false\n    scripts_ok: [Latin]\n    langid: [en]\n")
    assert corpus_key_messages(config) == []


@pytest.mark.parametrize("value", ["false", "true", "0"])
def test_a_value_after_a_switch_names_the_switch(onmt_active, capsys, value):
    err = _refused(onmt_active, capsys, "-config", SMOKE, "-position_encoding", value)
    assert f"error: -position_encoding takes no value (got {value!r}): write -position_encoding alone" \
        in err
    assert "cannot turn off a 'position_encoding: true' of a config: edit the config" in err
    assert "no option takes it" not in err and err.count("\n") == 1


def test_a_value_joined_to_a_switch_names_the_switch(onmt_active, capsys):
    err = _refused(onmt_active, capsys, "-config", SMOKE, "-position_encoding=false")
    assert "error: -position_encoding takes no value (got 'false'): write -position_encoding alone" in err
    assert err.count("\n") == 1


def test_a_stray_value_elsewhere_is_still_reported(onmt_active, capsys):
    err = _refused(onmt_active, capsys, "-config", SMOKE, "-train_steps", "2", "stray")
    assert "unexpected value 'stray' (no option takes it)" in err


def test_a_minimum_length_above_the_maximum_is_refused():
    """``onmt_translate -min_length 10 -max_length 5`` stopped every output at 5 tokens without a word."""
    from onmt_ext.integration.parsing import stock_option_problems

    assert stock_option_problems(Namespace(min_length=10, max_length=5)) == [
        "-min_length 10: must be <= -max_length (5)"]
    assert stock_option_problems(Namespace(min_length=20, max_length=20)) == []
    assert stock_option_problems(Namespace(min_length=0, max_length=250, n_sample=-1)) == []
    assert stock_option_problems(Namespace(n_sample=0, train_steps=10)) == []  # onmt_train: no samples dumped


def test_a_corpus_merged_from_an_anchor_is_read_as_yaml_reads_it(tmp_path):
    """A merge key (``<<: *common``) brings the anchor's keys into the corpus, as OpenNMT-py's safe_load reads it:
    not an unknown key '<<', and the merged keys are judged too."""
    from onmt_ext.integration.parsing import corpus_key_messages

    config = tmp_path / "c.yaml"
    config.write_text("common: &common\n  weight: 1\n  transforms: [filtertoolong]\n"
                      "data:\n  c:\n    <<: *common\n    path_src: a\n    path_tgt: b\n")
    assert corpus_key_messages(config) == []
    config.write_text("common: &common\n  weigth: 1\ndata:\n  c:\n    <<: *common\n    path_src: a\n")
    assert [message.split(";")[0] for message in corpus_key_messages(config)] == [
        f"unknown key 'weigth' in corpus 'c' of data in {config}, line 2"]


def test_a_sides_size_that_the_shared_size_replaces_passes():
    """Stock replaces -enc_hid_size/-dec_hid_size with -hidden_size, and the sides' word vector sizes with
    -word_vec_size, when those are above 0: the sides' own values are then never read."""
    from onmt_ext.integration.parsing import stock_option_problems

    assert stock_option_problems(Namespace(enc_hid_size=0, dec_hid_size=0, hidden_size=512)) == []
    assert stock_option_problems(Namespace(src_word_vec_size=0, word_vec_size=512)) == []
    assert stock_option_problems(Namespace(src_word_vec_size=0, word_vec_size=-1)) == ["-src_word_vec_size 0: must be "
                                                                                       ">= 1"]


@pytest.mark.parametrize("size, shown", [("-hidden_size", "-hidden_size 0: must be >= 1, or -1"),
                                         ("-heads", "-heads 0: must be >= 1")])
def test_a_model_size_out_of_range_is_said_once_and_alone(onmt_active, capsys, size, shown):
    """onmt-ext's own checks read the sizes: with one out of range they would add a line on a size the user never
    gave (li2019's capsules against stock's default 500) or say -heads again."""
    message = _refused(onmt_active, capsys, "-config", SMOKE, size, 0)
    assert len(message.strip().splitlines()) == 1 and shown in message, message
