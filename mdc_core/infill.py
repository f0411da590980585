"""Infilling prompts: captions with some words fixed and ``[MASK]`` (or ``_``) slots for the model to fill.

``"a [MASK] square on the _"`` is tokenised in place: each stretch of text between slots with the caption
tokenizer (CLIP's BPE splits at word boundaries, so this equals tokenising the words in the full caption), each
slot one ``[MASK]`` token. The prompt's token count is the caption length N'. :func:`mdc_core.sampler.sample` fills
the slots (``prompt=``); :func:`score_fills` asks which filling the model prefers, scoring only the slots given
the fixed words (conditional likelihood, :func:`mdc_core.scoring.score_tokens` with ``fixed``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch

from .scoring import score_tokens
from .tokenizer import EOT_ID, MASK_ID, SOT_ID, CaptionTokenizer

SLOT = re.compile(r"\[mask\]|(?<!\S)_(?!\S)", re.IGNORECASE)  # "[MASK]" anywhere, "_" as a word of its own


def shown(text: str, limit: int = 60) -> str:
    """`text` quoted for an error message, cut to `limit` characters (a pasted paragraph stays one short line)."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


def _words(words: list[str], limit: int = 8) -> str:
    unique = list(dict.fromkeys(words))
    return ", ".join(unique[:limit]) + (f" and {len(unique) - limit} more" if len(unique) > limit else "")


def parse_prompt(text: str, tokenizer: CaptionTokenizer, model: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (N,) with ``[MASK]`` at the slots, and the fixed mask (N,) bool, of a prompt string.

    With `model`, words outside a corpus-restricted model's vocabulary raise ValueError naming them.
    Raises ValueError for an empty prompt, one without a slot, or one longer than the tokenizer's context."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("the prompt is empty; write a caption with [MASK] or _ where words should be filled in")
    ids: list[int] = []
    pieces = SLOT.split(text)
    for i, piece in enumerate(pieces):
        ids += tokenizer.encode_text(piece)
        if i < len(pieces) - 1:
            ids.append(MASK_ID)
    if MASK_ID not in ids:
        raise ValueError(f"the prompt {shown(text)} has no slot to fill: mark the words to generate with [MASK] or _")
    if len(ids) > tokenizer.context_length - 2:
        raise ValueError(f"the prompt has {len(ids)} tokens; the model's context holds {tokenizer.context_length - 2}")
    prompt = torch.tensor(ids, dtype=torch.long)
    fixed = prompt != MASK_ID
    if model is not None and getattr(model, "restricted", False):
        unknown = tokenizer.words_with(prompt, {int(t) for t in prompt[fixed] if int(model.output_index[t]) < 0})
        if unknown:
            raise ValueError(f"the prompt uses words this model never saw in training: {_words(unknown)}")
    return prompt, fixed


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


@torch.no_grad()
def score_fills(model: Any, image_tokens: torch.Tensor, prompt: str, fills: Sequence[str], method: str = "heuristic",
                **kw: Any) -> list[dict[str, Any]]:
    """Rank fillings of a prompt's slots for one image (image_tokens (1, M, D) or (M, D)).

    Each filling is scored by the conditional log-likelihood of its slot tokens given the fixed words and the
    image (`method` and `kw` as :func:`mdc_core.scoring.score_tokens`: ``heuristic``, ``mc`` or ``ar``). Returns
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
            raise ValueError(f"the fillings use words this model never saw in training: {_words(unknown)}")
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
