#!/usr/bin/env python
"""Speed and memory of each mechanism against the baseline Transformer, in one run (information only).

Usage::

    python tools/bench.py [--suite li2019] [--size smoke|paper] [--steps 300 (smoke) | 100 (paper)]
        [--warmup-steps 20] [--repeats 3] [--translate-repeats 10] [--greedy-repeats 2] [--test-sentences 200]
        [--output-length 0 (the references' mean length)] [--gpu -1] [--threads 1] [--out results/bench]
        [--work build/bench]

How it works and why: docs/tools.md (bench.py).
"""

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import yaml

import common
from prepare_tatoeba import encode_file

REPO = Path(__file__).resolve().parent.parent
#: Measured training steps at the smoke size (fewer spread more than the effects measured; see
#: docs/benchmarks-method.md).
SMOKE_STEPS = 300


@dataclass(frozen=True)
class Case:
    """A config to measure; ``train_target``/``translate_target`` are minimum ratios to the baseline."""

    label: str
    config: str
    train_target: float = None
    translate_target: float = None
    paper_train: float = None
    paper_translate: float = None
    pre_encoded: bool = False  # train on SentencePiece'd (and clause-split) copies of the data: no data transforms
    control: bool = False  # a second copy of the baseline, measured under its own name (see control_case)


def control_case(baseline):
    """The baseline again as one more case, an A/A control: any ratio of it other than 1 is the machine's."""
    return Case(f"{baseline.label}, again (A/A control)", baseline.config, pre_encoded=baseline.pre_encoded,
                control=True)


SUITES = {
    # li2019 Tables 2-3 (Transformer-Base, steps/s and sentences/s against 1.92 and 1.67)
    "li2019": (
        Case("baseline", "baseline/transformer_base_wmt17_zhen.yaml"),
        # the translation target is the "translation with encoder-only routing": every case here
        Case("simple routing, enc-self [1-6]", "li2019/transformer_base_wmt17_zhen_simple_enc_self.yaml",
             translate_target=0.97, paper_train=1.23 / 1.92, paper_translate=1.66 / 1.67),
        Case("EM routing, enc-self [1-6]", "li2019/transformer_base_wmt17_zhen_em_enc_self.yaml",
             train_target=0.75, translate_target=0.97, paper_train=1.20 / 1.92, paper_translate=1.65 / 1.67),
        Case("Effective Aggregation (EM, enc-self [1,2])",
             "li2019/transformer_base_wmt17_zhen_em_enc_self_layers_1-2.yaml",
             train_target=0.90, translate_target=0.97, paper_train=1.67 / 1.92),
    ),
    # cao2019 gives no speed figures
    "cao2019": (
        Case("baseline", "cao2019/transformer_base_wmt17_zhen_baseline.yaml"),
        Case("cross aggregation (vertical + horizontal, zero init.), enc [1-6]",
             "cao2019/transformer_base_wmt17_zhen_cross_zero.yaml", train_target=0.80),
    ),
    # chen2019 Table 3: training tokens/s 10.5K (RPEHead) and 9.9K (MPRHead) against 11.7K.  The NIST Zh-En
    # configs (separate vocabularies, like the Tatoeba sample's); the WMT14 ones differ only in sharing them.
    "chen2019": (
        Case("baseline", "chen2019/transformer_base_nist_zhen_baseline.yaml"),
        Case("RPEHead, d_r 320 (enc + dec)", "chen2019/transformer_base_nist_zhen_rpehead.yaml",
             train_target=0.92, paper_train=10.5 / 11.7),
        Case("MPRHead, d_r 256 (enc + dec)", "chen2019/transformer_base_nist_zhen_mprhead.yaml",
             train_target=0.92, paper_train=9.9 / 11.7),
        Case("MPRHead, head-restricted first layers", "chen2019/transformer_base_nist_zhen_mprhead_restricted.yaml"),
    ),
    # GRET adds one vector per sentence; the targets: 0.95 of the baseline's training and translation speed
    "gret": (
        Case("baseline", "gret/transformer_base_wmt17_zhen_baseline.yaml"),
        Case("GRET (K 4, T 3, all layers, gate)", "gret/transformer_base_wmt17_zhen_gret.yaml",
             train_target=0.95, translate_target=0.95),
    ),
    # Clause attention (issue target: 0.9 of the baseline's training speed with CA in every encoder layer).  The
    # first two cases read SentencePiece'd copies of the data, the CA one with the markers already in (split once
    # by tools/clause_split_corpus.py, -clause_presplit), so they compare the models alone; the third splits
    # with jieba in the training pipeline, as the smoke configs do, which adds the splitting cost.
    "clause": (
        Case("baseline (pre-encoded data)", "clause/transformer_base_wmt16_ende_baseline.yaml", pre_encoded=True),
        Case("CA with rule, every encoder layer, 6 levels (pre-split data)",
             "clause/transformer_base_wmt16_ende_ca_rule.yaml", train_target=0.90, pre_encoded=True),
        Case("CA with rule, split on the fly in training (sentencepiece + clause_split)",
             "clause/transformer_base_wmt16_ende_ca_rule.yaml"),
    ),
}

