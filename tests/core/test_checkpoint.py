"""Checkpoints: atomic layout, round trip from the folder alone, half-written and foreign checkpoints."""

import shutil

import pytest
import torch

from mdc_core import checkpoint as ck
from mdc_core.config import RunConfig
from mdc_core.factory import load_model
from mdc_core.sampler import sample
from mdc_core.tokenizer import build_output_vocab
from tests.conftest import micro_config


def _cfg(**model) -> RunConfig:
    cfg = RunConfig(model=micro_config(**model))
    cfg.sampler.length = 6
    return cfg.validate()


def test_round_trip_rebuilds_same_model_and_samples(tmp_path, tiny_model):
    ids = build_output_vocab(["a red circle", "a blue square left of a green star"])
    model = tiny_model(output_ids=ids)
    cfg = _cfg(output_vocab="corpus", output_vocab_size=len(ids))
    path = ck.save_checkpoint(tmp_path, 7, cfg, model, train_state={"step": 7})
    assert path.name == "step_00000007" and (tmp_path / "checkpoints" / "latest").read_text().strip() == path.name
    loaded, cfg2 = load_model(tmp_path)
    assert cfg2 == cfg
    for k, v in model.state_dict().items():
        assert torch.equal(v, loaded.state_dict()[k]), k
    images = torch.randn(2, 3, 32, 32)
    a = sample(model, model.encode_image(images), cfg.sampler)
    b = sample(loaded, loaded.encode_image(images), cfg2.sampler)
    assert torch.equal(a.tokens, b.tokens) and torch.allclose(a.reveal_confidence, b.reveal_confidence)
    assert ck.load_train_state(path)["step"] == 7


def test_keep_last_and_a_checkpoint_without_meta_is_damage_not_skipped_silently(tmp_path, tiny_model):
    model, cfg = tiny_model(), _cfg()
    for step in (1, 2, 3):
        ck.save_checkpoint(tmp_path, step, cfg, model, keep_last=2)
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["step_00000002", "step_00000003"]
    assert not list((tmp_path / "checkpoints").glob(".tmp*"))
    # step 4 without meta.json: a writer renames a checkpoint into place only once complete, so this is damage
    broken = tmp_path / "checkpoints" / "step_00000004"
    shutil.copytree(tmp_path / "checkpoints" / "step_00000003", broken)
    (broken / "meta.json").unlink()
    (tmp_path / "checkpoints" / "latest").write_text("step_00000004\n")
    with pytest.warns(UserWarning, match="step_00000004 has no meta.json.*using the newest complete checkpoint"):
        assert ck.latest_checkpoint(tmp_path).name == "step_00000003"
    for path in (broken, tmp_path):  # the folder itself, or the run whose newest checkpoint it is
        with pytest.raises(ck.CheckpointError, match="step_00000004 has no meta.json"):
            ck.resolve_checkpoint(path)


def test_checkpoint_of_another_architecture(tmp_path, tiny_model):
    ck.save_checkpoint(tmp_path, 1, _cfg(), tiny_model())
    cfg_path = tmp_path / "checkpoints" / "step_00000001" / "config.json"
    other = _cfg(text_width=64)
    other.save(cfg_path)  # config now describes a wider decoder than the saved weights
    with pytest.raises(ValueError, match="does not fit the config.json beside it: .* tensors have other shapes"):
        load_model(tmp_path)  # found in the weights' header, before the model is built


def test_missing_run_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_model(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        load_model(tmp_path)
