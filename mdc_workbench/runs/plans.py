"""Batch runs: execute notebooks with papermill over a grid of parameters (``mdc runs PLAN.yaml``).

A plan is a YAML file (the shipped ones are in ``plans/``)::

    name: schedule_ablation            # optional; default: the file name. Output: <output_root>/<name>/
    description: Table 5 on the embedded data
    kernel: mdc                        # optional; the project's kernel, registered on first use
    output_root: papermill_runs        # optional; relative to the working directory
    timeout_s: 1800                    # optional; per-cell execution timeout (default: none)
    deadline_s: 480                    # optional; stop the whole plan after this long, keeping what finished
    jobs: 2                            # optional; notebooks executed at once (default 1; see below)
    parameters:                        # base parameters: given to every notebook that declares them
      device: cpu
    grid:                              # optional; crossed with every notebook's own grid
      n_train: [2000, 4000]
    seeds: [0, 1, 2]                   # optional; repeat every run over training seeds (see below)
    decides: [...]                     # optional; the claims it decides, declared with their power (see below)
    notebooks:
      - notebooks/01_pretraining.ipynb            # a path ...
      - path: notebooks/02_noise_schedule_ablation.ipynb   # ... or a mapping
        id: ablation                              # optional run-id prefix (default: the notebook's stem)
        parameters: {steps: 200}                  # must be declared by this notebook
        grid: {t_low: [0.3, 0.5]}                 # one run per combination
        seeds: [0]                                # optional; overrides the plan's seeds for this notebook
        members: 4                                # optional; train the seeds 4 at a time (seed stacks, below)
    cluster:                           # optional; what each job asks for with --executor slurm (runs/executor.py)
      gpus: 1                          #   per run; cpus (its torch threads), mem_gb, timeout_min, partition,
      timeout_min: 120                 #   account, array_parallelism (runs at once) likewise

``seeds`` repeats each run once per training seed: the notebook's ``train_seed`` parameter (:data:`SEED_PARAM`;
it seeds model initialisation, masks and data order) is set, and the run id gets ``__seed=N``. The plan-level
list applies to the notebooks that declare ``train_seed`` (others run once); an entry's own ``seeds`` needs a
notebook that declares it. The summary gathers the repeats of a table row into a mean with a 95% interval.
An entry's ``members: K`` trains its seeds K at a time as seed stacks, one run per stack, and the summary gathers
each member as a seed (:mod:`mdc_workbench.runs.members`).

``decides`` declares the claims a plan decides, each with its effect or margin and the variance of earlier runs
(the layout: :mod:`mdc_workbench.runs.powered`); ``mdc runs`` computes the seeds each needs for 80% power and refuses
to start a plan whose seeds fall short unless ``--underpowered-ok``.

How a plan runs (run folders, markers, resuming, ``jobs`` and the thread shares) is in
:mod:`mdc_workbench.runs.runner`.

Parameters are checked against each notebook's ``parameters`` cell (``papermill.inspect_notebook``) before
anything runs: an undeclared name, a value of the wrong type (the annotated type, or for an untyped ``x = 1`` the
type of its default), a notebook without a kernelspec, or a missing notebook is an error naming it. With
``jobs`` > 1, two runs that would write one ``data_dir`` with different data parameters (:data:`DATA_PARAMS`) are
an error too: one would rewrite the data set while the other reads it.
"""

from __future__ import annotations

import ast
import contextlib
import itertools
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mdc_workbench.runs.evidence import SEED_PARAM
from mdc_workbench.runs.members import MEMBERS_PARAM, member_stacks
from mdc_workbench.runs.powered import Decision, PowerCheck, check, read_decides
from mdc_workbench.runs.resources import Resources

KERNEL_NAME = "mdc"  # the project's Jupyter kernel (this virtual environment's python)
KERNEL_DISPLAY_NAME = "MDC workbench"
PLAN_KEYS = ("name", "description", "kernel", "output_root", "timeout_s", "deadline_s", "jobs", "parameters", "grid",
             "seeds", "decides", "notebooks", "cluster")
ENTRY_KEYS = ("path", "id", "parameters", "grid", "seeds", "members")

