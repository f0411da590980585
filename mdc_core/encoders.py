"""Image encoders: any timm model as a token-sequence encoder, the optional early-convolution stem, local weights.

:class:`ImageEncoder` is a thin adapter around ``timm.create_model`` (as open_clip's ``TimmModel``): images
(B, 3, H, W) -> tokens (B, M, D). Other encoders are rows plug-ins add to :data:`mdc_core.registry.ENCODERS`
(:func:`~mdc_core.registry.register_encoder`), chosen by ``model.encoder`` like a timm name.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import timm
import torch
from timm.models.vision_transformer_hybrid import HybridEmbed
from torch import nn

from . import registry
from .config import ConfigError, ModelConfig, check_encoder_kwargs
from .tokenizer import MASK_ID


class ConvStem(nn.Sequential):
    """Early convolutions for a ViT (Xiao et al. 2021, "Early Convolutions Help Transformers See Better"):
    per entry of `channels` one stage of `depth` 3x3 convolutions + norm + ReLU, the first with stride 2,
    so the stem's stride is ``2 ** len(channels)``. `depth` is one count for every stage or a list, one per stage
    (e.g. ``[1, 2, 2]``: a single convolution at the highest resolution, where a convolution costs most). `norm`
    is "batch" (BatchNorm, as in the paper) or "group" (GroupNorm with one group, independent of the batch). The
    ViT's patch projection then runs on the stem's feature map."""

    NORMS = ("batch", "group")

    def __init__(self, in_chans: int, channels: Sequence[int], depth: int | Sequence[int] = 1,
                 norm: str = "batch") -> None:
        if norm not in self.NORMS:
            raise ValueError(f"conv stem norm must be one of {', '.join(self.NORMS)}, got {norm!r}")
        depths = list(depth) if isinstance(depth, list | tuple) else [depth] * len(channels)
        if len(depths) != len(channels) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1
                                                   for d in depths):
            raise ValueError(f"model.encoder_kwargs.conv_stem_depth must be an integer >= 1 or a list of "
                             f"{len(channels)} (one per stage), got {depth!r}")
        layers: list[nn.Module] = []
        for c, stage_depth in zip(channels, depths, strict=True):
            for i in range(stage_depth):
                layers += [nn.Conv2d(in_chans, c, 3, stride=2 if i == 0 else 1, padding=1, bias=False),
                           nn.BatchNorm2d(c) if norm == "batch" else nn.GroupNorm(1, c), nn.ReLU()]
                in_chans = c
        super().__init__(*layers)
        self.stride = 2 ** len(channels)


def _conv_stem_embed(channels: Sequence[int], options: dict[str, Any], *, img_size: Any, patch_size: int,
                     in_chans: int = 3, **kwargs: Any) -> HybridEmbed:
    """timm ``embed_layer`` for ``encoder_kwargs["conv_stem"]``: tokens keep the stride `patch_size`
    (the stem takes ``2 ** len(channels)`` of it, the patch projection the rest). `options`: ConvStem's
    ``depth`` and ``norm``."""
    stem = ConvStem(in_chans, channels, **options)
    if patch_size % stem.stride:
        raise ValueError(f"conv_stem {list(channels)} has stride {stem.stride}, which must divide the encoder's "
                         f"patch_size {patch_size}")
    return HybridEmbed(stem, img_size=img_size, patch_size=patch_size // stem.stride, in_chans=in_chans, **kwargs)


class ImageEncoder(nn.Module):
    """Any timm model as a token-sequence encoder: images (B, 3, H, W) -> tokens (B, M, D).

    ``encoder_kwargs`` go to ``timm.create_model``, except ``conv_stem`` (a list of channel widths), which gives
    a ViT the early-convolution stem :class:`ConvStem` (a convolutional inductive bias for small images), with
    ``conv_stem_depth`` convolutions per stage (default 1; a list gives one count per stage) and
    ``conv_stem_norm`` "batch" (default) or "group"."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        kwargs = dict(cfg.encoder_kwargs)
        kwargs.setdefault("img_size", cfg.image_size)
        stem = kwargs.pop("conv_stem", None)
        options = {k: kwargs.pop(k) for k in ("conv_stem_depth", "conv_stem_norm") if k in kwargs}
        if options and not stem:
            raise ValueError(f"model.encoder_kwargs.{next(iter(options))} needs model.encoder_kwargs.conv_stem")
        if stem:
            if not isinstance(stem, list | tuple) or not all(isinstance(c, int) and c > 0 for c in stem):
                raise ValueError(f"model.encoder_kwargs.conv_stem must be a list of channel widths, got {stem!r}")
            options = {k.removeprefix("conv_stem_"): v for k, v in options.items()}  # ConvStem's depth, norm
            kwargs["embed_layer"] = partial(_conv_stem_embed, tuple(stem), options)
        check_local_dir(cfg.encoder)
        try:
            self.trunk = timm.create_model(cfg.encoder, pretrained=cfg.pretrained, num_classes=0, **kwargs)
        except (RuntimeError, TypeError) as err:
            raise ValueError(f"timm could not build encoder {cfg.encoder!r} with {kwargs}: {err}") from err
        if cfg.pretrained_path:
            load_encoder_weights(self.trunk, cfg.pretrained_path)
        self.num_prefix_tokens = int(getattr(self.trunk, "num_prefix_tokens", 0))
        self.width = int(self.trunk.num_features)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        feats = self.trunk.forward_features(images)
        if feats.ndim == 4:  # convolutional trunk: (B, C, H, W) -> (B, H*W, C)
            feats = feats.flatten(2).transpose(1, 2)
        return feats  # (B, M, D), final norm applied by timm

    def pool(self, tokens: torch.Tensor, kind: str = "gap") -> torch.Tensor:
        """Probe feature: global average of the patch tokens ("gap", the paper's choice for captioners) or
        the first prefix token ("cls", CLIP's pre-logits feature)."""
        if kind == "cls":
            if self.num_prefix_tokens == 0:
                raise ValueError("this encoder has no class token; use pool='gap'")
            return tokens[:, 0]
        return tokens[:, self.num_prefix_tokens:].mean(dim=1)


