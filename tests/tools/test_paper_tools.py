"""The paper-table tooling: generated configs, reproduction plans, the configs and schedule of timed runs."""

import argparse
import math
import os
import time
from pathlib import Path

import pytest
import yaml

import support

from tools import paper_configs
from tools import reproduce
from tools import timed_runs
from tools.gpu_check import cases


def test_committed_paper_configs_are_what_the_generator_writes(capsys):
    assert paper_configs.main(["--check"]) == 0, capsys.readouterr().out[-3000:]


def test_generator_check_reports_a_hand_edited_config(tmp_path, monkeypatch):
    path = next(path for path, text in paper_configs.generated().items() if "li2019_enc" in text)
    edited = tmp_path / "edited.yaml"
    edited.write_text(path.read_text(encoding="utf-8").replace("li2019_enc", "li2019_X", 1), encoding="utf-8")
    monkeypatch.setattr(paper_configs, "generated", lambda: {edited: path.read_text(encoding="utf-8")})
    assert paper_configs.main(["--check"]) == 1


def test_cao2019_has_table_1_on_zhen_and_table_2_on_both_tasks():
    names = {p.stem for p in (support.REPO / "yaml_configs/cao2019").glob("*.yaml")}
    rows = ("baseline", "horizontal_zero", "horizontal_self", "cross_zero", "cross_self")
    assert {f"transformer_base_wmt17_zhen_{row}" for row in rows} <= names
    assert {"transformer_base_wmt14_ende_baseline", "transformer_base_wmt14_ende_cross_zero"} <= names
    assert len(names) == 7


def test_li2019_has_every_table_row_at_both_sizes_and_tasks():
    names = {p.stem for p in (support.REPO / "yaml_configs/li2019").glob("*.yaml")}
    assert len(names) == 12 * 2 * 2  # the baseline and 11 routing rows
    for size in ("base", "big"):
        for task in ("wmt14_ende", "wmt17_zhen"):
            assert f"transformer_{size}_{task}_em_enc_self_layers_1-2" in names  # Effective Aggregation
            assert f"transformer_{size}_{task}_simple_enc_self" in names


def test_chen2019_has_every_row_of_tables_1_to_3_at_both_sizes_and_tasks():
    names = {p.stem for p in (support.REPO / "yaml_configs/chen2019").glob("*.yaml")}
    rows = ("baseline", "relative_pe", "disan", "rpehead", "mprhead", "rpehead_restricted", "mprhead_restricted",
            "no_pe_dec", "no_pe_enc", "no_pe_enc_dec", "rpehead_no_dec", "rpehead_no_enc", "mprhead_no_dec",
            "mprhead_no_enc")
    assert names == {f"transformer_{size}_{task}_{row}" for size in ("base", "big")
                     for task in ("wmt14_ende", "nist_zhen") for row in rows}
    for size, dims in paper_configs.CHEN2019_DR.items():
        for layout, dim in dims.items():
            rpe = yaml.safe_load((support.REPO / f"yaml_configs/chen2019/transformer_{size}_nist_zhen_{layout}.yaml")
                                 .read_text())
            assert rpe["chen2019_dim"] == dim and rpe["chen2019_enc"] == rpe["chen2019_dec"] == layout
            assert dim / rpe["hidden_size"] == paper_configs.CHEN2019_DR["base"][layout] / 512  # Base's d_r / d
    assert paper_configs.CHEN2019_DR["base"] == {"rpehead": 320, "mprhead": 256}  # sec. 5.3


def test_chen2019_configs_train_with_the_papers_tokens_per_update():
    """sec. 5.1: about 4096 x 4 source and target tokens per batch, on every GPU count the configs use."""
    paper = 4096 * 4
    configs = sorted((support.REPO / "yaml_configs/chen2019").glob("*.yaml"))
    assert len(configs) == 56
    for path in configs:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert config["batch_type"] == "tokens", path.name
        assert len(config["accum_count"]) == 1 and not config.get("accum_steps", [0])[0], path.name  # no schedule
        tokens = config["batch_size"] * config["accum_count"][0] * config["world_size"]
        assert tokens == paper, f"{path.name}: {tokens} tokens per update"


