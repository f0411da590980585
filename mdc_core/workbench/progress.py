"""Progress a notebook reports to the batch runner (``mdc runs``) while it executes.

Papermill runs a notebook in a separate kernel process, so the runner cannot see the notebook's own progress
bars (in a kernel they are widgets). Instead the runner puts a file path into the kernel's environment
(:data:`ENV`); the notebook's helpers write a small JSON record there, and the runner polls it and shows it beside
its run counter::

    plan cpu_demo:  20%|██        | 1/5 [03:10<...] 02_noise_schedule_ablation: train 3/8 [0.5, 1.0] · step 120/300

* :func:`report` sets the current ``stage`` (what the notebook does: "train 3/8 MDC") and/or ``detail`` (how far
  that stage is: "step 120/300").
* :func:`track` wraps a loop over models or evaluations and reports ``desc i/n: item``.
* :func:`watch_training` reports a training run's step from its ``metrics.jsonl`` while it trains.

Without the environment variable (a notebook opened in JupyterLab, a test) every call is a cheap no-op.
Torch-free; writes are atomic (temporary file + rename), so the runner never reads half a record.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

ENV = "MDC_PROGRESS_FILE"  # set by the runner for the kernel it starts
T = TypeVar("T")
_lock = threading.Lock()


def _target() -> Path | None:
    path = os.environ.get(ENV)
    return Path(path) if path else None


def report(stage: str | None = None, detail: str | None = None) -> None:
    """Update the record the runner shows: a new `stage` clears the detail; `detail` alone keeps the stage."""
    path = _target()
    if path is None:
        return
    with _lock:
        record = read_record(path) if stage is None else {}
        if stage is not None:
            record["stage"] = stage
        record["detail"] = detail or ""
        record["time"] = time.time()
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(record))
            os.replace(tmp, path)
        except OSError:  # progress is best effort: a full disk must not fail the notebook
            tmp.unlink(missing_ok=True)


def read_record(path: str | Path) -> dict[str, Any]:
    """The record at `path` ({} when absent or unreadable)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def describe(path: str | Path) -> str:
    """One line for the runner: ``stage · detail`` ("" when nothing was reported)."""
    record = read_record(path)
    parts = [str(record.get(k) or "") for k in ("stage", "detail")]
    return " · ".join(p for p in parts if p)


def track(items: Iterable[T], desc: str, total: int | None = None, label: Any = None) -> Iterator[T]:
    """Yield `items`, reporting ``desc i/n: name`` before each (name: ``label(item)`` if given, else the item
    itself when it is a string, or the key of a (key, value) pair)."""
    items = list(items) if total is None and not hasattr(items, "__len__") else items
    n = total if total is not None else len(items)  # type: ignore[arg-type]
    for i, item in enumerate(items, 1):
        name = label(item) if label else (item if isinstance(item, str) else
                                          item[0] if isinstance(item, tuple) and item else "")
        report(stage=f"{desc} {i}/{n}" + (f": {name}" if name != "" else ""))
        yield item


def _last_step(metrics: Path) -> int | None:
    try:
        lines = metrics.read_text().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):  # a line being written
            continue
    return None


@contextlib.contextmanager
def watch_training(run_dir: str | Path, total_steps: int, every_s: float = 2.0) -> Iterator[None]:
    """While the block runs, report ``step s/total`` of the training run in `run_dir` (read from its
    ``metrics.jsonl``) every `every_s` seconds. A no-op without the runner's environment variable."""
    if _target() is None:
        yield
        return
    metrics = Path(run_dir) / "metrics.jsonl"
    stop = threading.Event()
    started = time.perf_counter()

    def poll() -> None:
        while not stop.wait(every_s):
            step = _last_step(metrics)
            elapsed = time.perf_counter() - started
            report(detail=f"step {step if step is not None else 0}/{total_steps}, {elapsed:.0f} s")

    thread = threading.Thread(target=poll, daemon=True, name="mdc-progress")
    report(detail=f"step 0/{total_steps}")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=every_s + 1)
