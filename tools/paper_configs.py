#!/usr/bin/env python
"""Writes (or checks) the paper configs under yaml_configs/<paper>/ and their smoke twins.

Usage::

    python -m tools.paper_configs            # (re)write every generated config
    python -m tools.paper_configs --check    # exit 1 if a committed config differs

Every paper row is the matching baseline config of ``yaml_configs/baseline/``
(same data, size, schedule and hardware settings) with the onmt-ext model types
and the row's mechanism options added; its smoke twin is the baseline's smoke
twin with the same additions.  Keeping the rows here, in one table per paper,
means a fix to a baseline reaches every paper config, and the test suite
checks that the committed files are what this script writes.
"""

import difflib
import re
import sys
from dataclasses import dataclass, field

import yaml

from tools import common

REPO = common.REPO
CONFIGS = REPO / "yaml_configs"
SIZES = ("base", "big")


@dataclass(frozen=True)
class Row:
    """One table row of a paper: a config name suffix, what it is, and its mechanism options (none: the paper's
    own baseline run).  ``smoke_options`` apply to the smoke twin only, ``paper_options`` (run settings, ``{size}``
    and ``{task}`` filled in) to the paper config only; ``tasks`` and ``sizes`` restrict the row."""

    name: str
    description: str
    options: dict
    smoke_options: dict = field(default_factory=dict)
    tasks: tuple = None
    base: str = ""  # a variant of the baseline config, e.g. "rpr": transformer_<size>_rpr_<task>.yaml
    sizes: tuple = None
    paper_options: dict = field(default_factory=dict)
    source_suffix: str = ""  # paper configs only: read every path_src + this suffix (a pre-split corpus)


@dataclass(frozen=True)
class Paper:
    key: str
    title: str
    tasks: tuple
    rows: tuple
    run_options: dict = field(default_factory=dict)  # paper configs only (run settings, not the model)
    sizes: tuple = SIZES
    batch_note: str = ""  # replaces the baseline's comment on the batch when run_options set it
    task_options: dict = field(default_factory=dict)  # task -> run settings of that task's paper configs
    vocab_size: int = None  # src/tgt_vocab_size of the paper configs (0: no cap); None keeps the baseline's
    vocab_note: str = ""  # what the paper says about its vocabularies, the comment above the cap
    task_subsets: dict = field(default_factory=dict)  # task -> a LengthSubset name of prepare_data: train on it
    model_options: dict = field(default_factory=dict)  # the paper's Transformer itself, in every row (baseline too)
    model_note: str = ""  # why, the comment above model_options

    def run_settings(self, task):
        """``run_options`` with the task's own settings on top."""
        return {**self.run_options, **self.task_options.get(task, {})}


def _li2019_rows():
    enc6 = {"enc_layers": 6}  # the smoke twin keeps six encoder layers so the layer indices exist
    em_layers = lambda layers, label: Row(  # noqa: E731
        f"em_enc_self_layers_{label}",
        f"Table 3: EM routing in encoder self-attention of layers [{label}] only"
        + (" (Table 4: 'Effective Aggregation')" if label == "1-2" else ""),
        {"li2019_enc_self": "em", "li2019_enc_layers": layers},
        enc6,
    )
    return (
        Row("baseline", "Tables 2-4: the Transformer baseline (concat + linear), post-norm as every other row", {}),
        Row("simple_enc_self", "Table 2 row 3: simple routing in encoder self-attention, all layers",
            {"li2019_enc_self": "simple"}),
        Row("em_enc_self", "Table 2 row 4 = Table 3 row 2: EM routing in encoder self-attention, all layers",
            {"li2019_enc_self": "em"}),
        Row("em_enc_dec", "Table 2 row 5: EM routing in encoder-decoder attention, all layers "
            "(the component is inferred: see docs/li2019.md)",
            {"li2019_enc_dec": "em"}),
        Row("em_dec_self", "Table 2 row 6: EM routing in decoder self-attention, all layers "
            "(the component is inferred: see docs/li2019.md)",
            {"li2019_dec_self": "em"}),
        Row("em_enc_self_dec_self", "Table 2 row 7: EM routing in encoder and decoder self-attention "
            "(the two components are inferred: see docs/li2019.md)",
            {"li2019_enc_self": "em", "li2019_dec_self": "em"}),
        Row("em_all", "Table 2 row 8: EM routing in all three attention components",
            {"li2019_enc_self": "em", "li2019_enc_dec": "em", "li2019_dec_self": "em"}),
        em_layers([4, 5, 6], "4-6"),
        em_layers([1, 2, 3], "1-3"),
        em_layers([1, 2], "1-2"),
        em_layers([6], "6"),
        em_layers([1], "1"),
    )


