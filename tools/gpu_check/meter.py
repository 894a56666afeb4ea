"""What section b measures of each training run, through OpenNMT-py's own trainer (:class:`Meter`): data waits,
reports, synchronisations per step and their call sites, the first step, a profiled window, peak memory.  Its
wrappers are in place only inside its ``with`` block, over onmt-ext's, and what they replaced is put back."""

import contextlib
import functools
import gc
import re
import statistics
import time
from collections import Counter
from itertools import islice
from pathlib import Path

from tools import common
from tools.gpu_check.cases import REPO
from tools.gpu_check.plan import MIN_START_S

#: the check's own files, whose frames a synchronisation's call site skips (the Meter's wrappers, the training loop)
OWN_FILES = ("/gpu_check/meter.py", "/gpu_check/child.py")


def _merge(intervals):
    """Total length of the union of ``(start, end)`` intervals."""
    total, current_start, current_end = 0.0, None, None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total


def busy_seconds(profiler, cuda):
    """Seconds during which at least one CUDA kernel (``cuda``) or one CPU operator ran in a finished profile.

    Read from the profiler's raw events: building torch's ``FunctionEvent`` tree first took a second or two per
    profiled run, more than the steps themselves in section b's small runs."""
    from torch.autograd import DeviceType

    wanted = DeviceType.CUDA if cuda else DeviceType.CPU
    intervals = [(event.start_ns(), event.start_ns() + event.duration_ns())
                 for event in profiler.profiler.kineto_results.events()
                 if event.device_type() == wanted and event.duration_ns() > 0]
    return _merge(intervals) / 1e9


def _top_sites(sites, count=5):
    """The ``count`` commonest call sites, as paths from the repository or from site-packages."""
    short = [re.sub(r"^.*/site-packages/", "", site.replace(f"{REPO}/", "")) for site in sites]
    return [[site, number] for site, number in Counter(short).most_common(count)]


class _SyncWindow:
    """Host-device synchronisations between :meth:`open` and :meth:`close`, with their call sites: on CUDA
    torch's sync warnings (onmt_ext.runtime.hostsync.cuda_sync_warnings), on the CPU the host's reads of tensor
    values (HostReads), less the optimizer's reads of its CPU step counters (no synchronisation on a GPU)."""

    def __init__(self, cuda):
        from onmt_ext.runtime import hostsync

        self.cuda, self.hostsync = cuda, hostsync
        self.context = self.found = None

    def open(self):
        if self.cuda:
            self.context = self.hostsync.cuda_sync_warnings(skip=OWN_FILES)
            self.found = self.context.__enter__()
        else:
            self.context = self.hostsync.HostReads(optimizer_counters=False)
            self.context.__enter__()

    def close(self):
        """``(count, call sites)``."""
        self.context.__exit__(None, None, None)
        if self.found is not None:
            return len(self.found), self.found
        return len(self.context.reads), [where for _, where in self.context.reads]


class _NoOptimiserState:
    """Stands in for a saver's optimiser: its checkpoint gets ``"optim": None``."""

    @staticmethod
    def state_dict():
        return None


_NO_OPTIMISER_STATE = _NoOptimiserState()


class WarmedUp(Exception):
    """Ends a warm-up job's training after its ``stop_after`` steps (raised after a whole step)."""


