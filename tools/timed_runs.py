#!/usr/bin/env python
"""The configs that ``python -m tools.gpu_check`` times, and the pieces of its method that are not about a GPU.

A :class:`Case` is a paper config with its speed targets.  :func:`case_config` writes the YAML of one timed run
(the smoke twin with the paper's layer counts, or the Base config on the Tatoeba sample); with ``pre_encoded``
the run reads SentencePiece'd (and clause-split) copies of the data, so that it times the model, not the
transforms.  Translation runs follow :func:`translation_schedule`, each between two of the baseline's, and
:func:`median_interval` bounds the median of their paired ratios.  Why: docs/benchmarks-method.md.
"""

import math
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from tools import common
from tools.prepare_tatoeba import encode_file

REPO = common.REPO


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
    #: -ext_compile auto compiles its cores in training on CUDA (onmt_ext.runtime.compile)
    compiles_by_default: bool = False


def control_case(baseline):
    """The baseline again as one more case, an A/A control: any ratio of it other than 1 is the machine's."""
    return Case(f"{baseline.label}, again (A/A control)", baseline.config, pre_encoded=baseline.pre_encoded,
                control=True)


# keys taken from the smoke twin when a paper config runs on the Tatoeba sample
DATA_KEYS = ("data", "src_vocab", "tgt_vocab", "src_vocab_size", "tgt_vocab_size", "share_vocab",
             "share_embeddings", "transforms", "src_subword_model", "tgt_subword_model",
             "src_seq_length", "tgt_seq_length", "clause_lang", "clause_tagger_model", "clause_presplit")
#: options a fine-tuning config carries that a timed run from scratch drops
FINE_TUNING_KEYS = ("train_from", "override_opts", "reset_optim")


def case_config(case, size, args, workdir, overrides=None, suffix="", repeat=1, lines=None):
    """Writes the YAML trained for ``case`` (``overrides`` last, ``suffix`` on its name, ``repeat`` and ``lines``:
    see :func:`_use_pre_encoded_data`); returns its path, the final checkpoint and the options."""
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
        _use_pre_encoded_data(config, workdir, repeat, lines)
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


def _stale(target, *inputs):
    """True when ``target`` is missing or older than any of ``inputs`` (a copy made from data since remade)."""
    return not target.exists() or any(Path(path).stat().st_mtime_ns > target.stat().st_mtime_ns for path in inputs)


def _use_pre_encoded_data(config, workdir, repeat=1, lines=None):
    """Point ``config`` at SentencePiece'd (with clause attention, pre-split) copies of its corpora (``lines``: of
    that many lines spread over each), made again whenever what they are made from is newer; training corpora
    ``repeat`` times over, so that an epoch can outlast the steps measured."""
    transforms = [t for t in config["transforms"] if t != "sentencepiece"]
    outputs, splitting = {}, {}  # the corpora's clause splits run at once, one process per output
    try:
        _encode_and_split(config, workdir, outputs, splitting, lines)
        for command, process in splitting.values():
            if process.wait():
                raise subprocess.CalledProcessError(process.returncode, command)
    finally:
        for _, process in splitting.values():
            if process.poll() is None:
                process.kill()
                process.wait()
    for (corpus_name, side), out in outputs.items():
        if repeat > 1 and corpus_name != "valid":
            out = repeated_file(out, repeat, varied=side == "src")
        config["data"][corpus_name][f"path_{side}"] = str(out)
    config["transforms"] = transforms
    if config.get("clause_attention"):
        config["clause_presplit"] = True


