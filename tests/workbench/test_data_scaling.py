"""Fig. 5's data-scaling table (mdc_workbench.eval.data_scaling) on constructed runs: rows per method and size,
intervals over seeds by hand, the largest-minus-smallest difference paired by seed, and the guards."""

import math

import pytest

from mdc_workbench.eval.data_scaling import (
    SEED_PARAM,
    data_scaling_markdown,
    data_scaling_table,
    plot_data_scaling,
    row_name,
    scaling_differences,
    scaling_estimates,
)
from mdc_workbench.eval.stats import t_interval
from mdc_workbench.runs import evidence

T2 = 4.302653  # Student-t 97.5% quantile, 2 degrees of freedom


def run(n: int, seed: int, gains: dict[str, float], steps: int = 400, items: dict[str, list[float]] | None = None):
    """One notebook 03 run's (id, parameters, metrics.json) with a table1 of these gains (top-1 = gain + 50)."""
    values = {m: {"top-1": g + 50.0, "gain": g} for m, g in gains.items()}
    values["random init (GAP)"] = {"top-1": 50.0}
    table = {"metric": "probe top-1 % and gain over random init", "values": values}
    if items:
        table["items"] = {m: {"gain": v} for m, v in items.items()}
    return (f"03_n{n}__seed={seed}", {"n_train": n, "steps": steps, SEED_PARAM: seed},
            {"tables": {"table1": table, "lr_sweep": {"values": {}}}})


MDC = {5000: [10.0, 12.0, 14.0], 20000: [13.0, 14.0, 15.0]}  # per seed 0, 1, 2
ARC = {5000: [20.0, 21.0, 22.0], 20000: [20.0, 23.0, 20.0]}


def runs():
    return [run(n, s, {"MDC": MDC[n][s], "ARC": ARC[n][s]}) for n in (20000, 5000) for s in range(3)]


def test_rows_are_method_at_size_over_seeds():
    table = data_scaling_table(runs())
    assert table["sizes"] == [5000, 20000] and table["methods"] == ["MDC", "ARC"] and table["steps"] == 400
    assert set(table["cells"]) == {row_name(m, n) for m in ("MDC", "ARC") for n in (5000, 20000)}  # no baseline
    assert table["cells"]["MDC @ 5000"]["gain"].values == {0: 10.0, 1: 12.0, 2: 14.0}
    assert table["cells"]["ARC @ 20000"]["top-1"].values == {0: 70.0, 1: 73.0, 2: 70.0}
    assert SEED_PARAM == evidence.SEED_PARAM


def test_intervals_by_hand():
    est = scaling_estimates(data_scaling_table(runs()))
    # MDC at 5000: 12 +- 4.3027 x 2 / sqrt(3) = [7.032, 16.968]
    e = est["MDC"][5000]
    assert (e.mean, e.low, e.high) == pytest.approx((12.0, 12 - T2 * 2 / math.sqrt(3), 12 + T2 * 2 / math.sqrt(3)))
    assert (e.low, e.high) == pytest.approx((t_interval(MDC[5000]).low, t_interval(MDC[5000]).high))
    # largest - smallest, paired by seed: [3, 2, 1] -> 2 +- 4.3027 x 1 / sqrt(3) = [-0.484, 4.484]
    d = scaling_differences(data_scaling_table(runs()))["MDC"]
    assert (d.mean, d.low, d.high) == pytest.approx((2.0, 2 - T2 / math.sqrt(3), 2 + T2 / math.sqrt(3)))
    assert "paired" in d.method
    # ARC: [0, 2, -2] -> mean 0, sd 2
    d = scaling_differences(data_scaling_table(runs()))["ARC"]
    assert (d.mean, d.high) == pytest.approx((0.0, T2 * 2 / math.sqrt(3)))


def test_one_seed_with_items_gets_a_bootstrap_interval_and_without_none():
    items = {"MDC": [float(i % 7) for i in range(40)]}
    one = [run(n, 0, {"MDC": 3.0}, items=items) for n in (5000, 10000)]
    est = scaling_estimates(data_scaling_table(one))["MDC"]
    assert est[5000].has_interval and "bootstrap" in est[5000].method
    bare = [run(n, 0, {"MDC": 3.0}) for n in (5000, 10000)]
    assert not scaling_estimates(data_scaling_table(bare))["MDC"][5000].has_interval
    assert scaling_differences(data_scaling_table(bare))["MDC"] is None  # one seed, no items: no interval rule


