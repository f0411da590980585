"""The training loop: AdamW, warm-up + cosine, accumulation, clipping, EMA, bf16 on CUDA, DDP, atomic checkpoints.

``train(cfg, out)`` reads as nanoGPT's ``train.py``: start or resume in the run folder `out`
(:mod:`mdc_core.run_folder`), build or restore the run's state (:class:`Trainer`), then :meth:`Trainer.run`'s loop of
read -> :meth:`Trainer.step` -> maybe log (:mod:`mdc_core.run_state`) / checkpoint / stop. Under ``torchrun`` it
runs DistributedDataParallel (:mod:`mdc_core.distributed`): each rank reads its own shards, the global batch is
``batch_size x world x grad_accum``, only rank 0 writes.

**Exactness.** A step's loss is normalised by the GLOBAL count of its loss terms, and every random draw of
micro-batch ``a`` on rank ``r`` is seeded by ``(seed, step, a * world + r)`` (:func:`step_seed`); with the data
split of :mod:`mdc_core.data` this makes ``world`` ranks with accumulation A compute the same updates as one
process with accumulation ``world * A`` (up to summation order). A resumed run restores model, optimizer,
schedule, EMA, RNG states, counters and the data position, so it continues as if never stopped.

**Stopping.** SIGINT and SIGTERM stop the run at the next step boundary with a checkpoint
(:class:`TrainingInterrupted`); a non-finite loss or gradient norm stops it with :class:`TrainingDiverged`
before anything is written (``train.nonfinite=stop``) or skips that update (``skip``).

**The step never waits for the device** between logging steps: micro-batches are prepared on the host and copied
without blocking (:class:`~mdc_core.loss_step.LossStep`); loss, metrics, gradient norm and the non-finite flag
(:class:`NonFiniteWatch`) stay on the device until a logging or checkpoint step reads them at once; AdamW is the
fused kernel on CUDA (the default on the CPU, so CPU runs keep their numbers to the bit).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import shutil
import signal
import time
from collections.abc import Iterable, Sequence
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
from . import run_folder
from .config import RunConfig, TrainConfig
from .data import BatchStream, iter_captions
from .factory import create_model, load_model
from .loss_step import LossStep, WholeStep
from .run_state import (  # TrainingDiverged: what train raises when the loss is not finite
    Counters,
    HookFactory,
    RunLog,
    StepStats,
    TrainingDiverged,  # noqa: F401
    TrainState,
    diverged,
    logged_loss,
    rng_state,
)
from .runlock import RunLock
from .sampler import bf16_enabled
from .tokenizer import CaptionTokenizer, build_output_vocab


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


def train(cfg: RunConfig, out: str | Path, *, resume: bool = False, init_from: str | Path | None = None,
          progress: bool = True, clock: StepClock | None = None, hooks: Sequence[HookFactory] = ()) -> TrainResult:
    """Train `cfg` into run folder `out`. With `resume`, continue from its latest complete checkpoint.

    `init_from` (a run or checkpoint folder) starts the run from that model's weights (:func:`init_from_weights`)
    with a fresh optimizer, schedule, EMA and counters (fine-tuning); it applies whenever the run starts at step 0
    (also a ``resume`` that finds no checkpoint). Under ``torchrun`` every rank calls this; only rank 0 writes,
    holding the run folder's lock from before its first write to the end (a second writer raises
    :class:`~mdc_core.runlock.RunFolderBusy` naming it). `clock` marks the phases of each step
    (:class:`StepClock`; ``mdc bench step`` times them). `hooks` are factories of loggers that rank 0 tells each
    record and checkpoint (:class:`~mdc_core.run_state.RunHook`), besides those the config asks for."""
    cfg.validate()
    ctx = dist.setup(cfg.train.device, cfg.train.dist_timeout_s)
    out = Path(out)
    created = not out.exists()
    lock = RunLock(out, "mdc train --resume" if resume else "mdc train")
    try:
        run_folder.lock_run_folder(lock, ctx)
        cfg, start_ckpt, state_problem = run_folder.prepare_run(run_folder.resolve_data_paths(cfg), out, resume,
                                                                ctx.is_main, lr_lambda, lock)
        dist.barrier(ctx, "start-up")  # every rank has checked the run folder before rank 0 writes to it
        return Trainer(cfg, out, ctx, start_ckpt, progress, state_problem, init_from, clock, hooks).run()
    except BaseException:
        if lock.held and created and run_folder.never_started(out):  # a run that could not start leaves no folder
            shutil.rmtree(out, ignore_errors=True)
        raise
    finally:
        lock.release()
        dist.teardown(ctx)


class Trainer:
    """One training run: build or restore the run's state (model, optimizer, schedule, EMA, data position,
    counters), then :meth:`run`'s loop. :meth:`step` is the whole optimizer step; nothing in it reads the device."""

    def __init__(self, cfg: RunConfig, out: Path, ctx: dist.DistContext, start_ckpt: Path | None, progress: bool,
                 state_problem: str = "", init_from: str | Path | None = None, clock: StepClock | None = None,
                 hooks: Sequence[HookFactory] = ()):
        tcfg = cfg.train
        self.cfg, self.out, self.ctx, self.progress, self.hooks = cfg, out, ctx, progress, hooks
        self.device, self.main = ctx.device, ctx.is_main
        seed_everything(tcfg.seed)  # the same initial weights on every rank
        if start_ckpt is not None:
            model = load_model(start_ckpt)[0]
        elif init_from is not None:
            model, self.cfg = init_from_weights(cfg, init_from)  # cfg: with the source's corpus vocabulary size
        else:
            model, self.cfg = init_model(cfg, progress=progress and self.main)  # with the corpus vocabulary's size
        cfg = self.cfg
        self.model = model.to(self.device).train()
        if tcfg.compile_step and ctx.distributed:
            raise ValueError("train.compile_step runs in one process; under torchrun leave it off")
        if self.main:
            out.mkdir(parents=True, exist_ok=True)
            cfg.save(out / "config.json")  # a run started over found its old logs set aside
        # forward + loss of a micro-batch: host batches (static shapes), autocast, train.compile (CUDA graphs)
        self.loss_step = LossStep(model, cfg.objective, tcfg, self.device, bf16_enabled(tcfg.precision, self.device),
                                  distributed=ctx.distributed)
        if ctx.distributed:
            self.loss_step.module = DistributedDataParallel(self.loss_step.module, device_ids=[self.device.index]
                                                            if self.device.type == "cuda" else None)
        self.opt = build_optimizer(param_groups(model, tcfg.weight_decay), tcfg, self.device)  # fused on CUDA
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: lr_lambda(s, tcfg.warmup_steps, tcfg.steps, tcfg.min_lr_ratio))
        self.ema = AveragedModel(model, use_buffers=True) if tcfg.ema_decay > 0 else None  # ema_update
        self.watch = NonFiniteWatch(self.device)
        self.clock = clock or StepClock()
        self.clock.watch([model] + ([self.ema.module] if self.ema is not None else []))
        self.n, self.last_ckpt, self.skips, self.saved_at = Counters(), start_ckpt, 0, time.monotonic()
        self.stop = dist.StopRequest(repeat_aborts=not ctx.distributed)
        epoch, batch_in_epoch = 0, 0
        if start_ckpt is not None:  # optimizer, schedule, EMA, RNG, counters and data position of the checkpoint
            self.n, epoch, batch_in_epoch = run_folder.restore(start_ckpt, out, ctx, self.opt, self.sched, self.ema,
                                                               tcfg.grad_accum, state_problem)
        elif init_from is not None:
            seed_everything(tcfg.seed)  # the RNG state of a fresh run's first step, not what loading the weights drew
        self.start_step = self.n.step
        self.whole = WholeStep(self.loss_step, self.opt, self.ema, tcfg) if tcfg.compile_step else None
        self.stream = BatchStream(cfg, ctx, epoch, batch_in_epoch, lambda f: self.log.end_epoch(f, self.stream.pending))

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
                        stop, due = agree_flags(self.ctx, self.stop.signum > 0, tcfg.ckpt_every_minutes > 0 and
                                                time.monotonic() - self.saved_at >= 60 * tcfg.ckpt_every_minutes)
                        log = self.n.step % tcfg.log_every == 0 or self.n.step in (1, tcfg.steps)  # 1: a first loss
                        save = self.n.step % tcfg.ckpt_every == 0 or self.n.step == tcfg.steps or due or stop
                        if log or save:
                            stats = stats or self._read(step)
                            loss = stats.loss
                            if log:
                                self.log.write(stats, self.stream.epoch, float(self.sched.get_last_lr()[0]))
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
        loss = loss if self.n.step > self.start_step else logged_loss(self.out, self.n.step)
        return TrainResult(self.out, self.n.step, loss, last, dict(self.n.skipped), self.n.truncated, self.start_step)

    def step(self, micro: list[dict[str, Any]]) -> tuple[DeviceStep | None, StepStats | None]:
        """One optimizer step over this rank's micro-batches: prepare each on the host (its masks drawn once, from
        the seed ``(seed, step, a * world + rank)``), forward and backward (gradients add up to the global batch's),
        clip, AdamW, schedule, EMA. Returns the step's device values (None: a non-finite update skipped) and, with
        train.nonfinite=skip (which must decide every step), what it read; else nothing here reads the device."""
        tcfg, ctx, clock, n = self.cfg.train, self.ctx, self.clock, self.n.step
        with clock.phase("prepare"):
            seeds = [step_seed(tcfg.seed, n, a * ctx.world + ctx.rank) for a in range(len(micro))]  # masking draws
            ready = [self.loss_step.prepare(b["tokens"], s) for b, s in zip(micro, seeds, strict=True)]
            denom = global_terms(ctx, sum(r.terms for r in ready))  # a number, or a device scalar all-reduced, no wait
            sums = StepSums(self.device, len(micro))
            torch.manual_seed(step_seed(tcfg.seed, n, ctx.rank, stream=1))  # dropout: per step and rank
        for a, (batch, r) in enumerate(zip(micro, ready, strict=True)):
            last = a == len(micro) - 1
            sync = self.loss_step.module.no_sync() if ctx.distributed and not last else contextlib.nullcontext()
            with clock.phase("forward_backward"), dist.guard(ctx, "DDP forward/backward (gradient all-reduce)"), sync:
                # DDP averages gradients over ranks: x world makes that a sum, / denom the global normalisation
                scale = r.terms * ctx.world / denom  # r.terms: its loss terms, counted from its own masks
                if self.whole is not None:  # train.compile_step: from the forward to the EMA in one compiled region
                    loss, metrics, grad_norm = self.whole(batch["image"], r, scale)
                else:
                    loss, metrics = self.loss_step.forward(batch["image"], r)
                    (loss * (scale.to(loss.dtype) if torch.is_tensor(scale) else scale)).backward()
            with clock.phase("metrics_logging"):
                sums.add(loss, metrics, r.terms)
        if self.whole is None:
            with clock.phase("clip_optimizer"):
                grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), tcfg.grad_clip
                                                           if tcfg.grad_clip > 0 else float("inf"))
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
            if self.whole is None:
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
            self.sched.step()
        if self.ema is not None and self.whole is None:
            with clock.phase("ema"):
                ema_update(self.ema, self.model, tcfg.ema_decay)
        self.n.step += 1
        self.log.bar.update(1)
        return step, stats

    def _read(self, step: DeviceStep) -> StepStats:
        """The step's values, summed over ranks (:meth:`~mdc_core.run_state.RunLog.read`): where the host waits for
        the device. TrainingDiverged if a step since the last read was not finite (train.nonfinite=stop)."""
        stats = self.log.read(step, self.watch.flag(), self.stream.pending)
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
        state = TrainState(self.n, self.stream.epoch, self.stream.batch_in_epoch, self.ctx.world, self.log.global_batch,
                           int(ema.n_averaged) if ema is not None else 0, self.opt.state_dict(),
                           self.sched.state_dict(), rng_state())
        self.last_ckpt = ckpt_io.save_checkpoint(self.out, self.n.step, self.cfg, self.model,
                                                 ema_state=ema.module.state_dict() if ema is not None else None,
                                                 train_state=state.state_dict(), keep_last=self.cfg.train.keep_last)