def _learning_rates(opt, steps, checkpoint=None):
    """OpenNMT-py's own optimizer for ``opt`` (from ``checkpoint`` as -train_from would load it) at ``steps``."""
    import torch
    from onmt.utils.optimizers import Optimizer

    optimizer = Optimizer.from_opt(torch.nn.Linear(2, 2), opt, checkpoint=checkpoint)
    first = optimizer.training_step
    rates = []
    for step in steps:
        optimizer._decay_step = step
        rates.append(optimizer.learning_rate())
    return first, rates


def test_gret_fine_tuning_continues_at_the_baselines_final_learning_rate(onmt_active):
    """-reset_optim all restarts the step count; the fine-tuning must not warm Noam up again (issue 37, with the
    configs' schedule of then: it peaked at 9.9e-4 and ended at twice the baseline's final rate): it holds the
    baseline's last rate throughout."""
    import torch

    cpu = ["-model_dtype", "fp32", "-gpu_ranks", "-world_size", "1"]
    tuned = sorted((support.REPO / "yaml_configs/gret").glob("*_gret*.yaml"))
    assert len(tuned) == 11
    for path in tuned:
        opt = support.load_train_opts(path.relative_to(support.REPO), *cpu)
        base_path = path.parent / (path.stem.split("_gret")[0] + "_baseline.yaml")
        base = support.load_train_opts(base_path.relative_to(support.REPO), *cpu)
        _, [final] = _learning_rates(base, [base.train_steps])
        adam = torch.optim.Adam(torch.nn.Linear(2, 2).parameters())
        checkpoint = {"opt": base, "optim": {"training_step": base.train_steps + 1,
                                             "decay_step": base.train_steps + 1, "optimizer": adam.state_dict()}}
        first, rates = _learning_rates(opt, [1, 2, 100, base.warmup_steps, opt.train_steps], checkpoint)
        assert first == 1  # reset_optim all: the step count restarts
        assert final < 3e-4 and rates == pytest.approx([final] * len(rates), rel=1e-8), path.name


def test_gret_rows_fine_tune_from_their_baseline_checkpoint():
    configs = support.REPO / "yaml_configs/gret"
    tuned = [p for p in configs.glob("*.yaml") if "_gret" in p.stem]
    assert len(tuned) == 2 * 4 + 3  # main results at Base and Big on four tasks; three ablations
    for path in tuned:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
        baseline = yaml.safe_load((configs / (path.stem.split("_gret")[0] + "_baseline.yaml")).read_text())
        assert config["train_from"] == f"{baseline['save_model']}_step_{baseline['train_steps']}.pt"
        assert config["override_opts"] is True and config["reset_optim"] == "all" and config["gret"] is True
        twin = yaml.safe_load((support.REPO / "yaml_configs/smoke/gret" / path.name).read_text(encoding="utf-8"))
        assert "train_from" not in twin  # the smoke twins train from scratch (the fine-tuning is tested apart)


def test_sweep_rows_train_into_their_own_directories():
    plans = [reproduce.plan(row, (0,)) for row in reproduce.TABLES["chen2019-figure2-mprhead"]]
    run_dirs = [p.run_dir for p in plans]
    assert len(set(run_dirs)) == len(run_dirs) == 8
    train = plans[-1].commands[0]
    assert train[-4:] == ["-chen2019_dim", "448", "-ext_binarized_cache", "build/binarized"]
    assert f"-save_model {run_dirs[-1]}/model" in " ".join(train)
    assert plans[-1].model == run_dirs[-1] / "average_last5.pt"  # averaged inside the sweep point's directory
    assert all(checkpoint.parent == run_dirs[-1] for checkpoint in plans[-1].checkpoints)


