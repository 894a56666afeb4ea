"""Training batches that reach the GPU without stalling the training thread.

Stock OpenNMT-py 3.5.1 puts per-example Python lists (``ind_in_bucket``, ``cid``, ``cid_line_number``) in every
batch, which the pin-memory thread walks under the GIL; sends each tensor from a data worker as shared memory whose
file descriptor is fetched over a new socket connection (``make bench-host`` measures it); copies every tensor
with a blocking ``.to(device)``; and without workers builds every sentence's tensor on the GPU.

Here a training or validation batch crosses from a worker as one packed int64 buffer with its layout (the lists
become tensors, ``cid`` the position of the example's corpus in ``opt.data``), is built on the CPU, pinned once
and copied with one ``non_blocking`` copy; :data:`HOST` keeps its CPU ``srclen`` and ``tgt`` for counting. A
worker fills its buckets with the garbage collector paused and without splitting plain lines into features, sorts
and cuts them with each example's key computed once, and pads each side of a batch as one tensor
(``docs/differences-from-stock.md``). The data and its order are stock's (``tests/unit/test_batches.py``).
"""

import gc
import math
from itertools import chain

import numpy as np
import torch

from onmt_ext.patches import SPEED, patch

# OpenNMT-py is imported inside the functions: importing it while this module initialises would activate
# onmt-ext (onmt_ext._autoload) before this module is whole.

#: ``onmt.constants.CorpusTask.INFER`` (not imported: importing onmt from here, before onmt-ext is active,
#: would run the start-up hook on this half-imported module)
_INFER = "infer"

#: key of a batch's CPU tensors ``{"srclen": (batch,), "tgt": (batch, len, 1)}`` (the trainer counts from them)
HOST = "onmt_ext_host"
#: per-example lists of stock batches that become tensors here
_LISTS = ("ind_in_bucket", "cid", "cid_line_number")
#: keys that stock OpenNMT-py keeps on the CPU
_CPU_KEYS = ("src_ex_vocab", *_LISTS, HOST)
#: key of a packed batch: ``(layout, buffer)``, layout ``((key, shape), ...)``, buffer the int64 values in order
PACKED = "onmt_ext_packed"
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


def pack(batch):
    """``{PACKED: (layout, bytes)}`` for a batch of int64 tensors only (others are returned unchanged)."""
    if not batch or not all(torch.is_tensor(v) and v.dtype == torch.int64 for v in batch.values()):
        return batch
    layout = tuple((key, tuple(value.shape)) for key, value in batch.items())
    flat = torch.cat([value.reshape(-1) for value in batch.values()])
    return {PACKED: (layout, flat.numpy().tobytes())}


def unpack(batch):
    """The batch of tensors (CPU views of one writable buffer) that :func:`pack` packed; others unchanged.

    Returns ``(batch, flat, layout)``: ``flat`` is the buffer as one int64 tensor, ``layout`` its layout; both
    None for a batch that was not packed.
    """
    if PACKED not in batch:
        return batch, None, None
    layout, data = batch[PACKED]
    flat = torch.frombuffer(bytearray(data), dtype=torch.int64)
    return _views(flat, layout), flat, layout


def _views(flat, layout, keys=None):
    """Views of ``flat`` by ``layout`` (only ``keys`` when given)."""
    views, offset = {}, 0
    for key, shape in layout:
        size = math.prod(shape)
        if keys is None or key in keys:
            views[key] = flat[offset:offset + size].view(shape)
        offset += size
    return views


def _tensor_batches(stock, self):
    """``DynamicDatasetIter.__iter__``: training and validation batches with tensors only, packed in a data
    worker (the DataLoader then moves one buffer per batch)."""
    if self.task == _INFER:
        yield from stock(self)
        return
    names = list(self.corpora_info)
    in_worker = torch.utils.data.get_worker_info() is not None
    for batch, bucket_index in stock(self):
        batch = tensor_bookkeeping(batch, names)
        yield (pack(batch) if in_worker else batch), bucket_index