# -- where the model starts --------------------------------------------------------------------------------------------

def seed_everything(seed: int) -> None:
    """Seed torch, Python's and NumPy's generators (the initial weights, and what a fresh run draws)."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def init_model(cfg: RunConfig, progress: bool = False) -> tuple[torch.nn.Module, RunConfig]:
    """A freshly initialised model for the run `cfg` (:func:`mdc_core.factory.create_model`) and the run's config as
    it must be saved: with ``output_vocab="corpus"`` the id table is built from the training captions and the
    returned config is a copy with its size in ``model.output_vocab_size`` (so ``config.json`` rebuilds the same
    shape); `cfg` itself is never changed."""
    if cfg.model.output_vocab != "corpus":
        return create_model(cfg, cfg.objective.name), cfg
    captions = tqdm(iter_captions(cfg.data, split="train"), desc="corpus vocabulary: reading the training captions",
                    unit=" captions", leave=False, delay=1.0, disable=not progress)  # shown when reading takes a while
    output_ids = build_output_vocab(captions, CaptionTokenizer(cfg.model.context_length))
    if progress:
        tqdm.write(f"corpus vocabulary: {len(output_ids)} token ids from {captions.n} training captions")
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, output_vocab_size=len(output_ids)))
    return create_model(cfg, cfg.objective.name, output_ids), cfg


def init_from_weights(cfg: RunConfig, source: str | Path) -> tuple[torch.nn.Module, RunConfig]:
    """A model for the run `cfg` holding the weights (not the EMA) of run or checkpoint folder `source`, and the
    run's config as it must be saved (a corpus head's size taken from `source` when `cfg` leaves it 0). Raises
    ``ValueError`` when `source`'s model differs from ``cfg.model`` (the encoder's ``pretrained`` settings aside:
    the weights replace them) or its weights do not fit `cfg`'s objective."""
    source_model, saved = load_model(source)
    arch = cfg.model
    if arch.output_vocab == "corpus" and arch.output_vocab_size == 0:
        arch = dataclasses.replace(arch, output_vocab_size=saved.model.output_vocab_size)
    there, here = dataclasses.asdict(saved.model), dataclasses.asdict(arch)
    diffs = [f"model.{k} {there[k]!r} there, {here[k]!r} here" for k in here
             if k not in ("pretrained", "pretrained_path") and there.get(k) != here[k]]
    if diffs:
        raise ValueError(f"init_from {source}: its model differs from this run's ({'; '.join(diffs[:4])})")
    model = create_model(dataclasses.replace(arch, pretrained=False, pretrained_path=""), cfg.objective.name)
    try:
        model.load_state_dict(source_model.state_dict())
    except (RuntimeError, ValueError) as err:  # CLIPModel says ValueError
        raise ValueError(f"init_from {source}: the weights of its {saved.objective.name} model do not fit a "
                         f"{cfg.objective.name} model ({str(err).splitlines()[0][:160]})") from None
    return model, dataclasses.replace(cfg, model=arch)


