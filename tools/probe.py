#!/usr/bin/env python
"""li2019's Table 1: Conneau et al.'s (2018) ten probing tasks on SentEval's data, beside the paper's numbers.

Usage::

    python -m tools.probe fetch [--data build/downloads/probing]
    python -m tools.probe run [--data DIR] [--out results/probe-li2019] [--models base,simple,em] [--tasks WC,...]
        [--device cuda] [--max-train N] [--nhid 50,100,200] [--dropout 0,0.1,0.2] [--l2 1e-5,1e-4,1e-3,1e-2]
    python -m tools.probe run --checkpoint MODEL.pt [--src-subword-model spm.model] ...   (a frozen NMT encoder)

``run`` trains, per task and aggregation, li2019's probing model (3 Transformer-Base encoder layers, the mean of the
top layer, an MLP), or with ``--checkpoint`` probes that model's encoder; writes ``probe.json`` and ``probe.md``.
How it works and why: docs/probing.md.
"""

import hashlib
import itertools
import json
import sys
from collections import Counter
from pathlib import Path

from tools import common

#: SentEval's probing files (column, file, git blob id at ``SENTEVAL_COMMIT``), in li2019's Table 1 order.
TASKS = (
    ("SeLen", "sentence_length.txt", "9799e50a7579b5b60294b708cedc063aea16f0be"),
    ("WC", "word_content.txt", "596d6fc7c624a989342f5aef2fa035d0d84f65b7"),
    ("TrDep", "tree_depth.txt", "91567ad524de360c38105afc39d29fb7ef6b5eb8"),
    ("ToCo", "top_constituents.txt", "1d00fe9b16f71303af7f0471fa028077f742d8b0"),
    ("BShif", "bigram_shift.txt", "1226c0467bd342c92132dd2fd26e54b7bd066bd7"),
    ("Tense", "past_present.txt", "d11394b28383bb1a8148670e33d39e5fcd326b16"),
    ("SubNm", "subj_number.txt", "dee5770953ad194ceafc68106bd9c071986c6d2a"),
    ("ObjNm", "obj_number.txt", "c5a6f758f2293d0ed0774de327ff8199322d12ee"),
    ("SOMO", "odd_man_out.txt", "ca1ec154df17e366330c542b48bdca5cfa65bf1c"),
    ("CoIn", "coordination_inversion.txt", "281888217fd1ed7faef2c63c5350d2ff1b8e64ce"),
)
SENTEVAL_COMMIT = "5d6dc117d1ac30357ddaeb7347fb5684e9b87015"  # SentEval's main branch, 2020-09-25
URL = "https://raw.githubusercontent.com/facebookresearch/SentEval/{commit}/data/probing/{file}"
DATA = Path("build/downloads/probing")
OUT = Path("results/probe-li2019")
PARTITIONS = ("tr", "va", "te")

#: li2019 Table 1 (sec. 5.1.2; /work/shared/papers/li2019-routing-aggregation.txt lines 162-165), accuracy in %.
PAPER = {
    "base": (97.22, 97.92, 44.48, 84.44, 49.30, 84.20, 87.66, 82.94, 50.24, 68.77),
    "simple": (97.10, 98.85, 43.37, 86.15, 49.87, 88.22, 87.25, 85.07, 48.77, 69.12),
    "em": (96.26, 98.75, 47.72, 87.00, 51.82, 88.17, 89.97, 86.40, 51.55, 69.86),
}
PAPER_SOURCE = "li2019 Table 1 (sec. 5.1.2)"
#: Our model names and the li2019 aggregation each one uses (onmt_ext.mechanisms.li2019: concat = stock).
MODELS = {"base": "concat", "simple": "simple", "em": "em"}
#: li2019 sec. 5.1.1: 3 encoder layers as in Transformer-Base; 512 output capsules, 3 routing iterations.
ENCODER = {"layers": 3, "d_model": 512, "heads": 8, "d_ff": 2048, "dropout": 0.1, "capsules": 512, "iterations": 3}


def _fail(message):
    raise SystemExit(f"probe.py: {message}")


