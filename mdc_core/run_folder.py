"""The run folder, and how a run starts or resumes in it: what :func:`mdc_core.train.train` does before its first
step. The folder, top to bottom as the trainer meets it::

    RUN/.mdc.lock              the writer's lock (mdc_core.runlock)
    RUN/data_fingerprint.json  what the training split holds (record_fingerprint)
    RUN/config.json            the run's RunConfig, written by the trainer
    RUN/metrics.jsonl          one record per logged step; epochs.jsonl: one per epoch (mdc_core.run_state)
    RUN/checkpoints/step_*/    weights, config.json, state.pt, meta.json (mdc_core.checkpoint)

* **One writer.** Rank 0 holds the folder's lock from before anything is written; every rank stops at once, naming
  the holder, when another process holds it (:func:`lock_run_folder`).
* **Start or resume.** :func:`prepare_run` checks the data and the folder and picks the checkpoint to continue from
  (:func:`resume_point`: damaged ones set aside as ``corrupt_step_*``); the config given must be the saved one
  (only ``train.steps`` and the data's location may change). A run is started over only when it never reached a
  checkpoint, and then its old logs are set aside, never rewritten (:func:`refuse_start_over`).
* **Data fingerprint.** ``data_fingerprint.json`` records a digest of the training split's content and of each
  shard (with its size and times, so a resume in place reads no shard again); ``--resume --data NEW`` accepts data
  that moved when its content is the same (:func:`accept_moved_data`). A refused resume writes nothing.
* **Restore.** :func:`restore` puts back what a checkpoint's train state holds and cuts the logs back to its step;
  when only a checkpoint's weights are intact, the step, the data position and the counters come from the logs
  (:func:`weights_only_state`; AdamW's moments and the RNG are lost).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from . import checkpoint as ckpt_io
from . import distributed as dist
from .config import RunConfig
from .run_state import Counters, TrainState, count, logged_step, read_jsonl, resume_problem, set_rng_state
from .runlock import LinkRefused, RunFolderBusy, RunLock, refuse_links
from .sources import data_fingerprint, resolve_source

FINGERPRINT_FILE = "data_fingerprint.json"


# -- one writer --------------------------------------------------------------------------------------------------------

def lock_run_folder(lock: RunLock, ctx: dist.DistContext) -> None:
    """Rank 0 takes the run folder's lock; every rank raises :class:`RunFolderBusy` if another process holds it, and
    :class:`~mdc_core.runlock.LinkRefused` if the folder holds a symbolic link (a run never writes through one)."""
    refused: RunFolderBusy | LinkRefused | None = None
    if ctx.is_main:
        try:
            lock.acquire()
            refuse_links(lock.folder)
        except (RunFolderBusy, LinkRefused) as err:
            refused = err
    if ctx.distributed:
        refused = dist.broadcast_object(ctx, refused, "run-folder lock")
    if refused is not None:
        raise refused


# -- start or resume ---------------------------------------------------------------------------------------------------

def resolve_data_paths(cfg: RunConfig) -> RunConfig:
    """`cfg` with ``data.path`` and ``data.images`` absolute (``data.path_as_given`` keeps what was typed), so
    that a run started with ``--data i2d`` resumes with the absolute path or from another working directory."""
    def absolute(path: str) -> str:
        return os.path.abspath(os.path.expanduser(path)) if path and "://" not in path else path
    d = cfg.data
    data = dataclasses.replace(d, path=absolute(d.path), images=absolute(d.images),
                               path_as_given=d.path_as_given or d.path)
    return dataclasses.replace(cfg, data=data)


def prepare_run(cfg: RunConfig, out: Path, resume: bool, main: bool, lr_lambda: Callable[..., float],
                lock: RunLock | None = None) -> tuple[RunConfig, Path | None, str]:
    """Check the data and the run folder; the config to train (the saved one when resuming), the checkpoint to
    start from (None: a fresh run) and, for a weights-only start, what is wrong with its train state. Rank 0 (which
    holds the lock) clears the half-written checkpoints of dead writers and sets damaged checkpoints aside, and
    holds a shared lock on the data folder for the run (`lock`: :meth:`~mdc_core.runlock.RunLock.share`), which
    ``mdc data synth --overwrite`` respects. The data record is written at a fresh start only (or once, to record
    the content of a run recorded before contents were hashed); a resume compares with it (:func:`check_same_data`)
    and never rewrites it."""
    if not cfg.data.path:
        raise ValueError("data.path is empty: pass --data DIR (e.g. a folder written by `mdc data synth`)")
    try:  # fails here, before any work
        source = resolve_source(cfg.data.path, cfg.data.format, "train", cfg.data.images or None)
    except FileNotFoundError as err:
        if not resume:
            raise
        raise FileNotFoundError(f"{err}. If the run's data moved, pass --data NEW_PATH: --resume accepts it when "
                                "its content is the same") from None
    holder = ckpt_io.run_holding(out)
    if holder is not None:
        raise ValueError(f"--out {out} is inside the run {holder}'s {ckpt_io.CKPT_DIR}/ folder: a run folder is never "
                         "inside another run's checkpoints (it would rewrite a checkpoint, and pruning would delete "
                         "it); resume the run itself (--out RUN) or train into another --out (nothing was written)")
    if main and lock is not None:  # no data set is replaced under the run (mdc data synth --overwrite refuses)
        for folder in sorted({Path(f) for f in [source.root, *(Path(s).parent for s in source.shards)] if f}):
            lock.share(folder)
    if main and (removed := ckpt_io.remove_stale_temporaries(out)):
        warnings.warn(f"removed what writers that are no longer running left in {out}: {', '.join(removed)}",
                      stacklevel=3)
    if not resume and (ckpt_io.checkpoint_folders(out) or (out / "metrics.jsonl").exists()):
        raise FileExistsError(f"run folder {out} already holds a run; pass --resume to continue it or choose "
                              "another --out (nothing was overwritten)")
    recorded_shards = known_digests(out)
    known = dict(recorded_shards)
    fingerprint = source.fingerprint(known)  # reads each shard not recorded with its size and times
    own = {str(Path(shard).resolve()) for shard in source.shards}
    shards = {path: entry for path, entry in known.items() if path in own}  # what the record keeps
    if not resume:
        if main:
            record_fingerprint(out, cfg, fingerprint, shards)
        return cfg, None, ""
    start_ckpt, state_problem = resume_point(out, set_aside_damaged=main)
    if start_ckpt is None:
        if not ((out / "config.json").is_file() or (out / "metrics.jsonl").is_file()):
            raise FileNotFoundError(f"--resume: {out} holds no complete checkpoint to resume from")
        refuse_start_over(out, cfg.train.ckpt_every)
        kept = set_logs_aside(out) if main else []
        also = f" (its log so far is kept as {', '.join(kept)})" if kept else ""
        warnings.warn(f"--resume: {out} holds a run that stopped before its first checkpoint; starting it over "
                      f"from step 0{also}", stacklevel=3)
        return cfg, None, ""
    saved = resolve_data_paths(RunConfig.load(start_ckpt / "config.json"))  # older runs saved paths as typed
    saved = accept_moved_data(saved, cfg, out, fingerprint, known)
    _check_resume_config(saved, cfg)
    check_same_data(out, saved, fingerprint, recorded_shards, known)
    done = json.loads((start_ckpt / "meta.json").read_text())["step"]
    check_steps(saved, cfg, done, lr_lambda)
    if state_problem:
        warnings.warn(f"--resume: {state_problem}, and no checkpoint has intact train state: resuming from "
                      f"{start_ckpt.name}'s weights (and EMA, if saved) only. Lost: the optimizer state (AdamW's "
                      "moments restart from zero) and the RNG state; the step, the learning-rate schedule, the data "
                      "position (from epochs.jsonl) and the counters go on, but the run will not match an "
                      "uninterrupted one", stacklevel=3)
    if main and not content_recorded(out):  # the resume is accepted: the first write
        record_fingerprint(out, saved, fingerprint, shards)
    steps = dataclasses.replace(saved.train, steps=cfg.train.steps)  # the one setting a resume may change
    return dataclasses.replace(saved, train=steps), start_ckpt, state_problem


def _check_resume_config(saved: RunConfig, given: RunConfig) -> None:
    """Resuming keeps the saved config; a different one given now (other than train.steps) is an error."""
    a, b = saved.to_dict(), given.to_dict()
    a["train"]["steps"] = b["train"]["steps"]
    a["model"]["output_vocab_size"] = b["model"]["output_vocab_size"] = 0
    a["preset"] = b["preset"] = ""
    a["data"]["path_as_given"] = b["data"]["path_as_given"] = ""  # the resolved paths are compared
    diffs = [f"{s}.{k}: saved {a[s][k]!r}, given {b[s][k]!r}" for s in a if isinstance(a[s], dict)
             for k in a[s] if a[s][k] != b[s].get(k)]
    if diffs:
        raise ValueError("--resume with a config that differs from the run's saved config.json: " +
                         "; ".join(diffs[:5]) + ". Resume with the same options (only --steps may change).")


def check_steps(saved: RunConfig, given: RunConfig, done: int, lr_lambda: Callable[..., float]) -> None:
    """`--steps` on ``--resume``: an error below `done` (the checkpoint's step); a warning when extending the run
    moves the schedule (`lr_lambda`: :func:`mdc_core.train.lr_lambda`)."""
    steps, before = given.train.steps, saved.train.steps
    if steps < done:
        raise ValueError(f"--steps {steps} is below the {done} steps this run has taken (checkpoint "
                         f"step_{done:08d}): nothing to train. Pass --steps N > {done} to train it longer")
    if steps == before or steps == done:
        return
    old, new = (c.train.lr * lr_lambda(done, c.train.warmup_steps, c.train.steps, c.train.min_lr_ratio)
                for c in (saved, given))
    if not math.isclose(old, new, rel_tol=1e-6, abs_tol=1e-12):
        warnings.warn(f"--steps {steps} (the run was set up for {before}): the cosine schedule now decays over "
                      f"{steps} steps, so the learning rate at step {done} changes from {old:.3g} to {new:.3g}",
                      stacklevel=3)


def resume_point(run_dir: str | Path, *, set_aside_damaged: bool = False) -> tuple[Path | None, str]:
    """The checkpoint ``--resume`` continues from, and what is wrong with its train state ('' for a full resume).

    Newest first, the first checkpoint whose files, config and step verify (:mod:`mdc_core.checkpoint`) and whose
    ``state.pt`` resumes that very step (:func:`train_state_problem`); each newer damaged one is named in a warning
    and, with `set_aside_damaged`, renamed ``corrupt_step_*``. When none is intact but one lacks only its train
    state, the newest such one, weights only (the second value says what is wrong). (None, '') without checkpoints;
    :class:`~mdc_core.checkpoint.CheckpointError` when every checkpoint's weights or meta.json are damaged."""
    damaged: list[tuple[Path, str]] = []
    weights_only: tuple[Path, str] | None = None
    start = None
    for ckpt in reversed(ckpt_io.checkpoint_folders(run_dir)):
        problem = ckpt_io.diagnose(ckpt) or ckpt_io.config_problem(ckpt) or ckpt_io.step_problem(ckpt) or \
            train_state_problem(ckpt)
        if not problem:
            start = ckpt
            break
        rest = ckpt_io.listed_files(ckpt, ckpt_io.WEIGHTS_ONLY)
        if weights_only is None and rest is not None and not ckpt_io.diagnose(ckpt, rest) and \
                not ckpt_io.config_problem(ckpt) and not ckpt_io.step_problem(ckpt):
            weights_only = (ckpt, problem)
        else:
            damaged.append((ckpt, problem))
    state_problem = ""
    if start is None and weights_only is not None:
        start, state_problem = weights_only
    elif weights_only is not None:
        damaged.insert(0, weights_only)
    damaged.sort(key=lambda d: d[0].name, reverse=True)
    if set_aside_damaged:
        damaged = [(ckpt_io.set_aside(ckpt), problem) for ckpt, problem in damaged]
    if start is None and damaged:
        moved = f" (set aside as {', '.join(c.name for c, _ in damaged)}, kept as found)" if set_aside_damaged else ""
        raise ckpt_io.CheckpointError(f"{damaged[0][1]}; no intact checkpoint left in {run_dir}{moved}: nothing to "
                                      "resume from. Train into another --out")
    if damaged:
        moved = f" (set aside as {', '.join(c.name for c, _ in damaged)})" if set_aside_damaged else ""
        how = f"{start.name}, weights only (see the next warning)" if state_problem else \
            f"the newest intact checkpoint, {start.name}"
        warnings.warn(f"{'; '.join(p for _, p in damaged)}{moved}; resuming from {how}", stacklevel=2)
    return start, state_problem


def train_state_problem(ckpt: str | Path) -> str:
    """What keeps checkpoint `ckpt`'s ``state.pt`` from resuming it exactly, in one line ('' when nothing does):
    :func:`~mdc_core.run_state.resume_problem` of the step ``meta.json`` records (read with ``mmap`` and
    ``weights_only``). Call it on a folder whose files and step verify."""
    ckpt = Path(ckpt)
    step = json.loads((ckpt / "meta.json").read_text())["step"]
    try:
        state = torch.load(ckpt / "state.pt", map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError:  # its message advises weights_only=False: never taken
        return ckpt_io.unsafe_pickle(ckpt / "state.pt")
    except (RuntimeError, EOFError, OSError, ValueError) as err:
        return f"checkpoint file {ckpt / 'state.pt'} cannot be read ({type(err).__name__}: {str(err)[:120]})"
    problem = resume_problem(state, step)
    return f"checkpoint file {ckpt / 'state.pt'} does not resume {ckpt.name}: {problem}" if problem else ""


def refuse_start_over(out: Path, ckpt_every: int, *, asked: str = "--resume",
                      remedy: str = "train into another --out") -> None:
    """Raise ``FileNotFoundError`` when run folder `out`, which has no checkpoint to resume from, once held one
    (damaged checkpoints set aside, or a metrics log past the first checkpoint step): starting it over from step 0
    would bury what is left of it. `asked` names what asked for the run, `remedy` what the user can do instead."""
    aside = sorted(p.name for p in (out / ckpt_io.CKPT_DIR).glob(ckpt_io.CORRUPT_PREFIX + "*"))
    if aside:
        raise FileNotFoundError(f"{asked}: {out} holds no intact checkpoint: its checkpoints were damaged and set "
                                f"aside as {', '.join(aside[::-1][:4])} (kept as found); nothing to resume from, and "
                                f"it is not started over: {remedy}")
    logged = max((r.get("step", 0) for r in read_jsonl(out / "metrics.jsonl", math.inf)), default=0)
    if logged > ckpt_every:  # step ckpt_every itself is logged just before its checkpoint is written
        raise FileNotFoundError(f"{asked}: {out} has no checkpoint, but its metrics.jsonl logged step {logged}, "
                                f"past its first checkpoint (step {ckpt_every}): its checkpoints were "
                                "deleted or moved. Nothing to resume from, and it is not started over: put the "
                                f"checkpoints back or {remedy}")


def set_logs_aside(out: Path) -> list[str]:
    """Rename the non-empty logs of a run that is started over (``metrics.jsonl`` -> ``metrics_before_start_over_
    N.jsonl``, the same for ``epochs.jsonl``), so that starting over never rewrites a log; returns the new names."""
    kept = []
    for name in ("metrics", "epochs"):
        log = out / f"{name}.jsonl"
        if log.is_file() and log.read_text().strip():
            n = 1
            while (out / f"{name}_before_start_over_{n}.jsonl").exists():
                n += 1
            target = out / f"{name}_before_start_over_{n}.jsonl"
            os.replace(log, target)
            kept.append(target.name)
    return kept


def never_started(out: Path) -> bool:
    """`out` holds no checkpoint and no logged step."""
    metrics = out / "metrics.jsonl"
    return not ckpt_io.checkpoint_folders(out) and not (metrics.is_file() and metrics.read_text().strip())


# -- data fingerprint --------------------------------------------------------------------------------------------------

def _record(out: Path) -> dict[str, Any]:
    """``out/data_fingerprint.json`` ({} when missing or unreadable)."""
    try:
        record = json.loads((out / FINGERPRINT_FILE).read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    return record if isinstance(record, dict) else {}


def known_digests(out: Path) -> dict[str, dict[str, Any]]:
    """The shard digests the run folder recorded (``{absolute path: {"bytes", "mtime_ns", "ctime_ns", "sha256"}}``),
    so that a resume reads no shard whose size and modification and change times are unchanged."""
    shards = _record(out).get("shards")
    return dict(shards) if isinstance(shards, dict) else {}


def content_recorded(out: Path) -> bool:
    """The run folder's data record holds a content fingerprint (``version``): it is never written again."""
    recorded = _record(out).get("fingerprint")
    return isinstance(recorded, dict) and "version" in recorded


def check_same_data(out: Path, saved: RunConfig, fingerprint: dict[str, Any] | None,
                    recorded_shards: dict[str, dict[str, Any]], now: dict[str, dict[str, Any]]) -> None:
    """``ValueError`` naming what differs when the data a resume reads (`fingerprint`, shard digests `now`) is not
    what the run recorded at its start (`recorded_shards` and the content fingerprint of ``data_fingerprint.json``):
    data changed in place (captions edited, ``mdc data synth --overwrite``) is never trained on silently. Records
    from before contents were hashed are compared by :func:`accept_moved_data` only."""
    recorded = _record(out).get("fingerprint")
    if fingerprint is None or not (isinstance(recorded, dict) and "version" in recorded) or recorded == fingerprint:
        return
    changed = sorted(Path(path).name for path, entry in now.items() if path in recorded_shards and
                     isinstance(recorded_shards[path], dict) and recorded_shards[path].get("sha256") != entry["sha256"])
    what = (f"shard{'s' if len(changed) > 1 else ''} {', '.join(changed[:3])}{', ...' if len(changed) > 3 else ''} "
            "changed" if changed else
            f"{recorded.get('items')} items recorded, {fingerprint.get('items')} now" if
            recorded.get("items") != fingerprint.get("items") else "its shard list, table or manifest.json changed")
    raise ValueError(f"--resume: the data at {saved.data.path} is not what this run recorded at its start ({what}; "
                     f"{out / FINGERPRINT_FILE}): restore the run's data, or start a new run (nothing was written)")


def record_fingerprint(out: Path, cfg: RunConfig, fingerprint: dict[str, Any] | None,
                       shards: dict[str, dict[str, Any]]) -> None:
    """Write ``out/data_fingerprint.json`` (what :func:`accept_moved_data` compares a moved data folder with), with
    the digests of the data's shards (`shards`: :func:`known_digests`'s form), atomically."""
    if fingerprint is not None:
        record = {"path": cfg.data.path, "images": cfg.data.images, "fingerprint": fingerprint, "shards": shards}
        ckpt_io.atomic_write_text(out / FINGERPRINT_FILE, json.dumps(record, indent=2) + "\n")


def accept_moved_data(saved: RunConfig, given: RunConfig, out: Path, fingerprint: dict[str, Any] | None,
                      known: dict[str, dict[str, Any]] | None = None) -> RunConfig:
    """`saved` with the data location of `given` when both name the same content (a moved or copied data folder);
    `saved` unchanged when the locations are the same or the old one still holds other data (the caller then
    reports the config difference); ``ValueError`` when the content differs from what the run recorded.
    `fingerprint` is that of `given`'s data, `known` the shard digests the run recorded. A run folder from before
    contents were hashed recorded shard names and sizes only: when the old location is gone, the new data's names
    and sizes are compared with that (the warning says so) and the caller then records the content fingerprint."""
    a, b = saved.data, given.data
    if (a.path, a.images) == (b.path, b.images):
        return saved
    recorded = _record(out).get("fingerprint")
    recorded, compared = recorded if isinstance(recorded, dict) else None, fingerprint
    names_only = recorded is not None and "version" not in recorded
    if (recorded is None or names_only) and Path(a.path).exists():
        recorded, names_only = data_fingerprint(a, known), False
        if recorded is not None and recorded != fingerprint:
            return saved  # two different data sets: a config change, reported as such
    elif names_only:
        try:
            compared = resolve_source(b.path, b.format, "train", b.images or None).names_and_sizes()
        except (OSError, ValueError):
            compared = None
    if recorded is not None and compared != recorded:
        raise ValueError(f"--resume: the data at {b.path_as_given or b.path} is not the data this run trained on "
                         f"({a.path}): their content fingerprints differ ({out / FINGERPRINT_FILE}). Resume with the "
                         "run's own data (--data may name its new location), or start a new run")
    how = ("shard names and sizes checked, not their bytes: the run recorded its fingerprint before contents were "
           "hashed; their digests are recorded from now on" if names_only else
           "the same content" if recorded is not None else
           "content not checked: the run recorded no fingerprint and the old location is gone")
    warnings.warn(f"--resume: the run's data moved from {a.path} to {b.path} ({how}); the run now reads it there",
                  stacklevel=3)
    data = dataclasses.replace(a, path=b.path, images=b.images, path_as_given=b.path_as_given)
    return dataclasses.replace(saved, data=data)


# -- restore -----------------------------------------------------------------------------------------------------------

def weights_only_state(out: Path, step: int, grad_accum: int) -> TrainState:
    """The parts of the train state of step `step` that the run folder's logs give back: the step, the data
    position (the epoch after the last one ``epochs.jsonl`` records, and the micro-batches read since) and the
    counters. No optimizer, scheduler or RNG state (None): those are lost. Damaged log lines are left out."""
    epochs = read_jsonl(out / "epochs.jsonl", step, keys=("epoch",))
    metrics = read_jsonl(out / "metrics.jsonl", step)
    last = metrics[-1] if metrics else {}
    finished = epochs[-1] if epochs else {"epoch": -1, "step": 0}  # the last epoch read to its end
    epoch, batch = finished["epoch"] + 1, (step - finished["step"]) * grad_accum
    skipped: Counter[str] = Counter()
    for counts in (record.get("skipped") for record in epochs):
        if isinstance(counts, dict):
            skipped.update({str(k): v for k, v in counts.items() if count(v, None) is not None})
    counters = Counters(step, count(last.get("truncated")), count(last.get("nonfinite_skipped")), skipped)
    return TrainState(counters, epoch, batch, ema_n_averaged=step)


def restore(ckpt: Path, out: Path, ctx: dist.DistContext, opt: torch.optim.Optimizer,
            sched: torch.optim.lr_scheduler.LambdaLR, ema: Any, grad_accum: int, state_problem: str = ""
            ) -> tuple[Counters, int, int]:
    """Load optimizer, schedule, EMA, RNG and counters from checkpoint `ckpt` of run `out`; return the counters and
    the data position (epoch, batch in epoch, rescaled when the run resumes on another number of ranks). With
    `state_problem` (its state.pt is missing or damaged) only what the logs give back (weights only)."""
    if state_problem:
        step = json.loads((ckpt / "meta.json").read_text())["step"]
        state = weights_only_state(out, step, grad_accum)
        lrs = [base * fn(step) for base, fn in zip(sched.base_lrs, sched.lr_lambdas, strict=True)]
        for group, lr in zip(opt.param_groups, lrs, strict=True):  # a fresh schedule put at `step`
            group["lr"] = lr
        sched.last_epoch, sched._last_lr = step, lrs  # _last_lr: what get_last_lr() reports until the next step()
    else:
        state = TrainState.from_state_dict(ckpt_io.load_train_state(ckpt))
        opt.load_state_dict(state.optimizer)
        sched.load_state_dict(state.scheduler)
    if ema is not None and (ckpt / "ema.safetensors").is_file():
        ema.module.load_state_dict(ckpt_io.load_weights(ckpt / "ema.safetensors"))
        ema.n_averaged.fill_(state.ema_n_averaged)
    if state.rng is not None:
        set_rng_state(state.rng)
    batch_in_epoch = state.batch_in_epoch
    if state.world != ctx.world:  # the same number of samples of this epoch, but not the same samples
        batch_in_epoch = batch_in_epoch * state.world // ctx.world
        warnings.warn(f"resuming a {state.world}-rank run on {ctx.world} ranks: the global batch and the data order "
                      "of the current epoch change; metrics will not match an uninterrupted run", stacklevel=3)
    if ctx.is_main:
        truncate_jsonl(out / "metrics.jsonl", state.step)
        truncate_jsonl(out / "epochs.jsonl", state.step)
    return state.counters, state.epoch, batch_in_epoch


def truncate_jsonl(path: Path, step: int) -> None:
    """Keep the lines of `path` logged at or before `step` (a killed run may have logged past its checkpoint).
    A line cut off by a kill is dropped; so is any other line that is not a record with an integer step, with a
    warning naming the file and how many."""
    if not path.is_file():
        return
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    keep, damaged = [], []
    for n, line in enumerate(lines, 1):
        try:
            logged = logged_step(json.loads(line))
        except json.JSONDecodeError:  # a line cut off by the kill
            continue
        except RecursionError:  # nested deeper than the stack: damage, dropped with the others
            logged = None
        if logged is None:
            damaged.append(n)
        elif logged <= step:
            keep.append(line)
    if damaged:
        warnings.warn(f"{path}: dropped {len(damaged)} damaged line(s) (line {', '.join(map(str, damaged[:5]))}: not "
                      "a JSON object with an integer step)", stacklevel=2)
    ckpt_io.atomic_write_text(path, "".join(x + "\n" for x in keep))
