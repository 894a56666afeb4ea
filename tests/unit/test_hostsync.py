"""What onmt_ext.runtime.hostsync.HostReads counts as a host read (its HOST_READS), in-process on the CPU.

Each pattern that waits for the device on CUDA (a value read, or an output whose size depends on the data) is
counted under its operator's name; its sync-free equivalent is not.  tests/support.py's host_reads, which the
training-step tests use, is HostReads with CUDA's sync warnings.
"""

import pytest
import torch

import support
from onmt_ext.runtime.hostsync import HostReads, host_read

MASK = torch.tensor([True, False, True, False])
REPEATS = torch.tensor([1, 2, 0, 1])


def _values():
    return torch.arange(12.0).reshape(4, 3)


def _assign(index, value):
    values = _values()
    values[index] = value
    return values


#: (pattern, what HostReads counts: the operator names, in order); each pattern runs on a (4, 3) tensor
READS = {
    "x[mask]": (lambda x: x[MASK], ["index"]),
    "x[uint8 mask]": (lambda x: x[MASK.to(torch.uint8)], ["index"]),
    "x[mask, 0]": (lambda x: x[MASK, 0], ["index"]),
    "x[mask] = rows": (lambda x: _assign(MASK, torch.zeros(2, 3)), ["index_put_"]),
    "x[mask] += v (accumulated)": (lambda x: x.index_put_((MASK,), torch.ones(2, 3), accumulate=True),
                                   ["index_put_"]),
    "x[mask] backward": (lambda x: x.requires_grad_()[MASK].sum().backward(), ["index", "index_put"]),
    "torch.where(cond)": (lambda x: torch.where(MASK), ["nonzero"]),
    "nonzero": (lambda x: MASK.nonzero(), ["nonzero"]),
    "argwhere": (lambda x: torch.argwhere(MASK), ["nonzero"]),
    "masked_select": (lambda x: x.masked_select(MASK[:, None]), ["masked_select"]),
    "repeat_interleave(x, tensor)": (lambda x: x.repeat_interleave(REPEATS, dim=0), ["repeat_interleave"]),
    "repeat_interleave(tensor)": (lambda x: torch.repeat_interleave(REPEATS), ["repeat_interleave"]),
    "bincount": (lambda x: REPEATS.bincount(minlength=5), ["bincount"]),
    "histc without a range": (lambda x: x.histc(bins=4), ["histc"]),
    "unique": (lambda x: REPEATS.unique(), ["_unique2"]),
    "unique(dim)": (lambda x: x.unique(dim=0), ["unique_dim"]),
    "unique_consecutive": (lambda x: REPEATS.unique_consecutive(), ["unique_consecutive"]),
    "item": (lambda x: x.sum().item(), ["item"]),
    "bool": (lambda x: bool(MASK.any()), ["item"]),
    "a tensor as a size": (lambda x: torch.arange(REPEATS.max()), ["item"]),
    "equal": (lambda x: torch.equal(x, x), ["equal"]),
    "allclose": (lambda x: torch.allclose(x, x), ["allclose"]),
    "tolist": (lambda x: x.tolist(), ["tolist"]),
}

#: the sync-free equivalents: nothing counted
SYNC_FREE = {
    "masked_fill": lambda x: x.masked_fill(MASK[:, None], 0.0),
    "x[mask] = one number (torch makes it a masked_fill_)": lambda x: _assign(MASK, 0.5),
    "x[:, mask] = one number": lambda x: _assign((slice(None), MASK[:3]), 0.5),
    "masked_scatter": lambda x: x.masked_scatter(MASK[:, None], torch.zeros(12)),
    "torch.where(cond, a, b)": lambda x: torch.where(MASK[:, None], x, 0.0),
    "x[long indices]": lambda x: x[REPEATS],
    "x[long indices] = v": lambda x: _assign(REPEATS, torch.zeros(4, 3)),
    "x[long indices] backward": lambda x: x.requires_grad_()[REPEATS].sum().backward(),
    "index_select": lambda x: x.index_select(0, REPEATS),
    "nonzero_static": lambda x: torch.nonzero_static(MASK, size=4),
    "repeat_interleave with output_size": lambda x: x.repeat_interleave(REPEATS, dim=0, output_size=4),
    "repeat_interleave(x, int)": lambda x: x.repeat_interleave(2, dim=0),
    "histc with a range": lambda x: x.histc(bins=4, min=0, max=12),
    "a copy on the CPU": lambda x: x.to("cpu", copy=True),
}


