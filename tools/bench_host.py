#!/usr/bin/env python
"""Host milliseconds per training step, onmt-ext against stock OpenNMT-py, in one run (a CPU proxy).

Usage::

    python -m tools.bench_host [--steps 40] [--warmup-steps 10] [--repeats 2] [--batch-size 8192]
        [--num-workers 2] [--out results/bench] [--work build/bench-host] [--label NAME]
        [--no-crossing] [--no-worker] [--worker-batches 160]

How it works and why: docs/tools.md (bench_host.py).
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from tools import common
from onmt_ext.runtime import train_log

REPO = common.REPO

#: the data-worker measurement: the paper's one-pass update and gpu-check's bucket for it (twice the batch)
WORKER_BATCH, WORKER_BUCKET = 32768, 65536

MODEL = {"enc_layers": 1, "dec_layers": 1, "hidden_size": 16, "word_vec_size": 16, "transformer_ff": 16,
         "heads": 2}
VARIANTS = {"onmt-ext": {}, "stock OpenNMT-py": {"ONMT_EXT_DISABLE": "1"}}


def config_text(args, work):
    """The demo config with the trivial model and this run's batch, steps and paths."""
    import yaml

    config = common.config_values("demo/tatoeba_zhen.yaml")
    steps = args.warmup_steps + args.steps
    config.update(MODEL, batch_size=args.batch_size, valid_batch_size=args.batch_size, num_workers=args.num_workers,
                  train_steps=steps, valid_steps=10 * steps, save_checkpoint_steps=10 * steps,
                  report_every=args.report_every, seed=1, save_model=str(work / "model"))
    return yaml.safe_dump(config, sort_keys=False)


def one_run(args, work, name, env, number):
    """Train once; returns seconds per step after the warm-up, from the log's timestamps."""
    folder = work / f"{name.split()[0]}-{number}"
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "config.yaml"
    config.write_text(config_text(args, folder), encoding="utf-8")
    for old in folder.glob("model_step_*.pt"):
        old.unlink()
    log = folder / "train.log"
    log.unlink(missing_ok=True)
    done = subprocess.run([common.program("onmt_train"), "-config", str(config), "-log_file", str(log)], cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **env}, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"bench_host.py: error: {name} run {number} failed (exit {done.returncode}); "
                         f"see {log}: {done.stderr.strip().splitlines()[-1:]}")
    records = [r for r in train_log.read(log).steps if r.step >= args.warmup_steps and r.time]
    if len(records) < 2:
        return None, str(log)
    first, last = records[0], records[-1]  # from the report that ends the warm-up to the last one
    return (last.time - first.time).total_seconds() / (last.step - first.step), str(log)


def _synthetic_batch(packed):
    """A batch of an 8k-token batch's shapes (600 sentences of 14/16 tokens), packed or as separate tensors."""
    from onmt_ext.runtime.batches import pack

    batch = {"src": torch.randint(0, 4000, (600, 14, 1)), "tgt": torch.randint(0, 4000, (600, 16, 1)),
             "srclen": torch.randint(1, 15, (600,)), "tgtlen": torch.randint(1, 17, (600,)),
             "ind_in_bucket": torch.arange(600), "cid": torch.zeros(600, dtype=torch.long),
             "cid_line_number": torch.arange(600)}
    return pack(batch) if packed else batch


class _Batches(torch.utils.data.IterableDataset):
    """An endless stream of :func:`_synthetic_batch` (DataLoader workers iterate it)."""

    def __init__(self, packed):
        self.packed = packed

    def __iter__(self):
        while True:
            yield _synthetic_batch(self.packed)


def crossing_ms(packed, batches=300):
    """Milliseconds the receiving process spends per batch from 2 DataLoader workers (after 20 warm-up ones)."""
    from onmt_ext.runtime.batches import unpack

    loader = iter(torch.utils.data.DataLoader(_Batches(packed), batch_size=None, num_workers=2, prefetch_factor=4,
                                              multiprocessing_context="spawn"))
    for _ in range(20):
        next(loader)
    start = time.perf_counter()
    for _ in range(batches):
        unpack(next(loader))
    return 1000 * (time.perf_counter() - start) / batches


