"""The training loop: AdamW, warm-up + cosine, accumulation, clipping, EMA, bf16 on CUDA, DDP, atomic checkpoints.

``train(cfg, out)`` runs a :class:`RunConfig` into the run folder `out` (layout in :mod:`mdc_core.checkpoint`).
Under ``torchrun`` it runs DistributedDataParallel (NCCL on CUDA, gloo on CPU; :mod:`mdc_core.distributed`):
each rank reads its own shards, the global batch is ``batch_size x world x grad_accum``, only rank 0 writes.

Exactness. The loss of a step is normalised by the GLOBAL count of its loss terms (:func:`loss_denominator`
summed over micro-batches and ranks), and every random draw of micro-batch ``a`` on rank ``r`` is seeded by
``(seed, step, a * world + r)``; with the data split of :mod:`mdc_core.data.loaders` this makes ``world`` ranks
with accumulation A compute the same updates as one process with ``world x`` the workers and accumulation
``world * A`` (up to floating-point summation order), and makes accumulation equal to one bigger batch.

A resumed run restores model, optimizer, scheduler, EMA, RNG states, counters and the data position (epoch, batches
read), and truncates ``metrics.jsonl``/``epochs.jsonl`` to the checkpoint's step, so it continues as if never
stopped. SIGINT (Ctrl-C) and SIGTERM (a pre-empted job) stop the run at the next step boundary with a checkpoint
(under torchrun the ranks agree by a tiny all-reduce each step); ``train.ckpt_every_minutes`` adds time-based
checkpoints, which bounds the work a crash can lose. A non-finite loss or gradient norm either stops the run with
:class:`TrainingDiverged` before anything is written, so the last checkpoint on disk is the last good one
(``train.nonfinite=stop``), or skips that update (``skip``; at most ``train.max_skipped_steps`` in a row). Records
skipped as corrupt are counted per epoch in ``epochs.jsonl``.

What a checkpoint holds besides the weights is one :class:`~mdc_core.train_state.TrainState`. ``train(cfg, out,
init_from=RUN)`` starts a new run from the weights of another run or checkpoint: weights only, with a fresh
optimizer, schedule, EMA and counters (fine-tuning).

The step never waits for the device between logging steps (:mod:`mdc_core.step_parts`): batches are prepared on the
host, and the loss, metrics, gradient norm and the non-finite check are read at logging and checkpoint steps only
(:meth:`mdc_core.train_log.RunLog.read`, which also writes the run's records).
"""

from __future__ import annotations

import contextlib
import math
import random
import shutil
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel
from torch.optim.swa_utils import AveragedModel

from . import checkpoint as ckpt_io
from . import distributed as dist
from . import run_start, step_parts
from .config import ObjectiveConfig, RunConfig
from .data.loaders import BatchStream
from .model_init import init_from_weights, init_model
from .objectives import draw_masks, objective_spec, trim_padding
from .run_start import resolve_data_paths
from .runlock import RunLock
from .train_log import HookFactory, RunLog, StepStats, TrainingDiverged, diverged  # noqa: F401 - TrainingDiverged
from .train_restore import restore
from .train_state import Counters, TrainState, rng_state


class TrainingInterrupted(KeyboardInterrupt):
    """SIGINT/SIGTERM stopped the run at a step boundary, after writing `checkpoint` (step `step`). A subclass of
    KeyboardInterrupt, so that callers that do not look for it (a notebook cell, ``mdc demo``) stop as on Ctrl-C."""

    def __init__(self, signum: int, step: int, checkpoint: Path | None):
        super().__init__(f"interrupted by {signal.Signals(signum).name} at step {step}; checkpoint {checkpoint}")
        self.signum, self.step, self.checkpoint = signum, step, checkpoint


