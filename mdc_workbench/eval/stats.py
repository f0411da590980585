"""Intervals, tests and verdicts for the workbench's evidence protocol (torch-free: numpy and scipy only).

Conventions (docs/evidence.md explains them for readers):

* **Over seeds** (n >= 2 independent trainings): the mean and a two-sided Student-t interval,
  ``mean +- t_{1-a/2, n-1} * s / sqrt(n)`` with ``s`` the sample standard deviation (ddof = 1).
* **One seed**: a percentile bootstrap over the test items' scores (resampling the items with replacement).
  It captures only test-set noise, not training noise; :attr:`Estimate.method` says so.
* **Seeds with per-item scores**: a hierarchical bootstrap (:func:`hierarchical_draws`): resample the seeds, then
  the test items within the resampled seeds. Seeds that scored the same test set (same number of items, item i
  the same image) share one draw of item indices per replicate, since their test-set noise is shared; otherwise
  each resampled seed draws its own. The reported interval is the union of that and the t-interval over seeds
  (:class:`Spread`): a bootstrap over 3 seeds alone is too narrow (it sees only 10 distinct seed resamples).
* **Differences** between two methods get their own interval: paired by seed (a t-interval of the per-seed
  differences) when both have the same seeds, since seeds share data order and initialisation stream; Welch's
  unequal-variance t-interval otherwise; with one seed each, a paired bootstrap over the shared test items.
* **Verdicts** read the interval of ``a - b`` against a null value: ``>`` (superiority) and ``<`` against 0;
  ``noninferior`` (a claim of "comparable") against ``-margin``, a margin stated before the data are seen.
  The interval above the null: the part *holds* (for ``<``: below); on the other side: *reversed*; containing
  it: *not resolved*.
* **Equivalence** (a claim that something "does not depend" on a variable): the interval of the estimate against
  ``+-margin``, a margin stated before the data are seen (:func:`equivalence_verdict`): inside it *equivalent*,
  entirely outside it *not equivalent*, wider than the whole equivalence region *underpowered* (no estimate of
  that precision could show equivalence), else *not resolved*.
* **Power**: a part's *detectable difference* (:func:`detectable_difference`) is the true difference a two-sided
  test at its level detects with 80% power: ``(t_{1-a/2} + t_{0.8}) x SE`` for large df (2.80 SE at 5%), solved
  exactly with the noncentral t for the actual df (5.65 SE over 3 seeds). A part that is not resolved although the
  effect the paper reports (or the margin of a claim of "comparable") is smaller than that is *underpowered*
  (:func:`power_verdict`): the design could not have shown the paper's effect, so it is no evidence against it.
* **Claims of several parts** (:func:`mdc_workbench.eval.decision.decide`, the one decision table): a claim that
  *every* part holds ("consistently", "the best of four", "outperforms X and Y in every column") is an intersection-
  union test: it holds when every part holds at level alpha, with no multiplicity correction; it is reversed when some
  part is shown reversed, which is a statement about *some* part and so uses Holm's step-down
  (:func:`~mdc_workbench.eval.decision.holm_step_down`). A claim that *some* part holds (two measures of one effect)
  is the mirror image: it holds when Holm finds a part that holds, and is reversed when every part is reversed at
  level alpha. Everything else is not resolved, or underpowered where the design could not have resolved the paper's
  effect; beside it the summary says how many parts' estimates point each way
  (:meth:`~mdc_workbench.eval.decision.Decision.counts`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats as sps

CONFIDENCE = 0.95
ALPHA = 1 - CONFIDENCE
N_BOOT = 4000  # bootstrap resamples for a displayed interval (the 2.5% tails hold 100 draws each)
N_BOOT_TESTS = 20000  # for verdicts: Holm's levels reach 1 - 0.05/m, whose tails need more draws
MIN_ITEMS = 10  # fewer test items give no bootstrap interval (a resample of 1-9 items says nothing reliable)
POWER = 0.80  # the power at which a part's detectable difference is stated (detectable_difference)
HOLDS, REVERSED, UNRESOLVED, UNMEASURED = "holds", "reversed", "not resolved", "not measured"
EQUIVALENT, NOT_EQUIVALENT, UNDERPOWERED = "equivalent", "not equivalent", "underpowered"
RELATIONS = (">", "<", "noninferior", "equivalent")
SINGLE, EVERY, SOME = "single", "every", "some"  # how a claim's parts combine (decide)
COMBINATIONS = (SINGLE, EVERY, SOME)


@dataclass(frozen=True)
class Estimate:
    """A mean with its interval. ``low``/``high`` are NaN when no interval can be formed (one value, no items)."""

    mean: float
    low: float
    high: float
    n: int  # seeds (t-interval), test items (bootstrap), or 1
    method: str  # "t over 3 seeds", "bootstrap over 512 test items (test-set noise only)", "single value"

    @property
    def has_interval(self) -> bool:
        return not (math.isnan(self.low) or math.isnan(self.high))

    def format(self, digits: int = 1) -> str:
        """``"61.2 [58.0, 64.4]"``, or just the mean when there is no interval."""
        if not self.has_interval:
            return f"{self.mean:.{digits}f}"
        return f"{self.mean:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"

    def to_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}


def _values(values: Sequence[float] | np.ndarray, what: str) -> np.ndarray:
    arr = np.asarray(values, dtype=float).ravel()
    if arr.size == 0:
        raise ValueError(f"{what}: no values")
    if not np.isfinite(arr).all():
        raise ValueError(f"{what}: values must be finite, got {arr.tolist()[:10]}")
    return arr


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def t_interval(values: Sequence[float] | np.ndarray, confidence: float = CONFIDENCE) -> Estimate:
    """Mean and two-sided Student-t interval of `values` (one per seed). With one value: no interval.

    Example: ``t_interval([1, 2, 3])`` is 2 +- 4.303 * 1 / sqrt(3) = [-0.484, 4.484].
    """
    _check_confidence(confidence)
    arr = _values(values, "t_interval")
    mean = float(arr.mean())
    if arr.size == 1:
        return Estimate(mean, math.nan, math.nan, 1, "single value")
    half = float(sps.t.ppf(0.5 + confidence / 2, arr.size - 1) * arr.std(ddof=1) / math.sqrt(arr.size))
    return Estimate(mean, mean - half, mean + half, int(arr.size), f"t over {arr.size} seeds")


def bootstrap_interval(items: Sequence[float] | np.ndarray, confidence: float = CONFIDENCE, *,
                       n_boot: int = N_BOOT, seed: int = 0) -> Estimate:
    """Mean of per-test-item scores (e.g. 0/1 correctness, or % per item) with a percentile bootstrap interval.

    The interval describes test-set noise only (the model is held fixed). Deterministic for a given `seed`.
    Fewer than :data:`MIN_ITEMS` items: the mean without an interval.
    """
    _check_confidence(confidence)
    arr = _values(items, "bootstrap_interval")
    if arr.size < MIN_ITEMS:
        return Estimate(float(arr.mean()), math.nan, math.nan, int(arr.size),
                        f"only {arr.size} test items: no bootstrap interval (needs {MIN_ITEMS})")
    low, high = _percentiles(bootstrap_draws(arr, n_boot, seed), confidence)
    return Estimate(float(arr.mean()), low, high, int(arr.size),
                    f"bootstrap over {arr.size} test items (test-set noise only)")


def bootstrap_draws(items: Sequence[float] | np.ndarray, n_boot: int = N_BOOT, seed: int = 0) -> np.ndarray:
    """`n_boot` bootstrap replicates of the mean of `items` (item indices drawn with replacement)."""
    if n_boot < 100:
        raise ValueError(f"n_boot must be >= 100, got {n_boot}")
    arr = _values(items, "bootstrap_draws")
    rng = np.random.default_rng(seed)
    means = np.empty(n_boot)
    for start in range(0, n_boot, 500):  # chunks bound the (chunk, N) index matrix
        stop = min(start + 500, n_boot)
        idx = rng.integers(0, arr.size, size=(stop - start, arr.size))
        means[start:stop] = arr[idx].mean(axis=1)
    return means


def hierarchical_draws(items_by_seed: Sequence[Sequence[float]], n_boot: int = N_BOOT, seed: int = 0) -> np.ndarray:
    """`n_boot` replicates of the grand mean of per-seed, per-item scores, resampling the seeds and then the test
    items within each resampled seed (the mean of the seeds' item means).

    Seeds with equally many items are taken to have scored the same test items (item i is one image in every
    seed), so one replicate draws one set of item indices for all its seeds (the test-set noise they share);
    seeds with different numbers of items draw their items independently.

    Hand-checkable: items constant within each seed (0 on seed A, 10 on seed B) give replicates 0, 5 and 10
    with probabilities 1/4, 1/2, 1/4; scores ``u_s + v_i`` give replicates of variance
    ``var(u) / S + var(v) / n`` (population variances).
    """
    if n_boot < 100:
        raise ValueError(f"n_boot must be >= 100, got {n_boot}")
    seeds = [_values(v, "hierarchical_draws") for v in items_by_seed]
    if not seeds:
        raise ValueError("hierarchical_draws: no seeds")
    n_seeds = len(seeds)
    rng = np.random.default_rng(seed)
    out = np.empty(n_boot)
    if len({s.size for s in seeds}) == 1:  # one test set scored by every seed: shared item draws
        grid = np.stack(seeds)  # (S, n)
        for start in range(0, n_boot, 500):
            stop = min(start + 500, n_boot)
            s_idx = rng.integers(0, n_seeds, size=(stop - start, n_seeds))  # (c, S)
            i_idx = rng.integers(0, grid.shape[1], size=(stop - start, grid.shape[1]))  # (c, n)
            out[start:stop] = grid[s_idx[:, :, None], i_idx[:, None, :]].mean(axis=(1, 2))  # (c, S, n) -> (c,)
        return out
    # ragged: each seed's own bootstrap means, one independent column per slot of a replicate
    per_seed = np.stack([bootstrap_draws(s, n_boot * n_seeds, seed + 1 + k).reshape(n_boot, n_seeds)
                         for k, s in enumerate(seeds)])  # (S, B, S): seed, replicate, slot
    s_idx = rng.integers(0, n_seeds, size=(n_boot, n_seeds))  # (B, S)
    picked = per_seed[s_idx, np.arange(n_boot)[:, None], np.arange(n_seeds)[None, :]]  # (B, S)
    return picked.mean(axis=1)


def _percentiles(draws: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1 - confidence) / 2
    low, high = np.quantile(draws, [tail, 1 - tail])
    return float(low), float(high)


@dataclass(frozen=True)
class Spread:
    """The sampling distribution of one estimated number (a table cell, or a difference of two cells), from which
    its interval at any confidence level and its p-value against any null value follow.

    ``t`` = (standard error, degrees of freedom) of a t-interval over seeds; ``draws`` = bootstrap replicates of
    the mean. With both, the interval is their union and the p-value the larger of the two (conservative).
    Neither: no interval (a single value)."""

    mean: float
    n: int  # seeds, test items, or 1
    method: str
    seeds: int = 1  # training seeds behind the number (1: test-set noise only)
    t: tuple[float, int] | None = None
    draws: np.ndarray | None = None

    @property
    def has_interval(self) -> bool:
        return self.t is not None or self.draws is not None

    def shifted(self, by: float) -> Spread:
        """The same distribution for ``mean - by`` (a cell against a constant)."""
        draws = None if self.draws is None else self.draws - by
        return Spread(self.mean - by, self.n, self.method, self.seeds, self.t, draws)

    def interval(self, confidence: float = CONFIDENCE) -> Estimate:
        _check_confidence(confidence)
        if not self.has_interval:
            return Estimate(self.mean, math.nan, math.nan, self.n, self.method)
        lows, highs = [], []
        if self.t is not None:
            se, df = self.t
            half = float(sps.t.ppf(0.5 + confidence / 2, df) * se)
            lows.append(self.mean - half)
            highs.append(self.mean + half)
        if self.draws is not None:
            low, high = _percentiles(self.draws, confidence)
            lows.append(low)
            highs.append(high)
        return Estimate(self.mean, min(lows), max(highs), self.n, self.method)

    def p_value(self, null: float = 0.0) -> float:
        """Two-sided p-value of ``mean == null`` (1.0 without an interval)."""
        ps = [1.0] if not self.has_interval else []
        if self.t is not None:
            se, df = self.t
            ps.append(float(2 * sps.t.sf(abs(self.mean - null) / se, df)))
        if self.draws is not None:
            below, above = (self.draws <= null).sum(), (self.draws >= null).sum()
            ps.append(min(1.0, 2 * (min(below, above) + 1) / (self.draws.size + 1)))
        return max(ps)


def t_spread(values: Sequence[float] | np.ndarray, what: str = "seeds") -> Spread:
    """A t-interval's distribution over per-seed `values` (no interval for one value or no spread)."""
    arr = _values(values, "t_spread")
    sd = float(arr.std(ddof=1)) if arr.size > 1 else 0.0
    if arr.size < 2 or sd == 0:
        reason = "single value" if arr.size < 2 else f"no spread over {arr.size} {what}: no interval"
        return Spread(float(arr.mean()), int(arr.size), reason, int(arr.size))
    return Spread(float(arr.mean()), int(arr.size), f"t over {arr.size} {what}", int(arr.size),
                  t=(sd / math.sqrt(arr.size), int(arr.size) - 1))


def seed_difference(a: Sequence[float], b: Sequence[float], *, paired: bool,
                    confidence: float = CONFIDENCE) -> Estimate:
    """Interval of mean(a) - mean(b) from per-seed values.

    ``paired=True`` (same seeds, in the same order): t-interval of the per-seed differences ``a_i - b_i``.
    ``paired=False``: Welch's t-interval (unequal variances, Welch-Satterthwaite degrees of freedom).
    """
    _check_confidence(confidence)
    xa, xb = _values(a, "seed_difference a"), _values(b, "seed_difference b")
    if paired:
        if xa.size != xb.size:
            raise ValueError(f"paired differences need as many values in a as in b, got {xa.size} and {xb.size}")
        est = t_interval(xa - xb, confidence)
        return Estimate(est.mean, est.low, est.high, est.n,
                        f"paired t over {est.n} seeds" if est.has_interval else "single value")
    return welch_spread(xa, xb).interval(confidence)


def welch_spread(a: Sequence[float], b: Sequence[float]) -> Spread:
    """Welch's unequal-variance t distribution of mean(a) - mean(b) (no interval with < 2 values or no spread)."""
    xa, xb = _values(a, "welch a"), _values(b, "welch b")
    mean = float(xa.mean() - xb.mean())
    seeds = min(xa.size, xb.size)
    if xa.size < 2 or xb.size < 2:
        return Spread(mean, seeds, "too few seeds for Welch's interval", seeds)
    va, vb = xa.var(ddof=1) / xa.size, xb.var(ddof=1) / xb.size
    se = math.sqrt(va + vb)
    if se == 0:  # identical values within each group: a zero-width interval would claim certainty it lacks
        return Spread(mean, int(xa.size + xb.size), "no spread over seeds: no interval", seeds)
    df = (va + vb) ** 2 / (va ** 2 / (xa.size - 1) + vb ** 2 / (xb.size - 1))
    return Spread(mean, int(xa.size + xb.size), f"Welch t over {xa.size} + {xb.size} seeds", seeds, t=(se, df))


def bootstrap_difference(items_a: Sequence[float], items_b: Sequence[float], confidence: float = CONFIDENCE, *,
                         n_boot: int = N_BOOT, seed: int = 0) -> Estimate:
    """Interval of mean(a) - mean(b) when both methods scored the same test items (item i of a is item i of b):
    a paired percentile bootstrap over the items (test-set noise only)."""
    xa, xb = _values(items_a, "bootstrap_difference a"), _values(items_b, "bootstrap_difference b")
    if xa.size != xb.size:
        raise ValueError(f"a paired bootstrap needs the same test items: {xa.size} vs {xb.size} scores")
    est = bootstrap_interval(xa - xb, confidence, n_boot=n_boot, seed=seed)
    if not est.has_interval:
        return est
    return Estimate(est.mean, est.low, est.high, est.n, f"paired bootstrap over {est.n} test items "
                    "(test-set noise only)")


def null_value(relation: str, margin: float = 0.0) -> float:
    """The value of ``a - b`` a part is tested against: 0 (also the centre of an equivalence region), or
    ``-margin`` for non-inferiority."""
    if relation not in RELATIONS:
        raise ValueError(f"relation must be one of {RELATIONS}, got {relation!r}")
    if margin < 0:
        raise ValueError(f"a margin is >= 0, got {margin}")
    return -margin if relation == "noninferior" else 0.0


def equivalence_verdict(est: Estimate | None, margin: float) -> str:
    """Equivalence of an estimate with 0 within ``+-margin`` (module docstring): :data:`EQUIVALENT` (interval
    inside ``(-margin, margin)``), :data:`NOT_EQUIVALENT` (interval entirely above `margin` or below `-margin`),
    :data:`UNDERPOWERED` (otherwise, with an interval at least ``2 * margin`` wide), :data:`UNRESOLVED`
    (otherwise) or :data:`UNMEASURED` (no interval). Example with margin 0.1: [-0.05, 0.08] equivalent,
    [0.16, 0.39] not equivalent, [-0.15, 0.12] underpowered, [0.05, 0.15] not resolved."""
    if margin <= 0:
        raise ValueError(f"an equivalence margin is > 0, got {margin}")
    if est is None or not est.has_interval:
        return UNMEASURED
    if -margin < est.low and est.high < margin:
        return EQUIVALENT
    if est.low > margin or est.high < -margin:
        return NOT_EQUIVALENT
    return UNDERPOWERED if est.high - est.low >= 2 * margin else UNRESOLVED


def _t_power_multiple(df: float, alpha: float, power: float) -> float:
    """The noncentrality (in standard errors) at which a two-sided t test with `df` degrees of freedom at level
    `alpha` rejects with probability `power` (both tails counted, as statsmodels' TTestPower does)."""
    from scipy.optimize import brentq

    if df > 1e5:  # the normal limit (scipy's noncentral t loses precision there)
        return float(sps.norm.ppf(1 - alpha / 2) + sps.norm.ppf(power))
    crit = sps.t.ppf(1 - alpha / 2, df)

    def short(nc: float) -> float:
        far = float(np.nan_to_num(sps.nct.cdf(-crit, df, nc)))  # the far tail: scipy returns NaN where it is ~0
        return float(sps.nct.sf(crit, df, nc)) + far - power

    high = 2 * crit + 2  # power grows with the noncentrality: widen the bracket until it holds the root
    while short(high) < 0:
        high *= 2
    return float(brentq(short, 0.0, high, xtol=1e-10))


def detectable_difference(spread: Spread | None, alpha: float = ALPHA, power: float = POWER) -> float | None:
    """The true difference a two-sided test of this spread at level `alpha` detects with probability `power` (None
    without an interval). With a t distribution (SE, df): the noncentral-t multiple of SE for that df (2.80 SE for
    large df at 5% and 80%, 5.65 SE over 3 seeds); with bootstrap draws: the normal ``(z_{1-a/2} + z_power) x SD``
    of the draws; with both, the larger. Example: SE 1 over 3 seeds (df 2): 5.653."""
    if not 0 < alpha < 1 or not 0 < power < 1:
        raise ValueError(f"alpha and power must be in (0, 1), got {alpha} and {power}")
    if spread is None or not spread.has_interval:
        return None
    sizes = []
    if spread.t is not None:
        se, df = spread.t
        sizes.append(_t_power_multiple(df, alpha, power) * se)
    if spread.draws is not None:
        sizes.append(float((sps.norm.ppf(1 - alpha / 2) + sps.norm.ppf(power)) * np.std(spread.draws, ddof=1)))
    return max(sizes)


def power_verdict(result: str, detectable: float | None, effect: float | None) -> str:
    """A part that is :data:`UNRESOLVED` becomes :data:`UNDERPOWERED` when the difference it detects with 80% power
    (:func:`detectable_difference`) exceeds `effect` (the paper's effect, or the margin of a claim of "comparable");
    every other result, and a part without a stated effect, is returned unchanged."""
    if result != UNRESOLVED or detectable is None or effect is None:
        return result
    return UNDERPOWERED if detectable > abs(effect) else result


def verdict(diff: Estimate | None, relation: str = ">", margin: float = 0.0) -> str:
    """The verdict on ``a <relation> b`` from the interval of ``a - b`` (see the module docstring).

    Returns :data:`HOLDS`, :data:`REVERSED`, :data:`UNRESOLVED`, or :data:`UNMEASURED` (no interval); for
    ``relation="equivalent"`` :func:`equivalence_verdict` of the interval of ``a - b`` with `margin`.
    """
    if relation == "equivalent":
        return equivalence_verdict(diff, margin)
    null = null_value(relation, margin)
    if diff is None or not diff.has_interval:
        return UNMEASURED
    side = "above" if diff.low > null else "below" if diff.high < null else ""
    if not side:
        return UNRESOLVED
    return HOLDS if (side == "below") == (relation == "<") else REVERSED


def describe_verdict(result: str, relation: str = ">", margin: float = 0.0) -> str:
    """The verdict as a reader sees it; a non-inferiority part says what holding or failing means."""
    if relation == "noninferior":
        return {HOLDS: f"holds (non-inferior: the interval lies above -{margin:g})",
                REVERSED: f"reversed (inferior by more than the margin {margin:g})"}.get(result, result)
    if relation == "equivalent":
        return {EQUIVALENT: f"equivalent (the interval lies inside +-{margin:g})",
                NOT_EQUIVALENT: f"not equivalent (the interval lies outside +-{margin:g})",
                UNDERPOWERED: f"underpowered (the interval is wider than the region +-{margin:g})"}.get(result, result)
    if result == UNDERPOWERED:
        return "underpowered (the difference detected with 80% power exceeds the paper's effect or the margin)"
    return result
