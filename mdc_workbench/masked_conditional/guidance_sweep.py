"""The guidance-scale sweep of MC-Diffusion (its Tables 3-4 and the trade-off figure) on the workbench.

For each captioner (an MC-Diffusion run sampled with the D3PM sampler, an MDC run with the confidence sampler), each
guidance mode (``cfg``, ``mcs``, ...) and each scale w, caption the same images, score the captions with reference-based
metrics (:func:`mdc_workbench.eval.caption_metrics.caption_metrics`) and CLIPScore
(:mod:`mdc_workbench.masked_conditional.clipscore`), and plot CLIPScore against each reference-based metric, one line
per mode with its points labelled by w, as the paper's figure.

References on the embedded data (:func:`synthetic_references`): the image's own short caption plus further
short captions of the same scene drawn from the caption generator with fresh seeds (COCO-style multiple
references; the generator is deterministic, so they are the same on every run).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from mdc_core.config import SamplerConfig
from mdc_core.sampler import sample
from mdc_core.tokenizer import CaptionTokenizer
from mdc_workbench.data.captions import short_caption
from mdc_workbench.data.scene import example_rng, heldout_combos, sample_scene, split_id
from mdc_workbench.eval.caption_metrics import score_captions
from mdc_workbench.masked_conditional.clipscore import CLIPScorer, clip_scores
from mdc_workbench.masked_conditional.diffusion import d3pm_sample
from mdc_workbench.masked_conditional.guidance import GuidanceConfig, GuidedCaptioner

REFERENCE_SEED_OFFSET = 10_000  # caption-generator seeds of the extra references: [seed, split, index, 10_000 + k]


def synthetic_references(meta: dict[str, Any], n: int = 5) -> list[str]:
    """Up to `n` distinct short captions of the embedded-data image described by `meta` (its KEY.json): its own
    short caption first, then fresh draws of the short-caption generator on the same scene."""
    seed, split, index = int(meta["seed"]), str(meta["split"]), int(meta["index"])
    scene = sample_scene(example_rng(seed, split, index), set(heldout_combos(seed)), compgen=split == "compgen")
    refs = [meta["short_caption"]]
    for k in range(20 * n):
        if len(refs) >= n:
            break
        caption = short_caption(scene, np.random.default_rng([seed, split_id(split), index,
                                                              REFERENCE_SEED_OFFSET + k]))[1]
        if caption not in refs:
            refs.append(caption)
    return refs


@dataclass
class SweepRun:
    """One captioner of the sweep."""

    name: str  # label in tables and plots, e.g. "MC-Diffusion"
    model: Any  # a Captioner
    sampler: str  # "d3pm" (T-step ancestral) | "mdc" (confidence unmasking)
    modes: Sequence[str] = ("cfg", "mcs")  # guidance modes to sweep (GuidanceConfig.mode)
    steps: int = 100  # d3pm: T (the run's objective.d3pm_steps)
    p_mask: float = 0.1  # mask rate of the reference condition (the run's objective.p_mask)


# sampler name -> (model, image tokens (B, M, D), length, run, seed) -> caption token ids (B, N)
SAMPLERS: dict[str, Callable[..., torch.Tensor]] = {
    "d3pm": lambda model, y, length, run, seed, stride: d3pm_sample(model, y, length, steps=run.steps, stride=stride,
                                                                    seed=seed).tokens,
    "mdc": lambda model, y, length, run, seed, stride: sample(model, y, SamplerConfig(length=length)).tokens,
}


@torch.no_grad()
def caption_images(run: SweepRun, images: torch.Tensor, guidance: GuidanceConfig, *, length: int, seed: int = 0,
                   stride: int = 1, batch_size: int = 64) -> list[str]:
    """Captions (texts) of normalised images (B, 3, H, W) by `run`'s sampler under `guidance`."""
    if run.sampler not in SAMPLERS:
        raise ValueError(f"unknown sampler {run.sampler!r}; choose one of {', '.join(SAMPLERS)}")
    device = next(run.model.parameters()).device
    tokenizer = CaptionTokenizer(run.model.cfg.context_length)
    guided = GuidedCaptioner(run.model, guidance)
    texts: list[str] = []
    for i in range(0, len(images), batch_size):
        y = run.model.encode_image(images[i:i + batch_size].to(device))  # (b, M, D)
        ids = SAMPLERS[run.sampler](guided, y, length, run, seed + i, stride)
        texts += tokenizer.batch_decode(ids.cpu())
    return texts


def guidance_sweep(runs: Sequence[SweepRun], images: torch.Tensor, references: Sequence[Sequence[str]],
                   scorer: CLIPScorer, scales: Sequence[float], *, length: int, seed: int = 0, stride: int = 1,
                   metrics: Sequence[str] = ("BLEU", "ROUGE-L", "CIDEr"), batch_size: int = 64,
                   progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """One row per (run, mode, scale): the reference-based `metrics`, mean ``CLIPScore`` and three example
    captions. `references[b]` are the references of images[b]."""
    if len(references) != len(images):
        raise ValueError(f"{len(images)} images but {len(references)} reference lists")
    refs = {b: list(r) for b, r in enumerate(references)}
    rows: list[dict[str, Any]] = []
    for run in runs:
        for mode in run.modes:
            for w in scales:
                texts = caption_images(run, images, GuidanceConfig(mode, float(w), run.p_mask, seed), length=length,
                                       seed=seed, stride=stride, batch_size=batch_size)
                scores = score_captions(dict(enumerate(texts)), refs, metrics=metrics)
                row = {"model": run.name, "sampler": run.sampler, "mode": mode, "scale": float(w),
                       **{k: v for k, v in scores.items() if isinstance(v, float) or v is None},
                       "CLIPScore": float(clip_scores(scorer, images, texts).mean()),
                       "examples": texts[:3]}
                rows.append(row)
                if progress is not None:
                    progress(f"{run.name} {mode} w={w}: " + ", ".join(
                        f"{k} {row[k]:.3f}" for k in row if isinstance(row[k], float) and k != "scale"))
    return rows


@dataclass
class TradeoffFigure:
    figure: Any  # matplotlib Figure
    metrics: list[str] = field(default_factory=list)


def plot_tradeoff(rows: Sequence[dict[str, Any]], metrics: Sequence[str] = ("BLEU@4", "ROUGE-L", "CIDEr"),
                  y: str = "CLIPScore") -> TradeoffFigure:
    """The paper's figure: one panel per reference-based metric (x) against CLIPScore (y); one line per
    (model, mode) through its scales, each point labelled with its w."""
    import matplotlib.pyplot as plt

    metrics = [m for m in metrics if any(r.get(m) is not None for r in rows)]
    fig, axes = plt.subplots(1, max(1, len(metrics)), figsize=(4.2 * max(1, len(metrics)), 3.6), squeeze=False)
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["mode"]), []).append(r)
    for ax, metric in zip(axes[0], metrics, strict=False):
        for (model, mode), rs in groups.items():
            rs = sorted(rs, key=lambda r: r["scale"])
            xs, ys = [r[metric] for r in rs], [r[y] for r in rs]
            ax.plot(xs, ys, marker="o", label=f"{model} {mode.upper()}")
            for r, xv, yv in zip(rs, xs, ys, strict=True):
                ax.annotate(f"{r['scale']:g}", (xv, yv), textcoords="offset points", xytext=(3, 3), fontsize=7)
        ax.set_xlabel(metric)
        ax.set_ylabel(y)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return TradeoffFigure(fig, list(metrics))
