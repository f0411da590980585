"""The synthetic data set: determinism, labels vs captions vs pixels, negatives, held-out pairs, shard writing."""

import io
import json
import re
import tarfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mdc_workbench.data import (
    COLOURS,
    LABEL_NAMES,
    NEGATIVE_TYPES,
    SHAPES,
    heldout_combos,
    make_example,
    read_manifest,
    synth,
    write_synthetic_dataset,
)
from mdc_workbench.data.captions import RELATIONS
from mdc_workbench.data.scene import DIFFICULTIES

SMALL = dict(n=24, n_val=6, n_test=6, n_compgen=8, image_size=32, shard_size=10, progress=False)


def _metas(split: str, n: int, seed: int = 0, size: int = 16) -> list[dict]:
    return [json.loads(make_example(seed, split, i, size)["json"]) for i in range(n)]


def _words(text: str) -> list[str]:
    return ["a" if w == "an" else w for w in text.split()]  # articles follow the next word


@pytest.fixture(scope="module")
def train_metas() -> list[dict]:
    return _metas("train", 400)


def _tar_members(root: Path) -> dict[str, bytes]:
    out = {}
    for shard in sorted(root.rglob("*.tar")):
        with tarfile.open(shard) as tf:
            for m in tf.getmembers():
                out[f"{shard.relative_to(root)}/{m.name}"] = tf.extractfile(m).read()
    return out


def test_same_seed_gives_identical_bytes_and_other_seed_differs(tmp_path):
    a = write_synthetic_dataset(tmp_path / "a", seed=3, **SMALL)
    b = write_synthetic_dataset(tmp_path / "b", seed=3, **SMALL)
    c = write_synthetic_dataset(tmp_path / "c", seed=4, **SMALL)
    assert a == b
    shards_a = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.tar"))
    assert shards_a == sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*.tar"))
    for rel in shards_a:  # whole tar files, headers included, are byte-identical
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()
    assert (tmp_path / "a/manifest.json").read_bytes() == (tmp_path / "b/manifest.json").read_bytes()
    ma, mc = _tar_members(tmp_path / "a"), _tar_members(tmp_path / "c")
    assert ma.keys() == mc.keys()
    assert sum(ma[k] != mc[k] for k in ma) > len(ma) // 2
    assert a["heldout_combos"] != c["heldout_combos"] or a != c


def test_layout_keys_members_and_manifest(tmp_path):
    m = write_synthetic_dataset(tmp_path, seed=0, **SMALL)
    assert m == read_manifest(tmp_path)
    assert m["counts"] == {"train": 24, "val": 6, "test": 6, "compgen": 8}
    assert m["splits"]["train"]["shards"] == ["000000.tar", "000001.tar", "000002.tar"]
    assert m["label_names"] == list(LABEL_NAMES) and m["negative_types"] == list(NEGATIVE_TYPES)
    assert set(m["vocab"]) == set(LABEL_NAMES) and m["params"]["image_size"] == 32
    assert len(m["vocab"]["shape"]) >= 6 and len(m["vocab"]["colour"]) >= 8
    with tarfile.open(tmp_path / "val" / "000000.tar") as tf:
        names = tf.getnames()
    assert names[:3] == ["100000000.jpg", "100000000.json", "100000000.txt"] and len(names) == 18
    assert not list(tmp_path.rglob("*.part")) and not list(tmp_path.rglob("*.tmp"))


def test_example_contents_and_caption_styles():
    ex = make_example(0, "train", 5, image_size=32, captions="short")
    meta = json.loads(ex["json"])
    assert re.fullmatch(r"\d{9}", ex["__key__"]) and meta["key"] == ex["__key__"]
    assert ex["txt"] == meta["caption"] == meta["short_caption"] and meta["caption_style"] == "short"
    img = Image.open(io.BytesIO(ex["jpg"]))
    assert img.format == "JPEG" and img.size == (32, 32) and img.mode == "RGB"
    long = json.loads(make_example(0, "train", 5, image_size=64, captions="long")["json"])
    assert long["caption"] == long["long_caption"] and long["objects"] == meta["objects"]  # scene independent
    styles = Counter(m["caption_style"] for m in _metas("train", 60))
    assert styles["short"] > 10 and styles["long"] > 10
    with pytest.raises(ValueError, match="captions"):
        make_example(0, "train", 0, captions="medium")


