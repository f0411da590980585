"""Loaders treat what they open as hostile (issue 49 item 5): ``MDCCaptioner.from_pretrained`` refuses a partial
and a byte-flipped export as ``load_model`` does; a ``config.json`` is validated (every number finite, every size
bounded) and checked against the weights' header before anything is built; an ``hf-hub:`` encoder is never resolved
from a local folder (``mdc sample``, ``load_encoder``, ``from_pretrained``). Each on a copy of the shipped export."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

import mdc_core
from mdc_core import config as config_module
from mdc_core.checkpoint import CheckpointError
from mdc_core.config import ConfigError, RunConfig
from mdc_core.factory import check_fits, load_model
from mdc_workbench.cli import main
from mdc_workbench.export import MDCCaptioner, load_encoder

SHIPPED = Path(mdc_core.__file__).parent / "pretrained" / "mdc_tiny_lean_easy"


@pytest.fixture
def export(tmp_path) -> Path:
    out = tmp_path / "export"
    shutil.copytree(SHIPPED, out)
    return out


def _edit_config(folder: Path, section: str, **values) -> None:
    data = json.loads((folder / "config.json").read_text())
    data[section].update(values)
    (folder / "config.json").write_text(json.dumps(data))


def test_from_pretrained_refuses_a_byte_flipped_and_a_partial_export(export, tmp_path):
    weights = export / "model.safetensors"
    original = weights.read_bytes()
    flipped = bytearray(original)
    flipped[-100] ^= 0xFF  # a value inside the last tensor: still a valid safetensors file
    weights.write_bytes(bytes(flipped))
    for load in (MDCCaptioner.from_pretrained, load_model):
        with pytest.raises(CheckpointError, match="model.safetensors is corrupt .*differs from meta.json") as err:
            load(export)
        assert "\n" not in str(err.value)
    state = load_file(str(SHIPPED / "model.safetensors"))
    save_file({k: v for k, v in state.items() if not k.startswith("decoder.layers.2")}, str(weights))
    with pytest.raises(CheckpointError, match="corrupt"):
        MDCCaptioner.from_pretrained(export)
    (export / "meta.json").unlink()  # without meta.json (a save_pretrained folder): the header check names it
    with pytest.raises(CheckpointError, match=r"tensors of the model are missing from the file \(e.g. decoder.layers"):
        MDCCaptioner.from_pretrained(export)
    weights.write_bytes(original)
    assert type(MDCCaptioner.from_pretrained(export)) is MDCCaptioner  # the intact folder still loads


@pytest.mark.parametrize(("key", "value", "message"), [
    ("mlp_ratio", -1, r"model.mlp_ratio must be in \(0, 64.0\]"),
    ("mlp_ratio", float("inf"), "model.mlp_ratio must be a finite number, got inf"),
    ("mlp_ratio", float("nan"), "model.mlp_ratio must be a finite number, got nan"),
    ("text_width", 2**22, "model.text_width must be <= 16384, got 4194304"),
    ("context_length", 10**9, "model.context_length must be <= 4096, got 1000000000"),
    ("context_length", 1e9, "model.context_length must be an integer"),
    ("text_layers", 200000, "model.text_layers must be <= 256, got 200000"),
    ("image_size", 10**6, "model.image_size must be <= 4096"),
    ("output_vocab_size", 10**7, "model.output_vocab_size must be <= 49408"),
    ("encoder_kwargs", {"depth": 100000}, "model.encoder_kwargs.depth must be a finite number of at most 256"),
    ("encoder_kwargs", {"embed_dim": 2**22}, "model.encoder_kwargs.embed_dim must be a finite number of at most"),
])
def test_a_hostile_config_is_refused_before_anything_is_built(key, value, message, export, monkeypatch):
    _edit_config(export, "model", **{key: value})
    built = []
    monkeypatch.setattr(MDCCaptioner, "__init__", lambda self, config: built.append(config))
    for load in (MDCCaptioner.from_pretrained, load_model):
        with pytest.raises(ConfigError, match=message) as err:
            load(export)
        assert "\n" not in str(err.value)
    assert built == []


def test_every_float_of_a_config_is_finite():
    data = RunConfig().to_dict()
    for section, key in (("train", "lr"), ("objective", "t_high"), ("sampler", "temperature")):
        bad = json.loads(json.dumps(data))
        bad[section][key] = float("inf")
        with pytest.raises(ConfigError, match=f"{section}.{key} must be a finite number"):
            RunConfig.from_dict(bad)
    assert config_module.MODEL_LIMITS["output_vocab_size"] == __import__("mdc_core.tokenizer").tokenizer.VOCAB_SIZE


@pytest.mark.parametrize(("key", "value", "shown"), [
    ("text_layers", 4, "tensors of the model are missing from the file (e.g. decoder.layers.3"),
    ("text_layers", 2, "tensors of the file are unknown to the model (e.g. decoder.layers.2"),
    ("text_width", 256, "tensors have other shapes"),
    ("context_length", 77, "tensors have other shapes (e.g. decoder.pos_emb"),
])
def test_sizes_that_contradict_the_weights_header_are_refused_before_building(key, value, shown, export,
                                                                               monkeypatch):
    _edit_config(export, "model", **{key: value})
    built = []
    monkeypatch.setattr(MDCCaptioner, "__init__", lambda self, config: built.append(config))
    for load in (MDCCaptioner.from_pretrained, load_model):
        with pytest.raises(CheckpointError, match="does not fit the config.json beside it") as err:
            load(export)
        assert shown in str(err.value) and "\n" not in str(err.value)
    assert built == []
    cfg = RunConfig.load(SHIPPED / "config.json")
    check_fits(cfg, SHIPPED / "model.safetensors")  # the shipped folder fits itself


def test_a_hub_encoder_is_never_resolved_from_a_local_folder(export, tmp_path, monkeypatch, capsys):
    import huggingface_hub
    import timm.models._hub as timm_hub

    def no_network(*args, **kwargs):
        raise AssertionError("the network was asked")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_network)
    monkeypatch.setattr(timm_hub, "hf_hub_download", no_network, raising=False)
    _edit_config(export, "model", encoder="hf-hub:timm/vit_base_patch32_224.augreg_in21k")
    for load in (MDCCaptioner.from_pretrained, load_model, load_encoder):
        with pytest.raises(ValueError, match="model.encoder 'hf-hub:timm/.*is a Hugging Face Hub name") as err:
            load(export)
        assert "\n" not in str(err.value)
    image = tmp_path / "img.png"
    Image.new("RGB", (64, 64), (200, 30, 30)).save(image)
    assert main(["sample", "--run", str(export), "--image", str(image)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mdc: error:") and "Hugging Face Hub name" in err and "\n" not in err, err
    _edit_config(export, "model", encoder="hf_hub:timm/vit_base_patch32_224")  # timm's other spelling
    with pytest.raises(ValueError, match="Hugging Face Hub name"):
        load_model(export)
    assert torch.is_tensor(next(iter(load_model(SHIPPED)[0].state_dict().values())))


def test_a_timm_export_config_with_a_hub_name_or_huge_model_args_is_refused_before_timm(tmp_path, monkeypatch):
    import timm

    def no_build(*args, **kwargs):
        raise AssertionError("timm was asked to build it")

    monkeypatch.setattr(timm, "create_model", no_build)
    folder = tmp_path / "timm_export"
    folder.mkdir()
    shutil.copy(SHIPPED / "model.safetensors", folder / "model.safetensors")
    hub = {"architecture": "hf-hub:timm/vit_base_patch32_224.augreg_in21k", "model_args": {"num_classes": 0},
           "pretrained_cfg": {"input_size": [3, 224, 224]}}
    (folder / "config.json").write_text(json.dumps(hub))
    with pytest.raises(ValueError, match="architecture 'hf-hub:timm/.*is not a timm model name here"):
        load_encoder(folder)
    (folder / "config.json").write_text(json.dumps({**hub, "architecture": "vit_base_patch32_224",
                                                    "model_args": {"depth": 100000}}))
    with pytest.raises(ConfigError, match="model_args.depth must be a finite number of at most 256"):
        load_encoder(folder)