# parameters a model may have, its decoder's or its encoder's (estimated from the widths and depths its config gives):
# each size limit of ModelConfig alone still allows 16384 wide x 256 layers (800 billion); ViT-L/14 with its decoder
# holds 0.4 billion. Checked by mdc_core.factory.create_model before anything is built.
MAX_PARAMS = 2_000_000_000
WIDTH_KEYS = ("dim", "width", "channels", "hidden")  # encoder arguments naming a width (embed_dim, dims, hidden_size)


def decoder_params(m: ModelConfig) -> int:
    """About how many parameters the decoder of `m` holds: per layer attention (4 w^2) and MLP (2 w^2 mlp_ratio),
    plus the input and output embeddings (one row per token id) and the positions."""
    w = m.text_width
    return int(m.text_layers * (4 + 2 * m.mlp_ratio) * w * w + (2 * (MASK_ID + 1) + m.context_length) * w)


def encoder_params(kwargs: dict[str, Any]) -> float:
    """An upper estimate of the parameters of the transformer `kwargs` describe: 12 w^2 per block, w the largest
    width among them, times the sum of their depths (0 when they give no width or no depth)."""
    widths, depth = [0.0], 0.0
    for key, value in kwargs.items():
        numbers = [abs(x) for x in (value if isinstance(value, (list, tuple)) else [value])
                   if isinstance(x, (int, float)) and not isinstance(x, bool)]
        if key == "depth" or key.endswith(("_depth", "layers")):
            depth += sum(numbers)
        elif any(k in key for k in WIDTH_KEYS):
            widths += numbers
    return 12 * max(widths) ** 2 * depth


def check_model_size(m: ModelConfig) -> None:
    """:class:`~mdc_core.config.ConfigError` when the decoder or the encoder of `m` (``local-dir:`` included,
    :func:`check_local_dir`) would hold more than :data:`MAX_PARAMS` parameters; nothing is built."""
    check_local_dir(m.encoder)
    for what, n in (("decoder", decoder_params(m)), ("encoder", encoder_params(m.encoder_kwargs))):
        if n > MAX_PARAMS:
            raise ConfigError(f"the {what} of this config (text_width {m.text_width} x text_layers {m.text_layers}, "
                              f"encoder_kwargs {str(m.encoder_kwargs)[:80]}) would hold about {n / 1e9:.0f} billion "
                              f"parameters, more than the {MAX_PARAMS / 1e9:.0f} billion a model may have")


def check_local_dir(encoder: str) -> None:
    """``local-dir:FOLDER``: the ``model_args`` timm reads from ``FOLDER/config.json`` pass the limits of
    ``model.encoder_kwargs`` (:func:`~mdc_core.config.check_encoder_kwargs`) before timm builds anything; a folder
    without a readable one is left to timm's own message."""
    if not encoder.startswith("local-dir:"):
        return
    path = Path(encoder.removeprefix("local-dir:")).expanduser() / "config.json"
    try:
        args = json.loads(path.read_text()).get("model_args", {})
    except (OSError, ValueError, AttributeError, RecursionError):
        return
    if not isinstance(args, dict):
        raise ConfigError(f"{path}: model_args must be a JSON object, got {type(args).__name__}")
    check_encoder_kwargs(args, f"{path} model_args")
    if encoder_params(args) > MAX_PARAMS:
        raise ConfigError(f"{path} model_args describe an encoder of about {encoder_params(args) / 1e9:.0f} billion "
                          f"parameters, more than the {MAX_PARAMS / 1e9:.0f} billion a model may have")


def build_image_encoder(cfg: ModelConfig) -> nn.Module:
    """The image encoder of `cfg`: a plug-in's encoder of that name, else the timm model named ``cfg.encoder``."""
    build = registry.encoder_builder(cfg.encoder)
    return ImageEncoder(cfg) if build is None else build(cfg)


def load_encoder_weights(trunk: nn.Module, path: str | Path) -> None:
    """Load a local weights file (safetensors or a torch state dict, loaded with weights_only) into `trunk`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"encoder weights file not found: {path}")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file
        state = load_file(str(path))
    else:
        state = torch.load(path, map_location="cpu", weights_only=True)
        state = state.get("state_dict", state.get("model", state)) if isinstance(state, dict) else state
    missing, unexpected = trunk.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("head")]
    if missing:
        raise ValueError(f"{path} does not fit encoder: missing {len(missing)} keys, e.g. {missing[:3]}")
    if unexpected and len(unexpected) == len(state):
        raise ValueError(f"{path} shares no keys with the encoder (e.g. {unexpected[:3]})")
