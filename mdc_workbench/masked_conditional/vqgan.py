"""``model.encoder = "vqgan"``: discrete image tokens of a local pretrained VQ model, loaded with diffusers.

diffusers' ``VQModel`` is the class VQ-Diffusion's VQ-VAE/VQGAN checkpoints load into (the ``vqvae`` folder of a
VQ-Diffusion pipeline). :class:`DiffusersVQEncoder` loads one from a local folder (``local_files_only``: nothing is
downloaded), freezes it and turns images into code indices exactly as the VQ model does (encoder -> quant_conv ->
nearest codebook vector); a trained code embedding, a position table and the ``[MASK]`` image token make the tokens
(B, M, D) the decoder cross-attends to: the contract of :class:`~mdc_workbench.masked_conditional.vqvae.VQImageEncoder`.

Configuration:

* ``model.pretrained_path``: the folder (``config.json`` + weights, as ``VQModel.save_pretrained`` writes it; a
  pipeline folder holding a ``vqvae/`` subfolder also works);
* ``model.encoder_kwargs``: ``{"token_width": D, "vq_config": <the VQModel's config>}``. The config rebuilds the
  architecture when :func:`mdc_core.factory.load_model` restores a run from its folder alone (the frozen VQ
  weights are saved in every checkpoint, like the VQ-VAE's); :func:`vqgan_encoder_kwargs` reads it from the
  folder and ``mdc vqvae show --path DIR`` prints the ``mdc train`` flags.

Images arrive normalised with the OpenAI CLIP mean/std (the data loaders'); they are mapped back to [-1, 1], the
range diffusers' VQ models are trained on. ``pip install "mdc-workbench[vqgan]"`` installs diffusers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from open_clip.constants import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD
from torch import nn

from mdc_core.config import ModelConfig

KWARGS = {"token_width": 128, "vq_config": None}  # model.encoder_kwargs keys and defaults (vq_config: see docstring)


def _vq_model_class() -> Any:
    try:
        from diffusers import VQModel
    except ImportError as err:  # optional dependency: only this encoder needs it
        raise ImportError("model.encoder='vqgan' needs diffusers: pip install 'mdc-workbench[vqgan]'") from err
    return VQModel


def vq_folder(path: str | Path) -> Path:
    """The folder of the diffusers VQModel at `path` (itself, or its ``vqvae/`` subfolder for a pipeline folder);
    FileNotFoundError / ValueError saying what is missing."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"VQ model folder not found: {path}")
    if not path.is_dir():
        raise ValueError(f"{path} is a file; model.encoder='vqgan' needs a diffusers VQModel folder (config.json + "
                         "diffusion_pytorch_model.safetensors). For a file written by `mdc vqvae train` use "
                         "model.encoder='vqvae'")
    if not (path / "config.json").is_file() and (path / "vqvae" / "config.json").is_file():
        path = path / "vqvae"  # a VQ-Diffusion pipeline folder
    config = path / "config.json"
    if not config.is_file():
        raise ValueError(f"{path} is not a diffusers VQModel folder: it has no config.json")
    class_name = json.loads(config.read_text()).get("_class_name")
    if class_name != "VQModel":
        raise ValueError(f"{config} describes a diffusers {class_name!r}, not a 'VQModel'; model.encoder='vqgan' "
                         "needs a VQ model (e.g. the vqvae/ folder of a VQ-Diffusion pipeline)")
    return path


def load_vq_model(path: str | Path) -> nn.Module:
    """The diffusers VQModel saved in the local folder `path` (eval mode); nothing is downloaded."""
    folder = vq_folder(path)
    try:
        return _vq_model_class().from_pretrained(str(folder), local_files_only=True).eval()
    except (OSError, ValueError, RuntimeError) as err:
        raise ValueError(f"diffusers could not load a VQModel from {folder}: {err}") from err


def architecture(vq_config: Any) -> dict[str, Any]:
    """The constructor arguments of a VQModel config (diffusers' bookkeeping keys dropped), JSON-normalised."""
    return json.loads(json.dumps({k: v for k, v in dict(vq_config).items() if not k.startswith("_")}))


