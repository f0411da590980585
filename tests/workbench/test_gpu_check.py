"""`make gpu-check`: the plan scaled for a CPU, the phases' bookkeeping, the wheelhouse's package list, and the whole
check at its tiny budget on the CPU (what CI can run of it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from mdc_workbench.runs import gpu_check
from mdc_workbench.runs.gpu_check import Phase, write_summary
from mdc_workbench.runs.gpu_estimate import (
    BENCH_RUNS,
    BUDGET_S,
    GOAL_MIN,
    LOAN_S,
    STACK_BENCH,
    STACK_FILE,
    STARTUP_S,
    BenchRun,
    StackStep,
    bench_seconds,
    call_estimates,
    estimate,
    measured_bench,
    plan_minutes,
    scale_plan,
    stack_step,
    trained_models,
)
from mdc_workbench.runs.plans import load_plan

ROOT = Path(__file__).resolve().parents[2]


def scaled(tmp_path: Path, **kw) -> Path:
    args = dict(steps={8000: 4, 1600: 2, 400: 1}, device="cpu", seeds=[0], n_train=64, n_eval=32, probe_limit=32,
                position_limit=8, jobs=2, name="tiny", output_root=tmp_path / "runs")
    args.update(kw)
    return scale_plan(ROOT / "plans" / "gpu_check.yaml", tmp_path / "tiny.yaml", **args)


def test_the_gpu_plan_scales_to_a_cpu_budget(tmp_path):
    plan = yaml.safe_load(scaled(tmp_path).read_text())
    base = plan["parameters"]
    assert (base["steps"], base["device"], base["n_train"], plan["seeds"], plan["jobs"]) == (4, "cpu", 64, [0], 2)
    assert base["overrides"]["train.warmup_steps"] == 1  # 800 of 8000 -> 0.4 of 4, at least 1
    assert base["data_dir"].startswith(str(tmp_path / "runs" / "tiny"))
    by_id = {e.get("id"): e["parameters"] for e in plan["notebooks"]}
    assert set(by_id) == {"03_arc", "03_mdc"}
    loaded = load_plan(tmp_path / "tiny.yaml", root=ROOT)  # still a valid plan, with its own output folder
    assert len(loaded.runs) == 2 and loaded.out_dir == tmp_path / "runs" / "tiny"
    central = yaml.safe_load(scale_plan(ROOT / "plans" / "gpu_central_claim.yaml", tmp_path / "c.yaml",
                                        steps={8000: 4}, device="cpu", seeds=[0], n_train=64, n_eval=32,
                                        probe_limit=32, position_limit=8, jobs=2, name="c",
                                        output_root=tmp_path / "runs").read_text())
    by_id = {e.get("id"): e["parameters"] for e in central["notebooks"]}
    assert by_id["03_central"]["position_limit"] == 8
    assert by_id["03_central"]["position_data_dir"].startswith(str(tmp_path / "runs" / "c"))


def test_the_central_claims_gpu_plan_counts_four_models_per_run():
    """An ARC + MDC pair per caption kind (or per caption order): 4 x 8000 steps x 22.8 ms + 45 s = 12.9 minutes,
    the 10 runs at once on 10 slots; too long for gpu_check's 8-minute goal, hence its own plan."""
    plan = load_plan(ROOT / "plans" / "gpu_central_claim.yaml", root=ROOT)
    declared = plan.declared[str(plan.runs[0].notebook)]
    assert {trained_models(r, declared) for r in plan.runs} == {4} and len(plan.runs) == 10
    total, _ = plan_minutes(plan)
    assert total == pytest.approx((4 * 8000 * 0.0228 + 45) / 60, abs=0.05) and total > GOAL_MIN


def test_a_budget_the_scaling_does_not_know_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no scaled budget for 8000 steps"):
        scaled(tmp_path, steps={1600: 2, 400: 1})


def test_the_gpu_plan_holds_the_seeds_one_call_fits_in_seed_stacks():
    """Table 1's deciding GPU plan: 20 seeds of ARC and of MDC in stacks of 10 fit one lent call under the stacks'
    goal (unmeasured); the 36 its power declaration needs would not."""
    plan = load_plan(ROOT / "plans" / "gpu_check.yaml", root=ROOT)
    assert [(r.run_id, len(r.parameters["train_seeds"]), r.parameters["steps"]) for r in plan.runs] == [
        (f"03_{o}__seeds={'-'.join(map(str, range(k, k + 10)))}", 10, 8000) for o in ("arc", "mdc") for k in (0, 10)]
    assert plan.seeds == 20
    stack = stack_step(ROOT / "benchmarks")
    (call,) = call_estimates((ROOT / "plans" / "gpu_check.yaml",), stack=stack, root=ROOT)
    assert call["fits"] and (call["seeds"], call["members"]) == (20, 10)
    (check,) = plan.power_checks()
    assert check.seeds_needed == 36 and 0.5 < check.power < 0.8 and f"{100 * check.power:.0f}%" in call["power"][0]
    assert call_estimates((ROOT / "plans" / "gpu_central_claim_1600.yaml",), stack=stack, root=ROOT)[0]["fits"]
    assert not call_estimates((ROOT / "plans" / "gpu_central_claim.yaml",), stack=stack, root=ROOT)[0]["fits"]


