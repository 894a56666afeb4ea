"""Checkpoint and command-line surprises through the real console scripts (issue 39, items 4 and 5).

Each test replays one fault: a resumed run that trains nothing or overwrites later checkpoints, li2019
fine-tuned from a baseline, a repeated option, ``onmt_build_vocab`` rerun, ``onmt_average_models`` mistakes,
and ``ONMT_EXT_DISABLE=1`` with a stock checkpoint.  The checkpoints are built in this process from the toy
smoke configs (no training), so every check runs before ``onmt_train`` would train; only the last test,
which trains, is slow.
"""

import pytest
import torch

import support

CONFIG = "yaml_configs/smoke/foundation/ext_transformer.yaml"
STOCK = "yaml_configs/smoke/baseline/transformer_base_wmt14_ende.yaml"


_one_error_line = support.one_error_line


def _checkpoint(path, config=CONFIG, *overrides, step=None, seed=0):
    """Save the untrained model of ``config`` as onmt_train does (with the optimiser state of ``step``)."""
    from onmt.inputters.inputter import vocabs_to_dict
    from onmt.utils.optimizers import Optimizer

    opt = support.load_train_opts(config, *overrides)
    opt._all_transform = set(opt.transforms)  # as onmt_train's data checks record them
    vocabs = support.load_vocabs(opt)
    model = support.build_model(opt, vocabs, seed=seed)
    optim = Optimizer.from_opt(model, opt)
    if step is not None:
        optim._training_step = optim._decay_step = step + 1  # OpenNMT-py stores the next step
    state = model.state_dict()
    torch.save({"model": {k: v for k, v in state.items() if "generator" not in k},
                "generator": model.generator.state_dict(), "vocab": vocabs_to_dict(vocabs), "opt": opt,
                "optim": optim.state_dict()}, path)
    return path


def _train(out, *extra):
    return support.run_cli("onmt_train", "-config", CONFIG, "-save_data", out / "samples", "-save_model",
                           out / "model", "-save_checkpoint_steps", 2, "-valid_steps", 100, "-report_every", 1,
                           *extra, check=False)


@pytest.fixture(scope="module")
def step_20(sample_data, onmt_active, tmp_path_factory):
    """A run's directory holding model_step_20.pt (the checkpoint to resume) and model_step_40/60.pt."""
    out = tmp_path_factory.mktemp("run")
    for step in (20, 40, 60):
        _checkpoint(out / f"model_step_{step}.pt", step=step, seed=step)
    return out


def test_a_resumed_run_never_overwrites_later_checkpoints(step_20, tmp_path):
    later = {step: (step_20 / f"model_step_{step}.pt").read_bytes() for step in (40, 60)}
    result = _train(step_20, "-train_from", step_20 / "model_step_20.pt", "-train_steps", 42)
    line = _one_error_line(result, "onmt_train", 2)
    assert f"-save_model {step_20 / 'model'}: holds checkpoints of step 21 or later" in line
    assert str(step_20 / "model_step_40.pt") in line and "-overwrite_checkpoints" in line
    assert all((step_20 / f"model_step_{step}.pt").read_bytes() == data for step, data in later.items())
    # fine-tuning (-reset_optim all) restarts at step 1: the run's own checkpoints are in the way too
    result = _train(step_20, "-train_from", step_20 / "model_step_20.pt", "-train_steps", 2,
                    "-reset_optim", "all")
    assert "holds checkpoints of step 1 or later" in _one_error_line(result, "onmt_train", 2)


def test_train_steps_at_or_below_the_checkpoints_step_is_refused(step_20, tmp_path):
    for steps in (10, 20):
        result = _train(tmp_path, "-train_from", step_20 / "model_step_20.pt", "-train_steps", steps)
        line = _one_error_line(result, "onmt_train", 2)
        assert line == (f"onmt_train: error: -train_steps {steps}: at or below the step of -train_from "
                        f"{step_20 / 'model_step_20.pt'} (20); a resumed run counts on from it, so give the total "
                        "(above 20), or -reset_optim all to fine-tune from step 1")
        assert not list(tmp_path.glob("model_step_*.pt"))


