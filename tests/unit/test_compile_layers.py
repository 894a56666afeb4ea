"""``-ext_compile_layers``: whole Transformer layers through ``torch.compile`` in training passes
(:func:`onmt_ext.runtime.compile.compile_layers`).

On the CPU, with ``aot_eager`` (the graphs Dynamo and AOTAutograd capture, run without generated code):

* a model with compiled layers gives the eager model's training outputs and gradients over three batch shapes,
  stock (fast tier) and with each paper's mechanisms (slow tier); the third shape compiles nothing new;
* layers of OpenNMT-py modules only see lengths padded to a multiple of 8, with the eager values; layers
  holding an onmt-ext module keep theirs;
* evaluation and step-by-step decoding stay eager, and decoding still equals the full pass;
* parameters and state dict are unchanged; a layer is wrapped once, even if another hook made its ``forward`` a
  ``partial``; the option reaches the model that ``onmt_train`` builds;
* with ``-ext_half_weights`` (CPU bfloat16 autocast) the trainer steps as with compiled layers alone, to the bit,
  in as many graphs; a layer whose shadows are stale runs eagerly, without them.
"""

import copy
import sys

import pytest
import torch

import support
import test_half_weights as half_tests
from onmt_ext.runtime import compat
from onmt_ext.mechanisms import initialisation
from onmt_ext import options
from onmt_ext.runtime import compile as ext_compile
from onmt_ext.runtime.half_weights import HalfWeights

BASELINE = "yaml_configs/smoke/baseline/transformer_base_wmt17_zhen.yaml"
SHAPES = [([5, 3, 4], [4, 6, 2]), ([7, 2], [3, 5]), ([4, 6, 3, 5], [6, 2, 4, 3])]


def _models(config):
    opt = support.load_train_opts(config, "-dropout", "0", "-attention_dropout", "0")
    vocabs = support.load_vocabs(opt)
    eager = support.build_model(opt, vocabs, seed=5)
    fast = copy.deepcopy(eager)
    return eager, fast, vocabs


@pytest.fixture
def counter(monkeypatch):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    counting = CompileCounterWithBackend("aot_eager")
    monkeypatch.setattr(ext_compile, "BACKEND", counting)
    monkeypatch.setattr(ext_compile, "_COMPILED", {})
    yield counting
    torch._dynamo.reset()


def _pass(model, src, src_len, tgt):
    model.zero_grad(set_to_none=True)
    enc_out, dec_out = support.full_forward(model, src, src_len, tgt)
    loss = (dec_out * torch.linspace(-1, 1, dec_out.numel()).view_as(dec_out)).sum() + enc_out.square().mean()
    loss.backward()
    return dec_out.detach(), [p.grad for p in model.parameters()]


@pytest.mark.parametrize("config", [
    BASELINE,
    pytest.param("yaml_configs/smoke/li2019/em_all_components.yaml", marks=pytest.mark.slow),
    pytest.param("yaml_configs/smoke/cao2019/transformer_base_wmt17_zhen_cross_zero.yaml", marks=pytest.mark.slow),
    pytest.param("yaml_configs/smoke/chen2019/transformer_base_nist_zhen_mprhead.yaml", marks=pytest.mark.slow),
    pytest.param("yaml_configs/smoke/clause/transformer_base_wmt16_ende_ca_rule.yaml", marks=pytest.mark.slow),
    pytest.param("yaml_configs/smoke/gret/transformer_base_wmt14_deen_gret.yaml", marks=pytest.mark.slow),
], ids=lambda c: c.split("smoke/")[1].removesuffix(".yaml"))
def test_compiled_layers_train_as_eager(config, sample_data, onmt_active, counter):
    eager, fast, vocabs = _models(config)
    layers = ext_compile.compile_layers(fast)
    assert layers == len(fast.encoder.transformer) + len(fast.decoder.transformer_layers)
    eager.train(), fast.train()
    frames = []
    for seed, (src_lens, tgt_lens) in enumerate(SHAPES):
        src, src_len, tgt = support.random_batch(vocabs, src_lens, tgt_lens, seed=seed)
        (out_e, grads_e), (out_f, grads_f) = _pass(eager, src, src_len, tgt), _pass(fast, src, src_len, tgt)
        torch.testing.assert_close(out_f, out_e, atol=1e-5, rtol=1e-4)
        for g_f, g_e in zip(grads_f, grads_e):
            assert (g_f is None) == (g_e is None)
            if g_e is not None:
                torch.testing.assert_close(g_f, g_e, atol=1e-5, rtol=1e-4)
        frames.append(counter.frame_count)
    assert frames[0] > 0, "no layer went through torch.compile"
    assert frames[-1] == frames[1], f"still recompiling for new shapes: frames after each batch {frames}"
    if config == BASELINE:  # a stock layer is one graph, and a new batch shape compiles nothing new
        assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])
        assert frames[-1] == frames[0], frames


