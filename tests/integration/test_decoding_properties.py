"""The decoding-property suite, run for every config in yaml_configs/smoke/.

A mechanism joins the suite by adding its smoke configs; nothing here needs to
change.  With dropout 0 (the models are in eval mode):

1. step-by-step decoding with the cache equals the teacher-forced pass;
2. a sentence alone gives the same encoder/decoder outputs as in a padded batch;
3. changing target tokens after position j changes no output at positions <= j;
4. ``map_state`` with a permutation (or beam tiling) mid-decoding equals
   decoding the permuted (tiled) batch from scratch, with both of the
   reordering functions OpenNMT-py uses;
5. ``onmt_translate`` (beam 4, no length penalty): PRED score == GOLD score
   of its own output (scored by the run of check 6 with ``-tgt``);
6. ``onmt_translate`` gives identical output for -batch_size 1 and 16.

1-4 run in-process on randomly initialised models, once per distinct model:
configs whose options differ only in output paths (e.g. the Base and Big smoke
twins of one paper row, identical at toy size) share one run, and the test id
names all of them.  5-6 run the real console scripts on a checkpoint trained
for 100 steps (300 with a decoder-side mechanism), once per representative
config: a config is covered by one with the same stock options that switches
on everything it switches on (see ``_code_paths``).
"""

import hashlib
import re
import sys

import pytest
import torch

import support

CONFIGS = support.smoke_configs()
ATOL = 1e-5


def _ids(paths):
    return [str(p.relative_to("yaml_configs/smoke")) for p in paths]


PATHS = {"save_data", "save_model", "config", "log_file"}


def _model_signature(config, ignore):
    """Configs with identical options (``ignore`` aside) share a signature."""
    opt = support.load_train_opts(config)
    text = repr(sorted((k, repr(v)) for k, v in vars(opt).items() if k not in ignore))
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def _layer_options():
    """Every option that only chooses layers or their number (``enc_layers``, ``li2019_enc_layers``...)."""
    from onmt_ext.options import OPTION_SPECS

    return {"enc_layers", "dec_layers", "layers"} | {spec.name for spec in OPTION_SPECS if spec.name.endswith("_layers")}


def _groups(configs, ignore):
    """Configs grouped by the signature of their options (``ignore`` aside), in order of first appearance."""
    groups = {}
    for config in configs:
        groups.setdefault(_model_signature(config, ignore), []).append(config)
    return list(groups.values())


def _distinct(ignore):
    """One representative config per signature, with an id naming every config it covers."""
    import onmt  # noqa: F401  (activates onmt-ext for the option parser)

    groups = _groups(CONFIGS, ignore)
    return [paths[0] for paths in groups], ["+".join(_ids(paths)) for paths in groups]


def _mechanism_features(config):
    """What a config switches on: ``(option, value)`` for every onmt-ext option away from its default.

    List options give one pair per element; options that are sizes or counts
    (not a choice, not a switch) give ``(option,)``, since every value runs
    the same code; layer selections are left out (see ``_layer_options``).
    """
    from onmt_ext.options import OPTION_SPECS

    opt = support.load_train_opts(config)
    defaults = support.train_parser()
    features = {(name, str(getattr(opt, name))) for name in _TRANSFORM_FEATURES
                if getattr(opt, name, None) != defaults.get_default(name)}
    for spec in OPTION_SPECS:
        value = getattr(opt, spec.name, spec.default)
        if value == spec.default or spec.name in _layer_options():
            continue
        if spec.nargs:
            features.update((spec.name, item) for item in value)
        elif spec.choices or spec.type is bool:
            features.add((spec.name, value))
        else:
            features.add((spec.name,))
    return frozenset(features)


# Options of onmt-ext's data transforms that choose a code path (the clause splitter's tagger, language,
# levels): compared like mechanism options, so that one console-script run covers a config whose splitter
# settings are a subset of the representative's.
_TRANSFORM_FEATURES = ("clause_lang", "clause_levels", "clause_tagger_model", "clause_presplit")


