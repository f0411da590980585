"""Parallel decoding: caption quality and speed against the number of denoising steps (issue 6).

One MDC-family run captions the same images once per decoding setting of :func:`mdc_core.sampler.sample`:

* ``greedy``: k = 1 token per step, N' steps (paper Eq. 6; the reference);
* ``k=K``: the K most confident masked tokens revealed per step, ceil(N'/K) steps;
* ``τ=T`` (Fast-dLLM threshold decoding, k = 1): the most confident masked token plus every other masked token
  whose confidence is >= T; between 1 and N' steps, fewer where the model is confident.

Per setting: mean (and max) denoising steps per caption (:attr:`SampleOutput.row_steps`), captions/s (wall time of
image encoding + :func:`sample`, data loading excluded, after one untimed warm-up batch; fastest of a few
repeats), decoder passes per batch (a batch runs until its slowest caption is done), colour accuracy and
colour+shape accuracy on single-object scenes, and CIDEr against each image's reference caption.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from mdc_core.config import DataConfig, SamplerConfig
from mdc_core.data import build_loader
from mdc_core.distributed import sync
from mdc_core.factory import load_model
from mdc_core.objectives import objective_spec
from mdc_core.sampler import sample
from mdc_core.tokenizer import CaptionTokenizer
from mdc_workbench.eval.caption_metrics import score_captions
from mdc_workbench.eval.figures import save_png
from mdc_workbench.eval.report import names_object

DEFAULT_THRESHOLDS = (0.9, 0.7, 0.5, 0.3)
DEFAULT_KS = (1, 2, 3)
COLUMNS = ("setting", "mean steps", "passes/batch", "captions/s", "colour acc", "colour+shape acc", "CIDEr")


def decoding_settings(length: int, ks: Sequence[int] = DEFAULT_KS,
                      thresholds: Sequence[float] = DEFAULT_THRESHOLDS) -> list[tuple[str, int, float]]:
    """(label, k, threshold) per setting: greedy first, then each k > 1, then each threshold (with k = 1).

    Raises ValueError for k outside [1, N'] or a threshold outside (0, 1]."""
    bad_k = [k for k in ks if not 1 <= k <= length]
    if bad_k:
        raise ValueError(f"tokens per step k must lie in [1, N'={length}], got {bad_k}")
    bad_t = [t for t in thresholds if not 0.0 < t <= 1.0]
    if bad_t:
        raise ValueError(f"thresholds must lie in (0, 1], got {bad_t}")
    settings = [("greedy", 1, 0.0)]
    settings += [(f"k={k}", int(k), 0.0) for k in dict.fromkeys(ks) if k != 1]
    settings += [(f"τ={t:g}", 1, float(t)) for t in dict.fromkeys(thresholds)]
    return settings


def _names_colour(caption: str, colour: str) -> bool:
    return colour.lower() in set(re.findall(r"[a-z]+", caption.lower()))


def _load_batches(data: str | Path, split: str, image_size: int, batch_size: int, limit: int) -> list[dict[str, Any]]:
    """The first `limit` images of `split` in memory (so data loading is not timed): per batch images, keys,
    references and single-object labels."""
    loader = build_loader(DataConfig(path=str(data), shuffle_buffer=0, num_workers=0), split=split,
                          image_size=image_size, batch_size=batch_size, shuffle=False, drop_last=False)
    batches, seen = [], 0
    for batch in loader:
        take = min(len(batch["caption"]), limit - seen)
        labels = [m.get("labels", {}) for m in batch["meta"][:take]]
        batches.append({"images": batch["image"][:take], "keys": [str(k) for k in batch["key"][:take]],
                        "references": list(batch["caption"][:take]),
                        "objects": [(lb["colour"], lb["shape"]) if lb.get("count") == 1 else None for lb in labels]})
        seen += take
        if seen >= limit:
            break
    if not seen:
        raise ValueError(f"{data} has no {split!r} images")
    return batches


def _timed(fn, device: str):
    """fn()'s result and its wall time in seconds (synchronised on CUDA)."""
    sync(torch.device(device))
    start = time.perf_counter()
    value = fn()
    sync(torch.device(device))
    return value, time.perf_counter() - start


def _run_setting(model: torch.nn.Module, batches: list[dict[str, Any]], sampler: SamplerConfig, device: str,
                 tokenizer: CaptionTokenizer, repeats: int) -> dict[str, Any]:
    """Captions, steps per caption, decoder passes per batch and the seconds spent encoding images and sampling
    (each batch timed `repeats` times, the fastest kept: the machine may be shared)."""
    captions, steps, batch_steps, encode_s, sample_s = [], [], [], 0.0, 0.0
    for b in batches:
        images = b["images"].to(device)
        best_encode = best_sample = float("inf")
        for _ in range(repeats):  # greedy and threshold decoding are deterministic: every repeat gives `out`
            image_tokens, t_encode = _timed(lambda: model.encode_image(images), device)  # noqa: B023
            out, t_sample = _timed(lambda: sample(model, image_tokens, sampler), device)  # noqa: B023
            best_encode, best_sample = min(best_encode, t_encode), min(best_sample, t_sample)
        encode_s, sample_s = encode_s + best_encode, sample_s + best_sample
        captions += [tokenizer.decode(t) for t in out.tokens]
        steps += out.row_steps.tolist()
        batch_steps.append(out.num_steps)
    return {"captions": captions, "steps": steps, "batch_steps": batch_steps, "encode_seconds": encode_s,
            "sample_seconds": sample_s}


@torch.no_grad()
def decoding_curve(run: str | Path, data: str | Path, *, thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
                   ks: Sequence[int] = DEFAULT_KS, length: int | None = None, split: str = "test", limit: int = 256,
                   batch_size: int = 64, device: str = "cpu", timing_repeats: int = 3,
                   progress: bool = True) -> dict[str, Any]:
    """Quality and speed of each decoding setting (see the module docstring) on `limit` images of `split`.

    Args:
        run: an MDC-family run folder (mdc, mdc_no_t, bert, parallel). data: embedded data folder (with labels).
        length: caption length N' (default: the run's ``sampler.length``).
        timing_repeats: each batch is encoded and decoded this many times; the fastest time counts.

    Returns a JSON-ready ``{"run", "data", "split", "length", "n_images", "n_single_object", ..., "results":
    [{"setting", "tokens_per_step", "threshold", "mean_steps", "max_steps", "mean_batch_steps", "captions_per_s",
    "seconds", "encode_seconds", "colour_accuracy", "colour_shape_accuracy", "CIDEr", "cider_tokenizer",
    "examples"}], "table"}``; accuracies are None when no single-object scene was captioned.
    """
    if limit < 1 or batch_size < 1 or timing_repeats < 1:
        raise ValueError(f"limit, batch_size and timing_repeats must be >= 1, got {limit}, {batch_size}, "
                         f"{timing_repeats}")
    model, cfg = load_model(run, device=device)
    spec = objective_spec(cfg.objective.name)
    if spec.decoder != "unmask":  # ARC, CLIP, MC-Diffusion
        raise ValueError(f"{run} is a {cfg.objective.name} run: parallel decoding needs a masked-diffusion "
                         "captioner (mdc, mdc_no_t, bert, parallel)")
    length = cfg.sampler.length if length is None else length
    if not 1 <= length <= cfg.model.context_length - 2:
        raise ValueError(f"caption length N' must lie in [1, {cfg.model.context_length - 2}] for this run, "
                         f"got {length}")
    settings = decoding_settings(length, ks, thresholds)
    base = dataclasses.replace(cfg.sampler, length=length, temperature=0.0, tokens_per_step=1, threshold=0.0)
    tokenizer = CaptionTokenizer(cfg.model.context_length)
    batches = _load_batches(data, split, cfg.model.image_size, batch_size, limit)
    keys = [k for b in batches for k in b["keys"]]
    if len(set(keys)) != len(keys):  # CIDEr is keyed by image: number duplicates
        keys = [f"{i}:{k}" for i, k in enumerate(keys)]
    references = {k: [r] for k, r in zip(keys, (r for b in batches for r in b["references"]), strict=True)}
    objects = [o for b in batches for o in b["objects"]]
    single = [i for i, o in enumerate(objects) if o is not None]

    sample(model, model.encode_image(batches[0]["images"].to(device)), base)  # untimed warm-up
    results = []
    for label, k, threshold in tqdm(settings, desc="decoding settings", disable=not progress):
        sampler = dataclasses.replace(base, tokens_per_step=k, threshold=threshold)
        run_ = _run_setting(model, batches, sampler, device, tokenizer, timing_repeats)
        captions, steps = run_["captions"], run_["steps"]
        seconds = run_["encode_seconds"] + run_["sample_seconds"]
        colour = [_names_colour(captions[i], objects[i][0]) for i in single]
        both = [names_object(captions[i], *objects[i]) for i in single]
        cider = score_captions(dict(zip(keys, captions, strict=True)), references, metrics=["CIDEr"])
        results.append({
            "setting": label, "tokens_per_step": k, "threshold": threshold,
            "mean_steps": sum(steps) / len(steps), "max_steps": max(steps),
            "mean_batch_steps": sum(run_["batch_steps"]) / len(batches),  # decoder passes: a batch waits for its
            "captions_per_s": len(captions) / seconds if seconds > 0 else None,  # slowest caption
            "seconds": seconds, "encode_seconds": run_["encode_seconds"],
            "colour_accuracy": sum(colour) / len(single) if single else None,
            "colour_shape_accuracy": sum(both) / len(single) if single else None,
            "CIDEr": cider["CIDEr"], "cider_tokenizer": cider["tokenizer"],
            "examples": [{"reference": references[kk][0], "caption": c} for kk, c in zip(keys[:3], captions[:3],
                                                                                      strict=True)],
        })
    result = {"run": str(run), "objective": cfg.objective.name, "data": str(data), "split": split, "length": length,
              "n_images": len(keys), "n_single_object": len(single), "batch_size": batch_size, "device": str(device),
              "timing_repeats": timing_repeats, "results": results}
    result["table"] = decoding_table(result)
    return result


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def decoding_table(result: dict[str, Any]) -> str:
    """Markdown table of :func:`decoding_curve`'s settings."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in result["results"]:
        lines.append(f"| {r['setting']} | {r['mean_steps']:.2f} | {r['mean_batch_steps']:.2f} | "
                     f"{_fmt(r['captions_per_s'], '.1f')} | "
                     f"{_fmt(r['colour_accuracy'], '.3f')} | {_fmt(r['colour_shape_accuracy'], '.3f')} | "
                     f"{_fmt(r['CIDEr'], '.3f')} |")
    return "\n".join(lines)


def _label_points(ax: Any, pts: list[tuple[float, float, str]]) -> None:
    """Label each (x, y, label) point; points that (nearly) coincide share one label ("greedy / τ=0.9") at the
    first of them."""
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    dx, dy = (max(xs) - min(xs)) or 1.0, (max(ys) - min(ys)) or 1.0
    groups: list[list[tuple[float, float, str]]] = []
    for x, y, label in pts:
        group = next((g for g in groups if abs(x - g[0][0]) < 0.04 * dx and abs(y - g[0][1]) < 0.06 * dy), None)
        if group is None:
            groups.append([(x, y, label)])
        else:
            group.append((x, y, label))
    for g in groups:
        ax.annotate(" / ".join(p[2] for p in g), g[0][:2], textcoords="offset points", xytext=(5, 4), fontsize=8)


def plot_decoding_curve(result: dict[str, Any], path: str | Path) -> Path:
    """Two panels from :func:`decoding_curve`: quality (CIDEr, colour accuracy) vs mean steps per caption, and
    captions/s vs mean steps; one labelled marker per setting. Writes a PNG and returns its path."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["results"]
    steps = [r["mean_steps"] for r in rows]
    fig, (ax_q, ax_s) = plt.subplots(1, 2, figsize=(11, 4.2))
    for key, name, marker in (("CIDEr", "CIDEr", "o"), ("colour_accuracy", "colour accuracy", "s")):
        pts = [(s, r[key], r["setting"]) for s, r in zip(steps, rows, strict=True) if r[key] is not None]
        if not pts:
            continue
        ax_q.scatter([p[0] for p in pts], [p[1] for p in pts], marker=marker, s=36, label=name, zorder=3)
        _label_points(ax_q, pts)
    ax_q.set_xlabel("mean denoising steps per caption")
    ax_q.set_ylabel("CIDEr / colour accuracy")
    ax_q.set_title("quality vs steps")
    ax_q.grid(alpha=0.3)
    ax_q.legend(fontsize=8, loc="best")
    speed = [(s, r["captions_per_s"], r["setting"]) for s, r in zip(steps, rows, strict=True)
             if r["captions_per_s"] is not None]
    ax_s.scatter([p[0] for p in speed], [p[1] for p in speed], color="C2", s=36, zorder=3)
    _label_points(ax_s, speed)
    ax_s.set_xlabel("mean denoising steps per caption")
    ax_s.set_ylabel(f"captions/s ({result.get('device', 'cpu')}, batch {result.get('batch_size', '?')})")
    ax_s.set_title("speed vs steps")
    ax_s.grid(alpha=0.3)
    for ax in (ax_q, ax_s):
        ax.margins(x=0.15, y=0.12)  # room for the labels
    fig.suptitle(f"{Path(result['run']).name}: N'={result['length']}, {result['n_images']} {result['split']} images",
                 fontsize=10)
    return save_png(fig, path)
