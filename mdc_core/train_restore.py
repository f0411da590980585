"""Where a resumed run picks up: :func:`restore` loads a checkpoint's training state (what
:class:`~mdc_core.train_state.TrainState` holds) into the trainer's optimizer, schedule and EMA, sets the RNG
states, and cuts the run's logs back to the checkpoint's step. The weights themselves are the model's
(:func:`mdc_core.checkpoint.load_model`); which checkpoint to resume is :func:`mdc_core.run_start.prepare_run`'s call.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
from torch.optim.swa_utils import AveragedModel

from . import checkpoint as ckpt_io
from . import distributed as dist
from . import run_start
from .train_state import Counters, TrainState, set_rng_state
from .weights import load_weights


def restore(ckpt: Path, out: Path, ctx: dist.DistContext, opt: torch.optim.Optimizer,
            sched: torch.optim.lr_scheduler.LRScheduler, ema: AveragedModel | None, grad_accum: int,
            state_problem: str = "") -> tuple[Counters, int, int]:
    """Load optimizer, schedule, EMA, RNG and counters from checkpoint `ckpt` of run `out`; return the counters and
    the data position (epoch, batch in epoch, rescaled when the run resumes on another number of ranks). With
    `state_problem` (its state.pt is missing or damaged) only what the logs give back (weights only)."""
    if state_problem:
        step = json.loads((ckpt / "meta.json").read_text())["step"]
        state = run_start.weights_only_state(out, step, grad_accum)
        run_start.set_schedule_step(sched, step)
    else:
        state = TrainState.from_state_dict(ckpt_io.load_train_state(ckpt))
        opt.load_state_dict(state.optimizer)
        sched.load_state_dict(state.scheduler)
    if ema is not None and (ckpt / "ema.safetensors").is_file():
        ema.module.load_state_dict(load_weights(ckpt / "ema.safetensors"))
        ema.n_averaged.fill_(state.ema_n_averaged)
    if state.rng is not None:
        set_rng_state(state.rng)
    batch_in_epoch = state.batch_in_epoch
    if state.world != ctx.world:  # the same number of samples of this epoch, but not the same samples
        batch_in_epoch = batch_in_epoch * state.world // ctx.world
        warnings.warn(f"resuming a {state.world}-rank run on {ctx.world} ranks: the global batch and the data order "
                      "of the current epoch change; metrics will not match an uninterrupted run", stacklevel=3)
    if ctx.is_main:
        ckpt_io.truncate_jsonl(out / "metrics.jsonl", state.step)
        ckpt_io.truncate_jsonl(out / "epochs.jsonl", state.step)
    return state.counters, state.epoch, batch_in_epoch
