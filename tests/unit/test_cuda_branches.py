"""Branches of onmt-ext that only a CUDA machine takes, run here on the CPU with what CUDA provides faked.

Each test runs the branch's own code: pinned host memory and the copy to the GPU are recorded by stand-ins for
``Tensor.pin_memory``, ``Tensor.is_pinned`` and ``Tensor.to``; a tensor "on the GPU" is a CPU tensor whose
``device`` says ``cuda:0`` (:class:`_OnCuda`), for code that only asks where a tensor is; CUDA's autocast is its
thread-local flag, which torch sets without a GPU too; an RNN that computes as cuDNN's does under CUDA autocast
(:class:`_CudnnUnderAutocast`) gives the float16 states that only a GPU gives; ``torch.cuda.is_available`` and
``torch.version.cuda`` are replaced where a branch asks them.  The float16 shadows of ``-ext_half_weights`` (CUDA
autocast's dtype) are tested in tests/unit/test_half_weights.py, and the first-use check of the fused routing
kernels on a CUDA device in tests/unit/test_routing_kernels.py.
"""

import argparse
import sys
import types

import pytest
import torch

pytestmark = pytest.mark.usefixtures("onmt_active")

GPU = torch.device("cuda", 0)


class _OnCuda(torch.Tensor):
    """A CPU tensor that says it is on ``cuda:0`` (``device``, ``is_cuda``): for code that only asks where a tensor
    is before it hands the tensor on."""

    @property
    def device(self):
        return GPU

    @property
    def is_cuda(self):
        return True


def _on_cuda(tensor):
    return tensor.as_subclass(_OnCuda)


@pytest.fixture
def cuda_autocast():
    """CUDA's autocast on, as in a training step on the GPU (``torch.autocast("cuda")`` itself switches off
    without CUDA; the flag does not), and as it was after the test."""
    previous = torch.is_autocast_enabled("cuda")
    torch.set_autocast_enabled("cuda", True)
    yield
    torch.set_autocast_enabled("cuda", previous)


# ----------------------------------------------------------------------------- batches (runtime/batches.py)

class _HostCopies:
    """What CUDA gives a host-to-device copy, recorded on the CPU: ``pin_memory`` returns a copy in "pinned"
    memory (its storage is remembered), ``is_pinned`` says whether a tensor's storage is such memory, and
    ``.to(cuda device)`` returns a CPU copy ("on the GPU"), recording its source and whether it waits."""

    def __init__(self, monkeypatch):
        self.pinned, self.pins, self.copies = set(), [], []
        to = torch.Tensor.to

        def pin_memory(tensor, *args, **kwargs):
            copy = tensor.clone()
            self.pins.append(tensor)
            self.pinned.add(copy.untyped_storage().data_ptr())
            return copy

        def is_pinned(tensor, *args, **kwargs):
            return tensor.untyped_storage().data_ptr() in self.pinned

        def copy_to(tensor, *args, **kwargs):
            if args and isinstance(args[0], torch.device) and args[0].type == "cuda":
                copy = tensor.clone()
                self.copies.append((tensor, kwargs.get("non_blocking", False), copy))
                return copy
            return to(tensor, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
        monkeypatch.setattr(torch.Tensor, "is_pinned", is_pinned)
        monkeypatch.setattr(torch.Tensor, "to", copy_to)

    def on_gpu(self, tensor):
        """Whether ``tensor`` is (a view of) one of the copies to the GPU."""
        return any(tensor.untyped_storage().data_ptr() == copy.untyped_storage().data_ptr()
                   for _, _, copy in self.copies)


def _batch():
    return {"src": torch.randint(0, 50, (3, 7, 1)), "srclen": torch.tensor([7, 4, 2]),
            "tgt": torch.randint(0, 50, (3, 5, 1)), "cid": torch.tensor([0, 0, 1])}


def test_a_packed_batch_is_pinned_once_and_copied_to_the_gpu_in_one_copy_that_does_not_wait(monkeypatch):
    from onmt_ext.runtime.batches import HOST, PACKED, pack, to_device

    batch = _batch()
    packed = pack(dict(batch))
    (layout, _), = packed.values()
    host = _HostCopies(monkeypatch)
    moved = to_device(packed, GPU)
    [buffer] = host.pins  # the whole buffer, pinned once
    assert buffer.numel() == 21 + 3 + 15 + 3 and PACKED not in moved and set(moved) == set(batch) | {HOST}
    [(source, non_blocking, _)] = host.copies  # one copy, from the pinned buffer, without waiting
    assert non_blocking and source.is_pinned()
    for key, value in batch.items():
        assert torch.equal(moved[key], value), key
        assert host.on_gpu(moved[key]) == (key != "cid"), key  # the corpus ids stay on the CPU
    assert not moved["cid"].is_pinned()
    assert torch.equal(moved[HOST]["tgt"], batch["tgt"]) and not host.on_gpu(moved[HOST]["tgt"])
    assert [key for key, _ in layout] == list(batch)


def test_each_tensor_of_a_batch_is_pinned_unless_it_is_and_copied_to_the_gpu_without_waiting(monkeypatch):
    from onmt_ext.runtime.batches import HOST, to_device

    batch = _batch()
    host = _HostCopies(monkeypatch)
    batch["tgt"] = batch["tgt"].pin_memory()  # already pinned (a DataLoader's pin_memory thread)
    host.pins.clear()
    original = dict(batch)
    moved = to_device(dict(batch), GPU)
    assert [id(t) for t in host.pins] == [id(original["src"]), id(original["srclen"])]  # not tgt, not cid
    assert len(host.copies) == 3 and all(non_blocking and source.is_pinned() for source, non_blocking, _ in
                                         host.copies)
    assert [copy for _, _, copy in host.copies] == [moved["src"], moved["srclen"], moved["tgt"]]
    for key in ("src", "srclen", "tgt"):
        assert torch.equal(moved[key], original[key]) and host.on_gpu(moved[key]), key
    assert moved["cid"] is original["cid"]  # the CPU's keys are left alone
    assert moved[HOST]["tgt"] is original["tgt"] and moved[HOST]["srclen"] is original["srclen"]


# ----------------------------------------------------------------------------- recurrent layers under autocast

class _CudnnUnderAutocast(torch.nn.Module):
    """``rnn`` (an ``nn.RNN``, ``nn.GRU`` or ``nn.LSTM``) computing as cuDNN's does under CUDA autocast, which
    casts ``_cudnn_rnn``'s input, state and weights to float16: outputs and final state in float16, gradients
    cast back to the float32 parameters.  The CPU's autocast leaves ``nn.GRU`` and ``nn.RNN`` in float32 (and
    onmt-ext runs an LSTM there in float32), so only a GPU gives the layers after it half-precision states."""

    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x, hidden=None):
        half = {name: p.to(torch.float16) for name, p in self.rnn.named_parameters()}
        if hidden is not None:
            hidden = (tuple(h.to(torch.float16) for h in hidden) if isinstance(hidden, tuple)
                      else hidden.to(torch.float16))
        return torch.func.functional_call(self.rnn, half, (x.to(torch.float16), hidden))


