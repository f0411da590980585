"""The paper's ordering claims as data, and their verdicts on measured tables (torch-free).

A measured table is what the notebooks write into ``metrics.json`` (``tables``: name -> ``{"metric", "values",
"items"}``), merged over the runs of a plan. Repeats of one run over training seeds are gathered per cell into
a :class:`Cell` (seed -> value, and optionally seed -> per-test-item scores); :meth:`Cell.estimate` gives the
mean and 95% interval (:mod:`mdc_core.eval.stats`), :func:`cell_difference` the interval of a difference, and
:func:`evaluate_claims` one verdict per claim of :data:`PAPER_CLAIMS`.

A claim is a list of pairwise orderings ``better <relation> worse`` between rows of one table (in each listed
column for two-dimensional tables). A row pattern is a row name, ``*`` (every model row other than the other
side's; the baseline rows ``random init ...``, ``raw pixels`` and ``..., blind`` are not models), or a shell
pattern such as ``BERT*``. The claim's verdict combines its parts with
:func:`~mdc_core.eval.stats.combine_verdicts`: reversed if any part is reversed, holds only if every part holds.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mdc_core.eval.stats import (
    UNMEASURED,
    Estimate,
    bootstrap_difference,
    bootstrap_interval,
    combine_verdicts,
    describe_verdict,
    seed_difference,
    t_interval,
    verdict,
)


@dataclass(frozen=True)
class Claim:
    """One ordering the paper claims, stated on the workbench's table names and row labels."""

    key: str  # short id, e.g. "table5_best"
    source: str  # where the paper makes it: "Table 5"
    text: str  # the claim as a reader says it
    table: str  # the metrics.json table it is checked on
    parts: tuple[tuple[str, str, str], ...]  # (better row pattern, ">" or ">=", worse row pattern)
    columns: tuple[str, ...] = ()  # columns checked in a 2-D table (each part in each column); () for 1-D tables


BASELINE_ROWS = ("random init*", "raw pixels*", "*, blind")  # baselines, not models (never matched by "*")

PAPER_CLAIMS: tuple[Claim, ...] = (
    Claim("table1", "Table 1", "linear probe: CLIP > MDC >= ARC", "table1",
          (("CLIP", ">", "MDC"), ("MDC", ">=", "ARC"))),
    Claim("table1_training", "workbench check", "training adds to the features of Table 1's models: every model's "
          "probe > the randomly initialised encoder's", "table1", (("*", ">", "random init*"),)),
    Claim("table4", "Table 4", "the 1/t weight helps: MDC > MDC without 1/t", "table4",
          (("MDC", ">", "MDC (w/o 1/t)"),)),
    Claim("table5_best", "Table 5", "short captions: schedule [0.5, 1] beats every other schedule", "table5",
          (("[0.5, 1.0]", ">", "*"),)),
    Claim("table5_worst", "Table 5", "short captions: schedule [0, 1] is worst", "table5",
          (("*", ">", "[0.0, 1.0]"),)),
    Claim("fig4", "Fig. 4", "MDC >= every fixed BERT masking ratio (and the parallel objective)", "fig4",
          (("MDC", ">=", "BERT*"), ("MDC", ">=", "Parallel*"))),
    Claim("table2", "Table 2", "MDC (heuristic) > ARC and CLIP on relation, attribute and swap", "table2",
          (("MDC (Heuristic)", ">", "ARC"), ("MDC (Heuristic)", ">", "CLIP")), ("relation", "attribute", "swap")),
    Claim("table3", "Table 3", "captioning: MDC-10 > ARC on CIDEr", "table3", (("MDC-10", ">", "ARC"),),
          ("CIDEr",)),
    Claim("position", "Sec. 3 (central claim)", "ARC's visual signal falls along the caption while MDC's does not "
          "(checked as: MDC's late-minus-early signal > ARC's)", "position_signal", (("MDC", ">", "ARC"),)),
    Claim("position_repeat", "Sec. 3 (central claim, same word)", "a word the caption names again: ARC needs the "
          "image less at the repeat than at the first mention, MDC does not (checked as: MDC's repeat-minus-first "
          "signal > ARC's)", "position_repeat", (("MDC", ">", "ARC"),)),
    *(Claim(f"{table}_training", "workbench check", f"training adds to the features of {what}: every model's "
            "probe > the randomly initialised encoder's", table, (("*", ">", "random init*"),))
      for table, what in (("table4", "Table 4's models"), ("table5", "Table 5's models"),
                          ("fig4", "Fig. 4's models"))),
)


