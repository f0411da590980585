"""The gradio app: callbacks called directly (what is shown must be the sampler's trajectory), bad uploads,
an end-to-end run through gradio_client on a loopback port, and (slow) a headless-Chromium screenshot."""

from __future__ import annotations

import dataclasses
import html
import json
import re
import shutil
import socket
import struct
import zlib

import gradio as gr
import pytest
import torch
from mdc_app import callbacks as A
from mdc_app import launch as S
from mdc_app import runs
from mdc_app.layout import build_app
from PIL import Image

from mdc_core.checkpoint import save_checkpoint
from mdc_core.config import RunConfig, SamplerConfig, sampler_options
from mdc_core.model import Captioner
from mdc_core.sampler import sample
from mdc_core.tokenizer import CaptionTokenizer, build_output_vocab
from mdc_core.transforms import eval_transform
from mdc_workbench.export.shipped import SHIPPED_DIR
from mdc_workbench.viz import animation, trajectory_view
from mdc_workbench.viz.animation import trajectory
from tests.conftest import micro_config

CHIP = re.compile(r'data-pos="(\d+)" data-state="(\w+)" data-token="([^"]*)"')


def _settings(**kw) -> list:
    """Slider values in SAMPLER_FIELDS order: the SamplerConfig defaults (greedy, N' = 15) except `kw`."""
    return [kw.get(name, getattr(SamplerConfig(), name)) for name in A.SAMPLER_FIELDS]


GREEDY = _settings()


WORDS = "a photo of the big small red blue green circle square triangle on left right top bottom and"


def _micro_run(causal: bool = False) -> tuple[Captioner, RunConfig]:
    """A micro captioner with a corpus head of ~20 words (fast on CPU, as the tiny preset's head)."""
    torch.manual_seed(1)
    ids = build_output_vocab([WORDS])
    short = {"context_length": 10} if causal else {}  # ARC: at most 9 tokens, keeps beam search quick
    cfg = RunConfig(model=micro_config(output_vocab="corpus", output_vocab_size=len(ids), **short),
                    sampler=SamplerConfig(length=8 if causal else 15)).validate()
    if causal:
        cfg.objective.name = "arc"
    return Captioner(cfg.model, causal=causal, output_ids=ids).eval(), cfg


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """Two registered micro runs ("micro" MDC, "micro-arc") and one saved run folder found under a root."""
    root = tmp_path_factory.mktemp("runs")
    model, cfg = _micro_run()
    save_checkpoint(root / "saved" / "run", 1, cfg, model)
    (root / "data" / "checkpoints").mkdir(parents=True)  # a data folder is never scanned
    demo = build_app({"micro": (model, cfg), "micro-arc": _micro_run(causal=True)}, root=root, default="micro")
    return {"demo": demo, "root": root, "model": model}


def _expected_record(model: Captioner, state: dict, cfg: SamplerConfig):
    image_tokens = model.encode_image(eval_transform(model.cfg.image_size)(state["image"])[None])
    out = sample(model, image_tokens, cfg, attention=True)  # the app records attention for its overlay
    return out, trajectory(out, CaptionTokenizer(model.cfg.context_length))


def _chips(html_text: str) -> list[tuple[int, str, str]]:
    return [(int(p), s, t) for p, s, t in CHIP.findall(html_text)]


