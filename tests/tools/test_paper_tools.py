"""The paper-table tooling: generated configs, reproduction plans, benchmark configs."""

import argparse
import math
import re
from pathlib import Path

import pytest
import yaml

import support

import bench
import paper_configs
import reproduce


def test_committed_paper_configs_are_what_the_generator_writes(capsys):
    assert paper_configs.main(["--check"]) == 0, capsys.readouterr().out[-3000:]


def test_generator_check_reports_a_hand_edited_config(tmp_path, monkeypatch):
    path = next(iter(paper_configs.generated()))
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
    assert len(names) == 11 * 2 * 2
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


def test_chen2019_configs_train_with_the_documented_tokens_per_update():
    """sec. 5.1: about 4096 x 4 source and target tokens per batch; docs/chen2019.md says the same."""
    docs = (support.REPO / "docs/chen2019.md").read_text(encoding="utf-8")
    documented = [int(a) * int(b) for a, b in re.findall(r"(\d+) × (\d+) tokens per update", docs)]
    assert documented == [4096 * 4]
    configs = sorted((support.REPO / "yaml_configs/chen2019").glob("*.yaml"))
    assert len(configs) == 56
    for path in configs:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert config["batch_type"] == "tokens", path.name
        tokens = config["batch_size"] * config["accum_count"][0] * config["world_size"]
        assert tokens == documented[0], f"{path.name}: {tokens} tokens per update"


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
    """-reset_optim all restarts the step count; the fine-tuning must not warm Noam up again (issue 37: it peaked
    at 9.9e-4 and ended at twice the baseline's final rate): it holds the baseline's last rate throughout."""
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
    assert train[-2:] == ["-chen2019_dim", "448"]
    assert f"-save_model {run_dirs[-1]}/model" in " ".join(train)
    assert plans[-1].model == run_dirs[-1] / "average_last5.pt"  # averaged inside the sweep point's directory
    assert all(checkpoint.parent == run_dirs[-1] for checkpoint in plans[-1].checkpoints)


@pytest.mark.parametrize("table", sorted(reproduce.TABLES))
def test_reproduction_plan_uses_existing_configs_and_the_papers_batch(table, capsys):
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
    assert first["encoder_type"] == "transformer", "the first row is the baseline the others are tested against"


def test_reproduction_rejects_a_gpu_count_that_breaks_the_batch():
    with pytest.raises(SystemExit, match=r"--gpus 0,1,2 \(3 GPUs\) does not divide accum_count 8"):
        reproduce.main(["li2019-table3", "--gpus", "0,1,2"])


@pytest.mark.parametrize("size", ["smoke", "paper"])
def test_bench_configs_parse_strictly_and_keep_the_mechanism(size, tmp_path, onmt_active):
    from onmt_ext.parsing import parse_train_config

    args = argparse.Namespace(warmup_steps=10, steps=20, batch_size=512, gpu=-1)
    for case in bench.SUITES["li2019"]:
        path, checkpoint, _ = bench.bench_config(case, size, args, tmp_path)
        opt = parse_train_config(path)
        paper = yaml.safe_load((support.REPO / "yaml_configs" / case.config).read_text(encoding="utf-8"))
        assert (opt.enc_layers, opt.dec_layers) == (paper["enc_layers"], paper["dec_layers"])
        assert opt.li2019_enc_self == paper.get("li2019_enc_self", "concat")
        assert opt.li2019_enc_layers == paper.get("li2019_enc_layers", [])
        assert opt.ext_compile == paper.get("ext_compile", False)
        assert opt.train_steps == 30 and checkpoint.name == "model_step_30.pt"
        if size == "paper":
            assert opt.hidden_size == paper["hidden_size"] and opt.model_dtype == "fp32"


@pytest.mark.parametrize("suite", sorted(bench.SUITES))
def test_every_bench_suite_has_a_stock_baseline_and_parses_strictly(suite, tmp_path, onmt_active, monkeypatch):
    from onmt_ext.parsing import parse_train_config

    # the pre-encoded corpora of the clause suite: only their names matter here, not a full encoding pass
    monkeypatch.setattr(bench, "encode_file", lambda model, path, out: out.parent.mkdir(exist_ok=True) or out.touch())
    monkeypatch.setattr(bench.subprocess, "run", lambda command, check: Path(command[command.index("--output") + 1])
                        .touch())
    args = argparse.Namespace(warmup_steps=10, steps=20, batch_size=512, gpu=-1)
    cases = bench.SUITES[suite]
    for size in ("smoke", "paper"):
        for case in cases:
            opt = parse_train_config(bench.bench_config(case, size, args, tmp_path)[0])
            assert not opt.train_from  # speed is measured from scratch, also for fine-tuned rows
            assert (opt.encoder_type == "transformer") == (case is cases[0])