def test_the_stack_step_is_the_goal_until_a_gpu_measured_one(tmp_path):
    (tmp_path / "step_phases_h200_after.json").write_text(json.dumps({"step_ms": 16.0}))
    goal = stack_step(tmp_path)  # 16 ms solo; K=16: 16 / 8 = 2 ms per member-step; a line through both
    assert not goal.measured and "UNMEASURED" in goal.source
    assert goal.member_step_s(1) == pytest.approx(0.016) and goal.member_step_s(16) == pytest.approx(0.002)
    assert goal.per_member_s == pytest.approx((0.032 - 0.016) / 15)
    rows = [{"row": "solo", "members": 16, "device": "cuda", "step_s": 0.02},
            {"row": "vmap", "members": 1, "device": "cuda", "step_s": 0.02},
            {"row": "vmap", "members": 16, "device": "cuda", "step_s": 0.05},
            {"row": "vmap", "members": 4, "device": "cpu", "step_s": 9.0}]  # a CPU row is not the GPU's
    (tmp_path / STACK_FILE).write_text(json.dumps({"rows": rows}))
    measured = stack_step(tmp_path)  # 20 ms at K=1, 50 ms at K=16: 2 ms per member, 18 ms paid once
    assert measured.measured and (measured.solo_s, measured.per_member_s) == pytest.approx((0.018, 0.002))
    assert measured.member_step_s(16) == pytest.approx(0.05 / 16)


def test_a_stacked_plan_estimate_by_hand(tmp_path):
    nb = ROOT / "notebooks" / "03_linear_probing.ipynb"
    (tmp_path / "p.yaml").write_text(
        f"name: p\njobs: 2\nseeds: [0, 1, 2, 3, 4]\nparameters: {{steps: 1000}}\nnotebooks:\n"
        f"  - {{path: {nb}, id: a, members: 4, parameters: {{objectives: [arc], position_signal: false}}}}\n")
    plan = load_plan(tmp_path / "p.yaml", root=ROOT)
    assert [len(r.parameters["train_seeds"]) for r in plan.runs] == [4, 1] and plan.seeds == 5
    stack = StackStep(solo_s=0.05, per_member_s=0.01, measured=True, source="by hand")
    # K=4: 6 s + 1000 x (0.05 + 4 x 0.01) + 4 x 1 s = 100 s; K=1: 6 + 60 + 1 = 67 s; side by side: 100 s; the GPU's
    # shares: 1000 x 5 x 0.01 = 50 s (+ 6 s) < 100 s
    total, schedule = plan_minutes(plan, stack=stack, extra_s=6.0, member_extra_s=1.0)
    assert total * 60 == pytest.approx(100) and [round(e * 60, 6) for _, _, e in schedule] == [100, 67]
    # a GPU share of 0.05 per member: alone, K=4 takes 6 + 4000 x 0.05 + 4 = 210 s and K=1 6 + 50 + 1 = 57 s, but the
    # GPU's shares add up to 5000 x 0.05 = 250 s (+ 6): both runs stretch by 256 / 210
    busy = StackStep(solo_s=0.0, per_member_s=0.05, measured=True, source="by hand")
    total, schedule = plan_minutes(plan, stack=busy, extra_s=6.0, member_extra_s=1.0)
    assert total * 60 == pytest.approx(256)
    assert [e * 60 for _, _, e in schedule] == pytest.approx([256, 57 * 256 / 210])
    with pytest.raises(ValueError, match="member_extra_s"):
        plan_minutes(plan, stack=busy, member_extra_s=-1.0)


