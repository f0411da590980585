"""Batch runs: execute notebooks with papermill over a grid of parameters (``mdc runs PLAN.yaml``).

A plan is a YAML file (the shipped ones are in ``plans/``)::

    name: schedule_ablation            # optional; default: the file name. Output: <output_root>/<name>/
    description: Table 5 on the embedded data
    kernel: mdc                        # optional; the project's kernel, registered on first use
    output_root: papermill_runs        # optional; relative to the working directory
    timeout_s: 1800                    # optional; per-cell execution timeout (default: none)
    jobs: 2                            # optional; notebooks executed at once (default 1; see below)
    parameters:                        # base parameters: given to every notebook that declares them
      device: cpu
    grid:                              # optional; crossed with every notebook's own grid
      n_train: [2000, 4000]
    seeds: [0, 1, 2]                   # optional; repeat every run over training seeds (see below)
    notebooks:
      - notebooks/01_pretraining.ipynb            # a path ...
      - path: notebooks/02_noise_schedule_ablation.ipynb   # ... or a mapping
        id: ablation                              # optional run-id prefix (default: the notebook's stem)
        parameters: {steps: 200}                  # must be declared by this notebook
        grid: {t_low: [0.3, 0.5]}                 # one run per combination
        seeds: [0]                                # optional; overrides the plan's seeds for this notebook

``seeds`` repeats each run once per training seed: the notebook's ``train_seed`` parameter (:data:`SEED_PARAM`;
it seeds model initialisation, masks and data order) is set, and the run id gets ``__seed=N``. The plan-level
list applies to the notebooks that declare ``train_seed`` (others run once); an entry's own ``seeds`` needs a
notebook that declares it. The summary gathers the repeats of a table row into a mean with a 95% interval.

Every run gets ``output_dir`` (its own run folder, absolute) on top of its parameters and executes in
``<output_root>/<name>/<run-id>/`` as ``<run-id>/<notebook>.ipynb`` beside ``parameters.json``, the
``metrics.json`` and ``figures/*.png`` the notebook writes, and a marker: ``DONE`` (JSON: duration) or
``FAILED`` (the error). A failed run is kept and the plan goes on; re-running a plan skips runs whose ``DONE``
marker and ``parameters.json`` match (a changed parameter re-runs that run), and retries failed ones. When the
plan ends :mod:`mdc_core.workbench.summary` writes ``summary.md``, ``summary.json`` and ``summary.png``.

``jobs`` runs that many notebooks at once, each in its own process and kernel with ``cpu_count // jobs``
torch threads (``OMP_NUM_THREADS``); ``mdc runs --jobs N`` overrides it. Runs start in plan order as slots
free up. Once nothing is left to start, a slot that empties hands its cores to the runs still going: each gets
``cpu_count // running`` threads (:func:`thread_share`, applied inside the kernel by
:func:`mdc_core.workbench.progress.follow_thread_share`), so the plan's last long run does not finish on one
core of an idle machine. Notebooks that need the same cached model or data folder do not race: the notebook
helpers hold a file lock on each cache folder while they write it (:func:`mdc_core.workbench.notebook.train_cached`,
:func:`~mdc_core.workbench.notebook.ensure_dataset`), so a notebook that needs a model another one is training
waits for it and then loads it. On a small CPU this pays because a small model's training uses a second thread
poorly and much of a notebook uses one core anyway (measurements in ``docs/notebooks.md``).

Parameters are checked against each notebook's ``parameters`` cell (``papermill.inspect_notebook``) before
anything runs: an undeclared name, a value of the wrong type, or a missing notebook is an error naming it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from tqdm.auto import tqdm

from mdc_core.workbench.evidence import SEED_PARAM
from mdc_core.workbench.summary import RunResult, write_summary

KERNEL_NAME = "mdc"  # the project's Jupyter kernel (this virtual environment's python)
KERNEL_DISPLAY_NAME = "MDC workbench"
PLAN_KEYS = ("name", "description", "kernel", "output_root", "timeout_s", "jobs", "parameters", "grid", "seeds",
             "notebooks")
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # what a run's kernel reads for its torch thread count
ENTRY_KEYS = ("path", "id", "parameters", "grid", "seeds")

RESERVED = ("output_dir",)  # set by the runner for every run
DONE, FAILED = "DONE", "FAILED"
SHARES_DIR = ".threads"  # under the plan folder: each running run's torch-thread share (thread_share)

# papermill's inferred type name of a parameter's default -> Python types a plan value may have
_TYPE_CHECKS: dict[str, tuple[type, ...]] = {
    "int": (int,), "float": (int, float), "str": (str,), "bool": (bool,), "list": (list,), "dict": (dict,),
    "tuple": (list,),
}


@dataclass
class RunSpec:
    """One execution of one notebook with one set of parameters."""

    run_id: str  # folder name under the plan folder
    notebook: Path  # source notebook (absolute)
    parameters: dict[str, Any]  # everything injected except output_dir

    def injected(self, run_dir: Path) -> dict[str, Any]:
        return {**self.parameters, "output_dir": str(run_dir.resolve())}


@dataclass
class Plan:
    """A parsed, validated plan (see the module docstring for the YAML layout)."""

    name: str
    source: Path  # the YAML file
    runs: list[RunSpec]
    kernel: str = KERNEL_NAME
    output_root: Path = Path("papermill_runs")
    timeout_s: int | None = None
    jobs: int = 1  # notebooks executed at once
    description: str = ""
    declared: dict[str, dict[str, Any]] = field(default_factory=dict)  # notebook -> papermill's parameter table

    @property
    def out_dir(self) -> Path:
        return self.output_root / self.name


# ----------------------------------------------------------------------------------------------------------
# plans


def load_plan(path: str | Path, *, root: str | Path | None = None) -> Plan:
    """Read and validate the plan at `path`. Notebook paths are relative to `root` (default: the working
    directory, i.e. the repository root when run from there), falling back to the plan's own folder."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"plan file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ValueError(f"plan {path} is not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ValueError(f"plan {path} must be a YAML mapping with a 'notebooks' list")
    _check_keys(data, PLAN_KEYS, f"plan {path}")
    root = Path(root) if root is not None else Path.cwd()
    name = str(data.get("name") or path.stem)
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"plan name {name!r} may hold only letters, digits, '_', '-' and '.'")
    base = _mapping(data.get("parameters"), "parameters")
    top_grid = _grid(data.get("grid"), "grid")
    top_seeds = _seeds(data.get("seeds"), f"plan {path}: seeds")
    entries = data.get("notebooks")
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"plan {path}: 'notebooks' must be a non-empty list of notebook paths or mappings")
    timeout = data.get("timeout_s")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int) or timeout <= 0):
        raise ValueError(f"plan {path}: timeout_s must be a positive integer (seconds), got {timeout!r}")
    jobs = data.get("jobs", 1)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"plan {path}: jobs must be a positive integer (notebooks at once), got {jobs!r}")

    declared: dict[str, dict[str, Any]] = {}
    runs: list[RunSpec] = []
    used_base: set[str] = set()
    for i, entry in enumerate(entries):
        where = f"plan {path}: notebooks[{i}]"
        if isinstance(entry, str):
            entry = {"path": entry}
        if not isinstance(entry, dict) or "path" not in entry:
            raise ValueError(f"{where} must be a notebook path or a mapping with 'path'")
        _check_keys(entry, ENTRY_KEYS, where)
        notebook = _find_notebook(str(entry["path"]), root, path.parent, where)
        params = declared.setdefault(str(notebook), notebook_parameters(notebook))
        for key in RESERVED:
            if key not in params:
                raise ValueError(f"{where}: notebook {notebook} has no '{key}' parameter (the runner sets it)")
        own = _mapping(entry.get("parameters"), f"{where}.parameters")
        grid = {**top_grid, **_grid(entry.get("grid"), f"{where}.grid")}
        shared = {k: v for k, v in base.items() if k in params}
        used_base.update(shared)
        prefix = str(entry.get("id") or notebook.stem)
        seeds = _entry_seeds(entry, top_seeds, params, notebook, where)
        for combo in _combinations(grid):
            for seed in seeds:
                values = {**shared, **own, **combo, **({} if seed is None else {SEED_PARAM: seed})}
                _check_values(values, params, notebook, where)
                run_id = _run_id(prefix, combo) + ("" if seed is None else f"__seed={seed}")
                runs.append(RunSpec(run_id=run_id, notebook=notebook, parameters=values))
    unused = sorted(set(base) - used_base)
    if unused:
        raise ValueError(f"plan {path}: base parameter(s) {unused} are declared by none of its notebooks")
    ids = [r.run_id for r in runs]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ValueError(f"plan {path}: run ids {dupes} occur twice; give the entries distinct 'id's")
    return Plan(name=name, source=path, runs=runs, kernel=str(data.get("kernel") or KERNEL_NAME),
                output_root=Path(data.get("output_root") or "papermill_runs"), timeout_s=timeout, jobs=jobs,
                description=str(data.get("description") or ""), declared=declared)


