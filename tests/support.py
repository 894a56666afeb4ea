"""Shared helpers of the test tiers: paths, CLI runs, models built from YAML configs.

Models are built through OpenNMT-py's own option parser and model builder,
from the same YAML files users train with, so that the tests exercise the
real option path (strict parsing, onmt-ext options, registration).
"""

import contextlib
import copy
import functools
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TATOEBA = REPO / "build" / "tatoeba"
SMOKE_DIR = REPO / "yaml_configs" / "smoke"


def smoke_configs():
    """Every config under yaml_configs/smoke/, as paths relative to the repository."""
    return sorted(p.relative_to(REPO) for p in SMOKE_DIR.rglob("*.yaml"))


# ---------------------------------------------------------------------------
# What the decoding-property suite runs on, from the environment (see tests/README.md)

#: ``ONMT_EXT_TEST_DEVICE``: where the in-process checks run their models (``cpu`` or ``cuda``).
DEVICE_VARIABLE = "ONMT_EXT_TEST_DEVICE"
#: ``ONMT_EXT_TEST_AUTOCAST``: the autocast dtype of the in-process checks (``none``, ``bf16`` or ``fp16``).
AUTOCAST_VARIABLE = "ONMT_EXT_TEST_AUTOCAST"
#: ``ONMT_EXT_TEST_CONFIGS``: comma-separated smoke configs (relative to yaml_configs/smoke/) to restrict the
#: property suite to.
CONFIGS_VARIABLE = "ONMT_EXT_TEST_CONFIGS"
SHARD_VARIABLE = "ONMT_EXT_TEST_CONSOLE_SHARD"

AUTOCAST_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def device_under_test():
    """The torch device named by ``ONMT_EXT_TEST_DEVICE`` (default ``cpu``); a clear error if it cannot run."""
    name = os.environ.get(DEVICE_VARIABLE, "cpu").strip() or "cpu"
    if name not in ("cpu", "cuda"):
        raise ValueError(f"{DEVICE_VARIABLE}={name!r}: expected cpu or cuda")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{DEVICE_VARIABLE}=cuda, but this torch sees no CUDA device")
    return torch.device(name)


def autocast_name():
    """``none``, ``bf16`` or ``fp16``, from ``ONMT_EXT_TEST_AUTOCAST`` (default ``none``)."""
    name = os.environ.get(AUTOCAST_VARIABLE, "none").strip() or "none"
    if name not in AUTOCAST_DTYPES:
        raise ValueError(f"{AUTOCAST_VARIABLE}={name!r}: expected one of {', '.join(AUTOCAST_DTYPES)}")
    return name


def autocast(device):
    """The autocast context of ``ONMT_EXT_TEST_AUTOCAST`` on ``device`` (a no-op context for ``none``)."""
    dtype = AUTOCAST_DTYPES[autocast_name()]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


@contextlib.contextmanager
def host_reads():
    """Collects, as ``what at call site`` strings in the list it yields (filled when the block ends), every read of
    tensor data back to the host inside the block: what ``onmt_ext.runtime.hostsync.HostReads`` counts (the aten
    operators of its ``HOST_READS``, through a dispatch mode that also sees those inside torch's own C++ code,
    backward passes included, and ``Tensor.tolist``, ``cpu`` and ``numpy``), and, on CUDA, every synchronisation
    torch's sync debug mode reports (``CUDA sync at call site``)."""
    from onmt_ext.runtime.hostsync import HostReads, cuda_sync_warnings

    found = []
    with contextlib.ExitStack() as stack:
        synced = stack.enter_context(cuda_sync_warnings()) if torch.cuda.is_available() else []
        reads = stack.enter_context(HostReads())
        yield found
    found += [f"{what} at {where}" for what, where in reads.reads] + [f"CUDA sync at {site}" for site in synced]


def console_shard(items):
    """The share of ``items`` (a list) that ``ONMT_EXT_TEST_CONSOLE_SHARD=k/n`` names: every n-th from the k-th
    (0-based), so that n processes with k = 0 .. n-1 run each item once; all of them when the variable is unset."""
    value = os.environ.get(SHARD_VARIABLE, "").strip()
    if not value:
        return items
    k, _, n = value.partition("/")
    if not (k.isdigit() and n.isdigit() and int(k) < int(n)):
        raise ValueError(f"{SHARD_VARIABLE}={value!r}: expected k/n with 0 <= k < n, e.g. 0/3")
    return items[int(k)::int(n)]


