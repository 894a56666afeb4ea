"""onmt_translate's progress on stderr through the real command (issue 58): the sentences translated, the rate and
the time left, and an output file that is byte for byte the one stock OpenNMT-py writes; a warning for lines far
longer than training's.

The checkpoint is the stock smoke model with random weights, built in-process (no training); the in-process tests
of onmt_ext.integration.progress are in tests/unit/test_progress.py.
"""

import torch

import support

STOCK = "yaml_configs/smoke/baseline/transformer_base_wmt14_ende.yaml"


def _stock_checkpoint(path):
    from onmt.inputters.inputter import vocabs_to_dict

    opt = support.load_train_opts(STOCK)
    vocabs = support.load_vocabs(opt)
    model = support.build_model(opt, vocabs, seed=5)
    state = model.state_dict()
    torch.save({"model": {k: v for k, v in state.items() if not k.startswith("generator.")},
                "generator": {k[len("generator."):]: v for k, v in state.items() if k.startswith("generator.")},
                "vocab": vocabs_to_dict(vocabs), "opt": opt, "optim": None}, path)
    return path


def test_translation_shows_its_progress_on_stderr(sample_data, onmt_active, tmp_path):
    model = _stock_checkpoint(tmp_path / "stock.pt")
    src = tmp_path / "src"  # subword pieces already: onmt-ext translates them as they are, as stock does
    src.write_text("▁我 ▁很 ▁好 。\n▁你 ▁好 。\n▁谢谢 。\n", encoding="utf-8")
    runs = {}
    for name, env in (("ours", support.cli_env()), ("stock", support.cli_env(ONMT_EXT_DISABLE="1"))):
        runs[name] = support.run_cli("onmt_translate", "-model", model, "-src", src, "-output", tmp_path / name,
                                     "-max_length", 4, "-batch_size", 1, "-batch_type", "sents", env=env)
    shown = [line for line in runs["ours"].stderr.splitlines() if " sentences (" in line]
    # stderr is no terminal here: a line after the first batch and one at the end (a terminal gets a tqdm bar)
    assert len(shown) == 2, runs["ours"].stderr[-3000:]
    assert shown[0].startswith("onmt_translate: 1/3 sentences (33%), ") and "elapsed, about " in shown[0]
    assert shown[1].startswith("onmt_translate: 3/3 sentences (100%), ") and shown[1].endswith("left")
    assert " sentences (" not in runs["stock"].stderr + runs["stock"].stdout + runs["ours"].stdout
    assert (tmp_path / "ours").read_bytes() == (tmp_path / "stock").read_bytes()
    assert len((tmp_path / "ours").read_text(encoding="utf-8").splitlines()) == 3
    assert "trained on" not in runs["ours"].stderr  # no line is longer than training's 100 tokens


def test_lines_longer_than_training_get_one_warning(sample_data, onmt_active, tmp_path):
    """Issue 58: a 2,000-token line, 20 times the model's -src_seq_length 100 (filtertoolong), is named in one
    warning at the end, with how many lines are long; every line is still translated."""
    model = _stock_checkpoint(tmp_path / "stock.pt")
    src = tmp_path / "src"
    src.write_text("▁我 ▁很 ▁好 。\n" + "▁我 " * 1999 + "。\n" + "▁你 " * 150 + "。\n", encoding="utf-8")
    run = support.run_cli("onmt_translate", "-model", model, "-src", src, "-output", tmp_path / "hyp",
                          "-max_length", 4, "-batch_size", 2, "-batch_type", "sents", env=support.cli_env())
    warnings = [line for line in run.stderr.splitlines() if "trained on" in line]
    assert len(warnings) == 1, run.stderr[-3000:]
    assert (f"-src {src}: 2 of 3 lines are longer than any source {model} was trained on (its filtertoolong kept "
            "-src_seq_length 100 tokens); the longest, line 2, has 2000 tokens." in warnings[0])
    assert "WARNING" in warnings[0] and "split such lines" in warnings[0] and "Traceback" not in run.stderr
    assert len((tmp_path / "hyp").read_text(encoding="utf-8").splitlines()) == 3