def test_guards():
    assert data_scaling_table([run(5000, s, {"MDC": 1.0}) for s in range(3)]) is None  # one size: nothing to scale
    assert data_scaling_table([]) is None
    mixed = runs() + [run(20000, 0, {"MDC": 30.0}, steps=1600), run(5000, 0, {"MDC": 25.0}, steps=1600)]
    with pytest.raises(ValueError, match="400, 1600 steps: pass steps="):
        data_scaling_table(mixed)
    assert data_scaling_table(mixed, steps=400)["cells"]["MDC @ 20000"]["gain"].values == {0: 13.0, 1: 14.0, 2: 15.0}
    assert data_scaling_table(mixed, steps=1600)["cells"]["MDC @ 20000"]["gain"].values == {0: 30.0}
    twice = runs() + [("03_n5000_again", {"n_train": 5000, "steps": 400, SEED_PARAM: 1}, runs()[4][2])]
    with pytest.raises(ValueError, match="both report MDC at 5000 images with seed 1"):
        data_scaling_table(twice)
    no_size = [(rid, {k: v for k, v in p.items() if k != "n_train"}, m) for rid, p, m in runs()]
    assert data_scaling_table(no_size) is None  # runs without n_train are not sizes


def test_markdown_and_figure(tmp_path):
    table = data_scaling_table(runs())
    text = data_scaling_markdown(table)
    assert text.splitlines()[0] == "| method (gain) | 5000 images | 20000 images | 20000 - 5000 |"
    assert "| MDC | 12.0 [7.0, 17.0] (3 seeds) | 14.0 [11.5, 16.5] (3 seeds) | 2.0 [-0.5, 4.5] |" in text
    path = plot_data_scaling(table, tmp_path / "fig5.png")
    assert path.is_file() and path.stat().st_size > 1000


def test_the_shipped_plan_gives_the_table_its_sizes():
    """plans/data_scaling.yaml: every size over the same steps and seeds, each size in its own data folder, so
    its runs' parameters are what data_scaling_table gathers (here with constructed metrics)."""
    from pathlib import Path

    from mdc_workbench.runs.plans import load_plan

    root = Path(__file__).resolve().parents[2]
    plan = load_plan(root / "plans" / "data_scaling.yaml", root=root)
    params = [r.parameters for r in plan.runs]
    assert {p["steps"] for p in params} == {400} and {p[SEED_PARAM] for p in params} == {0, 1, 2}
    folders = {p["n_train"]: p["data_dir"] for p in params}
    assert sorted(folders) == [2500, 5000, 10000, 20000] and len(set(folders.values())) == 4
    assert all(p["steps"] * p["overrides"]["train.batch_size"] >= p["n_train"] for p in params)  # each seen once
    runs_ = [(r.run_id, r.parameters, run(r.parameters["n_train"], r.parameters[SEED_PARAM], {"MDC": 1.0})[2])
             for r in plan.runs]
    table = data_scaling_table(runs_)
    assert table["sizes"] == [2500, 5000, 10000, 20000] and all(
        len(table["cells"][row_name("MDC", n)]["gain"].values) == 3 for n in table["sizes"])


def test_the_summary_lists_fig5_as_measured_without_a_verdict_once_the_sizes_are_gathered():
    """With runs at several sizes the claims section lists Fig. 5 under "Measured without a verdict", pointing at the
    table; without them it stays "not measured". The other unencoded statements stay not measured either way."""
    from mdc_workbench.eval.claims import not_encoded_markdown

    described, missing = not_encoded_markdown()
    assert described == [] and any("Fig. 5" in line and "*not measured*" in line for line in missing)
    described, missing = not_encoded_markdown({"table1", "data_scaling"})
    assert len(described) == 1 and "Fig. 5" in described[0] and "the table `data_scaling` above" in described[0]
    assert "not testable in this design" in described[0]  # fixed steps on a generator 2,500 images cover
    assert not any("Fig. 5" in line for line in missing) and any("Table 3" in line for line in missing)

    lines, _ = evidence.evidence_markdown(evidence.gather_runs(runs()))
    text = "\n".join(lines)
    measured, not_measured = text.split("### Not measured in these runs")
    assert "### Measured without a verdict" in measured and "Fig. 5" in measured and "Fig. 5" not in not_measured
    one_size = [r for r in runs() if r[1]["n_train"] == 20000]
    text = "\n".join(evidence.evidence_markdown(evidence.gather_runs(one_size))[0])
    assert "### Measured without a verdict" not in text and "Fig. 5" in text.split("### Not measured in these runs")[1]
