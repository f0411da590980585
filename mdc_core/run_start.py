"""Starting a run in its folder, and resuming it: what :func:`mdc_core.train.train` does before its first step.

* **One writer.** :func:`lock_run_folder`: rank 0 holds the folder's lock (:mod:`mdc_core.runlock`) from before
  anything is written; every rank fails at once when another process holds it.
* **Start or resume.** :func:`prepare_run` checks the data and the folder, clears half-written checkpoints of dead
  writers, picks the checkpoint to continue from (:func:`mdc_core.checkpoint.resume_point`: damaged ones set
  aside with a warning) and checks the config given against the saved one (only ``train.steps`` and the data's
  location may change). A run is started over from step 0 only when it never reached a checkpoint, and then its
  old logs are set aside, never rewritten (:func:`refuse_start_over`, :func:`set_logs_aside`).

* **Data fingerprint.** A run records ``data_fingerprint.json``: a digest of its training split's content (the
  SHA-256 of each shard with its name, or of its caption table, and of a synthetic data set's ``manifest.json``)
  and each shard's digest with its size and modification time, so that a shard is read once: a resume in place
  costs one ``stat`` per shard (:meth:`~mdc_core.data.sources.Source.fingerprint`). ``--resume --data NEW``
  accepts a data folder that moved when its content fingerprint matches the recorded one
  (:func:`accept_moved_data`; a run recorded before contents were hashed is compared by shard names and sizes,
  then records its content). A refused resume writes nothing: ``data_fingerprint.json`` is written once
  :func:`prepare_run` has accepted the resume, and ``config.json`` after it.
* **Weights-only start.** When every checkpoint lacks intact train state (``state.pt``) but one has intact
  weights, :func:`weights_only_state` rebuilds what can be rebuilt: the step (so the schedule goes on), the data
  position (from ``epochs.jsonl``) and the run's counters (from ``metrics.jsonl``); AdamW's moments and the RNG
  state are lost, and :func:`weights_only_warning` says so.
* **Steps.** :func:`check_steps`: ``--steps`` below the checkpoint's step is an error (nothing to train),
  above it extends the run, with a warning when that moves the cosine schedule.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import checkpoint as ckpt_io
from . import distributed as dist
from .config import RunConfig
from .data.sources import resolve_source
from .runlock import RunFolderBusy, RunLock
from .train_state import Counters, TrainState

FINGERPRINT_FILE = "data_fingerprint.json"


def data_fingerprint(data: Any, known: dict[str, dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """The content :meth:`~mdc_core.data.sources.Source.fingerprint` of a :class:`~mdc_core.config.DataConfig`'s
    training split (None: not readable); `known` holds shard digests already computed (:func:`known_digests`)."""
    try:
        return resolve_source(data.path, data.format, "train", data.images or None).fingerprint(known)
    except (OSError, ValueError):
        return None


def _names_and_sizes(data: Any) -> dict[str, Any] | None:
    try:
        return resolve_source(data.path, data.format, "train", data.images or None).names_and_sizes()
    except (OSError, ValueError):
        return None


def _record(out: Path) -> dict[str, Any]:
    """``out/data_fingerprint.json`` ({} when missing or unreadable)."""
    try:
        record = json.loads((out / FINGERPRINT_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def known_digests(out: Path) -> dict[str, dict[str, Any]]:
    """The shard digests the run folder recorded (``{absolute path: {"bytes", "mtime_ns", "sha256"}}``), so that a
    resume reads no shard whose size and modification time are unchanged."""
    shards = _record(out).get("shards")
    return dict(shards) if isinstance(shards, dict) else {}


def record_fingerprint(out: Path, cfg: RunConfig, fingerprint: dict[str, Any] | None,
                       shards: dict[str, dict[str, Any]] | None = None) -> None:
    """Write ``out/data_fingerprint.json`` (what :func:`accept_moved_data` compares a moved data folder with), with
    the digests of the data's shards (`shards`: :func:`known_digests`'s form), atomically."""
    if fingerprint is not None:
        record = {"path": cfg.data.path, "images": cfg.data.images, "fingerprint": fingerprint,
                  "shards": shards or {}}
        ckpt_io.atomic_write_text(out / FINGERPRINT_FILE, json.dumps(record, indent=2) + "\n")


def _recorded(out: Path) -> dict[str, Any] | None:
    fingerprint = _record(out).get("fingerprint")
    return fingerprint if isinstance(fingerprint, dict) else None


def accept_moved_data(saved: RunConfig, given: RunConfig, out: Path, fingerprint: dict[str, Any] | None,
                      known: dict[str, dict[str, Any]] | None = None) -> RunConfig:
    """`saved` with the data location of `given` when both name the same content (a moved or copied data folder);
    `saved` unchanged when the locations are the same or the old one still holds other data (the caller then
    reports the config difference). `fingerprint` is that of `given`'s data, `known` the shard digests the run
    recorded. Raises ``ValueError`` when the content differs from what the run recorded.

    A run folder from before contents were hashed recorded shard names and sizes only (a fingerprint without
    ``version``): when the old location is gone, the new data's names and sizes are compared with that record (all
    such a run can offer; the warning says so), and the caller then records the content fingerprint, which every
    later resume compares. Where the old location still exists, both contents are compared instead."""
    a, b = saved.data, given.data
    if (a.path, a.images) == (b.path, b.images):
        return saved
    recorded, compared = _recorded(out), fingerprint
    names_only = recorded is not None and "version" not in recorded
    if (recorded is None or names_only) and Path(a.path).exists():
        recorded, names_only = data_fingerprint(a, known), False
        if recorded is not None and recorded != fingerprint:
            return saved  # two different data sets: a config change, reported as such
    elif names_only:
        compared = _names_and_sizes(b)
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


def read_jsonl(path: Path, step: float, keys: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The records of `path` logged at or before `step`; a line that is not a JSON object with an integer step
    (and integer `keys`) is left out, as is a line cut off by a kill."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        logged = ckpt_io.logged_step(record)
        if logged is not None and logged <= step and all(_count(record.get(k), None) is not None for k in keys):
            records.append(record)
    return records


def _count(value: Any, default: int | None = 0) -> int | None:
    """`value` when it is an integer (a logged counter), else `default`."""
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def weights_only_state(out: Path, step: int, grad_accum: int) -> TrainState:
    """The parts of the train state of step `step` that the run folder's logs give back: the step, the data
    position (the epoch after the last one ``epochs.jsonl`` records, and the micro-batches read since) and the
    counters. No optimizer, scheduler or RNG state (None): those are lost. Damaged log lines are left out."""
    epochs = read_jsonl(out / "epochs.jsonl", step, keys=("epoch",))
    metrics = read_jsonl(out / "metrics.jsonl", step)
    last = metrics[-1] if metrics else {}
    if epochs:
        epoch, batch = epochs[-1]["epoch"] + 1, (step - epochs[-1]["step"]) * grad_accum
    else:
        epoch, batch = 0, step * grad_accum
    skipped: Counter[str] = Counter()
    for record in epochs:
        counts = record.get("skipped", {})
        if isinstance(counts, dict):
            skipped.update({str(k): v for k, v in counts.items() if _count(v, None) is not None})
    counters = Counters(step, _count(last.get("truncated")), _count(last.get("nonfinite_skipped")), skipped)
    return TrainState(counters, epoch, batch, ema_n_averaged=step)


def weights_only_warning(ckpt: Path, problem: str) -> str:
    return (f"--resume: {problem}, and no checkpoint has intact train state: resuming from {ckpt.name}'s weights "
            "(and EMA, if saved) only. Lost: the optimizer state (AdamW's moments restart from zero) and the RNG "
            "state; the step, the learning-rate schedule, the data position (from epochs.jsonl) and the counters "
            "go on, but the run will not match an uninterrupted one")


def set_schedule_step(scheduler: Any, step: int) -> None:
    """Put a fresh ``LambdaLR`` (and its optimizer's learning rates) at `step`, as `step` calls of ``step()``."""
    lrs = [base * fn(step) for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)]
    for group, lr in zip(scheduler.optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
    scheduler.last_epoch = step
    scheduler._last_lr = lrs  # what get_last_lr() reports until the next step()


def check_steps(saved: RunConfig, given: RunConfig, done: int, lr_at: Any) -> None:
    """`--steps` on ``--resume``: an error below `done` (the checkpoint's step); a warning when extending the run
    moves the schedule. `lr_at(step, cfg)` is the learning rate of the schedule of `cfg` at `step`."""
    steps, before = given.train.steps, saved.train.steps
    if steps < done:
        raise ValueError(f"--steps {steps} is below the {done} steps this run has taken (checkpoint "
                         f"step_{done:08d}): nothing to train. Pass --steps N > {done} to train it longer")
    if steps == before or steps == done:
        return
    old, new = lr_at(done, saved), lr_at(done, given)
    if not math.isclose(old, new, rel_tol=1e-6, abs_tol=1e-12):
        warnings.warn(f"--steps {steps} (the run was set up for {before}): the cosine schedule now decays over "
                      f"{steps} steps, so the learning rate at step {done} changes from {old:.3g} to {new:.3g}",
                      stacklevel=3)


def lock_run_folder(lock: RunLock, ctx: dist.DistContext) -> None:
    """Rank 0 takes the run folder's lock; every rank raises :class:`RunFolderBusy` if another process holds it."""
    busy = ""
    if ctx.is_main:
        try:
            lock.acquire()
        except RunFolderBusy as err:
            busy = str(err)
    if ctx.distributed:
        busy = dist.broadcast_object(ctx, busy, "run-folder lock")
    if busy:
        raise RunFolderBusy(busy)


def never_started(out: Path) -> bool:
    """`out` holds no checkpoint and no logged step."""
    metrics = out / "metrics.jsonl"
    return not ckpt_io.checkpoint_folders(out) and not (metrics.is_file() and metrics.read_text().strip())


def resolve_data_paths(cfg: RunConfig) -> RunConfig:
    """`cfg` with ``data.path`` and ``data.images`` absolute (``data.path_as_given`` keeps what was typed), so
    that a run started with ``--data i2d`` resumes with the absolute path or from another working directory."""
    def absolute(path: str) -> str:
        return os.path.abspath(os.path.expanduser(path)) if path and "://" not in path else path
    d = cfg.data
    data = dataclasses.replace(d, path=absolute(d.path), images=absolute(d.images),
                               path_as_given=d.path_as_given or d.path)
    return dataclasses.replace(cfg, data=data)


def prepare_run(cfg: RunConfig, out: Path, resume: bool, main: bool, lr_lambda: Callable[..., float]
                ) -> tuple[RunConfig, Path | None, str]:
    """Check the data and the run folder; the config to train (the saved one when resuming), the checkpoint to
    start from (None: a fresh run) and, for a weights-only start, what is wrong with its train state. Rank 0 (which
    holds the lock) clears the half-written checkpoints of dead writers and sets damaged checkpoints aside, with a
    warning (:func:`mdc_core.checkpoint.resume_point`)."""
    if not cfg.data.path:
        raise ValueError("data.path is empty: pass --data DIR (e.g. a folder written by `mdc data synth`)")
    try:  # fails here, before any work
        source = resolve_source(cfg.data.path, cfg.data.format, "train", cfg.data.images or None)
    except FileNotFoundError as err:
        if not resume:
            raise
        raise FileNotFoundError(f"{err}. If the run's data moved, pass --data NEW_PATH: --resume accepts it when "
                                "its content is the same") from None
    if main:
        removed = ckpt_io.remove_stale_temporaries(out)
        if removed:
            warnings.warn(f"removed what writers that are no longer running left in {out}: {', '.join(removed)}",
                          stacklevel=3)
    if not resume and (ckpt_io.checkpoint_folders(out) or (out / "metrics.jsonl").exists()):
        raise FileExistsError(f"run folder {out} already holds a run; pass --resume to continue it or choose "
                              "another --out (nothing was overwritten)")
    known = known_digests(out)
    fingerprint = source.fingerprint(known)  # reads each shard not recorded with its size and mtime
    own = {str(Path(shard).resolve()) for shard in source.shards}
    shards = {path: entry for path, entry in known.items() if path in own}  # what the record keeps
    if not resume:
        if main:
            record_fingerprint(out, cfg, fingerprint, shards)
        return cfg, None, ""
    start_ckpt, state_problem = ckpt_io.resume_point(out, set_aside_damaged=main)
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
    done = json.loads((start_ckpt / "meta.json").read_text())["step"]
    check_steps(saved, cfg, done, lambda step, c: c.train.lr * lr_lambda(
        step, c.train.warmup_steps, c.train.steps, c.train.min_lr_ratio))
    if state_problem:
        warnings.warn(weights_only_warning(start_ckpt, state_problem), stacklevel=3)
    if main:  # the resume is accepted: the first write
        record_fingerprint(out, saved, fingerprint, shards)
    return (saved if saved.train.steps == cfg.train.steps else _with_steps(saved, cfg.train.steps)), start_ckpt, \
        state_problem


def refuse_start_over(out: Path, ckpt_every: int, *, asked: str = "--resume",
                      remedy: str = "train into another --out") -> None:
    """Raise ``FileNotFoundError`` when run folder `out`, which has no checkpoint to resume from, once held one:
    damaged checkpoints set aside (``corrupt_step_*``), or a metrics log past the first checkpoint step. Starting
    such a run over from step 0 would bury what is left of it. `asked` names what asked for the run (the message's
    first words) and `remedy` what the user can do instead."""
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


def logged_loss(out: Path, step: int) -> float:
    """The last loss ``metrics.jsonl`` logged at or before `step` (NaN: none), for a call that trained no step."""
    records = read_jsonl(out / "metrics.jsonl", step)
    loss = records[-1].get("loss") if records else None
    return float(loss) if isinstance(loss, (int, float)) and not isinstance(loss, bool) else math.nan


def _with_steps(cfg: RunConfig, steps: int) -> RunConfig:
    data = cfg.to_dict()
    data["train"]["steps"] = steps
    return RunConfig.from_dict(data)


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
