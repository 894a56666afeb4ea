"""chen2019 recurrent positional embeddings: layouts, the BiRNN and padding, decoding state, head isolation, options.

A bad option value through ``onmt_train`` is in tests/integration/test_chen2019_cli.py, which
imports ``SMOKE`` and ``EXT`` from here.
"""

import argparse

import pytest
import torch

import support
from onmt_ext import options
from onmt_ext.mechanisms.chen2019 import BlockDiagonalLinear, HeadwiseNorm, RecurrentPositionalEmbeddings, combine

SMOKE = "yaml_configs/smoke/baseline/transformer_base_wmt14_ende.yaml"
EXT = ["-encoder_type", "ext_transformer", "-decoder_type", "ext_transformer"]


def test_layouts_on_a_hand_example():
    p = torch.tensor([[1.0, 2, 3, 4]])  # d_p = 4
    r = torch.tensor([[10.0, 20, 30, 40]])  # d_r = 4
    assert combine(p, r, 2, "rpehead").tolist() == [[1, 2, 3, 4, 10, 20, 30, 40]]
    # eq. 9-10, two heads: [p^1 : r^1, p^2 : r^2]
    assert combine(p, r, 2, "mprhead").tolist() == [[1, 2, 10, 20, 3, 4, 30, 40]]


def _embeddings(vocab=30, dim=16, pad=1, pe=True):
    from onmt.modules import Embeddings

    torch.manual_seed(0)
    emb = Embeddings(dim, vocab, pad, position_encoding=pe)
    torch.nn.init.normal_(emb.word_lut.weight)
    return emb


@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
def test_source_birnn_matches_a_per_sentence_bidirectional_rnn_and_ignores_padding(cell, onmt_active):
    module = RecurrentPositionalEmbeddings(_embeddings(), 4, 8, "rpehead", cell, bidirectional=True)
    module.eval()
    lengths = [5, 2, 7]
    src = torch.full((3, 7, 1), 1, dtype=torch.long)
    for b, n in enumerate(lengths):
        src[b, :n, 0] = torch.randint(4, 30, (n,))
    out = module(src)
    # reference: torch's own bidirectional RNN with the same weights, one unpadded sentence at a time
    reference = {"rnn": torch.nn.RNN, "gru": torch.nn.GRU, "lstm": torch.nn.LSTM}[cell](
        8, 4, batch_first=True, bidirectional=True)
    with torch.no_grad():
        for name, value in module.rnn.named_parameters():
            getattr(reference, name).copy_(value)
            getattr(reference, name + "_reverse").copy_(getattr(module.rnn_backward, name))
    for b, n in enumerate(lengths):
        x_r = module.make_embedding(src[b : b + 1, :n])[..., 8:] * 16 ** 0.5  # x_j times sqrt(d_model), split
        states, _ = reference(x_r)
        expected_r = torch.tanh(module.proj(states))
        torch.testing.assert_close(out[b : b + 1, :n, 8:], expected_r, atol=1e-6, rtol=0)
        torch.testing.assert_close(out[b : b + 1, :n], module(src[b : b + 1, :n]), atol=1e-6, rtol=0)


def test_p_is_the_scaled_x_p_plus_opennmt_sinusoidal_encoding_at_size_d_p(onmt_active):
    from onmt.modules.embeddings import PositionalEncoding

    pe = PositionalEncoding(8, "SinusoidalInterleaved")
    zeros = torch.zeros(2, 6, 8)
    src = torch.randint(4, 30, (2, 6, 1))
    for scale, factor in (("embedding", 16 ** 0.5), ("parts", 8 ** 0.5), ("none", 8 ** 0.5)):
        module = RecurrentPositionalEmbeddings(_embeddings(), 4, 8, "rpehead", bidirectional=True, scale=scale)
        x_p = module.make_embedding(src)[..., :8]
        torch.testing.assert_close(module(src)[..., :8], factor * x_p + pe(zeros))  # eq. 2 at size d_p
    without = RecurrentPositionalEmbeddings(_embeddings(), 4, 8, "rpehead", bidirectional=True,
                                            position_encoding=False, scale="none")
    assert torch.equal(without(src)[..., :8], x_p)  # no PE: stock OpenNMT-py embeddings (unscaled)


