"""The app's page: :func:`build_app` turns already loaded models into a ``gr.Blocks`` (inputs on the left, the
unmasking, compare and score tabs beside them, the hidden ``/caption_json`` API endpoint) and wires each control
to its callback in :mod:`mdc_app.callbacks`. :func:`mdc_app.launch.serve` (``mdc app --run RUN``) serves it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gradio as gr
import torch
from gradio.data_classes import GradioModel, ImageData
from gradio_client.utils import is_file_obj_with_meta, is_http_url_like
from pydantic import create_model, model_validator
from pydantic.json_schema import SkipJsonSchema

from mdc_core.config import RunConfig, SamplerConfig

from . import explore
from .callbacks import (
    DELETE_CACHE,
    INITIAL_SCENE,
    PLAY_INTERVAL_S,
    PRIVATE,
    SAMPLER_FIELDS,
    SAMPLER_MAIN,
    SCORE_LABELS,
    SCORE_METHODS,
    UPLOAD_TYPES,
    caption_json,
    compare_lengths,
    empty_upload,
    enable_unmask,
    hide_download,
    length_shown,
    load_upload,
    new_scene,
    on_run_change,
    play_tick,
    replay_on_page,
    rescan_runs,
    restore_after_failed_upload,
    run_caption,
    sampler_inputs,
    score_own,
    show_scene,
    show_step,
    shown_download,
    start_play,
)
from .runs import LoadedRun, get_run, refuse, register_run, run_choices

UPLOAD_HEIGHT = 150  # px of the upload and replay boxes: room for their label and "Click to Upload"
PAGE_CSS = """
#run-menu input { text-overflow: ellipsis; padding-right: 1.6em; }  /* a long run name ends before the arrow */
"""  # passed to launch() (gradio 6 takes the page's CSS there): mdc_app.launch.LAUNCH_KW


def _mark_non_files(cls: type, value: Any) -> Any:
    """`value` when it is a file (gradio's own, or what a client sends: a dict with gradio's file ``meta``), else a
    marked file payload (FileData requires a path and that meta)."""
    if isinstance(value, GradioModel) or is_file_obj_with_meta(value):
        return value
    return {"path": "", "not_a_file": type(value).__name__, "meta": {"_type": "gradio.FileData"}}


def _uploads_only(component: gr.components.Component, preprocess: Callable[[Any], Any] | None = None
                  ) -> gr.components.Component:
    """`component` (a file input: the upload box, the replay box, ``/caption_json``'s image) refusing in one line
    a payload that is no uploaded file (a path string, a number, a URL), which gradio's own validation turns into its
    generic "upstream Gradio app has raised an exception" and a traceback in the server log: its data model lets
    such a payload through, marked, and `preprocess` (default: the component's own) is reached only by files.
    (An error raised inside the pydantic validator would be wrapped: gr.Error is a ValueError.) Set on the instance,
    not by subclassing: gradio writes a ``.pyi`` stub beside the module of every component subclass."""
    model = component.data_model
    component.data_model = create_model(  # the field is left out of the API's schema
        f"Uploaded{model.__name__}", __base__=model, not_a_file=(SkipJsonSchema[str | None], None),
        __validators__={"mark": model_validator(mode="before")(classmethod(_mark_non_files))})
    inner = preprocess or component.preprocess

    def checked(payload: Any) -> Any:
        if payload is not None and payload.not_a_file:
            raise refuse(f"{component.label}: expected an uploaded file (gradio_client.handle_file(PATH)), got a "
                         f"{payload.not_a_file}")
        return inner(payload)

    component.preprocess = checked
    fetch = component.async_move_resource_to_block_cache

    async def no_download(path: str | Path | None) -> str | None:  # gradio would download a URL given as the file
        if path is not None and is_http_url_like(str(path)):
            raise refuse(f"{component.label}: a URL is not an uploaded file; the app downloads nothing (send the "
                         "file itself: gradio_client.handle_file(PATH))")
        return await fetch(path)

    component.async_move_resource_to_block_cache = no_download
    return component


def _image_path(payload: ImageData | None) -> str | None:
    """The preprocessing of the ``/caption_json`` image: the uploaded file's path, undecoded (gradio's decoding has
    no size limit and saturates 16-bit images), for :func:`mdc_app.callbacks.open_upload` to open with the upload
    box's checks."""
    if payload is None:
        return None
    if payload.path is None:
        raise refuse("image: send the image as a file (gradio_client.handle_file(PATH)), not as a data URL")
    return payload.path


def _sampler_inputs(defaults: SamplerConfig, max_length: int) -> list[gr.components.Component]:
    """One control per sampler option (:func:`~mdc_app.callbacks.sampler_inputs`): a slider over its declared range
    (N' and k at most `max_length`, the model's caption length), a number box where it declares none."""
    inputs: list[gr.components.Component] = []
    for opt in sampler_inputs():
        value = getattr(defaults, opt.name)
        if opt.range is None:
            inputs.append(gr.Number(value=value, precision=0 if opt.type is int else None, label=opt.label,
                                    render=False, elem_id=f"sampler-{opt.name}"))
            continue
        lo, hi = opt.range
        hi = min(hi, max_length) if opt.name in SAMPLER_MAIN else hi
        inputs.append(gr.Slider(lo, hi, value=min(value, hi), step=1 if opt.type is int else 0.05, label=opt.label,
                                render=False, elem_id=f"sampler-{opt.name}"))
    return inputs


def _initial_view(run_key: str, scene: int, cfg: SamplerConfig) -> dict[str, Any]:
    """What the page shows when it opens: `scene` captioned by the default run, unmasked to the last step."""
    if get_run(run_key).is_arc:
        return {}
    state, image, info = show_scene(scene, run_key, None)
    state, chips, _, fig, summary, _ = run_caption(run_key, state, *(getattr(cfg, f) for f in SAMPLER_FIELDS))
    steps = len(state["record"]["steps"])
    attention, label = explore.attention_view(steps, explore.LAST, explore.MEAN, state)
    return {"state": state, "image": image, "info": info, "chips": chips, "heatmap": fig, "summary": summary,
            "steps": steps, "attention": attention, "attention_label": label}


def build_app(models: Mapping[str, tuple[torch.nn.Module, RunConfig]], *, root: str | Path | None = None,
              default: str | None = None, initial_scene: int = INITIAL_SCENE) -> gr.Blocks:
    """The app's Blocks from loaded models ``{name or run folder: (model, cfg)}`` (or ``(model, cfg, folder)``: the
    folder a named model was loaded from); run folders under `root` are offered too (loaded on first use).
    `default` names the run selected at start (the first model if None)."""
    default, choices, arc_choices = _register_models(models, root, default)
    first = get_run(default)
    defaults = dataclasses.replace(first.cfg.sampler) if not first.is_arc else SamplerConfig()
    init = _initial_view(default, initial_scene, defaults)
    with gr.Blocks(title="MDC: watch a caption being unmasked", delete_cache=DELETE_CACHE) as demo:
        ui = SimpleNamespace(state=gr.State(init.get("state")),  # per user: {"image", "source", "record", "run"}
                             root_state=gr.State(str(root) if root else None))
        gr.Markdown("## Masked diffusion captioning: watch a caption being unmasked\nThe decoder starts from "
                    "`[MASK] x N'` and, at every step, reveals the masked position it is most confident about.")
        with gr.Row(equal_height=False):  # inputs on the left, the unmasking beside them: both on the first screen
            with gr.Column(scale=2, min_width=330):
                _input_panel(ui, init, choices, default, defaults, first.cfg.model.context_length - 2,
                             initial_scene)
            with gr.Column(scale=5), gr.Tabs():
                _unmasking_tab(ui, init, first, defaults.length)
                _compare_tab(ui, arc_choices)
                _score_tab(ui)
        _api_only(ui)
        _wire_events(ui)
    for block in demo.blocks.values():
        if isinstance(block, gr.components.Component):
            block.preprocess = _quietly(block.preprocess)
    return demo


def _quietly(preprocess: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A component's `preprocess` whose refusals (gradio's own checks: a slider value out of range, a run not in
    the menu) keep their one-line message but leave no traceback in the server log, as the app's own do
    (:func:`~mdc_app.runs.refuse`). Set on the instance, as in :func:`_uploads_only`."""
    def checked(payload: Any) -> Any:
        try:
            return preprocess(payload)
        except gr.Error as err:
            if not err.print_exception:
                raise
            raise refuse(err.message) from None

    return checked


def _register_models(models: Mapping[str, tuple[Any, ...]], root: str | Path | None,
                     default: str | None) -> tuple[str, list[tuple[str, str]], list[tuple[str, str]]]:
    """Register the loaded models in the run cache; (the run selected at start, the run menu's choices: MDC runs,
    or every run when there is none or an ARC run is the default, the ARC menu's choices)."""
    shown = {}
    for key, (model, cfg, *folder) in models.items():  # a run folder is named relative to the root (or cwd)
        shown[key] = os.path.relpath(key, Path(root or os.getcwd()).resolve()) if Path(key).is_absolute() else key
        register_run(shown[key], model, cfg, folder=folder[0] if folder else key if Path(key).is_dir() else None)
    default = shown.get(default, default) if default else None
    every = run_choices(root)
    if not every:
        raise ValueError("the app needs at least one run: pass a loaded model or a root with run folders")
    default = default or (next(iter(models)) if models else every[0][1])
    choices = run_choices(root, arc=False)
    if default not in {key for _, key in choices}:
        choices = every
    return default, choices, run_choices(root, arc=True)


def _input_panel(ui: SimpleNamespace, init: dict[str, Any], choices: list[tuple[str, str]], default: str,
                 defaults: SamplerConfig, max_length: int, initial_scene: int) -> None:
    """The left column: the run, the image (scene or upload), the unmask button and prompt, the caption length
    and tokens per step; the other sampler settings in a closed accordion, the upload box last."""
    with gr.Row():
        ui.run = gr.Dropdown(choices, value=default, label="trained run", scale=4, elem_id="run-menu")
        ui.rescan_btn = gr.Button("rescan", scale=1, size="sm", min_width=60)
    ui.image = gr.Image(init.get("image"), label="image", type="pil", interactive=False, height=220, elem_id="image")
    ui.image_info = gr.Markdown(init.get("info", ""), label="image info", elem_id="image-info")
    with gr.Row():
        ui.scene_btn = gr.Button("new random scene", size="sm")
        ui.scene_index = gr.Number(value=initial_scene, precision=0, minimum=0, label="scene #", min_width=90)
    ui.caption_btn = gr.Button("unmask", variant="primary", interactive=init.get("image") is not None,
                               elem_id="unmask")
    ui.prompt = gr.Textbox(label="fix some words (optional): [MASK] or _ marks a word to generate; the prompt sets "
                           "N'", placeholder="a [MASK] square on the _", max_lines=1, elem_id="prompt")
    sliders = _sampler_inputs(defaults, max_length)
    main = len(SAMPLER_MAIN)
    for slider in sliders[:main]:
        slider.render()
    more = [opt.name.replace("_", " ") for opt in sampler_inputs()[main:]]
    with gr.Accordion(f"more sampler settings: {', '.join(more)}", open=False):
        for slider in sliders[main:]:
            slider.render()
    ui.settings = sliders
    ui.upload = _uploads_only(gr.File(label="or upload an image (PNG, JPEG, WebP)", file_types=list(UPLOAD_TYPES),
                                      type="filepath", height=UPLOAD_HEIGHT, elem_id="upload"))


def _unmasking_tab(ui: SimpleNamespace, init: dict[str, Any], first: LoadedRun, length: int) -> None:
    """The step slider and player, the token chips, the attention map, the confidence heatmap, GIF and JSON."""
    with gr.Tab("Step-by-step unmasking"):
        ui.summary = gr.Markdown(init.get("summary", ""), label="summary", elem_id="summary")
        with gr.Row():
            ui.play_btn = gr.Button("\u25b6 play", scale=1, min_width=90, elem_id="play")
            n_steps = init.get("steps", length)
            ui.step = gr.Slider(0, n_steps, value=n_steps, step=1, label="step", scale=8, elem_id="step")
        layers, heads = explore.layer_choices(first) if not first.is_arc else ([explore.LAST], [explore.MEAN])
        with gr.Row():
            ui.chips = gr.HTML(init.get("chips", ""), label="canvas", show_label=False, elem_id="chips")
            with gr.Column(scale=0, min_width=270):
                ui.att_image = gr.Image(init.get("attention"), label="attention", type="pil",
                                        interactive=False, height=256, width=256)
                ui.att_label = gr.HTML(init.get("attention_label", ""), label="attention info", show_label=False)
                with gr.Row():
                    ui.layer = gr.Dropdown(layers, value=explore.LAST, label="layer", min_width=80)
                    ui.head = gr.Dropdown(heads, value=explore.MEAN, label="head", min_width=80)
        ui.heatmap = gr.Plot(init.get("heatmap"), label="confidence heatmap: steps x positions", show_label=False)
        with gr.Row(equal_height=False):
            with gr.Column():
                with gr.Row():
                    ui.gif_btn = gr.Button("GIF of this unmasking", size="sm")
                    ui.json_btn = gr.Button("save trajectory (JSON)", size="sm")
                ui.download = gr.File(label="download", interactive=False, visible="hidden",  # shown with a file
                                      elem_id="download")
            ui.replay = _uploads_only(gr.File(label="replay a saved trajectory (JSON)", file_types=[".json"],
                                              type="filepath", height=UPLOAD_HEIGHT, elem_id="replay"))
        ui.timer = gr.Timer(PLAY_INTERVAL_S, active=False)


def _compare_tab(ui: SimpleNamespace, arc_choices: list[tuple[str, str]]) -> None:
    with gr.Tab("Compare"):
        ui.arc = gr.Dropdown([("(none)", "")] + arc_choices, value="", label="ARC run (optional: ARC runs only)",
                             elem_id="arc-menu")
        ui.compare_btn = gr.Button("compare N' = 10 / 15 / 20")
        ui.compare_out = gr.HTML(label="captions compared", show_label=False, elem_id="compare-out")


def _score_tab(ui: SimpleNamespace) -> None:
    with gr.Tab("Score your own captions"):
        ui.typed = gr.Textbox(lines=4, label="captions, one per line", elem_id="typed",
                              placeholder="a small red circle in the top left\na big blue square")
        with gr.Row():
            ui.methods = gr.CheckboxGroup([(SCORE_LABELS[m], m) for m in SCORE_METHODS], value=["heuristic"],
                                          label="scores (log-likelihoods; the first checked ranks)", elem_id="methods")
            ui.mc_samples = gr.Slider(4, 256, value=32, step=4, label="Monte Carlo samples (mc only)")
        ui.score_btn = gr.Button("score")
        ui.score_out = gr.HTML(label="scores", show_label=False, elem_id="score-out")


def _api_only(ui: SimpleNamespace) -> None:
    """Hidden inputs and output of the ``/caption_json`` API endpoint (a script's image, scene number and prompt;
    the JSON answer): components, so that gradio checks and converts what a client sends; and the JSON outputs
    that ``/caption`` and ``/score`` add to what the page shows."""
    with gr.Column(visible=False):
        ui.api_image = _uploads_only(gr.Image(label="image", type="filepath"), _image_path)
        ui.api_scene = gr.Number(label="scene", precision=0, minimum=0)
        ui.api_prompt = gr.Textbox(label="prompt", value="")
        ui.api_json = gr.JSON(label="caption and trajectory")
        ui.api_btn = gr.Button("caption_json")
        ui.caption_data = gr.JSON(label="caption data")  # /caption's data as JSON (its last output)
        ui.score_data = gr.JSON(label="score data")  # /score's data as JSON (its last output)


def _wire_events(ui: SimpleNamespace) -> None:
    """Connect every control to its callback (:mod:`mdc_app.callbacks` and :mod:`mdc_app.explore`)."""
    cap_in = [ui.run, ui.state, *ui.settings]
    cap_out = [ui.state, ui.chips, ui.step, ui.heatmap, ui.summary, ui.caption_data]
    img_out = [ui.state, ui.image, ui.image_info]
    att_in, att_out = [ui.step, ui.layer, ui.head, ui.state], [ui.att_image, ui.att_label]

    def after_caption(event: Any) -> Any:
        """After every caption: the attention of the step shown, the length slider at the caption's N' (a prompt
        sets it), and no download of the previous trajectory."""
        event.success(explore.attention_view, att_in, att_out, api_visibility=PRIVATE)
        event.success(length_shown, [ui.state], [ui.settings[0]], api_visibility=PRIVATE)
        event.success(hide_download, None, [ui.download], api_visibility=PRIVATE)
        return event

    def captioned(event: Any) -> Any:
        return after_caption(event.success(run_caption, cap_in, cap_out, api_visibility=PRIVATE))

    scene = ui.scene_btn.click(new_scene, [ui.run, ui.state], [ui.scene_index, *img_out], api_name="new_scene")
    numbered = ui.scene_index.submit(show_scene, [ui.scene_index, ui.run, ui.state], img_out, api_name="show_scene")
    uploaded = ui.upload.upload(load_upload, [ui.upload, ui.state], img_out, api_name="upload")
    for new_image in (scene, numbered, uploaded):
        new_image.success(enable_unmask, None, [ui.caption_btn], api_visibility=PRIVATE)
        captioned(new_image)
    uploaded.success(empty_upload, None, [ui.upload], api_visibility=PRIVATE)
    uploaded.failure(restore_after_failed_upload, [ui.state],  # a refused file: the page as it was
                     [ui.image, ui.image_info, ui.caption_btn, ui.upload, ui.prompt], api_visibility=PRIVATE)
    for new_image in (ui.scene_btn.click, ui.scene_index.submit, ui.upload.upload):  # the prompt went with the image
        new_image(explore.clear_prompt, None, [ui.prompt], api_visibility=PRIVATE)
    after_caption(ui.caption_btn.click(explore.set_prompt, [ui.prompt, ui.state], [ui.state],
                                       api_visibility=PRIVATE).success(run_caption, cap_in, cap_out,
                                                                       api_name="caption"))
    captioned(ui.prompt.submit(explore.set_prompt, [ui.prompt, ui.state], [ui.state], api_visibility=PRIVATE))
    captioned(ui.run.change(on_run_change, [ui.run], [ui.settings[0]], api_visibility=PRIVATE))
    ui.run.change(explore.reload_run, [ui.run], [ui.layer, ui.head], api_visibility=PRIVATE)
    ui.rescan_btn.click(rescan_runs, [ui.root_state, ui.run, ui.arc], [ui.run, ui.arc], api_visibility=PRIVATE)
    ui.api_btn.click(caption_json, [ui.run, *ui.settings, ui.api_image, ui.api_scene, ui.api_prompt], [ui.api_json],
                     api_name="caption_json")
    ui.step.change(show_step, [ui.step, ui.state], [ui.chips], api_name="step", show_progress="hidden")
    ui.step.change(explore.attention_view, att_in, att_out, api_visibility=PRIVATE, show_progress="hidden")
    ui.layer.change(explore.attention_view, att_in, att_out, api_visibility=PRIVATE)
    ui.head.change(explore.attention_view, att_in, att_out, api_visibility=PRIVATE)
    ui.gif_btn.click(shown_download(explore.save_gif), [ui.state, ui.layer, ui.head], [ui.download], api_name="gif")
    ui.json_btn.click(shown_download(explore.save_json), [ui.state], [ui.download], api_name="save_json")
    after_caption(ui.replay.upload(replay_on_page, [ui.replay, ui.state],
                                   [ui.state, ui.image, ui.image_info, ui.chips, ui.step, ui.heatmap, ui.summary,
                                    ui.prompt], api_name="replay"))
    ui.play_btn.click(start_play, [ui.state], [ui.step, ui.timer], api_visibility=PRIVATE)
    ui.timer.tick(play_tick, [ui.step, ui.state], [ui.step, ui.timer], api_visibility=PRIVATE, show_progress="hidden")
    ui.compare_btn.click(compare_lengths, [ui.run, ui.arc, ui.state, *ui.settings], [ui.compare_out],
                         api_name="compare")
    ui.score_btn.click(score_own, [ui.run, ui.state, ui.typed, ui.methods, ui.mc_samples],
                       [ui.score_out, ui.score_data], api_name="score")