def _code_paths():
    """Representatives for the console-script checks, each with an id naming the configs it covers.

    Configs with the same stock options (paths and layer counts aside) are
    covered by a representative that switches on everything they switch on
    (a superset of their ``_mechanism_features``): that run takes every one
    of their mechanism settings through ``onmt_train`` and ``onmt_translate``.
    The representatives are chosen greedily, largest feature set first.
    """
    from onmt_ext.options import OPTION_SPECS

    stock_ignore = PATHS | _layer_options() | {spec.name for spec in OPTION_SPECS} | set(_TRANSFORM_FEATURES)
    reps, ids = [], []
    for group in _groups(CONFIGS, stock_ignore):
        features = {config: _mechanism_features(config) for config in group}
        ordered = sorted(group, key=lambda c: (-len(features[c]), str(c)))
        chosen = {}
        for config in ordered:
            cover = next((rep for rep in chosen if features[config] <= features[rep]), None)
            chosen.setdefault(cover or config, []).append(config)
        for rep, covered in chosen.items():
            reps.append(rep)
            ids.append("+".join(_ids(covered)))
    return reps, ids


DISTINCT, DISTINCT_IDS = _distinct(PATHS)
CODE_PATHS, CODE_PATH_IDS = _code_paths()


@pytest.fixture(scope="module", params=DISTINCT, ids=DISTINCT_IDS)
def model_and_vocabs(request, sample_data, onmt_active):
    opt = support.load_train_opts(request.param, "-dropout", "0", "-attention_dropout", "0")
    vocabs = support.load_vocabs(opt)
    model = support.build_model(opt, vocabs, seed=7)
    return model, vocabs


@torch.no_grad()
def test_stepwise_equals_full_pass(model_and_vocabs):
    model, vocabs = model_and_vocabs
    src, src_len, tgt = support.random_batch(vocabs, [7, 4, 9], [6, 6, 6], seed=1)
    _, full = support.full_forward(model, src, src_len, tgt)
    enc_out, src_len = support.start_decoding(model, src, src_len)
    stepwise = support.decode_steps(model, tgt, enc_out, src_len, 0, tgt.size(1))
    torch.testing.assert_close(stepwise, full, atol=ATOL, rtol=0)
    # and the generator's log-probabilities, which is what search consumes
    torch.testing.assert_close(model.generator(stepwise), model.generator(full), atol=ATOL, rtol=0)


@torch.no_grad()
def test_padding_and_batch_independence(model_and_vocabs):
    model, vocabs = model_and_vocabs
    src_lens, tgt_lens = [5, 11, 3], [4, 9, 7]
    src, src_len, tgt = support.random_batch(vocabs, src_lens, tgt_lens, seed=2, pad_to=(11, 12))
    enc_b, dec_b = support.full_forward(model, src, src_len, tgt)
    for i, (s, t) in enumerate(zip(src_lens, tgt_lens)):
        enc_1, dec_1 = support.full_forward(model, src[i : i + 1, :s], src_len[i : i + 1], tgt[i : i + 1, :t])
        torch.testing.assert_close(enc_b[i : i + 1, :s], enc_1, atol=ATOL, rtol=0)
        torch.testing.assert_close(dec_b[i : i + 1, :t], dec_1, atol=ATOL, rtol=0)


@torch.no_grad()
def test_no_dependence_on_future_targets(model_and_vocabs):
    model, vocabs = model_and_vocabs
    src, src_len, tgt = support.random_batch(vocabs, [6, 8], [9, 9], seed=3)
    _, base = support.full_forward(model, src, src_len, tgt)
    for j in (0, 3, 7):
        changed = tgt.clone()
        changed[:, j + 1 :, 0] = torch.randint(10, len(vocabs["tgt"]), changed[:, j + 1 :, 0].shape)
        _, out = support.full_forward(model, src, src_len, changed)
        torch.testing.assert_close(out[:, : j + 1], base[:, : j + 1], atol=ATOL, rtol=0)
        assert not torch.allclose(out[:, j + 1 :], base[:, j + 1 :]), "future tokens had no effect at all"


