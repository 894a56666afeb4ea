"""The training step without host reads (onmt_ext.runtime.train_step) against stock OpenNMT-py's, in-process."""

import copy

import pytest
import torch

import support

pytestmark = pytest.mark.usefixtures("onmt_active", "sample_data")
#: the stock trainer that these tests run beside ours calls torch.cuda.amp.autocast, which torch deprecates (onmt-ext
#: filters that warning only while its own step is in place)
STOCK_AMP_WARNING = pytest.mark.filterwarnings("ignore:`torch.cuda.amp.autocast:FutureWarning")

CONFIG = "yaml_configs/demo/tatoeba_zhen.yaml"
#: (source lengths, target lengths) of the batches fed to the trainer, in order
SHAPES = [([7, 5, 3], [6, 8, 4]), ([4, 9], [5, 3]), ([6, 6, 2, 5], [7, 2, 6, 3]), ([3, 8], [9, 4]),
          ([5, 5, 5], [4, 6, 5]), ([2, 7], [3, 8])]


def _trainer(opt, vocabs):
    from onmt.trainer import build_trainer
    from onmt.utils.optimizers import Optimizer

    model = support.build_model(opt, vocabs, seed=3)
    model.train()
    optim = Optimizer.from_opt(model, opt)
    return build_trainer(opt, -1, model, vocabs, optim, model_saver=None)


def _batches(vocabs):
    batches = []
    for seed, (src_lens, tgt_lens) in enumerate(SHAPES):
        src, src_len, tgt = support.random_batch(vocabs, src_lens, tgt_lens, seed=seed)
        batches.append(({"src": src, "srclen": src_len, "tgt": tgt}, 0))
    return batches


STOCK_METHODS = ("_accum_batches", "_gradient_accumulation")


def _train(monkeypatch, stock, accum_count=1, reads=None, fused=False):
    """Train on _batches() with the stock or onmt-ext's step; returns parameters after each step and reports.

    ``fused``: torch's fused Adam, as onmt-ext uses on CUDA (a plain Adam keeps its step counts on the
    CPU and reads them there, which is no synchronisation).
    """
    from onmt.trainer import Trainer
    from onmt.utils import Statistics
    from onmt.utils.report_manager import ReportMgrBase

    from onmt_ext import patches
    from onmt_ext.runtime.hostsync import HostReads
    from onmt_ext.runtime.train_step import fused_adam

    opt = support.load_train_opts(CONFIG, "-accum_count", accum_count, "-report_every", 2, "-seed", 1)
    opt.data = {}  # (no corpus is read: the batches are made here)
    vocabs = support.load_vocabs(opt)
    with monkeypatch.context() as patched:
        if stock:
            for name in STOCK_METHODS:
                patched.setattr(Trainer, name, patches.original(Trainer, name))
            patched.setattr(ReportMgrBase, "report_training", patches.original(ReportMgrBase, "report_training"))
        reports = []
        patched.setattr(Statistics, "output", lambda self, step, *args: reports.append(
            (step, self.loss, self.n_words, self.n_correct, self.n_src_words, self.n_sents, self.n_batchs)))
        torch.manual_seed(1)
        trainer = _trainer(opt, vocabs)
        if fused:
            trainer.optim._optimizer = fused_adam(trainer.optim._optimizer, devices=("cpu",))
        trainer.report_manager.start()
        total, report = Statistics(), Statistics()
        states = []
        for batches, normalization in trainer._accum_batches(iter(_batches(vocabs))):
            step = trainer.optim.training_step
            with HostReads() as found:
                trainer._gradient_accumulation(batches, normalization, total, report)
                if step % 2:  # not a report step: nothing may be read
                    report = trainer._maybe_report_training(step, 100, 1.0, report)
            if not step % 2:
                report = trainer._maybe_report_training(step, 100, 1.0, report)
            if reads is not None:
                reads.extend(found.reads)
            states.append({name: p.detach().clone() for name, p in trainer.model.named_parameters()})
    return states, reports


