"""The notebooks' model cache is keyed by what made a model: its config and its data (generator parameters, or
the content of data without a manifest); clearing a cache folder never reaches outside the cache."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from mdc_workbench.notebooks import notebook as wb


def caption_table(folder: Path, captions: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(len(captions)):
        Image.new("RGB", (16, 16), (30 * i, 0, 0)).save(folder / f"{i}.png")
    table = folder / "captions.csv"
    table.write_text("image,caption\n" + "".join(f"{i}.png,{c}\n" for i, c in enumerate(captions)))
    return table


def test_a_caption_table_whose_content_changed_gives_its_models_another_key(tmp_path: Path) -> None:
    table = caption_table(tmp_path / "data", ["a red circle", "a blue square"])
    cfg = wb.make_config("tiny_fast", table, "mdc", 10)
    first = wb.config_key(cfg)
    assert wb.config_key(cfg) == first  # stable while the data stay
    caption_table(tmp_path / "data", ["a red circle", "two green stars"])  # the same path, other captions
    assert wb.config_key(cfg) != first


def test_clearing_a_cache_folder_never_follows_a_link_out_of_the_cache(tmp_path: Path) -> None:
    from tests.train_helpers import micro_run, write_micro_data

    data = write_micro_data(tmp_path / "data", 16)
    cfg = micro_run(data, steps=2, batch_size=4)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "notes.txt").write_text("keep")
    run_dir = wb.cached_run_dir(tmp_path / "models", cfg)
    run_dir.parent.mkdir(parents=True)
    run_dir.symlink_to(victim, target_is_directory=True)
    with pytest.raises(ValueError, match="leads outside"):
        wb.train_cached(cfg, tmp_path / "models")
    assert (victim / "notes.txt").read_text() == "keep" and [p.name for p in victim.iterdir()] == ["notes.txt"]
