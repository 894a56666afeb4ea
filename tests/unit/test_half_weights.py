"""``-ext_half_weights`` (onmt_ext.runtime.half_weights): float16 copies of the Linear weights with float32 master
weights give autocast's numbers, to the bit.  On this CPU machine autocast is the CPU's, in bfloat16 and in float16:
the same mechanism that CUDA's float16 autocast takes, float16 being the dtype that ``-model_dtype fp16`` gives the
shadows on the GPU."""

import argparse
import copy
import warnings

import pytest
import torch

import support
from onmt_ext.runtime import compile as ext_compile
from onmt_ext.runtime.half_weights import HalfWeights

pytestmark = pytest.mark.usefixtures("onmt_active")
DTYPE = torch.bfloat16
#: the shadows' dtypes tested: the CPU autocast's default, and float16, CUDA autocast's (-model_dtype fp16)
DTYPES = pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])


class _Toy(torch.nn.Module):
    """Linear layers of every kind the shadows meet: plain, without bias, tied to an embedding, read directly."""

    def __init__(self, read_directly=True):
        super().__init__()
        self.read_directly = read_directly
        self.embedding = torch.nn.Embedding(11, 8)
        self.unused = torch.nn.Linear(8, 8)  # no gradient: Adam must leave it alone, as under autocast
        self.first = torch.nn.Linear(8, 16)
        self.second = torch.nn.Linear(16, 8, bias=False)
        self.direct = torch.nn.Linear(8, 8)  # its weight is also read outside its forward
        self.tied = torch.nn.Linear(8, 11)
        self.tied.weight = self.embedding.weight

    def forward(self, ids):
        x = self.embedding(ids)
        x = self.second(torch.relu(self.first(x)))
        x = self.direct(x) + (x @ self.direct.weight.t() if self.read_directly else 0)
        return self.tied(x).float().log_softmax(-1)


def _step(model, optimizer, half, seeds, autocast=True, dtype=DTYPE):
    """One update from the micro-batches ``seeds`` (accumulated) under CPU autocast to ``dtype``; returns the
    losses."""
    optimizer.zero_grad(set_to_none=True)
    if half is not None:
        half.clear()
    losses = []
    for seed in seeds:
        ids = torch.randint(0, 11, (3, 5), generator=torch.Generator().manual_seed(seed))
        with torch.autocast("cpu", dtype=dtype, enabled=autocast):
            loss = -model(ids).mean()
        loss.backward()
        if half is not None:
            half.collect()
        losses.append(loss.detach())
    optimizer.step()
    if half is not None:
        half.refresh()
    return losses


def _twins(read_directly=True):
    torch.manual_seed(0)
    model = _Toy(read_directly)
    twin = copy.deepcopy(model)
    return model, twin


@pytest.mark.parametrize("read_directly", [True, False], ids=["a-weight-read-directly", "layers-only"])
@pytest.mark.parametrize("accumulate", [1, 3])
@DTYPES
def test_half_weights_train_as_autocast_does_to_the_bit(accumulate, read_directly, dtype):
    model, twin = _twins(read_directly)
    half = HalfWeights(twin, dtype)
    assert {id(m) for m in half.modules} == {id(twin.first), id(twin.second), id(twin.direct),
                                             id(twin.unused)}  # not the tied one
    optimizers = [torch.optim.Adam(net.parameters(), lr=0.01) for net in (model, twin)]
    for step in range(4):
        seeds = [10 * step + k for k in range(accumulate)]
        expected = _step(model, optimizers[0], None, seeds, dtype=dtype)
        got = _step(twin, optimizers[1], half, seeds, dtype=dtype)
        assert [torch.equal(a, b) for a, b in zip(expected, got)] == [True] * accumulate, step
        for (name, ours), theirs in zip(twin.named_parameters(), model.parameters()):
            assert ours.dtype == torch.float32 and torch.equal(ours, theirs), (step, name)
    assert all(p.grad is None for p in half.shadows) and half.collected == 4 * accumulate
    assert twin.unused.weight.grad is None and torch.equal(twin.unused.weight, model.unused.weight)
    if not read_directly:  # the gradients in one float32 buffer, the parameters' .grad its views
        assert all(p.grad.data_ptr() != 0 and p.grad._base is half._grads for p in half.masters if p.grad is not None)


