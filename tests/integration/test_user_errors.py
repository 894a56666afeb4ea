"""Mistakes a new user makes, through the real console scripts: each ends in one line ``<command>: error: ...``.

Usage errors (an option or a path that names nothing) exit 2, run-time errors exit 1.  The trainings are the toy
``ext_transformer`` smoke config for two steps.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import support

CONFIG = "yaml_configs/smoke/foundation/ext_transformer.yaml"
SPM = ("-transforms", "sentencepiece", "-src_subword_model", support.TATOEBA / "spm.zh.model",
       "-tgt_subword_model", support.TATOEBA / "spm.en.model")


_one_error_line = support.one_error_line


def _train(out, *extra, check=True, env=None, steps=2):
    return support.run_cli("onmt_train", "-config", CONFIG, "-save_data", out / "samples", "-save_model",
                           out / "model", "-train_steps", steps, "-save_checkpoint_steps", 2, "-valid_steps", 100,
                           "-report_every", 1, *extra, check=check, env=env)


@pytest.fixture(scope="module")
def trained(sample_data, onmt_active, tmp_path_factory):
    """A toy model trained for two steps; its directory."""
    out = tmp_path_factory.mktemp("trained")
    _train(out)
    return out


def _source(tmp_path, lines=2):
    src = tmp_path / "src.zh"
    src.write_text("\n".join((support.TATOEBA / "test.zh").read_text(encoding="utf-8").splitlines()[:lines]) + "\n",
                   encoding="utf-8")
    return src


# 1, 2 ---------------------------------------------------------------- GPU options on a torch without CUDA


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where torch sees no CUDA device")
def test_gpu_options_without_cuda_are_refused_in_one_line(trained, tmp_path):
    result = support.run_cli("onmt_translate", "-model", trained / "model_step_2.pt", "-src", _source(tmp_path),
                             "-output", tmp_path / "hyp", "-gpu", 0, check=False)
    line = _one_error_line(result, "onmt_translate", 1)
    assert line.startswith("onmt_translate: error: -gpu 0: this torch (") and "has no CUDA" in line
    # a command that runs from where the user is (run_cli runs in the checkout, with its .venv)
    assert 'install a CUDA build of torch: make setup TORCH="torch==<version> --index-url <your CUDA index>" ' \
        "FORCE=1 (SYSTEM_TORCH=1 in place of TORCH=" in line and "do not fit" not in result.stderr
    assert not (tmp_path / "hyp").exists()
    result = _train(tmp_path, "-gpu_ranks", 0, check=False)
    line = _one_error_line(result, "onmt_train", 1)
    assert line.startswith("onmt_train: error: -gpu_ranks 0: this torch (") and "_cuda_setDevice" not in result.stderr


# 3 ------------------------------------------------------------------ tensorboard: true


def test_tensorboard_writes_event_files_and_corpus_warnings_are_printed_once(sample_data, onmt_active, tmp_path):
    """Also: a corpus warning is printed once per run, not once per pass over the corpus (epoch) or check."""
    data = tmp_path / "data"
    data.mkdir()
    zh = (support.TATOEBA / "train.zh").read_text(encoding="utf-8").splitlines()[:30]
    en = (support.TATOEBA / "train.en").read_text(encoding="utf-8").splitlines()[:30]
    zh[5] = ""  # an empty source line: a warning naming the file
    (data / "train.zh").write_text("\ufeff" + "\n".join(zh) + "\n", encoding="utf-8")  # and a byte-order mark
    (data / "train.en").write_text("\n".join(en) + "\n", encoding="utf-8")
    corpora = (f"{{corpus_1: {{path_src: {data / 'train.zh'}, path_tgt: {data / 'train.en'}}}, "
               f"valid: {{path_src: {support.TATOEBA / 'valid.zh'}, path_tgt: {support.TATOEBA / 'valid.en'}}}}}")
    config = tmp_path / "tensorboard.yaml"  # as a user writes it
    config.write_text((support.REPO / CONFIG).read_text(encoding="utf-8") + "tensorboard: true\n"
                      f"tensorboard_log_dir: {tmp_path / 'runs'}\n", encoding="utf-8")
    result = support.run_cli("onmt_train", "-config", config, "-save_data", tmp_path / "samples", "-save_model",
                             tmp_path / "model", "-train_steps", 6, "-valid_steps", 100, "-report_every", 1,
                             "-save_checkpoint_steps", 6, "-data", corpora)  # 30 pairs: several passes over them
    events = list((tmp_path / "runs").rglob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    log = result.stdout + result.stderr
    assert log.count(f"{data / 'train.zh'} has 1 empty line (line 6)") == 1, log[-3000:]
    assert log.count("byte-order mark at the start of") == 1, log[-3000:]


# 4 ------------------------------------------------------------------ an empty -src


def test_an_empty_source_file_is_named_and_no_output_is_created(trained, tmp_path):
    (tmp_path / "empty.zh").write_text("", encoding="utf-8")
    result = support.run_cli("onmt_translate", "-model", trained / "model_step_2.pt", "-src", tmp_path / "empty.zh",
                             "-output", tmp_path / "hyp", check=False)
    line = _one_error_line(result, "onmt_translate", 1)
    assert f"-src {tmp_path / 'empty.zh'}: the file is empty" in line
    assert "UnboundLocalError" not in result.stderr and not (tmp_path / "hyp").exists()


# issue 58 ------------------------------------------------------------ -output in a directory that does not exist


def test_an_output_in_a_missing_directory_is_refused_before_the_model_is_read(sample_data, onmt_active, tmp_path):
    """Stock: the model is loaded, then a 30-line traceback ending in FileNotFoundError.  onmt-ext creates no
    directory (a misspelt path would get a tree of its own): one line, exit 2, before the model is read (it
    is no checkpoint here: read, it would be refused)."""
    never_read = tmp_path / "never_read.pt"
    never_read.write_bytes(b"not a checkpoint")
    for output, message in (
            (tmp_path / "out" / "hyp.en", f"directory {tmp_path / 'out'} does not exist; create it first"),
            (tmp_path, "is a directory; give the path of a file in it"),
            (_source(tmp_path) / "hyp.en", f"{tmp_path / 'src.zh'} is not a directory")):
        result = support.run_cli("onmt_translate", "-model", never_read, "-src", _source(tmp_path), "-output", output,
                                 check=False)
        assert _one_error_line(result, "onmt_translate", 2) == f"onmt_translate: error: -output {output}: {message}"
    assert not (tmp_path / "out").exists()


# 5 ------------------------------------------------------------------ -model that is no checkpoint


def test_a_model_file_that_is_no_checkpoint_is_named(sample_data, onmt_active, tmp_path):
    fake = tmp_path / "notes.pt"
    fake.write_text("these are my notes, not a model\n", encoding="utf-8")
    result = support.run_cli("onmt_translate", "-model", fake, "-src", _source(tmp_path), "-output",
                             tmp_path / "hyp", check=False)
    line = _one_error_line(result, "onmt_translate", 1)
    assert line.startswith(f"onmt_translate: error: {fake} is not an OpenNMT-py checkpoint")
    assert "weights_only" not in result.stderr
    result = support.run_cli("onmt_translate", "-model", tmp_path / "missing.pt", "-src", _source(tmp_path),
                             "-output", tmp_path / "hyp", check=False)
    said = _one_error_line(result, "onmt_translate", 2)
    assert said == f"onmt_translate: error: -model {tmp_path / 'missing.pt'}: no such checkpoint file"
    result = support.run_cli("onmt_translate", "-model", tmp_path, "-src", _source(tmp_path), "-output",
                             tmp_path / "hyp", check=False)  # a directory: named with its option, as by onmt_train
    said = _one_error_line(result, "onmt_translate", 2)
    assert said == f"onmt_translate: error: -model {tmp_path}: is a directory, not a checkpoint file"
    result = support.run_cli("onmt_train", "-config", CONFIG, "-train_from", tmp_path, "-save_model",
                             tmp_path / "run" / "model", check=False)
    said = _one_error_line(result, "onmt_train", 2)
    assert said == f"onmt_train: error: -train_from {tmp_path}: is a directory, not a checkpoint file"


# 6 ------------------------------------------------------------------ misspelled vocabulary path


def test_a_missing_vocabulary_is_named_in_one_line(sample_data, onmt_active, tmp_path):
    result = _train(tmp_path, "-src_vocab", "build/tatoeba/vocab.zhh", check=False)
    line = _one_error_line(result, "onmt_train", 2)
    assert line.startswith("onmt_train: error: -src_vocab build/tatoeba/vocab.zhh: no such file")


# 7 ------------------------------------------------------------------ Ctrl-C


def test_ctrl_c_names_the_last_checkpoint_and_the_resume_command(sample_data, onmt_active, tmp_path):
    argv = [str(support.BIN / "onmt_train"), "-config", CONFIG, "-save_data", str(tmp_path / "samples"),
            "-save_model", str(tmp_path / "model"), "-train_steps", "100000", "-save_checkpoint_steps", "2",
            "-valid_steps", "100000", "-report_every", "1"]
    # output to files, not pipes: nobody reads a pipe while it trains, and a full pipe would block onmt_train
    with open(tmp_path / "stdout", "w") as stdout, open(tmp_path / "stderr", "w") as stderr:
        # Ctrl-C's default action in the child: a test run started in the background (`make test-all &`) ignores
        # SIGINT, and the child would inherit that and train on
        process = subprocess.Popen(argv, cwd=support.REPO, env=support.cli_env(), stdout=stdout, stderr=stderr,
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 600  # generous: on a loaded 2-core machine start-up alone can take minutes
        # any checkpoint: with -keep_checkpoint the first ones are deleted again within a fraction of a second
        while not list(tmp_path.glob("model_step_*.pt")) and time.time() < deadline and process.poll() is None:
            time.sleep(0.5)
        if process.poll() is not None:
            pytest.fail(f"onmt_train exited {process.returncode} before its first checkpoint:\n"
                        f"{(tmp_path / 'stderr').read_text()[-3000:]}")
        assert list(tmp_path.glob("model_step_*.pt")), "no checkpoint within 600 s"
        time.sleep(1)  # let a save in progress finish renaming
        process.send_signal(signal.SIGINT)
        process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    err = (tmp_path / "stderr").read_text()
    assert process.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("onmt_train: error: ")]
    assert len(errors) == 1, err[-3000:]
    assert "interrupted; the last checkpoint is " + str(tmp_path / "model_step_") in errors[0]
    assert "resume with: onmt_train -config " in errors[0] and errors[0].split(" -train_from ")[-1].endswith(".pt")


# 8 ------------------------------------------------------------------ -train_from with other options


def test_train_from_with_other_architecture_options_is_refused(trained, tmp_path):
    result = _train(tmp_path, "-train_from", trained / "model_step_2.pt", "-hidden_size", 64, "-word_vec_size",
                    64, "-heads", 2, steps=4, check=False)
    line = _one_error_line(result, "onmt_train", 2)
    assert "-hidden_size 64 (checkpoint: 32)" in line and "-heads 2 (checkpoint: 4)" in line
    assert "-word_vec_size 64 (checkpoint: 32)" in line
    assert not list(tmp_path.glob("model_step_*.pt"))
    # adding GRET to a checkpoint without it (the paper's fine-tuning) needs --override_opts; it is logged
    result = _train(tmp_path, "-train_from", trained / "model_step_2.pt", "-gret", "true", steps=4,
                    check=False)
    line = _one_error_line(result, "onmt_train", 2)
    assert "the checkpoint was trained without -gret True (checkpoint: False)" in line
    assert "--override_opts -reset_optim all (the step count then restarts at 1" in line
    result = _train(tmp_path, "-train_from", trained / "model_step_2.pt", "-gret", "true",
                    "--override_opts", "-reset_optim", "all", steps=2)
    log = result.stdout + result.stderr
    assert "fine-tuning the checkpoint's model with -gret True (checkpoint: False)" in log
    assert ("-reset_optim all: the step count restarts at 1 (the checkpoint is of step 2); -train_steps 2 counts "
            "the steps of this run") in log


# 9 ------------------------------------------------------------------ abbreviations


def test_abbreviated_options_are_refused_with_a_suggestion(trained, tmp_path):
    result = support.run_cli("onmt_translate", "-model", trained / "model_step_2.pt", "-src", _source(tmp_path),
                             "-output", tmp_path / "hyp", "-beam", 2, check=False)
    assert _one_error_line(result, "onmt_translate", 2) == \
        "onmt_translate: error: unknown option 'beam' on the command line; did you mean 'beam_size'?"
    result = _train(tmp_path, "-train_step", 2, check=False)
    assert _one_error_line(result, "onmt_train", 2) == \
        "onmt_train: error: unknown option 'train_step' on the command line; did you mean 'train_steps'?"


# issue 39 ----------------------------------------------------------- usage errors: one line, the config's line


def test_a_missing_src_and_a_bad_config_value_are_one_line(sample_data, onmt_active, tmp_path):
    """No -src: one line, not about 100 lines of usage first; a value outside the choices in a YAML config: the
    file and the line."""
    result = support.run_cli("onmt_translate", "-model", tmp_path / "m.pt", check=False)
    assert result.stderr.splitlines() == [
        "onmt_translate: error: the following arguments are required: --src/-src"], result.stderr[-3000:]
    config = tmp_path / "bad.yaml"
    text = (support.REPO / CONFIG).read_text(encoding="utf-8")
    config.write_text(text + "li2019_enc_self: bogus\n", encoding="utf-8")
    result = support.run_cli("onmt_train", "-config", config, "-save_model", tmp_path / "m", "-save_data",
                             tmp_path / "s", check=False)
    assert _one_error_line(result, "onmt_train", 2) == (
        f"onmt_train: error: key 'li2019_enc_self' in {config}, line {len(text.splitlines()) + 1}: invalid choice: "
        "'bogus' (choose from 'concat', 'simple', 'em')")
    assert len(result.stderr.splitlines()) == 1, result.stderr[-3000:]


def test_a_training_config_given_to_onmt_translate_is_one_line(sample_data, onmt_active, tmp_path):
    """Each training key of the config was an unknown option of its own line: 39 lines for the toy config."""
    result = support.run_cli("onmt_translate", "-config", CONFIG, "-model", tmp_path / "m.pt", "-src",
                             tmp_path / "s", check=False)
    assert _one_error_line(result, "onmt_translate", 2) == (
        f"onmt_translate: error: -config {CONFIG} is a training config (it sets save_model, data, train_steps): "
        "this command takes its own options (-model, -src, -output, the search); give them on the command line or "
        "in a config of their own")
    assert len(result.stderr.splitlines()) == 1, result.stderr[-3000:]


def test_a_wrong_routing_kernel_choice_is_one_line(sample_data, onmt_active, tmp_path):
    """``ONMT_EXT_ROUTING_KERNEL`` (docs/kernels.md) with a value it cannot take stops the command before it
    starts, naming the variable and its values, instead of a traceback from the first routing call."""
    env = support.cli_env(ONMT_EXT_ROUTING_KERNEL="gpu")
    result = support.run_cli("onmt_translate", "-model", tmp_path / "m.pt", "-src", tmp_path / "s", check=False,
                             env=env)
    assert _one_error_line(result, "onmt_translate", 2) == (
        "onmt_translate: error: ONMT_EXT_ROUTING_KERNEL='gpu' is not one of auto, torch, triton; unset it (auto) or "
        "set one of those (docs/kernels.md)")


# 10 ----------------------------------------------------------------- a YAML key twice


def test_a_yaml_key_set_twice_is_named_with_both_lines(sample_data, onmt_active, tmp_path):
    config = tmp_path / "twice.yaml"
    text = (support.REPO / CONFIG).read_text(encoding="utf-8")
    config.write_text(text + "hidden_size: 64\n", encoding="utf-8")
    first = next(i for i, line in enumerate(text.splitlines(), 1) if line.startswith("hidden_size:"))
    last = len(text.splitlines()) + 1
    result = support.run_cli("onmt_train", "-config", config, "-save_model", tmp_path / "m", "-save_data",
                             tmp_path / "s", check=False)
    assert _one_error_line(result, "onmt_train", 2).startswith(
        f"onmt_train: error: key 'hidden_size' is set 2 times in {config}, lines {first} and {last}")


def test_a_config_indented_with_a_tab_names_the_file_and_line(sample_data, onmt_active, tmp_path):
    """Issue 58: PyYAML's parse error gave a line and column but no hint; a tab in the indentation is named."""
    config = tmp_path / "my.yaml"
    text = (support.REPO / CONFIG).read_text(encoding="utf-8")
    lines = text.splitlines()
    nested = next(i for i, line in enumerate(lines) if line.startswith("  ") and line.strip())
    lines[nested] = "\t" + lines[nested].lstrip(" ")
    config.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = support.run_cli("onmt_train", "-config", config, "-save_model", tmp_path / "m", "-save_data",
                             tmp_path / "s", check=False)
    line = _one_error_line(result, "onmt_train", 2)
    assert line.startswith("onmt_train: error: Couldn't parse config file: ")
    assert line.endswith(f"; {config}, line {nested + 1} is indented with a tab: YAML allows only spaces for "
                         "indentation (replace the tab with spaces)")
    config.write_text(text + "src_vocab: [unclosed\n", encoding="utf-8")  # no tab: no hint
    result = support.run_cli("onmt_train", "-config", config, "-save_model", tmp_path / "m", "-save_data",
                             tmp_path / "s", check=False)
    assert "indented with a tab" not in _one_error_line(result, "onmt_train", 2)


