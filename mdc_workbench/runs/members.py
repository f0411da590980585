"""Plans with seed stacks: a plan entry's ``members: K`` trains its seeds K at a time in one notebook run.

An entry with ``members: K`` (and ``seeds``, its own or the plan's) runs its notebook once per stack of K seeds
(the last stack holds the rest), with the notebook's :data:`MEMBERS_PARAM` parameter set to the stack's seeds and
the run id ending in ``__seeds=3-5-8``; the notebook trains them as one seed stack
(:func:`mdc_workbench.seed_stack.train.train_stack`) and writes each member's results under ``members`` in its
``metrics.json``::

    {"notebook": "...", "members": {"3": {"metrics": {...}, "tables": {...}}, "5": {...}, "8": {...}}}

and each member's per-item file as ``<run>/seed_<seed>/items.npz`` (run id ``<run>/seed=<seed>``; notebook 03 with
``train_seeds``: :mod:`mdc_workbench.notebooks.seed_members`). The summary gathers each member as the run of its seed
(:func:`expand_members`): a table row measured on a stack of K members is K seeds, as K solo runs would give it, and
``mdc recompute`` finds the members' per-item files. Torch-free.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from mdc_workbench.eval.items import member_run_id
from mdc_workbench.runs.evidence import SEED_PARAM

MEMBERS_PARAM = "train_seeds"  # the notebook parameter a plan entry's `members` sets: the seeds of one stack


def member_stacks(seeds: Sequence[int], members: Any, where: str) -> list[list[int]]:
    """`seeds` in stacks of `members` (the last holds the rest); ValueError naming `where` for a count that is not
    a positive integer."""
    if isinstance(members, bool) or not isinstance(members, int) or members < 1:
        raise ValueError(f"{where}.members must be a positive integer (seeds trained at once), got {members!r}")
    return [list(seeds[i:i + members]) for i in range(0, len(seeds), members)]


def expand_members(runs: Iterable[tuple[str, dict[str, Any], dict[str, Any]]]
                   ) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """``[(run id, parameters, metrics.json)]`` with every stacked run (a ``members`` mapping in its metrics) replaced
    by one entry per member: run id ``<run>/seed=<seed>``, the run's parameters with :data:`SEED_PARAM` the member's
    seed (instead of the stack's :data:`MEMBERS_PARAM`), and the member's own metrics. A member whose key is not an
    integer seed is left out with a note."""
    out = []
    for run_id, params, metrics in runs:
        members = metrics.get("members") if isinstance(metrics, dict) else None
        if not isinstance(members, dict):
            out.append((run_id, params, metrics))
            continue
        shared = {k: v for k, v in params.items() if k != MEMBERS_PARAM}
        for key, own in members.items():
            try:
                seed = int(key)
            except (TypeError, ValueError):
                print(f"{run_id}: member {key!r} of metrics.json is not an integer seed; left out of the summary")
                continue
            own = own if isinstance(own, dict) else {}
            out.append((member_run_id(run_id, seed), {**shared, SEED_PARAM: seed}, own))
    return out