@pytest.mark.parametrize("table", sorted(reproduce.TABLES))
def test_reproduction_plan_uses_existing_configs_and_the_papers_batch(table, capsys, onmt_active):
    rows = reproduce.TABLES[table]
    configs = [yaml.safe_load((support.REPO / "yaml_configs" / row.config).read_text(encoding="utf-8"))
               for row in rows]
    devices = "0,1" if all(config["accum_count"][0] % 2 == 0 for config in configs) else "1"  # (clause: one GPU)
    gpus = len(devices.split(","))
    assert reproduce.main([table, "--dry-run", "--gpus", devices]) == 0
    prefix = f"CUDA_VISIBLE_DEVICES={devices} "
    lines = [line.removeprefix(prefix) for line in capsys.readouterr().out.splitlines()
             if line.startswith(prefix + "onmt_train") or line.startswith(prefix + "onmt_translate")]
    per_row = 1 + len(reproduce.test_sets(reproduce.table_task(table)))  # training, then each test set
    assert len(lines) == per_row * len(rows)
    for row, config, train, translate in zip(rows, configs, lines[0::per_row], lines[1::per_row]):
        assert train.startswith(f"onmt_train -config yaml_configs/{row.config} ")
        # with two GPUs half the accumulation: the paper's tokens per update
        ranks = " ".join(map(str, range(gpus)))
        assert f"-world_size {gpus} -gpu_ranks {ranks} -accum_count {config['accum_count'][0] // gpus} " in train
        assert translate.startswith("onmt_translate -model build/runs/")
        assert " -gpu 0 " in translate  # the first visible device
        if config.get("clause_attention"):  # the test source is split as in training
            assert f"-transforms clause_split -clause_lang {config['clause_lang']}" in translate
    first = yaml.safe_load((support.REPO / "yaml_configs" / rows[0].config).read_text(encoding="utf-8"))
    from onmt_ext.options import OPTION_SPECS

    # the first row is the baseline the others are tested against: no mechanism on (post-norm papers' baselines
    # are onmt-ext's Transformer with -ext_layer_norm post, docs/normalisation.md)
    mechanisms = {spec.name: spec.default for spec in OPTION_SPECS if not spec.name.startswith("ext_")}
    assert mechanisms and all(first.get(name, default) == default for name, default in mechanisms.items())
    assert first["encoder_type"] == ("ext_transformer" if first.get("ext_layer_norm") == "post" else "transformer")
    # each row differs from the baseline by its mechanism only: the same layer-norm placement in every row (li2019's
    # post-norm rows were once tested against the shared pre-norm baseline/ configs)
    norms = {row.config: config.get("ext_layer_norm", "pre") for row, config in zip(rows, configs)}
    assert len(set(norms.values())) == 1, norms


def test_reproduction_rejects_a_gpu_count_that_breaks_the_batch():
    with pytest.raises(SystemExit, match=r"--gpus 0,1,2 \(3 GPUs\) does not divide accum_count 8"):
        reproduce.main(["li2019-table3", "--gpus", "0,1,2"])


def _no_encoding(monkeypatch):
    """Pre-encoded corpora by name only: a timed run's config is checked here, not a full encoding pass."""
    monkeypatch.setattr(timed_runs, "encode_file", lambda model, path, out, **_: out.parent.mkdir(exist_ok=True)
                        or out.touch())
    monkeypatch.setattr(timed_runs.subprocess, "run", lambda command, check: Path(
        command[command.index("--output") + 1]).touch())


@pytest.mark.parametrize("size", ["smoke", "paper"])
def test_timed_configs_parse_strictly_and_keep_the_mechanism(size, tmp_path, onmt_active, monkeypatch):
    from onmt_ext.integration.parsing import parse_train_config

    _no_encoding(monkeypatch)
    args = argparse.Namespace(warmup_steps=10, steps=20, batch_size=512, gpu=-1)
    for case in (cases.BASELINE, *cases.MECHANISMS):
        path, checkpoint, _ = timed_runs.case_config(case, size, args, tmp_path)
        opt = parse_train_config(path)
        paper = yaml.safe_load((support.REPO / "yaml_configs" / case.config).read_text(encoding="utf-8"))
        assert (opt.enc_layers, opt.dec_layers) == (paper["enc_layers"], paper["dec_layers"])
        assert opt.li2019_enc_self == paper.get("li2019_enc_self", "concat")
        assert opt.li2019_enc_layers == paper.get("li2019_enc_layers", [])
        assert opt.ext_compile == paper.get("ext_compile", "auto")
        assert opt.train_steps == 30 and checkpoint.name == "model_step_30.pt"
        assert not opt.train_from  # speed is measured from scratch, also for fine-tuned rows
        assert (opt.encoder_type == "transformer") == (case is cases.BASELINE)
        if size == "paper":
            assert opt.hidden_size == paper["hidden_size"] and opt.model_dtype == "fp32"


