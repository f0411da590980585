"""Shareable trajectories: canvas replay with fixed words and remasks, attention maps, GIF frames, JSON records."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from mdc_core.config import SamplerConfig
from mdc_core.sampler import sample
from mdc_core.tokenizer import MASK_ID, CaptionTokenizer
from mdc_workbench.viz import animation
from mdc_workbench.viz.animation import trajectory

TOK = CaptionTokenizer(24)


def _record(model, image, **kw):
    prompt = kw.pop("prompt", None)
    out = sample(model, model.encode_image(image), SamplerConfig(**kw), prompt=prompt, attention=True)
    return trajectory(out, TOK)


def test_canvas_replays_fixed_words_and_remasks_by_hand():
    def step(s, rev, masked, remasked=()):
        return {"step": s, "revealed": [dict(zip(("position", "token", "confidence"), r, strict=True)) for r in rev],
                "masked": [dict(zip(("position", "top_token", "top_confidence"), m, strict=True)) for m in masked],
                "remasked": [{"position": p, "token": t, "token_id": 0} for p, t in remasked]}
    record = {"token_ids": [1, 2, 3], "tokens": ["a", "blue", "dot"], "fixed": [0], "steps": [
        step(0, [(1, "red", 0.4)], [(1, "red", 0.4), (2, "dot", 0.3)]),
        step(1, [(2, "dot", 0.8)], [(2, "dot", 0.8)]),
        step(2, [(1, "blue", 0.9)], [(1, "blue", 0.9)], remasked=[(1, "red")])]}
    cells = animation.canvas_at(record, 0)
    assert cells[0] == {"position": 0, "state": "fixed", "token": "a"}
    assert [c["state"] for c in cells] == ["fixed", "masked", "masked"]
    cells = animation.canvas_at(record, 2)
    assert cells[1]["token"] == "red" and cells[1]["remask_next"] and cells[2]["just"]
    cells = animation.canvas_at(record, 3)
    assert cells[1] == {"position": 1, "state": "revealed", "token": "blue", "confidence": 0.9, "order": 3,
                        "step": 2, "just": True, "revised": True}
    assert [c["token"] for c in cells] == ["a", "blue", "dot"]


def test_attention_map_by_hand():
    att = np.zeros((2, 2, 5))  # 2 layers, 2 heads, 1 class token + 2x2 patches
    att[1, 0] = [0.2, 0.8, 0.0, 0.0, 0.0]
    att[1, 1] = [0.2, 0.0, 0.0, 0.0, 0.8]
    att[0, :, 2] = 1.0
    grid = animation.attention_map(att, prefix=1)  # last layer, mean over heads, class token dropped
    np.testing.assert_allclose(grid, [[0.5, 0.0], [0.0, 0.5]])
    np.testing.assert_allclose(animation.attention_map(att, 1, layer=0, head=1), [[0.0, 1.0], [0.0, 0.0]])
    np.testing.assert_allclose(animation.attention_map(att, 1, layer="mean", head=0), [[0.8 / 1.8, 1 / 1.8], [0, 0]])
    with pytest.raises(ValueError, match="square grid"):
        animation.attention_map(att, prefix=0)


def test_gif_has_one_frame_per_step(tiny_model, tmp_path):
    model = tiny_model()
    image = torch.randn(1, 3, 32, 32)
    pil = Image.fromarray((np.random.default_rng(0).random((32, 32, 3)) * 255).astype(np.uint8))
    for kw in ({"length": 5}, {"length": 6, "tokens_per_step": 2},
               {"length": 4, "remask_threshold": 0.99, "remask_steps": 3},
               {"prompt": torch.tensor([320, MASK_ID, 1746, MASK_ID])}):
        record = animation.with_image(_record(model, image, **kw), pil)
        path = animation.trajectory_gif(record, tmp_path / "t.gif")
        with Image.open(path) as gif:
            assert gif.n_frames == len(record["steps"])
    with pytest.raises(ValueError, match="nothing to animate"):
        animation.trajectory_gif({**record, "steps": []}, tmp_path / "none.gif")


def test_json_record_round_trip_and_readable_errors(tiny_model, tmp_path):
    model = tiny_model()
    pil = Image.new("RGB", (32, 32), "red")
    record = animation.with_image(_record(model, torch.randn(1, 3, 32, 32), length=4, seed=7), pil)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(record))
    back = animation.load_record(path)
    assert back["settings"]["seed"] == 7 and back["token_ids"] == record["token_ids"]
    assert animation.record_image(back).getpixel((0, 0)) == (255, 0, 0)
    grid, label = animation.step_attention(back, 1)
    assert grid.shape == (4, 4) and grid.sum() == pytest.approx(1.0) and "last layer" in label
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a JSON trajectory"):
        animation.load_record(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text(json.dumps({"caption": "x"}))
    with pytest.raises(ValueError, match="missing tokens"):
        animation.load_record(tmp_path / "other.json")
    broken = {**record, "steps": [{**record["steps"][0], "revealed": [{"position": 99, "token": "x",
                                                                       "confidence": 1.0}]}]}
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    with pytest.raises(ValueError, match="damaged"):
        animation.load_record(tmp_path / "broken.json")
    with pytest.raises(FileNotFoundError):
        animation.load_record(tmp_path / "missing.json")
