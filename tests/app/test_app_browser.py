"""The app as a person meets it: Playwright drives Debian's Chromium (no browser download) through the page's main
actions (unmask, a prompt that sets N', play, the GIF and JSON downloads, a new scene, a good and a bad upload, a
replay, the Compare and Score tabs) and takes a screenshot after each (kept in $MDC_BROWSER_SHOTS when set).
Skips, saying what to install, without the playwright package or a chromium executable."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from mdc_app import runs
from mdc_app.layout import build_app
from mdc_app.screenshot import find_chromium
from PIL import Image

from mdc_core.checkpoint import save_checkpoint
from mdc_workbench.export.shipped import SHIPPED_DIR, load_shipped
from tests.app.test_app import _micro_run

sync_api = pytest.importorskip("playwright.sync_api", reason="the browser test needs playwright (pip install "
                                                              "playwright; no browser download: it drives chromium)")
CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="the browser test needs chromium (apt-get install -y "
                                                         "chromium)")
WAIT_MS = 120_000  # generous: a busy machine answers slowly, and nothing here is timed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """The app (the shipped captioner by default, a micro ARC run, a saved micro MDC run under the root) served on
    a loopback port, and a Chromium page on it."""
    from mdc_app.launch import LAUNCH_KW

    root = tmp_path_factory.mktemp("browser_runs")
    model, cfg = _micro_run()
    save_checkpoint(root / "saved" / "mdc", 1, cfg, model)
    demo = build_app({"shipped": (*load_shipped(), SHIPPED_DIR), "browser-arc": _micro_run(causal=True)}, root=root,
                     default="shipped")
    port = _free_port()
    demo.queue().launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                        **LAUNCH_KW)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        tab = browser.new_page(viewport={"width": 1400, "height": 1100}, accept_downloads=True)
        tab.set_default_timeout(WAIT_MS)
        tab.goto(f"http://127.0.0.1:{port}/")
        tab.locator("#chips [data-pos]").first.wait_for()  # the load view: scene 3 unmasked
        yield tab
        browser.close()
    demo.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("MDC_BROWSER_SHOTS") or tmp_path_factory.mktemp("shots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _number(page, elem_id: str) -> int:
    return int(page.locator(f"#{elem_id} input[type=number]").input_value())


def _wait_number(page, elem_id: str, value: int) -> None:
    page.wait_for_function("([id, v]) => document.querySelector(`#${id} input[type=number]`).value == String(v)",
                           arg=[elem_id, value])


def _menu_options(page, elem_id: str) -> list[str]:
    page.locator(f"#{elem_id} input").click()
    options = page.locator("ul.options li")
    options.first.wait_for()
    labels = [t.replace("\u2713", "").strip() for t in options.all_inner_texts()]  # no check mark of the chosen
    page.keyboard.press("Escape")
    return labels


def _summary(page) -> str:
    """The summary line (its markdown, without gradio's progress text) once no event is running on it."""
    page.wait_for_function("() => document.querySelector('#summary [data-testid=status-tracker]')"
                           ".classList.contains('hide')")
    return page.locator("#summary [data-testid=markdown]").inner_text()


def _caption_done(page, before: str) -> str:
    """Wait until the summary line changes from `before` (a caption answered); the new summary."""
    page.wait_for_function("b => document.querySelector('#summary [data-testid=markdown]').innerText !== b",
                           arg=before)
    return _summary(page)


def test_a_person_unmasks_plays_downloads_uploads_replays_compares_and_scores(page, shots, tmp_path):
    page.screenshot(path=str(shots / "01_opened.png"), full_page=True)
    run_menu = _menu_options(page, "run-menu")
    assert any(label.startswith("shipped") for label in run_menu), run_menu
    assert any(label.startswith("saved/mdc") for label in run_menu), run_menu
    assert not any(label.startswith("browser-arc") for label in run_menu), run_menu  # ARC: no unmasking to show

    # unmask, then a prompt of 6 words: N' follows it, on the slider too
    before = _summary(page)
    page.locator("#unmask").click()
    _caption_done(page, before)  # the same caption, new timings
    page.locator("#prompt input, #prompt textarea").first.fill("a _ _ _ _ _")
    before = _summary(page)
    page.locator("#unmask").click()
    assert "N' = 6" in _caption_done(page, before)
    _wait_number(page, "sampler-length", 6)
    assert page.locator("#chips [data-pos]").count() == 6
    page.screenshot(path=str(shots / "02_prompt_sets_length.png"), full_page=True)

    # play: the step slider rewinds and walks to the last step
    n_steps = _number(page, "step")  # 5: the prompt fixed one word
    page.locator("#play").click()
    page.wait_for_function("n => Number(document.querySelector('#step input[type=number]').value) < n", arg=n_steps)
    _wait_number(page, "step", n_steps)
    page.screenshot(path=str(shots / "03_played.png"), full_page=True)

    # the downloads: the box appears with the file's whole name, and the file downloads
    assert not page.locator("#download").is_visible()
    saved = {}
    for button, suffix in (("GIF of this unmasking", ".gif"), ("save trajectory (JSON)", ".json")):
        page.get_by_role("button", name=button).click()
        page.locator(f'#download td.filename[aria-label="mdc_trajectory{suffix}"]').wait_for()
        stem = page.locator("#download td.filename .stem")  # the whole name fits (it read "m..json" once)
        assert stem.evaluate("e => e.scrollWidth <= e.clientWidth + 1"), stem.inner_text()
        with page.expect_download() as download:
            page.locator("#download a[download]").first.click()
        saved[suffix] = tmp_path / f"downloaded{suffix}"
        download.value.save_as(saved[suffix])
        assert saved[suffix].stat().st_size > 0
    assert json.loads(saved[".json"].read_text())["prompt"] == "a _ _ _ _ _"
    page.screenshot(path=str(shots / "04_downloads.png"), full_page=True)

    # a new scene: the download of the previous trajectory goes, the prompt too
    before = _summary(page)
    page.get_by_role("button", name="new random scene").click()
    _caption_done(page, before)
    page.locator("#download").wait_for(state="hidden")
    assert page.locator("#prompt input, #prompt textarea").first.input_value() == ""

    # a good upload, then a bad one: the page keeps the good image, says why in one line, and unmask still works
    good = tmp_path / "scene.png"
    Image.new("RGB", (64, 64), (200, 40, 40)).save(good)
    before = _summary(page)
    page.locator("#upload input[type=file]").set_input_files(str(good))
    _caption_done(page, before)
    assert "scene.png" in page.locator("#image-info").inner_text()
    bad = tmp_path / "notes.png"
    bad.write_text("not an image")
    page.locator("#upload input[type=file]").set_input_files(str(bad))
    page.get_by_text("notes.png: not a readable image").first.wait_for()
    page.wait_for_function("() => document.querySelector('#image-info').innerText.includes('still showing')")
    assert "scene.png" in page.locator("#image-info").inner_text()
    for elem_id in ("image", "image-info"):  # no red error badge left on the image or its info
        assert page.locator(f"#{elem_id}").get_by_text("Error", exact=True).count() == 0
    assert page.locator("#image img").count() == 1 and page.locator("#unmask").is_enabled()
    page.screenshot(path=str(shots / "05_bad_upload.png"), full_page=True)
    before = _summary(page)
    page.locator("#prompt input, #prompt textarea").first.fill("")
    page.locator("#unmask").click()
    assert runs.get_run("shipped").label in _caption_done(page, before)  # the shown image, captioned again

    # replay the saved JSON: its image drawn at the page's size, not 64 px
    before = _summary(page)
    page.locator("#replay input[type=file]").set_input_files(str(saved[".json"]))
    assert "replay of" in _caption_done(page, before)
    page.wait_for_function("() => document.querySelector('#image img') && "
                           "document.querySelector('#image img').naturalWidth >= 256")
    page.screenshot(path=str(shots / "06_replayed.png"), full_page=True)

    # Compare: the ARC menu lists ARC runs only; the table shows MDC at three lengths and the ARC run
    page.get_by_role("tab", name="Compare").click()
    arc_menu = _menu_options(page, "arc-menu")
    assert arc_menu[0] == "(none)" and len(arc_menu) >= 2
    assert all(" (arc" in label for label in arc_menu[1:]), arc_menu
    page.locator("#arc-menu input").fill("browser-arc")  # the menu filters as one types; Enter takes the match
    page.keyboard.press("Enter")
    page.get_by_role("button", name="compare N' = 10 / 15 / 20").click()
    page.locator("#compare-out", has_text="ARC browser-arc, greedy").wait_for()
    assert "MDC N' = 10" in page.locator("#compare-out").inner_text()
    page.screenshot(path=str(shots / "07_compare.png"), full_page=True)

    # Score: the methods say what they are; the table ranks the typed captions
    page.get_by_role("tab", name="Score your own captions").click()
    methods = page.locator("#methods").inner_text()
    assert "Monte Carlo ELBO" in methods and "chain rule" in methods and "greedy-order" in methods
    page.locator("#typed textarea").fill("a red circle\na blue square")
    page.get_by_role("button", name="score", exact=True).click()
    page.locator("#score-out", has_text="heuristic score").wait_for()
    page.screenshot(path=str(shots / "08_score.png"), full_page=True)
