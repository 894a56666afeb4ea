"""tools/gpu_check/plan.py, the budget scheduler's pure functions, on hand-made inputs (no process, no device).

The dry run (tests/tools/test_gpu_check.py) runs them on the real options; here each one's rule is pinned:
the stages' deadlines, the walk that says which rows fit, the shares, the choice of timed runs and the split of
a part that does not fit.
"""

import math
import types

import pytest

from tools.gpu_check import cli, plan
from tools.gpu_check.cases import MECHANISMS


def test_a_stage_ends_its_share_after_it_starts_and_a_cumulative_one_when_the_budgets_so_far_are_spent(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(plan, "monotonic_now", lambda: clock[0])
    args = types.SimpleNamespace(part="all", tiny=False, budget_a=80.0, budget_b=200.0, budget_c=100.0)
    schedule = plan.Schedule(args)
    assert schedule.deadline("a") == 100.0 + 80.0  # a's whole share, from now
    clock[0] = 150.0  # a ended early: b fresh still gets its own share from now
    assert schedule.deadline("b fresh") == pytest.approx(150.0 + 0.50 * 200.0)
    # b compiled (cumulative) ends when a, b fresh, b eager and its own shares are spent, counted from the start
    schedule.deadline("b eager")
    assert schedule.deadline("b compiled") == pytest.approx(100.0 + 80.0 + 0.5 * 200.0 + 0.5 * 200.0 + 0.0)
    assert schedule.deadline("c eager", whole=True) == pytest.approx(150.0 + 100.0)  # whole: the section's budget
    schedule.record("a", 100.0, 180.0, 150.0, "done")
    assert schedule.parts == [{"part": "a", "budget_s": 80.0, "seconds": 50.0, "status": "done"}]


def test_the_dry_run_takes_the_tiny_shares():
    args = types.SimpleNamespace(part="all", tiny=True, budget_a=20.0, budget_b=100.0, budget_c=40.0)
    schedule = plan.Schedule(args)
    assert schedule.deadline("b eager") - schedule.start == pytest.approx(0.27 * 100.0, abs=0.5)


def test_left_out_walks_the_stages_and_skips_a_row_that_would_end_late():
    stages = [("a", 10.0, False, [(None, 4.0), ("slow", 7.0), ("fast", 5.0)]),  # slow would end at 11
              ("b", 5.0, True, [("late", 1.0)])]  # cumulative: ends at 15, the clock is at 9
    out, seconds = plan.left_out(stages)
    assert out == ["slow"] and seconds == 10.0
    assert plan.left_out([("a", 1.0, False, [(None, 5.0)])]) == ([], 5.0)  # a fixed cost always runs
    assert plan.left_out([]) == ([], 0.0)


def test_proportional_shares_give_the_time_left_in_proportion_and_the_last_all_of_it():
    shares = plan.proportional_shares([1.0, 1.0, 2.0])
    assert shares == pytest.approx([0.25, 1 / 3, 1.0])
    left, spent = 100.0, []
    for share in shares:  # each item takes its share of what is left when it starts
        spent.append(left * share)
        left -= spent[-1]
    assert spent == pytest.approx([25.0, 25.0, 50.0]) and left == pytest.approx(0.0)
    assert plan.proportional_shares([0.0, 0.0]) == [1.0, 1.0]


def test_plan_cases_counts_the_baseline_once_per_block_and_once_at_the_start():
    costs = {"x": 1.0, "y": 1.0, "z": 1.0}
    chosen, estimate = plan.plan_cases(costs, 2.0, ["x", "y", "z"], passes=2, block=2, seconds=100.0)
    assert chosen == ["x", "y", "z"]
    assert estimate == 2 * (3.0 + math.ceil(3 / 2) * 2.0) + 2.0  # 16 s
    assert plan.plan_cases(costs, 2.0, ["x"], passes=1, block=2, seconds=4.9) == ([], 0.0)  # 1 + 2 + 2 = 5 s
    assert plan.plan_cases(costs, 2.0, ["x"], passes=1, block=2, seconds=5.0) == (["x"], 5.0)


def test_run_costs_repeat_the_test_set_until_the_fastest_run_is_long_enough():
    copies, costs = plan.run_costs({"base": 0.3, "slow": 0.9}, min_run_s=1.0, overhead=0.1)
    assert copies == 4 and costs == pytest.approx({"base": 1.3, "slow": 3.7})
    assert plan.run_costs({"base": 0.3}, min_run_s=0.0) == (1, {"base": 0.3})


def test_warm_another_stops_when_a_warm_up_would_push_out_a_case_that_fits():
    first = {"base": 1.0, "a": 1.0}
    assert plan.warm_another({}, "base", [], 2, 2, 0.0, left=1.0)  # the baseline is always warmed first
    assert plan.warm_another(first, "base", [1.0], passes=2, block=2, min_run_s=0.0, left=100.0)
    # now "a" fits (2 * (1 + 1) + 1 = 5 s of 0.9 * 6); after another 5-s warm-up nothing more would
    assert not plan.warm_another(first, "base", [5.0], passes=2, block=2, min_run_s=0.0, left=6.0)


def test_part_command_names_the_papers_only_when_not_all_cases_run():
    assert plan.part_command("decode", MECHANISMS, MECHANISMS) == "--part decode"
    li2019 = [case for case in MECHANISMS if plan.paper_of(case) == "li2019"]
    assert li2019 and plan.part_command("decode", li2019, MECHANISMS) == "--part decode --cases li2019"


def test_apply_part_sets_sections_fresh_processes_groups_and_the_part_budget():
    args = cli.parse_args(["--part", "train-cases"])
    assert (args.sections, args.fresh, args.budget_b) == (plan.PART_STAGES["train-cases"][0], [], 240.0)
    args = cli.parse_args(["--part", "decode-greedy-eager", "--budget-c", "99"])
    assert args.groups == [plan.DECODE_GROUPS["decode-greedy-eager"]] and args.budget_c == 99.0
    args = cli.parse_args(["--part", "props", "--device", "cpu", "--tiny"])
    assert args.budget_a == plan.PART_BUDGETS["props"][2]


def test_every_part_names_known_stages_with_shares_at_most_one():
    stages = {name for name, *_ in plan.PARTS}
    for part, (sections, part_stages) in plan.PART_STAGES.items():
        assert sections and {name for name, *_ in part_stages} <= stages | {"b warm-up", "c checkpoints"}, part
        assert all(0.0 <= gpu <= 1.0 and 0.0 <= tiny <= 1.0 for _, gpu, tiny, _ in part_stages), part
    assert set(plan.SPLITS) <= set(plan.PART_STAGES)
    assert all(set(parts) <= set(plan.PART_STAGES) for parts in plan.SPLITS.values())


def test_a_cut_compiled_stage_leaves_the_aa_controls_three_runs():
    """Issue 57: the compiled stage gets what the eager one leaves, so a short budget cuts it first (a cold compile
    took more than 70 s on the H200), and the A/A control's third run, last of it, went with it; its runs are now
    spread over the eager stage, so a compiled stage with no time at all still leaves three."""
    args = cli.parse_args(["--part", "train-cases"])
    stages = plan.part_stages(args, list(MECHANISMS), plan.COSTS["cuda"])
    cut = [(name, 0.0, False, rows) if name == "b compiled" else (name, budget, cumulative, rows)
           for name, budget, cumulative, rows in stages]
    out, _ = plan.left_out(cut)
    labels = [label for *_, rows in stages for label, _ in rows if label]
    aa = [label for label in labels if "(A/A control)" in label]
    compiled = [label for label in labels if ", compiled, " in label]
    assert len(aa) == 3 and len(compiled) == len(MECHANISMS) and set(compiled) <= set(out)
    assert not set(aa) & set(out)


def _fresh_plan(fresh):
    args = cli.parse_args(["--part", "train-fresh", "--fresh", fresh])
    return {group: entries for _, group, _, entries in plan.training_plan(args, list(MECHANISMS))}


def test_the_users_path_aa_control_runs_only_when_asked_as_ext_again_after_every_process_but_the_layers():
    """Issue 57: ``--fresh ...,aa`` trains the onmt-ext baseline again in a fresh process of its own, ext's config
    at ext's batches, each row's ratio over ext's row at its batch; the default processes leave it out.  ext and
    aa bracket the processes compared with ext's rows; the compiled layers stay last."""
    assert plan.FRESH_AA not in _fresh_plan("ext,stock") and cli.parse_args([]).fresh == ["ext", "stock"]
    processes = _fresh_plan("layers,aa,bin,stock,ext")
    assert list(processes) == [plan.FRESH_EXT, plan.FRESH_STOCK, plan.FRESH_BIN, plan.FRESH_AA, plan.FRESH_LAYERS]
    ext, aa = processes[plan.FRESH_EXT], processes[plan.FRESH_AA]
    assert [row["batch_tokens"] for row, *_ in aa] == [row["batch_tokens"] for row, *_ in ext] == [8192, 32768]
    for (mine, *config), (theirs, *their_config) in zip(aa, ext):
        assert mine["control"] and not theirs["control"] and mine["reference"] == theirs["key"]
        assert config == their_config and mine["data_path"] == theirs["data_path"]  # ext's config, mode, batches
        assert mine["name"] != theirs["name"]  # (its own config file and checkpoint)
    assert plan.FRESH_REFERENCE["aa"] == "ext"


def test_the_plan_costs_the_aa_process_as_ext_and_fits_it_beside_ext_in_one_call():
    """By the plan's estimate on a GPU: ``--part train-fresh --fresh ext,aa`` fits one call (as ext,bin does);
    with stock as well it does not, and the calls offered keep each ratio's reference (aa's is ext)."""
    costs = plan.COSTS["cuda"]
    stages = {name: rows for name, _, _, rows in plan.part_stages(
        cli.parse_args(["--part", "train-fresh", "--fresh", "ext,aa"]), list(MECHANISMS), costs)}
    rows = dict(stages["b fresh"][1:3] + stages["b fresh"][4:6])  # (after each process's start-up)
    assert len(rows) == 4 and {seconds for label, seconds in rows.items() if "A/A" in label} == {
        seconds for label, seconds in rows.items() if "A/A" not in label}
    for fresh, line in (("ext,aa", "every row fits"),
                        ("aa,ext", "every row fits"),
                        ("ext,stock,aa", "run instead: --part train-fresh --fresh ext,stock and --part train-fresh "
                                         "--fresh ext,aa")):
        args = cli.parse_args(["--part", "train-fresh", "--fresh", fresh])
        text = plan.plan_line(args, list(MECHANISMS), MECHANISMS)
        assert text.startswith("== gpu-check --part train-fresh --fresh ext,") and line in text, text


def test_a_part_with_fresh_processes_offers_calls_that_name_them():
    """A ``train`` or ``all`` whose ``--fresh`` is not the default is split into calls that name it: its
    ``train-fresh`` by process (each with its ratios' reference), never by paper, whose rows it does not have."""
    args = cli.parse_args(["--part", "train", "--fresh", "ext,stock,aa"])
    assert plan.split_parts(args, list(MECHANISMS), plan.COSTS["cuda"]) == [
        ("train-fresh", list(MECHANISMS), ["ext", "stock"]), ("train-fresh", list(MECHANISMS), ["ext", "aa"]),
        ("train-cases", list(MECHANISMS), None)]
    args = cli.parse_args(["--part", "all", "--fresh", "aa,ext"])
    line = plan.plan_line(args, list(MECHANISMS), MECHANISMS)
    assert line.startswith("== gpu-check --part all --fresh ext,aa: ") and (
        "run instead: --part props and --part train-fresh --fresh ext,aa and --part train-cases and " in line)
    args = cli.parse_args(["--part", "train"])  # the default processes: named by none
    assert "run instead: --part train-fresh and --part train-cases" in plan.plan_line(args, list(MECHANISMS),
                                                                                     MECHANISMS)
