"""A plan's runs and a training job as cluster jobs through submitit (``--executor slurm``; the ``[cluster]`` extra).

``mdc runs PLAN --executor slurm`` submits each pending run of the plan (one notebook with its parameters and seed)
as one submitit job, all of them as one SLURM array (``executor.batch()``), with the resources of the plan's
``cluster`` section (:class:`Resources`; flags override it). Each job executes the run exactly as the local runner
does (:func:`mdc_workbench.runs.runner.execute_run`: the run folder, its lock, ``DONE`` with the notebook's SHA-256 or
``FAILED``), so the semantics are the local ones: finished runs are skipped, a failed run is reported (with the tail of
its job's log when the notebook never got to write a marker), ``--deadline`` and Ctrl-C cancel what is still queued
or running, and the summary is gathered from the shared folder when the jobs end. submitit's pickles and logs live
in ``<plan folder>/.submitit/`` (a run folder is cleared when its run starts); each finished job's stdout/stderr is
copied into its run folder as ``job.out`` / ``job.err``, and ``.submitit/jobs.json`` maps run ids to job ids for
``mdc runs --status PLAN`` (:func:`plan_status`, read from the folder alone: markers, run locks, job records).

``mdc train ... --executor slurm --nodes N --gpus-per-node G`` submits one job of N x G tasks (:class:`TrainJob`):
each task exports ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/``MASTER_PORT`` from the cluster's
environment (``submitit.helpers.TorchDistributedEnvironment``) and runs :func:`mdc_core.train.train`, which joins the
process group exactly as under torchrun. SLURM's pre-emption / time-limit signal (submitit's ``USR2``) is relayed to
the trainer's own stop (SIGTERM: finish the step on every rank, write a checkpoint); then submitit's checkpointing
protocol requeues the job with ``resume=True`` (:meth:`TrainJob.checkpoint`), and the requeued job continues from
that checkpoint, exactly.

Tests run the same job objects through submitit's ``LocalExecutor`` (subprocesses; ``tests/workbench/test_cluster.py``).
The local slot runner (``--executor local``, the default) stays the runner without the extra; what the two share and
why the slot loop remains is in ``docs/training_at_scale.md`` (a cluster for plans and training).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mdc_core.runlock import LOCK_NAME, RunLock
from mdc_workbench.runs.declared import record_start
from mdc_workbench.runs.outputs import DONE, FAILED, check_run_folder
from mdc_workbench.runs.plans import Plan, RunSpec, ensure_kernel
from mdc_workbench.runs.resources import Resources
from mdc_workbench.runs.runner import (
    DEADLINE_STOP,
    INTERRUPTED,
    THREAD_ENV,
    execute_run,
    mark_failed,
    result_from_markers,
    split_finished,
)
from mdc_workbench.runs.summary import RunResult, write_summary

JOBS_DIR = ".submitit"  # under the plan folder (or a training run's): submitit's pickles and logs, jobs.json
JOB_RECORDS = "jobs.json"  # run id -> {"job_id", "submitted" (unix time)}
LOG_TAIL_LINES = 20  # of a job's stderr, in a failed run's error when its notebook wrote no marker
NOT_STARTED = "not started: the plan's deadline (deadline_s) had passed"


def plan_resources(plan: Plan, **flags: Any) -> Resources:
    """The plan's ``cluster`` section with the command's flags (None: not given) applied."""
    return Resources.parse(plan.cluster or None, f"plan {plan.source}: cluster").replace(where="flags", **flags)


def make_executor(kind: str, folder: Path, resources: Resources, *, name: str, nodes: int = 1,
                  tasks_per_node: int = 1) -> Any:
    """A submitit executor of `kind` (``slurm``, or ``local`` / ``debug`` for tests and trials: submitit's own
    local executors) writing into `folder`, with `resources` set."""
    import submitit  # ModuleNotFoundError: `mdc` names the [cluster] extra (cli.common.EXTRA_MODULES)

    if kind not in ("slurm", "local", "debug"):
        raise ValueError(f"unknown executor {kind!r}; one of: slurm, local, debug")
    executor = submitit.AutoExecutor(folder=folder, cluster=kind)
    executor.update_parameters(**resources.executor_parameters(name=name, nodes=nodes, tasks_per_node=tasks_per_node))
    return executor


# ----------------------------------------------------------------------------------------------------------
# a plan's runs as jobs


@dataclass
class PlanJob:
    """One run of a plan, executed where the scheduler puts it: what the local runner's process does for it."""

    spec: RunSpec
    run_dir: Path
    plan_dir: Path
    kernel: str
    timeout_s: int | None = None
    cwd: Path | None = None
    env: dict[str, str] = field(default_factory=dict)  # its torch threads (THREAD_ENV)

    def __call__(self) -> str:
        os.environ.update(self.env)  # inherited by the kernel papermill starts
        signal.signal(signal.SIGTERM, _as_interrupt)  # scancel, SLURM's kill: the run marks itself as on Ctrl-C
        ensure_kernel(self.kernel)  # the node's view of the shared environment
        return execute_run(self.spec, self.run_dir, kernel=self.kernel, timeout_s=self.timeout_s, cwd=self.cwd,
                           plan_dir=self.plan_dir).status

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """submitit's pre-emption / time-out protocol: run the notebook again from its start (the notebooks'
        cached models and data sets are reused, so a requeued run redoes only the unfinished part)."""
        import submitit
        return submitit.helpers.DelayedSubmission(self)


