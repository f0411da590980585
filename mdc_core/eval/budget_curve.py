"""Training-budget curves: the probe's chance-corrected gain of each method at several training budgets, read from
the checkpoints of one long run per method, so that an ordering (e.g. MDC vs ARC) is seen as a function of
training rather than at one point.

A run trained for the longest budget with ``train.ckpt_every`` dividing every budget and ``train.keep_last`` at
least the number of budgets keeps one checkpoint per budget (``RUN/checkpoints/step_N``). Every checkpoint is
probed like a Table 1 row (:func:`mdc_core.workbench.probe_report.probe_budget_curve` runs the probes, with the
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

from mdc_core.eval.stats import bootstrap_difference, bootstrap_interval

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
    """The curve of a :func:`~mdc_core.workbench.probe_report.probe_models` result whose rows are
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

    from mdc_core.eval.figures import save_png

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
