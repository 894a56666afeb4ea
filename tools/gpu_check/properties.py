"""Section a of the GPU check: the decoding-property suite in pytest processes, fp32, fp16 and bf16 at once, and
their counts from pytest's JUnit XML."""

import os
import shlex
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree

from tools.gpu_check.cases import (
    KERNEL_TEST, KERNEL_TEST_WORKERS, PROPERTY_CONFIGS, PROPERTY_DTYPES, PROPERTY_TEST, REPO, TINY_PROPERTY_CONFIGS,
    TINY_PROPERTY_DTYPES,
)
from tools.gpu_check.plan import monotonic_now

#: seconds a pytest process stopped by the budget gets to write its JUnit report of the tests it finished (it is
#: interrupted as by Ctrl-C first, then killed)
STOP_GRACE_S = 10
#: ``python -m pytest`` that takes Ctrl-C (SIGINT) as pytest does even where its parent ignores it (a disposition
#: that a child inherits, and then Python installs no handler: as for a job that bash starts in the background)
INTERRUPTIBLE_PYTEST = ("import signal, sys, pytest; signal.signal(signal.SIGINT, signal.default_int_handler); "
                        "sys.exit(pytest.main(sys.argv[1:]))")


def pytest_command(arguments):
    """The command of a pytest process that :func:`finish_section_a` can interrupt: ``python -m pytest
    arguments`` (:data:`INTERRUPTIBLE_PYTEST`)."""
    return [sys.executable, "-c", INTERRUPTIBLE_PYTEST, *arguments]


def junit_counts(path):
    """``{passed, failed, errors, skipped, tests, failures: [test ids]}`` from a pytest JUnit XML file.  An
    interrupted run's report ends in a nameless test case (the one that was running): it is not counted."""
    root = ElementTree.parse(path).getroot()
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "failures": []}
    for case in root.iter("testcase"):
        if not case.get("name"):
            continue
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None:
            counts["failed"] += 1
            counts["failures"].append(name)
        elif case.find("error") is not None:
            counts["errors"] += 1
            counts["failures"].append(name)
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    counts["tests"] = counts["passed"] + counts["failed"] + counts["errors"] + counts["skipped"]
    return counts


#: the suite's variable that shares its console-script checks (5-6) among processes (tests/support.py)
CONSOLE_SHARD_VARIABLE = "ONMT_EXT_TEST_CONSOLE_SHARD"


def property_processes(args):
    """Section a's pytest processes: ``(dtype, share, pytest's selection, extra environment, file stem)`` each.

    The in-process checks (1-4) of every dtype run in one process each; on CUDA one more process runs the fused
    routing kernels' tests (:data:`KERNEL_TEST`) on the GPU.  The console-script checks (5-6) run
    in fp32 only (the suite skips them under autocast); each trains a model through ``onmt_train`` and translates
    through ``onmt_translate``, the slowest checks of the suite (docs/gpu-check.md, section a), so
    ``--console-shards`` processes share them (none: they are left out, as in the dry run).
    """
    dtypes = TINY_PROPERTY_DTYPES if args.tiny else PROPERTY_DTYPES
    shards = args.console_shards
    processes = []
    for dtype in dtypes:
        stem = f"properties-{dtype}"
        if shards and dtype != "none":  # the whole suite: its console-script checks skip themselves
            processes.append((dtype, "", [PROPERTY_TEST], {}, stem))
            continue
        processes.append((dtype, "checks 1-4", [PROPERTY_TEST, "-m", "not slow"], {}, stem))
        if shards:
            processes += [(dtype, f"checks 5-6, share {k + 1} of {shards}", [PROPERTY_TEST, "-m", "slow"],
                           {CONSOLE_SHARD_VARIABLE: f"{k}/{shards}"}, f"{stem}-console-{k + 1}-of-{shards}")
                          for k in range(shards)]
    if args.device == "cuda":
        processes.append(("none", "the fused routing kernels", [KERNEL_TEST, "-n", str(KERNEL_TEST_WORKERS)], {},
                          "routing-kernels"))
    return processes


