"""Two data-parallel CPU ranks over gloo (onmt_ext.runtime.distributed), in-process, against one process fed both
batches.

Two ranks are started with torch.multiprocessing (no console command: tests/integration/test_distributed_cli.py
runs ``onmt_train``).  Each trains onmt-ext's step on its own batch as ``Trainer.train`` drives it (the
normalisation gathered from both ranks, the gradients all-reduced); one more process trains the same model on
both batches at once (``-accum_count 2``).
"""

import signal
from datetime import timedelta

import pytest
import torch
import torch.multiprocessing as mp

import support

pytestmark = pytest.mark.usefixtures("onmt_active", "sample_data")

CONFIG = "yaml_configs/demo/tatoeba_zhen.yaml"
#: (source lengths, target lengths) of the batches: step s trains batches 2s and 2s + 1
SHAPES = [([7, 5, 3], [6, 8, 4]), ([4, 9], [5, 3]), ([6, 6, 2, 5], [7, 2, 6, 3]), ([3, 8], [9, 4])]
STEPS = len(SHAPES) // 2


def _opt(*extra):
    opt = support.load_train_opts(CONFIG, "-report_every", 1, "-seed", 1, *extra)
    opt.data = {}  # (no corpus is read: the batches are made here)
    return opt


def _batch(vocabs, index):
    src, src_len, tgt = support.random_batch(vocabs, *SHAPES[index], seed=index)
    return {"src": src, "srclen": src_len, "tgt": tgt}


def _trainer(opt, vocabs, device_id):
    from onmt.trainer import build_trainer
    from onmt.utils.optimizers import Optimizer

    from onmt_ext.runtime.train_step import fused_adam

    model = support.build_model(opt, vocabs, seed=3)
    model.train()
    trainer = build_trainer(opt, device_id, model, vocabs, Optimizer.from_opt(model, opt), model_saver=None)
    # torch's fused Adam, as onmt-ext uses on CUDA (a plain Adam reads its step counters on the CPU)
    trainer.optim._optimizer = fused_adam(trainer.optim._optimizer, devices=("cpu",))
    return trainer


def _train(trainer, batches_of_step, gather=None):
    """Train one step per entry of ``batches_of_step``; per step: gradients, parameters, report, host reads."""
    from onmt.utils import Statistics

    reports, steps = [], []
    stock = Statistics.output
    Statistics.output = lambda self, step, *args: reports.append(
        (step, self.loss, self.n_words, self.n_correct, self.n_src_words, self.n_sents, self.n_batchs))
    try:  # restored: the fixture trains in the test process, and later tests read the real report
        return _train_steps(trainer, batches_of_step, gather, steps), reports
    finally:
        Statistics.output = stock


def _train_steps(trainer, batches_of_step, gather, steps):
    from onmt.utils import Statistics

    trainer.report_manager.start()
    total, report = Statistics(), Statistics()
    for batches in batches_of_step:
        (batches, normalization), = trainer._accum_batches(iter([(b, 0) for b in batches]))
        if gather is not None:  # as Trainer.train does with several ranks
            normalization = sum(gather(normalization))
        step = trainer.optim.training_step
        with support.host_reads() as reads:
            trainer._gradient_accumulation(batches, normalization, total, report)
        report = trainer._maybe_report_training(step, 100, 1.0, report)
        steps.append({"grads": {n: p.grad.clone() for n, p in trainer.model.named_parameters()},
                      "params": {n: p.detach().clone() for n, p in trainer.model.named_parameters()},
                      "reads": list(reads)})
    return steps


def _rank(rank, init_file, out):
    import onmt  # noqa: F401  (activates onmt-ext through the start-up hook)
    import onmt.utils.distributed

    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", world_size=2, rank=rank)
    opt = _opt("-world_size", 2, "-gpu_ranks", 0, 1)
    vocabs = support.load_vocabs(opt)
    trainer = _trainer(opt, vocabs, rank)
    steps, reports = _train(trainer, [[_batch(vocabs, 2 * s + rank)] for s in range(STEPS)],
                            gather=onmt.utils.distributed.all_gather_list)
    torch.save({"steps": steps, "reports": reports, "n_gpu": trainer.n_gpu}, f"{out}/rank{rank}.pt")
    torch.distributed.destroy_process_group()


