"""Export a split of a shard data set as a COCO caption json plus an image folder (for COCO-style tools)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mdc_core.data import IMAGE_EXTS
from mdc_core.sources import iter_shard_records, resolve_source


def export_coco(dataset: str | Path, split: str | None = "test", out_dir: str | Path | None = None) -> Path:
    """Write ``out_dir/captions.json`` (``{"images": [{"id", "file_name"}], "annotations": [{"image_id",
    "caption", "id"}]}``, one annotation per image from KEY.txt) and ``out_dir/images/KEY.<ext>``, byte copies.

    `dataset` is anything :func:`~mdc_core.sources.resolve_source` accepts as shards; `out_dir` defaults to
    ``<dataset>/coco/<split>``. Records without an image or a UTF-8 caption are left out. Image ids are the
    keys as integers when all keys are digits, else 0..N-1. Returns the json path, written last (atomically).
    """
    source = resolve_source(str(dataset), "wds", split)
    out = Path(out_dir) if out_dir is not None else Path(dataset) / "coco" / (split or "all")
    (out / "images").mkdir(parents=True, exist_ok=True)
    images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    for rec in iter_shard_records(source.shards):
        ext = next((e for e in IMAGE_EXTS if e in rec), None)
        if "__skip__" in rec or ext is None or "txt" not in rec:
            continue
        try:
            caption = rec["txt"].decode("utf-8").strip()
        except UnicodeDecodeError:
            continue
        key = rec["__key__"]
        name = f"{key}.{ext}"
        (out / "images" / name).write_bytes(rec[ext])
        image_id = int(key) if key.isdigit() else len(images)
        images.append({"id": image_id, "file_name": name})
        annotations.append({"image_id": image_id, "caption": caption, "id": len(annotations)})
    path = out / "captions.json"
    tmp = out / "captions.json.tmp"
    tmp.write_text(json.dumps({"images": images, "annotations": annotations}) + "\n")
    os.replace(tmp, path)
    return path