def start_section_a(args, work):
    """Starts section a's pytest processes (:func:`property_processes`), all at once on the one device, each with
    an even share of the CPU threads; returns what :func:`finish_section_a` needs."""
    result = {"title": "decoding properties", "runs": []}
    configs = TINY_PROPERTY_CONFIGS if args.tiny else PROPERTY_CONFIGS
    processes = property_processes(args)
    threads = max(1, (os.cpu_count() or 1) // len(processes))
    started = []
    for dtype, share, selection, extra, stem in processes:
        env = dict(os.environ, ONMT_EXT_TEST_DEVICE=args.device, ONMT_EXT_TEST_AUTOCAST=dtype,
                   ONMT_EXT_TEST_CONFIGS=",".join(configs), OMP_NUM_THREADS=str(threads),
                   MKL_NUM_THREADS=str(threads), **extra)
        xml, log = work / f"{stem}.xml", work / f"{stem}.log"
        command = pytest_command(["-q", "-p", "no:cacheprovider", *selection, f"--junitxml={xml}"])
        shown = " ".join([f"{name}={value}" for name, value in extra.items()]
                         + [f"ONMT_EXT_TEST_DEVICE={args.device} ONMT_EXT_TEST_AUTOCAST={dtype} "
                            f"ONMT_EXT_TEST_CONFIGS={','.join(configs)} OMP_NUM_THREADS={threads} python -m pytest "
                            f"-q {shlex.join(selection)}".rstrip()])
        run = {"dtype": "fp32" if dtype == "none" else dtype, "share": share, "configs": list(configs),
               "command": shown, "log": str(log)}
        xml.unlink(missing_ok=True)
        with open(log, "w", encoding="utf-8") as out:
            child = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        started.append((run, child, xml, monotonic_now()))
        result["runs"].append(run)
    print(f"== gpu-check a: properties, {len(processes)} processes at once ({threads} threads each)", flush=True)
    return result, started


#: pytest's exit status when its selection holds no test (a console share with no representative left)
NO_TESTS = 5


def _finished_run(run, code, xml, seconds):
    """Fills ``run`` from its process's exit status ``code`` and JUnit report ``xml``."""
    run["seconds"] = round(seconds, 1)
    if code == NO_TESTS and (not xml.exists() or junit_counts(xml)["tests"] == 0):
        run.update(status="empty", reason="no test in this share", passed=0, failed=0, errors=0, skipped=0,
                   tests=0, failures=[])
    elif not xml.exists():
        run.update(status="failed", reason=f"pytest exited {code} without a report; see {run['log']}")
    else:
        run.update(junit_counts(xml))
        run["status"] = "passed" if code == 0 and run["tests"] else "failed"


def finish_section_a(result, started, deadline):
    """Waits for section a's processes until the monotonic ``deadline`` (then stops them, :func:`_stopped`); each
    run's seconds are its own, to its exit."""
    pending = list(started)
    while pending and monotonic_now() < deadline:
        for item in list(pending):
            run, child, xml, began = item
            if child.poll() is not None:
                _finished_run(run, child.returncode, xml, monotonic_now() - began)
                pending.remove(item)
        time.sleep(0.1)
    late = []
    for run, child, xml, began in pending:
        if child.poll() is not None:  # exited since the last look
            _finished_run(run, child.returncode, xml, monotonic_now() - began)
            continue
        os.killpg(child.pid, signal.SIGINT)  # as Ctrl-C: pytest writes the report of the tests it finished
        late.append((run, child, xml, began))
    grace = monotonic_now() + STOP_GRACE_S
    for run, child, xml, began in late:
        _stopped(run, child, xml, began, grace)
    if "status" not in result:
        statuses = {run["status"] for run in result["runs"]}
        result["status"] = "ran" if statuses <= {"passed", "failed", "empty"} else "partly run"
    return result


def _stopped(run, child, xml, began, grace):
    """A pytest process interrupted past its deadline: it is killed if still running at the monotonic ``grace``;
    the JUnit report it wrote of the tests it finished, if any, is counted in ``run``."""
    try:
        child.wait(timeout=max(0.0, grace - monotonic_now()))
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    run["seconds"] = round(monotonic_now() - began, 1)
    try:
        counts = junit_counts(xml) if xml.exists() else None
    except ElementTree.ParseError:  # killed while writing it
        counts = None
    if counts and counts["tests"]:
        run.update(counts, status="stopped", reason=f"budget: stopped after {run['seconds']} s, {counts['tests']} "
                                                    "tests finished (counted here), the rest not run")
    else:
        run.update(status="stopped", reason=f"not run: budget (stopped after {run['seconds']} s)")
