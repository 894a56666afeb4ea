"""onmt_translate repeats the checkpoint's source preprocessing (onmt_ext.integration.preprocessing), and the jieba
transform (onmt_ext.integration.zh_segment) cuts raw Chinese as the shipped sample was cut."""

import shutil

import pytest
import torch

from onmt_ext.integration.preprocessing import SEGMENTED_KEY, record_training_source
from tests import support

DEMO = "yaml_configs/demo/tatoeba_zhen.yaml"
RAW = "我今天很高兴。"


def _lines(path):
    return path.read_text(encoding="utf-8").splitlines()


def _checkpoint(tmp_path, *overrides, spm_dir=None, train_src=None):
    """A checkpoint file holding only the training options of the demo config (with ``overrides``).

    The subword models named in it are copies of the sample's, in ``spm_dir`` (default: ``tmp_path``); its
    training source is ``train_src`` (default: a file that is not there).
    """
    spm_dir = spm_dir or tmp_path
    opt = support.load_train_opts(DEMO, "-src_subword_model", spm_dir / "spm.zh.model",
                                  "-tgt_subword_model", spm_dir / "spm.en.model", *overrides)
    opt.data = {"corpus_1": {"path_src": str(train_src or tmp_path / "gone.zh"), "path_tgt": "x"},
                "valid": {"path_src": "y", "path_tgt": "z"}}
    setattr(opt, SEGMENTED_KEY, None)  # recorded again for this data, as training records it
    record_training_source(opt)
    path = tmp_path / "model_step_1.pt"
    torch.save({"model": {}, "generator": {}, "opt": opt}, path)
    return path, opt


def _copy_spm(sample_data, where):
    for lang in ("zh", "en"):
        shutil.copy(sample_data / f"spm.{lang}.model", where / f"spm.{lang}.model")


def _translate_opt(*args):
    import onmt.bin.translate

    return onmt.bin.translate._get_parser().parse_args(["-src", "x", *map(str, args)])


def _transforms_of(opt):
    """What onmt_translate's first step makes of ``opt``'s transforms (``opt._all_transform``)."""
    from onmt.utils.parse import ArgumentParser

    ArgumentParser._get_all_transform_translate(opt)
    return opt._all_transform


def _pipe(opt):
    from onmt.transforms import TransformPipe, get_transforms_cls, make_transforms

    transforms = make_transforms(opt, get_transforms_cls(opt._all_transform), None)
    return TransformPipe.build_from([transforms[name] for name in opt._all_transform])


def test_missing_transforms_are_taken_from_the_checkpoint(sample_data, onmt_active, tmp_path, capsys):
    _copy_spm(sample_data, tmp_path)
    path, trained = _checkpoint(tmp_path)
    opt = _translate_opt("-model", path)
    assert _transforms_of(opt) == ["sentencepiece"]  # filtertoolong is training's alone
    assert opt.src_subword_model == trained.src_subword_model
    assert opt.tgt_subword_model == trained.tgt_subword_model
    assert "applying the model's preprocessing: -transforms sentencepiece" in capsys.readouterr().err
    # an option the user gives is kept
    other = tmp_path / "other.model"
    shutil.copy(tmp_path / "spm.zh.model", other)
    opt = _translate_opt("-model", path, "-src_subword_model", other)
    assert _transforms_of(opt) == ["sentencepiece"] and opt.src_subword_model == str(other)


def test_a_clause_models_split_is_taken_from_the_checkpoint_and_done_on_the_fly(sample_data, onmt_active, tmp_path,
                                                                                capsys):
    """A clause-attention model's clause_split and its options are adopted like its subword model: its spaCy
    pipeline is a package name, not a file that must be here (every clause model failed so); a model trained on
    pre-split files (-clause_presplit) gets its raw source split on the fly, not passed through unsplit; a source
    in pieces already skips the subword model but is still split."""
    _copy_spm(sample_data, tmp_path)
    path, _ = _checkpoint(tmp_path, "-transforms", "sentencepiece", "clause_split", "filtertoolong",
                          "-clause_lang", "zh", "-clause_levels", 4, "-clause_presplit")
    opt = _translate_opt("-model", path)
    assert _transforms_of(opt)[-2:] == ["sentencepiece", "clause_split"]
    assert (opt.clause_lang, opt.clause_levels, opt.clause_presplit) == ("zh", 4, False)
    said = capsys.readouterr().err
    assert "-clause_lang zh -clause_levels 4" in said and "presplit" not in said and "spacy" not in said, said
    encoded = tmp_path / "test.sp.zh"  # cut into pieces already (as the paper configs' BPE'd test sources): split
    encoded.write_text(" ".join(spm_pieces(tmp_path).encode("我 今天 很 高兴 。", out_type=str)) + "\n",
                       encoding="utf-8")
    opt = _translate_opt("-model", path, "-src", encoded)
    assert _transforms_of(opt) == ["clause_split"] and (opt.clause_lang, opt.clause_levels) == ("zh", 4)
    assert capsys.readouterr().err == (f"onmt_translate: -src {encoded} holds subword pieces already: translated "
                                       "without the model's -transforms sentencepiece; applying its -transforms "
                                       "clause_split -clause_lang zh -clause_levels 4\n")


