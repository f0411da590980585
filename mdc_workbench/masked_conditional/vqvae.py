"""Discrete image tokens: a small VQ-VAE (van den Oord et al., 2017) and the encoder adapter MC-Diffusion uses.

* :class:`VQVAE`: conv encoder -> nearest-codebook quantizer (codebook + commitment loss, straight-through
  gradient) -> conv decoder, reconstructing the normalised image. :func:`train_vqvae` fits it on a data set's
  training images; :func:`save_vqvae` / :func:`load_vqvae` keep weights and config in one safetensors file.
* :class:`VQImageEncoder`: the captioner's encoder option ``model.encoder = "vqvae"``: the frozen VQ-VAE turns
  images into codes y (B, M) (M = (image_size / 2**downsample)^2), and a trainable code embedding plus a
  position table turn the codes into the token sequence (B, M, D) that the decoder cross-attends to. It also
  owns the learned ``[MASK]`` image token used by the masked condition strategy
  (:mod:`mdc_workbench.masked_conditional.guidance`).

Architecture hyper-parameters are :class:`VQVAEConfig`, passed as ``model.encoder_kwargs``; the trained weights
come from ``model.pretrained_path`` (a file :func:`save_vqvae` wrote). A pretrained VQ model in diffusers' format
(VQ-Diffusion's VQ-VAE/VQGAN) is ``model.encoder = "vqgan"`` (:mod:`mdc_workbench.masked_conditional.vqgan`); a raw
taming-transformers checkpoint is not loaded (its architecture is not reimplemented here).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, safe_open, save_file
from torch import nn

from mdc_core.config import DataConfig, ModelConfig


@dataclass
class VQVAEConfig:
    """VQ-VAE architecture (``model.encoder_kwargs`` when ``model.encoder = "vqvae"``)."""

    image_size: int = 64  # input resolution in pixels (must equal model.image_size)
    channels: int = 64  # hidden conv channels
    downsample: int = 3  # stride-2 stages: a (S / 2**downsample)^2 grid of codes
    codebook_size: int = 256  # K codes
    code_dim: int = 32  # codebook vector size
    beta: float = 0.25  # commitment loss weight
    token_width: int = 128  # width of the code embeddings the captioner cross-attends to (adapter only)

    def validate(self) -> VQVAEConfig:
        for name in ("image_size", "channels", "downsample", "codebook_size", "code_dim", "token_width"):
            if getattr(self, name) <= 0:
                raise ValueError(f"vqvae {name} must be > 0, got {getattr(self, name)}")
        if self.image_size % (2 ** self.downsample):
            raise ValueError(f"vqvae image_size {self.image_size} must be divisible by 2**downsample "
                             f"({2 ** self.downsample})")
        if self.beta < 0:
            raise ValueError(f"vqvae beta must be >= 0, got {self.beta}")
        return self

    @property
    def grid(self) -> int:
        return self.image_size // 2 ** self.downsample

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VQVAEConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown vqvae key(s) {unknown} in model.encoder_kwargs; known: {sorted(names)}")
        return cls(**data).validate()


class ResBlock(nn.Module):
    def __init__(self, ch: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.ReLU(), nn.Conv2d(ch, ch, 3, padding=1), nn.ReLU(), nn.Conv2d(ch, ch, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


@dataclass
class VQOutput:
    recon: torch.Tensor  # (B, 3, S, S) reconstruction of the normalised image
    codes: torch.Tensor  # (B, M) code indices, row-major over the grid
    loss: torch.Tensor  # reconstruction MSE + codebook loss + beta * commitment loss
    metrics: dict[str, torch.Tensor]


class VQVAE(nn.Module):
    """Conv encoder (B, 3, S, S) -> (B, code_dim, g, g) -> codes (B, g*g) -> conv decoder -> (B, 3, S, S)."""

    def __init__(self, cfg: VQVAEConfig) -> None:
        super().__init__()
        self.cfg = cfg.validate()
        ch = cfg.channels
        down: list[nn.Module] = [nn.Conv2d(3, ch, 4, stride=2, padding=1)]
        for _ in range(cfg.downsample - 1):
            down += [nn.ReLU(), nn.Conv2d(ch, ch, 4, stride=2, padding=1)]
        self.encoder = nn.Sequential(*down, ResBlock(ch), nn.ReLU(), nn.Conv2d(ch, cfg.code_dim, 1))
        self.codebook = nn.Embedding(cfg.codebook_size, cfg.code_dim)
        nn.init.uniform_(self.codebook.weight, -1 / cfg.codebook_size, 1 / cfg.codebook_size)
        up: list[nn.Module] = [nn.Conv2d(cfg.code_dim, ch, 3, padding=1), ResBlock(ch)]
        for _ in range(cfg.downsample - 1):
            up += [nn.ReLU(), nn.ConvTranspose2d(ch, ch, 4, stride=2, padding=1)]
        self.decoder = nn.Sequential(*up, nn.ReLU(), nn.ConvTranspose2d(ch, 3, 4, stride=2, padding=1))

    def quantize(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """z (B, D, g, g) -> (nearest codebook vectors (B, D, g, g), codes (B, g*g))."""
        B, D, g, _ = z.shape
        flat = z.permute(0, 2, 3, 1).reshape(-1, D)  # (B*g*g, D)
        e = self.codebook.weight  # (K, D)
        dist = flat.pow(2).sum(1, keepdim=True) - 2 * flat @ e.T + e.pow(2).sum(1)[None]  # (B*g*g, K)
        codes = dist.argmin(1)
        zq = self.codebook(codes).view(B, g, g, D).permute(0, 3, 1, 2)
        return zq, codes.view(B, g * g)

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, 3, S, S) -> codes (B, M) long."""
        return self.quantize(self.encoder(images))[1]

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """codes (B, M) -> reconstructed normalised images (B, 3, S, S)."""
        B, M = codes.shape
        g = int(math.isqrt(M))
        zq = self.codebook(codes).view(B, g, g, -1).permute(0, 3, 1, 2)
        return self.decoder(zq)

    def forward(self, images: torch.Tensor) -> VQOutput:
        z = self.encoder(images)  # (B, D, g, g)
        zq, codes = self.quantize(z)
        codebook_loss = F.mse_loss(zq, z.detach())  # moves the codes toward the encoder outputs
        commitment = F.mse_loss(z, zq.detach())  # keeps the encoder close to its codes
        zq_st = z + (zq - z).detach()  # straight-through estimator: decoder gradient flows to the encoder
        recon = self.decoder(zq_st)
        rec = F.mse_loss(recon, images)
        loss = rec + codebook_loss + self.cfg.beta * commitment
        usage = torch.bincount(codes.flatten(), minlength=self.cfg.codebook_size).float()
        p = usage / usage.sum()
        perplexity = torch.exp(-(p * p.clamp_min(1e-12).log()).sum())
        metrics = {"loss": loss.detach(), "recon_mse": rec.detach(), "commitment": commitment.detach(),
                   "perplexity": perplexity, "codes_used": (usage > 0).sum().float()}
        return VQOutput(recon, codes, loss, metrics)


