"""Plans repeated over training seeds, the summary's intervals and verdicts, and the runner's view of a
notebook's own progress (mdc_workbench.runs.plans, mdc_workbench.runs.evidence,
mdc_workbench.runs.progress)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mdc_workbench.runs import progress
from mdc_workbench.runs.plans import SEED_PARAM, load_plan
from mdc_workbench.runs.runner import execute_run, run_plan

from .test_runs import write_notebook, write_plan

SEEDED_PARAMS = ('output_dir: str = "."  # run folder\ntrain_seed: int = 0  # training seed\n'
                 'gap: float = 10.0  # CLIP minus MDC')
SEEDED_BODY = """\
import json, pathlib
out = pathlib.Path(output_dir)
(out / "figures" / "dot.txt").write_text("x")
s = train_seed
values = {"CLIP": 60.0 + gap + 2 * s, "MDC": 60.0 + s, "ARC": 70.0 - s}
items = {"MDC": {"top-1": [60.0 + s] * 10}, "ARC": {"top-1": [70.0 - s] * 10}}  # per test image, mean = value
table = {"metric": "toy top-1 %", "values": {k: {"top-1": v} for k, v in values.items()}, "items": items}
table["values"]["ARC"]["gain"] = 16.0  # Table 1's margin: 5% of ARC's gain = 0.8 points
metrics = {"metrics": {"seed": s}, "tables": {"table1": table}}
(out / "metrics.json").write_text(json.dumps(metrics))
"""


@pytest.fixture
def seeded(tmp_path: Path) -> Path:
    write_notebook(tmp_path / "probe.ipynb", SEEDED_PARAMS, SEEDED_BODY)
    write_notebook(tmp_path / "toy.ipynb")  # declares no train_seed
    return tmp_path


def test_seeds_expand_into_per_seed_runs(seeded: Path) -> None:
    text = ("seeds: [0, 1, 2]\nnotebooks:\n  - probe.ipynb\n  - path: toy.ipynb\n    grid: {value: [1, 2]}\n"
            "  - path: probe.ipynb\n    id: once\n    seeds: [7]\n")
    plan = load_plan(write_plan(seeded / "p.yaml", text), root=seeded)
    ids = [r.run_id for r in plan.runs]
    assert ids == ["probe__seed=0", "probe__seed=1", "probe__seed=2", "toy__value=1", "toy__value=2", "once__seed=7"]
    assert [r.parameters.get(SEED_PARAM) for r in plan.runs] == [0, 1, 2, None, None, 7]


@pytest.mark.parametrize("text, message", [
    ("seeds: [0, 0]\nnotebooks: [probe.ipynb]\n", "lists a seed twice"),
    ("seeds: []\nnotebooks: [probe.ipynb]\n", "non-empty list of non-negative integers"),
    ("seeds: [1.5]\nnotebooks: [probe.ipynb]\n", "non-empty list of non-negative integers"),
    ("notebooks:\n  - path: toy.ipynb\n    seeds: [0, 1]\n", "needs a 'train_seed' parameter"),
    ("notebooks:\n  - path: probe.ipynb\n    seeds: [0]\n    parameters: {train_seed: 3}\n", "not both"),
])
def test_bad_seeds_are_rejected(seeded: Path, text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_plan(write_plan(seeded / "bad.yaml", text), root=seeded)


def test_summary_shows_intervals_over_seeds_and_verdicts(seeded: Path) -> None:
    plan = load_plan(write_plan(seeded / "s.yaml", f"output_root: {seeded / 'out'}\nseeds: [0, 1, 2]\n"
                                                   "notebooks: [probe.ipynb]\n"), root=seeded)
    results = run_plan(plan, progress=False, cwd=seeded)
    assert [r.status for r in results] == ["done"] * 3
    summary = (seeded / "out" / "s" / "summary.md").read_text()
    # MDC = 60, 61, 62: mean 61, t-interval 61 +- 4.303 * 1 / sqrt(3) = [58.5, 63.5] (the hierarchical bootstrap
    # over seeds and the constant items lies inside it)
    assert "| MDC | 61.0 [58.5, 63.5] |" in summary and "| MDC | 68.7 | 77.2 | 80.6 |" in summary  # paper: Average
    assert "95% intervals over training seeds" in summary
    # MDC - ARC = -10, -8, -6 (paired): -8 +- 4.97 = [-13.0, -3.0], below -0.8: reversed
    assert "(the paper's claim): on alt-text captions MDC 'achieves performance comparable" in summary
    assert "-> **reversed over 3 seeds (inferior by more than the margin 0.8)**" in summary
    assert ("  - MDC >= ARC - 0.8 (= 0.05 x ARC gain) (top-1): difference -8.0 [-13.0, -3.0] (paired hierarchical "
            "bootstrap") in summary
    assert "One training seed" not in summary and "toy models, 1 steps" not in summary
    record = json.loads((seeded / "out" / "s" / "summary.json").read_text())
    assert record["claims"][0]["verdict"] == "reversed" and record["plan"] == "s"
    assert record["tables"]["table1"]["intervals"]["MDC"]["top-1"] == pytest.approx([58.515, 63.485], abs=1e-3)


def test_summary_with_one_seed_says_so_and_bootstraps_the_test_items(seeded: Path) -> None:
    plan = load_plan(write_plan(seeded / "one.yaml", f"output_root: {seeded / 'out'}\nnotebooks: [probe.ipynb]\n"),
                     root=seeded)
    run_plan(plan, progress=False, cwd=seeded)
    summary = (seeded / "out" / "one" / "summary.md").read_text()
    assert "One training seed per model" in summary and "test-set noise only" in summary
    assert "every verdict is about *this run*" in summary
    assert "| MDC | 60.0 [60.0, 60.0] |" in summary  # MDC has per-item scores: an interval (constant items)
    assert "| CLIP | 70.0 |" in summary  # no items, one seed: no interval
    assert ("MDC >= ARC - 0.8 (= 0.05 x ARC gain) (top-1): difference -10.0 [-10.0, -10.0] (paired bootstrap "
            "over 10 test items (test-set noise only)); detectable with 80% power: 0.0 (paper's effect or margin "
            "0.8): reversed") in summary
    assert "-> **reversed in this run (inferior by more than the margin 0.8)**" in summary
    assert "### Not measured in these runs" in summary and "Fig. 5" in summary  # not encoded: listed


def test_runner_shows_the_notebooks_own_progress(tmp_path: Path) -> None:
    body = ("import time\nfrom mdc_workbench.runs import progress\n"
            "for name in progress.track(['ARC', 'MDC'], 'train'):\n"
            "    progress.report(detail=f'step 5/10 of {name}')\n"
            "    time.sleep(1.6)\n"
            "import json, pathlib\n(pathlib.Path(output_dir) / 'metrics.json').write_text(json.dumps({}))\n")
    write_notebook(tmp_path / "slow.ipynb", 'output_dir: str = "."  # run folder', body)
    plan = load_plan(write_plan(tmp_path / "p.yaml", "notebooks: [slow.ipynb]\n"), root=tmp_path)
    seen: list[str] = []
    result = execute_run(plan.runs[0], tmp_path / "run", kernel="mdc", cwd=tmp_path, on_progress=seen.append)
    assert result.status == "done", result.error
    assert "train 1/2: ARC · step 5/10 of ARC" in seen and "train 2/2: MDC · step 5/10 of MDC" in seen
    assert progress.ENV not in __import__("os").environ  # the runner's environment is restored


def test_progress_helpers_are_no_ops_without_the_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(progress.ENV, raising=False)
    assert list(progress.track([1, 2], "x")) == [1, 2]
    progress.report("stage")  # nothing to write to: no error
    target = tmp_path / "p.json"
    monkeypatch.setenv(progress.ENV, str(target))
    assert list(progress.track({"a": 1}.items(), "probe")) == [("a", 1)]
    assert progress.describe(target) == "probe 1/1: a"
    progress.report(detail="step 3/9")
    assert progress.describe(target) == "probe 1/1: a · step 3/9"
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 4}\n{"step": 8}\n{"ste')
    with progress.watch_training(tmp_path / "run", 20, every_s=0.05):
        __import__("time").sleep(0.3)
    assert progress.describe(target).startswith("probe 1/1: a · step 8/20")


def test_the_kernels_own_stderr_goes_to_the_run_folder_not_the_terminal(tmp_path: Path, capfd) -> None:
    """What a kernel prints to its process's stderr (its log, the tracebacks of a kernel stopped by Ctrl-C) lands in
    RUN/kernel.log, so an interrupted plan shows one line; the notebook's own output is unaffected."""
    from mdc_workbench.runs.runner import KERNEL_LOG

    body = ("import os, json, pathlib\nos.write(2, b'KERNEL-NOISE\\n')\nprint('cell output')\n"
            "(pathlib.Path(output_dir) / 'metrics.json').write_text(json.dumps({}))\n")
    write_notebook(tmp_path / "noisy.ipynb", 'output_dir: str = "."  # run folder', body)
    plan = load_plan(write_plan(tmp_path / "p.yaml", "notebooks: [noisy.ipynb]\n"), root=tmp_path)
    result = execute_run(plan.runs[0], tmp_path / "run", kernel="mdc", cwd=tmp_path)
    assert result.status == "done", result.error
    assert "KERNEL-NOISE" in (tmp_path / "run" / KERNEL_LOG).read_text()
    captured = capfd.readouterr()
    assert "KERNEL-NOISE" not in captured.err + captured.out
    assert "cell output" in (tmp_path / "run" / "noisy.ipynb").read_text()


