"""Interrupts lose no work: SIGINT/SIGTERM to a real ``mdc train`` checkpoint at the next step and exit, the
resumed run matches an uninterrupted one, ranks agree on the stop, time-based checkpoints, and a run folder
killed before its first checkpoint resumes from scratch."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mdc_core import checkpoint as ck
from mdc_core import loss_step
from mdc_core.train import TrainingInterrupted, train
from tests.train_helpers import (
    assert_same_metrics,
    free_port,
    micro_run,
    one_thread,  # noqa: F401 - a fixture
    read_metrics,
    start_training,
    wait_for,
    write_micro_data,
)

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_micro_data(tmp_path_factory.mktemp("interrupt_data"), 48)


def _cli_sets(cfg) -> list[str]:
    return [arg for key in ("model", "data", "train", "sampler") for k, v in cfg.to_dict()[key].items()
            for arg in ("--set", f"{key}.{k}={json.dumps(v)}")]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_mdc_train_checkpoints_the_step_and_resume_matches_an_uninterrupted_run(data, tmp_path, sig):
    # min_lr_ratio=1: a constant lr after warm-up, so the schedule does not depend on train.steps
    kw = dict(batch_size=4, ckpt_every=100_000, ema_decay=0.9, min_lr_ratio=1.0)
    cfg = micro_run(data, steps=100_000, **kw)
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "mdc_workbench", "train", "--preset", "tiny", "--out", str(run), "--quiet",
           *_cli_sets(cfg)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: len(read_metrics(run)) >= 3 or proc.poll() is not None)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + sig, err[-2000:]
    assert f"got {signal.Signals(sig).name}" in err and "--resume" in err
    assert f"mdc: interrupted by {signal.Signals(sig).name} at step" in err
    stopped = read_metrics(run)[-1]["step"]
    assert ck.latest_checkpoint(run).name == f"step_{stopped:08d}"  # the step it was in, saved

    steps = stopped + 2
    full = train(micro_run(data, steps=steps, **kw), tmp_path / "full", progress=False)
    resumed = train(micro_run(data, steps=steps, **kw), run, resume=True, progress=False)
    assert resumed.steps == full.steps == steps
    assert_same_metrics(read_metrics(run), read_metrics(tmp_path / "full"))


def test_ranks_agree_to_stop_when_only_one_rank_gets_the_signal(data, tmp_path):
    cfg = micro_run(data, steps=100_000, batch_size=4, ckpt_every=100_000)
    run, port = tmp_path / "ddp", free_port()
    procs = [start_training(cfg, run, rank=r, world=2, port=port, delay_s=0.05) for r in range(2)]
    wait_for(lambda: len(read_metrics(run)) >= 2)
    os.kill(procs[1][0].pid, signal.SIGTERM)  # as a scheduler pre-empting one node would
    for proc, err in procs:  # each rank raised TrainingInterrupted (the helper reports it and exits 1)
        proc.join(120)
        assert proc.exitcode == 1 and err.read_text().startswith("TrainingInterrupted: interrupted by SIGTERM")
    stopped = read_metrics(run)[-1]["step"]
    assert ck.latest_checkpoint(run).name == f"step_{stopped:08d}"
    assert ck.load_train_state(ck.latest_checkpoint(run))["world"] == 2


def test_time_based_checkpoints(data, tmp_path):
    cfg = micro_run(data, steps=3, batch_size=4, ckpt_every=1000, keep_last=5, ckpt_every_minutes=1e-9)
    train(cfg, tmp_path / "run", progress=False)
    assert [p.name for p in ck.list_checkpoints(tmp_path / "run")] == [f"step_{s:08d}" for s in (1, 2, 3)]
    cfg = micro_run(data, steps=3, batch_size=4, ckpt_every=1000, keep_last=5)  # off by default: the last only
    train(cfg, tmp_path / "off", progress=False)
    assert [p.name for p in ck.list_checkpoints(tmp_path / "off")] == ["step_00000003"]


def test_a_run_killed_before_its_first_checkpoint_resumes_from_scratch(data, tmp_path):
    cfg = micro_run(data, steps=4, batch_size=4, ckpt_every=4)
    run = tmp_path / "run"
    proc, err = start_training(cfg, run, delay_s=0.3)
    wait_for(lambda: len(read_metrics(run)) >= 1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(30)
    assert ck.latest_checkpoint(run) is None and read_metrics(run)
    with pytest.raises(FileExistsError, match="--resume"):
        train(cfg, run, progress=False)
    with pytest.warns(UserWarning, match="starting it over from step 0"):
        result = train(cfg, run, resume=True, progress=False)
    assert result.steps == 4
    train(cfg, tmp_path / "full", progress=False)
    assert_same_metrics(read_metrics(run), read_metrics(tmp_path / "full"))


def test_in_process_an_interrupt_raises_after_the_checkpoint(data, tmp_path, monkeypatch):
    """A library caller (a notebook cell) sees a KeyboardInterrupt, as before, but only after the checkpoint."""
    real, calls = loss_step.Objective.forward, [0]

    def interrupting(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == 3:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C during the third step
        return real(self, *args, **kwargs)

    monkeypatch.setattr(loss_step.Objective, "forward", interrupting)
    cfg = micro_run(data, steps=50, batch_size=4, ckpt_every=100)
    # Python's own Ctrl-C handler, as in an interactive session (a background job starts with SIGINT ignored)
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            train(cfg, tmp_path / "run", progress=False)
        restored = signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, outer)
    err = info.value
    assert isinstance(err, TrainingInterrupted) and err.signum == signal.SIGINT and err.step in (3, 4)
    assert err.checkpoint == ck.latest_checkpoint(tmp_path / "run") and err.checkpoint.name == f"step_{err.step:08d}"
    assert restored is signal.default_int_handler  # the handler is restored