def test_fine_tuning_with_another_option_value_names_the_checkpoints_value(sample_data, onmt_active, tmp_path):
    """Issue 58: -li2019_iterations 5 on a checkpoint of 3 (the default) was "has none of -li2019_iterations 5"; the
    line gives the checkpoint's value and says that -reset_optim all restarts the step count at 1."""
    model = _checkpoint(tmp_path / "li.pt", CONFIG, "-li2019_enc_self", "em", step=4)
    result = _train(tmp_path, "-train_from", model, "-li2019_enc_self", "em", "-li2019_iterations", 5,
                    "-train_steps", 6)
    assert _one_error_line(result, "onmt_train", 2) == (
        f"onmt_train: error: -train_from {model}: the checkpoint was trained without -li2019_iterations 5 "
        "(checkpoint: 3); to fine-tune it with them add --override_opts -reset_optim all (the step count then "
        "restarts at 1, and -train_steps counts the fine-tuning steps), or drop them to resume the checkpoint's "
        "model")
    assert not list(tmp_path.glob("model_step_*.pt"))


def test_li2019_from_a_baseline_says_why_in_one_line(sample_data, onmt_active, tmp_path):
    base = _checkpoint(tmp_path / "base.pt", step=4)
    result = _train(tmp_path, "-train_from", base, "--override_opts", "-reset_optim", "all",
                    "-li2019_enc_self", "em", "-train_steps", 2)
    line = _one_error_line(result, "onmt_train", 1)
    assert "li2019's routing aggregation" in line and "final_linear" in line and "from scratch" in line
    assert "encoder.transformer.0.self_attn.final_linear.weight" in line and "another version" not in line
    assert "new tensors of onmt-ext mechanisms initialised" not in result.stdout + result.stderr
    assert not list(tmp_path.glob("model_step_*.pt"))


def test_clause_attention_from_a_baseline_names_the_vocabularies(sample_data, onmt_active, tmp_path):
    base = _checkpoint(tmp_path / "base.pt", step=4)
    result = _train(tmp_path, "-train_from", base, "--override_opts", "-reset_optim", "all", "-clause_attention",
                    "true", "-transforms", "sentencepiece", "clause_split", "filtertoolong", "-train_steps", 2)
    line = _one_error_line(result, "onmt_train", 1)
    words = torch.load(base)["model"]["encoder.embeddings.make_embedding.emb_luts.0.weight"].shape[0]
    assert f"the vocabularies differ from the checkpoint's (source: {words} words in the checkpoint, " in line
    assert "clause_split adds its clause markers" in line and "another version" not in line


def test_a_repeated_command_line_option_stops_the_command(sample_data, onmt_active, tmp_path):
    result = _train(tmp_path, "-train_steps", 2, "--train_steps=1")
    assert _one_error_line(result, "onmt_train", 2) == (
        "onmt_train: error: -train_steps is given 2 times on the command line (-train_steps 2, --train_steps 1); "
        "argparse would keep the last value silently: keep one")
    assert not list(tmp_path.glob("model_step_*.pt"))
    model = _checkpoint(tmp_path / "m.pt")
    (tmp_path / "src").write_text("▁我 ▁很 ▁好 。\n", encoding="utf-8")
    result = support.run_cli("onmt_translate", "-model", model, "-src", tmp_path / "src", "-output",
                             tmp_path / "hyp", "-beam_size", 2, "-beam_size", 3, check=False)
    assert "-beam_size is given 2 times" in _one_error_line(result, "onmt_translate", 2)
    assert not (tmp_path / "hyp").exists()


def test_build_vocab_rerun_without_overwrite_gets_one_line(sample_data, onmt_active, tmp_path):
    args = ("-config", CONFIG, "-save_data", tmp_path / "samples", "-n_sample", 50,
            "-src_vocab", tmp_path / "vocab.src", "-tgt_vocab", tmp_path / "vocab.tgt")
    support.run_cli("onmt_build_vocab", *args)
    (tmp_path / "vocab.src").write_text("mine\t1\n", encoding="utf-8")
    result = support.run_cli("onmt_build_vocab", *args, check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("onmt_build_vocab: error: ")]
    assert lines == [f"onmt_build_vocab: error: -{key} {tmp_path / ('vocab.' + key[:3])}: exists; pass -overwrite "
                     "to replace it, or choose another path" for key in ("src_vocab", "tgt_vocab")]
    assert (tmp_path / "vocab.src").read_text(encoding="utf-8") == "mine\t1\n"
    support.run_cli("onmt_build_vocab", *args, "-overwrite")
    assert (tmp_path / "vocab.src").read_text(encoding="utf-8") != "mine\t1\n"


