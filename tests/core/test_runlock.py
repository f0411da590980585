"""One writer per run folder: two ``mdc train`` (or ``mdc runs``) started at the same instant into one folder, a
lock left by a killed writer, and the one-line error that names the holder."""

import io
import json
import multiprocessing as mp
import os
import signal
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import torch

from mdc_workbench.cli import main
from tests.workbench.test_cli import MICRO_SETS
from tests.workbench.test_runs import write_notebook, write_plan

FORK = mp.get_context("fork")


def _cli_after_barrier(argv: list[str], barrier, result: str) -> None:
    """Child: wait for the other child, run ``mdc ARGV``, write its exit code and stderr to `result`."""
    torch.set_num_threads(1)
    err, code = io.StringIO(), 1
    try:
        barrier.wait(timeout=60)
        with redirect_stderr(err), redirect_stdout(io.StringIO()):
            code = main(argv)
    except BaseException as exc:  # noqa: BLE001 - reported to the test through the file
        err.write(f"{type(exc).__name__}: {exc}")
    Path(result).write_text(json.dumps({"code": code, "err": err.getvalue(), "pid": os.getpid()}))
    os._exit(0)


def _together(argvs: list[list[str]], tmp_path: Path) -> list[dict]:
    """Run each argv in its own forked process, all released at once by a barrier; their results in order."""
    barrier = FORK.Barrier(len(argvs))
    files = [tmp_path / f"result{i}.json" for i in range(len(argvs))]
    procs = [FORK.Process(target=_cli_after_barrier, args=(argv, barrier, str(f)))
             for argv, f in zip(argvs, files, strict=True)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    return [json.loads(f.read_text()) for f in files]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lock") / "data"
    assert main(["data", "synth", "--out", str(out), "--n", "24", "--seed", "3", "--image-size", "32",
                 "--captions", "short"]) == 0
    return out


def test_two_trainings_started_together_into_one_folder_one_wins_the_other_names_it(data, tmp_path):
    run = tmp_path / "run"
    argv = ["train", "--preset", "tiny", "--data", str(data), "--out", str(run), "--steps", "4", "--quiet",
            *MICRO_SETS]
    first, second = _together([argv, [*argv, "--set", "train.seed=1", "--set", "train.lr=0.01"]], tmp_path)
    codes = sorted([first["code"], second["code"]])
    assert codes == [0, 2], (first, second)
    winner, loser = (first, second) if first["code"] == 0 else (second, first)
    err = loser["err"].strip()
    assert err.startswith("mdc: error:") and "\n" not in err and f"in use by another writer, pid {winner['pid']}" in err
    assert "mdc train" in err
    # the folder holds one run, all of it from the winner: config, checkpoints and metrics agree
    seed = json.loads((run / "config.json").read_text())["train"]["seed"]
    for ckpt in sorted((run / "checkpoints").glob("step_*")):
        assert json.loads((ckpt / "config.json").read_text())["train"]["seed"] == seed
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
    assert not (run / ".mdc.lock").exists()  # released


def _hold_lock(folder: str, ready, command: str) -> None:
    from mdc_core.runlock import RunLock
    RunLock(folder, command).acquire()
    ready.set()
    time.sleep(600)


def test_a_lock_left_by_a_killed_writer_is_taken_over_and_a_live_one_is_named(tmp_path):
    from mdc_core.runlock import LOCK_NAME, RunFolderBusy, RunLock
    folder = tmp_path / "run"
    ready = FORK.Event()
    holder = FORK.Process(target=_hold_lock, args=(str(folder), ready, "mdc train"))
    holder.start()
    try:
        assert ready.wait(30)
        with pytest.raises(RunFolderBusy, match=rf"in use by another writer, pid {holder.pid} \(`mdc train`, started"):
            RunLock(folder).acquire()
    finally:
        os.kill(holder.pid, signal.SIGKILL)  # a crash: the lock file stays, its lock goes with the process
        holder.join(30)
    assert (folder / LOCK_NAME).is_file()
    start = time.monotonic()
    with RunLock(folder, "mdc train --resume") as lock:  # taken over at once, not waited on
        assert lock.previous["pid"] == holder.pid and time.monotonic() - start < 5
        assert json.loads((folder / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert not (folder / LOCK_NAME).exists()


def test_train_into_a_locked_folder_is_one_line_and_touches_nothing(data, tmp_path, capsys):
    from mdc_core.runlock import RunLock
    run = tmp_path / "run"
    ready = FORK.Event()
    holder = FORK.Process(target=_hold_lock, args=(str(run), ready, "mdc train"))
    holder.start()
    try:
        assert ready.wait(30)
        for extra in ([], ["--resume"]):
            assert main(["train", "--preset", "tiny", "--data", str(data), "--out", str(run), "--steps", "2",
                         "--quiet", *MICRO_SETS, *extra]) == 2
            err = capsys.readouterr().err.strip()
            assert f"pid {holder.pid}" in err and "\n" not in err, err
        assert sorted(p.name for p in run.iterdir()) == [".mdc.lock"]  # the loser wrote and removed nothing
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(30)
    with RunLock(run):
        pass


def test_two_mdc_runs_of_one_plan_started_together_one_runs_the_other_names_it(tmp_path):
    write_notebook(tmp_path / "toy.ipynb")
    plan = write_plan(tmp_path / "plan.yaml", f"output_root: {tmp_path / 'out'}\nnotebooks:\n"
                                              "  - path: toy.ipynb\n    grid: {value: [2]}\n")
    cwd = os.getcwd()
    os.chdir(tmp_path)  # the notebook path is relative to the plan; papermill runs in the current folder
    try:
        results = _together([["runs", str(plan), "--quiet"], ["runs", str(plan), "--quiet"]], tmp_path)
    finally:
        os.chdir(cwd)
    assert sorted(r["code"] for r in results) == [0, 2], results
    winner = next(r for r in results if r["code"] == 0)
    err = next(r for r in results if r["code"] == 2)["err"].strip()
    assert f"in use by another writer, pid {winner['pid']} (`mdc runs`" in err and "\n" not in err
    run = tmp_path / "out" / "plan" / "toy__value=2"
    assert (run / "DONE").is_file() and not (run / "FAILED").exists()
    assert json.loads((run / "metrics.json").read_text())["metrics"]["value_squared"] == 4


def test_a_run_folder_is_locked_while_its_notebook_executes(tmp_path):
    from mdc_core.runlock import RunFolderBusy, RunLock
    from mdc_workbench.runs.plans import load_plan
    from mdc_workbench.runs.runner import execute_run
    write_notebook(tmp_path / "toy.ipynb")
    plan = load_plan(write_plan(tmp_path / "p.yaml", f"output_root: {tmp_path / 'out'}\nnotebooks:\n"
                                                      "  - path: toy.ipynb\n"), root=tmp_path)
    run_dir = tmp_path / "out" / "p" / plan.runs[0].run_id
    (run_dir / "figures").mkdir(parents=True)
    (run_dir / "figures" / "kept.png").write_bytes(b"x")
    with RunLock(run_dir, "mdc runs"):
        with pytest.raises(RunFolderBusy, match=f"pid {os.getpid()} \\(this process\\)"):
            execute_run(plan.runs[0], run_dir, kernel="python3")
    assert (run_dir / "figures" / "kept.png").is_file()  # not cleared by the refused writer


def test_every_rank_stops_at_once_when_the_run_folder_is_locked(data, tmp_path):
    from tests.train_helpers import free_port, micro_run, start_training
    run = tmp_path / "run"
    ready = FORK.Event()
    holder = FORK.Process(target=_hold_lock, args=(str(run), ready, "mdc train"))
    holder.start()
    try:
        assert ready.wait(30)
        cfg = micro_run(data, steps=2, batch_size=4, dist_timeout_s=600)
        port = free_port()
        ranks = [start_training(cfg, run, rank=r, world=2, port=port) for r in range(2)]
        start = time.monotonic()
        for proc, err in ranks:  # rank 1 learns it from rank 0 (a broadcast), not from a 600 s timeout
            proc.join(120)
            assert proc.exitcode == 1 and err.read_text().startswith(f"RunFolderBusy: {run} is in use"), \
                err.read_text()[-2000:]
        assert time.monotonic() - start < 120
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(30)
