"""Per-test-item scores for the paper tables a notebook writes, so that a single training seed still gets a
bootstrap interval (test-set noise only) in its notebook and in the plan summary (``tables[name]["items"]``).

Probe items come from :mod:`mdc_workbench.notebooks.probe_report`; this module holds the compositionality ones.
"""

from __future__ import annotations

from typing import Any

from mdc_workbench.eval.composition_sets import COLUMNS


def compositionality_items(result: dict[str, Any]) -> dict[str, dict[str, list[float]]]:
    """Row label -> Table 2 column -> 100 x correct (0 or 100) per (example, task) of a
    :func:`mdc_workbench.eval.compositionality.compositionality` result.

    Only the (example, task) pairs every scorer scored are kept, in one sorted order, so item i is the same test
    item in every row (a paired bootstrap can compare rows). Columns that average several sub-tasks (SugarCrepe
    add / replace / swap on the real benchmark) get no items: their value is a mean of task accuracies, not of
    items, so a bootstrap over items would be centred elsewhere.
    """
    rows = result["results"]
    per_row = [{(ex["key"], task): ok for ex in r["examples"] for task, ok in ex["correct"].items()} for r in rows]
    shared = sorted(set.intersection(*(set(p) for p in per_row))) if per_row else []
    tasks_of: dict[str, set[str]] = {}
    for _, task in shared:
        tasks_of.setdefault(COLUMNS.get(task, ("", task))[1], set()).add(task)
    out: dict[str, dict[str, list[float]]] = {}
    for r, scored in zip(rows, per_row, strict=True):
        cols: dict[str, list[float]] = {}
        for key, task in shared:
            column = COLUMNS.get(task, ("", task))[1]
            if len(tasks_of[column]) == 1:
                cols.setdefault(column, []).append(100.0 * bool(scored[(key, task)]))
        out[r["label"]] = cols
    return out