def _one_process(_, out):
    """One process trained on both batches of every step (``-accum_count 2``); like the ranks, a fresh process, so
    that what earlier tests left in the test process cannot tell the two sides apart."""
    import onmt  # noqa: F401  (activates onmt-ext through the start-up hook)

    opt = _opt("-accum_count", 2)
    vocabs = support.load_vocabs(opt)
    one = _train(_trainer(opt, vocabs, -1), [[_batch(vocabs, 2 * s), _batch(vocabs, 2 * s + 1)]
                                             for s in range(STEPS)])
    torch.save(one, f"{out}/one.pt")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """What each of two CPU ranks saw, and one process trained on both batches of every step."""
    out = tmp_path_factory.mktemp("ranks")
    mp.start_processes(_rank, args=(str(out / "init"), str(out)), nprocs=2, start_method="spawn")
    mp.start_processes(_one_process, args=(str(out),), nprocs=1, start_method="spawn")
    return ([torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)],
            torch.load(out / "one.pt", weights_only=False))


def test_the_gradient_and_the_parameters_equal_one_process_fed_both_batches(ranks):
    (rank0, rank1), (single, _) = ranks
    assert rank0["n_gpu"] == rank1["n_gpu"] == 2  # the trainers took the data-parallel path
    for step, one in enumerate(single, start=1):
        for key in ("grads", "params"):
            for name, expected in one[key].items():
                for rank in (rank0, rank1):
                    torch.testing.assert_close(rank["steps"][step - 1][key][name], expected, rtol=1e-6, atol=1e-9,
                                               msg=f"step {step}: {key} {name}")
                assert torch.equal(rank0["steps"][step - 1][key][name], rank1["steps"][step - 1][key][name])


def test_the_reports_count_both_ranks_once(ranks):
    (rank0, rank1), (_, single_reports) = ranks
    assert [r[0] for r in single_reports] == list(range(1, STEPS + 1))
    for rank in (rank0, rank1):
        assert len(rank["reports"]) == STEPS
        for got, expected in zip(rank["reports"], single_reports):
            assert got[0] == expected[0] and got[2:] == expected[2:], (got, expected)  # tokens, correct, sentences
            assert got[1] == pytest.approx(expected[1], rel=1e-6)  # the loss (summed in another order)


def test_the_distributed_step_reads_nothing_back(ranks):
    """Beyond the gradient all-reduce, onmt-ext's step on the data-parallel path reads no tensor data back to the
    host (support.host_reads): on a GPU it would not wait for the device."""
    (rank0, rank1), _ = ranks
    assert all(step["reads"] == [] for rank in (rank0, rank1) for step in rank["steps"]), \
        [step["reads"] for rank in (rank0, rank1) for step in rank["steps"]]


def _rank_beside_nccl(rank, init_file, out):
    import onmt  # noqa: F401  (activates onmt-ext through the start-up hook)
    import onmt.utils.distributed
    from onmt.utils import Statistics

    from onmt_ext.runtime import distributed

    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", world_size=2, rank=rank)
    real = torch.distributed.get_backend
    # the world as OpenNMT-py makes it on GPUs (-gpu_backend nccl); stock's gather would need CUDA here
    torch.distributed.get_backend = lambda group=None: "nccl" if group is None else real(group)
    normalisations = [onmt.utils.distributed.all_gather_list(100 + 10 * step + rank) for step in range(3)]
    stats = Statistics.all_gather_stats(Statistics(loss=1.5 + rank, n_words=7 + rank, n_correct=rank))
    torch.save({"normalisations": normalisations, "groups": len(distributed._HOST_GROUP),
                "backend": real(distributed.host_group()), "stats": (stats.loss, stats.n_words, stats.n_correct)},
               f"{out}/rank{rank}.pt")
    torch.distributed.destroy_process_group()


