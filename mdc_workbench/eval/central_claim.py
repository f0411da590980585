"""The paper's central claim, measured once (``mdc eval central-claim``; notebook 03's last section).

The paper (abstract, Sec. 1): in autoregressive captioning "later text tokens can be predicted so well from the
earlier ones that the image becomes decreasingly important", while "the strength of the visual learning signal in
MDC does not depend on each token's position". Two per-token measures, each under the model's *own training
conditions* (ARC: teacher forcing, weight 1; a masked objective: per caption a ratio t from its training
distribution, drawn by its noise schedule (:mod:`mdc_core.registry`), its masked tokens scored, weighted as it
trains (1/t for MDC);
`draws` seeded draws, a token's value the mean over the draws that masked it):

* **gradient**, the visual learning signal itself: ``g[b][i] = || d (w_b CE_bi) / d V_b ||_2``, the gradient of the
  token's loss term with respect to the image tokens V_b (M, D) fed to the decoder: what training sends into the
  encoder from that token. One backward pass per caption column (captions are independent in the decoder).
* **pmi**, in distribution: the image's information about the token given the same context::

      pmi[b][i] = log p(c_i | ctx, I_b) - log sum_k w_k p(c_i | ctx, I_k),   w_k = p(ctx | I_k) / sum_k' p(ctx | I_k')

  over a pool of P = 1 + `pool` images (the true one first, then the batch rolled by 1..pool): w_k is
  p(I_k | ctx) under a uniform prior over the pool, so an image the context contradicts gets (almost) no weight
  and the marginal never asks how a caption reads under an image it was never seen with (the cue conflict that
  retired the mismatched-image measure). ctx is what the model conditions on: ARC the tokens before i
  (p(ctx | I) by teacher forcing, exact); a masked model the unmasked caption tokens (p(ctx | I) by the chain
  rule over them left to right, each scored with the later ones masked).

Both measures run on **both caption kinds** (``short`` captions and ``clauses``: two-clause captions whose second
clause restates the first, *predictable*, or names other facts, *unpredictable*), always together.

Statistics (per model, kind and measure; :mod:`mdc_workbench.eval.claim_stats`): values divided by the model's mean
over every scored token; relative position x = i / (K - 1); per caption the least-squares **slope** against x; the
**binned profile** (5 equal bins of x), each caption's bin mean minus its own mean (a **bin deviation**; 0 everywhere
= flat); ARC's **fall** (first bin minus last bin). Robustness rows: the slope of log(gradient) (scale-free), and the
slope without the first token and the clause connector. :func:`claim_table` writes them as the ``central_claim``
table of metrics.json with per-caption items (the same captions in every row), which
:mod:`mdc_workbench.eval.paper` tests as docs/evidence.md pre-declares. The retired measures and their numbers:
docs/results.md, "History".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from mdc_core.config import DataConfig, ObjectiveConfig
from mdc_core.data import build_loader
from mdc_core.objectives import apply_mask, maskable_positions, objective_spec, trim_padding
from mdc_core.tokenizer import MASK_ID, CaptionTokenizer
from mdc_workbench.eval.claim_stats import (  # noqa: F401 - the statistics' public names, as before the split
    BINS,
    CAPTION_KINDS,
    CONTRAST,
    MEASURE_LABELS,
    MEASURES,
    Row,
    bin_deviations,
    caption_items,
    claim_markdown,
    claim_table,
    connector_ids,
    model_mean,
    positions,
    slope,
)

# ----------------------------------------------------------------------------------------------------------
# the measure


def token_log_probs(model: torch.nn.Module, image_tokens: Tensor, tokens: Tensor, mask: Tensor | None,
                    select: Tensor | None = None) -> Tensor:
    """log p of each scored caption token, (n,) in row-major order of the scored (B, L) positions.

    tokens (B, L), image_tokens (B, M, D). `mask` None: teacher forcing (column j predicted from columns < j; every
    caption column scored). Otherwise the `mask`ed tokens are replaced by ``[MASK]`` and those listed in `select`
    (default: all masked ones) are scored.
    """
    if mask is None:
        scored = maskable_positions(tokens)[:, 1:]  # (B, L-1) targets in columns 1..
        logits = model.decode(tokens[:, :-1], image_tokens, select=scored, causal=True)  # (n, V_out)
        targets = tokens[:, 1:][scored]
    else:
        select = mask if select is None else select
        logits = model.decode(tokens.masked_fill(mask, MASK_ID), image_tokens, select=select, causal=False)
        targets = tokens[select]
    rows = model.output_index[targets]
    if bool((rows < 0).any()):
        raise ValueError(f"caption token ids {targets[rows < 0].unique()[:5].tolist()} have no row in the model's "
                         "output vocabulary (its corpus vocabulary comes from other captions)")
    return -F.cross_entropy(logits.float(), rows, reduction="none")


def training_draw(tokens: Tensor, objective: ObjectiveConfig | None, causal: bool, gen: torch.Generator
                  ) -> tuple[Tensor | None, Tensor]:
    """One draw of the training conditions: (mask (B, L) or None for teacher forcing, per-caption weight (B,))."""
    if causal:
        return None, torch.ones(len(tokens))
    if objective is None:
        raise ValueError("a masked (bidirectional) model needs its objective config to draw training masks")
    schedule = objective_spec(objective.name).schedule
    t = schedule.draw(objective, len(tokens), gen, "cpu")  # (B,) the training distribution's times
    mask = apply_mask(tokens, schedule.mask_rate(t), generator=gen)[1]
    weight = schedule.weight(t)
    return mask, weight


def token_gradient_norms(model: torch.nn.Module, image_tokens: Tensor, tokens: Tensor, mask: Tensor | None,
                         weight: Tensor) -> Tensor:
    """Per scored token ||d (w_b CE_bi) / d image_tokens_b||_2, (n,) in the order of :func:`token_log_probs`."""
    scored = maskable_positions(tokens) if mask is None else mask
    where = scored.nonzero().cpu()  # (n, 2): caption, column
    leaf = image_tokens.detach().requires_grad_(True)
    out = torch.zeros(len(where), dtype=torch.float64)
    with torch.enable_grad():
        ce = -token_log_probs(model, leaf, tokens, mask) * weight.to(leaf.device)[where[:, 0].to(leaf.device)]
        columns = where[:, 1]
        for j in columns.unique().tolist():  # a token's loss depends only on its own caption's image tokens
            pick = columns == j
            grad = torch.autograd.grad(ce[pick.to(ce.device)].sum(), leaf, retain_graph=True)[0]  # (B, M, D)
            out[pick] = grad.flatten(1).norm(dim=1).double().cpu()[where[pick, 0]]
    return out


def in_distribution_pmi(log_p: Tensor, log_context: Tensor) -> Tensor:
    """log p(token | ctx, pool image 0) - log sum_k w_k p(token | ctx, image k), w = softmax_k log p(ctx | image k).

    log_p, log_context: (P, n), the pool's images along dim 0 with the true image first. Returns (n,) in nats.
    """
    if log_p.shape != log_context.shape or log_p.dim() != 2 or len(log_p) < 2:
        raise ValueError(f"need log_p and log_context of the same shape (P >= 2, n); got {tuple(log_p.shape)} and "
                         f"{tuple(log_context.shape)}")
    marginal = torch.logsumexp(log_p + log_context, 0) - torch.logsumexp(log_context, 0)  # (n,)
    return log_p[0] - marginal


@torch.no_grad()
def context_log_likelihood(model: torch.nn.Module, image_tokens: Tensor, tokens: Tensor, mask: Tensor | None
                           ) -> Tensor:
    """log p(ctx | image) of each scored token's context, (n,) in the order of :func:`token_log_probs`.

    Teacher forcing: the sum of the log-probabilities of the caption tokens before the scored one. Masked: the
    unmasked caption tokens by the chain rule left to right (column j scored with the later unmasked ones and
    the masked ones hidden); the same for every masked token of a caption.
    """
    caption = maskable_positions(tokens)  # (B, L)
    if mask is None:
        per = torch.zeros(tokens.shape, dtype=torch.float64, device=tokens.device)
        per[:, 1:][caption[:, 1:]] = token_log_probs(model, image_tokens, tokens, None).double()
        before = per.cumsum(1) - per  # (B, L) sum over the columns before each
        return before[caption]
    visible = caption & ~mask
    total = torch.zeros(len(tokens), dtype=torch.float64, device=tokens.device)
    columns = torch.arange(tokens.shape[1], device=tokens.device)
    for j in visible.any(0).nonzero().flatten().tolist():
        rows = visible[:, j].nonzero().flatten()  # only the captions whose column j is visible
        hide = mask[rows] | (visible[rows] & (columns >= j))  # column j and the later visible ones hidden
        select = visible[rows] & (columns == j)
        total[rows] += token_log_probs(model, image_tokens[rows], tokens[rows], hide, select).double()
    return total[:, None].expand(tokens.shape)[mask]


@torch.no_grad()
def token_pmi(model: torch.nn.Module, image_tokens: Tensor, tokens: Tensor, mask: Tensor | None, pool: int
              ) -> Tensor:
    """:func:`in_distribution_pmi` of each scored token over the true image and `pool` others of the batch."""
    k = min(pool, len(tokens) - 1)
    if k < 1:
        raise ValueError(f"the PMI needs at least one other image: batch of {len(tokens)}, pool={pool}")
    pool_images = torch.cat([image_tokens.roll(s, dims=0) for s in range(k + 1)])  # (P * B, M, D), true first
    pool_tokens = tokens.repeat(k + 1, 1)  # (P * B, L): the captions under every pool image, one batched pass
    pool_mask = None if mask is None else mask.repeat(k + 1, 1)
    log_p = token_log_probs(model, pool_images, pool_tokens, pool_mask).double().view(k + 1, -1)  # (P, n)
    log_ctx = context_log_likelihood(model, pool_images, pool_tokens, pool_mask).view(k + 1, -1)  # (P, n)
    return in_distribution_pmi(log_p, log_ctx).cpu()


@dataclass
class ClaimScores:
    """Per caption (data order): its group (``all`` on short captions) and per measure its values by position."""

    mode: str
    groups: list[str] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)  # caption token ids, one per position
    gradient: list[Row] = field(default_factory=list)
    pmi: list[Row] = field(default_factory=list)


def score_captions(model: torch.nn.Module, batches: Iterable[tuple[Tensor, Tensor, Sequence[str]]], *,
                   objective: ObjectiveConfig | None = None, draws: int = 4, pool: int = 8, seed: int = 0
                   ) -> ClaimScores:
    """Both measures of every caption under the model's training conditions (module docstring).

    Args:
        model: a captioner (``encode_image``, ``decode``, ``output_index``, ``causal``) in eval mode.
        batches: (images (B, 3, S, S), tokens (B, L), groups (B names)); B >= 2.
        objective: a masked model's objective config (its masking distribution and 1/t weight).
        draws: training-mask draws per batch of a masked model (teacher forcing needs one).
        pool: other images of the batch in the PMI's pool.
        seed: seeds the mask draws (drawn on the CPU: the same on every device).
    """
    check_settings(draws, pool)
    causal = bool(getattr(model, "causal", False))
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    out = ClaimScores("teacher_forcing" if causal else "masked")
    for images, tokens, groups in batches:
        tokens = check_batch(images, tokens, groups)
        image_tokens = model.encode_image(images.to(device)).detach()  # (B, M, D)
        sums = {m: torch.zeros(tokens.shape, dtype=torch.float64) for m in MEASURES}
        counts = torch.zeros(tokens.shape, dtype=torch.float64)
        on_device = tokens.to(device)
        for _ in range(1 if causal else draws):
            mask, weight = training_draw(tokens, objective, causal, gen)
            scored = maskable_positions(tokens) if mask is None else mask
            if not bool(scored.any()):
                continue
            dev_mask = None if mask is None else mask.to(device)
            sums["pmi"][scored] += token_pmi(model, image_tokens, on_device, dev_mask, pool)
            sums["gradient"][scored] += token_gradient_norms(model, image_tokens, on_device, dev_mask, weight)
            counts[scored] += 1
        add_captions(out, tokens, groups, sums, counts)
    return finished(out)


def check_settings(draws: int, pool: int) -> None:
    """ValueError unless `draws` and `pool` are at least 1."""
    if draws < 1 or pool < 1:
        raise ValueError(f"need draws >= 1 and pool >= 1; got {draws}, {pool}")


def check_batch(images: Tensor, tokens: Tensor, groups: Sequence[str]) -> Tensor:
    """The batch's tokens (B, L) on the CPU without the columns that are padding in every row; ValueError unless it
    has >= 2 images and as many captions and groups."""
    if not len(images) == len(tokens) == len(groups) or len(images) < 2:
        raise ValueError(f"a batch needs >= 2 images, as many captions and groups; got {len(images)}, "
                         f"{len(tokens)}, {len(groups)}")
    return trim_padding(tokens.cpu())


def add_captions(out: ClaimScores, tokens: Tensor, groups: Sequence[str], sums: dict[str, Tensor], counts: Tensor
                 ) -> None:
    """Append one batch's captions to `out`: per measure the mean over the draws that scored a position, from the
    sums (B, L) and the counts of scoring draws (B, L); None where no draw scored it."""
    columns = maskable_positions(tokens)
    for measure in MEASURES:
        mean = (sums[measure] / counts.clamp(min=1)).masked_fill(counts == 0, math.nan)
        getattr(out, measure).extend([[None if math.isnan(v) else v for v in mean[b, columns[b]].tolist()]
                                      for b in range(len(tokens))])
    out.tokens.extend(tokens[b, columns[b]].tolist() for b in range(len(tokens)))
    out.groups.extend(str(g) for g in groups)


def finished(out: ClaimScores) -> ClaimScores:
    """`out`, or ValueError when it holds no caption."""
    if not out.groups:
        raise ValueError("no caption to score: the data gave no batch")
    return out


def caption_batches(data: str | Path, image_size: int, context_length: int, *, split: str = "test",
                    batch_size: int = 32, limit: int = 512) -> Iterator[tuple[Tensor, Tensor, list[str]]]:
    """(images, tokens, groups) of the first `limit` samples of `split` (group: ``clause_group`` or ``all``)."""
    if limit < 2 or batch_size < 2:
        raise ValueError(f"limit and batch_size must be >= 2 (got {limit}, {batch_size})")
    tokenizer = CaptionTokenizer(context_length)
    loader = build_loader(DataConfig(path=str(data), shuffle_buffer=0), split=split, image_size=image_size,
                          batch_size=batch_size, shuffle=False, drop_last=False)
    seen = 0
    for batch in loader:
        n = min(len(batch["caption"]), limit - seen)
        if n < 2:  # a last batch of one image has no other image for the pool
            return
        metas = batch.get("meta") or [{}] * n
        yield (batch["image"][:n], tokenizer.tokenize_batch(batch["caption"][:n])[0],
               [str((m or {}).get("clause_group", "all")) for m in metas[:n]])
        seen += n
        if seen >= limit:
            return



# ----------------------------------------------------------------------------------------------------------
# runs, figure, and the consequence for features


def central_claim_runs(pairs: dict[str, Sequence[str | Path]], data: dict[str, str | Path], *, limit: int = 512,
                       draws: int = 4, pool: int = 15, seed: int = 0, device: str = "cpu", batch_size: int = 32,
                       labels: dict[str, str] | None = None) -> dict[str, dict[str, ClaimScores]]:
    """:func:`score_captions` of each run on the first `limit` test captions of its kind's data set.

    `pairs`: ``{kind: [run folders]}`` (kinds of :data:`CAPTION_KINDS`; e.g. an ARC and an MDC run each); `data`:
    ``{kind: data folder}``; rows are named by `labels` (objective -> name; default the objective in capitals).
    Returns ``{kind: {row name: scores}}``, :func:`claim_table`'s input.
    """
    out: dict[str, dict[str, ClaimScores]] = {}
    for kind, runs in pairs.items():
        check_kind(kind, data)
        for run in runs:
            model, cfg, row = claim_model(run, device, labels)
            if row in out.get(kind, {}):
                raise ValueError(f"two {row} runs on the {kind} captions: give one run per objective and kind")
            batches = caption_batches(data[kind], cfg.model.image_size, cfg.model.context_length, limit=limit,
                                      batch_size=batch_size)
            out.setdefault(kind, {})[row] = score_captions(model, batches, objective=cfg.objective, draws=draws,
                                                           pool=pool, seed=seed)
    return out


def check_kind(kind: str, data: dict[str, str | Path]) -> None:
    """ValueError unless `kind` is one of :data:`CAPTION_KINDS` with a data set in `data`."""
    if kind not in CAPTION_KINDS or kind not in data:
        raise ValueError(f"caption kind {kind!r} needs to be one of {', '.join(CAPTION_KINDS)} with a data set")


def claim_model(run: str | Path, device: str, labels: dict[str, str] | None = None) -> tuple[Any, Any, str]:
    """(model, run config, row name) of run folder `run`; ValueError unless it is a captioner."""
    from mdc_core.factory import load_model

    model, cfg = load_model(run, device=device)
    if objective_spec(cfg.objective.name).model != "captioner":
        raise ValueError(f"{run} is a {cfg.objective.name} run: the central claim needs a captioner")
    return model, cfg, (labels or {}).get(cfg.objective.name, cfg.objective.name.upper())


def plot_profiles(table: dict[str, Any], path: str | Path, features: dict[str, Any] | None = None) -> Path:
    """The binned profiles of :func:`claim_table` (mean bin deviation per row), one panel per caption kind and
    measure; a PNG. A table gathered over seeds (a plan summary's, with ``means`` and ``intervals``) is drawn with
    its 95% intervals as error bars; with `features` (the gathered ``feature_order`` table) a last panel shows each
    model's late-position penalty per attribute, with its intervals."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mdc_workbench.eval.figures import save_png

    cols = len(CAPTION_KINDS) + (features is not None)
    fig, axes = plt.subplots(len(MEASURES), cols, figsize=(4.2 * cols, 6.2), squeeze=False)
    means, intervals = table.get("means", table["values"]), table.get("intervals", {})
    for i, measure in enumerate(MEASURES):
        for j, kind in enumerate(CAPTION_KINDS):
            ax, prefix = axes[i][j], f"{kind} {MEASURE_LABELS[measure]}: bin "
            for r, (row, values) in enumerate(means.items()):
                keys = [f"{prefix}{k + 1}" for k in range(BINS)]
                pts = [((k + 0.5) / BINS + 0.012 * (r - 0.5), values[key], intervals.get(row, {}).get(key))
                       for k, key in enumerate(keys) if values.get(key) is not None]
                if not pts:
                    continue
                xs, ys, ci = zip(*pts, strict=True)
                ax.errorbar(xs, ys, yerr=_yerr(ys, ci), marker="o", ms=3, capsize=2, label=row)
            ax.axhline(0.0, color="grey", lw=0.8)
            ax.set_title(f"{kind} captions: {MEASURE_LABELS[measure]}", fontsize=9)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
            if i == len(MEASURES) - 1:
                ax.set_xlabel("relative caption position")
        axes[i][0].set_ylabel("bin minus caption mean\n(model's mean = 1)")
    if features is not None:
        _plot_penalties(axes[0][-1], features)
        axes[1][-1].axis("off")
    bars = " (95% intervals over seeds)" if intervals else ""
    fig.suptitle(f"visual learning signal along the caption, both caption kinds (means over captions){bars}",
                 fontsize=9)
    return save_png(fig, path)


def _yerr(ys: Sequence[float], intervals: Sequence[Any]) -> list[list[float]] | None:
    """Matplotlib's asymmetric error bars (below, above) from 95% intervals; None when a point has none."""
    if any(c is None for c in intervals):
        return None
    pairs = list(zip(ys, intervals, strict=True))
    return [[y - c[0] for y, c in pairs], [c[1] - y for y, c in pairs]]


def _plot_penalties(ax: Any, features: dict[str, Any]) -> None:
    """Each model's late-position penalty (points of probe top-1) per attribute and their mean, with intervals."""
    columns = ["shape: late penalty", "colour: late penalty", "late penalty"]
    means, intervals = features.get("means", features["values"]), features.get("intervals", {})
    width = 0.8 / max(1, len(means))
    for r, (row, values) in enumerate(means.items()):
        xs = [c + (r - (len(means) - 1) / 2) * width for c in range(len(columns))]
        ys = [values.get(c, float("nan")) for c in columns]
        ax.bar(xs, ys, width=width, yerr=_yerr(ys, [intervals.get(row, {}).get(c) for c in columns]), capsize=3,
               label=row)
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(columns)), ["shape", "colour", "mean"])
    ax.set_ylabel("late-position penalty (points):\nattribute named first minus last")
    ax.set_title("consequence for features (linked data)", fontsize=9)
    ax.legend(fontsize=7)


