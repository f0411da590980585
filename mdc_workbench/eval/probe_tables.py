"""A probe table from probe results (torch-free): per row its mean top-1 over the averaged tasks, its gain over the
random-init row of its feature kind, and the per-test-image scores behind both, in the ``metrics.json`` layout the
summaries gather (``{"metric", "values", "items"}``). The recompute core (:mod:`mdc_workbench.eval.recompute`)
rebuilds Table 1 with it from per-item files; ``tests/workbench/test_items.py`` checks that it gives the probe
report's tables
(:mod:`mdc_workbench.notebooks.probe_report`, which computes the same for the notebooks) to the digit.

A result is what :func:`~mdc_workbench.eval.probe_data.probe_run` returns, as far as the table needs it:
``{"pool", "init", "tasks": {task: {"top1", "test_correct"}}}``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def probe_scores(result: Mapping[str, Any], tasks: Sequence[str], mean_tasks: Sequence[str]) -> dict[str, float]:
    """Top-1 % per task (`tasks`, then any of `mean_tasks` not among them), plus ``mean`` over `mean_tasks`."""
    missing = [t for t in [*tasks, *mean_tasks] if t not in result["tasks"]]
    if missing:
        raise ValueError(f"tasks {missing} were not probed; probed: {', '.join(result['tasks'])}")
    per_task = {t: 100.0 * result["tasks"][t]["top1"] for t in dict.fromkeys([*tasks, *mean_tasks])}
    return {**per_task, "mean": sum(100.0 * result["tasks"][t]["top1"] for t in mean_tasks) / len(mean_tasks)}


def probe_items(result: Mapping[str, Any], mean_tasks: Sequence[str]) -> list[float]:
    """Per test image: 100 x the fraction of `mean_tasks` it is classified right on."""
    columns = [result["tasks"][t]["test_correct"] for t in mean_tasks]
    if len({len(c) for c in columns}) != 1:
        raise ValueError("the tasks were scored on different test sets; per-item scores need the same images")
    return [100.0 * sum(vals) / len(vals) for vals in zip(*columns, strict=True)]


def probe_gains(results: Mapping[str, Mapping[str, Any]], scores: Mapping[str, Mapping[str, float]],
                mean_tasks: Sequence[str]) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, list[float]]]]:
    """Each row's gain over the random-init row (``init == "random"``) of its feature kind (``pool``): per task and
    ``mean`` over `mean_tasks`, with per-image items (the row's score minus the random row's on the same image).
    Rows without a random row of their kind (raw pixels) get none."""
    random_of = {r["pool"]: name for name, r in results.items() if r.get("init") == "random"}
    gains: dict[str, dict[str, float]] = {}
    items: dict[str, dict[str, list[float]]] = {}
    for name, result in results.items():
        base = random_of.get(result["pool"]) if result.get("init", "trained") != "pixels" else None
        if base is None:
            continue
        per_task = {t: scores[name][t] - scores[base][t] for t in scores[name] if t != "mean"}
        gains[name] = {**per_task, "mean": sum(per_task[t] for t in mean_tasks) / len(mean_tasks)}
        mine, theirs = probe_items(result, mean_tasks), probe_items(results[base], mean_tasks)
        items[name] = {"mean": [a - b for a, b in zip(mine, theirs, strict=True)]}
        for t in per_task:
            a, b = result["tasks"][t]["test_correct"], results[base]["tasks"][t]["test_correct"]
            items[name][t] = [100.0 * (x - y) for x, y in zip(a, b, strict=True)]
    return gains, items


def probe_table(results: Mapping[str, Mapping[str, Any]], *, rows: Sequence[str], metric: str,
                tasks: Sequence[str], mean_tasks: Sequence[str], rename: Mapping[str, str] | None = None
                ) -> dict[str, Any]:
    """The table: each of `rows` (renamed by `rename`) with ``top-1`` (mean over `mean_tasks`), ``gain`` and
    ``gain TASK`` per task where it has a random-init row of its kind, each with its per-test-image items."""
    scores = {k: probe_scores(r, tasks, mean_tasks) for k, r in results.items()}
    gains, gain_items = probe_gains(results, scores, mean_tasks)
    rename = rename or {}
    values: dict[str, dict[str, float]] = {}
    items: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        name = rename.get(r, r)
        values[name] = {"top-1": scores[r]["mean"]}
        items[name] = {"top-1": probe_items(results[r], mean_tasks)}
        if r in gains:
            per_task = [t for t in gains[r] if t != "mean"]
            values[name]["gain"] = gains[r]["mean"]
            items[name]["gain"] = gain_items[r]["mean"]
            values[name].update({f"gain {t}": gains[r][t] for t in per_task})
            items[name].update({f"gain {t}": gain_items[r][t] for t in per_task})
    return {"metric": metric, "values": values, "items": items}