def test_scene_statistics(train_metas):
    counts = Counter(m["labels"]["count"] for m in train_metas)
    assert set(counts) == {1, 2, 3, 4} and counts[1] > 0.15 * len(train_metas)
    for name in ("shape", "colour", "position", "background", "size"):
        values = Counter(m["labels"][name] for m in train_metas)
        assert len(values) >= {"size": 2, "background": 4}.get(name, 6), name


def test_labels_agree_with_objects_and_captions(train_metas):
    for m in train_metas:
        objs, labels, short, long = m["objects"], m["labels"], m["short_caption"], m["long_caption"]
        assert labels["count"] == len(objs) and set(labels) == set(LABEL_NAMES)
        assert {k: objs[0][k] for k in ("shape", "colour", "size", "position")} == \
            {k: labels[k] for k in ("shape", "colour", "size", "position")}
        assert objs[0]["size"] == "large" or all(o["size"] == "small" for o in objs)  # primary = largest
        assert len({(o["row"], o["col"]) for o in objs}) == len(objs)  # one object per cell: no overlap
        assert f"{labels['colour']} {labels['shape']}" in short  # the primary object is always named
        if labels["count"] == 1:
            assert f"{labels['colour']} " in short and labels["shape"] in short
        for o in objs:  # the long caption describes every object and the background
            assert f"{o['size']} {o['colour']} {o['shape']}" in long
        assert f"{labels['background']} background" in long
        assert 3 <= len(short.split()) <= 12 and 25 <= len(long.split()) <= 62


def test_primary_object_colour_is_drawn_at_its_centre():
    for i in range(40):
        ex = make_example(1, "train", i, image_size=64)
        meta = json.loads(ex["json"])
        if meta["labels"]["size"] != "large":
            continue
        obj = meta["objects"][0]
        px = np.asarray(Image.open(io.BytesIO(ex["jpg"])), dtype=int)
        y, x = int(obj["cy"] * 64), int(obj["cx"] * 64)
        centre = px[y - 1:y + 2, x - 1:x + 2].reshape(-1, 3).mean(0)
        assert np.abs(centre - COLOURS[obj["colour"]]).max() < 45, (i, obj, centre)


def test_negatives_differ_and_fit_their_category(train_metas):
    seen = Counter()
    for m in train_metas:
        caption, negs = m["short_caption"], m["negatives"]
        words = _words(caption)
        scene_colours = {o["colour"] for o in m["objects"]}
        scene_shapes = {o["shape"] for o in m["objects"]}
        assert set(negs) <= set(NEGATIVE_TYPES)
        for kind, neg in negs.items():
            seen[kind] += 1
            assert neg != caption
            if kind in ("attribute_swap", "relation_swap", "order_shuffle"):
                assert sorted(_words(neg)) == sorted(words), (kind, caption, neg)
            if kind == "relation_swap":
                assert any(f" {r} " in caption for r in RELATIONS)
            if kind == "replace":
                diff = [(a, b) for a, b in zip(words, _words(neg), strict=False) if a != b]
                assert len(_words(neg)) == len(words) and len(diff) == 1
                new = diff[0][1]
                assert (new in COLOURS and new not in scene_colours) or (new in SHAPES and new not in scene_shapes)
            if kind == "add":
                added = set(_words(neg)) - set(words)
                assert neg.startswith(caption.split(" on a ")[0].rsplit(" and ", 1)[0])
                assert any(w in SHAPES and w not in scene_shapes for w in added), (caption, neg)
        if m["labels"]["count"] == 1 and " on a" not in caption:
            assert "attribute_swap" not in negs  # not faked for a single object without a background
    assert all(seen[k] > 20 for k in NEGATIVE_TYPES), seen


def test_heldout_pairs_only_in_compgen(tmp_path):
    held = heldout_combos(0)
    assert len(held) == 6 and len({c for c, _ in held}) == 6 and len({s for _, s in held}) == 6
    assert held == heldout_combos(0) and held != heldout_combos(1)
    pattern = re.compile("|".join(rf"\b{c} {s}\b" for c, s in held))
    for split in ("train", "val", "test"):
        for m in _metas(split, 150 if split == "train" else 40):
            assert not any((o["colour"], o["shape"]) in held for o in m["objects"]) and not m["heldout"]
            texts = [m["short_caption"], m["long_caption"], *m["negatives"].values()]
            assert not any(pattern.search(t) for t in texts), texts
    comp = _metas("compgen", 40)
    for m in comp:
        assert m["heldout"] and (m["labels"]["colour"], m["labels"]["shape"]) in held
        assert f"{m['labels']['colour']} {m['labels']['shape']}" in m["short_caption"]
    assert len({(m["labels"]["colour"], m["labels"]["shape"]) for m in comp}) >= 4
    manifest = write_synthetic_dataset(tmp_path, seed=0, **SMALL)
    assert [tuple(p) for p in manifest["heldout_combos"]] == held


