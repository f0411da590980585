"""Damage that used to give tracebacks on ``--resume`` (issue 49 item 7): damaged log lines, an ``epochs.jsonl`` line
without its epoch, a ``state.pt`` without the optimizer or from another step (with ``meta.json``'s digests made to
match, so only its content tells), a cut-off run ``config.json``. Each resumes with a warning saying what it did,
or is one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from mdc_core.checkpoint import CKPT_DIR, CORRUPT_PREFIX
from mdc_core.run_folder import train_state_problem
from mdc_core.run_state import TrainState, resume_problem
from mdc_core.sources import file_sha256
from mdc_workbench.cli import main
from tests.train_helpers import read_metrics
from tests.workbench.test_cli import MICRO_SETS


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> tuple[Path, Path]:
    """A data folder (24 pairs: an epoch is 3 steps of 8) and a finished 4-step micro run (checkpoints 2 and 4)."""
    root = tmp_path_factory.mktemp("resume_damage")
    data, run = root / "data", root / "run"
    assert main(["data", "synth", "--out", str(data), "--n", "24", "--seed", "3", "--image-size", "32",
                 "--captions", "short"]) == 0
    assert main(["train", "--preset", "tiny", "--data", str(data), "--out", str(run), "--steps", "4", "--quiet",
                 *MICRO_SETS]) == 0
    return data, run


def _copy(setup, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(setup[1], copy)
    return copy


def _ckpt(run: Path, step: int) -> Path:
    return run / CKPT_DIR / f"step_{step:08d}"


def _replace_state(ckpt: Path, state: dict) -> None:
    """Write `state` as the checkpoint's state.pt and make meta.json's size and digest match it (as a hand that
    knows the format would): only its content can tell."""
    torch.save(state, ckpt / "state.pt")
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["bytes"]["state.pt"] = (ckpt / "state.pt").stat().st_size
    meta["sha256"]["state.pt"] = file_sha256(ckpt / "state.pt")
    (ckpt / "meta.json").write_text(json.dumps(meta))


def _resume(run: Path, steps: int = 6) -> int:
    return main(["train", "--out", str(run), "--resume", "--steps", str(steps), "--quiet"])


def test_damaged_metrics_lines_are_dropped_with_a_warning(setup, tmp_path, capsys):
    run = _copy(setup, tmp_path)
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write('null\n[1, 2]\n{"step": "abc", "loss": 1.0}\n{"step": 3, "loss": "abc"}\n')
    with pytest.warns(UserWarning, match=r"metrics.jsonl: dropped 3 damaged line\(s\) \(line 5, 6, 7: not a JSON "
                                         r"object with an integer step\)"):
        assert _resume(run) == 0
    assert "trained 6 steps (resumed at step 4)" in capsys.readouterr().out
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4, 3, 5, 6]  # the records with a step kept
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 6, "loss": "abc"}\n')
    assert main(["train", "--out", str(run), "--resume", "--quiet"]) == 0  # 'nothing to train' reads the log too
    assert "has already taken its 6 steps (last logged loss nan" in capsys.readouterr().out


def test_an_epochs_line_without_its_epoch_in_a_weights_only_resume(setup, tmp_path):
    run = _copy(setup, tmp_path)
    for step in (2, 4):
        (_ckpt(run, step) / "state.pt").unlink()  # every train state lost: rebuilt from the logs
    epochs = (run / "epochs.jsonl").read_text()
    assert json.loads(epochs.splitlines()[0])["epoch"] == 0
    (run / "epochs.jsonl").write_text(epochs + '{"step": 4, "skipped": {"bad": "x"}}\nnull\n')
    with pytest.warns(UserWarning, match="weights .*only"):
        assert _resume(run) == 0
    assert read_metrics(run)[-1]["step"] == 6


def test_a_state_pt_without_the_optimizer_falls_back_to_the_consistent_checkpoint(setup, tmp_path, capsys):
    run = _copy(setup, tmp_path)
    state = torch.load(_ckpt(run, 4) / "state.pt", weights_only=True)
    del state["optimizer"]
    _replace_state(_ckpt(run, 4), state)
    assert "holds no optimizer state" in train_state_problem(_ckpt(run, 4))
    with pytest.warns(UserWarning, match=r"state.pt does not resume step_00000004: it holds no optimizer state "
                                         r"\(set aside as corrupt_step_00000004\); resuming from the newest intact "
                                         r"checkpoint, step_00000002"):
        assert _resume(run) == 0
    assert "resumed at step 2" in capsys.readouterr().out
    assert (run / CKPT_DIR / f"{CORRUPT_PREFIX}step_00000004").is_dir()
    # the only checkpoint so: its weights, with the warning of a weights-only resume
    only = tmp_path / "only"
    shutil.copytree(setup[1], only)
    shutil.rmtree(_ckpt(only, 2))
    state = torch.load(_ckpt(only, 4) / "state.pt", weights_only=True)
    del state["optimizer"], state["scheduler"]
    _replace_state(_ckpt(only, 4), state)
    with pytest.warns(UserWarning, match="it holds no optimizer and no scheduler state, and no checkpoint has intact "
                                         "train state: resuming from step_00000004's weights"):
        assert _resume(only) == 0
    assert "resumed at step 4" in capsys.readouterr().out


def test_a_state_pt_of_another_step_is_not_resumed_as_this_one(setup, tmp_path, capsys):
    """step_4 holding step_2's state.pt used to resume 'at step 2' with step 4's weights."""
    run = _copy(setup, tmp_path)
    _replace_state(_ckpt(run, 4), torch.load(_ckpt(run, 2) / "state.pt", weights_only=True))
    with pytest.warns(UserWarning, match="it holds the train state of step 2, not of step 4.*resuming from the "
                                         "newest intact checkpoint, step_00000002"):
        assert _resume(run) == 0
    assert "resumed at step 2" in capsys.readouterr().out  # step 2's weights with step 2's state
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4, 5, 6]
    assert resume_problem({"step": "abc"}, 2) == "train state with a counter that is not a number (invalid " \
        "literal for int() with base 10: 'abc')"
    with pytest.raises(ValueError, match="train state is a list, not a dict"):
        TrainState.from_state_dict([1, 2])
    # meta.json saying another step than its folder's name is damage too
    meta = json.loads((_ckpt(run, 6) / "meta.json").read_text())
    (_ckpt(run, 6) / "meta.json").write_text(json.dumps({**meta, "step": 5}))
    with pytest.warns(UserWarning, match="records step 5, which is not the step its folder is named for"):
        assert _resume(run, 7) == 0
    assert "resumed at step 4" in capsys.readouterr().out


def test_a_cut_off_run_config_is_recovered_from_the_checkpoints_copy(setup, tmp_path, capsys):
    run = _copy(setup, tmp_path)
    whole = (run / "config.json").read_text()
    (run / "config.json").write_text(whole[: len(whole) // 2])
    with pytest.warns(UserWarning, match=r"config.json is damaged \(.*is not valid JSON.*\); using the config.json of "
                                         "step_00000004"):
        assert _resume(run) == 0
    assert json.loads((run / "config.json").read_text())["train"]["steps"] == 6  # written back whole
    (run / "config.json").write_text("{")
    for ckpt in (_ckpt(run, 4), _ckpt(run, 6)):
        (ckpt / "config.json").write_text("{")
    capsys.readouterr()
    assert _resume(run, 8) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mdc: error: --resume:") and "no checkpoint of" in err and "\n" not in err, err
