"""``train.tensorboard=true``: the scalars of metrics.jsonl as TensorBoard events in the run folder, read back with
tensorboard's own reader; a run resumed after logging past its checkpoint holds each step once."""

from __future__ import annotations

import math
import shutil
import sys

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.tensorboard import SummaryWriter

from mdc_core.checkpoint import CKPT_DIR
from mdc_core.cli import build_parser
from mdc_core.cli.train import _train_config
from mdc_core.config import ConfigError
from mdc_core.tensorboard_log import TAG_PREFIX, TensorBoardLog, drop_steps_after
from mdc_core.train import train
from tests.train_helpers import micro_run, one_thread, read_metrics, write_micro_data  # noqa: F401 - a fixture

pytestmark = pytest.mark.usefixtures("one_thread")


def _events(run, purge: bool = True) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] as TensorBoard reads the folder (`purge`: its default handling of restarts; False: every
    event on disk)."""
    acc = EventAccumulator(str(run), size_guidance={"scalars": 0}, purge_orphaned_data=purge)
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _assert_events_equal_metrics(run) -> None:
    records = read_metrics(run)
    keys = {k for r in records for k, v in r.items() if k != "step" and isinstance(v, int | float)}
    assert {"loss", "acc_masked", "lr", "samples_per_s", "grad_norm"} <= keys
    for purge in (True, False):
        events = _events(run, purge)
        assert set(events) == {TAG_PREFIX + k for k in keys}
        for key in keys:
            want = [(r["step"], float(np.float32(r[key]))) for r in records]  # TensorBoard keeps float32
            got = events[TAG_PREFIX + key]
            assert [s for s, _ in got] == [s for s, _ in want], (key, purge)  # each step once, in order
            assert all(a == b or (math.isnan(a) and math.isnan(b)) for (_, a), (_, b) in zip(got, want, strict=True))


def test_events_equal_metrics_jsonl_and_a_resume_appends_without_duplicates(tmp_path):
    data = write_micro_data(tmp_path / "data", 24)
    cfg = micro_run(data, steps=4, batch_size=8, ckpt_every=2, keep_last=5, tensorboard=True)
    run = tmp_path / "run"
    train(cfg, run, progress=False)
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4]
    _assert_events_equal_metrics(run)

    # a crash after logging step 4 but before its checkpoint: the newest checkpoint is step 2
    shutil.rmtree(run / CKPT_DIR / "step_00000004")
    (run / CKPT_DIR / "latest").write_text("step_00000002\n")
    before = {tag: dict(v) for tag, v in _events(run, purge=False).items()}
    train(micro_run(data, steps=6, batch_size=8, ckpt_every=2, keep_last=5, tensorboard=True), run, resume=True,
          progress=False)
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4, 5, 6]
    _assert_events_equal_metrics(run)
    assert len(list(run.glob("*tfevents*"))) == 2  # the first attempt's file (cut to step 2) and the resumed one
    after = {tag: dict(v) for tag, v in _events(run, purge=False).items()}
    assert all(after[tag][s] == before[tag][s] for tag in before for s in (1, 2))  # steps 1-2 kept as written


def test_drop_steps_after_rewrites_only_files_with_later_steps(tmp_path):
    writer = SummaryWriter(str(tmp_path))
    for step in range(1, 6):
        writer.add_scalar("train/loss", 1.0 / step, step)
    writer.close()
    (tmp_path / "metrics.jsonl").write_text("")  # other files of the run are left alone
    (name,) = [p.name for p in tmp_path.glob("*tfevents*")]
    assert drop_steps_after(tmp_path, 5) == 0
    assert drop_steps_after(tmp_path, 3) == 2
    assert [p.name for p in tmp_path.glob("*tfevents*")] == [name]
    assert _events(tmp_path, purge=False) == {"train/loss": [(s, float(np.float32(1.0 / s))) for s in (1, 2, 3)]}
    assert drop_steps_after(tmp_path, 0) == 3 and _events(tmp_path) == {}


def test_switches_and_a_missing_tensorboard_package(tmp_path, monkeypatch):
    args = build_parser().parse_args(["train", "--data", "d", "--out", "o", "--tensorboard"])
    assert _train_config(args).train.tensorboard is True
    assert _train_config(build_parser().parse_args(["train", "--data", "d", "--out", "o"])).train.tensorboard is False
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if tensorboard were not installed
    with pytest.raises(ConfigError, match=r"needs the tensorboard package.*\[tensorboard\]"):
        TensorBoardLog(tmp_path)