def notebook_parameters(notebook: Path) -> dict[str, Any]:
    """The notebook's ``parameters`` cell as papermill reads it: name -> {inferred_type_name, default, help}.
    Exactly one cell must be tagged ``parameters``."""
    import nbformat
    import papermill

    nb = nbformat.read(str(notebook), as_version=4)
    tagged = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(tagged) != 1:
        raise ValueError(f"notebook {notebook} must have exactly one cell tagged 'parameters', found {len(tagged)}")
    found = dict(papermill.inspect_notebook(str(notebook)))
    for number, line in enumerate(_source(tagged[0]).splitlines(), 1):
        name = re.match(r"\s*([A-Za-z_]\w*)\s*[:=]", line)
        if name and name.group(1) not in found:  # papermill skips lines it cannot parse (it only logs them)
            raise ValueError(f"notebook {notebook}: papermill cannot parse line {number} of the parameters cell "
                             f"({line.strip()!r}); write `name: type = literal  # comment` with no '=' inside "
                             "the value or the comment")
    return found


def _source(cell: Any) -> str:
    return "".join(cell.source) if isinstance(cell.source, list) else cell.source


def _find_notebook(name: str, root: Path, plan_dir: Path, where: str) -> Path:
    for base in (root, plan_dir):
        candidate = (base / name).resolve()
        if candidate.is_file():
            if candidate.suffix != ".ipynb":
                raise ValueError(f"{where}: {name} is not a .ipynb notebook")
            return candidate
    raise FileNotFoundError(f"{where}: notebook {name} not found (looked in {root} and {plan_dir})")


