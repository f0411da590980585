"""DDP on CPU (gloo): rank/worker data sharding, 2 ranks == 1 process with the same global batch, a dead rank."""

import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from safetensors.torch import load_file

from mdc_core import checkpoint as ck
from mdc_core.config import DataConfig
from mdc_core.data import build_loader
from mdc_core.train import train
from tests.train_helpers import (
    assert_same_metrics,
    free_port,
    join_all,
    micro_run,
    one_thread,  # noqa: F401 - a fixture
    read_metrics,
    start_training,
    write_micro_data,
)

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ddp_data")
    return write_micro_data(root, 64)


def test_ranks_and_workers_read_disjoint_shares_covering_the_epoch(data):
    for workers in (0, 2):
        cfg = DataConfig(path=str(data), num_workers=workers, shuffle_buffer=16)
        keys = [[k for b in build_loader(cfg, image_size=32, batch_size=4, seed=1, epoch=2, drop_last=False,
                                         rank=r, world=2) for k in b["key"]] for r in (0, 1)]
        assert not set(keys[0]) & set(keys[1])
        assert Counter(keys[0] + keys[1]) == Counter(f"{i:09d}" for i in range(64))  # each sample exactly once
    with pytest.raises(ValueError, match="rank"):
        build_loader(DataConfig(path=str(data)), image_size=32, batch_size=4, rank=2, world=2)
    with pytest.raises(ValueError, match="16 ranks"):  # 8 shards cannot feed 16 ranks
        build_loader(DataConfig(path=str(data)), image_size=32, batch_size=4, rank=0, world=16)


def test_two_gloo_ranks_match_one_process_with_the_same_global_batch(data, tmp_path):
    # 2 ranks x batch 4 x accumulation 1 == 1 process x batch 4 x accumulation 2 with 2 readers (workers):
    # same samples per step, same masking draws, loss normalised by the global token count
    ddp_cfg = micro_run(data, steps=5, batch_size=4, grad_accum=1, ckpt_every=5, seed=3)
    port = free_port()
    procs = [start_training(ddp_cfg, tmp_path / "ddp", rank=r, world=2, port=port) for r in (0, 1)]
    codes = join_all([p for p, _ in procs])
    errors = [e.read_text() for _, e in procs if e.exists()]
    assert codes == [0, 0], errors

    ref_cfg = micro_run(data, "data.num_workers=2", steps=5, batch_size=4, grad_accum=2, ckpt_every=5, seed=3)
    train(ref_cfg, tmp_path / "ref", progress=False)

    ddp, ref = read_metrics(tmp_path / "ddp"), read_metrics(tmp_path / "ref")
    assert len(ddp) == 5  # only rank 0 logs
    assert {r["global_batch"] for r in ddp} == {r["global_batch"] for r in ref} == {8}
    assert_same_metrics(ddp, ref, rel=1e-4)
    a, b = (load_file(str(ck.latest_checkpoint(tmp_path / run) / "model.safetensors")) for run in ("ddp", "ref"))
    for k in a:
        assert (a[k] - b[k]).abs().max() <= 1e-4 * max(1.0, float(b[k].abs().max())), k
    state = ck.load_train_state(ck.latest_checkpoint(tmp_path / "ddp"))
    assert state["world"] == 2 and state["global_batch"] == 8


def test_a_dead_rank_stops_the_job_with_a_clear_message(data, tmp_path):
    cfg = micro_run(data, steps=200, batch_size=4, ckpt_every=1000, dist_timeout_s=30)
    port = free_port()
    (p0, err0), (p1, _) = (start_training(cfg, tmp_path / "run", rank=r, world=2, port=port, delay_s=0.05)
                           for r in (0, 1))
    end = time.monotonic() + 60
    while len(read_metrics(tmp_path / "run")) < 2 and time.monotonic() < end:
        time.sleep(0.05)
    assert p0.is_alive() and p1.is_alive()
    os.kill(p1.pid, signal.SIGKILL)
    assert join_all([p0, p1], timeout_s=60) == [1, -signal.SIGKILL]
    message = err0.read_text()
    assert message.startswith("RankFailure") and "Another rank probably died" in message


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None,
                    reason="torchrun not installed beside this python")
def test_torchrun_cli(data, tmp_path):
    """The documented command line: ``torchrun --standalone --nproc_per_node=2 -m mdc_workbench train ...``."""
    cfg = micro_run(data, steps=3, batch_size=4, ckpt_every=3)
    sets = [arg for key in ("model", "data", "train") for k, v in cfg.to_dict()[key].items()
            for arg in ("--set", f"{key}.{k}={__import__('json').dumps(v)}")]
    cmd = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node=2", "-m", "mdc_workbench",
           "train", "--preset", "tiny", "--out", str(tmp_path / "run"), "--quiet", *sets]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(read_metrics(tmp_path / "run")) == 3
    assert ck.load_train_state(ck.latest_checkpoint(tmp_path / "run"))["world"] == 2


def test_training_stops_its_data_loader_workers(data, tmp_path):
    # the workers ignore SIGTERM (an interrupt must not kill the step in flight), so one left running would make
    # multiprocessing's exit hook wait for it forever: train() must shut them down itself, however it ends
    import multiprocessing

    before = set(multiprocessing.active_children())
    train(micro_run(data, "data.num_workers=2", steps=3, batch_size=4, ckpt_every=3), tmp_path / "w", progress=False)
    assert set(multiprocessing.active_children()) - before == set()
