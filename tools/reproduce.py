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
``test.<tgt>`` (detokenized reference; a multi-reference test set as
``test.<tgt>0``, ``test.<tgt>1``, ... and ``test.tok.<tgt>0``, ...).  Sweep
rows (``chen2019-figure2-*``) add command-line overrides to a config and
train into their own run directories.  ``--dry-run`` prints the commands
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
LANGS = {"wmt14_ende": ("en", "de"), "wmt14_deen": ("de", "en"), "wmt17_zhen": ("zh", "en"), "nist_zhen": ("zh", "en"),
         "wmt16_roen": ("ro", "en"), "niutrans_enzh": ("en", "zh"), "wmt16_ende": ("en", "de"),
         "wmt15_envi": ("en", "vi")}
#: Length buckets (source words) of the by-length report of the clause tables (the paper's Tables 6-9 compare
#: short, relatively short, relatively long and long sentences without giving bounds; these are ours).
CLAUSE_BUCKETS = (10, 20, 30, 40)


@dataclass(frozen=True)
class TableRow:
    """One row: a config under yaml_configs/, the paper's BLEU (None: not legible) and command-line overrides.

    A row with ``overrides`` (a sweep point) trains into its own run directory,
    the config's named after the overrides (``..._chen2019_dim_256``).
    """

    label: str
    config: str
    paper_bleu: float
    overrides: tuple = ()


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
    def rows(size, task, entries):
        return tuple(TableRow(label, f"chen2019/transformer_{size}_{task}_{suffix}.yaml", bleu)
                     for label, suffix, bleu in entries)

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
        # Table 2 reports NIST02, 03 and 04; this scores build/data/nist_zhen/test.* (one test set, e.g. NIST02)
        "chen2019-table2-nist_zhen": rows("base", "nist_zhen", (
            ("Transformer (base)", "baseline", 46.62), ("+Relative PEs", "relative_pe", 46.91),
            ("+RPEHead", "rpehead", 47.06), ("+MPRHead", "mprhead", 47.69),
        )) + rows("big", "nist_zhen", (("Transformer (big)", "baseline", 47.88), ("+MPRHead", "mprhead", 48.73))),
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


TABLES = {**_li2019_tables(), **_cao2019_tables(), **_chen2019_tables(), **_gret_tables(), **_clause_tables()}


def _config_values(config):
    import yaml

    return yaml.safe_load((REPO / "yaml_configs" / config).read_text(encoding="utf-8"))


def plan(row, gpus):
    """Paths and commands of one row: ``(run_dir, checkpoint, task, commands)``."""
    values = _config_values(row.config)
    save_model = Path(values["save_model"])
    if row.overrides:
        suffix = "_".join(str(part).lstrip("-") for part in row.overrides)
        save_model = save_model.parent.with_name(f"{save_model.parent.name}_{suffix}") / save_model.name
    run_dir = save_model.parent
    checkpoint = Path(f"{save_model}_step_{values['train_steps']}.pt")
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
    if row.overrides:
        train += ["-save_model", save_model, *row.overrides]
    translate = ["onmt_translate", "-model", checkpoint, "-src", DATA / task / f"test.bpe.{src}",
                 "-output", run_dir / "test.hyp.bpe", "-beam_size", 4, "-length_penalty", "wu", "-alpha", 0.6,
                 "-batch_size", 4096, "-batch_type", "tokens", "-gpu", 0, "-log_file", run_dir / "translate.log",
                 *_split_options(values)]
    commands = [train, translate]
    commands[:0] = _clause_preparation(values, task)
    return run_dir, checkpoint, task, [[str(part) for part in command] for command in commands]


def _clause_preparation(values, task):
    """Commands before training a clause-attention row: the "study" tagger, then the pre-split sources."""
    if not values.get("clause_attention"):
        return []
    src, _ = LANGS[task]
    lang, tagger = values["clause_lang"], values.get("clause_tagger_model")
    commands = []
    if tagger:  # "CA with study": the signal-word tagger is trained first, on the training source
        commands.append(["python", "tools/train_signal_tagger.py", "--lang", lang, "--input",
                         DATA / task / f"train.bpe.{src}", "--output", tagger, "--max-sentences", 100000])
    if values.get("clause_presplit"):  # the sources the config reads: <file>.clause_<rule|study>
        for corpus in values["data"].values():
            split = corpus["path_src"]
            commands.append(["python", "tools/clause_split_corpus.py", "--lang", lang, "--levels",
                             values.get("clause_levels", 6), "--input", split.rsplit(".clause_", 1)[0],
                             "--output", split, *(["--tagger-model", tagger] if tagger else [])])
    return commands


def _split_options(values):
    """onmt_translate options that split the BPE'd test source as in training (clause attention), else none."""
    sys.path.insert(0, str(REPO))
    from onmt_ext.clause_split import translate_options

    return translate_options(values)


def _metric(lang):
    """sacreBLEU's 13a BLEU, or its zh tokenizer for Chinese output."""
    return "bleu-zh" if lang == "zh" else "bleu"


def _postprocess(bpe_file, lang):
    """BPE removed (tokenized text) and detokenized text of an ``onmt_translate`` output."""
    from sacremoses import MosesDetokenizer

    detok = MosesDetokenizer(lang=lang)
    tokenized = [line.replace("@@ ", "").removesuffix("@@") for line in
                 bpe_file.read_text(encoding="utf-8").splitlines()]
    return tokenized, [detok.detokenize(line.split()) for line in tokenized]


