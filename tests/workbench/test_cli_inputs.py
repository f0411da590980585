"""No silent wrong input: numeric flags are range-checked (``--steps 0`` is an error, never the preset default),
runs store resolved data paths (resume from another directory), the official COCO layout is found, ``--images``
points at an image folder, and a run that cannot start leaves no run folder behind."""

import argparse
import json
import os
from pathlib import Path

import pytest
from PIL import Image

from mdc_core import checkpoint as ck
from mdc_workbench.cli import build_parser, main
from mdc_workbench.cli.checks import ANY_REAL, check_numeric_args
from mdc_workbench.eval.captioning import load_caption_set
from tests.workbench.test_cli import MICRO_SETS


def _numeric_flags(parser: argparse.ArgumentParser) -> set[str]:
    found = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _numeric_flags(sub)
        elif action.type in (int, float) or getattr(action.type, "__name__", "") == "_length_arg":
            found.add(action.dest)
    return found


def test_every_numeric_flag_refuses_a_negative_value():
    flags = _numeric_flags(build_parser())
    assert {"steps", "n", "batch_size", "limit", "samples", "seed", "port"} <= flags
    for dest in sorted(flags - ANY_REAL):
        with pytest.raises(ValueError, match=f"--{dest.replace('_', '-')} must"):
            check_numeric_args(argparse.Namespace(**{dest: -1}))
    check_numeric_args(argparse.Namespace(seed=0, workers=0, threshold=0.5, guidance_scale=-2.0, steps=None))


def test_remasking_flags_take_a_unit_threshold_and_zero_extra_steps():
    check_numeric_args(argparse.Namespace(remask_threshold=0.99, remask_steps=0))
    with pytest.raises(ValueError, match="--remask-threshold must be in \\[0, 1\\], got 1.5"):
        check_numeric_args(argparse.Namespace(remask_threshold=1.5))


def test_steps_zero_is_an_error_not_the_preset_default(tmp_path, capsys):
    assert main(["train", "--data", str(tmp_path), "--out", str(tmp_path / "run"), "--steps", "0"]) == 2
    assert capsys.readouterr().err.strip() == "mdc: error: --steps must be >= 1, got 0"
    assert not (tmp_path / "run").exists()
    for argv in (["data", "synth", "--out", str(tmp_path / "d"), "--n", "0"],
                 ["demo", "--out", str(tmp_path / "demo"), "--limit", "-3"],
                 ["app", "--port", "70000"]):
        assert main(argv) == 2 and capsys.readouterr().err.startswith("mdc: error: --"), argv


def _png(path: Path, colour: tuple[int, int, int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (40, 32), colour).save(path)


COLOURS = {"red": (220, 20, 20), "green": (20, 200, 20), "blue": (20, 20, 220)}


def _coco(path: Path, n: int, folder_prefix: str = "") -> None:
    """A COCO caption json of `n` images (file names only, as the official files) with two captions each."""
    names = list(COLOURS)
    images = [{"id": i, "file_name": f"{folder_prefix}{i:012d}.jpg"} for i in range(n)]
    anns = [{"image_id": i, "id": 2 * i + k, "caption": f"a {names[i % 3]} picture" if k else f"{names[i % 3]}"}
            for i in range(n) for k in (0, 1)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"images": images, "annotations": anns}))


@pytest.fixture
def coco_root(tmp_path) -> Path:
    """The official layout: annotations/captions_{train,val}2017.json beside train2017/ and val2017/."""
    root = tmp_path / "coco"
    for split, n in (("train", 16), ("val", 4)):
        _coco(root / "annotations" / f"captions_{split}2017.json", n)
        for i in range(n):
            _png(root / f"{split}2017" / f"{i:012d}.jpg", COLOURS[list(COLOURS)[i % 3]])
    return root


def test_the_official_coco_layout_is_found_by_train_and_eval(coco_root, tmp_path):
    items = load_caption_set(coco_root / "annotations" / "captions_val2017.json", "test")
    assert len(items) == 4 and all(Path(it.image).parent == coco_root / "val2017" for it in items)
    run = tmp_path / "run"
    assert main(["train", "--preset", "tiny", "--data", str(coco_root / "annotations" / "captions_train2017.json"),
                 "--out", str(run), "--steps", "2", "--quiet", *MICRO_SETS]) == 0
    assert ck.latest_checkpoint(run).name == "step_00000002"
    assert main(["eval", "captioning", "--run", str(run), "--data",
                 str(coco_root / "annotations" / "captions_val2017.json"), "--lengths", "4", "--metrics", "BLEU",
                 "--out", str(tmp_path / "eval"), "--quiet"]) == 0
    assert json.loads((tmp_path / "eval" / "captioning.json").read_text())["n_images"] == 4


def test_images_flag_and_no_run_folder_left_by_a_run_that_cannot_start(coco_root, tmp_path, capsys):
    flat = tmp_path / "elsewhere" / "captions.json"  # a json far from its images
    _coco(flat, 16)
    images = coco_root / "train2017"
    argv = ["train", "--preset", "tiny", "--data", str(flat), "--steps", "1", "--quiet", *MICRO_SETS]
    assert main([*argv, "--out", str(tmp_path / "no_images")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mdc: error:") and "none of its 32 images was found" in err and "--images" in err
    assert not (tmp_path / "no_images").exists()

    assert main([*argv, "--out", str(tmp_path / "too_big"), "--images", str(images), "--set",
                 "train.batch_size=64"]) == 2
    assert "holds fewer than 64 samples: lower train.batch_size" in capsys.readouterr().err
    assert not (tmp_path / "too_big").exists()  # the run could not start: nothing left behind

    assert main([*argv, "--out", str(tmp_path / "run"), "--images", str(images)]) == 0
    saved = json.loads((tmp_path / "run" / "config.json").read_text())["data"]
    assert saved["images"] == str(images)
    assert main(["data", "shards", "--from", str(flat), "--images", str(images), "--out", str(tmp_path / "shards"),
                 "--quiet"]) == 0
    assert "wrote 32 pairs" in capsys.readouterr().out
    assert main(["eval", "captioning", "--run", str(tmp_path / "run"), "--data", str(flat), "--images", str(images),
                 "--lengths", "4", "--metrics", "BLEU", "--limit", "3", "--out", str(tmp_path / "eval"),
                 "--quiet"]) == 0
    capsys.readouterr()  # (the retired position-signal verb took --images too; the central claim needs embedded data)
    assert main(["data", "bench", "--data", str(flat), "--images", str(images), "--image-size", "32", "--batches", "1",
                 "--batch-size", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["images"] > 0


def test_a_run_started_with_a_relative_data_path_resumes_from_anywhere(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(["data", "synth", "--out", "i2d", "--n", "16", "--image-size", "32", "--captions", "short"]) == 0
    base = ["train", "--preset", "tiny", "--quiet", *MICRO_SETS]
    assert main([*base, "--data", "i2d", "--out", "run", "--steps", "2"]) == 0
    data = json.loads((work / "run" / "config.json").read_text())["data"]
    assert data["path"] == str(work / "i2d") and data["path_as_given"] == "i2d"

    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.chdir(other)
    assert main([*base, "--data", str(work / "i2d"), "--out", str(work / "run"), "--steps", "3", "--resume"]) == 0
    assert main([*base, "--data", os.path.join("..", "work", "i2d"), "--out", str(work / "run"), "--steps", "4",
                 "--resume"]) == 0
    assert ck.latest_checkpoint(work / "run").name == "step_00000004"
