"""The CLIP baseline (paper Table 1): the captioner's ViT, a causal text encoder of the decoder's shape, and a
symmetric contrastive loss with a learned temperature (Radford et al., 2021).

Built from open_clip's parts: the text tower is ``open_clip.transformer.TextTransformer`` (pre-LN blocks, causal
mask, final LayerNorm, bias-free projection) configured with the decoder's width / layers / heads / MLP ratio /
context length, and the loss is ``open_clip.loss.ClipLoss``. The image tower is the same
:class:`~mdc_core.encoders.ImageEncoder` the captioners use; its CLS (pre-logits) token is both the probe feature
and, through a linear projection, the image embedding. The joint space has ``text_width`` dimensions
(512 for the paper's ViT-B presets, as OpenAI's CLIP ViT-B). open_clip is imported when a CLIP model is built
or its loss computed, not with this module: importing the ``open_clip`` package pulls in its model zoo
(``transformers``, scikit-learn), which the captioners never need.

Vocabulary: with ``model.output_vocab="full"`` the text encoder embeds all 49408 CLIP BPE ids. With ``"corpus"``
(the ``tiny`` preset) it embeds only the corpus ids, with the row mapping of :class:`~mdc_core.model.Captioner`
(corpus ids in order, then ``<sot>``, ``[MASK]``, pad), so CLIP and the captioners of one preset see the same
input vocabulary and the 49408-row table does not dominate a tiny model; a word outside the corpus is an error.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .encoders import ImageEncoder
from .model import corpus_input_index, lookup_rows, vocabulary_ids
from .tokenizer import EMBED_SIZE, EOT_ID

LOGIT_SCALE_INIT = math.log(1 / 0.07)  # CLIP's initial temperature 0.07
LOGIT_SCALE_MAX = math.log(100.0)  # CLIP clips the learned scale exp(s) at 100


class CLIPModel(nn.Module):
    """Image tower + causal text tower + projections to a joint space + learned logit scale.

    `vocab_ids` (V,) are the token ids the text tower embeds when ``cfg.output_vocab == "corpus"`` (the same table
    the captioners use as their output vocabulary); ignored for ``"full"``.
    """

    def __init__(self, cfg: ModelConfig, vocab_ids: torch.Tensor | None = None) -> None:
        super().__init__()
        cfg.validate()
        if cfg.dropout > 0:
            raise ValueError("model.dropout > 0 is not supported by the CLIP text encoder (open_clip's "
                             "TextTransformer has no dropout); set model.dropout=0 for objective 'clip'")
        self.cfg = cfg
        self.restricted = cfg.output_vocab == "corpus"
        vocab_ids = vocabulary_ids(cfg, vocab_ids, "vocab_ids")
        self.register_buffer("vocab_ids", vocab_ids)  # (V,) corpus token ids (saved)
        self._refresh_input_index()
        self.encoder = ImageEncoder(cfg)
        n_rows = len(vocab_ids) + 3 if self.restricted else EMBED_SIZE
        from open_clip.transformer import TextTransformer

        self.text = TextTransformer(
            context_length=cfg.context_length, vocab_size=n_rows, width=cfg.text_width, heads=cfg.text_heads,
            layers=cfg.text_layers, mlp_ratio=cfg.mlp_ratio, output_dim=cfg.text_width, pool_type="eos",
            eos_id=EOT_ID,
        )
        self.image_proj = nn.Linear(self.encoder.width, cfg.text_width, bias=False)
        nn.init.normal_(self.image_proj.weight, std=self.encoder.width ** -0.5)
        self.logit_scale = nn.Parameter(torch.tensor(LOGIT_SCALE_INIT))

    def _refresh_input_index(self) -> None:
        """``input_index`` (EMBED_SIZE,): token id -> embedding row (-1 for ids outside a corpus table)."""
        device = self.vocab_ids.device
        if not self.restricted:
            index = torch.arange(EMBED_SIZE, device=device)
        else:
            index = corpus_input_index(self.vocab_ids)  # the same table as Captioner.input_index
        self.register_buffer("input_index", index, persistent=False)

    def embedding_rows(self, tokens: torch.Tensor) -> torch.Tensor:
        """Embedding rows (B, L) of token ids `tokens` (B, L); ValueError for ids outside a corpus table."""
        return lookup_rows(self.input_index, tokens)

    # ------------------------------------------------------------------------------------------------------
    # towers

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, 3, H, W) normalised -> image tokens (B, M, D_img) (final norm applied), as the captioners."""
        return self.encoder(images)

    def pooled_features(self, images: torch.Tensor, kind: str = "cls") -> torch.Tensor:
        """Probe feature (B, D_img): the CLS / pre-logits token (``kind="gap"``: mean of the patch tokens)."""
        return self.encoder.pool(self.encode_image(images), kind)

    def embed_image(self, images: torch.Tensor, normalize: bool = True) -> torch.Tensor:
        """images (B, 3, H, W) -> joint-space embeddings (B, E), unit length when `normalize`."""
        z = self.image_proj(self.pooled_features(images, "cls"))  # (B, E)
        return F.normalize(z, dim=-1) if normalize else z

    def encode_text(self, tokens: torch.Tensor, normalize: bool = True, rows: torch.Tensor | None = None
                    ) -> torch.Tensor:
        """tokens (B, L) ``<sot> ids <eot> pad...`` (L <= context_length) -> joint-space embeddings (B, E).

        The feature of the first ``<eot>`` after the causal transformer and final LayerNorm, projected (CLIP's
        text embedding). Pads follow ``<eot>``, so the causal mask already hides them from it. `rows`: the
        embedding rows of `tokens`, when the caller has looked them up and checked the rows (and their ``<eot>``)
        already, as the training step does on the host (checking here reads the device: a sync on CUDA).
        """
        B, L = tokens.shape
        if L > self.cfg.context_length:
            raise ValueError(f"sequence of {L} tokens exceeds the model's context_length {self.cfg.context_length}")
        if rows is None:
            if not bool((tokens == EOT_ID).any(dim=1).all()):
                raise ValueError("every token row needs an <eot> token: its feature is the text embedding")
            rows = self.embedding_rows(tokens)
        text = self.text
        x = text.token_embedding(rows) + text.positional_embedding[:L]  # (B, L, C)
        x = text.transformer(x, attn_mask=text.attn_mask[:L, :L])  # causal, additive -inf mask (L, L)
        x = text.ln_final(x)
        from open_clip.transformer import text_global_pool

        pooled = text_global_pool(x, tokens, pool_type="eos", eos_token_id=EOT_ID)  # (B, C) at first <eot>
        z = pooled @ text.text_projection  # (B, E)
        return F.normalize(z, dim=-1) if normalize else z

    def scale(self) -> torch.Tensor:
        """The learned logit scale exp(s), clipped at 100 (scalar)."""
        return self.logit_scale.clamp(max=LOGIT_SCALE_MAX).exp()

    def forward(self, images: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> (image embeddings (B, E), text embeddings (B, E), logit scale ()), embeddings unit length."""
        return self.embed_image(images), self.encode_text(tokens), self.scale()

    def similarity(self, images: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Cosine similarity (B_img, B_txt) of every image with every caption (no temperature)."""
        return self.embed_image(images) @ self.encode_text(tokens).T

    def decode(self, *args, **kwargs) -> torch.Tensor:
        """CLIP has no caption decoder: tools that need one (sampling, likelihood scores) get a clear error."""
        raise ValueError("this is a CLIP run (objective 'clip'): it has no caption decoder, so it cannot sample "
                         "or score captions token by token; use its similarity() instead")

    # ------------------------------------------------------------------------------------------------------

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):  # noqa: D102
        try:
            result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        except RuntimeError as err:
            raise ValueError(f"checkpoint does not match this CLIP architecture (was it saved by a run with "
                             f"another config?): {err}") from err
        self._refresh_input_index()
        return result

    def num_params(self) -> dict[str, int]:
        enc = sum(p.numel() for p in self.encoder.parameters())
        rest = sum(p.numel() for p in self.parameters()) - enc
        return {"encoder": enc, "text": rest, "total": enc + rest}


