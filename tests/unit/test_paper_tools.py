"""The paper-table tooling: generated configs, reproduction plans, benchmark configs."""

import argparse
import sys

import pytest
import yaml

import support

sys.path.insert(0, str(support.REPO / "tools"))
import bench  # noqa: E402
import paper_configs  # noqa: E402
import reproduce  # noqa: E402


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


@pytest.mark.parametrize("table", sorted(reproduce.TABLES))
def test_reproduction_plan_uses_existing_configs_and_the_papers_batch(table, capsys):
    assert reproduce.main([table, "--dry-run", "--gpus", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = reproduce.TABLES[table]
    assert len(lines) == 2 * len(rows)
    for row, train, translate in zip(rows, lines[0::2], lines[1::2]):
        config = yaml.safe_load((support.REPO / "yaml_configs" / row.config).read_text(encoding="utf-8"))
        assert train.startswith(f"onmt_train -config yaml_configs/{row.config} ")
        # two GPUs with half the accumulation: the paper's tokens per update
        assert f"-world_size 2 -gpu_ranks 0 1 -accum_count {config['accum_count'][0] // 2} " in train
        assert translate.startswith("onmt_translate -model build/runs/")
    first = yaml.safe_load((support.REPO / "yaml_configs" / rows[0].config).read_text(encoding="utf-8"))
    assert first["encoder_type"] == "transformer", "the first row is the baseline the others are tested against"


def test_reproduction_rejects_a_gpu_count_that_breaks_the_batch():
    with pytest.raises(SystemExit):
        reproduce.main(["li2019-table3", "--gpus", "3"])


@pytest.mark.parametrize("size", ["smoke", "paper"])
def test_bench_configs_parse_strictly_and_keep_the_mechanism(size, tmp_path, onmt_active):
    from onmt_ext.plugin import parse_train_config

    args = argparse.Namespace(warmup_steps=10, steps=20, batch_size=512, gpu=-1)
    for case in bench.SUITES["li2019"]:
        path, checkpoint = bench.bench_config(case, size, args, tmp_path)
        opt = parse_train_config(path)
        paper = yaml.safe_load((support.REPO / "yaml_configs" / case.config).read_text(encoding="utf-8"))
        assert (opt.enc_layers, opt.dec_layers) == (paper["enc_layers"], paper["dec_layers"])
        assert opt.li2019_enc_self == paper.get("li2019_enc_self", "concat")
        assert opt.li2019_enc_layers == paper.get("li2019_enc_layers", [])
        assert opt.routing_compile == paper.get("routing_compile", False)
        assert opt.train_steps == 30 and checkpoint.name == "model_step_30.pt"
        if size == "paper":
            assert opt.hidden_size == paper["hidden_size"] and opt.model_dtype == "fp32"
