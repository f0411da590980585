"""Visual reliance by caption position: the direct test of the paper's central argument (``mdc eval visual-reliance``).

The paper (abstract, Sec. 1) argues that an autoregressive captioner needs the image less and less along the
caption, because later words become predictable from the earlier ones, while a masked diffusion captioner's need
does not depend on position. For every caption token this measures how much the image helps predict it:

    reliance = log p(token | true image, context) - log p(token | reference image, context)   (nats)

The reference is another image of the batch (the batch rolled by one: *mismatched*) or, with ``blind``, the
blank mean image (an all-zero input tensor: *blind*). The context is what the objective trains on:

* ``teacher_forcing`` (ARC): the caption's earlier tokens (causal decoder; the exact chain-rule factor).
* ``masked`` (MDC and its relatives): each caption token masked with probability r, the masked tokens predicted
  from the unmasked ones (bidirectional decoder), for ratios r inside the run's *training range* (MDC with
  t ~ U[0.5, 1]: r = 0.5, 0.75, 1; a BERT run: its fixed ratio), `draws` seeded mask draws per ratio (one at
  r = 1). A token's reliance at a ratio is its mean over the draws that masked it; its reliance is the mean over
  the ratios that scored it (equal weight per ratio).

``<eot>`` is not scored. Normalisation, per-caption slopes, binned profiles and their intervals:
:mod:`mdc_core.eval.reliance`. Captions carry a group (the embedded data's ``clauses`` style: ``predictable`` /
``unpredictable``, from each sample's metadata; other data: ``all``), and every statistic is given per group.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mdc_core.checkpoint import load_model
from mdc_core.config import DataConfig
from mdc_core.data import build_loader, read_manifest
from mdc_core.data.captions import CLAUSE_GROUPS, parse_clause_caption
from mdc_core.eval.figures import save_png
from mdc_core.eval.position_signal import scoring_settings, token_losses, training_ratios
from mdc_core.eval.reliance import (
    DEFAULT_BINS,
    N_BOOT,
    SLOPE_UNITS,
    clause_text_check,
    slope_table,
    summarise_runs,
)
from mdc_core.objectives import apply_mask, maskable_positions, objective_spec, trim_padding
from mdc_core.tokenizer import CaptionTokenizer

REFERENCES = ("mismatched", "blind")
DEFINITION = ("log p(token | true image) - log p(token | reference image), nats; reference: another image of the "
              "batch (mismatched) or the blank mean image (blind)")


@dataclass
class RelianceScores:
    """Per caption (data order): its group and, per caption position, the mean loss with the true image and with
    each reference (None: position not scored). ``reliance(ref)`` is reference loss minus true loss."""

    mode: str
    ratios: list[float]
    groups: list[str] = field(default_factory=list)
    loss_true: list[list[float | None]] = field(default_factory=list)
    loss_ref: dict[str, list[list[float | None]]] = field(default_factory=dict)

    def reliance(self, reference: str = "mismatched") -> list[list[float | None]]:
        return [[None if a is None or b is None else b - a for a, b in zip(t, r, strict=True)]
                for t, r in zip(self.loss_true, self.loss_ref[reference], strict=True)]


def _rows(mean: Tensor, scored: Tensor) -> list[list[float | None]]:
    """Per caption, the values of `mean` (B, L) at its caption columns (None where NaN)."""
    out = []
    for b in range(mean.shape[0]):
        values = mean[b, scored[b]].tolist()
        out.append([None if math.isnan(v) else v for v in values])
    return out


@torch.no_grad()
def token_reliance(model: torch.nn.Module, batches: Iterable[tuple[Tensor, Tensor, Sequence[str]]], *,
                   mode: str | None = None, ratios: Sequence[float] = (0.5, 0.75, 1.0), draws: int = 4,
                   seed: int = 0, blind: bool = False) -> RelianceScores:
    """Per-token losses with the true and the reference images (module docstring).

    Args:
        model: a captioner (``encode_image``, ``decode``, ``output_index``) in eval mode; its device is used.
        batches: (images (B, 3, S, S), tokens (B, L), groups (B names)); B >= 2 (the mismatched image comes from
            the batch).
        mode: ``teacher_forcing`` or ``masked``; default from the model (causal decoder -> teacher forcing).
        ratios, draws, seed: the masked mode's masking ratios, mask draws per ratio (seeded).
        blind: also score with the blank mean image (``loss_ref["blind"]``).
    """
    mode, settings = scoring_settings(model, mode, ratios, draws)
    device = next(model.parameters()).device
    refs = ["mismatched", "blind"] if blind else ["mismatched"]
    out = RelianceScores(mode, [] if mode == "teacher_forcing" else [float(r) for r in ratios],
                         loss_ref={r: [] for r in refs})
    gen = torch.Generator().manual_seed(seed)  # masks drawn on the CPU: the same on every device
    for images, tokens, groups in batches:
        if not len(images) == len(tokens) == len(groups):
            raise ValueError(f"batch has {len(images)} images, {len(tokens)} captions and {len(groups)} groups")
        if len(images) < 2:
            raise ValueError("visual reliance needs batches of >= 2 images (the mismatched image comes from the batch)")
        tokens = trim_padding(tokens.cpu())
        images = images.to(device)
        image_tokens = model.encode_image(images)  # (B, M, D)
        conditions = {"true": image_tokens, "mismatched": image_tokens.roll(1, dims=0)}  # caption b, image b-1
        if blind:
            conditions["blind"] = model.encode_image(torch.zeros_like(images))
        shape = (len(settings), *tokens.shape)
        sums = {k: torch.zeros(shape, dtype=torch.float64) for k in conditions}
        counts = torch.zeros(shape, dtype=torch.float64)
        dev_tokens = tokens.to(device)
        for s, (ratio, n_draws) in enumerate(settings):
            for _ in range(n_draws):
                mask = None if ratio is None else apply_mask(tokens, torch.full((len(tokens),), ratio),
                                                             generator=gen)[1]
                scored = maskable_positions(tokens) if mask is None else mask
                if not bool(scored.any()):
                    continue
                dev_mask = None if mask is None else mask.to(device)
                for key, cond in conditions.items():
                    sums[key][s][scored] += token_losses(model, cond, dev_tokens, dev_mask).double().cpu()
                counts[s][scored] += 1
        caption_cols = maskable_positions(tokens)
        for key, total in sums.items():
            per_setting = total / counts.clamp(min=1)
            mean = torch.nanmean(per_setting.masked_fill(counts == 0, math.nan), dim=0)  # (B, L)
            rows = _rows(mean, caption_cols)
            (out.loss_true if key == "true" else out.loss_ref[key]).extend(rows)
        out.groups.extend(str(g) for g in groups)
    if not out.groups:
        raise ValueError("no caption to score: the data gave no batch")
    return out


# ----------------------------------------------------------------------------------------------------------
# runs on a data set, JSON, table and plot


def grouped_batches(data: str | Path, split: str, image_size: int, context_length: int, batch_size: int, limit: int,
             images: str | Path | None = None, texts: list[str] | None = None
             ) -> Iterator[tuple[Tensor, Tensor, list[str]]]:
    """(images, tokens, groups) of the first `limit` samples of `split`; their captions are appended to `texts`."""
    tokenizer = CaptionTokenizer(context_length)
    cfg = DataConfig(path=str(data), images=str(images or ""), shuffle_buffer=0)
    loader = build_loader(cfg, split=split, image_size=image_size, batch_size=batch_size, shuffle=False,
                          drop_last=False)
    seen = 0
    for batch in loader:
        n = min(len(batch["caption"]), limit - seen)
        if n < 2:  # a last batch of one image has no mismatched partner
            return
        metas = batch.get("meta") or [{}] * n
        groups = [str((m or {}).get("clause_group", "all")) for m in metas[:n]]
        if texts is not None:
            texts.extend(batch["caption"][:n])
        yield batch["image"][:n], tokenizer.tokenize_batch(batch["caption"][:n])[0], groups
        seen += n
        if seen >= limit:
            return


def _round(rows: list[list[float | None]]) -> list[list[float | None]]:
    return [[None if v is None else round(v, 5) for v in row] for row in rows]


def visual_reliance_runs(runs: Sequence[str | Path], data: str | Path, *, split: str = "test", limit: int = 512,
                         batch_size: int = 32, ratios: Sequence[float] | None = None, draws: int = 4,
                         seed: int = 0, device: str = "cpu", ema: bool = False, images: str | Path | None = None,
                         blind: bool = False, bins: int = DEFAULT_BINS, n_boot: int = N_BOOT) -> dict[str, Any]:
    """:func:`token_reliance` of each run on the first `limit` captions of `split`, summarised per caption group
    (:func:`mdc_core.eval.reliance.summarise_runs`; differences: each later run minus the first). `ratios` None:
    each masked run's training range (:func:`training_ratios`). A JSON-ready dict ``{"data", "split", "limit",
    "seed", "draws", "definition", "slope_units", "groups", "references", "runs": [{"run", "objective", "mode",
    "ratios", "loss_true", "loss_<reference>" per caption and position}], "<reference>": summary}``."""
    if not runs:
        raise ValueError("give at least one run")
    if limit < 2 or batch_size < 2:
        raise ValueError(f"limit and batch_size must be >= 2 (got {limit}, {batch_size})")
    scores, out_runs, texts = [], [], []
    for run in runs:
        model, cfg = load_model(run, device=device, ema=ema)
        if objective_spec(cfg.objective.name).model != "captioner":
            raise ValueError(f"{run} is a {cfg.objective.name} run: visual reliance needs a captioner (a CLIP run "
                             "has no per-token likelihood)")
        batches = grouped_batches(data, split, cfg.model.image_size, cfg.model.context_length, batch_size, limit,
                                  images, texts if not scores else None)
        mode = "teacher_forcing" if getattr(model, "causal", False) else "masked"
        run_ratios = tuple(ratios) if ratios else training_ratios(cfg)
        result = token_reliance(model, batches, mode=mode, ratios=run_ratios, draws=draws, seed=seed, blind=blind)
        scores.append(result)
        out_runs.append({"run": str(run), "objective": cfg.objective.name, "mode": result.mode,
                         "ratios": result.ratios, "loss_true": _round(result.loss_true),
                         **{f"loss_{k}": _round(v) for k, v in result.loss_ref.items()}})
    groups = scores[0].groups
    if any(s.groups != groups for s in scores):
        raise ValueError("the runs scored different captions (their data gave different batches): compare runs "
                         "with the same image size and context length")
    references = list(scores[0].loss_ref)
    out: dict[str, Any] = {"data": str(data), "split": split, "limit": limit, "seed": seed, "draws": draws,
                           "definition": DEFINITION, "slope_units": SLOPE_UNITS, "groups": groups,
                           "references": references, "runs": out_runs}
    for ref in references:
        out[ref] = summarise_runs([s.reliance(ref) for s in scores], groups, bins=bins, n_boot=n_boot, seed=seed,
                                  contrast=CLAUSE_GROUPS)
    if set(groups) <= set(CLAUSE_GROUPS):  # the embedded two-clause captions: check the split on their text
        vocab = read_manifest(data)["vocab"]
        out["text_check"] = clause_text_check([parse_clause_caption(t, vocab) for t in texts])
    return out


def reliance_table(result: dict[str, Any], labels: dict[str, str] | None = None,
                   reference: str = "mismatched") -> dict[str, Any]:
    """The ``reliance_slope`` table (metrics.json layout) of :func:`visual_reliance_runs`: rows = runs named by
    `labels` (objective -> row name, default upper case), columns = caption groups, items = per-caption slopes."""
    labels = labels or {}
    rows = [labels.get(r["objective"], r["objective"].upper()) for r in result["runs"]]
    slopes = [r["slopes"] for r in result[reference]["runs"]]
    table = slope_table(slopes, result["groups"], rows)
    table["metric"] += f" (reference image: {reference})"
    return table


def plot_visual_reliance(result: dict[str, Any], path: str | Path, labels: dict[str, str] | None = None,
                         references: Sequence[str] | None = None) -> Path:
    """Normalised reliance vs relative caption position: one row of panels per reference image (default: every
    one the result has), one panel per caption group, one line per run with its 95% band (bootstrap over
    captions); a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = labels or {}
    references = list(references or result["references"])
    groups = result[references[0]]["groups"]
    fig, axes = plt.subplots(len(references), len(groups), figsize=(4.2 * len(groups), 3.3 * len(references)),
                             sharey="row", squeeze=False)
    for row, reference in zip(axes, references, strict=True):
        summary = result[reference]
        for ax, group in zip(row, groups, strict=True):
            _reliance_panel(ax, result["runs"], summary, group, labels)
            ax.set_title(f"{group} captions, {reference} image", fontsize=9)
        row[0].set_ylabel("reliance / model's mean")
    for ax in axes[-1]:
        ax.set_xlabel("relative caption position (0 = first token, 1 = last)")
    fig.suptitle("visual reliance along the caption: log p(true image) - log p(reference image), normalised "
                 "(95% bootstrap bands over captions)", fontsize=9)
    return save_png(fig, path)


