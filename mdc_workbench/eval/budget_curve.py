"""Training-budget curves: the probe's chance-corrected gain of each method at several training budgets, read from
the checkpoints of one long run per method, so that an ordering (e.g. MDC vs ARC) is seen as a function of
training rather than at one point.

A run trained for the longest budget with ``train.ckpt_every`` dividing every budget and ``train.keep_last`` at
least the number of budgets keeps one checkpoint per budget (``RUN/checkpoints/step_N``). Every checkpoint is
probed like a Table 1 row (:func:`mdc_workbench.notebooks.probe_report.probe_budget_curve` runs the probes, with the
random-init row of each feature kind once), and each point gets the gain over that row with a 95% bootstrap
interval over the test images (test-set noise only: one training seed); the difference of two methods at each
budget gets a paired bootstrap.

One caveat the tables state: a checkpoint at step 400 of a 1600-step run has not had its learning rate annealed
(the cosine schedule spans the whole run), so it is not the same model as a run trained for 400 steps; compare
the curve's first point with the 400-step Table 1 row to see how much that matters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mdc_workbench.eval.stats import bootstrap_difference, bootstrap_interval

BUDGET_SEP = " @ "  # probe row names: "<method> @ <step>"


def row_name(method: str, step: int) -> str:
    return f"{method}{BUDGET_SEP}{step}"


def checkpoint_at(run_dir: str | Path, step: int) -> Path:
    """The checkpoint folder of `run_dir` saved at `step`; ValueError naming the steps it does have."""
    from mdc_core.checkpoint import list_checkpoints

    folders = list_checkpoints(run_dir)
    by_step = {_step_of(f): f for f in folders}
    if step not in by_step:
        have = ", ".join(str(s) for s in sorted(by_step)) or "none"
        raise ValueError(f"{run_dir} has no checkpoint at step {step} (it has: {have}); train it with "
                         "train.ckpt_every dividing every budget and train.keep_last >= the number of budgets")
    return by_step[step]


def _step_of(folder: Path) -> int:
    import json

    meta = folder / "meta.json"
    if meta.is_file():
        return int(json.loads(meta.read_text())["step"])
    return int(folder.name.rsplit("_", 1)[-1])


def check_budgets(budgets: Sequence[int], steps: int) -> list[int]:
    """`budgets` sorted, each a positive step count <= `steps` (the longest run's length); ValueError otherwise."""
    out = sorted({int(b) for b in budgets})
    if not out or out[0] < 1 or out[-1] > steps or len(out) != len(budgets):
        raise ValueError(f"budgets must be distinct positive steps <= steps ({steps}); got {list(budgets)}")
    return out


def curve_from_probe(probe: Mapping[str, Any], methods: Sequence[str], budgets: Sequence[int]) -> dict[str, Any]:
    """The curve of a :func:`~mdc_workbench.notebooks.probe_report.probe_models` result whose rows are
    ``"<method> @ <step>"``: ``{"budgets": [...], "methods": {method: {"gain": [...], "low": [...], "high":
    [...], "top1": [...]}}, "items": {method: {step: [gain points per test image]}}}`` (gain = the mean over the
    averaged tasks of top-1 minus the random-init row's, in points; low/high its 95% bootstrap interval)."""
    curve: dict[str, Any] = {"budgets": list(budgets), "methods": {}, "items": {}}
    for m in methods:
        line: dict[str, list[float]] = {"gain": [], "low": [], "high": [], "top1": []}
        curve["items"][m] = {}
        for b in budgets:
            row = row_name(m, b)
            if row not in probe["gain_items"]:
                raise ValueError(f"the probe has no gain for {row!r} (no random-init row of its feature kind)")
            items = list(probe["gain_items"][row]["mean"])
            est = bootstrap_interval(items)
            line["gain"].append(est.mean)
            line["low"].append(est.low)
            line["high"].append(est.high)
            line["top1"].append(float(probe["scores"][row]["mean"]))
            curve["items"][m][b] = items
        curve["methods"][m] = line
    return curve


def curve_differences(curve: Mapping[str, Any], a: str, b: str) -> list[dict[str, float]]:
    """Per budget: gain of method `a` minus that of `b` with a paired bootstrap interval over the test images
    (both probed on the same images): ``[{"step", "mean", "low", "high"}]``."""
    out = []
    for step in curve["budgets"]:
        est = bootstrap_difference(curve["items"][a][step], curve["items"][b][step])
        out.append({"step": step, "mean": est.mean, "low": est.low, "high": est.high})
    return out


def budget_table(curve: Mapping[str, Any], metric: str) -> dict[str, Any]:
    """A ``metrics.json`` table: one row per method, a column ``gain @ <step>`` per budget, with the per-image
    items (so that the plan summary gathers seeds into hierarchical intervals)."""
    values = {m: {f"gain @ {b}": line["gain"][i] for i, b in enumerate(curve["budgets"])}
              for m, line in curve["methods"].items()}
    items = {m: {f"gain @ {b}": curve["items"][m][b] for b in curve["budgets"]} for m in curve["methods"]}
    return {"metric": metric, "values": values, "items": items}


def _fmt(mean: float, low: float, high: float) -> str:
    if low != low or high != high:  # NaN: no interval
        return f"{mean:.1f}"
    return f"{mean:.1f} [{low:.1f}, {high:.1f}]"


def budget_markdown(curve: Mapping[str, Any], pairs: Sequence[tuple[str, str]] = (("MDC", "ARC"),)) -> str:
    """A markdown table: gain [95% interval] per method and budget, then each pair's difference per budget (paired
    bootstrap; a difference whose interval excludes 0 is resolved)."""
    budgets = curve["budgets"]
    lines = ["| method | " + " | ".join(f"gain @ {b} steps" for b in budgets) + " |",
             "|---|" + "---|" * len(budgets)]
    for m, line in curve["methods"].items():
        cells = [_fmt(line["gain"][i], line["low"][i], line["high"][i]) for i in range(len(budgets))]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    for a, b in pairs:
        if a in curve["methods"] and b in curve["methods"]:
            diffs = curve_differences(curve, a, b)
            lines.append(f"| {a} - {b} | " + " | ".join(_fmt(d["mean"], d["low"], d["high"]) for d in diffs) + " |")
    return "\n".join(lines)


def plot_budget_curve(curve: Mapping[str, Any], path: str | Path, title: str = "") -> Path:
    """Budget (steps) on x, chance-corrected probe gain on y, one line per method with its 95% interval band."""
    import matplotlib.pyplot as plt

    from mdc_workbench.eval.figures import save_png

    fig, ax = plt.subplots(figsize=(6, 3.6))
    budgets = curve["budgets"]
    for m, line in curve["methods"].items():
        drawn = ax.plot(budgets, line["gain"], marker="o", label=m)[0]
        ax.fill_between(budgets, line["low"], line["high"], alpha=0.2, color=drawn.get_color())
    ax.set_xlabel("training steps (checkpoints of one run per method)")
    ax.set_ylabel("probe gain over random init (points)")
    ax.set_xticks(budgets)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or "probe gain vs training budget (95% bootstrap intervals, test-set noise)", fontsize=9)
    return save_png(fig, path)


