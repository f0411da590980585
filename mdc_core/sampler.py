"""Confidence-ordered unmasking sampler (paper Eq. 6) with its full trajectory.

Start from the canvas ``<sot> [MASK]*N' <eot>``. At every step the decoder predicts all positions; each
still-masked position's confidence is the highest probability it assigns to any allowed token, and the
k most confident masked positions are revealed with their argmax tokens (k = 1 in the paper, so N' steps).
Revealed tokens never change. ``<sot>``/``<eot>`` are excluded from the canvas vocabulary (and ``[MASK]``
has no output row), so the caption is always N' real tokens. Confidences are probabilities under the
softmax over the allowed tokens.

Options: ``tokens_per_step`` (k), ``temperature`` > 0 with ``top_k`` to sample the candidate token instead of
taking the argmax (its confidence is still its untempered probability), ``seed`` for that sampling, and
``threshold`` > 0 for Fast-dLLM's parallel decoding: each step also reveals every other masked position whose
confidence is >= threshold, so the number of steps depends on the data (at most ceil(N'/k)).

The image cross-attention keys/values are computed once per batch (:meth:`Captioner.image_cache`) and
reused by every step; the result equals the uncached computation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from .config import SamplerConfig
from .model import Captioner
from .tokenizer import EOT_ID, MASK_ID, SOT_ID, CaptionTokenizer


@dataclass
class SampleOutput:
    """Batched result of :func:`sample`. S = number of steps the batch took (with a threshold, rows may finish
    earlier: after its last step a row has no masked position, see :attr:`row_steps`), N = caption length N'."""

    tokens: torch.Tensor  # (B, N) final caption ids
    reveal_step: torch.Tensor  # (B, N) step at which each position was revealed
    reveal_confidence: torch.Tensor  # (B, N) its confidence when revealed
    step_top_token: torch.Tensor  # (S, B, N) per step, each still-masked position's top-1 token (0 elsewhere)
    step_top_confidence: torch.Tensor  # (S, B, N) and its confidence (0 elsewhere)
    step_masked: torch.Tensor  # (S, B, N) bool: position still masked at the start of the step
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def num_steps(self) -> int:
        return self.step_masked.shape[0]

    @property
    def row_steps(self) -> torch.Tensor:
        """(B,) steps each caption took (its last reveal step + 1)."""
        return self.reveal_step.max(dim=1).values + 1


