"""Adaptive caption length for MDC (``mdc sample --length auto``).

Masked diffusion captioning writes exactly N' tokens. Here every image is captioned at each N' of a range
(all images of a length in one batch, one image cache for all lengths), every candidate is scored by the
heuristic likelihood of Sec. 4.2 (:func:`mdc_core.scoring.score_tokens`), and the candidate with the highest
score per token (the length-normalised score) is kept.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .config import SamplerConfig
from .model import Captioner
from .sampler import SampleOutput, sample
from .scoring import score_tokens
from .tokenizer import EOT_ID, PAD_ID, SOT_ID


@dataclass
class AutoLengthOutput:
    """B images, K candidate lengths."""

    lengths: list[int]  # (K,) the N' tried
    candidates: list[SampleOutput]  # K sampler outputs, each for all B images
    scores: torch.Tensor  # (B, K) heuristic log-likelihood of each candidate
    normalized: torch.Tensor  # (B, K) scores / N'
    choice: torch.Tensor  # (B,) index into `lengths` of the kept candidate

    def tokens(self, index: int) -> torch.Tensor:
        """Caption ids (N',) kept for image `index`."""
        return self.candidates[int(self.choice[index])].tokens[index]


def parse_range(text: str, context_length: int) -> list[int]:
    """``"LO-HI"`` (inclusive) or a comma list ``"5,10,15"`` -> lengths, each within the model's context."""
    try:
        if "-" in text:
            lo, hi = (int(v) for v in text.split("-", 1))
            lengths = list(range(lo, hi + 1))
        else:
            lengths = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as err:
        raise ValueError(f"caption length range must look like 3-20 or 5,10,15, got {text!r}") from err
    limit = context_length - 2
    if not lengths or min(lengths) < 1 or max(lengths) > limit:
        raise ValueError(f"caption lengths must lie in 1..{limit} (the model's context), got {text!r}")
    return sorted(set(lengths))


@torch.no_grad()
def sample_auto_length(model: Captioner, image_tokens: torch.Tensor, cfg: SamplerConfig,
                       lengths: Sequence[int]) -> AutoLengthOutput:
    """Sample image_tokens (B, M, D) at every N' in `lengths` with `cfg` (its ``length`` is ignored) and pick,
    per image, the caption with the best heuristic score per token."""
    if not lengths:
        raise ValueError("no caption lengths to try")
    cache = model.image_cache(image_tokens)
    B, device = image_tokens.shape[0], image_tokens.device
    candidates = [sample(model, image_tokens, dataclasses.replace(cfg, length=n), cache=cache) for n in lengths]
    width = max(lengths) + 2
    rows = torch.full((len(lengths), B, width), PAD_ID, dtype=torch.long, device=device)  # (K, B, L)
    for k, (n, out) in enumerate(zip(lengths, candidates, strict=True)):
        rows[k, :, 0], rows[k, :, 1:n + 1], rows[k, :, n + 1] = SOT_ID, out.tokens, EOT_ID
    images = image_tokens.repeat(len(lengths), 1, 1)  # (K*B, M, D) paired with the flattened candidates
    scores = score_tokens(model, images, rows.view(-1, width), "heuristic").score.view(len(lengths), B).T  # (B, K)
    normalized = scores / torch.tensor(lengths, dtype=scores.dtype, device=device)
    return AutoLengthOutput(list(lengths), candidates, scores, normalized, normalized.argmax(dim=1))
