#!/usr/bin/env python
"""Memory of one training step of li2019's Transformer-Base configs against the baseline's (issue 35).

    python -m tools.routing_memory [--device cpu|cuda] [--sentences 512] [--length 16] [--cases ...]
        [--measure saved peak time ops] [--recompute false true] [--steps 3] [--json FILE]

Each (case, ``li2019_recompute``) runs in a fresh child process: the WMT17 Base config with the Tatoeba
vocabularies, a fixed batch of ``--sentences`` sentences of at most ``--length`` tokens a side, autocast (bf16 on
the CPU, fp16 on CUDA), training mode.  ``saved``: bytes autograd saves for backward, parameters excluded, split
into the attentions' ``final_linear`` and the rest (counted, not kept: steps that would not fit count too).
``peak``: peak memory (resident set on the CPU) and fastest step after the first of ``--steps`` Adam steps.
``time`` and ``ops`` (in this process): one routing's forward + backward, stored against recomputed, and its
operators (tools/op_count.py's count) and time, without and with autocast.  Method and figures:
results/bench/li2019-routing-memory.md.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from tools import common, op_count

REPO = common.REPO

CASES = {
    "baseline": "yaml_configs/baseline/transformer_base_wmt17_zhen.yaml",
    "simple_enc_self": "yaml_configs/li2019/transformer_base_wmt17_zhen_simple_enc_self.yaml",
    "em_enc_self": "yaml_configs/li2019/transformer_base_wmt17_zhen_em_enc_self.yaml",
    "em_all": "yaml_configs/li2019/transformer_base_wmt17_zhen_em_all.yaml",
}


class SavedBytes:
    """``saved_tensors_hooks`` that count the bytes of every storage autograd saves, each storage once.

    ``where`` names the bucket that the next saves count in.  With ``keep=False`` the pack hook keeps
    nothing (no backward pass is possible then); a storage is counted again only once the first one is
    freed, which a weak reference tells.  Storages in ``exclude`` (the parameters) are not counted.
    """

    def __init__(self, exclude=(), keep=False):
        from torch.multiprocessing.reductions import StorageWeakRef

        self._weak, self._refs, self.keep = StorageWeakRef, {}, keep
        self._exclude = {t.untyped_storage().data_ptr() for t in exclude}
        self.bytes, self.where = {}, "rest"

    def pack(self, tensor):
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        ref = self._refs.get(ptr)
        if ptr not in self._exclude and (ref is None or ref.expired()):
            self._refs[ptr] = self._weak(storage)
            self.bytes[self.where] = self.bytes.get(self.where, 0) + storage.nbytes()
        return tensor if self.keep else None

    @property
    def total(self):
        return sum(self.bytes.values())

    def hooks(self):
        import torch

        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda saved: saved)

    def watch(self, module, name):
        """Count what ``module``'s forward pass saves under ``name``."""
        module.register_forward_pre_hook(lambda *_: setattr(self, "where", name))
        module.register_forward_hook(lambda *_: setattr(self, "where", "rest"))


def _setup(case, recompute, args):
    """(model, batch, autocast) of ``case`` on ``args.device``, in training mode."""
    import torch
    from onmt.constants import DefaultTokens

    overrides = ["-src_vocab", "build/tatoeba/vocab.zh", "-tgt_vocab", "build/tatoeba/vocab.en"]
    if case != "baseline":
        overrides += ["-li2019_recompute", "true" if recompute else "false"]
    _, vocabs, model = common.built_model(REPO / CASES[case], *overrides)
    device = torch.device(args.device)
    model = model.to(device).train()
    generator = torch.Generator().manual_seed(1)
    n, length = args.sentences, args.length

    def side(vocab, extra):  # (n, length + extra, 1) random tokens, right-padded to lengths in [length - 4, length]
        lengths = torch.randint(length - 4, length + 1, (n,), generator=generator) + extra
        lengths[0] = length + extra
        tokens = torch.randint(10, len(vocab), (n, length + extra, 1), generator=generator)
        tokens[torch.arange(length + extra)[None, :] >= lengths[:, None]] = vocab[DefaultTokens.PAD]
        return tokens.to(device), lengths.to(device)

    src, src_len = side(vocabs["src"], 0)
    tgt, _ = side(vocabs["tgt"], 1)  # the decoder reads tgt[:, :-1] and predicts tgt[:, 1:]
    tgt[:, 0, 0] = vocabs["tgt"][DefaultTokens.BOS]
    return model, (src, tgt, src_len, vocabs["tgt"][DefaultTokens.PAD]), _autocast(device.type)


