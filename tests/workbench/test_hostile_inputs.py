"""Files from strangers are bounded: a YAML alias bomb in a plan, JSON nested past the interpreter's stack in a
run's config.json or an `mdc export --metrics` file are one-line errors, never a memory blow-up or RecursionError."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mdc_core.config import ConfigError, RunConfig
from mdc_workbench.cli import main
from mdc_workbench.runs.plans import bounded_yaml, load_plan
from tests.workbench.test_runs import write_notebook

DEEP = "[" * 100_000 + "]" * 100_000  # deeper than any interpreter stack


def alias_bomb() -> str:
    """About 0.5 KB that expands to 9**10 (3.5 billion) strings."""
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    return "\n".join([*lines, "notebooks: *a9", ""])


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("mdc: error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def test_a_yaml_alias_bomb_in_a_plan_is_refused_by_dry_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "bomb.yaml"
    plan.write_text(alias_bomb())
    assert len(plan.read_bytes()) < 1024
    assert main(["runs", str(plan), "--dry-run"]) == 2
    assert "alias bomb" in one_line_error(capsys)
    for text, problem in (("a: &a [*a]\nnotebooks: *a\n", "refers to itself"), (DEEP, "nested too deeply")):
        plan.write_text(text)
        assert main(["runs", str(plan), "--dry-run"]) == 2
        assert problem in one_line_error(capsys)


def test_plain_aliases_in_a_plan_still_work(tmp_path: Path) -> None:
    write_notebook(tmp_path / "toy.ipynb")
    plan = tmp_path / "p.yaml"
    plan.write_text(f"output_root: {tmp_path / 'out'}\nparameters: &base {{value: 3}}\nnotebooks:\n"
                    "  - path: toy.ipynb\n    parameters: *base\n")
    assert load_plan(plan, root=tmp_path).runs[0].parameters == {"value": 3}
    assert bounded_yaml("") is None
    with pytest.raises(ValueError, match="more than 10 items"):
        bounded_yaml("a: &a [1, 2, 3, 4]\nb: [*a, *a, *a]\n", max_nodes=10)


def test_a_deeply_nested_config_json_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.workbench.test_eval_compositionality import make_run

    run = make_run(tmp_path)
    config = next((run / "checkpoints").glob("step_*")) / "config.json"
    config.write_text(DEEP)
    with pytest.raises(ConfigError, match="nested too deeply"):
        RunConfig.load(config)
    assert main(["sample", "--run", str(run), "--image", str(tmp_path / "none.png")]) == 2
    assert "nested too deeply" in one_line_error(capsys)


def test_a_deeply_nested_metrics_file_for_export_is_one_line(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from tests.workbench.test_eval_compositionality import make_run

    run = make_run(tmp_path)
    deep = tmp_path / "deep.json"
    deep.write_text(DEEP)
    (run / "metrics.jsonl").write_text(DEEP + "\n" + json.dumps({"step": 0, "loss": 1.0}) + "\n")
    assert main(["export", str(run), "--out", str(tmp_path / "exported"), "--metrics", str(deep)]) == 2
    assert "--metrics file" in (err := one_line_error(capsys)) and "nested too deeply" in err
    shutil.rmtree(tmp_path / "exported", ignore_errors=True)