#: processes of a corpus's clause split (python -m tools.clause_split_corpus --jobs): up to 8, a quarter of the cores,
#: since gpu-check splits beside its property tests
SPLIT_JOBS = max(1, min(8, (os.cpu_count() or 1) // 4))


def _encode_and_split(config, workdir, outputs, splitting, lines=None):
    """The SentencePiece'd copy of each corpus side (made now), and the clause split of each source (started as a
    process in ``splitting``, ``{output: (command, process)}``, once per output); ``outputs[corpus, side]``: the
    file that side will read.  A timed run never validates (``valid_steps`` lies past its last step), so the
    validation corpus reads the training corpus's copies: its own split cost a second process."""
    corpora = sorted(config["data"].items(), key=lambda item: item[0] == "valid")
    trained = next((name for name, _ in corpora if name != "valid"), None)
    for corpus_name, corpus in corpora:
        if corpus_name == "valid" and trained:
            outputs.update({("valid", side): outputs[trained, side] for side in ("src", "tgt")})
            continue
        for side, model in (("src", config["src_subword_model"]), ("tgt", config["tgt_subword_model"])):
            path = Path(REPO / corpus[f"path_{side}"])
            out = workdir / "data" / f"{path.name}{f'.spread{lines}' if lines else ''}.sp"
            if _stale(out, path, REPO / model):
                encode_file(REPO / model, path, out, limit=lines, spread=True)
            if side == "src" and config.get("clause_attention"):
                from onmt_ext.mechanisms.clause.split import ClauseSplitOptions  # imports OpenNMT-py: only here

                split_options = ClauseSplitOptions.from_opts(config)
                levels, tagger = split_options.levels, split_options.tagger_model or None
                split = out.with_name(f"{out.name}.clause{levels}" + (".tagger" if tagger else ""))
                if split not in splitting and _stale(split, out, *([REPO / tagger] if tagger else [])):
                    command = [sys.executable, "-m", "tools.clause_split_corpus", "--lang",
                               config["clause_lang"], "--levels", str(levels), "--input", str(out),
                               "--output", str(split), "--jobs", str(SPLIT_JOBS)]
                    if tagger:
                        command += ["--tagger-model", str(REPO / tagger)]
                    splitting[split] = (command, subprocess.Popen(command))
                out = split
            outputs[corpus_name, side] = out


#: a placeholder piece, as the clause markers of onmt_ext.mechanisms.clause.split (``｟cl4_prep｠``)
PLACEHOLDER = re.compile(r"｟[^｠]*｠")


def repeated_file(path, copies, varied=False):
    """``<path>.x<copies>``: the lines of ``path`` ``copies`` times over, made again when ``path`` is newer.

    ``varied`` (``<path>.v<copies>``, for training sources): copy ``k`` of each line is :func:`varied_line`
    ``(line, k)``.  OpenNMT-py leaves out of a training batch a source line already in it, so plain copies that
    meet in one bucket are built and then dropped (results/bench/host-kept.md).  Varied copies keep each line's
    length, pieces and clause markers."""
    repeated = path.with_name(f"{path.name}.{'v' if varied else 'x'}{copies}")
    if _stale(repeated, path):
        partial = repeated.with_name(repeated.name + ".partial")
        text = path.read_text(encoding="utf-8")
        if varied:
            lines = text.splitlines()
            text = "".join(varied_line(line, copy) + "\n" for copy in range(copies) for line in lines)
        else:
            text *= copies
        partial.write_text(text, encoding="utf-8")
        partial.replace(repeated)
    from onmt_ext.mechanisms.clause.split import RECORD_SUFFIX  # imports OpenNMT-py: only here

    record = path.with_name(path.name + RECORD_SUFFIX)  # a clause split's record holds for its copies too
    if record.is_file():
        shutil.copyfile(record, repeated.with_name(repeated.name + RECORD_SUFFIX))
    return repeated


def varied_line(line, copy):
    """``line`` with its pieces other than placeholders (``｟...｠``, clause markers) rotated ``copy`` places left,
    and reversed on every second round of rotations: up to twice as many distinct copies as the line has
    such pieces.  Copy 0 is ``line``."""
    pieces = line.split()
    where = [index for index, piece in enumerate(pieces) if not PLACEHOLDER.fullmatch(piece)]
    if copy == 0 or len(where) < 2:
        return line
    moved = [pieces[index] for index in where]
    shift = copy % len(moved)
    moved = moved[shift:] + moved[:shift]
    if (copy // len(moved)) % 2:
        moved.reverse()
    for index, piece in zip(where, moved):
        pieces[index] = piece
    return " ".join(pieces)


#: The two searches measured: (key of the figures, output suffix, onmt_translate options).  Greedy search is
#: OpenNMT-py's sampling from the top 1 (beam size 1 alone is a one-beam search).
SEARCHES = (("translate", "", ("-beam_size", 4)),
            ("greedy", ".greedy", ("-beam_size", 1, "-random_sampling_topk", 1)))


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


def translation_source(workdir, sentences):
    """``(path, mean source pieces, mean first-reference pieces)`` of ``sentences`` Tatoeba test sentences spread
    over the test set, SentencePiece-encoded."""
    import sentencepiece as spm

    data = REPO / "build/tatoeba"
    if not (data / "spm.zh.model").exists():
        from onmt_ext.runtime.compat import make_command

        raise SystemExit(f"gpu_check.py: build/tatoeba is missing; run `{make_command('data')}` first")
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
