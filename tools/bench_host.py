#!/usr/bin/env python
"""Host milliseconds per training step, onmt-ext against stock OpenNMT-py, in one run (a CPU proxy).

Usage::

    python -m tools.bench_host [--steps 40] [--warmup-steps 10] [--repeats 2] [--batch-size 8192]
        [--num-workers 2] [--out results/bench] [--work build/bench-host] [--label NAME]
        [--no-training] [--no-crossing] [--no-worker] [--worker-batches 160] [--worker-config YAML] [--profile]

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


def _worker_iterator(work, config=None):
    """``(opt, vocabs, transforms_cls)`` of the Base baseline's config on the repeated pre-encoded Tatoeba sample
    (or of the training ``config``, a YAML path) with one data worker, :data:`WORKER_BATCH`-token batches and
    :data:`WORKER_BUCKET`-example buckets."""
    from onmt import train_single
    from onmt.bin.train import _get_parser
    from onmt.utils.misc import set_random_seed
    from onmt.utils.parse import ArgumentParser

    from tools import timed_runs
    from tools.gpu_check.cases import BASELINE

    overrides = {"num_workers": 1, "bucket_size": WORKER_BUCKET, "bucket_size_init": -1, "bucket_size_increment": 0}
    if config:
        options = ["-config", config, "-batch_type", "tokens", "-batch_size", str(WORKER_BATCH)]
        options += [item for key, value in overrides.items() for item in (f"-{key}", str(value))]
    else:
        settings = argparse.Namespace(batch_size=WORKER_BATCH, warmup_steps=1, steps=1, gpu=-1)
        written, _, _ = timed_runs.case_config(BASELINE, "paper", settings, work, suffix="_worker", repeat=40,
                                               overrides=overrides)
        options = ["-config", str(written)]
    opt, _ = _get_parser().parse_known_args(options)
    ArgumentParser.validate_train_opts(opt)
    set_random_seed(opt.seed, False)
    _, vocabs, transforms_cls = train_single._init_train(opt)
    return opt, vocabs, transforms_cls


def _cpu_seconds(pid):
    """User and system CPU seconds of process ``pid`` so far (Linux's /proc; None elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child_worker_rate(result_file, head, argv):
    """``head`` (work folder, count[, config]) batches of the Base baseline's config on the repeated pre-encoded
    Tatoeba sample, through OpenNMT-py's training iterator with one DataLoader worker (docs/tools.md); writes each
    one's arrival (seconds after the first), the worker's CPU seconds then, bucket, sentences and target tokens to
    ``result_file``."""
    from onmt.constants import CorpusTask
    from onmt.inputters.dynamic_iterator import build_dynamic_dataset_iter

    from onmt_ext.runtime.batches import unpack

    work, count, config = Path(head[0]), int(head[1]), head[2] if len(head) > 2 else None
    opt, vocabs, transforms_cls = _worker_iterator(work, config)
    batches = iter(build_dynamic_dataset_iter(opt, transforms_cls, vocabs, task=CorpusTask.TRAIN).data_iter)
    worker = batches._workers[0].pid  # (the DataLoader's own iterator: batches as they cross, packed or not)
    arrivals, cpu, tokens, buckets, sentences = [], [], [], [], []
    for _ in range(count):
        batch, bucket = next(batches)
        arrivals.append(time.perf_counter())
        cpu.append(_cpu_seconds(worker))
        batch, _, _ = unpack(batch)
        buckets.append(int(bucket))
        tokens.append(int(batch["tgtlen"].sum()) - len(batch["tgtlen"]))  # less each sentence's start token
        sentences.append(len(batch["tgtlen"]))
    Path(result_file).write_text(json.dumps({"arrivals": [t - arrivals[0] for t in arrivals], "cpu": cpu,
                                             "tokens": tokens, "buckets": buckets, "sentences": sentences}),
                                 encoding="utf-8")


def child_sort_stage(result_file, head, argv):
    """``head`` (work folder[, config]): CPU seconds of what ``DynamicDatasetIter.__iter__`` does after a bucket
    is filled (sort, cut into batches, shuffle, sort each batch), stock's against onmt-ext's ``_keyed_batches``,
    on the same two filled :data:`WORKER_BUCKET`-example buckets, ``tensorify`` stubbed out and the cyclic
    garbage collector off as in a data worker, 7 alternations;
    writes ``{variant: [seconds, ...]}`` to ``result_file``."""
    import gc
    import itertools

    from onmt.constants import CorpusTask
    from onmt.inputters import dynamic_iterator
    from onmt.inputters.text_corpus import get_corpora
    from onmt.transforms import make_transforms

    from onmt_ext import patches
    from onmt_ext.runtime import batches

    opt, vocabs, transforms_cls = _worker_iterator(Path(head[0]), head[1] if len(head) > 1 else None)
    data = dynamic_iterator.DynamicDatasetIter.from_opt(
        get_corpora(opt, CorpusTask.TRAIN), make_transforms(opt, transforms_cls, vocabs), vocabs, opt,
        CorpusTask.TRAIN, copy=False, device=torch.device("cpu"))
    data.num_workers = 0
    data._init_datasets(0)
    filled = list(itertools.islice(data._bucketing(), 2))
    data._bucketing = lambda: iter(filled)
    dynamic_iterator.tensorify = lambda vocabs, minibatch, device, left_pad: len(minibatch)
    stock = patches.original(dynamic_iterator.DynamicDatasetIter, "__iter__")
    variants = {"stock OpenNMT-py": lambda: stock(data), "onmt-ext": lambda: batches._keyed_batches(stock, data)}
    seconds = {name: [] for name in variants}
    gc.disable()  # as in a data worker (onmt_ext.runtime.batches._collector_paused)
    for _ in range(7):
        for name, run in variants.items():
            start = time.process_time()
            examples = sum(count for count, _ in run())
            seconds[name].append(time.process_time() - start)
    gc.enable()
    Path(result_file).write_text(json.dumps({"examples": examples, "seconds": seconds}), encoding="utf-8")


class _Profiled(torch.utils.data.IterableDataset):
    """OpenNMT-py's training dataset in a DataLoader worker under cProfile for its first ``count`` batches, whose
    statistics it writes to ``out`` (the worker's own thread: what the queue's feeder thread pickles is not in it)."""

    def __init__(self, inner, count, out):
        self.inner, self.count, self.out = inner, count, out

    def init(self, worker_id):
        self.inner._init_datasets(worker_id)

    def __iter__(self):
        import cProfile

        profiler, batches = cProfile.Profile(), iter(self.inner)
        profiler.enable()
        for _ in range(self.count):
            item = next(batches)
            profiler.disable()
            yield item
            profiler.enable()
        profiler.disable()
        profiler.dump_stats(self.out)
        yield None


def child_worker_profile(result_file, head, argv):
    """``head`` (work folder, count): the data worker of :func:`child_worker_rate` under cProfile for ``count``
    batches; its statistics go to ``result_file`` (pstats)."""
    from onmt.constants import CorpusTask
    from onmt.inputters.dynamic_iterator import build_dynamic_dataset_iter

    work, count, config = Path(head[0]), int(head[1]), head[2] if len(head) > 2 else None
    opt, vocabs, transforms_cls = _worker_iterator(work, config)
    built = build_dynamic_dataset_iter(opt, transforms_cls, vocabs, task=CorpusTask.TRAIN)
    loader = built.data_iter if hasattr(built, "data_iter") else built
    profiled = _Profiled(loader.dataset, count, str(Path(result_file).resolve()))
    batches = torch.utils.data.DataLoader(profiled, batch_size=None, num_workers=1, multiprocessing_context="spawn",
                                          worker_init_fn=profiled.init, prefetch_factor=opt.prefetch_factor)
    for item in batches:
        if item is None:
            break


#: the stages of a data worker's batch: label, and the function (module, qualified name) whose inclusive time is
#: the stage's; stock's functions, and onmt-ext's replacements where it replaces one
STAGES = (
    ("fill a bucket (DynamicDatasetIter._bucketing: all up to sorting)", "onmt.inputters.dynamic_iterator",
     "DynamicDatasetIter._bucketing"),
    ("  read, split, check, mix (WeightedMixer.__iter__)", "onmt.inputters.dynamic_iterator", "WeightedMixer.__iter__"),
    ("    split into tokens, checks (ParallelCorpusIterator._process)", "onmt.inputters.text_corpus",
     "ParallelCorpusIterator._process"),
    ("      read lines, decode (ParallelCorpus.load)", "onmt.inputters.text_corpus", "ParallelCorpus.load"),
    ("  transforms, join tokens (text_utils.process)", "onmt.inputters.text_utils", "process"),
    ("    transform pipe (TransformPipe.batch_apply)", "onmt.transforms.transform", "TransformPipe.batch_apply"),
    ("    clean_example (joins tokens)", "onmt.inputters.text_utils", "clean_example"),
    ("  numericalize (split, vocabulary look-up)", "onmt.inputters.text_utils", "numericalize"),
    ("sort keys (text_sort_key, stock)", "onmt.inputters.text_utils", "text_sort_key"),
    ("greedy batches (batch_iter, stock)", "onmt.inputters.dynamic_iterator", "DynamicDatasetIter.batch_iter"),
    ("greedy batches (onmt-ext)", "onmt_ext.runtime.batches", "_greedy_batches"),
    ("pad, make tensors (tensorify, stock)", "onmt.inputters.text_utils", "tensorify"),
    ("pad, make tensors (onmt-ext)", "onmt_ext.runtime.batches", "_padded_at_once"),
    ("bookkeeping, pack (onmt-ext)", "onmt_ext.runtime.batches", "pack"),
)


def _code_key(module, qualname):
    """cProfile's key ``(file, first line, name)`` of the function ``module.qualname`` (None if it has none)."""
    import importlib

    found = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    code = getattr(getattr(found, "__func__", found), "__code__", None)
    return (code.co_filename, code.co_firstlineno, code.co_name) if code else None


def profile_table(stats_file, top=20):
    """Markdown lines: the stages' inclusive seconds (:data:`STAGES`, stock's functions taken from
    :func:`onmt_ext.patches.original`) and the ``top`` functions by own time, from the pstats ``stats_file``."""
    import importlib
    import pstats

    import onmt  # noqa: F401  (onmt-ext's layers, unless ONMT_EXT_DISABLE)
    from onmt_ext import patches

    stats = pstats.Stats(stats_file)
    rows, total = stats.stats, stats.total_tt  # rows: key -> (primitive calls, calls, own s, inclusive s, callers)
    lines = [f"Profiled seconds in the worker's thread: {total:.2f}.", "",
             "| stage (inclusive; each dot: inside the stage above) | calls | seconds | share |",
             "|---|---:|---:|---:|"]
    for label, module, qualname in STAGES:
        key = _code_key(module, qualname)
        owner, _, attribute = qualname.rpartition(".")
        if module.startswith("onmt."):  # the stock function under onmt-ext's layers
            holder = importlib.import_module(module)
            for part in filter(None, owner.split(".")):
                holder = getattr(holder, part)
            stock = patches.original(holder, attribute)
            stock_code = getattr(stock, "__code__", None)
            key = (stock_code.co_filename, stock_code.co_firstlineno, stock_code.co_name) if stock_code else key
        if key in rows:
            value = rows[key]
            depth = (len(label) - len(label.lstrip())) // 2
            lines.append(f"| {'. ' * depth}{label.strip()} | {value[1]:,} | {value[3]:.2f} | {value[3] / total:.2f} |")
    lines += ["", f"| function (top {top} by own time) | calls | own s | inclusive s |", "|---|---:|---:|---:|"]
    for (path, line, name), value in sorted(rows.items(), key=lambda item: -item[1][2])[:top]:
        where = f" {Path(path).parent.name}/{Path(path).name}:{line}" if path != "~" else ""
        lines.append(f"| `{name}`{where} | {value[1]:,} | {value[2]:.2f} | {value[3]:.2f} |")
    return lines


def worker_rate(args, name, env):
    """One data worker's rate for ``name`` over whole buckets: batches and target tokens per second.  Returns a
    dict (``{"error": why}`` when no figure came)."""
    folder = args.work / f"worker-{name.split()[0]}"
    folder.mkdir(parents=True, exist_ok=True)
    result = folder / "arrivals.json"
    result.unlink(missing_ok=True)
    command = [sys.executable, "-m", "tools.bench_host", "--child", "worker-rate", str(result),
               str(folder), str(args.worker_batches), args.worker_config or "", "--"]
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
    cpu = found.get("cpu") or []
    cpu_seconds = cpu[end] - cpu[start] if len(cpu) > end and None not in (cpu[start], cpu[end]) else None
    return {"batches": end - start, "buckets": buckets, "seconds": seconds, "worker_cpu_seconds": cpu_seconds,
            "tokens_per_cpu_s": sum(tokens[start + 1:end + 1]) / cpu_seconds if cpu_seconds else None,
            "batches_per_s": (end - start) / seconds, "tokens_per_s": sum(tokens[start + 1:end + 1]) / seconds,
            "target_tokens_per_batch": statistics.mean(tokens),
            # OpenNMT-py leaves out of a training batch a source line that is already in it: the share of each
            # bucket's examples that reached a batch
            "kept_share": sum(found["sentences"][start:end]) / (buckets * WORKER_BUCKET),
            "bucket_waits_s": [arrivals[index] - arrivals[index - 1] for index in firsts]}


def worker_profile(args, name, env):
    """Markdown lines of :func:`profile_table` for ``name``'s data worker under cProfile (or why there are none)."""
    folder = args.work / f"worker-{name.split()[0]}"
    folder.mkdir(parents=True, exist_ok=True)
    result = folder / "worker.prof"
    result.unlink(missing_ok=True)
    command = [sys.executable, "-m", "tools.bench_host", "--child", "worker-profile", str(result), str(folder),
               str(args.worker_batches), args.worker_config or "", "--"]
    try:
        done = subprocess.run(command, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1", **env},
                              capture_output=True, text=True, check=False, timeout=900)
    except subprocess.TimeoutExpired:
        return ["the profiled data worker ran past 900 s"]
    if done.returncode or not result.exists():
        return [f"the profiled data worker failed (exit {done.returncode}): {done.stderr.strip().splitlines()[-1:]}"]
    shown = subprocess.run([sys.executable, "-c", "import sys; from tools.bench_host import profile_table; "
                            "print('\\n'.join(profile_table(sys.argv[1])))", str(result)], cwd=REPO,
                           env={**os.environ, **env}, capture_output=True, text=True, check=False)
    return shown.stdout.splitlines() or [f"no profile table: {shown.stderr.strip().splitlines()[-1:]}"]


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
    parser.add_argument("--no-training", dest="training", action="store_false",
                        help="leave out the training runs (the host milliseconds per step)")
    parser.add_argument("--no-worker", dest="worker", action="store_false",
                        help="leave out the data-worker measurement")
    parser.add_argument("--worker-batches", type=common.at_least(8), default=160,
                        help=f"batches of {WORKER_BATCH} tokens the data worker builds per variant (default 160: "
                             "about four buckets)")
    parser.add_argument("--worker-config", type=lambda path: str(Path(path).resolve()), default=None,
                        help="a training YAML for the data-worker measurement instead of the pre-encoded Tatoeba "
                             "baseline (its batches and buckets set as for that one, one worker)")
    parser.add_argument("--profile", action="store_true",
                        help="also profile each variant's data worker (cProfile, --worker-batches batches): where "
                             "its time goes, by stage")
    parser.add_argument("--label", default="proxy", help="report name: <out>/host-<label>.{json,md}")
    args = parser.parse_args(argv)
    args.work = args.work.resolve()  # the worker child runs in the repository root
    if args.steps % args.report_every or args.warmup_steps % args.report_every:
        parser.error("--steps and --warmup-steps must be multiples of --report-every")
    return args


def _median_of(runs, key):
    """The median of ``run[key]`` over ``runs`` where it is known (None when nowhere)."""
    known = [run[key] for run in runs if run.get(key) is not None]
    return statistics.median(known) if known else None


def markdown(report):
    lines = [f"# Host milliseconds per training step: {report['label']}", "",
             f"- machine: {report['machine']}; {report['date']} UTC; commit {report['commit'] or 'unknown'}",
             f"- `{report['command']}`"]
    if report.get("training", True):
        lines += [f"- trivial model ({', '.join(f'{k} {v}' for k, v in MODEL.items())}), {report['batch_size']}-token "
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
        data = (f"the config `{report['worker_config']}`" if report.get("worker_config") else
                "the Base baseline's config on the pre-encoded Tatoeba sample repeated")
        lines += ["", f"One data worker building {report['worker_batch']}-token batches from "
                  f"{report['worker_bucket']}-example buckets ({data}, one DataLoader worker), from the first batch "
                  "of its second bucket to the first of its last. The Tatoeba sample's copies vary the order of each "
                  "source line's pieces, since OpenNMT-py leaves out of a batch a source line already in it (plain "
                  "copies: 0.37 of a bucket kept): the last column is the share of a bucket's examples that reached "
                  "a batch.", "",
                  "| variant | batches/s (median) | target tokens/s | target tokens per worker CPU s | runs "
                  "(batches/s, buckets) | target tokens per batch | examples kept |",
                  "|---|---:|---:|---:|---|---:|---:|"]
        for name, runs in worker.items():
            good = [run for run in runs if "error" not in run]
            failed = "; ".join(run["error"] for run in runs if "error" in run)
            if not good:
                lines.append(f"| {name} | n/a | n/a | n/a | {failed} | n/a | n/a |")
                continue
            lines.append(f"| {name} | {statistics.median(run['batches_per_s'] for run in good):.2f} | "
                         f"{statistics.median(run['tokens_per_s'] for run in good):,.0f} | "
                         + (f"{cpu_rate:,.0f} | " if (cpu_rate := _median_of(good, "tokens_per_cpu_s")) else "n/a | ")
                         + ", ".join(f"{run['batches_per_s']:.2f} ({run['buckets']})" for run in good)
                         + (f"; {failed}" if failed else "")
                         + f" | {statistics.mean(run['target_tokens_per_batch'] for run in good):,.0f} | "
                         f"{statistics.mean(run['kept_share'] for run in good):.2f} |")
    for name, table in (report.get("worker_profiles") or {}).items():
        lines += ["", f"### {name}: one data worker under cProfile ({report['worker_batches']} batches; the profiler "
                  "slows Python calls, so shares, not seconds, carry over)", "", *table]
    lines += ["", "A CPU proxy for the host's share of a GPU step; information only, not a GPU figure."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return common.child_main(argv, {"worker-rate": child_worker_rate, "worker-profile": child_worker_profile,
                                        "sort-stage": child_sort_stage})
    args = parse_args(argv)
    if not (REPO / "build/tatoeba/vocab.en").exists():
        from onmt_ext.runtime.compat import make_command

        print(f"bench_host.py: error: build/tatoeba is missing; run `{make_command('data')}` first", file=sys.stderr)
        return 2
    results = {name: [] for name in VARIANTS}
    for number in range(args.repeats if args.training else 0):
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
    profiles = {name: worker_profile(args, name, env) for name, env in VARIANTS.items()} if args.profile else None
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
              "worker": worker, "worker_batch": WORKER_BATCH, "worker_bucket": WORKER_BUCKET,
              "worker_profiles": profiles, "worker_batches": args.worker_batches,
              "worker_config": args.worker_config, "training": args.training}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"host-{args.label}.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    (args.out / f"host-{args.label}.md").write_text(markdown(report), encoding="utf-8")
    print(markdown(report))
    return 0


if __name__ == "__main__":  # (the DataLoader's spawned workers import this module)
    sys.exit(main())
