"""Autoregressive (ARC) caption decoding: greedy and beam search with key/value caches.

An ARC :class:`Captioner` (causal decoder) writes a caption after ``<sot>`` one token at a time until ``<eot>`` or
the context is full. The image cross-attention keys/values (:meth:`Captioner.image_cache`) and the prefix's
self-attention keys/values (``past``) are cached, exactly, so every step costs one token. Log-probabilities are
those of the full output softmax (a caption's sum is its ``ar`` score in :mod:`mdc_core.scoring`); ``<sot>`` is
never a candidate. Beam search ranks hypotheses by summed log-probability / ``length ** length_penalty``
(0 = raw sum, the default; 1 = mean per token), counting ``<eot>`` as a token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .model import Captioner
from .tokenizer import EOT_ID, PAD_ID, SOT_ID


@dataclass
class ARDecodeOutput:
    """B captions. T = longest generated sequence; after ``<eot>`` ids are ``PAD_ID`` and log-probs 0."""

    tokens: torch.Tensor  # (B, T) generated ids after <sot>, including the <eot> when one was emitted
    token_logprobs: torch.Tensor  # (B, T) log-probability of each generated token
    lengths: torch.Tensor  # (B,) caption tokens, <eot> excluded

    @property
    def score(self) -> torch.Tensor:
        """(B,) summed log-probability of each caption (its <eot> included)."""
        return self.token_logprobs.sum(dim=1)


def _check(model: Captioner, max_tokens: int | None) -> int:
    if not model.causal:
        raise ValueError("autoregressive decoding needs a causal (ARC) model; for MDC use mdc_core.sampler.sample")
    limit = model.cfg.context_length - 1
    if max_tokens is None:
        return limit
    if not 1 <= max_tokens <= limit:
        raise ValueError(f"max_tokens must be in [1, {limit}] (the context after <sot>), got {max_tokens}")
    return max_tokens


def _next_logprobs(model: Captioner, tokens: torch.Tensor, cache, past: list[list]) -> torch.Tensor:
    """Feed the newest token of each row (R, 1) -> log-probs (R, V_out) of the next token; <sot> excluded."""
    logits = model.decode(tokens, None, causal=True, cache=cache, past=past)[:, -1].float()  # (R, V_out)
    logp = F.log_softmax(logits, dim=-1)
    return logp.masked_fill(model.output_ids == SOT_ID, float("-inf"))


@torch.no_grad()
def greedy(model: Captioner, image_tokens: torch.Tensor, *, max_tokens: int | None = None) -> ARDecodeOutput:
    """Greedy decoding of image_tokens (B, M, D): each step appends the most probable token."""
    max_tokens = _check(model, max_tokens)
    B, device = image_tokens.shape[0], image_tokens.device
    cache = model.image_cache(image_tokens)
    past: list[list] = [[] for _ in model.decoder.layers]
    last = torch.full((B, 1), SOT_ID, dtype=torch.long, device=device)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    ids, lps = [], []
    for _ in range(max_tokens):
        lp, row = _next_logprobs(model, last, cache, past).max(dim=-1)  # (B,)
        tok = torch.where(done, PAD_ID, model.output_ids[row])
        ids.append(tok)
        lps.append(lp.masked_fill(done, 0.0))
        done = done | (tok == EOT_ID)
        if bool(done.all()):
            break
        last = tok[:, None]
    tokens = torch.stack(ids, dim=1)  # (B, T)
    return ARDecodeOutput(tokens, torch.stack(lps, dim=1), _lengths(tokens))


def _lengths(tokens: torch.Tensor) -> torch.Tensor:
    """(B,) caption tokens before the first <eot> (all of them when there is none)."""
    is_eot = tokens == EOT_ID
    return torch.where(is_eot.any(dim=1), is_eot.int().argmax(dim=1), tokens.shape[1])


@dataclass
class _Finished:
    """The finished hypotheses of one image, at most W kept, best first, as (normalised score, ids, log-probs);
    `done` once none of the image's live beams can beat the worst of W finished ones."""

    width: int
    length_penalty: float
    best: list[tuple[float, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    done: bool = False

    def norm(self, score: float, length: int) -> float:
        return score / length ** self.length_penalty

    def add(self, score: float, length: int, ids: torch.Tensor, lps: torch.Tensor) -> None:
        self.best.append((self.norm(score, length), ids, lps))

    def trim_and_close(self, best_live: float, length: int) -> None:
        """Keep the W best; done when W are finished and the best live beam (score `best_live`) cannot beat them."""
        self.best.sort(key=lambda h: -h[0])
        del self.best[self.width:]
        if not self.done and len(self.best) == self.width:
            self.done = best_live == float("-inf") or self.norm(best_live, length) <= self.best[-1][0]


@torch.no_grad()
def beam_search(model: Captioner, image_tokens: torch.Tensor, *, beam_size: int = 6, length_penalty: float = 0.0,
                max_tokens: int | None = None) -> ARDecodeOutput:
    """Beam search over image_tokens (B, M, D); returns the best finished hypothesis of each image.

    Each step extends the W = `beam_size` live beams of an image by every token, keeps the 2W best extensions;
    those ending in ``<eot>`` become finished hypotheses, the best W others live on. An image is done when it
    has W finished hypotheses and none of its live beams scores better than the worst of them (the usual
    heuristic; exact for ``length_penalty=0``, where scores only fall). Live beams at the length limit finish
    without ``<eot>``. With W = 1 this is greedy decoding."""
    max_tokens = _check(model, max_tokens)
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    B, W, device = image_tokens.shape[0], beam_size, image_tokens.device
    cache = model.image_cache(image_tokens).index(torch.arange(B, device=device).repeat_interleave(W))
    past: list[list] = [[] for _ in model.decoder.layers]
    last = torch.full((B * W, 1), SOT_ID, dtype=torch.long, device=device)
    hist = torch.zeros(B * W, 0, dtype=torch.long, device=device)  # (B*W, t) tokens of each live beam
    hist_lp = torch.zeros(B * W, 0, device=device)  # (B*W, t) and their log-probs
    beam_score = torch.full((B, W), float("-inf"), device=device)
    beam_score[:, 0] = 0.0  # one live beam at the start, so the first step does not pick W copies
    finished = [_Finished(W, length_penalty) for _ in range(B)]
    for t in range(max_tokens):
        logp = _next_logprobs(model, last, cache, past)  # (B*W, V)
        new_src, new_tok, beam_score = _extend(model, logp, beam_score, finished, hist, hist_lp, t)  # (B, W) each
        beams = (torch.arange(B, device=device)[:, None] * W + new_src).view(-1)  # (B*W,) source beam rows
        rows = model.output_index[new_tok.view(-1)].clamp(min=0)
        hist = torch.cat([hist[beams], new_tok.view(-1, 1)], dim=1)
        hist_lp = torch.cat([hist_lp[beams], logp[beams, rows].view(-1, 1)], dim=1)
        if all(f.done for f in finished):
            break
        for layer_past in past:
            layer_past[:] = [layer_past[0][beams], layer_past[1][beams]]
        last = new_tok.view(-1, 1)
    for b, f in enumerate(finished):  # beams still live at the length limit finish without <eot>
        if not f.done:
            for w in range(W):
                if float(beam_score[b, w]) > float("-inf"):
                    f.add(float(beam_score[b, w]), hist.shape[1], hist[b * W + w], hist_lp[b * W + w])
            f.best.sort(key=lambda h: -h[0])
    return _pack([f.best[0] for f in finished], device)


def _extend(model: Captioner, logp: torch.Tensor, beam_score: torch.Tensor, finished: list[_Finished],
            hist: torch.Tensor, hist_lp: torch.Tensor, t: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One beam-search step: of the 2W best extensions of each image's live beams (log-probs `logp` (B*W, V),
    scores `beam_score` (B, W)), those ending in ``<eot>`` finish (among the W best only), the W best others live
    on. Returns their source beam, token and score, each (B, W) (-inf score for empty slots)."""
    (B, W), V, device = beam_score.shape, logp.shape[-1], logp.device
    total = (beam_score.view(-1, 1) + logp).view(B, W * V)  # (B, W*V)
    top_score, top_idx = total.topk(min(2 * W, W * V), dim=-1)  # (B, 2W)
    src, row = top_idx // V, top_idx % V  # beam within the image, head row
    tok = model.output_ids[row]
    new_src = torch.zeros(B, W, dtype=torch.long, device=device)
    new_tok = torch.full((B, W), PAD_ID, dtype=torch.long, device=device)
    new_score = torch.full((B, W), float("-inf"), device=device)
    top_score_l, src_l, row_l, tok_l = top_score.tolist(), src.tolist(), row.tolist(), tok.tolist()
    for b, f in enumerate(finished):
        kept = 0
        for j in range(len(tok_l[b])):
            score, beam = top_score_l[b][j], b * W + src_l[b][j]
            if score == float("-inf") or kept == W or f.done:
                break
            if tok_l[b][j] == EOT_ID:
                if j < W:  # an <eot> below the W best extensions never beats those
                    f.add(score, t + 1, torch.cat([hist[beam], hist.new_tensor([EOT_ID])]),
                          torch.cat([hist_lp[beam], logp[beam, row_l[b][j]].view(1)]))
                continue
            new_src[b, kept], new_tok[b, kept], new_score[b, kept] = src_l[b][j], tok_l[b][j], score
            kept += 1
        f.trim_and_close(float(new_score[b].max()), t + 1)
    return new_src, new_tok, new_score


def _pack(best: list[tuple[float, torch.Tensor, torch.Tensor]], device: torch.device) -> ARDecodeOutput:
    T = max(len(ids) for _, ids, _ in best)
    tokens = torch.full((len(best), T), PAD_ID, dtype=torch.long, device=device)
    lps = torch.zeros(len(best), T, device=device)
    for i, (_, ids, lp) in enumerate(best):
        tokens[i, : len(ids)], lps[i, : len(ids)] = ids, lp
    return ARDecodeOutput(tokens, lps, _lengths(tokens))


DECODERS = {"greedy": greedy, "beam": beam_search}  # name -> decoding function


def ar_decode(model: Captioner, image_tokens: torch.Tensor, method: str = "greedy", **kw) -> ARDecodeOutput:
    """Decode with ``method`` (a key of :data:`DECODERS`); `kw` go to that function."""
    if method not in DECODERS:
        raise ValueError(f"unknown decoding method {method!r}; choose one of {', '.join(DECODERS)}")
    return DECODERS[method](model, image_tokens, **kw)
