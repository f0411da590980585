"""What a training run records about itself: ``metrics.jsonl``, ``epochs.jsonl``, the progress bar and the run's
hooks (:class:`RunHook`: a logger beside metrics.jsonl, such as the workbench's TensorBoard writer), and the counts
it sums over ranks (samples read, captions truncated, corrupt records skipped).

:meth:`RunLog.read` is where the host waits for the device: the step's loss, metrics, gradient norm and the
non-finite watch, with the counts since the last read, summed over ranks in one collective. The trainer
(:mod:`mdc_core.train`) calls it at logging and checkpoint steps only (every step with ``train.nonfinite=skip``).
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Protocol

import torch
from tqdm.auto import tqdm

from . import distributed as dist
from .config import ConfigError, RunConfig
from .data import SKIP_REASONS
from .objectives import logged_accuracy
from .step_parts import DeviceStep, NonFiniteWatch
from .train_state import Counters

HOOK_GROUP = "mdc_core.run_hooks"  # entry points: name -> a RunHook factory; train.tensorboard=true asks for
# the one named "tensorboard" (the workbench's, pyproject.toml)


class RunHook(Protocol):
    """What rank 0 tells a logger beside ``metrics.jsonl``. A factory ``(run_dir, start_step, cfg) -> RunHook`` is
    called once the run knows its start step (a resumed run's hook drops what it logged past that step)."""

    def record(self, record: dict[str, Any]) -> None:
        """Each ``metrics.jsonl`` record, once written."""

    def checkpoint(self, step: int, model: torch.nn.Module) -> None:
        """After each checkpoint but the one a stop request writes (the model is the trained one, in train mode; a
        hook that evaluates it leaves it and the random states as it found them)."""

    def close(self) -> None:
        """The run's end (also when it fails)."""


HookFactory = Callable[[Path, int, RunConfig], RunHook]


def config_hooks(cfg: RunConfig) -> list[HookFactory]:
    """The hooks the run's config asks for: ``train.tensorboard=true`` -> the factory installed under the name
    ``tensorboard`` in :data:`HOOK_GROUP`; ``ConfigError`` when none is."""
    if not cfg.train.tensorboard:
        return []
    found = [ep for ep in entry_points(group=HOOK_GROUP) if ep.name == "tensorboard"]
    if not found:
        raise ConfigError(f"train.tensorboard=true, but no run hook named 'tensorboard' is installed (entry point "
                          f"group {HOOK_GROUP}): install the workbench, pip install -e '.[tensorboard]'")
    return [found[0].load()]


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


def diverged(what: str, why: str, last_ckpt: Path | None) -> TrainingDiverged:
    """The error that stops a run without saving: what happened, why it stops, where its last good checkpoint is."""
    where = f"last good checkpoint: {last_ckpt}" if last_ckpt else "no checkpoint was written yet"
    return TrainingDiverged(f"{what}; stopping without saving ({why}). {where}. Try a lower train.lr or "
                            "train.grad_clip=1.0")


@dataclass
class StepStats:
    """One optimizer step as logged: each value reduced over ranks (:func:`mdc_core.distributed.all_reduce_named`)."""

    loss: float  # the step's loss, normalised by the global count of loss terms
    metrics: dict[str, float]  # compute_loss's other metrics, mean over micro-batches and ranks
    samples: float  # captions read by all ranks since the last read
    truncated: int  # captions cut to the context length, all ranks, since the last read
    grad_norm: float  # global gradient norm before clipping
    diverged: bool = False  # some step since the last read was not finite (train.nonfinite=stop's watch)

    @property
    def finite(self) -> bool:
        return math.isfinite(self.loss) and math.isfinite(self.grad_norm)


class RunLog:
    """The run's records and counts; rank 0 writes the files. `counters` are the run's (updated in place)."""

    def __init__(self, cfg: RunConfig, out: Path, ctx: dist.DistContext, counters: Counters, progress: bool,
                 how: str = "", hooks: Sequence[HookFactory] = ()) -> None:
        tcfg = cfg.train
        self.cfg, self.out, self.ctx, self.n, self.progress, self.main = cfg, out, ctx, counters, progress, ctx.is_main
        self.global_batch = tcfg.batch_size * ctx.world * tcfg.grad_accum
        if self.main and progress:
            tqdm.write(f"global batch {self.global_batch} = {tcfg.batch_size} per device x {ctx.world} devices "
                       f"({ctx.device.type}) x {tcfg.grad_accum} accumulation; step: {how}")
        self.hooks: list[RunHook] = []
        for make in [*hooks, *config_hooks(cfg)] if self.main else []:
            self.hooks.append(make(out, counters.step, cfg))
        self.pending_samples, self.pending_truncated = 0.0, 0  # this rank's, since the last read
        self.bar = tqdm(total=tcfg.steps, initial=counters.step, desc=f"train {cfg.objective.name}", unit="step",
                        disable=not (progress and self.main))
        self.metrics_file = open(out / "metrics.jsonl", "a") if self.main else None  # noqa: SIM115 - closed by close
        self.window_start, self.window_samples = time.perf_counter(), 0.0

    def read(self, step: DeviceStep, watch: NonFiniteWatch, skipped: Counter[str]) -> StepStats:
        """The step's values and the counts since the last read, summed over ranks in one collective (the skipped
        records this rank met, `skipped`, in a second one; emptied)."""
        local = {"loss": step.loss_sum, "samples": self.pending_samples, "truncated": float(self.pending_truncated),
                 "nonfinite": watch.flag(), **{f"metric/{k}": v for k, v in step.metrics.items()}}
        total = dist.all_reduce_named(self.ctx, local, "step metrics")
        self.pending_samples, self.pending_truncated = 0.0, 0
        self.sum_skipped(skipped)
        self.n.truncated += int(total["truncated"])
        self.window_samples += total["samples"]
        metrics = {k.removeprefix("metric/"): v for k, v in total.items() if k.startswith("metric/")}
        return StepStats(total["loss"] / float(step.denom), metrics, total["samples"], int(total["truncated"]),
                         float(step.grad_norm), total["nonfinite"] > 0)

    def write(self, stats: StepStats, epoch: int, lr: float) -> None:
        """Rank 0 writes a metrics line for the step just taken."""
        if not self.main:
            return
        elapsed = time.perf_counter() - self.window_start
        record = {"step": self.n.step, "epoch": epoch, "lr": lr, "grad_norm": stats.grad_norm, "loss": stats.loss,
                  **stats.metrics, "global_batch": self.global_batch,
                  "samples_per_s": self.window_samples / max(elapsed, 1e-9), "skipped": sum(self.n.skipped.values()),
                  "truncated": self.n.truncated, "nonfinite_skipped": self.n.nonfinite_skipped}
        self.metrics_file.write(json.dumps(record) + "\n")
        self.metrics_file.flush()
        for hook in self.hooks:
            hook.record(record)
        accuracy = logged_accuracy(record)
        self.bar.set_postfix(loss=f"{stats.loss:.3f}", acc=f"{float('nan') if accuracy is None else accuracy[1]:.2f}")
        self.window_start, self.window_samples = time.perf_counter(), 0.0

    def skip_update(self, stats: StepStats, in_a_row: int, last_ckpt: Path | None) -> None:
        """Count a non-finite update dropped (train.nonfinite=skip), the `in_a_row`-th in a row; TrainingDiverged
        when that is more than train.max_skipped_steps."""
        what, most = f"loss became {stats.loss} (grad norm {stats.grad_norm}) at step {self.n.step}", \
            self.cfg.train.max_skipped_steps
        if in_a_row > most:
            raise diverged(what, f"train.nonfinite=skip, but {in_a_row} updates in a row were non-finite "
                           f"(train.max_skipped_steps={most})", last_ckpt)
        self.n.nonfinite_skipped += 1
        if self.main:
            tqdm.write(f"{what}; skipped this update (train.nonfinite=skip; {self.n.nonfinite_skipped} so far)")

    def sum_skipped(self, skipped: Counter[str]) -> None:
        """Add every rank's newly met skipped records (this rank's: `skipped`, emptied) to the run and epoch counts."""
        new = dist.all_reduce_named(self.ctx, {r: float(skipped[r]) for r in SKIP_REASONS}, "skipped-record counts")
        new = Counter({r: int(c) for r, c in new.items() if c})
        self.n.skipped.update(new)
        self.n.skipped_epoch.update(new)
        skipped.clear()

    def end_epoch(self, finished: int, skipped: Counter[str]) -> None:
        """Epoch `finished` was read to its end: its skipped records go to ``epochs.jsonl``."""
        self.sum_skipped(skipped)
        if self.main:
            with open(self.out / "epochs.jsonl", "a") as fh:
                fh.write(json.dumps({"epoch": finished, "step": self.n.step, "skipped": dict(self.n.skipped_epoch),
                                     "n_skipped": sum(self.n.skipped_epoch.values())}) + "\n")
            if self.n.skipped_epoch and self.progress:
                tqdm.write(f"epoch {finished}: skipped {dict(self.n.skipped_epoch)}")
        self.n.skipped_epoch.clear()

    def checkpoint(self, model: torch.nn.Module) -> None:
        """Tell the hooks a checkpoint was written (TensorBoard's val/* at the checkpoint cadence)."""
        for hook in self.hooks:
            hook.checkpoint(self.n.step, model)

    def close(self) -> None:
        self.bar.close()
        if self.metrics_file is not None:
            self.metrics_file.close()
        for hook in self.hooks:
            hook.close()
