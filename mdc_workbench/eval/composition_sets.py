"""Compositionality benchmarks read from their published formats at local paths (nothing is downloaded).

Every loader returns a list of :class:`Example`: one image, its true caption, and per task the false captions
it must beat. Accuracy is "pick the true caption": an example counts as correct for a task when the true
caption scores strictly higher than every false caption of that task.

=================  =====================================================================================
benchmark          ``--data`` and format
=================  =====================================================================================
``synth``          the embedded data set folder (``mdc data synth``); each sample's ``KEY.json`` holds
                   ``short_caption`` and ``negatives``: category -> text (see :data:`SYNTH_TASKS`)
``aro-relation``   ARO VG-Relation: folder with ``visual_genome_relation.json`` (list of ``image_path``,
                   ``bbox_x/y/w/h``, ``true_caption``, ``false_caption``, ``relation_name``) and ``images/``;
                   the image is cropped to the box, as ARO does
``aro-attribution``  ARO VG-Attribution: ``visual_genome_attribution.json`` likewise (``attributes``)
``coco-order``     ARO COCO-order: ``coco_karpathy_test.json`` as ARO reads it (list of ``image``,
``flickr-order``   ``caption`` [list]), or a Karpathy ``dataset_*.json`` (test split), or precomputed cases
                   (list of ``image``, ``caption_options`` = [true, perturbed ...]); images relative to the
                   json's folder. Perturbations are made by :func:`order_perturbations`
``sugarcrepe``     folder with any of ``add_obj.json`` ... ``swap_att.json`` (dict id -> ``filename``,
                   ``caption``, ``negative_caption``); images (COCO val2017) in ``--images`` or
                   ``images/``, ``val2017/`` beside the jsons, or the folder itself
=================  =====================================================================================
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mdc_core.sources import iter_shard_records, resolve_source
from mdc_core.transforms import eval_transform, open_image, read_image_file

# synthetic negative category -> task name (the task names the Table 2 column, see COLUMNS)
SYNTH_TASKS: dict[str, str] = {"relation_swap": "relation", "attribute_swap": "attribute",
                               "order_shuffle": "order", "add": "add", "replace": "replace"}
SUGARCREPE_TASKS: tuple[str, ...] = ("add_obj", "add_att", "replace_obj", "replace_att", "replace_rel",
                                     "swap_obj", "swap_att")
ARO_VG_FILES: dict[str, str] = {"aro-relation": "visual_genome_relation.json",
                                "aro-attribution": "visual_genome_attribution.json"}
ORDER_FILES: dict[str, str] = {"coco-order": "coco_karpathy_test.json", "flickr-order": "flickr30k_test.json"}

# task -> (benchmark group, column) of the paper's Table 2; SugarCrepe sub-tasks are averaged per column
COLUMNS: dict[str, tuple[str, str]] = {
    "relation": ("ARO", "relation"), "attribute": ("ARO", "attribute"), "coco_order": ("ARO", "coco order"),
    "flickr_order": ("ARO", "flickr30k order"), "order": ("ARO", "order"),
    "add": ("SugarCrepe", "add"), "add_obj": ("SugarCrepe", "add"), "add_att": ("SugarCrepe", "add"),
    "replace": ("SugarCrepe", "replace"), "replace_obj": ("SugarCrepe", "replace"),
    "replace_att": ("SugarCrepe", "replace"), "replace_rel": ("SugarCrepe", "replace"),
    "swap_obj": ("SugarCrepe", "swap"), "swap_att": ("SugarCrepe", "swap"),
}
COLUMN_ORDER: tuple[str, ...] = ("relation", "attribute", "coco order", "flickr30k order", "order", "add",
                                 "replace", "swap")


@dataclass(frozen=True)
class Example:
    """One image with its true caption and, per task, the false captions it must beat."""

    key: str
    image: str | bytes  # file path, or encoded image bytes (embedded data shards)
    positive: str
    negatives: dict[str, tuple[str, ...]] = field(default_factory=dict)  # task -> false captions
    crop: tuple[float, float, float, float] | None = None  # (x, y, w, h) pixels, cut before preprocessing

    def candidates(self) -> tuple[list[str], dict[str, list[int]]]:
        """All distinct captions (the true one first) and, per task, the indices of its false captions.

        A "false" caption identical to the true one is dropped (an order shuffle of a short caption can give
        the caption back); it is no negative. ARO's argmax protocol gives the same answer in that case.
        """
        texts = [self.positive]
        index = {self.positive: 0}
        tasks: dict[str, list[int]] = {}
        for task, negs in self.negatives.items():
            for neg in negs:
                if neg == self.positive:
                    continue
                if neg not in index:
                    index[neg] = len(texts)
                    texts.append(neg)
                tasks.setdefault(task, []).append(index[neg])
        return texts, tasks


def image_pixels(source: str | Path | bytes, image_size: int, *, crop: tuple[float, float, float, float] | None = None,
                 name: str = "image") -> torch.Tensor:
    """An image file (or its encoded bytes), optionally cropped to (x, y, w, h) pixels first, as a (3, S, S)
    tensor preprocessed for evaluation. FileNotFoundError names a missing file."""
    if isinstance(source, bytes):
        data = source
    else:
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"image file not found: {path} ({name}); set the image folder (--images) or "
                                    "check the data set layout")
        name, data = str(path), read_image_file(path)
    img = open_image(data, name)
    if crop is not None:
        x, y, w, h = crop
        img = img.crop((x, y, x + w, y + h))
    return eval_transform(image_size)(img)


def example_pixels(example: Example, image_size: int) -> torch.Tensor:
    """The example's image (cropped when it has a box) as a (3, S, S) tensor, preprocessed for evaluation."""
    return image_pixels(example.image, image_size, crop=example.crop, name=f"example {example.key}")


