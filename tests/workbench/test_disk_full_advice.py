"""What `DiskFullError` advises must be something `--resume` then accepts: freeing space, not a config change."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mdc_core import checkpoint as ck
from mdc_core.config import RunConfig
from mdc_workbench.cli import main
from tests.conftest import micro_config
from tests.workbench.test_cli import MICRO_SETS


def test_the_disk_full_advice_is_something_resume_accepts(tmp_path: Path, tiny_model, monkeypatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    assert main(["data", "synth", "--out", str(data), "--n", "24", "--seed", "3", "--image-size", "32",
                 "--captions", "short"]) == 0
    run = tmp_path / "run"
    train = ["train", "--preset", "tiny", "--data", str(data), "--out", str(run), "--quiet", *MICRO_SETS]
    assert main([*train, "--steps", "2"]) == 0
    assert main([*train, "--resume", "--steps", "4", "--set", "train.keep_last=1"]) == 2
    assert "keep_last" in capsys.readouterr().err  # a changed keep_last is refused: the advice must not name it

    model, cfg = tiny_model(), RunConfig(model=micro_config()).validate()
    folder = tmp_path / "full"
    ck.save_checkpoint(folder, 1, cfg, model)
    real = shutil.disk_usage
    monkeypatch.setattr(ck.shutil, "disk_usage", lambda path: real(path)._replace(free=1000))
    with pytest.raises(ck.DiskFullError) as err:
        ck.save_checkpoint(folder, 2, cfg, model)
    advice = str(err.value)
    assert "keep_last" not in advice and "Free some space" in advice and advice.endswith("continue with --resume")
