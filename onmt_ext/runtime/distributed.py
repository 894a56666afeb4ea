"""Data-parallel training on CPU ranks: ``onmt_train -world_size N -gpu_ranks ...`` on a machine without CUDA.

The rule (:func:`cpu_ranks`): when this torch sees no CUDA device (a CPU build, or ``CUDA_VISIBLE_DEVICES=``),
``-world_size`` above 1 with ``-parallel_mode data_parallel`` runs one CPU process per ``-gpu_ranks`` entry, as
on GPUs, over gloo in place of ``-gpu_backend``; the parent says so in one log line.  Each rank reads its own
share of the corpus and all-reduces the gradients as on GPUs; at every checkpoint the ranks compare digests of
their parameters (rank 0 logs the digest, a difference stops the run).  With CUDA these changes call stock,
but for two: each rank reads the share of its global rank among ``-world_size`` (:func:`global_share`; stock
shares by the processes of one node, so every node read the same lines), and ``all_gather_list`` gathers on the
host through a gloo group of the same ranks (:func:`host_group`), so that no step waits for the device.
``ONMT_EXT_TRACE_BATCHES=<dir>`` (tests, debugging) writes each training batch's source ids and target token
count to ``<dir>/batches.<rank>.jsonl`` (``single`` without ranks).  docs/scale-out.md.
"""

import copy
import hashlib
import json
import os
from datetime import timedelta

import torch

from onmt_ext.errors import UserError
from onmt_ext.patches import FIX, SPEED, patch, record

# OpenNMT-py is imported inside the functions: importing it while this module initialises would activate
# onmt-ext (onmt_ext._autoload) before this module is whole.

#: the environment variable of the batch trace (see the module docstring)
TRACE_VARIABLE = "ONMT_EXT_TRACE_BATCHES"
_TEST = "tests/integration/test_distributed_cli.py"


def cpu_ranks(opt):
    """True when ``opt`` asks for several data-parallel ranks and this torch has no CUDA device to give them."""
    return (getattr(opt, "world_size", 1) > 1 and bool(getattr(opt, "gpu_ranks", None))
            and getattr(opt, "parallel_mode", "data_parallel") == "data_parallel" and not torch.cuda.is_available())


def _on_cpu_ranks():
    """True inside a rank of :func:`cpu_ranks` (its gloo process group is up)."""
    distributed = torch.distributed
    return (distributed.is_available() and distributed.is_initialized() and distributed.get_backend() == "gloo"
            and not torch.cuda.is_available())


def _rank_name():
    return str(torch.distributed.get_rank()) if torch.distributed.is_initialized() else "single"


def waiting_line(opt):
    """The log line of a node that holds only some of the ranks (``len(-gpu_ranks) < -world_size``, legal: each
    node of a multi-node run gives its own ranks): its ranks wait for the others at ``-master_ip:-master_port``,
    up to ``-timeout`` seconds, before the run fails; None when this node holds every rank."""
    ranks = list(getattr(opt, "gpu_ranks", None) or [])
    world_size = getattr(opt, "world_size", 1)
    if not ranks or world_size <= len(ranks):
        return None
    return (f"onmt-ext: this node runs ranks {' '.join(map(str, ranks))} of -world_size {world_size}: they wait "
            f"up to -timeout {opt.timeout} s for the other {world_size - len(ranks)} at {opt.master_ip}:"
            f"{opt.master_port} (start the other nodes, or give -gpu_ranks {' '.join(map(str, range(world_size)))} "
            "to run them all here; docs/scale-out.md)")