@STOCK_AMP_WARNING
@pytest.mark.parametrize("accum_count", [1, 2])
def test_steps_equal_stock_and_read_nothing_from_the_device(monkeypatch, accum_count):
    stock_states, _ = _train(monkeypatch, stock=True, accum_count=accum_count)
    states, _ = _train(monkeypatch, stock=False, accum_count=accum_count)
    assert len(states) == len(stock_states) == len(SHAPES) // accum_count
    for step, (ours, theirs) in enumerate(zip(states, stock_states), start=1):
        for name in theirs:
            assert torch.equal(ours[name], theirs[name]), f"step {step}: {name} differs from stock"
    stock_reads, ours_reads = [], []
    _train(monkeypatch, stock=True, accum_count=accum_count, reads=stock_reads, fused=True)
    _train(monkeypatch, stock=False, accum_count=accum_count, reads=ours_reads, fused=True)
    assert stock_reads, "stock OpenNMT-py's step reads device values (the test would not see a regression)"
    assert not ours_reads, f"host reads in the step: {ours_reads[:5]}"


@STOCK_AMP_WARNING
def test_reports_equal_stock(monkeypatch):
    _, stock_reports = _train(monkeypatch, stock=True)
    _, reports = _train(monkeypatch, stock=False)
    assert [r[0] for r in reports] == [2, 4, 6]
    assert reports == stock_reports  # the loss too: summed in float64 in the stock order


def test_device_sums_settle_onto_what_the_statistics_held():
    from onmt.utils import Statistics

    from onmt_ext.runtime.train_step import add_to, settle

    stats = Statistics(loss=1.5, n_words=10, n_correct=4)
    add_to(stats, torch.tensor([2.25, 7.0, 3.0], dtype=torch.float64))
    add_to(stats, torch.tensor([0.5, 1.0, 1.0], dtype=torch.float64))
    assert (stats.loss, stats.n_words) == (1.5, 10)  # nothing read until settled
    settle(stats)
    assert (stats.loss, stats.n_words, stats.n_correct) == (4.25, 18, 8)
    add_to(stats, torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64))
    settle(stats)  # still from the base it held before the first device sum
    assert (stats.loss, stats.n_words, stats.n_correct) == (5.25, 19, 8)


def test_encoder_equals_stock():
    from onmt.encoders.transformer import TransformerEncoder

    from onmt_ext import patches
    from onmt_ext.runtime.hostsync import HostReads

    opt = support.load_train_opts(CONFIG)
    vocabs = support.load_vocabs(opt)
    model = support.build_model(opt, vocabs)
    src, src_len, _ = support.random_batch(vocabs, [6, 3, 9, 1], [2, 2, 2, 2])
    stock_forward = patches.original(TransformerEncoder, "forward")
    with torch.no_grad(), HostReads() as ours_reads:
        ours = model.encoder(src, src_len)
    with torch.no_grad(), HostReads() as stock_reads:
        stock = stock_forward(model.encoder, src, src_len)
    assert torch.equal(ours[0], stock[0]) and ours[2] is stock[2] is src_len
    assert stock_reads.reads and not ours_reads.reads


def test_host_reads_counts_the_python_reads_and_leaves_torch_tensor_as_it_was():
    """``.tolist()``, ``.cpu()`` and ``.numpy()`` are counted inside the block only; leaving it (by an error too,
    and from nested blocks) leaves ``torch.Tensor``'s own namespace as it was: they are inherited, not set on it."""
    from onmt_ext.runtime.hostsync import HostReads

    before = dict(vars(torch.Tensor))
    values = torch.arange(3.0)
    with HostReads() as outer:
        with HostReads(device="meta") as inner:
            values.tolist()
        values.cpu()
    assert [what for what, _ in outer.reads] == ["tolist", "cpu"] and not inner.reads
    with pytest.raises(ZeroDivisionError), HostReads() as failed:
        values.numpy()
        1 / 0
    values.tolist()
    assert [what for what, _ in failed.reads] == ["numpy"]
    assert dict(vars(torch.Tensor)) == before


def test_host_reads_can_leave_out_the_optimizers_own_step_counters():
    """gpu_check's CPU count leaves out what a non-fused Adam reads of its CPU step counters (they stay on the host
    on a GPU too); every other read still counts."""
    from onmt_ext.runtime.hostsync import HostReads

    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.Adam([weight], lr=0.1, foreach=False)
    weight.grad = torch.ones(3)
    optimizer.step()  # the state exists: the next step reads its counter
    for counters, expected in ((True, 1), (False, 0)):
        with HostReads(optimizer_counters=counters) as found:
            optimizer.step()
        assert len(found.reads) == expected, (counters, found.reads)
    with HostReads(optimizer_counters=False) as found:
        float(weight.detach().sum())
    assert [what for what, _ in found.reads] == ["item"]


