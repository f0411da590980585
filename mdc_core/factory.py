"""One place that turns (model config, objective) into a model: the trainer and the checkpoint loader both call
:func:`create_model`, so every objective's run saves and loads the same way (safetensors + ``config.json``).

The objective table (:data:`mdc_core.registry.OBJECTIVES`) names each objective's architecture (its spec's
``model``); the architectures are the rows of :data:`MODELS`. (An objective's *family*, masked / causal /
contrastive, is another thing: :attr:`mdc_core.registry.ObjectiveSpec.family`.)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .clip_model import CLIPModel
from .config import ModelConfig, RunConfig
from .encoders import check_model_size
from .model import Captioner
from .registry import ObjectiveSpec, objective_spec

MODELS: dict[str, Callable[[ModelConfig, ObjectiveSpec, torch.Tensor | None], nn.Module]] = {
    "captioner": lambda cfg, spec, ids: Captioner(cfg, causal=spec.causal, output_ids=ids),
    "clip": lambda cfg, spec, ids: CLIPModel(cfg, vocab_ids=ids),
}

# probe feature of each architecture: GAP over patch tokens for captioners (the paper's choice), CLS for CLIP
PROBE_POOL: dict[str, str] = {"captioner": "gap", "clip": "cls"}


def create_model(cfg: RunConfig | ModelConfig, objective: str, output_ids: torch.Tensor | None = None
                 ) -> Captioner | CLIPModel:
    """A freshly initialised model for `objective` (a row of the objective table).

    `output_ids` is the corpus token table when ``cfg.output_vocab == "corpus"`` (the captioners' output rows,
    CLIP's input rows); None allocates it for a checkpoint to fill, or means the full vocabulary.
    """
    model_cfg = cfg.model if isinstance(cfg, RunConfig) else cfg
    check_model_size(model_cfg)  # before anything is built: a config inside each limit can still be too large
    spec = objective_spec(objective)
    return MODELS[spec.model](model_cfg, spec, output_ids)


def model_architecture(objective: str) -> str:
    """The architecture ("captioner" or "clip") an objective trains: a row of :data:`MODELS`."""
    return objective_spec(objective).model


def probe_pool(objective: str) -> str:
    """The pooling (``"gap"`` or ``"cls"``) that gives the probe feature of a run with this objective."""
    return PROBE_POOL[model_architecture(objective)]