def _as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@dataclass
class _Submitted:
    index: int
    spec: RunSpec
    run_dir: Path
    job: Any
    submitted: float
    result: RunResult | None = None


def submit_plan(plan: Plan, executor: Any, *, cwd: Path | None = None, deadline_s: float | None = None,
                progress: bool = True, poll_s: float = 2.0) -> list[RunResult]:
    """Submit every pending run of `plan` through `executor` (a submitit executor with its resources set:
    :func:`make_executor`) as one batch (a SLURM array), wait for them, then write the summary; the same results
    as :func:`mdc_workbench.runs.runner.run_plan`. `deadline_s` (default: the plan's): cancel what is still queued
    or running after that many seconds. Ctrl-C cancels every job and re-raises. The plan folder is locked for the
    whole call, as the local runner locks it."""
    from tqdm.auto import tqdm

    deadline_s = plan.deadline_s if deadline_s is None else deadline_s
    if deadline_s is not None and deadline_s <= 0:
        raise ValueError(f"deadline_s must be a positive number of seconds, got {deadline_s}")
    stop_at = None if deadline_s is None else time.monotonic() + deadline_s
    kernel = ensure_kernel(plan.kernel)
    out = plan.out_dir
    with RunLock(out, "mdc runs"):
        results, todo = split_finished(plan)
        record_start(out, runs_finished=bool(results), plan=plan.source)
        threads = {name: str(executor_cpus(executor)) for name in THREAD_ENV}
        jobs = _submit(plan, todo, executor, kernel=kernel, cwd=cwd, env=threads)
        bar = tqdm(total=len(plan.runs), initial=len(results), desc=f"plan {plan.name}", unit="run",
                   disable=not progress)
        try:
            _wait(jobs, stop_at, bar, poll_s)
        except KeyboardInterrupt:
            _cancel(jobs, INTERRUPTED)
            raise
        finally:
            bar.close()
        results.update({s.index: s.result for s in jobs if s.result is not None})
        ordered = [results[i] for i in range(len(plan.runs))]
        write_summary(out, ordered, name=plan.name, source=plan.source, description=plan.description)
        return ordered


def executor_cpus(executor: Any) -> int:
    """The CPU cores each task of `executor` was given (its ``cpus_per_task``; 1 when not set)."""
    inner = getattr(executor, "_executor", executor)
    return int(getattr(inner, "parameters", {}).get("cpus_per_task", 1) or 1)


def _submit(plan: Plan, todo: list[tuple[int, RunSpec]], executor: Any, *, kernel: str, cwd: Path | None,
            env: dict[str, str]) -> list[_Submitted]:
    out = plan.out_dir
    if not todo:
        return []
    for _, spec in todo:  # a retried run's old markers go now, so that the gather reads this attempt's
        run_dir = check_run_folder(out / spec.run_id, out)
        for marker in (DONE, FAILED):
            (run_dir / marker).unlink(missing_ok=True)
    calls = [PlanJob(spec, out / spec.run_id, out, kernel, plan.timeout_s, cwd, env) for _, spec in todo]
    with executor.batch():
        pending = [executor.submit(call) for call in calls]
    now = time.time()
    jobs = [_Submitted(i, spec, out / spec.run_id, job, now) for (i, spec), job in zip(todo, pending, strict=True)]
    records_path = out / JOBS_DIR / JOB_RECORDS
    records = _read_records(records_path)
    records.update({s.spec.run_id: {"job_id": str(s.job.job_id), "submitted": now} for s in jobs})
    records_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = records_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
    tmp.replace(records_path)
    return jobs