@pytest.mark.parametrize("config", [BASELINE, "yaml_configs/smoke/chen2019/transformer_base_nist_zhen_mprhead.yaml",
                                    "yaml_configs/smoke/cao2019/transformer_base_wmt17_zhen_cross_zero.yaml"],
                         ids=["stock", "chen2019-stock-layers", "cao2019"])
def test_stock_layers_see_lengths_padded_to_a_multiple_of_8(config, sample_data, onmt_active, monkeypatch):
    """Inductor's CUDA attention guards on the key length being a multiple of 8, so the compiled stock layers get
    their lengths padded (masked keys, query rows cut off), also around chen2019's embeddings; layers that hold
    an onmt-ext module (cao2019's attention) keep theirs.  The graph is run eagerly here: this checks the
    padding, the test above the compiled arithmetic."""
    seen, mask_strides = [], set()

    def recording(fn, fullgraph=True):
        def run(layer, layer_in, *args, **kwargs):
            seen.append((type(layer).__name__, layer_in.size(1), *(a.size(1) for a in args[:1] if a.dim() == 3)))
            if args[0].dim() == 4:  # an encoder layer's mask (batch, 1, src, src): one layout, padded or not
                mask_strides.add(args[0].stride(2))
            return fn(layer, layer_in, *args, **kwargs)
        return run

    eager, fast, vocabs = _models(config)
    ext_compile.compile_layers(fast)
    eager.train(), fast.train()
    monkeypatch.setattr(ext_compile, "compiled", recording)
    for seed, (src_lens, tgt_lens) in enumerate([([5, 3, 9], [4, 6, 2]), ([8, 2], [9, 3])]):
        src, src_len, tgt = support.random_batch(vocabs, src_lens, tgt_lens, seed=seed)
        (out_e, grads_e), (out_f, grads_f) = _pass(eager, src, src_len, tgt), _pass(fast, src, src_len, tgt)
        torch.testing.assert_close(out_f, out_e, atol=1e-5, rtol=1e-4)
        for g_f, g_e in zip(grads_f, grads_e):
            if g_e is not None:
                torch.testing.assert_close(g_f, g_e, atol=1e-5, rtol=1e-4)
    lengths = [length for _, *sizes in seen for length in sizes]
    assert seen and any(length % 8 for length in [5, 3, 9, 4, 6, 2])
    if "cao2019" not in config:
        assert all(length % 8 == 0 for length in lengths), seen
        assert mask_strides == {0}, mask_strides  # batch 2's source (8) is not padded, batch 1's (9) is
    else:
        assert any(length % 8 for length in lengths), seen