def _check_keys(data: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; allowed: {', '.join(allowed)}")


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be a mapping of parameter names to values, got {type(value).__name__}")
    for key in value:
        if key in RESERVED:
            raise ValueError(f"{where}: '{key}' is set by the runner for every run; remove it from the plan")
    return dict(value)


def _grid(value: Any, where: str) -> dict[str, list[Any]]:
    grid = _mapping(value, where)
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"{where}.{key} must be a non-empty list of values (one run per value)")
    return grid


def _seeds(value: Any, where: str) -> list[int] | None:
    """A `seeds` list: distinct non-negative integers (None when absent)."""
    if value is None:
        return None
    if (not isinstance(value, list) or not value
            or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in value)):
        raise ValueError(f"{where} must be a non-empty list of non-negative integers, got {value!r}")
    if len(set(value)) != len(value):
        raise ValueError(f"{where} lists a seed twice: {value!r}")
    return list(value)


def _entry_seeds(entry: dict[str, Any], top: list[int] | None, params: dict[str, Any], notebook: Path,
                 where: str) -> list[int | None]:
    """The training seeds one notebook entry runs over ([None]: once, without setting the seed)."""
    own = _seeds(entry.get("seeds"), f"{where}.seeds")
    if own is not None and SEED_PARAM not in params:
        raise ValueError(f"{where}: 'seeds' needs a '{SEED_PARAM}' parameter, which {notebook.name} does not declare")
    if own is not None and (SEED_PARAM in (entry.get("parameters") or {}) or SEED_PARAM in (entry.get("grid") or {})):
        raise ValueError(f"{where}: set '{SEED_PARAM}' through 'seeds' or through parameters/grid, not both")
    seeds = own if own is not None else (top if SEED_PARAM in params else None)
    return list(seeds) if seeds else [None]