def _greedy_batches(self, order, longest, examples):
    """Stock's ``DynamicDatasetIter.batch_iter`` over bucket positions ``order`` (sorted), with each example's
    longer side ``longest[i]`` (stock's ``max_src_tgt``) computed once: the same lists of positions, cut where
    stock cuts them (``batch_size`` tokens or sentences, ``batch_size_multiple``, a training batch's seen-set)."""
    from onmt.utils.logging import logger

    size, multiple, tokens = self.batch_size, self.batch_size_multiple, self.batch_type == "tokens"
    train = self.task == "train"
    minibatch, maxlen, seen = [], 0, set()
    for index in order:
        src = examples[index]["src"]["src"]
        if src in seen and train:
            continue
        seen.add(src)
        minibatch.append(index)
        count = len(minibatch)
        if longest[index] > maxlen:
            maxlen = longest[index]
        so_far = count * maxlen if tokens else count
        if so_far < size:
            continue
        overflowed = 1 if so_far > size else 0
        if multiple > 1:
            overflowed += (count - overflowed) % multiple
        if overflowed == 0:
            yield minibatch
            minibatch, maxlen, seen = [], 0, set()
        elif overflowed == count:
            logger.warning("The batch will be filled until we reach %d, its size may exceed %d tokens"
                           % (multiple, size))
        else:
            yield minibatch[:-overflowed]
            minibatch = minibatch[-overflowed:]
            maxlen, seen = max(longest[i] for i in minibatch), set()
    if minibatch:
        yield minibatch


def _keyed_batches(stock, self):
    """Stock's ``DynamicDatasetIter.__iter__`` with each example's sort key and longer side computed once per
    bucket, where stock calls ``text_sort_key`` (through a lambda) in the bucket's sort and again in each
    batch's, and two nested functions per example in ``batch_iter``.  Positions are sorted instead of examples
    (both sorts are stable: the same order); batches are stock's, in stock's order, shuffled by the same
    ``RandomShuffler``.  A subclass, another sort key or ``batch_iter``, another batch type: stock."""
    from onmt.inputters import dynamic_iterator, text_utils

    stock_class = dynamic_iterator.DynamicDatasetIter
    if (type(self) is not stock_class or self.sort_key is not text_utils.text_sort_key
            or stock_class.batch_iter.__module__ != stock_class.__module__
            or self.batch_type not in ("tokens", "sents") or self.task not in ("train", "valid")):
        yield from stock(self)
        return
    for bucket, bucket_index in self._bucketing():
        keys, longest = [], []
        for example in bucket:
            src, tgt = len(example["src"]["src_ids"]), example["tgt"]
            if tgt:
                tgt = len(tgt["tgt_ids"])
                keys.append((src, tgt))
                longest.append(src if src > tgt else tgt)
            else:
                keys.append(src)
                longest.append(src)
        order = sorted(range(len(bucket)), key=keys.__getitem__)
        batches = list(_greedy_batches(self, order, longest, bucket))
        if self.task == "train":
            batches = self.random_shuffler(batches)
        for positions in batches:
            if self.task == "train":
                positions.sort(key=keys.__getitem__, reverse=True)
            minibatch = [(bucket[index], index) for index in positions]
            yield dynamic_iterator.tensorify(self.vocabs, minibatch, self.device, self.left_pad), bucket_index


#: in a data worker, every this many batches the objects frozen since the last time are released and collected
COLLECT_EVERY = 500


def _collector_paused(stock, self):
    """``DynamicDatasetIter.__iter__`` with the cyclic garbage collector paused while the stock iterator works.

    The collector is paused inside each ``next`` of the stock iterator and restored (if it was on) before the
    batch is handed on, so the consumer (the training loop without workers) runs with it as it was. In a data
    worker, which only builds batches, what exists then is also frozen (``gc.freeze``): the bucket's examples
    outlive many batches, and each collection would scan them again. Reference counting frees them all the same.
    The few objects in reference cycles (``docs/differences-from-stock.md`` counts them) wait for the next
    collection; in a worker every :data:`COLLECT_EVERY` batches they are unfrozen and collected.
    """
    batches, handed = stock(self), 0
    in_worker = torch.utils.data.get_worker_info() is not None
    while True:
        enabled = gc.isenabled()
        gc.disable()
        try:
            item = next(batches)
        except StopIteration:
            return
        finally:
            if enabled:
                if in_worker:
                    gc.freeze()
                gc.enable()
        handed += 1
        if enabled and in_worker and handed % COLLECT_EVERY == 0:
            gc.unfreeze()
            gc.collect()
        yield item


