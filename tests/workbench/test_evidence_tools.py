"""The evidence plan's tools against hand-computed values: training-budget curves (mdc_workbench.eval.budget_curve),
the parity table (mdc_workbench.eval.parity) and the learning-rate choice (mdc_workbench.notebooks.tuning)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mdc_core.config import ObjectiveConfig
from mdc_core.objectives import maskable_positions
from mdc_core.tokenizer import EMBED_SIZE, CaptionTokenizer
from mdc_workbench.eval import budget_curve as bc
from mdc_workbench.eval.parity import (
    expected_supervised_tokens,
    measured_supervised_tokens,
    parameter_count,
    step_flops,
)
from mdc_workbench.notebooks.tuning import best_learning_rates
from mdc_workbench.runs.plans import load_plan

ROOT = Path(__file__).resolve().parents[2]


def _probe(gains: dict[str, list[float]]) -> dict:
    """A probe_models-shaped result whose rows have the given per-image gain items (top-1 = 50 + mean gain)."""
    return {"gain_items": {r: {"mean": v} for r, v in gains.items()},
            "scores": {r: {"mean": 50.0 + sum(v) / len(v)} for r, v in gains.items()}}


def test_curve_from_probe_means_intervals_and_paired_differences() -> None:
    mdc_400, mdc_800 = [10.0, 20.0] * 10, [30.0, 40.0] * 10  # means 15 and 35
    arc_400, arc_800 = [5.0, 15.0] * 10, [40.0, 40.0] * 10  # means 10 and 40
    probe = _probe({"MDC @ 400": mdc_400, "MDC @ 800": mdc_800, "ARC @ 400": arc_400, "ARC @ 800": arc_800})
    curve = bc.curve_from_probe(probe, ["MDC", "ARC"], [400, 800])
    assert curve["budgets"] == [400, 800]
    assert curve["methods"]["MDC"]["gain"] == pytest.approx([15.0, 35.0])
    assert curve["methods"]["ARC"]["gain"] == pytest.approx([10.0, 40.0])
    assert curve["methods"]["MDC"]["top1"] == pytest.approx([65.0, 85.0])
    for line in curve["methods"].values():
        assert all(lo <= g <= hi for lo, g, hi in zip(line["low"], line["gain"], line["high"], strict=True))
    assert curve["methods"]["ARC"]["low"][1] == curve["methods"]["ARC"]["high"][1] == 40.0  # no spread, no width
    diffs = bc.curve_differences(curve, "MDC", "ARC")
    assert [d["mean"] for d in diffs] == pytest.approx([5.0, -5.0])
    # paired per image: MDC - ARC at 400 is exactly +5 on every image, so the interval is the point
    assert diffs[0]["low"] == pytest.approx(5.0) and diffs[0]["high"] == pytest.approx(5.0)
    assert diffs[1]["high"] < 0  # at 800: -10 or 0 per image, mean -5, interval below 0
    table = bc.budget_table(curve, "gain")
    assert table["values"]["MDC"] == pytest.approx({"gain @ 400": 15.0, "gain @ 800": 35.0})
    assert table["items"]["ARC"]["gain @ 800"] == arc_800
    md = bc.budget_markdown(curve)
    assert "| MDC - ARC | 5.0 [5.0, 5.0] |" in md and "gain @ 800 steps" in md


def test_curve_needs_a_gain_for_every_point() -> None:
    with pytest.raises(ValueError, match="no gain for 'MDC @ 800'"):
        bc.curve_from_probe(_probe({"MDC @ 400": [1.0] * 10}), ["MDC"], [400, 800])


def test_check_budgets() -> None:
    assert bc.check_budgets([800, 400], 800) == [400, 800]
    for bad in ([], [0, 400], [400, 1200], [400, 400]):
        with pytest.raises(ValueError, match="budgets must be"):
            bc.check_budgets(bad, 800)


def test_checkpoint_at_finds_the_step_or_names_those_present(tmp_path: Path) -> None:
    for step in (400, 800):
        folder = tmp_path / "checkpoints" / f"step_{step:08d}"
        folder.mkdir(parents=True)
        (folder / "meta.json").write_text(json.dumps({"step": step, "complete": True, "files": []}))
    assert bc.checkpoint_at(tmp_path, 800).name == "step_00000800"
    with pytest.raises(ValueError, match=r"no checkpoint at step 1200 \(it has: 400, 800\).*keep_last"):
        bc.checkpoint_at(tmp_path, 1200)


def test_plot_budget_curve_writes_a_png(tmp_path: Path) -> None:
    curve = bc.curve_from_probe(_probe({"MDC @ 1": [1.0, 2.0] * 5, "MDC @ 2": [2.0, 3.0] * 5}), ["MDC"], [1, 2])
    path = bc.plot_budget_curve(curve, tmp_path / "f" / "curve.png")
    assert path.is_file() and path.read_bytes()[:4] == b"\x89PNG"


def test_parameters_and_flops_of_a_linear_layer_by_hand() -> None:
    layer = torch.nn.Linear(3, 4)
    assert parameter_count(layer) == 3 * 4 + 4
    x = torch.randn(5, 3)
    # forward x @ W^T: 2 * 5 * 3 * 4 = 120; backward: the weight's gradient only (x needs none): another 120
    assert step_flops(lambda: layer(x).sum()) == 240
    assert layer.weight.grad is not None


def test_expected_supervised_tokens_by_hand() -> None:
    lengths = [3, 5]  # 8 caption tokens in two captions
    assert expected_supervised_tokens(lengths, ObjectiveConfig(name="arc")) == 10  # + one <eot> each
    assert expected_supervised_tokens(lengths, ObjectiveConfig(name="mdc", t_low=0.5, t_high=1.0)) == 6.0
    assert expected_supervised_tokens(lengths, ObjectiveConfig(name="bert", mask_ratio=0.25)) == 2.0
    assert expected_supervised_tokens(lengths, ObjectiveConfig(name="parallel")) == 8
    assert expected_supervised_tokens(lengths, ObjectiveConfig(name="clip")) == 0


def test_measured_supervised_tokens_match_the_objectives() -> None:
    captions = ["a red circle on a blue background", "two small green squares", "one big yellow triangle"] * 20
    tokens, _ = CaptionTokenizer(32).tokenize_batch(captions)
    n = int(maskable_positions(tokens).sum())  # caption tokens (no <sot>, <eot>, padding)
    index = torch.arange(EMBED_SIZE)
    assert measured_supervised_tokens(tokens, ObjectiveConfig(name="arc"), index) == n + len(captions)
    assert measured_supervised_tokens(tokens, ObjectiveConfig(name="parallel"), index) == n
    mdc = measured_supervised_tokens(tokens, ObjectiveConfig(name="mdc", t_low=0.5, t_high=1.0), index, draws=64)
    assert mdc == pytest.approx(0.75 * n, rel=0.05)
    assert measured_supervised_tokens(tokens, ObjectiveConfig(name="clip"), None) == 0.0


def test_best_learning_rate_is_the_lowest_validation_loss_smaller_on_ties() -> None:
    losses = {"arc": {1e-3: 2.0, 2e-3: 1.5, 5e-4: 1.5}, "mdc": {1e-3: 3.0, 2e-3: 3.5, 5e-4: 3.2}, "clip": {}}
    assert best_learning_rates(losses) == {"arc": 5e-4, "mdc": 1e-3}


def _plan_runs(name: str) -> dict[str, dict]:
    return {r.run_id: r.parameters for r in load_plan(ROOT / "plans" / f"{name}.yaml").runs}


def _check_sweep_and_claims(by_id: dict[str, dict]) -> None:
    main = [p for rid, p in by_id.items() if rid.startswith("03_linear_probing")]
    assert len(main) == 3 and all(len(p["lrs"]) == 3 and p["parity"] for p in main)
    assert sum(rid.startswith("02_noise") for rid in by_id) == 3


def test_make_evidence_carries_the_sweep_parity_and_table4_and_central_claim_its_own_plan() -> None:
    by_id = _plan_runs("cpu_evidence")
    assert not any(p["position_signal"] for rid, p in by_id.items() if rid.startswith("03"))  # make central-claim
    central = _plan_runs("cpu_central_claim")
    assert {rid.split("__")[0] for rid in central} == {"03_central", "03_features"} and len(central) == 6
    assert all(p["steps"] == 1600 for p in central.values())
    _check_sweep_and_claims(by_id)
    t4 = next(p for rid, p in by_id.items() if rid.startswith("02_noise"))
    assert [0.5, 1.0] in t4["schedules"] and {0.5, 0.75} <= set(t4["bert_ratios"])
    assert {p["steps"] for p in by_id.values()} == {400}  # one budget: its claims are about 400-step models


def test_make_evidence_more_carries_the_annealed_budget_curve_table5_table2_and_long_captions() -> None:
    by_id = _plan_runs("cpu_evidence_more")
    annealed = [p for rid, p in by_id.items() if rid.startswith("03_b1600")]
    assert len(annealed) == 3 and all(p["steps"] == 1600 and not p.get("budgets") for p in annealed)
    assert all(p["overrides"]["train.warmup_steps"] == 160 for p in annealed)  # 10% of the run, as at 400 steps
    assert sum(rid.startswith("03_linear_probing") for rid in by_id) == 3  # the curve's 400-step point
    t5 = next(p for rid, p in by_id.items() if rid.startswith("02_t5"))
    assert len(t5["schedules"]) == 4
    assert sum(rid.startswith("04_") for rid in by_id) == 3
    assert sum(p.get("captions") == "long" for p in by_id.values()) == 3
    more, core = load_plan(ROOT / "plans" / "cpu_evidence_more.yaml"), _plan_runs("cpu_evidence")
    shared = next(iter(core.values()))  # the same data and model cache as make evidence
    assert more.runs[0].parameters["models_dir"] == shared["models_dir"]


def test_the_gpu_evidence_plan_carries_the_budget_curve_sweep_parity_and_claims() -> None:
    by_id = _plan_runs("gpu_evidence")
    budget = next(p for rid, p in by_id.items() if rid.startswith("03_budget"))
    assert len(budget["budgets"]) >= 4 and max(budget["budgets"]) == budget["steps"]
    every = budget["overrides"]["train.ckpt_every"]
    assert all(b % every == 0 for b in budget["budgets"])
    assert budget["overrides"]["train.keep_last"] >= len(budget["budgets"])
    _check_sweep_and_claims(by_id)
    assert any(p.get("captions") == "long" and p.get("objectives", ["clip"]) for p in by_id.values())
    assert any(rid.startswith("03_central") and p["position_limit"] == 1000
               for rid, p in by_id.items())  # the central claim, both caption kinds


def test_notebook_03_declares_the_evidence_parameters_off_by_default() -> None:
    """budgets, lrs and parity exist (the evidence plans set them) and cost nothing unless set (make demo)."""
    from mdc_workbench.runs.plans import notebook_parameters

    params = notebook_parameters(ROOT / "notebooks" / "03_linear_probing.ipynb")
    assert {k: params[k]["default"] for k in ("budgets", "lrs", "parity")} == {
        "budgets": "[]", "lrs": "[]", "parity": "False"}


def test_the_validation_loss_scores_every_swept_objective_clip_included(tmp_path: Path) -> None:
    """Notebook 03 sweeps CLIP's learning rate like ARC's and MDC's: the validation loss is each objective's own
    loss under fixed draws, finite and the same on a second call, for CLIP too."""
    from mdc_core.config import DataConfig, RunConfig
    from mdc_core.factory import create_model
    from mdc_workbench.data import write_synthetic_dataset
    from mdc_workbench.notebooks.tuning import validation_loss
    from tests.conftest import micro_config

    data = tmp_path / "data"
    write_synthetic_dataset(data, 8, image_size=32, n_val=12, n_test=2, n_compgen=2, progress=False, workers=1)
    for objective in ("clip", "arc", "mdc"):
        torch.manual_seed(0)
        cfg = RunConfig(model=micro_config(context_length=32), objective=ObjectiveConfig(name=objective),
                        data=DataConfig(path=str(data)))
        model = create_model(cfg, objective)
        first = validation_loss(model, cfg, limit=12, batch_size=6, draws=2)
        assert first > 0 and first == pytest.approx(validation_loss(model, cfg, limit=12, batch_size=6, draws=2))


def _table1(gains: dict[str, float]) -> dict:
    rows = {m: {"top-1": 50.0 + g, "gain": g} for m, g in gains.items()}
    rows["random init (GAP)"] = {"top-1": 50.0}
    return {"tables": {"table1": {"metric": "probe", "values": rows}}}


def _budget_runs() -> list[tuple[str, dict, dict]]:
    """3 seeds at the plan's 400 steps (MDC gain 2, 3, 4) and 3 separately annealed 1600-step runs (10, 12, 14)."""
    runs = [(f"03__seed={s}", {"steps": 400, "train_seed": s}, _table1({"MDC": 2.0 + s, "ARC": 5.0 + s}))
            for s in range(3)]
    runs += [(f"03_b1600__seed={s}", {"steps": 1600, "train_seed": s}, _table1({"MDC": 10.0 + 2 * s, "ARC": 6.0 + s}))
             for s in range(3)]
    return runs