def _train_said(stock, opt, *args, **kwargs):
    """``onmt.bin.train.train``: one log line when the ranks are CPU processes, and one when this node holds only
    some of the ranks (:func:`waiting_line`)."""
    waiting = waiting_line(opt)
    if cpu_ranks(opt) or waiting:
        from onmt.utils.logging import init_logger, logger

        init_logger(opt.log_file)
        if cpu_ranks(opt):
            logger.info(f"onmt-ext: this torch sees no CUDA device: -world_size {opt.world_size} -gpu_ranks "
                        f"{' '.join(map(str, opt.gpu_ranks))} run as {len(opt.gpu_ranks)} CPU processes over gloo "
                        f"(-gpu_backend {opt.gpu_backend} is not used; docs/scale-out.md)")
        if waiting:
            logger.info(waiting)
    return stock(opt, *args, **kwargs)


def _multi_init(stock, opt, device_id):
    """``multi_init``: gloo on CPU ranks, ``-timeout`` kept for :func:`host_group`, and a rendezvous that the other
    ranks never reached (torch's ``DistError`` traceback after ``-timeout``) as one line."""
    _TIMEOUT[:] = [opt.timeout]
    if cpu_ranks(opt):
        opt = copy.copy(opt)
        opt.gpu_backend = "gloo"
    try:
        return stock(opt, device_id)
    except torch.distributed.DistError as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        command = "onmt_train" if hasattr(opt, "train_steps") else "onmt_translate"
        raise UserError(f"-world_size {opt.world_size}: the ranks did not all meet at {opt.master_ip}:"
                        f"{opt.master_port} within -timeout {opt.timeout} s ({first}); start every node's {command} "
                        "with the same -world_size, -master_ip and -master_port, or give this node every rank "
                        f"(-gpu_ranks {' '.join(map(str, range(opt.world_size)))})") from None


def _configure_process(stock, opt, device_id):
    if not cpu_ranks(opt):
        return stock(opt, device_id)
    from onmt.utils.misc import set_random_seed

    if "OMP_NUM_THREADS" not in os.environ:  # the ranks share the machine's cores
        threads = torch.get_num_threads()
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // len(opt.gpu_ranks)))
        record("torch.set_num_threads (a CPU rank)", kind=FIX, undo=lambda: torch.set_num_threads(threads),
               test=f"{_TEST}::test_after_every_step_both_ranks_hold_the_parameters_of_the_checkpoint",
               reason="each CPU rank of -world_size N takes its share of the machine's cores (1/N), unless "
                      "OMP_NUM_THREADS says otherwise; N ranks of all the cores each crawl")
    set_random_seed(opt.seed, False)


def _use_gpu(stock, opt):
    return False if cpu_ranks(opt) else stock(opt)


class _Traced:
    """A training iterator that writes each batch it yields to the trace file (see the module docstring)."""

    def __init__(self, inner, path, padding_idx):
        self.inner, self.path, self.padding_idx = inner, path, padding_idx

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __iter__(self):
        with open(self.path, "a", encoding="utf-8") as trace:
            for batch, bucket in self.inner:
                lengths = batch["srclen"].tolist()
                rows = [row[:length] for row, length in zip(batch["src"][:, :, 0].tolist(), lengths)]
                tokens = int(batch["tgt"][:, 1:, 0].ne(self.padding_idx).sum())
                trace.write(json.dumps({"src": rows, "tgt_tokens": tokens}) + "\n")
                trace.flush()
                yield batch, bucket


def _iterator(stock, opt, transforms_cls, vocabs, *args, task="train", device_id=-1, **kwargs):
    """``build_dynamic_dataset_iter`` of a CPU rank: its batches stay on the CPU (the rank's share, ``stride`` and
    ``offset``, is what ``train_single.main`` computed); a training iterator is traced when asked."""
    from onmt.constants import CorpusTask, DefaultTokens

    if device_id >= 0 and cpu_ranks(opt):
        device_id = -1
    built = stock(opt, transforms_cls, vocabs, *args, task=task, device_id=device_id, **kwargs)
    folder = os.environ.get(TRACE_VARIABLE)
    if not folder or built is None or task != CorpusTask.TRAIN:
        return built
    path = os.path.join(folder, f"batches.{_rank_name()}.jsonl")
    return _Traced(built, path, vocabs["tgt"][DefaultTokens.PAD])


