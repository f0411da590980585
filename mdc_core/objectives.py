"""Training objectives: MDC (paper Alg. 1 / Eq. 5) and its baselines, chosen from one table.

Everything here except :func:`compute_loss` is a pure function of tensors, so the mathematics is tested
directly against hand-computed values.

Conventions (DESIGN.md section 2): caption tokens are ``<sot> c_0 .. c_{N-1} <eot> pad ...``. Only the
caption tokens ``c_i`` are *maskable*: ``<sot>``, ``<eot>`` and pads are never masked and never in the loss,
so the sampling canvas ``<sot> [MASK]*N' <eot>`` is in-distribution.

MDC loss, per-token normalisation (default)::

    L = sum_b w_b * sum_{i masked in b} CE_bi  /  sum_b n_b        w_b = 1/t_b (mdc) or 1 (others)

where n_b is the number of maskable tokens of caption b. Since each token is masked with probability t_b,
E[L | t] = sum_b sum_i CE_bi / sum_b n_b: the mean per-token cross-entropy, for every t (this is the
NELBO estimator of MDLM with the linear schedule alpha_t = 1 - t, for which -alpha'_t / (1 - alpha_t) = 1/t).
``per_sequence`` normalisation instead averages ``w_b * sum_i CE_bi / n_b`` over captions (CapPa-style).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .clip_model import contrastive_loss
from .config import ObjectiveConfig, resolve_ref
from .model import Captioner, padding_mask
from .tokenizer import EOT_ID, MASK_ID, SOT_ID

T_MIN = 1e-3  # t is clamped here so that 1/t stays finite for a schedule starting at 0 (MDLM uses eps=1e-3)


@dataclass(frozen=True)
class ObjectiveSpec:
    """One row of the objective table."""

    causal: bool  # decoder self-attention is causal (teacher forcing) instead of bidirectional
    masking: str  # "time": t ~ U[t_low, t_high] per caption; "fixed": t = mask_ratio; "all": t = 1; "none";
    # "d3pm": mask-and-replace noise at t ~ U{1..T} (mdc_core.masked_conditional.diffusion)
    inv_t_weight: bool  # weight each caption's masked CE by 1/t (the diffusion ELBO weight)
    loss: str  # "module:function" of the batch loss, (model, images, tokens, cfg, generator) -> LossOutput;
    # a string so that the table names the MC-Diffusion extension without importing it (resolved on use)
    model: str = "captioner"  # model family (mdc_core.factory.MODELS): "captioner" or "clip" (contrastive loss)

    def loss_fn(self) -> Callable[..., LossOutput]:
        return resolve_ref(self.loss)


_MASKED, _AR = "mdc_core.objectives:masked_token_loss", "mdc_core.objectives:autoregressive_loss"
OBJECTIVES: dict[str, ObjectiveSpec] = {  # keys: config.OBJECTIVE_NAMES in that order (tests/test_objectives.py)
    "mdc": ObjectiveSpec(causal=False, masking="time", inv_t_weight=True, loss=_MASKED),  # masked diffusion captioning
    "mdc_no_t": ObjectiveSpec(causal=False, masking="time", inv_t_weight=False, loss=_MASKED),  # = CMLM (Table 4)
    "bert": ObjectiveSpec(causal=False, masking="fixed", inv_t_weight=False, loss=_MASKED),  # image-cond. BERT, r
    "parallel": ObjectiveSpec(causal=False, masking="all", inv_t_weight=False, loss=_MASKED),  # r = 1, CapPa parallel
    "arc": ObjectiveSpec(causal=True, masking="none", inv_t_weight=False, loss=_AR),  # autoregressive captioning
    "clip": ObjectiveSpec(causal=True, masking="none", inv_t_weight=False, model="clip",  # contrastive baseline
                          loss="mdc_core.objectives:clip_loss"),
    "d3pm": ObjectiveSpec(causal=False, masking="d3pm", inv_t_weight=False,  # MC-Diffusion mask-and-replace D3PM
                          loss="mdc_core.masked_conditional.diffusion:d3pm_objective"),
}
# training-time condition corruption for guided sampling (objective.guidance = cfg | mcs; MC-Diffusion's guidance)
CONDITION_CORRUPTION = "mdc_core.masked_conditional.guidance:corrupt_training_condition"


def objective_spec(name: str) -> ObjectiveSpec:
    if name not in OBJECTIVES:
        raise ValueError(f"unknown objective {name!r}; choose one of {', '.join(OBJECTIVES)}")
    return OBJECTIVES[name]


@dataclass
class LossOutput:
    loss: torch.Tensor  # scalar to backpropagate
    metrics: dict[str, torch.Tensor]  # detached scalars (no host sync until the trainer logs them)


# ----------------------------------------------------------------------------------------------------------
# pure tensor functions


def maskable_positions(tokens: torch.Tensor) -> torch.Tensor:
    """(B, L) bool: caption tokens that may be masked (not ``<sot>``, ``<eot>`` or padding)."""
    return ~padding_mask(tokens) & (tokens != SOT_ID) & (tokens != EOT_ID)


def trim_padding(tokens: torch.Tensor) -> torch.Tensor:
    """Drop the trailing columns that are padding in every row (saves compute; results are unchanged
    because pads are invisible to attention and never in the loss)."""
    is_eot = (tokens == EOT_ID).int()
    has_eot = is_eot.any(dim=1)
    length = torch.where(has_eot, is_eot.argmax(dim=1) + 1, torch.full_like(has_eot, tokens.shape[1], dtype=torch.long))
    return tokens[:, : int(length.max())]


def sample_t(batch: int, low: float, high: float, *, antithetic: bool = False,
             generator: torch.Generator | None = None, device: torch.device | str = "cpu") -> torch.Tensor:
    """(B,) times in [low, high): i.i.d. uniform, or stratified one per 1/B-bin (MDLM's low-discrepancy
    sampler: u_b = (b + U) / B), which keeps the marginal uniform and lowers the batch loss variance."""
    u = torch.rand(batch, generator=generator, device=device)
    if antithetic:
        u = (torch.arange(batch, device=device) + u) / batch
        u = u[torch.randperm(batch, generator=generator, device=device)]  # no order correlation with data
    return low + (high - low) * u


def apply_mask(tokens: torch.Tensor, t: torch.Tensor, *, generator: torch.Generator | None = None,
               min_one: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask each maskable token of caption b independently with probability t_b (Alg. 1: ``p < t``).

    tokens (B, L), t (B,). Returns (noisy tokens (B, L) with ``[MASK]`` at masked positions, mask (B, L)).
    With `min_one`, a caption that drew no masked token gets one, chosen uniformly among its maskable tokens.
    """
    maskable = maskable_positions(tokens)
    p = torch.rand(tokens.shape, generator=generator, device=tokens.device)
    mask = (p < t[:, None]) & maskable
    if min_one:
        need = (mask.sum(dim=1) == 0) & maskable.any(dim=1)
        scores = torch.rand(tokens.shape, generator=generator, device=tokens.device).masked_fill(~maskable, -1.0)
        pick = F.one_hot(scores.argmax(dim=1), tokens.shape[1]).bool()  # (B, L) one random maskable slot
        mask = mask | (pick & need[:, None])
    return tokens.masked_fill(mask, MASK_ID), mask