# keys taken from the smoke twin when a paper config runs on the Tatoeba sample
DATA_KEYS = ("data", "src_vocab", "tgt_vocab", "src_vocab_size", "tgt_vocab_size", "share_vocab",
             "share_embeddings", "transforms", "src_subword_model", "tgt_subword_model",
             "src_seq_length", "tgt_seq_length", "clause_lang", "clause_tagger_model", "clause_presplit")


FINE_TUNING_KEYS = ("train_from", "override_opts", "reset_optim")


def bench_config(case, size, args, workdir, overrides=None, suffix="", repeat=1):
    """Writes the YAML trained for ``case`` (``overrides`` last, ``suffix`` on its name, ``repeat``: see
    :func:`_use_pre_encoded_data`); returns its path, the final checkpoint and the options."""
    paper, twin = common.config_values(case.config), common.config_values(f"smoke/{case.config}")
    if size == "smoke":
        config = dict(twin, enc_layers=paper["enc_layers"], dec_layers=paper["dec_layers"])
    else:
        config = dict(paper)
        for key in FINE_TUNING_KEYS:  # measured from scratch: the speed does not depend on the start
            config.pop(key, None)
        for key in DATA_KEYS:
            config.pop(key, None)
            if key in twin:
                config[key] = twin[key]
        config.update(model_dtype="fp32", batch_type="tokens", batch_size=args.batch_size,
                      valid_batch_size=args.batch_size, accum_count=[1], accum_steps=[0],
                      bucket_size=args.batch_size * 16, num_workers=0)
    name = (Path(case.config).stem + ("_pre_encoded" if case.pre_encoded else "")
            + ("_control" if case.control else "") + suffix)
    if case.pre_encoded:
        _use_pre_encoded_data(config, workdir, repeat)
    total = args.warmup_steps + args.steps
    config.update(
        save_data=str(workdir / name / "samples"), save_model=str(workdir / name / "model"),
        train_steps=total, report_every=args.warmup_steps, valid_steps=10 * total,
        save_checkpoint_steps=total, keep_checkpoint=1, world_size=1,
        gpu_ranks=[0] if args.gpu >= 0 else [], seed=1234, overwrite_checkpoints=True,
    )
    config.update(overrides or {})
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path, workdir / name / f"model_step_{total}.pt", config


def _use_pre_encoded_data(config, workdir, repeat=1):
    """Point ``config`` at SentencePiece'd (with clause attention, pre-split) copies of its corpora, made once;
    training corpora ``repeat`` times over, so that an epoch can outlast the steps measured."""
    transforms = [t for t in config["transforms"] if t != "sentencepiece"]
    for corpus_name, corpus in config["data"].items():
        for side, model in (("src", config["src_subword_model"]), ("tgt", config["tgt_subword_model"])):
            path = Path(REPO / corpus[f"path_{side}"])
            out = workdir / "data" / f"{path.name}.sp"
            if not out.exists():
                encode_file(REPO / model, path, out)
            if side == "src" and config.get("clause_attention"):
                split = out.with_name(out.name + ".clause")
                if not split.exists():
                    command = [sys.executable, str(REPO / "tools/clause_split_corpus.py"), "--lang",
                               config["clause_lang"], "--levels", str(config.get("clause_levels", 6)),
                               "--input", str(out), "--output", str(split)]
                    if config.get("clause_tagger_model"):
                        command += ["--tagger-model", str(REPO / config["clause_tagger_model"])]
                    subprocess.run(command, check=True)
                out = split
            if repeat > 1 and corpus_name != "valid":
                repeated = out.with_name(f"{out.name}.x{repeat}")
                if not repeated.exists():
                    text = out.read_text(encoding="utf-8")
                    partial = repeated.with_name(repeated.name + ".partial")
                    partial.write_text(text * repeat, encoding="utf-8")
                    partial.replace(repeated)
                out = repeated
            corpus[f"path_{side}"] = str(out)
    config["transforms"] = transforms
    if config.get("clause_attention"):
        config["clause_presplit"] = True