class _RecordingRnn:
    """An RNN that records what it was called with, and under which autocast."""

    def __init__(self):
        self.calls = []

    def __call__(self, x, hidden=None):
        self.calls.append((x, hidden, torch.is_autocast_enabled("cuda"), torch.is_autocast_enabled("cpu")))
        return x, hidden


def _chen_layer(cell, layout="mprhead", bidirectional=False):
    from onmt.modules import Embeddings

    from onmt_ext.mechanisms.chen2019 import RecurrentPositionalEmbeddings

    torch.manual_seed(0)
    embeddings = Embeddings(16, 30, 1, position_encoding=True)
    torch.nn.init.normal_(embeddings.word_lut.weight)
    return RecurrentPositionalEmbeddings(embeddings, 4, 8, layout, cell, bidirectional=bidirectional).eval()


@pytest.mark.parametrize("cpu_autocast", [False, True], ids=["gpu-autocast", "both-autocasts"])
def test_an_lstm_on_the_gpu_gets_its_input_and_state_as_they_are_under_autocast(cuda_autocast, cpu_autocast):
    """chen2019's ``_recur``: on the CPU under autocast an LSTM runs in float32 with autocast off (oneDNN);
    on the GPU it is cuDNN's under CUDA's autocast: the input and state as given, autocast left on."""
    layer = _chen_layer("lstm")
    rnn, x_r = _RecordingRnn(), _on_cuda(torch.randn(3, 5, 8))
    hidden = (torch.zeros(1, 3, 8, dtype=torch.float16), torch.zeros(1, 3, 8, dtype=torch.float16))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cpu_autocast):
        assert layer._recur(rnn, x_r, hidden) == (x_r, hidden)
        layer._recur(rnn, x_r)
    [(x, state, on_gpu, on_cpu), (_, none, _, _)] = rnn.calls
    assert x is x_r and state is hidden and none is None
    assert on_gpu and on_cpu == cpu_autocast  # neither autocast switched off