def _combinations(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    keys = list(grid)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*(grid[k] for k in keys))]


def _check_values(values: dict[str, Any], declared: dict[str, Any], notebook: Path, where: str) -> None:
    for key, value in values.items():
        if key not in declared:
            known = ", ".join(k for k in declared if k not in RESERVED)
            raise ValueError(f"{where}: parameter {key!r} is not declared by {notebook.name} (declared: {known})")
        type_name = str(declared[key].get("inferred_type_name", "")).split("[")[0]
        allowed = _TYPE_CHECKS.get(type_name)
        bad_bool = isinstance(value, bool) and type_name in ("int", "float")
        if allowed is not None and (bad_bool or not isinstance(value, allowed)):
            raise ValueError(f"{where}: parameter {key!r} of {notebook.name} is {type_name}, got {value!r}")


def _slug(value: Any) -> str:
    text = "-".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return re.sub(r"[^A-Za-z0-9.-]+", "-", text).strip("-") or "x"


def _run_id(prefix: str, combo: dict[str, Any]) -> str:
    return "__".join([prefix, *(f"{k}={_slug(v)}" for k, v in combo.items())])


# ----------------------------------------------------------------------------------------------------------
# the kernel


def ensure_kernel(name: str = KERNEL_NAME, display_name: str = KERNEL_DISPLAY_NAME) -> str:
    """Register this environment's python as Jupyter kernel `name` (``--sys-prefix``) unless a kernel of that
    name exists whose python is present. Returns the kernel name."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        spec = KernelSpecManager().get_kernel_spec(name)
        if spec.argv and Path(spec.argv[0]).exists():
            return name
    except NoSuchKernel:
        pass
    cmd = [sys.executable, "-m", "ipykernel", "install", "--sys-prefix", "--name", name,
           "--display-name", display_name]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"could not register the Jupyter kernel {name!r}: {done.stderr.strip()}")
    return name


# ----------------------------------------------------------------------------------------------------------
# running


def run_status(run_dir: Path, parameters: dict[str, Any]) -> str:
    """'done' when the run finished with exactly these parameters, 'failed' when marked so, else 'pending'."""
    try:
        saved = json.loads((run_dir / "parameters.json").read_text())
    except (OSError, json.JSONDecodeError):
        return "pending"
    if saved != json.loads(json.dumps(parameters)):
        return "pending"
    if (run_dir / DONE).is_file():
        return "done"
    return "failed" if (run_dir / FAILED).is_file() else "pending"


def execute_run(spec: RunSpec, run_dir: Path, *, kernel: str, timeout_s: int | None = None,
                cwd: Path | None = None, on_progress: Callable[[str], None] | None = None) -> RunResult:
    """Execute one run into `run_dir` (cleared first). Never raises for a failing notebook: the error is
    written to ``FAILED`` and returned; KeyboardInterrupt marks the run and propagates.

    ``on_progress(text)`` is called about once a second with what the notebook reports through
    :mod:`mdc_core.workbench.progress` (its stage and training step), read from ``<run_dir>/progress.json``."""
    import papermill

    if run_dir.exists():
        shutil.rmtree(run_dir)
    (run_dir / "figures").mkdir(parents=True)
    params = spec.injected(run_dir)
    (run_dir / "parameters.json").write_text(json.dumps(spec.parameters, indent=2, sort_keys=True) + "\n")
    start = time.perf_counter()
    error = ""
    try:
        with _progress_relay(run_dir / "progress.json", on_progress):
            papermill.execute_notebook(str(spec.notebook), str(run_dir / spec.notebook.name), parameters=params,
                                       kernel_name=kernel, progress_bar=False, cwd=str(cwd or Path.cwd()),
                                       execution_timeout=timeout_s)
        if not (run_dir / "metrics.json").is_file():
            error = f"the notebook finished but wrote no metrics.json into {run_dir}"
    except KeyboardInterrupt:
        _mark_failed(run_dir, "interrupted (KeyboardInterrupt)", time.perf_counter() - start)
        raise
    except Exception as err:  # any failure of this run is recorded; the plan goes on
        error = _describe(err)
    duration = time.perf_counter() - start
    if error:
        _mark_failed(run_dir, error, duration)
        status = "failed"
    else:
        (run_dir / DONE).write_text(json.dumps({"duration_s": round(duration, 2),
                                                "finished": dt.datetime.now(dt.UTC).isoformat()}) + "\n")
        status = "done"
    return RunResult(spec.run_id, spec.notebook.name, status, run_dir, duration, error, spec.parameters)


@contextlib.contextmanager
def _progress_relay(path: Path, on_progress: Callable[[str], None] | None, every_s: float = 1.0) -> Iterator[None]:
    """Point the kernel at `path` (:data:`mdc_core.workbench.progress.ENV`; a kernel inherits the runner's environment)
    and, with `on_progress`, poll the notebook's reports in a thread while the block runs."""
    from mdc_core.workbench.progress import ENV, describe

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


def _mark_failed(run_dir: Path, error: str, duration: float) -> None:
    (run_dir / FAILED).write_text(f"{error}\nduration_s: {duration:.1f}\n")


def run_plan(plan: Plan, *, progress: bool = True, cwd: Path | None = None, jobs: int | None = None
             ) -> list[RunResult]:
    """Execute every pending run of `plan`, skipping finished ones, then write the summary. `jobs` (default: the
    plan's ``jobs``) notebooks run at once; with more than one, each runs in its own process (module docstring)."""

    kernel = ensure_kernel(plan.kernel)
    out = plan.out_dir
    out.mkdir(parents=True, exist_ok=True)
    jobs = plan.jobs if jobs is None else jobs
    if jobs < 1:
        raise ValueError(f"jobs must be a positive integer (notebooks at once), got {jobs}")
    results: dict[int, RunResult] = {}
    todo: list[tuple[int, RunSpec]] = []
    for i, spec in enumerate(plan.runs):
        run_dir = out / spec.run_id
        if run_status(run_dir, spec.parameters) == "done":
            done = json.loads((run_dir / DONE).read_text())
            results[i] = RunResult(spec.run_id, spec.notebook.name, "skipped", run_dir,
                                   float(done.get("duration_s", 0.0)), parameters=spec.parameters)
        else:
            todo.append((i, spec))
    bar = tqdm(total=len(plan.runs), initial=len(results), desc=f"plan {plan.name}", unit="run",
               disable=not progress)

    def finished(i: int, result: RunResult) -> None:
        results[i] = result
        if result.status == "failed":
            tqdm.write(f"run {result.run_id} FAILED: {result.error.splitlines()[0][:300]}")
        bar.update(1)

    if jobs == 1 or len(todo) <= 1:
        for i, spec in todo:
            bar.set_postfix_str(spec.run_id)
            report = (lambda text, rid=spec.run_id: bar.set_postfix_str(f"{rid}: {text}", refresh=True)) \
                if progress else None
            finished(i, execute_run(spec, out / spec.run_id, kernel=kernel, timeout_s=plan.timeout_s, cwd=cwd,
                                    on_progress=report))
    else:
        _run_concurrently(plan, todo, kernel=kernel, cwd=cwd, jobs=jobs, bar=bar if progress else None,
                          on_finished=finished)
    bar.close()
    ordered = [results[i] for i in range(len(plan.runs))]
    write_summary(plan.out_dir, ordered, name=plan.name, source=plan.source, description=plan.description)
    return ordered


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
                      env: dict[str, str]) -> None:
    """Process target of a concurrent run: the run's outcome is its marker file (``DONE`` / ``FAILED``)."""
    os.environ.update(env)  # inherited by the kernel papermill starts
    try:
        execute_run(spec, run_dir, kernel=kernel, timeout_s=timeout_s, cwd=cwd)
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
    _mark_failed(run_dir, error, 0.0)
    return RunResult(spec.run_id, spec.notebook.name, "failed", run_dir, 0.0, error, spec.parameters)


