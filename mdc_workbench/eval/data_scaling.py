"""Fig. 5, data scaling: the probe gain of each method at several training-set sizes, over training seeds
(torch-free: numpy, and matplotlib for the figure).

The paper pretrains MDC on 5M, 10M, 20M and 30M image-text pairs and reports that "the more image text pairs used
for pretraining, the better performance on the downstream tasks" (Sec. 4.2 "Dataset size scaling", Fig. 5). Here
the sizes are embedded data sets of ``n_train`` images, one notebook 03 entry per size with its own ``data_dir``
and the same steps (``plans/data_scaling.yaml``). Every run writes its Table 1 (``table1``); this module gathers
those tables by size into one table whose rows are ``"<method> @ <n_train>"``, each cell a
:class:`~mdc_workbench.eval.cells.Cell` over the training seeds (with the per-test-image scores, so that its interval
is the one every other table gets: t over seeds widened by the hierarchical bootstrap; one seed: the bootstrap
over test images), and the difference between the largest and the smallest size per method, paired by seed.

Input: the runs of a plan as ``(run id, notebook parameters, metrics.json)``, the shape
:func:`mdc_workbench.runs.evidence.gather_runs` takes; a run's size is its ``n_train`` parameter and its seed its
``train_seed`` parameter (:data:`SEED_PARAM`, as the plans set it).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mdc_workbench.eval.cells import Cell, difference_spread
from mdc_workbench.eval.stats import Estimate

SEED_PARAM = "train_seed"  # = mdc_workbench.runs.evidence.SEED_PARAM (the parameter a plan's seeds set)
SIZE_PARAM = "n_train"  # the notebook parameter that sets the training-set size
SCALING_SEP = " @ "  # row names: "<method> @ <n_train>"
SOURCE_TABLE = "table1"  # the table each run writes (notebook 03, short captions)
BASELINES = ("random init*", "raw pixels*")  # baseline rows (mdc_workbench.eval.paper.BASELINE_ROWS): no method
COLUMNS = ("gain", "top-1")  # the probe's chance-corrected gain (the figure's) and its mean top-1


def row_name(method: str, n_train: int) -> str:
    return f"{method}{SCALING_SEP}{n_train}"


def _is_baseline(row: str) -> bool:
    return any(fnmatch.fnmatchcase(row, pattern) for pattern in BASELINES)


def data_scaling_table(runs: Sequence[tuple[str, Mapping[str, Any], Mapping[str, Any]]], *,
                       source: str = SOURCE_TABLE, steps: int | None = None,
                       columns: Sequence[str] = COLUMNS) -> dict[str, Any] | None:
    """The data-scaling table of `runs` (``[(run id, parameters, metrics.json)]``), or None when they hold the
    `source` table at fewer than two sizes (nothing to scale).

    Runs count when their parameters give ``n_train`` and their metrics the `source` table; when those runs were
    trained for different ``steps``, `steps` picks one (ValueError naming the step counts otherwise: a size curve
    mixes no budgets). Returns ``{"metric", "sizes": [n_train ascending], "methods": [in first-seen order],
    "cells": {"<method> @ <n>": {column: Cell}}, "runs": [run ids], "steps"}``: the cells layout of
    :func:`mdc_workbench.eval.cells.gather_tables`, so that the summary's interval code reads it as any table.
    ValueError when two runs report one method at one size with one seed (a plan that repeats a run must give
    it another seed)."""
    chosen = [(rid, params, metrics) for rid, params, metrics in runs
              if params.get(SIZE_PARAM) is not None and isinstance((metrics.get("tables") or {}).get(source), dict)]
    step_counts = sorted({params.get("steps") for _, params, _ in chosen}, key=lambda x: (x is None, x or 0))
    if steps is not None:
        chosen = [r for r in chosen if r[1].get("steps") == steps]
    elif len(step_counts) > 1:
        raise ValueError(f"the {source} runs were trained for {', '.join(map(str, step_counts))} steps: pass steps= "
                         "to pick one budget")
    sizes = sorted({int(params[SIZE_PARAM]) for _, params, _ in chosen})
    if len(sizes) < 2:
        return None
    cells: dict[str, dict[str, Cell]] = {}
    owners: dict[tuple[str, str, int], str] = {}  # (row, column, seed) -> the run that reported it
    methods: list[str] = []
    metric = ""
    for rid, params, metrics in chosen:
        table = metrics["tables"][source]
        metric = metric or table.get("metric", "")
        n, seed = int(params[SIZE_PARAM]), int(params.get(SEED_PARAM) or 0)
        items = table.get("items") if isinstance(table.get("items"), dict) else {}
        for method, value in table.get("values", {}).items():
            if _is_baseline(method) or not isinstance(value, dict):
                continue
            for col in columns:
                if not isinstance(value.get(col), (int, float)):
                    continue
                key = (row_name(method, n), col, seed)
                if key in owners:
                    raise ValueError(f"runs {owners[key]} and {rid} both report {method} at {n} images with seed "
                                     f"{seed}; give repeats distinct seeds")
                owners[key] = rid
                cell = cells.setdefault(row_name(method, n), {}).setdefault(col, Cell())
                cell.values[seed] = float(value[col])
                col_items = (items.get(method) or {}).get(col) if isinstance(items.get(method), dict) else None
                if isinstance(col_items, list) and col_items:
                    cell.items[seed] = [float(x) for x in col_items]
                if method not in methods:
                    methods.append(method)
    return {"metric": f"{metric}; by training-set size (embedded images), same steps", "sizes": sizes,
            "methods": methods, "cells": cells, "runs": [rid for rid, _, _ in chosen],
            "steps": steps if steps is not None else (step_counts[0] if step_counts else None)}


def scaling_estimates(table: Mapping[str, Any], column: str = "gain") -> dict[str, dict[int, Estimate]]:
    """method -> size -> mean with its 95% interval (:meth:`Cell.estimate`) in `column`; sizes a method lacks
    are left out."""
    out: dict[str, dict[int, Estimate]] = {}
    for method in table["methods"]:
        for n in table["sizes"]:
            cell = table["cells"].get(row_name(method, n), {}).get(column)
            if cell is not None and cell.values:
                out.setdefault(method, {})[n] = cell.estimate()
    return out


def scaling_differences(table: Mapping[str, Any], column: str = "gain") -> dict[str, Estimate | None]:
    """Per method: the largest size minus the smallest it was measured at, in `column` (the paper's claim: more
    pairs, better features), with the 95% interval of :func:`mdc_workbench.eval.cells.difference_spread` (paired by
    seed; None where no interval rule applies, e.g. one seed without per-item scores)."""
    out: dict[str, Estimate | None] = {}
    for method in table["methods"]:
        measured = [n for n in table["sizes"] if column in table["cells"].get(row_name(method, n), {})]
        if len(measured) < 2:
            continue
        big, small = (table["cells"][row_name(method, n)][column] for n in (measured[-1], measured[0]))
        spread = difference_spread(big, small)
        out[method] = None if spread is None else spread.interval()
    return out


def data_scaling_markdown(table: Mapping[str, Any], column: str = "gain", digits: int = 1) -> str:
    """A markdown table: one row per method, one column per size (``mean [low, high]``, the seeds behind it),
    then the largest-minus-smallest difference per method."""
    est, diffs = scaling_estimates(table, column), scaling_differences(table, column)
    sizes = table["sizes"]
    lines = [f"| method ({column}) | " + " | ".join(f"{n} images" for n in sizes) +
             f" | {sizes[-1]} - {sizes[0]} |", "|---|" + "---|" * (len(sizes) + 1)]
    for method in table["methods"]:
        cells = [est.get(method, {}).get(n) for n in sizes]
        text = [f"{e.format(digits)} ({_seeds(table, method, n, column)})" if e is not None else "–"
                for e, n in zip(cells, sizes, strict=True)]
        diff = diffs.get(method)
        text.append(diff.format(digits) if diff is not None else "–")
        lines.append(f"| {method} | " + " | ".join(text) + " |")
    return "\n".join(lines)


def _seeds(table: Mapping[str, Any], method: str, n: int, column: str) -> str:
    k = len(table["cells"][row_name(method, n)][column].values)
    return f"{k} seed{'s' if k != 1 else ''}"


def plot_data_scaling(table: Mapping[str, Any], path: str | Path, column: str = "gain", title: str = "") -> Path:
    """Training-set size on x (log scale), the probe's `column` on y: one line per method with its 95% intervals
    as error bars (the figure of Fig. 5, which plots MDC's ImageNet top-1 against 5M-30M pairs)."""
    import matplotlib.pyplot as plt

    from mdc_workbench.eval.figures import save_png

    est = scaling_estimates(table, column)
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for method, points in est.items():
        sizes = sorted(points)
        means = [points[n].mean for n in sizes]
        low = [points[n].mean - points[n].low if points[n].has_interval else 0.0 for n in sizes]
        high = [points[n].high - points[n].mean if points[n].has_interval else 0.0 for n in sizes]
        ax.errorbar(sizes, means, yerr=[low, high], marker="o", capsize=3, label=method)
    ax.set_xscale("log")
    ax.set_xticks(table["sizes"])
    ax.set_xticklabels([f"{n:,}" for n in table["sizes"]])
    ax.minorticks_off()
    ax.set_xlabel(f"training images (embedded data; {table.get('steps') or 'same'} steps each)")
    ax.set_ylabel("probe gain over random init (points)" if column == "gain" else f"probe {column}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9)
    ax.set_title(title or "Fig. 5: probe vs training-set size (95% intervals)", fontsize=10)
    return save_png(fig, path)
