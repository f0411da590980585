"""`mdc runs`: plans are validated before anything runs; runs execute, fail in isolation, resume, summarise."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from mdc_workbench.cli import main
from mdc_workbench.eval.paper import PAPER
from mdc_workbench.runs import progress
from mdc_workbench.runs.plans import RunSpec, load_plan
from mdc_workbench.runs.runner import result_from_markers, run_plan, run_status, thread_env, thread_share
from mdc_workbench.runs.summary import _fmt, table_markdown

TINY_BODY = """\
import json, pathlib
out = pathlib.Path(output_dir)
if fail:
    raise RuntimeError(f"asked to fail with value={value}")
(out / "figures" / "dot.txt").write_text("x")
metrics = {"metrics": {"value_squared": value ** 2},
           "tables": {"table5": {"metric": "toy", "values": {f"[{value}, 1.0]": float(value)}}}}
(out / "metrics.json").write_text(json.dumps(metrics))
"""


def write_notebook(path: Path, params: str = 'output_dir: str = "."  # run folder\nvalue: int = 1  # toy\n'
                   'fail: bool = False  # raise', body: str = TINY_BODY) -> Path:
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(params)
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_code_cell("import json"), cell, nbformat.v4.new_code_cell(body)]
    nb.metadata["kernelspec"] = {"name": "mdc", "display_name": "MDC workbench", "language": "python"}
    nbformat.write(nb, str(path))
    return path


def write_plan(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    write_notebook(tmp_path / "toy.ipynb")
    return tmp_path


def test_two_run_plan_runs_then_resumes(toy: Path) -> None:
    plan_file = write_plan(toy / "two.yaml", f"output_root: {toy / 'out'}\nnotebooks:\n"
                                             "  - path: toy.ipynb\n    grid: {value: [2, 3]}\n")
    plan = load_plan(plan_file, root=toy)
    assert [r.run_id for r in plan.runs] == ["toy__value=2", "toy__value=3"]
    first = run_plan(plan, progress=False, cwd=toy)
    assert [r.status for r in first] == ["done", "done"]
    run2 = toy / "out" / "two" / "toy__value=2"
    assert json.loads((run2 / "metrics.json").read_text())["metrics"]["value_squared"] == 4
    assert json.loads((run2 / "parameters.json").read_text()) == {"value": 2}
    assert (run2 / "toy.ipynb").is_file() and (run2 / "DONE").is_file() and (run2 / "figures" / "dot.txt").is_file()
    executed = nbformat.read(str(run2 / "toy.ipynb"), as_version=4)
    assert any("injected-parameters" in c.metadata.get("tags", []) for c in executed.cells)
    summary = (toy / "out" / "two" / "summary.md").read_text()
    assert "toy__value=3" in summary and "value_squared=9" in summary
    assert "[0.5, 1.0]" in summary and "39.2" in summary  # the paper's Table 5 row beside ours
    assert (toy / "out" / "two" / "summary.png").stat().st_size > 0

    mtime = (run2 / "toy.ipynb").stat().st_mtime_ns
    again = run_plan(load_plan(plan_file, root=toy), progress=False, cwd=toy)
    assert [r.status for r in again] == ["skipped", "skipped"]
    assert (run2 / "toy.ipynb").stat().st_mtime_ns == mtime  # not executed again
    assert "2 finished earlier (skipped)" in (toy / "out" / "two" / "summary.md").read_text()


def test_failed_run_is_marked_and_others_continue(toy: Path) -> None:
    plan_file = write_plan(toy / "mixed.yaml", f"output_root: {toy / 'out'}\nnotebooks:\n"
                                               "  - path: toy.ipynb\n    grid: {fail: [true, false]}\n")
    results = run_plan(load_plan(plan_file, root=toy), progress=False, cwd=toy)
    assert [r.status for r in results] == ["failed", "done"]
    bad = toy / "out" / "mixed" / "toy__fail=True"
    marker = (bad / "FAILED").read_text()
    assert "RuntimeError: asked to fail with value=1" in marker
    assert (bad / "toy.ipynb").is_file() and not (bad / "DONE").exists()  # the executed notebook is kept
    assert (toy / "out" / "mixed" / "toy__fail=False" / "DONE").is_file()
    assert "FAILED" in (toy / "out" / "mixed" / "summary.md").read_text()
    assert run_status(bad, {"fail": True}) == "failed"


CONCURRENT_BODY = """\
import json, os, pathlib, time
out = pathlib.Path(output_dir)
start = time.time()
if fail:
    raise RuntimeError(f"asked to fail with value={value}")