def _loss(model, batch, autocast):
    """OpenNMT-py's loss: the generator's logits in float32, label-smoothed cross-entropy summed, per token."""
    import torch.nn.functional as F

    src, tgt, src_len, pad = batch
    with autocast:
        dec_out, _ = model(src, tgt, src_len)
        logits = model.generator(dec_out)
    target = tgt[:, 1:, 0].reshape(-1)
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), target, ignore_index=pad, reduction="sum",
                           label_smoothing=0.1)
    return loss / (target != pad).sum()


def _autocast(device_type, enabled=True):
    """Autocast as the runs use it: bf16 on the CPU, fp16 on CUDA."""
    import torch

    return torch.autocast(device_type, dtype=torch.bfloat16 if device_type == "cpu" else torch.float16,
                          enabled=enabled)


def _seconds(run, cuda):
    """Wall seconds of ``run()``, waiting for CUDA's queued kernels where ``cuda``."""
    import torch

    start = time.perf_counter()
    run()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def child(case, recompute, measure, args):
    import torch

    from onmt_ext.mechanisms.li2019 import RoutingAggregation

    torch.set_num_threads(args.threads)
    model, batch, autocast = _setup(case, recompute, args)
    result = dict(case=case, recompute=recompute if case != "baseline" else None, measure=measure,
                  positions=int(batch[0].shape[0] * batch[0].shape[1]),
                  routed=sum(isinstance(m, RoutingAggregation) for m in model.modules()))
    if measure == "saved":
        counter = SavedBytes(exclude=list(model.parameters()))
        for module in model.modules():
            if hasattr(module, "final_linear"):
                counter.watch(module.final_linear, "aggregation")
        with counter.hooks():
            _loss(model, batch, autocast)
        result.update(saved_bytes=counter.total, saved_aggregation_bytes=counter.bytes.get("aggregation", 0),
                      saved_rest_bytes=counter.bytes.get("rest", 0))
    else:
        cuda = batch[0].is_cuda
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
        scaler = torch.amp.GradScaler("cuda", enabled=cuda)
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

        def step():
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(_loss(model, batch, autocast)).backward()
            scaler.step(optimizer)
            scaler.update()

        times = [_seconds(step, cuda) for _ in range(args.steps)]
        result.update(step_s=min(times[1:]), peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      rss_before_steps_bytes=rss_before)
        if cuda:
            result.update(peak_cuda_bytes=torch.cuda.max_memory_allocated(), device_name=torch.cuda.get_device_name())
    print("RESULT " + json.dumps(result), flush=True)



def _routing(args, method, capsules=512, **options):
    """A Base-size routing (H = 8, d = 512; ``options``: RoutingAggregation's, its defaults otherwise), seeded, and its
    ``(--sentences, --length, 512)`` input."""
    import torch

    from onmt_ext.mechanisms.li2019 import RoutingAggregation

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    module = RoutingAggregation(8, 512, capsules, method, **options).to(args.device)
    return module, torch.randn(args.sentences, args.length, 512, device=args.device, requires_grad=True)


def routing_ops(args):
    """Aten operators and time of one routing (N = ``--capsules``, T = ``--iterations``): forward and backward
    counted apart, in float32 and under autocast, stored and recomputed; the fastest of ``--repeats`` passes."""
    for method in ("simple", "em"):
        for autocast in (False, True):
            for recompute in (False, True):
                module, context = _routing(args, method, args.capsules, iterations=args.iterations, recompute=recompute)

                def forward():
                    with _autocast(args.device, enabled=autocast):
                        return module(context).float().sum()

                with op_count.counter() as forward_ops:
                    loss = forward()
                with op_count.counter() as backward_ops:
                    loss.backward()
                times = [_seconds(lambda: forward().backward(), args.device == "cuda") for _ in range(args.repeats)]
                yield dict(measure="ops", method=method, autocast=autocast, recompute=recompute,
                           positions=args.sentences * args.length, capsules=args.capsules,
                           iterations=args.iterations, forward=forward_ops.totals(), backward=backward_ops.totals(),
                           seconds=min(times))