RESERVED = ("output_dir",)  # set by the runner for every run
# the parameters that define the embedded data set a notebook writes into its `data_dir` (when `synthesize`)
DATA_PARAMS = ("n_train", "n_eval", "captions", "image_size", "difficulty", "seed")

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
    deadline_s: float | None = None  # stop the plan after this many seconds with what finished (None: no limit)
    description: str = ""
    declared: dict[str, dict[str, Any]] = field(default_factory=dict)  # notebook -> papermill's parameter table
    cluster: dict[str, Any] = field(default_factory=dict)  # resources of each job with --executor slurm (resources.py)
    decides: list[Decision] = field(default_factory=list)  # the claims it decides, with their power declaration

    @property
    def seeds(self) -> int:
        """The training seeds of the plan's runs, a seed stack's members each as its seed (1 when none sets
        ``train_seed`` or ``train_seeds``)."""
        return max(1, len({s for r in self.runs for s in ([r.parameters[SEED_PARAM]] if SEED_PARAM in r.parameters
                                                         else r.parameters.get(MEMBERS_PARAM) or [])}))

    def power_checks(self) -> list[PowerCheck]:
        """Each declared claim's power under the plan's seeds and test items (:func:`mdc_workbench.runs.powered.check`;
        the test items are the plan's ``n_eval`` unless the declaration names its own)."""
        n_eval = next((r.parameters["n_eval"] for r in self.runs if isinstance(r.parameters.get("n_eval"), int)), None)
        return check(self.decides, self.seeds, n_eval)

    @property
    def out_dir(self) -> Path:
        return self.output_root / self.name


# ----------------------------------------------------------------------------------------------------------
# plans


def load_plan(path: str | Path, *, root: str | Path | None = None) -> Plan:
    """Read and validate the plan at `path`. Notebook paths are relative to `root` (default: the working
    directory, i.e. the repository root when run from there), falling back to the plan's own folder."""
    path = Path(path)
    data = _read_plan_file(path)
    root = Path(root) if root is not None else Path.cwd()
    name = folder_name(str(data.get("name") or path.stem), f"plan {path}: name")
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
    deadline = data.get("deadline_s")
    if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or deadline <= 0):
        raise ValueError(f"plan {path}: deadline_s must be a positive number (seconds), got {deadline!r}")

    decides = read_decides(data.get("decides"), f"plan {path}: decides")
    declared: dict[str, dict[str, Any]] = {}
    runs: list[RunSpec] = []
    used_base: set[str] = set()
    for i, entry in enumerate(entries):
        runs += _entry_runs(entry, f"plan {path}: notebooks[{i}]", root=root, plan_dir=path.parent, base=base,
                            top_grid=top_grid, top_seeds=top_seeds, declared=declared, used_base=used_base)
    unused = sorted(set(base) - used_base)
    if unused:
        raise ValueError(f"plan {path}: base parameter(s) {unused} are declared by none of its notebooks")
    ids = [r.run_id for r in runs]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ValueError(f"plan {path}: run ids {dupes} occur twice; give the entries distinct 'id's")
    if jobs > 1:
        _check_shared_data(runs, declared, jobs, path)
    Resources.parse(data.get("cluster"), f"plan {path}: cluster")
    return Plan(name=name, source=path, runs=runs, kernel=str(data.get("kernel") or KERNEL_NAME),
                output_root=Path(data.get("output_root") or "papermill_runs"), timeout_s=timeout, jobs=jobs,
                deadline_s=None if deadline is None else float(deadline),
                description=str(data.get("description") or ""), declared=declared, decides=decides,
                cluster=dict(data.get("cluster") or {}))


def folder_name(value: str, what: str) -> str:
    """`value` when it is one folder name that :mod:`mdc_workbench.runs.runner` may clear: a plan's name (its
    folder under ``output_root``) or a run id (a folder inside the plan's). Not empty, no ``/``, ``\\`` or NUL (so not
    absolute, never ``..`` or ``.``), and not starting with ``.`` or ``_`` (the plan folder's own entries:
    ``.mdc.lock``, ``.threads``, the notebooks' ``_data`` and ``_models`` caches); ValueError naming `what` else."""
    if not re.fullmatch(r"[A-Za-z0-9][^/\\\x00]*", value) or value.strip() != value:
        raise ValueError(f"{what} {value!r} must be one folder name: not empty, no '/', '\\' or NUL, not '.' or "
                         "'..', and starting with a letter or digit (the plan folder's own entries start with "
                         "'.' or '_')")
    return value