@dataclass
class TrainResult:
    run_dir: Path
    steps: int
    final_loss: float
    checkpoint: Path
    skipped: dict[str, int] = field(default_factory=dict)  # corrupt records skipped, by reason
    truncated: int = 0  # captions cut to the context length
    start_step: int = 0  # the step this call started from (> 0: resumed; == steps: nothing was left to train)


def use_bf16(precision: str, device: torch.device) -> bool:
    """bf16 autocast on CUDA by default; fp32 on CPU (bf16 matmul there is ~250x slower)."""
    return precision == "bf16" or (precision == "auto" and device.type == "cuda")


def lr_lambda(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Multiplier of the peak lr: linear warm-up over `warmup` steps, then cosine decay to `min_ratio`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Decay matrices only: biases, norms, embeddings and position tables are not decayed (as open_clip)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        skip = p.ndim < 2 or "emb" in name or "pos_embed" in name or "cls_token" in name or "norm" in name
        (no_decay if skip else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def seed_everything(seed: int) -> None:
    """Seed torch, Python's and NumPy's generators (the initial weights, and what a fresh run draws)."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def step_seed(seed: int, step: int, index: int, stream: int = 0) -> int:
    """A 63-bit seed for micro-batch `index` (global, see the module docstring) of optimizer step `step`; stream
    0 is the masking draws, stream 1 dropout (index = rank). Every random draw of a step derives from these, so
    it depends neither on the rank that draws it nor on a resume."""
    entropy = [seed, stream, step, index]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0] >> np.uint64(1))


def loss_denominator(tokens: torch.Tensor, objective: ObjectiveConfig, seed: int | None = None) -> int:
    """What :func:`compute_loss` divides a micro-batch's summed (weighted) cross-entropy by: its maskable tokens
    (``per_token``; caption tokens + ``<eot>`` for arc) or its captions with any (``per_sequence``); the batch
    size for the contrastive objective. tokens (B, L). Summed over the global batch it makes accumulation and
    DDP give the gradient of one big batch.

    An objective divided by its masked tokens (``per_masked_token``: cmlm) counts the masks the micro-batch's
    masking `seed` draws (:func:`~mdc_core.objectives.draw_masks` with a CPU generator seeded as
    :class:`~mdc_core.step_parts.HostBatches` seeds its own). The trainer does not draw them twice: HostBatches
    counts the masks it prepares (:attr:`~mdc_core.step_parts.ReadyBatch.terms`), the same number."""
    spec = objective_spec(objective.name)
    if not spec.per_masked_token:
        return spec.loss_denominator(tokens, objective.normalization)
    if seed is None:
        raise ValueError(f"objective {objective.name!r} divides its loss by the masked tokens: give the micro-batch's "
                         "masking seed")
    _, _, mask = draw_masks(trim_padding(tokens), objective, torch.Generator().manual_seed(seed))
    return spec.loss_denominator(tokens, objective.normalization, mask=mask)


def train(cfg: RunConfig, out: str | Path, *, resume: bool = False, init_from: str | Path | None = None,
          progress: bool = True, clock: step_parts.StepClock | None = None, hooks: Sequence[HookFactory] = ()
          ) -> TrainResult:
    """Train `cfg` into run folder `out`. With `resume`, continue from its latest complete checkpoint.

    `init_from` (a run or checkpoint folder) starts the run from that model's weights instead of a fresh
    initialisation (:func:`~mdc_core.model_init.init_from_weights`), with a fresh optimizer, schedule, EMA and
    counters. It applies whenever the run starts at step 0 (also a ``resume`` that finds no checkpoint and starts
    over); a run that resumes from its own checkpoint continues from that.

    Under ``torchrun`` every rank calls this: DistributedDataParallel (NCCL on CUDA, gloo on CPU), each rank
    reading its share of the data; the global batch is ``batch_size x world x grad_accum``. Only rank 0 writes,
    holding the run folder's lock (:mod:`mdc_core.runlock`) from before its first write to the end: a second
    writer raises :class:`~mdc_core.runlock.RunFolderBusy` naming it.

    `clock` marks the phases of each step (:class:`~mdc_core.step_parts.StepClock`; ``mdc bench step`` times them).
    `hooks` are factories of loggers that rank 0 tells each record and checkpoint
    (:class:`~mdc_core.train_log.RunHook`), besides those the config asks for (``train.tensorboard``).
    """
    cfg.validate()
    ctx = dist.setup(cfg.train.device, cfg.train.dist_timeout_s)
    out = Path(out)
    created = not out.exists()
    lock = RunLock(out, "mdc train --resume" if resume else "mdc train")
    try:
        run_start.lock_run_folder(lock, ctx)
        cfg, start_ckpt, state_problem = run_start.prepare_run(resolve_data_paths(cfg), out, resume, ctx.is_main,
                                                               lr_lambda)
        dist.barrier(ctx, "start-up")  # every rank has checked the run folder before rank 0 writes to it
        return Trainer(cfg, out, ctx, start_ckpt, progress, state_problem, init_from, clock, hooks).run()
    except BaseException:
        if lock.held and created and run_start.never_started(out):  # a run that could not start leaves no folder behind
            shutil.rmtree(out, ignore_errors=True)
        raise
    finally:
        lock.release()
        dist.teardown(ctx)


class Trainer:
    """One training run, as nanoGPT's ``train.py`` reads: build or restore the run's state (model, optimizer,
    schedule, EMA, data position, counters), then :meth:`run`'s loop of read -> :meth:`step` -> maybe log /
    checkpoint / stop. :meth:`step` is the whole optimizer step; nothing in it reads the device."""

    def __init__(self, cfg: RunConfig, out: Path, ctx: dist.DistContext, start_ckpt: Path | None, progress: bool,
                 state_problem: str = "", init_from: str | Path | None = None,
                 clock: step_parts.StepClock | None = None, hooks: Sequence[HookFactory] = ()):
        tcfg = cfg.train
        self.hooks = hooks
        self.cfg, self.out, self.ctx, self.progress = cfg, out, ctx, progress
        self.device, self.main = ctx.device, ctx.is_main
        seed_everything(tcfg.seed)  # the same initial weights on every rank
        if start_ckpt is not None:
            model = ckpt_io.load_model(start_ckpt)[0]
        elif init_from is not None:
            model, self.cfg = init_from_weights(cfg, init_from)  # cfg: with the source's corpus vocabulary size
        else:
            model, self.cfg = init_model(cfg, progress=progress and self.main)  # with the corpus vocabulary's size
        cfg = self.cfg
        self.model = model.to(self.device).train()
        if self.main:
            out.mkdir(parents=True, exist_ok=True)
            cfg.save(out / "config.json")  # a run started over found its old logs set aside (resume.set_logs_aside)
        # forward + loss of a micro-batch: host batches (static shapes), autocast, train.compile (CUDA graphs)
        self.loss_step = step_parts.LossStep(model, cfg.objective, tcfg, self.device, use_bf16(tcfg.precision,
                                             self.device), distributed=ctx.distributed)
        if ctx.distributed:
            self.loss_step.module = DistributedDataParallel(self.loss_step.module, device_ids=[self.device.index]
                                                            if self.device.type == "cuda" else None)
        self.opt = step_parts.build_optimizer(param_groups(model, tcfg.weight_decay), tcfg, self.device)  # fused: CUDA
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: lr_lambda(s, tcfg.warmup_steps, tcfg.steps, tcfg.min_lr_ratio))
        self.ema = AveragedModel(model, use_buffers=True) if tcfg.ema_decay > 0 else None  # step_parts.ema_update
        self.watch = step_parts.NonFiniteWatch(self.device)
        self.clock = clock or step_parts.StepClock()
        self.clock.watch([model] + ([self.ema.module] if self.ema is not None else []))
        self.n, self.last_ckpt, self.skips, self.saved_at = Counters(), start_ckpt, 0, time.monotonic()
        self.stop = dist.StopRequest(repeat_aborts=not ctx.distributed)
        epoch, batch_in_epoch = 0, 0
        if start_ckpt is not None:  # optimizer, schedule, EMA, RNG, counters and data position of the checkpoint
            self.n, epoch, batch_in_epoch = restore(start_ckpt, out, ctx, self.opt, self.sched, self.ema,
                                                    tcfg.grad_accum, state_problem)
        elif init_from is not None:
            seed_everything(tcfg.seed)  # the RNG state of a fresh run's first step, not what loading the weights drew
        self.start_step = self.n.step
        self.stream = BatchStream(cfg, ctx, epoch, batch_in_epoch,
                                  lambda finished: self.log.end_epoch(finished, self.stream.pending))

    def run(self) -> TrainResult:
        """Optimizer steps until train.steps or a stop request (then TrainingInterrupted, after a checkpoint)."""
        tcfg, clock, stopped_by, loss = self.cfg.train, self.clock, 0, float("nan")
        self.log = RunLog(self.cfg, self.out, self.ctx, self.n, self.progress, f"compile {self.loss_step.mode or 'off'}"
                          f", static shapes {self.loss_step.static}", self.hooks)
        try:
            with self.stop:
                while self.n.step < tcfg.steps and not stopped_by:
                    with clock.phase("read"):
                        micro = self.stream.take(tcfg.grad_accum)  # each with its tokens (B, L) and images
                    step, stats = self.step(micro)
                    if step is None:  # train.nonfinite=skip dropped the update
                        continue
                    with clock.phase("metrics_logging"):
                        stop, due = step_parts.agree_flags(self.ctx, self.stop.signum > 0, tcfg.ckpt_every_minutes
                                                           > 0 and time.monotonic() - self.saved_at >=
                                                           60 * tcfg.ckpt_every_minutes)
                        log = self.n.step % tcfg.log_every == 0 or self.n.step in (1, tcfg.steps)  # 1: a first loss
                        save = self.n.step % tcfg.ckpt_every == 0 or self.n.step == tcfg.steps or due or stop
                        if log or save:
                            stats = stats or self._read(step)
                            loss = stats.loss
                            if log:
                                self.log.write(stats, self.stream.epoch, self.sched.get_last_lr()[0])
                    if save:
                        with clock.phase("checkpoint"):
                            self._checkpoint()
                            if not stop:
                                self.log.checkpoint(self.model)  # the hooks' (TensorBoard's val/*)
                    stopped_by = int(self.stop.signum or signal.SIGTERM) if stop else 0  # no signal here: SIGTERM
                stopped_by = stopped_by or self.stop.signum  # a signal during the last checkpoint counts too
            dist.barrier(self.ctx, "end of training")
        finally:
            self.stream.close()
            self.log.close()
        if stopped_by:
            raise TrainingInterrupted(stopped_by, self.n.step, self.last_ckpt)
        last = self.last_ckpt or ckpt_io.latest_checkpoint(self.out)  # None: resumed a run that was complete
        loss = loss if self.n.step > self.start_step else run_start.logged_loss(self.out, self.n.step)
        return TrainResult(self.out, self.n.step, loss, last, dict(self.n.skipped), self.n.truncated, self.start_step)

    def step(self, micro: list[dict[str, Any]]) -> tuple[step_parts.DeviceStep | None, StepStats | None]:
        """One optimizer step over this rank's micro-batches: prepare each on the host (its masks drawn once, from
        the seed ``(seed, step, a * world + rank)``), forward and backward (gradients add up to the global batch's),
        clip, AdamW, schedule, EMA. Returns the step's device values (None: a non-finite update skipped) and, with
        train.nonfinite=skip (which must decide every step), what it read; else nothing here reads the device."""
        tcfg, ctx, clock, n = self.cfg.train, self.ctx, self.clock, self.n.step
        with clock.phase("prepare"):
            seeds = [step_seed(tcfg.seed, n, a * ctx.world + ctx.rank) for a in range(len(micro))]  # masking draws
            ready = [self.loss_step.prepare(b["tokens"], s) for b, s in zip(micro, seeds, strict=True)]
            counts = [r.terms for r in ready]  # loss_denominator of each, from its own masks
            denom = step_parts.global_terms(ctx, sum(counts))  # a number, or a device scalar all-reduced, no wait
            sums = step_parts.StepSums(self.device, len(micro))
            torch.manual_seed(step_seed(tcfg.seed, n, ctx.rank, stream=1))  # dropout: per step and rank
        for a, (batch, r, count) in enumerate(zip(micro, ready, counts, strict=True)):
            last = a == len(micro) - 1
            sync = self.loss_step.module.no_sync() if ctx.distributed and not last else contextlib.nullcontext()
            with clock.phase("forward_backward"), dist.guard(ctx, "DDP forward/backward (gradient all-reduce)"), sync:
                loss, metrics = self.loss_step.forward(batch["image"], r)
                # DDP averages gradients over ranks: x world makes that a sum, / denom the global normalisation
                scale = count * ctx.world / denom
                (loss * (scale.to(loss.dtype) if torch.is_tensor(scale) else scale)).backward()
            with clock.phase("metrics_logging"):
                sums.add(loss, metrics, count)
        with clock.phase("clip_optimizer"):
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), tcfg.grad_clip if tcfg.grad_clip > 0
                                                       else float("inf"))
        with clock.phase("metrics_logging"):
            self.log.pending_samples += float(sum(b["tokens"].shape[0] for b in micro))
            self.log.pending_truncated += sum(b["truncated"] for b in micro)
            step, stats = sums.done(denom, grad_norm, ctx.world), None
            if tcfg.nonfinite == "skip":
                stats = self._read(step)
                self.skips = 0 if stats.finite else self.skips + 1
                if self.skips:
                    self.opt.zero_grad(set_to_none=True)
                    self.log.skip_update(stats, self.skips, self.last_ckpt)  # TrainingDiverged after too many
                    return None, None
            else:  # train.nonfinite=stop: noted on the device, raised at the next read, before anything is written
                self.watch.note(n, step.loss_sum / denom, grad_norm)
        with clock.phase("clip_optimizer"):
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            self.sched.step()
        if self.ema is not None:
            with clock.phase("ema"):
                step_parts.ema_update(self.ema, self.model, tcfg.ema_decay)
        self.n.step += 1
        self.log.bar.update(1)
        return step, stats

    def _read(self, step: step_parts.DeviceStep) -> StepStats:
        """The step's values, summed over ranks (:meth:`RunLog.read`): where the host waits for the device.
        TrainingDiverged if a step since the last read was not finite (train.nonfinite=stop)."""
        stats = self.log.read(step, self.watch, self.stream.pending)
        if stats.diverged:
            raise diverged(self.watch.describe(), "train.nonfinite=stop", self.last_ckpt)
        return stats

    def _checkpoint(self) -> None:
        """Rank 0 writes checkpoint `step` (atomically); every rank remembers where it is."""
        self.saved_at = time.monotonic()
        if not self.main:
            self.last_ckpt = self.out / ckpt_io.CKPT_DIR / f"step_{self.n.step:08d}"
            return
        ema = self.ema
        state = TrainState(self.n, self.stream.epoch, self.stream.batch_in_epoch, self.ctx.world,
                           self.log.global_batch, int(ema.n_averaged) if ema is not None else 0, self.opt.state_dict(),
                           self.sched.state_dict(), rng_state())
        self.last_ckpt = ckpt_io.save_checkpoint(self.out, self.n.step, self.cfg, self.model,
                                                 ema_state=ema.module.state_dict() if ema is not None else None,
                                                 train_state=state.state_dict(), keep_last=self.cfg.train.keep_last)

