"""The captioner: a timm image encoder and a cross-attention text decoder (paper Sec. 3.2, Fig. 2).

Read top to bottom: :class:`ImageEncoder` (thin adapter around ``timm.create_model``, as open_clip's
``TimmModel``), :class:`Attention`, :class:`DecoderLayer` (pre-LN self-attention -> cross-attention -> MLP),
:class:`TextDecoder`, and :class:`Captioner` which ties them together. The decoder takes no time input
(time-independent parameterization); MDC uses it bidirectionally, ARC causally: same class, one flag.
"""

from __future__ import annotations

import math
from pathlib import Path

import timm
import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .tokenizer import EMBED_SIZE, EOT_ID, MASK_ID, PAD_ID, SOT_ID, VOCAB_SIZE


def padding_mask(tokens: torch.Tensor) -> torch.Tensor:
    """(B, L) bool, True at pads: every position after the first ``<eot>``.

    Pads cannot be found by id because the pad id 0 is also the real token "!".
    """
    is_eot = tokens == EOT_ID
    return (torch.cumsum(is_eot.int(), dim=1) - is_eot.int()) > 0


class ImageEncoder(nn.Module):
    """Any timm model as a token-sequence encoder: images (B, 3, H, W) -> tokens (B, M, D)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        kwargs = dict(cfg.encoder_kwargs)
        kwargs.setdefault("img_size", cfg.image_size)
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


class Attention(nn.Module):
    """Multi-head attention of queries `x` over `context` (itself for self-attention), fused SDPA kernel."""

    def __init__(self, dim: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, context: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, L, C), context (B, S, C), mask (B, 1, L|1, S) bool, True = may attend -> (B, L, C)."""
        B, L, C = x.shape
        q = self.q(x).view(B, L, self.heads, C // self.heads).transpose(1, 2)  # (B, h, L, c)
        k, v = self.kv(context).view(B, -1, 2, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)  # (B, h, S, c)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                           dropout_p=self.dropout if self.training else 0.0)
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

    def forward(self, x: torch.Tensor, image: torch.Tensor, self_mask: torch.Tensor | None) -> torch.Tensor:
        h = self.ln_self(x)
        x = x + self.self_attn(h, h, self_mask)
        x = x + self.cross_attn(self.ln_cross(x), self.ln_image(image))
        return x + self.mlp(self.ln_mlp(x))


class TextDecoder(nn.Module):
    """Token + position embeddings, N decoder layers, final norm and the output head.

    The output head has one row per entry of ``output_ids`` (the full 49408-way vocabulary, or the corpus
    table when ``output_vocab="corpus"``); logit j scores token ``output_ids[j]``. ``[MASK]`` has an input
    embedding but no output row, so it can never be predicted. With a corpus table the input embedding is
    restricted too: rows ``output_ids`` then ``<sot>``, ``[MASK]``, pad (see ``Captioner.input_index``).
    """

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

    def hidden(self, tokens: torch.Tensor, image_tokens: torch.Tensor, causal: bool,
               rows: torch.Tensor | None = None) -> torch.Tensor:
        """tokens (B, L), image_tokens (B, M, D_img) -> final hidden states (B, L, C).

        `rows` (B, L) are the embedding rows of `tokens` when the input table is restricted to a corpus.
        """
        B, L = tokens.shape
        if L > self.pos_emb.shape[0]:
            raise ValueError(f"sequence of {L} tokens exceeds the model's context_length {self.pos_emb.shape[0]}")
        x = self.tok_emb(tokens if rows is None else rows) + self.pos_emb[:L]  # (B, L, C)
        image = self.image_proj(image_tokens)  # (B, M, C)
        mask = None if self.attend_to_pads else ~padding_mask(tokens)[:, None, None, :]  # (B, 1, 1, L)
        if causal:
            tril = torch.ones(L, L, dtype=torch.bool, device=tokens.device).tril()  # (L, L)
            mask = tril if mask is None else mask & tril
        for layer in self.layers:
            x = layer(x, image, mask)
        return self.ln_f(x)


class Captioner(nn.Module):
    """Image encoder f + text decoder g. ``causal=False`` for MDC/BERT, ``True`` for ARC."""

    def __init__(self, cfg: ModelConfig, causal: bool = False, output_ids: torch.Tensor | None = None) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.causal = causal
        if output_ids is None:
            if cfg.output_vocab == "corpus":
                if cfg.output_vocab_size <= 0:
                    raise ValueError("model.output_vocab='corpus' needs output_ids (or output_vocab_size to "
                                     "allocate them before loading a checkpoint)")
                output_ids = torch.zeros(cfg.output_vocab_size, dtype=torch.long)  # filled by load_state_dict
            else:
                output_ids = torch.arange(VOCAB_SIZE)
        self.register_buffer("output_ids", output_ids.clone().long())  # (V_out,) head row -> token id
        self.restricted = cfg.output_vocab == "corpus"
        self._refresh_output_index()
        self.encoder = ImageEncoder(cfg)
        n_in = len(output_ids) + 3 if self.restricted else EMBED_SIZE
        self.decoder = TextDecoder(cfg, self.encoder.width, n_in, len(output_ids))
        self._init_decoder()

    def _init_decoder(self) -> None:
        for module in self.decoder.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.trunc_normal_(module.weight, std=0.02)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
        nn.init.trunc_normal_(self.decoder.pos_emb, std=0.01)
        for layer in self.decoder.layers:  # GPT-2 style scaled init of residual projections
            for proj in (layer.self_attn.proj, layer.cross_attn.proj, layer.mlp[2]):
                nn.init.trunc_normal_(proj.weight, std=0.02 / math.sqrt(2 * len(self.decoder.layers)))

    def _refresh_output_index(self) -> None:
        """Build ``output_index`` (EMBED_SIZE,): token id -> head row (-1 where the head has no row), and for a
        corpus table ``input_index`` (EMBED_SIZE,): token id -> embedding row (-1 for ids the model never saw)."""
        device, n = self.output_ids.device, len(self.output_ids)
        index = torch.full((EMBED_SIZE,), -1, dtype=torch.long, device=device)
        index[self.output_ids] = torch.arange(n, device=device)
        self.register_buffer("output_index", index, persistent=False)
        if self.restricted:
            inp = index.clone()
            inp[SOT_ID], inp[MASK_ID], inp[PAD_ID] = n, n + 1, n + 2
            self.register_buffer("input_index", inp, persistent=False)

    def embedding_rows(self, tokens: torch.Tensor) -> torch.Tensor | None:
        """Embedding rows of `tokens` (B, L) for a corpus-restricted model (None for the full vocabulary)."""
        if not self.restricted:
            return None
        rows = self.input_index[tokens]
        if bool((rows < 0).any()):
            unknown = tokens[rows < 0].unique()[:5].tolist()
            raise ValueError(f"token ids {unknown} are not in this model's corpus vocabulary (it was trained with "
                             "model.output_vocab='corpus'); such words cannot be represented by this model")
        return rows

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, 3, H, W) normalised -> image tokens V (B, M, D_img)."""
        return self.encoder(images)

    def pooled_features(self, images: torch.Tensor, kind: str = "gap") -> torch.Tensor:
        """Probe feature (B, D_img): GAP over patch tokens (or ``kind="cls"``)."""
        return self.encoder.pool(self.encode_image(images), kind)

    def decode(self, tokens: torch.Tensor, image_tokens: torch.Tensor, *, select: torch.Tensor | None = None,
               causal: bool | None = None) -> torch.Tensor:
        """Logits over the output vocabulary.

        tokens (B, L) ids (``[MASK]`` allowed), image_tokens (B, M, D_img). Returns (B, L, V_out), or
        (n, V_out) for the n positions where the bool mask `select` (B, L) is True: the training step only
        needs masked positions, which saves most of the output-head cost.
        """
        rows = self.embedding_rows(tokens)
        h = self.decoder.hidden(tokens, image_tokens, self.causal if causal is None else causal, rows)
        if select is not None:
            h = h[select]  # (n, C)
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

    def num_params(self) -> dict[str, int]:
        enc = sum(p.numel() for p in self.encoder.parameters())
        dec = sum(p.numel() for p in self.decoder.parameters())
        return {"encoder": enc, "decoder": dec, "total": enc + dec}