def selected_smoke_configs():
    """The smoke configs named by ``ONMT_EXT_TEST_CONFIGS`` (in that order), or all of them when it is unset.

    Names are relative to yaml_configs/smoke/ (``li2019/em_all_components.yaml``); an unknown name is an error,
    so that a misspelt selection never runs an empty suite.
    """
    value = os.environ.get(CONFIGS_VARIABLE, "").strip()
    if not value:
        return smoke_configs()
    chosen = []
    for name in (part.strip() for part in value.split(",")):
        if not name:
            continue
        path = (SMOKE_DIR / name).resolve()
        if not path.is_file() or SMOKE_DIR.resolve() not in path.parents:
            raise ValueError(f"{CONFIGS_VARIABLE}: {name!r} is not a config under yaml_configs/smoke/")
        if path.relative_to(REPO) not in chosen:
            chosen.append(path.relative_to(REPO))
    if not chosen:
        raise ValueError(f"{CONFIGS_VARIABLE}={value!r} names no config")
    return chosen


def read_yaml(config):
    """The raw mapping of a repository-relative YAML config (C loader when available), read once per path and
    shared by every caller: read it, do not change it."""
    return _read_yaml(str(config))


@functools.lru_cache(maxsize=None)
def _read_yaml(config):
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load((REPO / config).read_text(encoding="utf-8"), Loader=loader) or {}


def cached_train_opts(config):
    """``load_train_opts(config)`` parsed once per config and process; each caller gets its own copy.

    For suites that read the options of many configs several times.  Not for tests that change the
    registered options between parses (they must call ``load_train_opts``).
    """
    return copy.deepcopy(_cached_train_opts(str(config)))


@functools.lru_cache(maxsize=None)
def _cached_train_opts(config):
    return load_train_opts(config)


def ensure_sample_data():
    """Prepare the shipped Tatoeba sample and its vocabularies (``make data``) if missing.

    ``make test`` builds them first; the lock is for ``pytest -n`` run directly, whose workers would
    otherwise all start ``make data`` at once.
    """
    from filelock import FileLock

    def ready():
        return all((TATOEBA / name).exists() for name in ("vocab.en", "signal_tagger.zh.pt"))

    if ready():
        return
    TATOEBA.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(TATOEBA.parent / ".sample-data.lock")):
        if not ready():
            subprocess.run(["make", "-s", "data"], cwd=REPO, check=True)


def cli_env(**extra):
    """Environment for running the stock console scripts in a subprocess."""
    env = dict(os.environ)
    env.pop("ONMT_EXT_DISABLE", None)
    env.update(extra)
    return env


