"""tools/routing_bench.py: its CPU dry run times both variants, the kernels really run, and the report holds."""

import json
import os

import pytest
import torch

from tools import routing_bench


def test_the_dry_run_times_the_reference_and_the_kernels_and_they_agree(tmp_path):
    from onmt_ext.mechanisms import routing_triton

    before = dict(routing_triton.LAUNCHES)
    cases = ["li2019-base-em", "li2019-base-simple", "cao2019", "gret"]
    assert routing_bench.main(["--tiny", "--device", "cpu", "--cases", *cases, "--out", str(tmp_path / "r")]) == 0
    launched = {name: count - before.get(name, 0) for name, count in routing_triton.LAUNCHES.items()}
    assert all(launched.get(kernel, 0) > 0 for kernel in ("_em_forward", "_em_backward", "_simple_forward",
                                                          "_simple_backward", "_chunked_forward",
                                                          "_chunked_backward")), launched
    report = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))
    rows = report["rows"]
    assert [(row["case"], row["variant"]) for row in rows] == [
        (case, variant) for case in cases for variant in routing_bench.VARIANTS]
    assert [row["routes"] for row in rows[::2]] == ["(8, 8, 512, 1) votes, em", "(8, 8, 512, 1) votes, simple",
                                                    "(1, 8, 8, 8) masked scores (sentences, heads, L, L)",
                                                    "(6, 1, 8, 4, 128) votes (layers, sentences, L, K, d_c)"]
    assert all(row["ms"] > 0 and row["warmup_s"] >= 0 for row in rows)
    for row in rows[1::2]:  # the kernels' rows, float32 on the CPU: the reference's values to rounding
        assert row["speedup"] > 0 and row["output_difference"] < 1e-5 and row["gradient_difference"] < 1e-5
    text = (tmp_path / "r.md").read_text(encoding="utf-8")
    assert text.count("| li2019-base-em |") == 2 and "8 positions per call, T = 3" in text
    assert os.environ.get("ONMT_EXT_ROUTING_KERNEL") is None  # each variant's choice is undone


def test_a_variant_out_of_memory_is_reported_and_the_others_still_run(tmp_path, monkeypatch):
    stock = routing_bench.forward_backward

    def reference_runs_out(case, problem, iterations, backward=True):
        if os.environ["ONMT_EXT_ROUTING_KERNEL"] == "torch":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 36.50 GiB")
        return stock(case, problem, iterations, backward)

    monkeypatch.setattr(routing_bench, "forward_backward", reference_runs_out)
    args = ["--tiny", "--device", "cpu", "--cases", "li2019-base-simple", "--out", str(tmp_path / "r")]
    assert routing_bench.main(args) == 0
    reference, kernels = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))["rows"]
    assert reference["failed"] == "out of memory: CUDA out of memory. Tried to allocate 36.50 GiB"
    assert kernels["ms"] > 0 and "speedup" not in kernels
    assert "| PyTorch (reference) | out of memory: CUDA out of memory." in (tmp_path / "r.md").read_text()


def test_a_cuda_run_without_a_device_stops_in_one_line(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(SystemExit) as stopped:
        routing_bench.main(["--device", "cuda"])
    assert stopped.value.code == 2 and "no CUDA device visible to torch" in capsys.readouterr().err


def test_kernels_that_fall_back_to_pytorch_are_not_timed_as_the_kernels(tmp_path, monkeypatch):
    """A kernel that fails its first-use check routes through PyTorch with a warning: the kernels' row says so
    instead of timing the reference under their name."""
    import warnings

    from onmt_ext.mechanisms import routing

    def refused(kind, votes, *args):
        warnings.warn("onmt-ext: the fused kernel for simple routing failed its first-use check (a test)")
        return False

    monkeypatch.setattr(routing, "_kernels_trusted", refused)
    args = ["--tiny", "--device", "cpu", "--cases", "li2019-base-simple", "--out", str(tmp_path / "r")]
    assert routing_bench.main(args) == 0
    reference, kernels = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))["rows"]
    assert reference["ms"] > 0
    assert kernels["failed"] == ("the kernels did not run: onmt-ext: the fused kernel for simple routing failed "
                                 "its first-use check (a test)")