def child_worker_rate(result_file, head, argv):
    """``head`` (work folder, count) batches of the Base baseline's config on the repeated pre-encoded Tatoeba
    sample, through OpenNMT-py's training iterator with one DataLoader worker (docs/tools.md); writes each one's
    arrival (seconds after the first), bucket, sentences and target tokens to ``result_file``."""
    from onmt import train_single
    from onmt.bin.train import _get_parser
    from onmt.constants import CorpusTask
    from onmt.inputters.dynamic_iterator import build_dynamic_dataset_iter
    from onmt.utils.misc import set_random_seed
    from onmt.utils.parse import ArgumentParser

    from tools import timed_runs
    from tools.gpu_check import BASELINE

    work, count = Path(head[0]), int(head[1])
    settings = argparse.Namespace(batch_size=WORKER_BATCH, warmup_steps=1, steps=1, gpu=-1)
    config, _, _ = timed_runs.case_config(BASELINE, "paper", settings, work, suffix="_worker", repeat=40, overrides={
        "num_workers": 1, "bucket_size": WORKER_BUCKET, "bucket_size_init": -1, "bucket_size_increment": 0})
    opt, _ = _get_parser().parse_known_args(["-config", str(config)])
    ArgumentParser.validate_train_opts(opt)
    set_random_seed(opt.seed, False)
    _, vocabs, transforms_cls = train_single._init_train(opt)
    batches = iter(build_dynamic_dataset_iter(opt, transforms_cls, vocabs, task=CorpusTask.TRAIN))
    arrivals, tokens, buckets, sentences = [], [], [], []
    for _ in range(count):
        batch, bucket = next(batches)
        arrivals.append(time.perf_counter())
        buckets.append(int(bucket))
        tokens.append(int(batch["tgtlen"].sum()) - len(batch["tgtlen"]))  # less each sentence's start token
        sentences.append(len(batch["tgtlen"]))
    Path(result_file).write_text(json.dumps({"arrivals": [t - arrivals[0] for t in arrivals], "tokens": tokens,
                                             "buckets": buckets, "sentences": sentences}), encoding="utf-8")


def worker_rate(args, name, env):
    """One data worker's rate for ``name`` over whole buckets: batches and target tokens per second.  Returns a
    dict (``{"error": why}`` when no figure came)."""
    folder = args.work / f"worker-{name.split()[0]}"
    folder.mkdir(parents=True, exist_ok=True)
    result = folder / "arrivals.json"
    result.unlink(missing_ok=True)
    command = [sys.executable, "-m", "tools.bench_host", "--child", "worker-rate", str(result),
               str(folder), str(args.worker_batches), "--"]
    try:
        done = subprocess.run(command, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1", **env},
                              capture_output=True, text=True, check=False, timeout=900)
    except subprocess.TimeoutExpired:
        return {"error": "the data worker's process ran past 900 s"}
    if done.returncode or not result.exists():
        return {"error": f"the data worker's process failed (exit {done.returncode}): "
                         f"{done.stderr.strip().splitlines()[-1:]}"}
    found = json.loads(result.read_text(encoding="utf-8"))
    arrivals, tokens = found["arrivals"], found["tokens"]
    # whole buckets, from the first batch of the second (the first also pays the worker's start) to the first of
    # the last, so that each bucket's build and its batches count once
    firsts = [index for index in range(1, len(arrivals)) if found["buckets"][index] != found["buckets"][index - 1]]
    if len(firsts) < 2:
        return {"error": f"its {len(arrivals)} batches span fewer than three buckets; raise --worker-batches"}
    start, end = firsts[0], firsts[-1]
    seconds = arrivals[end] - arrivals[start]  # the arrivals of batches start + 1 to end
    buckets = len(firsts) - 1
    return {"batches": end - start, "buckets": buckets, "seconds": seconds,
            "batches_per_s": (end - start) / seconds, "tokens_per_s": sum(tokens[start + 1:end + 1]) / seconds,
            "target_tokens_per_batch": statistics.mean(tokens),
            # OpenNMT-py leaves out of a training batch a source line that is already in it: the share of each
            # bucket's examples that reached a batch
            "kept_share": sum(found["sentences"][start:end]) / (buckets * WORKER_BUCKET),
            "bucket_waits_s": [arrivals[index] - arrivals[index - 1] for index in firsts]}


