"""What the commands under tools/ share: argument parsing, number and table formatting, child processes.

The commands import it as ``from tools import common`` (they run from the checkout as ``python -m tools.<name>``).
A child process is this interpreter running a tool's module, ``python -m tools.<name> --child KIND RESULT
[head...] -- argv`` (:func:`run_child`), which writes its figures as JSON to ``RESULT``.
:func:`recording_training` is the training statistics the GPU check takes from OpenNMT-py's own trainer,
through :func:`replacing`, which puts back what it changed.
"""

import argparse
import contextlib
import copy
import functools
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from onmt_ext.patches import temporarily

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "yaml_configs"


class Parser(argparse.ArgumentParser):
    """Bad arguments: one line, ``<prog>: error: ...``, exit status 2 (no usage block)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def fmt(value, digits=2):
    """``value`` for a report: ``n/a`` for None or NaN, a float with ``digits`` decimals, anything else as str."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def device_info(device):
    """The machine a measurement ran on: torch's, CUDA's and Python's versions, and the GPU (name, memory,
    capability, cuDNN) when ``device`` is ``"cuda"``, else the CPU and its cores."""
    import torch

    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()}
    if device == "cuda":
        properties = torch.cuda.get_device_properties(0)
        info.update(name=torch.cuda.get_device_name(0), memory_gib=round(properties.total_memory / 2**30, 1),
                    capability=f"{properties.major}.{properties.minor}",
                    cudnn=torch.backends.cudnn.version())
    else:
        info.update(name=f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)")
    return info


def add_bench_options(parser, dtypes, tiny, warmup, repeats):
    """A benchmark's common options: ``--dtype`` (one of ``dtypes``), ``--warmup`` and ``--repeats`` calls (their
    defaults), ``--seed``, ``--device``, ``--tiny`` (the dry run's settings ``tiny``) and ``--out``."""
    parser.add_argument("--dtype", choices=dtypes, help="default: float16 on CUDA, float32 on the CPU")
    parser.add_argument("--warmup", type=at_least(0), default=warmup, help="untimed calls first")
    parser.add_argument("--repeats", type=at_least(1), default=repeats, help="timed calls (their median)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=("cuda", "cpu"),
                        help="default: cuda when torch sees a CUDA device, else cpu")
    parser.add_argument("--tiny", action="store_true", help=f"a dry run on toy sizes: {tiny}")
    parser.add_argument("--out", help="write <out>.json and <out>.md")


def parse_bench_args(parser, argv, tiny):
    """Parse a benchmark's command line (:func:`add_bench_options`): ``--tiny`` replaces settings with ``tiny``;
    ``device`` defaults to ``cuda`` when torch sees a CUDA device, else ``cpu``, ``dtype`` to float16 on CUDA and
    float32 on the CPU; ``cuda`` without a device is a ``parser`` error."""
    import torch

    args = parser.parse_args(argv)
    if args.tiny:
        vars(args).update(tiny)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error(f"no CUDA device visible to torch {torch.__version__}")
    args.dtype = args.dtype or ("float16" if args.device == "cuda" else "float32")
    return args


def bench_report(args, setting, rows):
    """A benchmark's report: ``{"machine": device_info(args.device), "setting": setting, "rows": rows}``."""
    return {"machine": device_info(args.device), "setting": setting, "rows": rows}


def publish_bench(args, setting, rows, markdown):
    """A benchmark's :func:`bench_report`: printed as ``markdown(report)`` and, with ``args.out``, written to
    ``<out>.json`` and ``<out>.md``; returns 0, the command's exit status."""
    report = bench_report(args, setting, rows)
    text = markdown(report)
    print(text, end="")
    if args.out:
        write_outputs(args.out, report, text)
    return 0


def write_outputs(out, data, text):
    """``<out>.json`` (``data``) and ``<out>.md`` (``text``, a newline added if it lacks one)."""
    with open(f"{out}.json", "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1)
    with open(f"{out}.md", "w", encoding="utf-8") as handle:
        handle.write(text if text.endswith("\n") else text + "\n")


def append_json_line(path, entry):
    """Appends ``entry`` to the JSON-lines file ``path`` at once (a stopped child keeps what it recorded)."""
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(entry) + "\n")


def read_json_lines(path):
    """The entries of the JSON-lines file ``path`` (none when it does not exist)."""
    path = Path(path)
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []


def peak_memory_mb(cuda):
    """Peak CUDA memory allocated (``cuda``), else the peak resident set of this process, in MiB."""
    if cuda:
        import torch

        return torch.cuda.max_memory_allocated() / 2**20
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def replacing(stack, owner, name, new):
    """Sets ``owner.name`` to ``new`` until ``stack`` (a :class:`contextlib.ExitStack`) closes, which puts back
    exactly what was there (:func:`onmt_ext.patches.temporarily`: the object itself, where the class or module
    held it).  The tools change OpenNMT-py only this way, for the block that needs it; a target that onmt-ext's
    registry wraps keeps its wrapper under the tool's."""
    stack.enter_context(temporarily(owner, name, new))
    return new


@contextlib.contextmanager
def recording_training(reports, parameters):
    """While the block runs, OpenNMT-py's trainer appends each report's ``step``, target/source tokens and
    seconds to ``reports`` and sets ``parameters["total"]`` when the model counts its parameters."""
    from onmt.models import model as models
    from onmt.utils import statistics as stats

    output = stats.Statistics.output

    def recording_output(statistics, step, *args, **kwargs):
        reports.append({"step": step, "tgt_tokens": statistics.n_words, "src_tokens": statistics.n_src_words,
                        "seconds": statistics.elapsed_time()})
        return output(statistics, step, *args, **kwargs)

    def recording(count):
        def recording_count(model, *args, **kwargs):
            parameters["total"] = sum(p.numel() for p in model.parameters())
            return count(model, *args, **kwargs)

        return recording_count

    with contextlib.ExitStack() as stack:
        replacing(stack, stats.Statistics, "output", recording_output)
        for cls in (models.BaseModel, models.NMTModel, models.LanguageModel):  # each defines its own
            replacing(stack, cls, "count_parameters", recording(cls.__dict__["count_parameters"]))
        yield


