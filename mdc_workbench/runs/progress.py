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

The other direction: when ``mdc runs`` executes several notebooks at once and a slot empties with nothing left
to start, it hands the idle cores to the notebooks still running by writing each one's new torch thread count
into a file it names in the kernel's environment (:data:`THREADS_ENV`, :func:`write_thread_share`).
:func:`follow_thread_share` (called by :mod:`mdc_workbench.notebooks.notebook` when it is imported in a kernel the
runner started) makes the kernel apply it: torch's thread count is a per-thread setting, so a module forward
pre-hook applies the share in whichever thread runs a model (the training thread of a live-plotted run
included), reading the file at most every :data:`SHARE_POLL_S` seconds per thread.

Without the environment variable (a notebook opened in JupyterLab, a test) every call is a cheap no-op.
Torch-free at import; writes are atomic (temporary file + rename), so neither side reads half a record.
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
THREADS_ENV = "MDC_THREADS_FILE"  # set by the runner: a file holding the torch threads it gives this run now
SHARE_POLL_S = 2.0  # how often (per thread) a kernel re-reads its thread share
T = TypeVar("T")
_lock = threading.Lock()
_follow_handle: Any = None  # the registered forward pre-hook (one per process)


def _target() -> Path | None:
    path = os.environ.get(ENV)
    return Path(path) if path else None


def target_set() -> bool:
    """Whether this process reports to a runner (``mdc runs`` set :data:`ENV`)."""
    return _target() is not None


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
        _write_atomic(path, json.dumps(record))  # best effort: a full disk must not fail the notebook


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


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError:  # best effort, as progress
        tmp.unlink(missing_ok=True)


def write_thread_share(path: str | Path, threads: int) -> None:
    """Runner side: give the run whose share file is `path` `threads` torch threads from now on."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(path, f"{int(threads)}\n")


def read_thread_share(path: str | Path) -> int | None:
    """The thread count in the share file `path` (None when absent, unreadable or not a positive integer)."""
    try:
        n = int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None
    return n if n >= 1 else None


def follow_thread_share(every_s: float = SHARE_POLL_S) -> bool:
    """Kernel side: apply the runner's thread share (module docstring) from now on. Registers one global module
    forward pre-hook per process; a no-op without the runner's environment variable. Returns whether it is on."""
    global _follow_handle
    share_path = os.environ.get(THREADS_ENV)
    if not share_path:
        return False
    if _follow_handle is not None:
        return True
    import torch

    share_file = Path(share_path)
    due = threading.local()  # torch's thread count is per thread, and so is the next read

    def apply(_module: Any, _args: Any) -> None:
        now = time.monotonic()
        if now < getattr(due, "at", 0.0):
            return
        due.at = now + every_s
        n = read_thread_share(share_file)
        if n is not None and n != torch.get_num_threads():
            torch.set_num_threads(n)

    _follow_handle = torch.nn.modules.module.register_module_forward_pre_hook(apply)
    return True