def test_evaluation_and_decoding_stay_eager(sample_data, onmt_active, counter):
    _, fast, vocabs = _models(BASELINE)
    ext_compile.compile_layers(fast)
    src, src_len, tgt = support.random_batch(vocabs, [6, 4, 5], [5, 5, 5], seed=7)
    fast.eval()
    with torch.no_grad():
        _, full = support.full_forward(fast, src, src_len, tgt)
        enc_out, lengths = support.start_decoding(fast, src, src_len)
        stepwise = support.decode_steps(fast, tgt, enc_out, lengths, 0, tgt.size(1))
    assert counter.frame_count == 0
    torch.testing.assert_close(stepwise, full, atol=1e-5, rtol=0)


def test_parameters_and_state_dict_are_unchanged_and_wrapping_is_once(sample_data, onmt_active):
    eager, fast, _ = _models(BASELINE)
    before = fast.forward
    assert ext_compile.compile_layers(fast) == ext_compile.compile_layers(fast) > 0
    layer = fast.encoder.transformer[0]
    assert layer.forward.args[1].__func__ is type(layer).forward  # wrapped once: the eager forward inside
    assert fast.forward == before
    assert list(fast.state_dict()) == list(eager.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(fast.state_dict().values(), eager.state_dict().values()))


def test_a_layer_whose_forward_another_hook_made_a_partial_is_still_wrapped(sample_data, onmt_active):
    from functools import partial

    _, fast, _ = _models(BASELINE)
    layer = fast.encoder.transformer[0]
    theirs = partial(type(layer).forward, layer)  # a partial that is not ours
    layer.forward = theirs
    wrapped = ext_compile.compile_layers(fast)
    assert len(ext_compile.compiled_layers(fast)) == wrapped
    assert layer.forward.args[1] is theirs  # ours, with theirs inside as the eager forward


def test_the_option_reaches_the_model_onmt_train_builds(sample_data, onmt_active):
    opt = support.load_train_opts(BASELINE, "-ext_compile_layers", "true")
    assert opt.ext_compile_layers is True and options.check_options(opt) == []  # stock layers: no mechanism needed
    for on in (False, True):
        opt.ext_compile_layers = on
        model = copy.deepcopy(_models(BASELINE)[0])
        built = initialisation._build_model_initialised(lambda *args, **kwargs: model, opt, opt, None, None)
        wrapped = [type(layer).__name__ for layer in built.modules() if "forward" in vars(layer)]
        assert bool(wrapped) is on, wrapped


def test_compiled_layers_import_the_routing_kernels_before_any_graph(sample_data, onmt_active, monkeypatch):
    """cao2019's cross aggregation routes inside a compiled layer's graph, whose trace cannot import the fused
    kernels: without an eager import first, every compiled training pass on CUDA routed in PyTorch.  The model
    that ``onmt_train`` builds with compiled layers imports them where its device routes through them (CUDA,
    taken here for the CPU's by ``routing._on_cuda``)."""
    from onmt_ext.mechanisms import routing

    loads = []
    monkeypatch.delitem(sys.modules, routing._KERNEL_MODULE, raising=False)
    monkeypatch.setattr(routing, "_load_kernels", lambda: loads.append(1))
    monkeypatch.setattr(routing, "_on_cuda", lambda tensor: True)
    monkeypatch.setenv("ONMT_EXT_ROUTING_KERNEL", "auto")
    opt = support.load_train_opts(BASELINE, "-ext_compile_layers", "true")
    for on in (False, True):
        opt.ext_compile_layers = on
        model = copy.deepcopy(_models(BASELINE)[0])
        initialisation._build_model_initialised(lambda *args, **kwargs: model, opt, opt, None, None)
        assert len(loads) == int(on), (on, loads)


