"""The hand-written statistics (mdc_workbench.eval.stats, mdc_workbench.eval.cells) against the libraries that define
them: scipy.stats (Student-t, paired and Welch intervals, p-values, the percentile bootstrap) and statsmodels (Holm's
step-down). Fixed random data; each comparison also has an input where a classic mistake would show (the normal quantile
for the t one at n = 3, a bootstrap at the wrong level, Holm without its stop)."""

import math

import numpy as np
import pytest
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestPower

from mdc_workbench.eval.cells import Cell, cell_spread, difference_spread
from mdc_workbench.eval.decision import (
    PartTest,
    decide,
    holm_step_down,
)
from mdc_workbench.eval.stats import (
    EVERY,
    HOLDS,
    REVERSED,
    SOME,
    UNRESOLVED,
    Spread,
    bootstrap_difference,
    bootstrap_interval,
    detectable_difference,
    seed_difference,
    t_interval,
    welch_spread,
)

RNG = np.random.default_rng(20261127)
SEEDS_A = RNG.normal(60.0, 1.5, size=5)  # five seeds of one method
SEEDS_B = RNG.normal(58.5, 2.5, size=5)  # ... of another (same seeds: paired)
SEEDS_C = RNG.normal(57.0, 0.8, size=3)  # three seeds of a third (different seeds: Welch)
ITEMS = RNG.normal(0.3, 1.0, size=100)  # per-test-item scores of one seed (standard error 0.1)
ITEMS_B = ITEMS + RNG.normal(-0.2, 0.5, size=100)  # the same items scored by another model


def _ci(result, confidence=0.95) -> tuple[float, float]:
    ci = result.confidence_interval(confidence_level=confidence)
    return float(ci.low), float(ci.high)


@pytest.mark.parametrize("values", [SEEDS_A, SEEDS_C, [1.0, 2.0, 3.0]], ids=["5 seeds", "3 seeds", "1-2-3"])
@pytest.mark.parametrize("confidence", [0.95, 0.99])
def test_t_interval_is_scipys_one_sample_t(values, confidence):
    est = t_interval(values, confidence)
    low, high = _ci(sps.ttest_1samp(values, 0.0), confidence)
    assert (est.low, est.high) == pytest.approx((low, high), abs=1e-9)
    assert est.mean == pytest.approx(float(np.mean(values)))


def test_at_three_seeds_the_t_quantile_is_not_the_normal_one():
    """[1, 2, 3]: scipy's t-interval is 2 +- 4.303 / sqrt(3); the normal quantile would give 2 +- 1.96 / sqrt(3),
    which a comparison at this tolerance tells apart."""
    est = t_interval([1.0, 2.0, 3.0])
    assert est.high - est.mean == pytest.approx(4.3027 / math.sqrt(3), abs=1e-4)
    normal_half = sps.norm.ppf(0.975) / math.sqrt(3)
    assert abs((est.high - est.mean) - normal_half) > 1.0


def test_paired_seed_difference_is_scipys_ttest_rel():
    est = seed_difference(SEEDS_A, SEEDS_B, paired=True)
    assert (est.low, est.high) == pytest.approx(_ci(sps.ttest_rel(SEEDS_A, SEEDS_B)), abs=1e-9)
    # the same difference, unpaired, is a different (here wider) interval: pairing is not ignored
    unpaired = seed_difference(SEEDS_A, SEEDS_B, paired=False)
    assert (unpaired.low, unpaired.high) != pytest.approx((est.low, est.high), abs=1e-3)


@pytest.mark.parametrize("a,b", [(SEEDS_A, SEEDS_C), (SEEDS_C, SEEDS_B), (SEEDS_A, SEEDS_B)])
def test_welch_is_scipys_ttest_ind_with_unequal_variances(a, b):
    ref = sps.ttest_ind(a, b, equal_var=False)
    est = seed_difference(a, b, paired=False)
    assert (est.low, est.high) == pytest.approx(_ci(ref), abs=1e-9)
    assert welch_spread(a, b).p_value(0.0) == pytest.approx(float(ref.pvalue), rel=1e-9)
    # the pooled-variance interval (equal_var=True) differs on these unequal groups: Welch's df are not n_a + n_b - 2
    pooled = _ci(sps.ttest_ind(a, b, equal_var=True))
    assert (est.low, est.high) != pytest.approx(pooled, abs=1e-3)


