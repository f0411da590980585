"""Issue 61 item 4: one command recomputes every table interval and verdict from kept data on a CPU, without a
model: ``mdc recompute FOLDER`` (the per-item files under it) or ``mdc recompute SUMMARY_JSON`` (a committed plan
summary's per-seed values)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from mdc_workbench.cli.runs import cmd_recompute
from mdc_workbench.eval.recompute import recompute

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "tests" / "items_sample"


def _run(path: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, dict]:
    cmd_recompute(argparse.Namespace(path=str(path), json=str(out)))
    return capsys.readouterr().out, json.loads(out.read_text())


def test_recompute_command_on_the_committed_sample(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text, record = _run(SAMPLE, tmp_path / "r.json", capsys)
    direct = recompute(SAMPLE)
    assert record["runs"] == direct["runs"] == [f"03_sample__seed={s}" for s in (0, 1, 2)]
    for name, rows in direct["tables"].items():  # every cell, as recompute() gives it
        for row, cols in rows.items():
            for col, est in cols.items():
                got = record["tables"][name][row][col]
                assert got["mean"] == pytest.approx(est.mean) and got["n"] == est.n, (name, row, col)
    verdicts = {c["key"]: c["verdict"] for c in record["claims"]}
    assert verdicts["central_claim"] == "holds"  # the sample is built so that the paper's sentence holds
    assert "Recomputed from 3 run(s)" in text and "central_claim" in text


def test_recompute_command_reproduces_the_quoted_intervals_from_a_committed_summary(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/results.md quotes the mechanism check's interaction -1.3683 [-1.6477, -1.0890] and the features' mean
    penalty difference +4.134 [-1.489, +9.757] from gpu_central_claim_1600 (t over 3 seeds)."""
    _, record = _run(ROOT / "docs" / "gpu_central_claim_1600_summary.json", tmp_path / "g.json", capsys)
    claims = {c["key"]: c for c in record["claims"]}
    mech = claims["central_claim_mechanism"]["parts"][0]["difference"]
    assert (round(mech["mean"], 4), round(mech["low"], 4), round(mech["high"], 4)) == (-1.3683, -1.6477, -1.0890)
    mean_penalty = next(p for p in claims["feature_order_attributes"]["parts"] if p["column"] == "late penalty")
    d = mean_penalty["difference"]
    assert (round(d["mean"], 3), round(d["low"], 3), round(d["high"], 3)) == (4.134, -1.489, 9.757)


def test_recompute_command_names_a_missing_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        cmd_recompute(argparse.Namespace(path=str(tmp_path / "nope"), json=None))
    with pytest.raises(ValueError, match="no items.npz under"):
        cmd_recompute(argparse.Namespace(path=str(tmp_path), json=None))


def test_a_plan_summary_gathers_its_runs_per_item_files(tmp_path: Path) -> None:
    import shutil

    from mdc_workbench.runs.summary import RunResult, write_summary

    out = tmp_path / "plan"
    results = []
    for run in sorted(p.name for p in SAMPLE.iterdir() if p.is_dir()):
        shutil.copytree(SAMPLE / run, out / run)
        results.append(RunResult(run, "03_linear_probing.ipynb", "done", out / run))
    write_summary(out, results, name="plan", source=tmp_path / "absent.yaml")
    record = json.loads((out / "summary.json").read_text())
    assert record["items"] == [f"{r.run_id}/items.npz" for r in results]
    assert f"`mdc recompute {out}` rebuilds every table" in (out / "summary.md").read_text()
    assert recompute(out)["runs"] == recompute(SAMPLE)["runs"]
