"""A training step that never waits for the GPU between report steps.

Stock OpenNMT-py 3.5.1 reads device values on the host several times a step (``.item()`` of the token count,
the source length sum, the loss and the accuracy counts; ``lengths.max()`` for the encoder mask; the AMP scaler's
inf check before a non-fused Adam step).  Here:

* token counts come from the batch's CPU tensors (:data:`onmt_ext.runtime.batches.HOST`);
* loss, target-token and correct-token sums stay on the device, in float64 in stock's order, and are read once
  per report (:func:`settle`);
* the encoder's padding mask takes the batch width; Adam on a CUDA model is torch's fused Adam.

Also here: ``-adam_eps``, Adam's epsilon, which stock fixes at :data:`STOCK_ADAM_EPS`.

Parameters after each step and the reported statistics equal stock's bit for bit (fused Adam aside;
``tests/unit/test_train_step.py``).  docs/differences-from-stock.md, "Speed".
"""

import sys
import time
import traceback

import torch

from onmt_ext.runtime.batches import HOST
from onmt_ext.patches import FIX, NEEDED, SPEED, patch, record

# OpenNMT-py is imported inside the functions: importing it while this module initialises would activate
# onmt-ext (onmt_ext._autoload) before this module is whole.

#: attribute of an onmt.utils.Statistics holding its device sums ``[loss, n_words, n_correct]`` (float64)
_SUMS = "_onmt_ext_device_sums"
_TEST = "tests/unit/test_train_step.py"
#: the epsilon OpenNMT-py 3.5.1 gives ``-optim adam`` (``onmt.utils.optimizers.build_torch_optimizer``)
STOCK_ADAM_EPS = 1e-8


# ---------------------------------------------------------------- statistics on the device


def add_to(stats, sums):
    """Add ``sums`` ``(3,)`` (loss, target tokens, correct tokens) to ``stats``' device sums."""
    held = getattr(stats, _SUMS, None)
    if held is None:  # what the host fields hold now is the base that settle() adds the device sums to
        setattr(stats, _SUMS, (sums.clone(), (stats.loss, stats.n_words, stats.n_correct)))
    else:
        held[0].add_(sums)


def settle(stats, keep=True):
    """Set ``stats``' host fields to its base plus its device sums (one read of the device); returns ``stats``.

    With fresh statistics the base is 0 (and 0 + x is x): the loss is the stock
    running sum, in the stock order.  ``keep=False`` drops the device sums (statistics that
    are pickled or thrown away next).
    """
    held = getattr(stats, _SUMS, None) if stats is not None else None
    if held is None:
        return stats
    sums, (loss, words, correct) = held
    total_loss, total_words, total_correct = sums.tolist()
    stats.loss = loss + total_loss
    stats.n_words, stats.n_correct = words + int(total_words), correct + int(total_correct)
    if not keep:
        delattr(stats, _SUMS)
    return stats


def _plain_loss(compute):
    """True when ``compute`` (a LossCompute) is the generator and a cross entropy, nothing else."""
    return (type(compute.criterion) is torch.nn.CrossEntropyLoss and not compute.copy_attn
            and not compute.lambda_align and not compute.lambda_coverage
            and compute.lm_generator is None and compute.lm_prior_model is None)


def loss_on_device(compute, batch, output, attns, start, size):
    """The loss of target positions ``start .. start + size`` and its sums, without reading the device.

    Args:
        compute: the trainer's ``LossCompute``.
        batch: the batch; ``batch["tgt"]`` ``(batch, len, 1)``.
        output: decoder output ``(batch, len - 1, d_model)``.
    Returns:
        ``(loss, sums)``: the summed loss (a scalar tensor) and ``(3,)`` float64
        ``[loss, target tokens, correct tokens]``.  A loss other than the plain
        one (copy attention, alignment, coverage, LM prior, sparsemax) is the
        stock ``LossCompute``'s, which reads the device.
    """
    if not _plain_loss(compute):
        loss, stats = compute(batch, output, attns, trunc_start=start, trunc_size=size)
        return loss, torch.tensor([stats.loss, stats.n_words, stats.n_correct], dtype=torch.float64,
                                  device=output.device)
    end = start + size
    target = batch["tgt"][:, start + compute.tgt_shift_index:end, 0].reshape(-1)  # (tokens,)
    hidden = output[:, start:end, :]
    scores = compute.generator(hidden.reshape(-1, hidden.size(-1)))  # (tokens, vocab)
    loss = compute.criterion(scores.to(torch.float32), target)
    real = target.ne(compute.padding_idx)
    correct = scores.max(1)[1].eq(target) & real
    sums = torch.stack([loss.detach().sum().double(), real.sum().double(), correct.sum().double()])
    return loss, sums