def test_spread_p_values_are_scipys_t_tests():
    assert cell_spread(Cell(dict(enumerate(SEEDS_A)))).p_value(59.0) == pytest.approx(
        float(sps.ttest_1samp(SEEDS_A, 59.0).pvalue), rel=1e-9)
    paired = difference_spread(Cell(dict(enumerate(SEEDS_A))), Cell(dict(enumerate(SEEDS_B))))
    assert paired.p_value(0.0) == pytest.approx(float(sps.ttest_rel(SEEDS_A, SEEDS_B).pvalue), rel=1e-9)
    welch = difference_spread(Cell(dict(enumerate(SEEDS_A))), Cell({10 + k: v for k, v in enumerate(SEEDS_C)}))
    assert welch.p_value(0.0) == pytest.approx(float(sps.ttest_ind(SEEDS_A, SEEDS_C, equal_var=False).pvalue),
                                               rel=1e-9)


@pytest.mark.parametrize("confidence", [0.95, 0.9])
def test_bootstrap_interval_is_scipys_percentile_bootstrap(confidence):
    """Both resample the items with replacement and take percentiles of the means; with 20000 resamples each,
    their endpoints differ by Monte Carlo noise only (about 0.003 here), below the 0.01 tolerance, while a
    90% interval in place of a 95% one (or the reverse) moves them by (1.96 - 1.64) x 0.1 = 0.03."""
    est = bootstrap_interval(ITEMS, confidence, n_boot=20000, seed=1)
    ref = sps.bootstrap((ITEMS,), np.mean, confidence_level=confidence, n_resamples=20000, method="percentile",
                        random_state=np.random.default_rng(2)).confidence_interval
    assert (est.low, est.high) == pytest.approx((ref.low, ref.high), abs=0.01)
    other = 0.9 if confidence == 0.95 else 0.95
    wrong = sps.bootstrap((ITEMS,), np.mean, confidence_level=other, n_resamples=20000, method="percentile",
                          random_state=np.random.default_rng(2)).confidence_interval
    assert max(abs(est.low - wrong.low), abs(est.high - wrong.high)) > 0.025


def test_paired_bootstrap_difference_is_scipys_paired_bootstrap():
    est = bootstrap_difference(ITEMS, ITEMS_B, n_boot=20000, seed=3)
    ref = sps.bootstrap((ITEMS, ITEMS_B), lambda a, b, axis=-1: a.mean(axis=axis) - b.mean(axis=axis),
                        paired=True, n_resamples=20000, method="percentile",
                        random_state=np.random.default_rng(4)).confidence_interval
    assert (est.low, est.high) == pytest.approx((ref.low, ref.high), abs=0.005)
    # unpaired resampling of the same scores is about twice as wide here: the pairing matters and is kept
    unpaired = sps.bootstrap((ITEMS, ITEMS_B), lambda a, b, axis=-1: a.mean(axis=axis) - b.mean(axis=axis),
                             n_resamples=20000, method="percentile",
                             random_state=np.random.default_rng(4)).confidence_interval
    assert (unpaired.high - unpaired.low) > 1.5 * (est.high - est.low)


def _t_spread_with_p(p: float, df: int = 4, se: float = 1.0) -> Spread:
    """A t-spread whose two-sided p-value against 0 is `p`."""
    return Spread(float(se * sps.t.isf(p / 2, df)), df + 1, "t", df + 1, t=(se, df))


def _rejected(p_values: list[float], alpha: float = 0.05) -> list[bool]:
    sides = holm_step_down([_t_spread_with_p(p) for p in p_values], [0.0] * len(p_values), alpha)
    return [side != "" for side, _ in sides]


@pytest.mark.parametrize("p_values", [
    [0.01, 0.04, 0.03],  # 0.01 < 0.05/3 rejected; 0.03 > 0.05/2 stops: 0.04 < 0.05 must NOT be rejected
    [0.001, 0.012, 0.02, 0.3],
    [0.2, 0.004, 0.011, 0.06, 0.0001],
    [0.049],
    [0.051, 0.001],
], ids=["stop", "four", "five", "one", "two"])
@pytest.mark.parametrize("alpha", [0.05, 0.1])
def test_holm_step_down_rejects_what_statsmodels_rejects(p_values, alpha):
    want = multipletests(p_values, alpha=alpha, method="holm")[0].tolist()
    assert _rejected(p_values, alpha) == want


