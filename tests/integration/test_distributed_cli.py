"""``onmt_train -world_size 2 -gpu_ranks 0 1`` on a torch without CUDA: two CPU ranks over gloo (issue 59).

One toy run (yaml_configs/smoke/foundation/ext_transformer.yaml on 40 lines of the Tatoeba sample, one batch per
rank a step) is traced with ``ONMT_EXT_TRACE_BATCHES`` (each rank's batches) and saves every step.  Beside it: a
one-process run, a run resumed from step 2, one from binarised data, and two "nodes" of one rank each (two
``onmt_train`` processes, ``-gpu_ranks 0`` and ``-gpu_ranks 1``).  In-process checks of the gradient against one
process, of the reports, of host reads and of a broken all-reduce: tests/unit/test_distributed.py.  Every
mechanism trains on two ranks in two models (``TOGETHER``); each one's own smoke config on two ranks is slow.
"""

import json
import re
import subprocess

import pytest
import torch
import yaml

import support

pytestmark = [pytest.mark.usefixtures("sample_data", "onmt_active"),
              pytest.mark.skipif(torch.cuda.is_available(), reason="CPU ranks run where torch sees no CUDA device")]

CONFIG = "yaml_configs/smoke/foundation/ext_transformer.yaml"
LINES = 40  # each rank's share (20 lines) is one bucket and one batch
#: the corpus of the run with data workers: stock deals blocks of 4 lines to 2 x 2 workers in turn, block by block
#: (``ParallelCorpus.load``: line i to the worker ``(i // 4) % 4``), so 32 = 2 x 4 x 4 lines give each 8
WORKER_LINES = 32
STEPS = 4
RANKS = ("-world_size", 2, "-gpu_ranks", 0, 1)
#: every run: a report every step, no validation
EVERY_STEP = ("-report_every", 1, "-valid_steps", 100)
DIGEST = re.compile(r"onmt-ext: step (\d+): the 2 ranks hold identical parameters \(sha256 ([0-9a-f]{64})\)")
REPORT = re.compile(r"Step +(\d+)/ *\d+; acc: .*; sents: +(\d+); bsz: +(\d+)/ *(\d+)/ *(\d+);")


def _config(folder, config=CONFIG, data=None):
    """``config`` with its outputs under ``folder`` (and its training corpus replaced by ``data``, a prefix)."""
    options = yaml.safe_load((support.REPO / config).read_text(encoding="utf-8"))
    options.update(save_data=str(folder / "samples"), save_model=str(folder / "model"))
    if data is not None:
        options["data"]["corpus_1"].update(path_src=f"{data}.zh", path_tgt=f"{data}.en")
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(options), encoding="utf-8")
    return path


def _train(folder, *extra, config=CONFIG, data=None, trace=True):
    folder.mkdir(parents=True, exist_ok=True)
    env = support.cli_env(**({"ONMT_EXT_TRACE_BATCHES": str(folder)} if trace else {}))
    result = support.run_cli("onmt_train", "-config", _config(folder, config, data), "-master_port",
                             support.free_port(), *EVERY_STEP, *extra, env=env)
    return result.stderr + result.stdout


def _two_nodes(base, data, *extra):
    """Two "nodes" of one rank each, as two ``onmt_train`` processes on this machine: ``-world_size 2`` with
    ``-gpu_ranks 0`` and ``-gpu_ranks 1``, one master port.  Each writes under its own folder; both trace their
    batches into ``base``.  Returns the two logs."""
    port, processes = support.free_port(), []
    env = support.cli_env(ONMT_EXT_TRACE_BATCHES=str(base))
    for rank in (0, 1):
        folder = base / f"node{rank}"
        folder.mkdir(parents=True)
        argv = [str(support.BIN / "onmt_train"), "-config", str(_config(folder, data=data)), "-master_port",
                *map(str, (port, "-world_size", 2, "-gpu_ranks", rank, *EVERY_STEP, *extra))]
        processes.append(subprocess.Popen(argv, cwd=support.REPO, env=env, text=True, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT))
    logs = []
    try:
        for process in processes:
            logs.append(process.communicate(timeout=600)[0])
    finally:
        for process in processes:
            process.kill()
    for process, log in zip(processes, logs):
        assert process.returncode == 0, log[-3000:]
    return logs


def _batches(folder, rank):
    return [json.loads(line) for line in (folder / f"batches.{rank}.jsonl").read_text().splitlines()]


