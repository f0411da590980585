"""The variance budget (mdc_workbench.eval.variance): balanced-ANOVA components by hand, negative estimates
truncated and flagged, recovery of known components from simulated designs, the variance of a mean difference
under a design against simulation, and inputs that must fail."""

import numpy as np
import pytest

from mdc_workbench.eval.variance import (
    Budget,
    budget,
    budget_markdown,
    components,
    items_budget,
    mean_variance,
    seed_components,
)


def test_two_seeds_three_items_by_hand():
    # grand mean 3.5; seed means 2, 5; item means 2, 3, 5.5: SS_S = 13.5 (df 1), SS_I = 13 (df 2), SS_total 29.5,
    # SS_SI = 3 (df 2): MS 13.5, 6.5, 1.5 -> seed (13.5 - 1.5) / 3 = 4, item (6.5 - 1.5) / 2 = 2.5, seed_item 1.5
    c = components([[1, 2, 3], [3, 4, 8]])
    assert (c.seed, c.item, c.seed_item) == pytest.approx((4.0, 2.5, 1.5))
    assert c.mean == pytest.approx(3.5) and (c.n_seeds, c.n_items, c.n_fits) == (2, 3, 1)
    assert c.fit == 0 and c.residual == 0 and c.confounded == ("fit", "residual") and c.truncated == ()
    # what one seed's mean over the 3 items varies by about the grand mean of the items: 4 + 1.5 / 3
    assert c.per_seed_variance() == pytest.approx(4.5)
    assert sum(c.shares().values()) == pytest.approx(1.0)
    assert c.shares()["item"] == pytest.approx((2.5 / 3) / (4 + 2.5 / 3 + 1.5 / 3))


def test_negative_estimates_are_truncated_and_flagged():
    # seed means equal (1/3, 1/3): MS_S = 0 < MS_SI = 1/2, so seed = -1/6; item means 1/2, 1/2, 0: MS_I = 1/6,
    # item = (1/6 - 1/2) / 2 = -1/6
    c = components([[0, 1, 0], [1, 0, 0]])
    assert c.raw["seed"] == pytest.approx(-1 / 6) and c.raw["item"] == pytest.approx(-1 / 6)
    assert c.seed == 0 and c.item == 0 and c.seed_item == pytest.approx(0.5)
    assert c.truncated == ("seed", "item")
    assert "(0: truncated)" in budget_markdown(Budget(c))


def test_probe_fits_nested_in_seeds_by_hand():
    # y[s, i, f] = b_i + d_sf, b = (0, 2), d = ((1, -1), (2, -2)): MS_I = 8, MS_F = 20 / 2 = 10, MS_S = MS_SI =
    # MS_e = 0, so item = 8 / (S F) = 2 (the sample variance of b), fit = 10 / I = 5 (the within-seed variance of d,
    # ddof 1, averaged: (2 + 8) / 2), seed = (0 - 0 - 10 + 0) / 4 < 0: truncated
    b, d = np.array([0.0, 2.0]), np.array([[1.0, -1.0], [2.0, -2.0]])
    y = b[None, :, None] + d[:, None, :]  # (S, I, F) = (2, 2, 2)
    c = components(y)
    assert (c.item, c.fit, c.seed_item, c.residual) == pytest.approx((2.0, 5.0, 0.0, 0.0))
    assert c.raw["seed"] == pytest.approx(-2.5) and c.truncated == ("seed",) and c.confounded == ()


def _simulate(rng, s, i, f, sd):
    """y = S_s + I_i + SI_si + F_sf + e_sif with the given standard deviations (normal effects)."""
    return (sd["seed"] * rng.standard_normal((s, 1, 1)) + sd["item"] * rng.standard_normal((1, i, 1))
            + sd["seed_item"] * rng.standard_normal((s, i, 1)) + sd["fit"] * rng.standard_normal((s, 1, f))
            + sd["residual"] * rng.standard_normal((s, i, f)))


TRUE = {"seed": 4.0, "item": 1.0, "seed_item": 0.5, "fit": 2.0, "residual": 1.5}


def test_known_components_are_recovered_from_simulated_designs():
    """The moment estimators are unbiased: averaged over 400 simulated designs (10 seeds x 40 items x 3 fits) each
    component lands within 4 standard errors of the mean of its estimates from the truth."""
    rng = np.random.default_rng(61)
    sd = {k: v ** 0.5 for k, v in TRUE.items()}
    est = np.array([[getattr(components(_simulate(rng, 10, 40, 3, sd)), k) for k in TRUE] for _ in range(400)])
    raw_mean, spread = est.mean(axis=0), est.std(axis=0, ddof=1) / np.sqrt(len(est))
    for k, m, se in zip(TRUE, raw_mean, spread, strict=True):
        # truncation at 0 lifts the mean a little only where estimates go negative; none of these is near 0
        assert abs(m - TRUE[k]) < 4 * se + 0.02 * TRUE[k], (k, m, se)
    one = components(_simulate(np.random.default_rng(7), 200, 400, 4, sd))  # one large design: close to the truth
    for k, v in TRUE.items():
        assert getattr(one, k) == pytest.approx(v, rel=0.25), k