def test_holm_without_its_stop_would_differ_here():
    """[0.01, 0.04, 0.03] at 0.05: testing each sorted p-value at alpha / (m - k) without stopping at the first
    that fails would also reject 0.04 (0.04 < 0.05 / 1); statsmodels and the project's step-down do not. The
    adjusted p-values (statsmodels') are 0.03, 0.06, 0.06: their running maximum is the monotone step."""
    p = [0.01, 0.04, 0.03]
    order = np.argsort(p)
    no_stop = [False] * 3
    for k, i in enumerate(order):
        no_stop[i] = p[i] < 0.05 / (3 - k)
    assert no_stop == [True, True, False]
    reject, adjusted, _, _ = multipletests(p, alpha=0.05, method="holm")
    assert reject.tolist() == [True, False, False] == _rejected(p)
    assert adjusted.tolist() == pytest.approx([0.03, 0.06, 0.06])


def test_holm_levels_are_the_step_down_levels():
    """The k-th smallest p-value's interval is read at 1 - alpha / (m - k): 0.9833, 0.975, 0.95 for m = 3."""
    sides = holm_step_down([_t_spread_with_p(p) for p in (0.001, 0.002, 0.003)], [0.0] * 3)
    assert [round(level, 4) for _, level in sides] == [0.9833, 0.975, 0.95]
    assert all(side == "above" for side, _ in sides)


@pytest.mark.parametrize("n", [3, 5, 10, 40])
@pytest.mark.parametrize("alpha", [0.05, 0.05 / 3])
def test_the_detectable_difference_is_statsmodels_80_percent_power_difference(n, alpha):
    """A one-sample t test over n seeds (df n - 1): TTestPower's effect size (in SDs) times the SD is the difference
    detected with 80% power; the interval's half-width (t_{1-a/2} SE, 50% power) is well below it."""
    values = SEEDS_A if n == 5 else RNG.normal(0.0, 1.7, size=n)
    sd = float(np.std(values, ddof=1))
    spread = Spread(0.0, n, "t", n, t=(sd / math.sqrt(n), n - 1))
    ours = detectable_difference(spread, alpha)
    power = TTestPower()
    at_ours = power.power(ours / sd, n, alpha, alternative="two-sided")
    if math.isnan(at_ours):  # statsmodels' far tail is scipy's noncentral t, NaN where it is ~0: the near tail alone
        at_ours = sps.nct.sf(sps.t.ppf(1 - alpha / 2, n - 1), n - 1, ours / (sd / math.sqrt(n)))
    assert at_ours == pytest.approx(0.8, abs=1e-6)
    d = power.solve_power(effect_size=None, nobs=n, alpha=alpha, power=0.8, alternative="two-sided")
    if power.power(d, n, alpha, alternative="two-sided") == pytest.approx(0.8, abs=1e-4):  # its solver converged
        assert ours == pytest.approx(d * sd, rel=1e-4)  # (at n = 3, alpha = 0.05 / 3 it stops at 61% power)
    assert detectable_difference(spread, alpha) > 1.2 * sps.t.ppf(1 - alpha / 2, n - 1) * sd / math.sqrt(n)


@pytest.mark.parametrize("p_values", [[0.01, 0.04, 0.03], [0.03, 0.04], [0.001, 0.2], [0.2, 0.3]])
def test_every_is_intersection_union_and_some_is_holm(p_values):
    """"every part holds" holds iff every p < 0.05 (no correction: a Holm-corrected rule would leave [0.03, 0.04]
    unresolved); "some part holds" holds iff statsmodels' Holm rejects some part."""
    parts = [PartTest(_t_spread_with_p(p)) for p in p_values]
    every = decide(parts, EVERY).verdict
    assert (every == HOLDS) == all(p < 0.05 for p in p_values)
    assert (decide(parts, SOME).verdict == HOLDS) == bool(multipletests(p_values, method="holm")[0].any())
    against = [PartTest(_t_spread_with_p(p).shifted(2 * _t_spread_with_p(p).mean)) for p in p_values]  # mirrored
    assert (decide(against, SOME).verdict == REVERSED) == all(p < 0.05 for p in p_values)
    assert (decide(against, EVERY).verdict == REVERSED) == bool(multipletests(p_values, method="holm")[0].any())
    assert every in (HOLDS, UNRESOLVED)
