"""Probe tables for notebooks and plans: several runs plus the random-init (and optional raw-pixel) rows, per-task
top-1, a mean over the tasks that carry the evidence, and per-test-item scores for bootstrap intervals.

Why the mean leaves background out: a randomly initialised encoder already decodes it perfectly, so it only
dilutes the mean. The other scene labels are partly decodable untrained as well (measured with the converged
probe on the ``tiny`` preset's random-init encoder, 2000 embedded training images, 512 test images: background
100%, count 60%, position 52%, colour 49%, shape 23% top-1), which is why every table has the random-init row:
what training added is the gap to it, per task. :data:`EVIDENCE_TASKS` are averaged by default, and every
probed task is still reported on its own.

The gap is reported as the **gain**: each task's top-1 minus that of the random-init row of the same feature kind
(GAP vs GAP for captioners, CLS vs CLS for CLIP), and their mean over the averaged tasks (the chance-corrected
mean). Raw top-1 means over tasks of 3-9 classes whose untrained scores differ by tens of points; the gain
compares what each objective added, and a CLS model with a GAP one on equal terms.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mdc_workbench.eval.probe_tables import probe_gains, probe_items, probe_scores  # noqa: F401 - the notebooks' names
from mdc_workbench.runs.progress import report, track

EVIDENCE_TASKS = ("shape", "colour", "count", "position")  # averaged into "mean" by default (module docstring)
HELDOUT_SEED_OFFSET = 1000  # a held-out probe set is the embedded generator at data seed + this


def heldout_probe_set(data_dir: str | Path, *, n_train: int, n_eval: int, captions: str, image_size: int,
                      seed: int, difficulty: str) -> Path:
    """A labelled probe set of images no model was pretrained on: the embedded generator with the settings of
    `data_dir` but data seed ``seed + 1000``, written beside it as ``<data_dir>_probe`` (reused when its
    manifest matches). `n_train` images train the probe, `n_eval` per val/test split score it."""
    from mdc_workbench.notebooks import notebook as wb

    root = Path(f"{wb.project_path(data_dir)}_probe")
    wb.ensure_dataset(root, n_train, captions=captions, image_size=image_size, seed=seed + HELDOUT_SEED_OFFSET,
                      n_eval=n_eval, difficulty=difficulty)
    return root


def probe_models(runs: Mapping[str, str | Path], data: str | Path, *, tasks: Sequence[str],
                 mean_tasks: Sequence[str] = EVIDENCE_TASKS, baselines: Sequence[str] = ("random",),
                 features: Mapping[str, Any] | None = None, **probe_kwargs: Any) -> dict[str, Any]:
    """Probe each named run on `data`, then the baselines: ``random`` = the first run of each feature kind
    (GAP for captioners, CLS for CLIP) with its architecture untrained (row ``random init``, or ``random init
    (CLS)`` etc. when the runs mix kinds); ``pixels`` = the raw pixels (row ``raw pixels``).

    Returns ``{"scores": {row: {task: %, "mean": %}}, "items": {row: [% per test image]}, "results": {row:
    probe_run result}}``. Only `tasks` and `mean_tasks` are probed; `features` ({run name: probe_run's
    ``features``}) gives runs their features computed elsewhere (a seed stack's members:
    :func:`mdc_workbench.notebooks.seed_members.probe_members`); `probe_kwargs` go to
    :func:`~mdc_workbench.eval.probe_data.probe_run`.
    Progress is reported to the batch runner (:mod:`mdc_workbench.runs.progress`).
    """
    from mdc_workbench.eval.probe_data import probe_run

    results: dict[str, dict[str, Any]] = {}
    needed = list(dict.fromkeys([*tasks, *mean_tasks]))
    for name, run in track(runs.items(), "probe"):
        results[name] = probe_run(run, data, task=needed, features=(features or {}).get(name), **probe_kwargs)
    pools = {r["pool"] for r in results.values()}
    done: set[str] = set()
    if "random" in baselines:
        for name, run in runs.items():
            pool = results[name]["pool"]
            if pool in done:
                continue
            done.add(pool)
            label = "random init" if len(pools) == 1 else f"random init ({pool.upper()})"
            report(stage=f"probe {label}")
            results[label] = probe_run(run, data, task=needed, init="random", **probe_kwargs)
    if "pixels" in baselines:
        report(stage="probe raw pixels")
        results["raw pixels"] = probe_run(next(iter(runs.values())), data, task=needed, init="pixels",
                                          **probe_kwargs)
    scores = {k: probe_scores(r, tasks, mean_tasks) for k, r in results.items()}
    items = {k: probe_items(r, mean_tasks) for k, r in results.items()}
    gains, gain_items = probe_gains(results, scores, mean_tasks)
    return {"scores": scores, "items": items, "gains": gains, "gain_items": gain_items, "results": results}


def probe_table(probe: dict[str, Any], rows: Sequence[str], metric: str,
                rename: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A paper table for ``metrics.json`` from a :func:`probe_models` result: each of `rows` (renamed by
    `rename`, e.g. ``{"[0.5, 1.0]": "MDC"}``) with columns ``top-1`` (mean probe top-1 %), ``gain`` (the
    chance-corrected mean: the mean gain over the random-init row of its kind, :func:`probe_gains`) and ``gain
    TASK`` per averaged task, each with its per-test-image scores. Rows without a matching random-init row have
    ``top-1`` only."""
    rename = rename or {}
    gains, gain_items = probe.get("gains", {}), probe.get("gain_items", {})
    values: dict[str, dict[str, float]] = {}
    items: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        name = rename.get(r, r)
        values[name] = {"top-1": probe["scores"][r]["mean"]}
        items[name] = {"top-1": probe["items"][r]}
        if r in gains:
            tasks = [t for t in gains[r] if t != "mean"]
            values[name]["gain"] = gains[r]["mean"]
            items[name]["gain"] = gain_items[r]["mean"]
            values[name].update({f"gain {t}": gains[r][t] for t in tasks})
            items[name].update({f"gain {t}": gain_items[r][t] for t in tasks})
    return {"metric": metric, "values": values, "items": items}


def probe_budget_curve(runs: Mapping[str, str | Path], data: str | Path, *, budgets: Sequence[int],
                       tasks: Sequence[str], mean_tasks: Sequence[str], **probe_kwargs: Any) -> dict[str, Any]:
    """Probe each run of `runs` ({method: run folder}) at every checkpoint step of `budgets` on `data`; returns
    :func:`mdc_workbench.eval.budget_curve.curve_from_probe`'s result. `probe_kwargs` go to
    :func:`~mdc_workbench.eval.probe_data.probe_run`."""
    from mdc_workbench.eval.budget_curve import check_budgets, checkpoint_at, curve_from_probe, row_name

    budgets = check_budgets(budgets, max(budgets, default=0))
    ckpts = {row_name(m, b): checkpoint_at(run, b) for m, run in runs.items() for b in budgets}
    probe = probe_models(ckpts, data, tasks=tasks, mean_tasks=mean_tasks, **probe_kwargs)
    return curve_from_probe(probe, list(runs), list(budgets))