def _reference_files(task, name):
    """``<name>`` or, for multi-reference test sets (NIST), ``<name>0``, ``<name>1``, ..."""
    numbered = sorted((DATA / task).glob(f"{name}[0-9]"))
    return numbered or [DATA / task / name]


def score(rows_done, task):
    """Per row: NIST BLEU, tokenized BLEU and the bootstrap p-value against the first row."""
    sys.path.insert(0, str(REPO))
    from onmt_ext import evaluation as ev

    _, tgt = LANGS[task]
    refs = ev.read_references(_reference_files(task, f"test.{tgt}"))
    tok_refs = ev.read_references(_reference_files(task, f"test.tok.{tgt}"))
    outputs = [_postprocess(run_dir / "test.hyp.bpe", tgt) for run_dir in rows_done]
    results = []
    for tokenized, detokenized in outputs:
        nist = ev.compute_metric(_metric(tgt), detokenized, refs)
        tok = ev.tokenized_bleu(tokenized, tok_refs)
        results.append({"bleu": nist.score, "tok_bleu": tok.score, "signature": nist.signature})
    base_detok = outputs[0][1]
    for result, (_, detokenized) in zip(results[1:], outputs[1:]):
        test = ev.paired_bootstrap(base_detok, detokenized, refs, metric=_metric(tgt))
        result["p_value"], result["marker"] = test.p_value, test.marker
    return results


def by_length(table, rows, rows_done, task):
    """Markdown lines: every row against the first per source-length bucket (paired bootstrap), and a plot each."""
    sys.path.insert(0, str(REPO))
    from onmt_ext import evaluation as ev

    src, tgt = LANGS[task]
    refs = ev.read_references(_reference_files(task, f"test.{tgt}"))
    sources = [line.replace("@@ ", "").removesuffix("@@") for line in
               ev.read_hypotheses(DATA / task / f"test.bpe.{src}", "test source")]
    outputs = [_postprocess(run_dir / "test.hyp.bpe", tgt)[1] for run_dir in rows_done]
    lines = ["", f"{_metric(tgt)} by source length (words of the BPE-free source), vs. row 1 "
                 f"(paired bootstrap per bucket; † p < 0.05, ‡ p < 0.01)", ""]
    for row, output in zip(rows[1:], outputs[1:]):
        comparisons = ev.compare_by_length(outputs[0], output, refs, sources, CLAUSE_BUCKETS, _metric(tgt))
        plot = RUNS / f"{table}.{row.config.split('_')[-1].removesuffix('.yaml')}.by_length.png"
        ev.plot_by_length(comparisons, plot, f"{table}: {row.label} vs {rows[0].label}", (rows[0].label, row.label))
        lines += [f"{row.label} (plot: {plot})", "", "| source length | segments | row 1 | this row | delta | p |",
                  "|---|---:|---:|---:|---:|---:|"]
        for c in comparisons:
            t = c.bootstrap
            lines.append(f"| {c.label} | 0 | | | | |" if t is None else
                         f"| {c.label} | {c.count} | {t.baseline_score:.2f} | {t.system_score:.2f} | "
                         f"{t.delta:+.2f} | {t.p_value:.3f} {t.marker} |")
        lines.append("")
    return lines


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
            if command[0] == "python" and Path(command[command.index("--output") + 1]).exists():
                continue
            if command[0] == "onmt_translate" and (run_dir / "test.hyp.bpe").exists():
                continue
            for needed in (DATA / task / f"train.bpe.{LANGS[task][0]}",
                           _reference_files(task, f"test.{LANGS[task][1]}")[0]):
                if not needed.exists():
                    raise SystemExit(f"reproduce.py: {needed} is missing; prepare build/data/{task}/ "
                                     "first (see the module docstring for the files it must hold)")
            run_dir.mkdir(parents=True, exist_ok=True)
            subprocess.run([str(bin_dir / command[0]), *command[1:]], check=True)
    if args.dry_run:
        return 0
    [task] = tasks
    results = score([run_dir for run_dir, _, _, _ in plans], task)
    lines = [f"{args.table}: BLEU on {task} test (case-sensitive, "
             f"{'zh' if LANGS[task][1] == 'zh' else '13a'} tokenizer; p from paired bootstrap vs. row 1)", "",
             "| row | config | paper BLEU | BLEU | tok. BLEU | p |", "|---|---|---:|---:|---:|---:|"]
    for row, result in zip(rows, results):
        p = f"{result['p_value']:.3f} {result['marker']}" if "p_value" in result else ""
        paper = "n/a" if row.paper_bleu is None else f"{row.paper_bleu:.2f}"
        lines.append(f"| {row.label} | `{row.config}` | {paper} | {result['bleu']:.2f} | "
                     f"{result['tok_bleu']:.2f} | {p} |")
    lines.append(f"\nsacreBLEU signature: {results[0]['signature']}")
    if args.table.startswith("clause-"):  # the paper's claim is about long sentences (Tables 6-9)
        lines += by_length(args.table, rows, [run_dir for run_dir, _, _, _ in plans], task)
    text = "\n".join(lines) + "\n"
    (RUNS / f"{args.table}.md").write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
