"""The page's consistency without a browser (issue 64 item 5; tests/app/test_app_browser.py clicks the same in
Chromium): menus that list only runs that fit, a refused upload that leaves the last good image, the length slider
at the caption's N', a replayed image drawn at the page's size, score methods that say what they are, and a heatmap
whose labels do not overlap at a long N'."""

from __future__ import annotations

import json
from pathlib import Path

import gradio as gr
import pytest
from mdc_app import callbacks as A
from mdc_app import explore, runs
from mdc_app.layout import build_app

from mdc_core.checkpoint import save_checkpoint
from mdc_workbench.viz import trajectory_view
from tests.app.test_app import GREEDY, _micro_run


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    root = tmp_path_factory.mktemp("page_runs")
    model, cfg = _micro_run()
    save_checkpoint(root / "saved" / "mdc", 1, cfg, model)
    arc_model, arc_cfg = _micro_run(causal=True)
    save_checkpoint(root / "saved" / "arc", 1, arc_cfg, arc_model)
    demo = build_app({"page-mdc": (model, cfg), "page-arc": (arc_model, arc_cfg)}, root=root, default="page-mdc")
    return {"demo": demo, "root": root}


def test_menus_list_only_runs_that_fit(page):
    keys = {arc: {key for _, key in runs.run_choices(page["root"], arc=arc)} for arc in (True, False)}
    assert {"page-arc", "saved/arc"} <= keys[True] and not {"page-mdc", "saved/mdc"} & keys[True]
    assert {"page-mdc", "saved/mdc"} <= keys[False] and not {"page-arc", "saved/arc"} & keys[False]
    assert keys[True] | keys[False] == {key for _, key in runs.run_choices(page["root"])}
    menus = {c.elem_id: c for c in page["demo"].blocks.values() if getattr(c, "elem_id", None) in ("run-menu",
                                                                                                   "arc-menu")}
    assert {key for _, key in menus["arc-menu"].choices} - {""} <= keys[True]
    assert {key for _, key in menus["run-menu"].choices} <= keys[False]
    run_menu, arc_menu = A.rescan_runs(str(page["root"]), "page-mdc", "")
    assert {key for _, key in run_menu.choices} == keys[False]
    assert {key for _, key in arc_menu.choices} == keys[True] | {""}
    assert runs.is_arc_objective("arc") is True and runs.is_arc_objective("mdc") is False
    assert runs.is_arc_objective("no-such-objective") is None


def test_a_refused_upload_leaves_the_last_good_image(page, tmp_path):
    state = A.show_scene(2, "page-mdc", None)[0]
    bad = tmp_path / "notes.png"
    bad.write_text("not an image")
    with pytest.raises(gr.Error, match="notes.png: not a readable image"):
        A.load_upload(str(bad), state)  # the page's toast says this; then the failure handler restores the page
    image, info, button, upload, prompt = A.restore_after_failed_upload({**state, "prompt": "a _"})
    assert image.size == A._display(state["image"]).size and "scene 2" in info
    assert button.interactive is True and upload is None and prompt == "a _"
    image, info, button, upload, prompt = A.restore_after_failed_upload({})
    assert image is None and button.interactive is False and "no image" in info
    upload_events = [fn for fn in page["demo"].fns.values() if fn.api_name == "upload"]
    failure = [fn for fn in page["demo"].fns.values() if fn.fn is A.restore_after_failed_upload]
    assert len(upload_events) == 1 and len(failure) == 1 and failure[0].trigger_only_on_failure


def test_the_length_slider_shows_the_captions_length(page):
    state = A.show_scene(1, "page-mdc", None)[0]
    state = explore.set_prompt("a _ _ _", state)
    state = A.run_caption("page-mdc", state, *GREEDY)[0]
    assert A.length_shown(state).value == len(state["record"]["tokens"]) == 4
    assert A.length_shown({}) == gr.skip()  # no caption yet: the slider as it is


def test_a_replayed_image_is_drawn_at_the_pages_size_and_downloads_show_with_their_file(page, tmp_path):
    state = A.show_scene(1, "page-mdc", None)[0]
    state = A.run_caption("page-mdc", state, *GREEDY)[0]
    shown = A.shown_download(explore.save_json)(state)
    path = Path(shown.value["path"] if isinstance(shown.value, dict) else shown.value)
    assert shown.visible is True and json.loads(path.read_text())["caption"] == state["record"]["caption"]
    assert A.hide_download().visible == "hidden"
    replayed = A.replay_on_page(str(path), None)
    assert state["image"].width < 256 <= replayed[1].width  # upscaled as a scene is


def test_score_methods_say_what_they_are():
    assert list(A.SCORE_LABELS) == A.SCORE_METHODS
    assert "Monte Carlo ELBO" in A.SCORE_LABELS["mc"] and "chain rule" in A.SCORE_LABELS["ar"]


def test_heatmap_labels_do_not_overlap_at_a_long_caption():
    n = 62
    record = {"tokens": [f"w{i}" for i in range(n)], "token_ids": list(range(n)), "fixed": [],
              "steps": [{"step": s, "revealed": [{"position": s, "token": f"w{s}", "token_id": s, "confidence": 0.5}],
                         "remasked": [], "masked": [{"position": p, "top_confidence": 0.3}
                                                    for p in range(s + 1, n)]} for s in range(n)]}
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = trajectory_view.heatmap_figure(record)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    ax, renderer = fig.axes[0], canvas.get_renderer()
    for labels in (ax.get_xticklabels(), ax.get_yticklabels()):
        boxes = [label.get_window_extent(renderer) for label in labels if label.get_text()]
        assert all(not a.overlaps(b) for a, b in zip(boxes, boxes[1:], strict=False)), "tick labels overlap"