def canvas(batch: int, length: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(B, N'+2) fully masked canvas ``<sot> [MASK]*N' <eot>``."""
    x = torch.full((batch, length + 2), MASK_ID, dtype=torch.long, device=device)
    x[:, 0], x[:, -1] = SOT_ID, EOT_ID
    return x


def allowed_rows(model: Captioner) -> torch.Tensor:
    """(V_out,) bool: head rows the canvas may take (everything but ``<sot>``/``<eot>``)."""
    ids = model.output_ids
    return (ids != SOT_ID) & (ids != EOT_ID)


@torch.no_grad()
def sample(model: Captioner, image_tokens: torch.Tensor, cfg: SamplerConfig, *, cache: Any = None) -> SampleOutput:
    """Generate captions of ``cfg.length`` tokens for image_tokens (B, M, D) by confidence unmasking.

    `cache`: the images' :meth:`Captioner.image_cache`, when the caller already has it (e.g. for several N')."""
    cfg.validate()
    if model.causal:
        raise ValueError("this model is autoregressive (ARC); unmasking sampling needs a bidirectional model")
    B, N, k = image_tokens.shape[0], cfg.length, cfg.tokens_per_step
    if N + 2 > model.cfg.context_length:
        raise ValueError(f"caption length {N} exceeds the model's context ({model.cfg.context_length - 2} tokens)")
    device = image_tokens.device
    max_steps = math.ceil(N / k)
    x = canvas(B, N, device)
    allowed = allowed_rows(model)
    if cache is None:
        cache = model.image_cache(image_tokens)  # cross-attention keys/values, once for all steps
    gen = torch.Generator(device=device).manual_seed(cfg.seed) if cfg.temperature > 0 else None

    reveal_step = torch.full((B, N), -1, dtype=torch.long, device=device)
    reveal_conf = torch.zeros(B, N, device=device)
    top_tok = torch.zeros(max_steps, B, N, dtype=torch.long, device=device)
    top_conf = torch.zeros(max_steps, B, N, device=device)
    was_masked = torch.zeros(max_steps, B, N, dtype=torch.bool, device=device)
    steps = max_steps
    for s in range(max_steps):
        masked = x[:, 1:-1] == MASK_ID  # (B, N)
        if cfg.threshold > 0 and not bool(masked.any()):  # every row finished early
            steps = s
            break
        select = F.pad(masked, (1, 1))  # (B, N+2): the output head runs at masked positions only
        logits = model.decode(x, None, cache=cache, select=select).float()  # (n, V_out)
        logits = logits.masked_fill(~allowed, float("-inf"))
        probs = logits.softmax(dim=-1)
        conf_n, best_n = probs.max(dim=-1)  # (n,)
        cand_n = best_n if gen is None else _sample_rows(logits, cfg.temperature, cfg.top_k, gen)
        cand_conf_n = conf_n if gen is None else probs.gather(-1, cand_n[..., None])[..., 0]
        conf, best, cand, cand_conf = (torch.zeros(B, N, dtype=v.dtype, device=device).masked_scatter(masked, v)
                                       for v in (conf_n, best_n, cand_n, cand_conf_n))  # (B, N), 0 where revealed
        top_tok[s], top_conf[s], was_masked[s] = torch.where(masked, model.output_ids[best], 0), conf, masked

        reveal = _reveal_mask(cand_conf, masked, k, cfg.threshold)  # (B, N)
        x[:, 1:-1] = torch.where(reveal, model.output_ids[cand], x[:, 1:-1])
        reveal_step[reveal] = s
        reveal_conf[reveal] = cand_conf[reveal]

    settings = {"length": N, "tokens_per_step": k, "temperature": cfg.temperature, "top_k": cfg.top_k,
                "seed": cfg.seed, "threshold": cfg.threshold, "steps": steps}
    return SampleOutput(x[:, 1:-1].clone(), reveal_step, reveal_conf, top_tok[:steps], top_conf[:steps],
                        was_masked[:steps], settings)


def _reveal_mask(conf: torch.Tensor, masked: torch.Tensor, k: int, threshold: float) -> torch.Tensor:
    """(B, N) bool: the k most confident masked positions of each row (fewer if fewer are masked), plus,
    with threshold > 0, every masked position whose confidence is >= threshold. conf, masked: (B, N)."""
    score = conf.masked_fill(~masked, float("-inf"))
    top = score.topk(min(k, score.shape[1]), dim=-1).indices  # (B, k) most confident first
    reveal = torch.zeros_like(masked).scatter_(1, top, True) & masked
    if threshold > 0:
        reveal |= masked & (conf >= threshold)
    return reveal


def _sample_rows(logits: torch.Tensor, temperature: float, top_k: int, gen: torch.Generator) -> torch.Tensor:
    """Draw one head row per position from softmax(logits / T), optionally among the top_k. (..., V) -> (...)."""
    scaled = logits / temperature
    if top_k > 0:
        kth = scaled.topk(min(top_k, scaled.shape[-1]), dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    flat = scaled.softmax(dim=-1).reshape(-1, scaled.shape[-1])
    return torch.multinomial(flat, 1, generator=gen).view(logits.shape[:-1])


def trajectory(out: SampleOutput, tokenizer: CaptionTokenizer, index: int = 0) -> dict[str, Any]:
    """JSON-ready record of caption `index`: text, tokens, and one entry per step.

    Each step lists every token it revealed (``revealed``, most confident first) and every position that
    was still masked when it began with the model's top guess there (``masked``); ``position``, ``token``
    and ``confidence`` repeat the step's most confident reveal (the only one when k = 1). Positions count
    caption tokens from 0 (``<sot>`` excluded). Only the steps this caption took are listed (with a
    threshold, other captions of the batch may have needed more).
    """
    ids = out.tokens[index].tolist()
    steps = []
    for s in range(int(out.row_steps[index])):
        revealed_pos = (out.reveal_step[index] == s).nonzero()[:, 0].tolist()
        revealed = sorted(
            ({"position": p, "token": tokenizer.token_string(ids[p]), "token_id": ids[p],
              "confidence": float(out.reveal_confidence[index, p])} for p in revealed_pos),
            key=lambda r: -r["confidence"],
        )
        masked = [
            {"position": p, "top_token": tokenizer.token_string(int(out.step_top_token[s, index, p])),
             "top_token_id": int(out.step_top_token[s, index, p]),
             "top_confidence": float(out.step_top_confidence[s, index, p])}
            for p in out.step_masked[s, index].nonzero()[:, 0].tolist()
        ]
        first = revealed[0]
        steps.append({"step": s, "position": first["position"], "token": first["token"],
                      "confidence": first["confidence"], "revealed": revealed, "masked": masked})
    return {
        "caption": tokenizer.decode(ids),
        "tokens": [tokenizer.token_string(i) for i in ids],
        "token_ids": ids,
        "steps": steps,
        "settings": dict(out.settings),
    }
