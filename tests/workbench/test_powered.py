"""Issue 61 item 3: power before the run, mechanically. A plan that decides a claim declares its effect or margin and
the variance of earlier runs (``decides``); ``mdc runs`` computes the seeds it needs for 80% power, refuses to start
it short of them unless ``--underpowered-ok``, and the summary then says so (mdc_workbench/runs/powered.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mdc_workbench.runs.plans import load_plan
from mdc_workbench.runs.powered import POWER_FILE, check, read_decides, refusal
from mdc_workbench.runs.runner import run_plan

from .test_runs import write_plan
from .test_runs_evidence import seeded  # noqa: F401  (fixture)

# per-seed differences -2, 0, 2: seed variance 4; effect 2 needs 10 seeds (3.150 x 2 / sqrt(10) = 1.99 <= 2 <
# 3.201 x 2 / 3 = 2.13, the multiples of stats.detectable_difference at df 9 and 8; tests/workbench/test_power.py)
DECLARED = {"claim": "table4", "relation": ">", "effect": 2.0, "per_seed": [-2.0, 0.0, 2.0], "from": "earlier runs",
            "minutes_per_seed": 30}


def test_the_seeds_needed_by_hand() -> None:
    [d] = read_decides([DECLARED], "decides")
    assert d.variance.seed == pytest.approx(4.0)
    short, enough = check([d], 9, 512)[0], check([d], 10, 512)[0]
    assert short.seeds_needed == enough.seeds_needed == 10 and enough.minutes_needed == 300
    assert not short.enough and enough.enough and short.power < 0.8 <= enough.power
    assert refusal([enough]) is None
    assert "needs 10" in refusal([short]) and "--underpowered-ok" in refusal([short])
    assert check([d], 1, 512)[0].power == 0.0  # one seed decides nothing


def test_declared_components_count_the_item_term() -> None:
    """Declared components: the shared test items' variance (50 points^2 over 100 items: 0.5 per design) adds to
    every design's variance, so the same seeds give less power than with the seed's term alone."""
    base = {k: v for k, v in DECLARED.items() if k != "per_seed"}
    [seed_only] = read_decides([{**base, "components": {"seed": 4.0}}], "decides")
    [with_items] = read_decides([{**base, "components": {"seed": 4.0, "item": 50.0}, "items": 100}], "decides")
    assert check([seed_only], 10, 100)[0].seeds_needed == 10
    assert check([with_items], 10, 100)[0].power < check([seed_only], 10, 100)[0].power
    assert check([with_items], 10, 100)[0].seeds_needed > 10


@pytest.mark.parametrize(("change", "message"), [
    ({"claim": "nope"}, "claim 'nope' is not a key of PAPER_CLAIMS"),
    ({"relation": ">="}, "relation must be one of"),
    ({"effect": 0}, "effect must be a positive number"),
    ({"relation": "noninferior"}, "margin must be a positive number"),
    ({"from": " "}, "'from' must name the earlier runs"),
    ({"components": {"seed": 1.0}}, "exactly one of per_seed, components"),
    ({"per_seed": [1.0]}, "need >= 2 finite per-seed values"),
    ({"per_seed": "1, 2"}, "per_seed must be a list"),
    ({"seeds": 3}, "unknown key(s) ['seeds']"),
])
def test_bad_declarations_are_refused(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        read_decides([{**DECLARED, **change}], "plan p.yaml: decides")
    with pytest.raises(ValueError, match="components must map"):
        read_decides([{**{k: v for k, v in DECLARED.items() if k != "per_seed"}, "components": {"x": 1}}], "d")


def _decl_yaml() -> str:
    return ("decides:\n  - {claim: table4, relation: '>', effect: 2.0, per_seed: [-2.0, 0.0, 2.0], "
            "from: earlier runs}\n")


def test_a_plan_short_of_its_seeds_is_refused_unless_underpowered_ok(seeded: Path) -> None:  # noqa: F811
    plan = load_plan(write_plan(seeded / "w.yaml", f"output_root: {seeded / 'out'}\nseeds: [0, 1]\n" + _decl_yaml()
                                + "notebooks: [probe.ipynb]\n"), root=seeded)
    assert plan.seeds == 2 and [c.seeds_needed for c in plan.power_checks()] == [10]
    with pytest.raises(ValueError, match="fall short of 80% power for table4 .2 seeds"):
        run_plan(plan, progress=False, cwd=seeded)
    assert not (seeded / "out" / "w").exists()  # refused before anything ran
    from mdc_workbench.cli import build_parser
    from mdc_workbench.cli.runs import cmd_runs

    args = build_parser().parse_args(["runs", str(plan.source), "--quiet"])
    with pytest.raises(SystemExit, match="--underpowered-ok"):
        cmd_runs(args)
    run_plan(plan, progress=False, cwd=seeded, underpowered_ok=True)
    out = seeded / "out" / "w"
    record = json.loads((out / POWER_FILE).read_text())
    assert record["underpowered_ok"] is True and record["checks"][0]["seeds_needed"] == 10
    summary = (out / "summary.md").read_text()
    assert "80% needs 10 seeds [UNDERPOWERED]" in summary
    assert "**Started with --underpowered-ok: the seeds fall short of 80% power for `table4`" in summary


def test_a_plan_with_enough_seeds_starts_and_says_so(seeded: Path) -> None:  # noqa: F811
    text = _decl_yaml().replace("per_seed: [-2.0, 0.0, 2.0]", "per_seed: [-0.2, 0.0, 0.2]")  # variance 0.04
    plan = load_plan(write_plan(seeded / "v.yaml", f"output_root: {seeded / 'out'}\nseeds: [0, 1, 2]\n" + text
                                + "notebooks: [probe.ipynb]\n"), root=seeded)
    assert plan.power_checks()[0].enough
    run_plan(plan, progress=False, cwd=seeded)
    summary = (seeded / "out" / "v" / "summary.md").read_text()
    assert "[enough]" in summary and "underpowered-ok" not in summary


def test_a_plan_that_declares_nothing_keeps_no_power_file(tmp_path: Path) -> None:
    from mdc_workbench.runs.powered import record, summary_lines

    [d] = read_decides([DECLARED], "decides")
    record(tmp_path, check([d], 2, 512), underpowered_ok=True)
    assert (tmp_path / POWER_FILE).is_file() and summary_lines(tmp_path)
    record(tmp_path, [], underpowered_ok=False)  # the plan no longer declares anything
    assert not (tmp_path / POWER_FILE).exists() and summary_lines(tmp_path) == []