#: OpenNMT-py's separator of a token's features (``this￨A``)
_FEATURE_SEPARATOR = "\uffe8"


def _plain_line(stock, line, n_feats=0, defaults=None):
    """``text_corpus.parse_features`` for a line without features: the line less its newline, as stock returns it.

    Stock splits every token on the feature separator; for a line with no separator, no newline but a final one,
    and no features expected, its result is ``(line without the final newline, None)``. Any other line goes to
    stock, errors included.
    """
    if n_feats == 0 and _FEATURE_SEPARATOR not in line and "\n" not in line[:-1]:
        return (line[:-1] if line.endswith("\n") else line), None
    return stock(line, n_feats, defaults)


def _padded(sequences, pad, device):
    """``(batch, max len)`` int64 of ``sequences`` (lists of ids, or numpy arrays: binarised data), padded on the
    right with ``pad``: one tensor from all the ids at once, where stock makes one per sequence and pads them with
    ``pad_sequence``."""
    lengths = torch.tensor([len(ids) for ids in sequences], dtype=torch.long)
    width = int(lengths.max()) if len(sequences) else 0
    padded = torch.full((len(sequences), width), pad, dtype=torch.long)
    if sequences and isinstance(sequences[0], np.ndarray):
        flat = torch.from_numpy(np.concatenate(sequences).astype(np.int64))
    else:
        flat = torch.tensor(list(chain.from_iterable(sequences)), dtype=torch.long)
    padded[torch.arange(width) < lengths[:, None]] = flat
    return padded.to(device), lengths.to(device)


#: example keys that only stock's ``tensorify`` turns into tensors (features, alignments, the copy mechanism)
_STOCK_ONLY_KEYS = ("src_map", "alignment", "src_ex_vocab")


def _padded_at_once(stock, vocabs, minibatch, device, left_pad=False):
    """``tensorify`` of a batch with right padding, no source features, alignments or copy vocabularies: stock's
    dict, its ``src`` ``(batch, len, 1)`` and ``tgt`` each made from one flat list of ids. Other batches go to
    stock. Like stock, it looks at the first example to tell which keys the batch has."""
    from onmt.constants import DefaultTokens

    first = minibatch[0][0]
    if left_pad or "feats" in first["src"] or first.get("align") is not None \
            or any(key in first for key in _STOCK_ONLY_KEYS):
        return stock(vocabs, minibatch, device, left_pad)
    examples = [example for example, _ in minibatch]
    src, srclen = _padded([example["src"]["src_ids"] for example in examples], vocabs["src"][DefaultTokens.PAD],
                          device)
    batch = {"src": src[:, :, None], "srclen": srclen}
    if first["tgt"] is not None:
        tgt, tgtlen = _padded([example["tgt"]["tgt_ids"] for example in examples],
                              vocabs["tgt"][DefaultTokens.PAD], device)
        batch.update(tgt=tgt[:, :, None], tgtlen=tgtlen)
    batch["ind_in_bucket"] = [index for _, index in minibatch]
    batch["cid"] = [example["cid"] for example in examples]
    batch["cid_line_number"] = [example["cid_line_number"] for example in examples]
    return batch


