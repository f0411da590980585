"""Per-item results (mdc_workbench.eval.items) and the recompute core (mdc_workbench.eval.recompute): the schema's
round trip, the committed sample (tests/items_sample/) rebuilt to the digit and judged with known answers, the
probe's per-image labels and predictions, a committed summary's per-seed recomputation, and files that must fail."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from mdc_workbench.eval.cells import gather_tables, table_estimates
from mdc_workbench.eval.central_claim import claim_table, connector_ids, feature_order_table
from mdc_workbench.eval.claims import evaluate_claims
from mdc_workbench.eval.items import (
    PROBE_COLUMNS,
    SIGNAL_COLUMNS,
    RunItems,
    add_probe_table,
    probe_results,
    read_items,
    signal_rows,
    write_items,
)
from mdc_workbench.eval.probe_tables import probe_table as eval_probe_table
from mdc_workbench.eval.recompute import recompute, summary_runs, tables_from_items
from mdc_workbench.eval.stats import EQUIVALENT, HOLDS
from mdc_workbench.eval.variance import items_budget
from mdc_workbench.notebooks.probe_report import probe_gains, probe_items, probe_scores, probe_table
from tests.items_sample import METRIC, ROOT, SEEDS, TASKS, build

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_committed_sample_is_what_its_generator_writes():
    for seed in SEEDS:
        made, _ = build(seed)
        kept = read_items(ROOT / made.run_id / "items.npz")
        assert (kept.run_id, kept.seed) == (made.run_id, seed) and kept.tables == json.loads(json.dumps(made.tables))
        for kind, cols in (("probe", PROBE_COLUMNS), ("signal", SIGNAL_COLUMNS)):
            for name in cols:
                np.testing.assert_array_equal(kept.column(kind, name), made.column(kind, name), err_msg=name)


def test_write_and_read_round_trip(tmp_path):
    made, inputs = build(0)
    path = write_items(made, tmp_path / "run" / "items.npz")
    back = read_items(path)
    assert probe_results(back, "table1") == {
        k: {"pool": r["pool"], "init": r["init"], "tasks": r["tasks"]} for k, r in inputs["results"].items()}
    rows = signal_rows(back)
    for kind, by_row in inputs["scored"].items():
        for row, s in by_row.items():
            assert rows[kind][row] == {"mode": s.mode, "groups": s.groups, "tokens": s.tokens,
                                       "gradient": s.gradient, "pmi": s.pmi}


def _direct(seed: int) -> dict:
    """The tables built straight from the in-memory inputs, as notebook 03 builds them."""
    _, inputs = build(seed)
    results = inputs["results"]
    scores = {k: probe_scores(r, TASKS, TASKS) for k, r in results.items()}
    gains, gain_items = probe_gains(results, scores, TASKS)
    probe = {"scores": scores, "items": {k: probe_items(r, TASKS) for k, r in results.items()}, "gains": gains,
             "gain_items": gain_items, "results": results}
    return {"table1": probe_table(probe, ["ARC", "MDC", "random init"], METRIC),
            "feature_order": feature_order_table(inputs["orders"]),
            "central_claim": claim_table(inputs["scored"], connector_ids())}


def test_recompute_rebuilds_every_table_and_verdict_to_the_digit():
    result = recompute(ROOT)
    assert result["runs"] == [f"03_sample__seed={s}" for s in SEEDS]
    direct = gather_tables([(f"03_sample__seed={s}", s, {"tables": _direct(s)}) for s in SEEDS])
    assert result["tables"] == {name: table_estimates(t["cells"]) for name, t in direct.items()}
    expected = evaluate_claims(direct, measured_only=True)
    assert [(c["key"], c["verdict"], [p["difference"] for p in c["parts"]]) for c in result["claims"]] == [
        (c["key"], c["verdict"], [p["difference"] for p in c["parts"]]) for c in expected]
    # the sample's known answers: ARC falls on content words, MDC is flat, so the sentence holds on both kinds
    claims = {c["key"]: c for c in result["claims"]}
    assert claims["central_claim"]["verdict"] == HOLDS and len(claims["central_claim"]["parts"]) == 4
    assert claims["central_claim_flat"]["verdict"] == EQUIVALENT
    # the budget of a deciding difference straight from the recomputed cells: MDC - ARC per test image
    cells = result["cells"]["table1"]
    bud = items_budget(cells["MDC"]["top-1"].items, cells["ARC"]["top-1"].items)
    assert bud.difference.mean == pytest.approx(result["tables"]["table1"]["MDC"]["top-1"].mean
                                                - result["tables"]["table1"]["ARC"]["top-1"].mean)
    assert (bud.difference.n_seeds, bud.difference.n_items) == (3, 40)
    top1 = result["tables"]["table1"]["ARC"]["top-1"].mean
    arc = [probe_results(read_items(ROOT / f"03_sample__seed={s}" / "items.npz"), "table1")["ARC"] for s in SEEDS]
    assert top1 == pytest.approx(np.mean([100 * np.mean([a["tasks"][t]["top1"] for t in TASKS]) for a in arc]))


def test_the_eval_probe_table_is_the_probe_reports_to_the_digit():
    """eval.probe_tables rebuilds Table 1 without the notebooks' package; it must give what the probe report gives
    (a raw-pixels row has no gain: no random row of its kind)."""
    _, inputs = build(1)
    results = {**inputs["results"], "raw pixels": {**inputs["results"]["MDC"], "init": "pixels", "pool": "pixels"}}
    for tasks, mean_tasks in ((TASKS, TASKS), (("shape",), TASKS), (TASKS, ("colour",))):
        scores = {k: probe_scores(r, tasks, mean_tasks) for k, r in results.items()}
        gains, gain_items = probe_gains(results, scores, mean_tasks)
        probe = {"scores": scores, "items": {k: probe_items(r, mean_tasks) for k, r in results.items()},
                 "gains": gains, "gain_items": gain_items}
        rows = ["ARC", "MDC", "random init", "raw pixels"]
        expected = probe_table(probe, rows, METRIC, {"MDC": "MDC [0.5, 1]"})
        assert eval_probe_table(results, rows=rows, metric=METRIC, tasks=tasks, mean_tasks=mean_tasks,
                                rename={"MDC": "MDC [0.5, 1]"}) == expected
    with pytest.raises(ValueError, match="were not probed"):
        eval_probe_table(results, rows=["ARC"], metric=METRIC, tasks=["count"], mean_tasks=TASKS)


def test_a_probe_keeps_each_test_images_label_and_prediction():
    from mdc_workbench.eval.probe import linear_probe

    gen = torch.Generator().manual_seed(0)
    y = torch.arange(60) % 3 + 7  # label values 7, 8, 9: kept as given, not as probe outputs
    x = torch.randn(60, 4, generator=gen) + 2 * torch.nn.functional.one_hot(y - 7, 4).float()
    r = linear_probe(x[:40], y[:40], x[40:], y[40:], c_grid=[1.0])
    assert r.test_label == y[40:].tolist() and set(r.test_pred) <= {7, 8, 9}
    assert r.test_correct == [int(a == b) for a, b in zip(r.test_label, r.test_pred, strict=True)]
    items = add_probe_table(RunItems("r", 0), "t", {"results": {"M": {"pool": "gap", "tasks": {"shape": r.to_dict()}}}},
                            metric="m", rows=["M"], tasks=["shape"], mean_tasks=["shape"])
    assert probe_results(items, "t")["M"]["tasks"]["shape"]["test_correct"] == r.test_correct


def test_a_committed_summary_recomputes_per_seed_verdicts():
    """The 2026-11-28 central-claim summary keeps per-seed means: the mechanism check recomputes (t over 3 seeds),
    the sentence's content slope was not kept, so it is not measured."""
    runs = summary_runs(DOCS / "gpu_central_claim_1600_summary.json")
    assert [seed for _, seed, _ in runs] == [0, 1, 2, 0, 1, 2]
    claims = {c["key"]: c for c in recompute(runs)["claims"]}
    mechanism = claims["central_claim_mechanism"]
    assert mechanism["verdict"] == HOLDS and mechanism["parts"][0]["difference"]["mean"] == pytest.approx(-1.3683,
                                                                                                        abs=1e-4)
    assert claims["central_claim"]["verdict"] == "not measured"
    assert claims["central_claim"]["missing"] == ["column short gradient: content slope",
                                                  "column clauses gradient: content slope"]


