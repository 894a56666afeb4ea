#!/usr/bin/env python
"""Reproduce a paper table: train every row's config, average its last checkpoints, translate, score, report.

``make reproduce-TABLE`` runs it: ``--preflight``, then ``--rules FILE`` (a Makefile of the rows' steps, which
make runs), then the scoring and report.  Usage::

    python -m tools.reproduce TABLE (--preflight | --rules FILE | --dry-run) [--gpus 0,1,2,3] [--average 5]
        [--nodes 2 --node-rank R --master-ip IP [--master-port PORT]]   # one of two machines
    python -m tools.reproduce TABLE [--gpus ...] [--average 5] [--results-dir DIR]   # score and report
    python -m tools.reproduce TABLE --report-only [--results-json FILE] [--results-dir DIR]
    python -m tools.reproduce --list

How it works and why: docs/tools.md (reproduce.py).
"""

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

from tools import common
from tools.prepare_data import TASKS as DATA_TASKS  # the tasks `make data-<task>` prepares

REPO = common.REPO
DATA = Path("build/data")  # relative to REPO, the working directory of main()
#: Where the rows' training corpora are kept binarised (onmt_train -ext_binarized_cache; --from-text: not at all).
BINARIZED = Path("build/binarized")
RESULTS = REPO / "results"

#: (source, target) language of every task, as prepared by tools/prepare_data.py.
LANGS = {name: (task.src, task.tgt) for name, task in DATA_TASKS.items()}
#: Length buckets (source words) of the by-length report of the clause tables (the paper's Tables 6-9 compare
#: short, relatively short, relatively long and long sentences without giving bounds; these are ours).
CLAUSE_BUCKETS = (10, 20, 30, 40)
#: OpenNMT-py's ``-timeout`` (seconds) on several nodes: how long one node's ranks wait for the other's, at the
#: start of each row's training and in each collective.  OpenNMT-py's 60 s would end a row whose ranks start
#: minutes apart (a node still binarising or averaging); a dead node is noticed this much later.
NODE_TIMEOUT = 1800
#: Checkpoints averaged unless ``--average`` says otherwise.
AVERAGE = 5
#: OpenNMT-py's defaults (onmt/opts.py) of the checkpoint options, for a config that leaves them out.
ONMT_CHECKPOINT_DEFAULTS = {"save_checkpoint_steps": 5000, "keep_checkpoint": -1}
#: Bootstrap resamples and seed of the significance test (onmt_ext.integration.evaluation's defaults).
BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED = 1000, 12345
#: At most this many training points per row are kept in the results JSON (the validation points all are).
CURVE_POINTS = 500
#: The BLEU each paper reports, which the "ours - paper" column uses: (key of a scored row, description); ``bleu``
#: is sacreBLEU on the detokenized text (13a, or zh for Chinese), ``tok_bleu`` tokenize='none' on the tokenized text.
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
#: The significance test each paper names, where it is not the paired bootstrap of the reports (which is computed
#: in the paper's own metric, :func:`paper_metric`, so that its marks are comparable with the paper's).
PAPER_TESTS = {
    "li2019": "bootstrap resampling (Koehn 2004), marks at p < 0.05 / 0.01: the same test",
    "cao2019": "not named; marks at p < 0.05 / 0.01",
    "chen2019": "Collins et al. (2005), a sign test over the test sentences, marks at p < 0.01: not the bootstrap",
    "clause": "\"samples\" on English-Chinese only, not otherwise described",
    "gret": "none named in our copy of the paper",
}
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


def _rows(prefix, entries):
    """The rows of ``(label, suffix, paper BLEU)`` entries, each training ``<prefix>_<suffix>.yaml``; a tuple of BLEU
    scores has one per test set (TEST_SETS)."""
    rows = []
    for label, suffix, bleu in entries:
        config = f"{prefix}_{suffix}.yaml"
        first, *more = bleu if isinstance(bleu, tuple) else (bleu,)
        rows.append(TableRow(label, config, first, paper_more=tuple(more)))
    return tuple(rows)


def _chen2019_figure2(layout):
    """chen2019's Figure 2 for ``layout``: BLEU against d_r, over whole heads of Transformer-Base (64).  Its values
    are not legible in our copy; sec. 5.2 gives the peaks (320 for RPEHead, 256 for MPRHead)."""
    config = f"chen2019/transformer_base_wmt14_ende_{layout}.yaml"
    return (TableRow("Transformer-Base", "chen2019/transformer_base_wmt14_ende_baseline.yaml", 27.25),) + tuple(
        TableRow(f"{layout} d_r = {dim}", config, None, ("-chen2019_dim", dim)) for dim in range(64, 512, 64))


