"""Executing a plan (:mod:`mdc_workbench.runs.plans` reads and checks it): ``mdc runs PLAN.yaml``.

Every run gets ``output_dir`` (its own run folder, absolute) on top of its parameters and executes in
``<output_root>/<name>/<run-id>/`` as ``<run-id>/<notebook>.ipynb`` beside ``parameters.json``, the
``metrics.json`` and ``figures/*.png`` the notebook writes, and a marker: ``DONE`` (JSON: duration) or
``FAILED`` (the error). A failed run is kept and the plan goes on; re-running a plan skips runs whose ``DONE``
marker and ``parameters.json`` match (a changed parameter, or a changed notebook: ``DONE`` records the notebook's
SHA-256, re-runs that run), and retries failed ones. When the plan ends :mod:`mdc_workbench.runs.summary` writes
``summary.md``, ``summary.json`` and ``summary.png``. A run folder is cleared before it executes, so it is checked
first to be a folder directly inside the plan's, and the plan folder one the runner may write into
(:mod:`mdc_workbench.runs.outputs`; the plan's checks already refuse a run id or plan name that is a path).

``jobs`` runs that many notebooks at once, each in its own process and kernel with ``cpu_count // jobs`` torch threads
(``OMP_NUM_THREADS``); ``mdc runs --jobs N`` overrides it. Runs start in plan order as slots free up. Once nothing is
left to start, a slot that empties hands its cores to the runs still going: each gets ``cpu_count // running`` threads
(:func:`thread_share`, applied inside the kernel by :func:`mdc_workbench.runs.progress.follow_thread_share`), so
the plan's last long run does not finish on one core of an idle machine. Notebooks that need the same cached model or
data folder do not race: the notebook helpers hold a file lock on each cache folder while they write it
(:func:`mdc_workbench.notebooks.notebook.train_cached`, :func:`~mdc_workbench.notebooks.notebook.ensure_dataset`), so a
notebook that needs a model another one is training waits for it and then loads it. On a small CPU this pays because a
small model's training uses a second thread poorly and much of a notebook uses one core anyway (measurements in
``docs/notebooks.md``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from mdc_core.runlock import LOCK_NAME, RunLock
from mdc_workbench.runs.declared import record_start
from mdc_workbench.runs.outputs import DONE, FAILED, SHARES_DIR, check_outputs, check_run_folder
from mdc_workbench.runs.plans import Plan, RunSpec, ensure_kernel
from mdc_workbench.runs.powered import record as power_record
from mdc_workbench.runs.powered import refusal
from mdc_workbench.runs.summary import RunResult, write_summary

THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # what a run's kernel reads for its torch thread count
INTERRUPTED = "interrupted (KeyboardInterrupt)"  # what a run's FAILED marker says after Ctrl-C
KERNEL_LOG = "kernel.log"  # in each run folder: what the notebook's kernel wrote to its stderr
DEADLINE_STOP = "stopped at the plan's deadline (deadline_s) before it finished"


def notebook_digest(notebook: Path) -> str:
    """SHA-256 of the notebook file: with the parameters, what a finished run was produced by."""
    return hashlib.sha256(Path(notebook).read_bytes()).hexdigest()


def run_status(run_dir: Path, parameters: dict[str, Any], notebook: Path | None = None) -> str:
    """'done' when the run finished with exactly these parameters (and, given `notebook`, from this notebook's
    content: its ``DONE`` marker records :func:`notebook_digest`), 'failed' when marked so, else 'pending'."""
    try:
        saved = json.loads((run_dir / "parameters.json").read_text())
    except (OSError, json.JSONDecodeError):
        return "pending"
    if saved != json.loads(json.dumps(parameters)):
        return "pending"
    if (run_dir / DONE).is_file():
        if notebook is None:
            return "done"
        try:
            marker = json.loads((run_dir / DONE).read_text())
        except (OSError, ValueError):
            return "pending"
        same = isinstance(marker, dict) and marker.get("notebook_sha256") == notebook_digest(notebook)
        return "done" if same else "pending"
    return "failed" if (run_dir / FAILED).is_file() else "pending"


def execute_run(spec: RunSpec, run_dir: Path, *, kernel: str, timeout_s: int | None = None,
                cwd: Path | None = None, on_progress: Callable[[str], None] | None = None,
                plan_dir: Path | None = None) -> RunResult:
    """Execute one run into `run_dir` (cleared first), holding its lock (:mod:`mdc_core.runlock`; a second
    writer raises :class:`~mdc_core.runlock.RunFolderBusy`). Never raises for a failing notebook: the error is
    written to ``FAILED`` and returned; KeyboardInterrupt marks the run and propagates. `run_dir` must lie
    directly inside `plan_dir` (default: its parent; :func:`check_run_folder`), else ValueError and nothing is
    touched.

    ``on_progress(text)`` is called about once a second with what the notebook reports through
    :mod:`mdc_workbench.runs.progress` (its stage and training step), read from ``<run_dir>/progress.json``."""
    plan_dir = run_dir.parent if plan_dir is None else plan_dir
    check_run_folder(run_dir, plan_dir)
    with RunLock(run_dir, "mdc runs"):
        return _execute_locked(spec, run_dir, kernel=kernel, timeout_s=timeout_s, cwd=cwd, on_progress=on_progress,
                               plan_dir=plan_dir)


def _execute_locked(spec: RunSpec, run_dir: Path, *, kernel: str, timeout_s: int | None, cwd: Path | None,
                    on_progress: Callable[[str], None] | None, plan_dir: Path) -> RunResult:
    import papermill

    check_run_folder(run_dir, plan_dir, clearing=True)  # again under the lock, right before clearing
    for old in run_dir.iterdir():  # cleared, but for the lock file
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old)
        elif old.name != LOCK_NAME:
            old.unlink()
    (run_dir / "figures").mkdir(parents=True)
    params = spec.injected(run_dir)
    digest = notebook_digest(spec.notebook)  # read before it executes: what this run was produced by
    (run_dir / "parameters.json").write_text(json.dumps(spec.parameters, indent=2, sort_keys=True) + "\n")
    start = time.perf_counter()
    error = ""
    try:
        with _progress_relay(run_dir / "progress.json", on_progress):
            papermill.execute_notebook(str(spec.notebook), str(run_dir / spec.notebook.name), parameters=params,
                                       kernel_name=kernel, progress_bar=False, cwd=str(cwd or Path.cwd()),
                                       execution_timeout=timeout_s,
                                       kernel_manager_class=kernel_manager_logging_to(run_dir / KERNEL_LOG))
        if not (run_dir / "metrics.json").is_file():
            error = f"the notebook finished but wrote no metrics.json into {run_dir}"
    except KeyboardInterrupt:
        mark_failed(run_dir, INTERRUPTED, time.perf_counter() - start)
        raise
    except Exception as err:  # any failure of this run is recorded; the plan goes on
        error = _describe(err)
    duration = time.perf_counter() - start
    if error:
        mark_failed(run_dir, error, duration)
        status = "failed"
    else:
        (run_dir / DONE).write_text(json.dumps({"duration_s": round(duration, 2),
                                                "finished": dt.datetime.now(dt.UTC).isoformat(),
                                                "notebook_sha256": digest}) + "\n")
        status = "done"
    return RunResult(spec.run_id, spec.notebook.name, status, run_dir, duration, error, spec.parameters)


def kernel_manager_logging_to(log_path: Path) -> type:
    """A kernel manager class (jupyter_client's ``AsyncKernelManager``) whose kernel writes its own stderr to
    `log_path` instead of the terminal: the kernel's log lines and the tracebacks it prints when it is stopped
    mid-cell (Ctrl-C, a deadline) stay in the run folder, so an interrupted plan prints one line. The notebook's
    own output and errors still go into the executed notebook and ``FAILED``."""
    from jupyter_client import AsyncKernelManager

    class RunKernelManager(AsyncKernelManager):  # type: ignore[misc]
        async def _async_launch_kernel(self, kernel_cmd: list[str], **kw: Any) -> None:
            with open(log_path, "ab") as log:  # the kernel process holds its own copy of the descriptor
                kw.setdefault("stderr", log)
                await super()._async_launch_kernel(kernel_cmd, **kw)

    return RunKernelManager


@contextlib.contextmanager
def _progress_relay(path: Path, on_progress: Callable[[str], None] | None, every_s: float = 1.0) -> Iterator[None]:
    """Point the kernel at `path` (:data:`mdc_workbench.runs.progress.ENV`; a kernel inherits the runner's
    environment) and, with `on_progress`, poll the notebook's reports in a thread while the block runs."""
    from mdc_workbench.runs.progress import ENV, describe

    before = os.environ.get(ENV)
    os.environ[ENV] = str(path.resolve())
    stop = threading.Event()

    def poll() -> None:
        shown = ""
        while not stop.wait(every_s):
            text = describe(path)
            if text and text != shown:
                shown = text
                on_progress(text)

    thread = threading.Thread(target=poll, daemon=True, name="mdc-runs-progress") if on_progress else None
    if thread:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        if thread:
            thread.join(timeout=every_s + 1)
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before


def _describe(err: Exception) -> str:
    ename, evalue = getattr(err, "ename", None), getattr(err, "evalue", None)
    if ename is not None:  # papermill.PapermillExecutionError: the notebook's own exception
        cell = getattr(err, "exec_count", None)
        return f"{ename}: {evalue} (cell [{cell}])"
    return f"{type(err).__name__}: {err}"


def mark_failed(run_dir: Path, error: str, duration: float) -> None:
    (run_dir / FAILED).write_text(f"{error}\nduration_s: {duration:.1f}\n")


def show_postfix(bar: Any, text: str) -> None:
    """Set the plan bar's postfix and redraw it no more often than its ``mininterval``: every poll on a terminal,
    at most every 30 s in a log (``make demo > log``; the command line sets tqdm's default, mdc_workbench.cli.main),
    instead of a carriage-return line every second."""
    bar.set_postfix_str(text, refresh=False)
    if not bar.disable and time.time() - bar.last_print_t >= bar.mininterval:
        bar.refresh()


def run_plan(plan: Plan, *, progress: bool = True, cwd: Path | None = None, jobs: int | None = None,
             deadline_s: float | None = None, underpowered_ok: bool = False) -> list[RunResult]:
    """Execute every pending run of `plan`, skipping finished ones, then write the summary. `jobs` (default: the
    plan's ``jobs``) notebooks run at once; with more than one, each runs in its own process (module docstring).
    `deadline_s` (default: the plan's ``deadline_s``): after that many seconds no run starts, the running ones are
    stopped (each marked FAILED, "stopped at the deadline") and the summary is written with what finished.
    The plan folder is locked for the whole call: a second ``mdc runs`` of the plan raises
    :class:`~mdc_core.runlock.RunFolderBusy` naming this one, before it touches any run folder. A plan that declares
    the claims it decides (``decides``) whose seeds fall short of 80% power raises ValueError before anything runs,
    unless `underpowered_ok` (:mod:`mdc_workbench.runs.powered`; the summary then says so)."""
    jobs = plan.jobs if jobs is None else jobs
    if jobs < 1:
        raise ValueError(f"jobs must be a positive integer (notebooks at once), got {jobs}")
    deadline_s = plan.deadline_s if deadline_s is None else deadline_s
    if deadline_s is not None and deadline_s <= 0:
        raise ValueError(f"deadline_s must be a positive number of seconds, got {deadline_s}")
    checks = plan.power_checks()
    short = refusal(checks)
    if short and not underpowered_ok:
        raise ValueError(f"plan {plan.name}: {short}")
    kernel = ensure_kernel(plan.kernel)
    stop_at = None if deadline_s is None else time.monotonic() + deadline_s
    check_outputs(plan)  # before the lock file goes there
    with RunLock(plan.out_dir, "mdc runs"):
        power_record(plan.out_dir, checks, underpowered_ok)
        return _run_plan_locked(plan, kernel, progress=progress, cwd=cwd, jobs=jobs, stop_at=stop_at)


def _run_plan_locked(plan: Plan, kernel: str, *, progress: bool, cwd: Path | None, jobs: int,
                     stop_at: float | None = None) -> list[RunResult]:
    out = plan.out_dir
    check_outputs(plan, clearing=True)  # again under the lock: a run folder holding another's files is refused here
    results, todo = split_finished(plan)
    record_start(out, runs_finished=bool(results), plan=plan.source)  # what its verdicts are declared under
    bar = tqdm(total=len(plan.runs), initial=len(results), desc=f"plan {plan.name}", unit="run",
               disable=not progress)

    def finished(i: int, result: RunResult) -> None:
        results[i] = result
        if result.status == "failed":
            tqdm.write(f"run {result.run_id} FAILED: {result.error.splitlines()[0][:300]}")
        bar.update(1)

    if stop_at is None and (jobs == 1 or len(todo) <= 1):
        for i, spec in todo:
            bar.set_postfix_str(spec.run_id)
            report = (lambda text, rid=spec.run_id: show_postfix(bar, f"{rid}: {text}")) if progress else None
            finished(i, execute_run(spec, out / spec.run_id, kernel=kernel, timeout_s=plan.timeout_s, cwd=cwd,
                                    on_progress=report, plan_dir=out))
    else:
        _run_concurrently(plan, todo, kernel=kernel, cwd=cwd, jobs=jobs, bar=bar if progress else None,
                          on_finished=finished, stop_at=stop_at)
    bar.close()
    ordered = [results[i] for i in range(len(plan.runs))]
    write_summary(plan.out_dir, ordered, name=plan.name, source=plan.source, description=plan.description)
    return ordered


def split_finished(plan: Plan) -> tuple[dict[int, RunResult], list[tuple[int, RunSpec]]]:
    """The plan's finished runs as "skipped" results by position, and the (position, run) pairs left to execute;
    every run folder is checked first (a RunSpec built by hand has not been through load_plan's checks). Shared
    with the cluster executor (:mod:`mdc_workbench.runs.executor`), so both skip and retry alike."""
    out = plan.out_dir
    for spec in plan.runs:
        check_run_folder(out / spec.run_id, out)
    results: dict[int, RunResult] = {}
    todo: list[tuple[int, RunSpec]] = []
    for i, spec in enumerate(plan.runs):
        run_dir = out / spec.run_id
        if run_status(run_dir, spec.parameters, spec.notebook) == "done":
            done = json.loads((run_dir / DONE).read_text())
            results[i] = RunResult(spec.run_id, spec.notebook.name, "skipped", run_dir,
                                   float(done.get("duration_s", 0.0)), parameters=spec.parameters)
        else:
            todo.append((i, spec))
    return results, todo


def thread_env(jobs: int, cpus: int | None = None) -> dict[str, str]:
    """The environment that gives each of `jobs` concurrent runs its share of the CPU: ``cpus // jobs`` threads
    (at least 1; `cpus` default ``os.cpu_count()``)."""
    threads = max(1, (cpus or os.cpu_count() or 1) // jobs)
    return {name: str(threads) for name in THREAD_ENV}


def thread_share(jobs: int, running: int, queued: bool, cpus: int | None = None) -> int:
    """Torch threads for each of `running` concurrent runs: ``cpus // jobs`` while runs are `queued` (every slot
    will be busy), else the idle slots' cores shared out, ``cpus // running`` (at least 1 either way)."""
    cpus = cpus or os.cpu_count() or 1
    return max(1, cpus // (jobs if queued or running < 1 else min(running, jobs)))


def _execute_in_child(spec: RunSpec, run_dir: Path, kernel: str, timeout_s: int | None, cwd: Path | None,
                      env: dict[str, str], plan_dir: Path) -> None:
    """Process target of a concurrent run: the run's outcome is its marker file (``DONE`` / ``FAILED``)."""
    os.environ.update(env)  # inherited by the kernel papermill starts
    try:
        execute_run(spec, run_dir, kernel=kernel, timeout_s=timeout_s, cwd=cwd, plan_dir=plan_dir)
    except KeyboardInterrupt:  # execute_run has marked the run
        sys.exit(130)


def result_from_markers(spec: RunSpec, run_dir: Path, exitcode: int | None = None) -> RunResult:
    """The :class:`RunResult` of a run executed in another process, read from its marker; a run with neither
    marker (its process was killed) is marked failed here."""
    done, failed = run_dir / DONE, run_dir / FAILED
    if done.is_file():
        try:
            duration = float(json.loads(done.read_text()).get("duration_s", 0.0))
        except (OSError, ValueError, AttributeError):
            duration = 0.0
        return RunResult(spec.run_id, spec.notebook.name, "done", run_dir, duration, "", spec.parameters)
    if failed.is_file():
        lines = failed.read_text().splitlines()
        error = "\n".join(line for line in lines if not line.startswith("duration_s:")) or "failed"
        duration = next((float(line.split(":", 1)[1]) for line in lines if line.startswith("duration_s:")), 0.0)
        return RunResult(spec.run_id, spec.notebook.name, "failed", run_dir, duration, error, spec.parameters)
    error = f"the run's process ended (exit code {exitcode}) before the notebook finished or failed"
    run_dir.mkdir(parents=True, exist_ok=True)
    mark_failed(run_dir, error, 0.0)
    return RunResult(spec.run_id, spec.notebook.name, "failed", run_dir, 0.0, error, spec.parameters)


def _stop_runs(active: dict[int, tuple[Any, RunSpec, Path]], why: str, grace_s: float = 5,
               join_s: float = 30) -> None:
    """SIGINT every running notebook's process (each marks its run FAILED), wait up to `join_s` for all of them
    together, then end the stragglers; a run left without a marker is marked FAILED with `why`."""
    import signal
    from multiprocessing.connection import wait

    procs = [proc for proc, _, _ in active.values()]
    wait([p.sentinel for p in procs], timeout=grace_s)  # Ctrl-C in a terminal reached them too
    for proc in procs:
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGINT)
    wait([p.sentinel for p in procs], timeout=join_s)
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()
    for _, _spec, run_dir in active.values():
        if (run_dir / DONE).is_file():
            continue
        try:  # a run's process marks itself "interrupted" when signalled; the runner knows why it was stopped
            lines = (run_dir / FAILED).read_text().splitlines()
        except OSError:
            lines = []
        if not lines or lines[0] == INTERRUPTED:
            duration = next((float(line.split(":", 1)[1]) for line in lines if line.startswith("duration_s:")), 0.0)
            run_dir.mkdir(parents=True, exist_ok=True)
            mark_failed(run_dir, why, duration)


def _run_concurrently(plan: Plan, todo: list[tuple[int, RunSpec]], *, kernel: str, cwd: Path | None, jobs: int,
                      bar: Any, on_finished: Callable[[int, RunResult], None], poll_s: float = 1.0,
                      stop_at: float | None = None) -> None:
    """Run `todo` in plan order, `jobs` processes at a time; `bar` (a tqdm bar or None) shows what each running
    notebook reports. Ctrl-C stops every running notebook (each marks itself FAILED) and re-raises. At `stop_at`
    (time.monotonic) the running notebooks are stopped the same way and the queued ones are reported not started."""
    import multiprocessing
    from collections import deque
    from multiprocessing.connection import wait

    from mdc_workbench.runs.progress import THREADS_ENV, describe, write_thread_share

    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no threads or torch state inherited
    env = thread_env(jobs)
    shares_dir = plan.out_dir / SHARES_DIR
    queue = deque(todo)
    active: dict[int, tuple[Any, RunSpec, Path]] = {}
    given: dict[str, int] = {}  # run id -> the share last written (a kernel starts with the env's cpu_count // jobs)
    try:
        while queue or active:
            if stop_at is not None and time.monotonic() >= stop_at:
                why = DEADLINE_STOP
                _stop_runs(active, why, grace_s=0, join_s=15)
                for i, (_, spec, run_dir) in active.items():
                    on_finished(i, result_from_markers(spec, run_dir))
                for i, spec in queue:
                    on_finished(i, RunResult(spec.run_id, spec.notebook.name, "failed", plan.out_dir / spec.run_id,
                                             0.0, "not started: the plan's deadline (deadline_s) had passed",
                                             spec.parameters))
                return
            while queue and len(active) < jobs:
                i, spec = queue.popleft()
                run_dir = plan.out_dir / spec.run_id
                share_file = shares_dir / spec.run_id
                share_file.unlink(missing_ok=True)
                given[spec.run_id] = int(env[THREAD_ENV[0]])
                proc = ctx.Process(target=_execute_in_child, name=f"mdc-runs-{spec.run_id}",
                                   args=(spec, run_dir, kernel, plan.timeout_s, cwd,
                                         {**env, THREADS_ENV: str(share_file.resolve())}, plan.out_dir))
                proc.start()
                active[i] = (proc, spec, run_dir)
            wait([proc.sentinel for proc, _, _ in active.values()], timeout=poll_s)
            for i, (proc, spec, run_dir) in list(active.items()):
                if not proc.is_alive():
                    proc.join()
                    del active[i]
                    (shares_dir / spec.run_id).unlink(missing_ok=True)
                    given.pop(spec.run_id, None)
                    on_finished(i, result_from_markers(spec, run_dir, proc.exitcode))
            share = thread_share(jobs, len(active), bool(queue))
            for _, spec, _ in active.values():
                if given.get(spec.run_id) != share:
                    write_thread_share(shares_dir / spec.run_id, share)
                    given[spec.run_id] = share
            if bar is not None:
                show_postfix(bar, " | ".join(f"{spec.run_id}: {describe(run_dir / 'progress.json') or 'starting'}"
                                             for _, spec, run_dir in active.values()))
    except KeyboardInterrupt:
        _stop_runs(active, INTERRUPTED)
        raise


def describe_plan(plan: Plan) -> str:
    """Human-readable listing of the runs a plan would execute (for ``--dry-run``)."""
    at_once = f", {plan.jobs} at a time" if plan.jobs > 1 else ""
    lines = [f"plan {plan.name} ({plan.source}): {len(plan.runs)} run(s){at_once} -> {plan.out_dir}/", ""]
    for spec in plan.runs:
        status = run_status(plan.out_dir / spec.run_id, spec.parameters, spec.notebook)
        params = ", ".join(f"{k}={json.dumps(v)}" for k, v in spec.parameters.items())
        lines.append(f"  [{status:7s}] {spec.run_id}  <- {spec.notebook.name}  {params}")
    return "\n".join(lines)
