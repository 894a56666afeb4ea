"""An error inside a rank of ``onmt_translate -world_size N``: the run ends in ``onmt_translate: error: rank R: ...``.

Stock's ``spawned_infer`` needs CUDA (``torch.cuda.set_device``, and onmt-ext refuses ``-gpu_ranks`` on a torch
without it), so these tests fake it: the unit tests run a rank's target in this process with the rendezvous, the
device and the translator faked; the slow test runs ``onmt_translate``'s ``main`` with two spawned ranks whose only
fake is ``torch.cuda.set_device``.
"""

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from argparse import Namespace

import pytest
import torch

import support

pytestmark = pytest.mark.usefixtures("onmt_active")


def _raise(error):
    def raising(*args, **kwargs):
        raise error

    return raising


def _run_rank(monkeypatch, error, device_id=1, where="build_translator"):
    """What the rank ``device_id`` of two hands the parent through the error queue when ``error`` is raised in
    ``where`` (a name that stock's ``spawned_infer`` calls), with the target that ``InferenceEnginePY`` spawns."""
    import onmt.inference_engine
    import onmt.utils.distributed

    monkeypatch.setattr(onmt.utils.distributed, "multi_init", lambda opt, device_id: opt.gpu_ranks[device_id])
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)  # (no CUDA here)
    monkeypatch.setattr(onmt.utils.distributed, "init_logger", lambda *args, **kwargs: None)
    monkeypatch.setattr(onmt.utils.distributed, where, _raise(error))
    told = []
    queue = type("Queue", (), {"put": lambda self, item: told.append(item)})()
    handler = signal.getsignal(signal.SIGINT)
    try:
        result = onmt.inference_engine.spawned_infer(Namespace(gpu_ranks=[0, 1], log_file=""), device_id, queue,
                                                     None, None)
    finally:
        signal.signal(signal.SIGINT, handler)
    assert result is None
    return told


def _parent_ends(told, capsys, ranks=()):
    """How ``onmt_translate`` ends when stock's ErrorHandler, whose ranks are the process ids ``ranks``, hears of
    the first error in ``told`` (what the ranks put on its queue): its signal handler sends the ranks Ctrl-C and
    raises in the parent."""
    from onmt.utils.distributed import ErrorHandler

    from onmt_ext.integration import commands

    handler = ErrorHandler.__new__(ErrorHandler)  # (no listener thread, no SIGUSR1 handler in the test process)
    handler.children_pids, handler.error_queue = list(ranks), type("Queue", (), {"get": lambda self: told[0]})()

    def translate(opt):
        handler.signal_handler(signal.SIGUSR1, None)

    translate.__module__ = "onmt.bin.translate"
    with pytest.raises(SystemExit) as stopped:
        commands._run_command(translate, Namespace())
    return stopped.value.code, capsys.readouterr().err


def _sequence_too_long():
    from onmt.modules.embeddings import SequenceTooLongError

    return SequenceTooLongError("Sequence is 6000 but PositionalEncoding is limited to 5000.")


def _not_a_checkpoint():
    from onmt_ext.errors import user_error

    return user_error("x.pt is not an OpenNMT-py checkpoint (no model and options in it)", ValueError)


def _usage_error():
    from onmt_ext.errors import UsageError

    return UsageError("-src x: first line\nsecond line")


@pytest.mark.parametrize("error, status, lines", [
    (_usage_error, 2, ["rank 1: -src x: first line", "rank 1: second line"]),  # a SystemExit: stock hung
    (_sequence_too_long, 1, ["rank 1: Sequence is 6000 but PositionalEncoding is limited to 5000."]),
    (_not_a_checkpoint, 1, ["rank 1: x.pt is not an OpenNMT-py checkpoint (no model and options in it)"]),
], ids=["user-error", "known-error", "user-error-of-stocks-type"])
def test_a_translation_ranks_one_line_error_reaches_the_parent_and_fails_the_run(monkeypatch, capsys, error, status,
                                                                                 lines):
    """A UserError is a SystemExit, which stock's spawned_infer lets through: the rank printed it and the parent
    waited for its translation for ever. A known error that is an Exception (and a UserError that is also stock's
    type) stock handed the parent as a traceback. Each now reaches the parent as its line, with the rank, and
    ``onmt_translate`` ends in it with the error's status."""
    told = _run_rank(monkeypatch, error())
    assert [rank for rank, _ in told] == [1]
    assert _parent_ends(told, capsys) == (status, "".join(f"onmt_translate: error: {line}\n" for line in lines))


