"""Greedy Eq. 6 vs revisable tokens (remasking) on the embedded test split: repetition rate, single-object accuracy,
CIDEr, with 95% intervals.

Each sampler captions the same images (:func:`mdc_core.report.caption_report`); per caption we keep whether it
repeats a word (:mod:`mdc_workbench.eval.repetition`), whether a single-object scene's caption names its colour and
shape, and its CIDEr against the image's reference (pycocoevalcap, document frequencies of these images). Rates get
Wilson intervals, CIDEr a bootstrap interval over images; each sampler's difference to the first one (greedy) gets
a paired bootstrap interval (same resampled images for both), so an ordering is claimed only where that interval
excludes 0.

``python -m mdc_workbench.eval.remasking --run RUN [--limit 256] [--thresholds 0.3 0.5] [--steps 10]`` prints the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from mdc_core.config import SamplerConfig
from mdc_workbench.eval.caption_metrics import score_captions
from mdc_workbench.eval.repetition import repeated_words
from mdc_workbench.eval.report import caption_report

Z95 = 1.959963984540054


def wilson(k: int, n: int) -> tuple[float, float]:
    """95% Wilson score interval of a proportion k / n."""
    if n == 0:
        return math.nan, math.nan
    p = k / n
    centre = (p + Z95 ** 2 / (2 * n)) / (1 + Z95 ** 2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95 ** 2 / (4 * n * n)) / (1 + Z95 ** 2 / n)
    return centre - half, centre + half


def _bootstrap(values: np.ndarray, draws: np.ndarray) -> tuple[float, float]:
    """95% percentile interval of the mean of `values` (n,) over resampled index rows `draws` (R, n)."""
    means = values[draws].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def compare_samplers(model: Any, cfg: Any, samplers: Mapping[str, SamplerConfig], *, split: str = "test",
                     limit: int = 256, device: str = "cpu", resamples: int = 2000, seed: int = 0,
                     progress: bool = True) -> dict[str, Any]:
    """Caption `limit` images of `split` of ``cfg.data`` with each sampler (the first is the baseline).

    Returns ``{"n_images", "n_single_object", "rows": {name: {"sampler", "repetition_rate", "repetition_ci",
    "single_object_accuracy", "accuracy_ci", "cider", "cider_ci", "diff": {metric: [value, lo, hi]}}},
    "examples": [captions that differ]}``; rates and CIDEr as fractions (CIDEr on its usual 0-10 scale).
    """
    if not samplers:
        raise ValueError("no sampler to compare")
    reports = {name: caption_report(model, cfg.data, s, split=split, limit=limit, device=device, progress=progress)
               for name, s in samplers.items()}
    first = next(iter(reports.values()))["captions"]
    keys = [r["key"] for r in first]
    refs = {r["key"]: [r["reference"]] for r in first}
    single = np.array(["correct" in r for r in first])
    draws = np.random.default_rng(seed).integers(0, len(keys), size=(resamples, len(keys)))
    per: dict[str, dict[str, np.ndarray]] = {}
    rows: dict[str, dict[str, Any]] = {}
    for name, rep in reports.items():
        caps = {r["key"]: r["caption"] for r in rep["captions"]}
        cider = score_captions(caps, refs, metrics=("CIDEr",), per_image_cider=True)
        values = {"repetition_rate": np.array([bool(repeated_words(caps[k])) for k in keys], dtype=float),
                  "cider": np.array([cider["per_image"]["CIDEr"][k] for k in keys]),
                  "single_object_accuracy": np.array([float(r.get("correct", False)) for r in rep["captions"]])}
        per[name] = values
        n_rep, n_single = int(values["repetition_rate"].sum()), int(single.sum())
        n_ok = int(values["single_object_accuracy"][single].sum())
        rows[name] = {
            "sampler": dataclasses.asdict(samplers[name]),
            "repetition_rate": n_rep / len(keys), "repetition_ci": wilson(n_rep, len(keys)),
            "single_object_accuracy": n_ok / n_single if n_single else None,
            "accuracy_ci": wilson(n_ok, n_single),
            "cider": float(values["cider"].mean()), "cider_ci": _bootstrap(values["cider"], draws),
        }
    base = next(iter(per))
    for name in per:
        diff = {}
        for metric in ("repetition_rate", "cider"):
            d = per[name][metric] - per[base][metric]
            diff[metric] = [float(d.mean()), *_bootstrap(d, draws)]
        if single.any():
            d = (per[name]["single_object_accuracy"] - per[base]["single_object_accuracy"])[single]
            sub = np.random.default_rng(seed).integers(0, len(d), size=(resamples, len(d)))
            diff["single_object_accuracy"] = [float(d.mean()), *_bootstrap(d, sub)]
        rows[name]["diff"] = diff
    examples = [{"reference": refs[k][0], **{n: reports[n]["captions"][i]["caption"] for n in reports}}
                for i, k in enumerate(keys) if len({reports[n]["captions"][i]["caption"] for n in reports}) > 1]
    return {"split": split, "n_images": len(keys), "n_single_object": int(single.sum()), "rows": rows,
            "examples": examples[:12]}


def remasking_table(result: dict[str, Any]) -> str:
    """Markdown: one row per sampler, each metric with its 95% interval, and the paired difference to the first."""
    def pct(v: float | None, ci: tuple[float, float]) -> str:
        return "n/a" if v is None else f"{100 * v:.1f} [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"

    def delta(d: list[float] | None, scale: float = 100.0) -> str:
        return "" if d is None else f" ({scale * d[0]:+.1f} [{scale * d[1]:+.1f}, {scale * d[2]:+.1f}])"

    lines = ["| sampler | repetition rate % | single-object accuracy % | CIDEr x 100 |", "|---|---:|---:|---:|"]
    for i, (name, r) in enumerate(result["rows"].items()):
        d = r["diff"] if i else {}
        lines.append(f"| {name} | {pct(r['repetition_rate'], r['repetition_ci'])}{delta(d.get('repetition_rate'))} "
                     f"| {pct(r['single_object_accuracy'], r['accuracy_ci'])}"
                     f"{delta(d.get('single_object_accuracy'))} | {pct(r['cider'], r['cider_ci'])}"
                     f"{delta(d.get('cider'))} |")
    return "\n".join(lines)


def default_samplers(base: SamplerConfig, thresholds: list[float], steps: int) -> dict[str, SamplerConfig]:
    """Greedy (`base`) first, then one remasking sampler per threshold with `steps` extra steps at most."""
    out = {"greedy (Eq. 6)": base}
    for t in thresholds:
        out[f"remask < {t:g}, <= {steps} extra"] = dataclasses.replace(base, remask_threshold=t, remask_steps=steps)
    return out


def main(argv: list[str] | None = None) -> None:
    from mdc_core.factory import load_model
    p = argparse.ArgumentParser(prog="python -m mdc_workbench.eval.remasking", description=__doc__.splitlines()[0])
    p.add_argument("--run", required=True, help="run or checkpoint folder (its data.path is the embedded data)")
    p.add_argument("--limit", type=int, default=256, help="test images")
    p.add_argument("--length", type=int, help="caption length N' (default: the run's)")
    p.add_argument("--thresholds", type=float, nargs="+", default=[0.5], help="remasking confidence thresholds")
    p.add_argument("--steps", type=int, default=10, help="extra remasking steps at most")
    p.add_argument("--out", help="also write the result JSON here")
    args = p.parse_args(argv)
    model, cfg = load_model(args.run)
    base = dataclasses.replace(cfg.sampler, length=args.length or cfg.sampler.length)
    result = compare_samplers(model, cfg, default_samplers(base, args.thresholds, args.steps), limit=args.limit)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print(f"{result['n_images']} {result['split']} images ({result['n_single_object']} single-object), "
          f"N' = {base.length}; 95% intervals; (difference to greedy [paired bootstrap 95%])")
    print(remasking_table(result))
    for ex in result["examples"][:6]:
        print("  " + " | ".join(f"{k}: {v}" for k, v in ex.items()))


if __name__ == "__main__":
    main()