# 11 ----------------------------------------------------------------- evaluate.py --refs with a TSV


def test_evaluate_points_a_tsv_given_to_refs_to_ref_tsv(tmp_path):
    (tmp_path / "hyp").write_text("a b c\nd e f\n", encoding="utf-8")
    (tmp_path / "refs.tsv").write_text("源 一\ta b c\tx y\n源 二\td e f\n", encoding="utf-8")
    result = subprocess.run([sys.executable, "-m", "tools.evaluate", "--hyp", tmp_path / "hyp", "--refs",
                             tmp_path / "refs.tsv"], cwd=support.REPO, capture_output=True, text=True, timeout=120)
    line = _one_error_line(result, "evaluate.py", 2)
    assert f"{tmp_path / 'refs.tsv'}" in line and "--ref-tsv" in line and "tab" in line


# 12 ----------------------------------------------------------------- every translation empty: unit test in
# tests/unit/test_plugin.py (test_all_empty_translations_give_a_warning); no model reliably writes only empty lines


# 13 ----------------------------------------------------------------- save_model with another run's checkpoints


def test_training_into_another_runs_checkpoints_is_refused(trained, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "model_step_2.pt").write_bytes((trained / "model_step_2.pt").read_bytes())
    before = (out / "model_step_2.pt").stat().st_mtime_ns
    result = _train(out, check=False)
    line = _one_error_line(result, "onmt_train", 2)
    assert f"-save_model {out / 'model'}: holds checkpoints of another run ({out / 'model_step_2.pt'})" in line
    assert f"-train_from {out / 'model_step_2.pt'}" in line and "-overwrite_checkpoints" in line
    assert (out / "model_step_2.pt").stat().st_mtime_ns == before
    _train(out, "-overwrite_checkpoints")
    assert (out / "model_step_2.pt").stat().st_mtime_ns != before