# ---------------------------------------------------------------- data
def git_blob_id(path):
    """The git blob id (SHA-1 of ``blob <size>\\0`` + content) of a file: what SentEval's tree records."""
    data = Path(path).read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def fetch(data=DATA, tasks=TASKS, commit=SENTEVAL_COMMIT):
    """Every probing file into ``data`` by the corpora's fetcher, then checked against SentEval's git blob ids."""
    from tools import prepare_data

    for _, name, blob in tasks:
        path = prepare_data.download(prepare_data.Archive(URL.format(commit=commit, file=name)), Path(data))
        if git_blob_id(path) != blob:
            _fail(f"{path} is not SentEval's {name} at {commit[:12]} (git blob {git_blob_id(path)}, expected "
                  f"{blob}); delete it and rerun")


def read_task(path):
    """``{partition: (sentences as token lists, labels)}`` of a SentEval probing file (``partition<TAB>label<TAB>
    ...<TAB>sentence``); a malformed line: one line naming ``path:line``."""
    splits = {p: ([], []) for p in PARTITIONS}
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        _fail(f"cannot read {path}: {error}")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        fields = line.rstrip("\r\n").split("\t")
        if len(fields) < 3 or fields[0] not in splits or not fields[1] or not fields[-1].split():
            _fail(f"{path}:{number}: expected 'tr|va|te<TAB>label<TAB>sentence', got {line[:60]!r}")
        splits[fields[0]][0].append(fields[-1].split())
        splits[fields[0]][1].append(fields[1])
    missing = [p for p in PARTITIONS if not splits[p][0]]
    if missing:
        _fail(f"{path}: no {'/'.join(missing)} lines")
    unseen = sorted(set(splits["va"][1] + splits["te"][1]) - set(splits["tr"][1]))
    if unseen:
        _fail(f"{path}: labels {unseen[:5]} occur in va/te but not in tr")
    return splits


# ---------------------------------------------------------------- models
def build_encoder(vocab_size, pad, method, layers, d_model, heads, d_ff, dropout, capsules, iterations):
    """li2019's probing encoder: OpenNMT-py's Transformer encoder, its self-attention heads aggregated by
    ``method`` (``concat``, ``simple``, ``em``) in every layer."""
    import onmt  # noqa: F401  (loads onmt-ext through its start-up hook)
    import torch
    from onmt.encoders.transformer import TransformerEncoder
    from onmt.modules import Embeddings

    from onmt_ext.mechanisms.li2019 import RoutingAggregation

    embeddings = Embeddings(d_model, vocab_size, pad, position_encoding=True, dropout=dropout)
    encoder = TransformerEncoder(layers, d_model, heads, d_ff, dropout, dropout, embeddings, 0, 0)
    for module in encoder.modules():  # OpenNMT-py leaves them undrawn; Transformer-Base's -param_init_glorot
        for name, param in module.named_parameters(recurse=False):
            if name == "weight" and param.dim() > 1:
                torch.nn.init.xavier_uniform_(param)
            elif name == "bias":
                torch.nn.init.zeros_(param)
    if method != "concat":  # after the pass above, which would overwrite its capsule maps' stated draw
        for layer in encoder.transformer:
            layer.self_attn.final_linear = RoutingAggregation(heads, d_model, capsules, method, iterations)
    return encoder


def load_checkpoint(checkpoint):
    """A trained NMT checkpoint's model (eval mode, CPU) and vocabularies: the one place that loads one here."""
    from tools import gret_probe

    return gret_probe.load_model(checkpoint, "--checkpoint", "probe.py")


def make_probe(encoder, inputs, nhid, classes, dropout):
    """The classifier: Conneau et al.'s MLP (linear, dropout, sigmoid, linear; ``nhid`` 0: linear) on the input
    vectors, or on the mean of ``encoder``'s top layer over the words; a ``torch.nn.Module``."""
    import torch

    head = (torch.nn.Linear(inputs, classes) if nhid == 0 else torch.nn.Sequential(
        torch.nn.Linear(inputs, nhid), torch.nn.Dropout(dropout), torch.nn.Sigmoid(), torch.nn.Linear(nhid, classes)))

    class Probe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder, self.head = encoder, head

        def forward(self, batch):
            if self.encoder is None:
                return self.head(batch)
            src, lengths = batch
            out, _, _ = self.encoder(src, lengths)
            keep = (torch.arange(out.size(1), device=out.device)[None] < lengths[:, None]).unsqueeze(-1)
            return self.head((out * keep).sum(1) / lengths[:, None].to(out.dtype))

    return Probe()