# ---------------------------------------------------------------- the trainer's step


def host_counts(batch, padding_idx):
    """``(source words, target tokens after BOS)`` of ``batch``, from its CPU tensors (kept under HOST)."""
    host = batch.setdefault(HOST, {"srclen": batch.get("srclen"), "tgt": batch["tgt"]})
    if "counts" not in host:
        lengths, tgt = host["srclen"], host["tgt"]
        host["counts"] = (None if lengths is None else int(lengths.sum()),
                          int(tgt[:, 1:, 0].ne(padding_idx).sum()))
    return host["counts"]


#: the process has said that it waits for its first training batch (:func:`_first_batch_said`)
_FIRST_BATCH = []


def _first_batch_said(iterator):
    """``iterator``, with a log line before its first batch (the data path fills a bucket of ``-bucket_size``
    examples first, minutes on a large corpus with nothing printed) and one when it came; once per process."""
    if _FIRST_BATCH:
        yield from iterator
        return
    from onmt.utils.logging import logger

    _FIRST_BATCH.append(True)
    logger.info("onmt-ext: building the first training batches (a bucket of -bucket_size examples is read, "
                "transformed and sorted first)")
    start = time.monotonic()
    items = iter(iterator)
    try:
        first = next(items)
    except StopIteration:
        return
    logger.info(f"onmt-ext: the first training batch came after {time.monotonic() - start:.1f} s")
    yield first
    yield from items


def accum_batches(self, iterator):
    """``Trainer._accum_batches`` counting the normalisation on the CPU copy of each batch."""
    batches, normalization = [], 0
    self.accum_count = self._accum_count(self.optim.training_step)
    for batch, _ in _first_batch_said(iterator):
        batches.append(batch)
        _, tokens = host_counts(batch, self.train_loss.padding_idx)
        # stock: target tokens after BOS without each sentence's EOS, or sentences
        normalization += tokens - len(batch["tgt"]) if self.norm_method == "tokens" else len(batch["tgt"])
        if len(batches) == self.accum_count:
            yield batches, normalization
            self.accum_count = self._accum_count(self.optim.training_step)
            batches, normalization = [], 0
    if batches:
        yield batches, normalization


def gradient_accumulation(self, true_batches, normalization, total_stats, report_stats):
    """``Trainer._gradient_accumulation`` with the statistics kept on the device (see the module docstring)."""
    import onmt

    if self.accum_count > 1:
        self.optim.zero_grad(set_to_none=True)
    for batch in true_batches:
        words, _ = host_counts(batch, self.train_loss.padding_idx)
        if words is not None:
            report_stats.n_src_words += words
            total_stats.n_src_words += words
        tgt_full, length = batch["tgt"], batch["tgt"].size(1)
        size = self.trunc_size or length
        bptt = False
        for start in range(0, length - 1, size):
            if self.accum_count == 1:
                self.optim.zero_grad(set_to_none=True)
            try:
                with torch.autocast("cuda", enabled=self.optim.amp):
                    model_out, attns = self.model(batch["src"], tgt_full[:, start:start + size, :], batch["srclen"],
                                                  bptt=bptt, with_align=self.with_align)
                    bptt = True
                    if self.zero_out_prompt_loss:
                        batch = self.train_loss.ignore_prompt(batch)
                    loss, sums = loss_on_device(self.train_loss, batch, model_out, attns, start, size)
                if loss is not None:
                    loss /= normalization
                    self.optim.backward(loss)
                sentences = len(batch["srclen"]) if start == 0 else 0
                for stats in (total_stats, report_stats):
                    stats.n_sents += sentences
                    stats.n_batchs += 1 if sentences else 0
                    add_to(stats, sums)
            except Exception:
                if "CUDA out of memory" not in traceback.format_exc():
                    raise
                _skip_out_of_memory(self, batch)
            if self.model.decoder.state != {}:
                self.model.decoder.detach_state()
    if self.n_gpu > 1 and self.parallel_mode == "data_parallel":
        # summed, not averaged (stock divides by n_gpu): each rank's loss is already divided by the normalisation of
        # all ranks (Trainer.train gathers it), so the sum is the gradient of one process fed every rank's batches
        grads = [p.grad.data for p in self.model.parameters() if p.requires_grad and p.grad is not None]
        onmt.utils.distributed.all_reduce_and_rescale_tensors(grads, 1.0)
    self.optim.step()


