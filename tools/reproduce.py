#!/usr/bin/env python
"""Reproduce a paper table: train every row's config, average its last checkpoints, translate, score, report.

``make reproduce-TABLE`` runs it: ``--preflight``, then ``--rules FILE`` (a Makefile of the rows' steps, which
make runs), then the scoring and report.  Usage::

    python tools/reproduce.py TABLE (--preflight | --rules FILE | --dry-run) [--gpus 0,1,2,3] [--average 5]
    python tools/reproduce.py TABLE [--gpus ...] [--average 5] [--results-dir DIR]   # score and report
    python tools/reproduce.py TABLE --report-only [--results-json FILE] [--results-dir DIR]
    python tools/reproduce.py --list

How it works and why: docs/tools.md (reproduce.py).
"""

import argparse
import functools
import json
import math
import os
import re
import shlex
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = Path("build/data")  # relative to REPO, the working directory of main()
RESULTS = REPO / "results"
import common
from prepare_data import TASKS as DATA_TASKS  # the tasks `make data-<task>` prepares

#: (source, target) language of every task, as prepared by tools/prepare_data.py.
LANGS = {name: (task.src, task.tgt) for name, task in DATA_TASKS.items()}
#: Length buckets (source words) of the by-length report of the clause tables (the paper's Tables 6-9 compare
#: short, relatively short, relatively long and long sentences without giving bounds; these are ours).
CLAUSE_BUCKETS = (10, 20, 30, 40)
#: Checkpoints averaged unless ``--average`` says otherwise.
AVERAGE = 5
#: OpenNMT-py's defaults (onmt/opts.py) of the checkpoint options, for a config that leaves them out.
ONMT_CHECKPOINT_DEFAULTS = {"save_checkpoint_steps": 5000, "keep_checkpoint": -1}
#: Bootstrap resamples and seed of the significance test (onmt_ext.evaluation's defaults).
BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED = 1000, 12345
#: At most this many training points per row are kept in the results JSON (the validation points all are).
CURVE_POINTS = 500
#: The BLEU each paper reports, which the "ours - paper" column uses: (key of a scored row, description).
#: ``bleu`` is sacreBLEU on the detokenized text (13a, or zh for Chinese output), ``tok_bleu`` sacreBLEU with
#: tokenize='none' on the tokenized text (sacremoses, or jieba words for Chinese) that :func:`score` reads.
NIST_BLEU = ("bleu", "case-sensitive NIST BLEU (mteval-v13a tokenization: sacreBLEU tokenize='13a') on "
                     "detokenized text")
PAPER_METRICS = {
    "li2019": NIST_BLEU,  # "case-sensitive 4-gram NIST BLEU score"
    "cao2019": NIST_BLEU,  # "case-sensitive 4-gram NIST BLEU score"
    "gret": NIST_BLEU,  # "we measure translation quality with the NIST BLEU"
    "chen2019": ("tok_bleu", "multi-bleu.perl BLEU, case-sensitive, on Moses-tokenized text (sacreBLEU "
                             "tokenize='none', no smoothing)"),  # "The multi-bleu.perl was used"
}
#: The clause paper names no BLEU variant; its Chinese rows (Table 5) are scored on words as segmented.
CLAUSE_METRICS = {"zh": ("tok_bleu", "word-level BLEU on jieba-segmented Chinese (sacreBLEU tokenize='none')")}
UNSTATED_METRIC = ("bleu", "sacreBLEU (13a; the paper does not say which BLEU it reports)")
#: The training data of each (paper, task) as the paper describes it, set beside ours in every report.
PAPER_DATA = {
    ("li2019", "wmt14_ende"): "WMT14 En-De, 4.6M pairs",
    ("li2019", "wmt17_zhen"): "WMT17 Zh-En, all of its parallel data, about 20.6M pairs",
    ("cao2019", "wmt14_ende"): "WMT14 En-De, 4.6M pairs",
    ("cao2019", "wmt17_zhen"): "WMT17 Zh-En, 20.6M pairs, of which those with sentences under 50 words are kept",
    ("chen2019", "wmt14_ende"): "WMT'14 En-De, 4.43M pairs",
    ("chen2019", "nist_zhen"): "LDC Zh-En corpora, 1.28M pairs",
    ("clause", "niutrans_enzh"): "NiuTrans En-Zh, 80k training pairs (Table 1)",
    ("clause", "wmt16_ende"): "WMT16 En-De, 20k training pairs (Table 1)",
    ("clause", "wmt15_envi"): "WMT15 En-Vi, 100k training pairs (Table 1)",
    **{("gret", task): f"{name} (its size is not legible in our copy of the paper)" for task, name in (
        ("wmt14_ende", "WMT14 En-De"), ("wmt14_deen", "WMT14 De-En"), ("wmt17_zhen", "WMT17 Zh-En"),
        ("wmt16_roen", "WMT16 Ro-En"))},
}
#: The task whose full corpus cannot be fetched here; its tables refuse to run on the small part alone.
FULL_CORPUS_TASK = "wmt17_zhen"


@dataclass(frozen=True)
class TableRow:
    """One row: a config under yaml_configs/, the paper's BLEU (None: not legible) and command-line overrides
    (a sweep point, trained into the config's run directory named after them: ``..._chen2019_dim_256``)."""

    label: str
    config: str
    paper_bleu: float
    overrides: tuple = ()
    paper_more: tuple = ()  # the paper's BLEU on the task's further test sets (TEST_SETS), in order


#: The test sets of a task as (label, file prefix under build/data/<task>/); every other task has one, ``test``.
#: Each row is translated and scored on all of them; bootstrap tests and by-length reports compare within a set.
TEST_SETS = {"nist_zhen": (("NIST02", "test"), ("NIST03", "test_nist03"), ("NIST04", "test_nist04"))}


def compared_row(configs, index):
    """The index of the row that row ``index`` (of the config names ``configs``) is tested against: the first
    row of its model size (``transformer_big_`` or not), as the papers test Big against the Big baseline."""
    big = ["transformer_big_" in Path(config).name for config in configs]
    return big.index(big[index])


def test_sets(task):
    """The ``(label, file prefix)`` of every test set of ``task``, the main one (``test``) first."""
    return TEST_SETS.get(task, (("test", "test"),))