def _batch(inputs, index, pad, device):
    """Rows ``index`` of ``inputs``: a feature tensor's rows, or token-id lists padded to ``(batch, len, 1)``."""
    import torch

    if isinstance(inputs, torch.Tensor):
        return inputs[index].to(device)
    rows = [inputs[i] for i in index]
    lengths = torch.tensor([len(r) for r in rows])
    src = torch.full((len(rows), int(lengths.max()), 1), pad, dtype=torch.long)
    for i, row in enumerate(rows):
        src[i, : len(row), 0] = torch.tensor(row)
    return src.to(device), lengths.to(device)


def accuracy(model, inputs, labels, pad=0, device="cpu", batch_size=256):
    """Accuracy in % of ``model`` on ``inputs`` (feature rows or token-id lists)."""
    import torch

    model.eval()
    right = 0
    with torch.no_grad():
        for start in range(0, len(labels), batch_size):
            index = list(range(start, min(start + batch_size, len(labels))))
            right += int((model(_batch(inputs, index, pad, device)).argmax(-1).cpu() == labels[index]).sum())
    return 100.0 * right / len(labels)


def fit(model, data, l2, pad=0, device="cpu", lr=1e-3, batch_size=64, epoch_size=4, tenacity=5, max_epochs=200,
        seed=1111):
    """Train as SentEval's MLP does: Adam (weight decay ``l2``), batches of 64, the validation accuracy checked
    every ``epoch_size`` epochs, stopped after ``tenacity`` checks without gain; returns the best state's va %."""
    import torch

    (x_tr, y_tr), (x_va, y_va) = data["tr"], data["va"]
    generator = torch.Generator().manual_seed(seed)
    model.to(device)
    optimiser = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=l2)
    best, best_state, stale, epochs = -1.0, None, 0, 0
    while stale < tenacity and epochs < max_epochs:
        model.train()
        for _ in range(epoch_size):
            order = torch.randperm(len(y_tr), generator=generator).tolist()
            for start in range(0, len(order), batch_size):
                index = order[start : start + batch_size]
                loss = torch.nn.functional.cross_entropy(model(_batch(x_tr, index, pad, device)),
                                                         y_tr[index].to(device))
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
        epochs += epoch_size
        score = accuracy(model, x_va, y_va, pad, device)
        if score > best:
            best, stale = score, 0
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            stale += 1
    model.load_state_dict(best_state)
    return best


def grid_search(make, data, grid, seed=1111, **train):
    """One model per ``(nhid, dropout, l2)`` of ``grid`` (``make(nhid, dropout)`` builds it, seeded), chosen by
    validation accuracy (the first of equals); ``{"valid", "test", "chosen", "grid"}``, accuracies in %."""
    import torch

    results, best = [], None
    for nhid, dropout, l2 in grid:
        torch.manual_seed(seed)
        model = make(nhid, dropout)
        valid = fit(model, data, l2, seed=seed, **train)
        results.append({"nhid": nhid, "dropout": dropout, "l2": l2, "valid": round(valid, 2)})
        if best is None or valid > best[0]:
            best = (valid, model, results[-1])
    x_te, y_te = data["te"]
    test = accuracy(best[1], x_te, y_te, train.get("pad", 0), train.get("device", "cpu"))
    chosen = {k: best[2][k] for k in ("nhid", "dropout", "l2")}
    return {"valid": round(best[0], 2), "test": round(test, 2), "chosen": chosen, "grid": results}


def encode_labels(splits):
    """Labels as class ids (training labels sorted), per partition: ``{partition: LongTensor}``, and the classes."""
    import torch

    classes = sorted(set(splits["tr"][1]))
    ids = {label: i for i, label in enumerate(classes)}
    return {p: torch.tensor([ids[label] for label in splits[p][1]]) for p in PARTITIONS}, classes


