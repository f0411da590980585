"""A plan's `name` and run `id`s are single folder names: a plan never clears or writes outside its own folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mdc_workbench.cli import main
from mdc_workbench.runs.plans import load_plan
from mdc_workbench.runs.runner import execute_run, run_plan
from tests.workbench.test_runs import write_notebook, write_plan


def victim(root: Path) -> Path:
    """A folder of somebody else's files, which no plan may touch."""
    folder = root / "victim"
    (folder / "deep").mkdir(parents=True)
    (folder / "thesis.txt").write_text("years of work")
    (folder / "deep" / "data.csv").write_text("a,b\n1,2\n")
    return folder


def intact(folder: Path) -> bool:
    return ((folder / "thesis.txt").read_text() == "years of work"
            and (folder / "deep" / "data.csv").read_text() == "a,b\n1,2\n"
            and sorted(p.name for p in folder.rglob("*")) == ["data.csv", "deep", "thesis.txt"])


@pytest.mark.parametrize("entry, top", [
    ("    id: ../../victim\n", ""),
    ("    id: {victim}\n", ""),  # an absolute folder
    ("    id: ..\n", ""),
    ("    id: .\n", ""),
    ("    id: _models\n", ""),  # the plan's own model cache
    ("    id: \"a\\0b\"\n", ""),
    ("", "name: \"..\"\n"),
    ("", "name: .\n"),
])
def test_a_plan_whose_id_or_name_is_a_path_is_refused_and_the_victim_survives(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], entry: str, top: str) -> None:
    folder = victim(tmp_path)
    out = tmp_path / "a" / "b"
    out.mkdir(parents=True)
    (tmp_path / "a" / "summary.md").write_text("the parent's own summary")
    write_notebook(tmp_path / "toy.ipynb")
    plan_file = write_plan(tmp_path / "p.yaml", f"{top}output_root: {out}\nnotebooks:\n  - path: toy.ipynb\n"
                                                + entry.format(victim=folder))
    with pytest.raises(ValueError, match="must be one folder name"):
        load_plan(plan_file, root=tmp_path)
    for extra in (["--dry-run"], ["--quiet"]):
        assert main(["runs", str(plan_file), *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("mdc: error: ") and "must be one folder name" in err and "\n" not in err
    assert intact(folder)
    assert (tmp_path / "a" / "summary.md").read_text() == "the parent's own summary"
    assert sorted(os.listdir(out)) == []


def test_the_runner_itself_never_clears_a_folder_outside_the_plan(tmp_path: Path) -> None:
    """Whatever the plan's checks let through, the code that clears a run folder checks where it is first."""
    folder = victim(tmp_path)
    write_notebook(tmp_path / "toy.ipynb")
    plan = load_plan(write_plan(tmp_path / "p.yaml", f"output_root: {tmp_path / 'out'}\nnotebooks:\n"
                                                     "  - toy.ipynb\n"), root=tmp_path)
    plan_dir = plan.out_dir
    plan_dir.mkdir(parents=True)
    with pytest.raises(ValueError, match="is not the folder"):
        execute_run(plan.runs[0], plan_dir / ".." / ".." / "victim", kernel="python3", plan_dir=plan_dir)
    (plan_dir / "toy").symlink_to(folder, target_is_directory=True)  # a link inside the plan to elsewhere
    with pytest.raises(ValueError, match="is not the folder"):
        execute_run(plan.runs[0], plan_dir / "toy", kernel="python3", plan_dir=plan_dir)
    plan.runs[0].run_id = "../../victim"  # a RunSpec built by hand, past load_plan's checks
    with pytest.raises(ValueError, match="is not the folder"):
        run_plan(plan, progress=False, cwd=tmp_path)
    assert intact(folder)


def test_a_changed_notebook_makes_its_finished_run_pending(tmp_path: Path) -> None:
    """The skip of finished runs is keyed by what produced them: the parameters and the notebook's content."""
    notebook = write_notebook(tmp_path / "toy.ipynb")
    plan_file = write_plan(tmp_path / "p.yaml", f"output_root: {tmp_path / 'out'}\nnotebooks:\n  - toy.ipynb\n")
    assert [r.status for r in run_plan(load_plan(plan_file, root=tmp_path), progress=False, cwd=tmp_path)] == ["done"]
    assert [r.status for r in run_plan(load_plan(plan_file, root=tmp_path), progress=False,
                                       cwd=tmp_path)] == ["skipped"]
    write_notebook(notebook, body="import json, pathlib\n(pathlib.Path(output_dir) / 'metrics.json').write_text("
                                  "json.dumps({'metrics': {'edited': 1}}))\n")
    again = run_plan(load_plan(plan_file, root=tmp_path), progress=False, cwd=tmp_path)
    assert [r.status for r in again] == ["done"]
    assert '"edited": 1' in (again[0].run_dir / "metrics.json").read_text()