def train_vqvae(cfg: VQVAEConfig, data: DataConfig, *, steps: int, batch_size: int = 64, lr: float = 2e-3,
                seed: int = 0, device: str | torch.device = "cpu", restart_every: int = 50,
                log_every: int = 25) -> tuple[VQVAE, list[dict[str, float]]]:
    """Fit a VQ-VAE on the training images of `data` for `steps` Adam steps.

    The codebook starts from encoder outputs of the first batch, and every `restart_every` steps codes no
    batch used since the last check are moved onto random encoder outputs (a standard fix for dead codes).
    Returns the model (eval mode) and one metrics dict per `log_every` steps.
    """
    from mdc_core.data import build_loader  # mdc_core.data imports PIL/webdataset; keep the model import light

    torch.manual_seed(seed)
    model = VQVAE(cfg).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    history: list[dict[str, float]] = []
    used = torch.zeros(cfg.codebook_size, dtype=torch.bool, device=device)
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def images():
        epoch = 0
        while True:
            n = 0
            for batch in build_loader(data, split="train", image_size=cfg.image_size, batch_size=batch_size,
                                      seed=seed, epoch=epoch):
                n += 1
                yield batch["image"].to(device)
            if n == 0:
                raise ValueError(f"data at {data.path} gave no batch of {batch_size} training images")
            epoch += 1

    stream = images()
    for step in range(steps):
        x = next(stream)
        if step == 0 or (restart_every and step % restart_every == 0):
            with torch.no_grad():
                z = model.encoder(x).permute(0, 2, 3, 1).reshape(-1, cfg.code_dim)  # (B*M, D)
                dead = torch.ones_like(used) if step == 0 else ~used
                pick = torch.randint(0, len(z), (int(dead.sum()),), generator=gen).to(device)
                model.codebook.weight[dead] = z[pick]
                used.zero_()
        out = model(x)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        opt.step()
        used[out.codes.flatten().unique()] = True
        if (step + 1) % log_every == 0 or step + 1 == steps:
            history.append({"step": step + 1, **{k: float(v) for k, v in out.metrics.items()}})
    return model.eval(), history