def to_device(batch, device):
    """Pin and copy a CPU batch's tensors to ``device`` without waiting; keep the CPU counts under :data:`HOST`.

    A packed batch is unpacked, and its buffer pinned and copied as one tensor.
    """
    batch, flat, layout = unpack(batch)
    batch[HOST] = {"srclen": batch.get("srclen"), "tgt": batch.get("tgt")}
    if flat is not None and device.type == "cuda":
        on_device = flat.pin_memory().to(device, non_blocking=True)
        batch.update(_views(on_device, layout, {key for key, _ in layout if key not in _CPU_KEYS}))
        return batch
    for key, value in batch.items():
        if key in _CPU_KEYS or not torch.is_tensor(value):
            continue
        if device.type == "cuda" and not value.is_pinned():
            value = value.pin_memory()
        batch[key] = value.to(device, non_blocking=True)
    return batch


def _device_batches(self):
    """``OnDeviceDatasetIter.__iter__``: batches unpacked, and on CUDA copied without waiting."""
    for batch, bucket_index in self.data_iter:
        yield to_device(batch, self.device), bucket_index


def _cpu_built_iterator(stock, opt, transforms_cls, vocabs, *args, task="train", device_id=-1, **kwargs):
    """``build_dynamic_dataset_iter`` for training/validation on a GPU: batches built on the CPU, then copied."""
    from onmt.inputters.dynamic_iterator import OnDeviceDatasetIter

    if task == _INFER or device_id < 0:
        return stock(opt, transforms_cls, vocabs, *args, task=task, device_id=device_id, **kwargs)
    built = stock(opt, transforms_cls, vocabs, *args, task=task, device_id=-1, **kwargs)
    if built is None:
        return None
    if isinstance(built, OnDeviceDatasetIter):  # data workers: their packed batches are pinned in to_device
        built.device = torch.device("cuda", device_id)
        return built
    return OnDeviceDatasetIter(built, torch.device("cuda", device_id))


def install():
    """Register the seven changes (idempotent)."""
    from onmt import train_single
    from onmt.inputters import dynamic_iterator, text_corpus

    patch(dynamic_iterator.DynamicDatasetIter, "__iter__", _tensor_batches, kind=SPEED,
          test=f"{_TEST}::test_batches_carry_tensors_only_and_the_same_data",
          reason="per-example Python lists in every batch keep the pin-memory thread busy under the GIL while "
                 "the training thread waits")
    patch(dynamic_iterator.DynamicDatasetIter, "__iter__", _collector_paused, kind=SPEED, order=1,
          test=f"{_TEST}::test_the_collector_is_paused_only_while_a_batch_is_built",
          reason="while a data worker fills a bucket, Python's cyclic garbage collector scans the bucket's examples "
                 "again and again, which doubled the worker's time per bucket")
    patch(dynamic_iterator.DynamicDatasetIter, "__iter__", _keyed_batches, kind=SPEED, order=2,
          test=f"{_TEST}::test_keyed_batches_are_stock_batches_in_stock_order",
          reason="stock computes each example's sort key up to three times per bucket, through two Python calls "
                 "each, and its longer side again in batch_iter: about 6% of a data worker's CPU time")
    patch(text_corpus, "parse_features", _plain_line, kind=SPEED,
          test=f"{_TEST}::test_plain_lines_parse_as_stock_parses_them",
          reason="stock splits every token of every training line on the feature separator in Python, also when "
                 "the corpus has no features")
    patch(dynamic_iterator, "tensorify", _padded_at_once, kind=SPEED,
          test=f"{_TEST}::test_batches_carry_tensors_only_and_the_same_data",
          reason="stock makes one tensor per sentence and side and pads them in a second pass, which took most of a "
                 "data worker's time per batch besides the bucket")
    patch(dynamic_iterator.OnDeviceDatasetIter, "__iter__", _device_batches, wrap=False, kind=SPEED,
          test=f"{_TEST}::test_batches_reach_the_device_unchanged",
          reason="a blocking .to(device) of every batch tensor waits for all queued GPU work")
    patch(train_single, "build_dynamic_dataset_iter", _cpu_built_iterator, kind=SPEED, order=1,  # after CPU ranks'
          test=f"{_TEST}::test_training_iterators_build_on_the_cpu",
          reason="without data workers, stock builds each sentence's tensor on the GPU, a blocking copy each")
