"""Issue 61 item 3: the fingerprint a plan's verdicts are declared under covers everything that can change a verdict:
the measurement code, the data and caption generators, the plan file and its notebooks (beside the claims, margins
and deciding code that tests/workbench/test_runs_evidence.py changes). Each is changed here in a copy of the
checkout's files and only its own group's hash moves."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mdc_workbench.runs import declared
from mdc_workbench.runs.declared import DATA, MEASUREMENT, ROOT, declaration_lines, fingerprint, plan_files


@pytest.fixture
def copy_root(tmp_path: Path) -> Path:
    """The measurement and data files copied under a fresh root."""
    root = tmp_path / "checkout"
    for rel in (*MEASUREMENT, *(str(p.relative_to(ROOT)) for p in (ROOT / DATA).glob("*.py"))):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, root / rel)
    return root


def _plan(folder: Path) -> Path:
    (folder / "nb.ipynb").write_text('{"cells": []}\n')
    plan = folder / "p.yaml"
    plan.write_text("seeds: [0, 1]\nparameters: {steps: 1600}\nnotebooks:\n  - path: nb.ipynb\n")
    return plan


def _moved(before: dict[str, str], after: dict[str, str]) -> set[str]:
    return {k for k in before if before[k] != after[k]}


@pytest.mark.parametrize(("rel", "group"), [("mdc_workbench/eval/central_claim.py", "measurement"),
                                            ("mdc_workbench/eval/claim_stats.py", "measurement"),
                                            ("mdc_workbench/seed_stack/claim.py", "measurement"),
                                            ("mdc_workbench/eval/content_words.py", "measurement"),
                                            ("mdc_workbench/eval/stats.py", "measurement"),
                                            ("mdc_workbench/eval/probe.py", "measurement"),
                                            ("mdc_workbench/notebooks/probe_report.py", "measurement"),
                                            ("mdc_workbench/data/captions.py", "data"),
                                            ("mdc_workbench/data/scene.py", "data")])
def test_changing_the_measurement_or_a_generator_moves_its_group_only(copy_root: Path, tmp_path: Path, rel: str,
                                                                      group: str) -> None:
    plan = _plan(tmp_path)
    before = fingerprint(plan, root=copy_root)
    assert before == fingerprint(plan, root=copy_root)  # deterministic
    with (copy_root / rel).open("a") as fh:
        fh.write("\n# changed\n")
    assert _moved(before, fingerprint(plan, root=copy_root)) == {group, "definitions"}


def test_a_new_data_module_moves_the_data_group(copy_root: Path) -> None:
    before = fingerprint(None, root=copy_root)
    (copy_root / DATA / "new_generator.py").write_text("X = 1\n")
    assert _moved(before, fingerprint(None, root=copy_root)) == {"data", "definitions"}


def test_changing_the_plan_file_or_its_notebook_moves_the_plan_group(copy_root: Path, tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    assert plan_files(plan) == [plan, tmp_path / "nb.ipynb"]
    before = fingerprint(plan, root=copy_root)
    plan.write_text(plan.read_text().replace("seeds: [0, 1]", "seeds: [0, 1, 2]"))
    after_plan = fingerprint(plan, root=copy_root)
    assert _moved(before, after_plan) == {"plan", "definitions"}
    (tmp_path / "nb.ipynb").write_text('{"cells": [1]}\n')
    assert _moved(after_plan, fingerprint(plan, root=copy_root)) == {"plan", "definitions"}


def test_changing_a_deciding_constant_or_claim_moves_its_group(monkeypatch: pytest.MonkeyPatch) -> None:
    from mdc_workbench.eval import paper

    before = fingerprint()
    monkeypatch.setattr(paper, "FLAT_MARGIN", 0.25)
    assert _moved(before, fingerprint()) == {"constants", "definitions"}
    monkeypatch.undo()
    monkeypatch.setattr(paper, "PAPER_CLAIMS", paper.PAPER_CLAIMS[:-1])
    assert _moved(before, fingerprint()) == {"claims", "definitions"}


def test_a_record_from_before_the_new_groups_compares_what_it_has(tmp_path: Path) -> None:
    now = fingerprint(_plan(tmp_path))
    old = {g: now[g] for g in declared.RECORDED_SINCE_2026_11_28} | {"definitions": "000000000000"}
    line = declaration_lines(old, now)[0]
    assert line.startswith("Definitions") and "were not yet fingerprinted then" in line
    assert "the measurement code" in line and "the plan file" in line
    changed = {**old, "constants": "111111111111"}
    assert "Changed: the margins and statistical constants." in declaration_lines(changed, now)[0]
    moved = {**now, "measurement": "222222222222"}
    assert "Changed: the measurement code." in declaration_lines(moved, now)[0]