def test_build_vocab_refuses_a_sample_without_tokens(sample_data, onmt_active, tmp_path):
    """Filters that leave out every pair gave empty vocabularies and exit 0 (onmt_train refused them later)."""
    args = ("-config", STOCK, "-save_data", tmp_path / "samples", "-n_sample", 50,
            "-src_vocab", tmp_path / "vocab.src", "-tgt_vocab", tmp_path / "vocab.tgt")
    result = support.run_cli("onmt_build_vocab", *args, "-src_seq_length", 1, "-tgt_seq_length", 1, check=False)
    assert _one_error_line(result, "onmt_build_vocab", 2).startswith(
        "onmt_build_vocab: error: no source and no target token was counted in the sample (-n_sample 50): every "
        "pair was left out by the transforms (-transforms: sentencepiece, filtertoolong;")
    assert not (tmp_path / "vocab.src").exists() and not (tmp_path / "vocab.tgt").exists()
    support.run_cli("onmt_build_vocab", *args)  # the same sample with the config's filters: counted and written
    assert (tmp_path / "vocab.src").stat().st_size > 0


def test_average_models_mistakes_get_one_line(sample_data, onmt_active, tmp_path):
    first, second = _checkpoint(tmp_path / "a.pt", step=2), _checkpoint(tmp_path / "b.pt", step=4, seed=1)
    gret = _checkpoint(tmp_path / "gret.pt", CONFIG, "-gret", "true", step=4)
    wider = _checkpoint(tmp_path / "wider.pt", CONFIG, "-transformer_ff", 96, step=4)
    (tmp_path / "text.pt").write_text("not a checkpoint\n", encoding="utf-8")
    out = tmp_path / "avg.pt"

    def average(*models):
        return support.run_cli("onmt_average_models", "-models", *models, "-output", out, check=False)

    assert _one_error_line(average(first, tmp_path / "none.pt"), "onmt_average_models", 2) == \
        f"onmt_average_models: error: -models {tmp_path / 'none.pt'}: no such checkpoint file"
    # files that exist but cannot be averaged: a run-time failure, exit 1 (docs/troubleshooting.md, "Exit status")
    for other, shown in ((gret, "-gret True (in "), (wider, "-transformer_ff 96 (in ")):
        for models in ((first, other), (other, first)):  # stock: a KeyError one way, silent the other
            line = _one_error_line(average(*models), "onmt_average_models", 1)
            assert f"-models {models[1]}: another model than {models[0]}" in line and "one run" in line
        assert shown in _one_error_line(average(first, other), "onmt_average_models", 1)
    line = _one_error_line(average(first, tmp_path / "text.pt"), "onmt_average_models", 1)
    assert f"-models {tmp_path / 'text.pt'}: not an OpenNMT-py checkpoint" in line
    assert not out.exists()
    support.run_cli("onmt_average_models", "-models", first, second, "-output", out)
    averaged, a, b = torch.load(out), torch.load(first), torch.load(second)
    for part in ("model", "generator"):  # stock: the tied target embeddings and generator weight a/4 + 3b/4
        assert all(torch.allclose(averaged[part][k], (a[part][k] + b[part][k]) / 2) for k in a[part]), part
    assert averaged["optim"] is None and averaged["opt"].transformer_ff == a["opt"].transformer_ff


