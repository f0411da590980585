"""Reading a model's weight file without trusting it: a safetensors file's header checked against the model its
``config.json`` builds before anything is allocated (:func:`check_fits`), its tensors decoded with one-line errors
(:func:`load_weights`), and Hub encoder names refused for local folders (:func:`refuse_hub_encoder`). Used by
:func:`mdc_core.checkpoint.load_model` (a run's checkpoint folder) and :mod:`mdc_core.hub` (a ``save_pretrained``
folder); where checkpoints are written, found and verified is :mod:`mdc_core.checkpoint`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from .config import RunConfig
from .factory import create_model


class CheckpointError(ValueError):
    """A checkpoint file is damaged (its size or SHA-256 differs from meta.json, or it cannot be decoded)."""


HUB_PREFIXES = ("hf-hub:", "hf_hub:")  # timm model names it resolves on the Hugging Face Hub (network)


def refuse_hub_encoder(cfg: RunConfig, where: str | Path) -> None:
    """Raise ``ValueError`` when the config read from `where` (a local folder) names a Hub encoder: timm would
    fetch its architecture from the network although the weights are right here. No saved model needs one."""
    if cfg.model.encoder.lower().startswith(HUB_PREFIXES):
        raise ValueError(f"{where}: model.encoder {cfg.model.encoder!r} is a Hugging Face Hub name, which timm would "
                         "resolve on the network; a model loaded from a local folder is never resolved there (its "
                         "config.json was edited or is not a workbench run's)")


def weight_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape in safetensors file `path`, read from its header (no tensor is loaded)."""
    try:
        with safe_open(str(path), framework="pt") as fh:
            return {k: tuple(fh.get_slice(k).get_shape()) for k in fh.keys()}  # noqa: SIM118 (not a dict)
    except Exception as err:  # SafetensorError for a damaged header
        raise CheckpointError(f"checkpoint file {path} cannot be read ({type(err).__name__}: "
                              f"{str(err).splitlines()[0][:200]}): truncated or not a safetensors file") from err


def check_fits(cfg: RunConfig, weights: str | Path) -> None:
    """Raise :class:`CheckpointError` unless the model `cfg` builds has exactly the tensors, with the same shapes,
    that the header of safetensors file `weights` lists: checked before anything is allocated (the model is built
    on the meta device, whose tensors hold no memory; ``cfg`` passed validation, which bounds every size first), so
    a config.json edited to other sizes is one line, never a model that fills the memory or is left half random."""
    refuse_hub_encoder(cfg, Path(weights).parent)
    arch = dataclasses.replace(cfg.model, pretrained=False, pretrained_path="")
    with torch.device("meta"):
        own = {k: tuple(v.shape) for k, v in create_model(arch, cfg.objective.name).state_dict().items()}
    theirs = weight_shapes(weights)
    bad = [k for k in own if k in theirs and own[k] != theirs[k]]
    missing, unknown = sorted(set(own) - set(theirs)), sorted(set(theirs) - set(own))
    parts = [f"{len(bad)} tensors have other shapes (e.g. {bad[0]}: file {theirs[bad[0]]}, config "
             f"{own[bad[0]]})"] if bad else []
    if missing:
        parts.append(f"{len(missing)} tensors of the model are missing from the file (e.g. {missing[0]})")
    if unknown:
        parts.append(f"{len(unknown)} tensors of the file are unknown to the model (e.g. {unknown[0]})")
    if parts:
        raise CheckpointError(f"checkpoint file {weights} does not fit the config.json beside it: "
                              f"{'; '.join(parts)}. The config or the weights were edited, or come from another run")


def load_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors; a file that cannot be decoded raises :class:`CheckpointError` naming it."""
    try:
        return load_file(str(path))
    except Exception as err:  # safetensors raises SafetensorError (not an OSError) for truncated headers/data
        raise CheckpointError(f"checkpoint file {path} cannot be read ({type(err).__name__}: "
                              f"{str(err).splitlines()[0][:200]}): truncated or not a safetensors file") from err
