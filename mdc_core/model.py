"""The captioner: a timm image encoder and a cross-attention text decoder (paper Sec. 3.2, Fig. 2).

Read top to bottom: :class:`ImageEncoder`, a thin adapter around ``timm.create_model`` (as open_clip's
``TimmModel``) with the optional early-convolution stem :class:`ConvStem` (plug-ins add other encoders to
:data:`mdc_core.registry.ENCODERS`); then :class:`Attention`, :class:`DecoderLayer` (pre-LN self-attention ->
cross-attention -> MLP), :class:`TextDecoder` and :class:`Captioner`. The decoder takes no time input
(time-independent parameterization); MDC uses it bidirectionally, ARC causally: same class, one flag.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import timm
import torch
import torch.nn.functional as F
from timm.models.vision_transformer_hybrid import HybridEmbed
from torch import nn

from . import registry
from .config import ConfigError, ModelConfig, check_encoder_kwargs
from .tokenizer import (
    EMBED_SIZE,
    VOCAB_SIZE,
    corpus_input_index,
    lookup_rows,
    padding_mask,
    select_positions,
)

# -- the image encoder ------------------------------------------------------------------------------------------------

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
    a ViT the early-convolution stem :class:`ConvStem` (a convolutional inductive bias for small images);
    ``conv_stem_depth`` and ``conv_stem_norm`` are its ``depth`` and ``norm``."""

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


# -- the text decoder -------------------------------------------------------------------------------------------------

def vocabulary_ids(cfg: ModelConfig, ids: torch.Tensor | None, name: str) -> torch.Tensor:
    """The (V,) token ids a model's vocabulary table holds: `ids` as given, else every id (``output_vocab="full"``),
    else zeros of ``output_vocab_size`` for a checkpoint to fill. `name` is the argument that passes `ids`."""
    if ids is not None:
        return ids.clone().long()
    if cfg.output_vocab != "corpus":
        return torch.arange(VOCAB_SIZE)
    if cfg.output_vocab_size <= 0:
        raise ValueError(f"model.output_vocab='corpus' needs {name} (or output_vocab_size to allocate them before "
                         "loading a checkpoint)")
    return torch.zeros(cfg.output_vocab_size, dtype=torch.long)  # filled by load_state_dict


@dataclass
class ImageCache:
    """Cross-attention keys and values of a batch of images, one (k, v) pair per decoder layer, each
    (B, h, M, c). Built by :meth:`Captioner.image_cache`; exact, since they never depend on the text."""

    kv: list[tuple[torch.Tensor, torch.Tensor]]

    @property
    def batch(self) -> int:
        return self.kv[0][0].shape[0]

    def expand(self, n: int) -> ImageCache:
        """The cache of one image as a batch of n identical rows (views: nothing is copied)."""
        if self.batch != 1:
            raise ValueError(f"only a cache of one image can be expanded (this one holds {self.batch})")
        return ImageCache([(k.expand(n, -1, -1, -1), v.expand(n, -1, -1, -1)) for k, v in self.kv])

    def index(self, rows: torch.Tensor) -> ImageCache:
        """Rows `rows` (n,) of the batch, e.g. the image of each caption; a one-image cache is expanded."""
        if self.batch == 1:
            return self.expand(len(rows))
        return ImageCache([(k[rows], v[rows]) for k, v in self.kv])