FEATURE_ATTRIBUTES = {"shape": "colour_last", "colour": "shape_last"}  # attribute -> the order that names it first
FEATURE_ORDERS = ("shape_last", "colour_last")


def feature_order_table(results: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """The ``feature_order`` table: ``results[order][row]`` is a probe result
    (:func:`~mdc_workbench.eval.probe_data.probe_run`, tasks ``shape`` and ``colour``) of the model of that row trained
    on that caption order, all probed on the same held-out images. Per row: ``<attribute>: late penalty``, per
    image 100 x (right when the attribute's word comes first) - 100 x (right when it comes last), and ``late
    penalty``, their mean per image; ``<attribute>: top-1, <order>`` descriptive."""
    if set(results) != set(FEATURE_ORDERS):
        raise ValueError(f"need probes after both caption orders {FEATURE_ORDERS}, got {sorted(results)}")
    rows = list(results[FEATURE_ORDERS[0]])
    values: dict[str, dict[str, float]] = {}
    items: dict[str, dict[str, list[float]]] = {}
    for row in rows:
        per: dict[str, list[float]] = {}
        for attribute, first in FEATURE_ATTRIBUTES.items():
            last = next(o for o in FEATURE_ORDERS if o != first)
            right = {o: [100.0 * float(x) for x in results[o][row]["tasks"][attribute]["test_correct"]]
                     for o in FEATURE_ORDERS}
            if len(right[first]) != len(right[last]):
                raise ValueError(f"{row}: the two orders were probed on different test images")
            per[attribute] = [a - b for a, b in zip(right[first], right[last], strict=True)]
            for o in FEATURE_ORDERS:
                items.setdefault(row, {})[f"{attribute}: top-1, {o}"] = right[o]
        per["late penalty"] = [(a + b) / 2 for a, b in zip(per["shape"], per["colour"], strict=True)]
        for name, col in per.items():
            key = name if name == "late penalty" else f"{name}: late penalty"
            items[row][key] = col
        values[row] = {k: sum(v) / len(v) for k, v in items[row].items()}
    return {"metric": "probe top-1 % on held-out images where shape and colour are not linked, after training on "
                      "captions that name the attribute first or last (late penalty: first minus last, points)",
            "values": values, "items": items}