def _li2019_tables():
    def rows(size, task, entries):
        return tuple(TableRow(label, f"{'baseline' if suffix is None else 'li2019'}/transformer_{size}_{task}"
                              f"{'' if suffix is None else '_' + suffix}.yaml", bleu)
                     for label, suffix, bleu in entries)

    table2 = rows("base", "wmt14_ende", (
        ("2 baseline (concat + linear)", None, 27.31),
        ("3 simple routing, enc-self", "simple_enc_self", 27.98),
        ("4 EM routing, enc-self", "em_enc_self", 28.28),
        ("5 EM routing, enc-dec", "em_enc_dec", 27.94),
        ("6 EM routing, dec-self", "em_dec_self", 28.15),
        ("7 EM routing, enc-self + dec-self", "em_enc_self_dec_self", 28.45),
        ("8 EM routing, all three", "em_all", 28.47),
    ))
    table3 = rows("base", "wmt14_ende", (
        ("1 none", None, 27.31),
        ("2 [1-6]", "em_enc_self", 28.28),
        ("3 [4-6]", "em_enc_self_layers_4-6", 28.26),
        ("4 [1-3]", "em_enc_self_layers_1-3", 28.27),
        ("5 [1,2]", "em_enc_self_layers_1-2", 28.26),
        ("6 [6]", "em_enc_self_layers_6", 27.68),
        ("7 [1]", "em_enc_self_layers_1", 27.75),
    ))
    table4 = {}
    for task, scores in (("wmt14_ende", (27.31, 28.26, 28.58, 28.96)), ("wmt17_zhen", (24.13, 24.68, 24.56, 25.00))):
        base_b, ea_b, base_g, ea_g = scores
        table4[task] = (rows("base", task, (("Transformer-Base", None, base_b),
                                            ("+ Effective Aggregation", "em_enc_self_layers_1-2", ea_b)))
                        + rows("big", task, (("Transformer-Big", None, base_g),
                                             ("+ Effective Aggregation", "em_enc_self_layers_1-2", ea_g))))
    return {
        "li2019-table2": table2,
        "li2019-table3": table3,
        "li2019-table4-wmt14_ende": table4["wmt14_ende"],
        "li2019-table4-wmt17_zhen": table4["wmt17_zhen"],
    }


def _cao2019_tables():
    def rows(task, entries):
        return tuple(TableRow(label, f"cao2019/transformer_base_{task}_{suffix}.yaml", bleu)
                     for label, suffix, bleu in entries)

    return {
        "cao2019-table1": rows("wmt17_zhen", (
            ("1 Transformer-Base", "baseline", 24.28),
            ("2 + horizontal, zero init.", "horizontal_zero", 24.76),
            ("3 + horizontal, self init.", "horizontal_self", 24.88),
            ("4 + vertical + horizontal, zero init.", "cross_zero", 25.02),
            ("5 + vertical + horizontal, self init.", "cross_self", 24.68),
        )),
        "cao2019-table2-wmt17_zhen": rows("wmt17_zhen", (
            ("Transformer-Base", "baseline", 24.28), ("+ Cross Aggregation", "cross_zero", 25.02))),
        "cao2019-table2-wmt14_ende": rows("wmt14_ende", (
            ("Transformer-Base", "baseline", 27.43), ("+ Cross Aggregation", "cross_zero", 28.04))),
    }


def _chen2019_tables():
    def rows(size, task, entries):  # bleu: a number, or a tuple with one per test set of the task (TEST_SETS)
        scores = [bleu if isinstance(bleu, tuple) else (bleu,) for _, _, bleu in entries]
        return tuple(TableRow(label, f"chen2019/transformer_{size}_{task}_{suffix}.yaml", bleu[0],
                              paper_more=bleu[1:]) for (label, suffix, _), bleu in zip(entries, scores))

    # Figure 2: BLEU against d_r.  Its values are not legible in our copy; sec. 5.2 gives the peaks
    # (320 for RPEHead, 256 for MPRHead).  d_r runs over whole heads of Transformer-Base (64).
    def sweep(layout):
        config = f"chen2019/transformer_base_wmt14_ende_{layout}.yaml"
        return (TableRow("Transformer-Base", "chen2019/transformer_base_wmt14_ende_baseline.yaml", 27.25),) + tuple(
            TableRow(f"{layout} d_r = {dim}", config, None, ("-chen2019_dim", dim)) for dim in range(64, 512, 64))

    return {
        "chen2019-table1": rows("base", "wmt14_ende", (
            ("Transformer (base)", "baseline", 27.25), ("+Relative PE", "relative_pe", 27.60),
            ("+DiSAN", "disan", 27.66), ("+RPEHead", "rpehead", 28.11), ("+MPRHead", "mprhead", 28.35),
        )) + rows("big", "wmt14_ende", (("Transformer (big)", "baseline", 28.22), ("+MPRHead", "mprhead", 29.11))),
        # NIST02 (test.*), with NIST03 and NIST04 (test_nist03.*, test_nist04.*) as TEST_SETS["nist_zhen"]
        "chen2019-table2-nist_zhen": rows("base", "nist_zhen", (
            ("Transformer (base)", "baseline", (46.62, 45.90, 45.95)),
            ("+Relative PEs", "relative_pe", (46.91, 46.47, 45.96)),
            ("+RPEHead", "rpehead", (47.06, 46.21, 46.32)), ("+MPRHead", "mprhead", (47.69, 47.27, 47.31)),
        )) + rows("big", "nist_zhen", (("Transformer (big)", "baseline", (47.88, 47.58, 47.37)),
                                       ("+MPRHead", "mprhead", (48.73, 48.61, 48.21)))),
        "chen2019-table3": rows("base", "wmt14_ende", (
            ("Transformer (base)", "baseline", 27.25), ("- PE of Dec", "no_pe_dec", 26.73),
            ("- PE of Enc", "no_pe_enc", 10.71), ("RPEHead (base)", "rpehead", 28.11),
            ("- RPE&PE of Dec", "rpehead_no_dec", 27.54), ("- RPE&PE of Enc", "rpehead_no_enc", 11.16),
            ("MPRHead (base)", "mprhead", 28.35), ("- RPE&PE of Dec", "mprhead_no_dec", 27.74),
            ("- RPE/PE of Enc", "mprhead_no_enc", 10.89), ("- RPE&PE of Enc&Dec", "no_pe_enc_dec", 10.43),
        )),
        "chen2019-figure2-rpehead": sweep("rpehead"),
        "chen2019-figure2-mprhead": sweep("mprhead"),
    }


def _gret_tables():
    # The BLEU scores of our copy of the paper are not legible (paper BLEU: n/a).  Each GRET row fine-tunes
    # from the checkpoint of the table's baseline row, which is trained first.
    def rows(size, task, suffixes):
        return tuple(TableRow(label, f"gret/transformer_{size}_{task}_{suffix}.yaml", None)
                     for label, suffix in suffixes)

    main = (("Transformer", "baseline"), ("+ GRET", "gret"))
    tables = {f"gret-main-{task}": rows("base", task, main)
              for task in ("wmt14_ende", "wmt14_deen", "wmt17_zhen", "wmt16_roen")}
    tables["gret-ablation"] = rows("base", "wmt14_ende", main + (
        ("GRET - capsule network", "gret_no_capsules"), ("GRET - layer aggregation", "gret_no_layers"),
        ("GRET - context gate", "gret_no_gate")))
    tables["gret-big"] = rows("big", "wmt14_ende", (("Transformer-Big", "baseline"), ("+ GRET (Big)", "gret")))
    return tables


