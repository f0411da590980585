"""The captioner shipped in ``mdc_core/pretrained/``: it loads (safetensors, no pickle), its checksum verifies, a
tampered copy is refused, and it captions the held-out single-object scenes with >= 90% accuracy, as its
README promises."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from mdc_core.checkpoint import CheckpointError
from mdc_core.factory import load_model
from mdc_workbench.export import shipped


@pytest.fixture(scope="module")
def loaded():
    return shipped.load_shipped()


def test_the_shipped_files_carry_one_checksum_and_stay_small() -> None:
    folder = shipped.shipped_model_dir()
    weights = folder / "model.safetensors"
    assert weights.stat().st_size < 20 * 2**20  # the repository's limit on a committed safetensors file
    assert shipped.sha256(weights) == shipped.SHIPPED_SHA256
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["complete"] and meta["sha256"]["model.safetensors"] == shipped.SHIPPED_SHA256
    readme = (folder / "README.md").read_text()
    assert shipped.SHIPPED_SHA256 in readme and "--set train.seed=1" in readme and "--difficulty easy" in readme
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["preset"] == "tiny_lean" and cfg["train"]["seed"] == 1 and not Path(cfg["data"]["path"]).is_absolute()
    assert shipped.data_params()["difficulty"] == "easy"


def test_it_captions_the_held_out_single_object_scenes_at_90_percent_or_more(loaded) -> None:
    model, cfg = loaded
    assert not model.causal and model.restricted and cfg.objective.name == "mdc"
    scenes = shipped.single_object_scenes()
    assert len(scenes) == 177  # of the first 512 test scenes of the easy data (docs/fast_recipe.md)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    result = shipped.single_object_accuracy(model, cfg, scenes)
    assert result["accuracy"] >= 0.90, result["accuracy"]
    claimed = float(re.search(r"\*\*([\d.]+)%\*\*", (shipped.SHIPPED_DIR / "README.md").read_text()).group(1))
    assert abs(100 * result["accuracy"] - claimed) < 0.05  # the README's number is this measurement


def test_tampered_weights_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / shipped.SHIPPED_NAME
    shutil.copytree(shipped.shipped_model_dir(), copy)
    data = bytearray((copy / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF  # one bit pattern changed in the last weight
    (copy / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt"):  # meta.json's SHA-256, checked by every load
        load_model(copy)
    meta = json.loads((copy / "meta.json").read_text())  # even with meta.json rewritten to match
    meta["sha256"]["model.safetensors"] = shipped.sha256(copy / "model.safetensors")
    (copy / "meta.json").write_text(json.dumps(meta))
    monkeypatch.setattr(shipped, "SHIPPED_DIR", copy)
    with pytest.raises(CheckpointError, match="not the shipped model"):
        shipped.load_shipped()