def masked_diffusion_loss(ce: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor, n_valid: torch.Tensor,
                          normalization: str = "per_token") -> torch.Tensor:
    """Weighted masked cross-entropy, normalised as described in the module docstring.

    ce: (n,) cross-entropy at the masked positions in row-major order of `mask` (B, L);
    weight: (B,) per-caption weight (1/t or 1); n_valid: (B,) maskable tokens per caption.
    """
    row = mask.nonzero()[:, 0]  # (n,) caption index of each masked token
    per_caption = torch.zeros(mask.shape[0], dtype=ce.dtype, device=ce.device).index_add_(0, row, ce)  # (B,)
    per_caption = per_caption * weight
    if normalization == "per_token":
        return per_caption.sum() / n_valid.sum().clamp(min=1)
    if normalization == "per_sequence":
        keep = n_valid > 0
        return (per_caption[keep] / n_valid[keep]).sum() / keep.sum().clamp(min=1)
    raise ValueError(f"unknown normalization {normalization!r}; use per_token or per_sequence")


def mask_rates(cfg: ObjectiveConfig, batch: int, generator: torch.Generator | None,
               device: torch.device | str) -> torch.Tensor:
    """(B,) masking probabilities for the objective: sampled t (mdc, mdc_no_t), r (bert) or 1 (parallel)."""
    spec = objective_spec(cfg.name)
    if spec.masking == "time":
        t = sample_t(batch, cfg.t_low, cfg.t_high, antithetic=cfg.antithetic_t, generator=generator, device=device)
        return t.clamp(min=T_MIN)
    if spec.masking == "fixed":
        return torch.full((batch,), cfg.mask_ratio, device=device)
    if spec.masking == "all":
        return torch.ones(batch, device=device)
    raise ValueError(f"objective {cfg.name!r} does not mask tokens")


# ----------------------------------------------------------------------------------------------------------
# the loss of a batch