def test_the_plan_estimate_schedules_runs_in_plan_order(tmp_path):
    nb = ROOT / "notebooks" / "03_linear_probing.ipynb"
    (tmp_path / "p.yaml").write_text(
        f"name: p\njobs: 1\nparameters: {{steps: 1000}}\nnotebooks:\n"
        f"  - {{path: {nb}, id: a, parameters: {{objectives: [arc], position_signal: false}}}}\n"
        f"  - {{path: {nb}, id: b, parameters: {{objectives: [arc, mdc], lrs: [0.1, 0.2, 0.3], "
        f"position_signal: false}}}}\n"
        f"  - {{path: {nb}, id: c, parameters: {{objectives: [], position_signal: true}}}}\n"
        f"  - {{path: {nb}, id: d, parameters: {{objectives: [arc, mdc], captions: short}}}}\n")
    plan = load_plan(tmp_path / "p.yaml", root=ROOT)
    total, schedule = plan_minutes(plan, step_s=0.06, extra_s=0.0)  # 1000 steps of 0.06 s: 1 minute per model
    assert [(rid, start, end) for rid, start, end in schedule] == [("a", 0, 1), ("b", 1, 7), ("c", 7, 11),
                                                                    ("d", 11, 15)]
    # b: 2 objectives + 2 x 2 more learning rates; c: an ARC + MDC pair per caption kind; d: its own ARC and MDC
    # are the short pair, plus the two-clause pair
    assert total == 15
    assert plan_minutes(plan, step_s=0.06, extra_s=0.0, jobs=4)[0] == 6
    with pytest.raises(ValueError, match="step_s must be > 0"):
        plan_minutes(plan, step_s=0.0)


def test_a_bench_estimate_by_hand():
    run = BenchRun("b", "p", 0, ("r1", "r2", "r3"), 100, "x.json", ("--count-ops",))
    figures = {"train": {"r1": {"warmup_s": 10.0, "step_s": 0.5}, "r2": {"error": "timed out", "step_s": 1.0}}}
    # 30 s start; r1: 15 s + 10 s warm-up + (10 timed + 1 FLOP count + 2 counting ops) x 0.5 s; r2 (an error) and r3
    # (not measured): 90 s each
    assert bench_seconds(run, figures) == 30 + (15 + 10 + 13 * 0.5) + 90 + 90
    assert bench_seconds(BenchRun("b", "p", 0, ("r1",), 100, "x.json"), figures) == 30 + 15 + 10 + 11 * 0.5


def test_the_check_estimate_spends_the_budget_as_the_check_does():
    schedule = [("x", 0.0, 1.0), ("y", 0.0, 2.0), ("z", 2.0, 4.0)]  # minutes
    parts = {p["part"]: p for p in estimate(480, [("a", 100, 210), ("b", 400, 120)], schedule)}
    # a: limit min(210, 480 - 180) = 210, takes 100; b: limit min(120, 380 - 180) = 120, cut from 400 to 120;
    # the plan's deadline: 480 - 220 - 45 = 215 s: x (60 s) and y (120 s) end by it, z (240 s) does not
    assert (parts["a"]["limit_s"], parts["a"]["takes_s"]) == (210, 100)
    assert (parts["b"]["limit_s"], parts["b"]["takes_s"]) == (120, 120)
    plan = parts["evidence_plan"]
    assert [plan[k] for k in ("estimate_s", "limit_s", "takes_s", "finished", "runs")] == [240, 215, 215, 2, 3]
    assert parts["cuda_tests"]["takes_s"] == 150 and parts["precision_curves"]["takes_s"] == 90
    whole = parts["whole check"]
    assert whole["takes_s"] == STARTUP_S + 220 + 215 == 555 and whole["fits"]
    # a budget past the loan: the 8-minute plan runs to its deadline, 700 - 220 - 45 = 435 s, and the check past 600 s
    whole = estimate(700, [("a", 100, 210), ("b", 400, 120)], [("w", 0.0, 8.0)])[-1]
    assert whole["takes_s"] == STARTUP_S + 220 + 435 and not whole["fits"]


def test_the_default_budget_fits_a_ten_minute_loan_from_the_last_figures(monkeypatch, capsys):
    assert STARTUP_S + BUDGET_S == LOAN_S == 600
    bench = measured_bench(ROOT / "benchmarks")
    assert [name for name, _, _ in bench] == [STACK_BENCH, *(b.name for b in BENCH_RUNS)]
    assert all(seconds > 0 for _, seconds, _ in bench)
    _, schedule = plan_minutes(load_plan(ROOT / "plans" / "gpu_check.yaml", root=ROOT))
    parts = estimate(BUDGET_S, bench, schedule)
    assert parts[-1]["fits"] and parts[-1]["takes_s"] <= LOAN_S
    monkeypatch.chdir(ROOT)
    gpu_check.main(["--estimate"])
    printed = capsys.readouterr().out.splitlines()
    whole = next(i for i, line in enumerate(printed) if line.startswith("whole check"))
    assert f"{parts[-1]['takes_s'] / 60:.1f}" in printed[whole]
    assert any(line.startswith("plans/gpu_check.yaml ") and "fits 10 minutes" in line for line in printed)