class Attention(nn.Module):
    """Multi-head attention of queries `x` over `context` (itself for self-attention), fused SDPA kernel."""

    def __init__(self, dim: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)
        self.dropout = dropout

    def project_kv(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """context (B, S, C) -> keys, values (B, h, S, c) each."""
        B, S, C = context.shape
        return self.kv(context).view(B, S, 2, self.heads, C // self.heads).permute(2, 0, 3, 1, 4).unbind(0)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None, mask: torch.Tensor | None = None,
                kv: tuple[torch.Tensor, torch.Tensor] | None = None, weights: list | None = None) -> torch.Tensor:
        """x (B, L, C), context (B, S, C), mask (B, 1, L|1, S) bool, True = may attend -> (B, L, C).

        `kv` are precomputed keys and values (B, h, S, c) used instead of `context`. Keys of a single image
        (batch 1, or expanded from batch 1) serve B query rows by folding the batch into the query axis:
        exact when there is no mask, and nothing is copied. With a list `weights`, the attention probabilities
        (B, h, L, S) are appended to it, computed explicitly instead of by the fused kernel (same output up to
        rounding; the fused path, and its cost, is untouched when `weights` is None)."""
        B, L, C = x.shape
        q = self.q(x).view(B, L, self.heads, C // self.heads).transpose(1, 2)  # (B, h, L, c)
        k, v = self.project_kv(context) if kv is None else kv  # (B|1, h, S, c)
        if weights is not None:
            scores = q @ k.transpose(-2, -1) / math.sqrt(C // self.heads)  # (B, h, L, S)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            probs = scores.softmax(dim=-1)
            weights.append(probs)
            probs = F.dropout(probs, self.dropout) if self.training else probs
            return self.proj((probs @ v).transpose(1, 2).reshape(B, L, C))
        shared = mask is None and B > 1 and (k.shape[0] == 1 or k.stride(0) == 0)
        if shared:
            q = q.transpose(0, 1).reshape(1, self.heads, B * L, C // self.heads)  # (1, h, B*L, c)
            k, v = k[:1], v[:1]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                           dropout_p=self.dropout if self.training else 0.0)
        if shared:
            y = y.view(self.heads, B, L, C // self.heads).transpose(0, 1)  # (B, h, L, c)
        return self.proj(y.transpose(1, 2).reshape(B, L, C))


class DecoderLayer(nn.Module):
    """Pre-LN block: text self-attention, then cross-attention to the image tokens, then an MLP."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float, dropout: float) -> None:
        super().__init__()
        self.ln_self = nn.LayerNorm(dim)
        self.self_attn = Attention(dim, heads, dropout)
        self.ln_cross = nn.LayerNorm(dim)
        self.ln_image = nn.LayerNorm(dim)
        self.cross_attn = Attention(dim, heads, dropout)
        self.ln_mlp = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor, image: torch.Tensor | None, self_mask: torch.Tensor | None,
                image_kv: tuple[torch.Tensor, torch.Tensor] | None = None, past: list | None = None,
                attention: list | None = None) -> torch.Tensor:
        """x (B, L, C), image (B, M, C) projected image tokens -> (B, L, C).

        `attention`: a list to which the cross-attention weights (B, h, L, M) are appended (see :class:`Attention`).

        `image_kv`: this layer's cached image keys/values (see :class:`ImageCache`), used instead of `image`.
        `past`: self-attention cache for incremental causal decoding, ``[]`` or ``[k, v]`` (B, h, T, c); the keys
        and values of `x` are appended to it in place and the queries attend over all of them."""
        h = self.ln_self(x)
        self_kv = None
        if past is not None:
            k, v = self.self_attn.project_kv(h)  # (B, h, L, c)
            if past:
                k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)  # (B, h, T+L, c)
            past[:] = [k, v]
            self_kv = (k, v)
        x = x + self.self_attn(h, h, self_mask, kv=self_kv)
        x = x + self.cross_attn(self.ln_cross(x), None if image_kv is not None else self.ln_image(image), kv=image_kv,
                                weights=attention)
        return x + self.mlp(self.ln_mlp(x))


class TextDecoder(nn.Module):
    """Token + position embeddings, N decoder layers, final norm and the output head, with GPT-2-style initialisation.

    The output head has one row per entry of ``output_ids`` (the full 49408-way vocabulary, or the corpus
    table when ``output_vocab="corpus"``); logit j scores token ``output_ids[j]``. ``[MASK]`` has an input
    embedding but no output row, so it can never be predicted. With a corpus table the input embedding is
    restricted too: rows ``output_ids`` then ``<sot>``, ``[MASK]``, pad (see ``Captioner.input_index``)."""

    def __init__(self, cfg: ModelConfig, image_width: int, n_in: int, n_out: int) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(n_in, cfg.text_width)
        self.pos_emb = nn.Parameter(torch.zeros(cfg.context_length, cfg.text_width))
        self.image_proj = nn.Linear(image_width, cfg.text_width)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg.text_width, cfg.text_heads, cfg.mlp_ratio, cfg.dropout) for _ in range(cfg.text_layers)
        )
        self.ln_f = nn.LayerNorm(cfg.text_width)
        self.head = nn.Linear(cfg.text_width, n_out)
        self.attend_to_pads = cfg.attend_to_pads
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.trunc_normal_(module.weight, std=0.02)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
        nn.init.trunc_normal_(self.pos_emb, std=0.01)
        for layer in self.layers:  # GPT-2 style scaled init of residual projections
            for proj in (layer.self_attn.proj, layer.cross_attn.proj, layer.mlp[2]):
                nn.init.trunc_normal_(proj.weight, std=0.02 / math.sqrt(2 * len(self.layers)))

    def hidden(self, tokens: torch.Tensor, image_tokens: torch.Tensor | None, causal: bool,
               rows: torch.Tensor | None = None, cache: ImageCache | None = None,
               past: list[list] | None = None, attention: list | None = None) -> torch.Tensor:
        """tokens (B, L), image_tokens (B, M, D_img) -> final hidden states (B, L, C).

        `rows` (B, L) are the embedding rows of `tokens` when the input table is restricted to a corpus.
        `cache` replaces `image_tokens` by their precomputed keys/values. `past` (one list per layer, see
        :class:`DecoderLayer`) continues a cached prefix of T tokens: `tokens` sit at positions T..T+L-1 and
        must hold no padding (incremental ARC decoding). `attention`: a list that receives each layer's
        cross-attention weights (B, h, L, M), first layer first."""
        B, L = tokens.shape
        start = past[0][0].shape[2] if past and past[0] else 0  # T cached positions
        if start + L > self.pos_emb.shape[0]:
            raise ValueError(f"sequence of {start + L} tokens exceeds the model's context_length "
                             f"{self.pos_emb.shape[0]}")
        x = self.tok_emb(tokens if rows is None else rows) + self.pos_emb[start:start + L]  # (B, L, C)
        image = self.image_proj(image_tokens) if cache is None else None  # (B, M, C)
        mask = None
        if not self.attend_to_pads and past is None:
            mask = ~padding_mask(tokens)[:, None, None, :]  # (B, 1, 1, L)
        if causal and (past is None or L > 1):
            tril = torch.ones(L, start + L, dtype=torch.bool, device=tokens.device).tril(start)  # (L, T+L)
            mask = tril if mask is None else mask & tril
        for i, layer in enumerate(self.layers):
            x = layer(x, image, mask, None if cache is None else cache.kv[i], None if past is None else past[i],
                      attention)
        return self.ln_f(x)


class Captioner(nn.Module):
    """Image encoder f + text decoder g. ``causal=False`` for MDC/BERT, ``True`` for ARC."""

    def __init__(self, cfg: ModelConfig, causal: bool = False, output_ids: torch.Tensor | None = None) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.causal = causal
        output_ids = vocabulary_ids(cfg, output_ids, "output_ids")
        self.register_buffer("output_ids", output_ids)  # (V_out,) head row -> token id
        self.restricted = cfg.output_vocab == "corpus"
        self._refresh_output_index()
        self.encoder = build_image_encoder(cfg)
        n_in = len(output_ids) + 3 if self.restricted else EMBED_SIZE
        self.decoder = TextDecoder(cfg, self.encoder.width, n_in, len(output_ids))

    def _refresh_output_index(self) -> None:
        """Build ``output_index`` (EMBED_SIZE,): token id -> head row (-1 where the head has no row), and for a
        corpus table ``input_index`` (EMBED_SIZE,): token id -> embedding row (-1 for ids the model never saw)."""
        device, n = self.output_ids.device, len(self.output_ids)
        index = torch.full((EMBED_SIZE,), -1, dtype=torch.long, device=device)
        index[self.output_ids] = torch.arange(n, device=device)
        self.register_buffer("output_index", index, persistent=False)
        if self.restricted:
            self.register_buffer("input_index", corpus_input_index(self.output_ids), persistent=False)

    def embedding_rows(self, tokens: torch.Tensor) -> torch.Tensor | None:
        """Embedding rows of `tokens` (B, L) for a corpus-restricted model (None for the full vocabulary)."""
        return lookup_rows(self.input_index, tokens) if self.restricted else None

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, 3, H, W) normalised -> image tokens V (B, M, D_img)."""
        return self.encoder(images)

    def pooled_features(self, images: torch.Tensor, kind: str = "gap") -> torch.Tensor:
        """Probe feature (B, D_img): GAP over patch tokens (or ``kind="cls"``)."""
        return self.encoder.pool(self.encode_image(images), kind)

    def image_cache(self, image_tokens: torch.Tensor) -> ImageCache:
        """Cross-attention keys/values of image_tokens (B, M, D_img) for every decoder layer (after
        ``image_proj``, ``ln_image`` and the key/value projection). They do not depend on the text, so one
        cache serves every denoising step, candidate caption and Monte Carlo sample of these images."""
        image = self.decoder.image_proj(image_tokens)  # (B, M, C)
        return ImageCache([layer.cross_attn.project_kv(layer.ln_image(image)) for layer in self.decoder.layers])

    def decode(self, tokens: torch.Tensor, image_tokens: torch.Tensor | None, *, select: torch.Tensor | None = None,
               causal: bool | None = None, cache: ImageCache | None = None, past: list[list] | None = None,
               attention: list | None = None, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Logits over the output vocabulary.

        tokens (B, L) ids (``[MASK]`` allowed), image_tokens (B, M, D_img). Returns (B, L, V_out), or
        (n, V_out) for the n positions where the bool mask `select` (B, L) is True, or at the n flat positions
        (n,) `select` holds (see :func:`select_positions`): the training step only needs masked positions, which
        saves most of the output-head cost. `rows`: the embedding rows of `tokens` of a corpus-restricted model,
        when the caller has looked them up and checked them already (the training step does it on the host, so
        the device never has to answer "is every id known?"); None looks them up here. With `cache` (from
        :meth:`image_cache`, batch B or 1 = one image for all rows) `image_tokens` may be None and the logits
        are those of the uncached call. `past`: incremental causal decoding, see :meth:`TextDecoder.hidden`.
        `attention`: a list that receives, per decoder layer (first layer first), the cross-attention weights over
        the M image tokens: (B, L, h, M), or (n, h, M) at the `select` positions; each sums to 1 over M.
        Off (None) by default, and then nothing extra is computed."""
        if cache is None and image_tokens is None:
            raise ValueError("decode needs image_tokens or an image cache")
        if cache is not None and cache.batch not in (1, tokens.shape[0]):
            raise ValueError(f"image cache holds {cache.batch} images but {tokens.shape[0]} token rows were given; "
                             "use a cache of one image or cache.index(rows)")
        rows = self.embedding_rows(tokens) if rows is None else rows
        weights: list | None = None if attention is None else []
        h = self.decoder.hidden(tokens, image_tokens, self.causal if causal is None else causal, rows, cache, past,
                                weights)
        if weights is not None:
            per_position = [w.transpose(1, 2) for w in weights]  # (B, L, h, M) each
            attention.extend(per_position if select is None else
                             [select_positions(w, select) for w in per_position])
        if select is not None:
            h = select_positions(h, select)  # (n, C)
        return self.decoder.head(h)

    def forward(self, images: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return self.decode(tokens, self.encode_image(images))

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):  # noqa: D102
        own = self.state_dict()
        bad = [(k, tuple(v.shape), tuple(own[k].shape)) for k, v in state_dict.items()
               if k in own and tuple(v.shape) != tuple(own[k].shape)]
        missing = sorted(set(own) - set(state_dict))
        unexpected = sorted(set(state_dict) - set(own))
        if strict and (bad or missing or unexpected):
            parts = []
            if bad:
                k, theirs, ours = bad[0]
                parts.append(f"{len(bad)} tensors have other shapes (e.g. {k}: checkpoint {theirs}, model {ours})")
            if missing:
                parts.append(f"{len(missing)} model tensors are missing from the checkpoint (e.g. {missing[:2]})")
            if unexpected:
                parts.append(f"{len(unexpected)} checkpoint tensors are unknown to the model (e.g. {unexpected[:2]})")
            raise ValueError("checkpoint does not match this architecture: " + "; ".join(parts) +
                             ". Was it saved by a run with another config (preset, encoder, widths)?")
        result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        self._refresh_output_index()
        return result
