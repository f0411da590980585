"""Per-item results kept beside a run's metrics: one compact columnar file, ``items.npz`` (numpy only, no pickle), from
which every table the run reported, and so every verdict and interval, can be rebuilt (:mod:`mdc_workbench.eval.
recompute`) or analysed another way. docs/evidence.md, "Per-item results", gives the schema for readers.

**Schema** (version :data:`SCHEMA_VERSION`; every column one array, all arrays of a record kind equally long):

* ``probe.*``, one row per (table, condition, model row, task, test image, probe fit): ``table`` (the metrics table
  it feeds, e.g. ``table1``, ``feature_order``), ``condition`` (``""``, or the caption order of a
  ``feature_order`` pair), ``row`` (the probed model's key: ``ARC``, ``MDC``, ``random init``), ``task``,
  ``image`` (test image index, the same image in every row and seed), ``label`` and ``pred`` (the true label and
  the probe's top-1 prediction, as label values), ``fit`` (probe refit index; 0 for the one fit).
* ``signal.*``, one row per (caption kind, model row, caption, position): ``kind`` (``short`` / ``clauses``),
  ``row``, ``caption`` (index in data order), ``group`` (``all``, ``predictable`` / ``unpredictable``),
  ``position`` (0..length-1 over the caption tokens, no ``<sot>``/``<eot>``), ``length``, ``token`` (BPE id),
  ``gradient`` and ``pmi`` (the central claim's two measures; NaN where the position was not scored).
* ``meta``: one JSON string: ``{"schema", "run_id", "seed", "tables": {table name: how to rebuild it}}``: a probe
  table's ``metric``, ``tasks``, ``mean_tasks``, ``rows``, ``rename`` and each probed key's ``pool`` and ``init``;
  the central claim's per-row scoring mode.

Writers take what the notebook already holds (:func:`add_probe_table` a ``probe_models`` result,
:func:`add_feature_order` the per-order probe results, :func:`add_central_claim` the scored captions); none changes
a number. :func:`write_items` / :func:`read_items` check the schema and say what is wrong in one line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

SCHEMA_VERSION = 1
FILE_NAME = "items.npz"
PROBE_COLUMNS = {"table": "U", "condition": "U", "row": "U", "task": "U", "image": "i4", "label": "i8", "pred": "i8",
                 "fit": "i2"}
SIGNAL_COLUMNS = {"kind": "U", "row": "U", "caption": "i4", "group": "U", "position": "i2", "length": "i2",
                  "token": "i4", "gradient": "f8", "pmi": "f8"}
PROBE_TABLE, FEATURE_ORDER, CENTRAL_CLAIM = "probe_table", "feature_order", "claim_table"  # how a table is rebuilt


@dataclass
class RunItems:
    """One run's per-item results: the two record kinds as column lists (appended to) and the tables' recipes."""

    run_id: str
    seed: int | None
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    probe: dict[str, list[Any]] = field(default_factory=lambda: {k: [] for k in PROBE_COLUMNS})
    signal: dict[str, list[Any]] = field(default_factory=lambda: {k: [] for k in SIGNAL_COLUMNS})

    def column(self, kind: str, name: str) -> np.ndarray:
        """One column as a numpy array (``kind``: ``probe`` or ``signal``)."""
        dtypes = PROBE_COLUMNS if kind == "probe" else SIGNAL_COLUMNS
        return _array(getattr(self, kind)[name], dtypes[name])


def _array(values: Sequence[Any], dtype: str) -> np.ndarray:
    if dtype == "U":
        return np.array([str(v) for v in values], dtype=str) if len(values) else np.zeros(0, dtype="U1")
    return np.asarray(values, dtype=dtype)


def _probe_rows(items: RunItems, table: str, condition: str, results: Mapping[str, Mapping[str, Any]],
                tasks: Sequence[str], fit: int) -> None:
    for key, result in results.items():
        for task in tasks:
            r = result["tasks"].get(task)
            if r is None:
                raise ValueError(f"{key}: task {task!r} was not probed")
            labels, preds = r.get("test_label"), r.get("test_pred")
            if not labels or not preds or len(labels) != len(preds):
                raise ValueError(f"{key} / {task}: the probe result has no per-image labels and predictions "
                                 "(test_label, test_pred; probes before 2026-12-02 kept only test_correct)")
            n = len(labels)
            for col, vals in (("table", [table] * n), ("condition", [condition] * n), ("row", [key] * n),
                              ("task", [task] * n), ("image", range(n)), ("label", labels), ("pred", preds),
                              ("fit", [fit] * n)):
                items.probe[col].extend(vals)


def add_probe_table(items: RunItems, table: str, probe: Mapping[str, Any], *, metric: str, rows: Sequence[str],
                    tasks: Sequence[str], mean_tasks: Sequence[str], rename: Mapping[str, str] | None = None,
                    fit: int = 0) -> RunItems:
    """Record a probe table as :func:`mdc_workbench.notebooks.probe_report.probe_table` builds it from a
    ``probe_models`` result (`probe`, with its ``results``): every probed key (baselines included: the gains need
    them) on `tasks` and `mean_tasks`, and the recipe (metric, rows, rename, each key's pool and init)."""
    results = probe["results"]
    needed = list(dict.fromkeys([*tasks, *mean_tasks]))
    _probe_rows(items, table, "", results, needed, fit)
    items.tables[table] = {"builder": PROBE_TABLE, "metric": metric, "rows": list(rows), "rename": dict(rename or {}),
                           "tasks": list(tasks), "mean_tasks": list(mean_tasks),
                           "results": {k: {"pool": r.get("pool", ""), "init": r.get("init", "trained")}
                                       for k, r in results.items()}}
    return items


def add_feature_order(items: RunItems, orders: Mapping[str, Mapping[str, Mapping[str, Any]]],
                      tasks: Sequence[str] = ("shape", "colour"), fit: int = 0) -> RunItems:
    """Record the ``feature_order`` table's probes: ``orders[caption order][row]`` a probe result (as
    :func:`mdc_workbench.eval.central_claim.feature_order_table` takes them)."""
    for order, results in orders.items():
        _probe_rows(items, FEATURE_ORDER, order, results, tasks, fit)
    items.tables[FEATURE_ORDER] = {"builder": FEATURE_ORDER, "tasks": list(tasks)}
    return items


def add_central_claim(items: RunItems, scored: Mapping[str, Mapping[str, Any]], table: str = "central_claim"
                      ) -> RunItems:
    """Record the central claim's per-position signal: ``scored[kind][row]`` a
    :class:`~mdc_workbench.eval.central_claim.ClaimScores` (what ``claim_table`` takes)."""
    modes: dict[str, dict[str, str]] = {}
    for kind, by_row in scored.items():
        for row, s in by_row.items():
            modes.setdefault(kind, {})[row] = s.mode
            for c, (group, ids, grads, pmis) in enumerate(zip(s.groups, s.tokens, s.gradient, s.pmi, strict=True)):
                n = len(ids)
                if len(grads) != n or len(pmis) != n:
                    raise ValueError(f"{kind} / {row} caption {c}: {n} tokens but {len(grads)} gradient and "
                                     f"{len(pmis)} PMI values")
                for col, vals in (("kind", [kind] * n), ("row", [row] * n), ("caption", [c] * n),
                                  ("group", [group] * n), ("position", range(n)), ("length", [n] * n),
                                  ("token", ids), ("gradient", [math.nan if v is None else v for v in grads]),
                                  ("pmi", [math.nan if v is None else v for v in pmis])):
                    items.signal[col].extend(vals)
    items.tables[table] = {"builder": CENTRAL_CLAIM, "modes": modes}
    return items


def write_items(items: RunItems, path: str | Path) -> Path:
    """Write `items` as a compressed ``.npz`` (numpy arrays and one JSON ``meta`` string; no pickle)."""
    arrays: dict[str, np.ndarray] = {}
    for kind, dtypes in (("probe", PROBE_COLUMNS), ("signal", SIGNAL_COLUMNS)):
        cols = {name: items.column(kind, name) for name in dtypes}
        if len({len(v) for v in cols.values()}) != 1:
            raise ValueError(f"{kind} columns have different lengths: {({k: len(v) for k, v in cols.items()})}")
        arrays.update({f"{kind}.{name}": v for name, v in cols.items()})
    meta = {"schema": SCHEMA_VERSION, "run_id": items.run_id, "seed": items.seed, "tables": items.tables}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as fh:  # a file object: np.savez would append ".npz" to another name
        np.savez_compressed(fh, meta=np.array(json.dumps(meta)), **arrays)
    return path


def read_items(path: str | Path) -> RunItems:
    """Read a file written by :func:`write_items`; ValueError naming the problem when it is not one (other schema,
    missing or ragged columns, no meta)."""
    path = Path(path)
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: not a per-item file ({err})") from None
    with data:
        if "meta" not in data.files:
            raise ValueError(f"{path}: no meta record (not written by write_items)")
        meta = json.loads(str(data["meta"]))
        if meta.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"{path}: schema {meta.get('schema')!r}, this reader knows {SCHEMA_VERSION}")
        items = RunItems(str(meta.get("run_id", path.parent.name)), meta.get("seed"), meta.get("tables", {}))
        for kind, dtypes in (("probe", PROBE_COLUMNS), ("signal", SIGNAL_COLUMNS)):
            missing = [n for n in dtypes if f"{kind}.{n}" not in data.files]
            if missing:
                raise ValueError(f"{path}: missing column(s) {', '.join(f'{kind}.{m}' for m in missing)}")
            cols = {n: data[f"{kind}.{n}"] for n in dtypes}
            if len({len(v) for v in cols.values()}) != 1:
                raise ValueError(f"{path}: the {kind} columns have different lengths")
            setattr(items, kind, {n: v.tolist() for n, v in cols.items()})
    return items