REORDERINGS = {
    # what OpenNMT-py's search passes to map_state
    "index_select": lambda index: (lambda state, dim: state.index_select(dim, index)),
    "beam_lambda": lambda index: (lambda state, dim: state[index]),
}


@pytest.mark.parametrize("reorder", sorted(REORDERINGS))
@torch.no_grad()
def test_map_state_permutation_mid_decoding(model_and_vocabs, reorder):
    model, vocabs = model_and_vocabs
    src, src_len, tgt = support.random_batch(vocabs, [5, 9, 3, 7], [8, 8, 8, 8], seed=4)
    perm = torch.tensor([2, 0, 3, 1])
    k, steps = 3, tgt.size(1)

    enc_out, lens = support.start_decoding(model, src, src_len)
    support.decode_steps(model, tgt, enc_out, lens, 0, k)
    model.decoder.map_state(REORDERINGS[reorder](perm))
    after = support.decode_steps(model, tgt[perm], enc_out[perm], lens[perm], k, steps)

    enc_p, lens_p = support.start_decoding(model, src[perm], src_len[perm])
    scratch = support.decode_steps(model, tgt[perm], enc_p, lens_p, 0, steps)[:, k:]
    torch.testing.assert_close(after, scratch, atol=ATOL, rtol=0)


@torch.no_grad()
def test_map_state_beam_tiling(model_and_vocabs):
    from onmt.utils.misc import tile

    model, vocabs = model_and_vocabs
    src, src_len, tgt = support.random_batch(vocabs, [6, 4], [7, 7], seed=5)
    beam = 3
    enc_out, lens = support.start_decoding(model, src, src_len)
    # as the translator does: init_state on the batch, then tile every state
    model.decoder.map_state(lambda state, dim: tile(state, beam, dim=dim))
    enc_t, lens_t, tgt_t = tile(enc_out, beam, 0), tile(lens, beam, 0), tile(tgt, beam, 0)
    tiled = support.decode_steps(model, tgt_t, enc_t, lens_t, 0, tgt.size(1))

    src_t, src_len_t = tile(src, beam, 0), tile(src_len, beam, 0)
    enc_s, lens_s = support.start_decoding(model, src_t, src_len_t)
    scratch = support.decode_steps(model, tgt_t, enc_s, lens_s, 0, tgt.size(1))
    torch.testing.assert_close(tiled, scratch, atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------
# 5-6: through the console scripts


# Steps of training before the console-script checks: the models must end most
# translations with EOS.  At toy size 100 steps do for the baselines and for
# encoder-side mechanisms; with routing in the decoder most outputs still loop
# at 200 steps, so configs with a decoder-side onmt-ext option get 300.
TRAIN_STEPS, DECODER_MECHANISM_TRAIN_STEPS = 100, 300
SENTENCES = 40


def _train_steps(config):
    from onmt_ext.options import OPTION_SPECS

    opt = support.load_train_opts(config)
    decoder_side = any(spec.side == "decoder" and getattr(opt, spec.name, spec.default) != spec.default
                       for spec in OPTION_SPECS)
    return DECODER_MECHANISM_TRAIN_STEPS if decoder_side else TRAIN_STEPS


@pytest.fixture(scope="module", params=CODE_PATHS, ids=CODE_PATH_IDS)
def trained_model(request, sample_data, onmt_active, tmp_path_factory):
    """A checkpoint of the config trained through onmt_train (see TRAIN_STEPS)."""
    out = tmp_path_factory.mktemp("model")
    steps = _train_steps(request.param)
    support.run_cli(
        "onmt_train", "-config", request.param, "-save_model", out / "model", "-save_data", out / "samples",
        "-train_steps", steps, "-save_checkpoint_steps", steps, "-valid_steps", 10 * steps,
        "-log_file_level", "WARNING",
    )
    model = out / f"model_step_{steps}.pt"
    _SPLIT_ARGS[model] = _split_args(request.param)
    return model


# onmt_translate needs the source split as in training: checkpoint -> the transform options to pass.
_SPLIT_ARGS = {}


def _split_args(config):
    """``-transforms clause_split -clause_*`` for a clause-attention config (the test source is SentencePiece'd)."""
    from onmt_ext.clause_split import translate_options

    return translate_options(vars(support.load_train_opts(config)))


@pytest.fixture(scope="module")
def encoded_test_source(sample_data, tmp_path_factory):
    """The first SENTENCES test sentences, SentencePiece-encoded (so outputs are pieces too)."""
    sys.path.insert(0, str(support.REPO / "tools"))
    from prepare_tatoeba import encode_file

    return encode_file(sample_data / "spm.zh.model", sample_data / "test.zh",
                       tmp_path_factory.mktemp("src") / "test.sp.zh", limit=SENTENCES)


_SENT = re.compile(r"SENT (\d+): .*?PRED SCORE: (-?[\d.]+).*?(?=SENT \d+:|\Z)", re.S)
_GOLD = re.compile(r"GOLD SCORE: (-?[\d.]+)")
MAX_LENGTH = 40


def _translate(model, src, out, *args):
    # -max_length_ratio 0: OpenNMT-py's default ratio caps the output length
    # at ratio * (longest source in the *batch*) + 5, which makes translations
    # depend on the batch composition and can cut a hypothesis before its EOS
    # (its PRED score then lacks the EOS term that GOLD has).  Only the fixed
    # -max_length cap is kept, and capped hypotheses are skipped below.
    # -min_length 1: without a length penalty beam search may prefer the empty
    # output, and OpenNMT-py cannot score an empty -tgt line as GOLD.
    return support.run_cli(
        "onmt_translate", "-model", model, "-src", src, "-output", out, "-max_length", MAX_LENGTH,
        "-max_length_ratio", 0, "-min_length", 1, *_SPLIT_ARGS.get(model, []), *args
    )


@pytest.fixture(scope="module")
def beam_translations(trained_model, encoded_test_source, tmp_path_factory):
    """Beam-4 translations of the test source with -batch_size 16 and -batch_size 1, and their verbose logs.

    The second run also scores the first run's output as ``-tgt`` (GOLD
    scores: a teacher-forced pass over each hypothesis), so that one process
    serves both console-script checks.
    """
    out = tmp_path_factory.mktemp("translations")
    runs = {}
    for batch_size in (16, 1):
        hyp = out / f"hyp.{batch_size}.txt"
        gold = ["-tgt", runs[16][0]] if batch_size == 1 else []
        result = _translate(trained_model, encoded_test_source, hyp, "-beam_size", 4, "-batch_size", batch_size,
                            "-length_penalty", "none", "-verbose", *gold)
        runs[batch_size] = (hyp, result.stdout + result.stderr)
    return runs


def test_pred_score_equals_gold_score(beam_translations):
    """The score beam search reports for its output is the model's own score of that output."""
    hyp, log = beam_translations[16]
    gold_log = beam_translations[1][1]  # GOLD SCORE of the -batch_size 16 output, sentence by sentence
    hyps = hyp.read_text(encoding="utf-8").splitlines()
    golds = {int(m.group(1)): m.group(0) for m in _SENT.finditer(gold_log)}
    compared = 0
    for match in _SENT.finditer(log):
        index, pred = int(match.group(1)), float(match.group(2))
        gold = _GOLD.search(golds.get(index, ""))
        assert gold, f"no GOLD SCORE for sentence {index}"
        if len(hyps[index - 1].split()) >= MAX_LENGTH:  # cut at max_length: no EOS in PRED
            continue
        assert abs(pred - float(gold.group(1))) < 1e-3, f"sentence {index}: PRED {pred} != GOLD {gold.group(1)}"
        compared += 1
    assert compared >= 10, f"only {compared} sentences compared"


def test_translation_independent_of_batch_size(beam_translations):
    outputs = [beam_translations[b][0].read_text(encoding="utf-8") for b in (16, 1)]
    assert outputs[0] == outputs[1]
    assert len(outputs[0].splitlines()) == SENTENCES
