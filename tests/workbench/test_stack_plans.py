"""A plan with `members:` runs a shipped notebook as seed stacks (issue 63 item 4): `mdc runs` on notebook 03 at toy
size, two seeds in one stack, and the summary gathers each member as the run of its seed with the numbers the
member's own folder holds (its metrics.json entry and its per-item file)."""

from __future__ import annotations

import json

import pytest
import yaml

from mdc_workbench.runs.plans import ensure_kernel
from tests.workbench.test_notebooks import COMMON, NOTEBOOK_DIR, PAPER_DATA

SEEDS = [3, 5]


def test_a_plan_with_members_runs_notebook_03_as_one_stack(tmp_path, monkeypatch, capsys):
    from mdc_workbench.cli.main import main
    from mdc_workbench.eval.items import read_items
    from mdc_workbench.eval.recompute import recompute, summary_runs, tables_from_items

    ensure_kernel()
    monkeypatch.chdir(tmp_path)
    plan = {"name": "stacks", "output_root": str(tmp_path / "out"), "jobs": 1, "seeds": SEEDS,
            "parameters": {**COMMON, **PAPER_DATA, "captions": "short", "data_dir": str(tmp_path / "data"),
                           "models_dir": str(tmp_path / "models"), "objectives": ["arc", "mdc"],
                           "position_signal": False, "probe_tasks": ["shape", "colour"], "probe_limit": 0},
            "notebooks": [{"path": str(NOTEBOOK_DIR / "03_linear_probing.ipynb"), "id": "t1", "members": 2}]}
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(plan))
    assert main(["runs", str(tmp_path / "plan.yaml"), "--quiet"]) == 0
    run = tmp_path / "out" / "stacks" / "t1__seeds=3-5"
    record = json.loads((run / "metrics.json").read_text())
    assert record["train_seeds"] == SEEDS and sorted(record["members"]) == ["3", "5"]
    models = sorted(p.name for p in (tmp_path / "models").iterdir() if p.is_dir())
    assert len(models) == 4 and not any("stack" in m for m in models)  # each member in its solo cache folder
    values = {}
    for seed in SEEDS:
        member = record["members"][str(seed)]
        table = member["tables"]["table1"]
        assert set(table["values"]) == {"ARC", "MDC", "random init"}
        values[seed] = {row: cols["gain"] for row, cols in table["values"].items() if "gain" in cols}
        assert member["metrics"]["probe_gain/MDC"] == values[seed]["MDC"]
        items = read_items(run / f"seed_{seed}" / "items.npz")  # the member's per-item file rebuilds its table
        assert (items.run_id, items.seed) == (f"t1__seeds=3-5/seed={seed}", seed)
        rebuilt = json.loads(json.dumps(tables_from_items(items)))["table1"]
        assert rebuilt["values"]["MDC"]["gain"] == pytest.approx(values[seed]["MDC"])
    assert values[3] != values[5]  # two members, two models
    summary = json.loads((tmp_path / "out" / "stacks" / "summary.json").read_text())
    gathered = summary["tables"]["table1"]
    for row in ("ARC", "MDC"):  # the mean over the two members, each counted as a seed
        assert gathered["means"][row]["gain"] == pytest.approx((values[3][row] + values[5][row]) / 2)
    assert summary["items"] == [f"t1__seeds=3-5/seed_{s}/items.npz" for s in SEEDS]
    again = recompute(tmp_path / "out" / "stacks")  # mdc recompute finds the members' files: two seeds
    assert sorted(again["runs"]) == [f"t1__seeds=3-5/seed={s}" for s in SEEDS]
    assert again["tables"]["table1"]["MDC"]["gain"].mean == pytest.approx(gathered["means"]["MDC"]["gain"])
    from_summary = summary_runs(summary)  # summary.json alone (no items files) also reads each member as its seed
    assert [(run_id, seed) for run_id, seed, _ in from_summary] == [(f"t1__seeds=3-5/seed={s}", s) for s in SEEDS]
    assert [t["tables"]["probe"]["values"]["MDC"]["shape"] for _, _, t in from_summary] == pytest.approx(
        [record["members"][str(s)]["metrics"]["probe/MDC/shape"] for s in SEEDS])


def test_notebook_03_refuses_what_a_stack_does_not_measure():
    from mdc_workbench.notebooks.seed_members import check_stack

    assert check_stack([4, 2], budgets=[], parity=False, extra_probe_data="") == [4, 2]
    for seeds in ([], [1, 1], [-1], [True], [1.0]):
        with pytest.raises(ValueError, match="distinct non-negative integer seeds"):
            check_stack(seeds)
    with pytest.raises(ValueError, match="budgets, parity run per solo seed"):
        check_stack([0, 1], budgets=[200, 400], parity=True, extra_probe_data="")


def test_given_features_are_a_trained_models_train_and_test_splits(tmp_path):
    from mdc_workbench.eval.probe_data import probe_run

    for kwargs in ({"features": {"train": None}}, {"features": {"train": None, "test": None}, "init": "random"}):
        with pytest.raises(ValueError, match="given features are a trained model's train and test splits"):
            probe_run(tmp_path / "run", tmp_path / "data", **kwargs)
