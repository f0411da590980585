"""What a checkpoint's ``state.pt`` holds: the one home of the training state's keys.

A checkpoint is the model's weights (``model.safetensors``, ``ema.safetensors``: :mod:`mdc_core.checkpoint`) and
:class:`TrainState`: the optimizer, the schedule and the RNG states, the data position and the run's counters.
:meth:`TrainState.state_dict` is the only writer of ``state.pt``'s keys and :meth:`TrainState.from_state_dict`
their only reader, so :mod:`mdc_core.train` (saving and resuming) and :mod:`mdc_core.run_start` (a weights-only
resume, rebuilt from the logs) spell none of them. The keys on disk are those of every earlier checkpoint; keys an
older or partial ``state.pt`` lacks take the defaults below.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


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
    """Everything a resume needs besides the weights. `optimizer`, `scheduler` and `rng` are None where they are
    lost (a weights-only resume: :func:`mdc_core.run_start.weights_only_state`)."""

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


FULL_RESUME = ("optimizer", "scheduler")  # what a full resume loads besides the counters (the RNG state is optional)


def resume_problem(state: Any, step: int) -> str:
    """What keeps a ``state.pt`` dict from resuming checkpoint step `step` exactly ('' when nothing does): it does
    not read (:meth:`TrainState.from_state_dict`), lacks the optimizer or the schedule (a resume would restart
    AdamW's moments: that is a weights-only resume, said as such), or holds another step's state."""
    try:
        train_state = TrainState.from_state_dict(state)
    except ValueError as err:
        return str(err)
    lacking = [name for name in FULL_RESUME if not isinstance(state.get(name), dict)]
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
