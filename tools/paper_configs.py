#!/usr/bin/env python
"""Writes (or checks) the paper configs under yaml_configs/<paper>/ and their smoke twins.

Usage::

    python tools/paper_configs.py            # (re)write every generated config
    python tools/paper_configs.py --check    # exit 1 if a committed config differs

Every paper row is the matching baseline config of ``yaml_configs/baseline/``
(same data, size, schedule and hardware settings) with the onmt-ext model types
and the row's mechanism options added; its smoke twin is the baseline's smoke
twin with the same additions.  Keeping the rows here, in one table per paper,
means a fix to a baseline reaches every paper config, and the test suite
checks that the committed files are what this script writes.
"""

import argparse
import difflib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "yaml_configs"
SIZES = ("base", "big")


@dataclass(frozen=True)
class Row:
    """One table row of a paper: a config name suffix, what it is, and its options.

    ``smoke_options`` override size options of the smoke twin only (e.g. a
    layer count the row's layer indices need); ``tasks`` restricts the row to
    some of the paper's tasks.  A row without options is the paper's own
    baseline run (stock OpenNMT-py model types, the paper's run settings).
    """

    name: str
    description: str
    options: dict
    smoke_options: dict = field(default_factory=dict)
    tasks: tuple = None


@dataclass(frozen=True)
class Paper:
    key: str
    title: str
    tasks: tuple
    rows: tuple
    run_options: dict = field(default_factory=dict)  # paper configs only (run settings, not the model)
    speed_options: dict = field(default_factory=dict)  # paper configs of mechanism rows only (e.g. compilation)
    sizes: tuple = SIZES
    batch_note: str = ""  # replaces the baseline's comment on the batch when run_options set it


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
        Row("simple_enc_self", "Table 2 row 3: simple routing in encoder self-attention, all layers",
            {"li2019_enc_self": "simple"}),
        Row("em_enc_self", "Table 2 row 4 = Table 3 row 2: EM routing in encoder self-attention, all layers",
            {"li2019_enc_self": "em"}),
        Row("em_enc_dec", "Table 2 row 5: EM routing in encoder-decoder attention, all layers",
            {"li2019_enc_dec": "em"}),
        Row("em_dec_self", "Table 2 row 6: EM routing in decoder self-attention, all layers",
            {"li2019_dec_self": "em"}),
        Row("em_enc_self_dec_self", "Table 2 row 7: EM routing in encoder and decoder self-attention "
            "(the two components are inferred: see README)",
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


PAPERS = (
    Paper("li2019", "Li et al. 2019, information aggregation for multi-head attention with routing-by-agreement",
          ("wmt14_ende", "wmt17_zhen"), _li2019_rows(), speed_options={"routing_compile": True}),
    # sec. 4.1: 2048 tokens per batch, gradients accumulated 12 times, on 2 GPUs (one GPU: 24 times)
    Paper("cao2019", "Cao, Zhao and Yu 2019, cross aggregation of multi-head attention",
          ("wmt14_ende", "wmt17_zhen"), _cao2019_rows(),
          {"batch_size": 2048, "valid_batch_size": 2048, "accum_count": [24]}, sizes=("base",),
          batch_note="cao2019 sec. 4.1: 2048 tokens per batch, 12 accumulations, 2 GPUs; accum_count is the "
                     "one-GPU equivalent (make reproduce-* divides it by GPUS)"),
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


def render(paper, row, size, task, smoke):
    """Text of the config (or smoke twin) of ``row`` at ``size`` on ``task``."""
    base_name = f"transformer_{size}_{task}.yaml"
    base_path = CONFIGS / ("smoke/baseline" if smoke else "baseline") / base_name
    text = _strip_header(base_path.read_text(encoding="utf-8"))
    name = f"transformer_{size}_{task}_{row.name}"
    runs = "build/smoke" if smoke else "build/runs"
    text = _set_key(text, "save_data", f"{runs}/{paper.key}/{name}/samples", base_path)
    text = _set_key(text, "save_model", f"{runs}/{paper.key}/{name}/model", base_path)
    if row.options:
        text = _set_key(text, "encoder_type", "ext_transformer", base_path)
        text = _set_key(text, "decoder_type", "ext_transformer", base_path)
    if smoke:
        for key, value in row.smoke_options.items():
            text = _set_key(text, key, value, base_path)
    else:  # run settings that are top-level keys of the baseline are replaced in place
        if "batch_size" in paper.run_options:  # the baseline's comment on its batch no longer applies
            text = re.sub(r"(^#[^\n]*\n)+(?=batch_type:)", f"# {paper.batch_note}\n", text, count=1, flags=re.M)
        for key, value in paper.run_options.items():
            if _has_key(text, key):
                text = _set_key(text, key, value, base_path)
    if smoke:
        header = (f"# Smoke twin of yaml_configs/{paper.key}/{name}.yaml: the same options at toy size\n"
                  f"# on the shipped Tatoeba sample (built from yaml_configs/smoke/baseline/{base_name}).\n")
    else:
        header = (f"# {paper.title}.\n# {row.description}.\n"
                  f"# Transformer-{size.capitalize()} on {task}: everything but the block below"
                  f"{' and the batch settings' if paper.run_options.keys() & {'batch_size', 'accum_count'} else ''}"
                  f" is yaml_configs/baseline/{base_name}.\n")
    header += "# Generated by tools/paper_configs.py: edit the row there, not this file.\n"
    extra = {} if smoke else {k: v for k, v in paper.run_options.items() if not _has_key(text, k)}
    options = dict(row.options, **extra, **({} if smoke or not row.options else paper.speed_options))
    block = f"# --- {paper.key} ---\n" + "".join(f"{k}: {_yaml_value(v)}\n" for k, v in options.items())
    if not options:
        block = f"# --- {paper.key}: no mechanism (the paper's baseline run) ---\n"
    return header + text.rstrip("\n") + "\n" + block


def generated():
    """``{path: text}`` of every generated config."""
    files = {}
    for paper in PAPERS:
        for row in paper.rows:
            for size in paper.sizes:
                for task in row.tasks or paper.tasks:
                    name = f"transformer_{size}_{task}_{row.name}.yaml"
                    files[CONFIGS / paper.key / name] = render(paper, row, size, task, smoke=False)
                    files[CONFIGS / "smoke" / paper.key / name] = render(paper, row, size, task, smoke=True)
    return files


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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