def test_the_timing_control_is_the_baseline_under_its_own_name(tmp_path, onmt_active, monkeypatch):
    from onmt_ext.integration.parsing import parse_train_config

    _no_encoding(monkeypatch)
    args = argparse.Namespace(warmup_steps=10, steps=20, batch_size=512, gpu=-1)
    baseline = cases.BASELINE
    control = timed_runs.control_case(baseline)
    assert control.control and control.train_target is control.translate_target is None
    (path, checkpoint, config), (path2, checkpoint2, config2) = (
        timed_runs.case_config(case, "smoke", args, tmp_path) for case in (baseline, control))
    assert path != path2 and checkpoint.parent != checkpoint2.parent  # nothing shared on disk
    differing = {key for key in config if config[key] != config2[key]}
    assert differing == {"save_data", "save_model"}, differing  # same model, same seed, same data
    assert vars(parse_train_config(path2)).keys() == vars(parse_train_config(path)).keys()


def test_timed_schedule_puts_every_case_run_between_two_baseline_runs():
    base, a, b = (timed_runs.Case(name, f"{name}.yaml") for name in "Bab")
    assert timed_runs.translation_schedule((base, a, b), base, 3) == [base, a, base, b, base, b, base, a, base, a,
                                                                      base, b, base]
    assert timed_runs.translation_schedule((a, base, b), base, 1) == [base, a, base, b, base]  # whatever its place


@pytest.mark.parametrize("n, expected", [(5, None), (6, (1, 6)), (9, (2, 8)), (15, (4, 12)), (30, (10, 21))])
def test_median_interval_takes_the_binomial_order_statistics(n, expected):
    """The textbook 95% intervals for the median (e.g. the 10th and 21st of 30 values)."""
    values = [float(v) for v in range(n, 0, -1)]  # unsorted on purpose
    assert timed_runs.median_interval(values) == expected
    if expected:  # its coverage reaches 95%, and the next narrower interval's does not
        k = int(expected[0])
        coverage = 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n
        narrower = 1 - 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n
        assert coverage >= 0.95 > narrower