def test_fused_adam_follows_adam():
    from onmt_ext.runtime.train_step import fused_adam

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 2))
    twin = copy.deepcopy(model)
    plain = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.9, 0.98), eps=1e-8)
    reference = torch.optim.Adam(twin.parameters(), lr=0.01, betas=(0.9, 0.98), eps=1e-8)
    assert fused_adam(plain) is plain  # the parameters are not on CUDA

    def step(net, optimizer, seed):
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(seed))
        optimizer.zero_grad()
        net(x).square().sum().backward()
        optimizer.step()

    for seed in range(3):
        step(model, plain, seed)
        step(twin, reference, seed)
    fused = fused_adam(plain, devices=("cpu",))
    assert fused is not plain and fused._step_supports_amp_scaling
    assert all(group["fused"] and group["betas"] == (0.9, 0.98) for group in fused.param_groups)
    for seed in range(3, 6):  # the moments and step counts carried over: the same updates, up to rounding
        step(model, fused, seed)
        step(twin, reference, seed)
    for ours, theirs in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_a_batch_dropped_for_lack_of_gpu_memory_is_a_warning_that_says_what(monkeypatch, caplog):
    """Stock skips a batch that runs out of CUDA memory with an INFO line; onmt-ext warns with its size."""
    import logging

    from onmt.utils.logging import logger
    from onmt.utils import Statistics

    opt = support.load_train_opts(CONFIG, "-seed", 1)
    opt.data = {}
    vocabs = support.load_vocabs(opt)
    trainer = _trainer(opt, vocabs)
    batch, _ = _batches(vocabs)[0]

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(trainer, "model", out_of_memory)
    monkeypatch.setattr(trainer.model, "decoder", type("D", (), {"state": {}})(), raising=False)
    monkeypatch.setattr(logger, "propagate", True)
    with caplog.at_level(logging.WARNING, logger=logger.name):
        trainer._gradient_accumulation([batch], 10, Statistics(), Statistics())
    tokens = int(batch["tgt"][:, 1:, 0].ne(trainer.train_loss.padding_idx).sum())
    warned = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warned) == 1 and "CUDA out of memory" in warned[0]
    assert f"a batch of 3 sentences and {tokens} target tokens is skipped" in warned[0]


def test_adam_eps_reaches_adam():
    """-adam_eps is Adam's epsilon; its default is stock's fixed 1e-8, and an optimiser that would not read it
    is refused before training."""
    from onmt.utils.optimizers import Optimizer

    from onmt_ext.runtime.train_step import STOCK_ADAM_EPS, adam_eps_problems

    opt = support.load_train_opts(CONFIG, "-seed", 1)
    vocabs = support.load_vocabs(opt)
    assert opt.adam_eps == STOCK_ADAM_EPS == 1e-8
    model = support.build_model(opt, vocabs, seed=3)
    assert {group["eps"] for group in Optimizer.from_opt(model, opt)._optimizer.param_groups} == {1e-8}
    opt = support.load_train_opts(CONFIG, "-seed", 1, "-adam_eps", "1e-9")
    assert {group["eps"] for group in Optimizer.from_opt(model, opt)._optimizer.param_groups} == {1e-9}
    assert adam_eps_problems(opt) == []
    opt.optim = "sgd"
    assert adam_eps_problems(opt) == ["-adam_eps 1e-09: only -optim adam reads it (this run: -optim sgd)"]
    opt.optim, opt.adam_eps = "adam", 0.0
    assert adam_eps_problems(opt) == ["-adam_eps 0.0: must be above 0"]


def test_the_wait_for_the_first_batch_is_said_once(monkeypatch):
    """Issue 58: training printed nothing for minutes while its first bucket was built; a line says what it waits
    for, and one when the first batch came, once per process; the batches pass unchanged."""
    from onmt.utils import logging as onmt_logging

    from onmt_ext.runtime import train_step

    lines = []
    monkeypatch.setattr(onmt_logging.logger, "info", lines.append)
    monkeypatch.setattr(train_step, "_FIRST_BATCH", [])
    assert list(train_step._first_batch_said(iter([1, 2, 3]))) == [1, 2, 3]
    assert len(lines) == 2
    assert lines[0].startswith("onmt-ext: building the first training batches")
    assert lines[1].startswith("onmt-ext: the first training batch came after ") and lines[1].endswith(" s")
    assert list(train_step._first_batch_said(iter([4, 5]))) == [4, 5] and len(lines) == 2  # once per process
