"""Issue 59 item 2: a plan's ``output_root`` is checked as its ids are. The runner writes into, and clears folders
of, only a plan folder it made (new, empty, or holding its marks), and writes nothing there through a link."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mdc_workbench.cli import main
from tests.workbench.test_runs import write_notebook, write_plan


def test_an_output_root_naming_somebody_elses_folder_writes_and_clears_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`output_root: /some/folder`, `name: victimdir`, `id: keep`: `keep/precious.txt` survives and no summary or
    declared.json is written there; one line names the folder."""
    root = tmp_path / "some" / "folder"
    keep = root / "victimdir" / "keep"
    keep.mkdir(parents=True)
    (keep / "precious.txt").write_text("years of work")
    write_notebook(tmp_path / "toy.ipynb")
    plan = write_plan(tmp_path / "p.yaml", f"name: victimdir\noutput_root: {root}\nnotebooks:\n"
                                           "  - path: toy.ipynb\n    id: keep\n")
    assert main(["runs", str(plan), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mdc: error: ") and "\n" not in err and "did not write" in err
    assert (keep / "precious.txt").read_text() == "years of work"
    assert sorted(os.listdir(root / "victimdir")) == ["keep"] and os.listdir(keep) == ["precious.txt"]


def test_a_run_folder_without_the_runners_marks_is_not_cleared(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A plan folder the runner made (it holds a finished run), and a run folder in it holding another's files: the
    run folder is not cleared."""
    write_notebook(tmp_path / "toy.ipynb")
    out = tmp_path / "out"
    plan = write_plan(tmp_path / "p.yaml", f"name: mine\noutput_root: {out}\nnotebooks:\n"
                                           "  - path: toy.ipynb\n    id: a\n  - path: toy.ipynb\n    id: b\n")
    (out / "mine" / "b").mkdir(parents=True)
    (out / "mine" / "b" / "thesis.txt").write_text("years of work")
    (out / "mine" / "a").mkdir()
    (out / "mine" / "a" / "parameters.json").write_text("{}")
    assert main(["runs", str(plan), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "b" in err and "refusing to clear it" in err
    assert (out / "mine" / "b" / "thesis.txt").read_text() == "years of work"


@pytest.mark.parametrize("name", ["summary.md", "summary.json", "declared.json"])
def test_a_plan_output_that_is_a_link_is_never_written_through(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    """Issue 59 item 1 (plan outputs): `PLAN/summary.md -> elsewhere` is one line, the target keeps its bytes."""
    write_notebook(tmp_path / "toy.ipynb")
    out = tmp_path / "out"
    plan = write_plan(tmp_path / "p.yaml", f"name: mine\noutput_root: {out}\nnotebooks:\n  - toy.ipynb\n")
    (out / "mine").mkdir(parents=True)
    important = tmp_path / "important.txt"
    important.write_text("years of work")
    (out / "mine" / name).symlink_to(important)
    assert main(["runs", str(plan), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "symbolic link" in err and name in err
    assert important.read_text() == "years of work"