def global_share(stride, offset):
    """``(stride, offset)`` of this process's share of the training corpora: its global rank among all ranks.

    Stock ``train_single.main`` passes ``len(-gpu_ranks)`` and the process's index on its own node, so the
    ranks of a second node (``-gpu_ranks 8 ... 15`` of ``-world_size 16``) read exactly the first node's shares.
    With one node and ``-gpu_ranks 0 ... N-1`` both are the same.  Outside a process group: unchanged.
    """
    distributed = torch.distributed
    if not (distributed.is_available() and distributed.is_initialized()):
        return stride, offset
    return distributed.get_world_size(), distributed.get_rank()


def _global_share_iterator(stock, opt, *args, task="train", stride=1, offset=0, **kwargs):
    """``build_dynamic_dataset_iter`` of a data-parallel training rank: stride and offset of :func:`global_share`
    (one log line, from rank 0, when they differ from stock's)."""
    from onmt.constants import CorpusTask

    if task == CorpusTask.TRAIN and getattr(opt, "parallel_mode", "data_parallel") == "data_parallel":
        share = global_share(stride, offset)
        if share != (stride, offset):
            from onmt.utils.logging import logger

            logger.info(f"onmt-ext: each of the {share[0]} ranks reads its own share of the training corpora, by "
                        f"global rank (stock OpenNMT-py shares by the {stride} processes of one node, so every "
                        "node would read the same lines; docs/scale-out.md)")
            stride, offset = share
    return stock(opt, *args, task=task, stride=stride, offset=offset, **kwargs)


def parameter_digest(state):
    """sha256 (hex) of a model's ``state_dict()`` items (as a checkpoint holds them), by name: names, dtypes, shapes
    and bytes."""
    digest = hashlib.sha256()
    for name, value in sorted(state, key=lambda item: item[0]):
        value = value.detach().cpu().contiguous()
        digest.update(f"{name}:{value.dtype}:{tuple(value.shape)};".encode())
        digest.update(value.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class RanksDiverged(RuntimeError):
    """The ranks' parameters differ at a checkpoint; the message is one line."""


def _save_compared(stock, self, step, *args, **kwargs):
    """``ModelSaverBase.save`` on CPU ranks: the ranks' parameter digests are compared first (rank 0 logs it)."""
    if _on_cpu_ranks() and self.keep_checkpoint != 0 and step != self.last_saved_step:
        from onmt.utils.logging import logger

        digests = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(digests, parameter_digest(self.model.state_dict().items()))
        if len(set(digests)) > 1:
            raise RanksDiverged(f"step {step}: the parameters of the {len(digests)} ranks differ (sha256 "
                                f"{', '.join(d[:12] for d in digests)}): the gradient all-reduce is broken")
        logger.info(f"onmt-ext: step {step}: the {len(digests)} ranks hold identical parameters "
                    f"(sha256 {digests[0]})")
    return stock(self, step, *args, **kwargs)


def _gathered(data, group=None):
    """Every rank's ``data``, in rank order, through gloo's ``all_gather_object`` over ``group`` (None: the world)."""
    gathered = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, data, group=group)
    return gathered


def _all_gather_list(stock, data, max_size=4096):
    """``all_gather_list`` on CPU ranks: gloo's ``all_gather_object`` (stock's buffers are CUDA tensors)."""
    if not _on_cpu_ranks():
        return stock(data, max_size=max_size)
    return _gathered(data)


#: the gloo group of every rank that :func:`_gathered_on_the_host` uses beside an NCCL world (made at its first call)
_HOST_GROUP = []
#: ``-timeout`` (seconds) of the world that ``multi_init`` made in this process, for :func:`host_group`
_TIMEOUT = []