# -- optimizer, schedule, EMA ------------------------------------------------------------------------------------------

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


def build_optimizer(param_groups: list[dict[str, Any]], tcfg: TrainConfig, device: torch.device
                    ) -> torch.optim.Optimizer:
    """AdamW with the run's lr and betas: the fused kernel on CUDA (all parameters floating point on one device),
    the default implementation elsewhere; with train.compile_step its lr is a tensor, capturable on CUDA."""
    params = [p for g in param_groups for p in g["params"]]
    fused = device.type == "cuda" and all(p.is_cuda and p.is_floating_point() for p in params)
    whole = {"capturable": True} if tcfg.compile_step else {}  # a CUDA graph may replay the update (WholeStep)
    return torch.optim.AdamW(param_groups, lr=WholeStep.lr(tcfg.lr, tcfg, device if fused else None),
                             betas=tcfg.betas, **({"fused": True, **whole} if fused else {}))


@torch.no_grad()
def ema_update(ema: AveragedModel, model: torch.nn.Module, decay: float) -> None:
    """One EMA step of `ema` (``use_buffers=True``) towards `model`: the first copies, later ones move every
    floating-point parameter and buffer by ``1 - decay`` (``torch._foreach_lerp_``, as ``get_ema_multi_avg_fn``);
    integer buffers are copied (averaging token-id tables would round them to other ids). The update count lives on
    the CPU, so nothing waits (AveragedModel's own update copies it to the device)."""
    first = int(ema.n_averaged) == 0  # a CPU tensor (AveragedModel's default): no device read
    groups: dict[tuple[torch.device, torch.dtype], tuple[list, list]] = {}
    for avg, cur in zip([*ema.module.parameters(), *ema.module.buffers()], [*model.parameters(), *model.buffers()],
                        strict=True):
        if first or not avg.is_floating_point():
            avg.copy_(cur)
        else:
            a, c = groups.setdefault((avg.device, avg.dtype), ([], []))
            a.append(avg)
            c.append(cur)
    for a, c in groups.values():
        torch._foreach_lerp_(a, c, 1.0 - decay)
    ema.n_averaged += 1


