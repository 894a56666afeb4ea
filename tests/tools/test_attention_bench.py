"""tools/attention_bench.py: its CPU dry run writes every row (a call at a new shape included, each shape new to
the run), its masks are OpenNMT-py's, and the decoder's
``is_causal`` without a mask computes OpenNMT-py's masked self-attention on the rows the loss reads.

The last is checked on the CPU's math backend, in float32, against the masked call without ``is_causal`` (the
math backend refuses a mask with ``is_causal``; the mask already holds the future, so it is the same attention),
and the check is shown to fail on planted errors: left padding, and an upstream gradient on padding rows.
"""

import json
import types

import pytest
import torch

from tools import attention_bench as ab

#: the masked call on the CPU (stock's mask without is_causal) and the causal-only call, both on the math backend
MASKED = ab.Variant("decoder self", "math, mask", ("MATH",), "opennmt", False)
CAUSAL = ab.Variant("decoder self", "math, is_causal only", ("MATH",), None, True)
TOLERANCE = 1e-5  # float32


def _problem(attention="decoder self", left=False, batch=5, length=9):
    return ab.make_problem(attention, batch, length, 2, 16, torch.float32, "cpu", torch.Generator().manual_seed(3),
                           left=left)


def _differences(problem, variant=CAUSAL):
    return ab.differences(problem, ab.forward_backward(variant, problem, 0.0),
                          ab.forward_backward(MASKED, problem, 0.0))


def test_the_dry_run_writes_every_row_with_a_figure_or_a_reason(tmp_path, capsys):
    assert ab.main(["--tiny", "--device", "cpu", "--out", str(tmp_path / "attention")]) == 0
    report = json.loads((tmp_path / "attention.json").read_text(encoding="utf-8"))
    rows = report["rows"]
    expected = [(f"{b}x{n}", v.attention, v.name) for b, n in ab.TINY["shapes"] for v in ab.VARIANTS]
    assert [(row["shape"], row["attention"], row["variant"]) for row in rows] == expected
    for row in rows:
        assert (row["ms"] is not None and row["ms"] > 0 and row["reason"] is None) or (
            row["ms"] is None and row["reason"].startswith("not supported")), row
        assert (row["new_shape_ms"] is not None) == (row["ms"] is not None), row
        assert len(row["new_shapes"]) == (ab.TINY["new_shapes"] if row["ms"] is not None else 0), row
    fresh = [shape for row in rows for shape in row["new_shapes"]]  # no call's plan could serve another's
    assert fresh and len(set(fresh)) == len(fresh) and not set(fresh) & {f"{b}x{n}" for b, n in ab.TINY["shapes"]}
    stock = [row for row in rows if row["variant"] == "stock" and row["attention"] != "decoder self"]
    assert stock and all(row["ms"] and row["ratio"] == 1 for row in stock)  # the CPU's math backend runs them
    assert report["machine"]["torch"] == torch.__version__ and report["setting"]["tiny"]
    table = (tmp_path / "attention.md").read_text(encoding="utf-8")
    assert table.count("\n| ") == len(rows) + 1 and table in capsys.readouterr().out
    assert "Partial" not in table


def test_a_run_stopped_after_an_attention_keeps_what_it_measured(tmp_path, monkeypatch):
    """The report is written again after each attention of each shape, so a device call stopped by its time limit
    (``timeout``) keeps the attentions it measured, and says which it did not."""
    stock, calls = ab.measure, []

    def stopped_at_the_second_shape(variant, problem, *rest, **kwargs):
        calls.append(variant)
        if problem.q.size(0) == ab.TINY["shapes"][1][0]:
            raise KeyboardInterrupt  # as a device call's time limit would stop it
        return stock(variant, problem, *rest, **kwargs)

    monkeypatch.setattr(ab, "measure", stopped_at_the_second_shape)
    with pytest.raises(KeyboardInterrupt):
        ab.main(["--tiny", "--device", "cpu", "--out", str(tmp_path / "attention")])
    assert len(calls) == len(ab.VARIANTS) + 1
    rows = json.loads((tmp_path / "attention.json").read_text(encoding="utf-8"))["rows"]
    first, second = (f"{b}x{n}" for b, n in ab.TINY["shapes"])
    assert [(row["shape"], row["attention"], row["variant"]) for row in rows] == [
        (first, v.attention, v.name) for v in ab.VARIANTS]
    text = (tmp_path / "attention.md").read_text(encoding="utf-8")
    assert (f"**Partial:** 3 of 6 attentions measured (the run stopped early or is still running); not measured: "
            f"{second} encoder self, {second} decoder self, {second} context.") in text
    assert text.count("\n| ") == len(rows) + 1


