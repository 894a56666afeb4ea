#!/usr/bin/env python
"""Reproduce a paper table: train every row's config, translate the test set, score, compare.

Usage::

    python tools/reproduce.py TABLE [--gpus 1] [--dry-run]
    python tools/reproduce.py --list

``TABLE`` is one of ``TABLES`` (e.g. ``li2019-table3``); ``make
reproduce-<TABLE>`` calls this.  For each row, in order, and skipping what is
already on disk:

1. ``onmt_train -config <row config>`` on ``--gpus`` GPUs, with the
   config's ``accum_count`` divided by the number of GPUs, so that every
   update sees the paper's batch whatever the GPU count (the configs hold the
   one-GPU equivalent: li2019's 8 GPUs x 4096 tokens are 4096 x 8);
2. ``onmt_translate`` of the test set with the last checkpoint (beam 4,
   length penalty alpha 0.6, as Vaswani et al. 2017, which the papers follow);
3. BPE removed (``@@ ``), the output detokenized with sacremoses, and scored
   with sacreBLEU: case-sensitive NIST-style BLEU (13a) against the
   detokenized reference, ``multi-bleu.perl``-equivalent BLEU on the
   tokenized text, and a paired bootstrap test (1000 samples) against the
   table's baseline row.

The table is printed beside the paper's BLEU and written to
``build/runs/<TABLE>.md``.  Data layout expected under
``build/data/<task>/``: ``{train,valid,test}.bpe.<lang>`` (BPE-segmented,
Moses-tokenized), ``test.tok.<tgt>`` (tokenized reference) and
``test.<tgt>`` (detokenized reference).  ``--dry-run`` prints the commands
and checks the configs without needing data or GPUs.
"""

import argparse
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUNS = Path("build/runs")  # relative to REPO, the working directory of main()
DATA = Path("build/data")
LANGS = {"wmt14_ende": ("en", "de"), "wmt17_zhen": ("zh", "en"), "nist_zhen": ("zh", "en")}


@dataclass(frozen=True)
class TableRow:
    label: str
    config: str  # under yaml_configs/
    paper_bleu: float


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


TABLES = {**_li2019_tables(), **_cao2019_tables()}


def _config_values(config):
    import yaml

    return yaml.safe_load((REPO / "yaml_configs" / config).read_text(encoding="utf-8"))


def plan(row, gpus):
    """Paths and commands of one row: ``(run_dir, checkpoint, task, commands)``."""
    values = _config_values(row.config)
    run_dir = Path(values["save_model"]).parent
    checkpoint = Path(f"{values['save_model']}_step_{values['train_steps']}.pt")
    task = next((t for t in LANGS if t in Path(row.config).stem), None)
    if task is None:
        raise SystemExit(f"reproduce.py: cannot tell the task of {row.config}")
    src, _ = LANGS[task]
    accum_total = values.get("accum_count", [1])[0]
    if accum_total % gpus:
        raise SystemExit(f"reproduce.py: --gpus {gpus} does not divide accum_count {accum_total} of {row.config}, "
                         "so the paper's batch cannot be kept")
    accum = accum_total // gpus
    train = ["onmt_train", "-config", f"yaml_configs/{row.config}", "-world_size", gpus,
             "-gpu_ranks", *range(gpus), "-accum_count", accum, "-log_file", run_dir / "train.log"]
    translate = ["onmt_translate", "-model", checkpoint, "-src", DATA / task / f"test.bpe.{src}",
                 "-output", run_dir / "test.hyp.bpe", "-beam_size", 4, "-length_penalty", "wu", "-alpha", 0.6,
                 "-batch_size", 4096, "-batch_type", "tokens", "-gpu", 0, "-log_file", run_dir / "translate.log"]
    return run_dir, checkpoint, task, [[str(part) for part in train], [str(part) for part in translate]]