def test_a_subword_model_that_is_not_here_stops_translation_in_one_line(sample_data, onmt_active, tmp_path):
    from onmt_ext.errors import UsageError

    path, trained = _checkpoint(tmp_path, spm_dir=tmp_path / "moved")
    with pytest.raises(UsageError) as error:
        _transforms_of(_translate_opt("-model", path))
    message = error.value.message
    assert "\n" not in message
    assert f"-src_subword_model {trained.src_subword_model} (from training): no such file" in message
    assert "trained with -transforms sentencepiece filtertoolong" in message


def test_transforms_that_differ_from_training_are_named(sample_data, onmt_active, tmp_path, capsys):
    _copy_spm(sample_data, tmp_path)
    path, _ = _checkpoint(tmp_path, "-transforms", "jieba", "sentencepiece", "filtertoolong")
    opt = _translate_opt("-model", path, "-transforms", "sentencepiece", "-src_subword_model",
                         tmp_path / "spm.zh.model", "-tgt_subword_model", tmp_path / "spm.en.model")
    assert _transforms_of(opt) == ["sentencepiece"]  # a warning, the user's choice stands
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "warning: -transforms sentencepiece: the model was trained with -transforms jieba " \
                             "sentencepiece filtertoolong" in err[0]
    # the same transforms with another subword model file
    opt = _translate_opt("-model", path, "-transforms", "jieba", "sentencepiece", "-src_subword_model",
                         tmp_path / "spm.en.model", "-tgt_subword_model", tmp_path / "spm.en.model")
    _transforms_of(opt)
    err = capsys.readouterr().err
    assert f"-src_subword_model {tmp_path / 'spm.en.model'} differs from the file the model was trained with" in err
    # what matches training says nothing
    opt = _translate_opt("-model", path, "-transforms", "jieba", "sentencepiece", "filtertoolong",
                         "-src_subword_model", tmp_path / "spm.zh.model", "-tgt_subword_model",
                         tmp_path / "spm.en.model")
    _transforms_of(opt)
    assert capsys.readouterr().err == ""


def test_raw_chinese_gets_the_pieces_of_training(sample_data, onmt_active, tmp_path):
    """A model trained on raw Chinese through ``jieba``: raw Chinese given to onmt_translate without -transforms
    reaches the model as the pieces training made of the same sentence."""
    _copy_spm(sample_data, tmp_path)
    path, trained = _checkpoint(tmp_path, "-transforms", "jieba", "sentencepiece", "filtertoolong")
    opt = _translate_opt("-model", path)
    assert _transforms_of(opt) == ["jieba", "sentencepiece"]
    opt.share_vocab = False  # (set by onmt_translate's later validation)
    trained._all_transform = list(trained.transforms)
    seen_in_training = _pipe(trained).apply({"src": [RAW], "tgt": ["I", "am", "happy."]}, is_train=True)
    at_translation = _pipe(opt).apply({"src": [RAW], "tgt": None})
    assert at_translation["src"] == seen_in_training["src"]
    import sentencepiece as spm

    words = spm.SentencePieceProcessor(model_file=str(tmp_path / "spm.zh.model"))
    assert at_translation["src"] != words.encode(RAW, out_type=str)  # not what raw text alone would give


def test_jieba_cuts_raw_chinese_as_the_shipped_sample_was_cut(sample_data, onmt_active):
    """The shipped test sources, raw, through the transform: build/tatoeba/test.zh line for line; the segmented
    training and validation lines pass unchanged with -jieba_keep_segmented."""
    from onmt.transforms import make_transforms, get_transforms_cls

    from onmt_ext.integration.zh_segment import segment

    raw = [line.split("\t")[0] for line in _lines(support.REPO / "data/tatoeba-zh-en/zh2en.multiref.tsv")]
    segmented = _lines(sample_data / "test.zh")
    assert [" ".join(segment(line)) for line in raw] == segmented
    opt = support.load_train_opts(DEMO, "-transforms", "jieba", "-jieba_keep_segmented")
    jieba = make_transforms(opt, get_transforms_cls(["jieba"]), None)["jieba"]
    for name in ("train.zh", "valid.zh", "test.zh"):
        lines = _lines(sample_data / name)
        assert [" ".join(jieba.apply({"src": line.split(" ")})["src"]) for line in lines] == lines, name
    assert jieba.apply({"src": [RAW], "tgt": ["x"]}) == {"src": segment(RAW), "tgt": ["x"]}


def test_jieba_sides(onmt_active):
    from onmt.transforms import make_transforms, get_transforms_cls

    from onmt_ext.integration.zh_segment import segment

    for side, cut in (("src", {"src"}), ("tgt", {"tgt"}), ("both", {"src", "tgt"})):
        opt = support.load_train_opts(DEMO, "-transforms", "jieba", "-jieba_side", side)
        jieba = make_transforms(opt, get_transforms_cls(["jieba"]), None)["jieba"]
        out = jieba.apply({"src": [RAW], "tgt": [RAW]})
        assert {k for k in out if out[k] == segment(RAW)} == cut


