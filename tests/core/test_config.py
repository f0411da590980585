"""Typed configs: presets, strict keys and types, overrides, JSON round trip."""

import dataclasses
import json

import pytest

from mdc_core.config import (
    ConfigError,
    RunConfig,
    SamplerConfig,
    apply_overrides,
    list_presets,
    load_preset,
    sampler_options,
)


def test_presets_registered_by_file_name():
    assert {"tiny", "vit_b32", "vit_b16", "vit_l14"} <= set(list_presets())


@pytest.mark.parametrize("name,width,heads,lr,wd,accum", [
    ("vit_b32", 512, 8, 5e-4, 0.1, 1), ("vit_b16", 512, 8, 5e-4, 0.2, 1), ("vit_l14", 768, 12, 4e-4, 0.2, 2)])
def test_paper_presets_match_appendix_a(name, width, heads, lr, wd, accum):
    cfg = load_preset(name)
    assert (cfg.model.text_layers, cfg.model.text_width, cfg.model.text_heads) == (12, width, heads)
    assert (cfg.model.image_size, cfg.model.context_length) == (224, 77)
    assert (cfg.train.lr, cfg.train.weight_decay, cfg.train.betas) == (lr, wd, (0.9, 0.98))
    assert cfg.train.warmup_steps == 10_000 and cfg.train.grad_accum == accum
    assert cfg.train.batch_size * cfg.train.grad_accum * 8 == 1024  # paper: 8 GPUs, global batch 1024
    assert (cfg.objective.t_low, cfg.objective.t_high) == (0.5, 1.0)


def test_unknown_key_names_it_and_suggests():
    with pytest.raises(ConfigError, match=r"unknown config key 'model.text_widht'.*text_width"):
        RunConfig.from_dict({"model": {"text_widht": 3}})
    with pytest.raises(ConfigError, match="unknown config section 'modle'"):
        apply_overrides(RunConfig(), ["modle.text_width=3"])
    with pytest.raises(ConfigError, match="unknown preset 'vit_h14'"):
        load_preset("vit_h14")


@pytest.mark.parametrize("override,message", [
    ("train.lr=fast", "train.lr must be a number"),
    ("train.steps=1.5", "train.steps must be an integer"),
    ("model.pretrained=1", "model.pretrained must be true or false"),
    ("train.betas=[0.9]", "train.betas must be a list of 2"),
    ("objective.name=diffusion", "objective.name must be one of"),
    ("objective.t_low=1.0", "t_low < t_high"),
    ("model.text_heads=3", "divisible by model.text_heads"),
    ("sampler.length=70", "exceeds model.context_length"),
    ("train.device=tpu", "train.device"),
    ("train", "section.key=value"),
])
def test_bad_values_raise_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_preset("tiny", [override])


def test_overrides_parse_json_and_strings():
    cfg = load_preset("tiny", ["train.lr=0.002", "model.encoder=vit_small_patch16_224", "train.betas=[0.9,0.95]",
                               "objective.antithetic_t=true"])
    assert cfg.train.lr == 0.002 and cfg.model.encoder == "vit_small_patch16_224"
    assert cfg.train.betas == (0.9, 0.95) and cfg.objective.antithetic_t is True


def test_json_round_trip(tmp_path):
    cfg = load_preset("vit_l14", ["objective.name=arc"])
    cfg.save(tmp_path / "config.json")
    again = RunConfig.load(tmp_path / "config.json")
    assert again == cfg
    assert json.loads((tmp_path / "config.json").read_text())["objective"]["name"] == "arc"


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        RunConfig.load(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        RunConfig.load(tmp_path / "bad.json")


def test_sampler_options_come_from_the_config():
    declared = {o.name: o for o in sampler_options()}
    assert list(declared) == [f.name for f in dataclasses.fields(SamplerConfig)]  # every field is an option
    assert declared["length"].range == (1, 75) and declared["length"].type is int and declared["length"].default == 15
    assert declared["seed"].range is None and declared["temperature"].flag == "--temperature"
    assert {name for name, o in declared.items() if o.range} == {"length", "tokens_per_step", "temperature", "top_k",
                                                                 "threshold", "remask_threshold", "remask_steps"}
    assert declared["threshold"].problem(1.5) == "must be in [0, 1]" and declared["threshold"].problem(1.0) is None
    with pytest.raises(ConfigError, match=r"sampler.top_k must be in \[0, 100\], got 101"):
        SamplerConfig(top_k=101).validate()
