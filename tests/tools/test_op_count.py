"""tools/op_count.py: it counts the launching operators of a training pass, and sees the fused routing kernels;
with ``--decode``, those of translation, split into the encoder and equal decoding steps.

Its counter is tools/routing_memory.py's too (the two once counted 1,628 and 1,616 operators for GRET's pass):
every operator below autograd but views and detaches, operators that return no tensor or a list of them included.
No case may issue more operators, over the baseline's, than results/bench/ops-per-step.md and
ops-per-decoding-step.md record (issue 56: the host-bound mechanisms).
"""

import json
import types

import pytest
import torch

import support
from tools import op_count, routing_memory


def test_views_and_detaches_are_not_counted():
    x = torch.ones(2, 3, requires_grad=True)
    with op_count.counter() as mode:
        y = (x.view(3, 2).t() * 2).detach().sum()
    assert dict(mode.counts) == {"mul": 1, "sum": 1}, mode.counts
    assert mode.totals() == {"ops": sum(mode.every.values()), "launches": 2} and mode.every["view"] == 1
    assert y.item() == 12


def test_operators_that_return_no_tensor_or_a_list_of_them_are_counted():
    x = torch.arange(6.0)
    with op_count.counter() as mode:
        parts = torch.ops.aten.unsafe_split(x, 2)  # a list of tensors (not marked a view)
        torch.ops.aten.promote_types(torch.float16, torch.float32)  # a dtype
    assert dict(mode.counts) == {"unsafe_split": 1, "promote_types": 1} and len(parts) == 3


def test_routing_memory_counts_with_the_same_counter():
    """``python -m tools.routing_memory --measure ops`` reports op_count's totals: under autocast the routing's
    forward pass has a ``promote_types``, which routing_memory's own count used to leave out."""
    assert routing_memory.op_count is op_count  # the one counter, imported
    args = types.SimpleNamespace(sentences=1, length=3, threads=1, device="cpu", capsules=8, iterations=2, repeats=1)
    row = next(row for row in routing_memory.routing_ops(args) if row["autocast"] and not row["recompute"])
    module, context = routing_memory._routing(args, row["method"], args.capsules, iterations=2, recompute=False)
    with op_count.counter() as mode, routing_memory._autocast("cpu"):
        module(context).float().sum()  # as routing_ops runs it
    assert row["forward"] == mode.totals() and mode.counts["promote_types"], (row["forward"], mode.counts)


@pytest.mark.slow  # about a minute: the kernels run in Triton's interpreter
def test_the_fused_routing_kernels_launch_fewer_operators_than_the_reference(monkeypatch, onmt_active,
                                                                              sample_data):
    """li2019's EM routing through the kernels (one operator per problem, here through Triton's interpreter) is
    fewer operators per training pass than through the PyTorch reference, whose iterations are many operators."""
    config = "li2019/transformer_base_wmt17_zhen_em_enc_self.yaml"
    counts = {}
    for choice in ("torch", "triton"):
        monkeypatch.setenv("ONMT_EXT_ROUTING_KERNEL", choice)
        counts[choice] = sum(op_count.count(config, layers=1).values())
    baseline = sum(op_count.count("baseline/transformer_base_wmt17_zhen.yaml", layers=1).values())
    assert baseline < counts["triton"] < counts["torch"], (baseline, counts)


def _within_recorded(counts, recorded):
    """Each case's count of ``counts`` over the baseline's is at most its recorded one's (``recorded``'s case whose
    name starts with the case's label) over the recorded baseline's."""
    for label, count in counts.items():
        [(name, limit)] = [(name, ops) for name, ops in recorded.items() if name.startswith(label)]
        ratio, allowed = count / counts["baseline"], limit / recorded["baseline"]
        assert ratio <= allowed + 1e-9, f"{label}: {count} operators, {ratio:.3f} of the baseline's; {name} " \
                                        f"records {limit}, {allowed:.3f}"


def _table_rows(name):
    """The cells of each Markdown table row of results/bench/``name``."""
    table = (support.REPO / "results" / "bench" / name).read_text(encoding="utf-8")
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in table.splitlines()
            if line.startswith("| ")]


def _recorded_through_pytorch():
    """``{case: operators}`` of results/bench/ops-per-step.md's column "routing in PyTorch (the reference)"."""
    return {cells[0]: int(cells[3]) for cells in _table_rows("ops-per-step.md")
            if len(cells) == 5 and cells[3].isdigit()}


def test_no_mechanism_issues_more_operators_per_training_pass_than_recorded(monkeypatch, onmt_active, sample_data):
    """Issue 56's host-bound mechanisms are bound by how many operators the host issues: no case's training pass
    (the PyTorch routing, this machine's path; at the papers' depth) may issue more operators, over the baseline's,
    than results/bench/ops-per-step.md records.  A change that adds some must record the new count there."""
    monkeypatch.setenv("ONMT_EXT_ROUTING_KERNEL", "torch")
    recorded = _recorded_through_pytorch()
    _within_recorded({label: sum(op_count.count(config, layers=6).values()) for label, config in op_count.CASES},
                     recorded)


