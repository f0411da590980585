"""Power before the run, mechanically: a plan that decides a claim declares its effect or margin and the variance of
earlier runs, and ``mdc runs`` computes the seeds it needs for 80% power before anything runs (torch-free).

A plan's ``decides`` list (:func:`read_decides`)::

    decides:
      - claim: table1                    # a key of PAPER_CLAIMS
        relation: noninferior            # > | < | noninferior | equivalent (the claim's deciding part)
        margin: 1.08                     # points: noninferior and equivalent; > and < declare `effect` instead
        true_difference: 0               # optional: the difference assumed true (default: the effect, or 0)
        per_seed: [-2.78, -3.37, -2.44, 2.20, -1.86]   # earlier runs' per-seed differences (or `components`)
        from: cpu_table1_1600 (2026-11-29), MDC - ARC probe top-1   # which runs those are
        items: 512                       # optional: test items each seed scores (default: the plan's n_eval)
        minutes_per_seed: 28.4           # optional: core-minutes one seed of this plan takes (for the minutes needed)

``per_seed`` gives the budget by :func:`~mdc_workbench.eval.variance.seed_components` (every source of spread counted
as the seed's); ``components`` (``{seed: .., item: .., seed_item: .., fit: .., residual: ..}``, points squared,
e.g. from :func:`~mdc_workbench.eval.variance.items_budget` of earlier per-item files) gives it directly.
:func:`check` computes, per declared claim, the power of the plan's own design (its seeds, its items) and the
fewest seeds that reach 80% (:func:`mdc_workbench.eval.power.power`); ``mdc runs`` prints that and refuses to start a
plan whose seeds fall short unless ``--underpowered-ok``, and the runner keeps what it found in ``power.json`` in the
plan folder, which the summary states (:func:`summary_lines`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mdc_workbench.eval.power import MAX_SEEDS, Design, _min_seeds, power
from mdc_workbench.eval.stats import POWER, RELATIONS
from mdc_workbench.eval.variance import COMPONENTS, Components, seed_components

POWER_FILE = "power.json"  # in the plan folder: the power check of the plan's last start
DECIDE_KEYS = ("claim", "relation", "effect", "margin", "true_difference", "per_seed", "components", "from", "items",
               "minutes_per_seed")


@dataclass(frozen=True)
class Decision:
    """One claim a plan decides, declared with its test and the variance of earlier runs."""

    claim: str
    relation: str
    variance: Components  # of the difference the claim's deciding part reads, per seed (points squared)
    source: str  # which earlier runs the variance comes from
    effect: float | None = None
    margin: float = 0.0
    true_difference: float | None = None
    items: int | None = None  # test items per seed (None: the plan's n_eval)
    minutes_per_seed: float | None = None


@dataclass(frozen=True)
class PowerCheck:
    """What :func:`check` found for one decision under the plan's design."""

    claim: str
    relation: str
    seeds: int  # the plan's training seeds
    items: int
    power: float  # of the plan's design (0 with fewer than 2 seeds: one seed decides nothing)
    seeds_needed: int | None  # the fewest seeds for 80% power with these items (None: more than MAX_SEEDS)
    minutes_needed: float | None  # seeds_needed x minutes_per_seed, when declared
    source: str

    @property
    def enough(self) -> bool:
        return self.seeds_needed is not None and self.seeds >= self.seeds_needed

    def text(self) -> str:
        need = (f"more than {MAX_SEEDS} seeds" if self.seeds_needed is None else
                f"{self.seeds_needed} seeds" + ("" if self.minutes_needed is None else
                                                f" (~{self.minutes_needed:.0f} core-minutes)"))
        verdict = "enough" if self.enough else "UNDERPOWERED"
        return (f"`{self.claim}` ({self.relation}): {self.seeds} seeds x {self.items} test items give "
                f"{100 * self.power:.0f}% power; {POWER:.0%} needs {need} [{verdict}] (variance from {self.source})")


