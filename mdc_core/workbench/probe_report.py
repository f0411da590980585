"""Probe tables for notebooks and plans: several runs plus the random-init (and optional raw-pixel) rows, per-task
top-1, a mean over the tasks that carry the evidence, and per-test-item scores for bootstrap intervals.

Why the mean leaves background out: a randomly initialised encoder already decodes it perfectly, so it only
dilutes the mean. The other scene labels are partly decodable untrained as well (measured with the converged
probe on the ``tiny`` preset's random-init encoder, 2000 embedded training images, 512 test images: background
100%, count 60%, position 52%, colour 49%, shape 23% top-1), which is why every table has the random-init row:
what training added is the gap to it, per task. :data:`EVIDENCE_TASKS` are averaged by default, and every
probed task is still reported on its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mdc_core.workbench.progress import report, track

EVIDENCE_TASKS = ("shape", "colour", "count", "position")  # averaged into "mean" by default (module docstring)


def probe_scores(result: dict[str, Any], tasks: Sequence[str], mean_tasks: Sequence[str]) -> dict[str, float]:
    """Top-1 % per task (`tasks`, then any of `mean_tasks` not among them) of a
    :func:`~mdc_core.eval.probe_data.probe_run` result, plus ``mean`` over `mean_tasks`."""
    missing = [t for t in [*tasks, *mean_tasks] if t not in result["tasks"]]
    if missing:
        raise ValueError(f"tasks {missing} were not probed; probed: {', '.join(result['tasks'])}")
    per_task = {t: 100.0 * result["tasks"][t]["top1"] for t in dict.fromkeys([*tasks, *mean_tasks])}
    return {**per_task, "mean": sum(100.0 * result["tasks"][t]["top1"] for t in mean_tasks) / len(mean_tasks)}


def probe_items(result: dict[str, Any], mean_tasks: Sequence[str]) -> list[float]:
    """Per test image: 100 x the fraction of `mean_tasks` it is classified right on (their mean is the ``mean``
    of :func:`probe_scores`); all tasks score the same test images in the same order."""
    columns = [result["tasks"][t]["test_correct"] for t in mean_tasks]
    if len({len(c) for c in columns}) != 1:
        raise ValueError("the tasks were scored on different test sets; per-item scores need the same images")
    return [100.0 * sum(vals) / len(vals) for vals in zip(*columns, strict=True)]


def probe_models(runs: Mapping[str, str | Path], data: str | Path, *, tasks: Sequence[str],
                 mean_tasks: Sequence[str] = EVIDENCE_TASKS, baselines: Sequence[str] = ("random",),
                 **probe_kwargs: Any) -> dict[str, Any]:
    """Probe each named run on `data`, then the baselines: ``random`` = the first run of each feature kind
    (GAP for captioners, CLS for CLIP) with its architecture untrained (row ``random init``, or ``random init
    (CLS)`` etc. when the runs mix kinds); ``pixels`` = the raw pixels (row ``raw pixels``).

    Returns ``{"scores": {row: {task: %, "mean": %}}, "items": {row: [% per test image]}, "results": {row:
    probe_run result}}``. Only `tasks` and `mean_tasks` are probed; `probe_kwargs` go to
    :func:`~mdc_core.eval.probe_data.probe_run`.
    Progress is reported to the batch runner (:mod:`mdc_core.workbench.progress`).
    """
    from mdc_core.eval.probe_data import probe_run

    results: dict[str, dict[str, Any]] = {}
    needed = list(dict.fromkeys([*tasks, *mean_tasks]))
    for name, run in track(runs.items(), "probe"):
        results[name] = probe_run(run, data, task=needed, **probe_kwargs)
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
    return {"scores": {k: probe_scores(r, tasks, mean_tasks) for k, r in results.items()},
            "items": {k: probe_items(r, mean_tasks) for k, r in results.items()}, "results": results}


def probe_table(probe: dict[str, Any], rows: Sequence[str], metric: str,
                rename: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A paper table for ``metrics.json`` from a :func:`probe_models` result: each of `rows` (renamed by
    `rename`, e.g. ``{"[0.5, 1.0]": "MDC"}``) with its mean probe top-1 % and per-test-image scores."""
    rename = rename or {}
    return {"metric": metric, "values": {rename.get(r, r): probe["scores"][r]["mean"] for r in rows},
            "items": {rename.get(r, r): probe["items"][r] for r in rows}}
