"""Shard writer (`mdc data shards`) from a CSV and from an image folder, and the data-throughput bench."""

import csv
import json
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from mdc_core.config import DataConfig
from mdc_core.data import build_loader
from mdc_workbench.bench.data import measure
from mdc_workbench.cli import main
from mdc_workbench.data.shards import write_shards


def _images(folder: Path, n: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        p = folder / f"img.{i}.{'png' if i % 2 else 'jpg'}"  # dots in the stem: keys must not break
        Image.new("RGB", (20 + i, 16), (10 * i, 50, 200)).save(p)
        paths.append(p)
    return paths


def test_shards_from_csv_round_trip_and_skip_counts(tmp_path):
    paths = _images(tmp_path / "imgs", 7)
    (tmp_path / "imgs" / "broken.jpg").write_bytes(b"\xff\xd8\xff not really a jpeg")
    rows = [(p.relative_to(tmp_path), f"caption number {i}", f"u{i}") for i, p in enumerate(paths)]
    rows += [("imgs/broken.jpg", "a broken image", "x"), ("imgs/missing.jpg", "gone", "y"),
             ("imgs/img.0.jpg", " ", "z")]
    with open(tmp_path / "pairs.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["filepath", "title", "url"])
        w.writerows(rows)
    stats = write_shards(tmp_path / "pairs.csv", tmp_path / "out", shard_size=3, progress=False)
    assert stats["written"] == 7 and stats["shards"] == 3
    assert stats["skipped"] == {"bad_image": 1, "missing_image": 1, "empty_caption": 1}
    assert stats["pattern"].endswith("{00000..00002}.tar")
    cfg = DataConfig(path=stats["pattern"], shuffle_buffer=0)
    batches = list(build_loader(cfg, image_size=16, batch_size=2, drop_last=False))
    captions = [c for b in batches for c in b["caption"]]
    assert Counter(captions) == Counter(f"caption number {i}" for i in range(7))
    assert {m["url"] for b in batches for m in b["meta"]} == {f"u{i}" for i in range(7)}
    with pytest.raises(FileExistsError):
        write_shards(tmp_path / "pairs.csv", tmp_path / "out", progress=False)


def test_shards_from_image_folder_with_txt_captions(tmp_path, capsys):
    paths = _images(tmp_path / "folder" / "sub", 4)
    for i, p in enumerate(paths[:3]):
        p.with_suffix(".txt").write_text(f"folder caption {i}\n")
    paths[2].with_suffix(".txt").write_bytes(b"caf\xe9")  # not UTF-8
    assert main(["data", "shards", "--from", str(tmp_path / "folder"), "--out", str(tmp_path / "out"),
                 "--quiet"]) == 0
    assert "wrote 2 pairs in 1 shards" in capsys.readouterr().out
    stats = json.loads((tmp_path / "out" / "shards_stats.json").read_text())
    assert stats["skipped"] == {"missing_caption": 1, "bad_caption_encoding": 1}
    assert main(["data", "shards", "--from", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o2")]) == 2
    assert "mdc: error:" in capsys.readouterr().err


def test_data_bench_reports_images_per_second(tmp_path, capsys):
    _images(tmp_path / "f", 6)
    for p in (tmp_path / "f").iterdir():
        p.with_suffix(".txt").write_text("a caption")
    write_shards(tmp_path / "f", tmp_path / "s", shard_size=4, progress=False)
    result = measure(DataConfig(path=str(tmp_path / "s")), image_size=32, batch_size=2, batches=4, warmup=1)
    assert result["images"] == 8 and result["images_per_s"] > 0 and result["workers"] == 1
    assert main(["data", "bench", "--data", str(tmp_path / "s"), "--image-size", "32", "--batch-size", "2",
                 "--batches", "2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["image_size"] == 32 and rows[0]["images_per_s_per_worker"] > 0