def test_the_bench_control_is_the_baseline_under_its_own_name(tmp_path, onmt_active):
    from onmt_ext.parsing import parse_train_config

    args = argparse.Namespace(warmup_steps=10, steps=20, batch_size=512, gpu=-1)
    for suite in ("li2019", "clause"):
        baseline = bench.SUITES[suite][0]
        control = bench.control_case(baseline)
        assert control.control and control.train_target is control.translate_target is None
        (path, checkpoint, config), (path2, checkpoint2, config2) = (
            bench.bench_config(case, "smoke", args, tmp_path) for case in (baseline, control))
        assert path != path2 and checkpoint.parent != checkpoint2.parent  # nothing shared on disk
        differing = {key for key in config if config[key] != config2[key]}
        assert differing == {"save_data", "save_model"}, differing  # same model, same seed, same data
        assert vars(parse_train_config(path2)).keys() == vars(parse_train_config(path)).keys()


@pytest.mark.parametrize("target", [0.75, 0.9, 0.97])
def test_bench_ratio_cells_never_show_a_ratio_on_the_wrong_side_of_its_target(target):
    """Around the target (steps of 1e-4), the verdict follows ratio >= target, and the printed ratio, read back,
    lies on the verdict's side of the target unless the ratio is within 5e-4 of it; it is the ratio rounded."""
    for step in range(-300, 301):
        ratio = round(target + step / 10000, 4)
        text, paper = bench._ratio_cell(ratio, target, None).split(" | ")
        shown, verdict, relation, printed_target = text.replace("(", "").replace(")", "").split(" ")
        assert relation == ">=" and verdict in ("meets", "BELOW"), text
        assert verdict == ("meets" if ratio >= target else "BELOW"), (ratio, text)
        assert float(printed_target) == target and paper == "n/a"
        decimals = len(shown.split(".")[1])
        assert abs(float(shown) - ratio) <= 0.5 * 10 ** -decimals + 1e-12, (ratio, text)
        if abs(ratio - target) >= 0.0005:
            assert (float(shown) >= target) == (verdict == "meets"), (ratio, text)
    assert bench._ratio_cell(0.5, None, None).split(" | ")[0] == "0.50"  # no target: no verdict


def test_bench_paper_ratio_cells_round_half_up_as_the_readme_quotes_them():
    for paper in (1.20 / 1.92, 1.23 / 1.92, 0.125, 0.9949, 1.0):
        quoted = bench._ratio_cell(1.0, None, paper).split(" | ")[1]
        assert abs(float(quoted) - paper) <= 0.005 + 1e-12 and len(quoted.split(".")[1]) == 2, (paper, quoted)
    assert bench._ratio_cell(1.0, None, 1.20 / 1.92).endswith("| 0.63")  # 0.625 up, where float rounding gives 0.62
    assert bench._ratio_cell(1.0, None, 0.125).endswith("| 0.13")
    assert bench._ratio_cell(1.0, None, None).endswith("| n/a")


def test_bench_schedule_puts_every_case_run_between_two_baseline_runs():
    base, a, b = (bench.Case(name, f"{name}.yaml") for name in "Bab")
    assert bench.translation_schedule((base, a, b), base, 3) == [base, a, base, b, base, b, base, a, base, a, base,
                                                                 b, base]
    assert bench.translation_schedule((a, base, b), base, 1) == [base, a, base, b, base]  # whatever its position


def test_bench_round_pairs_each_run_with_the_baseline_runs_beside_it(monkeypatch):
    """Training once per case; beam search runs --translate-repeats passes and greedy search --greedy-repeats;
    a case's figure is the median of its runs, its ratios its speed over the geometric mean of its neighbours."""
    calls = []
    speeds = {"B": iter([4.0, 16.0, 9.0, 1.0]), "a": iter([4.0, 6.0, 30.0])}
    monkeypatch.setattr(bench, "measure_training", lambda case, *rest: ({"train": case.label}, case.label))

    def translation(search, model, *rest):
        calls.append((search[0], model))
        return {f"{search[0]}_sentences_per_s": next(speeds[model]) if search[0] == "translate" else 1.0}

    monkeypatch.setattr(bench, "measure_translation", translation)
    cases = (bench.Case("B", "B.yaml"), bench.Case("a", "a.yaml"))
    args = argparse.Namespace(translate_repeats=3, greedy_repeats=2)
    figures = bench.measure_round(cases, "smoke", args, None, None, "test", cases[0])
    assert calls == [("translate", name) for name in "BaBaBaB"] + [("greedy", name) for name in "BaBaB"]
    assert figures[cases[0]] == {"train": "B", "translate_sentences_per_s": 6.5, "greedy_sentences_per_s": 1.0,
                                 "translate_ratios": [1.0, 1.0, 1.0], "greedy_ratios": [1.0, 1.0]}
    assert figures[cases[1]]["translate_sentences_per_s"] == 6.0
    assert figures[cases[1]]["translate_ratios"] == [0.5, 0.5, 10.0]  # 4 / sqrt(4 * 16), 6 / 12, 30 / 3
    assert figures[cases[1]]["greedy_ratios"] == [1.0, 1.0]


