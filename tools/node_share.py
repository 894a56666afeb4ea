"""Give a file that node 0 holds to the other nodes of a multi-node ``make reproduce-*``, over the network the
training uses.

A table's row can read a file another row wrote, where only node 0 has it: GRET's rows fine-tune from the
baseline's checkpoint (``-train_from``), which OpenNMT-py saves on global rank 0 alone, and the clause tables'
"study" rows split their corpora with a tagger, which both nodes must share.  Every node runs::

    python -m tools.node_share --nodes N --node-rank R --master-ip IP --master-port PORT FILE

at the same point of its plan.  They meet in a gloo group of one process per node at ``IP:PORT`` (the address and
port the trainings use, free between two of them); node 0 sends the file's bytes and its sha256, every other node
checks the digest and only then puts the file in place (written beside it, then renamed).  A node 0 without the
file says so in one line, and so do the others, instead of waiting.  docs/scale-out.md.
"""

import datetime
import hashlib
import os
import sys
from pathlib import Path

import numpy

from tools import common

#: Bytes per broadcast: a checkpoint of a Big model (about 2 GB with Adam's moments) goes in a few.
CHUNK = 1 << 28


def _broadcast_bytes(data, dist, torch):
    """Node 0's ``data`` (bytes; elsewhere None) on every node: its length, then its bytes in chunks of CHUNK (node
    0 gets its own ``data`` back, not a copy)."""
    size = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64)
    dist.broadcast(size, 0)
    buffer = torch.empty(int(size), dtype=torch.uint8)
    if data is not None:
        buffer.numpy()[:] = numpy.frombuffer(data, dtype=numpy.uint8)
    for start in range(0, int(size), CHUNK):
        dist.broadcast(buffer[start:start + CHUNK], 0)
    return data if data is not None else buffer.numpy().tobytes()


def share(path, nodes, rank, ip, port, timeout):
    """Node 0 sends ``path``; node ``rank`` > 0 receives it into ``path``.  Returns a line saying what was done;
    SystemExit with one line when node 0 lacks the file or a received copy's digest differs."""
    import torch
    import torch.distributed as dist

    path = Path(path)
    data = path.read_bytes() if rank == 0 and path.is_file() else None
    dist.init_process_group("gloo", init_method=f"tcp://{ip}:{port}", world_size=nodes, rank=rank,
                            timeout=datetime.timedelta(seconds=timeout))
    try:
        found = torch.tensor([int(data is not None)], dtype=torch.int64)
        dist.broadcast(found, 0)  # a node 0 without the file stops every node at once
        if not int(found):
            raise SystemExit(f"node_share.py: node 0 has no {path} to give" + (
                "" if rank == 0 else "; see node 0's messages"))
        digest = _broadcast_bytes(hashlib.sha256(data).digest() if data is not None else None, dist, torch)
        received = _broadcast_bytes(data, dist, torch)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        return f"node_share.py: gave {path} ({len(received):,} bytes) to {nodes - 1} node(s)"
    if hashlib.sha256(received).digest() != digest:
        raise SystemExit(f"node_share.py: the copy of {path} from node 0 does not have its sha256; nothing written")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.node{rank}.part")
    partial.write_bytes(received)
    os.replace(partial, path)
    return f"node_share.py: received {path} ({len(received):,} bytes, sha256 {digest.hex()[:16]}...) from node 0"


def main(argv=None):
    parser = common.Parser(prog="node_share.py", description=__doc__.split("\n")[0])
    parser.add_argument("file", type=Path, help="the file node 0 gives (the same path on every node)")
    parser.add_argument("--nodes", type=common.at_least(2), required=True, help="how many nodes meet")
    parser.add_argument("--node-rank", type=common.at_least(0), required=True, help="this node's rank, 0 gives")
    parser.add_argument("--master-ip", required=True, help="node 0's address")
    parser.add_argument("--master-port", type=common.at_least(1), required=True, help="a free port on node 0")
    parser.add_argument("--timeout", type=common.at_least(1), default=1800,
                        help="seconds to wait for the other nodes (default 1800)")
    args = parser.parse_args(argv)
    if args.node_rank >= args.nodes:
        parser.error(f"--node-rank {args.node_rank}: must be below --nodes {args.nodes}")
    print(share(args.file, args.nodes, args.node_rank, args.master_ip, args.master_port, args.timeout))
    return 0


if __name__ == "__main__":
    sys.exit(main())
