"""Intervals and verdicts for the workbench's evidence protocol (torch-free: numpy and scipy only).

Conventions (docs/evidence.md explains them for readers):

* **Over seeds** (n >= 2 independent trainings): the mean and a two-sided Student-t interval,
  ``mean +- t_{1-a/2, n-1} * s / sqrt(n)`` with ``s`` the sample standard deviation (ddof = 1).
* **One seed**: a percentile bootstrap over the test items' scores (resampling the items with replacement).
  It captures only test-set noise, not training noise; :attr:`Estimate.method` says so.
* **Differences** between two methods get their own interval: paired by seed (a t-interval of the per-seed
  differences) when both have the same seeds, since seeds share data order and initialisation stream; Welch's
  unequal-variance t-interval otherwise; with one seed each, a paired bootstrap over the shared test items.
  (:mod:`mdc_core.eval.claims` falls back to a bootstrap over the pooled test items when the values show no
  spread over seeds, which coarse accuracies on small test sets sometimes do.)
* **Verdicts** for an ordering claim ``a > b`` or ``a >= b`` read the interval of ``a - b``:
  ``holds`` when it lies above 0, ``reversed`` when it lies below 0, ``not resolved`` when it contains 0.
  For ``>=`` an unresolved interval is also *consistent* with the claim (not reversed); the verdict text says
  so, but only ``holds`` counts as support.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats as sps

CONFIDENCE = 0.95
N_BOOT = 4000  # bootstrap resamples (percentile interval; the 2.5% tails hold 100 draws each)
MIN_ITEMS = 10  # fewer test items give no bootstrap interval (a resample of 1-9 items says nothing reliable)
HOLDS, REVERSED, UNRESOLVED, UNMEASURED = "holds", "reversed", "not resolved", "not measured"
RELATIONS = (">", ">=")


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

    @property
    def half_width(self) -> float:
        """Half the interval's width (NaN without an interval); the ``+-`` of a symmetric t-interval."""
        return (self.high - self.low) / 2

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
    low, high = _bootstrap(arr, confidence, n_boot, seed)
    return Estimate(float(arr.mean()), low, high, int(arr.size),
                    f"bootstrap over {arr.size} test items (test-set noise only)")


def _bootstrap(arr: np.ndarray, confidence: float, n_boot: int, seed: int) -> tuple[float, float]:
    """Percentile interval of the mean of `arr` over `n_boot` resamples (item indices drawn with replacement)."""
    if n_boot < 100:
        raise ValueError(f"n_boot must be >= 100, got {n_boot}")
    rng = np.random.default_rng(seed)
    means = np.empty(n_boot)
    for start in range(0, n_boot, 500):  # chunks bound the (chunk, N) index matrix
        stop = min(start + 500, n_boot)
        idx = rng.integers(0, arr.size, size=(stop - start, arr.size))
        means[start:stop] = arr[idx].mean(axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)


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
    mean = float(xa.mean() - xb.mean())
    if xa.size < 2 or xb.size < 2:
        return Estimate(mean, math.nan, math.nan, min(xa.size, xb.size), "too few seeds for Welch's interval")
    va, vb = xa.var(ddof=1) / xa.size, xb.var(ddof=1) / xb.size
    se = math.sqrt(va + vb)
    if se == 0:  # identical values within each group: a zero-width interval would claim certainty it lacks
        return Estimate(mean, math.nan, math.nan, int(xa.size + xb.size), "no spread over seeds: no interval")
    df = (va + vb) ** 2 / (va ** 2 / (xa.size - 1) + vb ** 2 / (xb.size - 1))
    half = float(sps.t.ppf(0.5 + confidence / 2, df) * se)
    return Estimate(mean, mean - half, mean + half, int(xa.size + xb.size),
                    f"Welch t over {xa.size} + {xb.size} seeds")


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


def verdict(diff: Estimate | None, relation: str = ">") -> str:
    """The verdict on the claim ``a <relation> b`` from the interval of ``a - b`` (see the module docstring).

    Returns :data:`HOLDS`, :data:`REVERSED`, :data:`UNRESOLVED`, or :data:`UNMEASURED` (no interval).
    """
    if relation not in RELATIONS:
        raise ValueError(f"relation must be one of {RELATIONS}, got {relation!r}")
    if diff is None or not diff.has_interval:
        return UNMEASURED
    if diff.low > 0:
        return HOLDS
    if diff.high < 0:
        return REVERSED
    return UNRESOLVED


def combine_verdicts(verdicts: Sequence[str]) -> str:
    """One verdict for a claim made of several pairwise orderings: reversed if any part is reversed, holds if
    every part holds, not measured if no part was measured, else not resolved."""
    if not verdicts or all(v == UNMEASURED for v in verdicts):
        return UNMEASURED
    if REVERSED in verdicts:
        return REVERSED
    if all(v == HOLDS for v in verdicts):
        return HOLDS
    return UNRESOLVED


def describe_verdict(result: str, relation: str) -> str:
    """The verdict as a reader sees it: a ``>=`` claim that is not resolved is consistent (not reversed)."""
    if result == UNRESOLVED and relation == ">=":
        return "not resolved (consistent with >=: not reversed)"
    return result
