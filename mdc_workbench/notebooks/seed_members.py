"""Notebook 03 as a seed stack: every model of the notebook trained for all of its ``train_seeds`` at once, and every
member evaluated as the solo run of its seed is (plans with ``members:``, :mod:`mdc_workbench.runs.members`).

:func:`stack_cached` is :func:`~mdc_workbench.notebooks.notebook.train_cached` for K seeds of one config: the seeds
whose model the cache lacks are trained as one seed stack (:func:`mdc_workbench.seed_stack.train.train_stack`; on
the CPU the members are their solo runs to the bit, on a GPU up to rounding) and each member's run folder is then
moved to the cache folder of its seed's solo run, so the notebook's solo cells (and any later solo run of that seed)
reuse it. :func:`probe_members` probes every member on features read in one pass over the images for all of them
(:func:`mdc_workbench.seed_stack.features.stacked_features`); :func:`central_members` scores the central claim of
all members on one read of the captions (:func:`mdc_workbench.seed_stack.claim.central_claim_members`); the feature
orders are probed per member with the solo probe (:func:`order_members`). :func:`member_records` builds each
member's tables and metrics as the solo notebook does (:func:`run_metrics`) and writes its per-item file in
``<output_dir>/seed_<seed>/items.npz`` (:func:`mdc_workbench.seed_stack.items.write_member_items`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mdc_core.config import RunConfig

STACK_OFF = ("budgets", "parity", "extra_probe_data")  # notebook 03's parameters a seed stack does not measure


def check_stack(train_seeds: Sequence[int], **solo_only: Any) -> list[int]:
    """`train_seeds` as distinct non-negative integers; ValueError naming a parameter of :data:`STACK_OFF` that is
    set (`solo_only`: their values) or a bad seed list."""
    seeds = list(train_seeds)
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds) or \
            len(set(seeds)) != len(seeds):
        raise ValueError(f"train_seeds={seeds!r}: a seed stack needs distinct non-negative integer seeds")
    on = [name for name in STACK_OFF if solo_only.get(name)]
    if on:
        raise ValueError(f"train_seeds (a seed stack) measures Table 1, the central claim and the feature orders; "
                         f"{', '.join(on)} run per solo seed: drop them or give the entry `seeds` without `members`")
    return seeds


def stack_cached(cfg: RunConfig, seeds: Sequence[int], models_dir: str | Path) -> dict[int, Path]:
    """``{seed: run folder}`` of `cfg` trained with each of `seeds` (``train.seed``), in the model cache: finished
    runs are reused, a partly trained one goes on alone (:func:`~mdc_workbench.notebooks.notebook.train_cached`),
    and the others are trained as one seed stack in ``<models_dir>/<objective>-<key>-stack-<seeds>`` (resumed
    there after an interruption), their folders then moved to their solo cache folders."""
    from mdc_core.checkpoint import latest_checkpoint
    from mdc_workbench.notebooks import notebook as wb
    from mdc_workbench.runs.progress import watch_training
    from mdc_workbench.seed_stack import member_config
    from mdc_workbench.seed_stack.train import member_dir, train_stack

    runs = {s: wb.cached_run_dir(models_dir, member_config(cfg, s)) for s in seeds}
    todo = [s for s in seeds if not wb._finished(runs[s], cfg.train.steps)]
    for s in seeds:
        if s not in todo:
            print(f"reusing the trained run {runs[s].name} (seed {s}) in {models_dir}")
        elif runs[s].exists():  # a solo run of this seed was started: it goes on as it was
            wb.train_cached(member_config(cfg, s), models_dir)
    stacked = [s for s in todo if not runs[s].exists()]
    if not stacked:
        return runs
    name = f"{cfg.objective.name}-{wb.config_key(member_config(cfg, 0))}-stack-{'-'.join(map(str, stacked))}"
    folder = wb.project_path(models_dir) / name
    with wb.cache_lock(folder, f"the seed stack {name}"):
        resume = any(latest_checkpoint(member_dir(folder, s)) is not None for s in stacked if member_dir(
            folder, s).is_dir())
        if folder.exists() and not resume:  # stopped before its first checkpoint: start it over
            shutil.rmtree(folder)
        print(f"{'resuming' if resume else 'training'} {cfg.objective.name} for seeds {stacked} as one seed stack "
              f"in {wb.checkout_relative(folder)}")
        with watch_training(member_dir(folder, stacked[0]), cfg.train.steps):
            train_stack(cfg, folder, seeds=stacked, resume=resume, progress=False)
        for s in stacked:
            if runs[s].exists():
                raise FileExistsError(f"{runs[s]} appeared while the seed stack {name} trained seed {s}; its "
                                      f"member is kept in {member_dir(folder, s)}")
            os.replace(member_dir(folder, s), runs[s])
        folder.rmdir()
    return runs


def member_features(runs: Sequence[str | Path], data: str | Path, *, limit: int | None = None,
                    device: str = "cpu", batch_size: int = 64) -> list[dict[str, Any]]:
    """Each run's frozen features of `data`'s train and test splits, one pass over each split's images for all of
    them (:func:`~mdc_workbench.seed_stack.features.stacked_features`): ``[{"train": (features, labels), "test":
    ...}]``, what :func:`~mdc_workbench.eval.probe_data.probe_run` takes as ``features``. The runs are the members
    of one stack: one objective (one pooling) and one image size, else ValueError."""
    from mdc_core.checkpoint import resolve_checkpoint
    from mdc_core.factory import load_model
    from mdc_workbench.eval.probe_data import open_probe_dataset
    from mdc_workbench.eval.probe_pool import probe_pool
    from mdc_workbench.seed_stack.features import stacked_features

    loaded = [load_model(resolve_checkpoint(run), device=device) for run in runs]  # as probe_run loads them
    kinds = {(cfg.objective.name, cfg.model.image_size) for _, cfg in loaded}
    if len(kinds) != 1:
        raise ValueError(f"the members {[str(r) for r in runs]} differ in objective or image size: not one stack")
    objective, image_size = kinds.pop()
    out: list[dict[str, Any]] = [{} for _ in runs]
    train = open_probe_dataset(data, "train", limit=limit)
    for split in (train, open_probe_dataset(data, "test", train.format, limit)):
        feats, labels = stacked_features([m for m, _ in loaded], split, pool=probe_pool(objective),
                                         image_size=image_size, batch_size=batch_size, device=device)
        for k in range(len(runs)):
            out[k][split.split] = (feats[k], labels)
    return out


def probe_members(stacked: Mapping[str, Mapping[int, str | Path]], data: str | Path, *, tasks: Sequence[str],
                  mean_tasks: Sequence[str], baselines: Sequence[str] = ("random",), device: str = "cpu",
                  limit: int | None = None, **probe_kwargs: Any) -> dict[int, dict[str, Any]]:
    """``{seed: probe_models result}`` of every member: `stacked` is ``{row: {seed: run folder}}`` (each row's
    members, e.g. ARC's and MDC's, from :func:`stack_cached`); each row's members' features come from one pass
    over the images (:func:`member_features`), then each member's probes and baseline rows are its solo run's
    (:func:`~mdc_workbench.notebooks.probe_report.probe_models`)."""
    from mdc_workbench.notebooks.probe_report import probe_models
    from mdc_workbench.runs.progress import track

    seeds = list(next(iter(stacked.values()))) if stacked else []
    given: dict[int, dict[str, Any]] = {s: {} for s in seeds}
    for row, members in track(stacked.items(), "stacked features"):
        for s, feats in zip(members, member_features(list(members.values()), data, limit=limit, device=device),
                            strict=True):
            given[s][row] = feats
    return {s: probe_models({row: stacked[row][s] for row in stacked}, data, tasks=tasks, mean_tasks=mean_tasks,
                            baselines=baselines, features=given[s], device=device, limit=limit, **probe_kwargs)
            for s in seeds}


def central_members(pairs: Mapping[int, Mapping[str, Sequence[str | Path]]], data: Mapping[str, str | Path],
                    **claim_kwargs: Any) -> dict[int, dict[str, Any]]:
    """``{seed: central_claim_runs result}``: each member's ARC + MDC pair per caption kind (`pairs`: ``{seed:
    {kind: [runs]}}``) scored as its solo run's, every objective's members on one read of each kind's captions
    (:func:`mdc_workbench.seed_stack.claim.central_claim_members`, with `claim_kwargs`: the solo
    :func:`~mdc_workbench.eval.central_claim.central_claim_runs`' keywords; on the CPU each member's scores are its
    solo run's to the bit)."""
    from mdc_workbench.seed_stack.claim import central_claim_members

    seeds = list(pairs)
    stacks = {kind: [[pairs[s][kind][i] for s in seeds] for i in range(len(pairs[seeds[0]][kind]))] for kind in data}
    return dict(zip(seeds, central_claim_members(stacks, dict(data), **claim_kwargs), strict=True))


def order_members(pairs: Mapping[int, Mapping[str, Sequence[str | Path]]], orders: Sequence[str],
                  probe_set: str | Path, labels: Mapping[str, str], **probe_kwargs: Any
                  ) -> dict[int, dict[str, dict[str, Any]]]:
    """``{seed: {order: {row: probe_run result}}}``: each member's ARC and MDC of each caption order (`pairs`:
    ``{seed: {order: [arc run, mdc run]}}``) probed for shape and colour on `probe_set`, as the solo notebook
    probes them; each (order, objective)'s members read the images once (:func:`member_features`)."""
    from mdc_workbench.eval.probe_data import probe_run

    seeds = list(pairs)
    out: dict[int, dict[str, dict[str, Any]]] = {s: {} for s in seeds}
    for order in orders:
        for i, objective in enumerate(("arc", "mdc")):
            runs = [pairs[s][order][i] for s in seeds]
            feats = member_features(runs, probe_set, limit=probe_kwargs.get("limit"),
                                    device=probe_kwargs.get("device", "cpu"))
            for s, run, given in zip(seeds, runs, feats, strict=True):
                out[s].setdefault(order, {})[labels[objective]] = probe_run(
                    run, probe_set, task=["shape", "colour"], heldout=True, features=given, **probe_kwargs)
    return out


def run_metrics(scores: Mapping[str, Mapping[str, float]], gains: Mapping[str, Mapping[str, float]],
                tables: Mapping[str, Mapping[str, Any]], tasks: Sequence[str]) -> dict[str, float]:
    """Notebook 03's flat metrics of one run: each row's mean probe top-1 and gain, its top-1 per task, and every
    value of its central-claim and feature-order tables (``<table>/<row>/<column>``)."""
    metrics = {f"probe/{k}": v["mean"] for k, v in scores.items()}
    metrics.update({f"probe_gain/{k}": v["mean"] for k, v in gains.items()})
    metrics.update({f"probe/{k}/{t}": v[t] for k, v in scores.items() for t in tasks})
    metrics.update({f"{name}/{row}/{col}": v for name in ("central_claim", "feature_order") if name in tables
                    for row, cols in tables[name]["values"].items() for col, v in cols.items()})
    return metrics


def member_records(out: str | Path, seeds: Sequence[int], *, probes: Mapping[int, Any] | None = None,
                   scored: Mapping[int, Any] | None = None, orders: Mapping[int, Any] | None = None,
                   table1_name: str = "table1", metric: str = "", tasks: Sequence[str] = (),
                   mean_tasks: Sequence[str] = (), extra: Mapping[str, Any] | None = None
                   ) -> dict[str, dict[str, Any]]:
    """metrics.json's ``members`` (:mod:`mdc_workbench.runs.members`): per seed the tables and metrics its solo run
    writes (Table 1 from `probes`, then `extra` tables shared by every member, e.g. the learning-rate sweep, the
    central claim from `scored`, the feature orders from `orders`), and its per-item file written as
    ``<out>/seed_<seed>/items.npz`` (run id ``<run>/seed=<seed>``, as the summary names a member)."""
    from mdc_workbench.eval.central_claim import claim_table, connector_ids, feature_order_table
    from mdc_workbench.notebooks.probe_report import probe_table
    from mdc_workbench.seed_stack.items import write_member_items

    out = Path(out)
    members: dict[str, dict[str, Any]] = {}
    for s in seeds:
        probe = (probes or {}).get(s)
        rows = list(probe["scores"]) if probe else []
        tables = {table1_name: probe_table(probe, rows, metric)} if probe else {}
        tables.update(extra or {})
        if scored:
            tables["central_claim"] = claim_table(scored[s], connector_ids())
        if orders:
            tables["feature_order"] = feature_order_table(orders[s])
        metrics = run_metrics(probe["scores"] if probe else {}, probe["gains"] if probe else {}, tables, tasks)
        members[str(s)] = {"metrics": metrics, "tables": tables, "train_seed": s}
    first = (probes or {}).get(seeds[0]) if seeds else None
    write_member_items(out, seeds, probes=[probes[s] for s in seeds] if probes else None,
                       orders=[orders[s] for s in seeds] if orders else None,
                       scored=[scored[s] for s in seeds] if scored else None, probe_table_name=table1_name,
                       metric=metric, rows=list(first["scores"]) if first else [], tasks=tasks, mean_tasks=mean_tasks)
    return members