def test_shown_trajectory_is_the_samplers(app):
    state, image, info = A.show_scene(5, "micro", None)
    assert "scene #5" in info and image.size == (256, 256)
    settings = _settings(length=12, tokens_per_step=2, temperature=0.7, top_k=20, seed=3)
    state, chips, slider, fig, summary, data = A.run_caption("micro", state, *settings)
    out, expected = _expected_record(app["model"], state, A.sampler_config(*settings))
    got = state["record"]
    assert {k: got[k] for k in expected} == expected  # same caption, tokens, steps, settings
    assert data == {"run": "micro", "source": "scene 5", **A.trajectory_json(got, CaptionTokenizer())}  # as JSON
    assert slider.maximum == slider.value == out.num_steps == 6
    tok = CaptionTokenizer()
    for s in range(out.num_steps + 1):
        shown = _chips(A.show_step(s, state))
        assert [p for p, _, _ in shown] == list(range(12))
        for p, kind, text in shown:
            if out.reveal_step[0, p] < s:  # revealed: the final token (revealed tokens never change)
                assert (kind, text) == ("revealed", tok.token_string(int(out.tokens[0, p])))
            else:  # masked: the model's top guess at the start of step s
                assert (kind, text) == ("masked", tok.token_string(int(out.step_top_token[s, 0, p])))
    assert A.show_step(99, state) == A.show_step(6, state)  # clamped to the last step
    assert len(fig.axes[0].images[0].get_array()) == 6


def test_canvas_and_heatmap_by_hand():
    """A 3-token trajectory written by hand: positions revealed in the order 2, 0, 1."""
    def step(s, rev, masked):
        return {"step": s, "revealed": [dict(zip(("position", "token", "confidence"), r, strict=True)) for r in rev],
                "masked": [dict(zip(("position", "top_token", "top_confidence"), m, strict=True)) for m in masked]}
    record = {"token_ids": [1, 2, 3], "tokens": ["a", "red", "dot"], "steps": [
        step(0, [(2, "dot", 0.9)], [(0, "a", 0.5), (1, "big", 0.2), (2, "dot", 0.9)]),
        step(1, [(0, "a", 0.6)], [(0, "a", 0.6), (1, "blue", 0.3)]),
        step(2, [(1, "red", 0.7)], [(1, "red", 0.7)])]}
    assert [r["position"] for r in trajectory_view.reveal_order(record)] == [2, 0, 1]
    cells = animation.canvas_at(record, 1)
    assert cells[2] | {} == {"position": 2, "state": "revealed", "token": "dot", "confidence": 0.9, "order": 1,
                             "step": 0, "just": True}
    assert cells[0] == {"position": 0, "state": "masked", "token": "a", "confidence": 0.6, "next": True}
    assert cells[1] == {"position": 1, "state": "masked", "token": "blue", "confidence": 0.3, "next": False}
    assert [c["state"] for c in animation.canvas_at(record, 3)] == ["revealed"] * 3
    with pytest.raises(ValueError, match="step must be in"):
        animation.canvas_at(record, 4)
    nan = float("nan")
    grid = trajectory_view.heatmap_matrix(record)
    assert str(grid) == str([[0.5, 0.2, 0.9], [0.6, 0.3, nan], [nan, 0.7, nan]])
    assert [t for _, _, t in _chips(trajectory_view.chips_html(record, 1))] == ["a", "blue", "dot"]


def test_tokens_are_escaped():
    bad = '<img src=x onerror="alert(1)">'
    record = {"token_ids": [1], "tokens": [bad], "steps": [
        {"step": 0, "revealed": [{"position": 0, "token": bad, "confidence": 1.0}],
         "masked": [{"position": 0, "top_token": bad, "top_confidence": 1.0}]}]}
    for step in (0, 1):
        shown = trajectory_view.chips_html(record, step)
        assert "<img" not in shown and html.escape(bad) in shown


