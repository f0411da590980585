"""The unmasking sampler as it was before the strategy refactoring (issue 31), kept verbatim as a test oracle.

``tests/core/test_sampler_reference.py`` checks that :func:`mdc_core.sampler.sample` gives exactly these outputs, field
by field, for every sampler option. Not used by the package.
"""
# ruff: noqa

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from mdc_core.config import SamplerConfig
from mdc_core.sampler import inference_autocast
from mdc_core.sampler import SampleOutput
from mdc_core.tokenizer import EOT_ID, MASK_ID, SOT_ID


def canvas(batch: int, length: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(B, N'+2) fully masked canvas ``<sot> [MASK]*N' <eot>``."""
    x = torch.full((batch, length + 2), MASK_ID, dtype=torch.long, device=device)
    x[:, 0], x[:, -1] = SOT_ID, EOT_ID
    return x


def allowed_rows(model: Any) -> torch.Tensor:
    """(V_out,) bool: head rows the canvas may take (everything but ``<sot>``/``<eot>``)."""
    ids = model.output_ids
    return (ids != SOT_ID) & (ids != EOT_ID)


def _prompt_canvas(prompt: torch.Tensor, fixed: torch.Tensor | None, batch: int, model: Any,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The starting canvas (B, N+2) and fixed mask (B, N) of a prompt (N,) or (B, N) of caption ids."""
    prompt = prompt.to(device).long()
    prompt = prompt[None].expand(batch, -1) if prompt.ndim == 1 else prompt
    if prompt.ndim != 2 or prompt.shape[0] != batch or prompt.shape[1] == 0:
        raise ValueError(f"prompt of shape {tuple(prompt.shape)} does not fit {batch} images: give (N,) or (B, N)")
    fixed = (prompt != MASK_ID) if fixed is None else fixed.to(device).bool().expand_as(prompt)
    if bool((fixed & (prompt == MASK_ID)).any()):
        raise ValueError("a fixed prompt position holds [MASK]; fixed positions need real tokens")
    if bool((fixed & ((prompt == SOT_ID) | (prompt == EOT_ID))).any()):
        raise ValueError("a prompt may not fix <sot> or <eot> inside the caption")
    x = canvas(batch, prompt.shape[1], device)
    x[:, 1:-1] = torch.where(fixed, prompt, MASK_ID)
    if bool(fixed.any()) and hasattr(model, "embedding_rows"):
        model.embedding_rows(x)  # ValueError naming fixed words a corpus-restricted model cannot represent
    return x, fixed


@torch.no_grad()
def sample(model: Any, image_tokens: torch.Tensor, cfg: SamplerConfig, *, cache: Any = None,
           prompt: torch.Tensor | None = None, fixed: torch.Tensor | None = None,
           attention: bool = False, precision: str | None = None) -> SampleOutput:
    """Generate captions of ``cfg.length`` tokens for image_tokens (B, M, D) by confidence unmasking.

    Args:
        cache: the images' :meth:`Captioner.image_cache`, when the caller already has it (e.g. for several N').
        prompt: infilling: caption ids (N,) for every image or (B, N) per image, ``[MASK]`` at the slots to
            fill; N replaces ``cfg.length``. Every other position is fixed (never changed).
        fixed: (N,) or (B, N) bool, the fixed positions of `prompt` (default: its non-``[MASK]`` positions);
            positions not fixed are masked whatever `prompt` holds there.
        attention: also return the cross-attention weights of every revealed token (``step_attention``).
        precision: ``auto`` (bf16 autocast on CUDA, fp32 on the CPU), ``fp32`` or ``bf16``; None: the current
            default (:func:`mdc_core.sampler.default_inference_precision`, normally ``auto``).
    """
    cfg.validate()
    if model.causal:
        raise ValueError("this model is autoregressive (ARC); unmasking sampling needs a bidirectional model")
    B, k = image_tokens.shape[0], cfg.tokens_per_step
    device = image_tokens.device
    if prompt is None:
        x, fixed = canvas(B, cfg.length, device), torch.zeros(B, cfg.length, dtype=torch.bool, device=device)
    else:
        x, fixed = _prompt_canvas(prompt, fixed, B, model, device)
    N = x.shape[1] - 2
    if N + 2 > model.cfg.context_length:
        raise ValueError(f"caption length {N} exceeds the model's context ({model.cfg.context_length - 2} tokens)")
    free = int((~fixed).sum(dim=1).max())  # most slots any row fills
    max_steps = math.ceil(free / k) + (cfg.remask_steps if cfg.remasking else 0)
    allowed = allowed_rows(model)
    autocast = inference_autocast(precision, device)  # around each forward call
    if cache is None:
        with autocast:
            cache = model.image_cache(image_tokens)  # cross-attention keys/values, once for all steps
    gen = torch.Generator(device=device).manual_seed(cfg.seed) if cfg.temperature > 0 else None

    reveal_step = torch.full((B, N), -1, dtype=torch.long, device=device)
    reveal_conf = torch.zeros(B, N, device=device)
    S = max_steps
    top_tok, cur_tok = torch.zeros(S, B, N, dtype=torch.long, device=device), torch.zeros(S, B, N, dtype=torch.long,
                                                                                          device=device)
    top_conf, cur_conf = torch.zeros(S, B, N, device=device), torch.zeros(S, B, N, device=device)
    was_masked, revealed_at, remasked_at = (torch.zeros(S, B, N, dtype=torch.bool, device=device) for _ in range(3))
    att_steps: list[torch.Tensor | None] = [None] * S
    remask = _Remasking(cfg, fixed) if cfg.remasking else None
    steps = max_steps
    for s in range(max_steps):
        masked = x[:, 1:-1] == MASK_ID  # (B, N)
        if remask is not None:
            again = remask.pick(masked, reveal_conf, k)  # (B, N) rows with nothing masked revise their tokens
            before = x[:, 1:-1].clone()
            x[:, 1:-1] = x[:, 1:-1].masked_fill(again, MASK_ID)
            masked, remasked_at[s] = masked | again, again
        if not bool(masked.any()):  # every row finished early
            steps = s
            break
        select = F.pad(masked, (1, 1))  # (B, N+2): the output head runs at masked positions only
        att: list | None = [] if attention else None
        with autocast:
            logits = model.decode(x, None, cache=cache, select=select, attention=att) if attention else \
                model.decode(x, None, cache=cache, select=select)
        logits = logits.float().masked_fill(~allowed, float("-inf"))  # (n, V_out)
        probs = logits.softmax(dim=-1)
        conf_n, best_n = probs.max(dim=-1)  # (n,)
        cand_n = best_n if gen is None else _sample_rows(logits, cfg.temperature, cfg.top_k, gen)
        cand_conf_n = conf_n if gen is None else probs.gather(-1, cand_n[..., None])[..., 0]
        conf, best, cand, cand_conf = (torch.zeros(B, N, dtype=v.dtype, device=device).masked_scatter(masked, v)
                                       for v in (conf_n, best_n, cand_n, cand_conf_n))  # (B, N), 0 where revealed
        top_tok[s], top_conf[s], was_masked[s] = torch.where(masked, model.output_ids[best], 0), conf, masked

        reveal = _reveal_mask(cand_conf, masked, k, cfg.threshold)  # (B, N)
        new = model.output_ids[cand]  # (B, N)
        if remask is not None:
            remask.update(reveal, again, new, before)
        x[:, 1:-1] = torch.where(reveal, new, x[:, 1:-1])
        reveal_step[reveal] = s
        reveal_conf[reveal] = cand_conf[reveal]
        revealed_at[s], cur_tok[s], cur_conf[s] = reveal, torch.where(reveal, new, 0), torch.where(reveal, cand_conf, 0)
        if att is not None:
            grid = torch.stack(att, dim=1).float()  # (n, Ly, h, M) for the masked positions, in row-major order
            full = grid.new_zeros(B, N, *grid.shape[1:]).masked_scatter_(masked[..., None, None, None], grid)
            att_steps[s] = full * reveal[..., None, None, None]  # (B, N, Ly, h, M), revealed positions only

    settings = {"length": N, "tokens_per_step": k, "temperature": cfg.temperature, "top_k": cfg.top_k,
                "seed": cfg.seed, "threshold": cfg.threshold, "remask_threshold": cfg.remask_threshold,
                "remask_steps": cfg.remask_steps, "steps": steps}
    if attention:
        settings["attention_prefix_tokens"] = int(getattr(getattr(model, "encoder", None), "num_prefix_tokens", 0))
    step_attention = torch.stack(att_steps[:steps]) if attention and steps else None
    return SampleOutput(x[:, 1:-1].clone(), reveal_step, reveal_conf, top_tok[:steps], top_conf[:steps],
                        was_masked[:steps], settings, fixed, revealed_at[:steps], cur_tok[:steps], cur_conf[:steps],
                        remasked_at[:steps], step_attention)


class _Remasking:
    """Per-row bookkeeping of the revisable-token loop (see the module docstring)."""

    def __init__(self, cfg: SamplerConfig, fixed: torch.Tensor) -> None:
        self.threshold, self.budget = cfg.remask_threshold, cfg.remask_steps
        self.fixed = fixed  # (B, N)
        self.used = torch.zeros(fixed.shape[0], dtype=torch.long, device=fixed.device)  # (B,) extra steps taken
        self.checked = torch.zeros_like(fixed)  # (B, N) re-predicted from the present context, came back unchanged
        self.previous: torch.Tensor | None = None

    def pick(self, masked: torch.Tensor, conf: torch.Tensor, k: int) -> torch.Tensor:
        """(B, N) bool: the tokens to mask again this step, in rows that have no mask left and budget to spend."""
        rows = ~masked.any(dim=1) & (self.used < self.budget)  # (B,)
        cand = rows[:, None] & ~self.fixed & ~masked & (conf < self.threshold) & ~self.checked  # (B, N)
        score = conf.masked_fill(~cand, float("inf"))
        low = (-score).topk(min(k, score.shape[1]), dim=-1).indices  # (B, k) least confident first
        again = torch.zeros_like(cand).scatter_(1, low, True) & cand
        self.used += again.any(dim=1).long()
        return again

    def update(self, reveal: torch.Tensor, again: torch.Tensor, new: torch.Tensor, before: torch.Tensor) -> None:
        """After a step (all (B, N); `before`: the tokens before remasking): re-predicted tokens are checked; in a
        row where one of them changed, the context of the others changed, so they may be revised again."""
        redone = again & reveal
        changed = (redone & (new != before)).any(dim=1, keepdim=True)  # (B, 1)
        self.checked = (self.checked & ~changed) | redone


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