def _cao2019_rows():
    zhen = ("wmt17_zhen",)
    return (
        Row("baseline", "Table 1 row 1 and Table 2: the Transformer-Base baseline at the paper's batch", {}),
        Row("horizontal_zero", "Table 1 row 2: positional horizontal routing, zero initialisation",
            {"cao2019_horizontal": True}, tasks=zhen),
        Row("horizontal_self", "Table 1 row 3: positional horizontal routing, self-initialisation (eq. 15)",
            {"cao2019_horizontal": True, "cao2019_init": "self"}, tasks=zhen),
        Row("cross_zero", "Table 1 row 4 and Table 2 'Cross Aggregation': vertical + horizontal routing, "
            "zero initialisation", {"cao2019_vertical": True, "cao2019_horizontal": True}),
        Row("cross_self", "Table 1 row 5: vertical + horizontal routing, self-initialisation",
            {"cao2019_vertical": True, "cao2019_horizontal": True, "cao2019_init": "self"}, tasks=zhen),
    )


# chen2019's d_r per size and layout: sec. 5.3 at Base; Base's d_r / d at Big (not given by the paper)
CHEN2019_DR = {"base": {"rpehead": 320, "mprhead": 256}, "big": {"rpehead": 640, "mprhead": 512}}


def _chen2019_rows():
    def rpe(layout, dim, enc=True, dec=True, **extra):
        options = {}
        if enc:
            options["chen2019_enc"] = layout
        if dec:
            options["chen2019_dec"] = layout
        options["chen2019_dim"] = dim
        options.update(extra)
        return options

    toy = {"chen2019_dim": 16}  # d_model 32, 4 heads: two whole heads for RPEHead, half of each head for MPRHead
    rows = [
        Row("baseline", "Tables 1-3: the Transformer baseline", {}),
        Row("relative_pe", "Tables 1-2: +Relative PE (Shaw et al. 2018) through OpenNMT-py's max_relative_positions, "
            "the embeddings scaled by sqrt(d) as in every other row", {"chen2019_scale_without_pe": ["enc", "dec"]},
            base="rpr"),
        Row("disan", "Table 1: +DiSAN, directional self-attention in the encoder (onmt_ext/mechanisms/disan.py says "
            "what is implemented)", {"disan_enc": True}),
        Row("no_pe_dec", "Table 3: Transformer - PE of Dec", {"chen2019_pe_off": ["dec"]}),
        Row("no_pe_enc", "Table 3: Transformer - PE of Enc", {"chen2019_pe_off": ["enc"]}),
        Row("no_pe_enc_dec", "Table 3: MPRHead - RPE&PE of Enc&Dec (neither side keeps PE or RPE, so this is the "
            "Transformer without position encoding)", {"chen2019_pe_off": ["enc", "dec"]}),
    ]
    # sec. 5.3 picks d_r at Base (d 512) only: RPEHead 320, MPRHead 256.  Big (d 1024) keeps Base's ratios d_r / d
    # (5/8: ten of 16 heads; 1/2: half of each head), which also fits Table 2's +1.8M better (docs/chen2019.md).
    for size, dims in (("base", CHEN2019_DR["base"]), ("big", CHEN2019_DR["big"])):
        sizes = (size,)
        why = "sec. 5.3" if size == "base" else "sec. 5.3's Base ratio d_r / d"
        for layout, label in (("rpehead", "RPEHead"), ("mprhead", "MPRHead")):
            dim = dims[layout]
            rows += [
                Row(layout, f"Tables 1-3: +{label}, d_r = {dim} ({why}), full Q/K/V projections",
                    rpe(layout, dim), toy, sizes=sizes),
                Row(f"{layout}_restricted", f"not a paper row: {label} (d_r = {dim}) with head-restricted first-layer "
                    "projections (sec. 4.1 read literally; see onmt_ext/mechanisms/chen2019.py)",
                    rpe(layout, dim, chen2019_heads="restricted"), toy, sizes=sizes),
                Row(f"{layout}_no_dec", f"Table 3: {label} - RPE&PE of Dec",
                    rpe(layout, dim, dec=False, chen2019_pe_off=["dec"]), toy, sizes=sizes),
                Row(f"{layout}_no_enc", f"Table 3: {label} - RPE&PE of Enc",
                    rpe(layout, dim, enc=False, chen2019_pe_off=["enc"]), toy, sizes=sizes),
            ]
    return tuple(rows)


