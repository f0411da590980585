"""The embedded synthetic image-caption data set, written as img2dataset-style WebDataset shards.

``write_synthetic_dataset(out, n)`` writes::

    out/train/000000.tar, 000001.tar, ...   members KEY.jpg, KEY.txt (caption, UTF-8), KEY.json (metadata)
    out/val/...  out/test/...  out/compgen/...
    out/manifest.json                      generator version, parameters, counts, vocabularies, held-out pairs

KEY is 9 digits, ``<split id><index:08d>`` (train 0, val 1, test 2, compgen 3), so keys are unique across splits.
KEY.json holds ``caption`` (= KEY.txt), ``caption_style``, ``short_caption``, ``long_caption``, ``labels``
(probe labels, see :data:`~mdc_workbench.data.scene.LABEL_NAMES`), ``objects`` (all objects, primary first),
``negatives`` (category -> text, see :mod:`mdc_workbench.data.captions`) and ``heldout`` (has a held-out pair).
With caption style ``clauses`` the caption is a two-clause caption
(:func:`~mdc_workbench.data.captions.clause_caption`) and KEY.json also holds ``clause_group`` (``predictable`` |
``unpredictable``) and ``clause_facts`` (the facts of each clause); it is drawn after everything else, so the
images, other captions and negatives of a seed are those of the other styles, and the other styles' bytes do not
change.

Shards are written as ``NNNNNN.tar.part`` and renamed when complete, and ``manifest.json`` is written last
(temp file + ``os.replace``) after any old one is removed, so a crash never leaves a dataset that looks complete.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import webdataset as wds
from tqdm import tqdm

from mdc_workbench.data.captions import (
    LINKED_STYLES,
    NEGATIVE_TYPES,
    clause_caption,
    link_scene,
    long_caption,
    negatives,
    order_caption,
    short_caption,
)
from mdc_workbench.data.scene import (
    LABEL_NAMES,
    SPLITS,
    SYNTH_VERSION,
    encode_jpeg,
    example_rng,
    get_difficulty,
    heldout_combos,
    render_scene,
    sample_scene,
    split_id,
    vocabularies,
)

CAPTION_STYLES = ("short", "long", "mixed", "clauses", *LINKED_STYLES)
MAX_IMAGE_SIZE = 1024  # pixels: a scene is drawn whole in memory (1,000,000 px ran to 15.5 GB before it was bounded)
GENERATOR = "mdc_core.data.synth"  # manifest.json's name for this format (version SYNTH_VERSION), kept from before the
# writer moved to the workbench, so that a seed writes the same bytes and its data fingerprint stays the same
_SHARD_RE = re.compile(r"\d{6}\.tar(\.part)?")


def make_example(seed: int, split: str, index: int, image_size: int = 64, captions: str = "mixed",
                 heldout: list[tuple[str, str]] | None = None, difficulty: str = "paper") -> dict[str, Any]:
    """Example `index` of `split` as a WebDataset sample ``{"__key__", "jpg": bytes, "txt": str, "json": bytes}``.

    `captions` is ``short``, ``long``, ``mixed`` (a seeded coin per image), ``clauses`` (two-clause captions,
    half of them with a predictable second clause: :func:`~mdc_workbench.data.captions.clause_caption`) or a linked
    order, ``shape_last`` / ``colour_last`` (outside compgen the main object's shape follows its colour in 80% of
    the images, :func:`~mdc_workbench.data.captions.link_scene`; the caption names its colour and shape in that
    order, :func:`~mdc_workbench.data.captions.order_caption`). The short and long captions, the labels, the object
    list and the negatives are always in the JSON; the scene depends on neither `captions` (other than a linked
    order) nor `image_size`. `heldout` defaults to :func:`heldout_combos` of `seed`; `difficulty` names the scene
    settings (:data:`~mdc_workbench.data.scene.DIFFICULTIES`).
    """
    if captions not in CAPTION_STYLES:
        raise ValueError(f"captions must be one of {', '.join(CAPTION_STYLES)}, got {captions!r}")
    diff = get_difficulty(difficulty)
    held_set = set(heldout if heldout is not None else heldout_combos(seed, diff))
    rng = example_rng(seed, split, index)
    scene = sample_scene(rng, held_set, compgen=split == "compgen", difficulty=diff)
    linked = captions in LINKED_STYLES and split != "compgen"
    scene = link_scene(scene, rng, diff.shapes, held_set) if linked else scene  # shape follows colour (80%)
    img = render_scene(scene, image_size, rng)
    short_spec, short = short_caption(scene, rng)
    long = long_caption(scene, rng)
    style = ("short", "long")[int(rng.integers(2))]  # always drawn, so `captions` never shifts later choices
    style = style if captions == "mixed" else captions
    negs = negatives(short_spec, scene, rng, forbidden=None if split == "compgen" else held_set, shapes=diff.shapes)
    clause = clause_caption(scene, rng) if captions == "clauses" else None  # drawn last: other styles unchanged
    key = f"{split_id(split)}{index:08d}"
    meta = {
        "key": key, "split": split, "index": index, "seed": seed,
        "caption_style": style, "caption": clause[0] if clause else order_caption(scene, style) if linked
        else short if style == "short" else long,
        "short_caption": short, "long_caption": long,
        "labels": scene.labels(),
        "objects": [o.to_json() for o in scene.objects],
        "negatives": negs,
        "heldout": any((o.colour, o.shape) in held_set for o in scene.objects),
    }
    if clause:
        meta.update(clause_group=clause[1], clause_facts=[list(clause[2]), list(clause[3])])
    return {"__key__": key, "jpg": encode_jpeg(img), "txt": meta["caption"],
            "json": json.dumps(meta, ensure_ascii=False, sort_keys=True).encode("utf-8")}


def _examples(split: str, count: int, workers: int, **kw: Any) -> Iterator[dict[str, Any]]:
    make = partial(make_example, split=split, **kw)
    if workers <= 1 or count < 256:
        yield from (make(index=i) for i in range(count))
        return
    with ProcessPoolExecutor(workers) as pool:  # order-preserving map: output is identical to the serial loop
        yield from pool.map(_make_by_index, [(make, i) for i in range(count)], chunksize=64)


def _make_by_index(args: tuple[Any, int]) -> dict[str, Any]:
    make, index = args
    return make(index=index)


def _write_split(folder: Path, split: str, count: int, shard_size: int, workers: int, bar: tqdm,
                 **kw: Any) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():  # stale shards of an earlier run would otherwise be read with the new ones
        if _SHARD_RE.fullmatch(old.name):
            old.unlink()
    if count == 0:
        return []
    names: list[str] = []

    def finalize(part: str) -> None:  # a shard gets its real name only once it is complete
        os.replace(part, part[: -len(".part")])
        names.append(Path(part).name[: -len(".part")])

    writer = wds.ShardWriter(str(folder / "%06d.tar.part"), maxcount=shard_size, post=finalize, verbose=0,
                             mtime=0)  # fixed int mtime: byte-identical shards, no PAX header per member
    try:
        for sample in _examples(split, count, workers, **kw):
            writer.write(sample)
            bar.update(1)
    except BaseException:
        writer.post = None  # the interrupted shard keeps its .part name
        raise
    finally:
        writer.close()
    return names


def write_synthetic_dataset(out: str | Path, n: int, seed: int = 0, image_size: int = 64, captions: str = "mixed",
                            n_val: int | None = None, n_test: int | None = None, n_compgen: int | None = None,
                            shard_size: int = 1000, progress: bool = True,
                            workers: int | None = None, difficulty: str = "paper") -> dict[str, Any]:
    """Write the synthetic data set (`n` training images; val/test/compgen default to ``max(64, n // 20)``).

    `difficulty` names the scene settings (``paper``, the default, or ``easy``:
    :data:`~mdc_workbench.data.scene.DIFFICULTIES`); it is recorded in the manifest.

    `workers` processes draw the images (default: the CPU count, at most 8; 1 = in this process); the bytes
    written do not depend on it. Returns the
    manifest (also written to ``out/manifest.json``). Shard files of a previous run in ``out/<split>/`` are
    replaced.
    """
    if n < 1:
        raise ValueError(f"n (training images) must be >= 1, got {n}")
    if captions not in CAPTION_STYLES:
        raise ValueError(f"captions must be one of {', '.join(CAPTION_STYLES)}, got {captions!r}")
    if not 16 <= image_size <= MAX_IMAGE_SIZE:  # checked before anything is written: each image is drawn whole
        raise ValueError(f"image_size must be in 16-{MAX_IMAGE_SIZE} pixels, got {image_size}")
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    get_difficulty(difficulty)  # fail before anything is written
    workers = min(8, os.cpu_count() or 1) if workers is None else workers
    default = max(64, n // 20)
    counts = {"train": n, "val": default if n_val is None else n_val, "test": default if n_test is None else n_test,
              "compgen": default if n_compgen is None else n_compgen}
    for split, count in counts.items():
        if count < 0:
            raise ValueError(f"n_{split} must be >= 0, got {count}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").unlink(missing_ok=True)  # incomplete until the new manifest lands
    held = heldout_combos(seed, difficulty)
    params = {"n": n, "seed": seed, "image_size": image_size, "captions": captions, "n_val": counts["val"],
              "n_test": counts["test"], "n_compgen": counts["compgen"], "shard_size": shard_size,
              "difficulty": difficulty}
    splits: dict[str, Any] = {}
    with tqdm(total=sum(counts.values()), disable=not progress, desc=f"writing {out}", unit="img") as bar:
        for split in SPLITS:
            shards = _write_split(out / split, split, counts[split], shard_size, workers, bar, seed=seed,
                                  image_size=image_size, captions=captions, heldout=held, difficulty=difficulty)
            splits[split] = {"count": counts[split], "shards": shards}
    manifest = {
        "generator": GENERATOR, "version": SYNTH_VERSION, "params": params,
        "counts": {split: counts[split] for split in SPLITS}, "splits": splits,
        "vocab": vocabularies(difficulty), "label_names": list(LABEL_NAMES), "negative_types": list(NEGATIVE_TYPES),
        "heldout_combos": [list(p) for p in held],
        "caption_styles": ["short", "long"] + ([captions] if captions in ("clauses", *LINKED_STYLES) else []),
        "members": {"jpg": "RGB JPEG (quality 95)", "txt": "caption, UTF-8", "json": "metadata, UTF-8 JSON"},
    }
    tmp = out / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, out / "manifest.json")
    return manifest


def read_manifest(root: str | Path) -> dict[str, Any]:
    """The manifest of a synthetic data set written by :func:`write_synthetic_dataset`."""
    path = Path(root) / "manifest.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: {root} is not a complete synthetic data set "
                                f"(write one with write_synthetic_dataset)")
    return json.loads(path.read_text())
