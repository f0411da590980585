"""The summary of a batch run: ``summary.md``, ``summary.json`` and ``summary.png`` in the plan folder.

Each notebook writes ``metrics.json`` into its run folder::

    {"notebook": "02_noise_schedule_ablation",
     "metrics": {"probe_top1/[0.5, 1.0]": 0.61, ...},            # flat scalars, shown in the runs table
     "tables": {"table5": {"metric": "colour probe top-1 (%)",  # paper-style tables, by the paper's name
                           "values": {"[0.5, 1.0]": 61.0, ...}}}}  # row -> number, or row -> {column -> number}

Tables of the same name from several runs are merged row by row (a grid over schedules gives one row per
run); repeats of a run over training seeds (and the members of a seed stack, each as its seed:
:mod:`mdc_workbench.runs.members`) are gathered into one cell shown as ``mean [95% interval]``, and a
row that two other runs both report is kept twice, suffixed with its run id. A table may carry per-test-item
scores (``"items": {row: [...]}`` or ``{row: {column: [...]}}``, whose mean is the value) for bootstrap intervals
with one seed. Every table whose name is in :data:`PAPER` is printed beside the paper's numbers (from the column
that matches ours), with the scale it was measured at, and the claims of the paper's text get verdicts, its
tables' unclaimed row orders observations (:mod:`mdc_workbench.runs.evidence`). The embedded data are small
synthetic scenes, so the columns are comparable in direction and ordering only, never in value. The summary's
first lines say whether the claim definitions it was judged under are those recorded when the plan's first run
started (:mod:`mdc_workbench.runs.declared`).
"""

from __future__ import annotations

import json
import math
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mdc_workbench.eval.budget_curve import ANNEALED_TABLE, plot_annealed_budget
from mdc_workbench.eval.data_scaling import plot_data_scaling
from mdc_workbench.eval.items import FILE_NAME as ITEMS_FILE
from mdc_workbench.eval.paper import PAPER
from mdc_workbench.runs.declared import declaration_lines, fingerprint, read_start
from mdc_workbench.runs.evidence import (
    SCALING_TABLE,
    display_tables,
    evidence_markdown,
    gather_runs,
    interval_note,
)
from mdc_workbench.runs.members import expand_members
from mdc_workbench.runs.powered import summary_lines as power_summary


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



def run_record(result: Any, metrics_json: dict[str, Any]) -> dict[str, Any]:
    """One run's entry in ``summary.json``: its id, notebook, status, duration, error, parameters and flat metrics;
    a seed stack's run (a ``members`` mapping in its metrics.json) also each member's flat metrics by seed, which
    :func:`mdc_workbench.eval.recompute.summary_runs` reads as the runs of those seeds."""
    record = {"run_id": result.run_id, "notebook": result.notebook, "status": result.status,
              "duration_s": round(result.duration_s, 2), "error": result.error, "parameters": result.parameters,
              "metrics": metrics_json.get("metrics", {})}
    members = metrics_json.get("members")
    if isinstance(members, dict):
        record["members"] = {str(k): (v.get("metrics", {}) if isinstance(v, dict) else {}) for k, v in members.items()}
    return record