def _rows(batch):
    return [tuple(row) for row in batch["src"]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two CPU ranks for STEPS steps, one process for 2, and the two ranks resumed from step 2 to STEPS."""
    base = tmp_path_factory.mktemp("distributed")
    seen, lines = set(), []
    with open(support.TATOEBA / "train.zh", encoding="utf-8") as zh, \
            open(support.TATOEBA / "train.en", encoding="utf-8") as en:
        for src, tgt in zip(zh, en):
            if src not in seen and len(lines) < LINES:
                seen.add(src)
                lines.append((src, tgt))
    for side, index in (("zh", 0), ("en", 1)):
        (base / f"train.{side}").write_text("".join(pair[index] for pair in lines), encoding="utf-8")
        (base / f"workers.{side}").write_text("".join(pair[index] for pair in lines[:WORKER_LINES]), encoding="utf-8")
    saved = ("-batch_size", 4096, "-keep_checkpoint", 10, "-save_checkpoint_steps", 1)
    common = (*saved, "-bucket_size", LINES // 2)
    data = base / "train"
    logs = {"two": _train(base / "two", *RANKS, *common, "-train_steps", STEPS, data=data),
            "one": _train(base / "one", *common, "-train_steps", 2, data=data),
            "resumed": _train(base / "resumed", *RANKS, *common, "-train_steps", STEPS, "-train_from",
                              base / "two" / "model_step_2.pt", data=data, trace=False),
            "cached": _train(base / "cached", *RANKS, *common, "-train_steps", 2, "-ext_binarized_cache",
                             base / "cache", data=data)}
    logs["node0"], logs["node1"] = _two_nodes(base / "nodes", data, *common, "-train_steps", 2)
    # two data workers per rank, as on the users' path: each worker a quarter of the corpus, one bucket and batch
    logs["workers"] = _train(base / "workers", *RANKS, *saved, "-bucket_size", WORKER_LINES // 4, "-num_workers", 2,
                             "-train_steps", 2, data=base / "workers")
    return base, logs


def test_the_ranks_read_disjoint_shares_that_cover_the_corpus(runs):
    base, logs = runs
    assert logs["two"].count("run as 2 CPU processes over gloo") == 1, logs["two"][-3000:]
    shares = [set(_rows(_batches(base / "two", rank)[0])) for rank in (0, 1)]
    one = _batches(base / "one", "single")
    corpus = set(_rows(one[0])) | set(_rows(one[1]))  # one process: two buckets of 20 lines, the whole corpus
    assert len(corpus) == LINES
    assert [len(share) for share in shares] == [LINES // 2] * 2
    assert not shares[0] & shares[1], "both ranks read the same lines"
    assert shares[0] | shares[1] == corpus
    for rank in (0, 1):  # and every later step trains the same share again
        assert all(set(_rows(batch)) == shares[rank] for batch in _batches(base / "two", rank))


def test_two_nodes_read_disjoint_shares_that_cover_the_corpus(runs):
    """Ranks 0 and 1 on two nodes (one process each): each reads the share of its global rank.  Stock shares by
    the processes of a node, so both nodes would read the whole corpus: the same lines."""
    base, logs = runs
    shares = [set(_rows(_batches(base / "nodes", rank)[0])) for rank in (0, 1)]
    assert not shares[0] & shares[1], "both nodes read the same lines"
    assert [len(share) for share in shares] == [LINES // 2] * 2
    assert shares == [set(_rows(_batches(base / "two", rank)[0])) for rank in (0, 1)]  # as the ranks of one node
    assert [step for step, _ in DIGEST.findall(logs["node0"])] == ["1", "2"], logs["node0"][-3000:]
    assert "reads its own share of the training corpora, by global rank" in logs["node0"]


def test_with_data_workers_the_ranks_still_read_disjoint_shares_that_cover_the_corpus(runs):
    """Two data workers per rank (``-num_workers 2``): stock deals each rank's share out to its workers; over two
    steps each rank trains one batch of each worker, and together they are the corpus, each line once."""
    base, logs = runs
    assert [step for step, _ in DIGEST.findall(logs["workers"])] == ["1", "2"], logs["workers"][-3000:]
    batches = [_batches(base / "workers", rank) for rank in (0, 1)]
    assert [[len(batch["src"]) for batch in ranks] for ranks in batches] == [[WORKER_LINES // 4] * 2] * 2
    rows = [row for ranks in batches for batch in ranks for row in _rows(batch)]
    assert len(set(rows)) == len(rows) == WORKER_LINES  # no line twice, in one rank or across them


def test_both_ranks_train_on_their_shares_of_one_binarised_copy(runs):
    """With -ext_binarized_cache, the two ranks binarise the corpus once (one waits on the other's lock) and
    each reads from it the batches it read from the text."""
    base, logs = runs
    (cache,) = [path for path in (base / "cache").iterdir() if not path.name.startswith(".")]
    assert f"training corpora read from {cache}" in logs["cached"], logs["cached"][-3000:]
    assert logs["cached"].count("-ext_binarized_cache: binarising") <= 1
    for rank in (0, 1):
        assert _batches(base / "cached", rank) == _batches(base / "two", rank)[:2]


def test_after_every_step_both_ranks_hold_the_parameters_of_the_checkpoint(runs):
    """Rank 0 logs the digest of both ranks' parameters when they are equal at a checkpoint (a difference stops
    the run); with a checkpoint every step, each digest is that of the checkpoint rank 0 saves."""
    from onmt_ext.runtime.distributed import parameter_digest

    base, logs = runs
    digests = {int(step): digest for step, digest in DIGEST.findall(logs["two"])}
    assert sorted(digests) == list(range(1, STEPS + 1)), logs["two"][-3000:]
    assert len(set(digests.values())) == STEPS  # the parameters change every step
    for step, digest in digests.items():
        checkpoint = torch.load(base / "two" / f"model_step_{step}.pt", weights_only=False)
        named = list(checkpoint["model"].items()) + [(f"generator.{k}", v) for k, v in checkpoint["generator"].items()]
        assert parameter_digest(named) == digest, f"step {step}"


def test_the_reports_count_both_ranks_once(runs):
    base, logs = runs
    reports = {int(m[0]): tuple(map(int, m[1:])) for m in REPORT.findall(logs["two"])}
    assert sorted(reports) == list(range(1, STEPS + 1)), logs["two"][-3000:]
    ranks = [_batches(base / "two", rank) for rank in (0, 1)]
    for step, (sents, _, tgt_per_batch, sents_per_batch) in reports.items():
        batches = [ranks[rank][step - 1] for rank in (0, 1)]
        assert sents == sum(len(batch["src"]) for batch in batches) == LINES
        assert sents_per_batch == round(sents / 2)  # two batches: one per rank
        tokens = sum(batch["tgt_tokens"] for batch in batches)
        assert abs(tgt_per_batch - tokens / 2) <= 0.5, (step, tgt_per_batch, tokens)


def test_a_run_resumes_from_a_checkpoint(runs):
    """Two ranks resumed from step 2 reach the parameters of the run that never stopped."""
    _, logs = runs
    assert "onmt-ext: resuming at step 3" in logs["resumed"], logs["resumed"][-3000:]
    uninterrupted = dict(DIGEST.findall(logs["two"]))
    resumed = dict(DIGEST.findall(logs["resumed"]))
    assert sorted(resumed) == [str(step) for step in range(3, STEPS + 1)]
    assert all(resumed[step] == uninterrupted[step] for step in resumed)


#: every mechanism in two models (cao2019 excludes clause attention): in the default tier
TOGETHER = ["combined/all_mechanisms.yaml", "normalisation/post_norm_all_but_cao2019.yaml"]
#: one smoke config per mechanism, with most of its switches on, and DiSAN (chen2019's baseline)
MECHANISMS = ["li2019/em_all_components.yaml", "cao2019/dec_self_cross_self.yaml",
              "chen2019/mprhead_all_switches.yaml", "chen2019/rpehead_all_switches.yaml",
              "chen2019/transformer_base_nist_zhen_disan.yaml", "clause/transformer_base_niutrans_enzh_ca_study.yaml",
              "gret/transformer_base_wmt14_ende_gret_no_capsules.yaml"]


def _two_steps_on_two_ranks(config, folder):
    log = _train(folder, *RANKS, "-train_steps", 2, "-save_checkpoint_steps", 2,
                 config=f"yaml_configs/smoke/{config}", trace=False)
    assert [step for step, _ in DIGEST.findall(log)] == ["2"], log[-3000:]
    assert (folder / "model_step_2.pt").is_file()


@pytest.mark.parametrize("config", TOGETHER)
def test_the_mechanisms_together_train_on_two_ranks(config, tmp_path):
    _two_steps_on_two_ranks(config, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("config", MECHANISMS)
def test_every_mechanism_trains_on_two_ranks(config, tmp_path):
    _two_steps_on_two_ranks(config, tmp_path)


def test_each_node_says_which_ranks_it_waits_for(runs):
    """A node of -world_size 2 that runs one rank waits for the other at -master_ip:-master_port; it says so."""
    _, logs = runs
    for rank, other in ((0, 1), (1, 0)):
        assert (f"onmt-ext: this node runs ranks {rank} of -world_size 2: they wait up to -timeout 60 s for the other "
                f"1 at localhost:") in logs[f"node{rank}"], logs[f"node{rank}"][-3000:]
    assert "this node runs ranks" not in logs["two"]


def test_several_ranks_without_gpu_ranks_are_refused_in_one_line(tmp_path):
    """Stock spawns one process per -gpu_ranks entry: with none it trains nothing and exits 0."""
    result = support.run_cli("onmt_train", "-config", _config(tmp_path), "-world_size", 2, "-train_steps", 2,
                             check=False)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.startswith("onmt_train: error: -world_size 2 needs -gpu_ranks (without them no process "
                                    "trains): give this node's ranks, -gpu_ranks 0 1 on one node")
    assert result.stderr.count("\n") == 1 and not (tmp_path / "model_step_2.pt").exists()


@pytest.mark.slow
def test_half_precision_on_cpu_ranks_is_one_warning_line(tmp_path):
    """-model_dtype fp16 on CPU ranks trains in float32: one line names the option; torch's GradScaler and autocast
    warnings (once per rank, from processes that do not inherit the parent's filters) are not printed."""
    log = _train(tmp_path, *RANKS, "-train_steps", 1, "-model_dtype", "fp16", trace=False)
    assert log.count("onmt_train: warning: -model_dtype fp16: these ranks train on the CPU") == 1, log[-3000:]
    assert "GradScaler" not in log and "Disabling autocast" not in log, log[-3000:]