def _run_concurrently(plan: Plan, todo: list[tuple[int, RunSpec]], *, kernel: str, cwd: Path | None, jobs: int,
                      bar: Any, on_finished: Callable[[int, RunResult], None], poll_s: float = 1.0) -> None:
    """Run `todo` in plan order, `jobs` processes at a time; `bar` (a tqdm bar or None) shows what each running
    notebook reports. Ctrl-C stops every running notebook (each marks itself FAILED) and re-raises."""
    import multiprocessing
    import signal
    from collections import deque
    from multiprocessing.connection import wait

    from mdc_core.workbench.progress import THREADS_ENV, describe, write_thread_share

    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no threads or torch state inherited
    env = thread_env(jobs)
    shares_dir = plan.out_dir / SHARES_DIR
    queue = deque(todo)
    active: dict[int, tuple[Any, RunSpec, Path]] = {}
    try:
        while queue or active:
            while queue and len(active) < jobs:
                i, spec = queue.popleft()
                run_dir = plan.out_dir / spec.run_id
                share_file = shares_dir / spec.run_id
                share_file.unlink(missing_ok=True)
                proc = ctx.Process(target=_execute_in_child, name=f"mdc-runs-{spec.run_id}",
                                   args=(spec, run_dir, kernel, plan.timeout_s, cwd,
                                         {**env, THREADS_ENV: str(share_file.resolve())}))
                proc.start()
                active[i] = (proc, spec, run_dir)
            wait([proc.sentinel for proc, _, _ in active.values()], timeout=poll_s)
            for i, (proc, spec, run_dir) in list(active.items()):
                if not proc.is_alive():
                    proc.join()
                    del active[i]
                    (shares_dir / spec.run_id).unlink(missing_ok=True)
                    on_finished(i, result_from_markers(spec, run_dir, proc.exitcode))
            share = thread_share(jobs, len(active), bool(queue))
            for _, spec, _ in active.values():
                write_thread_share(shares_dir / spec.run_id, share)
            if bar is not None:
                bar.set_postfix_str(" | ".join(f"{spec.run_id}: {describe(run_dir / 'progress.json') or 'starting'}"
                                               for _, spec, run_dir in active.values()), refresh=True)
    except KeyboardInterrupt:
        procs = [proc for proc, _, _ in active.values()]
        wait([p.sentinel for p in procs], timeout=5)  # Ctrl-C in a terminal reached them too
        for proc in procs:
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGINT)
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.terminate()
        for _, _spec, run_dir in active.values():
            if not (run_dir / DONE).is_file() and not (run_dir / FAILED).is_file():
                run_dir.mkdir(parents=True, exist_ok=True)
                _mark_failed(run_dir, "interrupted (KeyboardInterrupt)", 0.0)
        raise


def describe_plan(plan: Plan) -> str:
    """Human-readable listing of the runs a plan would execute (for ``--dry-run``)."""
    at_once = f", {plan.jobs} at a time" if plan.jobs > 1 else ""
    lines = [f"plan {plan.name} ({plan.source}): {len(plan.runs)} run(s){at_once} -> {plan.out_dir}/", ""]
    for spec in plan.runs:
        status = run_status(plan.out_dir / spec.run_id, spec.parameters)
        params = ", ".join(f"{k}={json.dumps(v)}" for k, v in spec.parameters.items())
        lines.append(f"  [{status:7s}] {spec.run_id}  <- {spec.notebook.name}  {params}")
    return "\n".join(lines)
