"""The evidence part of a plan's summary: every table cell as a mean with its 95% interval, and a verdict per
paper claim (:mod:`mdc_core.eval.stats`, :mod:`mdc_core.eval.claims`).

Runs that repeat one notebook over training seeds (a plan's ``seeds``; the seed is the run's
:data:`SEED_PARAM` parameter) are gathered cell by cell: with two or more seeds a cell's interval is the
t-interval over seeds; with one seed it is a bootstrap over the test items the notebook recorded (the
table's ``items``), which captures test-set noise only; without items it has none. Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mdc_core.eval.claims import claims_markdown, evaluate_claims, gather_tables, table_estimates
from mdc_core.eval.stats import Estimate

SEED_PARAM = "train_seed"  # the notebook parameter a plan's `seeds` sets (mdc_core.workbench.plans)


def gather_runs(runs: Sequence[tuple[str, dict[str, Any], dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """``[(run id, parameters, metrics.json)]`` -> :func:`~mdc_core.eval.claims.gather_tables` output."""
    return gather_tables([(rid, params.get(SEED_PARAM), metrics) for rid, params, metrics in runs if metrics])


def _cell_text(est: Estimate) -> str:
    digits = 3 if abs(est.mean) < 1 and (not est.has_interval or abs(est.high) < 1) else 1
    return est.format(digits)


def display_tables(gathered: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Tables in :func:`mdc_core.workbench.summary.table_markdown`'s layout, each cell the text ``mean [low, high]``;
    ``means`` and ``intervals`` ((low, high) or None per cell) alongside, for figures."""
    out: dict[str, dict[str, Any]] = {}
    for name, table in gathered.items():
        est = table_estimates(table["cells"])
        values: dict[str, Any] = {}
        means: dict[str, Any] = {}
        intervals: dict[str, Any] = {}
        for row, cols in est.items():
            if set(cols) == {""}:
                e = cols[""]
                values[row], means[row] = _cell_text(e), e.mean
                intervals[row] = (e.low, e.high) if e.has_interval else None
            else:
                values[row] = {c: _cell_text(e) for c, e in cols.items()}
                means[row] = {c: e.mean for c, e in cols.items()}
                intervals[row] = {c: (e.low, e.high) if e.has_interval else None for c, e in cols.items()}
        out[name] = {"metric": table["metric"], "values": values, "means": means, "intervals": intervals}
    return out


def interval_note(gathered: dict[str, dict[str, Any]]) -> str:
    """One sentence saying what the intervals are: over how many seeds, or test-set bootstrap for one seed."""
    seeds = sorted({len(c.values) for t in gathered.values() for cols in t["cells"].values() for c in cols.values()})
    if not seeds:
        return "No table was measured."
    if seeds == [1]:
        return ("**One training seed per model**: the brackets are 95% bootstrap intervals over the test items "
                "(test-set noise only, not training noise); cells without per-item scores have none. Repeat the "
                "plan over seeds (`seeds: [0, 1, 2]`) for intervals that include training noise.")
    counts = ", ".join(str(n) for n in seeds)
    return (f"Brackets: 95% t-intervals over training seeds (seeds per cell: {counts}); a cell with one seed uses a "
            "bootstrap over test items (test-set noise only). Differences are paired by seed.")


def evidence_markdown(gathered: dict[str, dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """The summary's verdict section (markdown lines) and the claims' JSON-ready verdicts."""
    verdicts = evaluate_claims(gathered)
    lines = ["## Verdicts on the paper's claims", "",
             "Each claim is an ordering; its verdict reads the 95% interval of the difference: **holds** (above 0 "
             "in the paper's direction), **reversed** (below 0), **not resolved** (contains 0: the interval does "
             "not support either order at this size). For `>=` claims an unresolved interval is consistent with the "
             "claim but does not support it. See docs/evidence.md.", ""]
    if not verdicts:
        return lines + ["No paper table was measured by this plan.", ""], verdicts
    return lines + claims_markdown(verdicts) + [""], verdicts
