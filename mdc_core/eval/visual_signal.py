"""The visual learning signal per caption position, as the paper means it (``mdc_core.eval.visual_signal``).

The paper (abstract, Sec. 1) argues that an autoregressive captioner's *visual learning signal* weakens at later
caption positions, because later words become predictable from the earlier ones, while "the strength of the
visual learning signal in MDC does not depend on each token's position". Two per-token measures, each under the
model's own training conditions:

* **gradient** (the learning signal itself): for caption b and its caption position i, the L2 norm of the
  gradient of that token's training loss term with respect to the image tokens fed to the decoder (the encoder's
  output V_b, shape (M, D))::

      g[b][i] = || d (w_b * CE_bi) / d V_b ||_2

  This is what training sends back into the encoder from that token. ARC: teacher forcing (CE of token i given
  ``<sot>`` and the tokens before it; w = 1). Masked objectives (MDC and its relatives): each draw takes a masking
  ratio per caption from the run's *training distribution* (:func:`mdc_core.objectives.mask_rates`: MDC's
  t ~ U[t_low, t_high], BERT's fixed ratio, 1 for parallel), masks each caption token with it, and scores the
  masked tokens; w_b = 1/t_b where the objective weights its loss so (MDC), else 1. A token's value is its mean
  over the draws that masked it (`draws` seeded draws; never ratio 1 alone, where position independence would
  hold by construction). Captions are independent in the decoder, so one backward pass per caption column gives
  every caption's gradient at that column. The cost is bounded by `grad_limit` (captions measured) and `draws`.
* **pmi** (an in-distribution information measure beside it): a pointwise mutual information estimate between
  the token and the image, given the same context::

      pmi[b][i] = log p(c_i | context, image_b) - log( (1/K) sum_k p(c_i | context, image_{b-k}) )   (nats)

  over K = min(`pmi_images`, B - 1) other test images of the batch (the batch rolled by 1..K); the mean over
  other images estimates p(c_i | context) with the image marginalised out, instead of asking how one
  mismatched image (never seen with this caption) misleads the model.

``<eot>`` is not scored. The statistics are those of the older reliance measure (:mod:`mdc_core.eval.reliance`):
each model's values are divided by its own mean (so ARC and MDC compare on the shape of the profile), a
per-caption least-squares slope against relative position is one test item, per caption group
(``predictable`` / ``unpredictable`` second clause of the embedded two-clause captions). :func:`signal_table`
writes the ``visual_signal`` table of metrics.json whose columns carry the pre-declared tests
(docs/evidence.md): per measure the slope on each group and the group contrast (predictable minus
unpredictable), whose difference between ARC and MDC is the interaction the claim tests.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mdc_core.checkpoint import load_model
from mdc_core.config import ObjectiveConfig
from mdc_core.data.captions import CLAUSE_GROUPS
from mdc_core.eval.figures import save_png
from mdc_core.eval.paper_claims import SIGNAL_CONTRAST
from mdc_core.eval.position_signal import token_losses
from mdc_core.eval.reliance import DEFAULT_BINS, N_BOOT, summarise_runs
from mdc_core.eval.visual_reliance import grouped_batches, interval_text
from mdc_core.objectives import apply_mask, mask_rates, maskable_positions, objective_spec, trim_padding

MEASURES = ("gradient", "pmi")
MEASURE_LABELS = {"gradient": "gradient", "pmi": "PMI"}
DEFINITIONS = {
    "gradient": "L2 norm of the gradient of the token's training loss term (w * CE) with respect to the image "
                "tokens fed to the decoder, under the model's training conditions",
    "pmi": "log p(token | context, true image) - log mean_k p(token | context, image_k) over K other test images "
           "(nats)"}
CONTRAST = SIGNAL_CONTRAST


def column(measure: str, group: str) -> str:
    """Column name of the ``visual_signal`` table: ``"gradient: predictable"``, ``"PMI: predictable -
    unpredictable"``."""
    return f"{MEASURE_LABELS[measure]}: {group}"


