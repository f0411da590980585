"""The samples of a small data set decoded once and held in memory (``data.in_memory=true``).

A CPU training step of the ``tiny`` models costs a few hundred milliseconds, and decoding, resizing and
normalising a batch of 64 JPEGs costs tens of them, every epoch again. :class:`MemoryBatches` reads the split
once through the same records and decoders as the shard loader (:mod:`mdc_core.data.loaders`), keeps each image
as uint8 ``(3, S, S)`` after the evaluation geometry (resize + centre crop), and normalises whole batches as
they are drawn; the images it yields are bitwise those of the shard loader. Meant for sets that fit in memory
(the embedded data set: 20,000 images of 64 px are 250 MB); the shard loader stays the path for real data.

Order. Without shuffling, storage order (the shard loader's order without shuffling). With shuffling, a full
permutation drawn from (seed, epoch), cut into batches of `batch_size` (the last partial one dropped when
`drop_last`); rank r of `world` takes batches r, r + world, ..., so that world ranks x accumulation A see at each
step the micro-batches one process sees with accumulation world x A, as the shard loader guarantees.
Records that cannot be used are counted by reason once per epoch, in the first batch of rank 0 (not when the
epoch is resumed after its first batch, as the shard loader).
"""

from __future__ import annotations

import random
from collections import Counter, OrderedDict
from collections.abc import Iterator
from typing import Any

import torch
from torchvision.transforms import functional as TF

from mdc_core.data.loaders import _decode_record, _decode_row  # the shard loader's decoders: same samples
from mdc_core.data.sources import Source, iter_shard_records
from mdc_core.data.transforms import eval_geometry, normalise_batch

_CACHE: OrderedDict[tuple[str, str, int], dict[str, Any]] = OrderedDict()  # (location, kind, size) -> decoded split
_CACHE_SIZE = 4  # splits kept decoded per process (train + the evaluation splits of one data set)
MAX_BYTES = 2 * 1024**3  # decoded images of one split held at most (20,000 images of 64 px: 246 MB)


def decode_split(source: Source, image_size: int, max_bytes: int = MAX_BYTES) -> dict[str, Any]:
    """Every usable sample of `source`, decoded once per process and cached: ``{"images": uint8 (N, 3, S, S),
    "captions", "keys", "metas": lists of N, "skipped": Counter}``. ValueError once the images pass
    `max_bytes`."""
    cache_key = (source.location, source.kind, image_size)
    if cache_key in _CACHE:
        _CACHE.move_to_end(cache_key)
        return _CACHE[cache_key]
    if source.kind == "wds":
        records, decode = iter_shard_records(list(source.shards)), _decode_record
    else:
        records, decode = iter(source.rows), _decode_row
    geometry = eval_geometry(image_size)
    images, captions, keys, metas, skipped = [], [], [], [], Counter()
    for rec in records:
        sample = decode(rec)
        if "__skip__" in sample:
            skipped[sample["__skip__"]] += 1
            continue
        images.append(TF.pil_to_tensor(geometry(sample["pil"])))  # uint8 (3, S, S)
        if len(images) * images[0].numel() > max_bytes:
            raise ValueError(f"{source.location}: the decoded images pass {max_bytes / 1024**3:.1f} GiB at "
                             f"{len(images)} images of {image_size} px; data.in_memory is for small sets, "
                             "set data.in_memory=false")
        captions.append(sample["caption"])
        keys.append(sample["key"])
        metas.append(sample["meta"])
    stacked = torch.stack(images) if images else torch.empty(0, 3, image_size, image_size, dtype=torch.uint8)
    entry = {"images": stacked, "captions": captions, "keys": keys, "metas": metas, "skipped": skipped}
    _CACHE[cache_key] = entry
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return entry


class MemoryBatches:
    """One epoch of batches of a decoded split, in the format of :func:`mdc_core.data.build_loader`."""

    def __init__(self, source: Source, *, image_size: int, batch_size: int, seed: int, epoch: int,
                 skip_batches: int, shuffle: bool, drop_last: bool, rank: int = 0, world: int = 1):
        self.source, self.image_size, self.batch_size = source, image_size, batch_size
        self.seed, self.epoch, self.skip_batches = seed, epoch, skip_batches
        self.shuffle, self.drop_last, self.rank, self.world = shuffle, drop_last, rank, world

    def _batches(self, n: int) -> list[list[int]]:
        order = list(range(n))
        if self.shuffle:
            random.Random(f"memory-{self.seed}-{self.epoch}").shuffle(order)
        batches = [order[i:i + self.batch_size] for i in range(0, n, self.batch_size)]
        if batches and self.drop_last and len(batches[-1]) < self.batch_size:
            batches.pop()
        return batches[self.rank::self.world]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        data = decode_split(self.source, self.image_size)
        skipped = dict(data["skipped"]) if self.rank == 0 else {}
        for i, idx in enumerate(self._batches(len(data["keys"]))):
            if i < self.skip_batches:
                continue
            index = torch.tensor(idx)
            report = skipped if i == 0 else {}  # as the shard loader: not when resuming mid-epoch
            yield {"image": normalise_batch(data["images"][index]),  # (B, 3, S, S) float
                   "caption": [data["captions"][j] for j in idx], "key": [data["keys"][j] for j in idx],
                   "meta": [data["metas"][j] for j in idx], "n_skipped": sum(report.values()),
                   "skipped": dict(report)}