@pytest.mark.parametrize("scale, factor", [("embedding", 16 ** 0.5), ("parts", 8 ** 0.5), ("none", 1.0)])
def test_the_rnn_reads_x_r_scaled_by_chen2019_scale(scale, factor, onmt_active):
    module = RecurrentPositionalEmbeddings(_embeddings(), 4, 8, "mprhead", bidirectional=False, scale=scale).eval()
    src = torch.randint(4, 30, (2, 6, 1))
    x_r = module.make_embedding(src)[..., 8:]
    r = torch.tanh(module.proj(module.rnn(factor * x_r)[0]))
    torch.testing.assert_close(module(src).reshape(2, 6, 4, 4)[..., 2:].reshape(2, 6, 8), r)  # eq. 6, then eq. 9


def test_rnn_initialisation_follows_chen2019_init(onmt_active):
    from onmt_ext.mechanisms.initialisation import declared

    for cell in ("rnn", "gru", "lstm", "sru"):
        glorot = RecurrentPositionalEmbeddings(_embeddings(), 4, 8, "rpehead", cell, bidirectional=True)
        for name, rule in declared(glorot).items():
            assert rule.mismatch(dict(glorot.named_parameters())[name]) is None, (cell, name)
        if cell != "sru":
            projected = RecurrentPositionalEmbeddings(_embeddings(), 4, 8, "rpehead", cell, bidirectional=True,
                                                      recurrence="projected")
            rules = declared(projected)
            assert {"proj_backward.weight", "proj_backward.bias"} <= set(rules)
            assert set(rules) == {name for name, _ in projected.named_parameters()}
            for name, rule in rules.items():
                assert rule.mismatch(dict(projected.named_parameters())[name]) is None, (cell, name)
        assert glorot.rnn.bias.abs().sum() == 0 if cell == "sru" else glorot.rnn.bias_ih_l0.abs().sum() == 0
        pytorch = RecurrentPositionalEmbeddings(_embeddings(), 4, 8, "rpehead", cell, bidirectional=True,
                                                init="pytorch")
        matrix = pytorch.rnn.weight.weight if cell == "sru" else pytorch.rnn.weight_hh_l0
        bound = 1 / 8 ** 0.5 if cell == "sru" else 1 / 4 ** 0.5  # nn.Linear: 1/sqrt(in); RNN: 1/sqrt(units)
        assert matrix.abs().max() <= bound and matrix.abs().max() > bound / 2


CELLS_AND_RECURRENCES = [("rnn", "hidden"), ("gru", "hidden"), ("lstm", "hidden"), ("sru", "hidden"),
                         ("rnn", "projected"), ("gru", "projected"), ("lstm", "projected")]


