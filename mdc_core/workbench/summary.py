"""The summary of a batch run: ``summary.md``, ``summary.json`` and ``summary.png`` in the plan folder.

Each notebook writes ``metrics.json`` into its run folder::

    {"notebook": "02_noise_schedule_ablation",
     "metrics": {"probe_top1/[0.5, 1.0]": 0.61, ...},            # flat scalars, shown in the runs table
     "tables": {"table5": {"metric": "colour probe top-1 (%)",  # paper-style tables, by the paper's name
                           "values": {"[0.5, 1.0]": 61.0, ...}}}}  # row -> number, or row -> {column -> number}

Tables of the same name from several runs are merged row by row (a grid over schedules gives one row per
run); repeats of a run over training seeds are gathered into one cell shown as ``mean [95% interval]``, and a
row that two other runs both report is kept twice, suffixed with its run id. A table may carry per-test-item
scores (``"items": {row: [...]}`` or ``{row: {column: [...]}}``, whose mean is the value) for bootstrap intervals
with one seed. Every table whose name is in :data:`PAPER` is printed beside the paper's numbers (from the column
that matches ours), with the scale it was measured at, and the claims of the paper's text get verdicts, its
tables' unclaimed row orders observations (:mod:`mdc_core.workbench.evidence`). The embedded data are small
synthetic scenes, so the columns are comparable in direction and ordering only, never in value.
"""

from __future__ import annotations

import json
import math
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mdc_core.eval.budget_curve import ANNEALED_TABLE, plot_annealed_budget
from mdc_core.eval.data_scaling import plot_data_scaling
from mdc_core.workbench.evidence import SCALING_TABLE, display_tables, evidence_markdown, gather_runs, interval_note
from mdc_core.workbench.paper import PAPER


@dataclass
class RunResult:
    """The outcome of one run of a plan (one executed notebook in its run folder)."""

    run_id: str
    notebook: str
    status: str  # done | failed | skipped
    run_dir: Path
    duration_s: float = 0.0
    error: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)


