"""The small errors a new user meets first (issue 64 item 6): each says the problem in one line, in the workbench's
words, and the cheap ones answer before torch is imported."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from mdc_core.config import ConfigError, load_preset
from mdc_workbench.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "mdc_core" / "pretrained" / "mdc_tiny_lean_easy"


def _png_header(width: int, height: int) -> bytes:
    """A PNG that claims width x height in its header (no pixel data: nothing is allocated)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) + chunk(
        b"IEND", b"")


def _parse_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as err:
        main(argv)
    assert err.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_an_unknown_flag_is_named_before_a_missing_required_one(capsys):
    """argparse checks required flags first: `mdc train --bogus` answered "required: --out"."""
    assert _parse_error(["train", "--bogus"], capsys) == "mdc train: error: unrecognized arguments: --bogus"
    assert _parse_error(["data", "synth", "--n", "4", "--bogus=1"], capsys).endswith(
        "unrecognized arguments: --bogus=1")
    # a unique abbreviation of a known flag and a negative number are no unknown flags: the required one is named
    assert _parse_error(["train", "--pres", "tiny"], capsys).endswith("the following arguments are required: --out")
    assert _parse_error(["data", "synth", "--seed", "-1", "--out", "x"], capsys).endswith(
        "the following arguments are required: --n")


def test_a_misspelt_config_key_suggests_the_right_one():
    with pytest.raises(ConfigError) as err:
        load_preset("tiny", ["train.lrr=1"])
    assert str(err.value) == "unknown config key 'train.lrr'; did you mean train.lr?"


def test_a_non_image_and_an_oversized_image_say_so_in_the_workbenchs_words(tmp_path):
    from mdc_core.transforms import ImageError, load_image, open_image

    notes = tmp_path / "notes.png"
    notes.write_text("a text file, not a picture\n")
    with pytest.raises(ValueError) as err:
        load_image(notes, 32)
    assert str(err.value) == f"{notes}: not a readable image (cannot identify image file {notes})"
    for width, height, size in ((12000, 12000, "of 12000x12000 pixels"), (20000, 20000, "of 400 MP")):
        with pytest.raises(ImageError) as err:  # PIL warns above 89 MP and raises above 179 MP
            open_image(_png_header(width, height), "big.png")
        assert str(err.value) == f"big.png: image {size} is too large (limit 10000 px per side, 50 MP)"
        assert err.value.reason == "too_large" and "decompression" not in str(err.value)


HIDE_TORCH = """
import contextlib, io, json, sys
sys.modules["torch"] = None  # import torch raises ModuleNotFoundError: an error that needs torch shows a traceback
from mdc_workbench.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exit:
            rc = exit.code
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            rc = f"raised {type(exc).__name__}: {exc}"
    results.append({"rc": rc, "err": err.getvalue()})
print(json.dumps(results))
"""


def test_cheap_errors_answer_before_torch_is_imported(tmp_path):
    """An unknown preset, an unknown export format and an unknown flag need no torch: in an interpreter where torch
    cannot be imported they still give their one-line error (before: 12-20 s of importing torch first)."""
    calls = {
        "mdc: error: unknown preset 'tinny'; available: ": ["train", "--preset", "tinny", "--out", str(tmp_path / "r")],
        "mdc: error: unknown preset 'huge'; available: ": ["bench", "--preset", "huge"],
        "mdc: error: unknown export format 'onnx'; choose one of timm, hf": [
            "export", str(SHIPPED), "--format", "onnx", "--out", str(tmp_path / "e")],
        "mdc train: error: unrecognized arguments: --bogus": ["train", "--bogus"],
    }
    out = subprocess.run([sys.executable, "-c", HIDE_TORCH, json.dumps(list(calls.values()))], capture_output=True,
                         text=True, timeout=300, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    for expected, result in zip(calls, json.loads(out.stdout), strict=True):
        lines = result["err"].strip().splitlines()
        assert result["rc"] == 2 and lines[-1].startswith(expected), (expected, result)
        assert "Traceback" not in result["err"]
    assert not (tmp_path / "r").exists() and not (tmp_path / "e").exists()


def test_synth_writes_captions_that_fit_the_presets_context_by_default():
    """`mdc data synth` without --captions wrote mixed captions, 14% of which the tiny preset's 64-token context
    cut; its default is now short captions, none of which it cuts (mixed: 15% on 400 paper scenes)."""
    from mdc_core.tokenizer import CaptionTokenizer
    from mdc_workbench.data.synth import make_example

    args = build_parser().parse_args(["data", "synth", "--out", "x", "--n", "1"])
    context = load_preset("tiny").model.context_length
    tokenizer = CaptionTokenizer(context)

    def cut(captions: str) -> float:
        lengths = [len(tokenizer.encode_text(make_example(args.seed, "train", i, args.image_size, captions,
                                                         difficulty=args.difficulty)["txt"])) + 2
                   for i in range(400)]
        return sum(n > context for n in lengths) / len(lengths)

    assert cut(args.captions) == 0.0
    assert cut("mixed") > 0.05  # the premise: the old default's long captions outgrow the context
