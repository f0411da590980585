"""Resources: a full disk (a real small tmpfs where the test may mount one, else a writer patched to fail as
safetensors does on ENOSPC), the free-space check, what a killed writer leaves, file permissions, and commands
that fail leaving no output folder."""

import errno
import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from mdc_core import checkpoint as ck
from mdc_core import run_folder
from mdc_core.config import RunConfig
from mdc_workbench.cli import main
from tests.conftest import micro_config
from tests.train_helpers import micro_run, read_metrics
from tests.workbench.test_cli import MICRO_SETS

FORK = mp.get_context("fork")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("full") / "data"
    assert main(["data", "synth", "--out", str(out), "--n", "24", "--seed", "3", "--image-size", "32",
                 "--captions", "short"]) == 0
    return out


def _train_argv(data: Path, run: Path, *extra: str) -> list[str]:
    return ["train", "--preset", "tiny", "--data", str(data), "--out", str(run), "--quiet", *MICRO_SETS, *extra]


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("mdc: error:") and "\n" not in err, err
    return err


@pytest.fixture
def small_tmpfs(tmp_path):
    """A function mounting a tmpfs of `size` bytes at tmp_path/full (skips where mounting is not allowed)."""
    mounted = []

    def mount(size: int) -> Path:
        where = tmp_path / "full"
        where.mkdir()
        try:
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                                  capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            done = None
        if done is None or done.returncode != 0:
            pytest.skip("cannot mount a tmpfs here (not root, or no CAP_SYS_ADMIN); "
                        "test_enospc_from_the_writer_is_one_line... covers the same path with a patched writer")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", str(where)], capture_output=True, timeout=30)


def test_a_full_tmpfs_is_a_one_line_error_that_keeps_the_last_checkpoint(data, tmp_path, small_tmpfs, capsys,
                                                                         monkeypatch):
    probe = tmp_path / "probe"
    assert main(_train_argv(data, probe, "--steps", "1", "--set", "train.ckpt_every=1")) == 0
    size = sum(json.loads((ck.latest_checkpoint(probe) / "meta.json").read_text())["bytes"].values())
    full = small_tmpfs(int(1.6 * size) + 256 * 1024)  # one checkpoint and the logs fit, a second does not
    run = full / "R"
    argv = _train_argv(data, run, "--steps", "3", "--set", "train.ckpt_every=1")
    assert main(argv) == 1
    err = _one_line(capsys)
    assert "not enough free space for checkpoint step_00000002" in err and "step_00000001" in err
    assert "--resume" in err
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step_00000001"]
    ck.verify_checkpoint(run / "checkpoints" / "step_00000001")
    assert main(["train", "--out", str(run), "--resume", "--quiet"]) == 1  # resume: the same line, no traceback
    assert "not enough free space" in _one_line(capsys)
    # without the check the write itself fills the disk: the same promise
    monkeypatch.setattr(ck, "_ensure_space", lambda *a: None)
    assert main(["train", "--out", str(run), "--resume", "--quiet"]) == 1
    err = _one_line(capsys)
    assert "filled up while writing checkpoint step_00000002" in err and "removed the partial checkpoint" in err
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step_00000001"]
    ck.verify_checkpoint(run / "checkpoints" / "step_00000001")


def test_enospc_from_the_writer_is_one_line_and_removes_the_partial_folder(data, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    assert main(_train_argv(data, run, "--steps", "2")) == 0
    real = ck.save_file

    def full_disk(tensors, path, *args, **kwargs):  # as safetensors reports ENOSPC, after a partial write
        Path(path).write_bytes(b"\0" * 1000)
        raise Exception("Error while serializing: I/O error: No space left on device (os error 28)")  # noqa: TRY002

    monkeypatch.setattr(ck, "save_file", full_disk)
    assert main(_train_argv(data, run, "--resume", "--steps", "4")) == 1
    err = _one_line(capsys)
    assert "filled up while writing checkpoint step_00000004" in err and f"{run}/checkpoints/step_00000002" in err
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step_00000002"]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_00000002"
    monkeypatch.setattr(ck, "save_file", real)
    assert main(_train_argv(data, run, "--resume", "--steps", "4")) == 0
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4]


