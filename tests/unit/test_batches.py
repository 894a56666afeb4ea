"""Training batches with tensors only (onmt_ext.runtime.batches): the same data, in the same order, as stock."""

import itertools

import pytest
import torch

import support

pytestmark = pytest.mark.usefixtures("onmt_active", "sample_data")

CONFIG = "yaml_configs/demo/tatoeba_zhen.yaml"
BATCHES = 12


def training_opts(*overrides):
    """The demo config's options, validated as onmt_train does (corpus paths read from the repository root)."""
    from onmt.utils.parse import ArgumentParser

    opt = support.load_train_opts(CONFIG, "-num_workers", 0, "-bucket_size", 512, *overrides)
    ArgumentParser.validate_train_opts(opt)
    return opt


def first_batches(opt, stock, monkeypatch, count=BATCHES):
    """The first ``count`` training batches of ``opt`` with the stock or onmt-ext's ``DynamicDatasetIter``."""
    from onmt import train_single
    from onmt.constants import CorpusTask
    from onmt.inputters import dynamic_iterator, text_corpus
    from onmt.utils.misc import set_random_seed

    from onmt_ext import patches

    with monkeypatch.context() as patched:
        if stock:
            patched.setattr(dynamic_iterator.DynamicDatasetIter, "__iter__",
                            patches.original(dynamic_iterator.DynamicDatasetIter, "__iter__"))
            patched.setattr(text_corpus, "parse_features", patches.original(text_corpus, "parse_features"))
            patched.setattr(dynamic_iterator, "tensorify", patches.original(dynamic_iterator, "tensorify"))
        set_random_seed(opt.seed, False)
        _, vocabs, transforms_cls = train_single._init_train(opt)
        data = dynamic_iterator.build_dynamic_dataset_iter(opt, transforms_cls, vocabs, task=CorpusTask.TRAIN)
        return [batch for batch, _ in itertools.islice(data, count)], list(opt.data)


def test_batches_carry_tensors_only_and_the_same_data(monkeypatch):
    monkeypatch.chdir(support.REPO)
    stock, _ = first_batches(training_opts(), True, monkeypatch)
    ours, corpora = first_batches(training_opts(), False, monkeypatch)
    assert len(ours) == len(stock) == BATCHES
    for number, (mine, theirs) in enumerate(zip(ours, stock)):
        assert set(mine) == set(theirs), number
        assert all(torch.is_tensor(value) for value in mine.values()), (number, mine.keys())
        assert isinstance(theirs["cid"], list)  # (stock: per-example Python lists)
        for key in ("src", "tgt", "srclen", "tgtlen"):
            assert torch.equal(mine[key], theirs[key]), (number, key)
        assert mine["ind_in_bucket"].tolist() == theirs["ind_in_bucket"]
        assert mine["cid_line_number"].tolist() == theirs["cid_line_number"]
        assert [corpora[i] for i in mine["cid"].tolist()] == theirs["cid"]


def test_translation_batches_stay_stock():
    from onmt_ext.runtime.batches import tensor_bookkeeping

    batch = {"src_ex_vocab": [object()], "cid": ["corpus_1"], "ind_in_bucket": [0], "cid_line_number": [4]}
    assert tensor_bookkeeping(dict(batch), ["corpus_1"]) == batch  # the copy mechanism's vocabularies stay


def test_batches_reach_the_device_unchanged():
    from onmt_ext.runtime.batches import HOST, to_device

    src, tgt = torch.randint(0, 50, (3, 7, 1)), torch.randint(0, 50, (3, 5, 1))
    batch = {"src": src, "tgt": tgt, "srclen": torch.tensor([7, 4, 2]), "cid": torch.tensor([0, 0, 1])}
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    moved = to_device(dict(batch), device)
    assert moved[HOST]["tgt"] is tgt and moved[HOST]["srclen"] is batch["srclen"]
    assert moved["src"].device.type == device.type and moved["cid"].device.type == "cpu"
    assert torch.equal(moved["src"].cpu(), src) and torch.equal(moved["tgt"].cpu(), tgt)