# -- the step's parts --------------------------------------------------------------------------------------------------

def step_seed(seed: int, step: int, index: int, stream: int = 0) -> int:
    """A 63-bit seed for micro-batch `index` (global, see the module docstring) of optimizer step `step`; stream
    0 is the masking draws, stream 1 dropout (index = rank). Every random draw of a step derives from these, so
    it depends neither on the rank that draws it nor on a resume."""
    return int(np.random.SeedSequence([seed, stream, step, index]).generate_state(1, np.uint64)[0] >> np.uint64(1))


def global_terms(ctx: dist.DistContext, terms: int) -> float | torch.Tensor:
    """A step's loss terms summed over ranks, at least 1: a number in one process; under torchrun a device scalar,
    all-reduced without the host waiting for it."""
    if not ctx.distributed:
        return max(float(terms), 1.0)
    total = torch.full((), float(terms), dtype=torch.float64, device=ctx.device)
    return dist.all_reduce(ctx, total, "loss normalisation").clamp(min=1.0)


def agree_flags(ctx: dist.DistContext, stop: bool, due: bool) -> tuple[bool, bool]:
    """(stop, checkpoint due) of this rank; under torchrun, of any rank (the ranks must stop and save at the same
    step: one tiny all-reduce per step, which the host reads)."""
    if not ctx.distributed:
        return stop, due
    total = dist.all_reduce_named(ctx, {"stop": float(stop), "due": float(due)}, "stop/checkpoint flags")
    return total["stop"] > 0, total["due"] > 0