def _recorded_beam_steps():
    """``{case: operators per beam-4 decoding step}`` of results/bench/ops-per-decoding-step.md: its PyTorch
    routing column where it was counted, else the kernels' (the same path for a case without routing)."""
    return {cells[0]: float(cells[6].split()[0]) if cells[6][0].isdigit() else float(cells[1])
            for cells in _table_rows("ops-per-decoding-step.md") if len(cells) == 7
            and cells[1].replace(".", "").isdigit()}


def test_no_mechanism_issues_more_operators_per_decoding_step_than_recorded(monkeypatch, onmt_active, sample_data):
    """The same for a beam-4 decoding step (issue 56's decoding target: 0.97 of the baseline's pace), against
    results/bench/ops-per-decoding-step.md."""
    monkeypatch.setenv("ONMT_EXT_ROUTING_KERNEL", "torch")
    recorded = _recorded_beam_steps()
    _within_recorded({label: op_count.decode_count(config, layers=6)["per_step"] for label, config in op_count.CASES},
                     recorded)


def test_half_weights_remove_the_weight_casts_of_autocast(onmt_active, sample_data):
    """Under autocast each Linear weight is cast to half precision in the forward pass and its gradient back in
    the backward pass; -ext_half_weights's copies leave two operators per step in their place (cat, cast), and the
    refresh two (cat, copy)."""
    config = "baseline/transformer_base_wmt17_zhen.yaml"
    plain, autocast, half = (op_count.count(config, layers=1, autocast=a, half_weights=h)
                             for a, h in ((False, False), (True, False), (False, True)))
    assert plain["_to_copy"] < half["_to_copy"] < autocast["_to_copy"], (plain, autocast, half)
    linears = 4 + 8 + 2 * 2  # one layer each side: attention projections and feed-forward (no generator here)
    assert autocast["_to_copy"] - half["_to_copy"] == 2 * linears - 1, (autocast["_to_copy"], half["_to_copy"])
    assert half["cat"] == autocast["cat"] + 2


def test_the_decoding_count_splits_translation_into_encoder_and_equal_steps(onmt_active, sample_data):
    """``--decode``: the baseline and a mechanism decode the same number of steps (-min_length = -max_length),
    and the encoder, the steps and the search's set-up and report add up to the whole translation's count."""
    cases = ("baseline/transformer_base_wmt17_zhen.yaml", "gret/transformer_base_wmt17_zhen_gret.yaml")
    for search in ("greedy", "beam4"):  # beam4's results last, for the check below
        results = [op_count.decode_count(config, layers=1, search=search, steps=5) for config in cases]
        assert [result["steps"] for result in results] == [5, 5], (search, results)
        for result in results:
            loop = sum(result["loop"].values())
            assert result["encoder"] > 0 and result["per_step"] > 0 and 0 <= result["other"] < result["per_step"]
            assert result["per_step"] * result["steps"] == loop, result
            assert result["encoder"] + loop + result["other"] == result["total"], result
            assert result["loop"]["mm"] + result["loop"]["addmm"] >= 5 * 5, result["loop"]  # a decoder per step
        assert results[0]["encoder"] < results[1]["encoder"], results  # GRET's encoder adds its GRU and routing
    # the steps' count is what each further step costs: 5 more steps add about 5 times the count per step
    longer = op_count.decode_count(cases[0], layers=1, search="beam4", steps=10)
    added = (longer["total"] - results[0]["total"]) / 5
    assert longer["steps"] == 10 and abs(added / longer["per_step"] - 1) < 0.1, (added, longer["per_step"])


def test_the_decoding_mode_writes_a_row_per_case_and_search(onmt_active, sample_data, tmp_path, monkeypatch):
    monkeypatch.setattr(op_count, "DECODE_STEPS", 3)
    out = tmp_path / "decode"
    assert op_count.main(["--layers", "1", "--cases", "baseline", "--decode", "greedy", "--out", str(out)]) == 0
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert [(row["case"], row["search"], row["steps"], row["ratio"]) for row in rows] == [
        ("baseline", "greedy", 3, 1.0)]
    assert "| baseline | greedy | 3 |" in out.with_suffix(".md").read_text()
    assert op_count.main(["--layers", "1", "--cases", "baseline", "--decode", "greedy", "--out", str(out)]) == 0
    page = tmp_path / "page"
    page.with_suffix(".md").write_text("# Operators per decoding step\n\nprose\n")
    with pytest.raises(SystemExit, match="page.md exists and is not a table this command writes"):
        op_count.main(["--layers", "1", "--decode", "greedy", "--out", str(page)])  # stops before counting
    with pytest.raises(SystemExit, match="decode.md exists"):  # the training table would replace decoding's
        op_count.main(["--layers", "1", "--out", str(out)])
    assert page.with_suffix(".md").read_text().endswith("prose\n") and not page.with_suffix(".json").exists()
