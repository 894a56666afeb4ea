#!/usr/bin/env python
"""Load and scale checks on the CPU: long translation runs and long training sentences, per mechanism.

Usage::

    python -m tools.scale_check [--sentences 10000] [--length 200] [--mechanisms baseline li2019 ...]
                                [--out results/scale]

How it works and why: docs/tools.md (scale_check.py).
"""

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from tools import common

REPO = common.REPO
TATOEBA = Path("build/tatoeba")
#: Every translation is forced to this many tokens, so that an undertrained model does real decoding work.
OUTPUT_LENGTH = 20
#: One smoke config per mechanism (the decoder-side ones included where the mechanism has one).
MECHANISMS = {
    "baseline": "yaml_configs/smoke/baseline/transformer_base_wmt14_ende.yaml",
    "li2019": "yaml_configs/smoke/li2019/transformer_base_wmt14_ende_em_all.yaml",
    "cao2019": "yaml_configs/smoke/cao2019/transformer_base_wmt17_zhen_cross_zero.yaml",
    "chen2019": "yaml_configs/smoke/chen2019/transformer_base_wmt14_ende_mprhead.yaml",
    "clause": "yaml_configs/smoke/clause/transformer_base_niutrans_enzh_ca_rule.yaml",
    "gret": "yaml_configs/smoke/gret/transformer_base_wmt14_ende_gret.yaml",
}


def _rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return None


def run_measured(command, log, interval=0.2):
    """Runs ``command`` with its output in ``log``, sampling its resident memory every ``interval`` s; returns
    ``(seconds, [(t, KiB), ...], peak MiB)``, the peak being the process's ``ru_maxrss`` from wait4."""
    samples, done = [], threading.Event()
    start = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        process = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)

        def sample():
            while not done.is_set():
                rss = _rss_kib(process.pid)
                if rss is not None:
                    samples.append((time.perf_counter() - start, rss))
                done.wait(interval)

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        done.set()
        thread.join()
    if process.returncode:
        raise SystemExit(f"scale_check.py: {Path(command[0]).name} failed (exit {process.returncode}); see {log}")
    return time.perf_counter() - start, samples, usage.ru_maxrss / 1024


def memory_summary(samples):
    """Peak RSS, and the medians of the second and the last quarter of the run (the first holds start-up), MiB."""
    values = [kib / 1024 for _, kib in samples]
    if len(values) < 8:
        return {"peak_mib": max(values) if values else None, "second_quarter_mib": None, "last_quarter_mib": None}
    quarter = len(values) // 4
    return {"peak_mib": max(values), "second_quarter_mib": statistics.median(values[quarter:2 * quarter]),
            "last_quarter_mib": statistics.median(values[-quarter:]), "samples": len(values)}


def long_sentences(lines, pieces_per_line, target):
    """Sentences of about ``target`` pieces, each made by joining consecutive source lines (in parallel)."""
    out_src, out_tgt, src, tgt, count = [], [], [], [], 0
    for (s, t), n in zip(lines, pieces_per_line):
        src.append(s)
        tgt.append(t)
        count += n
        if count >= target:
            out_src.append(" ".join(src))
            out_tgt.append(" ".join(tgt))
            src, tgt, count = [], [], 0
    return out_src, out_tgt


