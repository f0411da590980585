"""The small trained captioner shipped with the repository: the app and the notebooks open on it at once.

``mdc_core/pretrained/mdc_tiny_lean_easy/`` is a checkpoint folder (``model.safetensors``, ``config.json``,
``meta.json`` with the SHA-256 of the weights, which :func:`mdc_core.factory.load_model` verifies on every load)
plus ``data_manifest.json`` (the parameters of the embedded data set it was trained on: which scenes it knows) and
``README.md`` (what it is, the command and seed that reproduce it, its accuracy). It is the `tiny_lean` preset
trained by the fast CPU recipe (docs/fast_recipe.md) on the `easy` embedded data; see :data:`SHIPPED_COMMAND`.

:func:`load_shipped` checks the weights against :data:`SHIPPED_SHA256` (written here, so that a replaced
``meta.json`` cannot vouch for other weights) and returns the model with its config; :func:`single_object_scenes`
and :func:`single_object_accuracy` measure what the README promises on the held-out test scenes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mdc_core.sources import file_sha256

SHIPPED_NAME = "mdc_tiny_lean_easy"
SHIPPED_DIR = Path(__file__).resolve().parents[2] / "mdc_core" / "pretrained" / SHIPPED_NAME
SHIPPED_LABEL = f"shipped: {SHIPPED_NAME}"  # how the app's run menu names it
SHIPPED_SHA256 = "6a305d9061e186503087cf6e38129ca0fbf5e2d454d5a54930ea4ec10176c258"
SHIPPED_COMMAND = (  # how the weights were made (bash; 9-15 minutes on 2 CPU cores), under flock so heavy jobs queue
    "mdc data synth --out DATA --n 20000 --seed 0 --captions short --image-size 64 --difficulty easy && "
    "mdc train --preset tiny_lean --data DATA --out RUN --set train.seed=1"
)
HELD_OUT = {"split": "test", "first": 512}  # the promise is measured on the single-object scenes among these


def shipped_model_dir() -> Path:
    """The shipped checkpoint folder (FileNotFoundError naming it when this checkout lacks it)."""
    if not (SHIPPED_DIR / "model.safetensors").is_file():
        raise FileNotFoundError(f"the shipped model is missing from this checkout: {SHIPPED_DIR}")
    return SHIPPED_DIR


def sha256(path: str | Path) -> str:
    """The SHA-256 hex digest of a file (the shipped weights' checksum)."""
    return file_sha256(path)


def data_params() -> dict[str, Any]:
    """The generator parameters of the data set the shipped model was trained on (``difficulty``, ``seed``,
    ``captions``, ``image_size``, ...), so that scenes can be drawn from the distribution it knows."""
    return json.loads((shipped_model_dir() / "data_manifest.json").read_text())["params"]


def knows_data(*, difficulty: str, captions: str, image_size: int, seed: int) -> bool:
    """Whether embedded data written with these generator parameters are the scenes the shipped model was trained
    on (its training images when `seed` matches), so that a notebook may use it in place of a model of its own."""
    p = data_params()
    return (difficulty, captions, image_size, seed) == (p.get("difficulty", "paper"), p["captions"],
                                                        p["image_size"], p["seed"])


def load_shipped(device: str = "cpu") -> tuple[Any, Any]:
    """``(model, cfg)`` of the shipped captioner in eval mode, after checking its weights' SHA-256."""
    from mdc_core.checkpoint import CheckpointError
    from mdc_core.factory import load_model

    folder = shipped_model_dir()
    found = sha256(folder / "model.safetensors")
    if found != SHIPPED_SHA256:
        raise CheckpointError(f"{folder / 'model.safetensors'} is not the shipped model (SHA-256 {found[:12]}..., "
                              f"expected {SHIPPED_SHA256[:12]}...): restore it with `git checkout {folder}`")
    return load_model(folder, device=device)


def single_object_scenes(limit: int = HELD_OUT["first"], image_size: int | None = None) -> list[dict[str, Any]]:
    """The held-out test scenes with one object among the first `limit` of the shipped model's data (drawn by the
    generator, nothing read from disk): ``{"image": PIL image, "colour", "shape", "caption"}`` each."""
    from mdc_core.transforms import open_image
    from mdc_workbench.data import make_example

    p = data_params()
    scenes = []
    for i in range(limit):
        ex = make_example(p["seed"], HELD_OUT["split"], i, image_size=image_size or p["image_size"],
                          captions=p["captions"], difficulty=p.get("difficulty", "paper"))
        labels = json.loads(ex["json"])["labels"]
        if labels["count"] == 1:
            scenes.append({"image": open_image(ex["jpg"], ex["__key__"]), "colour": labels["colour"],
                           "shape": labels["shape"], "caption": ex["txt"]})
    return scenes


def single_object_accuracy(model: Any, cfg: Any, scenes: list[dict[str, Any]], batch_size: int = 64
                           ) -> dict[str, Any]:
    """Greedy captions (the config's sampler) of `scenes`; the fraction that names the object's colour and shape
    (:func:`mdc_workbench.eval.report.names_object`, as ``mdc eval objects`` and notebook 01 count it)."""
    import torch

    from mdc_core.sampler import sample
    from mdc_core.tokenizer import CaptionTokenizer
    from mdc_core.transforms import eval_transform
    from mdc_workbench.eval.report import names_object

    tokenizer, to_tensor = CaptionTokenizer(cfg.model.context_length), eval_transform(cfg.model.image_size)
    captions: list[str] = []
    for start in range(0, len(scenes), batch_size):
        pixels = torch.stack([to_tensor(s["image"]) for s in scenes[start:start + batch_size]])
        with torch.no_grad():
            out = sample(model, model.encode_image(pixels), cfg.sampler)
        captions += [tokenizer.decode(row) for row in out.tokens]
    right = [names_object(c, s["colour"], s["shape"]) for c, s in zip(captions, scenes, strict=True)]
    return {"accuracy": sum(right) / len(right), "n": len(right), "captions": captions, "right": right}