def test_the_variance_of_a_mean_under_a_design_matches_simulation():
    """seed/s + item/i + seed_item/(s i) + fit/(s f) + residual/(s i f) for s = 4, i = 6, f = 2 (= 1.5 + 0.1667 +
    0.0208 + 0.25 + 0.03125 = 1.9687), against the variance of 20000 simulated grand means."""
    expected = 4 / 4 + 1 / 6 + 0.5 / 24 + 2 / 8 + 1.5 / 48
    from mdc_workbench.eval.variance import Components

    c = Components(0.0, **TRUE, n_seeds=4, n_items=6, n_fits=2)
    assert mean_variance(c, 4, 6, 2) == pytest.approx(expected)
    rng = np.random.default_rng(3)
    sd = {k: v ** 0.5 for k, v in TRUE.items()}
    means = np.array([_simulate(rng, 4, 6, 2, sd).mean() for _ in range(20000)])
    assert means.var() == pytest.approx(expected, rel=0.05)  # sampling error of a variance from 20000: ~1%


def test_paired_and_unpaired_designs_by_hand():
    """Two models whose items share a large effect and whose seeds share a large effect: the difference cancels
    both when paired; unpaired, each model's own seed terms add and only the item term stays the difference's."""
    rng = np.random.default_rng(0)
    shared_seed, shared_item = 3 * rng.standard_normal((40, 1)), 5 * rng.standard_normal((1, 50))
    a = shared_seed + shared_item + rng.standard_normal((40, 50))
    b = shared_seed + shared_item + rng.standard_normal((40, 50))
    bud = budget(a, b)
    assert bud.a.seed > 4 and bud.difference.seed < 0.5  # the seed effect (variance 9) shared by both cancels
    assert bud.difference.item < 0.5 < 10 < bud.a.item  # and so does the item effect (variance 25)
    paired = mean_variance(bud, 10, 100)
    d = bud.difference
    assert paired == pytest.approx(d.seed / 10 + d.item / 100 + d.seed_item / 1000)
    unpaired = mean_variance(bud, 10, 100, paired=False)
    assert unpaired == pytest.approx(bud.a.seed / 10 + bud.a.seed_item / 1000 + bud.b.seed / 10
                                     + bud.b.seed_item / 1000 + d.item / 100)
    assert unpaired > 5 * paired
    with pytest.raises(ValueError, match="unpaired design needs each model's components"):
        mean_variance(bud.difference, 10, 100, paired=False)


def test_per_seed_values_alone_count_everything_as_seed():
    # Table 1 at 1600 steps, MDC - ARC per seed (docs/results.md): the spread is the seed's, nothing else separable
    c = seed_components([-2.78, -3.37, -2.44, 2.20, -1.86])
    assert c.seed == pytest.approx(np.var([-2.78, -3.37, -2.44, 2.20, -1.86], ddof=1))
    assert c.mean == pytest.approx(-1.65) and "item" in c.confounded
    assert mean_variance(c, 5, 512) == pytest.approx(c.seed / 5)


@pytest.mark.parametrize("values, match", [
    ([[1, 2, 3]], "needs >= 2 seeds and >= 2 items"),
    ([[1], [2]], "needs >= 2 seeds and >= 2 items"),
    ([[1, 2, 3], [1, 2]], "balanced design"),
    ([[1, 2], [float("nan"), 2]], "finite"),
    ([1, 2, 3], r"\(seeds, items\)"),
])
def test_bad_inputs_fail_with_a_message(values, match):
    with pytest.raises(ValueError, match=match):
        components(values)


def test_a_budget_from_gathered_items_per_seed():
    a = {0: [1, 2, 3], 1: [3, 4, 8]}
    b = {0: [0, 0, 0], 1: [0, 0, 0]}
    assert items_budget(a, b).difference.seed == pytest.approx(4.0)  # the hand case above, minus zeros
    against = items_budget(a, 1.0).difference
    assert against.item == pytest.approx(2.5) and against.mean == pytest.approx(2.5)  # 3.5 - 1
    with pytest.raises(ValueError, match="same seeds"):
        items_budget(a, {0: [0, 0, 0], 2: [0, 0, 0]})


def test_other_bad_inputs_fail_with_a_message():
    with pytest.raises(ValueError, match="same seeds, items and fits"):
        budget([[1, 2], [3, 4]], [[1, 2, 3], [3, 4, 5]])
    with pytest.raises(ValueError, match=">= 2 finite per-seed values"):
        seed_components([1.0])
    with pytest.raises(ValueError, match=">= 1 seed, item and fit"):
        mean_variance(components([[1, 2, 3], [3, 4, 8]]), 0, 10)


def test_the_budget_power_and_item_modules_import_no_torch():
    """`mdc runs` plans a deciding run's seeds before any model loads: these modules stay numpy/scipy only."""
    import subprocess
    import sys

    code = ("import sys, mdc_workbench.eval.variance, mdc_workbench.eval.power, mdc_workbench.eval.items, "
            "mdc_workbench.eval.probe_tables; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