@pytest.mark.parametrize("variant", ["baseline", "cao2019", "clause", "li2019-em", "li2019-simple"])
def test_layer_cost_times_the_variant_s_own_mechanism_and_reports_the_median(variant, onmt_active, capsys,
                                                                              monkeypatch):
    """Each timed pass runs the variant's mechanism (and no other); ``seconds`` is the median of the timed passes
    (a fake clock: passes of 1, 2 and 5 s after the untimed first one)."""
    import json
    import types

    from tools import layer_cost
    from onmt_ext.mechanisms.li2019 import RoutingAggregation
    from onmt_ext.mechanisms.clause.attention import ClauseAttention
    from onmt_ext.mechanisms.cao2019 import CrossAggregation

    calls = []
    for cls in (RoutingAggregation, ClauseAttention, CrossAggregation):
        def counting(self, *inputs, _stock=cls.forward, **kwargs):
            calls.append(f"{type(self).__name__} {getattr(self, 'method', '')}".strip())
            return _stock(self, *inputs, **kwargs)
        monkeypatch.setattr(cls, "forward", counting)
    clock = iter([0.0, 1.0, 10.0, 12.0, 20.0, 25.0])
    monkeypatch.setattr(layer_cost, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    args = argparse.Namespace(variant=variant, gpu=-1, d_model=16, heads=2, batch=2, length=13, repeats=3)
    layer_cost.child(args)
    measured = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert measured["seconds"] == 2.0 and measured["peak_mb"] >= 0
    expected = {"baseline": None, "cao2019": "CrossAggregation", "clause": "ClauseAttention",
                "li2019-em": "RoutingAggregation em", "li2019-simple": "RoutingAggregation simple"}[variant]
    assert calls == ([] if expected is None else [expected] * 4), calls  # the untimed pass and three timed ones


def test_timed_runs_spread_their_test_sentences_over_the_sorted_test_set():
    assert timed_runs.spread_indices(10, 4) == [0, 2, 5, 7]
    assert timed_runs.spread_indices(3, 5) == [0, 1, 2]  # never more than there are
    assert timed_runs.natural_output_length(7.63) == 9  # the mean reference's pieces and the end-of-sentence step
    assert timed_runs.natural_output_length(0.2) == 1


def test_timed_translation_source_reports_its_lengths(sample_data, tmp_path):
    import sentencepiece as spm

    path, source_pieces, reference_pieces = timed_runs.translation_source(tmp_path, 50)
    lines = path.read_text(encoding="utf-8").splitlines()
    everything = (sample_data / "test.zh").read_text(encoding="utf-8").splitlines()
    chosen = timed_runs.spread_indices(len(everything), 50)
    assert len(lines) == 50 and chosen[-1] > len(everything) * 0.9  # reaches the end of the sorted set
    zh = spm.SentencePieceProcessor(model_file=str(sample_data / "spm.zh.model"))
    assert lines[7].split() == zh.encode(everything[chosen[7]], out_type=str)
    assert source_pieces == sum(len(line.split()) for line in lines) / 50
    # the head of the set is shorter than the spread sample: the reason for spreading
    (tmp_path / "head").mkdir()
    head, head_source, head_reference = timed_runs.translation_source(tmp_path / "head", 1)
    assert head_source < source_pieces and head_reference < reference_pieces


def _later(path, seconds=10):
    """Give ``path`` a modification time ``seconds`` after now, as a file remade later would have."""
    stamp = time.time() + seconds
    os.utime(path, (stamp, stamp))


def test_a_repeated_test_set_is_made_again_from_a_newer_one(tmp_path):
    """An earlier run's copy of another test set under the same name (same number of copies) is not reused: the
    check once timed 16 sentences while counting 200."""
    source = tmp_path / "test.sp.zh"
    source.write_text("a\n" * 16, encoding="utf-8")
    repeated = timed_runs.repeated_file(source, 3)
    assert repeated.read_text(encoding="utf-8").count("\n") == 48
    made = repeated.stat().st_mtime_ns
    assert timed_runs.repeated_file(source, 3).stat().st_mtime_ns == made  # unchanged source: kept
    source.write_text("b\n" * 200, encoding="utf-8")
    _later(source)
    assert timed_runs.repeated_file(source, 3).read_text(encoding="utf-8") == "b\n" * 600


def test_repeated_training_sources_are_varied_copies_that_a_batch_keeps(tmp_path):
    """OpenNMT-py drops a training source line already in the batch: plain copies of the sample were mostly
    dropped.  Varied copies differ from each other, and keep each line's pieces, length and clause markers."""
    line = "▁你 ｟cl4_prep｠ ▁用 ▁跑 ▁的 ▁。"
    copies = [timed_runs.varied_line(line, copy) for copy in range(10)]
    assert copies[0] == line and len(set(copies)) == 10  # 5 pieces: 5 rotations, each also reversed
    for copy in copies:
        pieces = copy.split()
        assert sorted(pieces) == sorted(line.split()) and pieces[1] == "｟cl4_prep｠"
    assert timed_runs.varied_line("▁嗨", 3) == "▁嗨"  # one piece: nothing to vary
    source = tmp_path / "train.sp.zh"
    source.write_text("a b c\nd e\n", encoding="utf-8")
    (tmp_path / "train.sp.zh.clause_split.json").write_text('{"levels": 4}', encoding="utf-8")
    varied = timed_runs.repeated_file(source, 3, varied=True)
    assert varied.read_text(encoding="utf-8") == "a b c\nd e\nb c a\ne d\nc a b\ne d\n"
    copied = tmp_path / "train.sp.zh.v3.clause_split.json"  # the clause split's record, which -clause_presplit reads
    assert copied.read_text(encoding="utf-8") == '{"levels": 4}'
    assert timed_runs.repeated_file(source, 3).read_text(encoding="utf-8") == "a b c\nd e\n" * 3


def test_a_spread_subset_keeps_a_length_sorted_corpus_lengths(tmp_path, sample_data):
    """The dry run's corpus is ``limit`` lines evenly spaced over the sample (which is sorted by length), not its
    shortest first lines."""
    source = tmp_path / "train.zh"
    source.write_text("".join("字 " * (index + 1) + "\n" for index in range(10)), encoding="utf-8")
    model = sample_data / "spm.zh.model"
    spread = timed_runs.encode_file(model, source, tmp_path / "spread.sp", limit=3, spread=True)
    head = timed_runs.encode_file(model, source, tmp_path / "head.sp", limit=3)
    everything = timed_runs.encode_file(model, source, tmp_path / "all.sp").read_text(encoding="utf-8").splitlines()
    assert spread.read_text(encoding="utf-8").splitlines() == [everything[0], everything[3], everything[6]]
    assert head.read_text(encoding="utf-8").splitlines() == everything[:3]


def test_pre_encoded_copies_follow_their_corpus_and_model(tmp_path, monkeypatch):
    encoded = []

    def encode(model, path, out, limit=None, spread=False):
        encoded.append(Path(path).name)
        out.parent.mkdir(parents=True, exist_ok=True)
        lines = Path(path).read_text(encoding="utf-8").splitlines(True)
        out.write_text("".join(lines[::len(lines) // limit] if spread and limit else lines[:limit]), encoding="utf-8")
        return out

    monkeypatch.setattr(timed_runs, "encode_file", encode)
    corpus = {name: tmp_path / name for name in ("train.zh", "train.en", "spm.model")}
    for path in corpus.values():
        path.write_text("x\n", encoding="utf-8")

    def config():
        return {"transforms": ["sentencepiece"], "src_subword_model": str(corpus["spm.model"]),
                "tgt_subword_model": str(corpus["spm.model"]),
                "data": {"corpus_1": {"path_src": str(corpus["train.zh"]), "path_tgt": str(corpus["train.en"])}}}

    work = tmp_path / "work"
    first = config()
    timed_runs._use_pre_encoded_data(first, work, repeat=2)
    assert encoded == ["train.zh", "train.en"] and first["transforms"] == []
    assert Path(first["data"]["corpus_1"]["path_src"]).read_text(encoding="utf-8") == "x\nx\n"
    assert first["data"]["corpus_1"]["path_src"].endswith(".v2")  # the source's copies varied, the target's not
    assert first["data"]["corpus_1"]["path_tgt"].endswith(".x2")
    timed_runs._use_pre_encoded_data(config(), work, repeat=2)
    assert encoded == ["train.zh", "train.en"]  # nothing newer: the copies stand
    corpus["train.zh"].write_text("y\n", encoding="utf-8")
    _later(corpus["train.zh"])
    again = config()
    timed_runs._use_pre_encoded_data(again, work, repeat=2)
    assert encoded[2:] == ["train.zh"]  # the remade corpus only, and its repeated copy after it
    assert Path(again["data"]["corpus_1"]["path_src"]).read_text(encoding="utf-8") == "y\ny\n"
    _later(corpus["spm.model"], 20)
    timed_runs._use_pre_encoded_data(config(), work, repeat=2)
    assert encoded[3:] == ["train.zh", "train.en"]  # a newer subword model: both sides again
    with_valid = config()
    with_valid["data"]["valid"] = {"path_src": "/nowhere/valid.zh", "path_tgt": "/nowhere/valid.en"}
    timed_runs._use_pre_encoded_data(with_valid, work, repeat=2)
    assert not [name for name in encoded if "valid" in name]  # never validated: it reads the training copies
    assert with_valid["data"]["valid"]["path_src"] == str(work / "data" / "train.zh.sp")
    corpus["train.zh"].write_text("y\nz\n", encoding="utf-8")
    head = config()
    timed_runs._use_pre_encoded_data(head, work, repeat=2, lines=1)  # the dry run's lines: copies apart
    assert Path(head["data"]["corpus_1"]["path_src"]).read_text(encoding="utf-8") == "y\ny\n"
    assert Path(head["data"]["corpus_1"]["path_src"]).name == "train.zh.spread1.sp.v2"


def test_cao2019_weights_names_itself_and_the_option_of_an_unreadable_source(tmp_path, capsys):
    """The helpers it shares with gret_probe.py write their errors under cao2019_weights.py's name, naming -src."""
    from tools import cao2019_weights

    with pytest.raises(SystemExit) as error:
        cao2019_weights.main(["-model", str(tmp_path / "m.pt"), "-src", str(tmp_path / "missing")])
    err = capsys.readouterr().err
    assert error.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"cao2019_weights.py: error: -src {tmp_path / 'missing'}: cannot read"), err