def test_a_packed_batch_crosses_as_one_buffer_and_comes_back_equal():
    from onmt_ext.runtime.batches import HOST, PACKED, pack, to_device

    batch = {"src": torch.randint(0, 50, (3, 7, 1)), "srclen": torch.tensor([7, 4, 2]),
             "tgt": torch.randint(0, 50, (3, 5, 1)), "cid": torch.tensor([0, 0, 1])}
    packed = pack(dict(batch))
    [(layout, buffer)] = packed.values()
    assert list(packed) == [PACKED] and isinstance(buffer, bytes) and len(buffer) == 8 * (21 + 3 + 15 + 3)
    assert [key for key, _ in layout] == list(batch)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    back = to_device(packed, device)
    assert set(back) == set(batch) | {HOST}
    for key, value in batch.items():
        assert torch.equal(back[key].cpu(), value), key
    assert back["cid"].device.type == "cpu" and back["src"].device.type == device.type
    assert torch.equal(back[HOST]["tgt"], batch["tgt"])
    back["tgt"][0, 0, 0] = 49  # writable (OpenNMT-py's ignore_prompt writes into the batch)
    with_lists = {"src": batch["src"], "src_ex_vocab": [object()]}
    assert pack(with_lists) is with_lists  # the copy mechanism's batches travel as they are


def test_training_iterators_build_on_the_cpu(monkeypatch):
    from onmt import train_single
    from onmt.constants import CorpusTask
    from onmt.inputters.dynamic_iterator import DynamicDatasetIter, OnDeviceDatasetIter

    monkeypatch.chdir(support.REPO)
    opt = training_opts()
    _, vocabs, transforms_cls = train_single._init_train(opt)
    built = train_single.build_dynamic_dataset_iter(opt, transforms_cls, vocabs, task=CorpusTask.TRAIN,
                                                    device_id=0)
    assert isinstance(built, OnDeviceDatasetIter) and built.device == torch.device("cuda", 0)
    assert isinstance(built.data_iter, DynamicDatasetIter) and built.data_iter.device == torch.device("cpu")
    on_cpu = train_single.build_dynamic_dataset_iter(opt, transforms_cls, vocabs, task=CorpusTask.TRAIN)
    assert isinstance(on_cpu, DynamicDatasetIter)  # stock's own iterator off the GPU


def test_the_collector_is_paused_only_while_a_batch_is_built(monkeypatch):
    import gc

    from onmt.inputters import dynamic_iterator

    from onmt_ext.runtime import batches

    monkeypatch.chdir(support.REPO)
    seen, bucketing = [], dynamic_iterator.DynamicDatasetIter._bucketing

    def recorded(self):
        for bucket in bucketing(self):
            seen.append(gc.isenabled())  # while the stock iterator fills a bucket
            yield bucket

    monkeypatch.setattr(dynamic_iterator.DynamicDatasetIter, "_bucketing", recorded)
    assert gc.isenabled()
    ours, _ = first_batches(training_opts(), False, monkeypatch, count=3)
    assert len(ours) == 3 and seen and not any(seen)
    assert gc.isenabled()  # where the consumer (the training loop without workers) runs

    def stock(self):
        yield from ((number, 0) for number in range(3))

    gc.disable()  # a collector that the caller turned off stays off
    try:
        assert [number for number, _ in batches._collector_paused(stock, None)] == [0, 1, 2]
        assert not gc.isenabled()
    finally:
        gc.enable()
    assert gc.get_freeze_count() == 0  # the training process freezes nothing

    # a data worker freezes what the stock iterator made, and every COLLECT_EVERY batches releases and collects it
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())
    monkeypatch.setattr(batches, "COLLECT_EVERY", 2)
    frozen = []
    try:
        for _ in batches._collector_paused(stock, None):
            frozen.append(gc.get_freeze_count())
    finally:
        gc.unfreeze()
    assert frozen[0] > 0 and frozen[1] == 0 and frozen[2] > 0 and gc.isenabled()


@pytest.mark.parametrize("line", ["a b c\n", "a b c", "", "\n", " \n", "a  b \n", "a\tb\r\n", "a\u2028b\n",
                                  "x\n\n", "a\nb\n", "a￨b c￨d\n", "a￨b\n", " lead and trail \n"])
@pytest.mark.parametrize("n_feats, defaults", [(0, None), (0, "X"), (1, None), (1, "X")])
def test_plain_lines_parse_as_stock_parses_them(line, n_feats, defaults):
    from onmt.inputters import text_utils

    from onmt_ext.runtime import batches

    def outcome(parse):
        try:
            return parse(line, n_feats, defaults)
        except AssertionError as error:  # stock's check of the feature count
            return type(error)

    assert outcome(lambda *a: batches._plain_line(text_utils.parse_features, *a)) == outcome(
        text_utils.parse_features)