def parse_args(argv):
    parser = common.Parser(prog="bench_host.py", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=common.at_least(1), default=40, help="measured steps (default 40)")
    parser.add_argument("--warmup-steps", type=common.at_least(1), default=10, help="steps before them (default 10)")
    parser.add_argument("--report-every", type=common.at_least(1), default=10)
    parser.add_argument("--repeats", type=common.at_least(1), default=2,
                        help="runs of each variant, alternating (default 2)")
    parser.add_argument("--batch-size", type=common.at_least(1), default=8192, help="tokens per batch (default 8192)")
    parser.add_argument("--num-workers", type=int, default=2, help="data workers (default 2, as the paper configs)")
    parser.add_argument("--out", type=Path, default=REPO / "results/bench")
    parser.add_argument("--work", type=Path, default=REPO / "build/bench-host")
    parser.add_argument("--no-crossing", dest="crossing", action="store_false",
                        help="leave out the batch-crossing measurement")
    parser.add_argument("--no-worker", dest="worker", action="store_false",
                        help="leave out the data-worker measurement")
    parser.add_argument("--worker-batches", type=common.at_least(8), default=160,
                        help=f"batches of {WORKER_BATCH} tokens the data worker builds per variant (default 160: "
                             "about four buckets)")
    parser.add_argument("--label", default="proxy", help="report name: <out>/host-<label>.{json,md}")
    args = parser.parse_args(argv)
    args.work = args.work.resolve()  # the worker child runs in the repository root
    if args.steps % args.report_every or args.warmup_steps % args.report_every:
        parser.error("--steps and --warmup-steps must be multiples of --report-every")
    return args