def _clause_tables():
    # BLEU columns of Tables 5 (NiuTrans en-zh), 10 (en-de) and 11 (en-vi); the "valid accuracy" column is not
    # reproduced, nor Table 5's rows of Wang et al. 2018 and Beltagy et al. 2020 (other systems).
    def rows(task, bleus):
        return tuple(TableRow(label, f"clause/transformer_base_{task}_{suffix}.yaml", bleu) for (label, suffix), bleu
                     in zip((("Transformer", "baseline"), ("CA with rule", "ca_rule"), ("CA with study", "ca_study")),
                            bleus))

    return {"clause-table5": rows("niutrans_enzh", (39.02, 39.46, 40.03)),
            "clause-table10": rows("wmt16_ende", (27.30, 27.46, 27.49)),
            "clause-table11": rows("wmt15_envi", (23.03, 23.34, 24.10))}


def _sample_tables():
    # The whole chain at toy size on the shipped WMT14 sample (`make data-sample_ende`), for the CPU test;
    # paper BLEU: none.
    return {"sample-li2019": tuple(TableRow(label, f"sample/transformer_tiny_sample_ende_{suffix}.yaml", None)
                                   for label, suffix in (("toy Transformer", "baseline"),
                                                         ("+ EM routing, enc-self", "em_enc_self")))}


TABLES = {**_li2019_tables(), **_cao2019_tables(), **_chen2019_tables(), **_gret_tables(), **_clause_tables(),
          **_sample_tables()}


# ---------------------------------------------------------------- Planning: the commands of a row

def parse_gpus(text):
    """The CUDA device ids of a ``--gpus`` value (``"0,1,3"``: ``(0, 1, 3)``; ``cpu``: ``()``); anything but
    distinct non-negative integers joined by commas raises ``ValueError`` saying what is wrong."""
    if text == "cpu":  # no GPU: train and translate on the CPU (the chain test; tiny models only)
        return ()
    if not re.fullmatch(r"[0-9]+(,[0-9]+)*", text):
        raise ValueError(f"{text!r} is not a comma-separated list of GPU ids such as 0 or 0,1,2,3")
    ids = tuple(int(item) for item in text.split(","))
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise ValueError(f"{text!r} lists GPU {', '.join(map(str, repeated))} more than once")
    return ids


def checkpoint_steps(train_steps, save_every):
    """The steps at which OpenNMT-py saves a checkpoint: every ``save_every`` (none for 0), and ``train_steps``."""
    steps = list(range(save_every, train_steps + 1, save_every)) if save_every > 0 else []
    if not steps or steps[-1] != train_steps:
        steps.append(train_steps)
    return steps


def averaged_steps(values, average, config):
    """The steps of the last ``average`` checkpoints the run of a config (its options ``values``) leaves, oldest
    first; SystemExit naming the option when ``keep_checkpoint`` or the run's checkpoints are fewer."""
    train_steps = int(values["train_steps"])
    save_every = int(values.get("save_checkpoint_steps", ONMT_CHECKPOINT_DEFAULTS["save_checkpoint_steps"]))
    keep = int(values.get("keep_checkpoint", ONMT_CHECKPOINT_DEFAULTS["keep_checkpoint"]))
    if 0 <= keep < average:
        raise SystemExit(f"reproduce.py: --average {average} needs the last {average} checkpoints, but {config} sets "
                         f"keep_checkpoint: {keep}, so OpenNMT-py keeps only {keep}; lower --average or raise "
                         "keep_checkpoint")
    steps = checkpoint_steps(train_steps, save_every)
    if len(steps) < average:
        raise SystemExit(f"reproduce.py: --average {average} needs {average} checkpoints, but {config} saves only "
                         f"{len(steps)} (train_steps: {train_steps}, save_checkpoint_steps: {save_every})")
    return steps[-average:]


@dataclass(frozen=True)
class Step:
    """One command of a row: a rule of :func:`make_rules`, ``output`` its target, ``inputs`` its prerequisites."""

    command: tuple
    output: Path
    inputs: tuple = ()


@dataclass(frozen=True)
class RowPlan:
    """What reproducing one row does: its steps, the ``checkpoints`` averaged (oldest first), the ``model``
    translated (their average, or the last checkpoint) and the BPE'd ``hypotheses`` of the main test set."""

    row: TableRow
    task: str
    run_dir: Path
    train_steps: int
    checkpoints: tuple
    model: Path
    hypotheses: Path
    steps: tuple

    def hypotheses_of(self, index):
        """The BPE'd translation of test set ``index`` of :func:`test_sets` (0: ``hypotheses``)."""
        return hypotheses_file(self.run_dir, test_sets(self.task)[index][1], self.model)

    @property
    def commands(self):
        """The commands of the steps, as lists of strings."""
        return [list(step.command) for step in self.steps]


def _with_overrides(values, overrides):
    """``values`` with a row's command-line overrides (``("-option", value, ...)``) applied."""
    values = dict(values)
    for flag, value in zip(overrides[0::2], overrides[1::2]):
        values[str(flag).lstrip("-")] = value
    return values


def _task_of(config):
    """The key of ``LANGS`` named in a config's file name."""
    task = next((t for t in LANGS if t in Path(config).stem), None)
    if task is None:
        raise SystemExit(f"reproduce.py: cannot tell the task of {config}")
    return task


def table_task(table):
    """The one task (key of ``LANGS``) of every row of ``TABLES[table]``."""
    tasks = {_task_of(row.config) for row in TABLES[table]}
    if len(tasks) != 1:
        raise SystemExit(f"reproduce.py: the rows of {table} mix tasks ({', '.join(sorted(tasks))})")
    return tasks.pop()


def results_dir(table, root=None):
    """``<root>/<paper>/<task>/`` of a table: its paper is the table name up to the first ``-``."""
    return Path(RESULTS if root is None else root) / table.split("-", 1)[0] / table_task(table)


def _training_inputs(values):
    """The files a training run reads: the corpora, the vocabularies and the checkpoint it starts from."""
    paths = [corpus[key] for corpus in values.get("data", {}).values() for key in ("path_src", "path_tgt")
             if corpus.get(key)]
    paths += [values[key] for key in ("src_vocab", "tgt_vocab", "train_from") if values.get(key)]
    return tuple(dict.fromkeys(Path(path) for path in paths))


