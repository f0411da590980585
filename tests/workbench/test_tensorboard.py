"""``train.tensorboard=true``: the scalars of metrics.jsonl as TensorBoard events in the run folder, read back with
tensorboard's own reader; a run resumed after logging past its checkpoint holds each step once."""

from __future__ import annotations

import math
import shutil
import sys

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData
from torch.utils.tensorboard import SummaryWriter

from mdc_core.checkpoint import CKPT_DIR
from mdc_core.config import ConfigError
from mdc_core.train import train
from mdc_workbench.cli import build_parser
from mdc_workbench.cli.train import _train_config
from mdc_workbench.viz.tensorboard_log import (
    NOT_DRAWN,
    TAG_PREFIX,
    TensorBoardLog,
    counter_rates,
    drop_steps_after,
    flat_hparams,
    validation_problem,
)
from tests.train_helpers import (
    assert_same_metrics,
    micro_run,
    one_thread,  # noqa: F401 - a fixture
    read_metrics,
    write_micro_data,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def _events(run, purge: bool = True) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] as TensorBoard reads the folder (`purge`: its default handling of restarts; False: every
    event on disk)."""
    acc = EventAccumulator(str(run), size_guidance={"scalars": 0}, purge_orphaned_data=purge)
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _assert_events_equal_metrics(run) -> None:
    """Every number of metrics.jsonl that moves is its train/ curve; counters that only add up are drawn as rates."""
    records = read_metrics(run)
    keys = {k for r in records for k, v in r.items() if k not in NOT_DRAWN and isinstance(v, int | float)}
    assert {"loss", "acc_masked", "lr", "samples_per_s", "grad_norm"} <= keys
    rates = {TAG_PREFIX + k for k in ("truncated_share", "skipped_per_step", "nonfinite_skipped_per_step")}
    for purge in (True, False):
        events = _events(run, purge)
        assert {t for t in events if t.startswith(TAG_PREFIX)} == {TAG_PREFIX + k for k in keys} | rates
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
    assert all(after[tag][s] == v for tag in before for s, v in before[tag].items() if s <= 2)  # kept as written


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


def _plugin(run, name: str) -> dict[str, bytes]:
    acc = EventAccumulator(str(run))
    acc.Reload()
    return acc.PluginTagToContent(name)


def test_a_run_logs_val_loss_captions_the_unmasking_image_and_hparams_and_trains_as_without(tmp_path):
    data = write_micro_data(tmp_path / "data", 24)
    plain, logged = tmp_path / "plain", tmp_path / "logged"
    train(micro_run(data, steps=4, batch_size=8, ckpt_every=2), plain, progress=False)
    train(micro_run(data, steps=4, batch_size=8, ckpt_every=2, tensorboard=True), logged, progress=False)
    assert_same_metrics(read_metrics(plain), read_metrics(logged))  # the evaluation leaves training alone

    acc = EventAccumulator(str(logged), size_guidance={"scalars": 0, "tensors": 0, "images": 0})
    acc.Reload()
    tags = acc.Tags()
    assert {"train/loss", "val/loss"} <= set(tags["scalars"])
    assert [e.step for e in acc.Scalars("val/loss")] == [2, 4]  # the checkpoint cadence
    assert all(math.isfinite(e.value) and e.value > 0 for e in acc.Scalars("val/loss"))
    assert not {"train/epoch", "train/truncated", "train/skipped", "train/global_batch"} & set(tags["scalars"])
    assert "val/captions/text_summary" in tags["tensors"] and "run/counters/text_summary" in tags["tensors"]
    text = acc.Tensors("val/captions/text_summary")[-1].tensor_proto.string_val[0].decode()
    rows = [line for line in text.splitlines() if line[:3] in {"| 0", "| 1", "| 2", "| 3"}]
    assert "| image | reference | caption |" in text and len(rows) == 4  # 4 captioned images
    assert "val/unmasking" in tags["images"] and acc.Images("val/unmasking")[-1].width > 100

    hp = _plugin(logged, "hparams")
    experiment = HParamsPluginData.FromString(hp["_hparams_/experiment"]).experiment
    names = {h.name for h in experiment.hparam_infos}
    assert {"train.lr", "model.text_width", "objective.name"} <= names
    assert {m.name.tag for m in experiment.metric_infos} == {"train/loss", "val/loss"}
    start = HParamsPluginData.FromString(hp["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["train.steps"].number_value == 4
    assert "_hparams_/session_end_info" in hp


def test_data_without_a_validation_split_gets_a_note_and_no_val_curves(tmp_path):
    data = write_micro_data(tmp_path / "data", 16)
    cfg = micro_run(data, steps=2, batch_size=8, ckpt_every=2, tensorboard=True)
    assert validation_problem(cfg) == ""
    only_train = micro_run(data / "train", steps=2, batch_size=8, ckpt_every=2, tensorboard=True)
    assert "no validation split" in validation_problem(only_train)
    train(only_train, tmp_path / "run", progress=False)
    acc = EventAccumulator(str(tmp_path / "run"))
    acc.Reload()
    assert "val/loss" not in acc.Tags()["scalars"] and "val/note/text_summary" in acc.Tags()["tensors"]
    experiment = HParamsPluginData.FromString(_plugin(tmp_path / "run", "hparams")["_hparams_/experiment"]).experiment
    assert {m.name.tag for m in experiment.metric_infos} == {"train/loss"}


def test_counter_rates_by_hand():
    previous = {"step": 10.0, "skipped": 2.0, "truncated": 5.0, "nonfinite_skipped": 0.0}
    record = {"step": 15, "global_batch": 8, "skipped": 7, "truncated": 25, "nonfinite_skipped": 1, "loss": 1.0}
    # 5 steps x 8 captions = 40 read, 20 of them truncated; 5 records skipped and 1 update dropped over 5 steps
    assert counter_rates(previous, record) == {"truncated_share": 0.5, "skipped_per_step": 1.0,
                                               "nonfinite_skipped_per_step": 0.2}
    assert counter_rates(None, record) == {}  # after a resume: the previous totals are not known
    assert counter_rates(previous, {**record, "step": 10}) == {}  # no step between: no rate


def test_flat_hparams_are_scalars_and_text(tmp_path):
    flat = flat_hparams(micro_run(tmp_path))
    assert flat["train.steps"] == 4000 and flat["train.lr"] == 1e-3  # the tiny preset's
    assert flat["train.betas"] == "(0.9, 0.98)" and isinstance(flat["model.encoder_kwargs"], str)
    assert all(isinstance(v, int | float | str | bool) for v in flat.values())


def test_validation_captions_the_model_cannot_represent_give_a_note_not_a_crash(tmp_path, monkeypatch):
    import torch

    import mdc_workbench.viz.tensorboard_log as tb
    monkeypatch.setattr(tb, "in_vocabulary", lambda model, tokens: torch.zeros(tokens.shape[0], dtype=torch.bool))
    data = write_micro_data(tmp_path / "data", 16)
    train(micro_run(data, steps=2, batch_size=8, ckpt_every=1, tensorboard=True), tmp_path / "run", progress=False)
    acc = EventAccumulator(str(tmp_path / "run"), size_guidance={"tensors": 0})
    acc.Reload()
    assert "val/loss" not in acc.Tags()["scalars"]
    notes = acc.Tensors("val/note/text_summary")
    assert len(notes) == 1 and "is in the model's vocabulary" in notes[0].tensor_proto.string_val[0].decode()


def test_a_run_hook_is_told_each_record_and_checkpoint_and_the_end(tmp_path):
    """``train(..., hooks=[factory])``: rank 0 builds the hook with the run folder, the start step and the config,
    then tells it each metrics.jsonl record as written, each checkpoint but a stop's, and the end."""
    data = write_micro_data(tmp_path / "data", 24)
    told: list[tuple] = []

    class Hook:
        def __init__(self, run_dir, start_step, cfg):
            told.append(("start", run_dir, start_step, cfg.train.steps))

        def record(self, record):
            told.append(("record", record["step"], record["loss"]))

        def checkpoint(self, step, model):
            told.append(("checkpoint", step, model.training))

        def close(self):
            told.append(("close",))

    run = tmp_path / "run"
    train(micro_run(data, steps=4, batch_size=8, ckpt_every=2), run, progress=False, hooks=[Hook])
    records = read_metrics(run)
    assert told[0] == ("start", run, 0, 4) and told[-1] == ("close",)
    assert [t for t in told if t[0] == "record"] == [("record", r["step"], r["loss"]) for r in records]
    assert [t for t in told if t[0] == "checkpoint"] == [("checkpoint", 2, True), ("checkpoint", 4, True)]
    told.clear()
    train(micro_run(data, steps=6, batch_size=8, ckpt_every=2), run, resume=True, progress=False, hooks=[Hook])
    assert told[0] == ("start", run, 4, 6) and [t[1] for t in told if t[0] == "record"] == [5, 6]


def test_tensorboard_asked_for_without_its_hook_installed_is_one_line(tmp_path, monkeypatch):
    import mdc_core.run_state as run_state
    cfg = micro_run(tmp_path, tensorboard=True)
    assert [f.__name__ for f in run_state.config_hooks(cfg)] == ["TensorBoardLog"]  # pyproject.toml's entry point
    assert run_state.config_hooks(micro_run(tmp_path)) == []
    monkeypatch.setattr(run_state, "entry_points", lambda group: [])
    with pytest.raises(ConfigError, match=r"train.tensorboard=true, but no run hook named 'tensorboard'"):
        run_state.config_hooks(cfg)
