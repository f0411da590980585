"""The benchmark peer: OpenCLIP's ``CoCa`` built to the dimensions of one of our model configs.

CoCa splits its text decoder in a unimodal (causal self-attention only) and a multimodal (self-attention then
cross-attention to the image tokens) half. Two layouts are built from one :class:`~mdc_core.config.ModelConfig`:

- ``depth_matched`` (the peer the targets are judged against): unimodal + multimodal layers = our decoder
  depth (``L // 2`` unimodal, at least 1, the rest multimodal), as in the CoCa paper's split;
- ``open_clip`` (the layout of open_clip's ``coca_ViT-*`` configs): unimodal = multimodal = our decoder depth.

The image tower is open_clip's own ViT with our encoder's width, depth, heads and patch size, returning its
patch tokens (``output_tokens=True``). When the encoder and decoder widths differ, open_clip's attentional
pooler maps the patch tokens to the decoder width with one query per patch (open_clip's CoCa needs it then).
Only the caption loss is trained (:class:`open_clip.loss.CoCaLoss` with ``clip_loss_weight=0``); the head is
CLIP's full 49408-way vocabulary, as in open_clip.
"""

from __future__ import annotations

from typing import Any

import torch

from mdc_core.config import ModelConfig
from mdc_core.tokenizer import EOT_ID, PAD_ID, SOT_ID, VOCAB_SIZE

COCA_LAYOUTS = ("depth_matched", "open_clip")


def encoder_dims(cfg: ModelConfig) -> dict[str, int]:
    """Width, depth, heads and patch size of our timm ViT encoder (read from the built timm model)."""
    import timm

    kwargs = {**cfg.encoder_kwargs, "img_size": cfg.image_size}
    trunk = timm.create_model(cfg.encoder, pretrained=False, num_classes=0, **kwargs)
    if not hasattr(trunk, "blocks") or not hasattr(trunk, "patch_embed"):
        raise ValueError(f"the CoCa peer mirrors ViT encoders only; {cfg.encoder!r} is not a timm ViT")
    width = int(trunk.num_features)
    heads = int(trunk.blocks[0].attn.num_heads)
    patch = trunk.patch_embed.patch_size
    return {"width": width, "layers": len(trunk.blocks), "heads": heads,
            "patch_size": int(patch[0] if isinstance(patch, (tuple, list)) else patch),
            "mlp_ratio": trunk.blocks[0].mlp.fc1.out_features / width}


def coca_config(cfg: ModelConfig, layout: str = "depth_matched") -> dict[str, Any]:
    """Keyword arguments of ``open_clip.coca_model.CoCa`` mirroring `cfg` (see the module docstring)."""
    if layout not in COCA_LAYOUTS:
        raise ValueError(f"unknown CoCa layout {layout!r}; choose one of {', '.join(COCA_LAYOUTS)}")
    if cfg.encoder_kwargs.get("conv_stem"):
        raise ValueError("open_clip's CoCa has no convolutional stem, so it cannot mirror an encoder with "
                         "model.encoder_kwargs.conv_stem; benchmark a plain-ViT preset such as tiny_vit")
    enc = encoder_dims(cfg)
    n_patches = (cfg.image_size // enc["patch_size"]) ** 2
    if layout == "depth_matched":
        uni = max(1, cfg.text_layers // 2)
        multi = max(1, cfg.text_layers - uni)
    else:
        uni = multi = cfg.text_layers
    pool = enc["width"] != cfg.text_width  # open_clip's CoCa feeds image tokens of the decoder width
    vision = {"image_size": cfg.image_size, "layers": enc["layers"], "width": enc["width"],
              "head_width": enc["width"] // enc["heads"], "mlp_ratio": enc["mlp_ratio"],
              "patch_size": enc["patch_size"], "output_tokens": True, "attentional_pool": pool,
              "attn_pooler_queries": n_patches, "attn_pooler_heads": cfg.text_heads}
    text = {"context_length": cfg.context_length, "vocab_size": VOCAB_SIZE, "width": cfg.text_width,
            "heads": cfg.text_heads, "layers": uni, "mlp_ratio": cfg.mlp_ratio, "embed_cls": True,
            "output_tokens": True}
    multimodal = {"context_length": cfg.context_length, "vocab_size": VOCAB_SIZE, "width": cfg.text_width,
                  "heads": cfg.text_heads, "layers": multi, "mlp_ratio": cfg.mlp_ratio}
    return {"embed_dim": cfg.text_width, "vision_cfg": vision, "text_cfg": text, "multimodal_cfg": multimodal,
            "pad_id": PAD_ID}


def build_coca(cfg: ModelConfig, layout: str = "depth_matched") -> torch.nn.Module:
    """A randomly initialised OpenCLIP CoCa with the dimensions of `cfg`."""
    from open_clip.coca_model import CoCa

    model = CoCa(**coca_config(cfg, layout))
    # open_clip's MultimodalTransformer allocates its output projection with torch.empty and never calls its own
    # init_parameters (which would fail: it reads self.transformer), so the head holds whatever memory it got:
    # zeros (every logit ties) or garbage (NaN probabilities in generate). Initialise it as that method intends.
    projection = model.text_decoder.text_projection
    torch.nn.init.normal_(projection, std=projection.shape[0] ** -0.5)
    return model


class CocaCaptionLoss(torch.nn.Module):
    """CoCa trained on the caption loss only: open_clip's ``CoCaLoss(caption_loss_weight=1, clip_loss_weight=0)``."""

    def __init__(self) -> None:
        super().__init__()
        from open_clip.loss import CoCaLoss

        self.loss = CoCaLoss(caption_loss_weight=1.0, clip_loss_weight=0.0, pad_id=PAD_ID)

    def forward(self, model: torch.nn.Module, images: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """images (B, 3, H, W), tokens (B, L) ``<sot> ... <eot> pad`` -> scalar caption loss."""
        out = model(images, tokens)
        _, caption = self.loss(out["image_features"], out["text_features"], out["logits"], out["labels"],
                               out["logit_scale"])
        return caption


def has_generate() -> bool:
    """True when open_clip's ``CoCa.generate`` can run (it needs ``transformers``)."""
    from open_clip import coca_model

    return bool(getattr(coca_model, "_has_transformers", False))


@torch.no_grad()
def coca_greedy(model: torch.nn.Module, images: torch.Tensor, length: int) -> torch.Tensor:
    """Greedy captions of exactly `length` tokens with ``CoCa.generate`` (top-1 of ``top_k`` sampling, end token
    suppressed until the last position): images (B, 3, H, W) -> (B, length + 2) ``<sot> ... <eot>``."""
    if not has_generate():
        raise RuntimeError("open_clip CoCa.generate needs transformers (pip install 'transformers<=4.56')")
    seq_len = length + 2
    return model.generate(images, generation_type="top_k", top_k=1, seq_len=seq_len, min_seq_len=seq_len - 1,
                          sot_token_id=SOT_ID, eos_token_id=EOT_ID, pad_token_id=PAD_ID)