def _reliance_panel(ax: Any, runs: list[dict[str, Any]], summary: dict[str, Any], group: str,
                    labels: dict[str, str]) -> None:
    xs = summary["bin_centres"]
    for run, stats in zip(runs, summary["runs"], strict=True):
        name = labels.get(run["objective"], run["objective"].upper())
        prof, slope = stats["profile"][group], stats["slope"][group]
        if slope["mean"] is None:
            continue
        pts = [(x, m, lo, hi) for x, m, lo, hi in zip(xs, prof["mean"], prof["low"], prof["high"], strict=True)
               if m is not None]
        line = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3,
                       label=f"{name}: slope {interval_text(slope)}")[0]
        band = [p for p in pts if p[2] is not None]
        ax.fill_between([p[0] for p in band], [p[2] for p in band], [p[3] for p in band], color=line.get_color(),
                        alpha=0.2)
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.axhline(0.0, color="grey", lw=0.8)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no run with a mean reliance above 0", ha="center", transform=ax.transAxes)


def save_result(result: dict[str, Any], path: str | Path) -> Path:
    """Write :func:`visual_reliance_runs`'s result (per-token losses included) as JSON to `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result) + "\n")
    return path


def compact(result: dict[str, Any]) -> dict[str, Any]:
    """`result` without the per-token losses (what a notebook's metrics.json keeps; the full result is its own
    file)."""
    return {**result, "runs": [{k: v for k, v in r.items() if not k.startswith("loss_")} for r in result["runs"]]}


def reliance_markdown(result: dict[str, Any], labels: dict[str, str] | None = None) -> str:
    """Markdown: per reference image, each run's mean reliance and its slope per caption group with the 95%
    interval, the paired differences, then the text check of the caption split (when the data have one)."""
    labels = labels or {}
    names = [labels.get(r["objective"], r["objective"].upper()) for r in result["runs"]]
    lines = []
    for ref in result["references"]:
        summary = result[ref]
        groups = summary["groups"]
        counts = {g: result["groups"].count(g) for g in groups}
        head = " | ".join(f"{g} ({counts[g]} captions)" for g in groups)
        lines += [f"**Reliance slope** against the {ref} image (normalised by each model's mean reliance; 95% "
                  "bootstrap over captions; < 0: the reliance falls along the caption)", "",
                  f"| model | mean reliance (nats) | {head} |", "|---" * (len(groups) + 2) + "|"]
        for name, stats in zip(names, summary["runs"], strict=True):
            cells = [interval_text(stats["slope"][g]) for g in groups]
            lines.append(f"| {name} | {stats['mean_reliance']:+.3f} | " + " | ".join(cells) + " |")
        pairs = {(d["run"], d["minus"]): {} for diffs in summary["differences"].values() for d in diffs}
        for g, diffs in summary["differences"].items():
            for d in diffs:
                pairs[(d["run"], d["minus"])][g] = interval_text(d)
        for (j, i), cells in pairs.items():
            lines.append(f"| {names[j]} - {names[i]} (paired) | | " + " | ".join(cells.get(g, "-") for g in groups)
                         + " |")
        lines.append("")
        for c in summary.get("contrasts", []):
            who = names[c["run"]] if c["minus"] is None else f"{names[c['run']]} minus {names[c['minus']]}"
            lines.append(f"- {who}: slope on {c['groups'][0]} minus on {c['groups'][1]} captions "
                         f"{interval_text(c)}")
        lines.append("")
    check = result.get("text_check")
    if check:
        lines += ["**The caption split, from the text alone** (scene words of each clause: share restating the "
                  "earlier clause; conditional entropy given the earlier clause's word for that fact):", "",
                  "| group | clause | words | restated | entropy (bits) |", "|---|---|---|---|---|"]
        for group, stats in check.items():
            for clause in ("first", "second"):
                c = stats[clause]
                lines.append(f"| {group} | {clause} | {c['words']} | {c['restated']:.2f} | {c['entropy_bits']:.2f} |")
    return "\n".join(lines)


def interval_text(est: dict[str, Any]) -> str:
    """``+m.mm [+l.ll, +h.hh]`` of a slope or difference dict (``-`` without a mean)."""
    if est["mean"] is None:
        return "-"
    if est.get("low") is None:
        return f"{est['mean']:+.2f}"
    return f"{est['mean']:+.2f} [{est['low']:+.2f}, {est['high']:+.2f}]"
