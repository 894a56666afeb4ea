"""Training batches that reach the GPU without stalling the training thread.

Stock OpenNMT-py 3.5.1 has three host stalls on the way from corpus to GPU:

* each batch carries per-example Python lists (``ind_in_bucket``, ``cid``,
  ``cid_line_number``) that the DataLoader's pin-memory thread unpickles and
  walks under the GIL while the training thread waits for it;
* with data workers, every tensor is copied with a blocking ``.to(device)``,
  which waits for all GPU work queued before it;
* without workers, ``tensorify`` builds every sentence's tensor on the GPU,
  one blocking copy per sentence.

Here training and validation batches (not translation's) carry tensors only
(the corpus of each example as its position in ``opt.data``), are built on the
CPU, pinned and copied with ``non_blocking=True``.  The batch also keeps
:data:`HOST`: its CPU ``srclen`` and ``tgt``, from which the trainer counts
tokens without reading the GPU.  Which examples, in which order, with which
transforms, is unchanged (``tests/unit/test_batches.py``).
"""

import torch
from onmt.constants import CorpusTask

from onmt_ext.patches import SPEED, patch

#: key of a batch's CPU tensors ``{"srclen": (batch,), "tgt": (batch, len, 1)}`` (the trainer counts from them)
HOST = "onmt_ext_host"
#: per-example lists of stock batches that become tensors here
_LISTS = ("ind_in_bucket", "cid", "cid_line_number")
#: keys that stock OpenNMT-py keeps on the CPU
_CPU_KEYS = ("src_ex_vocab", *_LISTS, HOST)
_TEST = "tests/unit/test_batches.py"


def tensor_bookkeeping(batch, corpus_names):
    """Turn a stock batch's per-example lists into int64 tensors ``(batch,)``, in place.

    ``cid`` becomes the position of each example's corpus in ``corpus_names``.
    A batch of the copy mechanism keeps its lists: ``src_ex_vocab`` holds
    vocabulary objects that no tensor can carry.
    """
    if "src_ex_vocab" in batch:
        return batch
    positions = {name: index for index, name in enumerate(corpus_names)}
    batch["cid"] = [positions[name] for name in batch["cid"]]
    for key in _LISTS:
        batch[key] = torch.tensor(batch[key], dtype=torch.long)
    return batch


def _tensor_batches(stock, self):
    """``DynamicDatasetIter.__iter__``, training and validation batches with tensors only."""
    if self.task == CorpusTask.INFER:
        yield from stock(self)
        return
    names = list(self.corpora_info)
    for batch, bucket_index in stock(self):
        yield tensor_bookkeeping(batch, names), bucket_index


def to_device(batch, device):
    """Pin and copy a CPU batch's tensors to ``device`` without waiting; keep the CPU counts under :data:`HOST`."""
    batch[HOST] = {"srclen": batch.get("srclen"), "tgt": batch.get("tgt")}
    for key, value in batch.items():
        if key in _CPU_KEYS or not torch.is_tensor(value):
            continue
        if device.type == "cuda" and not value.is_pinned():
            value = value.pin_memory()
        batch[key] = value.to(device, non_blocking=True)
    return batch


def _device_batches(stock, self):
    """``OnDeviceDatasetIter.__iter__``: asynchronous copies to a CUDA device (stock elsewhere)."""
    if self.device.type != "cuda":
        yield from stock(self)
        return
    for batch, bucket_index in self.data_iter:
        yield to_device(batch, self.device), bucket_index


def _cpu_built_iterator(stock, opt, transforms_cls, vocabs, *args, task=CorpusTask.TRAIN, device_id=-1, **kwargs):
    """``build_dynamic_dataset_iter`` for training/validation on a GPU: batches built on the CPU, then copied."""
    from onmt.inputters.dynamic_iterator import OnDeviceDatasetIter

    if task == CorpusTask.INFER or device_id < 0:
        return stock(opt, transforms_cls, vocabs, *args, task=task, device_id=device_id, **kwargs)
    built = stock(opt, transforms_cls, vocabs, *args, task=task, device_id=-1, **kwargs)
    if built is None:
        return None
    if isinstance(built, OnDeviceDatasetIter):  # data workers: the DataLoader already pins
        built.device = torch.device("cuda", device_id)
        return built
    return OnDeviceDatasetIter(built, torch.device("cuda", device_id))


def install():
    """Register the three changes (idempotent)."""
    from onmt import train_single
    from onmt.inputters import dynamic_iterator

    patch(dynamic_iterator.DynamicDatasetIter, "__iter__", _tensor_batches, kind=SPEED,
          test=f"{_TEST}::test_batches_carry_tensors_only_and_the_same_data",
          reason="per-example Python lists in every batch keep the pin-memory thread busy under the GIL while "
                 "the training thread waits")
    patch(dynamic_iterator.OnDeviceDatasetIter, "__iter__", _device_batches, kind=SPEED,
          test=f"{_TEST}::test_batches_reach_the_device_unchanged",
          reason="a blocking .to(device) of every batch tensor waits for all queued GPU work")
    patch(train_single, "build_dynamic_dataset_iter", _cpu_built_iterator, kind=SPEED,
          test=f"{_TEST}::test_training_iterators_build_on_the_cpu",
          reason="without data workers, stock builds each sentence's tensor on the GPU, a blocking copy each")
