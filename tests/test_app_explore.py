"""The app's "fix some words" box, attention overlay, GIF and JSON download, and replay (callbacks, no server)."""

import json

import gradio as gr
import pytest
from PIL import Image

from app import explore
from app import mdc_app as A
from tests.test_app import CHIP, _settings, app  # noqa: F401 - the module-scoped app fixture

GREEDY = _settings(length=6)


def _caption(prompt: str = ""):
    state = A.show_scene(2, "micro", None)[0]
    state = explore.set_prompt(prompt, state)
    return A.run_caption("micro", state, *GREEDY)


def test_fixed_words_stay_and_only_slots_are_unmasked(app):  # noqa: F811
    state, chips, slider, _, summary = _caption("a [MASK] square on the _")
    record = state["record"]
    assert record["fixed"] == [0, 2, 3, 4] and record["tokens"][2] == "square"
    assert slider.maximum == 2 and "4 words fixed by the prompt" in summary
    shown = CHIP.findall(A.show_step(0, state))
    assert [s for _, s, _ in shown] == ["fixed", "masked", "fixed", "fixed", "fixed", "masked"]
    with pytest.raises(gr.Error, match="no slot"):
        _caption("a red square")
    assert _caption("")[0]["record"]["fixed"] == []  # an empty box: every position is generated


def test_attention_overlay_follows_step_layer_and_head(app):  # noqa: F811
    state = _caption()[0]
    img, label = explore.attention_view(3, explore.LAST, explore.MEAN, state)
    assert isinstance(img, Image.Image) and img.size == (256, 256)
    revealed = state["record"]["steps"][2]["revealed"][0]
    assert f"'{revealed['token']}'" in label and "last layer, mean over heads" in label
    other, label2 = explore.attention_view(3, "1", "2", state)
    assert "layer 1, head 2" in label2 and other.size == (256, 256)
    assert explore.attention_view(0, explore.LAST, explore.MEAN, state)[0].size == (256, 256)  # no overlay yet
    layers, heads = explore.layer_choices(A.get_run("micro"))
    assert layers == ["last", "mean", "1", "2"] and heads == ["mean", "1", "2"]


def test_gif_json_and_replay(app, tmp_path):  # noqa: F811
    state = _caption("a _ _ square")[0]
    with Image.open(explore.save_gif(state)) as gif:
        assert gif.n_frames == len(state["record"]["steps"]) == 2
    path = explore.save_json(state)
    saved = json.loads(open(path).read())
    assert saved["prompt"] == "a _ _ square" and saved["image_png"] and saved["settings"]["seed"] == 0
    fresh, image, info, chips, slider, fig, summary, prompt = explore.load_replay(path, None)
    assert fresh["record"]["token_ids"] == state["record"]["token_ids"] and prompt == "a _ _ square"
    assert image.size == (32, 32) and slider.value == 2 and "replay of" in summary
    assert chips == A.show_step(2, state)
    bad = tmp_path / "bad.json"
    bad.write_text('{"caption": 1}')
    with pytest.raises(gr.Error, match="missing"):
        explore.load_replay(str(bad), None)
    with pytest.raises(gr.Error, match="caption an image first"):
        explore.save_gif({})