time.sleep(4)
(out / "metrics.json").write_text(json.dumps({"metrics": {"value": value}, "start": start, "end": time.time(),
                                              "threads": os.environ.get("OMP_NUM_THREADS")}))
"""


def test_jobs_run_notebooks_at_once_with_a_share_of_the_threads(tmp_path: Path) -> None:
    write_notebook(tmp_path / "slow.ipynb", body=CONCURRENT_BODY)
    plan_file = write_plan(tmp_path / "two.yaml", f"output_root: {tmp_path / 'out'}\njobs: 2\nnotebooks:\n"
                                                  "  - path: slow.ipynb\n    grid: {value: [1, 2]}\n"
                                                  "  - path: slow.ipynb\n    id: bad\n    parameters: {fail: true}\n")
    plan = load_plan(plan_file, root=tmp_path)
    assert plan.jobs == 2
    results = run_plan(plan, progress=False, cwd=tmp_path)
    assert [(r.run_id, r.status) for r in results] == [("slow__value=1", "done"), ("slow__value=2", "done"),
                                                        ("bad", "failed")]
    assert "RuntimeError: asked to fail with value=1" in results[2].error
    assert (tmp_path / "out" / "two" / "bad" / "FAILED").is_file()
    first, second = (json.loads((r.run_dir / "metrics.json").read_text()) for r in results[:2])
    assert max(first["start"], second["start"]) < min(first["end"], second["end"])  # they overlapped
    assert first["threads"] == second["threads"] == thread_env(2)["OMP_NUM_THREADS"]
    assert "slow__value=2" in (tmp_path / "out" / "two" / "summary.md").read_text()
    again = run_plan(load_plan(plan_file, root=tmp_path), progress=False, cwd=tmp_path, jobs=2)
    assert [r.status for r in again] == ["skipped", "skipped", "failed"]  # finished runs skip, failed ones retry


HANDOVER_BODY = """\
import json, os, pathlib, time
import torch
import mdc_workbench.notebooks.notebook  # noqa: F401  (under the runner: follow its thread share)
out = pathlib.Path(output_dir)
seen = []
deadline = time.time() + (value if value > 1 else 0)
layer = torch.nn.Linear(4, 4)
while True:
    layer(torch.zeros(1, 4))  # a forward pass is where the kernel applies its share
    seen.append(torch.get_num_threads())
    if seen[-1] > seen[0] or time.time() > deadline:
        break
    time.sleep(0.1)