def probe_results(items: RunItems, table: str, condition: str = "", fit: int = 0) -> dict[str, dict[str, Any]]:
    """The probe results of one table (and condition, fit) as ``probe_run`` returns them, as far as the tables
    need: per key ``{"pool", "init", "tasks": {task: {"top1", "test_correct", "test_label", "test_pred"}}}``
    (``top1`` is the share of ``label == pred``)."""
    cols = {k: items.column("probe", k) for k in PROBE_COLUMNS}
    pick = (cols["table"] == table) & (cols["condition"] == condition) & (cols["fit"] == fit)
    recipe = items.tables.get(table, {}).get("results", {})
    out: dict[str, dict[str, Any]] = {}
    for key in dict.fromkeys(cols["row"][pick].tolist()):
        info = recipe.get(key, {})
        tasks: dict[str, dict[str, Any]] = {}
        for task in dict.fromkeys(cols["task"][pick & (cols["row"] == key)].tolist()):
            sel = pick & (cols["row"] == key) & (cols["task"] == task)
            order = np.argsort(cols["image"][sel], kind="stable")
            label, pred = cols["label"][sel][order], cols["pred"][sel][order]
            correct = (label == pred).astype(int)
            tasks[task] = {"top1": float(correct.mean()), "test_correct": correct.tolist(),
                           "test_label": label.tolist(), "test_pred": pred.tolist()}
        out[key] = {"pool": info.get("pool", ""), "init": info.get("init", "trained"), "tasks": tasks}
    return out