def test_bench_pools_repeats_and_reports_the_median_paired_ratio_with_its_interval():
    runs = [{"train_tokens_per_s": 10.0, "translate_ratios": [0.9, 1.0, 0.95]},
            {"train_tokens_per_s": 30.0, "translate_ratios": [0.97, 0.98, 0.96]},
            {"train_tokens_per_s": 20.0, "translate_ratios": [0.99, 0.94, 0.93]}]
    pooled = bench.pool(runs)
    assert pooled["train_tokens_per_s"] == 20.0
    assert sorted(pooled["translate_ratios"]) == [0.9, 0.93, 0.94, 0.95, 0.96, 0.97, 0.98, 0.99, 1.0]
    assert bench._translation_ratio(pooled, "translate") == (0.96, (0.93, 0.99))  # 2nd and 8th of 9
    assert bench._translation_ratio({"greedy_ratios": [0.9, 1.0, 0.8]}, "greedy") == (0.9, None)  # too few
    assert bench._ratio_cell(0.96, 0.97, None, (0.93, 0.99)) == "0.96 [0.930, 0.990] (BELOW >= 0.97) | n/a"


@pytest.mark.parametrize("n, expected", [(5, None), (6, (1, 6)), (9, (2, 8)), (15, (4, 12)), (30, (10, 21))])
def test_median_interval_takes_the_binomial_order_statistics(n, expected):
    """The textbook 95% intervals for the median (e.g. the 10th and 21st of 30 values)."""
    values = [float(v) for v in range(n, 0, -1)]  # unsorted on purpose
    assert bench.median_interval(values) == expected
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

    import layer_cost
    from onmt_ext.li2019 import RoutingAggregation
    from onmt_ext.clause_attention import ClauseAttention
    from onmt_ext.cao2019 import CrossAggregation

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


def test_bench_spreads_its_test_sentences_over_the_sorted_test_set():
    assert bench.spread_indices(10, 4) == [0, 2, 5, 7]
    assert bench.spread_indices(3, 5) == [0, 1, 2]  # never more than there are
    assert bench.natural_output_length(7.63) == 9  # the mean reference's pieces and the end-of-sentence step
    assert bench.natural_output_length(0.2) == 1


def test_bench_test_source_reports_its_lengths(sample_data, tmp_path):
    import sentencepiece as spm

    path, source_pieces, reference_pieces = bench._test_source(tmp_path, 50)
    lines = path.read_text(encoding="utf-8").splitlines()
    everything = (sample_data / "test.zh").read_text(encoding="utf-8").splitlines()
    chosen = bench.spread_indices(len(everything), 50)
    assert len(lines) == 50 and chosen[-1] > len(everything) * 0.9  # reaches the end of the sorted set
    zh = spm.SentencePieceProcessor(model_file=str(sample_data / "spm.zh.model"))
    assert lines[7].split() == zh.encode(everything[chosen[7]], out_type=str)
    assert source_pieces == sum(len(line.split()) for line in lines) / 50
    # the head of the set is shorter than the spread sample: the reason for spreading
    (tmp_path / "head").mkdir()
    head, head_source, head_reference = bench._test_source(tmp_path / "head", 1)
    assert head_source < source_pieces and head_reference < reference_pieces


def test_translate_profile_pairs_each_run_with_the_first_model_of_its_pair():
    import translate_profile

    parts = {"encoder": 0.1, "decoder": 0.5, "generator": 0.1, "map_state": 0.1, "other": 0.2}
    totals = {("a", 0): 1.0, ("b", 0): 1.25, ("a", 1): 2.0, ("b", 1): 2.0, ("a", 2): 1.0, ("b", 2): 2.0}
    runs = [{"steps": 5, "pair": pair, "model": model, "total": total, **parts}
            for (model, pair), total in totals.items()]
    rows = translate_profile.summarise(runs, ["a", "b"])
    assert [(row["model"], row["ratio"], row["total"]) for row in rows] == [("a", 1.0, 1.0), ("b", 0.8, 2.0)]
    assert rows[1]["interval"] is None  # three pairs are too few for a 95% interval
    assert "| 5 | b | 2.000 | 0.100 | 0.500 | 0.100 | 0.100 | 0.200 | 0.800 |" in translate_profile.report(rows)


def test_translate_profile_flops_report_divides_the_first_models_total_by_each_ones_at_the_same_length():
    import translate_profile

    counts = [{"steps": steps, "model": model, "total": total, "encoder": 1e9, "decoder": 2e9, "generator": 5e8}
              for steps, model, total in ((9, "a", 4e9), (9, "b", 5e9), (20, "a", 8e9), (20, "b", 1e10))]
    table = translate_profile.flops_report(counts, ["a", "b"])
    assert "| 9 | a | 4.000 | 1.000 | 2.000 | 0.500 | 1.000 |" in table
    assert "| 9 | b | 5.000 | 1.000 | 2.000 | 0.500 | 0.800 |" in table
    assert "| 20 | b | 10.000 | 1.000 | 2.000 | 0.500 | 0.800 |" in table
