"""``torchrun`` with two ranks and a fault in one (rank 1 killed with SIGKILL mid-run): rank 0 stops with one
``mdc: error:`` line naming the failed collective, releases the run folder's lock, keeps its intact checkpoints, and
a one-process ``--resume`` continues the run."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mdc_core import checkpoint as ck
from mdc_workbench.cli import main
from tests.workbench.test_cli import MICRO_SETS

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = shutil.which("torchrun", path=str(Path(sys.executable).parent))


def _ranks(pid: int) -> dict[int, int]:
    """RANK -> pid of the processes below `pid` (Linux /proc: children and environment)."""
    found, todo = {}, [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*/children"):
            todo += [int(c) for c in task.read_text().split()]
        if parent != pid:
            with open(f"/proc/{parent}/environ", "rb") as fh:
                env = dict(item.split(b"=", 1) for item in fh.read().split(b"\0") if b"=" in item)
            if b"RANK" in env:
                found[int(env[b"RANK"])] = parent
    return found


@pytest.mark.slow
@pytest.mark.skipif(TORCHRUN is None or not Path("/proc/self/task").is_dir(),
                    reason="needs torchrun beside this python and Linux /proc")
def test_a_rank_killed_under_torchrun_stops_the_other_with_one_line_and_resume_goes_on(tmp_path):
    data, run = tmp_path / "data", tmp_path / "run"
    assert main(["data", "synth", "--out", str(data), "--n", "64", "--seed", "3", "--image-size", "32",
                 "--captions", "short", "--shard-size", "8"]) == 0  # every rank needs its own shards
    cmd = [TORCHRUN, "--standalone", "--nproc_per_node=2", "-m", "mdc_workbench", "train", "--preset", "tiny", "--data",
           str(data), "--out", str(run), "--steps", "400", "--quiet", *MICRO_SETS, "--set", "train.batch_size=4",
           "--set", "train.dist_timeout_s=30"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 240  # a deadline, not a timing: the run is waited for by its logged steps
    while time.monotonic() < end and proc.poll() is None and (
            not (run / "metrics.jsonl").is_file() or len((run / "metrics.jsonl").read_text().splitlines()) < 4):
        time.sleep(0.2)
    ranks = _ranks(proc.pid)
    assert proc.poll() is None and set(ranks) == {0, 1}, proc.communicate(timeout=60)[1][-3000:]
    os.kill(ranks[1], signal.SIGKILL)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode != 0
    ours = [line for line in err.splitlines() if line.startswith("mdc: error:")]
    assert len(ours) == 1 and "rank 0 of 2" in ours[0] and "Another rank probably died" in ours[0], err[-3000:]
    assert not (run / ".mdc.lock").exists()
    last = ck.latest_checkpoint(run)
    ck.verify_checkpoint(last)
    step = ck.load_train_state(last)["step"]
    with pytest.warns(UserWarning, match="resuming a 2-rank run on 1 ranks"):
        assert main(["train", "--out", str(run), "--resume", "--steps", str(step + 2), "--quiet"]) == 0
    assert ck.load_train_state(ck.latest_checkpoint(run))["step"] == step + 2
