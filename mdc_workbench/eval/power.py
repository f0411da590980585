"""Power before the run: the seeds (and test items) a declared test needs for 80% power, from the variance budget of
earlier runs, and the cheapest such design under a cost model (torch-free). docs/evidence.md, "Power before the
run", states the rule for readers.

**The test a design is powered for** is the workbench's own (:mod:`mdc_workbench.eval.stats`): a two-sided 95%
interval of the mean difference over seeds, read against its null (0 for ``>`` / ``<``, ``-margin`` for
``noninferior``; the band ``+-margin`` for ``equivalent``). Its standard error under a design is the square root
of :func:`mdc_workbench.eval.variance.mean_variance` (seed, item, seed-item, fit and residual terms); its degrees of
freedom are those of the t over seeds (paired: seeds - 1; unpaired: Welch-Satterthwaite from each model's
per-seed variance). The t over seeds alone does not see the shared test items' term; the workbench's interval is
the union with the hierarchical bootstrap, which does, and the power here counts it, so it errs on the safe side.

**Power** at a true difference delta (the declared effect for superiority; the assumed true difference,
0 unless stated, for non-inferiority and equivalence): for ``>``, ``<`` and ``noninferior`` the probability that
the interval excludes the null, ``P(T > t_crit) + P(T < -t_crit)`` with T noncentral t of the design's df and
noncentrality ``|delta - null| / SE`` (both tails, as :func:`~mdc_workbench.eval.stats.detectable_difference`:
80% power exactly when ``|delta - null|`` equals its multiple of SE, 5.653 over 3 seeds, 3.761 over 5, 3.150 over
10). For ``equivalent`` (the 95% interval inside ``+-margin``: two one-sided tests at 2.5%) the exact probability
for normal per-seed values: the estimate is N(delta, SE^2) and the interval's half-width t_crit x SE x
sqrt(chi2_df / df), integrated over the chi-square (the textbook shortcut ``P(T(nc (margin - delta)/SE) > t_crit) +
P(T(nc (margin + delta)/SE) > t_crit) - 1`` is 4 points low at 8 seeds, so it is not used).

**Designs and cost** (:func:`plan_design`): seeds from 2 (one seed decides nothing about a method), test items from
the candidates given (test images are free to make on the embedded generator, so larger sets are offered),
probe fits from the candidates given; the cost of a design is ``seeds x (seconds per seed + items x seconds per
item + fits x seconds per fit)``. The plan is the cheapest design with at least 80% power within the budget; when
none is, the outcome is **not decidable at this scale**, with the numbers: the most power any design within the
budget reaches, and the cheapest design that would reach 80% (and its seconds) if one exists up to ``max_seeds``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from scipy import stats as sps

from mdc_workbench.eval.stats import ALPHA, POWER, RELATIONS, _t_power_multiple, null_value
from mdc_workbench.eval.variance import Budget, Components, mean_variance

DECIDABLE, NOT_DECIDABLE = "decidable", "not decidable at this scale"
MAX_SEEDS = 10_000  # the search's ceiling: a design needing more seeds is reported as needing "more than" this


@dataclass(frozen=True)
class Design:
    """How many training seeds (per model), test items (shared by every seed and model) and probe fits per seed."""

    seeds: int
    items: int
    fits: int = 1
    paired: bool = True  # both models of a seed share its seed, data order and test items (the plans' design)

    def __post_init__(self) -> None:
        if self.seeds < 2 or self.items < 1 or self.fits < 1:
            raise ValueError(f"a deciding design needs >= 2 seeds, >= 1 item and >= 1 fit, got {self.seeds} seeds, "
                             f"{self.items} items, {self.fits} fits")


@dataclass(frozen=True)
class Cost:
    """Seconds a design costs: per training seed (every model of that seed), per test item scored by one seed's
    models, and per probe fit of one seed."""

    per_seed: float
    per_item: float = 0.0
    per_fit: float = 0.0

    def __post_init__(self) -> None:
        if min(self.per_seed, self.per_item, self.per_fit) < 0 or not all(
                math.isfinite(v) for v in (self.per_seed, self.per_item, self.per_fit)):
            raise ValueError(f"costs must be finite and >= 0 seconds, got {self}")

    def seconds(self, d: Design) -> float:
        return d.seeds * (self.per_seed + d.items * self.per_item + d.fits * self.per_fit)


def _check(relation: str, effect: float | None, margin: float) -> None:
    if relation not in RELATIONS:
        raise ValueError(f"relation must be one of {RELATIONS}, got {relation!r}")
    if relation in (">", "<") and (effect is None or effect == 0):
        raise ValueError(f"a superiority test ({relation}) is powered for a declared effect; got {effect}")
    if relation in ("noninferior", "equivalent") and not margin > 0:
        raise ValueError(f"a {relation} test needs a declared margin > 0, got {margin}")


def _assumed(relation: str, effect: float | None, true_difference: float | None) -> float:
    """The difference assumed true: `true_difference` if given, else the declared effect's size (superiority) or 0
    (non-inferiority, equivalence: the methods equal)."""
    if true_difference is not None:
        return float(true_difference)
    return abs(float(effect)) if relation in (">", "<") and effect is not None else 0.0


def _df(b: Budget | Components, d: Design) -> float:
    """Degrees of freedom of the t over seeds: paired seeds - 1; unpaired Welch-Satterthwaite from each model's
    per-seed variance (equal variances give 2 (seeds - 1))."""
    if d.paired or isinstance(b, Components) or b.a is None or b.b is None:
        return float(d.seeds - 1)
    va = b.a.per_seed_variance(d.items, d.fits) / d.seeds
    vb = b.b.per_seed_variance(d.items, d.fits) / d.seeds
    if va + vb == 0:
        return float(2 * (d.seeds - 1))
    return (va + vb) ** 2 / ((va ** 2 + vb ** 2) / (d.seeds - 1))


def standard_error(b: Budget | Components, d: Design) -> float:
    return math.sqrt(mean_variance(b, d.seeds, d.items, d.fits, d.paired))


def power(b: Budget | Components, d: Design, relation: str, *, effect: float | None = None, margin: float = 0.0,
          true_difference: float | None = None, alpha: float = ALPHA) -> float:
    """The probability that the design decides the declared test (module docstring). `effect`: the declared effect
    of a superiority test (its sign is ignored: the power to resolve it); `margin`: of a non-inferiority or
    equivalence test; `true_difference`: the difference assumed true (default: `effect`, or 0)."""
    _check(relation, effect, margin)
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    se, df = standard_error(b, d), _df(b, d)
    crit = float(sps.t.ppf(1 - alpha / 2, df))
    if relation == "equivalent":
        delta = 0.0 if true_difference is None else true_difference
        return _equivalence_power(margin, delta, se, df, crit)
    delta = _assumed(relation, effect, true_difference)
    distance = abs(delta - null_value(relation, margin))
    if se == 0:
        return 1.0 if distance > 0 else alpha
    nc = distance / se
    far = float(sps.nct.cdf(-crit, df, nc))
    return float(sps.nct.sf(crit, df, nc)) + (0.0 if math.isnan(far) else far)


def _equivalence_power(margin: float, delta: float, se: float, df: float, crit: float) -> float:
    """P(the interval est +- crit x SE_hat lies inside (-margin, margin)) with est ~ N(delta, se^2) and
    SE_hat = se sqrt(q / df), q ~ chi2(df) independent of est: the integral over q of
    ``Phi((margin - h - delta) / se) - Phi((-margin + h - delta) / se)``, h = crit x SE_hat, where h < margin."""
    from scipy.integrate import quad

    if se == 0:
        return 1.0 if abs(delta) < margin else 0.0
    q_max = df * (margin / (crit * se)) ** 2  # beyond it the interval is wider than the band

    def inside(q: float) -> float:
        h = crit * se * math.sqrt(q / df)
        p = sps.norm.cdf((margin - h - delta) / se) - sps.norm.cdf((-margin + h - delta) / se)
        return max(0.0, float(p)) * float(sps.chi2.pdf(q, df))

    spread = 12 * math.sqrt(2 * df)  # chi2(df) has sd sqrt(2 df): integrate where its mass is
    low, high = max(0.0, df - spread), min(q_max, df + spread)
    if high <= low:
        return 0.0
    return float(min(1.0, quad(inside, low, high, limit=200, points=[min(max(df, low), high)])[0]))


def detectable(b: Budget | Components, d: Design, alpha: float = ALPHA, target: float = POWER) -> float:
    """The distance from the null the design resolves with probability `target` (both tails):
    :func:`~mdc_workbench.eval.stats.detectable_difference`'s multiple of this design's standard error."""
    return _t_power_multiple(_df(b, d), alpha, target) * standard_error(b, d)


@dataclass(frozen=True)
class PowerPlan:
    """What :func:`plan_design` found. ``design`` is the chosen design (None when not decidable); ``best`` the
    most powerful design within the budget; ``needed`` the cheapest design reaching the target at any cost up to
    ``MAX_SEEDS`` seeds (None when none does)."""

    outcome: str  # DECIDABLE | NOT_DECIDABLE
    relation: str
    distance: float  # |assumed true difference - null|: what the design must resolve
    target: float
    budget_seconds: float
    design: Design | None
    seconds: float | None
    power: float | None
    best: Design | None
    best_power: float | None
    needed: Design | None
    needed_seconds: float | None
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _min_seeds(b: Budget | Components, items: int, fits: int, paired: bool, relation: str, kw: dict[str, Any],
               target: float, max_seeds: int) -> int | None:
    """The fewest seeds (2..max_seeds) reaching `target` power with these items and fits (power grows with seeds:
    a smaller SE and more df), or None."""
    def ok(s: int) -> bool:
        return power(b, Design(s, items, fits, paired), relation, **kw) >= target

    if not ok(max_seeds):
        return None
    lo, hi = 2, max_seeds
    if ok(lo):
        return lo
    while hi - lo > 1:  # ok(hi), not ok(lo)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def plan_design(b: Budget | Components, relation: str, cost: Cost, budget_seconds: float, *,
                items: Sequence[int], fits: Sequence[int] = (1,), paired: bool = True, effect: float | None = None,
                margin: float = 0.0, true_difference: float | None = None, target: float = POWER,
                max_seeds: int = MAX_SEEDS) -> PowerPlan:
    """The cheapest design with at least `target` power for the declared test within `budget_seconds`, or "not
    decidable at this scale" with the numbers (module docstring). `items` and `fits`: the candidate test-set sizes
    and probe fits per seed."""
    _check(relation, effect, margin)
    if not items or not fits or min(items) < 1 or min(fits) < 1:
        raise ValueError(f"give candidate item counts and fit counts >= 1, got items={list(items)}, fits={list(fits)}")
    if not budget_seconds > 0 or not 0 < target < 1 or max_seeds < 2:
        raise ValueError(f"need budget_seconds > 0, 0 < target < 1 and max_seeds >= 2, got {budget_seconds}, {target}, "
                         f"{max_seeds}")
    kw = {"effect": effect, "margin": margin, "true_difference": true_difference}
    delta = _assumed(relation, effect, true_difference)
    distance = abs(delta - null_value(relation, margin)) if relation != "equivalent" else margin - abs(delta)
    reaching: list[tuple[float, Design]] = []  # (seconds, design) of the cheapest seeds per (items, fits)
    best: tuple[float, Design] | None = None  # (power, design) of the most powerful design within the budget
    for i in sorted(set(items)):
        for f in sorted(set(fits)):
            s = _min_seeds(b, i, f, paired, relation, kw, target, max_seeds)
            if s is not None:
                d = Design(s, i, f, paired)
                reaching.append((cost.seconds(d), d))
            per_seed = cost.per_seed + i * cost.per_item + f * cost.per_fit
            s_max = min(max_seeds, int(budget_seconds // per_seed) if per_seed > 0 else max_seeds)
            if s_max >= 2:
                d = Design(s_max, i, f, paired)
                p = power(b, d, relation, **kw)
                if best is None or p > best[0]:
                    best = (p, d)
    needed = min(reaching, key=lambda x: (x[0], x[1].seeds)) if reaching else None
    within = [r for r in reaching if r[0] <= budget_seconds]
    base = dict(relation=relation, distance=distance, target=target, budget_seconds=budget_seconds,
                best=None if best is None else best[1], best_power=None if best is None else best[0],
                needed=None if needed is None else needed[1], needed_seconds=None if needed is None else needed[0])
    if within:
        secs, d = min(within, key=lambda x: (x[0], x[1].seeds))
        p = power(b, d, relation, **kw)
        msg = (f"{DECIDABLE}: {d.seeds} seeds x {d.items} test items x {d.fits} probe fit(s) "
               f"({'paired' if paired else 'unpaired'}) give {100 * p:.0f}% power to resolve {distance:.3g} "
               f"({relation}), {secs / 60:.1f} min of the {budget_seconds / 60:.1f} min budget")
        return PowerPlan(DECIDABLE, design=d, seconds=secs, power=p, message=msg, **base)  # type: ignore[arg-type]
    reach = (f"no design up to {max_seeds} seeds reaches {100 * target:.0f}%" if needed is None else
             f"{target:.0%} power needs {needed[1].seeds} seeds x {needed[1].items} test items x {needed[1].fits} "
             f"fit(s), {needed[0] / 60:.1f} min")
    most = "no design of >= 2 seeds fits the budget" if best is None else (
        f"the most within {budget_seconds / 60:.1f} min is {100 * best[0]:.0f}% ({best[1].seeds} seeds x "
        f"{best[1].items} test items)")
    msg = f"{NOT_DECIDABLE}: resolving {distance:.3g} ({relation}): {most}; {reach}"
    return PowerPlan(NOT_DECIDABLE, design=None, seconds=None, power=None, message=msg, **base)  # type: ignore[arg-type]