def _skip_out_of_memory(trainer, batch):
    """Stock's answer to running out of GPU memory: drop the batch and free the cache; here with a warning
    that says what was dropped (stock logs "cuda OOM - batch removed" at INFO level)."""
    from onmt.utils.logging import logger

    _, tokens = host_counts(batch, trainer.train_loss.padding_idx)
    logger.warning("onmt-ext: step %d: CUDA out of memory; a batch of %d sentences and %d target tokens is "
                   "skipped, as stock OpenNMT-py does, so this update trains on fewer tokens. Fewer tokens per "
                   "pass with more passes per update avoid it (-batch_size with -accum_count; docs/reproduce.md, "
                   "'Passes per update')", trainer.optim.training_step, len(batch["tgt"]), tokens)
    torch.cuda.empty_cache()
    if trainer.n_gpu > 1 and trainer.parallel_mode == "tensor_parallel":
        torch.distributed.destroy_process_group()
        sys.exit()


def _report_training(stock, self, step, num_steps, learning_rate, patience, report_stats, multigpu=False):
    if step % self.report_every == 0:
        settle(report_stats, keep=False)  # thrown away after the report (pickled first with several GPUs)
    return stock(self, step, num_steps, learning_rate, patience, report_stats, multigpu=multigpu)


def _report_step(stock, self, lr, patience, step, train_stats=None, valid_stats=None):
    return stock(self, lr, patience, step, train_stats=settle(train_stats), valid_stats=settle(valid_stats))


# ---------------------------------------------------------------- model and optimiser


def encoder_forward(self, src, src_len=None):
    """``TransformerEncoder.forward`` with the padding mask as wide as the batch (no ``lengths.max()`` read).

    ``src`` ``(batch, len, feats)`` is padded to its longest sentence, so the
    width is ``len``, which stock reads from the device as ``src_len.max()``.
    """
    from onmt.utils.misc import sequence_mask  # (onmt is imported by now; see batches._INFER)

    enc_out = self.embeddings(src)
    mask = sequence_mask(src_len, src.size(1)).unsqueeze(1).unsqueeze(1)  # (batch, 1, 1, len)
    mask = mask.expand(-1, -1, mask.size(3), -1)  # (batch, 1, len, len)
    for layer in self.transformer:
        enc_out = layer(enc_out, mask)
    return self.layer_norm(enc_out), None, src_len


def fused_adam(optimizer, devices=("cuda",)):
    """torch's fused Adam in place of a plain ``torch.optim.Adam`` whose parameters are all on ``devices``.

    The state (moments, steps) and hyper-parameters carry over.  Returns the
    new optimiser, or ``optimizer`` itself when it is not such an Adam.
    """
    if type(optimizer) is not torch.optim.Adam:
        return optimizer
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if not params or not all(p.device.type in devices and p.is_floating_point() for p in params):
        return optimizer
    if any(group.get("differentiable") or group.get("capturable") for group in optimizer.param_groups):
        return optimizer
    state = optimizer.state_dict()
    for group in state["param_groups"]:
        group.update(fused=True, foreach=None)
    fused = torch.optim.Adam([{"params": group["params"]} for group in optimizer.param_groups],
                             lr=optimizer.defaults["lr"], fused=True)
    fused.load_state_dict(state)  # hyper-parameters, moments and steps (moved to the parameters' device)
    return fused