(out / "metrics.json").write_text(json.dumps({"metrics": {"value": value}, "threads": seen}))
"""


def test_a_slot_that_empties_hands_its_cores_to_the_run_still_going(tmp_path: Path) -> None:
    """jobs: 2 on a machine with C cores: both runs start with C // 2 threads; once the short one ends and
    nothing is queued, the long one's kernel applies C threads at its next forward pass."""
    import os

    cpus = os.cpu_count() or 1
    if cpus < 2:
        pytest.skip("needs two cores to hand one over")
    write_notebook(tmp_path / "hand.ipynb", body=HANDOVER_BODY)
    plan_file = write_plan(tmp_path / "hand.yaml", f"output_root: {tmp_path / 'out'}\njobs: 2\nnotebooks:\n"
                                                   "  - path: hand.ipynb\n    grid: {value: [60, 1]}\n")
    results = run_plan(load_plan(plan_file, root=tmp_path), progress=False, cwd=tmp_path)
    assert [r.status for r in results] == ["done", "done"], [r.error for r in results]
    long_run, short_run = (json.loads((r.run_dir / "metrics.json").read_text())["threads"] for r in results)
    assert short_run == [cpus // 2]
    assert long_run[0] == cpus // 2 and long_run[-1] == cpus  # handed over well before its 60 s deadline
    assert not list((tmp_path / "out" / "hand" / ".threads").iterdir())  # share files go with their runs


def test_kernel_side_applies_the_share_in_the_thread_that_runs_a_model(tmp_path: Path, monkeypatch) -> None:
    import threading

    import torch

    share = tmp_path / "share"
    monkeypatch.setenv(progress.THREADS_ENV, str(share))
    before = torch.get_num_threads()
    assert progress._follow_handle is None
    try:
        assert progress.follow_thread_share(every_s=0.0)
        progress.write_thread_share(share, 1)
        assert progress.read_thread_share(share) == 1
        seen: list[int] = []

        def work() -> None:  # like live_train's training thread
            torch.set_num_threads(2)
            torch.nn.Linear(2, 2)(torch.zeros(1, 2))
            seen.append(torch.get_num_threads())

        worker = threading.Thread(target=work)
        worker.start()
        worker.join()
        assert seen == [1]
        for bad in ("0", "two", ""):  # an unusable share changes nothing
            share.write_text(bad)
            assert progress.read_thread_share(share) is None
    finally:
        if progress._follow_handle is not None:
            progress._follow_handle.remove()
            progress._follow_handle = None
        torch.set_num_threads(before)


def test_thread_share_and_results_read_back_from_markers(tmp_path: Path) -> None:
    assert thread_share(2, 2, queued=True, cpus=2) == thread_share(2, 2, queued=False, cpus=2) == 1
    assert thread_share(2, 1, queued=True, cpus=2) == 1  # a slot about to be filled keeps its share
    assert thread_share(2, 1, queued=False, cpus=2) == 2  # the last run takes the idle core
    assert thread_share(4, 3, queued=False, cpus=16) == 5
    assert thread_share(3, 1, queued=False, cpus=2) == 2 and thread_share(3, 3, queued=False, cpus=2) == 1
    assert thread_env(2, cpus=2) == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    assert thread_env(2, cpus=16)["OMP_NUM_THREADS"] == "8"
    assert thread_env(4, cpus=2)["OMP_NUM_THREADS"] == "1"  # never zero threads
    spec = RunSpec("r", tmp_path / "nb.ipynb", {"value": 1})
    done = tmp_path / "done"
    done.mkdir()
    (done / "DONE").write_text(json.dumps({"duration_s": 12.5}))
    assert (result_from_markers(spec, done).status, result_from_markers(spec, done).duration_s) == ("done", 12.5)
    failed = tmp_path / "failed"
    failed.mkdir()
    (failed / "FAILED").write_text("ValueError: bad (cell [3])\nduration_s: 2.0\n")
    result = result_from_markers(spec, failed)
    assert (result.status, result.error, result.duration_s) == ("failed", "ValueError: bad (cell [3])", 2.0)
    killed = result_from_markers(spec, tmp_path / "killed", exitcode=-9)  # neither marker: the process died
    assert killed.status == "failed" and "exit code -9" in killed.error
    assert (tmp_path / "killed" / "FAILED").is_file()


def test_changed_parameters_make_a_finished_run_pending(tmp_path: Path) -> None:
    (tmp_path / "parameters.json").write_text(json.dumps({"value": 2}))
    (tmp_path / "DONE").write_text("{}")
    assert run_status(tmp_path, {"value": 2}) == "done"
    assert run_status(tmp_path, {"value": 5}) == "pending"
    assert run_status(tmp_path / "missing", {"value": 2}) == "pending"


@pytest.mark.parametrize("text, message", [
    ("notebooks:\n  - toy.ipynb\n  - toy.ipynb\n", "occur twice"),
    ("notebooks:\n  - path: toy.ipynb\n    parameters: {valu: 3}\n", "'valu' is not declared by toy.ipynb"),
    ("notebooks:\n  - path: toy.ipynb\n    parameters: {value: 0.5}\n", "'value' of toy.ipynb is int"),
    ("notebooks:\n  - path: toy.ipynb\n    parameters: {fail: 1}\n", "'fail' of toy.ipynb is bool"),
    ("notebooks:\n  - path: toy.ipynb\n    grid: {value: []}\n", "non-empty list"),
    ("notebooks:\n  - missing.ipynb\n", "notebook missing.ipynb not found"),
    ("notebooks:\n  - toy.ipynb\nparameters: {nope: 1}\n", "declared by none of its notebooks"),
    ("notebooks:\n  - path: toy.ipynb\n    parameters: {output_dir: x}\n", "set by the runner"),
    ("notebook: [toy.ipynb]\n", "unknown key(s) ['notebook']"),
    ("notebooks: []\n", "non-empty list"),
    ("jobs: 0\nnotebooks: [toy.ipynb]\n", "jobs must be a positive integer"),
    ("jobs: two\nnotebooks: [toy.ipynb]\n", "jobs must be a positive integer"),
    ("deadline_s: 0\nnotebooks: [toy.ipynb]\n", "deadline_s must be a positive number"),
    ("deadline_s: soon\nnotebooks: [toy.ipynb]\n", "deadline_s must be a positive number"),
])
def test_bad_plans_are_rejected_before_running(toy: Path, text: str, message: str) -> None:
    with pytest.raises((ValueError, FileNotFoundError)) as err:
        load_plan(write_plan(toy / "bad.yaml", text), root=toy)
    assert message in str(err.value)


DATA_PARAMS = ('output_dir: str = "."  # run folder\ndata_dir: str = "data"  # data set\n'
               'n_train: int = 100  # images\nsynthesize: bool = True  # write the data set')


def test_runs_at_once_may_not_rewrite_one_data_set_with_different_parameters(tmp_path: Path) -> None:
    write_notebook(tmp_path / "data.ipynb", DATA_PARAMS, body="pass")
    entries = ("notebooks:\n  - data.ipynb\n  - path: data.ipynb\n    id: small\n"
               "    parameters: {n_train: 50%s}\n")
    with pytest.raises(ValueError, match=r"runs data and small write the data set data with different parameters "
                                         r"\(n_train 100 vs 50\); with jobs: 2 one would rewrite it"):
        load_plan(write_plan(tmp_path / "p.yaml", "jobs: 2\n" + entries % ""), root=tmp_path)
    for ok in ("jobs: 1\n" + entries % "",  # one at a time: each run rewrites the set it needs
               "jobs: 2\n" + entries % ", data_dir: other",  # a data set of its own
               "jobs: 2\n" + entries % ", synthesize: false"):  # reads, never writes
        assert len(load_plan(write_plan(tmp_path / "p.yaml", ok), root=tmp_path).runs) == 2


def test_notebook_without_single_parameters_cell_is_rejected(tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("output_dir = '.'")]
    nbformat.write(nb, str(tmp_path / "plain.ipynb"))
    with pytest.raises(ValueError, match="exactly one cell tagged 'parameters'"):
        load_plan(write_plan(tmp_path / "p.yaml", "notebooks: [plain.ipynb]\n"), root=tmp_path)


def test_cli_dry_run_lists_runs_without_executing(toy: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(toy)
    plan_file = write_plan(toy / "dry.yaml", "output_root: out\nparameters: {value: 4}\n"
                                             "notebooks:\n  - path: toy.ipynb\n    grid: {fail: [false, true]}\n")
    assert main(["runs", str(plan_file), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "toy__fail=False" in printed and "toy__fail=True" in printed and "value=4" in printed
    assert not (toy / "out").exists()
    assert main(["runs", str(toy / "nope.yaml"), "--dry-run"]) == 2
    assert "mdc: error: plan file not found" in capsys.readouterr().err


def test_tables_sit_beside_the_paper() -> None:
    ours = {"metric": "m", "values": {"[0.5, 1.0]": 60.0, "[0.0, 1.0]": 40.0}}
    text = "\n".join(table_markdown("table5", ours))
    assert "| [0.0, 1.0] | 40.0 | 29.3 |" in text and "| [0.3, 0.8] | – | 36.1 |" in text
    # Table 1: the Average column (our mean over tasks), not ImageNet-1k's, for each backbone
    assert {row: v["ViT-B/32"] for row, v in PAPER["table1"].values.items()} == {"CLIP": 71.7, "ARC": 69.5,
                                                                                "MDC": 68.7}


@pytest.mark.parametrize("plan", sorted((Path(__file__).resolve().parents[2] / "plans").glob("*.yaml")),
                         ids=lambda p: p.stem)
def test_shipped_plans_validate(plan: Path) -> None:
    loaded = load_plan(plan, root=plan.parents[1])  # notebooks exist, every parameter declared and well typed
    assert loaded.runs and loaded.name == plan.stem
    assert all(r.notebook.parent.name == "notebooks" for r in loaded.runs)


def test_summary_numbers_keep_the_digits_that_matter():
    # percentages keep one decimal; fractions (an accuracy of 0.934) are not rounded to 0.9
    assert [_fmt(v) for v in (36.66, 0.9338, 0.0712, 4000, float("nan"), None)] == [
        "36.7", "0.934", "0.0712", "4000", "–", "–"]


SLEEPER_BODY = """\
import json, pathlib, time
out = pathlib.Path(output_dir)
time.sleep(value)
(out / "metrics.json").write_text(json.dumps({"metrics": {"value": value}}))
"""


def test_a_deadline_stops_the_plan_and_keeps_what_finished(tmp_path: Path) -> None:
    """A finished run is kept, a 600 s run is stopped at the deadline, the run after it never starts, and the
    summary is written with all three: a GPU loan that ends early still says what it measured."""
    import time

    write_notebook(tmp_path / "sleep.ipynb", body=SLEEPER_BODY)
    first = write_plan(tmp_path / "p.yaml", f"output_root: {tmp_path / 'out'}\nnotebooks:\n"
                                            "  - path: sleep.ipynb\n    grid: {value: [0]}\n")
    assert [r.status for r in run_plan(load_plan(first, root=tmp_path), progress=False, cwd=tmp_path)] == ["done"]
    plan_file = write_plan(tmp_path / "p.yaml", f"output_root: {tmp_path / 'out'}\ndeadline_s: 8\nnotebooks:\n"
                                                "  - path: sleep.ipynb\n    grid: {value: [0, 600, 1]}\n")
    plan = load_plan(plan_file, root=tmp_path)
    assert plan.deadline_s == 8
    t0 = time.monotonic()
    results = run_plan(plan, progress=False, cwd=tmp_path)
    assert time.monotonic() - t0 < 300  # the 600 s run did not run to its end
    assert [r.status for r in results] == ["skipped", "failed", "failed"]
    assert (tmp_path / "out" / "p" / "sleep__value=600" / "FAILED").is_file()
    stopped = (tmp_path / "out" / "p" / "sleep__value=600" / "FAILED").read_text()
    assert stopped.startswith("stopped at the plan's deadline") and "KeyboardInterrupt" not in stopped
    assert results[1].error == "stopped at the plan's deadline (deadline_s) before it finished"
    assert "not started" in results[2].error and "deadline" in results[2].error
    assert not (tmp_path / "out" / "p" / "sleep__value=1").exists()
    assert "FAILED" in (tmp_path / "out" / "p" / "summary.md").read_text()
    with pytest.raises(ValueError, match="deadline_s must be a positive number"):
        run_plan(plan, progress=False, cwd=tmp_path, deadline_s=0)
