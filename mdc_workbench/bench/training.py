"""Training-step benchmark: samples/s, peak memory and model FLOPs of one optimizer step, one fresh process each.

Every row of :data:`TRAIN_SPECS` is measured in its own ``python -m mdc_workbench.bench.training`` child so that
its peak memory is its own: the peak resident set (``ru_maxrss``) on CPU, ``torch.cuda.max_memory_allocated``
on CUDA. A step is what :mod:`mdc_core.train` does: the batch prepared on the host and copied without blocking
(:class:`mdc_core.loss_step.HostBatches`), forward, loss, backward, AdamW update (fused on CUDA), ``zero_grad``
(bf16 autocast on GPUs with bf16, fp32 elsewhere), gradient-norm clipping. Our rows run the trainer's own
:class:`mdc_core.loss_step.LossStep`, so a compiled row compiles as ``train.compile=<mode>`` does (with the run's
``train.static_shapes``) and its warm-up time, compilation included, is reported as ``compile_s``. The model FLOPs
of a step (forward + backward, optimizer excluded) are counted once by ``torch.utils.flop_counter.FlopCounterMode``
on the eager, unpadded step: padding terms are not useful work, so MFU counts only the loss terms that train.
A row that runs past ``timeout_s`` (a compile that never finishes) is reported as an error naming it.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mdc_core.config import RunConfig, TrainConfig
from mdc_core.distributed import sync
from mdc_core.loss_step import LossStep, WholeStep
from mdc_core.model import Captioner
from mdc_core.objectives import objective_spec, trim_padding
from mdc_core.sampler import bf16_enabled
from mdc_core.train import build_optimizer


@dataclass(frozen=True)
class TrainSpec:
    """One row of the training benchmark."""

    implementation: str  # "ours" (mdc_core.model.Captioner + mdc_core.objectives) | "coca" (open_clip CoCa)
    objective: str = "mdc"  # ours: objective name
    output_vocab: str = ""  # ours: "" = the preset's, "full" = the 49408-way head (CoCa's)
    compile: str = ""  # ours: train.compile's mode ("" = eager, whatever the preset says): as the trainer compiles
    static: str = ""  # ours: train.static_shapes ("" = the preset's: auto = padded when compiling)
    whole: bool = False  # ours: train.compile_step (forward to the AdamW update in one compiled region, compile's mode)
    coca_layout: str = "depth_matched"  # coca: mdc_workbench.bench.coca.COCA_LAYOUTS
    note: str = ""


TRAIN_SPECS: dict[str, TrainSpec] = {
    "mdc": TrainSpec("ours", "mdc", note="the preset as it trains"),
    "mdc_full_vocab": TrainSpec("ours", "mdc", output_vocab="full", note="49408-way head, as CoCa"),
    "mdc_compiled": TrainSpec("ours", "mdc", compile="default", note="train.compile=true, static shapes (padded)"),
    "mdc_graphs": TrainSpec("ours", "mdc", compile="reduce-overhead",
                            note="train.compile=reduce-overhead: CUDA graphs on CUDA, static shapes (padded)"),
    "mdc_whole": TrainSpec("ours", "mdc", compile="reduce-overhead", whole=True,
                           note="train.compile_step=true: forward to AdamW one compiled region (CUDA graphs on CUDA)"),
    "mdc_graphs_dense": TrainSpec("ours", "mdc", compile="reduce-overhead", static="dense",
                                  note="as mdc_graphs, logits at every position (static_shapes=dense)"),
    "arc": TrainSpec("ours", "arc", note="same decoder, causal, teacher forcing"),
    "arc_graphs": TrainSpec("ours", "arc", compile="reduce-overhead", note="ARC, train.compile=reduce-overhead"),
    "coca": TrainSpec("coca", coca_layout="depth_matched", note="open_clip CoCa, unimodal + multimodal = depth"),
    "coca_open_clip_layout": TrainSpec("coca", coca_layout="open_clip",
                                       note="open_clip CoCa, unimodal = multimodal = depth"),
}


def build_step_model(spec: TrainSpec, cfg: RunConfig, output_ids: torch.Tensor | None, device: torch.device
                     ) -> tuple[torch.nn.Module, Callable[..., torch.Tensor]]:
    """(model on `device`, loss_fn(images, tokens, seed) -> scalar) for one row of :data:`TRAIN_SPECS`: images on
    the device, tokens (B, L) on the host, prepared for the step there as the trainer does (our rows: the trainer's
    :class:`~mdc_core.loss_step.LossStep`, bf16 autocast inside it on CUDA; CoCa: the caller's autocast)."""
    if spec.implementation == "coca":
        from .coca import CocaCaptionLoss, build_coca

        model = build_coca(cfg.model, spec.coca_layout).to(device)
        loss = CocaCaptionLoss()
        return model, lambda images, tokens, seed: loss(model, images,
                                                        trim_padding(tokens).to(device, non_blocking=True))
    mcfg = RunConfig.from_dict(cfg.to_dict()).model
    if spec.output_vocab == "full":
        mcfg.output_vocab, mcfg.output_vocab_size, output_ids = "full", 0, None
    model = Captioner(mcfg, causal=objective_spec(spec.objective).causal, output_ids=output_ids).to(device)
    objective = dataclasses.replace(cfg.objective, name=spec.objective)
    train = dataclasses.replace(cfg.train, compile=spec.compile or False,
                                static_shapes=spec.static or cfg.train.static_shapes, compile_step=spec.whole)
    loss_step = LossStep(model, objective, train, device, bf16_enabled(cfg.train.precision, device))

    def loss_fn(images: torch.Tensor, tokens: torch.Tensor, seed: int) -> torch.Tensor:
        return loss_step(images, tokens, seed)[0]

    loss_fn.loss_step = loss_step  # type: ignore[attr-defined]  # what a whole-step row compiles (_whole_step)
    return model, loss_fn


def count_step_flops(loss_fn: Callable[..., torch.Tensor], images: torch.Tensor, tokens: torch.Tensor,
                     seed: int = 1) -> int:
    """Model FLOPs of one forward + backward (matmuls, convolutions and attention, as FlopCounterMode counts)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        loss_fn(images, tokens, seed).backward()
    return int(counter.get_total_flops())


def _status_mib(field: str) -> float | None:
    """A memory field of /proc/self/status (VmRSS, VmHWM) in MiB; None where there is no /proc."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def reset_peak_rss() -> bool:
    """Reset this process's peak resident set (Linux: write 5 to /proc/self/clear_refs); False if impossible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss_mib(was_reset: bool) -> float:
    """Peak resident set in MiB since :func:`reset_peak_rss` (or since the process started)."""
    hwm = _status_mib("VmHWM") if was_reset else None
    return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _optimizer_step(loss_fn: Callable[..., torch.Tensor], model: torch.nn.Module, opt: torch.optim.Optimizer,
                    images: torch.Tensor, tokens: torch.Tensor, seeds: itertools.count, autocast: bool
                    ) -> Callable[[], None]:
    """One optimizer step as :mod:`mdc_core.train` takes it: loss, backward, gradient-norm clipping, AdamW,
    zero_grad (our rows autocast inside :class:`~mdc_core.loss_step.LossStep`; CoCa's under `autocast`)."""
    dev = images.device

    def step() -> None:
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
            loss = loss_fn(images, tokens, next(seeds))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _whole_step(loss_step: LossStep, opt: torch.optim.Optimizer, tcfg: TrainConfig, images: torch.Tensor,
                tokens: torch.Tensor, seeds: itertools.count) -> Callable[[], None]:
    """The same step with train.compile_step: forward to the AdamW update in one compiled region (no EMA, as the
    other rows)."""
    whole = WholeStep(loss_step, opt, None, tcfg)

    def step() -> None:
        whole(images, loss_step.prepare(tokens, next(seeds)), 1.0)

    return step


def measure_train_step(name: str, payload: dict[str, Any], *, steps: int, warmup: int, device: str,
                       threads: int, count_ops: bool = False) -> dict[str, Any]:
    """Run `warmup` + `steps` optimizer steps of row `name` on the payload's fixed batch; return its figures.

    Meant to run in a fresh process (:func:`run_train_bench` arranges that): the peak memory is the process's.
    """
    from mdc_core.train import param_groups

    if threads > 0:
        torch.set_num_threads(threads)
    spec = TRAIN_SPECS[name]
    cfg = RunConfig.from_dict(payload["run_config"])
    dev = torch.device(device)
    torch.manual_seed(0)
    model, loss_fn = build_step_model(spec, cfg, payload["output_ids"], dev)
    model.train()
    images, tokens = payload["images"].to(dev), payload["tokens"]  # tokens stay on the host, as in training
    tcfg = dataclasses.replace(cfg.train, compile_step=spec.whole)  # a whole step's lr: a tensor
    opt = build_optimizer(param_groups(model, cfg.train.weight_decay), tcfg, dev)
    bf16 = bf16_enabled(cfg.train.precision, dev)
    seeds = itertools.count(1)  # new masks every step, as in training

    take_step = _whole_step(loss_fn.loss_step, opt, tcfg, images, tokens, seeds) if spec.whole else \
        _optimizer_step(loss_fn, model, opt, images, tokens, seeds, bf16 and spec.implementation == "coca")

    rss_before = _status_mib("VmRSS") or 0.0
    start = time.perf_counter()
    for _ in range(warmup):  # torch.compile compiles here; its memory is not part of the step's peak
        take_step()
    sync(dev)
    warmup_s = time.perf_counter() - start
    was_reset = reset_peak_rss()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        take_step()
        sync(dev)
        times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    host_ops = _count_ops(take_step, dev) if count_ops else None
    if dev.type == "cuda":
        peak = {"peak_mem_mib": torch.cuda.max_memory_allocated(dev) / 2**20, "memory": "cuda max allocated"}
    else:
        rss_peak = peak_rss_mib(was_reset)
        peak = {"peak_mem_mib": rss_peak - rss_before, "peak_rss_mib": rss_peak,
                "memory": "peak RSS during the timed steps minus RSS before the first step"}
    if spec.compile or spec.static:  # count the FLOPs of the same computation, eagerly and unpadded
        eager = dataclasses.replace(spec, compile="", static="off", whole=False)
        model, loss_fn = build_step_model(eager, cfg, payload["output_ids"], dev)
        model.train()
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16 and spec.implementation == "coca"):
        flops = count_step_flops(loss_fn, images, tokens)
    batch = images.shape[0]
    return {"name": name, "note": spec.note, "batch": batch, "step_s": step_s, "samples_per_s": batch / step_s,
            "step_s_all": times, "warmup_s": warmup_s, "compile_s": warmup_s if spec.compile else None,
            "host_ops": host_ops,
            "flops_per_step": flops,
            "params": sum(p.numel() for p in model.parameters()), "threads": torch.get_num_threads(), **peak}


def _count_ops(take_step: Callable[[], None], dev: torch.device, steps: int = 2) -> dict[str, float]:
    """Host operations per optimizer step, counted by torch.profiler over `steps` more calls of the warm `take_step` (a
    compiled row's graphs are compiled and recorded already): operator calls (``aten::*``) and all CPU events.
    Every one is host work that a small model's step waits for: the figure CUDA graphs and fusion cut."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            take_step()
        sync(dev)
    events = prof.key_averages()
    return {"aten_ops_per_step": sum(e.count for e in events if e.key.startswith("aten::")) / steps,
            "events_per_step": sum(e.count for e in events) / steps}


def run_train_bench(names: list[str], payload_path: Path, *, steps: int, warmup: int, device: str, threads: int,
                    isolate: bool = True, timeout_s: float = 1800, count_ops: bool = False
                    ) -> dict[str, dict[str, Any]]:
    """Measure each row in its own fresh process; a row that fails is reported with its error, not dropped.

    ``isolate=False`` measures in this process instead (seconds faster per row; the peak memory is then only
    approximate, as memory freed by an earlier row may be reused without raising the resident set)."""
    results: dict[str, dict[str, Any]] = {}
    if not isolate:
        payload = torch.load(payload_path, weights_only=True)
        for name in names:
            results[name] = measure_train_step(name, payload, steps=steps, warmup=warmup, device=device,
                                               threads=threads, count_ops=count_ops)
            results[name]["memory"] += " (in-process: approximate)"
        return results
    for name in names:
        args = json.dumps({"name": name, "payload": str(payload_path), "steps": steps, "warmup": warmup,
                           "device": device, "threads": threads, "count_ops": count_ops})
        try:
            proc = subprocess.run([sys.executable, "-m", "mdc_workbench.bench.training", args], capture_output=True,
                                  text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            results[name] = {"name": name, "error": f"row {name!r} timed out after {timeout_s:.0f} s (its compile, "
                             f"{warmup} warm-up and {steps} timed steps); lower --steps or drop the row"}
            continue
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            results[name] = {"name": name, "error": " | ".join(tail) or f"exit status {proc.returncode}"}
            continue
        results[name] = json.loads(lines[-1])
    return results


def _profiled_steps(payload: dict[str, Any], name: str, steps: int, device: str):
    """A torch.profiler over `steps` optimizer steps of row `name` in the training precision (one warm-up first)."""
    from torch.profiler import ProfilerActivity, profile

    from mdc_core.train import param_groups

    cfg = RunConfig.from_dict(payload["run_config"])
    dev = torch.device(device)
    torch.manual_seed(0)
    spec = TRAIN_SPECS[name]
    model, loss_fn = build_step_model(spec, cfg, payload["output_ids"], dev)
    model.train()
    images, tokens = payload["images"].to(dev), payload["tokens"]
    opt = build_optimizer(param_groups(model, cfg.train.weight_decay), cfg.train, dev)
    take_step = _optimizer_step(loss_fn, model, opt, images, tokens, itertools.count(1),
                                bf16_enabled(cfg.train.precision, dev) and spec.implementation == "coca")
    take_step()
    take_step()  # warm-up (a compiled row compiles, CUDA graphs record)
    sync(dev)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            take_step()
        sync(dev)
    return prof


def profile_train_step(payload: dict[str, Any], *, name: str = "mdc", steps: int = 3, rows: int = 15,
                       device: str = "cpu") -> str:
    """torch.profiler table (top `rows` ops by self device time on CUDA, self CPU time elsewhere) of `steps`
    optimizer steps of row `name`, in the training precision (bf16 autocast on CUDA), as the trainer runs it."""
    prof = _profiled_steps(payload, name, steps, device)
    sort = "self_cuda_time_total" if torch.device(device).type == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=sort, row_limit=rows, max_name_column_width=40)


def _child_main(argv: list[str]) -> None:
    args = json.loads(argv[0])
    payload = torch.load(args["payload"], weights_only=True)
    result = measure_train_step(args["name"], payload, steps=args["steps"], warmup=args["warmup"],
                                device=args["device"], threads=args["threads"], count_ops=args.get("count_ops", False))
    print(json.dumps(result))


if __name__ == "__main__":
    _child_main(sys.argv[1:])