@DTYPES
def test_the_shadows_are_used_only_where_autocast_would_cast(dtype):
    model, twin = _twins()
    half = HalfWeights(twin, dtype)
    other = torch.float16 if dtype == torch.bfloat16 else torch.bfloat16
    ids = torch.randint(0, 11, (2, 4), generator=torch.Generator().manual_seed(1))
    calls = []
    original = torch.nn.functional.linear

    def spy(x, weight, bias=None):
        calls.append(weight.dtype)
        return original(x, weight, bias)

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(torch.nn.functional, "linear", spy)
        assert torch.equal(twin(ids), model(ids))  # no autocast: float32 parameters, stock's forward
        assert calls[:3] == [torch.float32] * 3
        calls.clear()
        with torch.autocast("cpu", dtype=dtype):
            twin(ids)
        assert calls[:3] == [dtype] * 3  # the shadows, no cast
        calls.clear()
        with torch.autocast("cpu", dtype=other):  # another dtype than the shadows': stock's forward
            twin(ids)
        assert calls[:3] == [torch.float32] * 3


def test_a_changed_or_copied_parameter_is_not_computed_with_stale_shadows():
    """A parameter changed after the refresh (in place, or its data replaced, as OpenNMT-py's validation with
    -average_decay does on a deep copy of the model) makes its layer compute from the parameter again."""
    model, twin = _twins()
    half = HalfWeights(twin, DTYPE)
    ids = torch.randint(0, 11, (2, 4), generator=torch.Generator().manual_seed(2))

    def same():
        with torch.autocast("cpu", dtype=DTYPE):
            return torch.equal(twin(ids), model(ids))

    assert same()
    with torch.no_grad():
        for net in (model, twin):
            net.first.weight.add_(0.5)
    assert same()
    copied, reference = copy.deepcopy(twin), copy.deepcopy(model)
    for net in (copied, reference):
        net.second.weight.data = torch.full_like(net.second.weight, 0.25)
    with torch.autocast("cpu", dtype=DTYPE):
        assert torch.equal(copied(ids), reference(ids))
    half.refresh()
    assert same()


def test_the_option_is_refused_where_it_cannot_work(monkeypatch):
    from onmt_ext.runtime.half_weights import _combination_check

    def opt(**values):
        return argparse.Namespace(**{"ext_half_weights": True, "model_dtype": "fp16", "optim": "adam",
                                     "ext_compile_layers": False, **values})

    assert _combination_check(opt()) == []
    assert _combination_check(opt(ext_half_weights=False, model_dtype="fp32")) == []
    assert "needs -model_dtype fp16" in _combination_check(opt(model_dtype="fp32"))[0]
    assert "fusedadam" in _combination_check(opt(optim="fusedadam"))[0]
    assert _combination_check(opt(ext_compile_layers=True)) == []  # tests/unit/test_compile_layers.py
    monkeypatch.setenv("ONMT_EXT_RUNTIME", "stock")
    assert "ONMT_EXT_RUNTIME=stock" in _combination_check(opt())[0]


CONFIG = "yaml_configs/demo/tatoeba_zhen.yaml"
SHAPES = [([7, 5, 3], [6, 8, 4]), ([4, 9], [5, 3]), ([6, 6, 2, 5], [7, 2, 6, 3]), ([3, 8], [9, 4])]


def _trained(half_weights, accum_count, compile_layers=False):
    """Parameters after each step of OpenNMT-py's trainer (onmt-ext's step) under CPU autocast, with or without
    the shadows on its optimizer, with eager or compiled layers (-ext_compile_layers, as onmt_train builds them:
    the layers wrapped before the optimizer is made)."""
    from onmt.trainer import build_trainer
    from onmt.utils import Statistics
    from onmt.utils.optimizers import Optimizer

    opt = support.load_train_opts(CONFIG, "-accum_count", accum_count, "-seed", 1)
    opt.data = {}
    vocabs = support.load_vocabs(opt)
    model = support.build_model(opt, vocabs, seed=3)
    if compile_layers:
        ext_compile.compile_layers(model)
    model.train()
    optim = Optimizer.from_opt(model, opt)
    assert not hasattr(optim, "_onmt_ext_half_weights")  # float32 training: the option is off
    if half_weights:
        optim._onmt_ext_half_weights = HalfWeights(model, DTYPE)
    trainer = build_trainer(opt, -1, model, vocabs, optim, model_saver=None)
    batches = []
    for seed, (src_lens, tgt_lens) in enumerate(SHAPES):
        src, src_len, tgt = support.random_batch(vocabs, src_lens, tgt_lens, seed=seed)
        batches.append(({"src": src, "srclen": src_len, "tgt": tgt}, 0))
    states, total, report = [], Statistics(), Statistics()
    torch.manual_seed(1)
    for group, normalization in trainer._accum_batches(iter(batches)):
        with torch.autocast("cpu", dtype=DTYPE):
            trainer._gradient_accumulation(group, normalization, total, report)
        states.append({name: p.detach().clone() for name, p in model.named_parameters()})
    return states, optim