# ---------------------------------------------------------------- child processes


def child_train(result_file, head, argv):
    """``onmt_train`` with OpenNMT-py's per-report statistics and the parameter count recorded."""
    from onmt.bin import train

    reports, parameters = [], {}
    common.record_training(reports, parameters)
    sys.argv = ["onmt_train", *argv]
    train.main()
    import torch

    result = {"reports": reports, "peak_memory_mb": common.peak_memory_mb(torch.cuda.is_initialized()),  # gpu_ranks
              "parameters": parameters.get("total")}
    Path(result_file).write_text(json.dumps(result), encoding="utf-8")


def child_translate(result_file, head, argv):
    """``onmt_translate`` with the time spent in translation (model loading excluded) recorded."""
    from onmt.bin import translate
    from onmt.translate import translator

    timing = {}
    inner = translator.Inference._translate

    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        out = inner(self, *args, **kwargs)
        timing["seconds"] = timing.get("seconds", 0.0) + time.perf_counter() - start
        timing["sentences"] = timing.get("sentences", 0) + len(out[1])
        return out

    translator.Inference._translate = timed
    sys.argv = ["onmt_translate", *argv]
    translate.main()
    timing["peak_memory_mb"] = common.peak_memory_mb("-gpu" in argv and "-1" not in argv)
    Path(result_file).write_text(json.dumps(timing), encoding="utf-8")


def _run_child(kind, argv, log, threads):
    try:
        return common.run_child(Path(__file__).resolve(), kind, argv, log, threads)
    except common.ChildFailed as failure:
        raise SystemExit(f"bench.py: error: {failure}") from None


# ---------------------------------------------------------------- measurement


def measure_training(case, size, args, workdir):
    """One training run of ``case``; returns its figures and what translating its checkpoint needs."""
    config_path, checkpoint, config = bench_config(case, size, args, workdir)
    name = config_path.stem
    train = _run_child("train", ["-config", config_path, "-log_file_level", "WARNING"],
                       workdir / f"{name}.train.log", args.threads)
    measured = train["reports"][1:]  # the first report covers the warm-up
    if not measured:
        raise SystemExit(f"bench.py: no training reports after the warm-up for {case.config}")
    figures = {"train_tokens_per_s": sum(r["tgt_tokens"] for r in measured) / sum(r["seconds"] for r in measured),
               "train_peak_memory_mb": train["peak_memory_mb"], "parameters": train["parameters"]}
    return figures, (name, checkpoint, config)


#: The two searches measured: (key of the figures, output suffix, onmt_translate options).  Greedy search is
#: OpenNMT-py's sampling from the top 1 (beam size 1 alone is a one-beam search).
SEARCHES = (("translate", "", ("-beam_size", 4)),
            ("greedy", ".greedy", ("-beam_size", 1, "-random_sampling_topk", 1)))


def measure_translation(search, model, args, workdir, test_source):
    """One ``onmt_translate`` run of ``search`` (one of ``SEARCHES``) with ``model`` from :func:`measure_training`."""
    from onmt_ext.clause_split import translate_options

    key, suffix, options = search
    name, checkpoint, config = model
    result = _run_child("translate", [
        "-model", checkpoint, "-src", test_source, "-batch_size", 32, "-batch_type", "sents",
        "-min_length", args.output_length, "-max_length", args.output_length, "-max_length_ratio", 0,
        "-gpu", args.gpu, *translate_options(config),  # the test source split as in training
        "-output", workdir / f"{name}{suffix}.hyp", *options], workdir / f"{name}{suffix or '.translate'}.log",
        args.threads)
    figures = {f"{key}_sentences_per_s": result["sentences"] / result["seconds"]}
    if key == "translate":
        figures["translate_peak_memory_mb"] = result["peak_memory_mb"]
    return figures