# ----------------------------------------------------------------------------------------------------------
# loaders


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise FileNotFoundError(f"benchmark file not found: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from err


def load_synth(path: str | Path, *, split: str = "test", limit: int | None = None, **_: Any) -> list[Example]:
    """Examples of the embedded data set: the short caption against each of its negatives."""
    source = resolve_source(str(path), "wds", split)
    out: list[Example] = []
    for rec in iter_shard_records(source.shards):
        if limit is not None and len(out) >= limit:
            break
        ext = next((e for e in ("jpg", "jpeg", "png", "webp") if e in rec), None)
        if "__skip__" in rec or ext is None or "json" not in rec:
            continue
        meta = json.loads(rec["json"])
        negs = {SYNTH_TASKS[k]: (v,) for k, v in meta.get("negatives", {}).items() if k in SYNTH_TASKS}
        positive = meta.get("short_caption") or rec.get("txt", b"").decode("utf-8").strip()
        if negs and positive:
            out.append(Example(rec["__key__"], rec[ext], positive, negs))
    if not out:
        raise ValueError(f"{path} (split {split!r}) holds no samples with negatives in their json; is it a data set "
                         "written by `mdc data synth`?")
    return out


def _vg_path(path: Path, benchmark: str) -> Path:
    return path / ARO_VG_FILES[benchmark] if path.is_dir() else path


def load_aro_vg(path: str | Path, *, benchmark: str = "aro-relation", images: str | Path | None = None,
                limit: int | None = None, **_: Any) -> list[Example]:
    """ARO VG-Relation / VG-Attribution: `path` is the ARO folder (or its json); images in ``images/``."""
    file = _vg_path(Path(path), benchmark)
    data = _read_json(file)
    if not isinstance(data, list) or (data and not {"image_path", "true_caption", "false_caption"} <= set(data[0])):
        raise ValueError(f"{file}: expected ARO's list of objects with image_path, bbox_x/y/w/h, true_caption, "
                         "false_caption")
    root = Path(images) if images else file.parent / "images"
    task = "relation" if benchmark == "aro-relation" else "attribute"
    out = []
    for i, item in enumerate(data[:limit]):
        crop = tuple(float(item[k]) for k in ("bbox_x", "bbox_y", "bbox_w", "bbox_h")) if "bbox_x" in item else None
        out.append(Example(str(i), str(root / item["image_path"]), item["true_caption"],
                           {task: (item["false_caption"],)}, crop))  # type: ignore[arg-type]
    return out


def pre_caption(caption: str, max_words: int = 30) -> str:
    """ARO's caption cleaning (``dataset_zoo/retrieval.py``): lower-case, some punctuation to spaces, at most
    `max_words` words."""
    caption = re.sub(r"([.!\"()*#:;~])", " ", caption.lower())
    caption = re.sub(r"\s{2,}", " ", caption).rstrip("\n").strip(" ")
    words = caption.split(" ")
    return " ".join(words[:max_words]) if len(words) > max_words else caption


_WORD = re.compile(r"\w+(?:[-']\w+)*|[^\w\s]")  # stands in for nltk.word_tokenize: words and punctuation


def _trigrams(tokens: list[str]) -> list[list[str]]:
    return [tokens[i:i + 3] for i in range(0, len(tokens), 3)]


def shuffle_within_trigrams(text: str, rng: random.Random) -> str:
    """ARO's ``shuffle_within_trigrams``: shuffle the words inside each consecutive trigram."""
    grams = _trigrams(_WORD.findall(text))
    for g in grams:
        rng.shuffle(g)
    return " ".join(" ".join(g) for g in grams)


def shuffle_trigrams(text: str, rng: random.Random) -> str:
    """ARO's ``shuffle_trigrams``: shuffle the order of the consecutive trigrams."""
    grams = _trigrams(_WORD.findall(text))
    rng.shuffle(grams)
    return " ".join(" ".join(g) for g in grams)


def _spacy_shufflers() -> dict[str, Callable[[str, random.Random], str]]:
    """ARO's two part-of-speech perturbations, when spaCy and its ``en_core_web_sm`` model are installed."""
    try:
        import spacy  # type: ignore[import-not-found]
        nlp = spacy.load("en_core_web_sm")
    except Exception:  # not installed (no model download is attempted)
        return {}
    nouns, adjs = {"NN", "NNS", "NNP", "NNPS"}, {"JJ", "JJR", "JJS"}

    def permute(words: list[str], idx: list[int], rng: random.Random) -> None:  # in place, like ARO's
        picked = [words[i] for i in idx]
        rng.shuffle(picked)
        for i, w in zip(idx, picked, strict=True):
            words[i] = w

    def nouns_and_adj(text: str, rng: random.Random) -> str:
        doc = nlp(text)
        words = [t.text for t in doc]
        permute(words, [i for i, t in enumerate(doc) if t.tag_ in nouns], rng)
        permute(words, [i for i, t in enumerate(doc) if t.tag_ in adjs], rng)
        return " ".join(words)

    def allbut_nouns_and_adj(text: str, rng: random.Random) -> str:
        doc = nlp(text)
        words = [t.text for t in doc]
        permute(words, [i for i, t in enumerate(doc) if t.tag_ not in nouns | adjs], rng)
        return " ".join(words)

    return {"shuffle_nouns_and_adj": nouns_and_adj, "shuffle_allbut_nouns_and_adj": allbut_nouns_and_adj}


def order_perturbations() -> dict[str, Callable[[str, random.Random], str]]:
    """ARO's order perturbations available here: the two trigram shuffles always; the two noun/adjective
    shuffles only when spaCy with ``en_core_web_sm`` is installed (they need a part-of-speech tagger)."""
    return {**_spacy_shufflers(), "shuffle_within_trigrams": shuffle_within_trigrams,
            "shuffle_trigrams": shuffle_trigrams}


def _order_cases(data: Any, file: Path) -> list[tuple[str, list[str]]]:
    """(image relative path, captions or caption options) from any of the three accepted layouts."""
    if isinstance(data, dict) and isinstance(data.get("images"), list):  # Karpathy dataset_*.json
        return [(str(Path(im.get("filepath", "")) / im["filename"]), [s["raw"] for s in im["sentences"]])
                for im in data["images"] if im.get("split") == "test"]
    if isinstance(data, list) and data and "caption_options" in data[0]:
        return [(d["image"], list(d["caption_options"])) for d in data]
    if isinstance(data, list) and data and "caption" in data[0]:
        return [(d["image"], d["caption"] if isinstance(d["caption"], list) else [d["caption"]]) for d in data]
    raise ValueError(f"{file}: expected ARO's coco_karpathy_test.json / flickr30k_test.json (list of image, caption), "
                     "a Karpathy dataset_*.json, or precomputed cases (list of image, caption_options)")


def load_order(path: str | Path, *, benchmark: str = "coco-order", images: str | Path | None = None,
               limit: int | None = None, seed: int = 0, max_words: int = 30, **_: Any) -> list[Example]:
    """ARO COCO-order / Flickr30k-order: every caption against its word-order perturbations (ARO's protocol:
    all options cleaned by :func:`pre_caption`). Precomputed ``caption_options`` are used as given."""
    p = Path(path)
    file = p / ORDER_FILES[benchmark] if p.is_dir() else p
    data = _read_json(file)
    precomputed = isinstance(data, list) and bool(data) and "caption_options" in data[0]
    cases = _order_cases(data, file)
    root = Path(images) if images else file.parent
    perturb = order_perturbations()
    task = benchmark.replace("-", "_")
    out: list[Example] = []
    for i, (image, captions) in enumerate(cases):
        if precomputed:
            options = [[captions[0], *captions[1:]]]
        else:
            options = []
            for j, cap in enumerate(captions):
                rng = random.Random(f"{seed}-{i}-{j}")  # ARO draws unseeded; here each case is reproducible
                options.append([pre_caption(cap, max_words)] + [pre_caption(fn(cap, rng), max_words)
                                                                for fn in perturb.values()])
        for j, opts in enumerate(options):
            if limit is not None and len(out) >= limit:
                return out
            out.append(Example(f"{i}-{j}", str(root / image), opts[0], {task: tuple(opts[1:])}))
    return out


def _sugarcrepe_images(folder: Path, images: str | Path | None) -> Path:
    if images:
        return Path(images)
    for cand in (folder / "images", folder / "val2017"):
        if cand.is_dir():
            return cand
    return folder


def load_sugarcrepe(path: str | Path, *, images: str | Path | None = None, limit: int | None = None,
                    **_: Any) -> list[Example]:
    """SugarCrepe: every ``<task>.json`` found in `path` (at least one); `limit` applies per task."""
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"SugarCrepe folder not found: {folder} (expected {', '.join(SUGARCREPE_TASKS)} .json)")
    found = [t for t in SUGARCREPE_TASKS if (folder / f"{t}.json").is_file()]
    if not found:
        raise FileNotFoundError(f"{folder} holds none of the SugarCrepe files "
                                f"{', '.join(t + '.json' for t in SUGARCREPE_TASKS)}")
    root = _sugarcrepe_images(folder, images)
    out = []
    for task in found:
        file = folder / f"{task}.json"
        data = _read_json(file)
        if not isinstance(data, dict):
            raise ValueError(f"{file}: expected a dict id -> {{filename, caption, negative_caption}}")
        for key, item in list(data.items())[:limit]:
            out.append(Example(f"{task}-{key}", str(root / item["filename"]), item["caption"],
                               {task: (item["negative_caption"],)}))
    return out


# benchmark name -> loader(path, benchmark=, images=, limit=, split=, seed=) -> examples
LOADERS: dict[str, Callable[..., list[Example]]] = {
    "synth": load_synth, "aro-relation": load_aro_vg, "aro-attribution": load_aro_vg, "coco-order": load_order,
    "flickr-order": load_order, "sugarcrepe": load_sugarcrepe,
}


def load_benchmark(name: str, path: str | Path, *, images: str | Path | None = None, limit: int | None = None,
                   split: str = "test", seed: int = 0) -> list[Example]:
    """Examples of benchmark `name` (a key of :data:`LOADERS`) from `path`; see the module docstring."""
    if name not in LOADERS:
        raise ValueError(f"unknown benchmark {name!r}; choose one of {', '.join(LOADERS)}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    if not Path(path).exists():
        raise FileNotFoundError(f"{name} data not found: {path}")
    examples = LOADERS[name](path, benchmark=name, images=images, limit=limit, split=split, seed=seed)
    if not examples:
        raise ValueError(f"{path} holds no {name} examples")
    return examples