@dataclass
class SignalScores:
    """Per caption (data order): its group and, per caption position, each measure's value (None: not scored;
    ``gradient`` only for the first `grad_limit` captions)."""

    mode: str
    groups: list[str] = field(default_factory=list)
    gradient: list[list[float | None]] = field(default_factory=list)
    pmi: list[list[float | None]] = field(default_factory=list)


def _training_masks(tokens: Tensor, objective: ObjectiveConfig | None, causal: bool, gen: torch.Generator
                    ) -> tuple[Tensor | None, Tensor]:
    """One draw of the training conditions: (mask (B, L) or None for teacher forcing, per-caption weight (B,))."""
    if causal:
        return None, torch.ones(len(tokens))
    if objective is None:
        raise ValueError("a masked (bidirectional) model needs its objective config to draw training masks")
    t = mask_rates(objective, len(tokens), gen, "cpu")  # (B,) the training distribution's ratios
    mask = apply_mask(tokens, t, generator=gen)[1]
    weight = 1.0 / t if objective_spec(objective.name).inv_t_weight else torch.ones_like(t)
    return mask, weight


def token_gradient_norms(model: torch.nn.Module, image_tokens: Tensor, tokens: Tensor, mask: Tensor | None,
                         weight: Tensor) -> Tensor:
    """Per scored token, ||d (w_b * CE_bi) / d image_tokens_b||_2; (n,) in the order of :func:`token_losses`.

    image_tokens (B, M, D) (detached here), tokens (B, L), mask (B, L) or None (teacher forcing), weight (B,).
    One backward pass per caption column: a token's loss depends only on its own caption's image tokens.
    """
    scored = maskable_positions(tokens) if mask is None else mask  # (B, L) caption columns scored
    where = scored.nonzero().cpu()  # (n, 2): caption, column, in the order token_losses returns
    leaf = image_tokens.detach().requires_grad_(True)
    out = torch.zeros(len(where), dtype=torch.float64)
    with torch.enable_grad():
        ce = token_losses(model, leaf, tokens, mask) * weight.to(leaf.device)[where[:, 0].to(leaf.device)]  # (n,)
        columns = where[:, 1]
        for j in columns.unique().tolist():
            pick = columns == j
            grad = torch.autograd.grad(ce[pick.to(ce.device)].sum(), leaf, retain_graph=True)[0]  # (B, M, D)
            norms = grad.flatten(1).norm(dim=1).double().cpu()  # (B,) only this column's captions are nonzero
            out[pick] = norms[where[pick, 0]]
    return out


@torch.no_grad()
def token_pmi(model: torch.nn.Module, image_tokens: Tensor, tokens: Tensor, mask: Tensor | None,
              others: int) -> Tensor:
    """Per scored token, log p(token | true image) - log mean_k p(token | image of caption b - k), k = 1..K with
    K = min(others, B - 1); (n,) in the order of :func:`token_losses`."""
    k = min(others, len(tokens) - 1)
    if k < 1:
        raise ValueError(f"PMI needs at least one other image: batch of {len(tokens)}, pmi_images={others}")
    true = -token_losses(model, image_tokens, tokens, mask).double()  # (n,)
    other = torch.stack([-token_losses(model, image_tokens.roll(s, dims=0), tokens, mask).double()
                         for s in range(1, k + 1)])  # (K, n)
    return (true - (torch.logsumexp(other, dim=0) - math.log(k))).cpu()


def _rows(total: Tensor, count: Tensor, columns: Tensor, first: int = 0, stop: int | None = None
          ) -> list[list[float | None]]:
    """Per caption (rows first..stop), the mean at its caption columns (None where nothing was scored)."""
    mean = (total / count.clamp(min=1)).masked_fill(count == 0, math.nan)
    out = []
    for b in range(first, len(total) if stop is None else stop):
        out.append([None if math.isnan(v) else v for v in mean[b, columns[b]].tolist()])
    return out


