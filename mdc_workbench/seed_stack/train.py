"""Train a seed stack into run folders: member k of the stack is written as the solo run of its seed would be.

``train_stack(cfg, out, seeds=[3, 5, 8])`` (or ``members=K``: seeds ``train.seed ... train.seed + K - 1``; ``mdc
train --members K``) trains the members in one process, one :class:`~mdc_workbench.seed_stack.step.SeedStack` step
for all of them, and writes each into ``out/seed_<seed>/``, a run folder of the solo layout
(:mod:`mdc_core.run_folder`): the lock, ``data_fingerprint.json``, ``config.json`` with the member's own
``train.seed``, ``metrics.jsonl``/``epochs.jsonl`` and ``checkpoints/step_*`` with the member's weights, EMA and a
``state.pt`` in the solo run's shapes (its AdamW moments, schedule, RNG, data position and counters). So ``mdc
probe``, ``mdc sample``, export and the app open a member as a run, and ``mdc train --resume --out
out/seed_<seed>`` continues it alone as if it had been trained alone.

Everything around the step is the core's: each member's folder is locked and checked, its data fingerprinted and
its resume point chosen by :func:`mdc_core.run_folder.prepare_run`; its data read by its own
:class:`~mdc_core.data.BatchStream`; its records written by its own :class:`~mdc_core.run_state.RunLog` at
the solo run's log steps (so its ``metrics.jsonl`` is the solo run's, ``samples_per_s`` aside); its checkpoints by
:func:`mdc_core.checkpoint.save_checkpoint` with a :class:`~mdc_core.run_state.TrainState`, at the solo run's
checkpoint steps. SIGINT or SIGTERM stops every member at the next step boundary with a checkpoint
(:class:`~mdc_core.train.TrainingInterrupted`). In mode "each" (the CPU's default) the member folders hold the solo
runs' numbers to the bit; in mode "vmap" up to rounding (:mod:`mdc_workbench.seed_stack.step`).

A resume (``resume=True``) continues every member from its latest intact checkpoint; when a kill between two
members' checkpoints left them at different steps, the members ahead go back to the others' step if they still
keep its checkpoint (``train.keep_last`` >= 2), and their logs are cut back to it. One process, one device; what
a stack does not do: ``train.nonfinite=skip`` (a non-finite member stops the stack with
:class:`~mdc_core.run_state.TrainingDiverged` naming it, as ``stop`` stops a solo run), compilation, torchrun,
``init_from`` and a weights-only resume.
"""

from __future__ import annotations

import copy
import json
import shutil
import signal
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mdc_core import checkpoint as ckpt_io
from mdc_core import distributed as dist
from mdc_core import run_folder
from mdc_core.config import RunConfig
from mdc_core.data import BatchStream
from mdc_core.factory import load_model
from mdc_core.run_state import Counters, HookFactory, RunLog, TrainState, diverged, logged_loss, rng_state
from mdc_core.runlock import RunLock
from mdc_core.train import NonFiniteWatch, TrainingInterrupted, TrainResult, lr_lambda

from .step import SeedStack, init_members, member_config, member_step


def member_dir(out: str | Path, seed: int) -> Path:
    """Member `seed`'s run folder in stack folder `out`."""
    return Path(out) / f"seed_{seed}"


def stack_seeds(cfg: RunConfig, members: int | None = None, seeds: Sequence[int] | None = None) -> list[int]:
    """The members' seeds: `seeds` as given, or `members` consecutive seeds from ``cfg.train.seed``."""
    if (members is None) == (seeds is None):
        raise ValueError("give a seed stack either members=K or seeds=[...], not both or neither")
    if seeds is None:
        if isinstance(members, bool) or not isinstance(members, int) or members < 1:
            raise ValueError(f"members={members!r}: a seed stack needs a positive number of members")
        return [cfg.train.seed + k for k in range(members)]
    seeds = [int(s) for s in seeds]
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ValueError(f"seeds={seeds}: a seed stack needs distinct non-negative seeds")
    return seeds


