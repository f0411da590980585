"""Data-throughput benchmark: images per second read, decoded and augmented by the training pipeline.

``mdc data bench --data PATH`` times :func:`mdc_core.data.build_loader` exactly as the trainer drives it
(shard reading, shuffle buffer, JPEG decode, resize/crop, normalisation, batching) and reports images/s in
total and per worker, so that ``num_workers`` can be sized for a GPU's appetite: a ViT-B/32 step on one
H100 consumes on the order of thousands of images/s, so divide by the per-worker figure. No model runs.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from mdc_core.config import DataConfig
from mdc_core.data import build_loader


def measure(cfg: DataConfig, *, image_size: int, batch_size: int = 64, batches: int = 20, warmup: int = 2,
            seed: int = 0) -> dict[str, Any]:
    """Time `batches` batches after `warmup` (worker start-up, first shard opens) of the train split.

    Epochs are chained if the data is shorter than ``warmup + batches``. Returns ``{"images", "seconds",
    "images_per_s", "images_per_s_per_worker", "workers", "image_size", "augment"}``; a worker is a
    DataLoader process, or the calling process when ``num_workers == 0``.
    """
    if batches < 1 or warmup < 0:
        raise ValueError(f"need batches >= 1 and warmup >= 0, got {batches}, {warmup}")
    threads = torch.get_num_threads()
    if cfg.num_workers == 0:
        torch.set_num_threads(1)  # as in a DataLoader worker process, which torch runs with one thread
    try:
        return _measure(cfg, image_size, batch_size, batches, warmup, seed)
    finally:
        torch.set_num_threads(threads)


def _measure(cfg: DataConfig, image_size: int, batch_size: int, batches: int, warmup: int, seed: int
             ) -> dict[str, Any]:
    images, start, seen, epoch = 0, None, 0, 0
    while seen < warmup + batches:
        got = 0
        loader = build_loader(cfg, split="train", image_size=image_size, batch_size=batch_size, seed=seed,
                              epoch=epoch)
        for batch in loader:
            got += 1
            if seen == warmup:
                start = time.perf_counter()
            if seen >= warmup:
                images += batch["image"].shape[0]
            seen += 1
            if seen >= warmup + batches:
                break
        if got == 0:
            raise ValueError(f"{cfg.path} gave no batch of {batch_size}; lower --batch-size")
        epoch += 1
    seconds = time.perf_counter() - start
    workers = max(1, cfg.num_workers)
    rate = images / max(seconds, 1e-9)
    return {"images": images, "seconds": seconds, "images_per_s": rate, "images_per_s_per_worker": rate / workers,
            "workers": workers, "image_size": image_size, "augment": cfg.augment, "batch_size": batch_size}


def bench_data(path: str, *, image_sizes: tuple[int, ...] = (64, 224), workers: int = 0, batch_size: int = 64,
               batches: int = 20, augment: str = "rrc", fmt: str = "auto", images: str | None = None
               ) -> list[dict[str, Any]]:
    """:func:`measure` at each image size (the synthetic shards are 64 px: 224 px measures the upscaling);
    `images`: the image folder of a caption json or table (default: found)."""
    base = DataConfig(path=path, images=images or "", format=fmt, num_workers=workers, augment=augment)
    base.validate()
    return [measure(dataclasses.replace(base), image_size=s, batch_size=batch_size, batches=batches)
            for s in image_sizes]
