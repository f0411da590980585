"""Power before the run (mdc_workbench.eval.power): the seeds a declared test needs by hand (the noncentral-t
multiples of stats.detectable_difference), the power against a simulation of the test's rejection rate, the
cheapest design under a cost model, "not decidable at this scale" with its numbers, and inputs that must fail."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from mdc_workbench.eval.power import (
    DECIDABLE,
    NOT_DECIDABLE,
    Cost,
    Design,
    detectable,
    plan_design,
    power,
    standard_error,
)
from mdc_workbench.eval.stats import Spread, detectable_difference, t_interval
from mdc_workbench.eval.variance import Budget, Components, seed_components


def comps(seed=0.0, item=0.0, seed_item=0.0, fit=0.0, residual=0.0) -> Components:
    return Components(0.0, seed, item, seed_item, fit, residual, n_seeds=5, n_items=100, n_fits=1)


def test_the_seeds_a_superiority_test_needs_by_hand():
    """Seed variance 4 (SD 2), effect 2: the detectable difference over n seeds is multiple(n - 1) x 2 / sqrt(n):
    n = 10: 3.150 x 0.632 = 1.992 <= 2 (80% reached); n = 9: 3.201 x 0.667 = 2.134 > 2 (not)."""
    c = comps(seed=4.0)
    assert detectable(c, Design(10, 100)) == pytest.approx(3.1496 * 2 / math.sqrt(10), abs=1e-3)
    assert detectable(c, Design(9, 100)) == pytest.approx(3.2009 * 2 / 3, abs=1e-3)
    assert power(c, Design(10, 100), ">", effect=2.0) >= 0.8 > power(c, Design(9, 100), ">", effect=2.0)
    plan = plan_design(c, ">", Cost(per_seed=60.0), 3600.0, items=[100], effect=2.0)
    assert plan.outcome == DECIDABLE and plan.design == Design(10, 100) and plan.seconds == 600.0
    # the same multiples as stats.detectable_difference: at distance = multiple x SE the power is 80% exactly
    se = standard_error(c, Design(3, 100))
    assert detectable_difference(Spread(0.0, 3, "t", 3, t=(se, 2))) == pytest.approx(detectable(c, Design(3, 100)))
    assert power(c, Design(3, 100), "<", effect=-5.653489 * se) == pytest.approx(0.8, abs=1e-5)


def test_non_inferiority_is_powered_at_the_margin_and_equivalence_at_two_one_sided_tests():
    c = comps(seed=4.0)
    d = Design(20, 100)
    se = 2 / math.sqrt(20)
    crit = sps.t.ppf(0.975, 19)
    # true difference 0, null -1.5: both tails of a noncentral t at 1.5 / SE
    expected = sps.nct.sf(crit, 19, 1.5 / se) + sps.nct.cdf(-crit, 19, 1.5 / se)
    assert power(c, d, "noninferior", margin=1.5) == pytest.approx(expected)
    assert power(c, d, "noninferior", margin=1.5, true_difference=-1.5) == pytest.approx(0.05)  # at the null
    # equivalence at +-1.5, true 0.5: at least the two-one-sided-tests bound P(T(nc (1.5 - 0.5) / SE) > crit) +
    # P(T(nc (1.5 + 0.5) / SE) > crit) - 1, and not far above it at df 19
    bound = sps.nct.sf(crit, 19, 1.0 / se) + sps.nct.sf(crit, 19, 2.0 / se) - 1
    assert bound <= power(c, d, "equivalent", margin=1.5, true_difference=0.5) <= bound + 0.03
    assert power(c, d, "equivalent", margin=0.1) < 1e-6  # an interval of half-width ~0.9 cannot fit in +-0.1
    # large df: the normal formula 2 Phi(m / SE - z) - 1
    big = Design(4000, 100)
    se_big = standard_error(c, big)
    z = sps.norm.ppf(0.975)
    assert power(c, big, "equivalent", margin=0.12) == pytest.approx(2 * sps.norm.cdf(0.12 / se_big - z) - 1,
                                                                      abs=2e-3)


def test_the_power_matches_the_rejection_rate_of_the_workbenchs_test():
    """Seeds (SD 1) and seed-item noise (SD 2, 20 items): per-seed differences are normal with variance 1 + 4/20, so
    the paired t over 5 seeds is exactly the noncentral t; 4000 simulated designs, rejections by the workbench's
    own t-interval (stats.t_interval), within 3 binomial standard errors of the computed power."""
    c = comps(seed=1.0, seed_item=4.0)
    d = Design(5, 20)
    effect = 1.2
    expected = power(c, d, ">", effect=effect)
    assert 0.3 < expected < 0.9
    rng = np.random.default_rng(5)
    hits = 0
    n = 4000
    for _ in range(n):
        per_item = effect + rng.standard_normal((5, 1)) + 2 * rng.standard_normal((5, 20))
        est = t_interval(per_item.mean(axis=1))
        hits += est.low > 0 or est.high < 0
    assert abs(hits / n - expected) < 3 * math.sqrt(expected * (1 - expected) / n)


@pytest.mark.slow
def test_the_equivalence_power_matches_simulated_two_one_sided_tests():
    c = comps(seed=0.25)
    d = Design(8, 50)
    expected = power(c, d, "equivalent", margin=0.5, true_difference=0.1)
    rng = np.random.default_rng(9)
    n = 6000
    inside = 0
    for _ in range(n):
        est = t_interval(0.1 + 0.5 * rng.standard_normal(8))
        inside += -0.5 < est.low and est.high < 0.5
    assert abs(inside / n - expected) < 3 * math.sqrt(expected * (1 - expected) / n)


def test_the_cheapest_design_spends_on_items_when_items_are_the_limit():
    """The test items' term does not shrink with seeds (every seed scores the same items): with item variance 400
    and 64 items it alone is SE 2.5, so no number of seeds resolves 2 points; 4096 items do it with few seeds."""
    c = comps(seed=1.0, item=400.0)
    cost = Cost(per_seed=600.0, per_item=0.05)
    few = plan_design(c, ">", cost, 10 ** 6, items=[64], effect=2.0, max_seeds=2000)
    assert few.outcome == NOT_DECIDABLE and few.needed is None and "no design up to 2000 seeds" in few.message
    plan = plan_design(c, ">", cost, 10 ** 6, items=[64, 512, 4096], effect=2.0)
    assert plan.outcome == DECIDABLE and plan.design.items == 4096
    cheaper = [Design(s, i) for i in (512, 4096) for s in range(2, plan.design.seeds + 40)
               if power(c, Design(s, i), ">", effect=2.0) >= 0.8 and cost.seconds(Design(s, i)) < plan.seconds]
    assert cheaper == []  # nothing cheaper reaches 80%


def test_table1_at_this_scale_is_not_decidable_and_says_with_what_numbers():
    """Table 1 at 1600 steps: per-seed MDC - ARC -2.78, -3.37, -2.44, +2.20, -1.86 (variance 4.93, every source
    counted as the seed's), margin 1.08, each seed two 14.2-minute models, 2 hours of 2 cores: even if MDC and ARC
    were equal, 80% power needs 36 seeds (1022 minutes)."""
    c = seed_components([-2.78, -3.37, -2.44, 2.20, -1.86])
    cost = Cost(per_seed=2 * 14.2 * 60)
    plan = plan_design(c, "noninferior", cost, 2 * 2 * 3600, items=[512], margin=1.08)
    assert plan.outcome == NOT_DECIDABLE and plan.design is None
    assert plan.needed == Design(36, 512) and plan.needed_seconds == pytest.approx(36 * 2 * 14.2 * 60)
    assert plan.best == Design(8, 512) and round(100 * plan.best_power) == 22
    assert plan.message.startswith(NOT_DECIDABLE) and "36 seeds" in plan.message and "8 seeds" in plan.message
    # 35 seeds fall short, 36 reach it
    assert power(c, Design(35, 512), "noninferior", margin=1.08) < 0.8 <= power(c, Design(36, 512), "noninferior",
                                                                               margin=1.08)


def test_unpaired_designs_use_welch_degrees_of_freedom():
    a, b = comps(seed=4.0), comps(seed=4.0)
    bud = Budget(comps(seed=1.0), a, b)
    d = Design(6, 100, paired=False)
    assert standard_error(bud, d) == pytest.approx(math.sqrt(8 / 6))
    # equal per-seed variances: Welch's df is 2 (n - 1) = 10
    from mdc_workbench.eval.stats import _t_power_multiple

    assert detectable(bud, d) == pytest.approx(_t_power_multiple(10, 0.05, 0.8) * math.sqrt(8 / 6))
    assert detectable(bud, Design(6, 100)) == pytest.approx(_t_power_multiple(5, 0.05, 0.8) * math.sqrt(1 / 6))


@pytest.mark.parametrize("kwargs, match", [
    ({"relation": "bigger", "effect": 1.0}, "relation must be one of"),
    ({"relation": ">"}, "declared effect"),
    ({"relation": "noninferior"}, "declared margin > 0"),
    ({"relation": "equivalent", "margin": -1.0}, "declared margin > 0"),
])
def test_undeclared_tests_fail_with_a_message(kwargs, match):
    relation = kwargs.pop("relation")
    with pytest.raises(ValueError, match=match):
        power(comps(seed=1.0), Design(3, 10), relation, **kwargs)


def test_bad_designs_and_costs_fail_with_a_message():
    with pytest.raises(ValueError, match=">= 2 seeds"):
        Design(1, 100)
    with pytest.raises(ValueError, match="finite and >= 0"):
        Cost(per_seed=-1.0)
    with pytest.raises(ValueError, match="candidate item counts"):
        plan_design(comps(seed=1.0), ">", Cost(1.0), 100.0, items=[], effect=1.0)
    with pytest.raises(ValueError, match="budget_seconds > 0"):
        plan_design(comps(seed=1.0), ">", Cost(1.0), 0.0, items=[10], effect=1.0)


def test_the_feature_consequence_at_this_scale_as_docs_evidence_states_it():
    """ARC's late penalty minus MDC's per seed +2.05, +3.81, +6.54 (variance 5.12), declared effect 2, four
    14.2-minute models per seed, 240 core-minutes: 13 seeds needed, 4 affordable (24%); at +4.13, 5 seeds."""
    c = seed_components([2.05078125, 3.80859375, 6.54296875])
    cost = Cost(per_seed=4 * 14.2 * 60)
    plan = plan_design(c, ">", cost, 4 * 3600, items=[512], effect=2.0)
    assert plan.outcome == NOT_DECIDABLE and plan.needed == Design(13, 512) and plan.best == Design(4, 512)
    assert round(100 * plan.best_power) == 24 and round(plan.needed_seconds / 60) == 738
    at_observed = plan_design(c, ">", cost, 4 * 3600, items=[512], effect=2.0, true_difference=c.mean)
    assert at_observed.needed == Design(5, 512) and round(at_observed.needed_seconds / 60) == 284