@dataclass
class Cell:
    """One measured number of a table, gathered over repeats: training seed -> value, and per-test-item scores
    (the value's mean over items) where the notebook recorded them."""

    values: dict[int, float] = field(default_factory=dict)
    items: dict[int, list[float]] = field(default_factory=dict)

    def estimate(self) -> Estimate:
        """t-interval over seeds (>= 2 seeds); one seed: bootstrap over its test items, else no interval.

        Identical values on every seed (accuracies on a small test set are coarse, so this happens) give a
        zero-width t-interval that means nothing: then the interval is a bootstrap over the test items of all
        seeds pooled (test-set noise only), or none without items."""
        seeds = sorted(self.values)
        if not seeds:
            raise ValueError("an empty cell has no estimate")
        if len(seeds) >= 2:
            est = t_interval([self.values[s] for s in seeds])
            if est.low < est.high:
                return est
            pooled = _pooled_items([self], seeds)
            if pooled is None:
                return Estimate(est.mean, math.nan, math.nan, est.n, f"no spread over {est.n} seeds: no interval")
            boot = bootstrap_interval(pooled[0])
            return Estimate(est.mean, boot.low, boot.high, boot.n, f"no spread over {est.n} seeds; {boot.method}")
        items = self.items.get(seeds[0])
        if items:
            est = bootstrap_interval(items)
            return Estimate(self.values[seeds[0]], est.low, est.high, est.n, est.method)
        return t_interval([self.values[seeds[0]]])


def cell_difference(a: Cell, b: Cell) -> Estimate | None:
    """Interval of a - b: paired t by seed when both have the same >= 2 seeds, Welch when both have >= 2 but
    different seeds, a paired bootstrap over shared test items with one seed each; None when none applies."""
    sa, sb = sorted(a.values), sorted(b.values)
    if len(sa) >= 2 and len(sb) >= 2:
        paired = sa == sb
        diff = seed_difference([a.values[s] for s in sa], [b.values[s] for s in sb], paired=paired)
        if diff.has_interval and diff.low < diff.high:
            return diff
        pooled = _pooled_items([a, b], sa) if paired else None  # no spread over seeds: test-set noise at least
        if pooled is None:
            return Estimate(diff.mean, math.nan, math.nan, diff.n, "no spread over seeds: no interval")
        boot = bootstrap_difference(*pooled)
        return Estimate(diff.mean, boot.low, boot.high, boot.n, f"no spread over seeds; {boot.method}")
    if len(sa) == 1 and len(sb) == 1:
        ia, ib = a.items.get(sa[0]), b.items.get(sb[0])
        if ia and ib and len(ia) == len(ib):
            diff = bootstrap_difference(ia, ib)
            return Estimate(a.values[sa[0]] - b.values[sb[0]], diff.low, diff.high, diff.n, diff.method)
    return None


def _pooled_items(cells: Sequence[Cell], seeds: Sequence[int]) -> list[list[float]] | None:
    """Each cell's items of `seeds` concatenated (seed order), when every cell has items for every seed and the
    cells' lists align (same lengths); else None."""
    out = []
    for cell in cells:
        if any(not cell.items.get(s) for s in seeds):
            return None
        out.append([x for s in seeds for x in cell.items[s]])
    return out if len({len(o) for o in out}) == 1 else None


Table = dict[str, dict[str, Cell]]  # row -> column ("" for 1-D tables) -> cell


