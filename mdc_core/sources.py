"""Where image-caption records come from: path resolution and raw (undecoded) record streams.

Accepted ``DataConfig.path`` forms (``format="auto"`` picks by extension / directory contents; an explicit
``format`` must agree with what is found):

* a directory of WebDataset shards (``*.tar``, ``*.tar.gz``, ``*.tgz``) as img2dataset writes them:
  members ``KEY.jpg`` (or ``.jpeg``/``.png``/``.webp``), ``KEY.txt`` (caption) and optional ``KEY.json``;
* a directory with a ``<split>`` subdirectory: ``path/<split>`` is used (the synthetic data set's layout);
  a directory that has a ``manifest.json`` or other split folders but not the requested one is an error;
* a brace or glob pattern of shards: ``dir/{000000..000010}.tar``, ``dir/*.tar`` (missing files are dropped
  with a warning; none existing is an error);
* a ``.csv`` or ``.tsv`` file with a header row naming an image column (one of :data:`IMAGE_COLUMNS`) and a
  caption column (one of :data:`CAPTION_COLUMNS`), case-insensitive; image paths relative to the file's folder
  or to the `images` folder when one is given (absolute paths are used as they are); other columns go to the
  sample's ``meta``;
* a COCO caption ``.json`` (``{"images": [{"id", "file_name"}], "annotations": [{"image_id", "caption", "id"}]}``,
  one sample per annotation, images looked up in the `images` folder when one is given, else beside the json, in
  an ``images/`` folder beside it, and in the official layout ``annotations/captions_val2017.json`` beside
  ``val2017/`` (the folder named by the part of the file name after the last ``_``)) or a Karpathy split json
  (``{"images": [{"filename", "filepath"?, "split", "sentences": [{"raw"}]}]}``, one sample per sentence,
  filtered by split: ``train`` includes ``restval``); a caption json none of whose images is found is an error;
* a directory holding no shards but exactly one ``.csv``/``.tsv``/``.json`` caption file (``manifest.json`` and
  ``*_stats.json`` are ignored): that file.
"""

from __future__ import annotations

import csv
import glob
import hashlib
import json
import logging
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import braceexpand
import webdataset as wds

IMAGE_COLUMNS = ("image", "filepath", "file_path", "image_path", "img_path", "img", "path", "file", "filename",
                 "file_name")
CAPTION_COLUMNS = ("caption", "title", "text", "captions", "sentence", "raw", "alt", "alt_text", "description")
SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz")
TABLE_KINDS = {".csv": "csv", ".tsv": "tsv", ".json": "coco"}  # caption files: Source.kind by extension
KNOWN_SPLITS = ("train", "val", "test", "compgen", "restval")
log = logging.getLogger("mdc_core.data")
_EXPECTED = ("a directory of .tar shards (or with a <split> subdirectory), a brace/glob shard pattern, "
             "a .csv/.tsv file or a COCO caption .json")


@dataclass
class Source:
    """A resolved data source: `shards` (kind ``wds``) or `rows` (kinds ``csv``, ``tsv``, ``coco``).

    A row is ``{"key": str, "image": str (absolute path), "caption": str, "meta": dict}``."""

    kind: str
    location: str
    shards: list[str] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    root: Path | None = None  # folder that may hold a synthetic manifest.json

    def __len__(self) -> int:
        return len(self.shards) if self.kind == "wds" else len(self.rows)

    def fingerprint(self, known: dict[str, dict[str, Any]] | None = None) -> dict[str, Any] | None:
        """A content fingerprint ``{"kind", "items", "digest", "version": 2}`` (None for remote shards, which cannot
        be read here): the digest covers the SHA-256 of each shard's bytes with its name (or of the caption table's
        bytes; its images are not read) and the data set's ``manifest.json``, but no folder name, so a moved copy
        gives the same one, and other content of the same sizes another. Each shard is read once (:func:`shard_sha256`
        with `known`, what :func:`mdc_core.run_folder.record_fingerprint` keeps; it gains the digests computed here)."""
        known = {} if known is None else known
        found = self._digest(lambda shard: shard_sha256(shard, known))
        return None if found is None else {**found, "version": FINGERPRINT_VERSION}

    def names_and_sizes(self) -> dict[str, Any] | None:
        """The fingerprint runs recorded before content was hashed (no ``version``): each shard's name and size
        (a caption table's bytes, the manifest's digest, as now). Only for comparing with such a record."""
        return self._digest(lambda shard: str(shard.stat().st_size))

    def _digest(self, describe: Callable[[Path], str]) -> dict[str, Any] | None:
        parts: list[str] = [self.kind]
        if self.kind == "wds":
            for shard in map(Path, self.shards):
                if not shard.is_file():
                    return None
                parts.append(f"{shard.name}:{describe(shard)}")
        elif Path(self.location).is_file():
            parts.append(file_sha256(Path(self.location)))
        else:
            return None
        manifest = self.root / "manifest.json" if self.root is not None else None
        if manifest is not None and manifest.is_file():
            parts.append(file_sha256(manifest))
        return {"kind": self.kind, "items": len(self), "digest": hashlib.sha256("\n".join(parts).encode()).hexdigest()}