_GRET_MAIN = (("Transformer", "baseline", None), ("+ GRET", "gret", None))
#: The rows of every table, named ``<paper>-<table>``; a row is tested against the first one of its model size.
TABLES = {
    "li2019-table2": _rows("li2019/transformer_base_wmt14_ende", (
        ("2 baseline (concat + linear)", "baseline", 27.31), ("3 simple routing, enc-self", "simple_enc_self", 27.98),
        ("4 EM routing, enc-self", "em_enc_self", 28.28), ("5 EM routing, enc-dec", "em_enc_dec", 27.94),
        ("6 EM routing, dec-self", "em_dec_self", 28.15),
        ("7 EM routing, enc-self + dec-self", "em_enc_self_dec_self", 28.45),
        ("8 EM routing, all three", "em_all", 28.47),
    )),
    "li2019-table3": _rows("li2019/transformer_base_wmt14_ende", (
        ("1 none", "baseline", 27.31), ("2 [1-6]", "em_enc_self", 28.28), ("3 [4-6]", "em_enc_self_layers_4-6", 28.26),
        ("4 [1-3]", "em_enc_self_layers_1-3", 28.27), ("5 [1,2]", "em_enc_self_layers_1-2", 28.26),
        ("6 [6]", "em_enc_self_layers_6", 27.68), ("7 [1]", "em_enc_self_layers_1", 27.75),
    )),
    "li2019-table4-wmt14_ende": _rows("li2019/transformer_base_wmt14_ende", (
        ("Transformer-Base", "baseline", 27.31), ("+ Effective Aggregation", "em_enc_self_layers_1-2", 28.26),
    )) + _rows("li2019/transformer_big_wmt14_ende", (
        ("Transformer-Big", "baseline", 28.58), ("+ Effective Aggregation", "em_enc_self_layers_1-2", 28.96))),
    "li2019-table4-wmt17_zhen": _rows("li2019/transformer_base_wmt17_zhen", (
        ("Transformer-Base", "baseline", 24.13), ("+ Effective Aggregation", "em_enc_self_layers_1-2", 24.68),
    )) + _rows("li2019/transformer_big_wmt17_zhen", (
        ("Transformer-Big", "baseline", 24.56), ("+ Effective Aggregation", "em_enc_self_layers_1-2", 25.00))),
    "cao2019-table1": _rows("cao2019/transformer_base_wmt17_zhen", (
        ("1 Transformer-Base", "baseline", 24.28), ("2 + horizontal, zero init.", "horizontal_zero", 24.76),
        ("3 + horizontal, self init.", "horizontal_self", 24.88),
        ("4 + vertical + horizontal, zero init.", "cross_zero", 25.02),
        ("5 + vertical + horizontal, self init.", "cross_self", 24.68),
    )),
    "cao2019-table2-wmt17_zhen": _rows("cao2019/transformer_base_wmt17_zhen", (
        ("Transformer-Base", "baseline", 24.28), ("+ Cross Aggregation", "cross_zero", 25.02))),
    "cao2019-table2-wmt14_ende": _rows("cao2019/transformer_base_wmt14_ende", (
        ("Transformer-Base", "baseline", 27.43), ("+ Cross Aggregation", "cross_zero", 28.04))),
    "chen2019-table1": _rows("chen2019/transformer_base_wmt14_ende", (
        ("Transformer (base)", "baseline", 27.25), ("+Relative PE", "relative_pe", 27.60),
        ("+DiSAN", "disan", 27.66), ("+RPEHead", "rpehead", 28.11), ("+MPRHead", "mprhead", 28.35),
    )) + _rows("chen2019/transformer_big_wmt14_ende", (
        ("Transformer (big)", "baseline", 28.22), ("+MPRHead", "mprhead", 29.11))),
    # BLEU on NIST02 (test.*), NIST03 and NIST04 (test_nist03.*, test_nist04.*): TEST_SETS["nist_zhen"]
    "chen2019-table2-nist_zhen": _rows("chen2019/transformer_base_nist_zhen", (
        ("Transformer (base)", "baseline", (46.62, 45.90, 45.95)),
        ("+Relative PEs", "relative_pe", (46.91, 46.47, 45.96)),
        ("+RPEHead", "rpehead", (47.06, 46.21, 46.32)), ("+MPRHead", "mprhead", (47.69, 47.27, 47.31)),
    )) + _rows("chen2019/transformer_big_nist_zhen", (
        ("Transformer (big)", "baseline", (47.88, 47.58, 47.37)), ("+MPRHead", "mprhead", (48.73, 48.61, 48.21)))),
    "chen2019-table3": _rows("chen2019/transformer_base_wmt14_ende", (
        ("Transformer (base)", "baseline", 27.25), ("- PE of Dec", "no_pe_dec", 26.73),
        ("- PE of Enc", "no_pe_enc", 10.71), ("RPEHead (base)", "rpehead", 28.11),
        ("- RPE&PE of Dec", "rpehead_no_dec", 27.54), ("- RPE&PE of Enc", "rpehead_no_enc", 11.16),
        ("MPRHead (base)", "mprhead", 28.35), ("- RPE&PE of Dec", "mprhead_no_dec", 27.74),
        ("- RPE/PE of Enc", "mprhead_no_enc", 10.89), ("- RPE&PE of Enc&Dec", "no_pe_enc_dec", 10.43),
    )),
    "chen2019-figure2-rpehead": _chen2019_figure2("rpehead"),
    "chen2019-figure2-mprhead": _chen2019_figure2("mprhead"),
    # gret: the BLEU scores of our copy of the paper are not legible (paper BLEU: n/a).  Each GRET row fine-tunes
    # from the checkpoint of the table's baseline row, which is trained first.
    **{f"gret-main-{task}": _rows(f"gret/transformer_base_{task}", _GRET_MAIN)
       for task in ("wmt14_ende", "wmt14_deen", "wmt17_zhen", "wmt16_roen")},
    "gret-ablation": _rows("gret/transformer_base_wmt14_ende", _GRET_MAIN + (
        ("GRET - capsule network", "gret_no_capsules", None), ("GRET - layer aggregation", "gret_no_layers", None),
        ("GRET - context gate", "gret_no_gate", None))),
    "gret-big": _rows("gret/transformer_big_wmt14_ende", (
        ("Transformer-Big", "baseline", None), ("+ GRET (Big)", "gret", None))),
    # clause: the BLEU columns of Tables 5 (NiuTrans en-zh), 10 (en-de) and 11 (en-vi); the "valid accuracy" column
    # is not reproduced, nor Table 5's rows of Wang et al. 2018 and Beltagy et al. 2020 (other systems).
    "clause-table5": _rows("clause/transformer_base_niutrans_enzh", (
        ("Transformer", "baseline", 39.02), ("CA with rule", "ca_rule", 39.46), ("CA with study", "ca_study", 40.03))),
    "clause-table10": _rows("clause/transformer_base_wmt16_ende", (
        ("Transformer", "baseline", 27.30), ("CA with rule", "ca_rule", 27.46), ("CA with study", "ca_study", 27.49))),
    "clause-table11": _rows("clause/transformer_base_wmt15_envi", (
        ("Transformer", "baseline", 23.03), ("CA with rule", "ca_rule", 23.34), ("CA with study", "ca_study", 24.10))),
    # not a paper: the whole chain at toy size on the shipped WMT14 sample (`make data-sample_ende`), for the CPU test
    "sample-li2019": _rows("sample/transformer_tiny_sample_ende", (
        ("toy Transformer", "baseline", None), ("+ EM routing, enc-self", "em_enc_self", None))),
}


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
    """One command of a row: a rule of :func:`make_rules`, ``output`` its target, ``inputs`` its prerequisites;
    with ``stamp`` the command writes no ``output``, which make touches once the command succeeded."""

    command: tuple
    output: Path
    inputs: tuple = ()
    stamp: bool = False


