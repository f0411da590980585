"""Loaders: shards, CSV/TSV/COCO json, corrupt records, errors, order/resume determinism, workers, load_image."""

import csv
import io
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import webdataset as wds
from open_clip.constants import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD
from PIL import Image

from mdc_core.config import DataConfig
from mdc_core.data import build_loader, iter_captions
from mdc_core.transforms import load_image
from mdc_workbench.data import export_coco, make_example, write_synthetic_dataset


@pytest.fixture(scope="module")
def synth_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("synth")
    write_synthetic_dataset(root, 48, seed=0, image_size=32, n_val=16, n_test=8, n_compgen=8, shard_size=12,
                            progress=False)
    return root


def _cfg(path, **kw) -> DataConfig:
    return DataConfig(path=str(path), **kw)


def _keys(loader) -> list[str]:
    return [k for batch in loader for k in batch["key"]]


def _skipped(loader) -> Counter:
    total = Counter()
    for batch in loader:
        assert batch["n_skipped"] == sum(batch["skipped"].values())
        total.update(batch["skipped"])
    return total


def _unnormalise(images: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(OPENAI_DATASET_MEAN)[:, None, None]
    std = torch.tensor(OPENAI_DATASET_STD)[:, None, None]
    return images * std + mean


def _png(path: Path, rgb=(200, 30, 30), size=(40, 24)) -> Path:
    Image.new("RGB", size, rgb).save(path)
    return path


# ----------------------------------------------------------------------------------------------------------
# synthetic shards


def test_round_trip_from_shards(synth_root):
    batches = list(build_loader(_cfg(synth_root), image_size=32, batch_size=10, shuffle=False, drop_last=False))
    assert [len(b["key"]) for b in batches] == [10, 10, 10, 10, 8]
    keys = _keys(batches)
    assert keys == sorted(keys) and len(set(keys)) == 48 and all(k.startswith("0") for k in keys)
    first = batches[0]
    assert first["image"].shape == (10, 3, 32, 32) and first["image"].dtype == torch.float32
    assert first["n_skipped"] == 0 and first["skipped"] == {}
    meta = first["meta"][0]
    assert first["caption"][0] == meta["caption"] and meta["key"] == first["key"][0] and "labels" in meta
    ex = make_example(0, "train", 0, 32)  # at the stored size the pixels come back exactly, normalised
    raw = torch.from_numpy(np.array(Image.open(io.BytesIO(ex["jpg"])))).permute(2, 0, 1).float() / 255
    assert torch.allclose(_unnormalise(first["image"][0]), raw, atol=1e-5)
    small = next(iter(build_loader(_cfg(synth_root), image_size=16, batch_size=4)))
    assert small["image"].shape == (4, 3, 16, 16)
    assert len(list(build_loader(_cfg(synth_root), image_size=32, batch_size=10))) == 4  # drop_last


def test_splits_and_patterns(synth_root):
    for split, n, first in (("val", 16, "1"), ("test", 8, "2"), ("compgen", 8, "3")):
        keys = _keys(build_loader(_cfg(synth_root), split=split, image_size=32, batch_size=4, drop_last=False))
        assert len(keys) == n and all(k.startswith(first) for k in keys)
    assert all(m["heldout"] for b in build_loader(_cfg(synth_root), split="compgen", image_size=32, batch_size=8)
               for m in b["meta"])
    pattern = str(synth_root / "train" / "{000000..000003}.tar")
    assert len(_keys(build_loader(_cfg(pattern), split=None, image_size=32, batch_size=4))) == 48
    assert len(_keys(build_loader(_cfg(synth_root / "train" / "000001.tar"), image_size=32, batch_size=4))) == 12
    with pytest.warns(UserWarning, match="do not exist"):
        part = str(synth_root / "train" / "{000002..000005}.tar")
        assert len(_keys(build_loader(_cfg(part), image_size=32, batch_size=4))) == 24


def test_iter_captions(synth_root):
    captions = list(iter_captions(_cfg(synth_root)))
    ordered = [b["caption"] for b in build_loader(_cfg(synth_root), image_size=32, batch_size=48, shuffle=False)]
    assert captions == ordered[0]
    assert len(list(iter_captions(_cfg(synth_root), split="val"))) == 16


def test_order_is_deterministic_per_seed_and_epoch(synth_root):
    cfg = _cfg(synth_root, shuffle_buffer=20)

    def run(**kw):
        return _keys(build_loader(cfg, image_size=32, batch_size=4, **kw))

    base = run(seed=1, epoch=0)
    assert base == run(seed=1, epoch=0) and sorted(base) == sorted(_keys(synth_keys(synth_root)))
    assert base != run(seed=1, epoch=1) and base != run(seed=2, epoch=0)
    assert base != sorted(base)
    for k in (1, 5, 11):
        assert run(seed=1, epoch=0, skip_batches=k) == base[4 * k:]
    assert run(seed=1, epoch=0, skip_batches=12) == []


def synth_keys(root):
    return build_loader(_cfg(root), image_size=32, batch_size=4, shuffle=False)


def test_workers_cover_the_same_samples_and_resume_exactly(synth_root):
    cfg0 = _cfg(synth_root, shuffle_buffer=10)
    cfg2 = _cfg(synth_root, shuffle_buffer=10, num_workers=2)
    kw = dict(image_size=32, batch_size=4, seed=3, epoch=1, drop_last=False)
    keys0, keys2 = _keys(build_loader(cfg0, **kw)), _keys(build_loader(cfg2, **kw))
    assert len(keys2) == 48 and Counter(keys2) == Counter(keys0)
    kw["drop_last"] = True
    full = [b["key"] for b in build_loader(cfg2, **kw)]
    assert [b["key"] for b in build_loader(cfg2, skip_batches=3, **kw)] == full[3:]
    assert full == [b["key"] for b in build_loader(cfg2, **kw)]  # same (seed, epoch, workers) -> same order


# ----------------------------------------------------------------------------------------------------------
# corrupt records


def _write_shard(path: Path, samples: list[dict]) -> None:
    with wds.TarWriter(str(path)) as w:
        for s in samples:
            w.write(s)


@pytest.fixture(scope="module")
def corrupt_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("corrupt")
    good = [make_example(0, "train", i, 32, captions="short") for i in range(8)]
    bad = [
        {"__key__": "bad_truncated", "jpg": good[0]["jpg"][: len(good[0]["jpg"]) // 2], "txt": "a red circle"},
        {"__key__": "bad_encoding", "jpg": good[1]["jpg"], "txt": b"caf\xe9 \xff\xfe"},
        {"__key__": "bad_no_txt", "jpg": good[2]["jpg"], "json": b"{}"},
        {"__key__": "bad_empty", "jpg": good[3]["jpg"], "txt": "  \n "},
        {"__key__": "bad_no_image", "txt": "a caption without an image"},
        {"__key__": "bad_not_jpeg", "jpg": b"this is not a jpeg", "txt": "a blue star"},
    ]
    (d / "a_garbage.tar").write_bytes(b"\x00garbage, not a tar file" * 40)
    _write_shard(d / "b_corrupt.tar", bad + good[:4])
    _write_shard(d / "c_good.tar", good[4:6])
    _write_shard(d / "d_good.tar", good[6:])
    return d


EXPECTED_SKIPS = {"bad_shard": 1, "bad_image": 2, "bad_caption_encoding": 1, "missing_caption": 1,
                  "empty_caption": 1, "missing_image": 1}


@pytest.mark.parametrize("workers", [0, 2])
def test_corrupt_records_are_skipped_and_counted(corrupt_dir, workers):
    loader = build_loader(_cfg(corrupt_dir, num_workers=workers), image_size=32, batch_size=1, shuffle=False,
                          drop_last=False)
    batches = list(loader)
    assert sorted(k for b in batches for k in b["key"]) == [f"{i:09d}" for i in range(8)]
    assert all(torch.isfinite(b["image"]).all() for b in batches)
    assert _skipped(batches) == EXPECTED_SKIPS


def test_iter_captions_passes_over_corrupt_records(corrupt_dir):
    captions = list(iter_captions(_cfg(corrupt_dir)))
    # images are not read: the truncated, not-a-jpeg and image-less records still give their captions
    assert len(captions) == 8 + 3 and all(c.strip() == c and c for c in captions)


# ----------------------------------------------------------------------------------------------------------
# CSV / TSV / COCO json


@pytest.fixture(scope="module")
def table_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tables")
    (d / "imgs").mkdir()
    for i, rgb in enumerate([(255, 0, 0), (0, 255, 0), (0, 0, 255)]):
        _png(d / "imgs" / f"{i}.png", rgb)
    with open(d / "pairs.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["filepath", "Title", "source"])
        w.writerows([["imgs/0.png", "a red picture", "web"], ["imgs/1.png", "a green, wide picture", "web"],
                     ["imgs/2.png", "a blue picture", "web"], ["imgs/missing.png", "gone", "web"],
                     ["imgs/0.png", "   ", "web"]])
    (d / "tsv").mkdir()
    (d / "tsv" / "pairs.tsv").write_text("image\tcaption\n../imgs/0.png\tred\n../imgs/2.png\tblue\n")
    (d / "coco" / "images").mkdir(parents=True)
    _png(d / "coco" / "images" / "im1.png", (0, 0, 0))
    _png(d / "coco" / "im2.png", (255, 255, 255))
    coco = {"images": [{"id": 1, "file_name": "im1.png"}, {"id": 2, "file_name": "im2.png"}],
            "annotations": [{"image_id": 1, "caption": "black", "id": 10},
                            {"image_id": 1, "caption": "dark", "id": 11},
                            {"image_id": 2, "caption": "white", "id": 12}]}
    (d / "coco" / "captions.json").write_text(json.dumps(coco))
    karpathy = {"images": [{"filename": "im2.png", "split": "test", "sentences": [{"raw": "white", "sentid": 5}]},
                           {"filename": "im2.png", "split": "restval", "sentences": [{"raw": "pale", "sentid": 6}]}]}
    (d / "coco" / "karpathy.json").write_text(json.dumps(karpathy))
    return d


def _load_all(path, **kw):
    return list(build_loader(_cfg(path, **kw), image_size=24, batch_size=1, shuffle=False, drop_last=False))


def test_csv_tsv_and_coco_load(table_dir):
    batches = _load_all(table_dir / "pairs.csv")
    assert [b["caption"][0] for b in batches] == ["a red picture", "a green, wide picture", "a blue picture"]
    assert batches[0]["meta"][0] == {"source": "web", "image": "imgs/0.png"}
    assert batches[0]["image"].shape == (1, 3, 24, 24)
    red = _unnormalise(batches[0]["image"][0])
    assert red[0].min() > 0.95 and red[1:].max() < 0.05
    assert _skipped(batches) == {"missing_image": 1, "empty_caption": 1}
    assert [b["caption"][0] for b in _load_all(table_dir / "tsv")] == ["red", "blue"]  # dir with one .tsv
    coco = _load_all(table_dir / "coco" / "captions.json")
    assert [(b["caption"][0], b["key"][0]) for b in coco] == [("black", "10"), ("dark", "11"), ("white", "12")]
    assert coco[0]["meta"][0]["image_id"] == 1
    assert [b["caption"][0] for b in _load_all(table_dir / "coco" / "karpathy.json", format="coco")] == ["pale"]
    test = build_loader(_cfg(table_dir / "coco" / "karpathy.json"), split="test", image_size=8, batch_size=1)
    assert [b["caption"][0] for b in test] == ["white"]
    assert list(iter_captions(_cfg(table_dir / "pairs.csv"))) == ["a red picture", "a green, wide picture",
                                                                  "a blue picture", "gone"]
    shuffled = _keys(build_loader(_cfg(table_dir / "pairs.csv", num_workers=2), image_size=8, batch_size=1,
                                  seed=5))
    assert sorted(shuffled) == ["000000000", "000000001", "000000002"]


def test_export_coco_round_trip(synth_root, tmp_path):
    path = export_coco(synth_root, "val", tmp_path / "coco")
    data = json.loads(path.read_text())
    assert len(data["images"]) == len(data["annotations"]) == 16
    via_coco = {b["caption"][0] for b in _load_all(path)}
    via_shards = {c for b in build_loader(_cfg(synth_root), split="val", image_size=24, batch_size=16) for c in
                  b["caption"]}
    assert via_coco == via_shards


# ----------------------------------------------------------------------------------------------------------
# errors


def test_bad_paths_raise_clear_errors(tmp_path, table_dir, synth_root):
    def load(path, **kw):
        cfg = _cfg(path, **kw.pop("cfg", {}))
        return build_loader(cfg, **{"image_size": 8, "batch_size": 1, **kw})

    with pytest.raises(FileNotFoundError, match="nowhere"):
        load(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty.*expected"):
        load(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="no shard files matched"):
        load(str(tmp_path / "{000000..000003}.tar"))
    with pytest.raises(ValueError, match="data.path is empty"):
        load("")
    with pytest.raises(FileNotFoundError, match="'holdout'"):
        load(synth_root, split="holdout")
    with pytest.raises(FileNotFoundError, match="no .tar shards"):
        load(synth_root, split=None, cfg={"format": "wds"})
    with pytest.raises(ValueError, match="looks like csv"):
        load(table_dir / "pairs.csv", cfg={"format": "coco"})
    (tmp_path / "header_only.csv").write_text("image,caption\n")
    with pytest.raises(ValueError, match="header_only.csv has no samples"):
        load(tmp_path / "header_only.csv")
    (tmp_path / "noheader.csv").write_text("a.png,a cat\n")
    with pytest.raises(ValueError, match="image column"):
        load(tmp_path / "noheader.csv")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load(tmp_path / "bad.json")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match="cannot tell the format"):
        load(tmp_path / "notes.txt")
    with pytest.raises(ValueError, match="batch_size"):
        load(synth_root, batch_size=0)


def test_rrc_is_seeded_and_only_for_training_splits(table_dir, synth_root):
    cfg = _cfg(table_dir / "pairs.csv", augment="rrc")
    _png(table_dir / "imgs" / "wide.png", size=(64, 32))

    def images(c, **kw):
        return torch.cat([b["image"] for b in build_loader(c, image_size=16, batch_size=3, **kw)])

    a, b = images(cfg, seed=0), images(cfg, seed=0)
    assert torch.equal(a, b) and not torch.equal(a, images(cfg, seed=0, epoch=1))
    with pytest.warns(UserWarning, match="synthetic"):
        build_loader(_cfg(synth_root, augment="rrc"), image_size=16, batch_size=2)
    val = next(iter(build_loader(_cfg(synth_root, augment="rrc"), split="val", image_size=32, batch_size=2,
                                 shuffle=False)))
    plain = next(iter(build_loader(_cfg(synth_root), split="val", image_size=32, batch_size=2, shuffle=False)))
    assert torch.equal(val["image"], plain["image"])


# ----------------------------------------------------------------------------------------------------------
# single images


def test_load_image(tmp_path):
    t = load_image(_png(tmp_path / "ok.png", size=(50, 30)), 20)
    assert t.shape == (3, 20, 20) and t.dtype == torch.float32
    assert torch.equal(load_image((tmp_path / "ok.png").read_bytes(), 20), t)
    fake = tmp_path / "notes.png"
    fake.write_text("these are my notes, not a picture")
    with pytest.raises(ValueError, match="notes.png.*not a readable image"):
        load_image(fake, 20)
    (tmp_path / "zero.jpg").write_bytes(b"")
    with pytest.raises(ValueError, match="zero.jpg.*empty"):
        load_image(tmp_path / "zero.jpg", 20)
    with pytest.raises(FileNotFoundError, match="absent.png"):
        load_image(tmp_path / "absent.png", 20)
    _png(tmp_path / "tall.png", size=(2, 10_001))
    with pytest.raises(ValueError, match="tall.png.*too large"):
        load_image(tmp_path / "tall.png", 20)
    with pytest.raises(ValueError, match="not a file"):
        load_image(tmp_path, 20)
    gray = Image.new("LA", (8, 8), (100, 255))
    buf = io.BytesIO()
    gray.save(buf, format="PNG")
    assert load_image(buf.getvalue(), 8).shape == (3, 8, 8)  # any mode is converted to RGB
