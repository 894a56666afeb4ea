"""tools/reproduce.py: GPU lists, checkpoint averaging, the dry run of every table, running, scoring, the report."""

import json
import os
import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest
import yaml

import support

from tools import reproduce

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def cuda_everywhere(monkeypatch):
    """Every test sees as many CUDA devices as it asks for, unless it probes otherwise itself (the real probe
    starts a Python with torch, which the tests of the CUDA check replace)."""
    monkeypatch.setattr(reproduce, "_cuda_devices", lambda gpus: len(gpus))


def _config(row):
    return yaml.safe_load((support.REPO / "yaml_configs" / row.config).read_text(encoding="utf-8"))


def _option(command, flag, count=1):
    """The ``count`` values after ``flag`` in a command (a list of words)."""
    at = command.index(flag)
    return command[at + 1:at + 1 + count]


def _option_values(command, flag):
    """Every value after ``flag`` up to the next option (``-models a b c``)."""
    values = []
    for word in command[command.index(flag) + 1:]:
        if word.startswith("-"):
            break
        values.append(word)
    return values


# ---------------------------------------------------------------- --gpus


@pytest.mark.parametrize("text, ids", [("0", (0,)), ("3", (3,)), ("0,1,2,3", (0, 1, 2, 3)), ("2,0", (2, 0)),
                                       ("10,11", (10, 11))])
def test_gpu_lists_parse_to_device_ids(text, ids):
    assert reproduce.parse_gpus(text) == ids


@pytest.mark.parametrize("text", ["", "x", "0,x", "0,,1", "1,", ",1", "-1", "0, 1", "1.5", "0,0", "1,2,1", "２"])
def test_garbage_gpu_lists_are_rejected_naming_the_option(text, capsys):
    with pytest.raises(ValueError):
        reproduce.parse_gpus(text)
    with pytest.raises(SystemExit) as exit_info:
        reproduce.main(["li2019-table3", "--dry-run", "--gpus", text])
    assert exit_info.value.code == 2  # parser.error
    assert "--gpus" in capsys.readouterr().err


