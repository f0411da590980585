"""Batches of (image, caption) pairs from shards, CSV/TSV or COCO json, for training and evaluation.

One pipeline serves the synthetic data and real data (accepted paths: :mod:`mdc_core.sources`)::

    shards (shuffled by (seed, epoch)) -> this worker's share -> webdataset tar reading -> shuffle buffer
    -> decode + check -> transform -> batches of exactly `batch_size` good samples

Records that cannot be used never stop a run: they are dropped and counted by reason (:data:`SKIP_REASONS`) in the
``"skipped"`` dict of the batch being built, so the counts cross DataLoader worker processes inside the batches.
:class:`BatchStream` feeds the trainer one rank's micro-batches, epoch after epoch, from a saved data position.

Order is a function of (seed, epoch, readers). The shards (or rows) are dealt to ``readers = world x W`` parts,
W = max(1, num_workers): worker w of rank r reads part ``w * world + r``, so ranks and workers never read the same
shard and together read all of them once per epoch. ``skip_batches = n`` makes worker w play the part of worker
(w + n) % W and pass over its share of the first n batches, so a resumed epoch yields exactly the batches the
un-skipped one yields after its first n. Hence ``world`` ranks with accumulation A see, at every optimizer step,
exactly the samples one process with ``world * W`` workers and accumulation ``world * A`` sees, which makes a DDP
run reproducible on one process. With ``data.in_memory`` a small set is decoded once and served from memory
(:class:`MemoryBatches`): the same samples, bitwise, in a full permutation per epoch.
"""

from __future__ import annotations

import json
import random
import signal
import warnings
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import torch
import webdataset as wds
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torchvision.transforms import functional as TF

from mdc_core import distributed as dist
from mdc_core.config import DataConfig, RunConfig
from mdc_core.sources import Source, iter_shard_records, resolve_source
from mdc_core.tokenizer import CaptionTokenizer, caption_problem
from mdc_core.transforms import (
    ImageError,
    SeededRandomResizedCrop,
    eval_geometry,
    eval_transform,
    normalise_batch,
    open_image,
    read_image_file,
)

SKIP_REASONS = ("bad_shard", "missing_image", "bad_image", "too_large", "missing_caption",
                "bad_caption_encoding", "empty_caption", "caption_too_long")  # the last two: caption_problem
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
EVAL_SPLITS = ("val", "test", "compgen", "restval")  # splits that never get random crops


def _skip(reason: str) -> dict[str, Any]:
    return {"__skip__": reason}


def _decode_record(rec: dict[str, Any], check_only: bool = False) -> dict[str, Any]:
    """A raw shard record -> ``{"key", "pil", "caption", "meta"}`` or a ``{"__skip__": reason}`` marker."""
    if "__skip__" in rec:
        return rec
    key = rec["__key__"]
    ext = next((e for e in IMAGE_EXTS if e in rec), None)
    if ext is None:
        return _skip("missing_image")
    if "txt" not in rec:
        return _skip("missing_caption")
    try:
        caption = rec["txt"].decode("utf-8").strip()
    except UnicodeDecodeError:
        return _skip("bad_caption_encoding")
    problem = caption_problem(caption)  # e.g. only control characters: empty after tokenization
    if problem:
        return _skip(problem)
    try:
        pil = open_image(rec[ext], f"{rec.get('__url__', '')}:{key}.{ext}")
    except ImageError as err:
        return _skip(err.reason)
    if check_only:
        return {"key": key}
    try:
        meta = json.loads(rec["json"]) if "json" in rec else {}
    except (ValueError, UnicodeDecodeError):
        meta = {}  # unreadable metadata does not make the image-caption pair unusable
    return {"key": key, "pil": pil, "caption": caption, "meta": meta if isinstance(meta, dict) else {}}


def _decode_row(row: dict[str, Any], check_only: bool = False) -> dict[str, Any]:
    """A CSV/COCO row -> the same as :func:`_decode_record`; the image file is read here."""
    caption = str(row["caption"]).strip()
    problem = caption_problem(caption)
    if problem:
        return _skip(problem)
    try:
        data = read_image_file(row["image"])  # a device or FIFO is refused, never read
        pil = open_image(data, row["image"])
    except FileNotFoundError:
        return _skip("missing_image")
    except ImageError as err:
        return _skip(err.reason)
    except OSError:
        return _skip("bad_image")
    if check_only:
        return {"key": row["key"]}
    return {"key": row["key"], "pil": pil, "caption": caption, "meta": dict(row["meta"])}