def time_routing(args):
    """Forward + backward of one routing (N = 512) under autocast, stored and recomputed in alternation,
    ``--repeats`` times each; the fastest of each."""
    for method in ("simple", "em"):
        module, context = _routing(args, method)

        def run():
            with _autocast(args.device):
                out = module(context)
            out.float().sum().backward()

        times = {False: [], True: []}
        for _ in range(args.repeats):
            for recompute in (False, True):
                module.recompute = recompute
                times[recompute].append(_seconds(run, args.device == "cuda"))
        yield dict(measure="time", method=method, positions=args.sentences * args.length,
                   stored_s=min(times[False]), recomputed_s=min(times[True]))


def model_runs(args, measure):
    """``measure`` (saved or peak) of each (case, recompute) asked for, each in a child process.  On the CPU,
    glibc serves and frees each allocation of 128 KiB or more by its own mapping there, so that the resident
    set follows the live tensors (else a freed block up to 32 MiB can stay resident and count in the peak)."""
    env = dict(os.environ)
    if args.device == "cpu":
        env.setdefault("MALLOC_MMAP_THRESHOLD_", str(128 * 1024))
    for case in args.cases:
        for recompute in (["true"] if case == "baseline" else args.recompute):
            if f"{case}:{recompute}:{measure}" in args.skip:
                continue
            command = [sys.executable, "-m", "tools.routing_memory", "--device", args.device,
                       "--sentences", str(args.sentences),
                       "--length", str(args.length), "--threads", str(args.threads), "--steps", str(args.steps),
                       "--child", case, recompute, measure]
            run = subprocess.run(command, capture_output=True, text=True, env=env)
            lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
            if run.returncode or not lines:
                yield dict(case=case, recompute=recompute == "true", measure=measure,
                           error=(run.stderr.strip().splitlines() or ["exit status %d" % run.returncode])[-1])
            else:
                yield json.loads(lines[-1][len("RESULT "):])


def main(argv=None):
    parser = common.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--sentences", type=int, default=512, help="sentences per batch (default 512)")
    parser.add_argument("--length", type=int, default=16, help="tokens per sentence, padded (default 16)")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--measure", nargs="+", default=["saved", "peak"], choices=["saved", "peak", "time", "ops"],
                        help="time: one routing's forward + backward, stored and recomputed; ops: its aten "
                        "operators and time (both in this process)")
    parser.add_argument("--repeats", type=int, default=5, help="rounds of --measure time and ops (default 5)")
    parser.add_argument("--capsules", type=int, default=512, help="N of --measure ops (default 512 = d_model)")
    parser.add_argument("--iterations", type=int, default=3, help="T of --measure ops (default 3)")
    parser.add_argument("--recompute", nargs="+", default=["false", "true"], choices=["false", "true"],
                        help="li2019_recompute values to run (the baseline runs once)")
    parser.add_argument("--skip", nargs="*", default=[], metavar="CASE:RECOMPUTE:MEASURE",
                        help="runs to leave out, e.g. em_all:false:peak where it does not fit in memory")
    parser.add_argument("--steps", type=int, default=3, help="training steps of a peak run (default 3); its step "
                        "time is the fastest after the first")
    parser.add_argument("--threads", type=int, default=max(1, os.cpu_count() or 1))
    parser.add_argument("--json", type=Path, help="write the results here as well")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.length < 5 or args.steps < 2:
        parser.error("--length must be at least 5 and --steps at least 2")
    if args.child:
        case, recompute, measure = args.child
        return child(case, recompute == "true", measure, args)
    results = []
    for measure in args.measure:
        runs = {"time": time_routing, "ops": routing_ops}.get(measure)
        for result in runs(args) if runs else model_runs(args, measure):
            print(json.dumps(result), flush=True)
            results.append(result)
    if args.json:
        args.json.write_text(json.dumps(dict(args={k: str(v) for k, v in vars(args).items()}, results=results),
                                        indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