def update_passes(values, gpus, passes=None, config="the config"):
    """``(batch_size, accum_count)`` per GPU that keeps the config's one-GPU update (``batch_size`` x
    ``accum_count``) over the GPUs ``gpus`` in ``passes`` passes each (default: the config's batch)."""
    accum_total, batch, n_gpus = values.get("accum_count", [1])[0], int(values["batch_size"]), max(1, len(gpus))
    if accum_total % n_gpus:
        raise SystemExit(f"reproduce.py: --gpus {','.join(map(str, gpus))} ({n_gpus} GPUs) does not divide "
                         f"accum_count {accum_total} of {config}, so the paper's batch cannot be kept")
    per_gpu = accum_total // n_gpus
    passes = per_gpu if passes is None else passes
    if passes < 1 or per_gpu % passes:
        raise SystemExit(f"reproduce.py: --passes {passes} must divide the {per_gpu} passes per GPU of one update "
                         f"(accum_count {accum_total} over {n_gpus} GPU(s))")
    return batch * (per_gpu // passes), passes


def plan(row, gpus=(0,), average=AVERAGE, passes=None):
    """The :class:`RowPlan` of one row trained on the CUDA devices ``gpus`` with ``average`` checkpoints averaged
    (``passes``: batches per update and GPU, see :func:`update_passes`)."""
    from onmt_ext.clause_split import translate_options

    values = _with_overrides(common.config_values(row.config), row.overrides)
    save_model = Path(values["save_model"])
    if row.overrides:
        suffix = "_".join(str(part).lstrip("-") for part in row.overrides)
        save_model = save_model.parent.with_name(f"{save_model.parent.name}_{suffix}") / save_model.name
    run_dir = save_model.parent
    task = _task_of(row.config)
    src, _ = LANGS[task]
    n_gpus = max(1, len(gpus))
    batch_size, accum_count = update_passes(values, gpus, passes, row.config)
    train_steps = int(values["train_steps"])
    checkpoints = tuple(Path(f"{save_model}_step_{step}.pt") for step in averaged_steps(values, average, row.config))
    steps = list(_clause_preparation(values, task))
    devices = ["-world_size", n_gpus, "-gpu_ranks", *range(n_gpus)] if gpus else []
    train = ["onmt_train", "-config", f"yaml_configs/{row.config}", *devices,
             "-accum_count", accum_count, *(["-batch_size", batch_size] if batch_size != int(values["batch_size"])
                                            else []),
             "-log_file", run_dir / "train.log", "-overwrite_checkpoints"]
    if row.overrides:
        train += ["-save_model", save_model, *row.overrides]
    steps.append(Step(tuple(train), checkpoints[-1], _training_inputs(values)))
    model = checkpoints[-1]
    if average > 1:
        model = run_dir / f"average_last{average}.pt"
        steps.append(Step(("onmt_average_models", "-models", *checkpoints, "-output", model), model, checkpoints))
    for _, prefix in test_sets(task):
        hypotheses = hypotheses_file(run_dir, prefix, model)
        test_source = DATA / task / f"{prefix}.bpe.{src}"
        log = run_dir / f"translate.{'' if prefix == 'test' else prefix + '.'}{model.stem}.log"
        translate = ["onmt_translate", "-model", model, "-src", test_source, "-output", hypotheses,
                     "-beam_size", 4, "-length_penalty", "wu", "-alpha", 0.6, "-batch_size", 4096,
                     "-batch_type", "tokens", *(["-gpu", 0] if gpus else []), "-log_file", log,
                     *translate_options(values)]  # the test source split as in training (clause attention)
        steps.append(Step(tuple(translate), hypotheses, (model, test_source)))
    steps = tuple(Step(tuple(str(part) for part in step.command), step.output, step.inputs) for step in steps)
    return RowPlan(row, task, run_dir, train_steps, checkpoints, model, hypotheses_file(run_dir, "test", model), steps)


def hypotheses_file(run_dir, prefix, model):
    """Where a row's translation of the test set ``prefix`` (``test``, ``test_nist03``...) with ``model`` goes."""
    return run_dir / f"{prefix}.{model.stem}.hyp.bpe"


def _clause_preparation(values, task):
    """Steps before training a clause-attention row: the "study" tagger, then the pre-split sources."""
    if not values.get("clause_attention"):
        return []
    src, _ = LANGS[task]
    lang, tagger = values["clause_lang"], values.get("clause_tagger_model")
    steps = []
    if tagger:  # "CA with study": the signal-word tagger is trained first, on the training source
        source = DATA / task / f"train.bpe.{src}"
        steps.append(Step(("python", "tools/train_signal_tagger.py", "--lang", lang, "--input", source,
                           "--output", tagger, "--max-sentences", 100000), Path(tagger), (source,)))
    if values.get("clause_presplit"):  # the sources the config reads: <file>.clause_<rule|study>
        for corpus in values["data"].values():
            split = corpus["path_src"]
            unsplit = split.rsplit(".clause_", 1)[0]
            steps.append(Step(("python", "tools/clause_split_corpus.py", "--lang", lang, "--levels",
                               values.get("clause_levels", 6), "--input", unsplit, "--output", split,
                               *(["--tagger-model", tagger] if tagger else [])),
                              Path(split), (Path(unsplit), *([Path(tagger)] if tagger else []))))
    return steps


# ---------------------------------------------------------------- Before anything runs: the devices and the corpus

@functools.lru_cache(maxsize=None)
def _cuda_devices(gpus):
    """How many CUDA devices torch sees with ``CUDA_VISIBLE_DEVICES=<gpus>`` (0 without CUDA), in a subprocess
    (as every command of the run sees them), or the one-line error of importing torch."""
    code = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(map(str, gpus)))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if done.returncode:
        return (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    return int(done.stdout.split()[-1])


def device_problem(gpus, probe=None):
    """One line saying why the CUDA devices ``gpus`` cannot run the table, or None; ``probe``: as
    :func:`_cuda_devices`."""
    if not gpus:
        return None
    asked = ",".join(map(str, gpus))
    seen = (probe or _cuda_devices)(gpus)
    if isinstance(seen, str):
        return f"reproduce.py: GPUS={asked} needs torch with CUDA, but importing torch failed: {seen}"
    hint = ("run on a machine with CUDA (a system CUDA torch: make setup SYSTEM_TORCH=1, docs/install.md), or "
            "GPUS=cpu for a toy table such as sample-li2019")
    if seen == 0:
        return (f"reproduce.py: GPUS={asked} asks for CUDA device{'s' if len(gpus) > 1 else ''} {asked}, but "
                f"torch ({sys.executable}) sees no CUDA device; {hint}")
    if seen < len(gpus):
        return (f"reproduce.py: GPUS={asked} asks for {len(gpus)} CUDA devices, but torch sees only {seen} of them "
                "(`nvidia-smi -L` lists this machine's); name only devices that exist")
    return None


def _read_corpora(task):
    """``build/data/<task>/raw/corpora.json`` (written by tools/prepare_data.py's raw step), or None."""
    path = DATA / task / "raw" / "corpora.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def corpus_problem(table, small_data=False, environ=None):
    """One line saying why a WMT17 Zh-En ``table`` cannot have the training data it asks for, or None.

    The data step downloads the full corpus itself (News Commentary v12, the UN corpus and CWMT), or takes the UN and
    CWMT pairs from ``WMT17_EXTRA_DIR``; ``small_data`` asks for News Commentary alone.  What can be seen before
    any data is prepared: that directory lacking its files, or set together with ``small_data``."""
    if table_task(table) != FULL_CORPUS_TASK:
        return None
    environ = os.environ if environ is None else environ
    from prepare_data import WMT17_EXTRA, extra_dir_missing

    extra = environ.get("WMT17_EXTRA_DIR")
    if extra and small_data:
        return ("reproduce.py: WMT17_SMALL_DATA=1 trains on News Commentary v12 alone, which leaves out the pairs "
                f"WMT17_EXTRA_DIR={extra} holds: unset one of them")
    missing = extra_dir_missing(FULL_CORPUS_TASK, extra) if extra else []
    if missing:
        return (f"reproduce.py: WMT17_EXTRA_DIR={extra} lacks {', '.join(missing)}: {WMT17_EXTRA}; or unset it, "
                "and make data-wmt17_zhen downloads them")
    return None


def preflight(table, gpus, small_data=False, dry_run=False, probe=None, environ=None):
    """The device and corpus problems of ``table``, before any data is prepared: SystemExit with one line each,
    or with ``dry_run`` warnings on stderr."""
    problems = [p for p in (device_problem(gpus, probe), corpus_problem(table, small_data, environ)) if p]
    if small_data and table_task(table) != FULL_CORPUS_TASK:
        print(f"reproduce.py: note: WMT17_SMALL_DATA applies to WMT17 Zh-En tables only; {table} trains on "
              f"{table_task(table)}", file=sys.stderr)
    if problems and dry_run:
        for problem in problems:
            print(problem.replace("reproduce.py: ", "reproduce.py: warning: ", 1), file=sys.stderr)
    elif problems:
        raise SystemExit("\n".join(problems))
    return problems


def paper_metric(table, task):
    """``(key, description)`` of the BLEU the table's paper reports (:data:`PAPER_METRICS`); ``key`` names the
    score of a result row that the "ours - paper" column uses."""
    paper = table.split("-", 1)[0]
    if paper == "clause":
        return CLAUSE_METRICS.get(LANGS[task][1], UNSTATED_METRIC)
    return PAPER_METRICS.get(paper, UNSTATED_METRIC)


def paper_data(table, task):
    """The training data of ``table``'s paper on ``task`` in words (:data:`PAPER_DATA`)."""
    return PAPER_DATA.get((table.split("-", 1)[0], task), "not stated (not a paper)")


def training_data(task):
    """Our training data of ``task`` in words: its corpora and pair counts, and the pairs left after cleaning."""
    prepared = _read_corpora(task)
    if prepared is None:
        return f"not recorded ({DATA / task}/raw/corpora.json is missing)"
    text = " + ".join(f"{entry['name']} ({entry['pairs']:,} pairs)" for entry in prepared["corpora"])
    try:
        stats = json.loads((DATA / task / "clean" / "stats.json").read_text(encoding="utf-8"))
        text += f"; {stats['pairs_kept']:,} pairs after cleaning"
        for name, subset in stats.get("subsets", {}).items():  # a paper's own filter (cao2019's Zh-En)
            text += f"; {subset['pairs']:,} in its {name} subset ({subset['note']})"
    except (OSError, ValueError, KeyError):
        pass
    return text


# ---------------------------------------------------------------- Running

def shell_line(command, gpus):
    """A command as the shell line that runs it on the devices ``gpus`` (``CUDA_VISIBLE_DEVICES=0,1 onmt_...``)."""
    return f"CUDA_VISIBLE_DEVICES={','.join(map(str, gpus))} {shlex.join(command)}"


def _scoring_inputs(task, by_length):
    """The data files the scoring reads: the references of every test set and, for the by-length report, the
    main test source."""
    src, tgt = LANGS[task]
    paths = [path for _, prefix in test_sets(task)
             for path in (*_reference_files(task, f"{prefix}.{tgt}"), *_reference_files(task, f"{prefix}.tok.{tgt}"))]
    return paths + ([DATA / task / f"test.bpe.{src}"] if by_length else [])


def make_rules(table, plans, gpus):
    """The Makefile that runs the steps of ``plans`` on ``gpus`` (``make -f FILE BIN=<venv>/bin``): each step's
    output is a target with the files it reads as prerequisites, so make skips what is up to date and redoes
    what an input changed under, except a training: its data are order-only prerequisites, so that a newer
    corpus never overwrites finished checkpoints (days of GPU time; delete the last checkpoint to train again).
    ``all`` needs the scoring inputs first; a missing data file stops make with one line naming it and
    ``make data-<task>``, a failed command with one line naming its log."""
    task = plans[0].task
    targets = [p.hypotheses_of(i) for p in plans for i in range(len(test_sets(task)))]
    lines = [f"# {table}: written by tools/reproduce.py --rules for make reproduce-{table}", ".DELETE_ON_ERROR:",
             ".NOTPARALLEL:",  # one step at a time: the rows share the devices
             f"export CUDA_VISIBLE_DEVICES := {','.join(map(str, gpus))}",
             "all: " + " ".join(map(str, _scoring_inputs(task, table.startswith("clause-")) + targets))]
    steps = {step.output: (p, step) for p in plans for step in p.steps}  # rows may share a step (a tagger)
    for output, (p, step) in steps.items():
        command = shlex.join(step.command).replace("$", "$$")
        log = step.command[step.command.index("-log_file") + 1] if "-log_file" in step.command else None
        needs = ("| " if step.command[0] == "onmt_train" else "") + " ".join(map(str, step.inputs))
        lines += ["", f"{output}: {needs}", f"\t@mkdir -p {output.parent}",
                  f"\t$(BIN)/{command} || {{ echo 'reproduce.py: {step.command[0]} failed; "
                  + (f"its log: {log}" if log else "its messages are above") + "' >&2; exit 1; }"]
    for p in plans:  # the checkpoints averaged besides the last one (the target of the training)
        if len(p.checkpoints) > 1:
            lines += ["", f"{' '.join(map(str, p.checkpoints[:-1]))}: | {p.checkpoints[-1]}",
                      f"\t@test -f $@ || {{ echo 'reproduce.py: $@ is missing; delete {p.checkpoints[-1]} to train "
                      "again' >&2; exit 1; }"]
    return "\n".join(lines + ["", f"{DATA}/%:", f"\t@echo 'reproduce.py: $@ is missing; prepare {DATA / task}/ "
                                              f"with `make data-{task}` (docs/data.md lists its files)' >&2; exit 1",
                               ""])


# ---------------------------------------------------------------- Scoring

def _metric(lang):
    """sacreBLEU's 13a BLEU, or its zh tokenizer for Chinese output."""
    return "bleu-zh" if lang == "zh" else "bleu"


def _postprocess(bpe_file, lang):
    """BPE removed (tokenized text) and detokenized text of an ``onmt_translate`` output."""
    from sacremoses import MosesDetokenizer

    from onmt_ext import evaluation as ev

    detok = MosesDetokenizer(lang=lang)
    tokenized = [line.replace("@@ ", "").removesuffix("@@") for line in ev.read_hypotheses(bpe_file)]
    return tokenized, [detok.detokenize(line.split()) for line in tokenized]


def _reference_files(task, name):
    """``<name>`` or, for multi-reference test sets (NIST), ``<name>0``, ``<name>1``, ..."""
    numbered = sorted((DATA / task).glob(f"{name}[0-9]"))
    return numbered or [DATA / task / name]


def score(plans, task, by_length=False, test_set=0):
    """Per row, on test set number ``test_set``: BLEU, tokenized BLEU, chrF, their signatures and the paired
    bootstrap against :func:`compared_row`'s row (with ``by_length``, per :data:`CLAUSE_BUCKETS` too)."""
    from onmt_ext import evaluation as ev

    src, tgt = LANGS[task]
    prefix = test_sets(task)[test_set][1]
    metric = _metric(tgt)
    refs = ev.read_references(_reference_files(task, f"{prefix}.{tgt}"))
    tok_refs = ev.read_references(_reference_files(task, f"{prefix}.tok.{tgt}"))
    outputs = [_postprocess(p.hypotheses_of(test_set), tgt) for p in plans]
    results = []
    for tokenized, detokenized in outputs:
        bleu = ev.compute_metric(metric, detokenized, refs)
        tok = ev.tokenized_bleu(tokenized, tok_refs)
        chrf = ev.chrf(detokenized, refs)
        results.append({"bleu": bleu.score, "tok_bleu": tok.score, "chrf": chrf.score, "signature": bleu.signature,
                        "tok_bleu_signature": tok.signature, "chrf_signature": chrf.signature,
                        "p_value": None, "marker": None})
    configs = [p.row.config for p in plans]
    tested = [(index, against) for index, against in enumerate(compared_row(configs, i) for i in range(len(plans)))
              if against != index]
    for index, against in tested:
        test = ev.paired_bootstrap(outputs[against][1], outputs[index][1], refs, metric=metric,
                                   n_samples=BOOTSTRAP_SAMPLES, seed=BOOTSTRAP_SEED)
        results[index].update(p_value=test.p_value, marker=test.marker, compared_with=plans[against].row.label)
    if by_length:
        sources = [line.replace("@@ ", "").removesuffix("@@") for line in
                   ev.read_hypotheses(DATA / task / f"{prefix}.bpe.{src}", "test source")]
        for index, against in tested:
            comparisons = ev.compare_by_length(outputs[against][1], outputs[index][1], refs, sources, CLAUSE_BUCKETS,
                                               metric, n_samples=BOOTSTRAP_SAMPLES, seed=BOOTSTRAP_SEED)
            results[index]["by_length"] = [asdict(c) for c in comparisons]
    return results


# ---------------------------------------------------------------- Training curves


def parse_train_log(text):
    """``{"train": {"step", "acc", "ppl", "xent"}, "valid": {"step", "acc", "ppl"}}`` (lists) of a ``train.log``
    text, read by :mod:`onmt_ext.train_log`."""
    from onmt_ext import train_log

    log = train_log.parse(text)
    return {"train": {"step": [r.step for r in log.steps], **{key: [getattr(r, key) for r in log.steps]
                                                              for key in ("acc", "ppl", "xent")}},
            "valid": {"step": [r.step for r in log.valid], **{key: [getattr(r, key) for r in log.valid]
                                                              for key in ("acc", "ppl")}}}


def thin_curve(curve, limit=CURVE_POINTS):
    """A columnar curve (``{"step": [...], ...}``) cut down to at most ``limit`` evenly spaced points, the last kept."""
    count = len(curve["step"])
    if count <= limit:
        return curve
    stride = math.ceil(count / limit)
    keep = list(range(count - 1, -1, -stride))[::-1]
    return {key: [values[i] for i in keep] for key, values in curve.items()}


def read_curves(log_file):
    """The curves of :func:`parse_train_log` for a ``train.log`` (training points thinned), None if it is missing."""
    path = Path(log_file)
    if not path.exists():
        return None
    curves = parse_train_log(path.read_text(encoding="utf-8", errors="replace"))
    return {"train": thin_curve(curves["train"]), "valid": curves["valid"]}


def plot_curves(rows, path, title=""):
    """Training and validation perplexity (left) and validation accuracy (right) of the rows' ``curves`` to
    ``path``; False when no row has any point."""
    shown = [(row["label"], row["curves"]) for row in rows
             if row.get("curves") and (row["curves"]["train"]["step"] or row["curves"]["valid"]["step"])]
    if not shown:
        return False
    from matplotlib.lines import Line2D

    plt = common.pyplot()

    fig, (ppl_ax, acc_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    for index, (label, curves) in enumerate(shown):
        colour = f"C{index % 10}"
        train, valid = curves["train"], curves["valid"]
        ppl_ax.plot(train["step"], train["ppl"], color=colour, linewidth=0.8, alpha=0.6)
        ppl_ax.plot(valid["step"], valid["ppl"], color=colour, marker="o", markersize=3, linestyle="--")
        acc_ax.plot(valid["step"], valid["acc"], color=colour, marker="o", markersize=3, label=label)
    ppl_ax.set_yscale("log")
    ppl_ax.set_xlabel("step")
    ppl_ax.set_ylabel("perplexity")
    ppl_ax.legend(handles=[Line2D([], [], color="grey", linewidth=0.8, label="training"),
                           Line2D([], [], color="grey", marker="o", markersize=3, linestyle="--", label="validation")],
                  fontsize="small")
    acc_ax.set_xlabel("step")
    acc_ax.set_ylabel("validation accuracy (%)")
    acc_ax.legend(fontsize="x-small")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


# ---------------------------------------------------------------- Report

def row_results(plans, scores, more_scores=()):
    """The result dicts of scored rows: identity, :func:`score`'s ``scores``, how the model was made, and
    ``test_sets`` (``{label: {"paper_bleu", <scores>, "hypotheses"}}``) from ``more_scores``, one per further set."""
    rows = []
    labels = [label for label, _ in test_sets(plans[0].task)] if plans else []
    for index, (p, result) in enumerate(zip(plans, scores)):
        row = {"label": p.row.label, "config": p.row.config, "overrides": [str(o) for o in p.row.overrides],
               "paper_bleu": p.row.paper_bleu, **result, "model": str(p.model),
               "checkpoints": [str(c) for c in p.checkpoints], "averaged": len(p.checkpoints),
               "train_steps": p.train_steps, "hypotheses": str(p.hypotheses),
               "train_log": str(p.run_dir / "train.log"), "curves": read_curves(p.run_dir / "train.log")}
        if more_scores:
            paper = p.row.paper_more or (None,) * len(more_scores)
            row["test_sets"] = {label: {"paper_bleu": bleu, **more[index], "hypotheses": str(p.hypotheses_of(number))}
                                for number, (label, bleu, more) in enumerate(zip(labels[1:], paper, more_scores),
                                                                             start=1)}
        rows.append(row)
    return rows


def _number_cell(value):
    """A score for the Markdown table: two decimals, or n/a."""
    return "n/a" if value is None else f"{value:.2f}"


def _by_length_plot_name(table, task, row):
    """The file name of a row's by-length plot: ``<table>.<config name after the task>.by_length.png``."""
    return f"{table}.{Path(row['config']).stem.split(f'_{task}_', 1)[-1]}.by_length.png"


def _by_length_section(table, task, rows, out_dir):
    """Markdown lines of the by-length comparison of every tested row against its reference row, drawing each plot."""
    from onmt_ext import evaluation as ev

    lines = ["", f"{_metric(LANGS[task][1])} by source length (words of the BPE-free source), vs. the first row "
                 "of the same model size (paired bootstrap per bucket; † p < 0.05, ‡ p < 0.01)", ""]
    configs = [row["config"] for row in rows]
    for index, row in enumerate(rows):
        if not row.get("by_length"):
            continue
        against = rows[compared_row(configs, index)]["label"]
        comparisons = [ev.LengthComparison(**{**c, "bootstrap": ev.BootstrapResult(**c["bootstrap"])
                                              if c["bootstrap"] else None}) for c in row["by_length"]]
        plot = _by_length_plot_name(table, task, row)
        ev.plot_by_length(comparisons, out_dir / plot, f"{table}: {row['label']} vs {against}", (against, row["label"]))
        lines += [f"{row['label']} vs {against} (plot: [{plot}]({plot}))", "",
                  "| source length | segments | reference row | this row | delta | p |",
                  "|---|---:|---:|---:|---:|---:|"]
        for c in comparisons:
            t = c.bootstrap
            lines.append(f"| {c.label} | 0 | | | | |" if t is None else
                         f"| {c.label} | {c.count} | {t.baseline_score:.2f} | {t.system_score:.2f} | "
                         f"{t.delta:+.2f} | {t.p_value:.3f} {t.marker} |")
        lines.append("")
    return lines


def report_markdown(table, task, rows, curves_file=None, data=None):
    """The Markdown lines of result rows (by-length section apart): one table per test set, the paper's BLEU
    beside ours in its own metric (:func:`paper_metric`), headed by the training ``data`` (ours, the paper's)."""
    tgt = LANGS[task][1]
    metric_key, metric_name = paper_metric(table, task)
    data = data or {}
    lines = [f"Training data: ours: {data.get('ours') or 'not recorded'}; the paper's: "
             f"{data.get('paper') or 'not stated'}.", "",
             f"ours - paper: {metric_name}, the paper's own metric, against the paper's BLEU.  sacreBLEU: "
             f"case-sensitive, {'zh' if tgt == 'zh' else '13a'} tokenizer on detokenized text (signature below); "
             "tok. BLEU: tokenize='none' on the tokenized text.", ""]
    for index, (label, _) in enumerate(test_sets(task)):
        views = rows if index == 0 else [{**row, **row.get("test_sets", {}).get(label, {})} for row in rows]
        if index and not all(label in row.get("test_sets", {}) for row in rows):
            continue  # a results JSON from before the further test sets were scored
        lines += [*([""] if index else []),
                  f"{table}: BLEU on {task} {label} (case-sensitive, {'zh' if tgt == 'zh' else '13a'} tokenizer; "
                  "p from paired bootstrap vs. the first row of the same model size; † p < 0.05, ‡ p < 0.01)", ""]
        lines += _bleu_table(views, metric_key)
    if rows and rows[0].get("signature"):
        lines.append(f"\nsacreBLEU signature: {rows[0]['signature']}")
    if curves_file is not None:
        lines += ["", f"Training curves: ![training and validation curves]({curves_file})"]
    return lines


def _bleu_table(rows, metric_key="bleu"):
    """The Markdown table lines of the rows' scores on one test set; "ours - paper" compares the paper's BLEU
    with the row's ``metric_key`` score (the paper's own metric, :func:`paper_metric`)."""
    lines = ["| row | config | paper BLEU | ours, paper's metric | ours - paper | sacreBLEU | tok. BLEU | chrF | p | "
             "model |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for row in rows:
        config = " ".join([f"`{row['config']}`", *(f"`{o}`" for o in row.get("overrides") or ())])
        paper, ours = row.get("paper_bleu"), row[metric_key]
        delta = "" if paper is None else f"{ours - paper:+.2f}"
        p = "" if row.get("p_value") is None else f"{row['p_value']:.3f} {row.get('marker') or ''}".rstrip()
        averaged = row.get("averaged")
        model = ("" if averaged is None else f"last {averaged} checkpoints averaged" if averaged > 1
                 else "last checkpoint")
        if row.get("train_steps") is not None:
            model += f"{', ' if model else ''}{row['train_steps']} steps"
        lines.append(f"| {row['label']} | {config} | {_number_cell(paper)} | {ours:.2f} | {delta} | "
                     f"{row['bleu']:.2f} | {row['tok_bleu']:.2f} | {_number_cell(row.get('chrf'))} | {p} | {model} |")
    return lines


def write_report(table, task, rows, out_dir, commands=(), data=None):
    """Write ``<table>.json``, ``<table>.md``, ``<table>.curves.png`` (when a row has curves) and by-length
    plots for the rows (as :func:`row_results` makes them; ``label``, ``config``, ``paper_bleu``, ``bleu`` and
    ``tok_bleu`` required) to ``out_dir``; returns the paths by kind.  ``commands``: the steps' shell lines."""
    paper = table.split("-", 1)[0]
    data = data or {"ours": training_data(task), "paper": paper_data(table, task)}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = [dict(row) for row in rows]
    written = {"json": out_dir / f"{table}.json", "md": out_dir / f"{table}.md"}
    curves = out_dir / f"{table}.curves.png"
    if plot_curves(rows, curves, f"{table}: training curves"):
        written["curves"] = curves
    lines = report_markdown(table, task, rows, curves.name if "curves" in written else None, data)
    if any(row.get("by_length") for row in rows):
        lines += _by_length_section(table, task, rows, out_dir)
        written["by_length"] = [out_dir / _by_length_plot_name(table, task, row) for row in rows
                                if row.get("by_length")]
    metric_key, metric_name = paper_metric(table, task)
    document = {"table": table, "paper": paper, "task": task, "metric": _metric(LANGS[task][1]),
                "paper_metric": {"score": metric_key, "name": metric_name}, "training_data": data,
                "significance": f"paired bootstrap against the first row of the same model size (Base or Big), "
                                f"{BOOTSTRAP_SAMPLES} resamples, "
                                f"seed {BOOTSTRAP_SEED}",
                "rows": rows, "commands": list(commands)}
    written["json"].write_text(_json_text(document), encoding="utf-8")
    written["md"].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return written


def _json_text(document):
    """``document`` as indented JSON with every list of plain values (curve points, paths) on one line."""
    text = json.dumps(document, indent=1, ensure_ascii=False)

    def one_line(match):  # JSON strings hold no raw newline, so joining the lines of a list changes no value
        return "[" + re.sub(r"\s*\n\s*", " ", match.group(0)[1:-1]).strip() + "]"

    return re.sub(r"\[[^\[\]{}]*\]", one_line, text) + "\n"


def load_results(path, table):
    """The ``(rows, commands, training data or None)`` of a results JSON of ``table`` (as :func:`write_report`
    writes it, or a bare list of rows); SystemExit when its table, row labels or scores do not fit the table."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SystemExit(f"reproduce.py: cannot read the results JSON {path}: {exc}") from None
    if isinstance(document, list):
        document = {"rows": document}
    if document.get("table", table) != table:
        raise SystemExit(f"reproduce.py: {path} holds the results of {document['table']}, not {table}")
    labels = [row.get("label") for row in document.get("rows", [])]
    expected = [row.label for row in TABLES[table]]
    if labels != expected:
        raise SystemExit(f"reproduce.py: the rows of {path} ({labels}) are not those of {table} ({expected})")
    for row in document["rows"]:
        missing = [key for key in ("config", "bleu", "tok_bleu") if row.get(key) is None]
        missing += [f"{key} on {name}" for name, scores in (row.get("test_sets") or {}).items()
                    for key in ("bleu", "tok_bleu") if scores.get(key) is None]
        if missing:
            raise SystemExit(f"reproduce.py: row {row['label']!r} of {path} has no {', '.join(missing)}")
    return document["rows"], document.get("commands", []), document.get("training_data")


def _show(path):
    """A path relative to the repository when it is inside it."""
    path = Path(path)
    try:
        return path.resolve().relative_to(REPO)
    except ValueError:
        return path


def _dry_run_notes(table, plans, task, out_dir):
    """The ``# score:`` and ``# report:`` lines of a dry run."""
    src, tgt = LANGS[task]
    lines = []
    configs = [p.row.config for p in plans]
    references = [compared_row(configs, index) for index in range(len(plans))]
    for number, (_, prefix) in enumerate(test_sets(task)):
        refs = ", ".join(map(str, _reference_files(task, f"{prefix}.{tgt}")))
        tok_refs = ", ".join(map(str, _reference_files(task, f"{prefix}.tok.{tgt}")))
        for index, (p, reference) in enumerate(zip(plans, references)):
            against = ("" if reference == index else f"; paired bootstrap against {plans[reference].row.label} "
                                                      f"({plans[reference].hypotheses_of(number)})")
            if against and number == 0 and table.startswith("clause-"):
                against += f"; by source length ({DATA / task / f'test.bpe.{src}'})"
            lines.append(f"# score: {p.row.label}: {p.hypotheses_of(number)} (BPE removed, detokenized) with "
                         f"{_metric(tgt)} and chrF against {refs}, tok. BLEU against {tok_refs}{against}")
    base = _show(out_dir) / table
    lines.append(f"# report: {base}.json, {base}.md, {base}.curves.png (curves from "
                 f"{', '.join(str(p.run_dir / 'train.log') for p in plans)})"
                 + (f", {base}.<row>.by_length.png" if table.startswith("clause-") else ""))
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("table", nargs="?", choices=sorted(TABLES))
    parser.add_argument("--gpus", default="0",
                        help="comma-separated CUDA device ids to train on, e.g. 0,1,2,3 (default 0); their number "
                             "must divide each config's accum_count; 'cpu' runs on the CPU")
    parser.add_argument("--passes", type=int, default=None,
                        help="batches per update on each GPU (default: the config's accum_count over the GPUs); "
                             "fewer, larger batches with the same tokens per update, as GPU memory allows")
    parser.add_argument("--average", type=common.at_least(1), default=AVERAGE,
                        help=f"average the last N checkpoints and translate with the average (default {AVERAGE}; "
                             "1: translate the last checkpoint)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the commands (with --preflight: the failed checks as warnings); run nothing")
    parser.add_argument("--rules", type=Path, metavar="FILE",
                        help="write the Makefile of the table's steps to FILE (make reproduce-<table> runs it)")
    parser.add_argument("--report-only", action="store_true",
                        help="only rewrite the report from a results JSON (no training, translation or scoring)")
    parser.add_argument("--results-json", type=Path,
                        help="with --report-only: the results JSON to report (default: the table's own)")
    parser.add_argument("--results-dir", type=Path,
                        help="where results/<paper>/<task>/ goes instead of the repository's results/")
    parser.add_argument("--small-data", action="store_true",
                        help="the WMT17 Zh-En table trains on News Commentary v12 alone, on purpose (make's "
                             "WMT17_SMALL_DATA=1, which the data step reads); without it the data step downloads "
                             "the full corpus")
    parser.add_argument("--preflight", action="store_true",
                        help="only check the CUDA devices and the corpus (make runs this before preparing data)")
    parser.add_argument("--list", action="store_true", help="list the tables")
    parser.add_argument("--task", action="store_true", help="print the table's task (its build/data/ directory)")
    args = parser.parse_args(argv)
    if args.list or not args.table:
        for name, rows in TABLES.items():
            print(f"{name}: " + "; ".join(row.label for row in rows))
        return 0
    if args.task:
        print(table_task(args.table))
        return 0
    try:
        gpus = parse_gpus(args.gpus)
    except ValueError as exc:
        parser.error(f"--gpus: {exc}")
    if args.results_json is not None and not args.report_only:
        parser.error("--results-json goes with --report-only")
    root = None if args.results_dir is None else args.results_dir.resolve()
    rules = None if args.rules is None else args.rules.resolve()
    results_json = None if args.results_json is None else args.results_json.resolve()
    os.chdir(REPO)
    table, rows = args.table, TABLES[args.table]
    task = table_task(table)
    out_dir = results_dir(table, root)
    if args.preflight:  # the options against every row's config, then the devices and the corpus
        for row in rows:
            plan(row, gpus, args.average, args.passes)
        preflight(table, gpus, args.small_data, args.dry_run)
        return 0
    if args.report_only:
        source = results_json or out_dir / f"{table}.json"
        rows_done, commands, data = load_results(source, table)
        data = data or {"ours": f"not recorded in {_show(source)}", "paper": paper_data(table, task)}
    else:
        plans = [plan(row, gpus, args.average, args.passes) for row in rows]
        if rules:
            rules.parent.mkdir(parents=True, exist_ok=True)
            rules.write_text(make_rules(table, plans, gpus), encoding="utf-8")
            return 0
        commands = [shell_line(command, gpus) for p in plans for command in p.commands]
        if args.dry_run:
            print("\n".join(commands + _dry_run_notes(table, plans, task, out_dir)))
            return 0
        clause = table.startswith("clause-")  # the paper's claim is about long sentences (Tables 6-9)
        from onmt_ext.evaluation import EvaluationError

        try:
            more = [score(plans, task, test_set=index) for index in range(1, len(test_sets(task)))]
            rows_done = row_results(plans, score(plans, task, by_length=clause), more)
        except EvaluationError as exc:
            raise SystemExit(f"reproduce.py: {exc} (`make reproduce-{table}` trains and translates first)") from None
        data = None
    written = write_report(table, task, rows_done, out_dir, commands, data)
    print(written["md"].read_text(encoding="utf-8"))
    print(f"written: {', '.join(str(_show(path)) for kind, path in written.items() if kind != 'by_length')}"
          + "".join(f", {_show(path)}" for path in written.get("by_length", [])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