def host_group():
    """A gloo process group of every rank, made once per process: its collectives move CPU tensors only.  Every
    rank must make it at the same point (``torch.distributed.new_group`` is collective); the first per-step
    gather of ``Trainer.train`` is such a point.  It waits for a missing rank as long as the world does
    (``-timeout``), not gloo's default of 30 minutes."""
    if not _HOST_GROUP:
        timeout = timedelta(seconds=_TIMEOUT[0]) if _TIMEOUT else None
        _HOST_GROUP.append(torch.distributed.new_group(backend="gloo", timeout=timeout))
    return _HOST_GROUP[0]


def _gathered_on_the_host(stock, data, max_size=4096):
    """``all_gather_list`` beside a world that is not gloo (NCCL on GPUs): the objects gathered through
    :func:`host_group`, on the host.  Stock pickles ``data`` into a CUDA byte tensor and reads each rank's back with
    ``.item()`` and ``.tolist()``, several waits for the device at the start of every step (``Trainer.train``
    gathers the normalisation there).  Here the ranks' hosts meet, and the device's queue keeps running."""
    if not torch.distributed.is_initialized() or torch.distributed.get_backend() == "gloo":
        return stock(data, max_size=max_size)
    return _gathered(data, host_group())


def install():
    """Register the changes (idempotent)."""
    import onmt.model_builder
    import onmt.utils.misc
    from onmt import train_single
    from onmt.bin import train
    from onmt.models.model_saver import ModelSaverBase
    from onmt.utils import distributed

    crash = ("-world_size 2 -gpu_ranks 0 1 on a torch without CUDA crashes (torch.cuda.set_device, CUDA tensors, "
             "nccl); onmt-ext runs the ranks as CPU processes over gloo")
    test = f"{_TEST}::test_after_every_step_both_ranks_hold_the_parameters_of_the_checkpoint"
    patch(train, "train", _train_said, kind=FIX, order=1, reason=crash + ", and says so in one log line",
          test=f"{_TEST}::test_the_ranks_read_disjoint_shares_that_cover_the_corpus")
    patch(distributed, "multi_init", _multi_init, kind=FIX, test=test,
          reason=crash + ": gloo in place of -gpu_backend; -timeout kept for the host group (host_group)")
    patch(train_single, "configure_process", _configure_process, kind=FIX, test=test,
          reason=crash + ": no torch.cuda.set_device, and the cores shared among the ranks")
    for owner in (onmt.utils.misc, onmt.model_builder):  # the model builder calls the name it imported
        patch(owner, "use_gpu", _use_gpu, kind=FIX, test=test, reason=crash + ": the model and loss on the CPU")
    patch(train_single, "build_dynamic_dataset_iter", _iterator, kind=FIX, order=0,  # before batches' GPU copy
          test=f"{_TEST}::test_the_ranks_read_disjoint_shares_that_cover_the_corpus",
          reason=crash + ": each rank's batches on the CPU; ONMT_EXT_TRACE_BATCHES traces them")
    patch(train_single, "build_dynamic_dataset_iter", _global_share_iterator, kind=FIX, order=2,
          test=f"{_TEST}::test_two_nodes_read_disjoint_shares_that_cover_the_corpus",
          reason="stock shares the training corpora among the processes of one node (stride len(-gpu_ranks), "
                 "offset the local index), so with several nodes every node reads the same lines and each "
                 "update holds each batch once per node; onmt-ext shares by global rank among -world_size")
    patch(distributed, "all_gather_list", _all_gather_list, kind=FIX, test=test,
          reason=crash + ": the per-step normalisation and the reports gathered with gloo")
    patch(distributed, "all_gather_list", _gathered_on_the_host, kind=SPEED, order=1,
          test="tests/unit/test_distributed.py::test_beside_an_nccl_world_the_gather_stays_on_the_host",
          reason="stock gathers each step's normalisation through CUDA byte tensors read back with .item() and "
                 ".tolist(): on several GPUs, the host waits for the device at the start of every step; a gloo "
                 "group of the same ranks gathers the same Python objects on the host")
    patch(ModelSaverBase, "save", _save_compared, kind=FIX, test=test,
          reason=crash + ", and compares the ranks' parameters at every checkpoint")