def test_a_layer_compile_failure_names_the_option(sample_data, onmt_active, monkeypatch):
    class FakeBackendError(Exception):
        __module__ = "torch._dynamo.exc"

    def broken(*args, **kwargs):
        raise FakeBackendError("cannot trace this\nmore detail")

    _, fast, vocabs = _models(BASELINE)
    ext_compile.compile_layers(fast)
    fast.train()
    monkeypatch.setattr(ext_compile, "compiled", lambda fn, fullgraph=True: broken)
    src, src_len, tgt = support.random_batch(vocabs, [3, 2], [3, 3], seed=1)
    with pytest.raises(RuntimeError, match=r"^-ext_compile_layers: .*TransformerEncoderLayer.forward.*cannot trace "
                                           r"this\); run with -ext_compile_layers false$"):
        support.full_forward(fast, src, src_len, tgt)


def _sdp_states():
    cuda = torch.backends.cuda
    return cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(), cuda.math_sdp_enabled(), cuda.cudnn_sdp_enabled()


def test_the_sdp_kernel_stand_in_chooses_the_backends_it_is_given():
    names = ("enable_flash", "enable_math", "enable_mem_efficient", "enable_cudnn")
    for number in range(16):
        chosen = {name: bool(number >> bit & 1) for bit, name in enumerate(names)}
        with pytest.warns(FutureWarning), torch.backends.cuda.sdp_kernel(**chosen):
            stock = _sdp_states()
        with compat.opennmt_sdp_kernel(**chosen):
            assert _sdp_states() == stock, chosen


def test_opennmt_attention_gets_the_backends_it_names(onmt_active):
    """OpenNMT-py 3.5.1's GPU attention enters ``sdp_kernel(enable_flash=False, enable_math=True,
    enable_mem_efficient=True)``; later torch adds cuDNN's attention to that unless told not to.  Through the
    patch, the call gets the named backends only, and the stock function is back afterwards."""
    from onmt.modules.multi_headed_attn import MultiHeadedAttention

    seen, stock = [], torch.backends.cuda.sdp_kernel

    def attention(self, fail=False):
        with torch.backends.cuda.sdp_kernel(enable_flash=False, enable_math=True, enable_mem_efficient=True):
            seen.append(_sdp_states())
        if fail:
            raise ValueError("inside the attention")
        return "out"

    assert compat._attention_forward(attention, None) == "out"
    with pytest.raises(ValueError):
        compat._attention_forward(attention, None, fail=True)
    assert seen == [(False, True, True, False)] * 2 and torch.backends.cuda.sdp_kernel is stock
    assert MultiHeadedAttention.forward.__wrapped_stock__ is not MultiHeadedAttention.forward  # installed


class _Attending(torch.nn.Module):
    """A layer shaped like OpenNMT-py's attention on a GPU: ``sdpa`` inside ``torch.backends.cuda.sdp_kernel``."""

    training = True

    def forward(self, x):
        with torch.backends.cuda.sdp_kernel(enable_flash=False, enable_math=True, enable_mem_efficient=True):
            y = torch.nn.functional.scaled_dot_product_attention(x, x, x)
        return (y * 2).relu()


def test_a_compiled_layer_traces_through_the_attention_backend_choice(monkeypatch):
    """The attention is in the layer's one graph; with the stock ``sdp_kernel`` the graph breaks before it and
    ``sdpa`` runs eagerly."""
    from torch._dynamo.testing import EagerAndRecordGraphs

    torch._dynamo.reset()
    recorder = EagerAndRecordGraphs()
    monkeypatch.setattr(ext_compile, "BACKEND", recorder)
    monkeypatch.setattr(ext_compile, "_COMPILED", {})
    layer, stock, x = _Attending(), torch.backends.cuda.sdp_kernel, torch.randn(2, 3, 5, 4)
    out = ext_compile._layer_forward(layer, layer.forward, None, x)
    torch._dynamo.reset()
    assert len(recorder.graphs) == 1
    assert "scaled_dot_product_attention" in recorder.graphs[0].code
    torch.testing.assert_close(out, (torch.nn.functional.scaled_dot_product_attention(x, x, x) * 2).relu())
    assert torch.backends.cuda.sdp_kernel is stock


