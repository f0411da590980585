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
host, and the loss, metrics, gradient norm and the non-finite check are read at logging and checkpoint steps only.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import shutil
import signal
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel
from torch.optim.swa_utils import AveragedModel
from tqdm.auto import tqdm

from . import checkpoint as ckpt_io
from . import distributed as dist
from . import resume as resume_io
from . import step_parts
from .config import ObjectiveConfig, RunConfig
from .data import SKIP_REASONS
from .data.loaders import BatchStream
from .model_init import init_from_weights, init_model
from .objectives import draw_masks, logged_accuracy, objective_spec, trim_padding
from .resume import resolve_data_paths
from .runlock import RunLock
from .tensorboard_log import TensorBoardLog
from .tokenizer import CaptionTokenizer
from .train_state import Counters, TrainState


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


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
    :class:`~mdc_core.step_parts.HostBatches` seeds its own, so the draws are the loss's own)."""
    spec = objective_spec(objective.name)
    if not spec.per_masked_token:
        return spec.loss_denominator(tokens, objective.normalization)
    if seed is None:
        raise ValueError(f"objective {objective.name!r} divides its loss by the masked tokens: give the micro-batch's "
                         "masking seed")
    _, _, mask = draw_masks(trim_padding(tokens), objective, torch.Generator().manual_seed(seed))
    return spec.loss_denominator(tokens, objective.normalization, mask=mask)