def test_runs_at_another_budget_are_other_models_not_repeats() -> None:
    from mdc_workbench.runs.evidence import gather_runs

    gathered = gather_runs(_budget_runs(), reference=400)
    # the 400-step table1 holds only the 400-step seeds: no 1600-step row leaks in as "MDC (run id)"
    assert set(gathered["table1"]["cells"]) == {"MDC", "ARC", "random init (GAP)"}
    assert gathered["table1"]["cells"]["MDC"]["gain"].values == {0: 2.0, 1: 3.0, 2: 4.0}
    assert gathered["table1_at_1600_steps"]["cells"]["MDC"]["gain"].values == {0: 10.0, 1: 12.0, 2: 14.0}
    curve = gathered[bc.ANNEALED_TABLE]
    assert set(curve["cells"]) == {"MDC", "ARC"}  # the random-init row has no gain
    assert curve["cells"]["MDC"]["400 steps"].values == {0: 2.0, 1: 3.0, 2: 4.0}
    assert curve["cells"]["MDC"]["1600 steps"].values == {0: 10.0, 1: 12.0, 2: 14.0}
    est = curve["cells"]["MDC"]["1600 steps"].estimate()  # mean 12, sd 2, t(0.975, 2) = 4.303: 12 +- 4.97
    assert est.mean == pytest.approx(12.0)
    assert est.high - est.mean == pytest.approx(4.302653 * 2.0 / 3 ** 0.5, rel=1e-4)
    assert curve["setting"] == "400, 1600 steps; 3 training seeds"