def _read_plan_file(path: Path) -> dict[str, Any]:
    """The plan's YAML mapping, its top-level keys checked; one-line errors for a missing or malformed file."""
    if not path.is_file():
        raise FileNotFoundError(f"plan file not found: {path}")
    try:
        data = bounded_yaml(path.read_text())
    except yaml.YAMLError as err:
        raise ValueError(f"plan {path} is not valid YAML: {_yaml_problem(err)}") from None
    except ValueError as err:
        raise ValueError(f"plan {path}: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"plan {path} must be a YAML mapping with a 'notebooks' list")
    _check_keys(data, PLAN_KEYS, f"plan {path}")
    return data


MAX_YAML_NODES = 100_000  # a plan's nodes with every alias expanded (the shipped plans: a few hundred)


def bounded_yaml(text: str, max_nodes: int = MAX_YAML_NODES) -> Any:
    """``yaml.safe_load(text)``, refusing (ValueError) a document whose nodes, with every alias expanded, exceed
    `max_nodes`: an alias bomb (a 1 KB file of nested aliases that expands to billions of items, exhausting
    memory in whatever walks it) is refused before anything is built; a recursive alias or nesting deeper than
    the interpreter's stack is refused too."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        expanded: dict[int, int] = {}  # id(node) -> its expanded size; -1 while being counted (a cycle)

        def size(n: yaml.Node) -> int:
            known = expanded.get(id(n))
            if known == -1:
                raise ValueError("a YAML alias refers to itself (a recursive structure)")
            if known is not None:
                return known
            expanded[id(n)] = -1
            children = [c for pair in n.value for c in pair] if isinstance(n, yaml.MappingNode) else \
                n.value if isinstance(n, yaml.SequenceNode) else []
            total = 1
            for child in children:
                total += size(child)
                if total > max_nodes:
                    raise ValueError(f"the YAML expands to more than {max_nodes} items (aliases of aliases: an "
                                     "alias bomb?); write the plan out without such aliases")
            expanded[id(n)] = total
            return total

        size(node)
        return loader.construct_document(node)
    except RecursionError:
        raise ValueError("the YAML is nested too deeply") from None
    finally:
        loader.dispose()


def _yaml_problem(err: yaml.YAMLError) -> str:
    """PyYAML's several-line message as one line: the problem and where it was found."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or " ".join(str(err).split())
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def _entry_runs(entry: Any, where: str, *, root: Path, plan_dir: Path, base: dict[str, Any],
                top_grid: dict[str, list[Any]], top_seeds: list[int] | None, declared: dict[str, dict[str, Any]],
                used_base: set[str]) -> list[RunSpec]:
    """The runs of one ``notebooks`` entry (its grid x its seeds); records the notebook's declared parameters in
    `declared` and the base parameters it takes in `used_base`."""
    if isinstance(entry, str):
        entry = {"path": entry}
    if not isinstance(entry, dict) or "path" not in entry:
        raise ValueError(f"{where} must be a notebook path or a mapping with 'path'")
    _check_keys(entry, ENTRY_KEYS, where)
    notebook = _find_notebook(str(entry["path"]), root, plan_dir, where)
    params = declared.setdefault(str(notebook), notebook_parameters(notebook))
    for key in RESERVED:
        if key not in params:
            raise ValueError(f"{where}: notebook {notebook} has no '{key}' parameter (the runner sets it)")
    own = _mapping(entry.get("parameters"), f"{where}.parameters")
    grid = {**top_grid, **_grid(entry.get("grid"), f"{where}.grid")}
    shared = {k: v for k, v in base.items() if k in params}
    used_base.update(shared)
    prefix = folder_name(str(entry.get("id") or notebook.stem), f"{where}: id")
    if "members" in entry:
        return _stack_runs(entry, where, notebook, params, {**shared, **own}, grid, top_seeds, prefix)
    seeds = _entry_seeds(entry, top_seeds, params, notebook, where)
    runs = []
    for combo in _combinations(grid):
        for seed in seeds:
            values = {**shared, **own, **combo, **({} if seed is None else {SEED_PARAM: seed})}
            _check_values(values, params, notebook, where)
            run_id = _run_id(prefix, combo) + ("" if seed is None else f"__seed={seed}")
            runs.append(RunSpec(run_id=run_id, notebook=notebook, parameters=values))
    return runs


def _stack_runs(entry: dict[str, Any], where: str, notebook: Path, params: dict[str, Any], values: dict[str, Any],
                grid: dict[str, list[Any]], top_seeds: list[int] | None, prefix: str) -> list[RunSpec]:
    """The runs of an entry with ``members: K``: its seeds (its own or the plan's) in stacks of K, one run per stack
    and grid combination, the notebook's :data:`MEMBERS_PARAM` set to the stack's seeds."""
    if MEMBERS_PARAM not in params:
        raise ValueError(f"{where}: 'members' needs a '{MEMBERS_PARAM}' parameter (the seeds of one stack), which "
                         f"{notebook.name} does not declare")
    if {SEED_PARAM, MEMBERS_PARAM} & {*(entry.get("parameters") or {}), *(entry.get("grid") or {})}:
        raise ValueError(f"{where}: with 'members', set the seeds through 'seeds', not parameters/grid")
    seeds = _seeds(entry.get("seeds"), f"{where}.seeds") or top_seeds
    if not seeds:
        raise ValueError(f"{where}: 'members' trains the entry's seeds in stacks: give 'seeds' (here or in the plan)")
    runs = []
    for combo in _combinations(grid):
        for stack in member_stacks(seeds, entry["members"], where):
            run_values = {**values, **combo, MEMBERS_PARAM: stack}
            _check_values(run_values, params, notebook, where)
            run_id = _run_id(prefix, combo) + "__seeds=" + "-".join(map(str, stack))
            runs.append(RunSpec(run_id=run_id, notebook=notebook, parameters=run_values))
    return runs


def notebook_parameters(notebook: Path) -> dict[str, Any]:
    """The notebook's ``parameters`` cell as papermill reads it: name -> {inferred_type_name, default, help}.
    Exactly one cell must be tagged ``parameters``."""
    import nbformat
    import papermill

    nb = nbformat.read(str(notebook), as_version=4)
    tagged = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(tagged) != 1:
        raise ValueError(f"notebook {notebook} must have exactly one cell tagged 'parameters', found {len(tagged)}")
    if not nb.metadata.get("kernelspec", {}).get("name"):
        raise ValueError(f"notebook {notebook} has no kernelspec in its metadata (papermill reads its parameters "
                         "with it): open it in Jupyter and save it with a kernel, or add metadata.kernelspec")
    found = dict(papermill.inspect_notebook(str(notebook)))
    for spec in found.values():  # an untyped `x = 1`: the type of its default, as the docs promise
        if spec.get("inferred_type_name") in (None, "None"):
            with contextlib.suppress(ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                default = ast.literal_eval(str(spec.get("default")))
                if default is not None:
                    spec["inferred_type_name"] = type(default).__name__
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


def _check_shared_data(runs: list[RunSpec], declared: dict[str, dict[str, Any]], jobs: int, path: Path) -> None:
    """Runs that execute at once must not write one ``data_dir`` with different data parameters: the notebook's
    ``ensure_dataset`` would rewrite the data set while another notebook reads it."""
    def value(run: RunSpec, key: str) -> Any:
        if key in run.parameters:
            return run.parameters[key]
        try:
            return ast.literal_eval(str(declared[str(run.notebook)][key]["default"]))
        except (KeyError, ValueError, SyntaxError):
            return None

    first: dict[str, tuple[RunSpec, dict[str, Any]]] = {}
    for run in runs:
        params_of = declared[str(run.notebook)]
        if "data_dir" not in params_of or value(run, "synthesize") is False:
            continue
        data_dir = str(value(run, "data_dir"))
        params = {key: value(run, key) for key in DATA_PARAMS if key in params_of}
        seen, seen_params = first.setdefault(data_dir, (run, params))
        diff = [f"{k} {seen_params[k]!r} vs {v!r}" for k, v in params.items() if seen_params.get(k, v) != v]
        if diff:
            raise ValueError(f"plan {path}: runs {seen.run_id} and {run.run_id} write the data set {data_dir} with "
                             f"different parameters ({', '.join(diff)}); with jobs: {jobs} one would rewrite it "
                             "while the other reads it: give one its own data_dir")


def _slug(value: Any) -> str:
    text = "-".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return re.sub(r"[^A-Za-z0-9.-]+", "-", text).strip("-") or "x"


def _run_id(prefix: str, combo: dict[str, Any]) -> str:
    return "__".join([prefix, *(f"{k}={_slug(v)}" for k, v in combo.items())])


# ----------------------------------------------------------------------------------------------------------
# the kernel


def ensure_kernel(name: str = KERNEL_NAME, display_name: str = KERNEL_DISPLAY_NAME) -> str:
    """Register this environment's python as Jupyter kernel `name` (``--sys-prefix``) unless a kernel of that
    name exists whose python is present. Returns the kernel name. Two ``mdc runs`` started at once register it one
    after the other (a file lock beside the environment's kernels; ``ipykernel install`` replaces the folder, and
    two at once can leave it half copied), so the second finds the first's."""
    from filelock import FileLock
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    def registered() -> bool:
        try:
            spec = KernelSpecManager().get_kernel_spec(name)
        except NoSuchKernel:
            return False
        return bool(spec.argv) and Path(spec.argv[0]).exists()

    if registered():
        return name
    share = Path(sys.prefix) / "share" / "jupyter"
    share.mkdir(parents=True, exist_ok=True)
    with FileLock(str(share / f".kernel-{name}.lock"), timeout=120):
        if registered():  # the other `mdc runs` registered it while this one waited
            return name
        cmd = [sys.executable, "-m", "ipykernel", "install", "--sys-prefix", "--name", name,
               "--display-name", display_name]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not registered():
            raise RuntimeError(f"could not register the Jupyter kernel {name!r}: {done.stderr.strip()}")
    return name