def vqgan_encoder_kwargs(path: str | Path, token_width: int | None = None) -> dict[str, Any]:
    """``model.encoder_kwargs`` for a captioner conditioned on the VQModel in the local folder `path`."""
    config = _vq_model_class().load_config(str(vq_folder(path)))
    return {"token_width": KWARGS["token_width"] if token_width is None else token_width,
            "vq_config": architecture(config)}


class DiffusersVQEncoder(nn.Module):
    """``model.encoder = "vqgan"``: images (B, 3, S, S) -> code embeddings (B, M, token_width), M = (S / f)^2 with
    f = 2**(len(block_out_channels) - 1) the VQ model's downsampling. The VQ model is frozen; the code embedding,
    position table and ``[MASK]`` image token are trained with the captioner."""

    num_prefix_tokens = 0

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        unknown = sorted(set(cfg.encoder_kwargs) - set(KWARGS))
        if unknown:
            raise ValueError(f"unknown vqgan key(s) {unknown} in model.encoder_kwargs; known: {sorted(KWARGS)}")
        kwargs = {**KWARGS, **cfg.encoder_kwargs}
        wanted = kwargs["vq_config"]
        if cfg.pretrained_path:
            self.vq = load_vq_model(cfg.pretrained_path)
            stored = architecture(self.vq.config)
            if wanted is None:
                raise ValueError("model.encoder_kwargs needs the VQ model's config so that the run can be rebuilt "
                                 "from its folder: set it to "
                                 "mdc_workbench.masked_conditional.vqgan.vqgan_encoder_kwargs"
                                 f"({cfg.pretrained_path!r}) (`mdc vqvae show --path {cfg.pretrained_path}` prints "
                                 "the flags)")
            if architecture(wanted) != stored:
                diff = sorted(k for k in stored.keys() | wanted.keys() if stored.get(k) != wanted.get(k))
                raise ValueError(f"{cfg.pretrained_path} holds a VQModel that differs from model.encoder_kwargs."
                                 f"vq_config in {diff}")
        elif wanted is None:
            raise ValueError("model.encoder='vqgan' needs model.pretrained_path (a local diffusers VQModel folder)")
        else:  # architecture only: load_model fills the weights from the run's checkpoint
            self.vq = _vq_model_class().from_config(wanted).eval()
        self.vq.requires_grad_(False)
        vq_cfg = self.vq.config
        factor = 2 ** (len(vq_cfg.block_out_channels) - 1)
        if cfg.image_size % factor:
            raise ValueError(f"model.image_size {cfg.image_size} must be divisible by the VQ model's downsampling "
                             f"factor {factor}")
        grid = cfg.image_size // factor
        self.width = int(kwargs["token_width"])
        self.code_emb = nn.Embedding(vq_cfg.num_vq_embeddings, self.width)
        self.pos_emb = nn.Parameter(torch.zeros(grid * grid, self.width))
        self.mask_token = nn.Parameter(torch.zeros(self.width))  # the [MASK] image token (guidance)
        nn.init.trunc_normal_(self.code_emb.weight, std=0.02)
        nn.init.trunc_normal_(self.pos_emb, std=0.01)
        nn.init.trunc_normal_(self.mask_token, std=0.02)
        # (1, 3, 1, 1) CLIP normalisation of the data loaders, undone before the VQ model (not saved: constants)
        self.register_buffer("mean", torch.tensor(OPENAI_DATASET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(OPENAI_DATASET_STD).view(1, 3, 1, 1), persistent=False)

    def train(self, mode: bool = True) -> DiffusersVQEncoder:
        super().train(mode)
        self.vq.eval()  # frozen: always in inference mode
        return self

    def codes(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, 3, S, S), CLIP-normalised -> code indices y (B, M), row-major over the (S/f, S/f) grid."""
        with torch.no_grad():
            x = (images * self.std + self.mean) * 2 - 1  # [-1, 1], the VQ model's input range
            latents = self.vq.encode(x).latents  # (B, C, g, g): encoder -> quant_conv
            indices = self.vq.quantize(latents)[2][2]  # (B*g*g,) nearest codebook entries
        return indices.view(images.shape[0], -1).long()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.code_emb(self.codes(images)) + self.pos_emb  # (B, M, D)

    def pool(self, tokens: torch.Tensor, kind: str = "gap") -> torch.Tensor:
        if kind == "cls":
            raise ValueError("the VQ model encoder has no class token; use pool='gap'")
        return tokens.mean(dim=1)