def save_vqvae(model: VQVAE, path: str | Path) -> Path:
    """Weights and config in one safetensors file (config as JSON metadata)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(path), metadata={"vqvae_config": json.dumps(dataclasses.asdict(model.cfg))})
    return path


def read_vqvae_config(path: str | Path) -> VQVAEConfig:
    """The config stored in a file :func:`save_vqvae` wrote."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"VQ-VAE weights file not found: {path}")
    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata() or {}
    if "vqvae_config" not in meta:
        raise ValueError(f"{path} is not a VQ-VAE file written by mdc_workbench.masked_conditional.vqvae.save_vqvae "
                         "(no vqvae_config)")
    return VQVAEConfig.from_dict(json.loads(meta["vqvae_config"]))


def load_vqvae(path: str | Path) -> VQVAE:
    model = VQVAE(read_vqvae_config(path))
    model.load_state_dict(load_file(str(path)))
    return model.eval()


def vqvae_encoder_kwargs(path: str | Path, token_width: int | None = None) -> dict[str, Any]:
    """``model.encoder_kwargs`` for a captioner conditioned on the VQ-VAE in `path`."""
    cfg = read_vqvae_config(path)
    if token_width is not None:
        cfg = dataclasses.replace(cfg, token_width=token_width)
    return dataclasses.asdict(cfg)


class VQImageEncoder(nn.Module):
    """``model.encoder = "vqvae"``: images (B, 3, S, S) -> code embeddings (B, M, token_width).

    The VQ-VAE is frozen (the paper uses a pre-trained one); the code embedding, the position table and the
    ``[MASK]`` image token are trained with the captioner. Same interface as :class:`~mdc_core.model.ImageEncoder`.
    """

    num_prefix_tokens = 0

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        vq_cfg = VQVAEConfig.from_dict(dict(cfg.encoder_kwargs))
        if vq_cfg.image_size != cfg.image_size:
            raise ValueError(f"model.image_size ({cfg.image_size}) differs from the VQ-VAE's image_size "
                             f"({vq_cfg.image_size}) in model.encoder_kwargs")
        self.vqvae = VQVAE(vq_cfg)
        if cfg.pretrained_path:
            stored = read_vqvae_config(cfg.pretrained_path)
            arch = dataclasses.replace(stored, token_width=vq_cfg.token_width, beta=vq_cfg.beta)
            if arch != vq_cfg:
                raise ValueError(f"{cfg.pretrained_path} holds a VQ-VAE {dataclasses.asdict(stored)}, but "
                                 f"model.encoder_kwargs asks for {dataclasses.asdict(vq_cfg)}")
            self.vqvae.load_state_dict(load_file(cfg.pretrained_path))
        self.vqvae.requires_grad_(False)
        self.width = vq_cfg.token_width
        self.code_emb = nn.Embedding(vq_cfg.codebook_size, self.width)
        self.pos_emb = nn.Parameter(torch.zeros(vq_cfg.grid ** 2, self.width))
        self.mask_token = nn.Parameter(torch.zeros(self.width))  # the [MASK] image token (guidance)
        nn.init.trunc_normal_(self.code_emb.weight, std=0.02)
        nn.init.trunc_normal_(self.pos_emb, std=0.01)
        nn.init.trunc_normal_(self.mask_token, std=0.02)

    def codes(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, 3, S, S) -> discrete image features y (B, M)."""
        with torch.no_grad():
            return self.vqvae.encode(images)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.code_emb(self.codes(images)) + self.pos_emb  # (B, M, D)

    def pool(self, tokens: torch.Tensor, kind: str = "gap") -> torch.Tensor:
        if kind == "cls":
            raise ValueError("the VQ-VAE encoder has no class token; use pool='gap'")
        return tokens.mean(dim=1)