def _optimizer_from_opt(stock, cls, model, opt, checkpoint=None):
    optimizer = stock(cls, model, opt, checkpoint=checkpoint)
    optimizer._optimizer = fused_adam(optimizer._optimizer)
    return optimizer


def adam_eps_problems(opt):
    """``-adam_eps`` that no optimiser would read, or not above 0: one line each (checked before training)."""
    eps = getattr(opt, "adam_eps", STOCK_ADAM_EPS)
    if eps == STOCK_ADAM_EPS:
        return []
    if not eps > 0:
        return [f"-adam_eps {eps}: must be above 0"]
    if getattr(opt, "optim", "sgd") != "adam":
        return [f"-adam_eps {eps}: only -optim adam reads it (this run: -optim {opt.optim})"]
    return []


def _adam_eps(stock, cls, model, opt, checkpoint=None):
    """The optimiser with ``-adam_eps`` in every Adam parameter group (a resumed run's too: the option of this
    run, not the checkpoint's, as for the learning rate)."""
    optimizer = stock(cls, model, opt, checkpoint=checkpoint)
    if isinstance(optimizer._optimizer, torch.optim.Adam):
        for group in optimizer._optimizer.param_groups:
            group["eps"] = getattr(opt, "adam_eps", STOCK_ADAM_EPS)
    return optimizer


def install():
    """Register the changes (idempotent)."""
    from onmt.encoders.transformer import TransformerEncoder
    from onmt.trainer import Trainer
    from onmt.utils.optimizers import Optimizer
    from onmt.utils.report_manager import ReportMgrBase

    record("data-parallel gradient scale (onmt_ext.runtime.train_step.gradient_accumulation)", kind=FIX, runtime=True,
           test="tests/unit/test_distributed.py::"
                "test_the_gradient_and_the_parameters_equal_one_process_fed_both_batches",
           reason="with several GPUs the all-reduced gradient is divided by their number although each rank's loss is "
                  "already divided by the normalisation of all ranks: 1/world_size of the gradient of one process fed "
                  "the same batches (halves SGD's learning rate on 2 GPUs, moves -max_grad_norm's threshold)")
    same = "the same parameters and statistics as stock at every step"
    patch(Trainer, "_accum_batches", accum_batches, wrap=False, kind=SPEED,
          test=f"{_TEST}::test_steps_equal_stock_and_read_nothing_from_the_device",
          reason="the loss normalisation reads each batch's token count from the GPU (.item()); " + same)
    patch(Trainer, "_gradient_accumulation", gradient_accumulation, wrap=False, kind=SPEED,
          test=f"{_TEST}::test_steps_equal_stock_and_read_nothing_from_the_device",
          reason="every batch reads the source length sum, the loss and the accuracy counts from the GPU "
                 "(.item()); " + same)
    patch(ReportMgrBase, "report_training", _report_training, kind=SPEED,
          test=f"{_TEST}::test_reports_equal_stock",
          reason="reads the device sums of the report interval once, when a report is written")
    patch(ReportMgrBase, "report_step", _report_step, kind=SPEED, test=f"{_TEST}::test_reports_equal_stock",
          reason="reads the device sums of the training statistics when a validation step reports them")
    patch(TransformerEncoder, "forward", encoder_forward, wrap=False, kind=SPEED,
          test=f"{_TEST}::test_encoder_equals_stock",
          reason="the padding mask's width is read from the GPU (src_len.max()) although it is the batch width")
    patch(Optimizer, "from_opt", _adam_eps, kind=NEEDED, order=1, test=f"{_TEST}::test_adam_eps_reaches_adam",
          reason="-adam_eps: stock fixes Adam's epsilon at 1e-8; the papers follow Vaswani et al.'s 1e-9")
    patch(Optimizer, "from_opt", _optimizer_from_opt, kind=SPEED, test=f"{_TEST}::test_fused_adam_follows_adam",
          reason="with AMP, the scaler reads a non-fused Adam's inf flag from the GPU before every step; fused "
                 "Adam takes the flag on the device")