def compute_loss(model: Captioner, images: torch.Tensor, tokens: torch.Tensor, cfg: ObjectiveConfig,
                 generator: torch.Generator | None = None) -> LossOutput:
    """Loss of one batch: images (B, 3, H, W), tokens (B, L) from :class:`CaptionTokenizer`; the objective's
    row of :data:`OBJECTIVES` names the loss function."""
    return objective_spec(cfg.name).loss_fn()(model, images, trim_padding(tokens), cfg, generator)


def encode_condition(model: Captioner, images: torch.Tensor, cfg: ObjectiveConfig,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """Image tokens (B, M, D) the decoder cross-attends to; with ``cfg.guidance`` = cfg | mcs, corrupted for
    guided sampling by :data:`CONDITION_CORRUPTION`."""
    image_tokens = model.encode_image(images)  # (B, M, D)
    if cfg.guidance != "none":
        image_tokens = resolve_ref(CONDITION_CORRUPTION)(model, image_tokens, cfg, generator)
    return image_tokens


def clip_loss(model: Any, images: torch.Tensor, tokens: torch.Tensor, cfg: ObjectiveConfig,
              generator: torch.Generator | None = None) -> LossOutput:
    """Symmetric InfoNCE of :func:`mdc_core.clip_model.contrastive_loss`; no token masking."""
    return LossOutput(*contrastive_loss(model, images, tokens))


def masked_token_loss(model: Captioner, images: torch.Tensor, tokens: torch.Tensor, cfg: ObjectiveConfig,
                      generator: torch.Generator | None = None) -> LossOutput:
    """MDC and its masked baselines (mdc_no_t, bert, parallel): mask each caption token with the objective's
    rate, predict the masked tokens, weight by 1/t where the row says so (module docstring)."""
    spec = objective_spec(cfg.name)
    image_tokens = encode_condition(model, images, cfg, generator)
    t = mask_rates(cfg, tokens.shape[0], generator, tokens.device)  # (B,)
    noisy, mask = apply_mask(tokens, t, generator=generator, min_one=cfg.min_one_masked)
    logits = model.decode(noisy, image_tokens, select=mask, causal=False)  # (n, V_out), masked positions only
    targets = _to_output_rows(model, tokens[mask])  # (n,)
    ce = F.cross_entropy(logits.float(), targets, reduction="none")  # (n,)
    weight = 1.0 / t if spec.inv_t_weight else torch.ones_like(t)
    n_valid = maskable_positions(tokens).sum(dim=1)  # (B,)
    loss = masked_diffusion_loss(ce, mask, weight, n_valid, cfg.normalization)
    n_masked = mask.sum()
    metrics = {
        "loss": loss.detach(),
        "ce_masked": (ce.detach().sum() / n_masked.clamp(min=1)),
        "acc_masked": ((logits.detach().argmax(-1) == targets).float().sum() / n_masked.clamp(min=1)),
        "masked_frac": n_masked / n_valid.sum().clamp(min=1),
        "t_mean": t.mean(),
    }
    return LossOutput(loss, metrics)


def autoregressive_loss(model: Captioner, images: torch.Tensor, tokens: torch.Tensor, cfg: ObjectiveConfig,
                        generator: torch.Generator | None = None) -> LossOutput:
    """Teacher forcing: predict token i+1 from tokens <= i; targets are the caption tokens and ``<eot>``."""
    image_tokens = encode_condition(model, images, cfg, generator)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]  # (B, L-1)
    valid = ~padding_mask(tokens)[:, 1:]  # (B, L-1) caption tokens and <eot>
    logits = model.decode(inputs, image_tokens, select=valid, causal=True)  # (n, V_out)
    target_rows = _to_output_rows(model, targets[valid])
    ce = F.cross_entropy(logits.float(), target_rows, reduction="none")  # (n,)
    n_valid = valid.sum(dim=1)
    loss = masked_diffusion_loss(ce, valid, torch.ones(tokens.shape[0], device=ce.device), n_valid,
                                 cfg.normalization)
    metrics = {
        "loss": loss.detach(),
        "ce_masked": ce.detach().mean(),
        "acc_masked": (logits.detach().argmax(-1) == target_rows).float().mean(),
        "masked_frac": torch.ones((), device=ce.device),
        "t_mean": torch.ones((), device=ce.device),
    }
    return LossOutput(loss, metrics)


def _to_output_rows(model: Captioner, token_ids: torch.Tensor) -> torch.Tensor:
    rows = model.output_index[token_ids]
    if bool((rows < 0).any()):
        missing = token_ids[rows < 0].unique()[:5].tolist()
        raise ValueError(f"target token ids {missing} have no row in the model's output vocabulary; the "
                         "corpus vocabulary was built from other captions (rebuild it, or use output_vocab=full)")
    return rows
