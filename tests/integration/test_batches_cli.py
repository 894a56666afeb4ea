"""With data workers, onmt-ext's training batches hold what stock OpenNMT-py's hold, in the same order.

Each side runs in its own process (stock with ``ONMT_EXT_DISABLE=1``, since the spawned workers load
onmt-ext through the start-up hook too) and saves its first batches.
"""

import sys

import pytest
import torch

import support

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("sample_data")]

SCRIPT = '''
import itertools, sys

import torch
from onmt import train_single
from onmt.bin.train import _get_parser
from onmt.constants import CorpusTask
from onmt.inputters.dynamic_iterator import build_dynamic_dataset_iter
from onmt.utils.misc import set_random_seed
from onmt.utils.parse import ArgumentParser

if __name__ == "__main__":
    opt, _ = _get_parser().parse_known_args(["-config", sys.argv[1], "-num_workers", "2", "-bucket_size", "512"])
    ArgumentParser.validate_train_opts(opt)
    set_random_seed(opt.seed, False)
    _, vocabs, transforms_cls = train_single._init_train(opt)
    data = build_dynamic_dataset_iter(opt, transforms_cls, vocabs, task=CorpusTask.TRAIN)
    batches = [(bucket, batch) for batch, bucket in itertools.islice(data, int(sys.argv[3]))]
    crossing, _ = next(iter(data.data_iter))  # a batch as it comes out of a worker
    torch.save({"batches": batches, "crossing": crossing}, sys.argv[2])
'''


def _batches(tmp_path, name, **env):
    import subprocess

    script, out = tmp_path / "dump_batches.py", tmp_path / f"{name}.pt"
    script.write_text(SCRIPT, encoding="utf-8")
    subprocess.run([sys.executable, str(script), "yaml_configs/demo/tatoeba_zhen.yaml", str(out), "16"],
                   cwd=support.REPO, env=support.cli_env(**env), check=True, capture_output=True, timeout=600)
    return torch.load(out, weights_only=False)


def test_worker_batches_equal_stock(tmp_path):
    from onmt_ext.runtime.batches import HOST, PACKED

    stock_run, our_run = _batches(tmp_path, "stock", ONMT_EXT_DISABLE="1"), _batches(tmp_path, "ours")
    stock, ours = stock_run["batches"], our_run["batches"]
    assert isinstance(stock_run["crossing"]["cid"], list)  # stock: per-example lists cross the boundary
    [(layout, buffer)] = our_run["crossing"].values()  # here: one buffer and its layout
    assert list(our_run["crossing"]) == [PACKED] and isinstance(buffer, bytes)
    assert len(ours) == len(stock) == 16
    for number, ((bucket, mine), (stock_bucket, theirs)) in enumerate(zip(ours, stock)):
        assert bucket == stock_bucket, number
        assert all(torch.is_tensor(v) for key, v in mine.items() if key != HOST), number
        for key in ("src", "tgt", "srclen", "tgtlen", "ind_in_bucket", "cid_line_number"):
            assert torch.equal(torch.as_tensor(mine[key]), torch.as_tensor(theirs[key])), (number, key)