def test_beside_an_nccl_world_the_gather_stays_on_the_host(tmp_path):
    """Stock's all_gather_list goes through CUDA byte tensors read back with .item() (a wait for the device at the
    start of every step on several GPUs); beside a world that is not gloo, onmt-ext gathers the same objects
    through one gloo group of the ranks (on this CUDA-less machine stock's path would fail outright)."""
    mp.start_processes(_rank_beside_nccl, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2,
                       start_method="spawn")
    for rank in range(2):
        seen = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        assert seen["normalisations"] == [[100, 101], [110, 111], [120, 121]]
        assert seen["groups"] == 1 and seen["backend"] == "gloo"
        assert seen["stats"] == (1.5 + 2.5, 7 + 8, 0 + 1)


def _rank_without_all_reduce(rank, init_file, out):
    """One step on two ranks whose gradient all-reduce does nothing, then the ranks' comparison at a checkpoint."""
    import types

    import onmt  # noqa: F401  (activates onmt-ext through the start-up hook)
    import onmt.utils.distributed

    from onmt_ext.runtime import distributed

    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", world_size=2, rank=rank)
    onmt.utils.distributed.all_reduce_and_rescale_tensors = lambda tensors, rescale_denom, **kwargs: None
    opt = _opt("-world_size", 2, "-gpu_ranks", 0, 1)
    vocabs = support.load_vocabs(opt)
    trainer = _trainer(opt, vocabs, rank)
    steps, _ = _train(trainer, [[_batch(vocabs, rank)]], gather=onmt.utils.distributed.all_gather_list)
    saver = types.SimpleNamespace(keep_checkpoint=1, last_saved_step=None, model=trainer.model)
    try:
        distributed._save_compared(lambda *args, **kwargs: "saved", saver, 1)
        outcome = "saved"
    except distributed.RanksDiverged as error:
        outcome = str(error)
    torch.save({"grads": steps[0]["grads"], "outcome": outcome}, f"{out}/rank{rank}.pt")
    torch.distributed.destroy_process_group()


def test_a_broken_all_reduce_fails_the_comparisons(ranks, tmp_path):
    """The checks above fail when the all-reduce is broken: each rank's gradient is then its own batch's, not one
    process's on both, and the ranks' comparison at the first checkpoint stops the run in one line."""
    mp.start_processes(_rank_without_all_reduce, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2,
                       start_method="spawn")
    _, (single, _) = ranks
    broken = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in range(2)]
    for rank in broken:
        assert rank["outcome"].startswith("step 1: the parameters of the 2 ranks differ (sha256 ")
        assert "\n" not in rank["outcome"] and rank["outcome"].endswith("the gradient all-reduce is broken")
        assert any(not torch.allclose(rank["grads"][name], expected, rtol=1e-6, atol=1e-9)
                   for name, expected in single[0]["grads"].items())


def test_the_host_group_waits_for_a_missing_rank_as_long_as_the_world(monkeypatch):
    """-timeout bounds how long a rank waits for the others; the host group of the gathers beside NCCL must not
    wait gloo's default 30 minutes instead when a rank has died."""
    from onmt_ext.runtime import distributed

    made = []
    monkeypatch.setattr(distributed, "_HOST_GROUP", [])
    monkeypatch.setattr(distributed, "_TIMEOUT", [])
    monkeypatch.setattr(torch.distributed, "new_group", lambda **kwargs: made.append(kwargs) or "group")
    opt = _opt("-timeout", 7)
    assert distributed._multi_init(lambda opt, device_id: 0, opt, 0) == 0
    assert distributed.host_group() == distributed.host_group() == "group"
    assert made == [{"backend": "gloo", "timeout": timedelta(seconds=7)}]


