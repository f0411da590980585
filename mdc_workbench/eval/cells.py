"""Measured tables gathered over runs and training seeds, and the sampling distribution of each cell and of each
difference of two cells (torch-free).

A measured table is what the notebooks write into ``metrics.json`` (``tables``: name -> ``{"metric", "values",
"items"}``), merged over the runs of a plan by :func:`gather_tables`. Repeats of one run over training seeds are
gathered per cell into a :class:`Cell` (seed -> value, and optionally seed -> per-test-item scores, whose mean
is the value). :func:`cell_spread` and :func:`difference_spread` give the :class:`~mdc_workbench.eval.stats.Spread`
that intervals and tests are read from (:mod:`mdc_workbench.eval.stats` states the rules).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mdc_workbench.eval.stats import (
    MIN_ITEMS,
    N_BOOT,
    Estimate,
    Spread,
    bootstrap_draws,
    hierarchical_draws,
    t_spread,
    welch_spread,
)


@dataclass
class Cell:
    """One measured number of a table, gathered over repeats: training seed -> value, and per-test-item scores
    (the value's mean over items) where the notebook recorded them."""

    values: dict[int, float] = field(default_factory=dict)
    items: dict[int, list[float]] = field(default_factory=dict)

    def estimate(self) -> Estimate:
        """Mean and 95% interval (:func:`cell_spread`): t over seeds, hierarchical with items, one seed: a
        bootstrap over its test items; no interval for one seed without items."""
        if not self.values:
            raise ValueError("an empty cell has no estimate")
        return cell_spread(self).interval()


def _aligned_items(cells: Sequence[Cell], seeds: Sequence[int]) -> list[np.ndarray] | None:
    """Per seed, the cells' items as one array per cell stacked (cells, n), when every cell has at least
    :data:`MIN_ITEMS` items for every seed and the cells agree on the number per seed; else None."""
    out = []
    for s in seeds:
        lists = [cell.items.get(s) for cell in cells]
        if any(not lst or len(lst) < MIN_ITEMS for lst in lists) or len({len(lst) for lst in lists}) != 1:  # type: ignore[arg-type]
            return None
        out.append(np.asarray(lists, dtype=float))
    return out


def _seed_items_spread(per_seed: list[np.ndarray], seed_values: np.ndarray, what: str, n_boot: int) -> Spread:
    """Spread from per-seed item scores (already combined into one row per seed, e.g. a - b) and per-seed values:
    one seed: a bootstrap over its items; several: the hierarchical bootstrap with the t-interval (union)."""
    n_items = per_seed[0].size
    if len(per_seed) == 1:
        return Spread(float(seed_values[0]), n_items, f"{what}bootstrap over {n_items} test items (test-set noise "
                      "only)", 1, draws=bootstrap_draws(per_seed[0], n_boot))
    t = t_spread(seed_values)
    ragged = len({p.size for p in per_seed}) > 1
    items = "test items (each seed its own)" if ragged else f"{n_items} test items"
    return Spread(float(seed_values.mean()), len(per_seed), f"{what}hierarchical bootstrap over {len(per_seed)} "
                  f"seeds x {items}, with the t-interval over seeds", len(per_seed), t=t.t,
                  draws=hierarchical_draws(per_seed, n_boot))


def cell_spread(cell: Cell, n_boot: int = N_BOOT) -> Spread:
    """The distribution of one cell's mean: t over >= 2 seeds (and the hierarchical bootstrap when every seed has
    items); one seed: a bootstrap over its test items, or no interval without them."""
    seeds = sorted(cell.values)
    if not seeds:
        raise ValueError("an empty cell has no spread")
    values = np.array([cell.values[s] for s in seeds])
    items = [np.asarray(cell.items[s], dtype=float) for s in seeds if len(cell.items.get(s) or []) >= MIN_ITEMS]
    if len(items) == len(seeds):
        return _seed_items_spread(items, values, "", n_boot)
    if len(seeds) >= 2:
        return t_spread(values)
    n = len(cell.items.get(seeds[0]) or [])
    reason = f"only {n} test items: no bootstrap interval (needs {MIN_ITEMS})" if n else "single value"
    return Spread(float(values[0]), max(n, 1), reason, 1)


def difference_spread(a: Cell, b: Cell | float, n_boot: int = N_BOOT) -> Spread | None:
    """The distribution of a - b. Against a constant: a's own, shifted. Two cells with the same >= 2 seeds: paired
    t over the per-seed differences, with the hierarchical bootstrap of the per-item differences where both have
    aligned items (the same test items in every seed); different >= 2 seeds: Welch; one seed each: a paired
    bootstrap over the shared test items. None when none applies (e.g. seeds on one side, a single value on the
    other, or one seed each without aligned items)."""
    if not isinstance(b, Cell):
        return cell_spread(a, n_boot).shifted(float(b))
    sa, sb = sorted(a.values), sorted(b.values)
    if len(sa) >= 2 and len(sb) >= 2 and sa == sb:
        diffs = np.array([a.values[s] - b.values[s] for s in sa])
        aligned = _aligned_items([a, b], sa)
        if aligned is not None:
            return _seed_items_spread([pair[0] - pair[1] for pair in aligned], diffs, "paired ", n_boot)
        t = t_spread(diffs)
        return Spread(t.mean, t.n, f"paired {t.method}", t.seeds, t=t.t)
    if len(sa) >= 2 and len(sb) >= 2:
        return welch_spread([a.values[s] for s in sa], [b.values[s] for s in sb])
    if len(sa) == 1 and len(sb) == 1:
        ia, ib = a.items.get(sa[0]), b.items.get(sb[0])
        if ia and ib and len(ia) == len(ib):
            mean = a.values[sa[0]] - b.values[sb[0]]
            if len(ia) < MIN_ITEMS:
                return Spread(mean, len(ia), f"only {len(ia)} test items: no bootstrap interval (needs {MIN_ITEMS})")
            d = np.asarray(ia, dtype=float) - np.asarray(ib, dtype=float)
            return Spread(mean, d.size, f"paired bootstrap over {d.size} test items (test-set noise only)", 1,
                          draws=bootstrap_draws(d, n_boot))
    return None


def cell_difference(a: Cell, b: Cell | float) -> Estimate | None:
    """95% interval of a - b (:func:`difference_spread`), or None when no interval rule applies."""
    spread = difference_spread(a, b)
    return None if spread is None else spread.interval()


Table = dict[str, dict[str, Cell]]  # row -> column ("" for 1-D tables) -> cell


def gather_tables(runs: Sequence[tuple[str, int | None, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Merge the ``tables`` of several runs' metrics.json: ``[(run id, training seed or None, metrics)]`` ->
    ``{name: {"metric": str, "cells": Table, "runs": [run ids]}}``.

    Runs with distinct seeds that report the same row are repeats: their values go into one cell. A row that
    two runs report with the same seed (or without one) is kept twice, the later one suffixed with its run id,
    unless its values are identical (one measurement reported twice, e.g. the random-init row of runs that
    split one table's methods between them): then it is kept once.
    """
    merged: dict[str, dict[str, Any]] = {}
    for run_id, seed, metrics in runs:
        for name, table in (metrics.get("tables") or {}).items():
            if not isinstance(table, dict) or not isinstance(table.get("values"), dict):
                continue
            slot = merged.setdefault(name, {"metric": table.get("metric", ""), "cells": {}, "owners": {},
                                            "runs": []})
            slot["runs"].append(run_id)
            items = table.get("items") if isinstance(table.get("items"), dict) else {}
            key_seed = 0 if seed is None else seed
            for row, value in table["values"].items():
                owners = slot["owners"].setdefault(row, set())  # seeds that already reported this row
                if row in slot["cells"] and (seed is None or seed in owners):
                    if _same_values(slot["cells"][row], value, key_seed):
                        continue  # the same measurement again (e.g. the random-init row of runs split by method)
                    target = f"{row} ({run_id})"  # not a repeat over seeds: a different run's row
                else:
                    target = row
                    owners.add(seed)
                cols = value if isinstance(value, dict) else {"": value}
                row_items = items.get(row)
                for col, v in cols.items():
                    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(float(v)):
                        continue
                    cell = slot["cells"].setdefault(target, {}).setdefault(col, Cell())
                    cell.values[key_seed] = float(v)
                    col_items = row_items.get(col) if isinstance(row_items, dict) else (
                        row_items if col == "" else None)
                    if isinstance(col_items, list) and col_items:
                        cell.items[key_seed] = [float(x) for x in col_items]
    for slot in merged.values():
        slot.pop("owners")
    return merged


def _same_values(cells: dict[str, Cell], value: Any, seed: int) -> bool:
    """Whether `value` (a number or {column: number}) equals what `cells` already hold for `seed`, column by column."""
    cols = value if isinstance(value, dict) else {"": value}
    return set(cols) == set(cells) and all(seed in cells[c].values and isinstance(v, (int, float))
                                           and math.isclose(cells[c].values[seed], float(v), rel_tol=1e-12,
                                                            abs_tol=1e-12) for c, v in cols.items())


def table_estimates(cells: Table) -> dict[str, dict[str, Estimate]]:
    """row -> column -> :meth:`Cell.estimate` for every cell of a gathered table."""
    return {row: {col: cell.estimate() for col, cell in cols.items()} for row, cols in cells.items()}