def main(argv=None):
    parser = common.Parser(description=__doc__.split("\n")[0])
    parser.add_argument("--sentences", type=int, default=10000)
    parser.add_argument("--length", type=int, default=200)
    parser.add_argument("--mechanisms", nargs="+", default=list(MECHANISMS), choices=list(MECHANISMS))
    parser.add_argument("--work", type=Path, default=Path("build/scale"))
    parser.add_argument("--out", type=Path, default=Path("results/scale"))
    args = parser.parse_args(argv)
    import sentencepiece
    import yaml

    from onmt_ext.mechanisms.clause.split import translate_options

    os.chdir(REPO)
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    sp = sentencepiece.SentencePieceProcessor(model_file=str(TATOEBA / "spm.zh.model"))
    zh = (TATOEBA / "train.zh").read_text(encoding="utf-8").splitlines()
    en = (TATOEBA / "train.en").read_text(encoding="utf-8").splitlines()
    source = work / f"translate.{args.sentences}.zh"
    source.write_text("\n".join(zh[i % len(zh)] for i in range(args.sentences)) + "\n", encoding="utf-8")
    long_src, long_tgt = long_sentences(list(zip(zh, en)), [len(sp.encode(line)) for line in zh], args.length)
    long_src, long_tgt = long_src[:64], long_tgt[:64]
    (work / "long.zh").write_text("\n".join(long_src) + "\n", encoding="utf-8")
    (work / "long.en").write_text("\n".join(long_tgt) + "\n", encoding="utf-8")
    mean_pieces = statistics.fmean(len(sp.encode(line)) for line in long_src)
    report = {"sentences": args.sentences, "long_sentence_pieces_mean": mean_pieces, "rows": []}
    for name in args.mechanisms:
        config = MECHANISMS[name]
        run = work / name
        run.mkdir(exist_ok=True)
        train = [common.program("onmt_train"), "-config", config, "-save_data", str(run / "samples"),
                 "-report_every", "10", "-valid_steps", "1000", "-overwrite_checkpoints"]
        *_, short_peak = run_measured([*train, "-save_model", str(run / "model"), "-train_steps", "30",
                                       "-save_checkpoint_steps", "30"], run / "train.log")
        data = json.dumps({"corpus_1": {"path_src": str(work / "long.zh"), "path_tgt": str(work / "long.en")},
                           "valid": {"path_src": str(TATOEBA / "valid.zh"), "path_tgt": str(TATOEBA / "valid.en")}})
        *_, long_peak = run_measured([*train, "-save_model", str(run / "long"), "-train_steps", "5",
                                      "-save_checkpoint_steps", "1000", "-data", data, "-batch_type", "sents",
                                      "-batch_size", "4", "-src_seq_length", str(args.length * 2),
                                      "-tgt_seq_length", str(args.length * 2)], run / "train_long.log")
        values = yaml.safe_load(Path(config).read_text(encoding="utf-8"))
        seconds, samples, _ = run_measured(
            [common.program("onmt_translate"), "-model", str(run / "model_step_30.pt"), "-src", str(source), "-output",
             str(run / "hyp.en"), "-beam_size", "4", "-batch_size", "64", "-batch_type", "sents",
             "-min_length", str(OUTPUT_LENGTH), "-max_length", str(OUTPUT_LENGTH), "-max_length_ratio", "0",
             *translate_options(values, ("sentencepiece",)), "-src_subword_model", str(TATOEBA / "spm.zh.model"),
             "-tgt_subword_model", str(TATOEBA / "spm.en.model")], run / "translate.log")
        translated = sum(1 for _ in (run / "hyp.en").open(encoding="utf-8"))
        report["rows"].append({"mechanism": name, "config": config, "translated": translated,
                               "translate_seconds": seconds, **memory_summary(samples),
                               "train_peak_mib_short": short_peak, "train_peak_mib_long": long_peak})
        print(json.dumps(report["rows"][-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scale.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    lines = [f"# Load and scale (CPU, smoke size): {args.sentences} sentences in one onmt_translate run (beam 4, "
             f"{OUTPUT_LENGTH} output tokens each); "
             f"training on sentences of {mean_pieces:.0f} pieces on average", "",
             "| mechanism | translated | seconds | RSS 2nd quarter (MiB) | RSS last quarter (MiB) | RSS peak (MiB) "
             "| training peak, short sentences (MiB) | training peak, long sentences (MiB) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in report["rows"]:
        figures = (row[key] for key in ("translate_seconds", "second_quarter_mib", "last_quarter_mib", "peak_mib",
                                        "train_peak_mib_short", "train_peak_mib_long"))  # None: too few samples
        lines.append(f"| {row['mechanism']} | {row['translated']} | "
                     + " | ".join(common.fmt(value, 0) for value in figures) + " |")
    (args.out / "scale.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