def test_a_translation_ranks_rendezvous_error_and_bug(monkeypatch, capsys):
    """A UserError before the translator (the rendezvous, onmt_ext.runtime.distributed) ends in one line too; a bug
    keeps stock's traceback."""
    from onmt_ext.errors import UserError
    from onmt_ext.integration import commands

    told = _run_rank(monkeypatch, UserError("-world_size 2: the ranks did not all meet"), 0, where="multi_init")
    assert _parent_ends(told, capsys) == (1, "onmt_translate: error: rank 0: -world_size 2: the ranks did not all "
                                             "meet\n")
    told = _run_rank(monkeypatch, RuntimeError("a bug"))
    assert told[0][0] == 1 and "Traceback" in told[0][1] and "RuntimeError: a bug" in told[0][1]
    assert commands._rank_error(Exception(told[0][1])) is None


def _deaf_rank(ready):
    """A rank that missed its Ctrl-C: it ignores SIGINT, says so (``ready``, an Event) and waits."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ready.set()
    time.sleep(120)


def test_a_rank_that_misses_its_ctrl_c_is_terminated(monkeypatch, capsys):
    """Stock's parent sends each rank Ctrl-C when one fails, then waits for every rank at exit: a rank that missed
    it kept the run from ending. The parent ends in the failed rank's line, and terminates such a rank (one of
    stock's ErrorHandler's ranks: another child process of the parent is left alone)."""
    from onmt_ext.integration import commands

    monkeypatch.setattr(commands, "_RANKS_GRACE", 0.5)
    fork = multiprocessing.get_context("fork")
    ready = [fork.Event(), fork.Event()]
    deaf, bystander = (fork.Process(target=_deaf_rank, args=(event,)) for event in ready)
    deaf.start()
    bystander.start()
    try:
        assert all(event.wait(60) for event in ready)  # (their SIGINT ignored)
        told = [(1, commands._RANK_ERROR + " 1\nrank 1: a rank's error")]
        assert _parent_ends(told, capsys, ranks=[deaf.pid]) == (1, "onmt_translate: error: rank 1: a rank's error\n")
        assert not deaf.is_alive() and deaf.exitcode == -signal.SIGTERM
        assert bystander.is_alive()
    finally:
        for child in (deaf, bystander):
            if child.is_alive():
                child.kill()
            child.join()


def fake_cuda_rank(opt, device_id, error_queue, queue_instruct, queue_result):
    """A translation rank without CUDA (the slow test's): the target onmt-ext gives ``InferenceEnginePY`` (as this
    spawned process has it), with a ``torch.cuda.set_device`` that raises a UserError on device 1; device 0 waits
    there, as a slow rank would, until the parent stops it."""
    import onmt.inference_engine

    from onmt_ext.errors import UserError

    def set_device(device):
        if device == 1:
            raise UserError("-src x: a rank's one-line error")
        time.sleep(300)

    torch.cuda.set_device = set_device
    onmt.inference_engine.spawned_infer(opt, device_id, error_queue, queue_instruct, queue_result)


#: the slow test's ``onmt_translate``: its ``main``, with CUDA faked (the parent's check, each rank's device)
_TRANSLATE = """
import sys
import onmt.bin.translate
import onmt.inference_engine
import test_translation_ranks
from onmt_ext.integration import commands

commands.cuda_problems = lambda opt, cpu_ranks=False: []
onmt.inference_engine.spawned_infer = test_translation_ranks.fake_cuda_rank
sys.argv[0] = "onmt_translate"
onmt.bin.translate.main()
"""


@pytest.mark.slow  # two ranks start
def test_onmt_translate_ends_in_a_ranks_one_line_error(tmp_path):
    """``onmt_translate -world_size 2 -gpu_ranks 0 1`` whose rank 1 fails with a UserError: stock's parent waited
    for that rank's translation for ever; the run now ends in the rank's line, exit 1, and rank 0 is stopped."""
    (tmp_path / "src.txt").write_text("hello world\n", encoding="utf-8")
    (tmp_path / "model.pt").write_bytes(b"")
    env = support.cli_env(PYTHONPATH=os.pathsep.join([str(support.REPO / "tests" / "unit"),
                                                      str(support.REPO / "tests")]))
    result = subprocess.run(
        [sys.executable, "-c", _TRANSLATE, "-model", tmp_path / "model.pt", "-src", tmp_path / "src.txt", "-output",
         tmp_path / "hyp.txt", "-world_size", "2", "-gpu_ranks", "0", "1", "-master_port", str(support.free_port())],
        cwd=support.REPO, capture_output=True, text=True, timeout=240, env=env)
    assert support.one_error_line(result, "onmt_translate", 1) == (
        "onmt_translate: error: rank 1: -src x: a rank's one-line error")