# --- separately annealed budgets: one run per budget (and seed), gathered by the plan summary ------------------------

ANNEALED_TABLE = "budget_annealed"
ANNEALED_BASE = "table1"  # the Table 1 whose annealed runs at other budgets make the curve


def steps_table_name(name: str, steps: int) -> str:
    """Name of table `name` written by a run trained `steps` steps when the plan's reference budget differs:
    ``table1`` -> ``table1_at_1600_steps`` (names that already end in ``_steps`` are kept)."""
    return name if name.endswith("_steps") else f"{name}_at_{int(steps)}_steps"


def annealed_budget_table(gathered: Mapping[str, Mapping[str, Any]], reference_steps: int | None,
                          base: str = ANNEALED_BASE, column: str = "gain") -> dict[str, Any] | None:
    """The annealed budget curve from gathered tables (:func:`mdc_workbench.eval.cells.gather_tables` layout):
    `base` (trained `reference_steps` steps) and ``<base>_at_<N>_steps`` (runs trained N steps, each its own
    cosine schedule), as one gathered table ``{"metric", "cells": {method: {"<N> steps": Cell}}, "runs"}`` of
    each method's `column` cell per budget; None with fewer than two budgets. Cells keep their seeds, so
    intervals and differences are read as for any table (t over seeds)."""
    import re

    pattern = re.compile(rf"^{re.escape(base)}_at_(\d+)_steps$")
    by_steps: dict[int, Mapping[str, Any]] = {}
    if reference_steps is not None and base in gathered:
        by_steps[int(reference_steps)] = gathered[base]
    for name, table in gathered.items():
        match = pattern.match(name)
        if match:
            by_steps[int(match.group(1))] = table
    if len(by_steps) < 2:
        return None
    cells: dict[str, dict[str, Any]] = {}
    runs: list[str] = []
    for steps in sorted(by_steps):
        table = by_steps[steps]
        runs += list(table.get("runs", []))
        for row, cols in table["cells"].items():
            if column in cols and not row.lower().startswith("random"):
                cells.setdefault(row, {})[f"{steps} steps"] = cols[column]
    if not cells:
        return None
    return {"metric": f"probe {column} over random init (points) of separately annealed runs per training budget "
                      "(each budget its own cosine schedule, never a checkpoint of a longer run)",
            "cells": cells, "runs": runs}


def plot_annealed_budget(table: Mapping[str, Any], path: str | Path) -> Path:
    """Each method's gain against its training budget (log-scaled steps) with the 95% interval of every point,
    from :func:`annealed_budget_table`; returns `path`."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.4, 4.2), layout="constrained")
    for i, (method, cols) in enumerate(sorted(table["cells"].items())):
        points = sorted((int(c.split()[0]), cell.estimate()) for c, cell in cols.items())
        xs = [s * (1 + 0.03 * (i - 1)) for s, _ in points]  # a small dodge so intervals do not overlap
        means = [e.mean for _, e in points]
        lows = [e.mean - e.low if e.has_interval else 0.0 for _, e in points]
        highs = [e.high - e.mean if e.has_interval else 0.0 for _, e in points]
        ax.errorbar(xs, means, yerr=[lows, highs], marker="o", capsize=3, label=method)
    ax.set_xscale("log")
    steps = sorted({int(c.split()[0]) for cols in table["cells"].values() for c in cols})
    ax.set_xticks(steps, [str(s) for s in steps])
    ax.minorticks_off()
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("training steps (each point its own annealed run)")
    ax.set_ylabel("probe gain over random init (points)")
    ax.set_title("Training budget: separately annealed runs, 95% intervals over seeds", fontsize=10)
    ax.legend(fontsize=9)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
