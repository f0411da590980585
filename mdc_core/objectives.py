"""Training objectives: MDC (paper Alg. 1 / Eq. 5) and its baselines, chosen from one table.

Everything here except :func:`compute_loss` is a pure function of tensors, tested against hand-computed values.
Caption tokens are ``<sot> c_0 .. c_{N-1} <eot> pad ...``; only the ``c_i`` are *maskable* (``<sot>``, ``<eot>``
and pads are never masked and never in the loss), so the sampling canvas ``<sot> [MASK]*N' <eot>`` is
in-distribution (docs/design.md "Decisions").

MDC loss, per-token normalisation (default)::

    L = sum_b w_b * sum_{i masked in b} CE_bi  /  sum_b n_b        w_b = 1/t_b (mdc) or 1 (others)

where n_b is the number of maskable tokens of caption b. Each token is masked with probability t_b, so the 1/t_b
weight makes up for the fraction of tokens in the sum: MDLM's NELBO estimator for the linear schedule
alpha_t = 1 - t (the draw of t, the masking rate and w_b are the objective's schedule's: :mod:`mdc_core.registry`).
Given t the expected loss is the mean per-token cross-entropy at that noise level, which still rises with t for a
model that reads the unmasked words (notebook 00 plots it). ``per_sequence`` instead averages
``w_b * sum_i CE_bi / n_b`` over captions (CapPa-style).

Without the weight there are two losses (docs/design.md "The method in one page"): ``mdc_no_t`` (Eq. 5 with
``w_b = 1``) per *caption* token, ``sum_b sum_i CE_bi / sum_b n_b``, and ``cmlm`` (Alg. 1 without ``1/t``, Eq. 1,
CMLM; the paper's Table 4 row "MDC (w/o t)") per *masked* token, ``sum_b sum_i CE_bi / sum_b m_b`` (the row's
``per_masked_token``). Per batch they differ by ``sum_b n_b / sum_b m_b`` (about ``1 / E[t]``).

Host and device: everything data-dependent about a batch (trimming, the masking draws, the loss positions and their
target rows, the embedding rows and the id checks) is decided by :func:`prepare_batch`, a pure function of the
token ids that the trainer runs on the host (:class:`PreparedBatch`), so the device step never waits for a sync.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F

from .config import ObjectiveConfig
from .model import Captioner
from .registry import ObjectiveSpec, condition_transforms, objective_spec
from .tokenizer import EOT_ID, MASK_ID, PAD_ID, SOT_ID, lookup_rows, padding_mask, unknown_ids


@dataclass
class LossOutput:
    loss: torch.Tensor  # scalar to backpropagate
    metrics: dict[str, torch.Tensor]  # detached scalars (no host sync until the trainer logs them)


@dataclass
class PreparedBatch:
    """The data-dependent part of a batch's loss, decided before the forward pass by :func:`prepare_batch`.

    ``inputs`` is what the decoder reads: the noisy captions (masked objectives), the captions without their last
    column (ARC, teacher forcing) or the captions (CLIP). The n loss terms sit at the True positions of
    ``loss_mask``, in row-major order, which ``index`` holds as flat positions; B captions, L tokens, L_in inputs."""

    tokens: torch.Tensor  # (B, L) the captions, all-padding columns trimmed
    inputs: torch.Tensor  # (B, L_in) decoder (or CLIP text tower) input ids
    rows: torch.Tensor | None = None  # (B, L_in) their embedding rows (corpus-restricted tables); None: the ids
    loss_mask: torch.Tensor | None = None  # (B, L_in) bool: positions with a loss term (captioners)
    index: torch.Tensor | None = None  # (n,) their flat positions b * L_in + i
    owner: torch.Tensor | None = None  # (n,) their caption b
    targets: torch.Tensor | None = None  # (n,) output-head row of each target token
    t: torch.Tensor | None = None  # (B,) time of each caption's noise (for the linear schedule its masking rate)
    valid: torch.Tensor | None = None  # (n,) bool: False at loss terms that only pad to a static count; None: all real

    def to(self, device: torch.device | str, non_blocking: bool = True) -> PreparedBatch:
        """A copy on `device` (asynchronous from the host by default: nothing here is read back)."""
        return PreparedBatch(**{f.name: None if getattr(self, f.name) is None else
                                getattr(self, f.name).to(device, non_blocking=non_blocking) for f in fields(self)})


# -- pure tensor functions ---------------------------------------------------------------------------------------------


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


TERM_BUCKETS = 8  # static_shapes="padded": loss terms padded up to a multiple of 1/8 of the batch's positions


def bucket_length(length: int, bucket: int, limit: int) -> int:
    """The smallest multiple of `bucket` that holds `length` tokens, at most `limit` (the context length)."""
    return min(limit, -(-length // bucket) * bucket)


def term_capacity(n: int, positions: int, static: str) -> int:
    """How many loss terms a static-shape batch computes for `n` real ones among `positions` (B x L_in) decoder
    positions: all positions (``dense``), or `n` rounded up to a multiple of ``positions / TERM_BUCKETS``
    (``padded``: at most :data:`TERM_BUCKETS` shapes per caption length)."""
    if static == "dense":
        return positions
    if static != "padded":
        raise ValueError(f"unknown static_shapes {static!r}; use off, padded or dense")
    step = -(-positions // TERM_BUCKETS)
    return min(positions, -(-max(n, 1) // step) * step)


def _pad_columns(x: torch.Tensor, width: int, value: int | bool) -> torch.Tensor:
    """x (B, L) padded on the right with `value` to (B, width), contiguous (a compiled step guards on strides)."""
    return x.contiguous() if x.shape[1] >= width else F.pad(x, (0, width - x.shape[1]), value=value)


def apply_mask(tokens: torch.Tensor, t: torch.Tensor, *, generator: torch.Generator | None = None,
               min_one: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask each maskable token of caption b independently with probability t_b (Alg. 1: ``p < t``).

    tokens (B, L), t (B,). Returns (noisy tokens (B, L) with ``[MASK]`` at masked positions, mask (B, L)).
    With `min_one`, a caption that drew no masked token gets one, chosen uniformly among its maskable tokens."""
    maskable = maskable_positions(tokens)
    p = torch.rand(tokens.shape, generator=generator, device=tokens.device)
    mask = (p < t[:, None]) & maskable
    if min_one:
        need = (mask.sum(dim=1) == 0) & maskable.any(dim=1)
        scores = torch.rand(tokens.shape, generator=generator, device=tokens.device).masked_fill(~maskable, -1.0)
        pick = F.one_hot(scores.argmax(dim=1), tokens.shape[1]).bool()  # (B, L) one random maskable slot
        mask = mask | (pick & need[:, None])
    return tokens.masked_fill(mask, MASK_ID), mask