@pytest.mark.filterwarnings("ignore:indexing with dtype torch.uint8 is now deprecated")
@pytest.mark.parametrize("pattern", READS)
def test_each_read_is_counted_under_its_operator(pattern):
    run, expected = READS[pattern]
    with HostReads() as found:
        run(_values())
    assert [what for what, _ in found.reads] == expected, found.reads
    assert all(__file__ in where for _, where in found.reads), found.reads  # the call site is this file


@pytest.mark.parametrize("pattern", SYNC_FREE)
def test_the_sync_free_equivalents_are_not(pattern):
    with HostReads() as found:
        SYNC_FREE[pattern](_values())
    assert found.reads == []


def test_a_blocking_copy_to_the_host_reads_and_a_non_blocking_one_does_not():
    """A device tensor's copy to the CPU (checked without running it: the meta device stands for a GPU)."""
    device, host = torch.empty(3, device="meta"), torch.empty(3)
    aten = torch.ops.aten
    assert host_read(aten._to_copy.default, (device,), {"device": torch.device("cpu")}) == ("_to_copy", device)
    assert host_read(aten.copy_.default, (host, device)) == ("copy_", device)
    assert host_read(aten._to_copy.default, (device,), {"device": "cpu", "non_blocking": True}) is None
    assert host_read(aten.copy_.default, (host, device, True)) is None
    assert host_read(aten._to_copy.default, (host,), {"device": "meta"}) is None  # to the device
    assert host_read(aten.copy_.default, (device, host)) is None


def test_a_python_method_that_reads_is_counted_once_and_the_device_filter_holds():
    with HostReads() as found, HostReads(device="meta") as elsewhere:
        MASK.nonzero()
        REPEATS.numpy()
    assert [what for what, _ in found.reads] == ["nonzero", "numpy"] and elsewhere.reads == []


def test_support_host_reads_reports_what_host_reads_counts():
    values = _values()
    with support.host_reads() as reads:
        values[MASK].sum().item()
        assert reads == []  # (filled when the block ends)
    assert [read.split(" at ")[0] for read in reads] == ["index", "item"] and __file__ in reads[0], reads


def test_cuda_sync_warnings_record_each_sync_and_show_every_other_warning(monkeypatch):
    """gpu_check's meter counts a step's syncs inside :func:`cuda_sync_warnings` on CUDA: each sync warning is a
    site, two from one line are two; any other warning (a kernel's failed first-use check) is shown as outside,
    not recorded away.  torch's sync debug mode is faked (no CUDA here) and restored on leaving."""
    import sys
    import warnings

    from onmt_ext.runtime import hostsync

    modes = ["default"]
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: modes[-1])
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    with warnings.catch_warnings(record=True) as outside:
        warnings.simplefilter("default")
        with hostsync.cuda_sync_warnings() as sites:
            for _ in range(2):
                warnings.warn("called a synchronizing CUDA operation")
            line = sys._getframe().f_lineno - 1
            warnings.warn("onmt-ext: the fused kernel ... failed its first-use check")
    assert sites == [f"{__file__}:{line} (test_cuda_sync_warnings_record_each_sync_and_show_every_other_warning)"] * 2
    assert [str(w.message) for w in outside] == ["onmt-ext: the fused kernel ... failed its first-use check"]
    assert modes == ["default", "warn", "default"]