def free_port():
    """A TCP port of 127.0.0.1 that nothing listens on now (a master port for ranks or nodes)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_cli(command, *args, check=True, timeout=600, env=None):
    """Run ``command`` (a console script of this venv, e.g. ``onmt_train``) from the repo root.

    Returns the CompletedProcess (text output).  With ``check`` a non-zero exit
    fails with the command's stderr in the message.
    """
    argv = [str(BIN / command), *map(str, args)]
    result = subprocess.run(
        argv, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env or cli_env()
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(argv)} exited {result.returncode}\n--- stderr ---\n{result.stderr[-4000:]}"
        )
    return result


def one_error_line(result, command, status):
    """The error line of a CLI ``result``: it exited ``status``, exactly one line of stderr starts with
    ``<command>: error:``, and there is no traceback."""
    assert result.returncode == status, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith(f"{command}: error: ")]
    assert len(errors) == 1, result.stderr[-3000:]
    return errors[0]


def train_parser():
    """OpenNMT-py's ``onmt_train`` parser (with onmt-ext's options when active)."""
    from onmt_ext.integration.parsing import train_parser as parser

    return parser()


def load_train_opts(config, *overrides):
    """Parse a repository-relative YAML config (plus overrides) as ``onmt_train`` does."""
    from onmt_ext.integration.parsing import parse_train_config

    return parse_train_config(REPO / config, *overrides)


def load_vocabs(opt):
    """The vocabularies named by ``opt`` (built by ``make data``)."""
    from onmt.constants import ModelTask
    from onmt.inputters.inputter import build_vocab

    if not hasattr(opt, "data_task"):  # set by OpenNMT-py's corpus validation
        opt.data_task = ModelTask.SEQ2SEQ
    old = os.getcwd()
    os.chdir(REPO)  # configs use repository-relative paths
    from onmt.transforms import get_specials, get_transforms_cls

    try:  # with the transforms' specials, as onmt_train builds them (e.g. clause_split's markers)
        return build_vocab(opt, get_specials(opt, get_transforms_cls(list(opt.transforms or []))))
    finally:
        os.chdir(old)


def build_model(opt, vocabs, seed=0):
    """Build the model of ``opt`` with Glorot init from ``seed``, in eval mode, dropout off."""
    from onmt.model_builder import build_base_model
    from torch.nn.init import xavier_uniform_

    torch.manual_seed(seed)
    model = build_base_model(opt, vocabs)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() > 1:
                xavier_uniform_(param)
            elif name.endswith("bias"):  # (the generator's bias is created uninitialised)
                param.uniform_(-0.1, 0.1)
            else:  # norm gains near 1, perturbed so that nothing is trivially symmetric
                param.uniform_(0.9, 1.1)
    model.eval()
    for module in model.modules():
        if hasattr(module, "dropout_p"):
            module.dropout_p = 0.0
    return model


def random_batch(vocabs, src_lens, tgt_lens, seed=0, pad_to=None):
    """A padded batch of random non-special tokens.

    Returns ``src`` ``(batch, src_len, 1)``, ``src_len`` ``(batch,)`` and ``tgt``
    ``(batch, tgt_len, 1)`` (starting with BOS); padding uses each vocab's pad id.
    """
    from onmt.constants import DefaultTokens

    gen = torch.Generator().manual_seed(seed)
    src_pad = vocabs["src"][DefaultTokens.PAD]
    tgt_pad = vocabs["tgt"][DefaultTokens.PAD]
    bos = vocabs["tgt"][DefaultTokens.BOS]
    s_max = pad_to[0] if pad_to else max(src_lens)
    t_max = pad_to[1] if pad_to else max(tgt_lens)
    src = torch.full((len(src_lens), s_max, 1), src_pad, dtype=torch.long)
    tgt = torch.full((len(tgt_lens), t_max, 1), tgt_pad, dtype=torch.long)
    markers = _marker_ids(vocabs["src"])
    for i, (s, t) in enumerate(zip(src_lens, tgt_lens)):
        src[i, :s, 0] = torch.randint(10, len(vocabs["src"]), (s,), generator=gen)
        if markers:  # clause markers in about a quarter of the positions, so that sentences have clauses
            where = torch.rand(s, generator=gen) < 0.25
            picks = torch.tensor(markers)[torch.randint(len(markers), (s,), generator=gen)]
            src[i, :s, 0] = torch.where(where, picks, src[i, :s, 0])
        tgt[i, :t, 0] = torch.randint(10, len(vocabs["tgt"]), (t,), generator=gen)
        tgt[i, 0, 0] = bos
    return src, torch.tensor(src_lens), tgt


def _marker_ids(vocab):
    """Ids of the clause_split markers in ``vocab`` (none unless the config lists the transform)."""
    from onmt_ext.mechanisms.clause.split import marker_tokens

    return [vocab[token] for token in marker_tokens() if token in vocab.ids_to_tokens]


def full_forward(model, src, src_len, tgt):
    """Teacher-forced pass: encoder output ``(B, S, D)`` and decoder output ``(B, T, D)``."""
    enc_out, enc_final_hs, src_len = model.encoder(src, src_len)
    model.decoder.init_state(src, enc_out, enc_final_hs)
    dec_out, _ = model.decoder(tgt, enc_out, src_len=src_len)
    return enc_out, dec_out


def start_decoding(model, src, src_len):
    """Run the encoder and initialise the decoder state; returns ``(enc_out, src_len)``."""
    enc_out, enc_final_hs, src_len = model.encoder(src, src_len)
    model.decoder.init_state(src, enc_out, enc_final_hs)
    return enc_out, src_len


def decode_steps(model, tgt, enc_out, src_len, start, stop):
    """Feed ``tgt[:, start:stop]`` one token at a time with the cache; returns ``(B, stop-start, D)``."""
    outs = []
    for step in range(start, stop):
        out, _ = model.decoder(tgt[:, step : step + 1], enc_out, step=step, src_len=src_len)
        outs.append(out)
    return torch.cat(outs, dim=1)
