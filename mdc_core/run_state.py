"""What a run knows about itself: its train state (a checkpoint's ``state.pt``) and its records (``metrics.jsonl``:
one record per logged step; ``epochs.jsonl``: one per epoch, with the corrupt records skipped, by reason).

**Train state.** :class:`TrainState` is everything a resume needs besides the weights (optimizer, schedule and RNG
states, the data position, the :class:`Counters`); :meth:`TrainState.state_dict` is the only writer of
``state.pt``'s keys and :meth:`TrainState.from_state_dict` their only reader (missing keys take the defaults).

**Records.** :class:`RunLog` writes them (rank 0) and keeps the counts summed over ranks. Its :meth:`~RunLog.read`
is where the host waits for the device: the step's loss, metrics, gradient norm and non-finite flag, summed over
ranks in one collective, at logging and checkpoint steps only. A hook (:class:`RunHook`) is a logger that rank 0
tells each record, each checkpoint and the end: ``train(..., hooks=[factory])`` passes one, and
``train.tensorboard=true`` loads the one installed as ``tensorboard`` in the entry-point group :data:`HOOK_GROUP`.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from tqdm.auto import tqdm

from . import distributed as dist
from .config import ConfigError, RunConfig
from .data import SKIP_REASONS

# the accuracy each loss logs, one name per meaning: masked (the masked objectives, D3PM's x_0), next (ARC), in-batch
# retrieval (CLIP); runs logged before the split call all three "acc_masked", which logged_accuracy still reads
ACCURACY_KEYS = {"acc_masked": "masked-token accuracy", "acc_next": "next-token accuracy",
                 "acc_retrieval": "retrieval accuracy"}


def logged_accuracy(record: dict[str, Any]) -> tuple[str, float] | None:
    """(what it measures, value) of the accuracy a metrics record carries (:data:`ACCURACY_KEYS`), or None."""
    key = next((k for k in ACCURACY_KEYS if k in record), None)
    return None if key is None else (ACCURACY_KEYS[key], float(record[key]))


# -- train state -------------------------------------------------------------------------------------------------------

@dataclass
class Counters:
    """The run's bookkeeping, all-rank totals (the same on every rank)."""

    step: int = 0  # optimizer steps taken
    truncated: int = 0  # captions cut to the context length
    nonfinite_skipped: int = 0  # updates skipped for a non-finite loss (train.nonfinite=skip)
    skipped: Counter[str] = field(default_factory=Counter)  # corrupt records skipped over the run, by reason
    skipped_epoch: Counter[str] = field(default_factory=Counter)  # ... in the current epoch


@dataclass
class TrainState:
    """Everything a resume needs besides the weights: what a checkpoint's ``state.pt`` holds. `optimizer`,
    `scheduler` and `rng` are None where they are lost (a weights-only resume:
    :func:`mdc_core.run_folder.weights_only_state`)."""

    counters: Counters = field(default_factory=Counters)
    epoch: int = 0  # the data position: the epoch being read ...
    batch_in_epoch: int = 0  # ... and the micro-batches of it read so far (per rank)
    world: int = 1  # ranks that trained it (a resume on another number of ranks rescales batch_in_epoch)
    global_batch: int = 0  # batch_size x world x grad_accum (0: not recorded)
    ema_n_averaged: int = 1  # updates the EMA has averaged (0: trained without EMA)
    optimizer: dict[str, Any] | None = None  # torch.optim.AdamW.state_dict()
    scheduler: dict[str, Any] | None = None  # torch.optim.lr_scheduler.LambdaLR.state_dict()
    rng: dict[str, Any] | None = None  # rng_state()

    @property
    def step(self) -> int:
        return self.counters.step

    def state_dict(self) -> dict[str, Any]:
        """The ``state.pt`` dict (plain types and tensors: it loads with ``torch.load(weights_only=True)``)."""
        n = self.counters
        lost = {"optimizer": self.optimizer, "scheduler": self.scheduler, "rng": self.rng}
        return {**{k: v for k, v in lost.items() if v is not None},
                "step": n.step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch, "world": self.world,
                "global_batch": self.global_batch, "skipped": dict(n.skipped), "skipped_epoch": dict(n.skipped_epoch),
                "truncated": n.truncated, "nonfinite_skipped": n.nonfinite_skipped,
                "ema_n_averaged": self.ema_n_averaged}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> TrainState:
        """Read a ``state.pt`` dict; a key it lacks (an older checkpoint) takes its default. ``ValueError`` (one line)
        when it is not a dict, has no step, or a counter is not a number."""
        if not isinstance(state, dict):
            raise ValueError(f"train state is a {type(state).__name__}, not a dict")
        if "step" not in state:
            raise ValueError(f"train state without a 'step' (keys: {', '.join(sorted(map(str, state))) or 'none'})")
        try:
            counters = Counters(int(state["step"]), int(state.get("truncated", 0)),
                                int(state.get("nonfinite_skipped", 0)), Counter(state.get("skipped", {})),
                                Counter(state.get("skipped_epoch", {})))
            return cls(counters, int(state.get("epoch", 0)), int(state.get("batch_in_epoch", 0)),
                       int(state.get("world", 1)), int(state.get("global_batch", 0)),
                       int(state.get("ema_n_averaged", 1)), state.get("optimizer"), state.get("scheduler"),
                       state.get("rng"))
        except (TypeError, ValueError, RuntimeError) as err:  # RuntimeError: int() of a tensor of several values
            raise ValueError(f"train state with a counter that is not a number ({err})") from None


