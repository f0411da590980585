"""Recompute every verdict and interval from kept data, on a CPU, without a model: from a folder of per-item files
(:mod:`mdc_workbench.eval.items`, the core of "recompute every verdict") or, where only per-seed means were kept,
from a plan summary's per-run metrics (:func:`summary_runs`).

:func:`tables_from_items` rebuilds a run's ``metrics.json`` tables with the functions that build them
(``claim_table``, ``feature_order_table``, :func:`~mdc_workbench.eval.probe_tables.probe_table`);
:func:`recompute` gathers the runs of a folder over seeds (:func:`~mdc_workbench.eval.cells.gather_tables`) and
judges the declared claims (:func:`~mdc_workbench.eval.claims.evaluate_claims`, ``PAPER_CLAIMS`` unless others are
given).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mdc_workbench.eval.cells import gather_tables, table_estimates
from mdc_workbench.eval.claims import Claim, claims_markdown, evaluate_claims
from mdc_workbench.eval.items import (
    CENTRAL_CLAIM,
    FEATURE_ORDER,
    FILE_NAME,
    PROBE_TABLE,
    RunItems,
    conditions,
    member_run_id,
    probe_results,
    read_items,
    signal_rows,
)
from mdc_workbench.eval.paper import PAPER_CLAIMS
from mdc_workbench.eval.probe_tables import probe_table

Run = tuple[str, int | None, dict[str, Any]]  # (run id, training seed, metrics with "tables"): gather_tables' input


def _probe_table(items: RunItems, name: str, recipe: dict[str, Any]) -> dict[str, Any]:
    return probe_table(probe_results(items, name), rows=recipe["rows"], metric=recipe["metric"],
                       tasks=recipe["tasks"], mean_tasks=recipe["mean_tasks"], rename=recipe.get("rename"))


def tables_from_items(items: RunItems) -> dict[str, dict[str, Any]]:
    """The run's tables (``metrics.json`` layout: ``{name: {"metric", "values", "items"}}``) rebuilt from its
    per-item file by the functions that built them."""
    out: dict[str, dict[str, Any]] = {}
    for name, recipe in items.tables.items():
        builder = recipe.get("builder")
        if builder == PROBE_TABLE:
            out[name] = _probe_table(items, name, recipe)
        elif builder == FEATURE_ORDER:
            from mdc_workbench.eval.central_claim import feature_order_table

            out[name] = feature_order_table({c: probe_results(items, name, c) for c in conditions(items, name)})
        elif builder == CENTRAL_CLAIM:
            from mdc_workbench.eval.central_claim import ClaimScores, claim_table, connector_ids

            scored = {kind: {row: ClaimScores(**rec) for row, rec in by_row.items()}
                      for kind, by_row in signal_rows(items).items()}
            out[name] = claim_table(scored, connector_ids())
        else:
            raise ValueError(f"{items.run_id}: table {name!r} has no known builder ({builder!r})")
    return out


def item_runs(folder: str | Path) -> list[Run]:
    """Every per-item file under `folder` (``**/items.npz``, sorted by path) as gather_tables' input."""
    paths = sorted(Path(folder).rglob(FILE_NAME))
    if not paths:
        raise ValueError(f"no {FILE_NAME} under {folder}")
    runs = []
    for p in paths:
        items = read_items(p)
        runs.append((items.run_id, items.seed, {"tables": tables_from_items(items)}))
    return runs


def summary_runs(summary: str | Path | dict[str, Any]) -> list[Run]:
    """The per-seed tables of a plan summary (``summary.json``: each run's flat metrics ``"<table>/<row>/<column>"``
    and its ``train_seed``; a seed stack's run gives each of its ``members`` as the run of its seed, run id
    ``<run>/seed=<seed>``): values only, so intervals are t over seeds and nothing per item can be recomputed."""
    record = json.loads(Path(summary).read_text()) if not isinstance(summary, dict) else summary
    runs: list[Run] = []
    for r in record.get("runs", []):
        if r.get("status", "done") != "done":
            continue
        members = r.get("members")
        if isinstance(members, dict):
            runs += [(member_run_id(r["run_id"], int(seed)), int(seed), {"tables": _flat_tables(metrics)})
                     for seed, metrics in members.items()]
        else:
            runs.append((r["run_id"], (r.get("parameters") or {}).get("train_seed"),
                         {"tables": _flat_tables(r.get("metrics") or {})}))
    return runs


def _flat_tables(metrics: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Tables from flat metrics ``{"<table>/<row>/<column>": value}`` (other keys and non-numbers left out)."""
    tables: dict[str, dict[str, Any]] = {}
    for key, value in metrics.items():
        parts = key.split("/", 2)
        if len(parts) != 3 or not isinstance(value, (int, float)):
            continue
        table, row, col = parts
        tables.setdefault(table, {"metric": "", "values": {}})["values"].setdefault(row, {})[col] = value
    return tables


def recompute(runs: str | Path | Sequence[Run], claims: Sequence[Claim] = PAPER_CLAIMS) -> dict[str, Any]:
    """Every cell's estimate and every claim's verdict from a folder of per-item files (or runs already read):
    ``{"tables": {name: {row: {column: Estimate}}}, "claims": evaluate_claims(...) over the measured tables,
    "cells": {name: {row: {column: Cell}}} (per seed values and items, e.g. for
    :func:`~mdc_workbench.eval.variance.items_budget`), "runs": [run ids]}``."""
    runs = item_runs(runs) if isinstance(runs, (str, Path)) else list(runs)
    gathered = gather_tables(runs)
    return {"tables": {name: table_estimates(t["cells"]) for name, t in gathered.items()},
            "claims": evaluate_claims(gathered, claims, measured_only=True),
            "cells": {name: t["cells"] for name, t in gathered.items()}, "runs": [r[0] for r in runs]}


def recompute_markdown(result: dict[str, Any]) -> str:
    """The recomputed cells (``mean [low, high]``) and verdicts as markdown."""
    lines = [f"Recomputed from {len(result['runs'])} run(s): {', '.join(result['runs'])}", ""]
    for name, rows in result["tables"].items():
        lines.append(f"**{name}**")
        for row, cols in rows.items():
            cells = "; ".join(f"{c or 'value'} {e.format(3)}" for c, e in cols.items())
            lines.append(f"- {row}: {cells}")
        lines.append("")
    return "\n".join(lines + claims_markdown(result["claims"]))


def recompute_json(result: dict[str, Any]) -> dict[str, Any]:
    """The recomputed cells (``{table: {row: {column: {"mean", "low", "high", ...}}}}``) and verdicts as plain JSON."""
    return {"runs": result["runs"], "claims": result["claims"],
            "tables": {name: {row: {col: e.to_dict() for col, e in cols.items()} for row, cols in rows.items()}
                       for name, rows in result["tables"].items()}}


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m mdc_workbench.eval.recompute PATH``: as ``mdc recompute PATH``."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        raise SystemExit("usage: python -m mdc_workbench.eval.recompute FOLDER_OF_ITEMS|SUMMARY_JSON")
    path = Path(args[0])
    print(recompute_markdown(recompute(summary_runs(path) if path.is_file() else path)))


if __name__ == "__main__":
    main()
