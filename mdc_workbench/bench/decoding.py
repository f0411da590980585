"""Captioning and scoring benchmarks: latency and throughput of every decoder the workbench has, and CoCa's.

Captioning rows (all greedy, N' tokens, image encoding included in the time):

- ``mdc_uncached``: :func:`mdc_core.sampler.sample` with the image cache switched off (every step recomputes
  the image keys/values, as before the cache existed), one token per step;
- ``mdc_cached``: the sampler as it ships (exact image cross-attention cache), one token per step;
- ``mdc_threshold``: the same plus confidence-threshold parallel decoding (``SamplerConfig.threshold``);
- ``arc_kv``: our ARC model, greedy with a self-attention KV cache (:mod:`mdc_core.ar_decode`);
- ``coca_generate``: open_clip ``CoCa.generate`` greedy (no cache: every step reruns the whole prefix).

The models are randomly initialised (the cost of a fixed-length decode does not depend on the weights); the
threshold row then reveals about one token per step, so its speed-up needs trained weights: that comparison is
:func:`quality_comparison`, run only when trained MDC and ARC runs are given.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

import torch

from mdc_core.config import RunConfig, SamplerConfig
from mdc_core.model import Captioner
from mdc_core.sampler import sample

from .core import BenchConfig, median_time


class _Uncached:
    """A captioner seen through :func:`sample` with the image cache switched off: ``image_cache`` returns
    nothing and every ``decode`` recomputes the image keys/values from the image tokens."""

    def __init__(self, model: Captioner, image_tokens: torch.Tensor) -> None:
        self._model, self._image_tokens = model, image_tokens

    def image_cache(self, image_tokens: torch.Tensor) -> None:
        self._image_tokens = image_tokens

    def decode(self, tokens: torch.Tensor, image_tokens: torch.Tensor | None, **kw: Any) -> torch.Tensor:
        kw.pop("cache", None)
        return self._model.decode(tokens, self._image_tokens if image_tokens is None else image_tokens, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def _unavailable(note: str) -> dict[str, Any]:
    return {"available": False, "note": note}


def _optional(module: str, attr: str) -> Callable[..., Any] | None:
    """`module.attr` of mdc_core if that piece of the workbench exists, else None."""
    try:
        return getattr(importlib.import_module(f"mdc_core.{module}"), attr)
    except (ImportError, AttributeError):
        return None


def arc_greedy_fn() -> Callable[..., Any] | None:
    """The ARC greedy decoder with a KV cache: ``greedy(model, image_tokens, *, max_tokens) -> ARDecodeOutput``."""
    return _optional("ar_decode", "greedy")


def _tile(x: torch.Tensor, n: int) -> torch.Tensor:
    """The first n rows of x repeated as often as needed: (B, ...) -> (n, ...)."""
    reps = -(-n // x.shape[0])
    return x.repeat(reps, *([1] * (x.ndim - 1)))[:n]


@torch.no_grad()
def caption_speed(cfg: RunConfig, payload: dict[str, Any], bench: BenchConfig, device: torch.device,
                  say: Callable[[str], None] = lambda m: None) -> dict[str, dict[str, Any]]:
    """Latency (s per batch) and throughput (captions/s) of every captioning row at each batch size."""
    torch.manual_seed(0)
    mdc = Captioner(cfg.model, causal=False, output_ids=payload["output_ids"]).to(device).eval()
    arc = Captioner(cfg.model, causal=True, output_ids=payload["output_ids"]).to(device).eval()
    coca = coca_error = None
    try:
        from .coca import build_coca, coca_greedy, has_generate
        coca = build_coca(cfg.model).to(device).eval()
        if not has_generate():
            coca, coca_error = None, "open_clip CoCa.generate needs transformers<=4.56"
    except ImportError as err:  # pragma: no cover - open_clip is a dependency
        coca_error = str(err)
    N = bench.caption_length
    greedy = SamplerConfig(length=N)
    threshold = dataclasses.replace(greedy, threshold=bench.threshold)
    arc_greedy = arc_greedy_fn()
    cached_ok = hasattr(mdc, "image_cache")
    threshold_ok = "threshold" in SamplerConfig.__dataclass_fields__

    def mdc_run(images: torch.Tensor, scfg: SamplerConfig, cached: bool):
        image_tokens = mdc.encode_image(images)
        return sample(mdc if cached else _Uncached(mdc, image_tokens), image_tokens, scfg)

    rows: dict[str, tuple[Callable[[torch.Tensor], Any] | None, str]] = {
        "mdc_uncached": (lambda im: mdc_run(im, greedy, False), "image keys/values recomputed every step"),
        "mdc_cached": ((lambda im: mdc_run(im, greedy, True)) if cached_ok else None,
                       "exact image cache" if cached_ok else "Captioner.image_cache is missing"),
        "mdc_threshold": ((lambda im: mdc_run(im, threshold, True)) if threshold_ok else None,
                          f"threshold {bench.threshold}, untrained weights" if threshold_ok
                          else "SamplerConfig.threshold is missing"),
        "arc_kv": ((lambda im: arc_greedy(arc, arc.encode_image(im), max_tokens=N)) if arc_greedy else None,
                   "greedy, KV cache" if arc_greedy else "mdc_core.ar_decode.greedy is missing"),
        "coca_generate": ((lambda im: coca_greedy(coca, im, N)) if coca is not None else None,
                          "open_clip greedy generate, no KV cache" if coca is not None else str(coca_error)),
    }
    out: dict[str, dict[str, Any]] = {}
    for b in bench.caption_batches:
        images = _tile(payload["images"], b).to(device)
        section: dict[str, Any] = {}
        for name, (fn, note) in rows.items():
            if fn is None:
                section[name] = _unavailable(note)
                continue
            say(f"  {name}, batch {b}")
            seconds, result = median_time(lambda fn=fn, im=images: fn(im), repeats=bench.repeats, device=device)
            section[name] = {"latency_s": seconds, "captions_per_s": b / seconds, "note": note}
            steps = getattr(result, "num_steps", None)  # MDC sampler: denoising steps (decoder passes)
            if steps is None and hasattr(result, "tokens"):  # ARC (ids after <sot>); CoCa returns the ids
                steps = result.tokens.shape[1]
            if steps is None and isinstance(result, torch.Tensor):  # CoCa: <sot> + passes
                steps = result.shape[1] - 1
            section[name]["steps"] = steps
        if {"mdc_uncached", "mdc_cached"} <= set(section) and section["mdc_cached"].get("available", True):
            same = torch.equal(mdc_run(images, greedy, True).tokens, mdc_run(images, greedy, False).tokens)
            section["mdc_cached"]["same_tokens_as_uncached"] = same
        out[f"batch_{b}"] = section
    return out


@torch.no_grad()
def scoring_speed(cfg: RunConfig, payload: dict[str, Any], bench: BenchConfig,
                  device: torch.device) -> dict[str, dict[str, Any]]:
    """Captions scored per second by each method of :func:`mdc_core.scoring.score_tokens` (image encoding
    included), and the latency of the Monte Carlo score of one pair."""
    score_tokens = _optional("scoring", "score_tokens")
    if score_tokens is None:
        note = "mdc_core.scoring.score_tokens is missing"
        return {name: _unavailable(note) for name in ("heuristic", "mc", "mc_uncached", "ar")}
    torch.manual_seed(0)
    mdc = Captioner(cfg.model, causal=False, output_ids=payload["output_ids"]).to(device).eval()
    arc = Captioner(cfg.model, causal=True, output_ids=payload["output_ids"]).to(device).eval()
    images, tokens = payload["images"].to(device), payload["tokens"].to(device)

    def run(model: Captioner, n: int, method: str, **kw: Any) -> Any:
        return score_tokens(model, model.encode_image(_tile(images, n)), _tile(tokens, n), method, **kw)

    def timed(fn: Callable[[], Any]) -> float:
        return median_time(fn, repeats=bench.repeats, device=device)[0]

    out: dict[str, dict[str, Any]] = {}
    n, S, P = bench.score_pairs, bench.mc_samples, bench.mc_pairs
    seconds = timed(lambda: run(mdc, n, "heuristic"))
    out["heuristic"] = {"captions_per_s": n / seconds, "pairs": n, "note": "MDC, n passes per caption, batched"}
    one = timed(lambda: run(mdc, 1, "mc", samples=S))
    many = timed(lambda: run(mdc, P, "mc", samples=S))
    out["mc"] = {"captions_per_s": P / many, "latency_one_pair_s": one, "samples": S, "pairs": P,
                 "note": f"MDC, {S}-sample Monte Carlo ELBO, image cache"}
    try:  # the same pairs as "mc", so the two rows compare
        one = timed(lambda: run(mdc, 1, "mc", samples=S, use_cache=False))
        many = timed(lambda: run(mdc, P, "mc", samples=S, use_cache=False))
        out["mc_uncached"] = {"captions_per_s": P / many, "latency_one_pair_s": one, "samples": S, "pairs": P,
                              "note": "the same without the image cache"}
    except TypeError:
        out["mc_uncached"] = _unavailable("score_tokens has no use_cache switch")
    seconds = timed(lambda: run(arc, n, "ar"))
    out["ar"] = {"captions_per_s": n / seconds, "pairs": n, "note": "ARC, chain rule by teacher forcing"}
    return out


@torch.no_grad()
def quality_comparison(bench: BenchConfig, device: torch.device,
                       say: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Single-object colour+shape accuracy and captions/s on the test split of trained runs: MDC greedy
    (one token per step), MDC threshold decoding, and ARC greedy with its KV cache, all with the MDC run's
    caption length N' (ARC may stop earlier at ``<eot>``)."""
    if not (bench.mdc_run and bench.arc_run):
        return _unavailable("needs trained runs: pass --mdc-run RUN and --arc-run RUN")
    arc_greedy = arc_greedy_fn()
    if arc_greedy is None:
        return _unavailable("mdc_core.ar_decode.greedy is missing")
    import time

    from mdc_core.data import build_loader
    from mdc_core.factory import load_model
    from mdc_core.tokenizer import CaptionTokenizer

    from ..eval.report import names_object

    mdc, mcfg = load_model(bench.mdc_run, device=str(device))
    arc, _ = load_model(bench.arc_run, device=str(device))
    N = mcfg.sampler.length
    greedy = SamplerConfig(length=N)
    methods = {
        "mdc_greedy": lambda im: sample(mdc, mdc.encode_image(im), greedy),
        "mdc_threshold": lambda im: sample(mdc, mdc.encode_image(im), dataclasses.replace(greedy,
                                                                                          threshold=bench.threshold)),
        "arc_kv": lambda im: arc_greedy(arc, arc.encode_image(im), max_tokens=N),
    }
    tokenizer = CaptionTokenizer(mcfg.model.context_length)
    loader = build_loader(dataclasses.replace(mcfg.data, num_workers=0), split="test",
                          image_size=mcfg.model.image_size, batch_size=64, shuffle=False, drop_last=False)
    batches = []
    for batch in loader:
        batches.append(batch)
        if sum(len(b["caption"]) for b in batches) >= bench.quality_images:
            break
    out: dict[str, Any] = {"length": N, "threshold": bench.threshold}
    for name, fn in methods.items():
        say(f"  quality: {name}")
        fn(batches[0]["image"][:8].to(device))  # warm-up, untimed
        right = total = n_images = 0
        seconds = steps = 0.0
        for batch in batches:
            images = batch["image"].to(device)
            start = time.perf_counter()
            result = fn(images)
            seconds += time.perf_counter() - start
            ids = result.tokens if hasattr(result, "tokens") else result
            steps += float(result.row_steps.float().sum()) if hasattr(result, "row_steps") else 0.0
            for i, meta in enumerate(batch["meta"]):
                labels = meta.get("labels", {})
                if labels.get("count") == 1:
                    total += 1
                    right += names_object(tokenizer.decode(ids[i]), labels["colour"], labels["shape"])
            n_images += len(images)
        out[name] = {"accuracy": right / max(total, 1), "captions_per_s": n_images / seconds, "images": n_images}
        if steps:
            out[name]["mean_steps"] = steps / n_images
    thr, ref = out["mdc_threshold"]["accuracy"], out["arc_kv"]["accuracy"]
    out["equal_quality"] = ref > 0 and thr >= ref - 0.02  # within 2 points of ARC (or better); 0 vs 0 says nothing
    if ref == 0:
        out["note"] = "the ARC run names no single object right: too weakly trained to compare at equal quality"
    return out