def test_a_phase_past_its_time_limit_is_stopped_and_reported(tmp_path):
    phase = Phase("sleeper", [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"], 3,
                  tmp_path / "sleeper.log")
    phase.launch()
    phase.wait()
    assert phase.timed_out and phase.returncode != 0 and phase.seconds < 60
    assert "(time limit)" in (tmp_path / "sleeper.log").read_text()
    quick = Phase("quick", [sys.executable, "-c", "print('ok')"], 60, tmp_path / "quick.log")
    quick.launch()
    quick.wait()
    assert quick.returncode == 0 and not quick.timed_out
    bench = {"train": {"mdc": {"samples_per_s": 10.0, "step_s": 0.1, "mfu": 0.2, "compile_s": None},
                       "mdc_graphs": {"error": "row 'mdc_graphs' timed out after 150 s"}},
             "targets": [{"target": "best MDC row MFU", "goal": 0.25, "value": 0.2, "reached": False}]}
    (tmp_path / "bench_x.json").write_text(json.dumps(bench))
    text = write_summary(tmp_path, [phase, quick], {"gpu": "none"}, tmp_path / "no_plan").read_text()
    assert "| sleeper | " in text and "| True |" in text and "timed out after 150 s" in text
    assert "best MDC row MFU: 0.2 (goal 0.25): missed" in text
    assert json.loads((tmp_path / "summary.json").read_text())["phases"][0]["timed_out"] is True


def test_the_wheelhouse_leaves_out_the_torch_stack_and_what_the_image_has():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import wheelhouse
    finally:
        sys.path.pop(0)
    need = wheelhouse.closure(["notebooks"], "3.12")
    assert "papermill" in need and "open-clip-torch" in need and "torch" in need  # the closure itself
    assert wheelhouse.TORCH_STACK.match("nvidia-cublas") and wheelhouse.TORCH_STACK.match("torch")
    have = (ROOT / "benchmarks" / "gpu_image_packages.txt").read_text().split()
    assert "numpy" in have and "papermill" not in have


@pytest.mark.slow  # about 3 minutes: every phase of make gpu-check at toy size (make test-all runs it)
def test_gpu_check_runs_end_to_end_at_its_tiny_budget_on_the_cpu(tmp_path):
    """`make gpu-check` (scripts/gpu_check.sh) on a machine without CUDA: every phase at a budget of seconds (about 3
    minutes on 2 cores), the summary and the plan's summary in one folder."""
    import os
    import subprocess

    out = tmp_path / "gc"
    env = {**os.environ, "PYTHON": sys.executable, "BUDGET_S": "1500"}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(out)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    record = json.loads((out / "summary.json").read_text())
    assert [p["phase"] for p in record["phases"]] == [STACK_BENCH, "bench_tiny", "evidence_plan"]
    assert all(p["returncode"] == 0 and not p["timed_out"] for p in record["phases"]), record["phases"]
    assert (out / "plan_summary.md").is_file() and "## bench" in (out / "summary.md").read_text()
    plan_tables = json.loads((out / "plan_summary.json").read_text())["tables"]
    # Table 1's split runs are one table
    assert {"ARC", "MDC"} <= set(plan_tables["table1"]["values"])
    stacked = json.loads((out / "seed_stack.json").read_text())["rows"]  # the seed-stack bench, K = 1 and 2
    assert [(r["row"], r["members"]) for r in stacked] == [("solo", 1), ("vmap", 1), ("vmap", 2)]
    assert "### seed stack" in (out / "summary.md").read_text()
    bench = json.loads((out / "bench_tiny.json").read_text())
    assert all(row["host_ops"]["aten_ops_per_step"] > 0 for row in bench["train"].values())


def test_the_evidence_plan_runs_without_the_caption_metrics_extra():
    """A GPU image has no pycocoevalcap (a 100 MB wheel): `mdc runs`, its summary and notebook 03's imports must not
    need it (the first GPU check failed there, at `mdc_workbench.eval`'s import)."""
    import subprocess

    code = ("import sys; sys.modules['pycocoevalcap'] = None\n"
            "import mdc_workbench.runs.plans, mdc_workbench.runs.runner, mdc_workbench.runs.summary\n"
            "import mdc_workbench.runs.evidence, mdc_workbench.eval.probe_data, mdc_workbench.eval.budget_curve\n"
            "import mdc_workbench.eval.parity, mdc_workbench.eval.central_claim, mdc_workbench.notebooks.probe_report\n"
            "import mdc_workbench.notebooks.seed_members\n"
            "from mdc_workbench.eval import linear_probe\n"
            "try:\n    from mdc_workbench.eval import score_captions\nexcept ImportError:\n    print('lazy')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "lazy"  # the metrics still need it, when asked for
