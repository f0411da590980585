"""Intervals, differences and verdicts of the evidence protocol against hand-computed values and constructed
cases (mdc_core.eval.stats, mdc_core.eval.claims)."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from mdc_core.eval.claims import (
    PAPER_CLAIMS,
    Cell,
    cell_difference,
    claims_markdown,
    evaluate_claim,
    evaluate_claims,
    gather_tables,
    position_fade,
    position_fade_items,
)
from mdc_core.eval.stats import (
    HOLDS,
    REVERSED,
    UNMEASURED,
    UNRESOLVED,
    Estimate,
    bootstrap_difference,
    bootstrap_interval,
    combine_verdicts,
    describe_verdict,
    seed_difference,
    t_interval,
    verdict,
)


def test_t_interval_of_1_2_3_by_hand() -> None:
    est = t_interval([1, 2, 3])
    half = 4.302652729911275 * 1.0 / math.sqrt(3)  # t_{0.975, 2} * s / sqrt(n), s = 1
    assert est.mean == 2 and est.n == 3
    assert est.low == pytest.approx(2 - half, abs=1e-9) and est.high == pytest.approx(2 + half, abs=1e-9)
    assert est.method == "t over 3 seeds"


def test_t_interval_two_values_and_single_value() -> None:
    est = t_interval([10.0, 12.0])  # s = sqrt(2), t_{0.975, 1} = 12.706
    half = 12.706204736174704 * math.sqrt(2) / math.sqrt(2)
    assert (est.low, est.high) == (pytest.approx(11 - half), pytest.approx(11 + half))
    one = t_interval([5.0])
    assert one.mean == 5.0 and not one.has_interval and one.format() == "5.0"
    with pytest.raises(ValueError, match="no values"):
        t_interval([])
    with pytest.raises(ValueError, match="finite"):
        t_interval([1.0, float("nan")])


def test_bootstrap_interval_of_coin_flips_matches_the_normal_approximation() -> None:
    items = [1.0] * 300 + [0.0] * 200  # p = 0.6, n = 500: se = sqrt(.24 / 500) = 0.0219
    est = bootstrap_interval(items, seed=1)
    assert est.mean == pytest.approx(0.6) and "test-set noise only" in est.method and est.n == 500
    se = math.sqrt(0.24 / 500)
    assert est.low == pytest.approx(0.6 - 1.96 * se, abs=0.006) and est.high == pytest.approx(0.6 + 1.96 * se,
                                                                                             abs=0.006)
    assert bootstrap_interval(items, seed=1) == est  # deterministic for a seed
    constant = bootstrap_interval([1.0] * 50)
    assert (constant.low, constant.high) == (1.0, 1.0)


def test_paired_seed_difference_is_the_t_interval_of_the_differences() -> None:
    a, b = [3.0, 5.0, 7.0], [2.0, 3.0, 4.0]  # differences 1, 2, 3
    est = seed_difference(a, b, paired=True)
    ref = t_interval([1, 2, 3])
    assert (est.mean, est.low, est.high) == (ref.mean, ref.low, ref.high) and est.method.startswith("paired")
    with pytest.raises(ValueError, match="paired"):
        seed_difference([1.0, 2.0], [1.0], paired=True)


def test_welch_difference_by_hand() -> None:
    a, b = [1.0, 2.0, 3.0], [4.0, 6.0, 8.0, 10.0]
    va, vb = 1.0 / 3, (20.0 / 3) / 4  # var(a)/n_a, var(b)/n_b
    df = (va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 3)
    from scipy import stats

    half = stats.t.ppf(0.975, df) * math.sqrt(va + vb)
    est = seed_difference(a, b, paired=False)
    assert est.mean == pytest.approx(2 - 7) and est.half_width == pytest.approx(half)
    assert not seed_difference([1.0], [1.0, 2.0], paired=False).has_interval


def test_paired_bootstrap_difference_sees_a_consistent_gap() -> None:
    rng = np.random.default_rng(0)
    b = rng.integers(0, 2, 400).astype(float)
    a = np.maximum(b, rng.integers(0, 2, 400) * (rng.random(400) < 0.3))  # a is right wherever b is, and more
    est = bootstrap_difference(a, b)
    assert est.low > 0 and "paired bootstrap" in est.method
    with pytest.raises(ValueError, match="same test items"):
        bootstrap_difference([1.0, 0.0], [1.0])


@pytest.mark.parametrize(("low", "high", "relation", "expected"), [
    (0.5, 2.0, ">", HOLDS), (-2.0, -0.1, ">", REVERSED), (-1.0, 1.0, ">", UNRESOLVED),
    (0.1, 0.2, ">=", HOLDS), (-0.3, -0.1, ">=", REVERSED), (-0.2, 0.4, ">=", UNRESOLVED),
    (0.0, 1.0, ">", UNRESOLVED),  # touching 0 does not exclude it
])
def test_verdict_on_constructed_intervals(low: float, high: float, relation: str, expected: str) -> None:
    assert verdict(Estimate((low + high) / 2, low, high, 3, "t"), relation) == expected


def test_verdict_without_interval_and_combinations() -> None:
    assert verdict(None) == UNMEASURED and verdict(t_interval([1.0])) == UNMEASURED
    with pytest.raises(ValueError, match="relation"):
        verdict(t_interval([1.0, 2.0]), "<")
    assert combine_verdicts([HOLDS, HOLDS]) == HOLDS
    assert combine_verdicts([HOLDS, UNRESOLVED]) == UNRESOLVED
    assert combine_verdicts([HOLDS, REVERSED, UNRESOLVED]) == REVERSED
    assert combine_verdicts([UNMEASURED, UNMEASURED]) == UNMEASURED and combine_verdicts([]) == UNMEASURED
    assert "consistent" in describe_verdict(UNRESOLVED, ">=") and describe_verdict(UNRESOLVED, ">") == UNRESOLVED


def test_cell_estimates_and_differences_pick_the_right_interval() -> None:
    seeds = Cell({0: 1.0, 1: 2.0, 2: 3.0})
    assert seeds.estimate() == t_interval([1, 2, 3])
    one = Cell({0: 60.0}, {0: [100.0] * 6 + [0.0] * 4})
    est = one.estimate()
    assert est.mean == 60.0 and "bootstrap" in est.method and est.low < 60 < est.high
    assert not Cell({0: 5.0}).estimate().has_interval
    other = Cell({0: 0.0, 1: 1.0, 2: 1.0})
    paired = cell_difference(seeds, other)
    assert paired is not None and paired.method == "paired t over 3 seeds" and paired.mean == pytest.approx(4 / 3)
    welch = cell_difference(seeds, Cell({5: 0.0, 6: 1.0}))
    assert welch is not None and welch.method.startswith("Welch")
    assert cell_difference(one, Cell({0: 10.0})) is None  # one seed and no items: no interval
    boot = cell_difference(one, Cell({0: 40.0}, {0: [100.0] * 4 + [0.0] * 6}))
    assert boot is not None and boot.mean == pytest.approx(20.0) and "paired bootstrap" in boot.method


def _metrics(table: str, values: dict, items: dict | None = None) -> dict:
    return {"tables": {table: {"metric": "m", "values": values, **({"items": items} if items else {})}}}


def test_gather_tables_merges_seeds_and_keeps_distinct_runs_apart() -> None:
    runs = [("t1__seed=0", 0, _metrics("table1", {"CLIP": 60.0, "MDC": 50.0})),
            ("t1__seed=1", 1, _metrics("table1", {"CLIP": 62.0, "MDC": 52.0})),
            ("other", 1, _metrics("table1", {"CLIP": 10.0}))]
    cells = gather_tables(runs)["table1"]["cells"]
    assert cells["CLIP"][""].values == {0: 60.0, 1: 62.0} and cells["MDC"][""].values == {0: 50.0, 1: 52.0}
    assert cells["CLIP (other)"][""].values == {1: 10.0}
    two_d = gather_tables([("c", None, _metrics("table2", {"MDC (Heuristic)": {"swap": 70.0}},
                                                {"MDC (Heuristic)": {"swap": [100.0, 0.0, 100.0]}}))])
    cell = two_d["table2"]["cells"]["MDC (Heuristic)"]["swap"]
    assert cell.values == {0: 70.0} and cell.items == {0: [100.0, 0.0, 100.0]}


def test_claims_on_constructed_tables_hold_reverse_or_stay_open() -> None:
    def table(values: dict[str, list[float]]) -> dict:
        return {row: {"": Cell(dict(enumerate(v)))} for row, v in values.items()}

    claim = next(c for c in PAPER_CLAIMS if c.key == "table1")
    clear = evaluate_claim(claim, table({"CLIP": [70, 72, 71.5], "MDC": [60, 61, 62], "ARC": [50, 52, 51]}))
    assert clear["verdict"] == HOLDS and len(clear["parts"]) == 2
    flipped = evaluate_claim(claim, table({"CLIP": [50, 52, 51], "MDC": [60, 61, 62], "ARC": [50, 52, 51]}))
    assert flipped["verdict"] == REVERSED
    overlap = evaluate_claim(claim, table({"CLIP": [70, 71, 72], "MDC": [60, 65, 61], "ARC": [62, 60, 64]}))
    assert overlap["verdict"] == UNRESOLVED
    assert evaluate_claim(claim, table({"CLIP": [70, 71, 72]}))["verdict"] == UNMEASURED

    best = next(c for c in PAPER_CLAIMS if c.key == "table5_best")
    res = evaluate_claim(best, table({"[0.0, 1.0]": [1, 2, 3], "[0.3, 0.8]": [2, 3, 4], "[0.5, 1.0]": [9, 9.5, 10]}))
    assert res["verdict"] == HOLDS and {p["worse"] for p in res["parts"]} == {"[0.0, 1.0]", "[0.3, 0.8]"}
    worst = next(c for c in PAPER_CLAIMS if c.key == "table5_worst")
    res = evaluate_claim(worst, table({"[0.0, 1.0]": [1, 2, 3], "[0.3, 0.8]": [2, 3, 4], "[0.5, 1.0]": [9, 9.5, 10]}))
    assert {p["better"] for p in res["parts"]} == {"[0.3, 0.8]", "[0.5, 1.0]"}
    fig4 = next(c for c in PAPER_CLAIMS if c.key == "fig4")
    res = evaluate_claim(fig4, table({"MDC": [5, 5.1, 5.2], "BERT 0.15": [5, 5.3, 5.0], "Parallel (r = 1)": [1, 1, 2]}))
    assert res["verdict"] == UNRESOLVED and "consistent" in res["parts"][0]["verdict_text"]

    trained = next(c for c in PAPER_CLAIMS if c.key == "fig4_training")  # every ablation model vs random init
    res = evaluate_claim(trained, table({"MDC": [60, 61, 62], "BERT 0.15": [40, 41, 40.5],
                                         "random init (GAP)": [50, 50.5, 51]}))
    assert res["verdict"] == REVERSED  # one model below its untrained encoder reverses the check
    assert {(p["better"], p["verdict"]) for p in res["parts"]} == {("MDC", HOLDS), ("BERT 0.15", REVERSED)}


def test_two_dimensional_claim_checks_each_column_and_markdown_says_it() -> None:
    cells = {"MDC (Heuristic)": {c: Cell({0: 80.0, 1: 82.0, 2: 81.0}) for c in ("relation", "attribute", "swap")},
             "ARC": {c: Cell({0: 60.0, 1: 61.0, 2: 62.0}) for c in ("relation", "attribute", "swap")},
             "CLIP": {c: Cell({0: 50.0, 1: 51.0, 2: 53.0}) for c in ("relation", "attribute", "swap")}}
    results = evaluate_claims({"table2": {"metric": "m", "cells": cells}})
    assert [r["key"] for r in results] == ["table2"] and results[0]["verdict"] == HOLDS
    assert len(results[0]["parts"]) == 6
    text = "\n".join(claims_markdown(results))
    assert "**Table 2**" in text and "(swap)" in text and "paired t over 3 seeds" in text


def test_position_fade_is_late_minus_early() -> None:
    run = {"run": "x", "curves": [{"signal": [2.0, 2.0, 1.0, 0.0], "count": [10, 10, 10, 10]},
                                  {"signal": [1.0, 1.0, 1.0, None], "count": [5, 5, 5, 0]}]}
    # curve 1: late (1 + 0) / 2 - early 2 = -1.5; curve 2: positions 0..2, late [1, 2] = 1 - early 1 = 0
    assert position_fade(run) == pytest.approx(-0.75)
    assert position_fade_items(run) is None  # a result written before the per-caption fades
    run["caption_fades"] = [-1.0, 0.5, 0.0, -0.3]
    assert position_fade(run) == pytest.approx(-0.2)  # the per-caption mean, when present
    assert position_fade_items(run) == [-1.0, 0.5, 0.0, -0.3]


def test_the_statistics_modules_import_no_torch() -> None:
    code = ("import sys; import mdc_core.eval.stats, mdc_core.eval.claims; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_too_few_items_give_no_bootstrap_interval() -> None:
    assert not bootstrap_interval([1.0, 0.0, 1.0]).has_interval
    assert not bootstrap_difference([100.0], [0.0]).has_interval  # one item cannot resolve anything
    assert verdict(bootstrap_difference([100.0], [0.0])) == UNMEASURED


def test_claim_names_what_the_table_lacks() -> None:
    claim = next(c for c in PAPER_CLAIMS if c.key == "table2")
    cells = {"MDC (Heuristic)": {"relation": Cell({0: 80.0, 1: 81.0, 2: 82.0})},
             "ARC": {"relation": Cell({0: 60.0, 1: 62.0, 2: 61.0})}}
    res = evaluate_claim(claim, cells)
    assert res["verdict"] == HOLDS and len(res["parts"]) == 1  # only the column and rows present are compared
    assert sorted(res["missing"]) == ["CLIP", "column attribute", "column swap"]
    assert "not in this table (not measured): " in "\n".join(claims_markdown([res]))


def test_probe_scores_and_items_average_the_evidence_tasks() -> None:
    from mdc_core.workbench.probe_report import probe_items, probe_scores, probe_table

    result = {"tasks": {"shape": {"top1": 0.5, "test_correct": [1, 0, 1, 0]},
                        "colour": {"top1": 1.0, "test_correct": [1, 1, 1, 1]},
                        "count": {"top1": 0.25, "test_correct": [0, 0, 1, 0]}}}
    scores = probe_scores(result, ["colour"], ["shape", "count"])
    assert scores == {"colour": 100.0, "shape": 50.0, "count": 25.0, "mean": 37.5}
    items = probe_items(result, ["shape", "count"])
    assert items == [50.0, 0.0, 100.0, 0.0] and sum(items) / 4 == scores["mean"]
    probe = {"scores": {"[0.5, 1.0]": scores}, "items": {"[0.5, 1.0]": items}}
    table = probe_table(probe, ["[0.5, 1.0]"], "m", {"[0.5, 1.0]": "MDC"})
    assert table == {"metric": "m", "values": {"MDC": 37.5}, "items": {"MDC": items}}
    with pytest.raises(ValueError, match="not probed"):
        probe_scores(result, ["position"], ["shape"])


def test_compositionality_items_pair_the_examples_every_scorer_scored() -> None:
    from mdc_core.workbench.table_items import compositionality_items

    result = {"results": [
        {"label": "ARC", "examples": [{"key": "a", "correct": {"relation": True, "add": False}},
                                     {"key": "b", "correct": {"relation": False}}]},
        {"label": "MDC (Heuristic)", "examples": [{"key": "a", "correct": {"relation": True}},  # "add" skipped
                                                  {"key": "b", "correct": {"relation": True}}]},
    ]}
    items = compositionality_items(result)
    assert items == {"ARC": {"relation": [100.0, 0.0]}, "MDC (Heuristic)": {"relation": [100.0, 100.0]}}
    example = {"key": "a", "correct": {"swap_obj": True, "swap_att": False}}
    sugar = {"results": [{"label": "ARC", "examples": [example]}]}
    assert compositionality_items(sugar) == {"ARC": {}}  # swap averages two sub-tasks: no items


def test_no_spread_over_seeds_falls_back_to_pooled_test_items() -> None:
    items = [100.0] * 12 + [0.0] * 8  # 60% on 20 test items, the same on both seeds
    flat = Cell({0: 60.0, 1: 60.0}, {0: items, 1: items})
    est = flat.estimate()
    assert est.mean == 60.0 and est.low < 60 < est.high and "no spread over 2 seeds" in est.method
    assert not Cell({0: 60.0, 1: 60.0}).estimate().has_interval  # and without items: no interval at all
    other = Cell({0: 50.0, 1: 50.0}, {0: [100.0] * 10 + [0.0] * 10, 1: [100.0] * 10 + [0.0] * 10})
    diff = cell_difference(flat, other)
    assert diff is not None and diff.mean == pytest.approx(10.0) and "paired bootstrap over 40" in diff.method
    assert not cell_difference(Cell({0: 60.0, 1: 60.0}), Cell({0: 50.0, 1: 50.0})).has_interval
    assert not seed_difference([1.0, 1.0], [0.0, 0.0, 0.0], paired=False).has_interval
