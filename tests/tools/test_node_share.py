"""tools/node_share.py: node 0 gives a file to the other nodes of a multi-node ``make reproduce-*``."""

import os
import subprocess

import pytest

import support

from tools import node_share


#: node_share's command line with broadcasts of ``CHUNK`` bytes (the first argument): the file's 3 MB then go in
#: many chunks, the last one short, as a Big checkpoint's 2 GB go in chunks of 256 MB.
COMMAND = ("import sys; from tools import node_share; node_share.CHUNK = int(sys.argv[1]); "
           "sys.exit(node_share.main(sys.argv[2:]))")


def _nodes(tmp_path, name, chunk=65_536):
    """Run node 0 in ``tmp_path/node0`` and node 1 in ``tmp_path/node1`` at once, each asked for ``name``."""
    port, runs = support.free_port(), []
    env = dict(support.cli_env(), PYTHONPATH=str(support.REPO))
    for rank in (0, 1):
        (tmp_path / f"node{rank}").mkdir(exist_ok=True)
        runs.append(subprocess.Popen(
            [str(support.REPO / ".venv/bin/python"), "-c", COMMAND, str(chunk), "--nodes", "2", "--node-rank",
             str(rank), "--master-ip", "127.0.0.1", "--master-port", str(port), "--timeout", "60", name],
            cwd=tmp_path / f"node{rank}", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    return [(run.wait(timeout=120), *run.communicate()) for run in runs]


def test_node_1_receives_node_0s_file_byte_for_byte(tmp_path):
    data = os.urandom(3_000_001)
    (tmp_path / "node0" / "runs").mkdir(parents=True)
    (tmp_path / "node0" / "runs" / "model_step_10.pt").write_bytes(data)
    (code0, out0, err0), (code1, out1, err1) = _nodes(tmp_path, "runs/model_step_10.pt")
    assert (code0, code1) == (0, 0), err0 + err1
    assert out0.strip() == "node_share.py: gave runs/model_step_10.pt (3,000,001 bytes) to 1 node(s)"
    assert out1.startswith("node_share.py: received runs/model_step_10.pt (3,000,001 bytes, sha256 ")
    assert (tmp_path / "node1" / "runs" / "model_step_10.pt").read_bytes() == data
    assert sorted(path.name for path in (tmp_path / "node1" / "runs").iterdir()) == ["model_step_10.pt"]


def test_a_node_0_without_the_file_stops_every_node_in_one_line(tmp_path):
    (code0, _, err0), (code1, _, err1) = _nodes(tmp_path, "runs/missing.pt")
    assert (code0, code1) == (1, 1)
    assert err0.strip() == "node_share.py: node 0 has no runs/missing.pt to give"
    assert err1.strip() == "node_share.py: node 0 has no runs/missing.pt to give; see node 0's messages"
    assert not (tmp_path / "node1" / "runs").exists()


@pytest.mark.parametrize("argv, message", [
    (["f", "--nodes", "1", "--node-rank", "0", "--master-ip", "h", "--master-port", "1"], "--nodes"),
    (["f", "--nodes", "2", "--node-rank", "2", "--master-ip", "h", "--master-port", "1"],
     "--node-rank 2: must be below --nodes 2"),
])
def test_options_that_do_not_fit_are_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        node_share.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