def _gret_rows():
    ende = ("wmt14_ende",)
    # sec. "implementation detail": GRET starts from the trained baseline's parameters.  How long it is then trained,
    # and at which learning rate, is not legible in our copy; 50k steps (a quarter of the baseline's 200k) is our
    # choice.  -reset_optim all gives a fresh Adam state (the checkpoint's has no moments for the new parameters) and
    # restarts the step count, so Noam would warm up again to ~1e-3; instead the rate is held at the baseline's
    # final Noam rate (docs/gret.md).  The checkpoint's tensors are loaded and the new ones initialised
    # (onmt_ext.mechanisms.gret.load_with_new_parameters logs both lists).
    finetune = {"train_from": "build/runs/gret/transformer_{size}_{task}_baseline/model_step_200000.pt",
                "override_opts": True, "reset_optim": "all", "train_steps": 50000,
                "decay_method": "none", "learning_rate": final_noam_rate,
                "learning_rate_decay": 1.0}  # OpenNMT-py's "none" halves the rate every 10k steps after 50k otherwise

    def gret(name, description, extra=None, **kw):
        return Row(name, description, {"gret": True, **(extra or {})}, paper_options=finetune, **kw)

    return (
        Row("baseline", "main results and ablations: the Transformer baseline (GRET's starting point)", {}),
        gret("gret", "main results: GRET (capsules, layer-wise GRU, context gate), fine-tuned from the baseline"),
        gret("gret_no_capsules", "ablation: no capsule network (mean pooling of each layer's states)",
             {"gret_pooling": "mean"}, tasks=ende, sizes=("base",)),
        gret("gret_no_layers", "ablation: no layer aggregation (the last encoder layer only)",
             {"gret_layers": "last"}, tasks=ende, sizes=("base",)),
        gret("gret_no_gate", "ablation: no context gate (the global state is added)",
             {"gret_gate": False}, tasks=ende, sizes=("base",)),
    )


def final_noam_rate(baseline):
    """The learning rate of the last update of a Noam run (Vaswani et al. eq. 3), from its config's values.

    ``learning_rate * d^-0.5 * min(step^-0.5, step * warmup^-1.5)`` at step ``train_steps``; written with nine
    significant digits.
    """
    if baseline.get("decay_method") != "noam":
        raise SystemExit(f"the baseline of a GRET row must use -decay_method noam, not {baseline.get('decay_method')!r}")
    step, warmup, size = baseline["train_steps"], baseline["warmup_steps"], baseline["hidden_size"]
    rate = baseline["learning_rate"] * size ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)
    return f"{rate:.8e}"