def program(name):
    """The path of the console script ``name`` (``onmt_train``, ...) of this interpreter's environment."""
    return str(Path(sys.executable).parent / name)


def threads_env(threads):
    """This process's environment with ``threads`` CPU threads for torch (OMP, MKL); unchanged for 0 or None."""
    return dict(os.environ, **({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} if threads else {}))


class ChildFailed(Exception):
    """A child process exited with an error (``timed_out``: it was stopped at its time limit)."""

    def __init__(self, message, timed_out=False):
        super().__init__(message)
        self.timed_out = timed_out


def run_child(module, kind, argv, log, threads, timeout=None, head=(), env=None):
    """Runs ``python -m module --child kind RESULT [head...] -- argv`` with its output in ``log`` and ``env``
    (variables) added to the environment; returns the JSON the child wrote.  Raises :class:`ChildFailed` if it fails or
    outlives ``timeout`` seconds (then its whole process group is killed)."""
    return Child(module, kind, argv, log, threads, head, env).finish(timeout)


class Child:
    """:func:`run_child` in two halves: the child starts now; :meth:`finish` waits for it (or :meth:`kill` stops it)."""

    def __init__(self, module, kind, argv, log, threads, head=(), env=None):
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
            self.result_file = handle.name
        self.kind, self.log = kind, log
        command = [sys.executable, "-m", module, "--child", kind, self.result_file, *map(str, head), "--",
                   *map(str, argv)]
        try:
            with open(log, "w", encoding="utf-8") as out:
                self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                                start_new_session=True, env=dict(threads_env(threads), **(env or {})))
        except BaseException:
            Path(self.result_file).unlink(missing_ok=True)
            raise

    def finish(self, timeout=None):
        """The JSON the child wrote once it ends; :class:`ChildFailed` as :func:`run_child`."""
        try:
            try:
                code = self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise ChildFailed(f"{self.kind} stopped after {timeout:.0f} s (time budget); see {self.log}",
                                  timed_out=True) from None
            if code:
                raise ChildFailed(f"{self.kind} failed (exit {code}); see {self.log}")
            return json.loads(Path(self.result_file).read_text(encoding="utf-8"))
        finally:
            Path(self.result_file).unlink(missing_ok=True)

    def kill(self):
        """Stops the child's whole process group (and removes its result file)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, 9)
        self.process.wait()
        Path(self.result_file).unlink(missing_ok=True)


def child_main(argv, children):
    """A tool's ``--child KIND RESULT [head...] -- argv`` entry: calls ``children[KIND](RESULT, head, argv)``."""
    import onmt  # noqa: F401  (onmt-ext's start-up hook, unless ONMT_EXT_DISABLE)

    kind, result_file, *rest = argv[1:]
    split = rest.index("--")
    return children[kind](result_file, rest[:split], rest[split + 1:])


def config_values(config):
    """The options of ``yaml_configs/<config>`` as a dict (a new one each call)."""
    path = CONFIGS / config
    stat = path.stat()
    return copy.deepcopy(_parsed_config(path, stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=None)
def _parsed_config(path, modified, size):
    """``path`` parsed (libyaml's safe loader where PyYAML has it), once per modification time and size."""
    import yaml

    return yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def built_model(config, *overrides, seed=0):
    """``(opt, vocabs, model)`` of the training config at ``config`` (a path; relative paths inside it are the
    repository's) with ``overrides``, built as ``onmt_train`` builds it (the transforms' specials in the
    vocabularies), its parameters drawn after ``torch.manual_seed(seed)``; the model on the CPU."""
    import torch
    from onmt.constants import ModelTask
    from onmt.inputters.inputter import build_vocab
    from onmt.model_builder import build_base_model
    from onmt.transforms import get_specials, get_transforms_cls

    from onmt_ext.integration.parsing import parse_train_config

    os.chdir(REPO)  # the configs' paths are relative to the repository
    opt = parse_train_config(config, *overrides)
    opt.data_task = ModelTask.SEQ2SEQ
    vocabs = build_vocab(opt, get_specials(opt, get_transforms_cls(list(opt.transforms or []))))
    torch.manual_seed(seed)
    return opt, vocabs, build_base_model(opt, vocabs)


def pyplot():
    """matplotlib's pyplot on the Agg back end (files only, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def inference_engine(argv):
    """OpenNMT-py's inference engine for the ``onmt_translate`` arguments ``argv``, checked as the command does."""
    from onmt.bin.translate import _get_parser
    from onmt.inference_engine import InferenceEnginePY
    from onmt.utils.parse import ArgumentParser

    opt = _get_parser().parse_args([str(word) for word in argv])
    ArgumentParser.validate_translate_opts(opt)
    ArgumentParser._get_all_transform_translate(opt)
    ArgumentParser._validate_transforms_opts(opt)
    ArgumentParser.validate_translate_opts_dynamic(opt)
    return InferenceEnginePY(opt)


def at_least(minimum):
    """An argparse ``type``: an integer >= ``minimum``; anything else is the one-line error of its option."""

    def integer(text):
        if not text.lstrip("-").isdigit() or int(text) < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, not {text!r}")
        return int(text)

    return integer