def markdown(report):
    lines = [f"# Host milliseconds per training step: {report['label']}", "",
             f"- machine: {report['machine']}; {report['date']} UTC; commit {report['commit'] or 'unknown'}",
             f"- `{report['command']}`",
             f"- trivial model ({', '.join(f'{k} {v}' for k, v in MODEL.items())}), {report['batch_size']}-token "
             f"batches, {report['num_workers']} data workers, {report['steps']} measured steps after "
             f"{report['warmup_steps']}; one torch thread", "",
             "| variant | host ms per step (median) | runs (ms) |", "|---|---:|---|"]
    for name, row in report["variants"].items():
        runs = ", ".join(f"{1000 * s:.1f}" if s else "n/a" for s in row["seconds_per_step"])
        lines.append(f"| {name} | {common.fmt(row['median_ms'], 1)} | {runs} |")
    if ratio := report.get("stock_over_ext"):
        lines += ["", f"Stock's time per step over onmt-ext's: {ratio:.2f}."]
    if crossing := report.get("crossing_ms"):
        lines += ["", "Receiving one 8k-token batch from 2 data workers (the training process's side, ms per "
                  "batch): seven shared-memory tensors (stock) "
                  f"{crossing['tensors']:.2f}, one packed buffer (onmt-ext) {crossing['packed']:.2f}."]
    if worker := report.get("worker"):
        lines += ["", f"One data worker building {report['worker_batch']}-token batches from "
                  f"{report['worker_bucket']}-example buckets (the Base baseline's config on the pre-encoded Tatoeba "
                  "sample repeated, one DataLoader worker), from the first batch of its second bucket to the first "
                  "of its last. The sample's copies vary the order of each source line's pieces, since OpenNMT-py "
                  "leaves out of a batch a source line already in it (plain copies: 0.37 of a bucket kept): the last "
                  "column is the share of a bucket's examples that reached a batch.", "",
                  "| variant | batches/s (median) | target tokens/s | runs (batches/s, "
                  "buckets) | target tokens per batch | examples kept |", "|---|---:|---:|---|---:|---:|"]
        for name, runs in worker.items():
            good = [run for run in runs if "error" not in run]
            failed = "; ".join(run["error"] for run in runs if "error" in run)
            if not good:
                lines.append(f"| {name} | n/a | n/a | {failed} | n/a | n/a |")
                continue
            lines.append(f"| {name} | {statistics.median(run['batches_per_s'] for run in good):.2f} | "
                         f"{statistics.median(run['tokens_per_s'] for run in good):,.0f} | "
                         + ", ".join(f"{run['batches_per_s']:.2f} ({run['buckets']})" for run in good)
                         + (f"; {failed}" if failed else "")
                         + f" | {statistics.mean(run['target_tokens_per_batch'] for run in good):,.0f} | "
                         f"{statistics.mean(run['kept_share'] for run in good):.2f} |")
    lines += ["", "A CPU proxy for the host's share of a GPU step; information only, not a GPU figure."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return common.child_main(argv, {"worker-rate": child_worker_rate})
    args = parse_args(argv)
    if not (REPO / "build/tatoeba/vocab.en").exists():
        from onmt_ext.runtime.compat import make_command

        print(f"bench_host.py: error: build/tatoeba is missing; run `{make_command('data')}` first", file=sys.stderr)
        return 2
    results = {name: [] for name in VARIANTS}
    for number in range(args.repeats):
        for name, env in VARIANTS.items():
            seconds, log = one_run(args, args.work, name, env, number)
            print(f"== bench-host: {name}, run {number + 1}: "
                  + (f"{1000 * seconds:.1f} ms per step" if seconds else "no figure") + f" ({log})", flush=True)
            results[name].append(seconds)
    crossing = {"tensors": crossing_ms(False), "packed": crossing_ms(True)} if args.crossing else None
    worker = None
    if args.worker:
        worker = {name: [] for name in VARIANTS}
        for number in range(args.repeats):
            for name, env in VARIANTS.items():
                found = worker_rate(args, name, env)
                print(f"== bench-host: {name}, data worker {number + 1}: " + (
                    f"{found['batches_per_s']:.2f} batches/s over {found['buckets']} buckets" if "error" not in found
                    else f"no figure: {found['error']}"), flush=True)
                worker[name].append(found)
    # the commit of the onmt-ext that this interpreter's onmt_train loads (another checkout's, with another venv)
    where = subprocess.run([sys.executable, "-c", "import onmt_ext, os; print(os.path.dirname(onmt_ext.__file__))"],
                           capture_output=True, text=True, check=False).stdout.strip() or str(REPO)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=where, capture_output=True, text=True,
                            check=False).stdout.strip()
    variants = {}
    for name, runs in results.items():
        found = [s for s in runs if s]
        variants[name] = {"seconds_per_step": runs, "median_ms": 1000 * statistics.median(found) if found else None}
    ext, stock = variants["onmt-ext"]["median_ms"], variants["stock OpenNMT-py"]["median_ms"]
    report = {"label": args.label, "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} "
              f"cores, Python {platform.python_version()}", "commit": commit or None,
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
              "command": "python -m tools.bench_host " + " ".join(argv),
              "batch_size": args.batch_size, "num_workers": args.num_workers, "steps": args.steps,
              "warmup_steps": args.warmup_steps, "variants": variants,
              "stock_over_ext": stock / ext if ext and stock else None, "crossing_ms": crossing,
              "worker": worker, "worker_batch": WORKER_BATCH, "worker_bucket": WORKER_BUCKET}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"host-{args.label}.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    (args.out / f"host-{args.label}.md").write_text(markdown(report), encoding="utf-8")
    print(markdown(report))
    return 0


if __name__ == "__main__":  # (the DataLoader's spawned workers import this module)
    sys.exit(main())