def _number(value: Any, where: str, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (positive and not value > 0):
        raise ValueError(f"{where} must be a {'positive ' if positive else ''}number, got {value!r}")
    return float(value)


def read_decides(value: Any, where: str) -> list[Decision]:
    """The plan's ``decides`` list checked (module docstring); one-line errors naming the entry and key."""
    from mdc_workbench.eval.paper import PAPER_CLAIMS

    if value is None:
        return []
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where} must be a non-empty list of declared claims")
    out = []
    for n, entry in enumerate(value):
        at = f"{where}[{n}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{at} must be a mapping with claim, relation, margin or effect, per_seed or components")
        unknown = sorted(set(entry) - set(DECIDE_KEYS))
        if unknown:
            raise ValueError(f"{at}: unknown key(s) {unknown}; allowed: {', '.join(DECIDE_KEYS)}")
        claim, relation = entry.get("claim"), entry.get("relation")
        if claim not in {c.key for c in PAPER_CLAIMS}:
            raise ValueError(f"{at}: claim {claim!r} is not a key of PAPER_CLAIMS (mdc_workbench/eval/paper.py)")
        if relation not in RELATIONS:
            raise ValueError(f"{at}: relation must be one of {RELATIONS}, got {relation!r}")
        if relation in (">", "<"):
            effect, margin = _number(entry.get("effect"), f"{at}.effect", positive=True), 0.0
        else:
            effect, margin = None, _number(entry.get("margin"), f"{at}.margin", positive=True)
        if not str(entry.get("from") or "").strip():
            raise ValueError(f"{at}: 'from' must name the earlier runs the variance comes from")
        if ("per_seed" in entry) == ("components" in entry):
            raise ValueError(f"{at}: give the variance of earlier runs as exactly one of per_seed, components")
        if "per_seed" in entry:
            per_seed = entry["per_seed"]
            if not isinstance(per_seed, list):
                raise ValueError(f"{at}.per_seed must be a list of per-seed differences, got {per_seed!r}")
            variance = seed_components([_number(v, f"{at}.per_seed") for v in per_seed])
        else:
            comps = entry["components"]
            if not isinstance(comps, dict) or not set(comps) <= set(COMPONENTS) or "seed" not in comps:
                raise ValueError(f"{at}.components must map {', '.join(COMPONENTS)} (seed required) to variances")
            vals = {k: _number(comps.get(k, 0.0), f"{at}.components.{k}") for k in COMPONENTS}
            if min(vals.values()) < 0:
                raise ValueError(f"{at}.components: variances must be >= 0, got {vals}")
            variance = Components(0.0, *(vals[k] for k in COMPONENTS), n_seeds=2, n_items=1, n_fits=1,
                                  method="declared components")
        items = entry.get("items")
        minutes = entry.get("minutes_per_seed")
        out.append(Decision(
            claim=str(claim), relation=str(relation), variance=variance, source=str(entry["from"]).strip(),
            effect=effect, margin=margin,
            true_difference=None if entry.get("true_difference") is None else _number(
                entry["true_difference"], f"{at}.true_difference"),
            items=None if items is None else int(_number(items, f"{at}.items", positive=True)),
            minutes_per_seed=None if minutes is None else _number(minutes, f"{at}.minutes_per_seed", positive=True)))
    return out


def check(decisions: list[Decision], seeds: int, n_eval: int | None) -> list[PowerCheck]:
    """The power of a design of `seeds` training seeds (and `n_eval` test items, unless a decision names its own)
    for each decision, and the fewest seeds reaching 80% (:data:`~mdc_workbench.eval.stats.POWER`)."""
    out = []
    for d in decisions:
        items = d.items or n_eval or 1
        kw = {"effect": d.effect, "margin": d.margin, "true_difference": d.true_difference}
        p = power(d.variance, Design(seeds, items), d.relation, **kw) if seeds >= 2 else 0.0
        need = _min_seeds(d.variance, items, 1, True, d.relation, kw, POWER, MAX_SEEDS)
        minutes = None if need is None or d.minutes_per_seed is None else need * d.minutes_per_seed
        out.append(PowerCheck(d.claim, d.relation, seeds, items, p, need, minutes, d.source))
    return out


def refusal(checks: list[PowerCheck]) -> str | None:
    """The one-line reason ``mdc runs`` refuses to start the plan (None when every decision has its seeds)."""
    short = [c for c in checks if not c.enough]
    if not short:
        return None
    return ("the plan's seeds fall short of 80% power for " + "; ".join(
        f"{c.claim} ({c.seeds} seeds, {100 * c.power:.0f}%; needs "
        f"{c.seeds_needed if c.seeds_needed is not None else f'more than {MAX_SEEDS}'})" for c in short)
        + ": add seeds, or start it anyway with --underpowered-ok (its summary then says so)")


def record(out: Path, checks: list[PowerCheck], underpowered_ok: bool) -> None:
    """Write `out`/power.json: the checks of this start and whether it was started underpowered on purpose (a plan
    that declares nothing: no file, and an earlier one is removed)."""
    if not checks:
        (out / POWER_FILE).unlink(missing_ok=True)
        return
    out.mkdir(parents=True, exist_ok=True)
    (out / POWER_FILE).write_text(json.dumps({"underpowered_ok": underpowered_ok,
                                              "checks": [asdict(c) for c in checks]}, indent=2) + "\n")


def summary_lines(out: Path) -> list[str]:
    """The summary's lines on power: each declared claim's check, and when the plan was started short of its
    seeds with ``--underpowered-ok``, a bold line saying so. [] when the plan declares nothing."""
    path = out / POWER_FILE
    if not path.is_file():
        return []
    rec = json.loads(path.read_text())
    checks = [PowerCheck(**c) for c in rec.get("checks", [])]
    if not checks:
        return []
    lines = ["Power before the run (`power.json`; docs/evidence.md, \"Power before the run\"):", "",
             *(f"- {c.text()}" for c in checks), ""]
    if rec.get("underpowered_ok") and any(not c.enough for c in checks):
        lines += ["**Started with --underpowered-ok: the seeds fall short of 80% power for "
                  + ", ".join(f"`{c.claim}`" for c in checks if not c.enough)
                  + "; a verdict that is not resolved there is no evidence against the claim.**", ""]
    return lines