def test_a_summary_says_in_its_first_lines_when_its_definitions_changed_after_its_runs_began(
        seeded: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mdc_workbench.eval import decision, paper

    plan = load_plan(write_plan(seeded / "d.yaml", f"output_root: {seeded / 'out'}\nseeds: [0, 1]\n"
                                                   "notebooks: [probe.ipynb]\n"), root=seeded)
    out = seeded / "out" / "d"
    run_plan(plan, progress=False, cwd=seeded)
    start = json.loads((out / "declared.json").read_text())
    lines = (out / "summary.md").read_text().splitlines()
    assert lines[2].startswith(f"Definitions `{start['definitions']}`: the same as when this plan's first run started")
    run_plan(plan, progress=False, cwd=seeded)  # unchanged definitions, summary written again: no warning
    assert "Warning" not in (out / "summary.md").read_text()
    monkeypatch.setattr(paper, "TABLE1_MARGIN", 0.06)  # a margin changed between the runs and the summary
    run_plan(plan, progress=False, cwd=seeded)
    lines = (out / "summary.md").read_text().splitlines()
    assert lines[2].startswith("**Warning: the claim definitions changed after this plan's runs began.**")
    assert "Changed: the margins and statistical constants." in lines[2] and start["definitions"] in lines[2]
    assert json.loads((out / "declared.json").read_text()) == start  # the start's record is never rewritten
    record = json.loads((out / "summary.json").read_text())["definitions"]
    assert record["at_start"] == start and record["judged"]["constants"] != start["constants"]
    monkeypatch.undo()
    monkeypatch.setattr(decision, "decide", lambda parts, combination="every", alpha=0.05: None)  # other deciding code
    run_plan(plan, progress=False, cwd=seeded)  # (the summary is written with the patched code's fingerprint only)
    assert "Changed: the code of the deciding functions." in (out / "summary.md").read_text().splitlines()[2]


def test_a_plan_folder_whose_runs_finished_before_declarations_says_it_is_not_known(seeded: Path) -> None:
    plan = load_plan(write_plan(seeded / "e.yaml", f"output_root: {seeded / 'out'}\nnotebooks: [probe.ipynb]\n"),
                     root=seeded)
    out = seeded / "out" / "e"
    run_plan(plan, progress=False, cwd=seeded)
    (out / "declared.json").unlink()  # as in a folder from before 2026-11-28
    run_plan(plan, progress=False, cwd=seeded)
    assert "was not recorded" in (out / "summary.md").read_text().splitlines()[2]
    assert not (out / "declared.json").exists()  # written only at a start, never after runs finished
    (out / "declared.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="declared.json: needs the fingerprints"):
        run_plan(plan, progress=False, cwd=seeded)