@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
def test_half_precision_states_of_cudnn_under_autocast_decode_step_by_step_as_in_one_pass(cell):
    """chen2019's recurrence with the float16 states that cuDNN gives under CUDA autocast: the decoder's steps,
    which keep the state in float16 between them and follow the beam's reordering, give the full pass's output,
    the source's BiRNN reads each sentence within its length, and both stay within float16's rounding of the
    float32 computation."""
    target, source = _chen_layer(cell), _chen_layer(cell, "rpehead", bidirectional=True)
    tgt, src = torch.randint(4, 30, (3, 6, 1)), torch.randint(4, 30, (3, 6, 1))
    src[1, 4:, 0] = 1  # padding
    with torch.no_grad():
        expected_tgt, expected_src = target(tgt), source(src)
        target.rnn = _CudnnUnderAutocast(target.rnn)
        source.rnn, source.rnn_backward = _CudnnUnderAutocast(source.rnn), _CudnnUnderAutocast(source.rnn_backward)
        full = target(tgt)
        steps = [target(tgt[:, j:j + 1], step=j) for j in range(3)]
        assert target.decoding_state["hidden"].dtype == torch.float16  # as the GPU keeps it
        perm = torch.tensor([2, 0, 1])
        target.reorder_decoding_state(lambda state, dim: state.index_select(dim, perm))
        steps = [s[perm] for s in steps] + [target(tgt[perm, j:j + 1], step=j) for j in range(3, 6)]
        encoded = source(src)
        alone = source(src[1:2, :4])
    torch.testing.assert_close(torch.cat(steps, dim=1), full[perm], atol=2e-3, rtol=0)
    torch.testing.assert_close(full.float(), expected_tgt, atol=1e-2, rtol=0)
    torch.testing.assert_close(encoded.float(), expected_src, atol=1e-2, rtol=0)
    torch.testing.assert_close(encoded[1:2, :4], alone, atol=2e-3, rtol=0)


def test_the_global_state_of_a_cudnn_gru_under_autocast_is_fused_in_the_decoders_dtype():
    """GRET's layer-wise GRU under CUDA autocast is cuDNN's in float16 (the CPU's GRU stays float32): the
    global state reaches the decoder in float16, and the fusion, under autocast as in a GPU training step,
    gives the decoder output's dtype and float32's values within float16's rounding, with gradients for the
    GRU's float32 weights.  (The CPU's float16 autocast stands for CUDA's.)"""
    from onmt_ext.mechanisms.gret import GlobalFusion, GlobalRepresentation

    torch.manual_seed(5)
    summary, fusion = GlobalRepresentation(8, layers=3, capsules=2, iterations=3), GlobalFusion(8, gate=True)
    keep = torch.arange(7)[None] < torch.tensor([7, 4, 1])[:, None]
    hidden = [torch.randn(3, 7, 8) for _ in range(3)]
    dec_out = torch.randn(3, 5, 8)

    def fused():
        summary.start()
        for output in hidden:
            summary.observe(None, None, output)
        state = summary.summarise(keep)
        fusion.init_decoding_state(None, None, state)
        return state, fusion(dec_out)

    expected_state, expected = fused()
    summary.gru = _CudnnUnderAutocast(summary.gru)
    with torch.autocast("cpu", dtype=torch.float16):
        state, out = fused()
    assert state.dtype == torch.float16 and out.dtype == dec_out.dtype
    torch.testing.assert_close(state.float(), expected_state, atol=1e-2, rtol=0)
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=0)
    out.sum().backward()
    grads = [p.grad for p in summary.gru.rnn.parameters()]
    assert all(g is not None and g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)


# ----------------------------------------------------------------------------- routing and compilation

def test_routing_loads_the_fused_kernels_for_a_cuda_tensor(monkeypatch):
    """``auto`` (the default) routes CUDA tensors through the fused kernels: a module's ``prepare_kernels``
    imports them for a CUDA tensor, not for a CPU one (the other tests replace ``_on_cuda`` itself)."""
    from onmt_ext.mechanisms import routing

    loaded = []
    monkeypatch.delenv(routing.KERNEL_VARIABLE, raising=False)
    monkeypatch.delitem(sys.modules, routing._KERNEL_MODULE, raising=False)
    monkeypatch.setattr(routing, "_load_kernels", lambda: loaded.append(True))
    assert routing._on_cuda(_on_cuda(torch.ones(2))) and not routing._on_cuda(torch.ones(2))
    routing.prepare_kernels(torch.ones(2))
    assert loaded == []
    routing.prepare_kernels(_on_cuda(torch.ones(2)))
    assert loaded == [True]


def test_routing_of_a_cuda_tensor_runs_with_cuda_autocast_off_and_the_cpus_as_it_was(cuda_autocast):
    from onmt_ext.mechanisms import routing

    seen = []

    @routing.without_autocast
    def core(tensor):
        seen.append((tensor.device.type, torch.is_autocast_enabled("cuda"), torch.is_autocast_enabled("cpu")))

    with torch.autocast("cpu", dtype=torch.bfloat16):
        core(_on_cuda(torch.ones(2)))
        core(torch.ones(2))
    assert seen == [("cuda", False, True), ("cpu", True, False)]
    assert torch.is_autocast_enabled("cuda")  # back on after the call


