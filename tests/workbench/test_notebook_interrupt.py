"""Kernel > Interrupt stops a notebook's training cell: ``train_cached(..., live=True)`` trains in the notebook's main
thread (only the loss curve is drawn in a background thread), so the interrupt stops training at the next step
boundary with a checkpoint, the cache lock is released only after training has stopped (never two trainers on one
run folder), and running the cell again resumes to the same result as an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from mdc_core import checkpoint as ck
from mdc_core import loss_step
from mdc_core.train import TrainingInterrupted, train
from mdc_workbench.notebooks import notebook as wb
from tests.train_helpers import (
    assert_same_metrics,
    micro_run,
    one_thread,  # noqa: F401 - a fixture
    read_metrics,
    write_micro_data,
)

pytestmark = pytest.mark.usefixtures("one_thread")
STEPS = 12  # one checkpoint, at the end (ckpt_every > STEPS): an interrupt must write its own


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_micro_data(tmp_path_factory.mktemp("nb_interrupt_data"), 48)


def _lock_free(run_dir: Path) -> bool:
    from filelock import FileLock, Timeout

    lock = FileLock(str(run_dir) + ".lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return False
    lock.release()
    return True


def _lock_held_elsewhere(run_dir: Path) -> bool:
    """Whether another thread could take the run's cache lock now (FileLock is re-entrant within one thread)."""
    box: list[bool] = []
    probe = threading.Thread(target=lambda: box.append(_lock_free(run_dir)))
    probe.start()
    probe.join()
    return not box[0]


def test_an_interrupt_stops_the_live_training_at_a_step_with_a_checkpoint_and_the_cell_resumes(data, tmp_path,
                                                                                                 monkeypatch):
    cfg = micro_run(data, steps=STEPS, batch_size=4, ckpt_every=100)
    models = tmp_path / "models"
    run_dir = wb.cached_run_dir(models, cfg)
    real, calls, held = loss_step.Objective.forward, [0], []

    def interrupting(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == 3:
            held.append(_lock_held_elsewhere(run_dir))  # while training, nobody else may train this run
            os.kill(os.getpid(), signal.SIGINT)  # Kernel > Interrupt (SIGINT to the kernel) during the third step
        return real(self, *args, **kwargs)

    monkeypatch.setattr(loss_step.Objective, "forward", interrupting)
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)  # what ipykernel installs while a cell runs
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            wb.train_cached(cfg, models, live=True)
    finally:
        signal.signal(signal.SIGINT, outer)
    err = info.value
    assert isinstance(err, TrainingInterrupted) and err.step == 3 and held == [True]
    assert err.checkpoint == ck.latest_checkpoint(run_dir) and err.checkpoint.name == "step_00000003"
    assert not any(t.name == "mdc-loss-curve" for t in threading.enumerate())  # the painter is gone too
    assert _lock_free(run_dir)  # released, now that training has stopped
    logged = (run_dir / "metrics.jsonl").read_text()
    time.sleep(0.3)
    assert (run_dir / "metrics.jsonl").read_text() == logged and read_metrics(run_dir)[-1]["step"] == 3

    model, _, again = wb.train_cached(cfg, models, live=True)  # running the cell again resumes from step 3
    assert again == run_dir and json.loads((ck.latest_checkpoint(run_dir) / "meta.json").read_text())["step"] == STEPS
    assert calls[0] == STEPS  # 3 steps, then 9 more: none trained twice
    train(micro_run(data, steps=STEPS, batch_size=4, ckpt_every=100), tmp_path / "full", progress=False)
    assert_same_metrics(read_metrics(run_dir), read_metrics(tmp_path / "full"))


def test_kernel_interrupt_in_jupyter_stops_the_training_cell(data, tmp_path):
    """The same through a real kernel and jupyter_client's interrupt, as JupyterLab's Kernel > Interrupt sends it."""
    from jupyter_client.manager import start_new_kernel

    from mdc_workbench.runs.plans import ensure_kernel

    cfg = micro_run(data, steps=60, batch_size=4, ckpt_every=1000)
    cfg.save(tmp_path / "config.json")
    models = tmp_path / "models"
    run_dir = wb.cached_run_dir(models, cfg)
    cell = f"""
import time
import torch
import mdc_core.loss_step as T
from mdc_core.config import RunConfig
from mdc_workbench.notebooks import notebook as wb
torch.set_num_threads(1)
if not hasattr(T, "_real_forward"):
    T._real_forward = T.Objective.forward
    T.Objective.forward = lambda *a, **k: (time.sleep(0.05), T._real_forward(*a, **k))[1]  # slow enough to interrupt
cfg = RunConfig.load({str(tmp_path / "config.json")!r})
model, cfg, run_dir = wb.train_cached(cfg, {str(models)!r}, live=True)
"""
    km, kc = start_new_kernel(kernel_name=ensure_kernel(), cwd=str(tmp_path))
    try:
        def run_cell(interrupt_after: int | None) -> dict:
            msg_id = kc.execute(cell)
            if interrupt_after is not None:
                end = time.monotonic() + 120
                while len(read_metrics(run_dir)) < interrupt_after and time.monotonic() < end:
                    time.sleep(0.05)
                km.interrupt_kernel()
            while True:
                reply = kc.get_shell_msg(timeout=180)
                if reply["parent_header"].get("msg_id") == msg_id:
                    return reply["content"]

        first = run_cell(interrupt_after=3)
        assert first["status"] == "error" and first["ename"] == "TrainingInterrupted", first
        stopped = read_metrics(run_dir)[-1]["step"]
        assert 3 <= stopped < 60 and ck.latest_checkpoint(run_dir).name == f"step_{stopped:08d}"
        time.sleep(0.5)  # the kernel is idle and nothing trains any more
        assert read_metrics(run_dir)[-1]["step"] == stopped and _lock_free(run_dir)
        second = run_cell(interrupt_after=None)
        assert second["status"] == "ok", second
        steps = [r["step"] for r in read_metrics(run_dir)]
        assert steps == list(range(1, 61))  # resumed after the interrupted step: each step logged once
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