def train(cfg: RunConfig, out: str | Path, *, resume: bool = False, init_from: str | Path | None = None,
          progress: bool = True, clock: step_parts.StepClock | None = None) -> TrainResult:
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
    """
    cfg.validate()
    ctx = dist.setup(cfg.train.device, cfg.train.dist_timeout_s)
    out = Path(out)
    created = not out.exists()
    lock = RunLock(out, "mdc train --resume" if resume else "mdc train")
    try:
        resume_io.lock_run_folder(lock, ctx)
        cfg, start_ckpt, state_problem = resume_io.prepare_run(resolve_data_paths(cfg), out, resume, ctx.is_main,
                                                               lr_lambda)
        dist.barrier(ctx, "start-up")  # every rank has checked the run folder before rank 0 writes to it
        return _Trainer(cfg, out, ctx, start_ckpt, progress, state_problem, init_from, clock).run()
    except BaseException:
        if lock.held and created and resume_io.never_started(out):  # a run that could not start leaves no folder behind
            shutil.rmtree(out, ignore_errors=True)
        raise
    finally:
        lock.release()
        dist.teardown(ctx)


@dataclass
class StepStats:
    """One optimizer step as logged: each value reduced over ranks (:func:`mdc_core.distributed.all_reduce_named`)."""

    loss: float  # the step's loss, normalised by the global count of loss terms
    metrics: dict[str, float]  # compute_loss's other metrics, mean over micro-batches and ranks
    samples: float  # captions read by all ranks since the last read
    truncated: int  # captions cut to the context length, all ranks, since the last read
    grad_norm: float  # global gradient norm before clipping

    @property
    def finite(self) -> bool:
        return math.isfinite(self.loss) and math.isfinite(self.grad_norm)


class _Trainer:
    """The state of one training run (model, optimizer, schedule, EMA, data position, counters) and its loop."""

    def __init__(self, cfg: RunConfig, out: Path, ctx: dist.DistContext, start_ckpt: Path | None, progress: bool,
                 state_problem: str = "", init_from: str | Path | None = None,
                 clock: step_parts.StepClock | None = None):
        tcfg = cfg.train
        self.cfg, self.out, self.ctx, self.progress = cfg, out, ctx, progress
        self.device, self.main = ctx.device, ctx.is_main
        seed_everything(tcfg.seed)  # the same initial weights on every rank
        self.bf16 = use_bf16(tcfg.precision, self.device)
        if start_ckpt is not None:
            model = ckpt_io.load_model(start_ckpt)[0]
        elif init_from is not None:
            model, cfg = init_from_weights(cfg, init_from)  # cfg: with the source's corpus vocabulary size
            self.cfg = cfg
        else:
            model, cfg = init_model(cfg, progress=progress and self.main)  # cfg: with the corpus vocabulary's size
            self.cfg = cfg
        self.model = model.to(self.device).train()
        if self.main:
            out.mkdir(parents=True, exist_ok=True)
            cfg.save(out / "config.json")  # a run started over found its old logs set aside (resume.set_logs_aside)
        # forward + loss of a micro-batch: host batches (static shapes), autocast, train.compile (CUDA graphs)
        self.loss_step = step_parts.LossStep(model, cfg.objective, tcfg, self.device, self.bf16,
                                             distributed=ctx.distributed)
        if ctx.distributed:
            self.loss_step.module = DistributedDataParallel(self.loss_step.module, device_ids=[self.device.index]
                                                            if self.device.type == "cuda" else None)
        # fused on CUDA
        self.opt = step_parts.build_optimizer(param_groups(model, tcfg.weight_decay), tcfg, self.device)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: lr_lambda(s, tcfg.warmup_steps, tcfg.steps, tcfg.min_lr_ratio))
        self.ema = AveragedModel(model, use_buffers=True) if tcfg.ema_decay > 0 else None  # step_parts.ema_update
        self.watch = step_parts.NonFiniteWatch(self.device)
        self.clock = clock or step_parts.StepClock()
        self.clock.watch([model] + ([self.ema.module] if self.ema is not None else []))
        self.pending_samples, self.pending_truncated = 0.0, 0  # this rank's, since the last read
        self.tokenizer = CaptionTokenizer(cfg.model.context_length)
        self.global_batch = tcfg.batch_size * ctx.world * tcfg.grad_accum
        self.n = Counters()
        self.last_ckpt = start_ckpt
        self.consecutive_skips = 0
        self.saved_at = time.monotonic()
        self.stop = dist.StopRequest(repeat_aborts=not ctx.distributed)
        epoch, batch_in_epoch = self._restore(start_ckpt, state_problem) if start_ckpt is not None else (0, 0)
        if start_ckpt is None and init_from is not None:
            seed_everything(tcfg.seed)  # the RNG state of a fresh run's first step, not what loading the weights drew
        self.start_step = self.n.step
        self.tensorboard = TensorBoardLog(out, self.n.step, cfg) if self.main and tcfg.tensorboard else None
        self.stream = BatchStream(cfg, ctx, epoch, batch_in_epoch, self._end_epoch)

    def _restore(self, ckpt: Path, state_problem: str = "") -> tuple[int, int]:
        """Load optimizer, schedule, EMA, RNG and counters from `ckpt`; return the data position (epoch, batch).
        With `state_problem` (its state.pt is missing or damaged) only what the logs give back (weights only)."""
        if state_problem:
            step = json.loads((ckpt / "meta.json").read_text())["step"]
            state = resume_io.weights_only_state(self.out, step, self.cfg.train.grad_accum)
            resume_io.set_schedule_step(self.sched, step)
        else:
            state = TrainState.from_state_dict(ckpt_io.load_train_state(ckpt))
            self.opt.load_state_dict(state.optimizer)
            self.sched.load_state_dict(state.scheduler)
        if self.ema is not None and (ckpt / "ema.safetensors").is_file():
            self.ema.module.load_state_dict(ckpt_io.load_weights(ckpt / "ema.safetensors"))
            self.ema.n_averaged.fill_(state.ema_n_averaged)
        if state.rng is not None:
            ckpt_io.set_rng_state(state.rng)
        epoch, batch_in_epoch = state.epoch, state.batch_in_epoch
        saved_world = state.world
        if saved_world != self.ctx.world:  # the same number of samples of this epoch, but not the same samples
            batch_in_epoch = batch_in_epoch * saved_world // self.ctx.world
            warnings.warn(f"resuming a {saved_world}-rank run on {self.ctx.world} ranks: the global batch and the "
                          "data order of the current epoch change; metrics will not match an uninterrupted run",
                          stacklevel=3)
        self.n = state.counters
        if self.main:
            ckpt_io.truncate_jsonl(self.out / "metrics.jsonl", self.n.step)
            ckpt_io.truncate_jsonl(self.out / "epochs.jsonl", self.n.step)
        return epoch, batch_in_epoch

    def run(self) -> TrainResult:
        tcfg, main = self.cfg.train, self.main
        if main and self.progress:
            tqdm.write(f"global batch {self.global_batch} = {tcfg.batch_size} per device x {self.ctx.world} devices "
                       f"({self.device.type}) x {tcfg.grad_accum} accumulation; step: compile "
                       f"{self.loss_step.mode or 'off'}, static shapes {self.loss_step.static}")
        self.bar = tqdm(total=tcfg.steps, initial=self.n.step, desc=f"train {self.cfg.objective.name}", unit="step",
                        disable=not (self.progress and main))
        self.metrics_file = open(self.out / "metrics.jsonl", "a") if main else None
        self.window_start, self.window_samples = time.perf_counter(), 0.0
        self.loss, stopped_by = float("nan"), 0
        try:
            with self.stop:
                stopped_by = self._loop() or self.stop.signum  # a signal during the last checkpoint counts too
            dist.barrier(self.ctx, "end of training")
        finally:
            self.stream.close()
            self.bar.close()
            if self.metrics_file is not None:
                self.metrics_file.close()
            if self.tensorboard is not None:
                self.tensorboard.close()
        if stopped_by:
            raise TrainingInterrupted(stopped_by, self.n.step, self.last_ckpt)
        last = self.last_ckpt or ckpt_io.latest_checkpoint(self.out)  # None: resumed a run that was complete
        loss = self.loss if self.n.step > self.start_step else resume_io.logged_loss(self.out, self.n.step)
        return TrainResult(self.out, self.n.step, loss, last, dict(self.n.skipped), self.n.truncated, self.start_step)

    def _loop(self) -> int:
        """Optimizer steps until train.steps or a stop request; returns the stopping signal (0: none). Device values
        are read only at logging and checkpoint steps (every step with train.nonfinite=skip, which must decide)."""
        tcfg = self.cfg.train
        clock = self.clock
        while self.n.step < tcfg.steps:
            with clock.phase("read"):
                micro = self.stream.take(tcfg.grad_accum)
            device_step, stats = self._accumulate(micro), None
            if tcfg.nonfinite == "skip":
                with clock.phase("metrics_logging"):
                    stats = self._read(device_step)
                if not stats.finite:
                    self._skip_nonfinite(stats)
                    continue
                self.consecutive_skips = 0
            else:  # train.nonfinite=stop: noted on the device, raised at the next read, before anything is written
                with clock.phase("metrics_logging"):
                    self.watch.note(self.n.step, device_step.loss_sum / device_step.denom, device_step.grad_norm)
            self._update()
            with clock.phase("metrics_logging"):
                stop, due = step_parts.agree_flags(self.ctx, self.stop.signum > 0, tcfg.ckpt_every_minutes > 0 and
                                                   time.monotonic() - self.saved_at >= 60 * tcfg.ckpt_every_minutes)
                log = self.n.step % tcfg.log_every == 0 or self.n.step in (1, tcfg.steps)  # step 1: a first loss
                save = self.n.step % tcfg.ckpt_every == 0 or self.n.step == tcfg.steps or due or stop
                if log or save:
                    stats = stats or self._read(device_step)
                    self.loss = stats.loss
                    if log:
                        self._log(stats)
            if save:
                with clock.phase("checkpoint"):
                    self._checkpoint()
                    if self.tensorboard is not None and not stop:  # val/* at the checkpoint cadence
                        self.tensorboard.evaluate(self.n.step, self.model)
            if stop:
                return int(self.stop.signum or signal.SIGTERM)  # a rank that got no signal reports SIGTERM
        return 0

    def _accumulate(self, micro: list[dict[str, Any]]) -> step_parts.DeviceStep:
        """The step body: forward and backward over this rank's micro-batches (gradients add up to the global
        batch's) and gradient clipping; the batches are prepared on the host, and nothing here reads the device."""
        tcfg, ctx, device, clock = self.cfg.train, self.ctx, self.device, self.clock
        with clock.phase("read"):
            tokens, cut = zip(*(self.tokenizer.tokenize_batch(b["caption"]) for b in micro), strict=True)
        with clock.phase("prepare"):
            seeds = [step_seed(tcfg.seed, self.n.step, a * ctx.world + ctx.rank) for a in range(len(micro))]
            counts = [loss_denominator(tok, self.cfg.objective, seed) for tok, seed in zip(tokens, seeds, strict=True)]
            denom = step_parts.global_terms(ctx, sum(counts))  # a number, or a device scalar all-reduced, no wait
            loss_sum = torch.zeros((), dtype=torch.float64, device=device)
            means: dict[str, torch.Tensor] = {}
            torch.manual_seed(step_seed(tcfg.seed, self.n.step, ctx.rank, stream=1))  # dropout: per step and rank
        for a, (batch, tok, n, seed) in enumerate(zip(micro, tokens, counts, seeds, strict=True)):
            last = a == len(micro) - 1
            sync = self.loss_step.module.no_sync() if ctx.distributed and not last else contextlib.nullcontext()
            with clock.phase("prepare"):
                # the masking draws of micro-batch a on rank r are those of one rank with world x the micro-batches
                tok, prepared = self.loss_step.prepare(tok, seed)
            with clock.phase("forward_backward"), dist.guard(ctx, "DDP forward/backward (gradient all-reduce)"), sync:
                loss, metrics = self.loss_step.forward(batch["image"], tok, prepared)
                # DDP averages gradients over ranks: x world makes that a sum, / denom the global normalisation
                scale = n * ctx.world / denom
                (loss * (scale.to(loss.dtype) if torch.is_tensor(scale) else scale)).backward()
            with clock.phase("metrics_logging"):
                loss_sum += loss.detach().double() * n
                for k, v in metrics.items():
                    if k != "loss":
                        means[k] = means.get(k, 0) + v.detach().double() / len(micro)
        with clock.phase("clip_optimizer"):
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), tcfg.grad_clip if tcfg.grad_clip > 0
                                                       else float("inf"))
        self.pending_samples += float(sum(len(b["caption"]) for b in micro))
        self.pending_truncated += sum(cut)
        return step_parts.DeviceStep(loss_sum, denom, {k: v / ctx.world for k, v in sorted(means.items())}, grad_norm)

    def _read(self, device_step: step_parts.DeviceStep) -> StepStats:
        """The step's values and the counts since the last read, summed over ranks in one collective: where the host
        waits for the device. TrainingDiverged if a step since the last read was not finite (nonfinite=stop)."""
        local = {"loss": device_step.loss_sum, "samples": self.pending_samples,
                 "truncated": float(self.pending_truncated), "nonfinite": self.watch.flag(),
                 **{f"metric/{k}": v for k, v in device_step.metrics.items()}}
        total = dist.all_reduce_named(self.ctx, local, "step metrics")
        self.pending_samples, self.pending_truncated = 0.0, 0
        self._reduce_pending()
        self.n.truncated += int(total["truncated"])
        self.window_samples += total["samples"]
        if total["nonfinite"] > 0:
            self._diverged(self.watch.describe(), "train.nonfinite=stop")
        metrics = {k.removeprefix("metric/"): v for k, v in total.items() if k.startswith("metric/")}
        return StepStats(total["loss"] / float(device_step.denom), metrics, total["samples"],
                         int(total["truncated"]), float(device_step.grad_norm))

    def _update(self) -> None:
        """Apply the accumulated gradients: optimizer, schedule and EMA step; one more step taken."""
        with self.clock.phase("clip_optimizer"):
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            self.sched.step()
        if self.ema is not None:
            with self.clock.phase("ema"):
                step_parts.ema_update(self.ema, self.model, self.cfg.train.ema_decay)
        with self.clock.phase("metrics_logging"):
            self.n.step += 1
            self.bar.update(1)

    def _skip_nonfinite(self, stats: StepStats) -> None:
        """Drop a non-finite update (train.nonfinite=skip), or stop the run without saving."""
        tcfg = self.cfg.train
        self.opt.zero_grad(set_to_none=True)
        what = f"loss became {stats.loss} (grad norm {stats.grad_norm}) at step {self.n.step}"
        self.consecutive_skips += 1
        if self.consecutive_skips > tcfg.max_skipped_steps:
            self._diverged(what, f"train.nonfinite=skip, but {self.consecutive_skips} updates in a row were "
                           f"non-finite (train.max_skipped_steps={tcfg.max_skipped_steps})")
        self.n.nonfinite_skipped += 1
        if self.main:
            tqdm.write(f"{what}; skipped this update (train.nonfinite=skip; {self.n.nonfinite_skipped} so far)")

    def _diverged(self, what: str, why: str) -> None:
        where = f"last good checkpoint: {self.last_ckpt}" if self.last_ckpt else "no checkpoint was written yet"
        raise TrainingDiverged(f"{what}; stopping without saving ({why}). {where}. Try a lower train.lr or "
                               "train.grad_clip=1.0")

    def _log(self, stats: StepStats) -> None:
        """Rank 0 writes a metrics line (every train.log_every steps and the last)."""
        step = self.n.step
        if not self.main:
            return
        elapsed = time.perf_counter() - self.window_start
        record = {"step": step, "epoch": self.stream.epoch, "lr": self.sched.get_last_lr()[0],
                  "grad_norm": stats.grad_norm, "loss": stats.loss, **stats.metrics,
                  "global_batch": self.global_batch, "samples_per_s": self.window_samples / max(elapsed, 1e-9),
                  "skipped": sum(self.n.skipped.values()), "truncated": self.n.truncated,
                  "nonfinite_skipped": self.n.nonfinite_skipped}
        self.metrics_file.write(json.dumps(record) + "\n")
        self.metrics_file.flush()
        if self.tensorboard is not None:
            self.tensorboard.write(record)
        accuracy = logged_accuracy(record)
        self.bar.set_postfix(loss=f"{stats.loss:.3f}", acc=f"{float('nan') if accuracy is None else accuracy[1]:.2f}")
        self.window_start, self.window_samples = time.perf_counter(), 0.0

    def _reduce_pending(self) -> None:
        """Add every rank's newly met skipped records to the run and epoch counts."""
        new = dist.all_reduce_named(self.ctx, {r: float(self.stream.pending[r]) for r in SKIP_REASONS},
                                    "skipped-record counts")
        new = Counter({r: int(c) for r, c in new.items() if c})
        self.n.skipped.update(new)
        self.n.skipped_epoch.update(new)
        self.stream.pending.clear()

    def _end_epoch(self, finished: int) -> None:
        self._reduce_pending()
        if self.main:
            with open(self.out / "epochs.jsonl", "a") as fh:
                fh.write(json.dumps({"epoch": finished, "step": self.n.step, "skipped": dict(self.n.skipped_epoch),
                                     "n_skipped": sum(self.n.skipped_epoch.values())}) + "\n")
            if self.n.skipped_epoch and self.progress:
                tqdm.write(f"epoch {finished}: skipped {dict(self.n.skipped_epoch)}")
        self.n.skipped_epoch.clear()

    def _checkpoint(self) -> None:
        """Rank 0 writes checkpoint `step` (atomically); every rank remembers where it is."""
        self.saved_at = time.monotonic()
        if not self.main:
            self.last_ckpt = self.out / ckpt_io.CKPT_DIR / f"step_{self.n.step:08d}"
            return
        ema = self.ema
        state = TrainState(self.n, self.stream.epoch, self.stream.batch_in_epoch, self.ctx.world, self.global_batch,
                           int(ema.n_averaged) if ema is not None else 0, self.opt.state_dict(),
                           self.sched.state_dict(), ckpt_io.rng_state())
        self.last_ckpt = ckpt_io.save_checkpoint(self.out, self.n.step, self.cfg, self.model,
                                                 ema_state=ema.module.state_dict() if ema is not None else None,
                                                 train_state=state.state_dict(), keep_last=self.cfg.train.keep_last)
