"""Issue 59 item 4: every input has a cost bound checked before the work. A synthetic data set's image size, a
model's size from any source (a config inside each single limit, a ``local-dir:`` encoder's ``model_args``), an
image's resized pixel count."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from mdc_core.config import ConfigError, ModelConfig, RunConfig, load_preset
from mdc_core.factory import create_model, decoder_params
from mdc_core.model import MAX_PARAMS
from mdc_core.transforms import ImageError, load_image, open_image
from mdc_workbench.cli import main


def test_synth_refuses_an_image_size_it_cannot_hold_before_writing(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """`mdc data synth --image-size 1000000` (15.5 GB, then killed by the kernel, before): one line, no folder."""
    out = tmp_path / "big"
    assert main(["data", "synth", "--out", str(out), "--n", "4", "--image-size", "1000000"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mdc: error: ") and "\n" not in err and "1000000" in err
    assert not out.exists()


@pytest.mark.parametrize("sets", [
    ["model.text_width=16384", "model.text_layers=256", "model.text_heads=256"],  # each within its own limit
    ['model.encoder_kwargs={"patch_size": 8, "embed_dim": 65536, "depth": 256, "num_heads": 2}'],
])
def test_a_model_inside_each_limit_but_too_large_in_all_is_refused(sets: list[str], tmp_path: Path) -> None:
    """A config whose every size is inside its limit but whose model holds hundreds of billions of parameters is
    one ConfigError before anything is built, from a preset's overrides and from a saved config.json (what
    `--resume` and `load_model` read)."""
    cfg = load_preset("tiny", [*sets, 'model.output_vocab="full"'])
    with pytest.raises(ConfigError, match="billion"):
        create_model(cfg, cfg.objective.name)
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    with pytest.raises(ConfigError, match="billion"):
        create_model(RunConfig.load(tmp_path / "config.json"), cfg.objective.name)


def test_the_parameter_bound_leaves_every_preset_far_below() -> None:
    cfg = load_preset("tiny", ['model.output_vocab="full"'])
    model = create_model(cfg, cfg.objective.name)
    decoder = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("encoder."))
    assert decoder_params(cfg.model) == pytest.approx(decoder, rel=0.05)  # the estimate is the count
    large = ModelConfig(text_width=768, text_layers=12, text_heads=12)  # ViT-L/14's decoder
    assert decoder_params(large) < MAX_PARAMS / 10


@pytest.mark.parametrize("model_args", [{"depth": 5000, "embed_dim": 8, "num_heads": 1},
                                        {"depth": 2, "embed_dim": 70000, "num_heads": 1}])
def test_a_local_dir_encoder_passes_the_same_limits(tmp_path: Path, model_args: dict) -> None:
    """`model.encoder="local-dir:DIR"` whose config.json says depth 5000 or width 70000: one ConfigError naming
    the file, before timm builds anything."""
    folder = tmp_path / "enc"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architecture": "vit_tiny_patch16_224", "num_classes": 0,
                                                    "model_args": {**model_args, "patch_size": 16}}))
    cfg = load_preset("tiny", [f'model.encoder="local-dir:{folder}"', 'model.encoder_kwargs={}',
                               'model.output_vocab="full"'])
    with pytest.raises(ConfigError, match="config.json model_args"):
        create_model(cfg, cfg.objective.name)


def _png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("L", (width, height), 128).save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


@pytest.mark.parametrize("size", [(1, 10_000), (10_000, 1), (40, 1290)])
def test_an_image_too_elongated_to_resize_is_refused_before_resizing(size: tuple[int, int]) -> None:
    """A 121-byte 1x10000 PNG inside the side and pixel limits (2.8 GB at 224 px, 8.8 GB at 448 px, before): an
    ImageError (skipped as too_large by training), before any resize; 32:1 still loads."""
    data = _png(*size)
    with pytest.raises(ImageError, match="too elongated") as err:
        open_image(data, "thin.png")
    assert err.value.reason == "too_large"
    assert load_image(_png(32, 1024), 32).shape == (3, 32, 32)


def test_the_thin_png_path_peaks_low(tmp_path: Path) -> None:
    """Peak memory of `load_image` of the 1x10000 PNG at 448 px, in a fresh process: the refusal costs what the
    imports cost (the figure in docs/reliability.md)."""
    png = tmp_path / "thin.png"
    png.write_bytes(_png(1, 10_000))
    code = ("import resource, sys\nfrom mdc_core.transforms import load_image\n"
            "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "try:\n    load_image(sys.argv[1], 448)\nexcept ValueError as err:\n    print('refused', err)\n"
            "print(base, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n")
    out = subprocess.run([sys.executable, "-c", code, str(png)], capture_output=True, text=True, timeout=600)
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("refused") and "too elongated" in lines[0], out.stderr[-2000:]
    base, peak = map(int, lines[-1].split())
    assert peak - base < 100_000  # KiB: the image is never resized (8.8 GB before)