def _wait(jobs: list[_Submitted], stop_at: float | None, bar: Any, poll_s: float) -> None:
    """Gather each job as it ends; at `stop_at` (time.monotonic) cancel the rest."""
    from tqdm.auto import tqdm

    while True:
        for s in jobs:
            if s.result is None and s.job.done():
                s.result = _gather(s)
                if s.result.status == "failed":
                    tqdm.write(f"run {s.spec.run_id} FAILED: {s.result.error.splitlines()[0][:300]}")
                bar.update(1)
        if all(s.result is not None for s in jobs):
            return
        if stop_at is not None and time.monotonic() >= stop_at:
            _cancel(jobs, DEADLINE_STOP)
            return
        bar.set_postfix_str(f"{sum(s.result is None for s in jobs)} job(s) queued or running", refresh=False)
        time.sleep(poll_s)


def _cancel(jobs: list[_Submitted], why: str, join_s: float = 60.0) -> None:
    """Cancel every job not yet gathered, wait up to `join_s` for them to end, and gather each: a run its
    process did not mark is marked FAILED with `why` (or :data:`NOT_STARTED` when it never started)."""
    live = [s for s in jobs if s.result is None]
    for s in live:
        with contextlib.suppress(Exception):  # a job that ended meanwhile (the scheduler says so) is gathered below
            s.job.cancel(check=False)
    end = time.monotonic() + join_s
    while time.monotonic() < end and not all(s.job.done() for s in live):
        time.sleep(0.2)
    for s in live:
        started = _started(s)
        if not (s.run_dir / DONE).is_file() and not (s.run_dir / FAILED).is_file() or \
                _failed_first_line(s.run_dir) == INTERRUPTED:
            s.run_dir.mkdir(parents=True, exist_ok=True)
            mark_failed(s.run_dir, why if started or why != DEADLINE_STOP else NOT_STARTED, 0.0)
        s.result = result_from_markers(s.spec, s.run_dir)
        _copy_logs(s)


def _started(s: _Submitted) -> bool:
    """The run's job got as far as executing it: its parameters.json was written after the submission."""
    try:
        return (s.run_dir / "parameters.json").stat().st_mtime >= s.submitted - 1.0
    except OSError:
        return False


def _failed_first_line(run_dir: Path) -> str:
    try:
        return (run_dir / FAILED).read_text().splitlines()[0]
    except (OSError, IndexError):
        return ""


def _gather(s: _Submitted) -> RunResult:
    """The result of a job that ended: its markers; with none (the job died before the notebook finished or
    failed: killed, out of memory, a broken environment on the node) FAILED with the tail of the job's log."""
    _copy_logs(s)
    if not (s.run_dir / DONE).is_file() and not (s.run_dir / FAILED).is_file():
        tail = log_tail(s.run_dir / "job.err")
        s.run_dir.mkdir(parents=True, exist_ok=True)
        mark_failed(s.run_dir, f"the job {s.job.job_id} ended ({s.job.state}) before the notebook finished or failed"
                    + (f"; the end of its log (job.err):\n{tail}" if tail else ""), 0.0)
    return result_from_markers(s.spec, s.run_dir)


def _copy_logs(s: _Submitted) -> None:
    """The job's stdout and stderr into its run folder (job.out, job.err), when the run folder is there."""
    for source, name in ((s.job.paths.stdout, "job.out"), (s.job.paths.stderr, "job.err")):
        if source.is_file() and s.run_dir.is_dir():
            shutil.copyfile(source, s.run_dir / name)


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _read_records(path: Path) -> dict[str, dict[str, Any]]:
    try:
        records = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return records if isinstance(records, dict) else {}


# ----------------------------------------------------------------------------------------------------------
# mdc runs --status


STATES = ("done", "failed", "running", "queued", "pending")


