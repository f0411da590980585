"""A seed stack's per-item files: each member's ``items.npz`` as its solo run writes it (issue 63, item 3).

:func:`write_member_items` writes member k's probe table, feature-order probes and central-claim scores with the
solo writer (:func:`mdc_workbench.eval.items.write_run_items`) into ``<run folder>/seed_<seed>/items.npz``, under
the run id the summary gives the member (:func:`mdc_workbench.eval.items.member_run_id`, ``<run>/seed=<seed>``)
and the member's seed, so ``mdc recompute`` and the summary read each member as the run of its seed. The files'
records are the solo run's own: only the run id differs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mdc_workbench.eval.items import member_run_id, write_run_items

from .train import member_dir


def write_member_items(folder: str | Path, seeds: Sequence[int], *, probes: Sequence[Mapping[str, Any]] | None = None,
                       orders: Sequence[Mapping[str, Mapping[str, Mapping[str, Any]]]] | None = None,
                       scored: Sequence[Mapping[str, Mapping[str, Any]]] | None = None, **table: Any
                       ) -> list[Path | None]:
    """Member k's per-item file from its own results, for every member of the stack run in `folder` (the stacked
    notebook's output folder): `probes[k]` a ``probe_models`` result, `orders[k]` the feature-order probes,
    `scored[k]` the central claim's scores (e.g. :func:`~mdc_workbench.seed_stack.claim.central_claim_members`'
    k-th); `table`: ``write_run_items``' shared keywords (``probe_table_name``, ``metric``, ``rows``, ``tasks``,
    ``mean_tasks``). Returns each member's path (None where it measured nothing). ValueError when a list does not
    hold one entry per seed."""
    seeds = [int(s) for s in seeds]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"a stack's members need distinct seeds; got {seeds}")
    for name, per in (("probes", probes), ("orders", orders), ("scored", scored)):
        if per is not None and len(per) != len(seeds):
            raise ValueError(f"{name}: {len(per)} results for {len(seeds)} members; give one per member")
    folder = Path(folder)
    return [write_run_items(member_dir(folder, s), s, probe=probes[k] if probes else None,
                            orders=orders[k] if orders else None, scored=scored[k] if scored else None,
                            run_id=member_run_id(folder.name, s), **table)
            for k, s in enumerate(seeds)]