def test_one_budget_makes_no_annealed_curve_and_the_reference_is_the_plans_budget(tmp_path: Path) -> None:
    from mdc_workbench.runs.evidence import gather_runs, reference_steps
    from mdc_workbench.runs.summary import plan_steps

    assert bc.ANNEALED_TABLE not in gather_runs(_budget_runs()[:3])
    assert gather_runs(_budget_runs())["table1"]["cells"]["MDC"]["gain"].values[0] == 10.0  # a tie: 1600 steps
    plan = tmp_path / "p.yaml"
    plan.write_text("name: p\nparameters: {steps: 400}\nnotebooks: []\n")
    assert plan_steps(plan) == 400 and plan_steps(tmp_path / "missing.yaml") is None
    assert reference_steps([{"steps": 400}, {"steps": 400}, {"steps": 1600}]) == 400
    assert reference_steps([{"steps": 400}, {"steps": 8000}]) == 8000  # a tie: the longer-trained runs
    assert reference_steps([{"lr": 1}]) is None
    assert bc.steps_table_name("table1", 800) == "table1_at_800_steps"
    assert bc.steps_table_name("table1_at_1600_steps", 800) == "table1_at_1600_steps"


def test_plot_annealed_budget_writes_a_png(tmp_path: Path) -> None:
    from mdc_workbench.runs.evidence import gather_runs

    path = bc.plot_annealed_budget(gather_runs(_budget_runs(), 400)[bc.ANNEALED_TABLE], tmp_path / "b.png")
    assert path.stat().st_size > 5000