@dataclass(frozen=True)
class Nodes:
    """The machines one table trains on together: ``count`` nodes, each with the same GPUs, this one ``rank``;
    rank 0 is reached at ``ip``:``port``, writes the checkpoints, translates, scores and reports.  On node ``r``
    of ``n`` GPUs, the training ranks are ``r * n ... r * n + n - 1`` of a world of ``count * n``.  Each row of a
    table meets at a port of its own (:meth:`for_row`), so that nodes at different rows never train together."""

    count: int = 1
    rank: int = 0
    ip: str = None
    port: int = 10000

    @property
    def first(self):
        """Whether this node holds global rank 0."""
        return self.rank == 0

    def ranks(self, gpus):
        """The global ranks of this node's GPUs ``gpus``."""
        return range(self.rank * len(gpus), (self.rank + 1) * len(gpus))

    def options(self):
        """``onmt_train``'s options that meet the other nodes (none on one node)."""
        return [] if self.count == 1 else ["-master_ip", self.ip, "-master_port", self.port, "-timeout", NODE_TIMEOUT]

    def suffix(self):
        """The part of a file name that keeps this node's logs and stamps apart from another node's."""
        return "" if self.count == 1 else f".node{self.rank}"

    def log_suffix(self):
        """:meth:`suffix` of a log: none on node 0, whose ``train.log`` the report reads."""
        return "" if self.first else self.suffix()

    def for_row(self, index):
        """These nodes meeting at the port of row ``index`` of a table: ``port + index``."""
        return self if self.count == 1 else Nodes(self.count, self.rank, self.ip, self.port + index)


ONE_NODE = Nodes()


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

    @property
    def training(self):
        """The row's ``onmt_train`` step."""
        return next(step for step in self.steps if step.command[0] == "onmt_train")


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