def plan_status(plan: Plan) -> list[tuple[str, str, str]]:
    """(run id, state, detail) for every run of `plan`, read from the shared folder alone (no scheduler query, so
    it answers on any machine that sees the folder): ``done`` (a DONE marker for these parameters and this
    notebook), ``failed`` (a FAILED marker; detail: its first line), ``running`` (a process holds the run's lock),
    ``queued`` (submitted, not started; detail: the job id), ``pending`` (never submitted, or changed since)."""
    from mdc_workbench.runs.runner import run_status

    records = _read_records(plan.out_dir / JOBS_DIR / JOB_RECORDS)
    rows = []
    for spec in plan.runs:
        run_dir = plan.out_dir / spec.run_id
        record = records.get(spec.run_id, {})
        job = f"job {record['job_id']}" if record.get("job_id") else ""
        if _lock_held(run_dir):
            rows.append((spec.run_id, "running", job))
            continue
        state = run_status(run_dir, spec.parameters, spec.notebook)
        if state == "failed":
            rows.append((spec.run_id, "failed", _failed_first_line(run_dir)[:200]))
        elif state == "done" or not record:
            rows.append((spec.run_id, state, job))
        else:
            markers = [run_dir / DONE, run_dir / FAILED]
            newer = any(m.is_file() and m.stat().st_mtime >= float(record.get("submitted", 0)) for m in markers)
            rows.append((spec.run_id, "pending" if newer else "queued", job))
    return rows


def describe_status(plan: Plan) -> str:
    rows = plan_status(plan)
    counts = {state: sum(r[1] == state for r in rows) for state in STATES}
    head = f"plan {plan.name} -> {plan.out_dir}/: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    return "\n".join([head, *(f"  [{state:7s}] {rid}  {detail}".rstrip() for rid, state, detail in rows)])


def _lock_held(folder: Path) -> bool:
    """A process holds `folder`'s run lock (:class:`mdc_core.runlock.RunLock`; flock, so a dead holder's is free)."""
    try:
        fd = os.open(folder / LOCK_NAME, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock taken here
    return False


def describe_submission(plan: Plan, resources: Resources) -> str:
    """What ``--executor slurm --dry-run`` prints: the jobs it would submit and what each asks for."""
    from mdc_workbench.runs.runner import run_status

    pending = [s for s in plan.runs if run_status(plan.out_dir / s.run_id, s.parameters, s.notebook) != "done"]
    at_once = "" if resources.array_parallelism is None else f", at most {resources.array_parallelism} at once"
    lines = [f"plan {plan.name} ({plan.source}): {len(pending)} of {len(plan.runs)} run(s) to submit as one SLURM "
             f"array{at_once}; logs in {plan.out_dir / JOBS_DIR}/, results in {plan.out_dir}/",
             f"each job: {resources.describe()} (OMP_NUM_THREADS={resources.cpus})", ""]
    lines += [f"  job {spec.run_id}  <- {spec.notebook.name}" for spec in pending]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------
# a (multi-node) training job


@dataclass
class TrainJob:
    """``mdc train`` as one job of N x G tasks: each task one rank (module docstring)."""

    config: dict[str, Any]  # RunConfig.to_dict()
    out: str  # the run folder, on a file system every node sees
    resume: bool = False

    def __call__(self) -> dict[str, Any] | None:
        import submitit

        from mdc_core.config import RunConfig
        from mdc_core.train import TrainingInterrupted, train

        env = submitit.JobEnvironment()
        if env.num_tasks > 1:  # one device per task: the trainer picks cuda:LOCAL_RANK itself
            submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        usr = env._usr_sig()
        requeue = signal.getsignal(usr)  # submitit's handler: checkpoint() on rank 0, requeue, exit
        caught: list[int] = []

        def relay(signum: int, frame: object) -> None:  # pre-emption / time limit: the trainer's own stop
            caught.append(signum)
            signal.raise_signal(signal.SIGTERM)

        signal.signal(usr, relay)
        requeued = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0) > 0  # SLURM requeued it by itself
        try:
            result = train(RunConfig.from_dict(self.config), self.out, resume=self.resume or requeued,
                           progress=False)
        except TrainingInterrupted:
            if not caught or not callable(requeue):
                raise  # scancel or a plain SIGTERM: stopped with a checkpoint, as under torchrun
            requeue(caught[0], None)  # rank 0 exits inside (the job is requeued); the others end here
            return None
        return {"steps": result.steps, "final_loss": result.final_loss, "checkpoint": str(result.checkpoint)}

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """submitit's checkpointing protocol: the requeued job resumes the run from the checkpoint the stop wrote."""
        import submitit
        return submitit.helpers.DelayedSubmission(TrainJob(self.config, self.out, resume=True))


def submit_training(config: dict[str, Any], out: str | Path, executor: Any, *, resume: bool = False) -> Any:
    """Submit :class:`TrainJob` through `executor` (its nodes and tasks set: :func:`make_executor`); the job."""
    return executor.submit(TrainJob(config, str(out), resume))