def test_runs_at_other_training_set_sizes_make_the_data_scaling_table() -> None:
    from mdc_workbench.runs.evidence import SCALING_TABLE, gather_runs

    runs = [(f"03_n{n}__seed={s}", {"steps": 400, "n_train": n, "train_seed": s},
             _table1({"MDC": g + s, "ARC": 5.0 + s})) for n, g in ((20000, 10.0), (5000, 4.0)) for s in range(3)]
    gathered = gather_runs(runs, reference=400, reference_size=20000)
    assert gathered["table1"]["cells"]["MDC"]["gain"].values == {0: 10.0, 1: 11.0, 2: 12.0}  # 20000 images only
    assert gathered["table1_at_5000_images"]["cells"]["MDC"]["gain"].values == {0: 4.0, 1: 5.0, 2: 6.0}
    scaling = gathered[SCALING_TABLE]
    assert scaling["sizes"] == [5000, 20000] and scaling["cells"]["MDC @ 5000"]["gain"].values == {0: 4.0, 1: 5.0,
                                                                                                 2: 6.0}
    assert scaling["setting"] == "5000, 20000 training images, 400 steps; 3 training seeds"
    assert SCALING_TABLE not in gather_runs(runs[:3], reference=400)  # one size: nothing to scale


def test_the_central_claims_tables_name_the_caption_style_they_were_measured_on() -> None:
    from mdc_workbench.runs.evidence import run_setting

    params = {"preset": "tiny_fast", "steps": 1600, "n_train": 20000, "difficulty": "easy", "captions": "short"}
    assert "easy, short and two-clause captions" in run_setting(params, "central_claim")
    assert "linked shape-colour, either order, captions" in run_setting(params, "feature_order")
    assert "(easy, short captions)" in run_setting(params, "table1")