def normalized_token_loss(ce: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor, n_valid: torch.Tensor,
                          normalization: str = "per_token", owner: torch.Tensor | None = None) -> torch.Tensor:
    """Weighted cross-entropy of the loss positions, normalised as described in the module docstring: the masked
    tokens of the masked objectives, every next token of ARC (weight 1).

    ce: (n,) cross-entropy at the loss positions in row-major order of `mask` (B, L);
    weight: (B,) per-caption weight (1/t or 1); n_valid: (B,) what each caption's loss is divided by (the tokens
    that may carry a loss term, or the masked ones for a per-masked-token loss);
    owner: (n,) the caption of each masked position when known (else found from `mask`, a sync on CUDA)."""
    row = mask.nonzero()[:, 0] if owner is None else owner  # (n,) caption index of each masked token
    per_caption = torch.zeros(mask.shape[0], dtype=ce.dtype, device=ce.device).index_add_(0, row, ce)  # (B,)
    per_caption = per_caption * weight
    if normalization == "per_token":
        return per_caption.sum() / n_valid.sum().clamp(min=1)
    if normalization == "per_sequence":
        keep = n_valid > 0  # captions without a maskable token add nothing and are not counted
        return torch.where(keep, per_caption / n_valid.clamp(min=1), 0.0).sum() / keep.sum().clamp(min=1)
    raise ValueError(f"unknown normalization {normalization!r}; use per_token or per_sequence")