def word_ids(splits, max_vocab):
    """Sentences as word ids over the ``max_vocab`` commonest training words (0: padding, 1: unknown)."""
    counts = Counter(word for sentence in splits["tr"][0] for word in sentence)
    vocab = {word: i + 2 for i, (word, _) in enumerate(counts.most_common(max_vocab))}
    return {p: [[vocab.get(w, 1) for w in s] for s in splits[p][0]] for p in PARTITIONS}, len(vocab) + 2


def checkpoint_features(loaded, splits, subword_model=None):
    """``{partition: (n, d_model)}``: the mean of the checkpoint's top encoder layer over each sentence's tokens
    (after the source subword model, when given)."""
    from tools import gret_probe

    model, vocabs, _ = loaded
    processor = gret_probe._subword(subword_model, "--src-subword-model", "probe.py")
    pieces = (lambda s: s) if processor is None else (lambda s: processor.encode(" ".join(s), out_type=str))
    return {p: gret_probe.features(model, vocabs, [pieces(s) for s in splits[p][0]], "average") for p in PARTITIONS}


# ---------------------------------------------------------------- the table
def probe_task(path, model_name, args, loaded=None):
    """One task's grid search for one model (an aggregation of li2019's probing model, or ``checkpoint``)."""
    splits = read_task(path)
    if args.limit:
        splits = {p: (s[: args.limit], y[: args.limit]) for p, (s, y) in splits.items()}
    labels, classes = encode_labels(splits)
    nhids = (0,) if Path(path).name == "word_content.txt" else args.nhid  # SentEval: WC uses a linear classifier
    dropouts = (0.0,) if nhids == (0,) else args.dropout
    grid = list(itertools.product(nhids, dropouts, args.l2))
    train = {"device": args.device, "epoch_size": args.epoch_size, "tenacity": args.tenacity,
             "max_epochs": args.max_epochs}
    if loaded is not None:
        features = checkpoint_features(loaded, splits, args.src_subword_model)
        data = {p: (features[p], labels[p]) for p in PARTITIONS}
        dim = features["tr"].size(1)
        result = grid_search(lambda nhid, dropout: make_probe(None, dim, nhid, len(classes), dropout), data, grid,
                             lr=args.lr or 1e-3, **train)
    else:
        ids, vocab_size = word_ids(splits, args.vocab)
        data = {p: (ids[p], labels[p]) for p in PARTITIONS}
        size = {**ENCODER, **({"d_model": args.d_model, "d_ff": 4 * args.d_model, "capsules": args.d_model}
                              if args.d_model else {}), **({"layers": args.layers} if args.layers else {})}

        def make(nhid, dropout):
            encoder = build_encoder(vocab_size, 0, MODELS[model_name], **size)
            return make_probe(encoder, size["d_model"], nhid, len(classes), dropout)

        result = grid_search(make, data, grid, lr=args.lr or 1e-4, **train)
    return {**result, "classes": len(classes), "train": len(labels["tr"])}


