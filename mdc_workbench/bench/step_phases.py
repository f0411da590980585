"""``mdc bench step``: where the trainer's step spends its time, phase by phase, and how often the host waits.

The trainer marks the phases of its step (:class:`mdc_core.train.StepClock`: read, prepare, forward_backward,
clip_optimizer, ema, metrics_logging, checkpoint); :class:`PhaseClock` times them, waiting for the device at every
phase boundary (``torch.cuda.synchronize``, here only: the trainer itself never waits), so that each phase's time is
its own work. :func:`measure_step_phases` trains a preset for a few dozen steps on a small embedded data set
exactly as ``mdc train`` does, with that clock, and reports per phase the median milliseconds of the steps that
neither log nor checkpoint. A step is the time from one ``read`` to the next, so the phases add up to it up to the
few lines between them (``coverage``). The model's compute is forward_backward + clip_optimizer + ema; the rest of
the step is its fixed cost (``fixed_ms``). Each phase's CPU time on the training thread is reported beside its wall
time: on a shared machine it is the steadier measure of the host's own work.

A second, short run counts host synchronisations per step (:class:`SyncCounter`: every call that would make the
host wait for a CUDA device, on the CPU path too; on CUDA also ``torch.cuda.set_sync_debug_mode``'s warnings).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import tempfile
import time
import traceback
import warnings
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from mdc_core.distributed import sync
from mdc_core.train import StepClock

MODEL_PHASES = ("forward_backward", "clip_optimizer", "ema")  # the model's compute; the other phases: fixed cost

T = torch.Tensor
READS = {T.item: "item()", T.tolist: "tolist()", T.cpu: "cpu()", T.numpy: "numpy()", T.__bool__: "bool(tensor)",
         T.__float__: "float(tensor)", T.__int__: "int(tensor)", T.__index__: "tensor as an index",
         torch.equal: "torch.equal"}
DATA_SHAPED = {torch.nonzero: "nonzero", T.nonzero: "nonzero", torch.argwhere: "argwhere", T.argwhere: "argwhere",
               torch.masked_select: "masked_select", T.masked_select: "masked_select", torch.unique: "unique",
               T.unique: "unique", torch.unique_consecutive: "unique_consecutive"}
INDEXING = {T.__getitem__, T.__setitem__, T.index_put_, T.index_put, torch.index_put}


class SyncCounter(TorchFunctionMode):
    """Counts the calls that would synchronise a CUDA device with the host, on any device (the CPU path included).

    On CUDA the host queues kernels and runs ahead of the GPU until it needs a value the GPU computes: ``.item()``,
    ``.tolist()``, ``.cpu()``/``.numpy()``, ``bool()``/``float()``/``int()`` of a tensor, ``nonzero``, boolean-mask
    indexing, or a blocking host-to-device copy. Device tensors are `tensors` and `params` (and the params'
    gradients), what is moved with ``.to(device)``, and everything computed from them (followed through this
    ``TorchFunctionMode``); host tensors (the tokenizer's, the host-side batch preparation's) may be read freely.
    :attr:`calls` names each call and where it was made; none is counted while :attr:`paused`."""

    def __init__(self, device: torch.device | str, tensors: Iterable[torch.Tensor], params: Iterable[torch.Tensor]):
        super().__init__()
        self.device, self.params = torch.device(device), list(params)
        self.tags: dict[int, weakref.ref] = {}
        self.calls: list[str] = []
        self.paused = False
        for t in [*tensors, *self.params]:
            self._tag(t)

    def _tag(self, t: torch.Tensor) -> None:
        self.tags[id(t)] = weakref.ref(t)

    def on_device(self, t: object) -> bool:
        if not isinstance(t, torch.Tensor):
            return False
        ref = self.tags.get(id(t))
        return (ref is not None and ref() is t) or any(t is p.grad for p in self.params)  # autograd makes grads

    def _target(self, func: Any, args: tuple, kwargs: dict) -> str | None:
        """For a transfer call: "device" (the training device) or "host"; None for other calls."""
        if func is T.cpu:
            return "host"
        if func is T.cuda:
            return "device"
        if func is not T.to:
            return None
        for a in [*args[1:], kwargs.get("device")]:
            if isinstance(a, T):
                a = a.device
            if isinstance(a, str):  # "cpu" written out means the host; a device object means the trainer's device
                return "host" if a == "cpu" else "device"
            if isinstance(a, torch.device):
                return "device" if a.type == self.device.type else "host"
        return None

    def _reason(self, func: Any, args: tuple, kwargs: dict, device_in: bool) -> str | None:
        if func in READS and device_in:
            return READS[func]
        if func in DATA_SHAPED and device_in:
            return DATA_SHAPED[func]
        if func in INDEXING and device_in:
            index = args[1] if len(args) > 1 else kwargs.get("indices")
            if any(isinstance(i, T) and i.dtype == torch.bool for i in tree_flatten(index)[0]):
                return "boolean-mask indexing"
        target = self._target(func, args, kwargs)
        blocking = not kwargs.get("non_blocking", False)
        if target == "host" and device_in:
            return "copy to the host"
        if target == "device" and not self.on_device(args[0]) and blocking:
            return "blocking host-to-device copy"
        if func is T.copy_ and self.on_device(args[0]) != self.on_device(args[1]) and blocking:
            return "blocking copy between host and device"
        if func in (torch.tensor, torch.as_tensor) and isinstance(kwargs.get("device"), torch.device) \
                and kwargs["device"].type == self.device.type:
            return "torch.tensor(..., device=): a blocking host-to-device copy"
        return None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        device_in = any(self.on_device(t) for t in tree_flatten((args, kwargs))[0])
        reason = None if self.paused else self._reason(func, args, kwargs, device_in)
        if reason:
            where = [f for f in traceback.extract_stack()[:-1] if "mdc_core" in f.filename or "tests" in f.filename]
            at = f"{where[-1].filename.split('/')[-1]}:{where[-1].lineno} {where[-1].line}" if where else "?"
            self.calls.append(f"{reason} at {at}")
        out = func(*args, **kwargs)
        if device_in or self._target(func, args, kwargs) == "device":
            for t in tree_flatten(out)[0]:
                if isinstance(t, T):
                    self._tag(t)
        return out


class PhaseClock(StepClock):
    """Times each phase of each step, waiting for `device` at every boundary; with `count_syncs`, counts each
    step's host synchronisations instead (a :class:`SyncCounter` per step, paused while the data is read on the
    host; on CUDA also the sync debug mode's warnings). A step starts where a ``read`` phase follows another phase.
    Call :meth:`close` after the run."""

    def __init__(self, device: torch.device | str, count_syncs: bool = False) -> None:
        self.device, self.count_syncs = torch.device(device), count_syncs
        self.steps: list[dict[str, float]] = []  # per step: phase -> seconds
        self.cpu: list[dict[str, float]] = []  # per step: phase -> CPU seconds of this thread (the host's own work)
        self.starts: list[float] = []  # perf_counter at the start of each step
        self.cpu_starts: list[float] = []  # thread_time at the start of each step
        self.cpu_end = 0.0
        self.end = 0.0  # the end of the last phase
        self.syncs: list[list[str]] = []  # per step: the calls that would synchronise
        self.modules: list[torch.nn.Module] = []
        self._last = ""
        self._counter: SyncCounter | None = None
        self._warnings: contextlib.ExitStack | None = None
        self._caught: list[warnings.WarningMessage] = []

    def watch(self, modules: Iterable[torch.nn.Module]) -> None:
        self.modules = list(modules)

    def _next_step(self) -> None:
        self._stop_counting()
        self.steps.append({})
        self.cpu.append({})
        self.starts.append(time.perf_counter())
        self.cpu_starts.append(time.thread_time())
        if self.count_syncs:
            self.syncs.append([])
            self._counter = SyncCounter(self.device, [b for m in self.modules for b in m.buffers()],
                                        [p for m in self.modules for p in m.parameters()])
            self._counter.__enter__()
            if self.device.type == "cuda" and self._warnings is None:
                self._warnings = contextlib.ExitStack()
                self._caught = self._warnings.enter_context(warnings.catch_warnings(record=True))
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")

    def _stop_counting(self) -> None:
        if self._counter is not None:
            self._counter.__exit__(None, None, None)
            self.syncs[-1] += self._counter.calls
            self._counter = None
        if self._caught:  # CUDA's own account: every real synchronisation of the step
            self.syncs[-1] += [f"cuda sync: {w.message}" for w in self._caught if "ynchroniz" in str(w.message)]
            self._caught.clear()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if not self.count_syncs:  # counting: the clock's own waits would be counted
            sync(self.device)
        if name == "read" and self._last != "read":
            self._next_step()
        if self._counter is not None:
            self._counter.paused = name == "read"
        start, cpu = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            if self._counter is not None:
                self._counter.paused = False
            if not self.count_syncs:
                sync(self.device)
            self.cpu_end = time.thread_time()  # before the wall clock: a wait inside this call stays in the phase
            self.end = time.perf_counter()
            self.steps[-1][name] = self.steps[-1].get(name, 0.0) + self.end - start
            self.cpu[-1][name] = self.cpu[-1].get(name, 0.0) + self.cpu_end - cpu
            self._last = name

    def close(self) -> None:
        """Stop counting (the last step's syncs are kept) and leave the sync debug mode."""
        if self.steps:
            self._stop_counting()
        if self._warnings is not None:
            torch.cuda.set_sync_debug_mode(0)
            self._warnings.close()
            self._warnings = None

    def walls(self) -> list[float]:
        """Each step's wall time: from its start to the next step's (the last: to the end of its last phase)."""
        return [b - a for a, b in zip(self.starts, [*self.starts[1:], self.end], strict=True)]

    def cpu_walls(self) -> list[float]:
        """Each step's CPU time on the training thread, from its start to the next step's."""
        return [b - a for a, b in zip(self.cpu_starts, [*self.cpu_starts[1:], self.cpu_end], strict=True)]


class OpsClock(StepClock):
    """Counts each step's host operations with torch.profiler (CPU activity): the ``aten::*`` operator calls the
    training thread makes and every profiler event, per step from one ``read`` to the next, for the steps after the
    first `skip` (their compiles done). Unlike :class:`SyncCounter` it changes nothing dynamo guards on, so a compiled
    step is counted as it runs: operators inside generated kernels are not host operations and are not counted. Call
    :meth:`close` after the run (the last step, which checkpoints, is left out of :attr:`counts`)."""

    def __init__(self, skip: int) -> None:
        self.skip, self.seen = skip, 0
        self.counts: list[dict[str, int]] = []  # per counted step: aten_ops, events
        self._prof: Any = None
        self._last = ""

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name == "read" and self._last != "read":
            self._stop()
            self.seen += 1
            if self.seen > self.skip:
                from torch.profiler import ProfilerActivity, profile

                self._prof = profile(activities=[ProfilerActivity.CPU])
                self._prof.__enter__()
        self._last = name
        yield

    def _stop(self) -> None:
        if self._prof is not None:
            self._prof.__exit__(None, None, None)
            events = self._prof.key_averages()
            self.counts.append({"aten_ops": sum(e.count for e in events if e.key.startswith("aten::")),
                                "events": sum(e.count for e in events)})
            self._prof = None

    def close(self) -> None:
        self._stop()
        self.counts = self.counts[:-1]


def summarize(clock: PhaseClock, plain: list[int]) -> dict[str, Any]:
    """The phase breakdown of steps `plain` (indices into the clock's steps): the median ms of each phase and of
    the step, the sum of the phases over the step (``coverage``: 1.0 when the phases cover the step; ``cpu_coverage``
    the same in the training thread's CPU time, which a loaded machine does not disturb), the model's
    compute and the fixed cost (medians of the per-step figures). ``phases_cpu_ms``: the CPU time of the training
    thread in each phase (median), the host's own work, which other processes on the machine slow much less than
    the wall time (torch's other intra-op threads are not in it)."""
    if not plain:
        raise ValueError("no step to summarise: give more timed steps than warm-up, logging and checkpoint steps")
    walls = clock.walls()
    names = [p for p in StepClock.PHASES if any(p in clock.steps[i] for i in plain)]
    ms = {p: 1e3 * statistics.median(clock.steps[i].get(p, 0.0) for i in plain) for p in names}
    cpu_ms = {p: 1e3 * statistics.median(clock.cpu[i].get(p, 0.0) for i in plain) for p in names}
    model = [sum(clock.steps[i].get(p, 0.0) for p in MODEL_PHASES) for i in plain]
    covered = sum(sum(clock.steps[i].values()) for i in plain)
    cpu_covered, cpu_walls = sum(sum(clock.cpu[i].values()) for i in plain), clock.cpu_walls()
    return {"phases_ms": ms, "phases_cpu_ms": cpu_ms, "step_ms": 1e3 * statistics.median(walls[i] for i in plain),
            "phase_sum_ms": sum(ms.values()), "coverage": covered / sum(walls[i] for i in plain),
            "cpu_coverage": cpu_covered / max(sum(cpu_walls[i] for i in plain), 1e-9),
            "model_ms": 1e3 * statistics.median(model),
            "fixed_ms": 1e3 * statistics.median(walls[i] - m for i, m in zip(plain, model, strict=True)),
            "steps": len(plain)}


def _logs(step: int, log_every: int, steps: int) -> bool:
    """Whether optimizer step `step` (1-based) logs (the trainer's rule: every log_every, the first and the last)."""
    return step % log_every == 0 or step in (1, steps)


def measure_step_phases(preset: str = "tiny_fast", overrides: Iterable[str] = (), *, steps: int = 30,
                        warmup: int = 5, device: str = "cpu", threads: int = 0, images: int = 512,
                        sync_steps: int = 4, data: str | Path | None = None, count_ops: bool = False,
                        ops_steps: int = 4) -> dict[str, Any]:
    """Train `preset` (with `overrides`) for `warmup` + `steps` steps on `images` embedded-data training images
    (synthesized in a temporary folder unless `data` names a data set) under a :class:`PhaseClock`, then
    `sync_steps` more in a fresh, uncompiled run that counts host synchronisations. Returns the JSON-ready report:
    :func:`summarize`'s figures of the timed steps that neither log nor checkpoint (and the logging steps' median
    step), and the syncs per step between logging steps and at them. With `count_ops`, a third run as the timed one
    (compiled as it is) counts the host operations of `ops_steps` steps after its warm-up (:class:`OpsClock`):
    ``host_ops``, the medians per step."""
    from mdc_core.config import load_preset
    from mdc_core.train import train
    from mdc_workbench.data import write_synthetic_dataset

    if steps < 1 or warmup < 0 or sync_steps < 2:
        raise ValueError(f"need steps >= 1, warmup >= 0, sync_steps >= 2; got {steps}, {warmup}, {sync_steps}")
    if threads > 0:
        torch.set_num_threads(threads)
    dev = torch.device(device)
    with tempfile.TemporaryDirectory(prefix="mdc_bench_step_") as tmp:
        cfg = load_preset(preset, list(overrides))
        if data is None:
            data = Path(tmp) / "data"
            write_synthetic_dataset(data, images, image_size=cfg.model.image_size, n_val=0, n_test=0, n_compgen=0,
                                    progress=False, workers=1)
        total = warmup + steps
        base = [*overrides, f"data.path={json.dumps(str(data))}", f'train.device="{device}"', "train.tensorboard=false"]
        cfg = load_preset(preset, [*base, f"train.steps={total}", f"train.ckpt_every={total}"])
        clock = PhaseClock(dev)
        try:
            train(cfg, Path(tmp) / "timed", progress=False, clock=clock)
        finally:
            clock.close()
        log_every = cfg.train.log_every
        plain = [i for i in range(warmup, total) if not _logs(i + 1, log_every, total)]
        logged = [i for i in range(warmup, total - 1) if _logs(i + 1, log_every, total)]
        report = {"preset": preset, "overrides": list(overrides), "device": str(dev), "batch": cfg.train.batch_size,
                  "grad_accum": cfg.train.grad_accum, "log_every": log_every, "warmup": warmup,
                  "threads": torch.get_num_threads(), **summarize(clock, plain),
                  "log_step_ms": 1e3 * statistics.median(clock.walls()[i] for i in logged) if logged else None}
        # the counting run is eager: SyncCounter is a TorchFunctionMode, and dynamo guards on the mode stack, so a
        # compiled step would recompile and break into pieces under it (seen on an H200: the recompile limit hit,
        # thousands of sync warnings per step) and the count would be of another program than the timed one;
        # CUDA graphs add no host synchronisation, so the eager step's count is the compiled step's too
        counted = load_preset(preset, [*base, f"train.steps={sync_steps}", f"train.ckpt_every={sync_steps}",
                                       f"train.log_every={sync_steps + 1}", "train.compile=false",
                                       "train.compile_step=false"])
        clock = PhaseClock(dev, count_syncs=True)
        try:
            train(counted, Path(tmp) / "counted", progress=False, clock=clock)
        finally:
            clock.close()
        if count_ops:
            report["host_ops"] = count_host_ops(preset, base, warmup, ops_steps, Path(tmp) / "ops")
    between = [clock.syncs[i] for i in range(1, sync_steps - 1)]  # step 1 and the last one log
    report["syncs_per_step"] = {"between_log_steps": max(len(s) for s in between),
                                "log_steps": max(len(clock.syncs[0]), len(clock.syncs[-1]))}
    report["sync_calls"] = {"between_log_steps": sorted({c for s in between for c in s})[:10],
                            "log_steps": sorted(set(clock.syncs[-1]))[:10]}
    return report


def count_host_ops(preset: str, overrides: list[str], warmup: int, steps: int, out: Path) -> dict[str, Any]:
    """Host operations per step of `preset` (with `overrides`) trained for `warmup` + `steps` + 1 steps into `out`:
    the medians over the `steps` steps after the warm-up (the last, which checkpoints, is not counted)."""
    from mdc_core.config import load_preset
    from mdc_core.train import train

    total = warmup + steps + 1
    cfg = load_preset(preset, [*overrides, f"train.steps={total}", f"train.ckpt_every={total}",
                               f"train.log_every={total + 1}"])
    clock = OpsClock(skip=warmup)
    try:
        train(cfg, out, progress=False, clock=clock)
    finally:
        clock.close()
    return {"aten_ops_per_step": statistics.median(c["aten_ops"] for c in clock.counts),
            "events_per_step": statistics.median(c["events"] for c in clock.counts), "steps": len(clock.counts),
            "compile": str(cfg.train.compile), "compile_step": cfg.train.compile_step}


def format_phases(report: dict[str, Any]) -> str:
    """The report of :func:`measure_step_phases` as a table."""
    step = report["step_ms"]
    rows = [f"step phases: {report['preset']} {' '.join(report['overrides'])} on {report['device']}, batch "
            f"{report['batch']} x {report['grad_accum']}, {report['threads']} threads; medians of {report['steps']} "
            "steps that neither log nor checkpoint", "",
            f"{'phase':<18}{'ms/step':>10}{'share':>8}{'thread CPU ms':>15}"]
    for name, ms in report["phases_ms"].items():
        rows.append(f"{name:<18}{ms:>10.2f}{ms / step:>8.1%}{report['phases_cpu_ms'][name]:>15.2f}")
    syncs = report["syncs_per_step"]
    rows += [f"{'sum of phases':<18}{report['phase_sum_ms']:>10.2f}{report['phase_sum_ms'] / step:>8.1%}",
             f"{'step (wall)':<18}{step:>10.2f}", "",
             f"model compute (forward_backward + clip_optimizer + ema): {report['model_ms']:.2f} ms; fixed cost "
             f"(step - model compute): {report['fixed_ms']:.2f} ms; phases cover {report['coverage']:.1%} of the steps",
             f"logging step: {report['log_step_ms']:.2f} ms" if report.get("log_step_ms") else "logging step: -",
             f"host synchronisations per step: {syncs['between_log_steps']} between logging steps, "
             f"{syncs['log_steps']} at a logging/checkpoint step"]
    rows += [f"  between: {c}" for c in report["sync_calls"]["between_log_steps"]]
    if report.get("host_ops"):
        ops = report["host_ops"]
        rows.append(f"host operations per step (torch.profiler, median of {ops['steps']} steps after the warm-up, "
                    f"compile={ops['compile']}, compile_step={ops['compile_step']}): {ops['aten_ops_per_step']:g} aten "
                    f"ops, {ops['events_per_step']:g} profiler events")
    return "\n".join(rows)
