"""The central-claim measure of a seed stack's members, one read of the captions for all (issue 63, item 3).

:func:`stacked_claim_scores` gives every member's :class:`~mdc_workbench.eval.central_claim.ClaimScores` (the
gradient and PMI of every caption token under the member's training conditions) from one read and tokenisation of
the captions; :func:`central_claim_members` does it for stacks of run folders, as
:func:`~mdc_workbench.eval.central_claim.central_claim_runs` does for single runs. Member k draws its training masks
from its own generator, seeded as its solo measure's (``seeds[k]``), in the solo's order (per batch, per draw), so
it scores exactly the positions its solo measure scores. Modes:

* ``each``: the members one after another with the solo function
  (:func:`~mdc_workbench.eval.central_claim.score_captions`): member k's scores are its solo measure's to the bit.
* ``vmap``: one vmapped forward over the stacked weights (:func:`~mdc_workbench.seed_stack.stacked.stack_models`,
  ``torch.func.functional_call``; on the CPU under the math attention) per measure and draw: the image encoder, the
  PMI's pool and context passes and the gradient's backward passes (``torch.func.vjp``, one pull per caption
  column). The solo measure picks positions with boolean masks whose counts differ between members, which vmap
  cannot batch (data-dependent shapes), and reads the host (``bool(...)``, ``nonzero``) to choose its loops; here the
  host picks every member's scored positions (padded to the most any member has) and the columns to loop over
  before the forward, and the context pass decodes at each column the captions where some member sees it (the solo
  decodes only those where this member sees it: the same values, more rows). Equal to the solo up to rounding.
* ``auto``: ``each`` on the CPU (where the vmapped forward costs more CPU time than the solo kernels, as for the
  training step), ``vmap`` elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import vjp

from mdc_core.config import ObjectiveConfig
from mdc_core.objectives import maskable_positions
from mdc_core.tokenizer import MASK_ID, lookup_rows
from mdc_workbench.eval.central_claim import (
    MEASURES,
    ClaimScores,
    add_captions,
    caption_batches,
    check_batch,
    check_kind,
    check_settings,
    claim_model,
    finished,
    in_distribution_pmi,
    score_captions,
    training_draw,
)

from .stacked import Encode, check_members, stack_models, vmap_members

Batch = tuple[Tensor, Tensor, Sequence[str]]
MODES = ("auto", "vmap", "each")


def stack_mode(mode: str, device: str | torch.device) -> str:
    """``each`` or ``vmap`` for `mode` (``auto``: each on the CPU, vmap elsewhere); ValueError naming a typo."""
    if mode not in MODES:
        raise ValueError(f"seed stack evaluation mode {mode!r}: choose one of {', '.join(MODES)}")
    return ("each" if torch.device(device).type == "cpu" else "vmap") if mode == "auto" else mode


def member_seeds(seeds: int | Sequence[int], k: int) -> list[int]:
    """One seed per member: `seeds` itself for every member (each still draws from its own generator), or a list
    of `k` seeds."""
    if isinstance(seeds, int):
        return [seeds] * k
    if len(seeds) != k:
        raise ValueError(f"{len(seeds)} seeds for {k} members: give one seed, or one per member")
    return [int(s) for s in seeds]


def stacked_claim_scores(models: Sequence[nn.Module], batches: Iterable[Batch], *,
                         objective: ObjectiveConfig | None = None, draws: int = 4, pool: int = 8,
                         seeds: int | Sequence[int] = 0, mode: str = "auto") -> list[ClaimScores]:
    """Every member's central-claim scores from one read of `batches` (module docstring).

    Args:
        models: K captioners of one architecture and kind (all causal or all masked), in eval mode, on one device.
        batches: (images (B, 3, S, S), tokens (B, L), groups (B names)), as for ``score_captions``; read once.
        objective, draws, pool: as for ``score_captions`` (the members share their objective config).
        seeds: the mask draws' seed of every member, or one per member (``score_captions``'s `seed`).
        mode: ``each``, ``vmap`` or ``auto``.
    Returns member k's ``ClaimScores``, what ``score_captions(models[k], batches, seed=seeds[k], ...)`` gives.
    """
    members = list(models)
    check_members(members)
    if len({bool(getattr(m, "causal", False)) for m in members}) > 1:
        raise ValueError("the members of a seed stack must be of one kind: all left-to-right (ARC) or all masked")
    check_settings(draws, pool)
    seeds = member_seeds(seeds, len(members))
    device = next(members[0].parameters()).device
    mode = stack_mode(mode, device)
    read = [(images, check_batch(images, tokens, groups), groups) for images, tokens, groups in batches]  # one read
    if not read:
        raise ValueError("no caption to score: the data gave no batch")
    if mode == "each":
        return [score_captions(m, read, objective=objective, draws=draws, pool=pool, seed=s)
                for m, s in zip(members, seeds, strict=True)]
    return VmappedClaim(members, objective, draws, pool).scores(read, seeds)


class VmappedClaim:
    """The measure of K stacked members by ``torch.vmap`` over ``functional_call`` (``vmap`` mode)."""

    def __init__(self, members: Sequence[nn.Module], objective: ObjectiveConfig | None, draws: int, pool: int
                 ) -> None:
        self.stacked = stack_models(members).eval()  # (K, ...) parameters and buffers
        self.first = members[0]  # its integer tables (one for all: check_members) and its flags
        self.causal = bool(getattr(self.first, "causal", False))
        self.objective, self.draws, self.pool = objective, draws, pool
        self.device = next(self.first.parameters()).device

    @torch.no_grad()
    def scores(self, batches: Sequence[Batch], seeds: Sequence[int]) -> list[ClaimScores]:
        gens = [torch.Generator().manual_seed(s) for s in seeds]  # each member's own, as its solo measure's
        out = [ClaimScores("teacher_forcing" if self.causal else "masked") for _ in seeds]
        for images, tokens, groups in batches:
            image_tokens = self.vmap(Encode(self.stacked), images.to(self.device), in_dims=(None,))  # (K, B, M, D)
            sums = [{m: torch.zeros(tokens.shape, dtype=torch.float64) for m in MEASURES} for _ in seeds]
            counts = [torch.zeros(tokens.shape, dtype=torch.float64) for _ in seeds]
            for _ in range(1 if self.causal else self.draws):
                drawn = [training_draw(tokens, self.objective, self.causal, g) for g in gens]  # the solo's order
                scored = [maskable_positions(tokens) if mask is None else mask for mask, _ in drawn]
                if not any(bool(s.any()) for s in scored):
                    continue
                pmi, grad = self.signal(image_tokens, tokens, drawn, scored)
                for k, where in enumerate(scored):
                    n = int(where.sum())
                    if n:  # the solo skips a draw that scores nothing
                        sums[k]["pmi"][where] += pmi[k, :n].double().cpu()
                        sums[k]["gradient"][where] += grad[k, :n].double().cpu()
                        counts[k][where] += 1
            for k in range(len(seeds)):
                add_captions(out[k], tokens, groups, sums[k], counts[k])
        return [finished(o) for o in out]

    def vmap(self, module: nn.Module, *args: Any, in_dims: tuple) -> Any:
        return vmap_members(module, self.stacked, *args, in_dims=in_dims)

    def signal(self, image_tokens: Tensor, tokens: Tensor, drawn: list[tuple[Tensor | None, Tensor]],
               scored: list[Tensor]) -> tuple[Tensor, Tensor]:
        """(PMI, gradient norm), each (K, n_max): member k's values at its scored positions in row-major order (the
        first ``scored[k].sum()``; the rest padding), from the host's picks (module docstring)."""
        B, L = tokens.shape
        flat = [s.flatten().nonzero().flatten() for s in scored]  # (n_k,) positions b * L + j, row-major
        n_max, fill = max(len(f) for f in flat), next(int(f[0]) for f in flat if len(f))
        # (K, n_max): each member's positions, padded with one that some member scores (the padding's values dropped)
        pos = torch.stack([F.pad(f, (0, n_max - len(f)), value=fill) for f in flat])
        valid = torch.stack([torch.arange(n_max) < len(f) for f in flat])  # (K, n_max)
        index = self.first.output_index.cpu()
        targets = index[tokens.flatten()[pos]]  # (K, n_max) head rows of the scored tokens
        masks = torch.stack([torch.zeros(B, L, dtype=torch.bool) if m is None else m for m, _ in drawn])  # (K, B, L)
        visible = maskable_positions(tokens) & ~masks  # (K, B, L): the masked context's tokens
        read = (torch.stack(scored) | visible).any(0)  # (B, L) every token some member's measure reads
        if bool((index[tokens][read] < 0).any()):  # what the solo's token_log_probs refuses
            bad = tokens[read & (index[tokens] < 0)].unique()[:5].tolist()
            raise ValueError(f"caption token ids {bad} have no row in the model's output vocabulary (its corpus "
                             "vocabulary comes from other captions)")
        weights = torch.stack([w.float() for _, w in drawn])  # (K, B)
        columns = sorted({int(j) for s in scored for j in s.any(0).nonzero().flatten()})  # scored by any member
        seen = visible.any(0)  # (B, L): the context tokens of some member
        context = [(j, seen[:, j].nonzero().flatten().to(self.device)) for j in range(L) if bool(seen[:, j].any())]
        signal = Signal(self.stacked, tokens.to(self.device), self.causal, min(self.pool, B - 1), columns, context)
        on = [t.to(self.device) for t in (masks, weights, pos, targets, valid)]
        return self.vmap(signal, image_tokens, *on, in_dims=(0, 0, 0, 0, 0, 0))