def _png_header(width: int, height: int) -> bytes:
    """A PNG that claims width x height in its header (no pixel data: nothing is allocated)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) + chunk(
        b"IEND", b"")


@pytest.mark.parametrize("name,data,message", [
    ("notes.png", b"this is a text file, not a picture\n", r"notes\.png: not a readable image"),
    ("empty.png", b"", r"empty\.png: empty file"),
    ("huge.png", _png_header(20000, 20000), r"huge\.png: image .*too large"),
])
def test_bad_uploads_give_readable_errors(tmp_path, name, data, message):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(gr.Error, match=message):
        A.load_upload(str(path), {"image": None})
    with pytest.raises(gr.Error, match="pick an image first"):
        A.run_caption("micro", None, *GREEDY)


def test_good_upload_is_captioned(app, tmp_path):
    path = tmp_path / "photo.webp"
    Image.new("RGB", (300, 200), (200, 30, 30)).save(path)
    state, image, info = A.load_upload(str(path), None)
    assert state["image"].size == (300, 200) and "300 x 200" in info
    state, chips, *_ = A.run_caption("micro", state, *GREEDY)
    assert len(_chips(chips)) == 15 and state["record"]["caption"]


def test_sampler_settings_follow_the_config(app):
    sliders = {s.label: s for s in app["demo"].blocks.values() if isinstance(s, gr.Slider)}
    declared = {o.name: o for o in sampler_options()}
    length = sliders[declared["length"].label]
    assert (length.minimum, length.maximum) == (declared["length"].range[0], 22)  # micro context 24 - 2
    temp = sliders[declared["temperature"].label]
    assert (temp.minimum, temp.maximum) == declared["temperature"].range == (0.0, 2.0)
    with pytest.raises(gr.Error, match=r"sampler.temperature must be in \[0, 2\]"):
        A.run_caption("micro", A.show_scene(0, "micro", None)[0], *_settings(temperature=3.0))
    with pytest.raises(gr.Error, match="exceeds the model's context"):
        A.run_caption("micro", A.show_scene(0, "micro", None)[0], *_settings(length=40))


def test_play_walks_every_step_then_stops(app):
    state = A.run_caption("micro", A.show_scene(1, "micro", None)[0], *_settings(length=4))[0]
    slider, timer = A.start_play(state)
    assert slider.value == 0 and timer.active
    frames = [0]
    while timer.active:
        slider, timer = A.play_tick(frames[-1], state)
        frames.append(slider.value)
    assert frames == [0, 1, 2, 3, 4]


def test_compare_lengths_and_arc(app):
    state = A.show_scene(2, "micro", None)[0]
    table = A.compare_lengths("micro", "", state, *GREEDY)
    shown = [html.unescape(c) for c in re.findall(r'data-caption="([^"]*)"', table)]
    expected = [" ".join(_expected_record(app["model"], state, SamplerConfig(length=n))[1]["tokens"])
                for n in A.COMPARE_LENGTHS]
    assert shown == expected
    with pytest.raises(gr.Error, match="autoregressive"):
        A.run_caption("micro-arc", state, *GREEDY)
    with pytest.raises(gr.Error, match="not an ARC run"):
        A.compare_lengths("micro", "micro", state, *GREEDY)
    table = A.compare_lengths("", "micro-arc", state, *GREEDY)
    assert "ARC micro-arc, greedy" in table and "ARC micro-arc, beam 4" in table and "MDC N" not in table
    ar_decode = pytest.importorskip("mdc_core.ar_decode")
    arc = runs.get_run("micro-arc")
    out = ar_decode.ar_decode(arc.model, A._image_tokens(arc, state), "greedy")
    greedy = " ".join(arc.tokenizer.token_strings(out.tokens[0, : int(out.lengths[0])]))
    assert html.unescape(re.findall(r'data-caption="([^"]*)"', table)[0]) == greedy


def test_runs_under_root_are_found_and_loaded_once(app):
    choices = runs.run_choices(app["root"])
    labels = [label for label, _ in choices]
    steps = RunConfig().train.steps
    assert f"micro (mdc · {steps} steps)" in labels and f"micro-arc (arc · {steps} steps)" in labels
    assert "saved/run (mdc · 1 steps)" in labels  # a folder: the step of its latest checkpoint
    assert not any(label.startswith("data") for label in labels)
    key = dict(choices)["saved/run (mdc · 1 steps)"]
    first = runs.get_run(key)
    assert runs.get_run(key) is first and torch.equal(first.model.output_ids, app["model"].output_ids)
    with pytest.raises(gr.Error, match="unknown run"):
        runs.get_run("no-such-run")


def test_score_own_captions_ranked_as_the_scorer_says(app):
    scoring = pytest.importorskip("mdc_workbench.cli.scores")
    tok = CaptionTokenizer()
    ids = torch.tensor(sorted({*tok.encode_text("a red circle square"), 49407}))
    torch.manual_seed(0)
    cfg = RunConfig(model=micro_config(output_vocab="corpus", output_vocab_size=len(ids))).validate()
    run = runs.register_run("micro-corpus", Captioner(cfg.model, output_ids=ids).eval(), cfg)
    state = A.show_scene(0, "micro-corpus", None)[0]
    with pytest.raises(gr.Error, match="never saw in training: blue"):
        A.score_own("micro-corpus", state, "a blue circle", ["heuristic"], 8)
    with pytest.raises(gr.Error, match="type one or more captions"):
        A.score_own("micro-corpus", state, " \n ", ["heuristic"], 8)
    captions = ["a red circle", "circle red a", "a red square"]
    table, data = A.score_own("micro-corpus", state, "\n".join(captions), ["heuristic", "mc"], 8)
    direct = scoring.score_captions(run.model, A._image_tokens(run, state), captions, "heuristic")
    ranked = [r["caption"] for r in sorted(direct, key=lambda r: -r["score"])]
    rows = re.findall(r"<tr><td[^>]*>(\d+)</td><td[^>]*>([^<]*)</td><td[^>]*>([-\d.]+)</td>", table)
    assert rows == [(str(i + 1), c, f"{next(r['score'] for r in direct if r['caption'] == c):.3f}")
                    for i, c in enumerate(ranked)]
    assert "mc score" in table and table.count("&plusmn;") == 3  # Monte Carlo scores carry a standard error
    assert [(r["rank"], r["caption"]) for r in data["captions"]] == list(enumerate(ranked, 1))  # the same, as JSON
    assert data["ranked_by"] == "heuristic" and data["source"] == "scene 0"
    for row in data["captions"]:
        score = next(r for r in direct if r["caption"] == row["caption"])
        assert row["scores"]["heuristic"] == {k: score[k] for k in ("score", "token_logprobs", "order")}
        assert row["tokens"] == score["tokens"] and set(row["scores"]["mc"]) == {"score", "stderr"}
    with pytest.raises(gr.Error, match="needs a MDC model"):
        A.score_own("micro-arc", state, "a red circle", ["heuristic"], 8)


def test_loopback_by_default_and_no_analytics(app):
    from mdc_workbench.cli import build_parser
    args = build_parser().parse_args(["app"])
    assert (args.host, args.share, args.run) == ("127.0.0.1", False, None)  # None: serve() picks default_run()
    assert S.serve.__kwdefaults__["host"] == "127.0.0.1" and S.serve.__kwdefaults__["share"] is False
    assert app["demo"].analytics_enabled is False


def test_default_run_is_the_demo_plans_model_else_mdc_demos_else_the_shipped_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert S.default_run() == str(SHIPPED_DIR)  # nothing trained yet: the model shipped with the repository
    (tmp_path / S.DEFAULT_RUN).mkdir(parents=True)
    assert S.default_run() == S.DEFAULT_RUN  # `mdc demo` has run
    metrics = tmp_path / S.DEMO_METRICS
    metrics.parent.mkdir(parents=True)
    metrics.write_text('{"run_dir": "models/mdc-abc"}')
    assert S.default_run() == S.DEFAULT_RUN  # named but missing: not offered
    (tmp_path / "models" / "mdc-abc").mkdir(parents=True)
    assert S.default_run() == "models/mdc-abc"
    metrics.write_text("{not json")
    assert S.default_run() == S.DEFAULT_RUN


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_end_to_end_through_gradio_client(app, tmp_path):
    from gradio_client import Client, handle_file
    port = _free_port()
    demo = app["demo"]
    demo.queue().launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                        **S.LAUNCH_KW)
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        client.predict(3, "micro", api_name="/show_scene")
        chips, slider, _, summary, data = client.predict("micro", *GREEDY, api_name="/caption")
        state = A.show_scene(3, "micro", None)[0]
        _, expected = _expected_record(app["model"], state, SamplerConfig())
        assert [t for _, _, t in _chips(chips)] == expected["tokens"]
        shown = _chips(client.predict(0, api_name="/step"))
        assert {kind for _, kind, _ in shown} == {"masked"}
        assert [t for _, _, t in shown] == [m["top_token"] for m in expected["steps"][0]["masked"]]
        bad = tmp_path / "notes.png"
        bad.write_text("not an image")
        with pytest.raises(Exception, match="notes.png: not a readable image"):
            client.predict(handle_file(str(bad)), api_name="/upload")
    finally:
        demo.close()


@pytest.mark.slow
def test_screenshot_after_full_unmasking(app, tmp_path):
    from mdc_app.screenshot import find_chromium, screenshot
    if find_chromium() is None:
        pytest.skip("no chromium installed (apt-get install -y chromium)")
    out = screenshot(tmp_path / "shot.png", run=app["root"] / "saved" / "run", width=1100, height=1500)
    img = Image.open(out)
    assert img.size[0] >= 500 and len(set(img.convert("L").resize((64, 64)).getdata())) > 20  # not a blank page
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_run_menu_says_what_each_run_is(tmp_path):
    """A cached run's hashed folder is labelled with its objective, preset, steps and the notebook whose
    metrics.json names it (relative to the root or absolute; the first notebook in name order wins)."""
    model, cfg = _micro_run()
    cfg = dataclasses.replace(cfg, preset="tiny_lean")
    for name in ("mdc-0123456789", "mdc-aaaaaaaaaa", "mdc-bbbbbbbbbb"):
        save_checkpoint(tmp_path / "_models" / name, 7, cfg, model)
    metrics = {"01_pretraining": {"run_dir": "_models/mdc-0123456789"},
               "03_linear_probing": {"runs": {"MDC": str(tmp_path / "_models" / "mdc-0123456789"),
                                              "ARC": str(tmp_path / "_models" / "mdc-aaaaaaaaaa")}},
               "04_broken": None}
    for notebook, record in metrics.items():
        folder = tmp_path / "papermill_runs" / "plan" / notebook
        folder.mkdir(parents=True)
        text = "{not json" if record is None else json.dumps({"notebook": notebook, **record})
        (folder / "metrics.json").write_text(text)
    assert runs.describe_run("mdc", "", None, None) == "mdc"
    runs.register_run("bbb", model, cfg, folder=tmp_path / "_models" / "mdc-bbbbbbbbbb")
    labels = {key: label for label, key in runs.run_choices(tmp_path)}
    assert labels["_models/mdc-0123456789"] == ("_models/mdc-0123456789 (mdc · preset tiny_lean · 7 steps · "
                                                "notebook 01_pretraining)")
    assert labels["_models/mdc-aaaaaaaaaa"].endswith("(mdc · preset tiny_lean · 7 steps · notebook 03_linear_probing)")
    assert labels["bbb"] == f"bbb (mdc · preset tiny_lean · {cfg.train.steps} steps)"  # registered; no notebook


def test_trajectory_json_by_hand():
    """Position 0 fixed by a prompt; step 0 reveals "box" at 2, step 1 masks it again and reveals "red" at 1,
    step 2 reveals "dot" at 2: the canvases replay that (a replay that ignored remasking would show "a red box")."""
    tok = CaptionTokenizer()
    a, red, dot, box = (tok.encode_text(w)[0] for w in ("a", "red", "dot", "box"))
    rev = lambda p, w, i, c: {"position": p, "token": w, "token_id": i, "confidence": c, "attention": [[0.5]]}
    record = {"caption": "a red dot", "tokens": ["a", "red", "dot"], "token_ids": [a, red, dot], "fixed": [0],
              "settings": {"length": 3}, "latency_s": 0.01, "steps": [
                  {"step": 0, "revealed": [rev(2, "box", box, 0.4)], "remasked": [], "masked": []},
                  {"step": 1, "revealed": [rev(1, "red", red, 0.7)],
                   "remasked": [{"position": 2, "token": "box", "token_id": box}], "masked": []},
                  {"step": 2, "revealed": [rev(2, "dot", dot, 0.9)], "remasked": [], "masked": []}]}
    out = A.trajectory_json(record, tok)
    assert [s["canvas"] for s in out["steps"]] == [["a", "[MASK]", "box"], ["a", "red", "[MASK]"], ["a", "red", "dot"]]
    assert [s["text"] for s in out["steps"]] == ["a [MASK] box", "a red [MASK]", "a red dot"]
    assert out["steps"][1]["revealed"] == [{"position": 1, "token": "red", "confidence": 0.7}]  # no attention
    assert out["steps"][1]["remasked"] == [{"position": 2, "token": "box"}]
    assert out["caption"] == out["steps"][-1]["text"] and json.loads(json.dumps(out)) == out


def test_caption_json_is_the_pages_trajectory_as_plain_json(app, tmp_path):
    state = A.show_scene(4, "micro", None)[0]
    settings = _settings(length=9, tokens_per_step=2)
    record = A.run_caption("micro", state, *settings)[0]["record"]
    got = A.caption_json("micro", *settings, scene=4)
    assert got["run"] == "micro" and got["source"] == "scene 4" and got["tokens"] == record["tokens"]
    assert got["caption"] == record["caption"] == got["steps"][-1]["text"]
    assert [[(r["position"], r["token"], r["confidence"]) for r in s["revealed"]] for s in got["steps"]] == [
        [(r["position"], r["token"], r["confidence"]) for r in s["revealed"]] for s in record["steps"]]
    assert {tuple(r) for s in got["steps"] for r in s["revealed"]} == {("position", "token", "confidence")}
    state["image"].save(tmp_path / "scene4.png")  # the API's image arrives as a file, opened as an upload is
    assert A.caption_json("micro", *settings, image=str(tmp_path / "scene4.png"))["caption"] == got["caption"]
    fixed = A.caption_json("micro", *_settings(length=6), scene=4, prompt="a [MASK] square on the _")
    assert fixed["fixed"] == [0, 2, 3, 4] and fixed["steps"][0]["canvas"][2:5] == ["square", "on", "the"]
    with pytest.raises(gr.Error, match="give an image or a scene number"):
        A.caption_json("micro", *settings)
    with pytest.raises(gr.Error, match="autoregressive"):
        A.caption_json("micro-arc", *settings, scene=4)


def test_api_parameters_and_outputs_have_names(app):
    """Every public endpoint's parameters are named after its function's arguments (no ``param_3``) and every
    output after its component's label (no ``value_38``)."""
    info = app["demo"].get_api_info()["named_endpoints"]
    names = {e: [p["parameter_name"] for p in info[e]["parameters"]] for e in info}
    assert names["/caption"] == ["run", *A.SAMPLER_FIELDS]
    assert names["/caption_json"] == ["run", *A.SAMPLER_FIELDS, "image", "scene", "prompt"]
    assert names["/show_scene"] == ["scene", "run"] and names["/compare"][:2] == ["run", "arc_run"]
    assert not [(e, n) for e, ns in names.items() for n in ns if n.startswith("param_")]
    assert not [(e, r["label"]) for e, v in info.items() for r in v["returns"] if r["label"].startswith("value_")]
    assert [r["label"] for r in info["/caption_json"]["returns"]] == ["caption and trajectory"]


def test_console_points_to_the_clis_share_flag():
    text = S.console_text("http://127.0.0.1:7860/", share=False)
    assert "`mdc app --share`" in text and "share=True" not in text
    assert "http://127.0.0.1:7860/?view=api" in text
    assert "--share" not in S.console_text("http://127.0.0.1:7860/", share=True)