def _demo_checkpoint(sample_data, tmp_path):
    """The demo's options (sentencepiece alone; Chinese segmented beforehand), trained on a part of its train.zh."""
    _copy_spm(sample_data, tmp_path)
    train = tmp_path / "train.zh"
    train.write_text("\n".join(_lines(sample_data / "train.zh")[:300]) + "\n", encoding="utf-8")
    return _checkpoint(tmp_path, train_src=train)[0]


def test_raw_chinese_into_a_model_of_segmented_chinese_is_segmented(sample_data, onmt_active, tmp_path, capsys):
    """The demo model's case: trained on jieba-segmented text without the jieba transform.  Without -transforms,
    raw Chinese reaches the model as the pieces of its segmented form, and segmented input is left as it was."""
    from onmt_ext.integration.zh_segment import segment

    opt = _translate_opt("-model", _demo_checkpoint(sample_data, tmp_path))
    assert _transforms_of(opt) == ["jieba", "sentencepiece"] and opt.jieba_keep_segmented
    assert "-jieba_keep_segmented (its training source" in capsys.readouterr().err
    opt.share_vocab = False
    pipe = _pipe(opt)
    words = spm_pieces(tmp_path)
    assert pipe.apply({"src": [RAW], "tgt": None})["src"] == words.encode(" ".join(segment(RAW)), out_type=str)
    for line in _lines(sample_data / "test.zh")[:200]:
        assert pipe.apply({"src": line.split(" "), "tgt": None})["src"] == words.encode(line, out_type=str)


def test_the_segmented_training_source_is_known_after_the_file_is_gone(sample_data, onmt_active, tmp_path):
    """Training records that its source was segmented Chinese: a checkpoint moved to another machine, or whose
    training data was deleted, still gets jieba in front; a checkpoint without the record reads the file."""
    path = _demo_checkpoint(sample_data, tmp_path)
    (tmp_path / "train.zh").unlink()
    assert _transforms_of(_translate_opt("-model", path)) == ["jieba", "sentencepiece"]
    old = torch.load(path, weights_only=False)
    delattr(old["opt"], SEGMENTED_KEY)  # as written before the record existed: the file decides, and it is gone
    torch.save(old, path)
    assert _transforms_of(_translate_opt("-model", path)) == ["sentencepiece"]


def test_training_records_whether_its_source_is_segmented_chinese(sample_data, onmt_active, tmp_path):
    opt = support.load_train_opts(DEMO)
    assert getattr(opt, SEGMENTED_KEY) == "build/tatoeba/train.zh"
    english = tmp_path / "en-zh.yaml"  # the other direction: an English source
    english.write_text((support.REPO / DEMO).read_text(encoding="utf-8").replace("train.zh", "train.en"),
                       encoding="utf-8")
    assert getattr(support.load_train_opts(english), SEGMENTED_KEY) == ""


def test_raw_chinese_with_transforms_lacking_jieba_is_named(sample_data, onmt_active, tmp_path, capsys):
    path = _demo_checkpoint(sample_data, tmp_path)
    raw, segmented = tmp_path / "raw.zh", tmp_path / "segmented.zh"
    raw.write_text("我今天很高兴。\n你想去哪里吃饭？\n", encoding="utf-8")
    segmented.write_text("我 今天 很 高兴 。\n你 想 去 哪里 吃饭 ？\n", encoding="utf-8")
    spm = ("-transforms", "sentencepiece", "-src_subword_model", tmp_path / "spm.zh.model", "-tgt_subword_model",
           tmp_path / "spm.en.model")
    _transforms_of(_translate_opt("-model", path, *spm, "-src", raw))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"warning: -src {raw}: 2 of its first 2 Chinese lines are not segmented" in err[0]
    _transforms_of(_translate_opt("-model", path, *spm, "-src", segmented))
    assert capsys.readouterr().err == ""


def spm_pieces(where):
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=str(where / "spm.zh.model"))


def test_a_source_encoded_beforehand_is_translated_as_it_is(sample_data, onmt_active, tmp_path, capsys):
    """Pieces in -src (as tools/prepare_tatoeba.py's encode_file writes them) and no -transforms: nothing applied."""
    path = _demo_checkpoint(sample_data, tmp_path)
    encoded = tmp_path / "test.sp.zh"
    encoded.write_text(" ".join(spm_pieces(tmp_path).encode("我 今天 很 高兴 。", out_type=str)) + "\n",
                       encoding="utf-8")
    assert _transforms_of(_translate_opt("-model", path, "-src", encoded)) == []
    said = capsys.readouterr().err
    assert f"-src {encoded} holds subword pieces already: translated without the model's -transforms " \
           "sentencepiece\n" in said, said