def test_an_adam_eps_that_no_optimiser_reads_is_refused_in_one_line(sample_data, onmt_active, tmp_path):
    result = _train(tmp_path, "-optim", "sgd", "-adam_eps", "1e-9", check=False)
    assert _one_error_line(result, "onmt_train", 2) == (
        "onmt_train: error: -adam_eps 1e-09: only -optim adam reads it (this run: -optim sgd)")


# optional packages ----------------------------------------------------------------------------------------------

_HIDE = """
import importlib.abc, sys

class _Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("spacy", "fasttext"):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test)", name=name)
        return None

sys.meta_path.insert(0, _Refuse())
"""


def test_onmt_works_without_spacy_and_fasttext(sample_data, onmt_active, tmp_path):
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(textwrap.dedent(_HIDE), encoding="utf-8")
    env = support.cli_env(PYTHONPATH=os.pathsep.join([str(hide), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    code = textwrap.dedent("""
        import sys
        import onmt
        from onmt.transforms import AVAILABLE_TRANSFORMS
        from onmt_ext.integration import plugin
        assert plugin.is_active()
        assert "terminology" in AVAILABLE_TRANSFORMS and "clean" in AVAILABLE_TRANSFORMS
        assert "spacy" not in sys.modules and "fasttext" not in sys.modules  # the stand-ins are gone
        for name in ("spacy", "fasttext"):
            try:
                __import__(name)
            except ImportError:
                print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", code], cwd=support.REPO, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0 and result.stdout.split() == ["ok", "ok"], result.stderr[-3000:]
    for transform, message, pip in (("terminology", "the terminology transform needs spaCy (", "spacy=="),
                                    ("clean", "the clean transform needs fasttext (", "fasttext-wheel==")):
        result = _train(tmp_path, "-transforms", "sentencepiece", transform, check=False, env=env)
        line = _one_error_line(result, "onmt_train", 1)
        # pip of the very Python that runs onmt-ext, which works from any folder
        assert line.startswith(f"onmt_train: error: {message}") and f"/bin/python -m pip install {pip}" in line


def test_clause_split_option_checks_exit_by_the_convention(sample_data, onmt_active, tmp_path):
    """docs/troubleshooting.md's exit status: a -clause_levels out of range and a -clause_tagger_model that names no
    file are usage errors (2); a tagger file that cannot be read is a run-time failure (1)."""
    config = tmp_path / "clause.yaml"
    config.write_text(textwrap.dedent(f"""\
        save_data: {tmp_path}/samples
        src_vocab: {tmp_path}/vocab.src
        tgt_vocab: {tmp_path}/vocab.tgt
        data:
          corpus_1:
            path_src: {support.TATOEBA}/valid.zh
            path_tgt: {support.TATOEBA}/valid.en
        transforms: [clause_split]
        clause_lang: zh
        """), encoding="utf-8")
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"\x80\x04garbage")
    for args, status, message in (
            (("-clause_levels", 0), 2, "clause_split: -clause_levels must be an integer in 1..6, got 0"),
            (("-clause_tagger_model", tmp_path / "none.pt"), 2,
             f"clause_split: -clause_tagger_model {tmp_path / 'none.pt'}: file not found"),
            (("-clause_tagger_model", corrupt), 1, f"clause_split: -clause_tagger_model {corrupt}: not a readable")):
        result = support.run_cli("onmt_build_vocab", "-config", config, "-n_sample", 10, *args, check=False)
        assert _one_error_line(result, "onmt_build_vocab", status).startswith(f"onmt_build_vocab: error: {message}")


def test_a_presplit_source_is_checked_against_the_options_it_was_split_with(sample_data, onmt_active, tmp_path):
    """-clause_presplit: the record tools/clause_split_corpus.py writes beside its output is checked against the
    run's -clause_* options (one line naming them, exit 2); a file without one gets a warning that its split is not
    checked; a subword transform before clause_split, which would cut the markers in the file, is refused."""
    source, split = tmp_path / "valid.zh", tmp_path / "valid.zh.clause"
    for side in ("zh", "en"):
        lines = (support.TATOEBA / f"valid.{side}").read_text(encoding="utf-8").splitlines(True)[:40]
        (tmp_path / f"valid.{side}").write_text("".join(lines), encoding="utf-8")
    support.run_cli(sys.executable, "-m", "tools.clause_split_corpus", "--lang", "zh", "--levels", 4,
                    "--input", source, "--output", split)
    config = tmp_path / "clause.yaml"
    config.write_text(textwrap.dedent(f"""\
        save_data: {tmp_path}/samples
        src_vocab: {tmp_path}/vocab.src
        tgt_vocab: {tmp_path}/vocab.tgt
        overwrite: true
        data:
          corpus_1:
            path_src: {split}
            path_tgt: {tmp_path}/valid.en
        transforms: [clause_split]
        clause_lang: zh
        clause_presplit: true
        """), encoding="utf-8")

    def build(*args):
        return support.run_cli("onmt_build_vocab", "-config", config, "-n_sample", -1, *args, check=False)

    done = build("-clause_levels", 4)
    assert done.returncode == 0 and "clause_split" not in done.stderr.replace("Transform/ClauseSplit", ""), \
        done.stderr
    assert (tmp_path / "vocab.src").is_file()
    message = (f"clause_split: -clause_presplit: corpus 'corpus_1': {split} was split with -clause_levels 4, "
               f"but this run has -clause_levels 6;")
    assert _one_error_line(build(), "onmt_build_vocab", 2).startswith(f"onmt_build_vocab: error: {message}")
    said = _one_error_line(build("-clause_levels", 4, "-clause_lang", "en"), "onmt_build_vocab", 2)
    assert "was split with -clause_lang 'zh', -clause_spacy_model ''" in said, said
    said = _one_error_line(build("-clause_levels", 4, *SPM[:2], "clause_split"), "onmt_build_vocab", 2)
    assert "-clause_presplit: -transforms put sentencepiece before clause_split" in said, said
    (tmp_path / "valid.zh.clause.clause_split.json").unlink()
    done = build("-clause_levels", 4)
    notes = [line for line in done.stderr.splitlines() if "clause_split.json" in line]
    assert done.returncode == 0 and len(notes) == 1 and f"{split} has no .clause_split.json beside it" in notes[0]


# audit ---------------------------------------------------------------- outputs onto inputs, broken input files


@pytest.mark.slow
def test_outputs_onto_inputs_and_broken_files_get_one_line(trained, tmp_path):
    """An -output or -log_file that is an input, a -log_file in a missing directory, a truncated checkpoint, a
    sentencepiece .vocab as -src_vocab and onmt_average_models' -output: one line each, nothing overwritten."""
    model = tmp_path / "model.pt"
    model.write_bytes((trained / "model_step_2.pt").read_bytes())
    size, src = model.stat().st_size, _source(tmp_path)
    text = src.read_bytes()

    def translate(*extra):
        return support.run_cli("onmt_translate", "-model", model, "-src", src, *extra, check=False)

    line = _one_error_line(translate("-output", model), "onmt_translate", 2)
    assert line == f"onmt_translate: error: -output {model}: is the -model file; give another -output"
    assert _one_error_line(translate("-output", src), "onmt_translate", 2).endswith("is the -src file; give "
                                                                                    "another -output")
    line = _one_error_line(translate("-output", tmp_path / "hyp", "-log_file", src), "onmt_translate", 2)
    assert line.endswith(f"-log_file {src}: is the -src file; give another -log_file")
    line = _one_error_line(translate("-output", tmp_path / "hyp", "-log_file", tmp_path / "no" / "log"),
                           "onmt_translate", 2)
    assert line.endswith(f"-log_file {tmp_path / 'no' / 'log'}: directory {tmp_path / 'no'} does not exist; "
                         "create it first")
    assert model.stat().st_size == size and src.read_bytes() == text and not (tmp_path / "hyp").exists()
    truncated = tmp_path / "truncated.pt"
    for cut in (5000, size // 2, size * 99 // 100):
        truncated.write_bytes(model.read_bytes()[:cut])
        result = support.run_cli("onmt_translate", "-model", truncated, "-src", src, "-output", tmp_path / "hyp",
                                 check=False)
        assert f"error: {truncated} is not an OpenNMT-py checkpoint" in _one_error_line(result, "onmt_translate", 1)
    result = _train(tmp_path, "-log_file", tmp_path / "no" / "train.log", check=False)
    assert _one_error_line(result, "onmt_train", 2).endswith(f"directory {tmp_path / 'no'} does not exist; "
                                                            "create it first")
    result = _train(tmp_path, "-src_vocab", support.TATOEBA / "spm.zh.vocab", check=False)
    assert "this looks like a sentencepiece .vocab" in _one_error_line(result, "onmt_train", 2)
    for output, message in ((model, "is one of -models; give another -output (averaging would overwrite it)"),
                            (tmp_path / "no" / "avg.pt", f"directory {tmp_path / 'no'} does not exist")):
        result = support.run_cli("onmt_average_models", "-models", model, "-output", output, check=False)
        assert f"error: -output {output}: {message}" in _one_error_line(result, "onmt_average_models", 2)
    assert model.stat().st_size == size


# ranks ---------------------------------------------------------------- an error inside a training rank


@pytest.mark.slow  # two CPU ranks start, and a rendezvous times out
def test_a_ranks_error_ends_the_run_in_one_line(trained, tmp_path):
    """A rank's UserError (a SystemExit) passed stock's ``except Exception``: the rank printed it and the run exited
    0. It now ends the run in one line with the rank and the error's status; so does a rendezvous that the other
    ranks never reach (torch's DistStoreError traceback after -timeout)."""
    cut = tmp_path / "cut.pt"
    cut.write_bytes((trained / "model_step_2.pt").read_bytes()[:5000])
    result = _train(tmp_path / "ranks", "-world_size", 2, "-gpu_ranks", 0, 1, "-train_from", cut, "-master_port",
                    10317, check=False, steps=4)
    assert _one_error_line(result, "onmt_train", 1).startswith(
        f"onmt_train: error: rank 0: {cut} is not an OpenNMT-py checkpoint") or \
        _one_error_line(result, "onmt_train", 1).startswith(f"onmt_train: error: rank 1: {cut} is not")
    result = _train(tmp_path / "alone", "-world_size", 2, "-gpu_ranks", 0, "-timeout", 3, "-master_port", 10318,
                    check=False)
    assert _one_error_line(result, "onmt_train", 1).startswith(
        "onmt_train: error: rank 0: -world_size 2: the ranks did not all meet at localhost:10318 within -timeout 3 s")


# outputs onto more inputs ---------------------------------------------- a transform's file, a pipe, a terminal


def test_outputs_onto_a_transforms_file_or_a_pipe_and_a_piped_source_get_one_line(trained, tmp_path):
    """-output onto a transform's file emptied the sentencepiece model; -output /dev/stdout (a pipe) ended in an
    io.UnsupportedOperation traceback; -src /dev/stdin (a pipe) was called `no such file`."""
    model, src = trained / "model_step_2.pt", _source(tmp_path)
    spm = tmp_path / "spm.en.model"
    spm.write_bytes((support.TATOEBA / "spm.en.model").read_bytes())
    size = spm.stat().st_size
    result = support.run_cli("onmt_translate", "-model", model, "-src", src, "-output", spm, "-transforms",
                             "sentencepiece", "-src_subword_model", support.TATOEBA / "spm.zh.model",
                             "-tgt_subword_model", spm, check=False)
    assert _one_error_line(result, "onmt_translate", 2) == \
        f"onmt_translate: error: -output {spm}: is the -tgt_subword_model file; give another -output"
    assert spm.stat().st_size == size
    result = support.run_cli("onmt_translate", "-model", model, "-src", src, "-output", "/dev/stdout", check=False)
    assert _one_error_line(result, "onmt_translate", 2).startswith(
        "onmt_translate: error: -output /dev/stdout: is a pipe or a terminal, not a file")
    piped = subprocess.run([str(support.BIN / "onmt_translate"), "-model", str(model), "-src", "/dev/stdin",
                            "-output", str(tmp_path / "hyp")], input=src.read_text(encoding="utf-8"),
                           cwd=support.REPO, capture_output=True, text=True, timeout=600, env=support.cli_env())
    assert _one_error_line(piped, "onmt_translate", 2).startswith(
        "onmt_translate: error: -src /dev/stdin: is a pipe or a device, not a regular file; onmt-ext reads its input "
        "files more than once")
    assert not (tmp_path / "hyp").exists()
