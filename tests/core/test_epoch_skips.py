"""Per-epoch skip counts do not drift: every epoch of a caption table with 8 missing images reports 8 in
``epochs.jsonl``, whichever shuffle puts some of them among the records of the last, dropped, partial batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from mdc_core.data import build_loader
from mdc_core.train import train
from tests.train_helpers import micro_run, one_thread  # noqa: F401  (a fixture)


def table_with_missing_images(root: Path, n: int = 40) -> Path:
    """`n` rows, every fifth image missing (8 of 40): 32 good samples, batches of 5 leave a partial one."""
    root.mkdir(parents=True, exist_ok=True)
    rows = ["image,caption"]
    for i in range(n):
        if i % 5:
            Image.new("RGB", (32, 32), (6 * i, 40, 90)).save(root / f"{i}.png")
        rows.append(f"{i}.png,a red circle")
    (root / "captions.csv").write_text("\n".join(rows) + "\n")
    return root / "captions.csv"


@pytest.mark.parametrize("workers", [0, 2])
def test_every_epoch_of_the_loader_reports_every_skipped_record(tmp_path: Path, workers: int) -> None:
    cfg = micro_run(table_with_missing_images(tmp_path), f"data.num_workers={workers}", batch_size=5)
    for epoch in range(6):
        batches = list(build_loader(cfg.data, split="train", image_size=cfg.model.image_size, batch_size=5,
                                    seed=cfg.train.seed, epoch=epoch))
        assert sum(b["n_skipped"] for b in batches) == 8, epoch


def test_epochs_jsonl_counts_the_same_skips_every_epoch(tmp_path: Path, one_thread: None) -> None:  # noqa: F811
    cfg = micro_run(table_with_missing_images(tmp_path / "data"), steps=26, batch_size=5, ckpt_every=1000)
    train(cfg, tmp_path / "run", progress=False)
    epochs = [json.loads(line) for line in (tmp_path / "run" / "epochs.jsonl").read_text().splitlines()]
    assert [e["epoch"] for e in epochs] == [0, 1, 2, 3]
    assert [e["skipped"] for e in epochs] == [{"missing_image": 8}] * 4
