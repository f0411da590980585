"""The probe tables' baselines: what a linear probe gets without any training.

* ``random``: the run's own architecture, randomly initialised exactly as training starts (``torch.manual_seed``
  of the run's training seed, then :func:`~mdc_core.factory.create_model`), never trained. Background is
  linearly decodable from such features, colour, count and position partly (docs/evidence.md): what training
  adds is the gap to this row.
* ``pixels``: the image itself, average-pooled to 16 x 16 x 3 and flattened (768 numbers): a floor any
  encoder should clear on tasks that need more than colour statistics.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor

from mdc_core.config import RunConfig
from mdc_core.factory import create_model

INITS = ("trained", "random", "pixels")  # probe_run(init=...): the trained weights, or a baseline
PIXEL_GRID = 16  # pixels per side of the raw-pixel baseline


def random_init_model(cfg: RunConfig, device: str | torch.device = "cpu") -> torch.nn.Module:
    """The architecture of `cfg`, initialised as training with ``cfg.train.seed`` initialises it (no pretrained
    weights), in eval mode. The global RNG is left untouched."""
    arch = dataclasses.replace(cfg.model, pretrained=False, pretrained_path="")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.train.seed)  # as mdc_core.train does before building the model
        model = create_model(arch, cfg.objective.name)
    return model.to(device).eval()


class PixelFeatures(torch.nn.Module):
    """A stand-in encoder whose features are the raw pixels (the ``pixels`` baseline)."""

    def pooled_features(self, images: Tensor, pool: str = "pixels") -> Tensor:
        """(B, 3, S, S) normalised images -> (B, 3 * 16 * 16) average-pooled pixels."""
        return F.adaptive_avg_pool2d(images.float(), PIXEL_GRID).flatten(1)