def write_summary(out: Path, results: list[RunResult], *, name: str, source: Path | str,
                  description: str = "") -> Path:
    """Write summary.md, summary.json and summary.png into the plan folder `out` of plan `name` (read from the
    YAML file `source`); returns the summary.md path."""
    per_run = {r.run_id: read_metrics(r.run_dir) for r in results}
    gathered = gather_runs(expand_members([(r.run_id, r.parameters, per_run[r.run_id]) for r in results]),
                           plan_steps(source), plan_steps(source, "n_train"))  # a stack's members: seeds
    tables = display_tables(gathered)
    n_failed = sum(r.status == "failed" for r in results)
    definitions, start = fingerprint(source), read_start(out)
    lines = [f"# Plan `{name}`", "", *declaration_lines(start, definitions), *power_summary(out)]
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
    kept = [f for r in results for f in [r.run_dir / ITEMS_FILE, *sorted(r.run_dir.glob(f"seed_*/{ITEMS_FILE}"))]
            if f.is_file()]  # a seed stack's: one per member (mdc_workbench.runs.members)
    if kept:  # the runs' per-item files: every table and verdict above can be recomputed from them
        size = sum(f.stat().st_size for f in kept) / 1e6
        lines += ["", f"Per-item results kept by {len(kept)} run(s) (`<run>/{ITEMS_FILE}`, a stack's member's "
                      f"`<run>/seed_<seed>/{ITEMS_FILE}`; {size:.1f} MB in all): "
                      f"`mdc recompute {out}` rebuilds every table and verdict above from them, on a CPU."]
    path = out / "summary.md"
    path.write_text("\n".join(lines) + "\n")
    record = {"plan": name, "source": str(source), "definitions": {"judged": definitions, "at_start": start},
              "tables": tables, "claims": verdicts, "items": [str(f.relative_to(out)) for f in kept],
              "paper": {k: {"title": v.title, "metric": v.metric, "values": v.values} for k, v in PAPER.items()},
              "runs": [run_record(r, per_run.get(r.run_id, {})) for r in results]}
    (out / "summary.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    summary_figure(results, tables, out / "summary.png")
    if ANNEALED_TABLE in gathered:
        plot_annealed_budget(gathered[ANNEALED_TABLE], out / "budget_annealed.png")
    if SCALING_TABLE in gathered:
        plot_data_scaling(gathered[SCALING_TABLE], out / "data_scaling.png",
                          title="Fig. 5 at this scale: probe gain against training images\n(95% intervals over seeds)")
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


# columns of a paper table measured in a unit of their own: each gets a panel apart from the table's scores
UNIT_COLUMNS = {"repetition": "captions repeating a word (%)", "length": "mean caption length (tokens)"}
LABEL_WIDTH = 44  # characters per line of a panel's title and y label (a 5.2-inch panel at 8-9 pt)


@dataclass
class Panel:
    """One axes of summary.png: a table, the columns it draws (None: a 1-D table) and the y axis' unit."""

    name: str
    table: dict[str, Any]
    columns: list[str] | None
    unit: str
    part: str = ""  # which of the table's unit groups, when it has several ("scores", "repetition", ...)


def metric_unit(metric: str) -> str:
    """The unit a table's metric text states first (before any ``;``, parenthesis or ``:`` explanation): the y label
    of its panel, never cut mid-word (``"probe top-1 % and gain over random init (mean over ...)"`` -> ``"probe
    top-1 % and gain over random init"``)."""
    head = metric.split(";")[0].split(" (")[0].strip()
    name, colon, rest = head.partition(": ")
    return (rest if colon and len(name) < 30 and rest else head) or "value"


def summary_panels(tables: dict[str, dict[str, Any]]) -> list[Panel]:
    """The panels of the tables in the paper's order: one per table, or, for a table whose columns are in
    different units (Table 3's scores x 100, repetition %, length in tokens; :data:`UNIT_COLUMNS`), one per unit."""
    panels = []
    for name in _table_order(tables):
        table = tables[name]
        values = table["values"]
        unit = metric_unit(table.get("metric", ""))
        if not any(isinstance(v, dict) for v in values.values()):
            panels.append(Panel(name, table, None, unit))
            continue
        columns = list(dict.fromkeys(c for v in values.values() if isinstance(v, dict) for c in v))
        if "gain" in columns:  # probe tables: the raw and chance-corrected means (per-task gains: summary.md)
            columns = [c for c in columns if not c.startswith("gain ")]
        apart = [c for c in columns if c in UNIT_COLUMNS]
        rest = [c for c in columns if c not in UNIT_COLUMNS]
        if rest:
            panels.append(Panel(name, table, rest, unit.split(", ")[0] if apart else unit,
                                "scores" if apart else ""))
        panels += [Panel(name, table, [c], UNIT_COLUMNS[c], c) for c in apart]
    return panels


def panel_title(panel: Panel) -> str:
    """What the panel shows and on which data: the paper's table (without the setting of the paper's own numbers,
    such as "(MSCOCO, after fine-tuning)") and the embedded data and scale it was measured at."""
    paper = PAPER.get(panel.name)
    title = paper.title if paper else panel.name
    if paper and paper.values:  # a table of the paper's results: its parenthesis is the paper's data
        title = re.sub(r"\s*\([^)]*\)$", "", title)
    if panel.part:
        title += f": {panel.part}"
    data = f"embedded data: {panel.table['setting']}" if panel.table.get("setting") else "embedded data"
    return "\n".join(textwrap.wrap(title, LABEL_WIDTH) + textwrap.wrap(data, LABEL_WIDTH + 14))


def clipped_texts(fig: Any) -> list[str]:
    """The visible texts of `fig` that do not lie wholly inside it (each as ``'text' [x0, y0, x1, y1] px``), drawn
    by its own renderer: what a reader of the saved PNG would find cut. [] when every text fits."""
    from matplotlib.text import Text

    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)
    box = fig.bbox
    out = []
    for text in fig.findobj(Text):
        if not text.get_visible() or not text.get_text().strip():
            continue
        ext = text.get_window_extent(renderer)
        if ext.x0 < box.x0 - 0.5 or ext.y0 < box.y0 - 0.5 or ext.x1 > box.x1 + 0.5 or ext.y1 > box.y1 + 0.5:
            out.append(f"{text.get_text()!r} [{ext.x0:.0f}, {ext.y0:.0f}, {ext.x1:.0f}, {ext.y1:.0f}] px")
    return out