@dataclass
class Member:
    """One member's run folder and the core pieces that keep it: lock, config, data, records and counters."""

    seed: int
    out: Path
    lock: RunLock
    created: bool
    cfg: RunConfig | None = None
    start_ckpt: Path | None = None
    stream: BatchStream | None = None
    log: RunLog | None = None
    counters: Counters | None = None
    watch: NonFiniteWatch | None = None
    rng: dict[str, Any] | None = None  # its generators' states as its solo run holds them (state.pt's "rng")
    last_ckpt: Path | None = None


def train_stack(cfg: RunConfig, out: str | Path, *, members: int | None = None, seeds: Sequence[int] | None = None,
                resume: bool = False, mode: str = "auto", progress: bool = True,
                hooks: Sequence[HookFactory] = ()) -> list[TrainResult]:
    """Train the seed stack of `cfg` (its ``train.seed`` aside) into stack folder `out`: one run folder per member,
    ``out/seed_<seed>`` (:func:`member_dir`), each what ``mdc train`` would write for that seed. `members` or
    `seeds` name the members (:func:`stack_seeds`); `resume` continues them from their checkpoints; `mode` is
    :class:`~mdc_workbench.seed_stack.step.SeedStack`'s; `hooks` are given to every member's records, as
    :func:`mdc_core.train.train` gives them. Returns each member's :class:`~mdc_core.train.TrainResult`."""
    cfg.validate()
    seeds = stack_seeds(cfg, members, seeds)
    if cfg.train.nonfinite != "stop":
        raise ValueError(f"train.nonfinite={cfg.train.nonfinite!r}: a seed stack steps every member at once and "
                         "cannot drop one member's update; use train.nonfinite=stop")
    ctx = dist.setup(cfg.train.device, cfg.train.dist_timeout_s)
    if ctx.distributed:
        dist.teardown(ctx)
        raise ValueError("a seed stack trains in one process: run it without torchrun")
    out = Path(out)
    created = not out.exists()
    team = [Member(s, member_dir(out, s), RunLock(member_dir(out, s), "mdc train --members" + " --resume" * resume),
                   not member_dir(out, s).exists()) for s in seeds]
    try:
        for m in team:
            run_folder.lock_run_folder(m.lock, ctx)
            m.cfg, m.start_ckpt, problem = run_folder.prepare_run(
                run_folder.resolve_data_paths(member_config(cfg, m.seed)), m.out, resume, True, lr_lambda)
            if problem:
                raise ValueError(f"--resume: member {m.out} can resume from weights only ({problem}); a seed stack "
                                 "resumes its members exactly: resume that member alone (mdc train --resume --out "
                                 f"{m.out})")
        return StackTrainer(team, ctx, mode, progress, hooks).run()
    except BaseException:
        for m in team:
            if m.lock.held and m.created and run_folder.never_started(m.out):
                shutil.rmtree(m.out, ignore_errors=True)
        if created and out.is_dir() and not any(out.iterdir()):  # a stack that could not start leaves no folder
            out.rmdir()
        raise
    finally:
        for m in team:
            m.lock.release()
        dist.teardown(ctx)


def common_start(team: Sequence[Member]) -> int:
    """The step every member resumes from (0: a fresh start). Members a kill left ahead of the others go back to
    the others' step (their checkpoint of it must be intact). ValueError when no common step is left."""
    steps = [0 if m.start_ckpt is None else ckpt_step(m.start_ckpt) for m in team]
    target = min(steps)
    for m, step in zip(team, steps, strict=True):
        if step == target:
            continue
        back = m.out / ckpt_io.CKPT_DIR / f"step_{target:08d}"
        if target == 0 or not back.is_dir() or intact_problem(back):
            at = ", ".join(f"seed {t.seed}: {s}" for t, s in zip(team, steps, strict=True))
            raise ValueError(f"--resume: the stack's members stopped at different steps ({at}) and member {m.out} "
                             f"keeps no intact checkpoint of step {target}; resume its members alone (mdc train "
                             "--resume --out MEMBER)")
        warnings.warn(f"--resume: member {m.out} is at step {step}, others at {target}: it goes back to {back.name}",
                      stacklevel=3)
        m.start_ckpt = back
    return target


def ckpt_step(ckpt: Path) -> int:
    return int(json.loads((ckpt / "meta.json").read_text())["step"])