def test_parallel_generation_matches_serial():
    kw = dict(seed=2, image_size=16, captions="mixed", heldout=heldout_combos(2))
    serial = list(synth._examples("train", 300, workers=1, **kw))
    parallel = list(synth._examples("train", 300, workers=2, **kw))
    assert serial == parallel


def test_crash_leaves_no_manifest_and_no_complete_looking_shard(tmp_path, monkeypatch):
    write_synthetic_dataset(tmp_path, seed=0, **SMALL)
    real = synth.make_example

    def flaky(*args, index, **kw):
        if kw.get("split") == "val" and index == 3:
            raise RuntimeError("disk on fire")
        return real(*args, index=index, **kw)

    monkeypatch.setattr(synth, "make_example", flaky)
    with pytest.raises(RuntimeError, match="disk on fire"):
        write_synthetic_dataset(tmp_path, seed=1, **SMALL)
    assert not (tmp_path / "manifest.json").exists()
    with pytest.raises(FileNotFoundError, match="not a complete"):
        read_manifest(tmp_path)
    assert not list((tmp_path / "val").glob("*.tar"))  # the interrupted shard kept its .part name


def test_write_argument_errors(tmp_path):
    with pytest.raises(ValueError, match="n "):
        write_synthetic_dataset(tmp_path, 0)
    with pytest.raises(ValueError, match="captions"):
        write_synthetic_dataset(tmp_path, 4, captions="poem")
    with pytest.raises(ValueError, match="n_val"):
        write_synthetic_dataset(tmp_path, 4, n_val=-1)
    with pytest.raises(ValueError, match="shard_size"):
        write_synthetic_dataset(tmp_path, 4, shard_size=0)
    with pytest.raises(ValueError, match="unknown data difficulty 'hard'"):
        write_synthetic_dataset(tmp_path, 4, difficulty="hard")
    assert not (tmp_path / "manifest.json").exists()


def test_paper_difficulty_is_the_default_and_unchanged():
    """Naming `paper` gives the same bytes as not naming a difficulty (the data sets written before the option)."""
    for split, i in (("train", 0), ("train", 7), ("compgen", 3)):
        assert make_example(0, split, i, 32) == make_example(0, split, i, 32, difficulty="paper")


def test_easy_difficulty_scenes(tmp_path):
    easy = DIFFICULTIES["easy"]
    metas = [json.loads(make_example(0, "train", i, 16, difficulty="easy")["json"]) for i in range(300)]
    shapes = {o["shape"] for m in metas for o in m["objects"]}
    assert shapes == set(easy.shapes) == {"circle", "square", "triangle", "star", "cross"}
    assert {m["labels"]["count"] for m in metas} == {1, 2, 3}
    radii = {(o["size"], o["radius"]) for m in metas for o in m["objects"]}
    assert radii == {("small", 0.11), ("large", 0.15)}
    for m in metas:  # a salient primary: with 2+ objects exactly one is large, and it comes first
        sizes = [o["size"] for o in m["objects"]]
        if len(sizes) > 1:
            assert sizes == ["large"] + ["small"] * (len(sizes) - 1), sizes
    assert {m["objects"][0]["size"] for m in metas if len(m["objects"]) == 1} == {"small", "large"}
    for m in metas:  # negatives name only shapes the data shows
        for text in m["negatives"].values():
            assert not {"hexagon", "diamond"} & set(text.split()), text
    held = heldout_combos(0, "easy")
    assert len(held) == 5 and {s for _, s in held} == set(easy.shapes)  # one pair per shape, distinct colours
    assert len({c for c, _ in held}) == 5
    comp = [json.loads(make_example(0, "compgen", i, 16, difficulty="easy")["json"]) for i in range(20)]
    assert all((m["labels"]["colour"], m["labels"]["shape"]) in held for m in comp)
    manifest = write_synthetic_dataset(tmp_path, seed=0, difficulty="easy", **SMALL)
    assert manifest["params"]["difficulty"] == "easy"
    assert manifest["vocab"]["shape"] == list(easy.shapes) and manifest["vocab"]["count"] == [1, 2, 3]
    assert [tuple(p) for p in manifest["heldout_combos"]] == held