def test_files_that_are_not_per_item_records_fail_with_a_message(tmp_path):
    made, _ = build(0)
    good = write_items(made, tmp_path / "good.npz")
    with np.load(good) as data:
        arrays = {k: data[k] for k in data.files}
    cases = {
        "no meta record": {k: v for k, v in arrays.items() if k != "meta"},
        "schema 99": {**arrays, "meta": np.array(json.dumps({"schema": 99}))},
        "missing column": {k: v for k, v in arrays.items() if k != "signal.pmi"},
        "different lengths": {**arrays, "probe.label": arrays["probe.label"][:-1]},
    }
    for message, content in cases.items():
        path = tmp_path / f"{message.replace(' ', '_')}.npz"
        with path.open("wb") as fh:
            np.savez(fh, **content)
        with pytest.raises(ValueError, match=message):
            read_items(path)
    (tmp_path / "text.npz").write_text("not a zip")
    with pytest.raises(ValueError, match="not a per-item file"):
        read_items(tmp_path / "text.npz")
    with pytest.raises(ValueError, match="no per-image labels and predictions"):
        add_probe_table(RunItems("r", 0), "t", {"results": {"M": {"tasks": {"shape": {"test_correct": [1, 0]}}}}},
                        metric="m", rows=["M"], tasks=["shape"], mean_tasks=["shape"])
    with pytest.raises(ValueError, match="no items.npz under"):
        recompute(tmp_path / "empty")
    bad = RunItems("r", 0, tables={"x": {"builder": "nothing"}})
    with pytest.raises(ValueError, match="no known builder"):
        tables_from_items(bad)