def test_the_fused_kernels_take_cuda_votes_without_the_interpreter(monkeypatch):
    routing_triton = pytest.importorskip("onmt_ext.mechanisms.routing_triton")
    monkeypatch.setattr(routing_triton, "INTERPRETED", False)  # as on a GPU machine: compiled kernels only
    votes = torch.randn(3, 4, 5, 2)
    assert not routing_triton.fits(votes)  # CPU votes need the interpreter
    assert routing_triton.fits(_on_cuda(votes)) and routing_triton.fits(_on_cuda(votes), chunked=True)
    assert not routing_triton.fits(_on_cuda(torch.randn(1, 16, 64, 32)))  # beyond one block
    monkeypatch.setattr(routing_triton, "INTERPRETED", True)
    assert routing_triton.fits(votes) and routing_triton.fits(_on_cuda(votes))


def test_ext_compile_auto_compiles_a_training_pass_on_cuda_tensors_only():
    from onmt_ext.runtime import compile as ext_compile

    def core(x):
        return -x

    gpu, cpu = _on_cuda(torch.ones(2)), torch.ones(2)
    assert ext_compile._auto_compiles(core, (cpu, gpu, 3))
    assert not ext_compile._auto_compiles(core, (cpu, 3))
    with torch.no_grad():  # not a training pass
        assert not ext_compile._auto_compiles(core, (gpu,))


# ----------------------------------------------------------------------------- training step and machine checks

class _Autocast:
    """Stands for ``torch.autocast``: records the autocasts that are open (``active``), runs nothing under one."""

    active = []

    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        self.args = (device_type, enabled)

    def __enter__(self):
        self.active.append(self.args)

    def __exit__(self, *exc):
        self.active.pop()
        return False


@pytest.mark.parametrize("amp", [True, False], ids=["model_dtype-fp16", "fp32"])
def test_with_amp_the_training_step_runs_the_model_under_cuda_autocast(monkeypatch, amp):
    """The training step's forward runs under ``torch.autocast("cuda", enabled=<the optimizer's amp>)``, which
    only a GPU honours; the model records the autocasts open around it, then runs out of memory (the step skips
    the batch)."""
    from onmt.utils import Statistics
    from onmt.utils.logging import logger

    from onmt_ext.runtime import train_step

    seen = []

    class Model:
        decoder = types.SimpleNamespace(state={})

        def __call__(self, *args, **kwargs):
            seen.append(list(_Autocast.active))
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    trainer = types.SimpleNamespace(
        accum_count=1, trunc_size=0, zero_out_prompt_loss=False, with_align=False, n_gpu=1,
        parallel_mode="data_parallel", model=Model(), train_loss=types.SimpleNamespace(padding_idx=1),
        optim=types.SimpleNamespace(amp=amp, training_step=1, zero_grad=lambda set_to_none: None,
                                    step=lambda: None))
    batch = {"src": torch.ones(2, 3, 1, dtype=torch.long), "srclen": torch.tensor([3, 2]),
             "tgt": torch.full((2, 4, 1), 5)}
    monkeypatch.setattr(torch, "autocast", _Autocast)
    monkeypatch.setattr(logger, "disabled", True)  # (the skipped batch's warning)
    train_step.gradient_accumulation(trainer, [batch], 6, Statistics(), Statistics())
    assert seen == [[("cuda", amp)]] and _Autocast.active == []


def test_data_parallel_ranks_run_on_the_gpus_where_cuda_is_available(monkeypatch):
    from onmt_ext.runtime import distributed

    opt = argparse.Namespace(world_size=2, gpu_ranks=[0, 1], parallel_mode="data_parallel")
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_backend", lambda *args: "gloo")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert distributed.cpu_ranks(opt) and distributed._on_cpu_ranks()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not distributed.cpu_ranks(opt) and not distributed._on_cpu_ranks()


def test_gpu_options_are_no_problem_where_cuda_is_available_and_named_where_a_cuda_torch_sees_no_gpu(monkeypatch):
    from onmt_ext.integration.commands import cuda_problems

    opt = argparse.Namespace(gpu=0, gpu_ranks=[0])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cuda_problems(opt) == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "12.4")  # a CUDA build of torch on a machine without a GPU
    [problem] = cuda_problems(opt)
    assert problem == (f"-gpu 0 and -gpu_ranks 0: torch {torch.__version__} sees no CUDA device; drop it to run "
                       "on the CPU, or check the driver and CUDA_VISIBLE_DEVICES")