def _postprocess(bpe_file, lang):
    """BPE removed (tokenized text) and detokenized text of an ``onmt_translate`` output."""
    from sacremoses import MosesDetokenizer

    detok = MosesDetokenizer(lang=lang)
    tokenized = [line.replace("@@ ", "").removesuffix("@@") for line in
                 bpe_file.read_text(encoding="utf-8").splitlines()]
    return tokenized, [detok.detokenize(line.split()) for line in tokenized]


def score(rows_done, task):
    """Per row: NIST BLEU, tokenized BLEU and the bootstrap p-value against the first row."""
    sys.path.insert(0, str(REPO))
    from onmt_ext import evaluation as ev

    _, tgt = LANGS[task]
    refs = ev.read_references([DATA / task / f"test.{tgt}"])
    tok_refs = ev.read_references([DATA / task / f"test.tok.{tgt}"])
    outputs = [_postprocess(run_dir / "test.hyp.bpe", tgt) for run_dir in rows_done]
    results = []
    for tokenized, detokenized in outputs:
        nist = ev.nist_bleu(detokenized, refs)
        tok = ev.tokenized_bleu(tokenized, tok_refs)
        results.append({"bleu": nist.score, "tok_bleu": tok.score, "signature": nist.signature})
    base_detok = outputs[0][1]
    for result, (_, detokenized) in zip(results[1:], outputs[1:]):
        test = ev.paired_bootstrap(base_detok, detokenized, refs, metric="bleu")
        result["p_value"], result["marker"] = test.p_value, test.marker
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("table", nargs="?", choices=sorted(TABLES))
    parser.add_argument("--gpus", type=int, default=1,
                        help="GPUs to train on; must divide each config's accum_count")
    parser.add_argument("--dry-run", action="store_true", help="print the commands; run nothing")
    parser.add_argument("--list", action="store_true", help="list the tables")
    args = parser.parse_args(argv)
    if args.list or not args.table:
        for name, rows in TABLES.items():
            print(f"{name}: " + "; ".join(row.label for row in rows))
        return 0
    if args.gpus < 1:
        parser.error("--gpus must be >= 1")
    os.chdir(REPO)
    rows = TABLES[args.table]
    plans = [plan(row, args.gpus) for row in rows]
    tasks = {task for _, _, task, _ in plans}
    bin_dir = Path(sys.executable).parent
    for run_dir, checkpoint, task, commands in plans:
        for command in commands:
            if args.dry_run:
                print(shlex.join(command))
                continue
            if command[0] == "onmt_train" and checkpoint.exists():
                continue
            if command[0] == "onmt_translate" and (run_dir / "test.hyp.bpe").exists():
                continue
            for needed in (DATA / task / f"train.bpe.{LANGS[task][0]}", DATA / task / f"test.{LANGS[task][1]}"):
                if not needed.exists():
                    raise SystemExit(f"reproduce.py: {needed} is missing; prepare build/data/{task}/ "
                                     "first (see the module docstring for the files it must hold)")
            run_dir.mkdir(parents=True, exist_ok=True)
            subprocess.run([str(bin_dir / command[0]), *command[1:]], check=True)
    if args.dry_run:
        return 0
    [task] = tasks
    results = score([run_dir for run_dir, _, _, _ in plans], task)
    lines = [f"{args.table}: BLEU on {task} test (case-sensitive, 13a; p from paired bootstrap vs. row 1)", "",
             "| row | config | paper BLEU | BLEU | tok. BLEU | p |", "|---|---|---:|---:|---:|---:|"]
    for row, result in zip(rows, results):
        p = f"{result['p_value']:.3f} {result['marker']}" if "p_value" in result else ""
        lines.append(f"| {row.label} | `{row.config}` | {row.paper_bleu:.2f} | {result['bleu']:.2f} | "
                     f"{result['tok_bleu']:.2f} | {p} |")
    lines.append(f"\nsacreBLEU signature: {results[0]['signature']}")
    text = "\n".join(lines) + "\n"
    (RUNS / f"{args.table}.md").write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
