"""Caption strings in, JSON records out: what ``mdc score`` prints and the app's score tab and notebook 05 show.

The likelihoods themselves are :func:`mdc_core.scoring.score_tokens`' (token rows in, tensors out, conditional on
fixed positions for infilling); here caption strings and infilling prompts (:func:`mdc_core.tokenizer.parse_prompt`)
become token rows, and the scores become one dict per caption or filling.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mdc_core.objectives import maskable_positions
from mdc_core.scoring import model_kind, score_tokens
from mdc_core.tokenizer import EOT_ID, MASK_ID, SOT_ID, CaptionTokenizer, parse_prompt, shown, word_list


def score_captions(model: Any, image_tokens: torch.Tensor, captions: Sequence[str], method: str,
                   **kw: Any) -> list[dict[str, Any]]:
    """Score caption strings against one image, image_tokens (1, M, D) or (M, D); `kw` as
    :func:`~mdc_core.scoring.score_tokens`.

    One dict per caption: ``caption``, ``score``, ``tokens`` (token strings), ``token_logprobs`` (one per token,
    heuristic/ar), ``stderr`` (mc), ``order`` (reveal step per token, heuristic), ``eot_logprob`` (ARC ar)."""
    model_kind(model)
    captions = list(captions)
    if not captions:
        raise ValueError("no captions to score (the caption list is empty)")
    if image_tokens.ndim == 2:
        image_tokens = image_tokens[None]
    if image_tokens.ndim != 3 or image_tokens.shape[0] != 1:
        raise ValueError(f"score_captions takes one image, got image_tokens of shape {tuple(image_tokens.shape)}")
    tok = CaptionTokenizer(model.cfg.context_length)
    tokens = tok(captions, truncate=False)  # over-long captions raise ValueError
    out = score_tokens(model, image_tokens, tokens, method, **kw)
    records = []
    for i, text in enumerate(captions):
        n = int(maskable_positions(tokens[i: i + 1]).sum())
        ids = tokens[i, 1:n + 1].tolist()
        rec: dict[str, Any] = {"caption": text, "score": float(out.score[i]),
                               "tokens": [tok.token_string(t) for t in ids]}
        if out.stderr is not None:
            rec["stderr"] = float(out.stderr[i])
        if out.token_logprobs is not None:
            rec["token_logprobs"] = out.token_logprobs[i, 1:n + 1].tolist()
            if method == "ar" and model.causal:
                rec["eot_logprob"] = float(out.token_logprobs[i, n + 1])
        if out.order is not None and method == "heuristic":
            rec["order"] = out.order[i, 1:n + 1].tolist()
        records.append(rec)
    return records


@torch.no_grad()
def score_fills(model: Any, image_tokens: torch.Tensor, prompt: str, fills: Sequence[str], method: str = "heuristic",
                **kw: Any) -> list[dict[str, Any]]:
    """Rank fillings of a prompt's slots for one image (image_tokens (1, M, D) or (M, D)).

    Each filling is scored by the conditional log-likelihood of its slot tokens given the fixed words and the
    image (`method` and `kw` as :func:`~mdc_core.scoring.score_tokens`: ``heuristic``, ``mc`` or ``ar``). Returns
    one dict per filling, best first: ``fill``, ``caption``, ``score``, ``slot_tokens``, ``stderr`` (mc),
    ``slot_logprobs`` (heuristic, ar)."""
    fills = [f for f in fills if f.strip()]
    if not fills:
        raise ValueError("no fillings to score: give at least one word for the slots")
    tokenizer = CaptionTokenizer(model.cfg.context_length)
    ids, _ = parse_prompt(prompt, tokenizer, model)
    rows = torch.stack([fill_prompt(ids, f, tokenizer) for f in fills])  # (F, N)
    if getattr(model, "restricted", False):
        wanted = {int(t) for t in rows.flatten() if int(model.output_index[t]) < 0}
        unknown = sorted({w for row in rows for w in tokenizer.words_with(row, wanted)})
        if unknown:
            raise ValueError(f"the fillings use words this model never saw in training: {word_list(unknown)}")
    F, N = rows.shape
    tokens = torch.cat([torch.full((F, 1), SOT_ID), rows, torch.full((F, 1), EOT_ID)], dim=1)  # (F, N+2)
    fixed = torch.zeros_like(tokens, dtype=torch.bool)
    fixed[:, 1:-1] = ids != MASK_ID
    image_tokens = image_tokens[None] if image_tokens.ndim == 2 else image_tokens
    out = score_tokens(model, image_tokens, tokens.to(image_tokens.device), method, fixed=fixed.to(image_tokens.device),
                       **kw)
    slots = (ids == MASK_ID).nonzero()[:, 0] + 1  # token columns of the slots
    records = []
    for i, fill in enumerate(fills):
        rec: dict[str, Any] = {"fill": fill, "caption": tokenizer.decode(rows[i]), "score": float(out.score[i]),
                               "slot_tokens": [tokenizer.token_string(int(t)) for t in tokens[i, slots]]}
        if out.stderr is not None:
            rec["stderr"] = float(out.stderr[i])
        if out.token_logprobs is not None:
            rec["slot_logprobs"] = out.token_logprobs[i, slots].tolist()
        records.append(rec)
    return sorted(records, key=lambda r: -r["score"])


def prompt_text(prompt: torch.Tensor, tokenizer: CaptionTokenizer) -> str:
    """The prompt (N,) written back as text, ``_`` for each slot."""
    words = [("_ " if int(t) == MASK_ID else tokenizer.token_string(int(t), keep_space=True)) for t in prompt]
    return "".join(words).strip()


def fill_prompt(prompt: torch.Tensor, fill: str, tokenizer: CaptionTokenizer) -> torch.Tensor:
    """The prompt (N,) with its slots replaced, in order, by the tokens of `fill` (as many as there are slots)."""
    slots = prompt == MASK_ID
    ids = tokenizer.encode_text(fill)
    if len(ids) != int(slots.sum()):
        raise ValueError(f"the filling {shown(fill)} has {len(ids)} token(s) but the prompt has {int(slots.sum())} "
                         "slot(s); give one word piece per [MASK]")
    out = prompt.clone()
    out[slots] = torch.tensor(ids, dtype=torch.long)
    return out