def gather_tables(runs: Sequence[tuple[str, int | None, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Merge the ``tables`` of several runs' metrics.json: ``[(run id, training seed or None, metrics)]`` ->
    ``{name: {"metric": str, "cells": Table}}``.

    Runs with distinct seeds that report the same row are repeats: their values go into one cell. A row that
    two runs report with the same seed (or without one) is kept twice, the later one suffixed with its run id.
    """
    merged: dict[str, dict[str, Any]] = {}
    for run_id, seed, metrics in runs:
        for name, table in (metrics.get("tables") or {}).items():
            if not isinstance(table, dict) or not isinstance(table.get("values"), dict):
                continue
            slot = merged.setdefault(name, {"metric": table.get("metric", ""), "cells": {}, "owners": {}})
            items = table.get("items") if isinstance(table.get("items"), dict) else {}
            key_seed = 0 if seed is None else seed
            for row, value in table["values"].items():
                owners = slot["owners"].setdefault(row, set())  # seeds that already reported this row
                if row in slot["cells"] and (seed is None or seed in owners):
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


def _match(pattern: str, rows: Sequence[str]) -> list[str]:
    """Rows named `pattern`, or matching it as a shell pattern (exact names first: "[0.5, 1.0]" is a name)."""
    if pattern in rows:
        return [pattern]
    return [r for r in rows if fnmatch.fnmatchcase(r, pattern)]


def _rows(pattern: str, rows: Sequence[str], other: str) -> list[str]:
    if pattern == "*":
        excluded = set(_match(other, rows)) | {r for b in BASELINE_ROWS for r in _match(b, rows)}
        return [r for r in rows if r not in excluded]
    return _match(pattern, rows)


def evaluate_claim(claim: Claim, cells: Table | None) -> dict[str, Any]:
    """Verdict of one claim on a gathered table (``None``: the table was not measured).

    Returns ``{"key", "source", "text", "verdict", "parts": [{"better", "relation", "worse", "column",
    "difference": Estimate dict | None, "verdict"}]}``.
    """
    parts: list[dict[str, Any]] = []
    missing: list[str] = []  # rows or columns the claim names that the table lacks
    rows = list(cells or {})
    for better_pat, relation, worse_pat in claim.parts:
        missing += [p for p in (better_pat, worse_pat) if p != "*" and not _match(p, rows) and p not in missing]
        for better in _rows(better_pat, rows, worse_pat):
            for worse in _rows(worse_pat, rows, better_pat):
                if better == worse:
                    continue
                for col in claim.columns or ("",):
                    a, b = cells[better].get(col), cells[worse].get(col)
                    if a is None or b is None:
                        if f"column {col}" not in missing:
                            missing.append(f"column {col}")
                        continue
                    diff = cell_difference(a, b)
                    result = verdict(diff, relation)
                    parts.append({"better": better, "relation": relation, "worse": worse, "column": col,
                                  "difference": diff.to_dict() if diff else None, "verdict": result,
                                  "verdict_text": describe_verdict(result, relation)})
    overall = combine_verdicts([p["verdict"] for p in parts]) if parts else UNMEASURED
    relation = ">=" if parts and all(p["relation"] == ">=" for p in parts) else ">"
    return {"key": claim.key, "source": claim.source, "text": claim.text, "table": claim.table,
            "verdict": overall, "verdict_text": describe_verdict(overall, relation), "parts": parts,
            "missing": missing}


def evaluate_claims(tables: dict[str, dict[str, Any]], claims: Sequence[Claim] = PAPER_CLAIMS
                    ) -> list[dict[str, Any]]:
    """:func:`evaluate_claim` for every claim whose table was gathered (:func:`gather_tables` output)."""
    return [evaluate_claim(c, tables[c.table]["cells"]) for c in claims if c.table in tables]


def claims_markdown(results: Sequence[dict[str, Any]], digits: int = 1) -> list[str]:
    """Markdown lines: one verdict line per claim, then its parts with the difference and its interval."""
    lines: list[str] = []
    for r in results:
        lines.append(f"- **{r['source']}**: {r['text']} -> **{r['verdict_text']}**")
        for p in r["parts"]:
            d = p["difference"]
            where = f" ({p['column']})" if p["column"] else ""
            if d is None:
                diff = "no interval (needs >= 2 seeds, or per-item scores with one seed)"
            elif d["low"] is None:
                diff = f"{d['mean']:+.{digits}f}, no interval ({d['method']})"
            else:
                diff = f"{d['mean']:+.{digits}f} [{d['low']:+.{digits}f}, {d['high']:+.{digits}f}] ({d['method']})"
            lines.append(f"  - {p['better']} {p['relation']} {p['worse']}{where}: difference {diff}: "
                         f"{p['verdict_text']}")
        if r.get("missing"):
            lines.append(f"  - not in this table (not measured): {', '.join(r['missing'])}")
    return lines


def table_estimates(cells: Table) -> dict[str, dict[str, Estimate]]:
    """row -> column -> :meth:`Cell.estimate` for every cell of a gathered table."""
    return {row: {col: cell.estimate() for col, cell in cols.items()} for row, cols in cells.items()}


def position_fade(run: dict[str, Any]) -> float:
    """How much a captioner's visual signal changes along the caption, from one run of
    :func:`mdc_core.eval.position_signal.position_signal_runs` (nats; < 0: the signal fades): the mean over
    captions of each caption's later-half minus earlier-half signal (``caption_fades``). Results written before
    the per-caption fades existed: the token-weighted mean signal over the later half of the caption positions
    minus that over the earlier half, averaged over the run's curves (one for ARC, one per masking ratio for MDC)."""
    items = position_fade_items(run)
    if items:
        return sum(items) / len(items)
    fades = []
    for curve in run["curves"]:
        pos = [i for i, c in enumerate(curve["count"]) if c and curve["signal"][i] is not None]
        if len(pos) < 2:
            continue
        half = len(pos) // 2

        def weighted(idx: list[int], curve: dict[str, Any] = curve) -> float:
            total = sum(curve["count"][i] for i in idx)
            return sum(curve["signal"][i] * curve["count"][i] for i in idx) / total

        fades.append(weighted(pos[half:]) - weighted(pos[:half]))
    if not fades:
        raise ValueError(f"run {run.get('run')} has fewer than two scored caption positions")
    return sum(fades) / len(fades)


def position_fade_items(run: dict[str, Any]) -> list[float] | None:
    """The run's per-caption fades (test items, data order), or None when the result has none."""
    items = run.get("caption_fades")
    return [float(x) for x in items] if items else None


def repeat_fade_items(runs: Sequence[dict[str, Any]]) -> list[list[float]] | None:
    """Per run, the repeat fades (``repeat_fades``) of the captions where every run has one, in data order: the
    aligned test items of the same-word claim. None when a run has none or no caption has a repeat in all."""
    fades = [run.get("repeat_fades") for run in runs]
    if not fades or any(not f for f in fades) or len({len(f) for f in fades}) != 1:
        return None
    keep = [i for i in range(len(fades[0])) if all(f[i] is not None for f in fades)]
    return [[float(f[i]) for i in keep] for f in fades] if keep else None


def report_markdown(tables: dict[str, dict[str, Any]], seed: int | None = None, digits: int = 1) -> str:
    """What a notebook shows for its own paper tables (``metrics.json`` layout, one training seed): each cell as
    ``mean [95% interval]`` (a bootstrap over test items where the table has ``items``, test-set noise only),
    then the verdicts of the paper's claims on these tables. Repeats over seeds are the summary's job."""
    gathered = gather_tables([("notebook", seed, {"tables": tables})])
    lines: list[str] = []
    for name, table in gathered.items():
        est = table_estimates(table["cells"])
        columns = list(dict.fromkeys(c for cols in est.values() for c in cols))
        head = [name, *(c or table["metric"] for c in columns)]
        lines += ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
        for row, cols in est.items():
            cells = [cols[c].format(digits) if c in cols else "-" for c in columns]
            lines.append("| " + " | ".join([row, *cells]) + " |")
        lines.append("")
    lines.append("Brackets: 95% bootstrap intervals over the test items (one training seed: test-set noise only).")
    verdicts = evaluate_claims(gathered)
    if verdicts:
        lines += ["", "**Verdicts on the paper's claims** (interval of each difference; see docs/evidence.md):", "",
                  *claims_markdown(verdicts, digits)]
    return "\n".join(lines)
