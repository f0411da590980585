"""Image paths from a caption table are read only when they name a regular file of a bounded size: `/dev/zero`, a
FIFO or a 300 MB file are skipped (counted), never read until memory runs out or blocked on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from mdc_core.transforms import ImageError, read_image_file

ROOT = Path(__file__).resolve().parents[2]

DRIVER = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (12 * 2**30, 12 * 2**30))  # the old code read /dev/zero until this ran out
from mdc_workbench.data.shards import write_shards
table, out = sys.argv[1], sys.argv[2]
stats = write_shards(table, out, progress=False)
print(json.dumps({"written": stats["written"], "skipped": stats["skipped"]}))
"""


@pytest.fixture
def hostile_table(tmp_path: Path) -> Path:
    Image.new("RGB", (16, 16), (200, 0, 0)).save(tmp_path / "red.png")
    os.mkfifo(tmp_path / "pipe.png")  # no writer ever comes: reading it would block for ever
    with open(tmp_path / "huge.png", "wb") as fh:  # sparse: 300 MB of holes, no disk used
        fh.truncate(300 * 2**20)
    table = tmp_path / "captions.csv"
    table.write_text("image,caption\nred.png,a red square\n/dev/zero,zeros\npipe.png,a pipe\nhuge.png,huge\n")
    return table


def test_a_caption_table_naming_a_device_a_fifo_or_a_huge_file_is_skipped_by_data_shards(hostile_table: Path) -> None:
    done = subprocess.run([sys.executable, "-c", DRIVER, str(hostile_table), str(hostile_table.parent / "shards")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["written"] == 1 and result["skipped"] == {"bad_image": 2, "too_large": 1}


def test_read_image_file_names_what_the_path_is(hostile_table: Path) -> None:
    folder = hostile_table.parent
    assert read_image_file(folder / "red.png")[:4] == b"\x89PNG"
    for path, what in (("/dev/zero", "a device"), (folder / "pipe.png", "a FIFO"), (folder, "a folder")):
        with pytest.raises(ImageError, match=f"{path}: {what}, not an image file"):
            read_image_file(path)
    with pytest.raises(ImageError, match="300 MB is too large") as err:
        read_image_file(folder / "huge.png")
    assert err.value.reason == "too_large"
    with pytest.raises(FileNotFoundError):
        read_image_file(folder / "missing.png")


DECODE = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (12 * 2**30, 12 * 2**30))
from mdc_core.data import _decode_row
from mdc_core.sources import resolve_source
rows = resolve_source(sys.argv[1], "auto", "train").rows
print(json.dumps([_decode_row(row).get("__skip__", "ok") for row in rows]))
"""


def test_training_skips_a_device_a_fifo_or_a_huge_file_in_a_caption_table(hostile_table: Path) -> None:
    done = subprocess.run([sys.executable, "-c", DECODE, str(hostile_table)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["ok", "bad_image", "bad_image", "too_large"]
