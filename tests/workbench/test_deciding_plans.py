"""The plans that decide a claim carry what docs/evidence.md declares for them (issue 52): Table 1 at 1600 steps on
the CPU with at least 5 seeds and its learning rate re-chosen at that budget."""

from __future__ import annotations

from pathlib import Path

from mdc_workbench.runs.plans import load_plan

ROOT = Path(__file__).resolve().parents[2]


def test_table1s_deciding_cpu_plan_is_the_declared_one():
    plan = load_plan(ROOT / "plans" / "cpu_table1_1600.yaml", root=ROOT)
    assert len(plan.runs) >= 5 and len({r.parameters["train_seed"] for r in plan.runs}) == len(plan.runs)
    for run in plan.runs:
        params = run.parameters
        assert params["steps"] == 1600 and params["objectives"] == ["arc", "mdc"]
        assert len(params["lrs"]) >= 3  # the sweep runs inside the plan, at its own budget
        assert params["overrides"]["train.warmup_steps"] == 160  # 10% of the run's steps, as at 400
    declared = (ROOT / "docs" / "evidence.md").read_text()
    assert "plans/cpu_table1_1600.yaml" in declared and "**1600 steps**" in declared
    assert "evidence-1600:" in (ROOT / "Makefile").read_text()