class CaptionBatches(IterableDataset):
    """One epoch of batches (dicts, see :func:`build_loader`) of a :class:`Source`; safe in DataLoader workers."""

    def __init__(self, source: Source, *, image_size: int, batch_size: int, seed: int, epoch: int,
                 skip_batches: int, shuffle: bool, drop_last: bool, shuffle_buffer: int, random_crop: bool,
                 rank: int = 0, world: int = 1):
        super().__init__()
        self.source, self.image_size, self.batch_size = source, image_size, batch_size
        self.seed, self.epoch, self.skip_batches = seed, epoch, skip_batches
        self.shuffle, self.drop_last, self.buffer = shuffle, drop_last, shuffle_buffer
        self.random_crop, self.rank, self.world = random_crop, rank, world
        self._eval = eval_transform(image_size)

    def _records(self, part: int, parts: int) -> tuple[Iterator[dict[str, Any]], Callable[..., dict[str, Any]]]:
        if self.source.kind == "wds":
            shards = list(self.source.shards)
            if self.shuffle:
                random.Random(f"shards-{self.seed}-{self.epoch}").shuffle(shards)
            records = iter_shard_records(shards[part::parts])
            if self.shuffle and self.buffer > 1:
                rng = random.Random(f"samples-{self.seed}-{self.epoch}-{part}")
                records = wds.shuffle(self.buffer, initial=self.buffer, rng=rng)(records)
            return records, _decode_record
        order = list(range(len(self.source.rows)))
        if self.shuffle:  # a table fits in memory: a full permutation instead of a buffer
            random.Random(f"rows-{self.seed}-{self.epoch}").shuffle(order)
        return (self.source.rows[i] for i in order[part::parts]), _decode_row

    def _transform(self, pil: Any, key: str) -> torch.Tensor:
        if self.random_crop:  # crop drawn from (seed, epoch, key): independent of order, workers and skipping
            rng = random.Random(f"crop-{self.seed}-{self.epoch}-{key}")
            return SeededRandomResizedCrop(self.image_size, rng)(pil)
        return self._eval(pil)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        parts, worker = (1, 0) if info is None else (info.num_workers, info.id)
        part = (worker + self.skip_batches) % parts  # this rank's reader; see the module docstring
        to_skip = max(0, (self.skip_batches - part + parts - 1) // parts) * self.batch_size  # good samples
        records, decode = self._records(part * self.world + self.rank, parts * self.world)
        batch: list[dict[str, Any]] = []
        skipped: Counter[str] = Counter()
        # a full batch is held back until the next one is full: the records skipped in a last partial batch (dropped)
        # are reported with the last full one, so each epoch counts every skipped record once
        done: dict[str, Any] | None = None
        for rec in records:
            sample = decode(rec, check_only=to_skip > 0)
            if "__skip__" in sample:
                if not to_skip:
                    skipped[sample["__skip__"]] += 1
                continue
            if to_skip:
                to_skip -= 1
                continue
            sample["image"] = self._transform(sample.pop("pil"), sample["key"])
            batch.append(sample)
            if len(batch) == self.batch_size:
                if done is not None:
                    yield done
                done = _collate(batch, skipped)
                batch, skipped = [], Counter()
        if batch and not self.drop_last:
            if done is not None:
                yield done
            yield _collate(batch, skipped)
        elif done is not None:  # records dropped after the last full batch are reported with it
            done["skipped"] = dict(Counter(done["skipped"]) + skipped)
            done["n_skipped"] = sum(done["skipped"].values())
            yield done


def _collate(batch: list[dict[str, Any]], skipped: Counter[str]) -> dict[str, Any]:
    return {"image": torch.stack([s["image"] for s in batch]),  # (B, 3, S, S)
            "caption": [s["caption"] for s in batch], "key": [s["key"] for s in batch],
            "meta": [s["meta"] for s in batch], "n_skipped": sum(skipped.values()), "skipped": dict(skipped)}


def _identity(batch: dict[str, Any]) -> dict[str, Any]:
    return batch


def _captions_describe_layout(source: Source) -> bool:
    """Whether the data set's ``manifest.json`` lists position words among the vocabularies its captions use (the
    synthetic data set's does): then a random crop would move what the captions say."""
    for folder in filter(None, (source.root, source.root.parent if source.root else None)):
        manifest = folder / "manifest.json"
        if manifest.is_file():
            try:
                vocab = json.loads(manifest.read_text()).get("vocab")
            except (OSError, ValueError, AttributeError):
                return False
            return isinstance(vocab, dict) and bool(vocab.get("position"))
    return False


def build_loader(cfg: DataConfig, *, split: str | None = "train", image_size: int, batch_size: int, seed: int = 0,
                 epoch: int = 0, skip_batches: int = 0, shuffle: bool = True, drop_last: bool = True,
                 rank: int = 0, world: int = 1, context_length: int = 0) -> Iterable[dict[str, Any]]:
    """One epoch of batches from ``cfg.path`` (``path/split`` when that folder exists; see :mod:`.sources`).

    Each batch is a dict: ``image`` float (B, 3, image_size, image_size) normalised with the OpenAI CLIP
    mean/std; ``caption`` list[str] (stripped); ``key`` list[str]; ``meta`` list[dict] (the sample's KEY.json, or
    the row's other columns; {} when absent); ``n_skipped`` int and ``skipped`` {reason: count} for records
    dropped while this batch was built. B = `batch_size` except a last partial batch per worker when not
    `drop_last`. Shuffling (shard order + a ``cfg.shuffle_buffer`` sample buffer; a full permutation for tables)
    happens when `shuffle` and ``cfg.shuffle_buffer > 0``, seeded by (seed, epoch). ``cfg.augment == "rrc"``
    gives random resized crops, except for the :data:`EVAL_SPLITS`. Iterating again repeats the epoch.
    `rank`, `world`, `skip_batches` (this rank's batches) and ``cfg.in_memory``: module docstring. With
    `context_length`, in-memory batches also carry ``tokens`` and ``truncated`` (:func:`split_tokens`)."""
    cfg.validate()
    if image_size < 1 or batch_size < 1 or skip_batches < 0:
        raise ValueError(f"need image_size >= 1, batch_size >= 1, skip_batches >= 0; got {image_size}, "
                         f"{batch_size}, {skip_batches}")
    if not 0 <= rank < world:
        raise ValueError(f"need 0 <= rank < world, got rank {rank} of {world}")
    source = resolve_source(cfg.path, cfg.format, split, cfg.images or None)
    random_crop = cfg.augment == "rrc" and split not in EVAL_SPLITS
    if random_crop and _captions_describe_layout(source):
        warnings.warn("data.augment='rrc' on the synthetic data set: random crops change object positions and "
                      "sizes that captions and labels describe; use augment='none'", stacklevel=2)
    if cfg.in_memory:  # decoded once per process; ranks deal batches, workers are not needed
        return MemoryBatches(source, image_size=image_size, batch_size=batch_size, seed=seed, epoch=epoch,
                             skip_batches=skip_batches, shuffle=shuffle and cfg.shuffle_buffer > 0,
                             drop_last=drop_last, rank=rank, world=world, context_length=context_length)
    stream = CaptionBatches(source, image_size=image_size, batch_size=batch_size, seed=seed, epoch=epoch,
                            skip_batches=skip_batches, shuffle=shuffle and cfg.shuffle_buffer > 0,
                            drop_last=drop_last, shuffle_buffer=cfg.shuffle_buffer, random_crop=random_crop,
                            rank=rank, world=world)
    readers = world * max(1, cfg.num_workers)
    if len(source) < world:
        raise ValueError(f"{cfg.path} has {len(source)} {'shards' if source.kind == 'wds' else 'samples'} for "
                         f"{world} ranks: every rank needs its own shards; write smaller shards "
                         "(mdc data shards --shard-size N)")
    if source.kind == "wds" and len(source) < readers:
        warnings.warn(f"{len(source)} shards for {readers} readers ({world} ranks x {max(1, cfg.num_workers)} "
                      "workers): some workers will be idle", stacklevel=2)
    if cfg.num_workers == 0:
        return stream
    return DataLoader(stream, batch_size=None, num_workers=cfg.num_workers, collate_fn=_identity,
                      worker_init_fn=_ignore_interrupts)


def _ignore_interrupts(worker_id: int) -> None:
    """Workers ignore Ctrl-C/SIGTERM: the trainer finishes its step and checkpoints, which needs them alive
    (a worker whose parent dies exits by itself)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


# -- in memory (data.in_memory) ----------------------------------------------------------------------------------------
# Decoding a batch of 64 JPEGs costs tens of milliseconds every epoch, a CPU step of the ``tiny`` models a few
# hundred. A small split is decoded once instead, kept as uint8 after the evaluation geometry and normalised per
# batch (the shard loader's images bitwise). Batches cut from storage order (shuffled: a permutation per (seed,
# epoch)) go to rank r of `world` as r, r + world, ...: world ranks x accumulation A see what one process sees with
# accumulation world x A. Unusable records are counted once per epoch, in the first batch of rank 0.

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


def split_tokens(data: dict[str, Any], context_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens (N, context_length), cut (N,) bool: caption cut to the context) of a decoded split's captions,
    tokenized once per process and context length (kept with the split)."""
    key = ("tokens", context_length)
    if key not in data:
        tokenizer = CaptionTokenizer(context_length)
        captions = data["captions"]
        tokens = tokenizer(captions) if captions else torch.zeros(0, context_length, dtype=torch.long)
        cut = torch.tensor([len(tokenizer.encode_text(c)) > context_length - 2 for c in captions], dtype=torch.bool)
        data[key] = (tokens, cut)
    return data[key]


class MemoryBatches:
    """One epoch of batches of a decoded split, in the format of :func:`mdc_core.data.build_loader` (with
    `context_length`, also their ``tokens`` and ``truncated`` count, gathered from :func:`split_tokens`)."""

    def __init__(self, source: Source, *, image_size: int, batch_size: int, seed: int, epoch: int,
                 skip_batches: int, shuffle: bool, drop_last: bool, rank: int = 0, world: int = 1,
                 context_length: int = 0):
        self.source, self.image_size, self.batch_size = source, image_size, batch_size
        self.seed, self.epoch, self.skip_batches = seed, epoch, skip_batches
        self.shuffle, self.drop_last, self.rank, self.world = shuffle, drop_last, rank, world
        self.context_length = context_length

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
        tokens, cut = split_tokens(data, self.context_length) if self.context_length else (None, None)
        skipped = dict(data["skipped"]) if self.rank == 0 else {}
        for i, idx in enumerate(self._batches(len(data["keys"]))[self.skip_batches:], start=self.skip_batches):
            index = torch.tensor(idx)
            report = skipped if i == 0 else {}  # as the shard loader: not when resuming mid-epoch
            batch = {"image": normalise_batch(data["images"].index_select(0, index)),  # (B, 3, S, S) float
                     "caption": [data["captions"][j] for j in idx], "key": [data["keys"][j] for j in idx],
                     "meta": [data["metas"][j] for j in idx], "n_skipped": sum(report.values()),
                     "skipped": dict(report)}
            if tokens is not None:  # ready tensors: no tokenizer on the training step's path
                batch["tokens"], batch["truncated"] = tokens.index_select(0, index), int(cut[index].sum())
            yield batch


def iter_captions(cfg: DataConfig, split: str | None = "train") -> Iterator[str]:
    """Every usable caption (stripped, valid UTF-8, not empty after tokenization nor too long) of the split in
    storage order, without reading images: for building a corpus vocabulary. Bad shards (reported on the log) and
    bad captions are passed over."""
    cfg.validate()
    source = resolve_source(cfg.path, cfg.format, split, cfg.images or None)
    if source.kind != "wds":
        yield from (c for c in (str(r["caption"]).strip() for r in source.rows) if not caption_problem(c))
        return
    for rec in iter_shard_records(source.shards, suffixes={"txt"}):
        try:
            caption = rec["txt"].decode("utf-8").strip() if "txt" in rec else ""
        except UnicodeDecodeError:
            continue
        if not caption_problem(caption):
            yield caption


class BatchStream:
    """This rank's micro-batches, epoch after epoch, from the data position (epoch, batch_in_epoch).

    :meth:`take` returns n micro-batches of the current epoch, each with its captions tokenized (``tokens`` (B,
    context_length), ``truncated``: how many were cut; the in-memory set serves them ready) or, when any rank cannot
    fill its n (the end of the epoch; ranks agree by one all-reduce), drops what it got, calls ``on_epoch_end`` and
    starts the next epoch.
    Skipped-record counts met on this rank accumulate in `pending` until the trainer sums them over ranks."""

    def __init__(self, cfg: RunConfig, ctx: dist.DistContext, epoch: int, batch_in_epoch: int,
                 on_epoch_end: Any):
        self.cfg, self.ctx, self.on_epoch_end = cfg, ctx, on_epoch_end
        self.epoch, self.batch_in_epoch = epoch, batch_in_epoch
        self.pending: Counter[str] = Counter()
        self.tokenizer = CaptionTokenizer(cfg.model.context_length)
        self._it: Iterator[dict[str, Any]] | None = None

    def take(self, n: int) -> list[dict[str, Any]]:
        cfg = self.cfg
        while True:
            if self._it is None:  # this rank's loader, from the data position
                self._it = iter(build_loader(cfg.data, split="train", image_size=cfg.model.image_size,
                                             batch_size=cfg.train.batch_size, seed=cfg.train.seed, epoch=self.epoch,
                                             skip_batches=self.batch_in_epoch, rank=self.ctx.rank,
                                             world=self.ctx.world, context_length=cfg.model.context_length))
            got = list(islice(self._it, n))
            for batch in got:
                self.pending.update(batch.get("skipped", {}))
            if dist.all_agree(self.ctx, len(got) == n, "end-of-epoch agreement"):
                self.batch_in_epoch += n
                for batch in got:
                    if "tokens" not in batch:  # the shard loader's batches
                        batch["tokens"], batch["truncated"] = self.tokenizer.tokenize_batch(batch["caption"])
                return got
            if self.batch_in_epoch == 0:
                raise ValueError(self._too_little_data(n, len(got)))
            self._it = None  # a DataLoader's workers stop with their iterator
            self.on_epoch_end(self.epoch)
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0

    def _too_little_data(self, n: int, got: int) -> str:
        """Why a whole epoch gave this rank `got` < `n` micro-batches: what is wrong with the data, in one line."""
        batch, d = self.cfg.train.batch_size, self.cfg.data
        shown = d.path_as_given or d.path
        if got:
            ranks = f" on each of {self.ctx.world} ranks" if self.ctx.world > 1 else ""
            return (f"data at {shown} gave only {got} batch(es) of {batch} in a whole epoch, and a step needs "
                    f"{n} (train.grad_accum){ranks}: lower train.batch_size or train.grad_accum, or use more data")
        skipped = ", ".join(f"{reason} {count}" for reason, count in self.pending.most_common())
        source = resolve_source(d.path, d.format, "train", d.images or None)
        missing = [r["image"] for r in source.rows if not Path(r["image"]).is_file()]
        if source.rows and len(missing) == len(source.rows):
            return (f"none of the {len(missing)} images that {shown} names exists (first: {missing[0]}): image paths "
                    "are read relative to the caption file's folder, or to the folder given as --images")
        ranks = f" for each of {self.ctx.world} ranks" if self.ctx.world > 1 else ""
        if missing or skipped:
            what = f"{len(missing)} of {len(source.rows)} images missing" if missing else f"skipped: {skipped}"
            return (f"data at {shown} gave no batch of {batch} usable samples{ranks} in a whole epoch "
                    f"({what}): lower train.batch_size or repair the data (`mdc data shards --from` the data lists "
                    "what it skips, by reason)")
        return f"data at {shown} holds fewer than {batch} samples{ranks}: lower train.batch_size or add data"

    def close(self) -> None:
        """Stop this rank's DataLoader workers now. Dropping the iterator is not enough when the trainer sits in a
        reference cycle (it does: `on_epoch_end` is its bound method), and the workers ignore SIGTERM, so a
        process that exits with them still alive would wait for them forever in multiprocessing's exit hook."""
        it, self._it = self._it, None
        shutdown = getattr(it, "_shutdown_workers", None)  # torch's multi-process DataLoader iterator
        if shutdown is not None:
            shutdown()