def _clause_rows():
    # Tables 5, 10 and 11: the source is English in all three (en-zh, en-de, en-vi), BPE'd; clause_split reads the
    # BPE pieces (it runs after the subword step: here the data is BPE'd beforehand).  All six levels of sec. 3.2.
    # The paper configs train on sources split once beforehand (tools/clause_split_corpus.py, run by make
    # reproduce-clause-*; -clause_presplit passes the markers through): spaCy tagging in every epoch would starve
    # the GPU.  The smoke twins split the shipped Chinese source on the fly with jieba's tags (and a tagger
    # trained on it), so the tests run the transform itself.
    split = {"transforms": ["clause_split", "filtertoolong"], "clause_lang": "en", "clause_levels": 6,
             "clause_presplit": True}
    smoke_split = {"transforms": ["sentencepiece", "clause_split", "filtertoolong"], "clause_lang": "zh",
                   "clause_presplit": False}
    tagger = "build/data/{task}/signal_tagger.en.pt"
    return (
        Row("baseline", "the Transformer row", {}),
        Row("ca_rule", "CA with rule: clauses from the signal-word dictionary and POS tags",
            {"clause_attention": True, **split}, smoke_options=smoke_split, source_suffix=".clause_rule"),
        Row("ca_study", "CA with study: clauses from a trained signal-word tagger (tools/train_signal_tagger.py)",
            {"clause_attention": True, **split, "clause_tagger_model": tagger},
            smoke_options={**smoke_split, "clause_tagger_model": "build/tatoeba/signal_tagger.zh.pt"},
            source_suffix=".clause_study"),
    )


def _epochs(batch, epochs, pairs):
    """Run settings for the clause paper's Table 2: a batch of ``batch`` sentences for ``epochs`` epochs."""
    return {"batch_type": "sents", "batch_size": batch, "valid_batch_size": batch, "accum_count": [1],
            "train_steps": epochs * pairs // batch}


#: the papers whose Transformer normalises after each sublayer (the evidence per paper: docs/normalisation.md)
POST_NORM = {"ext_layer_norm": "post"}

PAPERS = (
    Paper("li2019", "Li et al. 2019, information aggregation for multi-head attention with routing-by-agreement",
          ("wmt14_ende", "wmt17_zhen"), _li2019_rows(),
          vocab_size=0, vocab_note="li2019 sec. 5.2.1: BPE with 32K merges for both pairs, no vocabulary cap "
                                   "named: every BPE entry (0: no cap)",
          model_options=POST_NORM, model_note="post-norm: sec. 5.2.1 follows Vaswani et al. 2017 "
                                              "(docs/normalisation.md)"),
    # sec. 4.1: 2048 tokens per batch, gradients accumulated 12 times, on 2 GPUs (one GPU: 24 times)
    Paper("cao2019", "Cao, Zhao and Yu 2019, cross aggregation of multi-head attention",
          ("wmt14_ende", "wmt17_zhen"), _cao2019_rows(),
          {"batch_size": 2048, "valid_batch_size": 2048, "accum_count": [24]}, sizes=("base",),
          batch_note="cao2019 sec. 4.1: 2048 tokens per batch, 12 accumulations, 2 GPUs; accum_count is the "
                     "one-GPU equivalent (make reproduce-* divides it by GPUS)",
          # sec. 4.1: Zh-En keeps the pairs "with the sentence length less than 50", a corpus step named before
          # BPE: words, filtered by prepare_data before BPE (train.lt50.*), not BPE pieces at training time
          task_subsets={"wmt17_zhen": "lt50"},
          vocab_size=0, vocab_note="cao2019 sec. 4.1: BPE with 32K merges, no vocabulary cap named: every BPE entry "
                                   "(0: no cap)"),
    # sec. 5.1: "approximately 4096*4 source tokens and 4096*4 target tokens" per batch, 200k batches
    Paper("chen2019", "Chen, Wang, Utiyama and Sumita 2019, recurrent positional embedding",
          ("wmt14_ende", "nist_zhen"), _chen2019_rows(),
          {"batch_size": 4096, "valid_batch_size": 4096, "accum_count": [4]},
          vocab_size=32000, vocab_note="chen2019 sec. 5.1: BPE, \"the vocabulary size was set as 32K\" (each side; "
                                       "rarer BPE entries become <unk>)",
          batch_note="chen2019 sec. 5.1: about 4096 x 4 source and 4096 x 4 target tokens per batch; accum_count is "
                     "the one-GPU equivalent (make reproduce-* divides it by GPUS)"),
    # Base and Big on four tasks (the paper reports Big on En-De); the ablations at Base on En-De
    Paper("gret", "Weng et al. 2020, GRET: global representation enhanced Transformer",
          ("wmt14_ende", "wmt14_deen", "wmt17_zhen", "wmt16_roen"), _gret_rows(),
          vocab_size=32000, vocab_note="GRET: BPE on all pairs, vocabulary \"limited to\" a size whose digits our "
                                       "copy lost; 32K is our choice (docs/gret.md)",
          model_options=POST_NORM, model_note="post-norm: its layers are written LN(h + SAN(h)) "
                                              "(docs/normalisation.md)"),
    # Table 2 of the clause paper: batch size (sentences) and epochs per task; Table 1: training pairs.  One GPU.
    Paper("clause", "Clause attention based on signal words division (anonymous), CA with rule and with study",
          ("niutrans_enzh", "wmt16_ende", "wmt15_envi"), _clause_rows(), sizes=("base",),
          batch_note="clause paper Table 2: batch size in sentences and the paper's number of updates "
                     "(train_steps = epochs x training pairs of Table 1 / batch size; our corpora differ, so "
                     "the epochs do: docs/clause.md), one GPU",
          task_options={"niutrans_enzh": _epochs(200, 380, 80000), "wmt16_ende": _epochs(256, 1600, 20000),
                        "wmt15_envi": _epochs(160, 168, 100000)},
          vocab_size=0, vocab_note="the clause paper says nothing of subwords or vocabularies: the task's 32K BPE "
                                   "merges and every BPE entry (0: no cap; docs/clause.md)",
          model_options=POST_NORM, model_note="post-norm: sec. 4.1 follows Vaswani et al. 2017 "
                                              "(docs/normalisation.md)"),
)


def _yaml_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml_value(v) for v in value) + "]"
    return str(value)