def test_the_gpu_list_sets_visible_devices_world_size_and_ranks(capsys):
    assert reproduce.main(["li2019-table3", "--dry-run", "--gpus", "2,3"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    assert lines and all(line.startswith("CUDA_VISIBLE_DEVICES=2,3 onmt_") for line in lines)
    train = next(line for line in lines if "onmt_train" in line)
    assert " -world_size 2 -gpu_ranks 0 1 -accum_count 4 " in train  # 8 / 2: the paper's batch kept
    translate = next(line for line in lines if "onmt_translate" in line)
    assert " -gpu 0 " in translate  # device 2: the first visible one


def _train_command(plan):
    return next(command for command in plan.commands if command[0] == "onmt_train")


def test_rows_train_from_binarised_corpora_where_their_data_allows(tmp_path):
    """Every row whose transforms give each line one result trains with ``-ext_binarized_cache build/binarized``
    (one directory per data set, shared by the rows: docs/binarized-data.md); the study's tagger labels a bucket's
    lines together, so its row trains from the text, as every row does with --from-text."""
    rows = reproduce.TABLES["clause-table5"]
    cached = {row.label: _train_command(reproduce.plan(row))[-2:] == ["-ext_binarized_cache", "build/binarized"]
              for row in rows}
    study = {row.label for row in rows if _config(row).get("clause_tagger_model")}
    assert study and all(not cached[label] for label in study)
    assert all(cached[label] for label in cached if label not in study), cached
    assert all("-ext_binarized_cache" not in _train_command(reproduce.plan(row, binarize=False)) for row in rows)
    li2019 = reproduce.plan(reproduce.TABLES["li2019-table3"][0])
    assert _train_command(li2019)[-2:] == ["-ext_binarized_cache", "build/binarized"]
    config = tmp_path / "tokendrop.yaml"  # a random draw at each reading of a line
    values = _config(reproduce.TABLES["sample-li2019"][0])
    config.write_text(yaml.safe_dump({**values, "transforms": ["tokendrop", "filtertoolong"]}), encoding="utf-8")
    assert reproduce.binarized_options(config) == []
    assert reproduce.binarized_options(reproduce.TABLES["sample-li2019"][0].config) != []


def _fake_programs(tmp_path, plan):
    """``bin/`` with stand-ins of the OpenNMT-py commands that log their call (and the visible devices) to
    ``calls`` and write their outputs: every checkpoint of ``plan``, the file after ``-output``."""
    programs = tmp_path / "bin"
    programs.mkdir()
    output = 'while [ "$1" != -output ]; do shift; done; echo x > "$2"'
    for name, body in (("onmt_train", f"touch {' '.join(map(str, plan.checkpoints))}"),
                       ("onmt_average_models", output), ("onmt_translate", output)):
        (programs / name).write_text(f'#!/bin/sh\necho "{name} $CUDA_VISIBLE_DEVICES" >> calls\n{body}\n')
        (programs / name).chmod(0o755)
    return programs


def _run_rules(tmp_path, plans, gpus, programs):
    rules = tmp_path / "steps.mk"
    rules.write_text(reproduce.make_rules("li2019-table3", plans, gpus), encoding="utf-8")
    return subprocess.run(["make", "--no-print-directory", "-f", str(rules), f"BIN={programs}"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)


def _calls(tmp_path):
    calls = tmp_path / "calls"
    done = calls.read_text(encoding="utf-8").splitlines() if calls.exists() else []
    calls.unlink(missing_ok=True)
    return done


def test_make_runs_each_step_once_on_the_visible_devices_and_never_trains_over_checkpoints(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = reproduce.plan(reproduce.TABLES["li2019-table3"][0], (1, 2), average=2)
    programs = _fake_programs(tmp_path, plan)
    data = [*plan.steps[0].inputs, *(Path("build/data/wmt14_ende") / name for name in ("test.bpe.en", "test.de",
                                                                                        "test.tok.de"))]
    for path in data:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x\n")
    result = _run_rules(tmp_path, [plan], (1, 2), programs)
    assert result.returncode == 0, result.stderr
    assert _calls(tmp_path) == ["onmt_train 1,2", "onmt_average_models 1,2", "onmt_translate 1,2"]
    assert f"{programs}/onmt_average_models -models {' '.join(map(str, plan.checkpoints))} -output" in result.stdout
    assert _run_rules(tmp_path, [plan], (1, 2), programs).returncode == 0 and _calls(tmp_path) == []  # up to date
    plan.model.unlink()
    assert _run_rules(tmp_path, [plan], (1, 2), programs).returncode == 0
    assert _calls(tmp_path) == ["onmt_average_models 1,2", "onmt_translate 1,2"]
    plan.checkpoints[0].unlink()  # a checkpoint to average is gone, the last one is there: nothing runs
    plan.model.unlink()
    result = _run_rules(tmp_path, [plan], (1, 2), programs)
    assert result.returncode != 0 and _calls(tmp_path) == []
    assert (f"reproduce.py: {plan.checkpoints[0]} is missing; delete {plan.checkpoints[-1]} to train again"
            in result.stderr.splitlines())
    plan.checkpoints[0].write_text("x\n")
    later = time.time() + 10
    os.utime(data[0], (later, later))  # a corpus newer than the checkpoints: they are kept, not trained over
    assert _run_rules(tmp_path, [plan], (1, 2), programs).returncode == 0
    assert _calls(tmp_path) == ["onmt_average_models 1,2", "onmt_translate 1,2"]
    os.utime(data[-3], (later, later))  # a newer test source: translated again, from the same average
    assert _run_rules(tmp_path, [plan], (1, 2), programs).returncode == 0
    assert _calls(tmp_path) == ["onmt_translate 1,2"]


def test_missing_data_stops_before_anything_runs_naming_the_file_and_the_make_target(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = reproduce.plan(reproduce.TABLES["li2019-table3"][0], (0,), average=2)
    programs = _fake_programs(tmp_path, plan)
    data = Path("build/data/wmt14_ende")
    for path in plan.steps[0].inputs + (data / "test.bpe.en", data / "test.de"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x\n")
    result = _run_rules(tmp_path, [plan], (0,), programs)  # test.tok.de, a reference of the scoring, is missing
    assert result.returncode != 0 and _calls(tmp_path) == []
    assert result.stderr.splitlines()[0] == ("reproduce.py: build/data/wmt14_ende/test.tok.de is missing; prepare "
                                             "build/data/wmt14_ende/ with `make data-wmt14_ende` (docs/data.md "
                                             "lists its files)")


def test_a_failing_command_ends_the_run_in_one_line_naming_its_log(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = reproduce.plan(reproduce.TABLES["li2019-table3"][0], (0,), average=2)
    programs = _fake_programs(tmp_path, plan)
    (programs / "onmt_train").write_text("#!/bin/sh\nexit 3\n")
    for path in plan.steps[0].inputs + tuple(reproduce._scoring_inputs("wmt14_ende", True)):  # with the source
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x\n")
    result = _run_rules(tmp_path, [plan], (0,), programs)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert f"reproduce.py: onmt_train failed; its log: {plan.run_dir / 'train.log'}" in result.stderr.splitlines()


# ---------------------------------------------------------------- checkpoints


def test_checkpoint_steps_are_the_ones_onmt_saves():
    assert reproduce.checkpoint_steps(200000, 5000)[-5:] == [180000, 185000, 190000, 195000, 200000]
    assert reproduce.checkpoint_steps(12, 5) == [5, 10, 12]  # and once more after the last step
    assert reproduce.checkpoint_steps(10, 5) == [5, 10]
    assert reproduce.checkpoint_steps(7, 0) == [7]


def test_the_last_checkpoints_of_a_row_are_averaged():
    li2019 = reproduce.plan(reproduce.TABLES["li2019-table3"][1], (0,))
    run_dir = Path("build/runs/li2019/transformer_base_wmt14_ende_em_enc_self")
    assert li2019.checkpoints == tuple(run_dir / f"model_step_{k}.pt" for k in range(180000, 200001, 5000))
    assert li2019.model == run_dir / "average_last5.pt"
    assert li2019.hypotheses == run_dir / "test.average_last5.hyp.bpe"
    clause = reproduce.plan(reproduce.TABLES["clause-table5"][0], (0,), average=3)  # 152000 steps, saved every 5000
    assert [c.name for c in clause.checkpoints] == ["model_step_145000.pt", "model_step_150000.pt",
                                                    "model_step_152000.pt"]
    last = reproduce.plan(reproduce.TABLES["li2019-table3"][1], (0,), average=1)
    assert last.checkpoints == (run_dir / "model_step_200000.pt",) and last.model == last.checkpoints[0]
    assert [command[0] for command in last.commands] == ["onmt_train", "onmt_translate"]


def test_averaging_more_checkpoints_than_the_config_keeps_is_refused():
    with pytest.raises(SystemExit, match=r"li2019/transformer_base_wmt14_ende_baseline\.yaml sets keep_checkpoint: 10"):
        reproduce.main(["li2019-table3", "--dry-run", "--average", "11"])
    values = {"train_steps": 20, "save_checkpoint_steps": 5}
    assert reproduce.averaged_steps({**values, "keep_checkpoint": -1}, 4, "x.yaml") == [5, 10, 15, 20]
    with pytest.raises(SystemExit, match=r"x\.yaml saves only 4"):
        reproduce.averaged_steps({**values, "keep_checkpoint": -1}, 5, "x.yaml")
    with pytest.raises(SystemExit, match=r"x\.yaml sets keep_checkpoint: 3"):
        reproduce.averaged_steps({**values, "keep_checkpoint": 3}, 4, "x.yaml")


@pytest.mark.parametrize("average", ["0", "-2"])
def test_average_must_be_positive(average, capsys):
    with pytest.raises(SystemExit):
        reproduce.main(["li2019-table3", "--dry-run", "--average", average])
    assert "--average" in capsys.readouterr().err


# ---------------------------------------------------------------- the dry run of every table


def _expected_checkpoints(save_model, config, average):
    """The last ``average`` checkpoints OpenNMT-py leaves for ``config``, worked out apart from reproduce.py."""
    train_steps, every = config["train_steps"], config["save_checkpoint_steps"]
    steps = [k for k in range(every, train_steps + 1, every)]
    if train_steps % every:
        steps.append(train_steps)
    assert config["keep_checkpoint"] == -1 or config["keep_checkpoint"] >= average
    return [f"{save_model}_step_{k}.pt" for k in steps[-average:]]


@pytest.mark.parametrize("table", sorted(reproduce.TABLES))
def test_dry_run_of_every_table_prints_consistent_commands(table, capsys):
    rows = reproduce.TABLES[table]
    assert reproduce.main([table, "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    commands = [shlex.split(line.removeprefix("CUDA_VISIBLE_DEVICES=0 ")) for line in lines
                if not line.startswith("#")]
    assert all(line.startswith(("CUDA_VISIBLE_DEVICES=0 ", "# update: ", "# score: ", "# report: ")) for line in lines)
    updates = [line for line in lines if line.startswith("# update: ")]  # the plan of each row (docs/scale-out.md)
    assert [line.split(": ")[1] for line in updates] == [row.label for row in rows]
    for line in updates:
        accum, world, batch, tokens = map(int, re.search(r"(\d+) x (\d+) x (\d+) = (\d+) ", line).groups())
        assert f"world_size {world}, gpu_ranks 0, accum_count {accum}, batch_size {batch} " in line
        assert tokens == accum * world * batch
    onmt = [command for command in commands if command[0].startswith("onmt_")]
    prefixes = [prefix for _, prefix in reproduce.test_sets(reproduce.table_task(table))]
    per_row = 2 + len(prefixes)
    assert [command[0] for command in onmt] == (["onmt_train", "onmt_average_models"]
                                                + ["onmt_translate"] * len(prefixes)) * len(rows)
    written, trained = set(), set()  # what the clause preparation writes, the last checkpoints of the rows
    for command in commands:
        if command[0] == "python":  # python -m tools.<name>
            assert command[1] == "-m" and (support.REPO / f"{command[2].replace('.', '/')}.py").exists()
            written.add(_option(command, "--output")[0])
    row_commands = [onmt[start:start + per_row] for start in range(0, len(onmt), per_row)]
    for row, (train, average, translate, *more) in zip(rows, row_commands):
        config = _config(row)
        [config_file] = _option(train, "-config")
        assert config_file == f"yaml_configs/{row.config}" and (support.REPO / config_file).is_file()
        save_model = _option(train, "-save_model")[0] if row.overrides else config["save_model"]
        run_dir = str(Path(save_model).parent)
        assert _option(train, "-log_file") == [f"{run_dir}/train.log"]
        assert _option_values(average, "-models") == _expected_checkpoints(save_model, config, 5)
        assert _option(average, "-output") == [f"{run_dir}/average_last5.pt"]
        assert _option(translate, "-model") == _option(average, "-output")
        assert _option(translate, "-output") == [f"{run_dir}/test.average_last5.hyp.bpe"]
        for prefix, command in zip(prefixes[1:], more):  # NIST03, NIST04: same model, their own source and output
            assert _option(command, "-model") == _option(average, "-output")
            assert _option(command, "-src")[0].endswith(f"/{prefix}.bpe.zh")
            assert _option(command, "-output") == [f"{run_dir}/{prefix}.average_last5.hyp.bpe"]
        assert _option(translate, "-gpu") == ["0"]
        if config.get("train_from"):  # fine-tuning (GRET) starts from the last checkpoint of an earlier row
            assert config["train_from"] in trained
        trained.add(_option_values(average, "-models")[-1])
        for corpus in config["data"].values():  # what training reads is shipped data or written before it
            assert corpus["path_src"].startswith("build/data/") or corpus["path_src"] in written
            if corpus["path_src"].endswith((".clause_rule", ".clause_study")):
                assert corpus["path_src"] in written
    scores = [line for line in lines if line.startswith("# score: ")]
    assert len(scores) == len(rows) * len(prefixes)
    for number in range(len(prefixes)):
        for row, line, commands_of_row in zip(rows, scores[number * len(rows):], row_commands):
            assert line.startswith(f"# score: {row.label}: {_option(commands_of_row[2 + number], '-output')[0]} ")
    paper = table.split("-")[0]
    task = reproduce.table_task(table)
    [report] = [line for line in lines if line.startswith("# report: ")]
    assert f"results/{paper}/{task}/{table}.json" in report and f"results/{paper}/{task}/{table}.md" in report


def test_results_go_to_the_paper_and_task_directory(tmp_path):
    assert reproduce.results_dir("li2019-table3") == reproduce.REPO / "results/li2019/wmt14_ende"
    assert reproduce.results_dir("cao2019-table2-wmt17_zhen", tmp_path) == tmp_path / "cao2019/wmt17_zhen"
    assert reproduce.results_dir("gret-big") == reproduce.REPO / "results/gret/wmt14_ende"
    assert reproduce.results_dir("clause-table5") == reproduce.REPO / "results/clause/niutrans_enzh"


# ---------------------------------------------------------------- training logs

LOG = """\
[2025-03-01 10:00:00,001 INFO] Start training loop and validate every 200 steps...
[2025-03-01 10:00:00,002 INFO] Validation perplexity: 999
[2025-03-01 10:00:09,000 INFO] Step 100/  400; acc: 12.3; ppl: 456.7; xent: 6.1; lr: 0.00012; sents:    3200; \
bsz:  900/1000/32; 9000/10000 tok/s;      9 sec;
[2025-03-01 10:00:18,000 INFO] Step 200/  400; acc: 25.0; ppl: 120.5; xent: 4.8; lr: 0.00025; sents:    3100; \
bsz:  900/1000/31; 9000/10000 tok/s;     18 sec;
[2025-03-01 10:00:18,100 INFO] Train perplexity: 230.4
[2025-03-01 10:00:18,101 INFO] Train accuracy: 18.6
[2025-03-01 10:00:18,102 INFO] Sentences processed: 6300
[2025-03-01 10:00:18,103 INFO] Average bsz:  900/1000/31
[2025-03-01 10:00:20,000 INFO] Validation perplexity: 98.76
[2025-03-01 10:00:20,001 INFO] Validation accuracy: 30.5
[2025-03-01 10:00:20,100 INFO] Saving checkpoint build/runs/x/model_step_200.pt
[2025-03-01 10:00:27,000 INFO] Step 300/  400; acc: 33.3; ppl: 60.0; xent: 4.1; lr: 0.00037; sents:    3000; \
bsz:  900/1000/30; 9000/10000 tok/s;     27 sec;
[2025-03-01 10:00:30,000 INFO] Step 300/  400; acc: 34.0; ppl: 58.5; xent: 4.1; lr: 0.00037; sents:    3000; \
bsz:  900/1000/30; 9000/10000 tok/s;      3 sec;
[2025-03-01 10:00:39,000 INFO] Step 400/  400; acc: 40.2; ppl: 35.25; xent: 3.6; lr: 0.00049; sents:    3000; \
bsz:  900/1000/30; 9000/10000 tok/s;     12 sec;
[2025-03-01 10:00:41,000 INFO] Validation perplexity: 50.5
[2025-03-01 10:00:41,001 INFO] Validation accuracy: 41.25
"""


def test_training_log_is_parsed_into_training_and_validation_curves():
    curves = reproduce.parse_train_log(LOG)
    assert curves["train"] == {"step": [100, 200, 300, 400], "acc": [12.3, 25.0, 34.0, 40.2],
                               "ppl": [456.7, 120.5, 58.5, 35.25], "xent": [6.1, 4.8, 4.1, 3.6]}
    # validation at the step reported just before it; the stray line before any step and the training totals
    # ("Train perplexity") are not validation points; step 300 logged twice (a resumed run) keeps its last values
    assert curves["valid"] == {"step": [200, 400], "acc": [30.5, 41.25], "ppl": [98.76, 50.5]}


def test_an_empty_log_has_empty_curves():
    assert reproduce.parse_train_log("[2025-03-01 10:00:00,001 INFO] Starting training on GPU: [0]\n") == {
        "train": {"step": [], "acc": [], "ppl": [], "xent": []}, "valid": {"step": [], "acc": [], "ppl": []}}


def test_the_log_format_of_the_installed_opennmt_py_is_parsed(tmp_path, onmt_active):
    import logging
    import time

    import onmt.utils
    from onmt.utils.logging import init_logger

    logger = logging.getLogger("onmt")
    saved_handlers, saved_level = logger.handlers[:], logger.level
    log_file = tmp_path / "train.log"
    try:
        init_logger(str(log_file))
        report = onmt.utils.ReportMgr(report_every=50, start_time=time.time())
        train = onmt.utils.Statistics(loss=460.0, n_batchs=2, n_sents=64, n_words=100, n_correct=40)
        report.report_training(150, 20000, 0.0007, None, train)
        valid = onmt.utils.Statistics(loss=230.0, n_batchs=1, n_sents=10, n_words=100, n_correct=55)
        report.report_step(0.0007, None, 150, train_stats=train, valid_stats=valid)
    finally:
        for handler in logger.handlers:
            handler.close()
        logger.handlers = saved_handlers
        logger.setLevel(saved_level)
    curves = reproduce.parse_train_log(log_file.read_text(encoding="utf-8"))
    assert curves["train"]["step"] == [150] and curves["train"]["acc"] == [40.0] and curves["train"]["xent"] == [4.6]
    assert curves["train"]["ppl"] == [pytest.approx(99.48, abs=0.05)]  # exp(4.6), printed with one decimal
    assert curves["valid"]["step"] == [150] and curves["valid"]["acc"] == [55.0]
    assert curves["valid"]["ppl"] == [pytest.approx(9.97418, abs=1e-4)]  # exp(2.3)


def test_long_curves_are_thinned_keeping_the_last_point():
    curve = {"step": list(range(1, 2001)), "ppl": [float(k) for k in range(1, 2001)]}
    thin = reproduce.thin_curve(curve, 500)
    assert len(thin["step"]) <= 500 and thin["step"][-1] == 2000 and thin["ppl"] == [float(k) for k in thin["step"]]
    assert reproduce.thin_curve({"step": [1, 2], "ppl": [3.0, 4.0]}, 500) == {"step": [1, 2], "ppl": [3.0, 4.0]}


# ---------------------------------------------------------------- the report


def _fixed_rows(table, shift=-0.5):
    """Result rows of ``table`` with made-up scores: BLEU = the paper's + shift (20.0 where the paper has none)."""
    curves = reproduce.parse_train_log(LOG)
    rows = []
    for index, row in enumerate(reproduce.TABLES[table]):
        bleu = 20.0 + index if row.paper_bleu is None else round(row.paper_bleu + shift, 2)
        rows.append({"label": row.label, "config": row.config, "overrides": [str(o) for o in row.overrides],
                     "paper_bleu": row.paper_bleu, "bleu": bleu, "tok_bleu": bleu + 0.75, "chrf": 55.0 + index,
                     "signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.3",
                     "p_value": None if index == 0 else 0.004, "marker": None if index == 0 else "‡",
                     "model": f"build/runs/x{index}/average_last5.pt", "averaged": 5, "train_steps": 200000,
                     "curves": curves})
    return rows


def _markdown_rows(markdown, first_column="row"):
    """The report's table as ``[{column: cell}]``, read by its header (the first line that starts with
    ``| <first_column> |``), so a test checks each value in its named column, not a row's exact layout."""
    lines = markdown.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith(f"| {first_column} |"))
    columns = [cell.strip() for cell in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2:]:  # after the header and its alignment line
        if not line.startswith("|"):
            break
        rows.append(dict(zip(columns, (cell.strip() for cell in line.strip("|").split("|")))))
    return rows


def test_report_from_fixed_json_puts_the_papers_bleu_beside_ours(tmp_path, capsys):
    table = "li2019-table3"
    source = tmp_path / "input.json"
    source.write_text(json.dumps({"table": table, "rows": _fixed_rows(table)}), encoding="utf-8")
    assert reproduce.main([table, "--report-only", "--results-json", str(source),
                           "--results-dir", str(tmp_path / "results")]) == 0
    out_dir = tmp_path / "results/li2019/wmt14_ende"
    markdown = (out_dir / f"{table}.md").read_text(encoding="utf-8")
    assert markdown in capsys.readouterr().out
    cells = _markdown_rows(markdown)
    assert [cell["row"] for cell in cells] == [row.label for row in reproduce.TABLES[table]]
    for cell, row, index in zip(cells, reproduce.TABLES[table], range(len(cells))):
        assert cell["config"] == f"`{row.config}`" and float(cell["paper BLEU"]) == row.paper_bleu
        ours = round(row.paper_bleu - 0.5, 2)
        assert float(cell["ours, paper's metric"]) == float(cell["sacreBLEU"]) == ours
        assert float(cell["ours - paper"]) == -0.5 and float(cell["tok. BLEU"]) == pytest.approx(ours + 0.75)
        assert float(cell["chrF"]) == 55.0 + index
        assert cell["p"] == ("" if index == 0 else "0.004 ‡")  # the baseline row is the reference of the tests
        assert cell["model"] == "last 5 checkpoints averaged, 200000 steps"
    assert "sacreBLEU signature: nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.3" in markdown
    assert f"({table}.curves.png)" in markdown
    document = json.loads((out_dir / f"{table}.json").read_text(encoding="utf-8"))
    assert (document["table"], document["paper"], document["task"]) == (table, "li2019", "wmt14_ende")
    assert [(row["label"], row["paper_bleu"], row["bleu"]) for row in document["rows"]] == [
        (row.label, row.paper_bleu, round(row.paper_bleu - 0.5, 2)) for row in reproduce.TABLES[table]]
    assert document["rows"][3]["p_value"] == 0.004 and document["rows"][0]["averaged"] == 5
    curves = (out_dir / f"{table}.curves.png").read_bytes()
    assert curves.startswith(PNG_MAGIC) and len(curves) > 10000
    # the JSON written is itself a report input: the default of --report-only, and the same report again
    (out_dir / f"{table}.md").unlink()
    assert reproduce.main([table, "--report-only", "--results-dir", str(tmp_path / "results")]) == 0
    assert (out_dir / f"{table}.md").read_text(encoding="utf-8") == markdown


def test_report_of_a_sweep_without_paper_scores_or_curves(tmp_path):
    table = "chen2019-figure2-mprhead"
    rows = _fixed_rows(table)
    for row in rows:
        del row["curves"]
    written = reproduce.write_report(table, "wmt14_ende", rows, tmp_path)
    markdown = written["md"].read_text(encoding="utf-8")
    cell = next(cell for cell in _markdown_rows(markdown) if cell["row"] == "mprhead d_r = 448")
    assert cell["config"] == "`chen2019/transformer_base_wmt14_ende_mprhead.yaml` `-chen2019_dim` `448`"
    assert cell["paper BLEU"] == "n/a" and cell["ours - paper"] == ""  # no paper score: no difference
    # chen2019's own metric is multi-bleu on tokenized text: the tokenized score, not sacreBLEU's
    assert cell["ours, paper's metric"] == cell["tok. BLEU"] != cell["sacreBLEU"]
    assert "curves" not in written and not (tmp_path / f"{table}.curves.png").exists()


def test_report_only_refuses_results_of_another_table(tmp_path):
    source = tmp_path / "input.json"
    source.write_text(json.dumps({"table": "li2019-table2", "rows": _fixed_rows("li2019-table2")}))
    with pytest.raises(SystemExit, match="li2019-table2, not li2019-table3"):
        reproduce.main(["li2019-table3", "--report-only", "--results-json", str(source),
                        "--results-dir", str(tmp_path)])
    source.write_text(json.dumps(_fixed_rows("li2019-table2")[:3]))
    with pytest.raises(SystemExit, match="are not those of li2019-table3"):
        reproduce.main(["li2019-table3", "--report-only", "--results-json", str(source),
                        "--results-dir", str(tmp_path)])
    rows = _fixed_rows("li2019-table3")
    del rows[2]["tok_bleu"]
    source.write_text(json.dumps(rows))
    with pytest.raises(SystemExit, match=r"row '3 \[4-6\]' of .* has no tok_bleu"):
        reproduce.main(["li2019-table3", "--report-only", "--results-json", str(source),
                        "--results-dir", str(tmp_path)])
    with pytest.raises(SystemExit):  # a results JSON is read by --report-only only
        reproduce.main(["li2019-table3", "--dry-run", "--results-json", str(source)])


# ---------------------------------------------------------------- scoring, end to end without training

REFERENCES = [
    "The cat sat on the mat .",
    "It is raining heavily in Paris today , and the streets are full of water .",
    "She bought three apples .",
    "We will meet at the station at noon , unless the train is late again .",
    "Could you please close the window ?",
    "He has lived in this town for ten years , ever since he left the army .",
]


def test_clause_table_scored_and_reported_from_hypotheses_on_disk(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(reproduce, "BOOTSTRAP_SAMPLES", 100)
    table, task = "clause-table10", "wmt16_ende"
    plans = [reproduce.plan(row, (0,)) for row in reproduce.TABLES[table]]
    data = tmp_path / "build/data" / task
    data.mkdir(parents=True)
    (data / "test.de").write_text("\n".join(r.replace(" .", ".").replace(" ,", ",").replace(" ?", "?")
                                            for r in REFERENCES) + "\n")
    (data / "test.tok.de").write_text("\n".join(REFERENCES) + "\n")
    (data / "test.bpe.en").write_text("\n".join(f"sour@@ ce {r}" for r in REFERENCES) + "\n")
    outputs = [[r.split(" ,")[0].replace("the", "a") for r in REFERENCES],  # row 1: worse on the long sentences
               REFERENCES,  # row 2: the reference itself
               [r.replace("station", "sta@@ tion").replace("window", "win@@ dow") for r in REFERENCES]]  # BPE'd
    for p, lines in zip(plans, outputs):
        p.hypotheses.parent.mkdir(parents=True)
        p.hypotheses.write_text("\n".join(lines) + "\n")
        (p.run_dir / "train.log").write_text(LOG)
    scores = reproduce.score(plans, table, by_length=True)
    assert [round(s["bleu"], 2) for s in scores[1:]] == [100.0, 100.0]
    assert scores[0]["bleu"] < 60 and scores[1]["tok_bleu"] == pytest.approx(100) == scores[2]["chrf"]
    assert scores[0]["p_value"] is None and scores[1]["p_value"] < 0.05 and scores[1]["marker"] in ("†", "‡")
    assert [c["count"] for c in scores[1]["by_length"]] == [3, 3, 0, 0, 0]  # source words 4-7, 13-17
    rows = reproduce.row_results(plans, scores)
    assert rows[1]["curves"]["valid"]["ppl"] == [98.76, 50.5] and rows[1]["averaged"] == 5
    assert rows[2]["model"] == "build/runs/clause/transformer_base_wmt16_ende_ca_study/average_last5.pt"
    written = reproduce.write_report(table, task, rows, tmp_path / "out", ["CUDA_VISIBLE_DEVICES=0 onmt_train x"])
    assert [path.name for path in written["by_length"]] == [f"{table}.ca_rule.by_length.png",
                                                           f"{table}.ca_study.by_length.png"]
    assert all(path.read_bytes().startswith(PNG_MAGIC) for path in written["by_length"] + [written["curves"]])
    markdown = written["md"].read_text(encoding="utf-8")
    metric, _ = reproduce.paper_metric(table, task)
    cells = _markdown_rows(markdown)
    assert len(cells) == len(plans)
    for p, score, cell in zip(plans, scores, cells):  # each row's own scores, in their columns
        paper = p.row.paper_bleu
        assert (cell["row"], cell["config"]) == (p.row.label, f"`{p.row.config}`")
        assert float(cell["paper BLEU"]) == pytest.approx(paper, abs=0.005)
        assert float(cell["ours, paper's metric"]) == pytest.approx(score[metric], abs=0.005)
        assert float(cell["sacreBLEU"]) == pytest.approx(score["bleu"], abs=0.005)
        assert float(cell["ours - paper"]) == pytest.approx(score[metric] - paper, abs=0.005)
        assert float(cell["tok. BLEU"]) == pytest.approx(score["tok_bleu"], abs=0.005)
        assert float(cell["chrF"]) == pytest.approx(score["chrf"], abs=0.005)
        assert cell["p"] == ("" if score["p_value"] is None else f"{score['p_value']:.3f} {score['marker']}".strip())
    assert f"CA with rule vs Transformer (plot: [{table}.ca_rule.by_length.png]" in markdown
    commands = json.loads(written["json"].read_text(encoding="utf-8"))["commands"]
    assert commands == ["CUDA_VISIBLE_DEVICES=0 onmt_train x"]


def test_nist_table_is_scored_on_all_three_test_sets_with_big_rows_against_the_big_baseline(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(reproduce, "BOOTSTRAP_SAMPLES", 100)
    table, task = "chen2019-table2-nist_zhen", "nist_zhen"
    plans = [reproduce.plan(row, (0,)) for row in reproduce.TABLES[table]]
    assert [reproduce.compared_row([p.row.config for p in plans], i) for i in range(6)] == [0, 0, 0, 0, 4, 4]
    data = tmp_path / "build/data" / task
    data.mkdir(parents=True)
    sets = {"test": REFERENCES[:3], "test_nist03": REFERENCES[3:5], "test_nist04": REFERENCES[5:]}
    for prefix, refs in sets.items():
        (data / f"{prefix}.bpe.zh").write_text("\n".join("源 句" for _ in refs) + "\n")
        for number in range(4):  # four references; the first one of each set is the one the systems output
            lines = refs if number == 0 else [f"{r} variant {number}" for r in refs]
            (data / f"{prefix}.en{number}").write_text("\n".join(lines) + "\n")
            (data / f"{prefix}.tok.en{number}").write_text("\n".join(lines) + "\n")
    for index, p in enumerate(plans):  # even rows translate perfectly, odd rows drop the last word
        p.run_dir.mkdir(parents=True)
        for number, refs in enumerate(sets.values()):
            lines = refs if index % 2 == 0 else [" ".join(r.split()[:-2]) for r in refs]
            p.hypotheses_of(number).write_text("\n".join(lines) + "\n")
    needed = reproduce._scoring_inputs(task, by_length=False)  # four references, raw and tokenized, of each set
    assert len(needed) == 24 and all(path.exists() for path in needed)
    more = [reproduce.score(plans, table, test_set=number) for number in (1, 2)]
    rows = reproduce.row_results(plans, reproduce.score(plans, table), more)
    assert [row["bleu"] == pytest.approx(100) for row in rows] == [True, False] * 3
    assert all(scores["bleu"] == pytest.approx(100) for row in rows[0::2] for scores in row["test_sets"].values())
    assert [row.get("compared_with") for row in rows] == [None, "Transformer (base)", "Transformer (base)",
                                                         "Transformer (base)", None, "Transformer (big)"]
    assert rows[4]["p_value"] is None and rows[5]["p_value"] is not None
    assert rows[5]["test_sets"]["NIST04"]["paper_bleu"] == 48.21
    assert rows[5]["test_sets"]["NIST03"]["hypotheses"].endswith("test_nist03.average_last5.hyp.bpe")
    assert "nrefs:4" in rows[0]["test_sets"]["NIST03"]["signature"]
    written = reproduce.write_report(table, task, rows, tmp_path / "out")
    markdown = written["md"].read_text(encoding="utf-8")
    for label in ("NIST02", "NIST03", "NIST04"):
        assert f"{table}: BLEU on nist_zhen {label} " in markdown
    assert "| +MPRHead | `chen2019/transformer_big_nist_zhen_mprhead.yaml` | 48.61 |" in markdown  # NIST03 column
    # the JSON written reads back through --report-only, giving the same report
    document = json.loads(written["json"].read_text(encoding="utf-8"))
    assert reproduce.load_results(written["json"], table)[0] == document["rows"]
    del document["rows"][2]["test_sets"]["NIST04"]["tok_bleu"]
    written["json"].write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(SystemExit, match="has no tok_bleu on NIST04"):
        reproduce.load_results(written["json"], table)


UPDATE = re.compile(r"^# update: (.+): world_size (\d+), gpu_ranks ([\d ]+), accum_count (\d+), batch_size (\d+) "
                    r"(\w+): (\d+) x (\d+) x (\d+) = (\d+) \w+ per update$")


def _updates(table, gpus, capsys):
    assert reproduce.main([table, "--dry-run", "--gpus", gpus]) == 0
    return [UPDATE.match(line).groups() for line in capsys.readouterr().out.splitlines()
            if line.startswith("# update: ")]


@pytest.mark.parametrize("table", sorted(reproduce.TABLES))
def test_every_table_plans_the_papers_update_on_4_and_8_gpus(table, capsys):
    """docs/scale-out.md: the same tokens (or sentences) per update on 1, 4 and 8 GPUs, every rank listed."""
    one = _updates(table, "0", capsys)
    assert one and all(update[1:3] == ("1", "0") for update in one)
    for n in (4, 8):
        many = _updates(table, ",".join(map(str, range(n))), capsys)
        assert [update[0] for update in many] == [update[0] for update in one]
        for (label, world, ranks, accum, batch, unit, *product), single in zip(many, one):
            assert (world, ranks.split()) == (str(n), [str(rank) for rank in range(n)]), label
            assert [accum, world, batch, product[3]] == product[:3] + [single[-1]], label
            assert int(accum) * n * int(batch) == int(single[-1]) and unit == single[5], label


def test_passes_keep_the_tokens_of_an_update():
    row = reproduce.TABLES["li2019-table3"][0]  # 4096 tokens x accum_count 8

    def batch_and_accum(gpus, passes=None):
        [command] = [list(map(str, step.command)) for step in reproduce.plan(row, gpus, passes=passes).steps
                     if step.command[0] == "onmt_train"]
        batch = int(_option(command, "-batch_size")[0]) if "-batch_size" in command else 4096
        return batch, int(_option(command, "-accum_count")[0])

    assert batch_and_accum((0,)) == (4096, 8)  # the config's own batch
    assert batch_and_accum((0,), passes=1) == (32768, 1)
    assert batch_and_accum((0, 1), passes=2) == (8192, 2)
    assert batch_and_accum((0, 1, 2, 3)) == (4096, 2)
    assert batch_and_accum(tuple(range(16))) == (2048, 1)  # more GPUs than passes: each a part of one batch
    assert batch_and_accum(tuple(range(16)), passes=2) == (1024, 2)
    with pytest.raises(SystemExit, match="--passes 3 must divide"):
        reproduce.plan(row, (0,), passes=3)
    with pytest.raises(SystemExit, match=r"update of 32768 tokens does not divide into 3 x 1 equal batches"):
        reproduce.plan(row, (0, 1, 2))


# ---------------------------------------------------------------- two nodes

NODE = ["--nodes", "2", "--master-ip", "10.0.0.1", "--master-port", "29400"]


def _node_dry_run(table, rank, capsys):
    assert reproduce.main([table, "--dry-run", "--gpus", "0,1,2,3", *NODE, "--node-rank", str(rank)]) == 0
    out = capsys.readouterr().out.splitlines()
    return [shlex.split(line)[1:] for line in out if not line.startswith("#")], out


@pytest.mark.parametrize("table", sorted(reproduce.TABLES))
def test_every_table_plans_the_papers_update_on_two_nodes_of_4_gpus(table, capsys):
    """docs/scale-out.md: two nodes of 4 GPUs hold the 8 ranks once between them, meet at node 0 and keep the
    one-GPU update; only node 0 averages and translates, and each node logs to a file of its own."""
    one = _updates(table, "0", capsys)
    ranks, trained = [], []
    for rank in (0, 1):
        commands, out = _node_dry_run(table, rank, capsys)
        updates = [UPDATE.match(line).groups() for line in out if line.startswith("# update: ")]
        assert [update[0] for update in updates] == [update[0] for update in one]
        assert all(update[1] == "8" and update[-1] == single[-1] for update, single in zip(updates, one)), table
        assert {tuple(update[2].split()) for update in updates} == {tuple(map(str, range(4 * rank, 4 * rank + 4)))}
        ranks.append(updates[0][2].split())
        trains = [command for command in commands if command[0] == "onmt_train"]
        differ = {"-gpu_ranks": 4, "-log_file": 1}  # what differs between the nodes' commands (values)
        trained.append([[word for i, word in enumerate(command)
                         if not any(flag in command[max(0, i - n):i] for flag, n in differ.items())]
                        for command in trains])
        for index, command in enumerate(trains):  # each row at a port of its own
            assert _option(command, "-master_ip", 6) == ["10.0.0.1", "-master_port", str(29400 + index),
                                                         "-timeout", str(reproduce.NODE_TIMEOUT), "-accum_count"]
            assert _option(command, "-log_file")[0].endswith("/train.log" if rank == 0 else "/train.node1.log")
            if "-ext_binarized_cache" in command:  # binarised before the training, by a command of its own
                binarize = next(earlier for earlier in reversed(commands[:commands.index(command)])
                                if earlier[0] == "onmt_ext_binarize")
                assert binarize[:3] == ["onmt_ext_binarize", "-config", _option(command, "-config")[0]]
        tools = [command[0] for command in commands]
        last = max(i for i, tool in enumerate(tools) if tool == "onmt_train")  # every training before the rest
        assert not {"onmt_translate", "onmt_average_models"} & set(tools[:last]), tools
        assert ("onmt_translate" in tools) == (rank == 0) and ("onmt_average_models" in tools) == (rank == 0)
        assert any(line.startswith("# nodes: node ") for line in out)
        assert any(line.startswith("# report: ") for line in out) == (rank == 0)
    assert sorted(ranks[0] + ranks[1], key=int) == [str(rank) for rank in range(8)]
    assert trained[0] == trained[1]  # the same rows (sweeps' overrides too) in the same order: the nodes meet at each


@pytest.mark.parametrize("args, message", [
    (["--nodes", "2", "--master-ip", "h", "--node-rank", "2"], "--node-rank 2: must be below --nodes 2"),
    (["--nodes", "2", "--node-rank", "0"], "--nodes 2 needs --master-ip"),
    (["--nodes", "2", "--master-ip", "h"], "--nodes 2 needs --node-rank"),
    (["--nodes", "2", "--node-rank", "0", "--master-ip", "h", "--master-port", "65530"], "above 65535"),
    (["--master-ip", "h"], "--master-ip goes with --nodes above 1"),
    (["--node-rank", "1", "--master-port", "1"], "--node-rank, --master-port go with --nodes above 1"),
    (["--nodes", "2", "--master-ip", "h", "--gpus", "cpu"], "--nodes needs CUDA devices"),
    (["--nodes", "0"], "--nodes"),
])
def test_node_options_that_do_not_fit_are_one_line_each(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        reproduce.main(["li2019-table3", "--dry-run", *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("rank", [0, 1])
def test_every_file_a_nodes_rules_read_is_data_or_made_by_a_rule(rank):
    """On either node every table's rules make each file they read, but the prepared data; no binarising reads
    a config's ``train_from`` (``onmt_ext_binarize`` refuses a fine-tuning's config)."""
    for table, rows in reproduce.TABLES.items():
        nodes = reproduce.Nodes(2, rank, "10.0.0.1")
        plans = [reproduce.plan(row, (0, 1), nodes=nodes.for_row(index)) for index, row in enumerate(rows)]
        steps = [step for p in plans for step in p.steps]
        made = {step.output for step in steps} | {path for p in plans for path in p.checkpoints if rank == 0}
        for step in steps:
            unmade = [path for path in step.inputs if path not in made and reproduce.DATA not in path.parents]
            assert not unmade, (table, rank, step.command[:4], unmade)
            if step.command[0] == "onmt_ext_binarize" and reproduce.common.config_values(
                    str(step.command[2]).removeprefix("yaml_configs/")).get("train_from"):
                assert _option(list(step.command), "-train_from") == [""], (table, step.command)


def _node_programs(tmp_path, plans):
    """Stand-ins that log their call: ``onmt_train`` writes the checkpoints only where it holds rank 0, as
    OpenNMT-py does; ``onmt_ext_binarize`` writes nothing."""
    programs = _fake_programs(tmp_path, plans[0])
    cases = "".join(f"  *' yaml_configs/{p.row.config} '*) touch {' '.join(map(str, p.checkpoints))};;\n"
                    for p in plans)
    (programs / "onmt_train").write_text('#!/bin/sh\necho "onmt_train $2" >> calls\ncase " $* " in\n'
                                         '  *" -gpu_ranks 0 "*) ;;\n  *) exit 0;;\nesac\n'
                                         f'case " $* " in\n{cases}esac\n')
    (programs / "onmt_ext_binarize").write_text('#!/bin/sh\necho "onmt_ext_binarize $2" >> calls\n')
    (programs / "python").write_text('#!/bin/sh\nfor last; do :; done\necho "$2 $6 $last" >> calls\n'
                                     'case " $* " in *" --node-rank 0 "*) ;; *) echo x > "$last";; esac\n')
    for name in ("onmt_ext_binarize", "python"):
        (programs / name).chmod(0o755)
    return programs


@pytest.mark.parametrize("table, shared", [("gret-main-wmt14_ende", "model_step_200000.pt"),
                                           ("clause-table5", "signal_tagger.en.pt")])
def test_files_only_node_0_makes_are_given_to_the_other_node_before_it_reads_them(table, shared, capsys):
    """GRET's rows fine-tune from the baseline's checkpoint, which only node 0 has; the clause "study" rows split
    with a tagger, which node 0 trains: node 0 gives each (tools.node_share) once it has it, node 1 receives it
    before the step that reads it, and trains no tagger of its own."""
    for rank in (0, 1):
        commands, _ = _node_dry_run(table, rank, capsys)
        tools = [command[0] if command[0] != "python" else command[2] for command in commands]
        [share] = [i for i, tool in enumerate(tools) if tool == "tools.node_share"]
        path = commands[share][-1]
        assert path.endswith(f"/{shared}") and _option(commands[share], "--node-rank") == [str(rank)]
        reader = next(command for command in commands[share:] if command[0] == "onmt_train")
        assert _option(commands[share], "--master-ip", 3) == ["10.0.0.1", "--master-port",
                                                              _option(reader, "-master_port")[0]]
        if shared.startswith("signal_tagger"):
            readers = [i for i, command in enumerate(commands) if "--tagger-model" in command]
            assert readers and share < min(readers)
            assert ("tools.train_signal_tagger" in tools[:share]) == (rank == 0)
            assert "tools.train_signal_tagger" not in tools[share:]
        else:
            trainings = [i for i, tool in enumerate(tools) if tool == "onmt_train"]
            assert trainings[0] < share < trainings[1], tools  # after the baseline, before the fine-tuning


def test_node_1_receives_the_checkpoint_its_fine_tuning_reads_when_node_0_gives_it(tmp_path, monkeypatch):
    """make's order on each node (a checkout each) of GRET's baseline and first fine-tuned row: node 0 trains the
    baseline, gives its checkpoint, then fine-tunes; node 1 trains with it, receives the checkpoint, fine-tunes."""
    rows, gpus = reproduce.TABLES["gret-main-wmt14_ende"][:2], (0, 1)
    calls = {}
    for rank in (1, 0):
        root = tmp_path / f"node{rank}"
        root.mkdir()
        monkeypatch.chdir(root)
        nodes = reproduce.Nodes(2, rank, "10.0.0.1")
        plans = [reproduce.plan(row, gpus, average=1, nodes=nodes) for row in rows]
        data = {path for step in plans[0].steps for path in step.inputs if reproduce.DATA in path.parents}
        for path in data | set(reproduce._scoring_inputs("wmt14_ende", True)):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("x\n")
        programs = _node_programs(root, plans)
        rules = root / "steps.mk"
        rules.write_text(reproduce.make_rules("gret-main-wmt14_ende", plans, gpus, nodes), encoding="utf-8")
        result = subprocess.run(["make", "--no-print-directory", "-f", str(rules), f"BIN={programs}"], cwd=root,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        calls[rank] = [call.split()[0] if "node_share" not in call else "node_share" for call in _calls(root)]
        assert plans[0].checkpoints[-1].exists()  # received on node 1 (the stand-in), trained on node 0
    assert calls[1] == ["onmt_ext_binarize", "onmt_train", "node_share", "onmt_ext_binarize", "onmt_train"]
    assert calls[0] == ["onmt_ext_binarize", "onmt_train", "onmt_ext_binarize", "node_share", "onmt_train",
                        "onmt_translate", "onmt_translate"]


def test_each_node_trains_every_row_first_and_only_node_0_translates(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rows, gpus = reproduce.TABLES["li2019-table3"][:2], (0, 1)
    for path in reproduce._scoring_inputs("wmt14_ende", False):  # the references, not yet the test source
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x\n")
    for rank in (1, 0):
        nodes = reproduce.Nodes(2, rank, "10.0.0.1")
        plans = [reproduce.plan(row, gpus, average=2, nodes=nodes) for row in rows]
        for path in {path for p in plans for path in p.steps[0].inputs}:  # binarising reads what training does
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("x\n")
        (tmp_path / f"node{rank}").mkdir()
        programs = _node_programs(tmp_path / f"node{rank}", plans)
        rules = tmp_path / f"node{rank}.mk"
        rules.write_text(reproduce.make_rules("li2019-table3", plans, gpus, nodes), encoding="utf-8")

        def run():
            return subprocess.run(["make", "--no-print-directory", "-f", str(rules), f"BIN={programs}"],
                                  cwd=tmp_path, capture_output=True, text=True, timeout=60)

        result = run()
        if rank == 0:  # the test source, translated after every training, is checked before any starts
            assert result.returncode != 0 and _calls(tmp_path) == []
            assert "reproduce.py: build/data/wmt14_ende/test.bpe.en is missing" in result.stderr
            Path("build/data/wmt14_ende/test.bpe.en").write_text("x\n")
            result = run()
        assert result.returncode == 0, result.stderr
        trainings = [f"{tool} yaml_configs/{row.config}" for row in rows
                     for tool in ("onmt_ext_binarize", "onmt_train")]
        if rank:
            assert _calls(tmp_path) == trainings
            assert not any(path.exists() for p in plans for path in p.checkpoints)  # no checkpoint on node 1
            assert all((p.run_dir / "train.node1.done").exists() for p in plans)
        else:
            assert _calls(tmp_path) == trainings + ["onmt_average_models 0,1", "onmt_translate 0,1"] * 2
        assert run().returncode == 0 and _calls(tmp_path) == []  # up to date


# ---------------------------------------------------------------- the paper's own metric in "ours - paper"

DETOK_REFERENCES = ["The well-known author didn't arrive until mid-day.", "It's a long-term plan, isn't it?",
                    "She bought three apples and two pears at the market.", "We'll meet at the station at noon.",
                    "The state-of-the-art system wasn't ready for the year-end review."]


def _paper_metric_markdown(tmp_path, table, refs, tok_refs, tok_hyps):
    """Score every row of ``table`` with the hypotheses ``tok_hyps`` (BPE-free, tokenized) against the
    references on disk, and return the Markdown report."""
    task = reproduce.table_task(table)
    src, tgt = reproduce.LANGS[task]
    data = tmp_path / "build/data" / task
    data.mkdir(parents=True)
    (data / f"test.{tgt}").write_text("\n".join(refs) + "\n", encoding="utf-8")
    (data / f"test.tok.{tgt}").write_text("\n".join(tok_refs) + "\n", encoding="utf-8")
    plans = [reproduce.plan(row, (0,)) for row in reproduce.TABLES[table]]
    for p in plans:
        p.run_dir.mkdir(parents=True)
        p.hypotheses.write_text("\n".join(tok_hyps) + "\n", encoding="utf-8")
    rows = reproduce.row_results(plans, reproduce.score(plans, table))
    return rows, reproduce.write_report(table, task, rows, tmp_path / "out")["md"].read_text(encoding="utf-8")


def _delta_cell(row, ours):
    return f"| {row.label} | `{row.config}` | {row.paper_bleu:.2f} | {ours:.2f} | {ours - row.paper_bleu:+.2f} |"


@pytest.mark.parametrize("table", ["chen2019-table1", "cao2019-table2-wmt17_zhen", "li2019-table4-wmt17_zhen",
                                   "gret-main-wmt14_ende", "clause-table10"])
def test_ours_minus_paper_uses_the_papers_own_bleu_on_english_and_german(table, tmp_path, monkeypatch):
    import sacrebleu
    from sacremoses import MosesTokenizer

    from onmt_ext.integration import evaluation

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(reproduce, "BOOTSTRAP_SAMPLES", 10)
    tests, bootstrap = [], evaluation.paired_bootstrap  # the marks' test: which metric, on which references
    monkeypatch.setattr(evaluation, "paired_bootstrap", lambda *args, **kw: tests.append((kw["metric"], args[2]))
                        or bootstrap(*args, **kw))
    tokenizer = MosesTokenizer(lang="en")
    tok_refs = [tokenizer.tokenize(r, aggressive_dash_splits=True, escape=False, return_str=True)
                for r in DETOK_REFERENCES]
    tok_hyps = [r.replace("author", "writer").replace("three", "four").replace("noon", "night") for r in tok_refs]
    rows, markdown = _paper_metric_markdown(tmp_path, table, DETOK_REFERENCES, tok_refs, tok_hyps)
    # multi-bleu.perl on the Moses-tokenized text (tokenize='none'), and NIST mteval-v13a on detokenized text
    multi_bleu = sacrebleu.corpus_bleu(tok_hyps, [tok_refs], tokenize="none", smooth_method="none", force=True).score
    tgt = reproduce.LANGS[reproduce.table_task(table)][1]  # score() detokenizes with the target's rules
    nist = sacrebleu.corpus_bleu([_detok(h, tgt) for h in tok_hyps], [DETOK_REFERENCES], tokenize="13a").score
    assert abs(multi_bleu - nist) > 1  # the two metrics really differ on this text
    assert rows[0]["tok_bleu"] == pytest.approx(multi_bleu) and rows[0]["bleu"] == pytest.approx(nist)
    expected = multi_bleu if table.startswith("chen2019") else nist  # clause (en-de): not stated, sacreBLEU
    for row in reproduce.TABLES[table][:2]:
        if row.paper_bleu is not None:
            assert _delta_cell(row, expected) in markdown
    assert reproduce.paper_metric(table, reproduce.table_task(table))[1] in markdown
    # the significance marks are computed in the paper's metric too (issue 61), and the paper's own test is named
    expected_test = ("tok-bleu", [tok_refs]) if table.startswith("chen2019") else ("bleu", [DETOK_REFERENCES])
    assert tests and all(test == expected_test for test in tests)
    assert reproduce.paper_test(table) in markdown and ("Collins" in markdown) == table.startswith("chen2019")


def _detok(line, lang):
    from sacremoses import MosesDetokenizer

    return MosesDetokenizer(lang=lang).detokenize(line.split())


def test_ours_minus_paper_is_word_level_bleu_on_segmented_chinese_for_clause_table5(tmp_path, monkeypatch):
    import sacrebleu

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(reproduce, "BOOTSTRAP_SAMPLES", 10)
    tok_refs = ["我们 明天 去 北京 开会 。", "他 喜欢 在 公园 里 跑步 。", "这 本 书 非常 有意思 。", "今天 的 天气 很 好 。"]
    tok_hyps = ["我们 明天 到 北京 开会 。", "他 喜欢 在 公园 里 散步 。", "这 本 书 非常 有趣 。", "今天 天气 很 好 。"]
    refs = [r.replace(" ", "") for r in tok_refs]
    rows, markdown = _paper_metric_markdown(tmp_path, "clause-table5", refs, tok_refs, tok_hyps)
    words = sacrebleu.corpus_bleu(tok_hyps, [tok_refs], tokenize="none", smooth_method="none", force=True).score
    characters = sacrebleu.corpus_bleu([h.replace(" ", "") for h in tok_hyps], [refs], tokenize="zh").score
    assert abs(words - characters) > 1 and rows[0]["bleu"] == pytest.approx(characters)
    for row in reproduce.TABLES["clause-table5"]:
        assert _delta_cell(row, words) in markdown
    assert "word-level BLEU on jieba-segmented Chinese" in markdown


def test_every_report_names_our_training_data_beside_the_papers(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    raw = tmp_path / "build/data/wmt17_zhen/raw"
    from tools import prepare_data

    prepare_data.write_corpora(raw, "wmt17_zhen", [("News Commentary v12", 227062)])
    (tmp_path / "build/data/wmt17_zhen/clean").mkdir()
    (tmp_path / "build/data/wmt17_zhen/clean/stats.json").write_text('{"pairs_kept": 225000}')
    table = "cao2019-table2-wmt17_zhen"
    rows = [{"label": row.label, "config": row.config, "paper_bleu": row.paper_bleu, "bleu": 20.0, "tok_bleu": 21.0}
            for row in reproduce.TABLES[table]]
    written = reproduce.write_report(table, "wmt17_zhen", rows, tmp_path / "out")
    markdown = written["md"].read_text(encoding="utf-8")
    assert ("Training data: ours: News Commentary v12 (227,062 pairs); 225,000 pairs after cleaning; the paper's: "
            "WMT17 Zh-En, 20.6M pairs") in markdown
    document = json.loads(written["json"].read_text(encoding="utf-8"))
    assert document["training_data"]["ours"].startswith("News Commentary v12 (227,062 pairs)")
    assert document["paper_metric"]["score"] == "bleu"
    assert all((name.split("-")[0], reproduce.table_task(name)) in reproduce.PAPER_DATA
               for name in reproduce.TABLES if not name.startswith("sample-"))


# ---------------------------------------------------------------- before anything runs: corpus and devices

WMT17_TABLES = [name for name in reproduce.TABLES if reproduce.table_task(name) == "wmt17_zhen"]


def test_the_wmt17_tables_are_those_of_cao2019_li2019_and_gret():
    assert sorted(WMT17_TABLES) == ["cao2019-table1", "cao2019-table2-wmt17_zhen", "gret-main-wmt17_zhen",
                                    "li2019-table4-wmt17_zhen"]


@pytest.mark.parametrize("table", WMT17_TABLES)
def test_wmt17_tables_stop_on_an_extra_directory_that_cannot_serve(table, tmp_path, monkeypatch, capsys):
    """The data step downloads the full corpus itself; what stops a table before any data: WMT17_EXTRA_DIR (the
    user's own UN and CWMT pairs) without its files, or together with WMT17_SMALL_DATA=1."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WMT17_EXTRA_DIR", raising=False)
    assert reproduce.main([table, "--preflight", "--gpus", "cpu"]) == 0  # nothing set: the full corpus is fetched
    monkeypatch.setenv("WMT17_EXTRA_DIR", str(tmp_path / "extra"))
    with pytest.raises(SystemExit) as stop:  # before the data: no build/data at all here
        reproduce.main([table, "--preflight", "--gpus", "cpu"])
    message = str(stop.value)
    assert len(message.splitlines()) == 1 and "lacks train.zh, train.en" in message
    assert "UN Parallel Corpus v1.0" in message and "CWMT" in message and not (tmp_path / "build").exists()
    # a DRY_RUN says the same, as a warning, and prints the commands
    assert reproduce.main([table, "--preflight", "--dry-run"]) == 0 and reproduce.main([table, "--dry-run"]) == 0
    captured = capsys.readouterr()
    assert "reproduce.py: warning: WMT17_EXTRA_DIR=" in captured.err and "onmt_train" in captured.out


def test_the_corpus_check_reads_the_extra_directory_and_the_small_data_choice(tmp_path):
    table = "li2019-table4-wmt17_zhen"
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "train.zh").write_text("你好\n")
    assert "lacks train.en" in reproduce.corpus_problem(table, environ={"WMT17_EXTRA_DIR": str(extra)})
    (extra / "train.en").write_text("hello\n")
    assert reproduce.corpus_problem(table, environ={"WMT17_EXTRA_DIR": str(extra)}) is None
    assert reproduce.corpus_problem(table, environ={}) is None
    assert reproduce.corpus_problem(table, small_data=True, environ={}) is None
    both = reproduce.corpus_problem(table, small_data=True, environ={"WMT17_EXTRA_DIR": str(extra)})
    assert "WMT17_SMALL_DATA=1 trains on News Commentary v12 alone" in both and "unset one of them" in both
    assert reproduce.corpus_problem("li2019-table2", environ={"WMT17_EXTRA_DIR": "/nowhere"}) is None  # WMT14


def test_no_cuda_stops_the_table_before_its_data_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(reproduce, "_cuda_devices", lambda gpus: 0)
    with pytest.raises(SystemExit) as stop:
        reproduce.main(["li2019-table2", "--preflight", "--gpus", "0"])
    assert str(stop.value).startswith("reproduce.py: GPUS=0 asks for CUDA device 0, but torch")
    assert "sees no CUDA device" in str(stop.value) and len(str(stop.value).splitlines()) == 1
    assert not (tmp_path / "build").exists()
    assert reproduce.main(["li2019-table2", "--gpus", "0", "--preflight", "--dry-run"]) == 0
    assert "reproduce.py: warning: GPUS=0 asks for CUDA device 0" in capsys.readouterr().err
    assert reproduce.device_problem((), lambda gpus: 0) is None  # GPUS=cpu needs no CUDA


def test_fewer_gpus_than_asked_and_a_broken_torch_are_one_line_each():
    message = reproduce.device_problem((0, 1, 2, 3), lambda gpus: 2)
    assert "GPUS=0,1,2,3 asks for 4 CUDA devices, but torch sees only 2 of them" in message
    assert reproduce.device_problem((0, 1), lambda gpus: 2) is None
    assert "importing torch failed: ImportError: x" in reproduce.device_problem((0,), lambda gpus: "ImportError: x")
