"""The app's "fix some words" box, attention overlay, GIF and JSON download, and replay (callbacks, no server)."""

import json
import re
from pathlib import Path

import gradio as gr
import pytest
from mdc_app import callbacks as A
from mdc_app import explore
from PIL import Image

from tests.app.test_app import CHIP, _settings, app  # noqa: F401 - the module-scoped app fixture

GREEDY = _settings(length=6)


def _caption(prompt: str = ""):
    state = A.show_scene(2, "micro", None)[0]
    state = explore.set_prompt(prompt, state)
    return A.run_caption("micro", state, *GREEDY)


def test_fixed_words_stay_and_only_slots_are_unmasked(app):  # noqa: F811
    state, chips, slider, _, summary, _ = _caption("a [MASK] square on the _")
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


def test_the_text_line_above_the_chips_shows_the_fixed_words(app):  # noqa: F811
    state = _caption("a [MASK] square on the _")[0]
    line = re.search(r'<span style="font-family:monospace">([^<]*)</span>', A.show_step(0, state)).group(1)
    assert line.split() == ["a", "\u2581", "square", "on", "the", "\u2581"]  # masked slots only are blanks


def test_a_new_image_drops_the_prompt_of_the_previous_one(app):  # noqa: F811
    state = explore.set_prompt("a [MASK] square on the _", A.show_scene(2, "micro", None)[0])
    for fresh in (A.show_scene(5, "micro", state)[0], A.new_scene("micro", state)[1]):
        assert fresh["prompt"] == ""
        assert A.run_caption("micro", fresh, *GREEDY)[0]["record"]["fixed"] == []  # every word generated
    assert explore.clear_prompt() == ""  # and the box is emptied (wired to the scene button, scene # and upload)
    blocks = app["demo"]
    cleared = {t for fn in blocks.fns.values() if fn.fn is explore.clear_prompt for t, _ in fn.targets}
    assert len(cleared) == 3


def test_downloads_live_in_one_temporary_folder_that_cleanup_removes(app):  # noqa: F811
    state = _caption()[0]
    first, second = Path(explore.save_json(state)), Path(explore.save_gif(state))
    folder = Path(explore._TEMP.name)
    assert folder.name.startswith("mdc-app-") and first.parent.parent == second.parent.parent == folder
    assert first.parent != second.parent  # one sub-folder per download: users never overwrite each other
    explore.cleanup_temp()
    assert not folder.exists() and explore._TEMP is None


def test_hidden_callbacks_are_no_api_endpoints(app):  # noqa: F811
    public = {fn.api_name for fn in app["demo"].fns.values() if fn.api_visibility == "public"}
    assert public == {"new_scene", "show_scene", "upload", "caption", "caption_json", "step", "gif", "save_json",
                      "replay", "compare", "score"}
    assert all(fn.api_name != "False" for fn in app["demo"].fns.values())


def test_errors_name_no_absolute_server_path(tmp_path, monkeypatch):
    from mdc_app.runs import scrub_paths, user_errors

    monkeypatch.chdir(tmp_path)
    message = f"checkpoint file {tmp_path}/runs/r/model.safetensors is corrupt; see /srv/secret/x.json."
    assert scrub_paths(message) == "checkpoint file runs/r/model.safetensors is corrupt; see x.json."
    assert scrub_paths("the 1/t weight and/or N'/k steps") == "the 1/t weight and/or N'/k steps"
    with pytest.raises(gr.Error) as info, user_errors():
        raise FileNotFoundError("trajectory file not found: /tmp/gradio/3f2a/trace.json")
    assert "/tmp" not in str(info.value.message) and "trace.json" in str(info.value.message)


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"a": ' * 50_000 + "1" + "}" * 50_000])
def test_a_deeply_nested_json_replay_is_named_not_gradios_generic_error(tmp_path, text):
    """json.loads raised RecursionError, which the app showed as gradio's generic "Error"."""
    bad = tmp_path / "deep.json"
    bad.write_text(text)
    with pytest.raises(gr.Error, match="deep.json is not a JSON trajectory: it is nested too deeply"):
        explore.load_replay(str(bad), None)