def _minibatch(rng, size, with_tgt=True, **extra):
    """``size`` numericalised examples as stock's iterator hands them to ``tensorify``, with their bucket indices."""
    def ids():
        return [rng.randrange(4, 60) for _ in range(rng.choice([0, 1, 2, 5, 9, 17]))]

    return [({"src": {"src": "", "src_ids": ids()}, "tgt": {"tgt": "", "tgt_ids": ids()} if with_tgt else None,
              "cid": rng.choice(["corpus_1", "corpus_2"]), "cid_line_number": rng.randrange(1000), **extra},
             rng.randrange(5000)) for _ in range(size)]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("with_tgt", [True, False])
def test_a_batch_is_padded_at_once_as_stock_pads_it(seed, with_tgt):
    import random

    from onmt.inputters import text_utils

    from onmt_ext.runtime import batches

    rng = random.Random(seed)
    vocabs = {"src": {"<blank>": 1}, "tgt": {"<blank>": 3}}
    for size in (1, 2, 7, 40):
        minibatch = _minibatch(rng, size, with_tgt)
        theirs = text_utils.tensorify(vocabs, minibatch, torch.device("cpu"))
        mine = batches._padded_at_once(text_utils.tensorify, vocabs, minibatch, torch.device("cpu"))
        assert list(mine) == list(theirs)
        for key, value in theirs.items():
            if torch.is_tensor(value):
                assert mine[key].dtype == value.dtype and torch.equal(mine[key], value), (size, key)
            else:
                assert mine[key] == value, (size, key)


@pytest.mark.parametrize("extra, left_pad", [({}, True), ({"align": "0-0"}, False), ({"src_map": [0]}, False),
                                             ({"alignment": [0]}, False), ({"src_ex_vocab": None}, False)])
def test_batches_with_more_than_ids_go_to_stock(extra, left_pad):
    import random

    from onmt_ext.runtime import batches

    minibatch, calls = _minibatch(random.Random(0), 3, **extra), []
    batches._padded_at_once(lambda *args: calls.append(args), {}, minibatch, torch.device("cpu"), left_pad)
    assert len(calls) == 1 and calls[0][1] is minibatch


def _bucket(rng, size, with_tgt):
    """``size`` numericalised examples as ``_bucketing`` yields them: few distinct lengths (many equal sort keys)
    and sources drawn from a small pool (repeated sources, which a training batch takes once)."""
    def ids():
        return [7] * rng.choice([1, 2, 3, 3, 5, 8, 13, 30])

    return [{"src": {"src": f"line {rng.randrange(size)}", "src_ids": ids()},
             "tgt": {"tgt": "", "tgt_ids": ids()} if with_tgt else None} for _ in range(size)]


@pytest.mark.parametrize("task", ["train", "valid"])
@pytest.mark.parametrize("batch_type, batch_size", [("tokens", 64), ("tokens", 10), ("sents", 7)])
@pytest.mark.parametrize("multiple", [1, 3, 8])
@pytest.mark.parametrize("with_tgt", [True, False])
def test_keyed_batches_are_stock_batches_in_stock_order(monkeypatch, task, batch_type, batch_size, multiple,
                                                        with_tgt):
    import random

    from onmt.inputters import dynamic_iterator

    from onmt_ext import patches
    from onmt_ext.runtime import batches

    rng = random.Random(f"{task}{batch_type}{batch_size}{multiple}{with_tgt}")
    buckets = [(_bucket(rng, size, with_tgt), number) for number, size in enumerate((1, 40, 300, 97))]
    monkeypatch.setattr(dynamic_iterator, "tensorify", lambda vocabs, minibatch, device, left_pad: [
        (id(example), index) for example, index in minibatch])
    stock = patches.original(dynamic_iterator.DynamicDatasetIter, "__iter__")

    def run(iterate):
        random.seed(5)  # the iterator's RandomShuffler starts from the global state, as in training
        data = dynamic_iterator.DynamicDatasetIter({}, {}, {}, {"data_task": "seq2seq"}, task, batch_type,
                                                   batch_size, multiple)
        data._bucketing = lambda: iter(buckets)
        return list(iterate(data))

    theirs = run(stock)
    assert len(theirs) > len(buckets) and any(len(batch) > 1 for batch, _ in theirs)
    assert run(lambda data: batches._keyed_batches(stock, data)) == theirs