def test_enospc_outside_a_checkpoint_is_one_line(data, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    assert main(_train_argv(data, run, "--steps", "2")) == 0

    def full(path, step):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(run_folder, "truncate_jsonl", full)
    assert main(_train_argv(data, run, "--resume", "--steps", "4")) == 1
    err = _one_line(capsys)
    assert err.startswith(f"mdc: error: no space left on the device (writing {run}/metrics.jsonl)")


def test_the_free_space_check_prunes_what_the_save_would_prune_and_never_the_last_checkpoint(tmp_path, tiny_model,
                                                                                          monkeypatch):
    model, cfg = tiny_model(), RunConfig(model=micro_config()).validate()
    for step in (1, 2):
        ck.save_checkpoint(tmp_path, step, cfg, model, keep_last=2)
    size = sum(json.loads((tmp_path / "checkpoints" / "step_00000002" / "meta.json").read_text())["bytes"].values())
    real, disk = shutil.disk_usage, {"capacity": 2.5 * size}

    def small_disk(path):  # a disk of `capacity` bytes holding the checkpoints
        used = len(ck.list_checkpoints(tmp_path)) * size
        return real(path)._replace(free=int(disk["capacity"] - used))

    monkeypatch.setattr(ck.shutil, "disk_usage", small_disk)
    ck.save_checkpoint(tmp_path, 3, cfg, model, keep_last=2)  # step 1 pruned first: the save would prune it anyway
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["step_00000002", "step_00000003"]
    ck.save_checkpoint(tmp_path, 4, cfg, model, keep_last=1)
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["step_00000004"]
    disk["capacity"] = 1.5 * size  # room for one: the only good checkpoint is never pruned to make room
    with pytest.raises(ck.DiskFullError, match="needs about .* free; the last good checkpoint is .*step_00000004"):
        ck.save_checkpoint(tmp_path, 5, cfg, model, keep_last=1)
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["step_00000004"]
    assert not list((tmp_path / "checkpoints").glob(".tmp*"))


def _killed_mid_write(cfg_dict: dict, out: str) -> None:
    """Child: train, but hang inside the first checkpoint's state.pt write (as a kill -9 would find it)."""
    import mdc_core.train as train_mod
    torch.set_num_threads(1)

    def hang(obj, path, *args, **kwargs):
        Path(path).write_bytes(b"\0" * 4096)
        time.sleep(600)

    ck.torch.save = hang
    train_mod.train(RunConfig.from_dict(cfg_dict), out, progress=False)
    os._exit(0)


def test_resume_clears_what_a_writer_killed_mid_checkpoint_left(data, tmp_path):
    from mdc_core.train import train
    cfg = micro_run(data, steps=2, batch_size=8, ckpt_every=2)
    run = tmp_path / "run"
    child = FORK.Process(target=_killed_mid_write, args=(cfg.to_dict(), str(run)))
    child.start()
    end = time.monotonic() + 120
    while time.monotonic() < end and not list((run / "checkpoints").glob(".tmp_step_*/state.pt")):
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)
    child.join(30)
    left = run / "checkpoints" / f".tmp_step_00000002_{child.pid}"
    assert left.is_dir()
    running = run / "checkpoints" / f".tmp_step_00000002_{os.getppid()}"  # a live process's: not touched
    running.mkdir()
    with pytest.warns(UserWarning, match=f"no longer running left in {run}: .tmp_step_00000002_{child.pid}"):
        result = train(cfg, run, resume=True, progress=False)
    assert result.steps == 2 and not left.exists() and running.is_dir()


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_weights_get_the_permissions_of_every_other_file(tmp_path, tiny_model, umask):
    old = os.umask(umask)
    try:
        path = ck.save_checkpoint(tmp_path, 1, RunConfig(model=micro_config()).validate(), tiny_model(),
                                  ema_state=tiny_model().state_dict(), train_state={"step": 1})
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in path.iterdir()}
    assert set(modes) == {"model.safetensors", "ema.safetensors", "config.json", "state.pt", "meta.json"}
    assert set(modes.values()) == {0o666 & ~umask}, modes


def test_failed_data_commands_leave_no_output_folder(tmp_path, capsys, monkeypatch):
    table = tmp_path / "bad.csv"
    table.write_text("image,caption\nnope1.jpg,a cat\nnope2.jpg,a dog\n")
    assert main(["data", "shards", "--from", str(table), "--out", str(tmp_path / "shards"), "--quiet"]) == 2
    assert "no usable image-caption pair" in _one_line(capsys)
    assert not (tmp_path / "shards").exists()
    existing = tmp_path / "mine"
    existing.mkdir()
    (existing / "notes.txt").write_text("kept")
    assert main(["data", "shards", "--from", str(table), "--out", str(existing), "--quiet"]) == 2
    assert sorted(p.name for p in existing.iterdir()) == ["notes.txt"]

    import mdc_workbench.data.synth as synth

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(synth, "_write_split", interrupted)
    assert main(["data", "synth", "--out", str(tmp_path / "synth"), "--n", "8"]) == 130
    assert not (tmp_path / "synth").exists()


def test_data_synth_does_not_replace_a_data_set_without_overwrite(data, tmp_path, capsys):
    copy = tmp_path / "data"
    shutil.copytree(data, copy)
    before = (copy / "manifest.json").read_text()
    assert main(["data", "synth", "--out", str(copy), "--n", "8"]) == 2
    assert "already holds a data set" in _one_line(capsys) and (copy / "manifest.json").read_text() == before
    assert main(["data", "synth", "--out", str(copy), "--n", "8", "--overwrite"]) == 0
    assert json.loads((copy / "manifest.json").read_text())["counts"]["train"] == 8
