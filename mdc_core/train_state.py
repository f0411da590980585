"""What a checkpoint's ``state.pt`` holds: the one home of the training state's keys.

A checkpoint is the model's weights (``model.safetensors``, ``ema.safetensors``: :mod:`mdc_core.checkpoint`) and
:class:`TrainState`: the optimizer, the schedule and the RNG states, the data position and the run's counters.
:meth:`TrainState.state_dict` is the only writer of ``state.pt``'s keys and :meth:`TrainState.from_state_dict`
their only reader, so :mod:`mdc_core.train` (saving and resuming) and :mod:`mdc_core.resume` (a weights-only
resume, rebuilt from the logs) spell none of them. The keys on disk are those of every earlier checkpoint; keys an
older or partial ``state.pt`` lacks take the defaults below.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


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
    lost (a weights-only resume: :func:`mdc_core.resume.weights_only_state`)."""

    counters: Counters = field(default_factory=Counters)
    epoch: int = 0  # the data position: the epoch being read ...
    batch_in_epoch: int = 0  # ... and the micro-batches of it read so far (per rank)
    world: int = 1  # ranks that trained it (a resume on another number of ranks rescales batch_in_epoch)
    global_batch: int = 0  # batch_size x world x grad_accum (0: not recorded)
    ema_n_averaged: int = 1  # updates the EMA has averaged (0: trained without EMA)
    optimizer: dict[str, Any] | None = None  # torch.optim.AdamW.state_dict()
    scheduler: dict[str, Any] | None = None  # torch.optim.lr_scheduler.LambdaLR.state_dict()
    rng: dict[str, Any] | None = None  # mdc_core.checkpoint.rng_state()

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
        """Read a ``state.pt`` dict; a key it lacks (an older checkpoint) takes its default. ``ValueError`` when it
        has no step."""
        if "step" not in state:
            raise ValueError(f"train state without a 'step' (keys: {', '.join(sorted(state)) or 'none'})")
        counters = Counters(int(state["step"]), int(state.get("truncated", 0)), int(state.get("nonfinite_skipped", 0)),
                            Counter(state.get("skipped", {})), Counter(state.get("skipped_epoch", {})))
        return cls(counters, int(state.get("epoch", 0)), int(state.get("batch_in_epoch", 0)),
                   int(state.get("world", 1)), int(state.get("global_batch", 0)), int(state.get("ema_n_averaged", 1)),
                   state.get("optimizer"), state.get("scheduler"), state.get("rng"))
