"""Likelihood scores of captions given an image (paper Sec. 4.2): Monte Carlo ELBO, greedy-order heuristic, chain rule.

Captions come as token rows ``<sot> c_1 .. c_n <eot> pad ...`` (n >= 1). Every method returns a log-likelihood
score, higher = more likely, and is chosen from :data:`METHODS`:

- ``mc`` (MDC models): the ELBO of Eq. 8, ``sum_{l=1}^{n} (1/l) E_{|mask|=l}[sum_{i masked} log p(c_i | C_l)]``,
  estimated as LLaDA's ``get_log_likelihood`` (docs/design.md "Decisions"): sample j masks l_j tokens, l_j
  stratified over 1..n (``l_j = floor((j + u) n / S) + 1``), and contributes ``(n / l_j) sum_{masked} log p``;
  the mean is unbiased. All captions share the random numbers (seed), which lowers the variance of score
  differences; identical masks are evaluated once.
- ``heuristic`` (MDC): from the fully masked caption, each step reveals the masked position of highest confidence
  (the sampler's rule, Eq. 6), adds the log-probability of the ground-truth token there and places it.
- ``ar``: ARC models, the exact chain rule of Eq. 7 by teacher forcing, ``<eot>`` included (as in the training
  loss); MDC models: a fixed left-to-right order (``<eot>`` not scored, as MDC never predicts it).

Conditional scores (``fixed``, infilling): fixed positions are never masked nor scored, so each method scores only
the free slots given the fixed tokens (``mc``: Eq. 8 with n = the slots). ARC cannot condition on later words.
:func:`sample_auto_length` (``mdc sample --length auto``) samples every N' of a range and keeps the caption with the
best heuristic score per token.

Log-probabilities are under the model's full output softmax, in fp32 (``precision``: :mod:`mdc_core.sampler`); the
image cross-attention keys/values are computed once and shared (``use_cache=False`` recomputes them, for tests).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .config import SamplerConfig
from .model import Captioner
from .objectives import maskable_positions, trim_padding
from .sampler import SampleOutput, allowed_rows, inference_autocast, sample
from .tokenizer import (
    EOT_ID,
    MASK_ID,
    PAD_ID,
    SOT_ID,
    CaptionTokenizer,
    padding_mask,
    unknown_ids,
)


@dataclass
class ScoreOutput:
    score: torch.Tensor  # (B,) log-likelihood score (higher = more likely)
    stderr: torch.Tensor | None  # (B,) Monte Carlo standard error (mc only)
    token_logprobs: torch.Tensor | None  # (B, L) per-token log-probs on the scoring path (heuristic/ar), 0 elsewhere
    order: torch.Tensor | None  # (B, L) reveal step of each token (heuristic, ar), -1 for non-caption positions


class _Images:
    """The images of one scoring call as the decoder wants them for a chunk of rows (cached or not)."""

    def __init__(self, model: Any, image_tokens: torch.Tensor, use_cache: bool) -> None:
        self.image_tokens = image_tokens  # (B|1, M, D)
        self.cache = model.image_cache(image_tokens) if use_cache else None

    def __call__(self, rows: torch.Tensor) -> dict[str, Any]:
        """rows (R,): the image of each decoder row -> keyword arguments of ``decode``."""
        if self.cache is not None:
            return {"image_tokens": None, "cache": self.cache.index(rows)}
        if self.image_tokens.shape[0] == 1:
            return {"image_tokens": self.image_tokens.expand(len(rows), -1, -1)}
        return {"image_tokens": self.image_tokens[rows]}


def _gt_logprobs(model: Any, logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """logits (n, V_out), ground-truth token ids (n,) -> their log-probabilities (n,) under the full softmax."""
    logp = F.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, model.output_index[token_ids][:, None])[:, 0]


# ----------------------------------------------------------------------------------------------------------
# the three methods: (model, images, tokens (B, L), free (B, L) positions scored, options) -> ScoreOutput


def _score_mc(model: Any, images: _Images, tokens: torch.Tensor, free: torch.Tensor, *, samples: int, seed: int,
              batch_size: int, **_: Any) -> ScoreOutput:
    B, L = tokens.shape
    n = free.sum(dim=1)  # (B,) scored tokens
    S, device = samples, tokens.device
    gen = torch.Generator().manual_seed(seed)
    u = float(torch.rand((), generator=gen))  # offset of the stratified mask counts
    noise = torch.rand(S, L, generator=gen)  # (S, L) ranks which positions are masked (shared by all captions)
    masks, owner, inverse, counts = [], [], [], []
    for b, nb in enumerate(n.tolist()):
        count = ((torch.arange(S) + u) * nb / S).floor().long().clamp(max=nb - 1) + 1  # (S,) masked tokens, 1..n
        rank = noise[:, :nb].argsort(dim=1).argsort(dim=1)  # (S, n) a uniform random order of the n tokens
        m = torch.zeros(S, L, dtype=torch.bool)
        m[:, free[b].nonzero()[:, 0].cpu()] = rank < count[:, None]  # (S, L) the l_j lowest-ranked free tokens
        uniq, inv = torch.unique(m, dim=0, return_inverse=True)  # identical masks are evaluated once
        inverse.append(inv + sum(len(x) for x in masks))
        masks.append(uniq)
        owner.append(torch.full((len(uniq),), b))
        counts.append(count)
    masks_t, owner_t = torch.cat(masks).to(device), torch.cat(owner).to(device)  # (R, L), (R,)
    sums = torch.zeros(len(masks_t), device=device)  # (R,) sum of masked log-probs of each distinct mask
    for start in range(0, len(masks_t), batch_size):
        m, rows = masks_t[start:start + batch_size], owner_t[start:start + batch_size]
        x = tokens[rows].masked_fill(m, MASK_ID)  # (r, L)
        logits = model.decode(x, **images(rows), select=m, causal=False)  # (k, V_out) masked positions only
        lp = _gt_logprobs(model, logits, tokens[rows][m])  # (k,)
        sums[start:start + batch_size] = torch.zeros(len(m), device=device).index_add_(0, m.nonzero()[:, 0], lp)
    sums = sums.cpu().double()
    score, stderr = torch.zeros(B, dtype=torch.float64), torch.zeros(B, dtype=torch.float64)
    for b, nb in enumerate(n.tolist()):
        values = sums[inverse[b]] * nb / counts[b]  # (S,) one ELBO sample per mask
        score[b], stderr[b] = values.mean(), _stratified_stderr(values, counts[b])
    return ScoreOutput(score.float().to(device), stderr.float().to(device), None, None)


def _stratified_stderr(values: torch.Tensor, strata: torch.Tensor) -> torch.Tensor:
    """Standard error of the mean of `values` (S,) drawn stratified by `strata` (S,):
    ``sqrt(sum_l S_l var_l) / S`` with S_l samples and sample variance var_l in stratum l. If a stratum holds a
    single sample its variance is unknown; then the plain ``std / sqrt(S)`` is used (an over-estimate)."""
    S = len(values)
    if S < 2:
        return torch.tensor(float("nan"), dtype=values.dtype)
    _, group, sizes = torch.unique(strata, return_inverse=True, return_counts=True)
    if bool((sizes < 2).any()):
        return values.std() / S ** 0.5
    means = torch.zeros(len(sizes), dtype=values.dtype).index_add_(0, group, values) / sizes
    sq = torch.zeros(len(sizes), dtype=values.dtype).index_add_(0, group, (values - means[group]) ** 2)
    var = sq / (sizes - 1)  # per-stratum sample variance
    return (sizes * var).sum().sqrt() / S


def _score_heuristic(model: Any, images: _Images, tokens: torch.Tensor, free: torch.Tensor, *, batch_size: int,
                     **_: Any) -> ScoreOutput:
    B, L = tokens.shape
    device = tokens.device
    n = free.sum(dim=1)  # (B,) tokens revealed and scored (those of `free`)
    allowed = allowed_rows(model)  # (V_out,) rows the canvas may take: the sampler's confidence
    token_lp = torch.zeros(B, L, device=device)
    order = torch.full((B, L), -1, dtype=torch.long, device=device)
    for start in range(0, B, batch_size):
        idx = torch.arange(start, min(start + batch_size, B), device=device)  # captions of this chunk
        x = tokens[idx].masked_fill(free[idx], MASK_ID)  # (r, L) every free token masked
        for s in range(int(n[idx].max())):
            masked = x == MASK_ID  # (r, L)
            act = masked.any(dim=1).nonzero()[:, 0]  # (a,) captions with tokens left
            m = masked[act]  # (a, L)
            logits = model.decode(x[act], **images(idx[act]), select=m, causal=False).float()  # (k, V_out)
            conf = logits.masked_fill(~allowed, float("-inf")).softmax(dim=-1).amax(dim=-1)  # (k,)
            grid = torch.full(m.shape, float("-inf"), device=device).masked_scatter(m, conf)  # (a, L)
            pos = grid.argmax(dim=1)  # (a,) most confident masked position
            flat = torch.cumsum(m.flatten().long(), 0).view(m.shape) - 1  # (a, L) index into the k selected rows
            rows = flat[torch.arange(len(act), device=device), pos]  # (a,)
            cap = idx[act]
            truth = tokens[cap, pos]  # (a,)
            token_lp[cap, pos] = _gt_logprobs(model, logits[rows], truth)
            order[cap, pos] = s
            x[act, pos] = truth
    return ScoreOutput(token_lp.sum(dim=1), None, token_lp, order)


def _score_left_to_right(model: Any, images: _Images, tokens: torch.Tensor, free: torch.Tensor, *,
                         batch_size: int, **_: Any) -> ScoreOutput:
    """The ``ar`` score: every token's log-probability given those to its left (ARC's chain rule, Eq. 7), or, for a
    bidirectional model, along a fixed left-to-right reveal order."""
    B, L = tokens.shape
    device = tokens.device
    token_lp = torch.zeros(B, L, device=device)
    order = torch.where(free, free.long().cumsum(dim=1) - 1, -1)  # left to right
    if model.causal:  # teacher forcing: predict token i from tokens < i, <eot> included
        valid = ~padding_mask(tokens)
        valid[:, 0] = False  # (B, L) positions predicted: caption tokens and <eot>
        for start in range(0, B, batch_size):
            idx = torch.arange(start, min(start + batch_size, B), device=device)
            v = valid[idx, 1:]  # (r, L-1)
            logits = model.decode(tokens[idx, :-1], **images(idx), select=v, causal=True)  # (k, V_out)
            lp = _gt_logprobs(model, logits, tokens[idx, 1:][v])
            token_lp[idx, 1:] = torch.zeros(v.shape, device=device).masked_scatter(v, lp)
        return ScoreOutput(token_lp.sum(dim=1), None, token_lp, order)
    # MDC: one row per (caption, free position i): free tokens before i revealed, i and after masked; score i
    cap, pos = free.nonzero(as_tuple=True)  # (R,), (R,) in caption order
    cols = torch.arange(L, device=device)
    for start in range(0, len(cap), batch_size):
        c, p = cap[start:start + batch_size], pos[start:start + batch_size]
        x = tokens[c].masked_fill(free[c] & (cols >= p[:, None]), MASK_ID)  # (r, L)
        select = cols == p[:, None]  # (r, L) one position per row
        logits = model.decode(x, **images(c), select=select, causal=False)  # (r, V_out)
        token_lp[c, p] = _gt_logprobs(model, logits, tokens[c, p])
    return ScoreOutput(token_lp.sum(dim=1), None, token_lp, order)


@dataclass(frozen=True)
class ScoreMethod:
    """One row of the method table (the module docstring says what each computes)."""

    fn: Callable[..., ScoreOutput]
    kinds: tuple[str, ...]  # model kinds that can use it: "mdc" (bidirectional decoder), "arc" (causal)


METHODS: dict[str, ScoreMethod] = {
    "mc": ScoreMethod(_score_mc, ("mdc",)),
    "heuristic": ScoreMethod(_score_heuristic, ("mdc",)),
    "ar": ScoreMethod(_score_left_to_right, ("arc", "mdc")),
}


def model_kind(model: Any) -> str:
    """``"arc"`` (causal decoder) or ``"mdc"`` (bidirectional); ValueError for a model without a caption decoder."""
    if not (callable(getattr(model, "decode", None)) and hasattr(model, "image_cache") and hasattr(model, "causal")):
        raise ValueError(f"{type(model).__name__} has no caption decoder, so it cannot score captions by "
                         "likelihood (a CLIP model compares embeddings instead)")
    return "arc" if model.causal else "mdc"


def methods_for(model: Any) -> list[str]:
    """Names of the scoring methods this model can use."""
    kind = model_kind(model)
    return [name for name, spec in METHODS.items() if kind in spec.kinds]


def _check(model: Any, image_tokens: torch.Tensor, tokens: torch.Tensor, method: str) -> ScoreMethod:
    if method not in METHODS:
        raise ValueError(f"unknown scoring method {method!r}; choose one of {', '.join(METHODS)}")
    kind = model_kind(model)
    if kind not in METHODS[method].kinds:
        raise ValueError(f"scoring method {method!r} needs a {' or '.join(METHODS[method].kinds).upper()} model; this "
                         f"one is {kind.upper()} (use one of: {', '.join(methods_for(model))})")
    if tokens.ndim != 2 or tokens.shape[0] == 0:
        raise ValueError(f"no captions to score (tokens of shape {tuple(tokens.shape)})")
    if image_tokens.ndim != 3 or image_tokens.shape[0] not in (1, tokens.shape[0]):
        raise ValueError(f"image_tokens of shape {tuple(image_tokens.shape)} do not pair with {tokens.shape[0]} "
                         "captions: give (B, M, D) row-wise or (1, M, D) for all")
    context = model.cfg.context_length
    if tokens.shape[1] > context:
        raise ValueError(f"captions of {tokens.shape[1]} tokens exceed the model's context of {context}")
    has_eot = (tokens == EOT_ID).any(dim=1)
    if not bool((tokens[:, 0] == SOT_ID).all()) or not bool(has_eot.all()):
        raise ValueError("each caption row must be <sot> tokens <eot> (a row without <eot> is longer than the "
                         "context or was truncated)")
    caption = maskable_positions(tokens)
    if not bool(caption.any(dim=1).all()):
        raise ValueError("a caption has no tokens")
    if bool((tokens[caption] == MASK_ID).any()):
        raise ValueError("captions to score may not contain [MASK]")
    unknown = unknown_ids(model.output_index, tokens[caption])
    if unknown:
        tokenizer, wanted = CaptionTokenizer(), set(unknown)
        found = list(dict.fromkeys(w for row in tokens for w in tokenizer.words_with(row, wanted)))
        words = ", ".join(repr(w) for w in found[:5])
        more = f" and {len(found) - 5} more" if len(found) > 5 else ""
        raise ValueError(f"the caption words {words}{more} are not in this model's output vocabulary (it predicts "
                         "only the words of its training captions), so their likelihood is zero")
    return METHODS[method]


@torch.no_grad()
def score_tokens(model: Any, image_tokens: torch.Tensor, tokens: torch.Tensor, method: str, *, samples: int = 1024,
                 seed: int = 0, batch_size: int = 256, use_cache: bool = True, fixed: torch.Tensor | None = None,
                 precision: str | None = None) -> ScoreOutput:
    """Score captions `tokens` (B, L) against image_tokens (B, M, D) paired row-wise, or (1, M, D) for all.

    `samples`, `seed`: Monte Carlo samples per caption and their seed (``mc``); `batch_size`: decoder rows per
    forward pass (memory only: results do not depend on it). `fixed` (B, L) bool: caption positions given as
    context, neither masked nor scored (conditional likelihood of the others; MDC only). `precision`: as
    :func:`mdc_core.sampler.sample`'s. Returned tensors have the width L of `tokens`."""
    spec = _check(model, image_tokens, tokens, method)
    if samples < 1 or batch_size < 1:
        raise ValueError(f"samples and batch_size must be >= 1, got {samples} and {batch_size}")
    full_width = tokens.shape[1]
    free = maskable_positions(tokens)
    if fixed is not None:
        if fixed.shape != tokens.shape:
            raise ValueError(f"fixed of shape {tuple(fixed.shape)} must match tokens {tuple(tokens.shape)}")
        if model.causal:
            raise ValueError("an ARC model reads left to right and cannot score words given later fixed words; "
                             "conditional (infilling) scores need an MDC model")
        free = free & ~fixed.to(free.device).bool()
        if not bool(free.any(dim=1).all()):
            raise ValueError("a caption has no free position left to score (every token is fixed)")
    tokens = trim_padding(tokens).to(image_tokens.device)
    free = free[:, :tokens.shape[1]].to(tokens.device)
    with inference_autocast(precision, image_tokens.device):  # the forward calls; log-probabilities in fp32
        out = spec.fn(model, _Images(model, image_tokens, use_cache), tokens, free, samples=samples, seed=seed,
                      batch_size=batch_size)
    pad = full_width - tokens.shape[1]
    if out.token_logprobs is not None:
        out.token_logprobs = F.pad(out.token_logprobs, (0, pad))
    if out.order is not None:
        out.order = F.pad(out.order, (0, pad), value=-1)
    return out


# ----------------------------------------------------------------------------------------------------------
# adaptive caption length (``mdc sample --length auto``): MDC writes exactly N' tokens, so every image is
# captioned at each N' of a range (all images of a length in one batch, one image cache for all lengths), every
# candidate scored by the heuristic likelihood, and the candidate with the best score per token kept


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
