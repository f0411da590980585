"""Write a user's image-caption pairs as WebDataset shards (the layout the loaders stream at any scale).

Inputs (``mdc data shards --from SRC``):

* a caption table: a ``.csv``/``.tsv`` with an image column and a caption column, a COCO caption ``.json`` or
  a Karpathy json (anything :func:`mdc_core.sources.resolve_source` accepts, e.g. an img2dataset
  ``--output_format files`` folder's parquet converted to CSV, or CC3M/CC12M ``.tsv`` files with local paths);
* an image folder: every image below it (``.jpg``/``.jpeg``/``.png``/``.webp``, recursively) whose caption is in
  a text file of the same name (``cat.jpg`` + ``cat.txt``), the img2dataset ``files`` layout.

Output: ``OUT/00000.tar, 00001.tar, ...`` (``shard_size`` samples each) with members ``KEY.jpg|png|webp``
(the original bytes, not re-encoded; other formats become PNG), ``KEY.txt`` (the caption, UTF-8) and
``KEY.json`` (source name and the table's other columns); keys are sequential numbers, so file names with dots
cannot break webdataset's grouping. ``OUT/shards_stats.json`` records the counts and the brace pattern to
pass as ``--data``. Pairs that cannot be used (missing or undecodable image, missing/empty/non-UTF-8
caption) are skipped and counted by reason, as the loaders do.
"""

from __future__ import annotations

import io
import json
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import webdataset as wds
from tqdm.auto import tqdm

from mdc_core.data import IMAGE_EXTS
from mdc_core.sources import resolve_source
from mdc_core.transforms import ImageError, open_image, read_image_file

STATS_FILE = "shards_stats.json"


def _folder_pairs(root: Path) -> Iterator[dict[str, Any]]:
    """``{"image": path, "caption": str | None | bytes, "meta": {...}}`` for every image under `root`."""
    for image in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower().lstrip(".") in IMAGE_EXTS):
        txt = image.with_suffix(".txt")
        caption: str | bytes | None = None
        if txt.is_file():
            raw = txt.read_bytes()
            try:
                caption = raw.decode("utf-8")
            except UnicodeDecodeError:
                caption = raw  # reported as bad_caption_encoding
        yield {"image": str(image), "caption": caption, "meta": {"source": str(image.relative_to(root))}}


def _table_pairs(path: str, images: str | None = None) -> Iterator[dict[str, Any]]:
    source = resolve_source(path, "auto", None, images)  # now: a bad source fails before --out is created
    if source.kind == "wds":
        raise ValueError(f"{path} already holds WebDataset shards; pass it as --data directly")
    return ({"image": row["image"], "caption": row["caption"], "meta": {"source": row["image"], **row["meta"]}}
            for row in source.rows)


def _has_images(path: Path) -> bool:
    return path.is_dir() and any(p.suffix.lower().lstrip(".") in IMAGE_EXTS for p in path.rglob("*") if p.is_file())


def write_shards(source: str | Path, out: str | Path, *, shard_size: int = 10_000, check_images: bool = True,
                 progress: bool = True, images: str | Path | None = None) -> dict[str, Any]:
    """Write the pairs of `source` (table file or image folder, see the module docstring) as shards in `out`;
    `images` is a caption table's image folder (default: found, see :mod:`mdc_core.sources`).

    `check_images` decodes every image once (the cost of one epoch's decoding) so that broken files are dropped
    here rather than on every epoch. Returns the stats also written to ``out/shards_stats.json``:
    ``{"written", "shards", "skipped": {reason: n}, "pattern"}``.
    """
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    src = Path(source).expanduser()
    if not src.exists():
        raise FileNotFoundError(f"--from {src} does not exist; expected a .csv/.tsv/.json caption file or a folder "
                                "of images with same-name .txt captions")
    pairs = _folder_pairs(src) if _has_images(src) else _table_pairs(str(src), str(images) if images else None)
    out = Path(out)
    if any(out.glob("*.tar")):
        raise FileExistsError(f"{out} already holds .tar shards; choose an empty --out folder")
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    skipped: Counter[str] = Counter()
    written = 0
    try:
        with wds.ShardWriter(str(out / "%05d.tar"), maxcount=shard_size, verbose=0) as sink:
            for pair in tqdm(pairs, desc="shards", unit=" pairs", disable=not progress):
                reason, sample = _sample(pair, written, check_images)
                if reason:
                    skipped[reason] += 1
                    continue
                sink.write(sample)
                written += 1
        if written == 0:
            raise ValueError(f"no usable image-caption pair in {src} (skipped: {dict(skipped)})")
    except BaseException:  # a failed or interrupted command leaves nothing behind: no shards, no empty --out
        if created:
            shutil.rmtree(out, ignore_errors=True)
        else:
            for p in out.glob("*.tar"):
                p.unlink()
        raise
    n_shards = len(list(out.glob("*.tar")))
    stats = {"source": str(src), "written": written, "shards": n_shards, "shard_size": shard_size,
             "skipped": dict(skipped), "pattern": str(out / f"{{00000..{n_shards - 1:05d}}}.tar")}
    (out / STATS_FILE).write_text(json.dumps(stats, indent=2) + "\n")
    return stats


def _sample(pair: dict[str, Any], index: int, check_images: bool) -> tuple[str, dict[str, Any]]:
    """(skip reason or "", webdataset sample) for one pair."""
    caption = pair["caption"]
    if caption is None:
        return "missing_caption", {}
    if isinstance(caption, bytes):
        return "bad_caption_encoding", {}
    caption = str(caption).strip()
    if not caption:
        return "empty_caption", {}
    path = Path(pair["image"])
    try:
        data = read_image_file(path)  # a device or FIFO is refused, never read
    except FileNotFoundError:
        return "missing_image", {}
    except ImageError as err:
        return err.reason, {}
    except OSError:
        return "bad_image", {}
    ext = path.suffix.lower().lstrip(".")
    ext = "jpg" if ext == "jpeg" else ext
    if check_images or ext not in IMAGE_EXTS:
        try:
            pil = open_image(data, str(path))
        except ImageError as err:
            return err.reason, {}
        if ext not in IMAGE_EXTS:  # e.g. .bmp/.gif from a table: stored losslessly as PNG
            buf = io.BytesIO()
            pil.save(buf, format="PNG")
            data, ext = buf.getvalue(), "png"
    meta = {k: v for k, v in pair["meta"].items() if isinstance(v, (str, int, float, bool)) or v is None}
    return "", {"__key__": f"{index:09d}", ext: data, "txt": caption, "json": json.dumps(meta)}