def translation_schedule(cases, baseline, passes, block=1):
    """The running order of one search's translations, ``passes`` of each other case, ``block`` of them between
    two baseline runs; passes alternate in direction and share the baseline run at their boundary::

        B c1 B c2 B c3 B | c3 B c2 B c1 B | c1 B ...        block 1
        B c1 c2 B c3 B | c3 c2 B c1 B | ...                 block 2
    """
    others = [case for case in cases if case is not baseline]
    schedule = [baseline]
    for number in range(passes):
        ordered = others if number % 2 == 0 else others[::-1]
        for start in range(0, len(ordered), block):
            schedule += [*ordered[start:start + block], baseline]
    return schedule


def measure_round(cases, size, args, workdir, test_source, label, baseline):
    """One repeat: every case trained, then translated with each search in :func:`translation_schedule`'s order.
    Returns ``{case: figures}`` (medians of its runs), with ``<search>_ratios``: each run's sentences/s over the
    geometric mean of the baseline runs beside it.  Why: docs/benchmarks-method.md."""
    figures, models = {}, {}
    for case in cases:
        print(f"== bench {label}: train {case.label}", flush=True)
        figures[case], models[case] = measure_training(case, size, args, workdir)
    for search in SEARCHES:
        key = f"{search[0]}_sentences_per_s"
        repeats = args.translate_repeats if search[0] == "translate" else args.greedy_repeats
        schedule = translation_schedule(cases, baseline, repeats)
        runs = []
        for number, case in enumerate(schedule):
            print(f"== bench {label}: {search[0]} {case.label} (run {number + 1}/{len(schedule)})", flush=True)
            runs.append(measure_translation(search, models[case], args, workdir, test_source))
        for case in cases:
            own = [index for index, scheduled in enumerate(schedule) if scheduled is case]
            figures[case].update({name: statistics.median(runs[index][name] for index in own)
                                  for name in runs[own[0]]})
            figures[case][f"{search[0]}_ratios"] = [1.0] * repeats if case is baseline else [
                runs[index][key] / math.sqrt(runs[index - 1][key] * runs[index + 1][key]) for index in own]
    return figures


