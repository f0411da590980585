"""Helpers for the trainer tests: a micro run config, metrics reading, and forked training processes.

Training children are forked from the test process (they inherit its imports, so they start in milliseconds
instead of re-importing torch/timm/open_clip); a child is a real OS process with its own gloo process group
when RANK/WORLD_SIZE are set, exactly as torchrun would set them.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import socket
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from mdc_core.config import RunConfig, load_preset
from mdc_workbench.data import write_synthetic_dataset
from tests.conftest import MICRO

# logged values that must agree between runs (samples_per_s is a timing)
COMPARED = ("step", "epoch", "lr", "grad_norm", "loss", "acc_masked", "acc_next", "acc_retrieval", "ce_masked",
            "masked_frac", "t_mean", "skipped", "truncated", "nonfinite_skipped")


@pytest.fixture
def one_thread():
    """Micro models on a shared 2-core machine run fastest (and reproducibly across processes) on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def micro_run(data: str | Path, *overrides: str, **train: object) -> RunConfig:
    """The tiny preset shrunk to the MICRO model (corpus head), on `data`, with train.KEY=VALUE `train` overrides."""
    items = [f"model.{k}={json.dumps(v)}" for k, v in MICRO.items()]
    items += ['model.output_vocab="corpus"', f"data.path={json.dumps(str(data))}", "data.shuffle_buffer=16",
              "train.device=\"cpu\"", "train.warmup_steps=2", "train.log_every=1", "sampler.length=6"]
    items += [f"train.{k}={json.dumps(v)}" for k, v in train.items()]
    return load_preset("tiny", [*items, *overrides])


def write_micro_data(root: str | Path, n: int) -> Path:
    """A tiny synthetic data set of `n` training pairs (32 px, 8 per shard) for the trainer tests."""
    write_synthetic_dataset(root, n, image_size=32, n_val=8, n_test=8, n_compgen=8, shard_size=8, progress=False,
                            workers=1)
    return Path(root)


def read_metrics(run_dir: str | Path, name: str = "metrics.jsonl") -> list[dict]:
    path = Path(run_dir) / name
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def assert_same_metrics(a: list[dict], b: list[dict], rel: float = 1e-5) -> None:
    assert len(a) == len(b) and a, (len(a), len(b))
    for ra, rb in zip(a, b, strict=True):
        for key in COMPARED:
            if key in ra or key in rb:
                va, vb = ra[key], rb[key]
                assert abs(va - vb) <= rel * max(1.0, abs(va), abs(vb)), (ra["step"], key, va, vb)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(cfg_dict: dict, out: str, resume: bool, env: dict[str, str], delay_s: float, err_file: str) -> None:
    os.environ.update(env)
    torch.set_num_threads(1)
    import mdc_core.train as train_mod
    from mdc_core import loss_step
    if delay_s:  # a slower child, so that the test can kill it mid-run (results are unchanged)
        import time
        real = loss_step.Objective.forward

        def slow(self, *args, **kwargs):
            time.sleep(delay_s)
            return real(self, *args, **kwargs)

        loss_step.Objective.forward = slow
    try:
        train_mod.train(RunConfig.from_dict(cfg_dict), out, resume=resume, progress=False)
    except BaseException as err:  # noqa: BLE001 - reported to the parent test through a file
        Path(err_file).write_text(f"{type(err).__name__}: {err}\n{traceback.format_exc()}")
        os._exit(1)
    os._exit(0)


def start_training(cfg: RunConfig, out: str | Path, *, rank: int = 0, world: int = 1, port: int = 0,
                   resume: bool = False, delay_s: float = 0.0) -> tuple[mp.Process, Path]:
    """Fork a process that trains `cfg` into `out` (rank `rank` of `world` when world > 1). Returns the process
    and the file its exception (if any) is written to."""
    env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port)} if world > 1 else {}
    err_file = Path(out).parent / f".{Path(out).name}_rank{rank}.err"
    err_file.unlink(missing_ok=True)
    proc = mp.get_context("fork").Process(target=_child, args=(cfg.to_dict(), str(out), resume, env, delay_s,
                                                               str(err_file)))
    proc.start()
    return proc, err_file


def wait_for(predicate: Callable[[], object], timeout_s: float = 120.0, poll_s: float = 0.05) -> None:
    """Poll `predicate` until it is true (a training child got far enough); AssertionError after `timeout_s`."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and not predicate():
        time.sleep(poll_s)
    assert predicate(), "timed out"


def join_all(procs: list[mp.Process], timeout_s: float = 120.0) -> list[int | None]:
    """Wait for the training children together (`timeout_s` for all), kill any still alive; their exit codes."""
    end = time.monotonic() + timeout_s
    for p in procs:
        p.join(max(0.1, end - time.monotonic()))
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
    return codes