def summary_figure(results: list[RunResult], tables: dict[str, dict[str, Any]], path: Path | None = None) -> Any:
    """One panel per table (per unit of a table with several: :func:`summary_panels`), ours beside the paper's for
    1-D tables, plus a panel of run durations; saved to `path` (when given) and returned (a matplotlib Figure)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = summary_panels(tables)
    cols = min(3, len(panels) + 1)
    nrows = math.ceil((len(panels) + 1) / cols)
    fig = Figure(figsize=(5.6 * cols, 4.4 * nrows))
    FigureCanvasAgg(fig)  # draws off screen, with no pyplot state
    axes = fig.subplots(nrows, cols, squeeze=False)
    flat = list(axes.ravel())
    for ax, panel in zip(flat, panels, strict=False):
        _table_panel(ax, panel)
    ax = flat[len(panels)]
    colours = {"done": "tab:green", "skipped": "tab:gray", "failed": "tab:red"}
    ids = [r.run_id for r in results]
    if ids:
        ax.barh(range(len(ids)), [r.duration_s for r in results], color=[colours[r.status] for r in results])
        ax.set_yticks(range(len(ids)), [i[:40] for i in ids], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("seconds (green: run, grey: skipped, red: failed)", fontsize=8)
        ax.set_title("runs", fontsize=9)
    else:
        ax.axis("off")
    for extra in flat[len(panels) + 1:]:
        extra.axis("off")
    fig.tight_layout()
    for ax in flat[:len(panels)]:
        _clear_legend(ax, fig.canvas.get_renderer())
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def _table_panel(ax: Any, panel: Panel) -> None:
    import numpy as np

    paper, table = PAPER.get(panel.name), panel.table
    values = table["values"]
    means = table.get("means", values)  # display tables hold text cells; their numbers are in "means"
    ax.set_title(panel_title(panel), fontsize=9)
    if panel.columns is not None:
        rows = [r for r, v in values.items() if isinstance(v, dict) and any(c in v for c in panel.columns)]
        columns = panel.columns
        width = 0.8 / max(1, len(rows))
        for i, row in enumerate(rows):
            ys = [float(means[row].get(c, np.nan)) for c in columns]
            spans = [((table.get("intervals") or {}).get(row) or {}).get(c) for c in columns]
            ax.bar(np.arange(len(columns)) + i * width, ys, width, yerr=_error_bars(ys, spans), capsize=2, label=row)
        ax.set_xticks(np.arange(len(columns)) + 0.4 - width / 2, columns, rotation=30 if len(columns) > 2 else 0,
                      ha="right" if len(columns) > 2 else "center", fontsize=8)
        ax.legend(fontsize=8, ncol=2 if len(rows) > 3 else 1, loc="upper left")
    else:
        paper_vals = _one_column(paper)  # a paper table of several columns gets no bar beside ours
        rows = list(dict.fromkeys([*paper_vals, *values]))
        x = np.arange(len(rows))
        ours = [float(means[r]) if isinstance(means.get(r), (int, float)) else np.nan for r in rows]
        spans = [(table.get("intervals") or {}).get(r) for r in rows]
        ax.bar(x - 0.2, ours, 0.4, yerr=_error_bars(ours, spans), capsize=3, label="embedded data (ours, 95% interval)")
        if paper_vals:
            ax.bar(x + 0.2, [float(paper_vals.get(r, np.nan)) for r in rows], 0.4, label="paper", color="tab:gray")
        ax.set_xticks(x, rows, rotation=30 if len(rows) > 3 else 0, ha="right" if len(rows) > 3 else "center",
                      fontsize=8)
        ax.legend(fontsize=8, loc="upper left")
    ax.axhline(0.0, color="black", lw=0.6)
    ax.set_ylabel(textwrap.fill(panel.unit, LABEL_WIDTH - 8), fontsize=8)
    ax.tick_params(axis="y", labelsize=8)


def _error_bars(means: list[float], spans: list[Any]) -> Any:
    """(2, n) lower and upper error bar lengths from (low, high) intervals (0 without one; never negative, also
    for an interval that does not hold its mean, as a bootstrap's may not)."""
    import numpy as np

    return np.array([[max(0.0, m - s[0]), max(0.0, s[1] - m)] if s else [0.0, 0.0]
                     for m, s in zip(means, spans, strict=True)]).T


def _clear_legend(ax: Any, renderer: Any) -> None:
    """Raise the y limit so that the bars (with their error bars) end below the legend in the upper left."""
    legend = ax.get_legend()
    if legend is None:
        return
    bottom = legend.get_window_extent(renderer).transformed(ax.transAxes.inverted()).y0  # axes fraction
    low, _ = ax.get_ylim()
    top = ax.dataLim.y1  # the highest bar or error bar
    if top <= low or bottom <= 0.2:
        return
    ax.set_ylim(low, low + (top - low) / (bottom - 0.04))