def draw_masks(tokens: torch.Tensor, cfg: ObjectiveConfig, generator: torch.Generator | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The masking draws of trimmed captions `tokens` (B, L): (t (B,), noisy tokens (B, L), mask (B, L)), in the
    order :func:`prepare_batch` makes them, so a generator seeded alike gives the trainer the same masks. t is the
    objective's schedule's draw; each token is masked with probability ``schedule.mask_rate(t)``."""
    schedule = objective_spec(cfg.name).schedule
    if schedule is None or not schedule.masks:
        raise ValueError(f"objective {cfg.name!r} does not mask tokens")
    t = schedule.draw(cfg, tokens.shape[0], generator, tokens.device)  # (B,)
    inputs, mask = apply_mask(tokens, schedule.mask_rate(t), generator=generator, min_one=cfg.min_one_masked)
    return t, inputs, mask


def loss_terms(spec: ObjectiveSpec, tokens: torch.Tensor, normalization: str, mask: torch.Tensor | None = None
               ) -> int:
    """What the loss of a micro-batch `tokens` (B, L) under objective row `spec` is divided by: its loss-carrying
    positions (``per_token``: caption tokens + ``<eot>`` under teacher forcing, the masked tokens `mask` (B, L') of
    a ``per_masked_token`` objective, else the maskable positions) or its captions with any (``per_sequence``);
    the batch size for a contrastive objective."""
    if spec.schedule is None:
        return tokens.shape[0]  # contrastive: a mean over the batch
    if not spec.schedule.masks:  # next-token targets: every token after <sot> that is not padding
        valid = ~padding_mask(tokens)[:, 1:]  # (B, L - 1)
    elif spec.per_masked_token:  # the draws decide it: the caller passes them
        if mask is None:
            raise ValueError("this objective divides its loss by the masked tokens: pass the batch's mask")
        valid = mask
    else:
        valid = maskable_positions(tokens)  # (B, L)
    per_caption = valid.sum(dim=1)  # (B,)
    return int(per_caption.sum()) if normalization == "per_token" else int((per_caption > 0).sum())


def id_tables(model: Any) -> dict[str, torch.Tensor | None]:
    """The id tables :func:`prepare_batch` needs from `model`: ``input_index`` (a corpus-restricted embedding,
    and CLIP's) and ``output_index`` (captioners). The trainer keeps host copies of them."""
    return {"input_index": getattr(model, "input_index", None), "output_index": getattr(model, "output_index", None)}


def prepare_batch(tokens: torch.Tensor, cfg: ObjectiveConfig, generator: torch.Generator | None = None, *,
                  input_index: torch.Tensor | None = None, output_index: torch.Tensor | None = None,
                  static: str = "off", length_bucket: int = 8) -> PreparedBatch:
    """Everything data-dependent about the loss of captions `tokens` (B, L) (see :class:`PreparedBatch`): trim,
    draw the masks (`generator`, on the tokens' device), find the loss positions and their target rows, look up
    and check the embedding rows. `input_index`/`output_index` (:func:`id_tables`) must be on the tokens' device;
    a corpus-restricted model needs `input_index`, a captioner `output_index`. ValueError for ids outside them.

    `static` (``train.static_shapes``) gives the batch shapes that do not change from step to step, so that a
    compiled step never recompiles and CUDA graphs can replay it: the captions are trimmed to a multiple of
    `length_bucket` tokens instead of their longest caption (pads are invisible to attention and never in the
    loss), and the loss terms are padded to :func:`term_capacity` entries that carry no loss (``valid`` False).
    The masks are drawn on the trimmed captions before padding, so the draws, and the loss up to summation
    order, are those of ``static="off"``."""
    spec = objective_spec(cfg.name)
    if not spec.prepared:
        raise ValueError(f"objective {cfg.name!r} draws its noise inside its own loss; it takes no prepared batch")
    context = tokens.shape[1]
    tokens = trim_padding(tokens)
    width = tokens.shape[1] if static == "off" else bucket_length(tokens.shape[1], length_bucket, context)
    if spec.model != "captioner":  # the contrastive objective reads whole captions
        if not bool((tokens == EOT_ID).any(dim=1).all()):
            raise ValueError("every token row needs an <eot> token: its feature is the text embedding")
        tokens = _pad_columns(tokens, width, PAD_ID)
        return PreparedBatch(tokens, tokens, None if input_index is None else lookup_rows(input_index, tokens))
    if output_index is None:
        raise ValueError("prepare_batch for a captioner needs its output_index (see id_tables)")
    if spec.schedule.masks:
        t, inputs, loss_mask = draw_masks(tokens, cfg, generator)
        tokens, inputs = _pad_columns(tokens, width, PAD_ID), _pad_columns(inputs, width, PAD_ID)
        loss_mask = _pad_columns(loss_mask, width, False)
        target_ids = tokens[loss_mask]  # (n,)
    else:  # teacher forcing: predict token i+1 from tokens <= i
        tokens = _pad_columns(tokens, width, PAD_ID)
        inputs, loss_mask = tokens[:, :-1], ~padding_mask(tokens)[:, 1:]  # (B, L-1) caption tokens and <eot>
        t = spec.schedule.draw(cfg, tokens.shape[0], generator, tokens.device)  # ones: nothing is drawn
        target_ids = tokens[:, 1:][loss_mask]  # (n,)
    missing = unknown_ids(output_index, target_ids)
    if missing:
        raise ValueError(f"target token ids {missing[:5]} have no row in the model's output vocabulary; the "
                         "corpus vocabulary was built from other captions (rebuild it, or use output_vocab=full)")
    index = loss_mask.flatten().nonzero()[:, 0]  # (n,) row-major, as loss_mask's True positions
    targets, valid = output_index[target_ids], None  # (n,) output-head rows
    if static != "off":
        positions = loss_mask.numel()
        capacity = term_capacity(len(index), positions, static)
        if static == "dense":  # every position, in row-major order; the loss positions keep their targets
            targets = torch.zeros(positions, dtype=torch.long, device=tokens.device).index_put_((index,), targets)
            index, valid = torch.arange(positions, device=tokens.device), loss_mask.flatten()
        else:  # the n terms first, then terms at position 0 with target row 0 that carry no loss
            valid = torch.arange(capacity, device=tokens.device) < len(index)
            index, targets = (F.pad(x, (0, capacity - len(x))) for x in (index, targets))
    rows = None if input_index is None else lookup_rows(input_index, inputs)
    return PreparedBatch(tokens, inputs, rows, loss_mask, index, index // loss_mask.shape[1], targets, t, valid)


# -- the loss of a batch -----------------------------------------------------------------------------------------------


def loss_function(spec: ObjectiveSpec) -> Callable[..., LossOutput]:
    """The batch loss of objective row `spec`: its own (a plug-in's), else its family's (:data:`LOSSES`)."""
    return spec.loss or LOSSES[spec.family]


def compute_loss(model: Captioner, images: torch.Tensor, tokens: torch.Tensor, cfg: ObjectiveConfig,
                 generator: torch.Generator | None = None, prepared: PreparedBatch | None = None) -> LossOutput:
    """Loss of one batch: images (B, 3, H, W), tokens (B, L) from :class:`CaptionTokenizer`, by the objective's
    :func:`loss_function`. `prepared`: the batch's :func:`prepare_batch` on this device (then `tokens` are its
    trimmed tokens and `generator` only serves draws the loss makes itself, such as a condition transform's);
    None prepares it here from `generator`."""
    fn = loss_function(objective_spec(cfg.name))
    if prepared is None:
        return fn(model, images, trim_padding(tokens), cfg, generator)
    return fn(model, images, tokens, cfg, generator, prepared=prepared)


def _prepare_for(model: Any, tokens: torch.Tensor, cfg: ObjectiveConfig, generator: torch.Generator | None,
                 prepared: PreparedBatch | None) -> PreparedBatch:
    """`prepared`, or the batch prepared on the tokens' device (the draws after any the loss made before)."""
    return prepared if prepared is not None else prepare_batch(tokens, cfg, generator, **id_tables(model))


def encode_condition(model: Captioner, images: torch.Tensor, cfg: ObjectiveConfig,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """Image tokens (B, M, D) the decoder cross-attends to, passed through the plug-ins' condition transforms
    (:func:`mdc_core.registry.register_condition_transform`; each leaves them unchanged unless `cfg` asks)."""
    image_tokens = model.encode_image(images)  # (B, M, D)
    for transform in condition_transforms():
        image_tokens = transform(model, image_tokens, cfg, generator)
    return image_tokens


def clip_loss(model: Any, images: torch.Tensor, tokens: torch.Tensor, cfg: ObjectiveConfig,
              generator: torch.Generator | None = None, prepared: PreparedBatch | None = None) -> LossOutput:
    """Symmetric InfoNCE of a batch (open_clip's ClipLoss) of a :class:`~mdc_core.factory.CLIPModel`: images
    (B, 3, H, W), tokens (B, L); no token masking.

    Under torch.distributed the features of all ranks are gathered (with gradients; each rank scores its own
    rows against all, open_clip's ``local_loss``), so the negatives are the global batch as in CLIP.
    ``acc_retrieval`` is the in-batch retrieval accuracy (mean of image->text and text->image top-1). `prepared`
    holds the tokens' embedding rows, checked on the host (see ``CLIPModel.encode_text``)."""
    rows = None if prepared is None else prepared.rows
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
    return LossOutput(loss, metrics)


def _term_ce(logits: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """(n,) cross-entropy of each loss term in fp32; 0 at the terms that only pad a static shape."""
    ce = F.cross_entropy(logits.float(), targets, reduction="none")
    return ce if valid is None else torch.where(valid, ce, 0.0)


def _term_hits(logits: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """(n,) 1.0 where the argmax is the target, at real loss terms only."""
    hits = logits.detach().argmax(-1) == targets
    return (hits if valid is None else hits & valid).float()


def masked_token_loss(model: Captioner, images: torch.Tensor, tokens: torch.Tensor, cfg: ObjectiveConfig,
                      generator: torch.Generator | None = None, prepared: PreparedBatch | None = None) -> LossOutput:
    """MDC and its masked baselines (mdc_no_t, cmlm, bert, parallel): mask each caption token with the rate of the
    objective's schedule, predict the masked tokens, weight each caption's loss by the schedule's weight (1/t for
    mdc), divide by the caption tokens or, for a ``per_masked_token`` row (cmlm), the masked ones (module
    docstring)."""
    spec = objective_spec(cfg.name)
    image_tokens = encode_condition(model, images, cfg, generator)
    p = _prepare_for(model, tokens, cfg, generator, prepared)
    t, mask, targets = p.t, p.loss_mask, p.targets  # (B,), (B, L), (n,)
    logits = model.decode(p.inputs, image_tokens, select=p.index, causal=False, rows=p.rows)  # (n, V_out) masked only
    ce = _term_ce(logits, targets, p.valid)  # (n,)
    weight = spec.schedule.weight(t)  # (B,)
    n_valid = maskable_positions(p.tokens).sum(dim=1)  # (B,)
    n_loss = mask.sum(dim=1) if spec.per_masked_token else n_valid  # (B,) what each caption's loss is divided by
    loss = normalized_token_loss(ce, mask, weight, n_loss, cfg.normalization, owner=p.owner)
    n_masked = mask.sum()
    metrics = {
        "loss": loss.detach(),
        "ce_masked": (ce.detach().sum() / n_masked.clamp(min=1)),
        "acc_masked": (_term_hits(logits, targets, p.valid).sum() / n_masked.clamp(min=1)),
        "masked_frac": n_masked / n_valid.sum().clamp(min=1),
        "t_mean": t.mean(),
    }
    return LossOutput(loss, metrics)


def autoregressive_loss(model: Captioner, images: torch.Tensor, tokens: torch.Tensor, cfg: ObjectiveConfig,
                        generator: torch.Generator | None = None, prepared: PreparedBatch | None = None) -> LossOutput:
    """Teacher forcing: predict token i+1 from tokens <= i; targets are the caption tokens and ``<eot>``."""
    image_tokens = encode_condition(model, images, cfg, generator)
    p = _prepare_for(model, tokens, cfg, generator, prepared)
    valid, target_rows = p.loss_mask, p.targets  # (B, L-1) caption tokens and <eot>; (n,)
    logits = model.decode(p.inputs, image_tokens, select=p.index, causal=True, rows=p.rows)  # (n, V_out)
    ce = _term_ce(logits, target_rows, p.valid)  # (n,)
    n_valid = valid.sum(dim=1)
    loss = normalized_token_loss(ce, valid, torch.ones(p.tokens.shape[0], device=ce.device), n_valid,
                                 cfg.normalization, owner=p.owner)
    n_terms = n_valid.sum().clamp(min=1)
    metrics = {
        "loss": loss.detach(),
        "ce_masked": ce.detach().sum() / n_terms,
        "acc_next": _term_hits(logits, target_rows, p.valid).sum() / n_terms,
        "masked_frac": torch.ones((), device=ce.device),
        "t_mean": torch.ones((), device=ce.device),
    }
    return LossOutput(loss, metrics)


# the loss of each family, the default of a row that names none (ObjectiveSpec.loss)
LOSSES: dict[str, Callable[..., LossOutput]] = {"masked": masked_token_loss, "causal": autoregressive_loss,
                                                "contrastive": clip_loss}