def conditions(items: RunItems, table: str) -> list[str]:
    """The conditions (caption orders) recorded for `table`, in file order."""
    cols = items.column("probe", "table"), items.column("probe", "condition")
    return list(dict.fromkeys(cols[1][cols[0] == table].tolist()))


def signal_rows(items: RunItems) -> dict[str, dict[str, dict[str, Any]]]:
    """The central claim's scored captions as plain lists: ``{kind: {row: {"mode", "groups", "tokens", "gradient",
    "pmi"}}}`` (values per position, None where not scored), the fields of ``ClaimScores``."""
    cols = {k: items.column("signal", k) for k in SIGNAL_COLUMNS}
    modes = next((t.get("modes", {}) for t in items.tables.values() if t.get("builder") == CENTRAL_CLAIM), {})
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for kind in dict.fromkeys(cols["kind"].tolist()):
        for row in dict.fromkeys(cols["row"][cols["kind"] == kind].tolist()):
            sel = (cols["kind"] == kind) & (cols["row"] == row)
            rec: dict[str, Any] = {"mode": modes.get(kind, {}).get(row, ""), "groups": [], "tokens": [],
                                   "gradient": [], "pmi": []}
            captions = cols["caption"][sel]
            for c in dict.fromkeys(captions.tolist()):
                one = np.flatnonzero(sel)[captions == c]
                one = one[np.argsort(cols["position"][one], kind="stable")]
                rec["groups"].append(str(cols["group"][one[0]]))
                rec["tokens"].append(cols["token"][one].tolist())
                for m in ("gradient", "pmi"):
                    rec[m].append([None if math.isnan(v) else float(v) for v in cols[m][one].tolist()])
            out.setdefault(kind, {})[row] = rec
    return out


def member_run_id(run_id: str, seed: int) -> str:
    """The run id of member `seed` of the seed stack run `run_id` (``<run>/seed=<seed>``): its per-item file's, and
    its run's in a plan summary (:func:`mdc_workbench.runs.members.expand_members`)."""
    return f"{run_id}/seed={seed}"


def write_run_items(folder: str | Path, seed: int | None, *, probe: Mapping[str, Any] | None = None,
                    probe_table_name: str = "table1", metric: str = "", rows: Sequence[str] = (),
                    tasks: Sequence[str] = (), mean_tasks: Sequence[str] = (),
                    orders: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
                    scored: Mapping[str, Mapping[str, Any]] | None = None, run_id: str = "") -> Path | None:
    """What notebook 03 calls after writing its metrics: the run's per-item file ``<folder>/items.npz`` (the run id
    is `run_id`, by default the folder's name, as ``mdc runs`` names run folders) from what it measured: the probe
    table (`probe`, a ``probe_models`` result, as `probe_table_name` with `rows`), the feature-order probes
    (`orders`) and the central claim's scored captions (`scored`). None (nothing written) when it measured none of
    them."""
    folder = Path(folder)
    items = RunItems(run_id or folder.name, seed)
    if probe:
        add_probe_table(items, probe_table_name, probe, metric=metric, rows=rows, tasks=tasks, mean_tasks=mean_tasks)
    if orders:
        add_feature_order(items, orders)
    if scored:
        add_central_claim(items, scored)
    return write_items(items, folder / FILE_NAME) if items.tables else None