def visual_signal(model: torch.nn.Module, batches: Iterable[tuple[Tensor, Tensor, Sequence[str]]], *,
                  objective: ObjectiveConfig | None = None, draws: int = 4, grad_limit: int = 64,
                  pmi_images: int = 8, seed: int = 0) -> SignalScores:
    """Per-token gradient norms and PMI under the model's training conditions (module docstring).

    Args:
        model: a captioner (``encode_image``, ``decode``, ``output_index``, ``causal``) in eval mode.
        batches: (images (B, 3, S, S), tokens (B, L), groups (B names)); B >= 2.
        objective: the run's objective config (masked models: its masking distribution and 1/t weight).
        draws: training-mask draws per batch of a masked model (teacher forcing needs one).
        grad_limit: captions (the first ones) whose gradients are measured (0: none; the PMI covers all).
        pmi_images: K, other images of the batch the PMI's marginal averages over.
        seed: seeds the mask draws (drawn on the CPU: the same on every device).
    """
    if draws < 1 or grad_limit < 0 or pmi_images < 1:
        raise ValueError(f"need draws >= 1, grad_limit >= 0 and pmi_images >= 1; got {draws}, {grad_limit}, "
                         f"{pmi_images}")
    causal = bool(getattr(model, "causal", False))
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    out = SignalScores("teacher_forcing" if causal else "masked")
    seen = 0
    for images, tokens, groups in batches:
        if not len(images) == len(tokens) == len(groups) or len(images) < 2:
            raise ValueError(f"a batch needs >= 2 images, as many captions and groups; got {len(images)}, "
                             f"{len(tokens)}, {len(groups)}")
        tokens = trim_padding(tokens.cpu())
        image_tokens = model.encode_image(images.to(device)).detach()  # (B, M, D)
        n_grad = max(0, min(len(tokens), grad_limit - seen))
        sums = {m: torch.zeros(tokens.shape, dtype=torch.float64) for m in MEASURES}
        counts = {m: torch.zeros(tokens.shape, dtype=torch.float64) for m in MEASURES}
        dev_tokens = tokens.to(device)
        for _ in range(1 if causal else draws):
            mask, weight = _training_masks(tokens, objective, causal, gen)
            scored = maskable_positions(tokens) if mask is None else mask
            if not bool(scored.any()):
                continue
            dev_mask = None if mask is None else mask.to(device)
            sums["pmi"][scored] += token_pmi(model, image_tokens, dev_tokens, dev_mask, pmi_images)
            counts["pmi"][scored] += 1
            if n_grad:
                sub_mask = None if mask is None else mask[:n_grad]
                sub = maskable_positions(tokens[:n_grad]) if mask is None else sub_mask
                if bool(sub.any()):
                    sums["gradient"][:n_grad][sub] += token_gradient_norms(
                        model, image_tokens[:n_grad], dev_tokens[:n_grad],
                        None if sub_mask is None else sub_mask.to(device), weight[:n_grad])
                    counts["gradient"][:n_grad][sub] += 1
        columns = maskable_positions(tokens)
        out.pmi.extend(_rows(sums["pmi"], counts["pmi"], columns))
        out.gradient.extend(_rows(sums["gradient"], counts["gradient"], columns, 0, n_grad))
        out.groups.extend(str(g) for g in groups)
        seen += len(tokens)
    if not out.groups:
        raise ValueError("no caption to score: the data gave no batch")
    return out


# ----------------------------------------------------------------------------------------------------------
# runs on a data set, the metrics.json table, markdown and figure