def markdown(report):
    """The table: our accuracies beside li2019's, one row per model."""
    columns = [column for column, _, _ in TASKS]
    lines = [f"# li2019 Table 1: probing accuracy (%, test split), ours beside {PAPER_SOURCE}", "",
             f"Setup: {report['setup']['mode']}; grid nhid {report['setup']['nhid']}, dropout "
             f"{report['setup']['dropout']}, L2 {report['setup']['l2']} (chosen on va).", "",
             "| model | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for name, results in report["results"].items():
        lines.append(f"| ours: {name} | " + " | ".join(common.fmt(results.get(c, {}).get("test")) for c in columns)
                     + " |")
        if name in PAPER:
            lines.append(f"| li2019: {name} | " + " | ".join(common.fmt(v) for v in PAPER[name]) + " |")
    return "\n".join(lines) + "\n"


def run(args):
    """Probe every task for every model, writing ``probe.json`` and ``probe.md`` after each one (a rerun with
    the same setup keeps the finished ones)."""
    names = ["checkpoint"] if args.checkpoint else args.models
    tasks = [task for task in TASKS if task[0] in args.tasks]
    paths = {column: Path(args.data) / name for column, name, _ in tasks}
    absent = [str(p) for p in paths.values() if not p.is_file()]
    if absent:
        _fail(f"no probing data at {', '.join(absent)}; run `python -m tools.probe fetch --data {args.data}`")
    setup = {"mode": f"frozen encoder of {args.checkpoint}, mean of its top layer" if args.checkpoint else
             "li2019's probing model trained per task (3 encoder layers, mean of the top layer, MLP)",
             **{k: getattr(args, k) for k in ("nhid", "dropout", "l2", "limit", "vocab", "d_model", "layers", "lr",
                                              "epoch_size", "tenacity", "max_epochs")}}
    setup = json.loads(json.dumps(setup))  # as probe.json holds it (lists, not tuples), to compare with it
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    old = json.loads((out / "probe.json").read_text(encoding="utf-8")) if (out / "probe.json").exists() else {}
    report = {"setup": setup, "paper": PAPER, "paper_source": PAPER_SOURCE,
              "results": old.get("results", {}) if old.get("setup") == setup else {}}
    loaded = load_checkpoint(args.checkpoint) if args.checkpoint else None
    for name in names:
        for column, path in paths.items():
            if column in report["results"].get(name, {}):
                continue
            result = probe_task(path, name, args, loaded)
            report["results"].setdefault(name, {})[column] = result
            print(f"probe: {name} {column}: test {result['test']:.2f} (va {result['valid']:.2f}, {result['chosen']})",
                  file=sys.stderr)
            (out / "probe.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
            (out / "probe.md").write_text(markdown(report), encoding="utf-8")
    print(markdown(report), end="")
    return report


def _floats(text):
    return tuple(float(v) for v in text.split(","))


def build_parser():
    parser = common.Parser(prog="probe.py", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    get = sub.add_parser("fetch", help="download SentEval's probing files into --data")
    run_ = sub.add_parser("run", help="the probing table")
    for p in (get, run_):
        p.add_argument("--data", default=str(DATA), help=f"the probing files' directory (default {DATA})")
    run_.add_argument("--out", default=str(OUT), help=f"where probe.json and probe.md go (default {OUT})")
    run_.add_argument("--models", type=lambda t: t.split(","), default=list(MODELS), help="base,simple,em")
    run_.add_argument("--tasks", type=lambda t: t.split(","), default=[c for c, _, _ in TASKS],
                      help="columns to run (default all ten)")
    run_.add_argument("--checkpoint", help="probe this NMT checkpoint's frozen encoder instead")
    run_.add_argument("--src-subword-model", help="with --checkpoint: its source sentencepiece model")
    run_.add_argument("--nhid", type=lambda t: tuple(int(v) for v in t.split(",")), default=(50, 100, 200))
    run_.add_argument("--dropout", type=_floats, default=(0.0, 0.1, 0.2))
    run_.add_argument("--l2", type=_floats, default=(1e-5, 1e-4, 1e-3, 1e-2))
    run_.add_argument("--lr", type=float, help="Adam's rate (default 1e-3 frozen, 1e-4 li2019's model)")
    run_.add_argument("--epoch-size", type=int, default=4, help="epochs between validations (SentEval: 4)")
    run_.add_argument("--tenacity", type=int, default=5, help="validations without gain before stopping")
    run_.add_argument("--max-epochs", type=int, default=200)
    run_.add_argument("--limit", type=int, default=0, help="keep the first N lines of each partition (a quick run)")
    run_.add_argument("--vocab", type=int, default=50000, help="li2019's model: the commonest training words kept")
    run_.add_argument("--d-model", type=int, default=0, help="li2019's model width (default 512; d_ff = 4x)")
    run_.add_argument("--layers", type=int, default=0, help="li2019's model depth (default 3)")
    run_.add_argument("--device", default=None, help="default cuda when available, else cpu")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.command == "fetch":
        fetch(args.data)
        return 0
    unknown = sorted(set(args.models) - set(MODELS)) + sorted(set(args.tasks) - {c for c, _, _ in TASKS})
    if unknown:
        _fail(f"--models/--tasks: unknown {', '.join(unknown)} (models {', '.join(MODELS)}; tasks "
              f"{', '.join(c for c, _, _ in TASKS)})")
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