def test_warps_rows_launch_every_kernel_at_the_forced_warps_and_agree(tmp_path):
    """``--warps``: one more kernels' row per value, every launch of it at that value (so the sweep really changes
    the launches on a GPU), the launcher's own choice restored after."""
    from onmt_ext.mechanisms import routing_triton

    chosen = routing_triton._warps
    args = ["--tiny", "--device", "cpu", "--cases", "li2019-base-simple", "--warps", "2", "--out", str(tmp_path / "r")]
    assert routing_bench.main(args) == 0
    assert routing_triton._warps is chosen
    rows = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))["rows"]
    assert [row["variant"] for row in rows] == ["PyTorch (reference)", "fused kernels", "fused kernels, 2 warps"]
    assert "warps" not in rows[1] and rows[2]["warps"] == 2
    # warm-up 1, the agreement's call 1, repeats 2 with the backward pass (2 kernels), forward alone 2
    assert rows[2]["warps_launches"] == 2 * (1 + 1 + 2) + 2, rows[2]
    assert rows[2]["output_difference"] < 1e-5 and rows[2]["gradient_difference"] < 1e-5 and rows[2]["speedup"] > 0
    assert all(0 < row["forward_ms"] for row in rows)
    text = (tmp_path / "r.md").read_text(encoding="utf-8")
    assert "| li2019-base-simple | (8, 8, 512, 1) votes, simple | fused kernels, 2 warps |" in text


def test_a_run_stopped_after_a_case_keeps_that_case_in_its_report(tmp_path, monkeypatch):
    stock = routing_bench.measure

    def stopped_in_gret(case, problem, args, choice, warps=None):
        if case is routing_bench.CASES["gret"]:
            raise KeyboardInterrupt  # as a device call's time limit would stop it
        return stock(case, problem, args, choice, warps)

    monkeypatch.setattr(routing_bench, "measure", stopped_in_gret)
    with pytest.raises(KeyboardInterrupt):
        routing_bench.main(["--tiny", "--device", "cpu", "--cases", "li2019-base-simple", "gret",
                            "--out", str(tmp_path / "r")])
    rows = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))["rows"]
    assert [row["case"] for row in rows] == ["li2019-base-simple"] * 2 and all(row["ms"] > 0 for row in rows)
    assert "**Partial:** 1 of 2 cases measured" in (tmp_path / "r.md").read_text(encoding="utf-8")


def test_kernels_that_do_not_launch_at_a_forced_warps_are_a_row_and_the_run_goes_on(tmp_path, monkeypatch):
    """Triton refuses a launch it has not the resources for (as ``--warps`` may ask on a GPU): that row says so, and
    the other variants and cases are still measured."""
    from onmt_ext.mechanisms import routing_triton

    chosen, stock = routing_triton._warps, routing_bench.forward_backward

    def refused_when_forced(case, problem, iterations, backward=True):
        if routing_triton._warps is not chosen:
            raise RuntimeError("out of resource: shared memory, Required: 262144, Hardware limit: 232448\nmore")
        return stock(case, problem, iterations, backward)

    monkeypatch.setattr(routing_bench, "forward_backward", refused_when_forced)
    args = ["--tiny", "--device", "cpu", "--cases", "li2019-base-simple", "--warps", "32", "--out", str(tmp_path / "r")]
    assert routing_bench.main(args) == 0
    reference, kernels, forced = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))["rows"]
    assert reference["ms"] > 0 and kernels["ms"] > 0
    assert forced["failed"] == "RuntimeError: out of resource: shared memory, Required: 262144, Hardware limit: 232448"
