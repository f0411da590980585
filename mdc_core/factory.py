"""The models a config builds, and the one place that builds them: :func:`create_model` (the trainer) and
:func:`load_model` (a run or checkpoint folder), so every objective's run saves and loads the same way. The
objective table names each objective's architecture (its spec's ``model``), a row of :data:`MODELS`: the captioner
(:class:`mdc_core.model.Captioner`) or the CLIP baseline, :class:`CLIPModel`. Sizes are checked before anything is
built (:func:`check_model_size`), and :func:`load_model` checks the weights' header against the model its
``config.json`` builds before allocating anything (:func:`check_fits`).

**The CLIP baseline** (paper Table 1): the captioner's ViT, open_clip's causal ``TextTransformer`` of the decoder's
shape, and open_clip's symmetric contrastive loss with a learned temperature (:func:`mdc_core.objectives.clip_loss`).
The image tower's CLS token is both the probe feature and, projected, the image embedding; the joint space has
``text_width`` dimensions. open_clip is imported when a CLIP model is built, not with this module (its package
pulls in its model zoo). With ``model.output_vocab="corpus"`` the text tower embeds only the corpus ids, with the
captioner's row mapping, so CLIP and the captioners of one preset see the same input vocabulary.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .checkpoint import CheckpointError, load_weights, refuse_hub_encoder, weight_shapes, weights_file
from .config import ConfigError, ModelConfig, RunConfig
from .model import MAX_PARAMS, Captioner, ImageEncoder, check_local_dir, encoder_params, vocabulary_ids
from .registry import ObjectiveSpec, objective_spec
from .tokenizer import EMBED_SIZE, EOT_ID, MASK_ID, corpus_input_index, lookup_rows

LOGIT_SCALE_INIT = math.log(1 / 0.07)  # CLIP's initial temperature 0.07
LOGIT_SCALE_MAX = math.log(100.0)  # CLIP clips the learned scale exp(s) at 100


class CLIPModel(nn.Module):
    """Image tower + causal text tower + projections to a joint space + learned logit scale.

    `vocab_ids` (V,) are the token ids the text tower embeds when ``cfg.output_vocab == "corpus"`` (the same table
    the captioners use as their output vocabulary); ignored for ``"full"``."""

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
        index = (corpus_input_index(self.vocab_ids) if self.restricted  # the same table as Captioner.input_index
                 else torch.arange(EMBED_SIZE, device=self.vocab_ids.device))
        self.register_buffer("input_index", index, persistent=False)

    def embedding_rows(self, tokens: torch.Tensor) -> torch.Tensor:
        """Embedding rows (B, L) of token ids `tokens` (B, L); ValueError for ids outside a corpus table."""
        return lookup_rows(self.input_index, tokens)

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
        already, as the training step does on the host (checking here reads the device: a sync on CUDA)."""
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

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):  # noqa: D102
        try:
            result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        except RuntimeError as err:
            raise ValueError(f"checkpoint does not match this CLIP architecture (was it saved by a run with "
                             f"another config?): {err}") from err
        self._refresh_input_index()
        return result


MODELS: dict[str, Callable[[ModelConfig, ObjectiveSpec, torch.Tensor | None], nn.Module]] = {
    "captioner": lambda cfg, spec, ids: Captioner(cfg, causal=spec.causal, output_ids=ids),
    "clip": lambda cfg, spec, ids: CLIPModel(cfg, vocab_ids=ids),
}


def decoder_params(m: ModelConfig) -> int:
    """About how many parameters the decoder of `m` holds: per layer attention (4 w^2) and MLP (2 w^2 mlp_ratio),
    plus the input and output embeddings (one row per token id) and the positions."""
    w = m.text_width
    return int(m.text_layers * (4 + 2 * m.mlp_ratio) * w * w + (2 * (MASK_ID + 1) + m.context_length) * w)


def check_model_size(m: ModelConfig) -> None:
    """:class:`~mdc_core.config.ConfigError` when the decoder or the encoder of `m` (``local-dir:`` included,
    :func:`check_local_dir`) would hold more than :data:`MAX_PARAMS` parameters; nothing is built."""
    check_local_dir(m.encoder)
    for what, n in (("decoder", decoder_params(m)), ("encoder", encoder_params(m.encoder_kwargs))):
        if n > MAX_PARAMS:
            raise ConfigError(f"the {what} of this config (text_width {m.text_width} x text_layers {m.text_layers}, "
                              f"encoder_kwargs {str(m.encoder_kwargs)[:80]}) would hold about {n / 1e9:.0f} billion "
                              f"parameters, more than the {MAX_PARAMS / 1e9:.0f} billion a model may have")


def create_model(cfg: RunConfig | ModelConfig, objective: str, output_ids: torch.Tensor | None = None
                 ) -> Captioner | CLIPModel:
    """A freshly initialised model for `objective` (a row of the objective table).

    `output_ids` is the corpus token table when ``cfg.output_vocab == "corpus"`` (the captioners' output rows,
    CLIP's input rows); None allocates it for a checkpoint to fill, or means the full vocabulary."""
    model_cfg = cfg.model if isinstance(cfg, RunConfig) else cfg
    check_model_size(model_cfg)  # before anything is built: a config inside each limit can still be too large
    spec = objective_spec(objective)
    return MODELS[spec.model](model_cfg, spec, output_ids)


def load_model(path: str | Path, *, device: str | torch.device = "cpu", ema: bool = False
               ) -> tuple[nn.Module, RunConfig]:
    """Rebuild a model from a run or checkpoint folder: its ``config.json`` builds the architecture and the
    safetensors weights fill it (no pickle is executed). ``ema=True`` loads the EMA weights if saved."""
    weights = weights_file(path, ema)
    cfg = RunConfig.load(weights.parent / "config.json")
    check_fits(cfg, weights)  # before building: a hostile config.json allocates nothing
    state = load_weights(weights)
    arch = dataclasses.replace(cfg.model, pretrained=False, pretrained_path="")  # weights come from the checkpoint
    model = create_model(arch, cfg.objective.name)  # a Captioner, or a CLIPModel for objective "clip"
    model.load_state_dict(state)
    return model.to(device).eval(), cfg


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