def median_interval(values, level=0.95):
    """Distribution-free interval ``(x_(k), x_(n+1-k))`` for the median of ``values``, with the largest k whose
    coverage ``1 - 2 P(Binomial(n, 1/2) < k)`` reaches ``level``; None when k = 1 falls short (n < 6 at 0.95)."""
    ordered, n = sorted(values), len(values)
    chosen, below = None, 0
    for k in range(1, (n + 1) // 2 + 1):
        below += math.comb(n, k - 1)  # the sum of C(n, i) for i < k
        if 1 - 2 * below / 2**n < level:
            break
        chosen = k
    return None if chosen is None else (ordered[chosen - 1], ordered[n - chosen])


def spread_indices(total, count):
    """``count`` line numbers spread evenly over ``total`` (the Tatoeba test set is sorted by length, so its head
    would under-represent the encoder's share of the work)."""
    count = min(count, total)
    return [index * total // count for index in range(count)]


def _test_source(workdir, sentences):
    """``(path, mean source pieces, mean first-reference pieces)`` of ``sentences`` Tatoeba test sentences spread
    over the test set, SentencePiece-encoded."""
    import sentencepiece as spm

    data = REPO / "build/tatoeba"
    if not (data / "spm.zh.model").exists():
        from onmt_ext.compat import make_command

        raise SystemExit(f"bench.py: build/tatoeba is missing; run `{make_command('data')}` first")
    sources = (data / "test.zh").read_text(encoding="utf-8").splitlines()
    references = (data / "test.en.ref0").read_text(encoding="utf-8").splitlines()
    chosen = spread_indices(len(sources), sentences)
    raw = workdir / "test.zh"
    raw.write_text("".join(sources[index] + "\n" for index in chosen), encoding="utf-8")
    path = encode_file(data / "spm.zh.model", raw, workdir / "test.sp.zh")
    pieces = spm.SentencePieceProcessor(model_file=str(data / "spm.en.model"))
    source_pieces = sum(len(line.split()) for line in path.read_text(encoding="utf-8").splitlines()) / len(chosen)
    reference_pieces = sum(len(pieces.encode(references[index])) for index in chosen) / len(chosen)
    return path, source_pieces, reference_pieces


def natural_output_length(reference_pieces):
    """Decoding steps of an output as long as the mean reference: its pieces plus the end-of-sentence step."""
    return max(1, round(reference_pieces + 1))


def _ratio_text(ratio, target=None, interval=None):
    """``ratio [interval] (meets|BELOW >= target)``: three decimals where two would hide which side of the
    target the ratio is on."""
    near = target is not None and f"{ratio:.2f}" == f"{target:.2f}"
    text = f"{ratio:.3f}" if near else f"{ratio:.2f}"
    if interval is not None:
        text += f" [{interval[0]:.3f}, {interval[1]:.3f}]"
    if target is not None:
        text += f" ({'meets' if ratio >= target else 'BELOW'} >= {target:.2f})"
    return text


def _ratio_cell(ratio, target, paper, interval=None):
    """:func:`_ratio_text` and the paper's column: its ratio rounded half up, as the README quotes it
    (1.20 / 1.92 = 0.625: 0.63), or n/a."""
    quoted = "n/a" if paper is None else Decimal(repr(paper)).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
    return f"{_ratio_text(ratio, target, interval)} | {quoted}"


def _device(args):
    if args.gpu >= 0:
        return f"GPU {args.gpu}"
    return f"CPU, {args.threads} thread(s)" if args.threads else "CPU, torch's default threads"


def _translation_ratio(figures, search):
    """The median of a case's paired ratios for ``search`` and their 95% interval (None for fewer than six)."""
    ratios = figures[f"{search}_ratios"]
    return statistics.median(ratios), median_interval(ratios)


def pool(runs):
    """One case's figures over the repeats: medians of the scalars, the paired ratios of every repeat together."""
    return {key: ([value for run in runs for value in run[key]] if isinstance(runs[0][key], list)
                  else statistics.median(run[key] for run in runs)) for key in runs[0]}


def report(suite, size, results, args):
    """Markdown table of medians and ratios; returns (text, list of missed targets)."""
    base = results[0][1]
    passes, greedy_passes = args.repeats * args.translate_repeats, args.repeats * args.greedy_repeats
    lines = [
        f"Benchmark `{suite}` at `{size}` size: {args.steps} measured training steps after {args.warmup_steps} "
        f"warm-up steps, {args.test_sentences} test sentences spread over the Tatoeba test set (sources "
        f"{args.source_pieces:.1f} pieces on average, first references {args.reference_pieces:.1f}) translated "
        f"(beam 4, every output forced to {args.output_length} decoding steps); medians of {args.repeats} "
        f"interleaved repeat(s); translation: {args.translate_repeats} beam and {args.greedy_repeats} greedy "
        f"passes per repeat, each case's run between two of the baseline's, "
        f"sentences/s the median over the repeats of each repeat's median, ratios the median of the {passes} "
        f"(greedy: {greedy_passes}) paired ratios (a case's speed over the geometric mean of the baseline runs "
        f"just before and after it) with a distribution-free 95% interval for that median in brackets; device: "
        f"{_device(args)}."
        + (" The A/A control is the baseline measured a second time: its ratios are the machine's noise."
           if any(case.control for case, _ in results) else ""),
        "",
        "| case | train tok/s | train ratio (target) | paper | translate sent/s | translate ratio (target) | paper "
        "| greedy sent/s | greedy ratio | train peak MB | translate peak MB | parameters |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    missed = []
    for case, figures in results:
        train_ratio = figures["train_tokens_per_s"] / base["train_tokens_per_s"]
        translate_ratio, translate_interval = _translation_ratio(figures, "translate")
        greedy_ratio, greedy_interval = _translation_ratio(figures, "greedy")
        for ratio, target, what in ((train_ratio, case.train_target, "training"),
                                    (translate_ratio, case.translate_target, "translation")):
            if target is not None and ratio < target:
                missed.append(f"{case.label}: {what} speed ratio {ratio:.3f} < target {target:.2f}")
        lines.append(
            f"| {case.label} | {figures['train_tokens_per_s']:.0f} | "
            f"{_ratio_cell(train_ratio, case.train_target, case.paper_train)} | "
            f"{figures['translate_sentences_per_s']:.1f} | "
            f"{_ratio_cell(translate_ratio, case.translate_target, case.paper_translate, translate_interval)} | "
            f"{figures['greedy_sentences_per_s']:.1f} | "
            f"{_ratio_text(greedy_ratio, interval=greedy_interval)} | "
            f"{figures['train_peak_memory_mb']:.0f} | {figures['translate_peak_memory_mb']:.0f} | "
            f"{figures['parameters']:,} |")
    return "\n".join(lines) + "\n", missed


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return common.child_main(argv, {"train": child_train, "translate": child_translate})
    parser = common.Parser(prog="bench.py", description=__doc__.split("\n")[0])
    parser.add_argument("--suite", choices=sorted(SUITES), default="li2019")
    parser.add_argument("--size", choices=("smoke", "paper"), default="smoke")
    parser.add_argument("--steps", type=common.at_least(1), default=None,
                        help="measured training steps (default: 300 at --size smoke, 100 at --size paper)")
    parser.add_argument("--warmup-steps", type=common.at_least(1), default=20, help="unmeasured first steps")
    parser.add_argument("--batch-size", type=int, default=1024, help="tokens per step at --size paper")
    parser.add_argument("--repeats", type=common.at_least(1), default=3)
    parser.add_argument("--translate-repeats", type=common.at_least(1), default=10,
                        help="beam-search passes per round (each case's run between two of the baseline's)")
    parser.add_argument("--greedy-repeats", type=common.at_least(1), default=2,
                        help="greedy-search passes per round (no target depends on them)")
    parser.add_argument("--control", action=argparse.BooleanOptionalAction, default=True,
                        help="measure the baseline twice, the second time as an A/A control (default: on)")
    parser.add_argument("--test-sentences", type=common.at_least(1), default=200,
                        help="test sentences per translation (a process's own speed varies by a few percent "
                             "whatever its length, so many short runs measure more precisely than few long ones)")
    parser.add_argument("--output-length", type=common.at_least(0), default=0,
                        help="decoding steps of every translation (-min_length = -max_length); 0 (default): "
                             "the test sentences' mean reference length plus the end-of-sentence step")
    parser.add_argument("--gpu", type=int, default=-1, help="GPU id; -1: CPU")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads per run (OMP_NUM_THREADS; 0: torch's default). One thread gives "
                             "steadier ratios on a small shared machine")
    parser.add_argument("--out", type=Path, default=REPO / "results/bench", help="where the reports go")
    parser.add_argument("--work", type=Path, default=REPO / "build/bench", help="models, data and logs")
    args = parser.parse_args(argv)
    if args.steps is None:  # a smoke step takes about 70 ms: 300 steps measure about 20 s per run
        args.steps = SMOKE_STEPS if args.size == "smoke" else 100
    if args.steps % args.warmup_steps:  # training reports come every --warmup-steps steps
        parser.error(f"--steps {args.steps} must be a multiple of --warmup-steps {args.warmup_steps}")
    workdir = args.work / f"{args.suite}-{args.size}"
    workdir.mkdir(parents=True, exist_ok=True)
    test_source, args.source_pieces, args.reference_pieces = _test_source(workdir, args.test_sentences)
    args.output_length = args.output_length or natural_output_length(args.reference_pieces)
    cases = SUITES[args.suite]
    if args.control:
        cases = (cases[0], control_case(cases[0])) + cases[1:]
    runs = {case: [] for case in cases}
    for repeat in range(args.repeats):
        order = cases if repeat % 2 == 0 else tuple(reversed(cases))
        measured = measure_round(order, args.size, args, workdir, test_source,
                                 f"{args.suite}/{args.size} repeat {repeat + 1}/{args.repeats}", baseline=cases[0])
        for case in cases:
            runs[case].append(measured[case])
    results = [(case, pool(runs[case])) for case in cases]
    text, missed = report(args.suite, args.size, results, args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.suite}-{args.size}.md").write_text(text, encoding="utf-8")
    (args.out / f"{args.suite}-{args.size}.json").write_text(json.dumps(
        {"args": {k: str(v) for k, v in vars(args).items()},
         "runs": {case.label: runs[case] for case in cases}}, indent=1), encoding="utf-8")
    print(text)
    for line in missed:  # information: the CPU bench is not a pass/fail gate
        print(f"bench.py: below target: {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
