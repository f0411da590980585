"""Batch runs: execute notebooks with papermill over a grid of parameters (``mdc runs PLAN.yaml``).

A plan is a YAML file (the shipped ones are in ``plans/``)::

    name: schedule_ablation            # optional; default: the file name. Output: <output_root>/<name>/
    description: Table 5 on the embedded data
    kernel: mdc                        # optional; the project's kernel, registered on first use
    output_root: papermill_runs        # optional; relative to the working directory
    timeout_s: 1800                    # optional; per-cell execution timeout (default: none)
    parameters:                        # base parameters: given to every notebook that declares them
      device: cpu
    grid:                              # optional; crossed with every notebook's own grid
      seed: [0, 1]
    notebooks:
      - notebooks/01_pretraining.ipynb            # a path ...
      - path: notebooks/02_noise_schedule_ablation.ipynb   # ... or a mapping
        id: ablation                              # optional run-id prefix (default: the notebook's stem)
        parameters: {steps: 200}                  # must be declared by this notebook
        grid: {t_low: [0.3, 0.5]}                 # one run per combination

Every run gets ``output_dir`` (its own run folder, absolute) on top of its parameters and executes in
``<output_root>/<name>/<run-id>/`` as ``<run-id>/<notebook>.ipynb`` beside ``parameters.json``, the
``metrics.json`` and ``figures/*.png`` the notebook writes, and a marker: ``DONE`` (JSON: duration) or
``FAILED`` (the error). A failed run is kept and the plan goes on; re-running a plan skips runs whose ``DONE``
marker and ``parameters.json`` match (a changed parameter re-runs that run), and retries failed ones. When the
plan ends :mod:`mdc_core.workbench.summary` writes ``summary.md``, ``summary.json`` and ``summary.png``.

Parameters are checked against each notebook's ``parameters`` cell (``papermill.inspect_notebook``) before
anything runs: an undeclared name, a value of the wrong type, or a missing notebook is an error naming it.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from tqdm.auto import tqdm

from mdc_core.workbench.summary import RunResult, write_summary

KERNEL_NAME = "mdc"  # the project's Jupyter kernel (this virtual environment's python)
KERNEL_DISPLAY_NAME = "MDC workbench"
PLAN_KEYS = ("name", "description", "kernel", "output_root", "timeout_s", "parameters", "grid", "notebooks")
ENTRY_KEYS = ("path", "id", "parameters", "grid")
RESERVED = ("output_dir",)  # set by the runner for every run
DONE, FAILED = "DONE", "FAILED"

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
    entries = data.get("notebooks")
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"plan {path}: 'notebooks' must be a non-empty list of notebook paths or mappings")
    timeout = data.get("timeout_s")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int) or timeout <= 0):
        raise ValueError(f"plan {path}: timeout_s must be a positive integer (seconds), got {timeout!r}")

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
        for combo in _combinations(grid):
            values = {**shared, **own, **combo}
            _check_values(values, params, notebook, where)
            runs.append(RunSpec(run_id=_run_id(prefix, combo), notebook=notebook, parameters=values))
    unused = sorted(set(base) - used_base)
    if unused:
        raise ValueError(f"plan {path}: base parameter(s) {unused} are declared by none of its notebooks")
    ids = [r.run_id for r in runs]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ValueError(f"plan {path}: run ids {dupes} occur twice; give the entries distinct 'id's")
    return Plan(name=name, source=path, runs=runs, kernel=str(data.get("kernel") or KERNEL_NAME),
                output_root=Path(data.get("output_root") or "papermill_runs"), timeout_s=timeout,
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
                cwd: Path | None = None) -> RunResult:
    """Execute one run into `run_dir` (cleared first). Never raises for a failing notebook: the error is
    written to ``FAILED`` and returned; KeyboardInterrupt marks the run and propagates."""
    import papermill

    if run_dir.exists():
        shutil.rmtree(run_dir)
    (run_dir / "figures").mkdir(parents=True)
    params = spec.injected(run_dir)
    (run_dir / "parameters.json").write_text(json.dumps(spec.parameters, indent=2, sort_keys=True) + "\n")
    start = time.perf_counter()
    error = ""
    try:
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


def _describe(err: Exception) -> str:
    ename, evalue = getattr(err, "ename", None), getattr(err, "evalue", None)
    if ename is not None:  # papermill.PapermillExecutionError: the notebook's own exception
        cell = getattr(err, "exec_count", None)
        return f"{ename}: {evalue} (cell [{cell}])"
    return f"{type(err).__name__}: {err}"


def _mark_failed(run_dir: Path, error: str, duration: float) -> None:
    (run_dir / FAILED).write_text(f"{error}\nduration_s: {duration:.1f}\n")


def run_plan(plan: Plan, *, progress: bool = True, cwd: Path | None = None) -> list[RunResult]:
    """Execute every pending run of `plan`, skipping finished ones, then write the summary."""

    kernel = ensure_kernel(plan.kernel)
    out = plan.out_dir
    out.mkdir(parents=True, exist_ok=True)
    results: list[RunResult] = []
    bar = tqdm(plan.runs, desc=f"plan {plan.name}", unit="run", disable=not progress)
    for spec in bar:
        run_dir = out / spec.run_id
        bar.set_postfix_str(spec.run_id)
        if run_status(run_dir, spec.parameters) == "done":
            done = json.loads((run_dir / DONE).read_text())
            results.append(RunResult(spec.run_id, spec.notebook.name, "skipped", run_dir,
                                     float(done.get("duration_s", 0.0)), parameters=spec.parameters))
            continue
        result = execute_run(spec, run_dir, kernel=kernel, timeout_s=plan.timeout_s, cwd=cwd)
        if result.status == "failed":
            tqdm.write(f"run {spec.run_id} FAILED: {result.error.splitlines()[0][:300]}")
        results.append(result)
    bar.close()
    write_summary(plan.out_dir, results, name=plan.name, source=plan.source, description=plan.description)
    return results


def describe_plan(plan: Plan) -> str:
    """Human-readable listing of the runs a plan would execute (for ``--dry-run``)."""
    lines = [f"plan {plan.name} ({plan.source}): {len(plan.runs)} run(s) -> {plan.out_dir}/", ""]
    for spec in plan.runs:
        status = run_status(plan.out_dir / spec.run_id, spec.parameters)
        params = ", ".join(f"{k}={json.dumps(v)}" for k, v in spec.parameters.items())
        lines.append(f"  [{status:7s}] {spec.run_id}  <- {spec.notebook.name}  {params}")
    return "\n".join(lines)