class Meter:
    """What section b measures of each training run in a process, through OpenNMT-py's trainer: data waits,
    report statistics, synchronisations per step, the first step's time, a profiled window, peak memory.
    A context manager: its wrappers of OpenNMT-py's trainer, saver and builders are in place inside the ``with``
    block, over what was there (onmt-ext's own wrappers), and exactly that is put back when the block ends
    (:func:`common.replacing`); :meth:`begin` and :meth:`end` frame each run (``job``) inside it."""

    def __init__(self, cuda):
        import torch

        self.torch, self.cuda, self.job = torch, cuda, None
        self.reports, self.parameters, self.replayed_by_key, self.tables = [], {}, {}, []
        self._stack, self.sync_window, self.window = None, None, {}

    def __enter__(self):
        stack = contextlib.ExitStack()
        with stack:
            self._install(stack)
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc):
        self.abandon()
        stack, self._stack = self._stack, None
        return stack.__exit__(*exc)

    def _install(self, stack):
        """Wraps OpenNMT-py's targets until ``stack`` closes."""
        from onmt import train_single
        from onmt import trainer as trainer_module
        from onmt.constants import CorpusTask
        from onmt.models import model_saver

        meter, replacing = self, functools.partial(common.replacing, stack)
        trainer_class = trainer_module.Trainer
        accum, accumulate = trainer_class._accum_batches, trainer_class._gradient_accumulation

        def timed_batches(trainer, iterator):
            batches = accum(trainer, iterator)
            while True:
                step = trainer.optim.training_step  # the step whose batches are fetched now
                meter._step_begins(step)
                start = time.perf_counter()
                try:
                    item = next(batches)
                except StopIteration:
                    meter._step_begins(None)
                    return
                meter.waits[step] = time.perf_counter() - start
                yield item

        def measured_step(trainer, *args, **kwargs):
            step = trainer.optim.training_step
            meter._profile(step, start=True)
            out = accumulate(trainer, *args, **kwargs)
            meter._profile(step, start=False)
            if step == 1:
                meter._sync()
                meter.first_step_end, meter.first_step_wall = time.perf_counter(), time.time()
            if step >= meter.job.get("stop_after", step + 1):
                meter._sync()
                raise WarmedUp(step)
            return out

        replacing(trainer_class, "_accum_batches", timed_batches)
        replacing(trainer_class, "_gradient_accumulation", measured_step)
        stack.enter_context(common.recording_training(self.reports, self.parameters))
        save = model_saver.ModelSaverBase.save

        def timed_save(saver, *args, **kwargs):
            """Section c's checkpoints: the model and its vocabularies without the optimiser's state (a third of
            the bytes; onmt_average_models writes translation checkpoints the same way), for the runs that save."""
            if meter.job["save"]:
                start, optim = time.perf_counter(), saver.optim
                saver.optim = _NO_OPTIMISER_STATE
                try:
                    save(saver, *args, **kwargs)
                finally:
                    saver.optim = optim
                meter.save_s += time.perf_counter() - start

        replacing(model_saver.ModelSaverBase, "save", timed_save)
        build_model, build_iter = train_single.build_model, train_single.build_dynamic_dataset_iter

        def timed_build(*args, **kwargs):
            model = build_model(*args, **kwargs)
            meter._sync()
            meter.model_built = time.perf_counter()
            meter.build_s = meter.model_built - meter.began
            return model

        def replayed_iter(*args, **kwargs):
            """The training batches built ahead of the first step, then replayed from memory."""
            if not meter.job["replay"] or kwargs.get("task", CorpusTask.TRAIN) != CorpusTask.TRAIN:
                return build_iter(*args, **kwargs)
            key, count = meter.job.get("replay_key"), meter.job["batches"]
            if key in meter.replayed_by_key and len(meter.replayed_by_key[key]) >= count:
                items = meter.replayed_by_key[key][:count]  # a case with the same data options built them
                meter.replayed, meter.replay_reused = len(items), True
                return items  # (no data iterator built for nothing)
            built = build_iter(*args, **kwargs)
            start = time.perf_counter()
            items = list(islice(iter(built), count))
            meter._sync()
            meter.replay_s, meter.replayed = time.perf_counter() - start, len(items)
            if key:
                meter.replayed_by_key[key] = items
            return items

        replacing(train_single, "build_model", timed_build)
        replacing(train_single, "build_dynamic_dataset_iter", replayed_iter)

    def write_tables(self, deadline, record):
        """The operator tables of the profiled runs, in run order, while the time before ``deadline`` (monotonic)
        seems to hold one more; ``record`` gets ``{"key", "phase": "table", "written"}`` for each.  torch's
        summaries take a second or two per run, so they wait until every run has been measured."""
        cost = 0.0
        while self.tables:
            key, profiler, path, title = self.tables.pop(0)
            written = time.monotonic() + max(cost, MIN_START_S / 3) < deadline
            if written:
                start = time.monotonic()
                write_profile_tables(profiler, self.cuda, path, title)
                cost = time.monotonic() - start
            record({"key": key, "phase": "table", "written": written})

    def _sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def abandon(self):
        """Closes what a run that raised mid-step left open, its figures dropped: the synchronisation window (on
        CUDA torch's sync debug mode and the warnings it catches, on the CPU the HostReads dispatch mode) and the
        profiler, which would otherwise stay on for the process's later runs.  A run that ended closed both."""
        window, self.sync_window = self.sync_window, None
        profiler = self.window.get("profiler")
        try:
            if window is not None:
                window.close()
        finally:
            if profiler is not None and "end" not in self.window:
                self.window.pop("profiler")
                profiler.__exit__(None, None, None)

    def begin(self, job):
        """Starts a run of ``job``: the figures of the run before dropped (and what it left open closed:
        :meth:`abandon`), the collector frozen for a replayed run, the peak memory reset."""
        self.abandon()
        self.job, self.waits, self.began, self.build_s = job, {}, time.perf_counter(), None
        self.reports.clear()
        self.parameters.clear()
        self.model_built = self.first_step_end = self.first_step_wall = None
        self.replay_s, self.replayed, self.window, self.syncs, self.sites = 0.0, None, {}, {}, []
        self.replay_reused, self.save_s, self.profiler_stop_s = False, 0.0, None
        self.sync_window, self.sync_step = None, None
        gc.collect()
        if job["replay"]:  # in one process, what survives (imports, caches) is frozen, so that the next run's
            gc.freeze()  # collection scans only what came since (a full one's cost: docs/gpu-check.md, section c)
        if self.cuda:
            self.torch.cuda.empty_cache()
            self.torch.cuda.reset_peak_memory_stats()
        else:
            try:  # "5": reset the peak resident set of this process (VmHWM)
                Path("/proc/self/clear_refs").write_text("5")
                self.peak_reset = True
            except OSError:
                self.peak_reset = False

    def _step_begins(self, step):
        """Closes the synchronisation window of the step before and opens ``step``'s when it is counted."""
        if self.sync_window is not None:
            count, sites = self.sync_window.close()
            self.sites += sites
            self.syncs[self.sync_step] = count
            self.sync_window = None
        first, last = self.job["counted"]
        reads = self.job["host_reads"]  # HostReads is a dispatch mode, which torch.compile refuses
        if step is not None and (self.cuda or reads) and first <= step <= last:
            self.sync_window, self.sync_step = _SyncWindow(self.cuda), step
            self.sync_window.open()

    def _profile(self, step, start):
        first, count = self.job["profile"]
        if start and step == first and count:
            self._sync()
            activities = [self.torch.profiler.ProfilerActivity.CPU]
            if self.cuda:
                activities.append(self.torch.profiler.ProfilerActivity.CUDA)
            self.window["profiler"] = self.torch.profiler.profile(activities=activities)
            self.window["profiler"].__enter__()
            self.window["start"] = time.perf_counter() - self.waits.get(step, 0.0)  # this step's data wait too
        elif not start and step == first + count - 1 and "profiler" in self.window:
            self._sync()
            self.window["end"] = time.perf_counter()
            self.window["profiler"].__exit__(None, None, None)
            self.profiler_stop_s = time.perf_counter() - self.window["end"]
            if self.job.get("profile_file"):  # written after the process's last run (write_tables)
                self.tables.append((self.job["key"], self.window["profiler"], Path(self.job["profile_file"]),
                                    f"{self.job['key']}: steps {first}-{first + count - 1}"))

    def end(self, t0_wall):
        """The run's figures; ``t0_wall``: when the parent started this process (None: not the first run)."""
        if self.sync_window is not None:
            self._step_begins(None)
        job, every = self.job, self.job["report_every"]
        first, last = job["measure"]
        measured = [r for r in self.reports if first <= r["step"] <= last]
        if not measured:
            raise RuntimeError(f"no training report of steps {first}-{last} (reports at "
                               f"{[r['step'] for r in self.reports]})")
        tokens, seconds = sum(r["tgt_tokens"] for r in measured), sum(r["seconds"] for r in measured)
        steps = measured[-1]["step"] - measured[0]["step"] + every
        waits = [self.waits.get(step, 0.0) for step in range(first, last + 1)]
        between = [count for step, count in self.syncs.items() if step % every]
        at_reports = [count for step, count in self.syncs.items() if not step % every]
        # one figure per report interval too: a recompilation (or any one-off stall) lands in one interval, so the
        # median interval shows the steady speed that the mean over the measured steps hides
        intervals = [r["tgt_tokens"] / r["seconds"] for r in measured if r["seconds"] > 0]
        figures = {
            "tokens_per_s": tokens / seconds, "measured_steps": steps, "step_ms": 1000 * seconds / steps,
            "interval_tokens_per_s": intervals, "measure_steps": job["measure"],
            # over time, (last step, tok/s) per report interval: whether the measured steps reached a plateau
            "interval_points": [[r["step"], r["tgt_tokens"] / r["seconds"]] for r in measured if r["seconds"] > 0],
            "median_interval_tokens_per_s": statistics.median(intervals) if intervals else None,
            "data_wait_share": sum(waits) / seconds, "peak_memory_mb": common.peak_memory_mb(self.cuda),
            "peak_memory_since": "the run" if self.cuda or self.peak_reset else "the process start",
            "parameters": self.parameters.get("total"), "replayed_batches": self.replayed,
            "replay_s": self.replay_s, "replay_reused": self.replay_reused, "model_build_s": self.build_s,
            "save_s": self.save_s, "profiler_stop_s": self.profiler_stop_s,
            "syncs_per_step": statistics.mean(between) if between else None, "sync_steps": len(between),
            "syncs_per_report_step": statistics.mean(at_reports) if at_reports else None,
            "sync_sites": _top_sites(self.sites),
            "sync_kind": "torch CUDA sync warnings" if self.cuda else "host reads of tensor values (HostReads)",
            "sync_counted_steps": job["counted"],
            "sync_sites_from": ("the Python caller of each sync warning" if self.cuda else "the caller of each host "
                                "read" if job["host_reads"] else "not counted (HostReads is a dispatch mode, which "
                                "torch.compile refuses)"),
        }
        if self.model_built is not None and self.first_step_end is not None:
            figures["first_step_s"] = self.first_step_end - self.model_built - self.replay_s
        if t0_wall is not None and self.first_step_wall is not None:
            figures["startup_s"] = self.first_step_wall - t0_wall
        if "end" in self.window:
            wall = self.window["end"] - self.window["start"]
            busy = busy_seconds(self.window["profiler"], self.cuda)
            figures["busy_share"] = busy / wall
            figures["busy_kind"] = "CUDA kernels" if self.cuda else "CPU operators"
            # the profiler slows the host, not the kernels: their time over the unprofiled step's is the busy
            # share of the measured steps, as near as one can tell without profiling them
            figures["busy_ms_per_step"] = 1000 * busy / job["profile"][1]
            figures["busy_share_unprofiled"] = min(1.0, figures["busy_ms_per_step"] / figures["step_ms"])
        return figures


def write_profile_tables(profiler, cuda, path, title):
    """The profiled steps' operators, by self device time (on CUDA) and by self CPU time, top 30 each, into
    ``path``: what to read before making a row faster."""
    averages = profiler.key_averages()
    sorts = ["self_cpu_time_total"]
    if cuda:
        sorts.insert(0, "self_device_time_total" if hasattr(averages[0], "self_device_time_total") else
                     "self_cuda_time_total")
    parts = [f"# {title}"]
    for sort in sorts:
        parts += [f"\n## sorted by {sort}\n", averages.table(sort_by=sort, row_limit=30, max_name_column_width=70)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts) + "\n", encoding="utf-8")