@pytest.mark.parametrize("cell, recurrence", CELLS_AND_RECURRENCES)
def test_target_rnn_step_by_step_equals_full_pass_and_follows_beam_reordering(cell, recurrence, onmt_active):
    module = RecurrentPositionalEmbeddings(_embeddings(), 4, 8, "mprhead", cell, bidirectional=False,
                                           recurrence=recurrence)
    module.eval()
    tgt = torch.randint(4, 30, (3, 6, 1))
    full = module(tgt)
    steps = [module(tgt[:, j : j + 1], step=j) for j in range(3)]
    perm = torch.tensor([2, 0, 1])
    module.reorder_decoding_state(lambda state, dim: state.index_select(dim, perm))
    steps = [s[perm] for s in steps] + [module(tgt[perm, j : j + 1], step=j) for j in range(3, 6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full[perm], atol=1e-6, rtol=0)
    assert set(module.decoding_state) == ({"hidden", "cell"} if cell == "lstm" else {"hidden"})
    module(tgt[:, :1], step=0)  # a new sentence starts from the zero state whatever was saved
    torch.testing.assert_close(module(tgt[:, 1:2], step=1), full[:, 1:2], atol=1e-6, rtol=0)


@pytest.mark.parametrize("cell, recurrence", CELLS_AND_RECURRENCES)
def test_cpu_autocast_both_sides_and_step_by_step(cell, recurrence, onmt_active):
    """Under CPU bf16 autocast every cell runs on both sides, and the target side's steps equal its full pass.

    The LSTM's recurrence runs in float32 there (oneDNN refuses a bf16 LSTM on CPUs without AVX-512), so its
    states are exactly the fp32 ones, and so is the decoding state it keeps.
    """
    source = RecurrentPositionalEmbeddings(_embeddings(), 4, 8, "rpehead", cell, bidirectional=True,
                                           recurrence=recurrence).eval()
    target = RecurrentPositionalEmbeddings(_embeddings(), 4, 8, "mprhead", cell, bidirectional=False,
                                           recurrence=recurrence).eval()
    src = torch.randint(4, 30, (3, 6, 1))
    src[1, 4:, 0] = 1  # padding
    tgt = torch.randint(4, 30, (3, 6, 1))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isfinite(source(src)).all()
        full = target(tgt)
        steps = torch.cat([target(tgt[:, j : j + 1], step=j) for j in range(6)], dim=1)
        if cell == "lstm" and recurrence == "hidden":
            x_r = target.make_embedding(tgt)[..., 8:]
            states, _ = target._recur(target.rnn, x_r)
            assert states.dtype == torch.float32 and target.decoding_state["cell"].dtype == torch.float32
            with torch.autocast("cpu", enabled=False):
                torch.testing.assert_close(states, target.rnn(x_r.float())[0], atol=0, rtol=0)
    assert torch.isfinite(full).all()
    torch.testing.assert_close(steps.float(), full.float(), atol=1e-2, rtol=0)


def test_sru_follows_its_recurrence_and_ignores_padding_on_the_source_side(onmt_active):
    from onmt_ext.mechanisms.chen2019 import SRU

    torch.manual_seed(0)
    sru = SRU(4, 3)
    torch.nn.init.normal_(sru.recurrent)
    x = torch.randn(2, 5, 4)
    out, final = sru(x)
    w = sru.weight.weight
    c = torch.zeros(2, 3)
    for t in range(5):  # Lei et al. 2018, written out one step at a time
        xt, f_in, r_in, hw = (x[:, t] @ w.t()).split(3, dim=-1)
        f = torch.sigmoid(f_in + sru.recurrent[0] * c + sru.bias[0])
        r = torch.sigmoid(r_in + sru.recurrent[1] * c + sru.bias[1])
        c = f * c + (1 - f) * xt
        torch.testing.assert_close(out[:, t], r * c + (1 - r) * hw)
    torch.testing.assert_close(final[0], c)
    module = RecurrentPositionalEmbeddings(_embeddings(), 4, 8, "rpehead", "sru", bidirectional=True).eval()
    src = torch.full((2, 6, 1), 1, dtype=torch.long)
    src[0, :6, 0], src[1, :3, 0] = torch.randint(4, 30, (6,)), torch.randint(4, 30, (3,))
    torch.testing.assert_close(module(src)[1:, :3], module(src[1:, :3]), atol=1e-6, rtol=0)


def test_block_diagonal_projection_and_headwise_norm_keep_heads_apart():
    torch.manual_seed(0)
    linear, norm = BlockDiagonalLinear(8, 4, bias=True), HeadwiseNorm(8, 4)
    torch.nn.init.normal_(linear.bias)
    x = torch.randn(2, 3, 8)
    changed = x.clone()
    changed[..., 6:] = torch.randn(2, 3, 2) * 5  # the last head's slice only
    for module in (linear, norm):
        a, b = module(x), module(changed)
        assert torch.equal(a[..., :6], b[..., :6]) and not torch.allclose(a[..., 6:], b[..., 6:])
    layer_norm = torch.nn.LayerNorm(2, eps=1e-6, elementwise_affine=False)
    torch.testing.assert_close(norm(x), layer_norm(x.view(2, 3, 4, 2)).view(2, 3, 8))


def _first_layer_heads(model, src, src_len, tgt):
    """The per-head context (before W^O) of the first encoder and decoder self-attention layers."""
    seen = {}
    hooks = [attention.final_linear.register_forward_pre_hook(
        lambda module, args, key=key: seen.__setitem__(key, args[0].detach().clone()))
        for key, attention in (("enc", model.encoder.transformer[0].self_attn),
                               ("dec", model.decoder.transformer_layers[0].self_attn))]
    support.full_forward(model, src, src_len, tgt)
    for hook in hooks:
        hook.remove()
    return seen


@pytest.mark.parametrize("heads_option, isolated", [("restricted", True), ("full", False)])
def test_restricted_rpehead_p_heads_do_not_see_r(heads_option, isolated, sample_data, onmt_active):
    # d_model 32, 4 heads of 8: d_r 16 gives heads 1-2 on P and heads 3-4 on R
    opt = support.load_train_opts(SMOKE, *EXT, "-chen2019_enc", "rpehead", "-chen2019_dec", "rpehead",
                                  "-chen2019_dim", "16", "-chen2019_heads", heads_option)
    model = support.build_model(opt, support.load_vocabs(opt), seed=3)
    src, src_len, tgt = support.random_batch(support.load_vocabs(opt), [6, 4], [5, 5], seed=1)
    with torch.no_grad():
        before = _first_layer_heads(model, src, src_len, tgt)
        for side in (model.encoder, model.decoder):
            side.embeddings.proj.weight.normal_()  # a different R, the same P
        after = _first_layer_heads(model, src, src_len, tgt)
    for side in ("enc", "dec"):
        p_heads_same = torch.allclose(before[side][..., :16], after[side][..., :16], atol=1e-6)
        assert p_heads_same == isolated
        assert not torch.allclose(before[side][..., 16:], after[side][..., 16:])  # the R heads do see R
    if isolated:
        assert isinstance(model.encoder.transformer[0].self_attn.linear_query, BlockDiagonalLinear)
        assert isinstance(model.encoder.transformer[0].layer_norm, HeadwiseNorm)
        assert isinstance(model.decoder.transformer_layers[0].layer_norm_1, HeadwiseNorm)
        assert isinstance(model.encoder.transformer[1].self_attn.linear_query, torch.nn.Linear)


def test_pe_off_on_both_sides_is_the_stock_model_without_the_encoding_but_with_its_scale(sample_data, onmt_active):
    """Table 3's -PE rows remove pe_j of eq. 2 only: the embeddings keep Vaswani et al.'s sqrt(d) (issue 37: stock
    sides lost it with the encoding while RPE sides kept it), i.e. stock OpenNMT-py with an all-zero encoding."""
    opt = support.load_train_opts(SMOKE, *EXT, "-chen2019_pe_off", "enc", "dec")
    vocabs = support.load_vocabs(opt)
    model = support.build_model(opt, vocabs, seed=5)
    stock = support.build_model(support.load_train_opts(SMOKE), vocabs, seed=5)
    encodings = [side.embeddings.make_embedding.pe for side in (stock.encoder, stock.decoder)]
    for encoding in encodings:
        encoding.pe.zero_()
    buffers = {name for name, _ in stock.named_buffers() if name.endswith("make_embedding.pe.pe")}
    assert len(buffers) == 2 and model.state_dict().keys() == stock.state_dict().keys() - buffers
    src, src_len, tgt = support.random_batch(vocabs, [6, 3], [4, 6], seed=2)
    with torch.no_grad():
        for mine, theirs in zip(support.full_forward(model, src, src_len, tgt),
                                support.full_forward(stock, src, src_len, tgt)):
            assert torch.equal(mine, theirs)
        # the scale is there: without it (stock -position_encoding false) the output differs
        plain = support.load_train_opts(SMOKE)
        plain.position_encoding = False  # (a flag: the YAML's true cannot be switched off from the command line)
        unscaled = support.build_model(plain, vocabs, seed=5)
        assert not torch.allclose(support.full_forward(unscaled, src, src_len, tgt)[0],
                                  support.full_forward(model, src, src_len, tgt)[0])


def test_relative_pe_row_is_the_stock_relative_model_with_the_embedding_scale(sample_data, onmt_active):
    """Tables 1-2's +Relative PE row: stock OpenNMT-py drops Vaswani et al.'s sqrt(d) with -position_encoding false
    (it lives in PositionalEncoding), so the row fed the first layer embeddings ~sqrt(d) smaller than every other
    row's; with -chen2019_scale_without_pe the model is the stock relative-position model, its embeddings scaled."""
    opt = support.load_train_opts("yaml_configs/smoke/chen2019/transformer_base_wmt14_ende_relative_pe.yaml")
    assert opt.chen2019_scale_without_pe == ["enc", "dec"] and not opt.position_encoding
    vocabs = support.load_vocabs(opt)
    model = support.build_model(opt, vocabs, seed=5)
    stock = support.build_model(support.load_train_opts("yaml_configs/smoke/baseline/transformer_base_rpr_wmt14_ende"
                                                        ".yaml"), vocabs, seed=5)
    assert stock.encoder.embeddings.position_encoding is False
    assert model.state_dict().keys() == stock.state_dict().keys()
    src, src_len, tgt = support.random_batch(vocabs, [6, 3], [4, 6], seed=2)
    with torch.no_grad():
        unscaled = support.full_forward(stock, src, src_len, tgt)
        for side in (stock.encoder, stock.decoder):
            side.embeddings.forward = (lambda plain: lambda source, step=None: plain(source, step=step) *
                                       opt.word_vec_size ** 0.5)(side.embeddings.forward)
        for mine, theirs, plain in zip(support.full_forward(model, src, src_len, tgt),
                                       support.full_forward(stock, src, src_len, tgt), unscaled):
            torch.testing.assert_close(mine, theirs, atol=1e-6, rtol=1e-6)
            assert not torch.allclose(mine, plain)


def test_only_the_listed_side_loses_its_position_encoding(sample_data, onmt_active):
    from onmt.modules.embeddings import PositionalEncoding

    from onmt_ext.mechanisms.chen2019 import EmbeddingScale

    opt = support.load_train_opts(SMOKE, *EXT, "-chen2019_pe_off", "dec")
    model = support.build_model(opt, support.load_vocabs(opt))
    assert isinstance(model.encoder.embeddings.make_embedding.pe, PositionalEncoding)
    assert type(model.decoder.embeddings.make_embedding.pe) is EmbeddingScale
    assert model.decoder.embeddings.make_embedding.pe.dim == opt.word_vec_size


def _rnn_parameters(d_r, bidirectional):
    units = d_r // 2 if bidirectional else d_r
    per_direction = units * d_r + units * units + 2 * units  # W_ih, W_hh, two biases (Elman cell)
    return per_direction * (2 if bidirectional else 1) + d_r * d_r + d_r  # + W^r, b^r of eq. 6


def test_parameter_delta_is_the_rnns_and_w_r(sample_data, onmt_active):
    """What tools/param_report.py reports for the paper configs: MPRHead at d_r 256 adds 0.362M (Table 1: 0.37M)."""
    from tools import param_report

    for name, dim in (("mprhead", 256), ("rpehead", 320)):
        [(_, _, _, delta)] = param_report.report(
            [support.REPO / f"yaml_configs/chen2019/transformer_base_wmt14_ende_{name}.yaml"], 1000)
        assert delta == _rnn_parameters(dim, True) + _rnn_parameters(dim, False)
    assert _rnn_parameters(256, True) + _rnn_parameters(256, False) == 361984


def _opt(**kw):
    base = dict(encoder_type="ext_transformer", decoder_type="ext_transformer", enc_layers=2, dec_layers=2, layers=-1,
                hidden_size=32, enc_hid_size=32, heads=4, position_encoding=True, chen2019_enc="none",
                chen2019_dec="none", chen2019_dim=0, chen2019_rnn="rnn", chen2019_heads="full", chen2019_pe_off=[],
                chen2019_scale_without_pe=[],
                parallel_residual=False, parallel_mode="data_parallel", world_size=1, n_src_feats=0)
    base.update(kw)
    return argparse.Namespace(**base)


@pytest.mark.parametrize("kw, message", [
    (dict(chen2019_enc="rpehead"), "-chen2019_enc rpehead needs the RPE size: set -chen2019_dim"),
    (dict(chen2019_enc="rpehead", chen2019_dim=12), "RPEHead needs d_r = t * d_model / heads"),
    (dict(chen2019_dec="mprhead", chen2019_dim=10), "MPRHead splits P and R over the 4 heads"),
    (dict(chen2019_enc="mprhead", chen2019_dim=32), "d_r must be between 1 and d_model - 1"),
    (dict(chen2019_dim=16), "-chen2019_dim has no effect while -chen2019_enc and -chen2019_dec are both none"),
    (dict(chen2019_rnn="gru"), "-chen2019_rnn has no effect"),
    (dict(chen2019_scale="parts"), "-chen2019_scale has no effect"),
    (dict(chen2019_init="pytorch"), "-chen2019_init has no effect"),
    (dict(chen2019_recurrence="projected"), "-chen2019_recurrence has no effect"),
    (dict(chen2019_enc="rpehead", chen2019_dim=16, chen2019_rnn="sru", chen2019_recurrence="projected"),
     "-chen2019_recurrence projected with -chen2019_rnn sru: the projected recurrence (eq. 6 as written) needs"),
    (dict(chen2019_pe_off=["dec"], position_encoding=False), "has no effect with -position_encoding false"),
    (dict(chen2019_pe_off=["enc"], encoder_type="transformer"), "-chen2019_pe_off enc needs -encoder_type"),
    (dict(chen2019_scale_without_pe=["dec"]), "has no effect with -position_encoding true"),
    (dict(chen2019_scale_without_pe=["enc"], position_encoding=False, encoder_type="transformer"),
     "-chen2019_scale_without_pe enc needs -encoder_type"),
    (dict(chen2019_scale_without_pe=["enc"], position_encoding=False, chen2019_enc="rpehead", chen2019_dim=16),
     "-chen2019_scale_without_pe enc has no effect with -chen2019_enc rpehead"),
    (dict(chen2019_enc="rpehead", chen2019_dim=16, n_src_feats=1), "does not support source word features"),
    (dict(chen2019_enc="rpehead", chen2019_dim=16, chen2019_heads="restricted", parallel_residual=True),
     "-parallel_residual"),
    (dict(decoder_type="transformer", chen2019_dec="rpehead", chen2019_dim=16),
     "-chen2019_dec 'rpehead' has no effect with -decoder_type 'transformer'"),
    (dict(heads=0), "-heads 0: must be >= 1"),  # checked for every ext_transformer model
    (dict(heads=3), "-heads 3: must divide -hidden_size 32"),
    (dict(heads=0, chen2019_enc="rpehead", chen2019_dim=16), "needs -heads >= 1 dividing d_model 32, got 0"),
    (dict(heads=0, chen2019_dec="mprhead", chen2019_dim=16, encoder_type="transformer"), "needs -heads >= 1"),
])
def test_option_checks(kw, message, onmt_active):
    problems = options.check_options(_opt(**kw))
    assert any(message in p for p in problems), problems


def _eq6_reference(module, proj, rnn, x_r):
    """Eq. 6 written out with torch's own cells and ``rnn``'s weights: ``r_j = tanh(W^r f(x^r_j, r_{j-1}) + b^r)``."""
    cell_class = {"rnn": torch.nn.RNNCell, "gru": torch.nn.GRUCell, "lstm": torch.nn.LSTMCell}[module.cell]
    units = proj.out_features
    cell = cell_class(x_r.size(-1), units)
    with torch.no_grad():
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(cell, name).copy_(getattr(rnn, f"{name}_l0"))
    r, c, out = torch.zeros(x_r.size(0), units), torch.zeros(x_r.size(0), units), []
    for j in range(x_r.size(1)):
        if module.cell == "lstm":
            h, c = cell(x_r[:, j], (r, c))
        else:
            h = cell(x_r[:, j], r)
        r = torch.tanh(proj(h))
        out.append(r)
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
def test_projected_recurrence_is_eq6_as_written_on_both_sides(cell, onmt_active):
    """``-chen2019_recurrence projected``: r_{j-1}, not the RNN's own state, recurs (torch's cells as reference);
    on the source each direction projects its own half, reading each sentence without its padding."""
    target = RecurrentPositionalEmbeddings(_embeddings(), 4, 8, "rpehead", cell, recurrence="projected").eval()
    source = RecurrentPositionalEmbeddings(_embeddings(), 4, 8, "rpehead", cell, bidirectional=True,
                                           recurrence="projected").eval()
    assert target.proj.weight.shape == (8, 8) and target.proj_backward is None
    assert source.proj.weight.shape == source.proj_backward.weight.shape == (4, 4)
    with torch.no_grad():
        for module in (target, source):
            for proj in (module.proj, module.proj_backward):
                if proj is not None:
                    proj.bias.normal_()  # b^r is zero at first: a nonzero one tests where it enters
        tgt = torch.randint(4, 30, (2, 6, 1))
        x_r = target.make_embedding(tgt)[..., 8:] * 16 ** 0.5
        torch.testing.assert_close(target(tgt)[..., 8:], _eq6_reference(target, target.proj, target.rnn, x_r),
                                   atol=1e-6, rtol=0)
        hidden = RecurrentPositionalEmbeddings(_embeddings(), 4, 8, "rpehead", cell).eval()
        hidden.load_state_dict(target.state_dict())  # the same parameters, the RNN recurring on its own state
        assert not torch.allclose(hidden(tgt), target(tgt))
        lengths = [6, 3]
        src = torch.full((2, 6, 1), 1, dtype=torch.long)
        for b, n in enumerate(lengths):
            src[b, :n, 0] = torch.randint(4, 30, (n,))
        out = source(src)
        for b, n in enumerate(lengths):
            x_r = source.make_embedding(src[b : b + 1, :n])[..., 8:] * 16 ** 0.5
            forward = _eq6_reference(source, source.proj, source.rnn, x_r)
            backward = _eq6_reference(source, source.proj_backward, source.rnn_backward, x_r.flip(1)).flip(1)
            torch.testing.assert_close(out[b : b + 1, :n, 8:], torch.cat([forward, backward], dim=-1),
                                       atol=1e-6, rtol=0)
            torch.testing.assert_close(out[b : b + 1, :n], source(src[b : b + 1, :n]), atol=1e-6, rtol=0)
