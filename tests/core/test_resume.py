"""Kill -9 mid-run, resume, and get the metrics and weights of an uninterrupted run; half-written checkpoints."""

import json
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mdc_core import checkpoint as ck
from mdc_core.train import train
from tests.train_helpers import (
    assert_same_metrics,
    micro_run,
    one_thread,  # noqa: F401 - a fixture
    read_metrics,
    start_training,
    wait_for,
    write_micro_data,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("resume_data")
    return write_micro_data(root, 48)


def _weights(run: Path, name: str = "model.safetensors") -> dict[str, torch.Tensor]:
    return load_file(str(ck.latest_checkpoint(run) / name))


def test_sigkill_then_resume_continues_like_an_uninterrupted_run(data, tmp_path):
    # 48 samples / (batch 4 x accum 2) = 6 steps per epoch: the 10 steps cross an epoch boundary; EMA on
    cfg = micro_run(data, steps=10, batch_size=4, grad_accum=2, ckpt_every=4, keep_last=2, ema_decay=0.9)
    full = train(cfg, tmp_path / "full", progress=False)
    assert full.steps == 10

    run = tmp_path / "killed"
    proc, err = start_training(cfg, run, delay_s=0.15)
    wait_for(lambda: ck.latest_checkpoint(run) and len(read_metrics(run)) >= 6, timeout_s=90, poll_s=0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(30)
    assert proc.exitcode == -signal.SIGKILL, err.read_text() if err.exists() else ""
    killed_at = len(read_metrics(run))
    assert ck.latest_checkpoint(run).name == "step_00000004" and 6 <= killed_at < 8  # logged past the checkpoint

    # a crash while writing step 8: the folder exists without meta.json, `latest` already names it
    broken = run / "checkpoints" / "step_00000008"
    shutil.copytree(run / "checkpoints" / "step_00000004", broken)
    (broken / "meta.json").unlink()
    (run / "checkpoints" / "latest").write_text("step_00000008\n")
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 7, "loss": 1.0, "cut off by the kil')  # a half-written line

    resumed = train(cfg, run, resume=True, progress=False)
    assert resumed.steps == 10
    assert_same_metrics(read_metrics(run), read_metrics(tmp_path / "full"), rel=1e-5)
    assert [r["step"] for r in read_metrics(run)] == list(range(1, 11))
    assert read_metrics(run, "epochs.jsonl") == read_metrics(tmp_path / "full", "epochs.jsonl") != []
    for name in ("model.safetensors", "ema.safetensors"):
        a, b = _weights(run, name), _weights(tmp_path / "full", name)
        worst = max(float((a[k] - b[k]).abs().max()) for k in a)
        assert worst < 1e-5, (name, worst)
    assert [p.name for p in ck.list_checkpoints(run)] == ["step_00000008", "step_00000010"]  # keep_last=2


def test_resume_refuses_a_changed_config_and_an_empty_folder(data, tmp_path):
    cfg = micro_run(data, steps=2, batch_size=4, ckpt_every=2)
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        train(cfg, tmp_path / "none", resume=True, progress=False)
    train(cfg, tmp_path / "run", progress=False)
    with pytest.raises(FileExistsError, match="--resume"):
        train(cfg, tmp_path / "run", progress=False)
    other = micro_run(data, steps=2, batch_size=8, ckpt_every=2)
    with pytest.raises(ValueError, match="train.batch_size"):
        train(other, tmp_path / "run", resume=True, progress=False)
    state = ck.load_train_state(ck.latest_checkpoint(tmp_path / "run"))
    assert {"optimizer", "scheduler", "rng", "step", "epoch", "batch_in_epoch", "world", "skipped"} <= set(state)
    assert json.loads((ck.latest_checkpoint(tmp_path / "run") / "meta.json").read_text())["step"] == 2
