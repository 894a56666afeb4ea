"""System tier: the whole reproduction chain through `make`, on the CPU, on the shipped WMT14 sample.

``make reproduce-sample`` prepares ``build/data/sample_ende`` (raw, tokenized, cleaned, BPE, vocabulary with
``onmt_build_vocab``), trains the two rows of the ``sample-li2019`` table (a toy stock Transformer and the
same with EM routing), averages each row's last five checkpoints, translates, scores against the baseline
and writes the report.  The models are toys: the test checks the chain, not the BLEU.

The chain runs in a scratch copy of what it reads (the Makefile, tools/, yaml_configs/, the WMT14 sample),
with the repository's virtual environment, so that it starts from nothing and its build/ never touches the
repository's.
"""

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import sacrebleu
from sacremoses import MosesDetokenizer

import support
from onmt_ext.integration import evaluation

from tools import reproduce

pytestmark = pytest.mark.slow

TIMEOUT = 900


@pytest.fixture
def checkout(tmp_path):
    """A scratch checkout of what `make reproduce-sample` reads: the top-level files (the Makefile and what
    its rules name), tools/, yaml_configs/ and the WMT14 sample."""
    root = tmp_path / "checkout"
    root.mkdir()
    for path in support.REPO.iterdir():
        if path.is_file():
            shutil.copy2(path, root / path.name)
    for name in ("tools", "yaml_configs", "data/wmt14-ende-sample"):
        shutil.copytree(support.REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _make(root, *args):
    """make in the scratch checkout with the repository's virtual environment.  Its set-up stamp is a fresh file
    of the checkout (newer than the copied files it depends on), so that neither this make nor the ones it
    starts reinstall packages into the repository's environment."""
    stamp = root / ".setup-done"
    if not stamp.exists():
        stamp.touch()
    return subprocess.run(["make", "--no-print-directory", f"VENV={support.REPO / '.venv'}", f"SETUP_STAMP={stamp}",
                           *args], cwd=root, capture_output=True, text=True, timeout=TIMEOUT, env=support.cli_env())


def _translation(root, row):
    """The row's translation as the scorer must see it: BPE removed (tokenized) and Moses-detokenized."""
    path = Path(row["hypotheses"])
    tokenized = [line.replace("@@ ", "").removesuffix("@@")
                 for line in (path if path.is_absolute() else root / path).read_text(encoding="utf-8").splitlines()]
    detokenizer = MosesDetokenizer(lang="de")
    return tokenized, [detokenizer.detokenize(line.split()) for line in tokenized]


def _assert_scores_are_of_the_rows_translations(root, rows):
    """BLEU and tokenized BLEU of each row, and the second row's p-value, recomputed here from the files on disk."""
    outputs = [_translation(root, row) for row in rows]
    data = root / "build/data/sample_ende"
    references = [(data / name).read_text(encoding="utf-8").splitlines() for name in ("test.de", "test.tok.de")]
    for row, (tokenized, detokenized) in zip(rows, outputs):
        assert len(tokenized) == len(references[0]) == len(references[1]) > 0
        assert row["bleu"] == pytest.approx(sacrebleu.corpus_bleu(detokenized, references[:1]).score, abs=1e-9)
        tok_bleu = sacrebleu.corpus_bleu(tokenized, references[1:], tokenize="none", smooth_method="none", force=True)
        assert row["tok_bleu"] == pytest.approx(tok_bleu.score, abs=1e-9)
    test = evaluation.paired_bootstrap(outputs[0][1], outputs[1][1], references[:1],
                                       n_samples=reproduce.BOOTSTRAP_SAMPLES, seed=reproduce.BOOTSTRAP_SEED)
    assert (rows[0]["p_value"], rows[1]["p_value"], rows[1]["marker"]) == (None, test.p_value, test.marker)


def test_make_reproduce_sample_runs_every_step_and_reports(checkout, tmp_path, onmt_active):
    results = tmp_path / "results"
    result = _make(checkout, "reproduce-sample", f"RESULTS_DIR={results}")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert any((checkout / "build/runs").rglob("average_last5.pt"))  # the runs went into the scratch checkout

    data = checkout / "build/data/sample_ende"
    for name in ("train.bpe.en", "train.bpe.de", "valid.bpe.en", "test.bpe.en", "test.de", "test.tok.de",
                 "vocab.shared", "bpe.codes"):
        assert (data / name).stat().st_size > 0, name
    assert "@@ " in (data / "train.bpe.en").read_text(encoding="utf-8")

    out = results / "sample" / "sample_ende"
    report = json.loads((out / "sample-li2019.json").read_text(encoding="utf-8"))
    rows = report["rows"]
    assert [row["config"] for row in rows] == ["sample/transformer_tiny_sample_ende_baseline.yaml",
                                              "sample/transformer_tiny_sample_ende_em_enc_self.yaml"]
    _assert_scores_are_of_the_rows_translations(checkout, rows)
    for row in rows:
        assert row["averaged"] == 5 and len(row["checkpoints"]) == 5
        assert row["model"].endswith("average_last5.pt")
        assert "nrefs:1|case:mixed" in row["signature"]
    ours = report["training_data"]["ours"]  # the corpus and its pair counts, as the data steps recorded them
    assert ours.startswith("data/wmt14-ende-sample/train.* (") and "pairs after cleaning" in ours
    commands = [command.split()[1] for command in report["commands"]]
    assert commands == ["onmt_train", "onmt_average_models", "onmt_translate"] * 2, commands
    # both rows trained on one binarised copy of their corpus (docs/binarized-data.md), written by the first
    assert all(command.endswith(" -ext_binarized_cache build/binarized") for command in report["commands"]
               if " onmt_train " in command)
    (cache,) = [path for path in (checkout / "build/binarized").iterdir() if not path.name.startswith(".")]
    assert json.loads((cache / "manifest.json").read_text(encoding="utf-8"))["corpora"]["corpus_1"]["kept"] > 0
    for row in rows:
        log = (checkout / row["model"]).parent / "train.log"
        assert f"training corpora read from {cache.relative_to(checkout)}" in log.read_text(encoding="utf-8")
    markdown = (out / "sample-li2019.md").read_text(encoding="utf-8")
    assert markdown.count("| ") > 4 and f"Training data: ours: {ours}" in markdown
    assert (out / "sample-li2019.curves.png").stat().st_size > 1000

    # a second run finds every step up to date (make's rules) and only rescores
    made = [*(checkout / "build/runs").rglob("*.pt"), *(checkout / "build/runs").rglob("*.hyp.bpe")]
    before = {path: path.stat().st_mtime_ns for path in made}
    again = _make(checkout, "reproduce-sample", f"RESULTS_DIR={results}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "onmt_train -config" not in again.stdout and len(made) > 6
    assert {path: path.stat().st_mtime_ns for path in made} == before

    # the data steps: up to date while their recipes stand; a changed one redoes its step and those after it
    assert "tools.prepare_data" not in again.stdout and "onmt_build_vocab" not in again.stdout
    recipe = data / ".recipe.clean"
    recipe.write_text(recipe.read_text(encoding="utf-8").replace('"ratio": 1.5', '"ratio": 2.5'), encoding="utf-8")
    redone = _make(checkout, "data-sample_ende")
    assert redone.returncode == 0, redone.stderr[-3000:]
    steps = [line.split()[3] for line in redone.stdout.splitlines() if "-m tools.prepare_data " in line]
    assert steps == ["clean", "bpe"] and "onmt_build_vocab" in redone.stdout, redone.stdout
    assert "step clean is redone with the steps after it: its ratio changed" in redone.stderr


def test_two_nodes_train_the_sample_table_together_through_their_rules(checkout, tmp_path, onmt_active):
    """``make reproduce-sample-li2019 NODES=2 ...`` as two machines would run it: two checkouts, each with its
    data, whose rules (``--rules``, as make writes them) run at once.  On this machine without CUDA each node's
    one rank is a CPU process over gloo (docs/scale-out.md).  Node 1 trains every row with node 0 and keeps no
    checkpoint; node 0 writes them, its log saying at each that both ranks hold the same parameters."""
    assert _make(checkout, "data-sample_ende").returncode == 0
    node1 = tmp_path / "node1"
    shutil.copytree(checkout, node1, symlinks=True)
    port, venv = support.free_port(), support.REPO / ".venv" / "bin"
    runs = []
    for rank, root in ((0, checkout), (1, node1)):
        rules = root / "build" / "two-nodes.mk"
        written = subprocess.run([str(venv / "python"), "-m", "tools.reproduce", "sample-li2019", "--gpus", "0",
                                  "--nodes", "2", "--node-rank", str(rank), "--master-ip", "127.0.0.1",
                                  "--master-port", str(port), "--rules", str(rules)],
                                 cwd=root, capture_output=True, text=True, timeout=120, env=support.cli_env())
        assert written.returncode == 0, written.stderr
        plans = [reproduce.plan(row, (0,), nodes=reproduce.Nodes(2, rank, "127.0.0.1", port).for_row(index))
                 for index, row in enumerate(reproduce.TABLES["sample-li2019"])]
        goals = [] if rank else [str(p.checkpoints[-1]) for p in plans]  # node 0 translates on a GPU: not here
        runs.append(subprocess.Popen(["make", "--no-print-directory", "-f", str(rules), f"BIN={venv}", *goals],
                                     cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=support.cli_env()))
    outputs = [run.communicate(timeout=TIMEOUT)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], "\n".join(output[-3000:] for output in outputs)
    for p in plans:  # the paths are the same in both checkouts
        assert all((checkout / path).exists() for path in p.checkpoints)
        assert not any((node1 / path).exists() for path in p.checkpoints)
        assert (node1 / p.run_dir / "train.node1.done").exists()
        assert (node1 / p.run_dir / "train.node1.log").exists()
        log = (checkout / p.run_dir / "train.log").read_text(encoding="utf-8")
        assert f"step {p.train_steps}: the 2 ranks hold identical parameters" in log, log[-2000:]
    averaged = _make(checkout, "-f", "build/two-nodes.mk", f"BIN={venv}", *(str(p.model) for p in plans))
    assert averaged.returncode == 0, averaged.stderr[-3000:]