def test_recompilations_are_logged_unless_torch_logs_says_otherwise(sample_data, onmt_active, monkeypatch):
    calls = []
    monkeypatch.setattr(torch._logging, "set_logs", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setenv("TORCH_LOGS", "+dynamo")
    ext_compile.compile_layers(_models(BASELINE)[1])
    assert calls == []  # the user's choice stands
    monkeypatch.delenv("TORCH_LOGS")
    ext_compile.compile_layers(_models(BASELINE)[1])
    assert calls == [{"recompiles": True}]


def _graphs(counter, run):
    """``run()`` from a fresh Dynamo (``counter``: the fixture's) and what it compiled: Dynamo's frames, unique
    graphs and graph breaks."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    ext_compile._COMPILED.clear()
    counter.clear()
    result = run()
    counts = torch._dynamo.utils.counters
    return result, (counter.frame_count, counts["stats"]["unique_graphs"], sum(counts["graph_break"].values()))


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_half_weights_in_compiled_layers_step_as_compiled_layers_alone(sample_data, onmt_active, counter, backend):
    """-ext_half_weights with -ext_compile_layers: the graphs compute with the shadows (their gradients are
    collected after every backward pass) and the parameters after every step equal compiled layers' without
    them, to the bit, also through Inductor's generated code (slow tier: 1-2 minutes); as many graphs as
    without them (a recompilation per layer would add one for each of the two encoder layers) and no graph
    break."""
    counter.backend = backend
    expected, alone = _graphs(counter, lambda: half_tests._trained(False, 1, compile_layers=True)[0])
    (got, optim), graphs = _graphs(counter, lambda: half_tests._trained(True, 1, compile_layers=True))
    half = optim._onmt_ext_half_weights
    assert half.collected == len(half_tests.SHAPES) and half._present == list(range(len(half.shadows)))
    for step, (ours, theirs) in enumerate(zip(got, expected), start=1):
        for name in theirs:
            assert torch.equal(ours[name], theirs[name]), (step, name)
    assert graphs == alone and alone[2] == 0, (graphs, alone)


def test_a_layer_with_stale_shadows_runs_eagerly_without_them(sample_data, onmt_active, counter):
    """A parameter changed after the refresh makes its compiled layer run eagerly (each Linear there checks its
    own shadows: the changed one computes from its parameter, as eager autocast does), the others stay in their
    graph, nothing recompiles; after the refresh all run compiled with their shadows again."""
    eager, fast, vocabs = _models(BASELINE)
    ext_compile.compile_layers(fast)
    half = HalfWeights(fast, half_tests.DTYPE)
    eager.train(), fast.train()
    stale = fast.encoder.transformer[0]
    frames = []
    for seed, (src_lens, tgt_lens) in enumerate(SHAPES):
        if seed == 1:
            with torch.no_grad():
                for model in (eager, fast):
                    model.encoder.transformer[0].self_attn.linear_query.weight.add_(0.5)
        if seed == 2:
            half.refresh()
        src, src_len, tgt = support.random_batch(vocabs, src_lens, tgt_lens, seed=seed)
        with torch.autocast("cpu", dtype=half_tests.DTYPE):
            outputs = [_pass(model, src, src_len, tgt)[0] for model in (eager, fast)]
        half.collect()
        assert torch.equal(*outputs), seed
        for p_f, p_e in zip(fast.parameters(), eager.parameters()):  # AOTAutograd's backward sums in another
            if p_e.grad is not None:  # order than eager's: about 1e-7 apart
                torch.testing.assert_close(p_f.grad, p_e.grad, atol=1e-5, rtol=1e-4)
        live = {id(s.module): s.live for s in half._shadows}
        assert [live[id(m)] for m in stale.modules() if id(m) in live] == [seed != 1] * 6, seed
        assert all(live[id(m)] for m in fast.decoder.modules() if id(m) in live), seed
        frames.append(counter.frame_count)
    assert frames[0] > 0 and frames == [frames[0]] * len(SHAPES), frames