class Signal(nn.Module):
    """One member's PMI and gradient norm at padded scored positions (``functional_call`` inside vmap): the solo
    measure's :func:`~mdc_workbench.eval.central_claim.token_pmi` and ``token_gradient_norms`` with the positions
    picked on the host. `tokens` (B, L) are every member's; `pool` the PMI's other images; `columns` the caption
    columns any member scores; `context` the columns any member sees unmasked (the masked context's chain rule),
    each with the captions (B-indices) where some member sees it."""

    def __init__(self, model: nn.Module, tokens: Tensor, causal: bool, pool: int, columns: list[int],
                 context: list[tuple[int, Tensor]]) -> None:
        super().__init__()
        self.model, self.tokens, self.causal, self.pool = model, tokens, causal, pool
        self.columns, self.context = columns, context
        index = getattr(model, "input_index", None) if getattr(model, "restricted", False) else None
        self.rows = None if index is None else lookup_rows(index[0].to(tokens.device), tokens)  # (B, L) or None
        self.mask_row = None if index is None else int(index[0][MASK_ID])

    def forward(self, image_tokens: Tensor, mask: Tensor, weight: Tensor, pos: Tensor, targets: Tensor,
                valid: Tensor) -> tuple[Tensor, Tensor]:
        return self.pmi(image_tokens, mask, pos, targets), self.gradient(image_tokens, mask, weight, pos, targets,
                                                                           valid)

    def log_probs(self, image_tokens: Tensor, tokens: Tensor, hide: Tensor, pos: Tensor, targets: Tensor,
                  rows: Tensor | None) -> Tensor:
        """log p of the tokens at flat positions `pos` (n,) of tokens (B, L): teacher forcing for a causal model,
        else with the `hide` (B, L) tokens replaced by ``[MASK]``; (n,) float32, as ``token_log_probs``."""
        L = tokens.shape[1]
        if self.causal:  # column j predicted from the columns before it: position b * (L - 1) + j - 1 of the input
            select = pos - pos // L - 1
            logits = self.model.decode(tokens[:, :-1], image_tokens, select=select, causal=True,
                                       rows=None if rows is None else rows[:, :-1])
        else:
            x_rows = None if rows is None else rows.masked_fill(hide, self.mask_row)
            logits = self.model.decode(tokens.masked_fill(hide, MASK_ID), image_tokens, select=pos, causal=False,
                                       rows=x_rows)
        return -F.cross_entropy(logits.float(), targets, reduction="none")

    def pmi(self, image_tokens: Tensor, mask: Tensor, pos: Tensor, targets: Tensor) -> Tensor:
        """``token_pmi``: log p(token | ctx, true image) against the context-weighted pool, (n,) float64."""
        P, (B, L) = self.pool + 1, self.tokens.shape
        images = torch.cat([image_tokens.roll(s, dims=0) for s in range(P)])  # (P * B, M, D), true first
        tokens, hide = self.tokens.repeat(P, 1), mask.repeat(P, 1)  # (P * B, L)
        rows = None if self.rows is None else self.rows.repeat(P, 1)
        at = torch.cat([pos + s * B * L for s in range(P)])  # (P * n,) the scored positions under every image
        log_p = self.log_probs(images, tokens, hide, at, targets.repeat(P), rows).double()  # (P * n,)
        if self.causal:  # p(ctx | image): the caption's log-probabilities before each scored token
            per = torch.zeros(P * B * L, dtype=torch.float64, device=log_p.device).scatter(0, at, log_p)
            per = per.view(P * B, L)
            log_ctx = (per.cumsum(1) - per).flatten()[at]
        else:  # the visible tokens by the chain rule left to right, the masked and later visible ones hidden
            visible = maskable_positions(tokens) & ~hide  # (P * B, L)
            columns = torch.arange(L, device=tokens.device)
            total = torch.zeros(P * B, dtype=torch.float64, device=log_p.device)
            for j, seen in self.context:
                some = torch.cat([seen + s * B for s in range(P)])  # (r,) the pool's captions some member sees j in
                every = torch.arange(len(some), device=tokens.device) * L + j  # their column j
                lp = self.log_probs(images[some], tokens[some], (hide | (visible & (columns >= j)))[some], every,
                                    self.first_rows(tokens[some, j]), None if rows is None else rows[some])
                total = total.index_add(0, some, torch.where(visible[some, j], lp.double(), 0.0))  # out of place
            log_ctx = total[at // L]
        return in_distribution_pmi(log_p.view(P, -1), log_ctx.view(P, -1))

    def first_rows(self, ids: Tensor) -> Tensor:
        """Head rows of token ids (any shape), 0 where the head has none (positions not scored)."""
        return self.model.output_index[ids].clamp(min=0)

    def gradient(self, image_tokens: Tensor, mask: Tensor, weight: Tensor, pos: Tensor, targets: Tensor,
                 valid: Tensor) -> Tensor:
        """``token_gradient_norms``: ||d (w_b CE_bi) / d image_tokens_b||_2 at the scored positions, (n,)
        float64; one pull of the backward per scored column (a token's loss depends on its own caption's image
        tokens only)."""
        L = self.tokens.shape[1]
        caption, column = pos // L, pos % L

        def loss(v: Tensor) -> Tensor:
            return -self.log_probs(v, self.tokens, mask, pos, targets, self.rows) * weight[caption]  # (n,)

        with torch.enable_grad():
            ce, pull = vjp(loss, image_tokens)
            out = torch.zeros(len(pos), dtype=torch.float64, device=ce.device)
            for j in self.columns:
                pick = (column == j) & valid
                grad = pull(pick.to(ce.dtype))[0]  # (B, M, D): d sum of column j's terms / d image tokens
                norms = grad.flatten(1).norm(dim=1).double()  # (B,)
                out = out + torch.where(pick, norms[caption], 0.0)
        return out


def central_claim_members(stacks: dict[str, Sequence[Sequence[str | Path]]], data: dict[str, str | Path], *,
                          limit: int = 512, draws: int = 4, pool: int = 15, seed: int | Sequence[int] = 0,
                          device: str = "cpu", batch_size: int = 32, labels: dict[str, str] | None = None,
                          mode: str = "auto") -> list[dict[str, dict[str, ClaimScores]]]:
    """:func:`~mdc_workbench.eval.central_claim.central_claim_runs` of K members at once.

    `stacks`: ``{kind: [member run folders of one objective (K), ...]}``, e.g. the ARC members and the MDC members
    of a seed stack; member k of every stack is one seed's run. Each kind's captions are read once for all stacks
    of one image size and context. `seed`: the mask draws' seed, one for all members or one per member.
    Returns, per member k, ``{kind: {row name: scores}}``: what ``central_claim_runs`` gives for the k-th run of
    every stack (``claim_table``'s and ``write_run_items``' input)."""
    stacks = {kind: [list(s) for s in by_objective] for kind, by_objective in stacks.items()}
    sizes = {len(s) for by_objective in stacks.values() for s in by_objective}
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError(f"every stack needs the same number of members (>= 1); got {sorted(sizes)}")
    out: list[dict[str, dict[str, ClaimScores]]] = [{} for _ in range(sizes.pop())]
    for kind, by_objective in stacks.items():
        check_kind(kind, data)
        read: dict[tuple[int, int], list[Batch]] = {}
        for runs in by_objective:
            loaded = [claim_model(run, device, labels) for run in runs]
            (_, cfg, row), names = loaded[0], {r for _, _, r in loaded}
            if len(names) > 1 or any(c.objective != cfg.objective for _, c, _ in loaded):
                raise ValueError(f"the {kind} stack {[str(r) for r in runs]} mixes objectives: one objective per "
                                 "stack")
            if row in out[0].get(kind, {}):
                raise ValueError(f"two {row} stacks on the {kind} captions: give one stack per objective and kind")
            size = (cfg.model.image_size, cfg.model.context_length)
            if size not in read:
                read[size] = list(caption_batches(data[kind], *size, limit=limit, batch_size=batch_size))
            scores = stacked_claim_scores([m for m, _, _ in loaded], read[size], objective=cfg.objective,
                                          draws=draws, pool=pool, seeds=seed, mode=mode)
            for k, s in enumerate(scores):
                out[k].setdefault(kind, {})[row] = s
    return out
