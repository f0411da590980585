"""Shared fixtures: a very small captioner that builds in milliseconds."""

import pytest
import torch

from mdc_core.config import ModelConfig
from mdc_core.model import Captioner

MICRO = dict(encoder="vit_base_patch32_224", image_size=32,
             encoder_kwargs={"patch_size": 8, "embed_dim": 32, "depth": 1, "num_heads": 2},
             text_width=32, text_layers=2, text_heads=2, context_length=24)


def micro_config(**overrides) -> ModelConfig:
    return ModelConfig(**{**MICRO, **overrides})


@pytest.fixture
def tiny_model():
    """Factory for a seeded micro captioner: tiny_model(causal=False, output_ids=None, **config overrides)."""

    def make(causal: bool = False, output_ids=None, seed: int = 0, **overrides) -> Captioner:
        torch.manual_seed(seed)
        cfg = micro_config(**overrides)
        if output_ids is not None:
            cfg.output_vocab, cfg.output_vocab_size = "corpus", len(output_ids)
        return Captioner(cfg, causal=causal, output_ids=output_ids).eval()

    return make