FINGERPRINT_VERSION = 2  # 2: shard contents hashed; records without a version hold names and sizes
_SHA256_MEMO: dict[tuple[str, int, int, int], str] = {}  # (absolute path, bytes, mtime_ns, ctime_ns) -> SHA-256


def shard_sha256(path: Path, known: dict[str, dict[str, Any]]) -> str:
    """The SHA-256 of file `path`, from `known` or this process's memo when its size and modification and change
    times (ns) are those recorded there, else read (and added to both). The change time is the kernel's (any write
    or ``utime`` sets it to now), so content edited in place with its mtime set back is read again."""
    stat = path.stat()
    key = str(path.resolve())
    entry = known.get(key)
    if isinstance(entry, dict) and entry.get("bytes") == stat.st_size and entry.get("mtime_ns") == stat.st_mtime_ns \
            and entry.get("ctime_ns") == stat.st_ctime_ns and isinstance(entry.get("sha256"), str):
        return entry["sha256"]
    memo = (key, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    if memo not in _SHA256_MEMO:
        _SHA256_MEMO[memo] = file_sha256(path)
    known[key] = {"bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns, "ctime_ns": stat.st_ctime_ns,
                  "sha256": _SHA256_MEMO[memo]}
    return _SHA256_MEMO[memo]


def file_sha256(path: str | Path) -> str:
    """The SHA-256 hex digest of a file."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _is_shard(p: Path) -> bool:
    return p.is_file() and p.name.endswith(SHARD_SUFFIXES)


def resolve_source(path: str, fmt: str = "auto", split: str | None = None, images: str | None = None) -> Source:
    """Resolve ``DataConfig.path``/``format`` (and `split`) to a :class:`Source`; see the module docstring.
    `images` is the folder a caption table's image paths are relative to (``DataConfig.images``; default: found).

    Raises ``FileNotFoundError`` (nothing there, or none of a caption json's images found) or ``ValueError``
    (wrong kind / unusable content) naming the path and what was expected."""
    if images and not Path(images).expanduser().is_dir():
        raise FileNotFoundError(f"image folder {images} (--images / data.images) does not exist")
    if not path:
        raise ValueError(f"data.path is empty; expected {_EXPECTED}")
    if any(c in path for c in "{*?["):
        return _pattern_source(path, fmt)
    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"data path {p} does not exist; expected {_EXPECTED}")
    if p.is_dir():
        return _dir_source(p, fmt, split, images)
    kind = TABLE_KINDS.get(p.suffix.lower(), "wds" if p.name.endswith(SHARD_SUFFIXES) else None)
    if kind is None:
        raise ValueError(f"cannot tell the format of {p} from its extension; expected {_EXPECTED}")
    if fmt not in ("auto", kind):
        raise ValueError(f"data.format={fmt!r} but {p} looks like {kind} data")
    return _file_source(p, kind, split, images)


def data_fingerprint(data: Any, known: dict[str, dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """The content :meth:`Source.fingerprint` of a :class:`~mdc_core.config.DataConfig`'s training split (None: not
    readable); `known` holds shard digests already computed (:func:`mdc_core.run_folder.known_digests`)."""
    try:
        return resolve_source(data.path, data.format, "train", data.images or None).fingerprint(known)
    except (OSError, ValueError):
        return None


def _pattern_source(pattern: str, fmt: str) -> Source:
    if fmt not in ("auto", "wds"):
        raise ValueError(f"data.format={fmt!r} but {pattern!r} is a shard pattern (format wds)")
    names = [n for part in braceexpand.braceexpand(pattern) for n in (sorted(glob.glob(part)) or [part])]
    shards = [n for n in names if _is_shard(Path(n))]
    if not shards:
        raise FileNotFoundError(f"no shard files matched {pattern!r}; expected files ending in "
                                f"{'/'.join(SHARD_SUFFIXES)}")
    missing = [n for n in names if n not in shards]
    if missing:
        warnings.warn(f"{len(missing)} of {len(names)} shards in {pattern!r} do not exist (first: {missing[0]})",
                      stacklevel=2)
    return Source("wds", pattern, shards=shards, root=Path(shards[0]).parent)


def _dir_source(p: Path, fmt: str, split: str | None, images: str | None) -> Source:
    root = p
    if split and (p / split).is_dir():
        p = p / split
    elif split:
        splits = sorted(d.name for d in p.iterdir() if d.is_dir() and d.name in KNOWN_SPLITS)
        if splits or (p / "manifest.json").is_file():
            raise FileNotFoundError(f"{p} has no {split!r} split folder (found: {', '.join(splits) or 'none'})")
    shards = sorted(str(f) for f in p.iterdir() if _is_shard(f))
    if shards and fmt in ("auto", "wds"):
        return Source("wds", str(p), shards=shards, root=root)
    if fmt == "wds":
        raise FileNotFoundError(f"no .tar shards in directory {p} (data.format='wds')")
    exts = [ext for ext, kind in TABLE_KINDS.items() if fmt in ("auto", kind)]
    tables = sorted(f for f in p.iterdir() if f.is_file() and f.suffix.lower() in exts
                    and f.name != "manifest.json" and not f.name.endswith("_stats.json"))
    if not tables:
        raise FileNotFoundError(f"directory {p} holds no data: expected .tar shards, a <split> subdirectory or "
                                f"one .csv/.tsv/.json caption file")
    if len(tables) > 1:
        raise ValueError(f"directory {p} holds several caption files ({', '.join(t.name for t in tables)}); "
                         f"set data.path to one of them")
    return _file_source(tables[0], TABLE_KINDS[tables[0].suffix.lower()], split, images)


def _file_source(p: Path, kind: str, split: str | None, images: str | None = None) -> Source:
    if kind == "wds":
        return Source("wds", str(p), shards=[str(p)], root=p.parent)
    base = Path(images).expanduser() if images else None
    rows = _read_table(p, "\t" if kind == "tsv" else ",", base) if kind in ("csv", "tsv") else \
        _read_coco(p, split, base)
    if not rows:
        raise ValueError(f"{p} has no samples" + (f" for split {split!r}" if kind == "coco" and split else ""))
    return Source(kind, str(p), rows=rows, root=p.parent)


def _pick(header: list[str], names: tuple[str, ...]) -> int | None:
    lowered = [h.strip().lower() for h in header]
    return next((lowered.index(n) for n in names if n in lowered), None)


def _read_table(p: Path, delimiter: str, images: Path | None = None) -> list[dict[str, Any]]:
    with open(p, newline="", encoding="utf-8", errors="replace") as f:
        reader = csv.reader(f, delimiter=delimiter)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{p} is empty; expected a header row and one row per image-caption pair")
        img_col, cap_col = _pick(header, IMAGE_COLUMNS), _pick(header, CAPTION_COLUMNS)
        if img_col is None or cap_col is None:
            raise ValueError(f"{p}: header {header} needs an image column (one of {', '.join(IMAGE_COLUMNS)}) "
                             f"and a caption column (one of {', '.join(CAPTION_COLUMNS)})")
        rows = []
        for i, row in enumerate(reader):
            if not row or len(row) <= max(img_col, cap_col):
                continue
            meta = {h: v for j, (h, v) in enumerate(zip(header, row, strict=False)) if j not in (img_col, cap_col)}
            meta["image"] = row[img_col]
            rows.append({"key": f"{i:09d}", "image": str((images or p.parent) / row[img_col]), "caption": row[cap_col],
                         "meta": meta})
    return rows


def image_folders(p: Path, images: Path | None = None) -> tuple[Path, ...]:
    """Where the images of caption json `p` are looked for, in order: `images` alone when given; else beside the
    json, its ``images/`` folder, and for the COCO layout (``ROOT/annotations/captions_val2017.json``)
    ``ROOT/val2017`` and ``ROOT/images/val2017``."""
    if images is not None:
        return (images,)
    folders = [p.parent, p.parent / "images"]
    if p.parent.name == "annotations" and "_" in p.stem:
        subset = p.stem.rsplit("_", 1)[1]  # captions_val2017 -> val2017
        folders += [p.parent.parent / subset, p.parent.parent / "images" / subset]
    return tuple(folders)


def _none_found(p: Path, rows: list[dict[str, Any]], folders: tuple[Path, ...], example: str) -> None:
    """A caption json none of whose images exists is a one-line error, not an epoch of skipped records."""
    if rows and not any(Path(r["image"]).is_file() for r in rows):
        raise FileNotFoundError(f"{p}: none of its {len(rows)} images was found (e.g. {example!r} in "
                                f"{', '.join(str(f) for f in folders)}); pass --images DIR (data.images), the "
                                "folder holding them")


def _read_coco(p: Path, split: str | None, images: Path | None = None) -> list[dict[str, Any]]:
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{p} is not valid JSON: {err}") from err
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise ValueError(f"{p}: expected a COCO caption json with 'images' and 'annotations' lists "
                         f"(or a Karpathy json with 'images' holding 'sentences')")
    listed = data["images"]
    if listed and isinstance(listed[0], dict) and "sentences" in listed[0]:
        return _read_karpathy(p, listed, split, images)
    if not isinstance(data.get("annotations"), list):
        raise ValueError(f"{p}: COCO caption json has no 'annotations' list")
    folders = image_folders(p, images)
    files: dict[Any, str] = {}
    for im in listed:
        name = im["file_name"]
        found = next((d / name for d in folders if (d / name).is_file()), folders[0] / name)
        files[im["id"]] = str(found)
    rows = []
    for ann in data["annotations"]:
        image = files.get(ann.get("image_id"))
        if image is None:
            continue  # an annotation of an image the json does not list
        rows.append({"key": str(ann.get("id", len(rows))), "image": image, "caption": str(ann.get("caption", "")),
                     "meta": {"image_id": ann["image_id"], "annotation_id": ann.get("id"),
                              "file_name": Path(image).name}})
    _none_found(p, rows, folders, listed[0]["file_name"] if listed else "")
    return rows


def _read_karpathy(p: Path, listed: list[dict[str, Any]], split: str | None, images: Path | None = None
                   ) -> list[dict[str, Any]]:
    wanted = None if split is None else {"train", "restval"} if split == "train" else {split}
    rows = []
    folders = (images,) if images is not None else (p.parent, p.parent / "images")
    for im in listed:
        if wanted is not None and im.get("split") not in wanted:
            continue
        rel = Path(im.get("filepath", "")) / im["filename"]
        cands = tuple(c for d in folders for c in (d / rel, d / im["filename"]))
        image = next((c for c in cands if c.is_file()), cands[0])
        for sent in im["sentences"]:
            rows.append({"key": str(sent.get("sentid", len(rows))), "image": str(image),
                         "caption": sent.get("raw", " ".join(sent.get("tokens", []))),
                         "meta": {"image_id": im.get("cocoid", im.get("imgid")), "file_name": im["filename"],
                                  "split": im.get("split")}})
    _none_found(p, rows, folders, str(Path(listed[0].get("filepath", "")) / listed[0]["filename"]) if listed else "")
    return rows


# -- raw record streams (no decoding): dicts with "__key__" and members, or {"__skip__": reason} -----------------------


def iter_shard_records(shards: list[str], suffixes: set[str] | None = None) -> Iterator[dict[str, Any]]:
    """Samples of `shards` in order, grouped by key by webdataset (``{"__key__", "jpg": bytes, ...}``).

    A shard that cannot be opened or read is reported on the ``mdc_core.data`` logger (stderr by default) and
    yields ``{"__skip__": "bad_shard", "__url__": shard}``; the stream goes on with the next shard (samples read
    before the error are kept). `suffixes` keeps only those members."""
    select = (lambda fname: fname.rsplit(".", 1)[-1].lower() in suffixes) if suffixes else None
    for shard in shards:
        try:
            yield from wds.tarfile_samples([{"url": shard}], select_files=select)
        except Exception as err:  # webdataset's default handler re-raises: tarfile/IO/grouping errors end the shard
            log.warning("cannot read shard %s (%s: %s); skipped the rest of it", shard, type(err).__name__, err)
            yield {"__skip__": "bad_shard", "__url__": shard}