@dataclass
class DeviceStep:
    """One optimizer step as the device holds it (nothing read yet)."""

    loss_sum: torch.Tensor  # this rank's sum over micro-batches of loss x loss terms (float64)
    denom: float | torch.Tensor  # the global count of loss terms (a device scalar under torchrun)
    metrics: dict[str, torch.Tensor]  # compute_loss's other metrics, mean over micro-batches, / world (float64)
    grad_norm: torch.Tensor  # global gradient norm before clipping


class StepSums:
    """A step's device values summed over its micro-batches as they come, nothing read: the loss x its loss terms,
    and the mean of every other metric; :meth:`done` makes the :class:`DeviceStep`."""

    def __init__(self, device: torch.device, micro_batches: int) -> None:
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.means: dict[str, torch.Tensor] = {}
        self.micro_batches = micro_batches

    def add(self, loss: torch.Tensor, metrics: dict[str, torch.Tensor], terms: int) -> None:
        self.loss_sum += loss.detach().double() * terms
        for k, v in metrics.items():
            if k != "loss":
                self.means[k] = self.means.get(k, 0) + v.detach().double() / self.micro_batches

    def done(self, denom: float | torch.Tensor, grad_norm: torch.Tensor, world: int) -> DeviceStep:
        return DeviceStep(self.loss_sum, denom, {k: v / world for k, v in sorted(self.means.items())}, grad_norm)


class NonFiniteWatch:
    """The first step whose loss or gradient norm was not finite, its loss and norm, kept on the device."""

    def __init__(self, device: torch.device) -> None:
        self.first_step = torch.full((), -1, dtype=torch.long, device=device)
        self.loss = torch.zeros((), dtype=torch.float64, device=device)
        self.grad_norm = torch.zeros((), dtype=torch.float64, device=device)

    def note(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """Record step `step` if it is the first non-finite one (device ops only)."""
        first = (self.first_step < 0) & ~(torch.isfinite(loss) & torch.isfinite(grad_norm))
        self.first_step = torch.where(first, step, self.first_step)
        self.loss = torch.where(first, loss.double(), self.loss)
        self.grad_norm = torch.where(first, grad_norm.double(), self.grad_norm)

    def flag(self) -> torch.Tensor:
        """1.0 if some step was not finite, else 0.0 (a device scalar, to read with the step's other values)."""
        return (self.first_step >= 0).double()

    def describe(self) -> str:
        """What happened, for the error message (reads the device)."""
        return f"loss became {float(self.loss)} (grad norm {float(self.grad_norm)}) at step {int(self.first_step)}"


class StepClock:
    """The phases the trainer marks (``with clock.phase("read"): ...``); this clock does nothing (``mdc bench step``
    passes one that times them). A step is the phases from one ``read`` to the next: ``read`` (the micro-batches
    with their tokens), ``prepare`` (masking seeds, :func:`~mdc_core.objectives.prepare_batch`, loss denominators,
    the copy of the prepared batch), ``forward_backward``, ``clip_optimizer`` (gradient clipping, AdamW, zero_grad,
    schedule), ``ema``, ``metrics_logging`` (the step's device values, the non-finite watch, the logging step's read
    and record) and ``checkpoint``."""

    PHASES = ("read", "prepare", "forward_backward", "clip_optimizer", "ema", "metrics_logging", "checkpoint")

    def watch(self, modules: Iterable[torch.nn.Module]) -> None:
        """Told once which modules (the model, its EMA copy) the step trains."""

    def phase(self, name: str) -> contextlib.AbstractContextManager:
        return _NO_PHASE


_NO_PHASE = contextlib.nullcontext()