def test_a_cuda_run_without_a_device_stops_in_one_line(capsys):
    """docs/gpu-check.md's device call asks for ``--device cuda``: on a machine whose torch sees no CUDA device it
    stops at once with one line, instead of running at full size on the CPU."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(SystemExit) as stopped:
        ab.main(["--device", "cuda", "--out", "never-written"])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert error == f"attention_bench.py: error: no CUDA device visible to torch {torch.__version__}\n"


def test_fresh_shapes_are_new_and_nearest_first():
    seen = {(3, 4), (2, 2)}
    shapes = list(ab.fresh_shapes(3, 4, seen))
    assert shapes[:4] == [(2, 4), (1, 4), (3, 3), (2, 3)]
    assert len(shapes) == 3 * 4 - 2 and (2, 2) not in shapes and seen == set(shapes) | {(3, 4), (2, 2)}
    assert list(ab.fresh_shapes(3, 4, seen)) == []  # each shape once, across calls


@pytest.mark.parametrize("attention", ab.ATTENTIONS)
def test_a_cut_problem_is_a_right_padded_batch_of_its_own_shape(attention):
    problem = _problem(attention)
    cut = ab.sub_problem(problem, 3, 6)
    for tensor, whole in zip(cut[:3], problem[:3]):
        assert tensor.shape == (3, 6, 2, 16) and tensor.is_leaf and tensor.requires_grad and tensor.is_contiguous()
        assert torch.equal(tensor, whole[:3, :6])
    query_pad, key_pad = ~cut.rows, cut.keys[:, 0, 0, :]
    assert torch.equal(cut.mask, ab.opennmt_mask(attention, query_pad, key_pad))
    assert cut.grad.shape == (3, 2, 6, 16) and not cut.grad.transpose(1, 2)[query_pad].any()
    assert not key_pad[:, 0].any()  # every sentence keeps its first token


def test_stock_gets_the_backends_onmt_ext_gives_opennmt_py():
    from torch.nn.attention import SDPBackend, _cur_sdpa_kernel_backends

    with ab.kernel(ab.VARIANTS[0]):
        assert set(_cur_sdpa_kernel_backends()) == {SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH}


def test_the_masks_are_opennmt_pys():
    from onmt.decoders.transformer import TransformerDecoderLayerBase
    from onmt.utils.misc import sequence_mask

    lengths = torch.tensor([6, 3, 5])
    pad = ab.padding(lengths, 6)
    assert torch.equal(pad, sequence_mask(lengths, 6))
    encoder = sequence_mask(lengths).unsqueeze(1).unsqueeze(1)
    assert torch.equal(ab.opennmt_mask("encoder self", pad, pad), encoder.expand(-1, -1, encoder.size(3), -1))
    decoder = TransformerDecoderLayerBase._compute_dec_mask(types.SimpleNamespace(sliding_window=0),
                                                           pad.unsqueeze(1), future=False).unsqueeze(1)
    assert torch.equal(ab.opennmt_mask("decoder self", pad, pad), decoder)
    for left in (False, True):  # the planted left padding goes through the same mask code
        problem = _problem(left=left)
        assert torch.equal(problem.rows, ~problem.keys[:, 0, 0])  # one sentence length per row of the batch


def test_stocks_call_is_the_masked_call_where_a_backend_takes_both():
    """Where a CPU backend takes a mask with ``is_causal`` (no gradients), it gives the mask alone: the reference
    of the agreement tests below computes stock's attention."""
    problem = _problem()
    q, k, v = (tensor.detach().transpose(1, 2) for tensor in problem[:3])
    with torch.no_grad():
        both = torch.nn.functional.scaled_dot_product_attention(q, k, v, ~problem.mask, is_causal=True)
        alone = torch.nn.functional.scaled_dot_product_attention(q, k, v, ~problem.mask)
    torch.testing.assert_close(both, alone, rtol=0, atol=TOLERANCE)


@pytest.mark.parametrize("variant", [CAUSAL, next(v for v in ab.VARIANTS if v.name == "flash, is_causal only")],
                         ids=["math", "the tool's flash variant (the CPU's flash kernel)"])
def test_is_causal_alone_agrees_on_the_rows_the_loss_reads(variant):
    found = _differences(_problem(), variant)
    assert max(found.values()) < TOLERANCE, found


def test_the_agreement_check_fails_on_left_padding():
    found = _differences(_problem(left=True))
    assert found["out"] > 1e-3 and found["dk"] > 1e-3, found


def test_the_agreement_check_fails_with_a_gradient_on_padding_rows():
    """The outputs still agree on the non-padding rows, but the padding rows' gradient reaches the padding keys
    through the causal-only call (which lets a padding query see them) and not through the mask."""
    problem = _problem()
    problem = problem._replace(grad=torch.randn(problem.grad.shape, generator=torch.Generator().manual_seed(4)))
    found = _differences(problem)
    assert found["out"] < TOLERANCE and found["dk"] > 1e-3 and found["dv"] > 1e-3, found


def test_the_shapes_option_refuses_bad_text(capsys):
    with pytest.raises(SystemExit) as stop:
        ab.main(["--shapes", "1024by32"])
    assert stop.value.code == 2 and capsys.readouterr().err.startswith("attention_bench.py: error: argument")