def _has_key(text, key):
    return re.search(rf"^{re.escape(key)}:", text, re.M) is not None


def _set_key(text, key, value, origin):
    """Replaces the top-level ``key: ...`` line of ``text`` (which must exist)."""
    pattern = re.compile(rf"^{re.escape(key)}:[^\n]*$", re.M)
    if not pattern.search(text):
        raise SystemExit(f"{origin}: no top-level '{key}:' line to replace")
    return pattern.sub(f"{key}: {_yaml_value(value)}", text, count=1)


def _strip_header(text):
    lines = text.splitlines(keepends=True)
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    return "".join(lines)


def _fill(value, size, task, baseline=None):
    """``{size}`` and ``{task}`` filled in a string option value; a callable gets the baseline config's values."""
    if callable(value):
        return value(baseline)
    return value.format(size=size, task=task) if isinstance(value, str) else value


def render(paper, row, size, task, smoke):
    """Text of the config (or smoke twin) of ``row`` at ``size`` on ``task``."""
    base_name = f"transformer_{size}_{row.base + '_' if row.base else ''}{task}.yaml"
    base_path = CONFIGS / ("smoke/baseline" if smoke else "baseline") / base_name
    text = _strip_header(base_path.read_text(encoding="utf-8"))
    name = f"transformer_{size}_{task}_{row.name}"
    runs = "build/smoke" if smoke else "build/runs"
    text = _set_key(text, "save_data", f"{runs}/{paper.key}/{name}/samples", base_path)
    text = _set_key(text, "save_model", f"{runs}/{paper.key}/{name}/model", base_path)
    if row.options or paper.model_options:
        text = _set_key(text, "encoder_type", "ext_transformer", base_path)
        text = _set_key(text, "decoder_type", "ext_transformer", base_path)
    run_options = paper.run_settings(task)
    mechanism = {k: _fill(v, size, task) for k, v in row.options.items()}
    if smoke:
        mechanism.update({k: v for k, v in row.smoke_options.items() if k in row.options})
        for key, value in row.smoke_options.items():
            if key not in row.options:
                text = _set_key(text, key, value, base_path)
    else:  # run settings that are top-level keys of the baseline are replaced in place
        if "batch_size" in run_options:  # the baseline's comment on its batch no longer applies
            text = re.sub(r"(^#[^\n]*\n)+(?=batch_type:)", f"# {paper.batch_note}\n", text, count=1, flags=re.M)
        for key, value in run_options.items():
            if _has_key(text, key):
                text = _set_key(text, key, value, base_path)
        values = yaml.safe_load(text)
        row_settings = {k: _fill(v, size, task, values) for k, v in row.paper_options.items()}
        for key, value in row_settings.items():
            if _has_key(text, key):
                text = _set_key(text, key, value, base_path)
    changed = ["the block below"]  # what differs from the baseline, for the header
    if run_options.keys() & {"batch_size", "accum_count"}:
        changed.append("the batch settings")
    if paper.vocab_size is not None and not smoke:
        if yaml.safe_load(text)["src_vocab_size"] != paper.vocab_size:
            changed.append("the vocabulary cap")
        text = _set_key(text, "src_vocab_size", paper.vocab_size, base_path)
        text = _set_key(text, "tgt_vocab_size", paper.vocab_size, base_path)
        text = re.sub(r"^(#[^\n]*\n)*(?=src_vocab_size:)", f"# {paper.vocab_note}\n", text, count=1, flags=re.M)
    subset = paper.task_subsets.get(task)
    if subset and not smoke:  # the training corpus only; the valid set is the paper's whole dev set
        text, count = re.subn(r"^(\s+path_(?:src|tgt): \S+/)train\.bpe\.", rf"\1train.{subset}.bpe.", text, flags=re.M)
        if count != 2:
            raise SystemExit(f"{base_path}: expected one training corpus (path_src, path_tgt) to read {subset} from")
        changed.append(f"the training corpus (its {subset} subset)")
    if row.source_suffix and not smoke:
        text = re.sub(r"^(\s+path_src: \S+)$", rf"\1{row.source_suffix}", text, flags=re.M)
    for key in [k for k in mechanism if _has_key(text, k)]:  # a stock option (e.g. transforms): set in place
        text = _set_key(text, key, mechanism.pop(key), base_path)
    if smoke:
        header = (f"# Smoke twin of yaml_configs/{paper.key}/{name}.yaml: the same options at toy size\n"
                  f"# on the shipped Tatoeba sample (built from yaml_configs/smoke/baseline/{base_name}).\n")
    else:
        header = (f"# {paper.title}.\n# {row.description}.\n"
                  f"# Transformer-{size.capitalize()} on {task}: everything but "
                  f"{', '.join(changed[:-1]) + ' and ' if len(changed) > 1 else ''}{changed[-1]}"
                  f" is yaml_configs/baseline/{base_name}.\n")
    header += "# Generated by tools/paper_configs.py: edit the row there, not this file.\n"
    extra = {} if smoke else {k: v for k, v in {**run_options, **row_settings}.items() if not _has_key(text, k)}
    options = dict(mechanism, **extra)
    block = f"# --- {paper.key} ---\n" + _lines(options)
    if not options:
        block = f"# --- {paper.key}: no mechanism (the paper's baseline run) ---\n"
    if paper.model_options:
        block = f"# --- {paper.key}'s Transformer: {paper.model_note} ---\n" + _lines(paper.model_options) + block
    return header + text.rstrip("\n") + "\n" + block


def _lines(options):
    return "".join(f"{k}: {_yaml_value(v)}\n" for k, v in options.items())


def generated():
    """``{path: text}`` of every generated config."""
    files = {}
    for paper in PAPERS:
        for row in paper.rows:
            for size in row.sizes or paper.sizes:
                for task in row.tasks or paper.tasks:
                    name = f"transformer_{size}_{task}_{row.name}.yaml"
                    files[CONFIGS / paper.key / name] = render(paper, row, size, task, smoke=False)
                    files[CONFIGS / "smoke" / paper.key / name] = render(paper, row, size, task, smoke=True)
    return files


def main(argv=None):
    parser = common.Parser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 on any difference")
    args = parser.parse_args(argv)
    stale = []
    for path, text in generated().items():
        old = path.read_text(encoding="utf-8") if path.exists() else ""
        if old == text:
            continue
        stale.append(path)
        if args.check:
            sys.stdout.writelines(difflib.unified_diff(
                old.splitlines(True), text.splitlines(True), str(path), "generated"))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if args.check and stale:
        print(f"{len(stale)} config(s) differ from tools/paper_configs.py; run it to rewrite them", file=sys.stderr)
        return 1
    if not args.check:
        print(f"wrote {len(stale)} of {len(generated())} configs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