def intact_problem(ckpt: Path) -> str:
    """What keeps `ckpt` from resuming its step exactly ('' when nothing does): the checks of
    :func:`mdc_core.run_folder.resume_point`."""
    return ckpt_io.diagnose(ckpt) or ckpt_io.config_problem(ckpt) or ckpt_io.step_problem(ckpt) or \
        run_folder.train_state_problem(ckpt)


class StackTrainer:
    """The members' run folders prepared (:func:`train_stack`), their stack built or restored; :meth:`run` is the
    loop of :class:`mdc_core.train.Trainer` for all of them at once."""

    def __init__(self, team: list[Member], ctx: dist.DistContext, mode: str, progress: bool,
                 hooks: Sequence[HookFactory]) -> None:
        self.team, self.ctx, self.progress, self.hooks = team, ctx, progress, hooks
        start = common_start(team)
        models: list[nn.Module] = []
        for m in team:
            if m.start_ckpt is None:  # as Trainer: seed_everything(seed), init_model; the rng its step 0 finds
                built, saved = init_members(m.cfg, [m.seed], progress=progress and not models)
                model, m.cfg, m.rng = built[0], member_config(saved, m.seed), rng_state()
            else:
                model = load_model(m.start_ckpt)[0]
            models.append(model)
            m.out.mkdir(parents=True, exist_ok=True)
            m.cfg.save(m.out / "config.json")
        self.cfg = team[0].cfg  # every member's but for train.seed
        self.scratch = copy.deepcopy(models[0])  # a solo model: what save_checkpoint and the hooks are given
        self.stack = SeedStack(self.cfg, models, [m.seed for m in team], ctx.device, mode)
        states = []
        for m in team:
            m.watch = NonFiniteWatch(ctx.device)
            epoch, batch_in_epoch = 0, 0
            m.counters = Counters()
            if m.start_ckpt is not None:
                state, member = self._restore(m)
                states.append(member)
                m.counters, epoch, batch_in_epoch, m.rng = state.counters, state.epoch, state.batch_in_epoch, \
                    state.rng
            m.last_ckpt = m.start_ckpt
            m.stream = BatchStream(m.cfg, ctx, epoch, batch_in_epoch,
                                   lambda finished, m=m: m.log.end_epoch(finished, m.stream.pending))
        if states:
            self.stack.load_member_states(states)
        self.start_step = start
        self.stop = dist.StopRequest(repeat_aborts=True)
        self.saved_at = time.monotonic()

    def _restore(self, m: Member) -> tuple[TrainState, dict[str, Any]]:
        """Member `m`'s train state from its checkpoint, its logs cut back to that step, and its
        :meth:`SeedStack.member_state`."""
        ckpt = m.start_ckpt
        state = TrainState.from_state_dict(ckpt_io.load_train_state(ckpt))
        if state.world != 1:
            raise ValueError(f"--resume: member {m.out} was trained on {state.world} ranks; a seed stack resumes "
                             "one-process runs only")
        ema = ckpt / "ema.safetensors"
        if self.stack.ema is not None and not ema.is_file():
            raise ValueError(f"--resume: member {m.out} has no EMA weights in {ckpt.name} but train.ema_decay > 0")
        run_folder.truncate_jsonl(m.out / "metrics.jsonl", state.step)
        run_folder.truncate_jsonl(m.out / "epochs.jsonl", state.step)
        member = {"model": ckpt_io.load_weights(ckpt / "model.safetensors"),
                  "ema": ckpt_io.load_weights(ema) if self.stack.ema is not None else None,
                  "optimizer": state.optimizer, "scheduler": state.scheduler, "step": state.step,
                  "ema_updates": state.ema_n_averaged}
        return state, member

    def run(self) -> list[TrainResult]:
        """Steps until train.steps or a stop request (then TrainingInterrupted, after every member's checkpoint)."""
        tcfg, team, stack = self.cfg.train, self.team, self.stack
        losses = [float("nan")] * len(team)
        stopped_by = 0
        for k, m in enumerate(team):
            how = f"seed stack of {len(team)} (mode {stack.mode}), member seed {m.seed}"
            m.log = RunLog(m.cfg, m.out, self.ctx, m.counters, self.progress and k == 0, how, self.hooks)
        try:
            with self.stop:
                while stack.n < tcfg.steps and not stopped_by:
                    micro = [m.stream.take(tcfg.grad_accum) for m in team]
                    n = stack.n
                    step = stack.step(micro)
                    for k, m in enumerate(team):
                        m.counters.step = stack.n
                        m.log.pending_samples += float(sum(b["tokens"].shape[0] for b in micro[k]))
                        m.log.pending_truncated += sum(b["truncated"] for b in micro[k])
                        own = member_step(step, k)
                        m.watch.note(n, own.loss_sum / own.denom, own.grad_norm)
                    team[0].log.bar.update(1)
                    stop = self.stop.signum > 0
                    due = tcfg.ckpt_every_minutes > 0 and \
                        time.monotonic() - self.saved_at >= 60 * tcfg.ckpt_every_minutes
                    log = stack.n % tcfg.log_every == 0 or stack.n in (1, tcfg.steps)
                    save = stack.n % tcfg.ckpt_every == 0 or stack.n == tcfg.steps or due or stop
                    if log or save:
                        stats = [self._read(m, member_step(step, k)) for k, m in enumerate(team)]
                        losses = [s.loss for s in stats]
                        if log:
                            for m, s in zip(team, stats, strict=True):
                                m.log.write(s, m.stream.epoch, stack.sched.get_last_lr()[0])
                    if save:
                        self._checkpoint(hooks=not stop)
                    stopped_by = int(self.stop.signum or signal.SIGTERM) if stop else 0
                stopped_by = stopped_by or self.stop.signum
        finally:
            for m in team:
                m.stream.close()
                m.log.close()
        if stopped_by:
            raise TrainingInterrupted(stopped_by, stack.n, team[0].last_ckpt)
        results = []
        for m, loss in zip(team, losses, strict=True):
            last = m.last_ckpt or ckpt_io.latest_checkpoint(m.out)
            loss = loss if stack.n > self.start_step else logged_loss(m.out, stack.n)
            results.append(TrainResult(m.out, stack.n, loss, last, dict(m.counters.skipped), m.counters.truncated,
                                       self.start_step))
        return results

    def _read(self, m: Member, step: Any) -> Any:
        """Member `m`'s values of the step (its RunLog's read); TrainingDiverged naming it when it was not finite."""
        stats = m.log.read(step, m.watch.flag(), m.stream.pending)
        if stats.diverged:
            raise diverged(f"member seed {m.seed}: {m.watch.describe()}", "train.nonfinite=stop; a seed stack "
                           "stops all its members", m.last_ckpt)
        return stats

    def _checkpoint(self, hooks: bool) -> None:
        """Every member's checkpoint of this step, as its solo run writes it; then its hooks' checkpoint call."""
        self.saved_at = time.monotonic()
        stack = self.stack
        for k, m in enumerate(self.team):
            own = stack.member_state(k)
            rng = member_rng(m.rng, stack.random.states[k], self.ctx.device)
            state = TrainState(m.counters, m.stream.epoch, m.stream.batch_in_epoch, 1, m.log.global_batch,
                               own["ema_updates"], own["optimizer"], own["scheduler"], rng)
            self.scratch.load_state_dict(own["model"])
            m.last_ckpt = ckpt_io.save_checkpoint(m.out, stack.n, m.cfg, self.scratch, ema_state=own["ema"],
                                                  train_state=state.state_dict(), keep_last=m.cfg.train.keep_last)
            if hooks:
                m.log.checkpoint(self.scratch.train())


def member_rng(saved: dict[str, Any], dropout: torch.Tensor | None, device: torch.device) -> dict[str, Any]:
    """A member's generator states as its solo run's checkpoint holds them (:func:`~mdc_core.run_state.rng_state`'s
    form): `saved` (what its start left: Python's and NumPy's, which training never draws from) with the device's
    default generator where the member's dropout left it (`dropout`: :class:`~mdc_workbench.seed_stack.step.
    MemberRandom`'s; None before its first step)."""
    if dropout is None:
        return saved
    if device.type == "cuda":
        cuda = list(saved.get("cuda") or [])
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index < len(cuda):
            cuda[index] = dropout
        return {**saved, "cuda": cuda}
    return {**saved, "torch": dropout}