def resume_problem(state: Any, step: int) -> str:
    """What keeps a ``state.pt`` dict from resuming checkpoint step `step` exactly ('' when nothing does): it does
    not read (:meth:`TrainState.from_state_dict`), lacks the optimizer or the schedule (a resume would restart
    AdamW's moments: that is a weights-only resume, said as such), or holds another step's state."""
    try:
        train_state = TrainState.from_state_dict(state)
    except ValueError as err:
        return str(err)
    lacking = [name for name in ("optimizer", "scheduler") if not isinstance(state.get(name), dict)]
    if lacking:
        return f"it holds no {' and no '.join(lacking)} state"
    if train_state.step != step:
        return f"it holds the train state of step {train_state.step}, not of step {step}"
    return ""


def rng_state() -> dict[str, Any]:
    """The torch, Python, NumPy and CUDA generator states (for ``state.pt``; loads with ``weights_only``)."""
    np_state = np.random.get_state()
    return {"torch": torch.get_rng_state(), "python": list(random.getstate()[1]),
            "python_version": random.getstate()[0],
            "numpy": [np_state[0], torch.from_numpy(np_state[1].copy()), *np_state[2:]],
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` saved."""
    torch.set_rng_state(state["torch"])
    random.setstate((state["python_version"], tuple(state["python"]), None))
    np_state = state["numpy"]
    np.random.set_state((np_state[0], np_state[1].numpy(), *np_state[2:]))
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# -- records -----------------------------------------------------------------------------------------------------------

HOOK_GROUP = "mdc_core.run_hooks"  # entry points: name -> a RunHook factory (train.tensorboard=true: "tensorboard")


class RunHook(Protocol):
    """What rank 0 tells a logger beside ``metrics.jsonl``. A factory ``(run_dir, start_step, cfg) -> RunHook`` is
    called once the run knows its start step (a resumed run's hook drops what it logged past that step)."""

    def record(self, record: dict[str, Any]) -> None:
        """Each ``metrics.jsonl`` record, once written."""

    def checkpoint(self, step: int, model: torch.nn.Module) -> None:
        """After each checkpoint but the one a stop request writes (`model` in train mode; a hook that evaluates it
        leaves it and the random states as it found them)."""

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
        self.hooks = [make(out, counters.step, cfg) for make in [*hooks, *config_hooks(cfg)]] if self.main else []
        self.pending_samples, self.pending_truncated = 0.0, 0  # this rank's, since the last read
        self.bar = tqdm(total=tcfg.steps, initial=counters.step, desc=f"train {cfg.objective.name}", unit="step",
                        disable=not (progress and self.main))
        self.metrics_file = open(out / "metrics.jsonl", "a") if self.main else None  # noqa: SIM115 - closed by close
        self.window_start, self.window_samples = time.perf_counter(), 0.0

    def read(self, step: Any, nonfinite: torch.Tensor, skipped: Counter[str]) -> StepStats:
        """The values of `step` (a :class:`~mdc_core.train.DeviceStep`), the `nonfinite` flag and the counts since
        the last read, summed over ranks in one collective (the skipped records this rank met, `skipped`, in a
        second one; emptied)."""
        local = {"loss": step.loss_sum, "samples": self.pending_samples, "truncated": float(self.pending_truncated),
                 "nonfinite": nonfinite, **{f"metric/{k}": v for k, v in step.metrics.items()}}
        total = dist.all_reduce_named(self.ctx, local, "step metrics")
        self.pending_samples, self.pending_truncated = 0.0, 0
        self.sum_skipped(skipped)
        self.n.truncated += int(total["truncated"])
        self.window_samples += total["samples"]
        metrics = {k.removeprefix("metric/"): v for k, v in total.items() if k.startswith("metric/")}
        return StepStats(total["loss"] / float(step.denom), metrics, total["samples"], int(total["truncated"]),
                         float(step.grad_norm), total["nonfinite"] > 0)

    def write(self, stats: StepStats, epoch: int, lr: float) -> None:
        """Rank 0 writes a metrics line for the step just taken and tells the hooks."""
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


def logged_step(record: Any) -> int | None:
    """The step of a ``metrics.jsonl``/``epochs.jsonl`` record; None when it is not a JSON object with an integer
    ``step`` (a damaged line: ``null``, a list, ``"step": "abc"``)."""
    return count(record.get("step"), None) if isinstance(record, dict) else None


def read_jsonl(path: Path, step: float, keys: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The records of `path` logged at or before `step`; a line that is not a JSON object with an integer step
    (and integer `keys`) is left out, as is a line cut off by a kill."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):  # cut off by a kill, or nested deeper than the stack: not a record
            continue
        logged = logged_step(record)
        if logged is not None and logged <= step and all(count(record.get(k), None) is not None for k in keys):
            records.append(record)
    return records


def count(value: Any, default: int | None = 0) -> int | None:
    """`value` when it is an integer (a logged counter), else `default`."""
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def logged_loss(out: Path, step: int) -> float:
    """The last loss ``metrics.jsonl`` logged at or before `step` (NaN: none), for a call that trained no step."""
    records = read_jsonl(out / "metrics.jsonl", step)
    loss = records[-1].get("loss") if records else None
    return float(loss) if isinstance(loss, (int, float)) and not isinstance(loss, bool) else math.nan