@pytest.mark.parametrize("accum_count", [1, 2])
def test_the_trainer_with_half_weights_steps_as_autocast_does(accum_count):
    """Through OpenNMT-py's optimizer (zero_grad, backward, step: onmt-ext's wrappers) and onmt-ext's training
    step, the Transformer's parameters after every step equal autocast's to the bit."""
    expected, _ = _trained(False, accum_count)
    got, optim = _trained(True, accum_count)
    half = optim._onmt_ext_half_weights
    assert len(half.modules) > 10 and len(got) == len(SHAPES) // accum_count
    for step, (ours, theirs) in enumerate(zip(got, expected), start=1):
        for name in theirs:
            assert torch.equal(ours[name], theirs[name]), (step, name)
    assert all(s.grad is None for s in half.shadows) and half.collected == len(SHAPES)  # every backward pass


def test_the_optimizer_gets_the_shadows_with_amp_only():
    from onmt.utils.optimizers import Optimizer

    for on in ("false", "true"):
        opt = support.load_train_opts(CONFIG, "-model_dtype", "fp16", "-ext_half_weights", on)
        vocabs = support.load_vocabs(opt)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's gradient scaler: no CUDA here
            optim = Optimizer.from_opt(support.build_model(opt, vocabs, seed=3), opt)
        assert optim.amp and hasattr(optim, "_onmt_ext_half_weights") == (on == "true")


def _amp_optimizer(model, half_weights):
    """OpenNMT-py's optimizer of ``model`` as ``-model_dtype fp16`` makes it for a GPU run: AMP's, with torch's
    gradient scaler (which switches itself off without CUDA), and with ``-ext_half_weights`` the float16 shadows
    that the option gives it."""
    from onmt.utils.optimizers import Optimizer

    opt = support.load_train_opts(CONFIG, "-model_dtype", "fp16", "-ext_half_weights", str(half_weights).lower())
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*GradScaler.*")  # no CUDA here
        return Optimizer.from_opt(model, opt)


@pytest.mark.parametrize("accumulate", [1, 3])
def test_the_amp_optimizer_of_the_option_steps_in_float16_as_autocast_does(accumulate):
    """``-model_dtype fp16 -ext_half_weights true``, the GPU's configuration, under float16 autocast (the CPU's
    here, CUDA's on the GPU): OpenNMT-py's AMP optimizer holds float16 shadows, and through its zero_grad,
    backward and step (onmt-ext's wrappers collect, refresh and clear them) the parameters after every step
    equal those of AMP training without the option, to the bit."""
    model, twin = _twins(read_directly=False)
    expected, got = _amp_optimizer(model, False), _amp_optimizer(twin, True)
    assert expected.amp and got.amp and not hasattr(expected, "_onmt_ext_half_weights")
    half, before = got._onmt_ext_half_weights, copy.deepcopy(twin.first.weight)
    assert half.dtype == torch.float16 and {id(m) for m in half.modules} == {
        id(twin.first), id(twin.second), id(twin.direct), id(twin.unused)}
    for step in range(3):
        for net, optim in ((model, expected), (twin, got)):
            optim.zero_grad(set_to_none=True)
            for seed in range(10 * step, 10 * step + accumulate):
                ids = torch.randint(0, 11, (3, 5), generator=torch.Generator().manual_seed(seed))
                with torch.autocast("cpu", dtype=torch.float16):
                    loss = -net(ids).mean()
                optim.backward(loss)
            optim.step()
        for (name, ours), theirs in zip(twin.named_parameters(), model.parameters()):
            assert ours.dtype == torch.float32 and torch.equal(ours, theirs), (step, name)
    assert not torch.equal(twin.first.weight, before)  # (the steps moved the parameters)
    assert half.collected == 3 * accumulate and all(s.grad is None for s in half.shadows)
    assert all(torch.equal(s, m.to(torch.float16)) for s, m in zip(half.shadows, half.masters))  # refreshed


def test_a_model_without_linear_layers_gets_no_shadows():
    model = torch.nn.Sequential(torch.nn.Embedding(5, 4))
    half = HalfWeights(model, DTYPE)
    half.refresh()
    half.collect()
    half.clear()
    assert half.modules == [] and half.shadows == [] and half.collected == 0
