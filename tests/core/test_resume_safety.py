"""``--resume`` never silently starts over: a run whose every checkpoint is damaged stops (saying where they went)
on every try, a folder that held checkpoints is never restarted from step 0, the metrics log is never rewritten,
and a run folder's config is found in its checkpoints when ``RUN/config.json`` is gone or a checkpoint's is
damaged (then the previous checkpoint is used). Each test resumes a copy of the session's ``trained_run``."""

import json
import shutil
from pathlib import Path

import pytest

from mdc_core import checkpoint as ck
from mdc_core.run_folder import truncate_jsonl
from mdc_workbench.cli import main
from tests.train_helpers import read_metrics


def _resume(data: Path, run: Path, steps: int = 4, flags: tuple[str, ...] = ()) -> list[str]:
    return ["train", "--out", str(run), "--steps", str(steps), "--quiet", "--resume", *flags]


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("mdc: error:") and "\n" not in err, err
    return err


def test_every_checkpoint_damaged_stops_every_resume_and_keeps_the_log(trained_run, tmp_path, capsys):
    """The second --resume used to say "stopped before its first checkpoint", start over from step 0 and rewrite
    metrics.jsonl; the first did not say that it had renamed the checkpoints."""
    data, run, _ = trained_run
    broken = tmp_path / "run"
    shutil.copytree(run, broken)
    for weights in (broken / "checkpoints").glob("step_*/model.safetensors"):
        weights.write_bytes(weights.read_bytes()[:100])
    log = (broken / "metrics.jsonl").read_bytes()
    assert main(_resume(data, broken)) == 2
    err = _one_line(capsys)
    assert "set aside as corrupt_step_00000004, corrupt_step_00000002" in err and "no intact checkpoint" in err, err
    for _ in range(2):  # and again: never a start from step 0
        assert main(_resume(data, broken)) == 2
        err = _one_line(capsys)
        assert "no intact checkpoint" in err and "corrupt_step_00000002" in err and "another --out" in err, err
        assert (broken / "metrics.jsonl").read_bytes() == log and ck.checkpoint_folders(broken) == []
    assert sorted(p.name for p in (broken / "checkpoints").glob("*step_*")) == \
        ["corrupt_step_00000002", "corrupt_step_00000004"]


def test_a_folder_whose_log_passed_a_checkpoint_is_never_started_over(trained_run, tmp_path, capsys):
    data, run, _ = trained_run
    broken = tmp_path / "run"
    shutil.copytree(run, broken)
    shutil.rmtree(broken / "checkpoints")  # deleted by hand: the log says step 2 and 4 were checkpointed
    log = (broken / "metrics.jsonl").read_bytes()
    assert main(_resume(data, broken)) == 2
    err = _one_line(capsys)
    assert "logged step 4" in err and "another --out" in err, err
    assert (broken / "metrics.jsonl").read_bytes() == log and not (broken / "checkpoints").exists()


def test_a_run_killed_before_its_first_checkpoint_starts_over_and_keeps_its_old_log(trained_run, tmp_path, capsys):
    data, run, _ = trained_run
    broken = tmp_path / "run"
    shutil.copytree(run, broken)
    shutil.rmtree(broken / "checkpoints")
    truncate_jsonl(broken / "metrics.jsonl", 1)  # killed after step 1, before the first checkpoint (step 2)
    (broken / "epochs.jsonl").unlink(missing_ok=True)
    log = (broken / "metrics.jsonl").read_bytes()
    with pytest.warns(UserWarning, match=r"stopped before its first checkpoint.*metrics_before_start_over_1.jsonl"):
        assert main(_resume(data, broken)) == 0
    assert (broken / "metrics_before_start_over_1.jsonl").read_bytes() == log  # the log is never rewritten
    assert [r["step"] for r in read_metrics(broken)] == [1, 2, 3, 4]
    for a, b in zip(read_metrics(broken), read_metrics(run), strict=True):
        assert abs(a["loss"] - b["loss"]) < 1e-5 * max(1, abs(a["loss"]))


def test_resume_finds_the_config_in_the_checkpoints_when_the_run_folder_lost_it(trained_run, tmp_path, capsys):
    data, run, _ = trained_run
    broken = tmp_path / "run"
    shutil.copytree(run, broken)
    (broken / "config.json").unlink()
    with pytest.warns(UserWarning, match=r"config.json is missing.*step_00000004"):
        assert main(_resume(data, broken, steps=6)) == 0
    assert "trained 6 steps (resumed at step 4)" in capsys.readouterr().out
    assert json.loads((broken / "config.json").read_text())["train"]["steps"] == 6


@pytest.mark.parametrize("damage", ['{"model": {"text_wid', '{"model": {"no_such_key": 1}}'],
                         ids=["cut-off", "unknown-key"])
def test_a_damaged_checkpoint_config_falls_back_to_the_previous_step(trained_run, tmp_path, capsys, damage):
    """It used to block --resume with the config loader's error."""
    data, run, _ = trained_run
    broken = tmp_path / "run"
    shutil.copytree(run, broken)
    config = broken / "checkpoints" / "step_00000004" / "config.json"
    config.write_text(damage)
    with pytest.warns(UserWarning, match=r"config.json is damaged.*set aside as corrupt_step_00000004.*step_00000002"):
        assert main(_resume(data, broken)) == 0
    assert (broken / "checkpoints" / "corrupt_step_00000004" / "config.json").read_text() == damage
    for a, b in zip(read_metrics(broken), read_metrics(run), strict=True):
        assert a["step"] == b["step"] and abs(a["loss"] - b["loss"]) < 1e-5 * max(1, abs(a["loss"]))