def visual_signal_runs(runs: Sequence[str | Path], data: str | Path, *, split: str = "test", limit: int = 512,
                       grad_limit: int = 64, batch_size: int = 32, draws: int = 4, pmi_images: int = 8,
                       seed: int = 0, device: str = "cpu", ema: bool = False, images: str | Path | None = None,
                       bins: int = DEFAULT_BINS, n_boot: int = N_BOOT) -> dict[str, Any]:
    """:func:`visual_signal` of each run on the first `limit` captions of `split` (gradients on the first
    `grad_limit` of them), summarised per measure and caption group by
    :func:`mdc_core.eval.reliance.summarise_runs` (normalised per-caption slopes, bootstrap intervals over
    captions, the group contrast per run and between runs). A JSON-ready dict ``{"data", "split", "limit",
    "grad_limit", "draws", "pmi_images", "seed", "definitions", "groups", "runs": [{"run", "objective", "mode"}],
    "gradient": summary, "pmi": summary}`` (a measure none of whose captions was scored is left out)."""
    if not runs:
        raise ValueError("give at least one run")
    if limit < 2 or batch_size < 2:
        raise ValueError(f"limit and batch_size must be >= 2 (got {limit}, {batch_size})")
    scores, out_runs = [], []
    for run in runs:
        model, cfg = load_model(run, device=device, ema=ema)
        if objective_spec(cfg.objective.name).model != "captioner":
            raise ValueError(f"{run} is a {cfg.objective.name} run: the visual signal needs a captioner")
        batches = grouped_batches(data, split, cfg.model.image_size, cfg.model.context_length, batch_size, limit,
                                  images)
        result = visual_signal(model, batches, objective=cfg.objective, draws=draws, grad_limit=grad_limit,
                               pmi_images=pmi_images, seed=seed)
        scores.append(result)
        out_runs.append({"run": str(run), "objective": cfg.objective.name, "mode": result.mode})
    return {"data": str(data), "split": split, "limit": limit, "grad_limit": grad_limit, "draws": draws,
            "pmi_images": pmi_images, **signal_result(scores, out_runs, seed=seed, bins=bins, n_boot=n_boot)}


def signal_result(scores: Sequence[SignalScores], runs: Sequence[dict[str, Any]], *, seed: int = 0,
                  bins: int = DEFAULT_BINS, n_boot: int = N_BOOT) -> dict[str, Any]:
    """The summary part of :func:`visual_signal_runs` from the runs' scores (`runs`: per run a dict with at least
    ``"objective"``): ``{"seed", "definitions", "groups", "runs", "gradient", "pmi"}``."""
    groups = scores[0].groups
    if any(s.groups != groups for s in scores):
        raise ValueError("the runs scored different captions: compare runs with the same image size and context "
                         "length")
    out: dict[str, Any] = {"seed": seed, "definitions": DEFINITIONS, "groups": groups, "runs": list(runs)}
    for measure in MEASURES:
        values = [getattr(s, measure) for s in scores]
        n = len(values[0])
        if n < 2:
            continue
        out[measure] = summarise_runs(values, groups[:n], bins=bins, n_boot=n_boot, seed=seed,
                                      contrast=CLAUSE_GROUPS)
    return out


def paired_contrast(slopes: Sequence[float | None], groups: Sequence[str], a: str = CLAUSE_GROUPS[0],
                    b: str = CLAUSE_GROUPS[1]) -> list[float]:
    """Test items of a group contrast: the k-th caption of group `a` paired with the k-th of group `b` (data
    order, captions with a slope only; the unmatched excess of the larger group left out), each item the
    difference of the two slopes. Their mean estimates mean(a) - mean(b); their variance over n pairs is
    (var_a + var_b) / n, as for two independent groups."""
    first = [s for s, g in zip(slopes, groups, strict=True) if g == a and s is not None]
    second = [s for s, g in zip(slopes, groups, strict=True) if g == b and s is not None]
    return [x - y for x, y in zip(first, second, strict=False)]