def test_a_node_with_some_of_the_ranks_says_it_waits_for_the_others():
    """-world_size 2 -gpu_ranks 0 is one node of two (legal: each node gives its own ranks); without the other it
    waits -timeout seconds in silence and then fails, so it says whom it waits for, where, and how long."""
    from argparse import Namespace

    from onmt_ext.runtime.distributed import waiting_line

    opt = Namespace(world_size=2, gpu_ranks=[0], timeout=60, master_ip="localhost", master_port=10000)
    assert waiting_line(opt) == ("onmt-ext: this node runs ranks 0 of -world_size 2: they wait up to -timeout 60 s "
                                 "for the other 1 at localhost:10000 (start the other nodes, or give -gpu_ranks 0 1 "
                                 "to run them all here; docs/scale-out.md)")
    assert waiting_line(Namespace(world_size=2, gpu_ranks=[0, 1])) is None
    assert waiting_line(Namespace(world_size=1, gpu_ranks=[])) is None


def test_a_rendezvous_the_other_ranks_never_reach_ends_in_one_line(monkeypatch):
    """torch's DistStoreError after -timeout (a node whose other nodes never started) is a UserError naming the
    address, the timeout and what to start."""
    from onmt_ext.errors import UserError
    from onmt_ext.runtime import distributed

    monkeypatch.setattr(distributed, "_TIMEOUT", [])

    def never_met(opt, device_id):
        raise torch.distributed.DistStoreError("Timed out after 6 seconds waiting for clients. 1/2 clients joined.")

    opt = _opt("-world_size", 2, "-gpu_ranks", 0, "-timeout", 5, "-master_port", 10555)
    with pytest.raises(UserError) as stopped:
        distributed._multi_init(never_met, opt, 0)
    assert stopped.value.message == (
        "-world_size 2: the ranks did not all meet at localhost:10555 within -timeout 5 s (Timed out after 6 seconds "
        "waiting for clients. 1/2 clients joined.); start every node's onmt_train with the same -world_size, "
        "-master_ip and -master_port, or give this node every rank (-gpu_ranks 0 1)")


def test_a_ranks_one_line_error_reaches_the_parent_and_fails_the_run(monkeypatch, capsys):
    """A UserError is a SystemExit, which stock's spawned_train lets through: the rank printed it and the parent's
    run exited 0. The rank hands it to the parent through stock's error queue instead, and the parent's command
    ends in that line with the error's status."""
    import onmt.utils.distributed

    from onmt_ext.errors import UsageError, UserError
    from onmt_ext.integration import commands

    told = []
    queue = type("Queue", (), {"put": lambda self, item: told.append(item)})()
    monkeypatch.setattr(onmt.utils.distributed, "multi_init", lambda opt, device_id: opt.gpu_ranks[device_id])
    opt = _opt("-world_size", 2, "-gpu_ranks", 0, 1)
    handler = signal.getsignal(signal.SIGINT)
    try:
        def broken(opt, device_id):
            raise UsageError("-train_from x.pt: first line\nsecond line")

        assert commands.spawned_rank(broken, opt, 1, queue) is None
        monkeypatch.setattr(onmt.utils.distributed, "multi_init",
                            lambda opt, device_id: (_ for _ in ()).throw(UserError("no rendezvous")))
        commands.spawned_rank(lambda opt, device_id: None, opt, 0, queue)  # (raised in multi_init)
    finally:
        signal.signal(signal.SIGINT, handler)
    assert [rank for rank, _ in told] == [1, 0]
    # the parent: stock's ErrorHandler raises an Exception that carries the rank's text
    def parent(opt):
        raise Exception("\n\n-- Tracebacks above this line can probably\n be ignored --\n\n" + told[0][1])

    parent.__module__ = "onmt.bin.train"
    with pytest.raises(SystemExit) as stopped:
        commands._run_command(parent, opt)
    assert stopped.value.code == 2
    assert capsys.readouterr().err == ("onmt_train: error: rank 1: -train_from x.pt: first line\n"
                                       "onmt_train: error: rank 1: second line\n")
    assert commands._rank_error(Exception(told[1][1])) == ("rank 0: no rendezvous", 1)
    assert commands._rank_error(Exception("another error")) is None