def test_disabled_extension_still_loads_a_stock_checkpoint(sample_data, onmt_active, tmp_path):
    model = _checkpoint(tmp_path / "stock.pt", STOCK, step=2)
    (tmp_path / "src").write_text("▁我 ▁很 ▁好 。\n", encoding="utf-8")
    result = support.run_cli("onmt_translate", "-model", model, "-src", tmp_path / "src", "-output",
                             tmp_path / "hyp", "-max_length", 4, env=support.cli_env(ONMT_EXT_DISABLE="1"))
    assert len((tmp_path / "hyp").read_text(encoding="utf-8").splitlines()) == 1, result.stderr[-3000:]
    # nothing but the torch.load allow-list is applied: no onmt-ext option exists, no option check runs
    result = support.run_cli("onmt_translate", "-model", model, "-src", tmp_path / "src", "-output",
                             tmp_path / "hyp2", "-ext_compile", env=support.cli_env(ONMT_EXT_DISABLE="1"),
                             check=False)
    assert result.returncode != 0 and "unrecognized arguments: -ext_compile" in result.stderr
    status = support.run_cli("python", "-c", "import onmt, onmt_ext.patches as p, onmt_ext.integration.plugin as q; "
                             "print(q.is_active(), [x.target for x in p.applied()])",
                             env=support.cli_env(ONMT_EXT_DISABLE="1"))
    assert status.stdout.strip() == ("False ['torch.serialization safe globals (argparse.Namespace)', "
                                     "'sys.excepthook (a model of onmt-ext while ONMT_EXT_DISABLE is set)']")


def test_disabled_extension_names_itself_for_its_own_model(sample_data, onmt_active, tmp_path):
    """Issue 58: ONMT_EXT_DISABLE=1 with a checkpoint (or config) of ext_transformer ended in a traceback ending in
    KeyError: 'ext_transformer'; one line names the checkpoint, its model type and the variable, exit 1."""
    model = _checkpoint(tmp_path / "ext.pt", step=2)
    (tmp_path / "src").write_text("▁我 ▁很 ▁好 。\n", encoding="utf-8")
    off = support.cli_env(ONMT_EXT_DISABLE="1")
    result = support.run_cli("onmt_translate", "-model", model, "-src", tmp_path / "src", "-output", tmp_path / "hyp",
                             env=off, check=False)
    assert _one_error_line(result, "onmt_translate", 1) == (
        f"onmt_translate: error: checkpoint {model} needs onmt-ext: it was trained with -encoder_type "
        "ext_transformer, onmt-ext's model, and ONMT_EXT_DISABLE=1 switches onmt-ext off; unset ONMT_EXT_DISABLE to "
        "load it")
    assert "KeyError" not in result.stderr
    # any other error is printed as before: the hook passes it on
    result = support.run_cli("python", "-c", "import onmt; raise KeyError('ext_transformer')", env=off, check=False)
    assert result.returncode == 1 and "Traceback" in result.stderr and "needs onmt-ext" not in result.stderr


@pytest.mark.slow
def test_resuming_from_the_last_checkpoint_and_overwriting_on_request_work(sample_data, onmt_active, tmp_path):
    """No false alarm: a real run resumed from its last checkpoint, or over later ones with the flag."""
    assert _train(tmp_path, "-train_steps", 4, "-keep_checkpoint", -1).returncode == 0
    four = (tmp_path / "model_step_4.pt").read_bytes()
    resumed = _train(tmp_path, "-train_from", tmp_path / "model_step_4.pt", "-train_steps", 6)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    refused = _train(tmp_path, "-train_from", tmp_path / "model_step_2.pt", "-train_steps", 4)
    assert "would overwrite" in _one_error_line(refused, "onmt_train", 2)
    assert (tmp_path / "model_step_4.pt").read_bytes() == four
    again = _train(tmp_path, "-train_from", tmp_path / "model_step_2.pt", "-train_steps", 4,
                   "-overwrite_checkpoints")
    assert again.returncode == 0, again.stderr[-3000:]
    assert (tmp_path / "model_step_4.pt").read_bytes() != four
    # a stock model trained with the extension off translates with it off
    off = support.cli_env(ONMT_EXT_DISABLE="1")
    support.run_cli("onmt_train", "-config", STOCK, "-save_data", tmp_path / "s", "-save_model", tmp_path / "stock",
                    "-train_steps", 2, "-save_checkpoint_steps", 2, "-valid_steps", 100, env=off)
    (tmp_path / "src").write_text("▁我 ▁很 ▁好 。\n", encoding="utf-8")
    support.run_cli("onmt_translate", "-model", tmp_path / "stock_step_2.pt", "-src", tmp_path / "src", "-output",
                    tmp_path / "hyp", "-max_length", 4, env=off)
    assert len((tmp_path / "hyp").read_text(encoding="utf-8").splitlines()) == 1