def update_passes(values, gpus, passes, config, nodes=1):
    """``(batch_size, accum_count)`` per GPU that keeps the config's one-GPU update (``batch_size`` x
    ``accum_count``) over the GPUs ``gpus`` of each of ``nodes`` machines in ``passes`` passes each (None: the
    config's batch).

    Where the GPUs divide ``accum_count`` each GPU takes its part of the passes.  Where they do not (more GPUs
    than passes: 4 GPUs for an update of one batch), each GPU does one pass of ``1/len(gpus)`` of the update,
    which must then divide into whole batches.
    """
    accum_total, batch = values.get("accum_count", [1])[0], int(values["batch_size"])
    n_gpus = max(1, len(gpus)) * nodes
    if accum_total % n_gpus == 0:
        per_gpu = accum_total // n_gpus
        passes = per_gpu if passes is None else passes
        if passes < 1 or per_gpu % passes:
            raise SystemExit(f"reproduce.py: --passes {passes} must divide the {per_gpu} passes per GPU of one "
                             f"update (accum_count {accum_total} over {n_gpus} GPU(s))")
        return batch * (per_gpu // passes), passes
    update, unit = batch * accum_total, values.get("batch_type", "sents")
    passes = 1 if passes is None else passes
    if passes < 1 or update % (n_gpus * passes):
        where = f" on each of {nodes} nodes" if nodes > 1 else ""
        raise SystemExit(f"reproduce.py: --gpus {','.join(map(str, gpus))}{where} ({n_gpus} GPUs) does not divide "
                         f"accum_count {accum_total} of {config}, and its update of {update} {unit} does not "
                         f"divide into {n_gpus} x {passes} equal batches, so the paper's batch cannot be kept")
    return update // (n_gpus * passes), passes


def binarized_options(config, overrides=()):
    """``["-ext_binarized_cache", BINARIZED]`` for a training of ``yaml_configs/<config>`` with ``overrides``
    whose corpora can be binarised (the same batches, the transforms done once: docs/binarized-data.md), unless
    the config names binarised data itself; else ``[]`` (the study's tagger, subword sampling: from the text)."""
    from onmt_ext.integration.parsing import train_parser
    from onmt_ext.runtime import binarized

    opt, _ = train_parser().parse_known_args(["-config", str(common.CONFIGS / config), *map(str, overrides)])
    chosen = binarized.BinarizedOptions.from_opt(opt)
    if chosen.binarized or chosen.binarized_cache or binarized.config_problems(opt):
        return []
    return ["-ext_binarized_cache", BINARIZED]


def plan(row, gpus=(0,), average=AVERAGE, passes=None, binarize=True, nodes=ONE_NODE):
    """The :class:`RowPlan` of one row trained on the CUDA devices ``gpus`` with ``average`` checkpoints averaged
    (``passes``: batches per update and GPU, see :func:`update_passes`), from binarised corpora where they can be
    (:func:`binarized_options`) unless not ``binarize``.

    On several :class:`Nodes` every node binarises the row's corpora in a step before its training (a node still
    binarising when the other starts would keep it waiting) and gets the files only node 0 makes from it
    (:func:`_shared_from_node_0`); only the first averages and translates: the others train, with their own
    log, and leave a stamp instead of checkpoints (OpenNMT-py saves on global rank 0 only)."""
    from onmt_ext.mechanisms.clause.split import translate_options

    values = common.config_values(row.config)  # with the row's overrides (``("-option", value, ...)``)
    values.update((str(flag).lstrip("-"), value) for flag, value in zip(row.overrides[0::2], row.overrides[1::2]))
    save_model, sweep = Path(values["save_model"]), []
    if row.overrides:  # a sweep point: its own run directory, named after the overrides
        suffix = "_".join(str(part).lstrip("-") for part in row.overrides)
        save_model = save_model.parent.with_name(f"{save_model.parent.name}_{suffix}") / save_model.name
        sweep = ["-save_model", save_model, *row.overrides]
    run_dir, node = save_model.parent, nodes.suffix()
    task = _task_of(row.config)
    batch_size, accum_count = update_passes(values, gpus, passes, row.config, nodes.count)
    checkpoints = tuple(Path(f"{save_model}_step_{step}.pt") for step in averaged_steps(values, average, row.config))
    steps = _clause_preparation(values, task)
    cache = binarized_options(row.config, row.overrides) if binarize else []
    inputs = _training_inputs(values)
    if cache and nodes.count > 1:
        stamp = run_dir / f"binarized{node}.done"
        fresh = ["-train_from", ""] if values.get("train_from") else []  # binarising reads the data alone
        steps.append(Step(("onmt_ext_binarize", "-config", f"yaml_configs/{row.config}", *row.overrides, *fresh,
                           *cache, "-log_file", run_dir / f"binarize{nodes.log_suffix()}.log"), stamp,
                          tuple(path for path in inputs if str(path) != values.get("train_from")), stamp=True))
        inputs += (stamp,)
    if nodes.count > 1:
        steps, given = _shared_from_node_0(steps, values, nodes)
        inputs += given
    devices = ["-world_size", len(gpus) * nodes.count, "-gpu_ranks", *nodes.ranks(gpus), *nodes.options()] \
        if gpus else []
    train = ["onmt_train", "-config", f"yaml_configs/{row.config}", *devices, "-accum_count", accum_count,
             *(["-batch_size", batch_size] if batch_size != int(values["batch_size"]) else []),
             "-log_file", run_dir / f"train{nodes.log_suffix()}.log", "-overwrite_checkpoints", *sweep, *cache]
    if not nodes.first:  # trains only: no checkpoint here, a stamp once its training ended
        steps.append(Step(tuple(train), run_dir / f"train{node}.done", inputs, stamp=True))
    else:
        steps.append(Step(tuple(train), checkpoints[-1], inputs))
    model = run_dir / f"average_last{average}.pt" if average > 1 else checkpoints[-1]
    if average > 1 and nodes.first:
        steps.append(Step(("onmt_average_models", "-models", *checkpoints, "-output", model), model, checkpoints))
    for _, prefix in test_sets(task) if nodes.first else ():
        hypotheses = hypotheses_file(run_dir, prefix, model)
        test_source = source_file(task, prefix)
        log = run_dir / f"translate.{'' if prefix == 'test' else prefix + '.'}{model.stem}.log"
        translate = ["onmt_translate", "-model", model, "-src", test_source, "-output", hypotheses,
                     "-beam_size", 4, "-length_penalty", "wu", "-alpha", 0.6, "-batch_size", 4096,
                     "-batch_type", "tokens", *(["-gpu", 0] if gpus else []), "-log_file", log,
                     *translate_options(values)]  # the test source split as in training (clause attention)
        steps.append(Step(tuple(translate), hypotheses, (model, test_source)))
    steps = tuple(Step(tuple(str(part) for part in step.command), step.output, step.inputs, step.stamp)
                  for step in steps)
    return RowPlan(row, task, run_dir, int(values["train_steps"]), checkpoints, model,
                   hypotheses_file(run_dir, "test", model), steps)


def _share_step(path, nodes):
    """The step that gives ``path`` from node 0 to the others (:mod:`tools.node_share`): on node 0 its output is
    a stamp beside the file, elsewhere the file itself."""
    command = ("python", "-m", "tools.node_share", "--nodes", nodes.count, "--node-rank", nodes.rank, "--master-ip",
               nodes.ip, "--master-port", nodes.port, "--timeout", NODE_TIMEOUT, path)
    if nodes.first:
        return Step(command, path.with_name(f"{path.name}.shared{nodes.suffix()}.done"), (path,), stamp=True)
    return Step(command, path)


def _shared_from_node_0(steps, values, nodes):
    """A row's ``steps`` on one of several nodes, with the files that only node 0 makes given to the others:
    the checkpoint a row fine-tunes from (``train_from``: OpenNMT-py saves on global rank 0 alone) and the clause
    tagger (trained once, on node 0, so that every node splits its corpora alike).  Returns the steps and what
    node 0's training must wait for: its giving of them, before it trains (the others wait to receive)."""
    tagger, train_from = (Path(values[key]) if values.get(key) else None
                          for key in ("clause_tagger_model", "train_from"))
    given = []
    for path in (tagger, train_from):
        if path is None:
            continue
        share = _share_step(path, nodes)
        made = next((i for i, step in enumerate(steps) if step.output == path), None)
        if not nodes.first:  # received instead of made here (the tagger), or made nowhere else (a checkpoint)
            steps = [step for step in steps if step.output != path]
        elif made is not None:  # given before splitting with it, so that the other nodes split meanwhile
            steps = [Step(step.command, step.output, step.inputs + (share.output,)) if path in step.inputs else step
                     for step in steps]
        steps.insert(len(steps) if made is None else made + nodes.first, share)
        given += [share.output] if nodes.first else []
    return steps, tuple(given)


def source_file(task, prefix):
    """The BPE'd source side of ``task``'s data file ``prefix`` (``test``, ``test_nist03``, ``train``...)."""
    return DATA / task / f"{prefix}.bpe.{LANGS[task][0]}"


def hypotheses_file(run_dir, prefix, model):
    """Where a row's translation of the test set ``prefix`` (``test``, ``test_nist03``...) with ``model`` goes."""
    return run_dir / f"{prefix}.{model.stem}.hyp.bpe"


def _clause_preparation(values, task):
    """Steps before training a clause-attention row: the "study" tagger, then the pre-split sources."""
    if not values.get("clause_attention"):
        return []
    lang, tagger = values["clause_lang"], values.get("clause_tagger_model")
    steps = []
    if tagger:  # "CA with study": the signal-word tagger is trained first, on the training source
        source = source_file(task, "train")
        steps.append(Step(("python", "-m", "tools.train_signal_tagger", "--lang", lang, "--input", source,
                           "--output", tagger, "--max-sentences", 100000, "--overwrite"), Path(tagger), (source,)))
    if values.get("clause_presplit"):  # the sources the config reads: <file>.clause_<rule|study>
        for corpus in values["data"].values():
            split = corpus["path_src"]
            unsplit = split.rsplit(".clause_", 1)[0]
            steps.append(Step(("python", "-m", "tools.clause_split_corpus", "--lang", lang, "--levels",
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
    """One line saying why the CUDA devices ``gpus`` cannot run the table, or None (``probe``: as _cuda_devices)."""
    if not gpus:
        return None
    asked = ",".join(map(str, gpus))
    seen = (probe or _cuda_devices)(gpus)
    if isinstance(seen, str):
        return f"reproduce.py: GPUS={asked} needs torch with CUDA, but importing torch failed: {seen}"
    if seen == 0:
        return (f"reproduce.py: GPUS={asked} asks for CUDA device{'s' if len(gpus) > 1 else ''} {asked}, but "
                f"torch ({sys.executable}) sees no CUDA device; run on a machine with CUDA (a system CUDA torch: "
                "make setup SYSTEM_TORCH=1, docs/install.md), or GPUS=cpu for a toy table such as sample-li2019")
    if seen < len(gpus):
        return (f"reproduce.py: GPUS={asked} asks for {len(gpus)} CUDA devices, but torch sees only {seen} of them "
                "(`nvidia-smi -L` lists this machine's); name only devices that exist")
    return None


def corpus_problem(table, small_data=False, environ=None):
    """One line saying why a WMT17 Zh-En ``table`` cannot have the training data it asks for, or None:
    ``WMT17_EXTRA_DIR`` lacks the UN and CWMT pairs, or is set with ``small_data`` (News Commentary v12 alone)."""
    if table_task(table) != FULL_CORPUS_TASK:
        return None
    from tools.prepare_data import WMT17_EXTRA, extra_dir_missing

    extra = (os.environ if environ is None else environ).get("WMT17_EXTRA_DIR")
    if extra and small_data:
        return ("reproduce.py: WMT17_SMALL_DATA=1 trains on News Commentary v12 alone, which leaves out the pairs "
                f"WMT17_EXTRA_DIR={extra} holds: unset one of them")
    if extra and (missing := extra_dir_missing(FULL_CORPUS_TASK, extra)):
        return (f"reproduce.py: WMT17_EXTRA_DIR={extra} lacks {', '.join(missing)}: {WMT17_EXTRA}; or unset it, "
                "and make data-wmt17_zhen downloads them")
    return None


def preflight(table, gpus, small_data, dry_run):
    """The device and corpus problems of ``table``, before any data is prepared: SystemExit with one line each,
    or with ``dry_run`` warnings on stderr."""
    problems = [p for p in (device_problem(gpus), corpus_problem(table, small_data)) if p]
    if not gpus and not table.startswith("sample-"):  # GPUS=cpu: allowed, but a paper table would take months
        print(f"reproduce.py: warning: GPUS=cpu trains {table}'s paper-size models on the CPU, meant for the toy "
              "sample tables only; name CUDA device ids, e.g. GPUS=0 or GPUS=0,1", file=sys.stderr)
    if small_data and table_task(table) != FULL_CORPUS_TASK:
        print(f"reproduce.py: note: WMT17_SMALL_DATA applies to WMT17 Zh-En tables only; {table} trains on "
              f"{table_task(table)}", file=sys.stderr)
    if problems and not dry_run:
        raise SystemExit("\n".join(problems))
    for problem in problems:
        print(problem.replace("reproduce.py: ", "reproduce.py: warning: ", 1), file=sys.stderr)


def paper_metric(table, task):
    """``(key, description)`` of the BLEU the table's paper reports (:data:`PAPER_METRICS`); ``key`` names the
    score of a result row that the "ours - paper" column uses."""
    paper = table.split("-", 1)[0]
    if paper == "clause":
        return CLAUSE_METRICS.get(LANGS[task][1], UNSTATED_METRIC)
    return PAPER_METRICS.get(paper, UNSTATED_METRIC)


def paper_test(table):
    """The significance test that ``table``'s paper names (:data:`PAPER_TESTS`)."""
    return PAPER_TESTS.get(table.split("-", 1)[0], "none (not a paper)")


def paper_data(table, task):
    """The training data of ``table``'s paper on ``task`` in words (:data:`PAPER_DATA`)."""
    return PAPER_DATA.get((table.split("-", 1)[0], task), "not stated (not a paper)")


def training_data(task):
    """Our training data of ``task`` in words: its corpora and pair counts, and the pairs left after cleaning."""
    try:
        prepared = json.loads((DATA / task / "raw" / "corpora.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        prepared = None
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

def _scoring_inputs(task, by_length):
    """The data files the scoring reads: the references of every test set and, for ``by_length``, the test source."""
    paths = [path for _, prefix in test_sets(task) for files in _reference_files(task, prefix) for path in files]
    return paths + ([source_file(task, "test")] if by_length else [])


def _in_order(plans, nodes):
    """The steps of ``plans`` in the order :func:`make_rules`' rules run them: on several nodes, every row up to
    its training first."""
    if nodes.count == 1:
        return [step for p in plans for step in p.steps]
    ends = [1 + p.steps.index(p.training) for p in plans]
    return [step for p, end in zip(plans, ends) for step in p.steps[:end]] + \
        [step for p, end in zip(plans, ends) for step in p.steps[end:]]


def make_rules(table, plans, gpus, nodes=ONE_NODE):
    """The Makefile that runs the steps of ``plans`` on ``gpus`` (``make -f FILE BIN=<venv>/bin``): each step's
    output is a target with the files it reads as prerequisites, order-only for a training (and its binarising),
    so that a newer corpus never overwrites finished checkpoints.  A missing data file or a failed command stops
    make with one line.

    On several ``nodes`` every row is trained before any is averaged or translated, on each node in the same
    order, so that the nodes' ranks meet at each row's start; a node but the first only trains."""
    task = plans[0].task
    targets = [p.hypotheses_of(i) for p in plans for i in range(len(test_sets(task)))] if nodes.first else []
    first = [p.training.output for p in plans] if nodes.count > 1 else []
    sources = [source_file(task, prefix) for _, prefix in test_sets(task)]
    scoring = list(dict.fromkeys(_scoring_inputs(task, table.startswith("clause-")) + sources)) \
        if nodes.first else []  # the data read after the trainings, checked before they start
    lines = [f"# {table}: written by python -m tools.reproduce --rules for make reproduce-{table}", ".DELETE_ON_ERROR:",
             ".NOTPARALLEL:",  # one step at a time: the rows share the devices
             f"export CUDA_VISIBLE_DEVICES := {','.join(map(str, gpus))}",
             "all: " + " ".join(map(str, scoring + first + targets))]
    steps = {step.output: step for p in plans for step in p.steps}  # rows may share a step (a tagger)
    for output, step in steps.items():
        command = shlex.join(step.command).replace("$", "$$")
        log = step.command[step.command.index("-log_file") + 1] if "-log_file" in step.command else None
        needs = ("| " if step.command[0] in ("onmt_train", "onmt_ext_binarize") else "") + \
            " ".join(map(str, step.inputs))
        lines += ["", f"{output}: {needs}", f"\t@mkdir -p {output.parent}",
                  f"\t$(BIN)/{command} || {{ echo 'reproduce.py: {step.command[0]} failed; "
                  + (f"its log: {log}" if log else "its messages are above") + "' >&2; exit 1; }"]
        lines += [f"\t@touch {output}"] if step.stamp else []
    for p in plans if nodes.first else ():  # the checkpoints averaged besides the last (the training's target)
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


def _remove_bpe(lines):
    """BPE'd lines (an ``onmt_translate`` output, a test source) as the tokenized text."""
    return [line.replace("@@ ", "").removesuffix("@@") for line in lines]


def _reference_files(task, prefix):
    """The detokenized and the tokenized reference files of test set ``prefix``: ``<prefix>[.tok].<tgt>`` or, for
    multi-reference test sets (NIST), ``<prefix>[.tok].<tgt>0``, ``...1``, ..."""
    names = (f"{prefix}.{LANGS[task][1]}", f"{prefix}.tok.{LANGS[task][1]}")
    return tuple(sorted((DATA / task).glob(f"{name}[0-9]")) or [DATA / task / name] for name in names)


def score(plans, table, by_length=False, test_set=0):
    """Per row of ``table``, on test set number ``test_set``: BLEU, tokenized BLEU, chrF, their signatures and the
    paired bootstrap against :func:`compared_row`'s row in the paper's own metric (with ``by_length``, per
    :data:`CLAUSE_BUCKETS` too)."""
    from sacremoses import MosesDetokenizer

    from onmt_ext.integration import evaluation as ev

    task = table_task(table)
    tgt = LANGS[task][1]
    prefix = test_sets(task)[test_set][1]
    metric = _metric(tgt)
    refs, tok_refs = map(ev.read_references, _reference_files(task, prefix))
    tokenized = [_remove_bpe(ev.read_hypotheses(p.hypotheses_of(test_set))) for p in plans]
    detok = MosesDetokenizer(lang=tgt)
    detokenized = [[detok.detokenize(line.split()) for line in lines] for lines in tokenized]
    results = []
    for tok_lines, lines in zip(tokenized, detokenized):
        bleu = ev.compute_metric(metric, lines, refs)
        tok = ev.tokenized_bleu(tok_lines, tok_refs)
        chrf = ev.chrf(lines, refs)
        results.append({"bleu": bleu.score, "tok_bleu": tok.score, "chrf": chrf.score, "signature": bleu.signature,
                        "tok_bleu_signature": tok.signature, "chrf_signature": chrf.signature,
                        "p_value": None, "marker": None})
    sources = _remove_bpe(ev.read_hypotheses(source_file(task, prefix), "test source")) if by_length else []
    configs = [p.row.config for p in plans]
    tok = paper_metric(table, task)[0] == "tok_bleu"  # the marks in the paper's own metric
    bootstrap = {"metric": "tok-bleu" if tok else metric, "n_samples": BOOTSTRAP_SAMPLES, "seed": BOOTSTRAP_SEED}
    lines, test_refs = (tokenized, tok_refs) if tok else (detokenized, refs)
    for index, against in enumerate(compared_row(configs, i) for i in range(len(plans))):
        if against == index:
            continue
        baseline, system = lines[against], lines[index]
        test = ev.paired_bootstrap(baseline, system, test_refs, **bootstrap)
        results[index].update(p_value=test.p_value, marker=test.marker, compared_with=plans[against].row.label)
        if by_length:
            comparisons = ev.compare_by_length(baseline, system, test_refs, sources, CLAUSE_BUCKETS, **bootstrap)
            results[index]["by_length"] = [asdict(c) for c in comparisons]
    return results


# ---------------------------------------------------------------- Training curves

def parse_train_log(text):
    """``{"train": {"step", "acc", "ppl", "xent"}, "valid": {"step", "acc", "ppl"}}`` (lists) of a ``train.log``
    text, read by :mod:`onmt_ext.runtime.train_log`."""
    from onmt_ext.runtime import train_log

    log = train_log.parse(text)
    columns = {"train": (log.steps, ("step", "acc", "ppl", "xent")), "valid": (log.valid, ("step", "acc", "ppl"))}
    return {name: {key: [getattr(record, key) for record in records] for key in keys}
            for name, (records, keys) in columns.items()}


def thin_curve(curve, limit=CURVE_POINTS):
    """A columnar curve (``{"step": [...], ...}``) cut down to at most ``limit`` evenly spaced points, the last kept."""
    count = len(curve["step"])
    if count <= limit:
        return curve
    stride = math.ceil(count / limit)
    return {key: values[(count - 1) % stride::stride] for key, values in curve.items()}


def read_curves(log_file):
    """The curves of :func:`parse_train_log` for a ``train.log`` (training points thinned), None if it is missing."""
    path = Path(log_file)
    if not path.exists():
        return None
    curves = parse_train_log(path.read_text(encoding="utf-8", errors="replace"))
    return {"train": thin_curve(curves["train"]), "valid": curves["valid"]}


def plot_curves(rows, path, title):
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
    ppl_ax.set(yscale="log", xlabel="step", ylabel="perplexity")
    ppl_ax.legend(handles=[Line2D([], [], color="grey", linewidth=0.8, label="training"),
                           Line2D([], [], color="grey", marker="o", markersize=3, linestyle="--", label="validation")],
                  fontsize="small")
    acc_ax.set(xlabel="step", ylabel="validation accuracy (%)")
    acc_ax.legend(fontsize="x-small")
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
    for index, (p, result) in enumerate(zip(plans, scores)):
        row = {"label": p.row.label, "config": p.row.config, "overrides": [str(o) for o in p.row.overrides],
               "paper_bleu": p.row.paper_bleu, **result, "model": str(p.model),
               "checkpoints": [str(c) for c in p.checkpoints], "averaged": len(p.checkpoints),
               "train_steps": p.train_steps, "hypotheses": str(p.hypotheses),
               "train_log": str(p.run_dir / "train.log"), "curves": read_curves(p.run_dir / "train.log")}
        if more_scores:
            paper = p.row.paper_more or (None,) * len(more_scores)
            further = enumerate(zip(test_sets(p.task)[1:], paper, more_scores), start=1)
            row["test_sets"] = {label: {"paper_bleu": bleu, **more[index], "hypotheses": str(p.hypotheses_of(number))}
                                for number, ((label, _), bleu, more) in further}
        rows.append(row)
    return rows


def _number_cell(value):
    """A score for the Markdown table: two decimals, or n/a."""
    return "n/a" if value is None else f"{value:.2f}"


def _by_length_section(table, task, rows, out_dir):
    """Markdown lines of the by-length comparison of every tested row against its reference row, and the plots
    drawn, one a row: ``<out_dir>/<table>.<config name after the task>.by_length.png``."""
    from onmt_ext.integration import evaluation as ev

    lines = ["", f"{paper_metric(table, task)[1]} by source length (words of the BPE-free source), vs. the first "
                 "row of the same model size (paired bootstrap per bucket; † p < 0.05, ‡ p < 0.01)", ""]
    configs, plots = [row["config"] for row in rows], []
    for index, row in enumerate(rows):
        if not row.get("by_length"):
            continue
        against = rows[compared_row(configs, index)]["label"]
        comparisons = [ev.LengthComparison(**{**c, "bootstrap": ev.BootstrapResult(**c["bootstrap"])
                                              if c["bootstrap"] else None}) for c in row["by_length"]]
        plots.append(out_dir / f"{table}.{Path(row['config']).stem.split(f'_{task}_', 1)[-1]}.by_length.png")
        ev.plot_by_length(comparisons, plots[-1], f"{table}: {row['label']} vs {against}", (against, row["label"]))
        lines += [f"{row['label']} vs {against} (plot: [{plots[-1].name}]({plots[-1].name}))", "",
                  "| source length | segments | reference row | this row | delta | p |",
                  "|---|---:|---:|---:|---:|---:|"]
        for c in comparisons:
            t = c.bootstrap
            lines.append(f"| {c.label} | 0 | | | | |" if t is None else
                         f"| {c.label} | {c.count} | {t.baseline_score:.2f} | {t.system_score:.2f} | "
                         f"{t.delta:+.2f} | {t.p_value:.3f} {t.marker} |")
        lines.append("")
    return lines, plots


def report_markdown(table, task, rows, curves_file, data):
    """The Markdown lines of result rows (by-length section apart): one table per test set, the paper's BLEU
    beside ours in its own metric (:func:`paper_metric`), headed by the training ``data`` (ours, the paper's)."""
    tokenizer = "zh" if LANGS[task][1] == "zh" else "13a"
    metric_key, metric_name = paper_metric(table, task)
    lines = [f"Training data: ours: {data.get('ours') or 'not recorded'}; the paper's: "
             f"{data.get('paper') or 'not stated'}.", "",
             f"ours - paper and p: {metric_name}, the paper's own metric, against the paper's BLEU.  The paper's "
             f"significance test: {paper_test(table)}.  sacreBLEU: "
             f"case-sensitive, {tokenizer} tokenizer on detokenized text (signature below); "
             "tok. BLEU: tokenize='none' on the tokenized text.", ""]
    for index, (label, _) in enumerate(test_sets(task)):
        if index and not all(label in row.get("test_sets", {}) for row in rows):
            continue  # a results JSON from before the further test sets were scored
        lines += [*([""] if index else []),
                  f"{table}: BLEU on {task} {label} (case-sensitive, {tokenizer} tokenizer; p from paired bootstrap "
                  f"in the paper's metric vs. the first row of the same model size; † p < 0.05, ‡ p < 0.01)", "",
                  "| row | config | paper BLEU | ours, paper's metric | ours - paper | sacreBLEU | tok. BLEU | chrF "
                  "| p | model |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
        for row in rows if index == 0 else [{**row, **row["test_sets"][label]} for row in rows]:
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
                         f"{row['bleu']:.2f} | {row['tok_bleu']:.2f} | {_number_cell(row.get('chrf'))} | {p} | "
                         f"{model} |")
    if rows and rows[0].get("signature"):
        lines.append(f"\nsacreBLEU signature: {rows[0]['signature']}")
    if curves_file is not None:
        lines += ["", f"Training curves: ![training and validation curves]({curves_file})"]
    return lines


def write_report(table, task, rows, out_dir, commands=(), data=None):
    """Write ``<table>.json``, ``<table>.md``, ``<table>.curves.png`` (when a row has curves) and by-length
    plots for the rows (as :func:`row_results` makes them; ``label``, ``config``, ``paper_bleu``, ``bleu`` and
    ``tok_bleu`` required) to ``out_dir``; returns the paths by kind.  ``commands``: the steps' shell lines."""
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
        section, written["by_length"] = _by_length_section(table, task, rows, out_dir)
        lines += section
    metric_key, metric_name = paper_metric(table, task)
    document = {"table": table, "paper": table.split("-", 1)[0], "task": task, "metric": _metric(LANGS[task][1]),
                "paper_metric": {"score": metric_key, "name": metric_name}, "training_data": data,
                "significance": f"paired bootstrap in {metric_key} (the paper's metric) against the first row of the "
                                f"same model size (Base or Big), {BOOTSTRAP_SAMPLES} resamples, seed {BOOTSTRAP_SEED}",
                "paper_test": paper_test(table),
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
    resolved = Path(path).resolve()
    return resolved.relative_to(REPO) if resolved.is_relative_to(REPO) else Path(path)


def _update_note(p):
    """``# update:`` line of a dry run: a row's world size, gpu_ranks, accum_count and tokens per update."""
    train = list(p.training.command)
    values = common.config_values(p.row.config)

    def option(name, default):
        return train[train.index(name) + 1] if name in train else default

    world, accum = int(option("-world_size", 1)), int(option("-accum_count", values.get("accum_count", [1])[0]))
    batch = int(option("-batch_size", values["batch_size"]))
    after = train[train.index("-gpu_ranks") + 1:] if "-gpu_ranks" in train else []
    ranks = " ".join(after[:next((i for i, part in enumerate(after) if part.startswith("-")), len(after))]) \
        if after else "none (CPU)"
    unit = values.get("batch_type", "sents")
    return (f"# update: {p.row.label}: world_size {world}, gpu_ranks {ranks}, accum_count {accum}, batch_size "
            f"{batch} {unit}: {accum} x {world} x {batch} = {accum * world * batch} {unit} per update")


def _node_note(table, nodes, gpus):
    """The ``# nodes:`` line of a dry run on several nodes: what this node does and what the others must."""
    ranks, rows = nodes.ranks(gpus), len(TABLES[table])
    common_part = (f"# nodes: node {nodes.rank} of {nodes.count}, global ranks {ranks[0]}-{ranks[-1]} of "
                   f"{nodes.count * len(gpus)}, meeting at {nodes.ip}, ports {nodes.port}-{nodes.port + rows - 1} "
                   "(one a row); ")
    if not nodes.first:
        return common_part + ("this node only trains (no checkpoints here); node 0 averages, translates, scores "
                              "and reports")
    others = "NODE_RANK=1 on the other node" if nodes.count == 2 else \
        f"NODE_RANK=1 ... {nodes.count - 1} on the other nodes"
    return common_part + (f"prepare the data on every node first (`make data-{table_task(table)}`), then start "
                          f"`make reproduce-{table}` with the same GPUS, NODES={nodes.count}, MASTER_IP and "
                          f"MASTER_PORT and {others} within {NODE_TIMEOUT // 60} minutes")


def _dry_run_notes(table, plans, task, out_dir, nodes=ONE_NODE):
    """The ``# update:``, ``# score:`` and ``# report:`` lines of a dry run (on a node but the first: the
    ``# update:`` lines only)."""
    tgt = LANGS[task][1]
    lines, configs = [_update_note(p) for p in plans], [p.row.config for p in plans]
    if not nodes.first:
        return lines
    for number, (_, prefix) in enumerate(test_sets(task)):
        refs, tok_refs = (", ".join(map(str, files)) for files in _reference_files(task, prefix))
        for index, p in enumerate(plans):
            reference = compared_row(configs, index)
            against = ("" if reference == index else f"; paired bootstrap in {paper_metric(table, task)[0]} against "
                       f"{plans[reference].row.label} ({plans[reference].hypotheses_of(number)})")
            if against and number == 0 and table.startswith("clause-"):
                against += f"; by source length ({source_file(task, 'test')})"
            lines.append(f"# score: {p.row.label}: {p.hypotheses_of(number)} (BPE removed, detokenized) with "
                         f"{_metric(tgt)} and chrF against {refs}, tok. BLEU against {tok_refs}{against}")
    base = _show(out_dir) / table
    lines.append(f"# report: {base}.json, {base}.md, {base}.curves.png (curves from "
                 f"{', '.join(str(p.run_dir / 'train.log') for p in plans)})"
                 + (f", {base}.<row>.by_length.png" if table.startswith("clause-") else ""))
    return lines


def _nodes(parser, args, gpus):
    """The :class:`Nodes` of the options, or a one-line parser error naming the option that does not fit."""
    if args.nodes == 1:
        given = [name for name, value in (("--node-rank", args.node_rank), ("--master-ip", args.master_ip),
                                          ("--master-port", args.master_port)) if value is not None]
        if given:
            parser.error(f"{', '.join(given)} go{'es' if len(given) == 1 else ''} with --nodes above 1 "
                         "(make's NODES=2 ...)")
        return ONE_NODE
    if args.report_only:
        parser.error("--nodes goes with training, not --report-only (node 0 writes the report)")
    if not gpus:
        parser.error("--nodes needs CUDA devices (--gpus 0,1,...), not --gpus cpu")
    if args.node_rank is None:
        others = "1 on the other" if args.nodes == 2 else f"1 ... {args.nodes - 1} on the others"
        parser.error(f"--nodes {args.nodes} needs --node-rank, this machine's place: 0 on the one at --master-ip, "
                     f"{others} (make's NODE_RANK)")
    if args.node_rank >= args.nodes:
        parser.error(f"--node-rank {args.node_rank}: must be below --nodes {args.nodes} (0 to {args.nodes - 1})")
    if not args.master_ip:
        parser.error(f"--nodes {args.nodes} needs --master-ip, the address of node 0 (make's MASTER_IP)")
    port = args.master_port or Nodes.port
    last = port + len(TABLES[args.table]) - 1
    if last > 65535:
        parser.error(f"--master-port {port}: the rows of {args.table} meet at ports {port} to {last}, above 65535")
    return Nodes(args.nodes, args.node_rank, args.master_ip, port)


def main(argv=None):
    parser = common.Parser(description=__doc__.split("\n")[0])
    parser.add_argument("table", nargs="?", choices=sorted(TABLES))
    parser.add_argument("--gpus", default="0",
                        help="comma-separated CUDA device ids to train on, e.g. 0,1,2,3 (default 0); their number "
                             "must split each config's update into equal batches; 'cpu' runs on the CPU")
    parser.add_argument("--passes", type=int, default=None,
                        help="batches per update on each GPU (default: the config's accum_count over the GPUs, or 1 "
                             "where the GPUs outnumber it); fewer, larger batches with the same tokens per update, "
                             "as GPU memory allows")
    parser.add_argument("--nodes", type=common.at_least(1), default=1,
                        help="machines that train the table together, each with the GPUs --gpus (make's NODES; "
                             "default 1); every node runs the same command with its own --node-rank")
    parser.add_argument("--node-rank", type=common.at_least(0), default=None,
                        help="with --nodes above 1: this machine's place among them, 0 to nodes-1 (make's "
                             "NODE_RANK); node 0 writes the checkpoints, translates, scores and reports, the others "
                             "only train")
    parser.add_argument("--master-ip", metavar="IP",
                        help="with --nodes above 1: the address of node 0 that the others reach (make's MASTER_IP)")
    parser.add_argument("--master-port", type=common.at_least(1), default=None, metavar="PORT",
                        help="with --nodes above 1: the first of the free ports on node 0 that the rows meet at, "
                             "one a row (make's MASTER_PORT; default 10000)")
    parser.add_argument("--average", type=common.at_least(1), default=AVERAGE,
                        help=f"average the last N checkpoints and translate with the average (default {AVERAGE}; "
                             "1: translate the last checkpoint)")
    parser.add_argument("--from-text", action="store_true",
                        help=f"train from the text corpora (make's BINARIZED=0); by default the rows whose data "
                             f"allows it train from it binarised once under {BINARIZED}/ (the same batches)")
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
    nodes = _nodes(parser, args, gpus)
    root, rules, results_json = (None if path is None else path.resolve()
                                 for path in (args.results_dir, args.rules, args.results_json))
    os.chdir(REPO)  # once the paths given, relative to the caller's directory, are resolved
    table, rows = args.table, TABLES[args.table]
    task = table_task(table)
    out_dir = results_dir(table, root)
    if args.preflight:  # the options against every row's config, then the devices and the corpus
        for index, row in enumerate(rows):
            plan(row, gpus, args.average, args.passes, not args.from_text, nodes.for_row(index))
        preflight(table, gpus, args.small_data, args.dry_run)
        return 0
    if args.report_only:
        source = results_json or out_dir / f"{table}.json"
        rows_done, commands, data = load_results(source, table)
        data = data or {"ours": f"not recorded in {_show(source)}", "paper": paper_data(table, task)}
    else:
        plans = [plan(row, gpus, args.average, args.passes, not args.from_text, nodes.for_row(index))
                 for index, row in enumerate(rows)]
        if rules:
            rules.parent.mkdir(parents=True, exist_ok=True)
            rules.write_text(make_rules(table, plans, gpus, nodes), encoding="utf-8")
            return 0
        visible = ",".join(map(str, gpus))  # the shell lines that run the steps on the devices
        commands = [f"CUDA_VISIBLE_DEVICES={visible} {shlex.join(step.command)}" for step in _in_order(plans, nodes)]
        if args.dry_run:
            notes = [_node_note(table, nodes, gpus)] if nodes.count > 1 else []
            print("\n".join(commands + notes + _dry_run_notes(table, plans, task, out_dir, nodes)))
            return 0
        if not nodes.first:
            print(f"reproduce.py: node {nodes.rank} of {nodes.count} has trained the rows of {table}; node 0 "
                  f"({nodes.ip}) averages, translates, scores and writes the report")
            return 0
        clause = table.startswith("clause-")  # the paper's claim is about long sentences (Tables 6-9)
        from onmt_ext.integration.evaluation import EvaluationError

        try:
            more = [score(plans, table, test_set=index) for index in range(1, len(test_sets(task)))]
            rows_done = row_results(plans, score(plans, table, by_length=clause), more)
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