def signal_table(result: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The ``visual_signal`` table (metrics.json layout) of :func:`visual_signal_runs`: rows = runs (named by
    `labels`, objective -> row name), columns = per measure the mean normalised slope on each caption group and
    the group contrast (:func:`paired_contrast`); items = per-caption slopes (captions every normalised run has
    a slope for) and the contrast's paired items. Runs whose mean is not resolved above 0 are left out."""
    labels = labels or {}
    values: dict[str, dict[str, float]] = {}
    items: dict[str, dict[str, list[float]]] = {}
    for measure in MEASURES:
        summary = result.get(measure)
        if summary is None:
            continue
        groups = result["groups"][:len(summary["runs"][0]["slopes"])]
        kept = [(labels.get(r["objective"], r["objective"].upper()), s["slopes"])
                for r, s in zip(result["runs"], summary["runs"], strict=True) if s["normalised"]]
        common = [i for i in range(len(groups)) if all(sl[i] is not None for _, sl in kept)]
        for name, slopes in kept:
            aligned = [slopes[i] for i in common]
            own = [groups[i] for i in common]
            for group in dict.fromkeys(own):
                col = [float(s) for s, g in zip(aligned, own, strict=True) if g == group]
                items.setdefault(name, {})[column(measure, group)] = col
                values.setdefault(name, {})[column(measure, group)] = sum(col) / len(col)
            pairs = paired_contrast(aligned, own)
            if pairs:
                items[name][column(measure, CONTRAST)] = pairs
                values[name][column(measure, CONTRAST)] = sum(pairs) / len(pairs)
    return {"metric": "visual learning signal: per-caption slope of the normalised per-token measure against "
                      "relative caption position (gradient: image-gradient norm; PMI: log p(true image) - log "
                      "mean over other images); < 0: it falls along the caption; contrast: predictable minus "
                      "unpredictable captions", "values": values, "items": items}


def signal_markdown(result: dict[str, Any], labels: dict[str, str] | None = None) -> str:
    """Markdown: per measure, each run's mean and normalised slope per caption group with 95% intervals (bootstrap
    over captions, one training seed), its group contrast and the interaction (a later run minus the first)."""
    labels = labels or {}
    names = [labels.get(r["objective"], r["objective"].upper()) for r in result["runs"]]
    lines = []
    for measure in MEASURES:
        summary = result.get(measure)
        if summary is None:
            continue
        groups = summary["groups"]
        lines += [f"**{MEASURE_LABELS[measure]}** ({DEFINITIONS[measure]}); slope of the value normalised by the "
                  "model's mean against relative position, 95% bootstrap over captions:", "",
                  f"| model | mean | {' | '.join(groups)} |", "|---" * (len(groups) + 2) + "|"]
        for name, stats in zip(names, summary["runs"], strict=True):
            cells = [interval_text(stats["slope"][g]) for g in groups]
            lines.append(f"| {name} | {stats['mean_reliance']:.4g} | " + " | ".join(cells) + " |")
        lines.append("")
        for c in summary.get("contrasts", []):
            who = names[c["run"]] if c["minus"] is None else f"{names[c['run']]} minus {names[c['minus']]}"
            lines.append(f"- {who}: slope on {c['groups'][0]} minus on {c['groups'][1]} captions {interval_text(c)}")
        lines.append("")
    return "\n".join(lines)


def plot_visual_signal(result: dict[str, Any], path: str | Path, labels: dict[str, str] | None = None) -> Path:
    """Normalised profiles along the caption: one row of panels per measure, one panel per caption group, one line
    per run with its 95% band (bootstrap over captions); a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mdc_core.eval.visual_reliance import _reliance_panel

    measures = [m for m in MEASURES if m in result]
    if not measures:
        raise ValueError("the result has no measured visual signal to plot")
    groups = result[measures[0]]["groups"]
    fig, axes = plt.subplots(len(measures), len(groups), figsize=(4.2 * len(groups), 3.3 * len(measures)),
                             sharey="row", squeeze=False)
    for row, measure in zip(axes, measures, strict=True):
        for ax, group in zip(row, groups, strict=True):
            _reliance_panel(ax, result["runs"], result[measure], group, labels or {})
            ax.set_title(f"{group} captions: {MEASURE_LABELS[measure]}", fontsize=9)
        row[0].set_ylabel("value / model's mean")
    for ax in axes[-1]:
        ax.set_xlabel("relative caption position (0 = first token, 1 = last)")
    fig.suptitle("visual learning signal along the caption under training conditions (95% bootstrap bands over "
                 "captions)", fontsize=9)
    return save_png(fig, path)