def read_metrics(run_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((run_dir / "metrics.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "–" if value is None else str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        return f"{value:.3g}" if abs(value) < 1 else f"{value:.1f}"  # fractions (accuracy 0.934) keep 3 digits
    return str(value)


def _md_table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows]
    return lines


def _one_column(paper: Any) -> dict[str, Any]:
    """The paper's values as row -> number when its table has one column (Table 5: ImageNet-1k), else {}."""
    values = paper.values if paper else {}
    if not any(isinstance(v, dict) for v in values.values()):
        return values
    columns = {c for v in values.values() if isinstance(v, dict) for c in v}
    return {r: v[next(iter(columns))] for r, v in values.items()} if len(columns) == 1 else {}


def table_markdown(name: str, ours: dict[str, Any]) -> list[str]:
    """Markdown lines for one merged table, beside the paper's numbers when the paper has the table."""
    paper = PAPER.get(name)
    values = ours["values"]
    title = paper.title if paper else name
    setting = f" ({ours['setting']})" if ours.get("setting") else ""
    lines = [f"### {title}", "", f"ours: {ours.get('metric') or 'see the notebook'}{setting}" +
             (f"; paper: {paper.metric}" if paper else ""), ""]
    two_d = any(isinstance(v, dict) for v in values.values())
    paper_vals = _one_column(paper)
    paper_two_d = bool(paper) and bool(paper.values) and not paper_vals
    if not two_d and not paper_two_d:
        rows = list(dict.fromkeys([*paper_vals, *values]))
        lines += _md_table(["", "embedded data (ours)", "paper"],
                           [[r, values.get(r), paper_vals.get(r)] for r in rows])
        return lines + [""]
    if two_d:
        columns = list(dict.fromkeys(c for v in values.values() if isinstance(v, dict) for c in v))
        lines += _md_table(["ours", *columns], [[r, *(v.get(c) for c in columns)] for r, v in values.items()
                                                if isinstance(v, dict)])
    else:
        lines += _md_table(["ours", "embedded data"], [[r, v] for r, v in values.items()])
    if paper and paper.values:
        pcols = list(dict.fromkeys(c for v in paper.values.values() for c in v))
        lines += ["", *_md_table(["paper", *pcols], [[r, *(v.get(c) for c in pcols)]
                                                    for r, v in paper.values.items()])]
    return lines + [""]


def _table_order(tables: dict[str, Any]) -> list[str]:
    """The paper's tables in the paper's order (Table 1 ... 5, then Fig. 4), then any others by name."""
    known = [name for name in PAPER if name in tables]
    return known + sorted(set(tables) - set(known))


def _scalars(metrics: dict[str, Any], limit: int = 4) -> str:
    flat = [(k, v) for k, v in (metrics.get("metrics") or {}).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)]
    text = ", ".join(f"{k}={_fmt(v)}" for k, v in flat[:limit])
    return text + (f", ... (+{len(flat) - limit})" if len(flat) > limit else "")


def write_summary(out: Path, results: list[RunResult], *, name: str, source: Path | str,
                  description: str = "") -> Path:
    """Write summary.md, summary.json and summary.png into the plan folder `out` of plan `name` (read from the
    YAML file `source`); returns the summary.md path."""
    per_run = {r.run_id: read_metrics(r.run_dir) for r in results}
    gathered = gather_runs([(r.run_id, r.parameters, per_run[r.run_id]) for r in results], plan_steps(source),
                           plan_steps(source, "n_train"))
    tables = display_tables(gathered)
    n_failed = sum(r.status == "failed" for r in results)
    lines = [f"# Plan `{name}`", ""]
    if description:
        lines += [description.strip(), ""]
    lines += [f"{len(results)} run(s): {sum(r.status == 'done' for r in results)} run now, "
              f"{sum(r.status == 'skipped' for r in results)} finished earlier (skipped), {n_failed} failed. "
              f"Plan file: `{source}`. Figure: `summary.png`.", "", "## Runs", ""]
    rows = [[f"`{r.run_id}`", r.status.upper() if r.status == "failed" else r.status, f"{r.duration_s:.0f}",
             r.error.splitlines()[0][:160] if r.error else _scalars(per_run.get(r.run_id, {}))] for r in results]
    lines += _md_table(["run", "status", "seconds", "metrics (or error)"], rows)
    if tables:
        lines += ["", "## Embedded-data versions of the paper's tables", "",
                  "The embedded data are small synthetic scenes and the models tiny, so compare orderings and "
                  "directions with the paper, not values. " + interval_note(gathered), ""]
        for table_name in _table_order(tables):  # not `name`: that is the plan's
            lines += table_markdown(table_name, tables[table_name])
    verdict_lines, verdicts = evidence_markdown(gathered)
    if tables:
        lines += verdict_lines
    path = out / "summary.md"
    path.write_text("\n".join(lines) + "\n")
    record = {"plan": name, "source": str(source), "tables": tables, "claims": verdicts,
              "paper": {k: {"title": v.title, "metric": v.metric, "values": v.values} for k, v in PAPER.items()},
              "runs": [{"run_id": r.run_id, "notebook": r.notebook, "status": r.status,
                        "duration_s": round(r.duration_s, 2), "error": r.error, "parameters": r.parameters,
                        "metrics": per_run.get(r.run_id, {}).get("metrics", {})} for r in results]}
    (out / "summary.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    summary_figure(results, tables, out / "summary.png")
    if ANNEALED_TABLE in gathered:
        plot_annealed_budget(gathered[ANNEALED_TABLE], out / "budget_annealed.png")
    if SCALING_TABLE in gathered:
        plot_data_scaling(gathered[SCALING_TABLE], out / "data_scaling.png",
                          title="Fig. 5 at this scale: probe gain against training images (95% intervals over seeds)")
    return path


def plan_steps(source: Path | str, key: str = "steps") -> int | None:
    """The training steps (or another integer `key`, e.g. ``n_train``) the plan file `source` sets for all its
    notebooks (``parameters.<key>``), None when it sets none or cannot be read: the budget its claims are tested
    at (other budgets, other training-set sizes: other models)."""
    import yaml

    try:
        steps = (yaml.safe_load(Path(source).read_text()).get("parameters") or {}).get(key)
    except (OSError, yaml.YAMLError, AttributeError):
        return None
    return int(steps) if isinstance(steps, (int, float)) and not isinstance(steps, bool) else None


def summary_figure(results: list[RunResult], tables: dict[str, dict[str, Any]], path: Path) -> None:
    """One panel per table (ours beside the paper's for 1-D tables) plus a panel of run durations."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    panels = len(tables) + 1
    cols = min(3, panels)
    nrows = math.ceil(panels / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 3.8 * nrows), squeeze=False)
    flat = list(axes.ravel())
    for ax, name in zip(flat, _table_order(tables), strict=False):
        _table_panel(ax, name, tables[name])
    ax = flat[len(tables)]
    colours = {"done": "tab:green", "skipped": "tab:gray", "failed": "tab:red"}
    ids = [r.run_id for r in results]
    ax.barh(range(len(ids)), [r.duration_s for r in results], color=[colours[r.status] for r in results])
    ax.set_yticks(range(len(ids)), [i[:40] for i in ids], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds (green: run, grey: skipped, red: failed)")
    ax.set_title("runs")
    for extra in flat[panels:]:
        extra.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _table_panel(ax: Any, name: str, table: dict[str, Any]) -> None:
    import numpy as np

    paper = PAPER.get(name)
    values = table["values"]
    ax.set_title(paper.title if paper else name, fontsize=9)
    if any(isinstance(v, dict) for v in values.values()):
        rows = [r for r, v in values.items() if isinstance(v, dict)]
        columns = list(dict.fromkeys(c for r in rows for c in values[r]))
        if "gain" in columns:  # probe tables: the raw and chance-corrected means (per-task gains: summary.md)
            columns = [c for c in columns if not c.startswith("gain ")]
        width = 0.8 / max(1, len(rows))
        means = table.get("means", values)
        for i, row in enumerate(rows):
            ys = [float(means[row].get(c, np.nan)) for c in columns]
            spans = [((table.get("intervals") or {}).get(row) or {}).get(c) for c in columns]
            yerr = np.array([[y - s[0], s[1] - y] if s else [0.0, 0.0] for y, s in zip(ys, spans, strict=True)]).T
            ax.bar(np.arange(len(columns)) + i * width, ys, width, yerr=yerr, capsize=2, label=row)
        ax.set_xticks(np.arange(len(columns)) + 0.4 - width / 2, columns, rotation=30, ha="right", fontsize=7)
        ax.legend(fontsize=6, ncol=2 if len(rows) > 4 else 1, loc="upper left")
        headroom = 0.25 + 0.06 * max(0, math.ceil(len(rows) / 2) - 2)  # room above the bars for a tall legend
    else:
        paper_vals = _one_column(paper)  # a paper table of several columns gets no bar beside ours
        rows = list(dict.fromkeys([*paper_vals, *values]))
        x = np.arange(len(rows))
        means = table.get("means", values)  # display tables hold text cells; their numbers are in "means"
        ours = [float(means[r]) if isinstance(means.get(r), (int, float)) else np.nan for r in rows]
        spans = [(table.get("intervals") or {}).get(r) for r in rows]
        yerr = np.array([[m - s[0], s[1] - m] if s else [0.0, 0.0] for m, s in zip(ours, spans, strict=True)]).T
        ax.bar(x - 0.2, ours, 0.4, yerr=yerr, capsize=3, label="embedded data (ours, 95% interval)")
        if paper_vals:
            ax.bar(x + 0.2, [float(paper_vals.get(r, np.nan)) for r in rows], 0.4, label="paper", color="tab:gray")
        ax.set_xticks(x, rows, rotation=30, ha="right", fontsize=7)
        ax.legend(fontsize=7)
        headroom = 0.25
    low, high = ax.get_ylim()
    if high > 0:
        ax.set_ylim(low, high + headroom * (high - low))  # so the legend does not sit on the bars
    metric = table.get("metric", "").split(";")[0]
    ax.set_ylabel(textwrap.fill(metric[:80], 40), fontsize=7)