def contrastive_loss(model: CLIPModel, images: torch.Tensor, tokens: torch.Tensor, rows: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Symmetric InfoNCE of a batch (open_clip's ClipLoss): images (B, 3, H, W), tokens (B, L).

    Under torch.distributed the features of all ranks are gathered (with gradients; each rank scores its own
    rows against all, open_clip's ``local_loss``), so the negatives are the global batch as in CLIP.
    Returns (loss, metrics); ``acc_retrieval`` is the in-batch retrieval accuracy (mean of image->text and
    text->image top-1), named like the captioners' token accuracy so the trainer logs it in the same column.
    `rows`: the tokens' embedding rows, checked by the caller (see :meth:`CLIPModel.encode_text`).
    """
    image_z, text_z, scale = model.embed_image(images), model.encode_text(tokens, rows=rows), model.scale()
    image_z, text_z = image_z.float(), text_z.float()  # the softmax over the batch in fp32 under autocast
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    rank, world = (torch.distributed.get_rank(), torch.distributed.get_world_size()) if distributed else (0, 1)
    from open_clip.loss import ClipLoss

    loss_fn = ClipLoss(local_loss=world > 1, gather_with_grad=world > 1, rank=rank, world_size=world)
    loss = loss_fn(image_z, text_z, scale)
    with torch.no_grad():
        logits = image_z @ text_z.T  # (B, B) local batch
        target = torch.arange(len(logits), device=logits.device)
        i2t = (logits.argmax(dim=1) == target).float().mean()
        t2i = (logits.argmax(dim=0) == target).float().mean()
    metrics = {"loss": loss.detach(), "acc_retrieval": (i2t + t2i) / 2, "acc_i2t": i2t, "acc_t2i": t2i,
               "logit_scale": scale.detach()}
    return loss, metrics
