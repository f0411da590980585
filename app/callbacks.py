"""The app's callbacks: what happens when a control of the page is used (a scene, an upload, unmask, a step,
compare, score), each a named module-level function of plain values, so tests call them without a server.

:func:`mdc_app.layout.build_app` lays the page out and wires its controls to these functions;
:func:`mdc_app.launch.serve` (the CLI verb ``mdc app --run RUN``) loads a run and launches it on 127.0.0.1.
Per-user data (the image and the last trajectory) lives in a ``gr.State`` dict; models live in a process-wide
cache keyed by run folder.
The trajectory's chips and heatmap are :mod:`mdc_workbench.viz.trajectory_view`'s (the notebooks draw with it
too), the other rendering (captions, tables) is in :mod:`mdc_app.render`, the model cache in :mod:`mdc_app.runs`.
"""

from __future__ import annotations

import dataclasses
import functools
import html
import inspect
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gradio as gr
import torch
from PIL import Image

from mdc_core import config
from mdc_core.ar_decode import ar_decode
from mdc_core.config import SamplerConfig
from mdc_core.tokenizer import MASK_ID, CaptionTokenizer, shown
from mdc_core.transforms import eval_transform, open_image
from mdc_workbench.cli import scores as scoring
from mdc_workbench.data import make_example
from mdc_workbench.viz import trajectory_view
from mdc_workbench.viz.animation import trajectory

from . import explore, render
from .runs import LoadedRun, get_run, refuse, run_choices, step_number, uploaded_path, user_errors

SCENE_SEED, SCENE_SPLIT, INITIAL_SCENE = 0, "test", 3  # data seed (when the run's is unknown), held-out split
COMPARE_LENGTHS = (10, 15, 20)
UPLOAD_TYPES = (".png", ".jpg", ".jpeg", ".webp")
MAX_UPLOAD_BYTES = 25 * 2**20
PLAY_INTERVAL_S = 0.45  # seconds per step of the animation
PRIVATE = "private"  # api_visibility of the callbacks that are no API endpoint (chained steps, timers, menus)
DELETE_CACHE = (3600, 3600)  # gradio deletes its copies of uploads and downloads hourly, and all when it stops
MAX_SCORED = 20  # captions per scoring request
SCORE_METHODS = ["heuristic", "mc", "ar"]  # mdc_core.scoring.METHODS: greedy-order path, Monte Carlo ELBO, chain rule
SCORE_LABELS = {"heuristic": "heuristic: the greedy-order path (Sec. 4.2)",  # what the page's check boxes say
                "mc": "mc: Monte Carlo ELBO (Eq. 8, a lower bound)",
                "ar": "ar: chain rule (exact for ARC runs, Eq. 7)"}
SAMPLER_MAIN = ("length", "tokens_per_step")  # the first sampler inputs, shown; the others sit in an accordion


def sampler_inputs() -> tuple[config.Option, ...]:
    """The sampler options in the order of the page's controls and the callbacks' parameters: those with a range
    (sliders) in declaration order, then the others (number boxes: the seed). Generated from
    :func:`mdc_core.config.sampler_options`, so a new option needs no change here."""
    declared = config.sampler_options()
    return tuple(o for o in declared if o.range is not None) + tuple(o for o in declared if o.range is None)


SAMPLER_FIELDS = tuple(o.name for o in sampler_inputs())  # the callbacks' sampler parameters (the API's names)


# ------------------------------------------------------------------------------------------------------------
# images


def _display(img: Image.Image) -> Image.Image:
    """A copy sized for the page: small scenes upscaled with crisp pixels, big uploads shrunk."""
    if max(img.size) < 256:
        scale = 256 // max(img.size) or 1
        return img.resize((img.width * scale, img.height * scale), Image.Resampling.NEAREST)
    out = img.copy()
    out.thumbnail((512, 512))
    return out


def show_scene(scene: float | None, run: str, state: dict | None) -> tuple[dict, Image.Image, str]:
    """Scene number `scene` of the embedded generator's held-out split, drawn with the settings of the training
    data of `run` (difficulty, seed, caption style; the default ones when unknown) at its image size. A new image
    drops the prompt's fixed words (they described the previous one)."""
    if isinstance(scene, bool) or not isinstance(scene, (int, float)) or not 0 <= scene < 2**31 or scene != int(scene):
        raise refuse(f"scene number must be a whole number >= 0, got {str(scene)[:40]!r}")
    index, loaded = int(scene), get_run(run)
    data = loaded.scenes  # the scenes this run was trained on (its data's difficulty, seed and caption style)
    ex = make_example(data.get("seed", SCENE_SEED), SCENE_SPLIT, index, image_size=loaded.cfg.model.image_size,
                      captions=data.get("captions", "mixed"), difficulty=data.get("difficulty", "paper"))
    img = open_image(ex["jpg"], f"scene {index}")
    info = (f"**scene #{index}** ({SCENE_SPLIT} split, {img.width} px) &middot; reference: "
            f"*{html.escape(ex['txt'])}*")
    new = {**(state or {}), "image": img, "source": f"scene {index}", "record": None, "prompt": ""}
    return new, _display(img), info


def new_scene(run: str, state: dict | None) -> tuple[int, dict, Image.Image, str]:
    """A random scene (the scene number is shown so it can be reproduced)."""
    index = random.randrange(100_000)
    return (index, *show_scene(index, run, state))


def open_upload(path: str | None) -> Image.Image:
    """The image file `path` that a user or a script sent, opened the one way every entry point opens an image
    (the upload box, ``/upload``, ``/caption_json``; ``/replay``'s embedded image goes through the same
    :func:`~mdc_core.transforms.open_image`): the file size first, then ``open_image``'s checks (empty, not an
    image, over 10,000 px per side or a decompression bomb, refused before decoding; 16-bit and float images scaled
    to 8 bits, not saturated). Each refusal is one line naming the file (:func:`~mdc_app.runs.refuse`)."""
    path = uploaded_path(path)
    name = Path(path).name
    size = os.path.getsize(path)
    if size > MAX_UPLOAD_BYTES:
        raise refuse(f"{name}: file of {size / 2**20:.1f} MB is too large (limit {MAX_UPLOAD_BYTES // 2**20} MB)")
    with user_errors():
        return open_image(Path(path).read_bytes(), name)


def load_upload(image: str | None, state: dict | None) -> tuple[dict, Image.Image, str]:
    """An uploaded file, opened by :func:`open_upload`; the prompt is dropped as for a new scene."""
    img, name = open_upload(image), Path(image or "").name
    info = f"**{html.escape(name)}** &middot; {img.width} x {img.height} px (uploaded)"
    return {**(state or {}), "image": img, "source": name, "record": None, "prompt": ""}, _display(img), info


def restore_after_failed_upload(state: dict | None) -> tuple[Any, str, Any, None, str]:
    """The page after an upload was refused (its one-line message is the error's toast): the image, info and prompt
    of what the state still holds (the last good image; none: unmask disabled), the upload box emptied."""
    state = state or {}
    image = state.get("image")
    if image is None:
        return None, "no image: pick a scene or upload another file", gr.Button(interactive=False), None, ""
    info = f"the upload was refused; still showing **{html.escape(str(state.get('source') or 'the last image'))}**"
    return _display(image), info, gr.Button(interactive=True), None, state.get("prompt") or ""


def empty_upload() -> None:
    """The upload box emptied once its image is shown in the image box: ready for the next file."""
    return None


def enable_unmask() -> Any:
    """The unmask button, usable again once an image is shown."""
    return gr.Button(interactive=True)


def replay_on_page(path: str | None, state: dict | None) -> tuple[Any, ...]:
    """:func:`mdc_app.explore.load_replay` with the replayed image drawn as a scene is (small images upscaled)."""
    state, image, *rest = explore.load_replay(path, state)
    return (state, None if image is None else _display(image), *rest)


def _image_tokens(run: LoadedRun, state: dict | None) -> torch.Tensor:
    if not state or state.get("image") is None:
        raise refuse("pick an image first: a random scene or an upload")
    pixels = eval_transform(run.cfg.model.image_size)(state["image"])[None]  # (1, 3, S, S)
    with torch.no_grad():
        return run.model.encode_image(pixels)  # (1, M, D)


# ------------------------------------------------------------------------------------------------------------
# unmasking


def sampler_config(*values: Any) -> SamplerConfig:
    """A validated SamplerConfig from the control values, in the order of :func:`sampler_inputs`."""
    kw = {o.name: o.type(v) for o, v in zip(sampler_inputs(), values, strict=True) if v is not None}
    cfg = config.SamplerConfig(**kw)
    with user_errors():
        cfg.validate()
    return cfg


def takes_sampler_settings(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, whose parameter ``sampler`` takes a SamplerConfig, as the page and the API call it: one parameter per
    sampler option in its place (:func:`sampler_inputs`, named as the fields), turned into a validated config by
    :func:`sampler_config`. Gradio names an endpoint's parameters from this signature."""
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())
    at = [p.name for p in params].index("sampler")
    settings = [inspect.Parameter(o.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=o.type.__name__)
                for o in sampler_inputs()]
    exposed = signature.replace(parameters=[*params[:at], *settings, *params[at + 1:]])

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        bound = exposed.bind(*args, **kwargs)
        values = dict(bound.arguments)
        sampler = sampler_config(*(values.pop(p.name) for p in settings))
        return fn(**values, sampler=sampler)

    call.__signature__ = exposed  # type: ignore[attr-defined]
    call.__annotations__ = {**{p.name: p.annotation for p in exposed.parameters.values()},
                            "return": signature.return_annotation}
    return call


def _unmask(run: LoadedRun, image_tokens: torch.Tensor, cfg: SamplerConfig, prompt: torch.Tensor | None = None
            ) -> dict[str, Any]:
    if run.is_arc:
        raise refuse(f"{run.label} is an autoregressive (ARC) model: it writes left to right, so there is no "
                       "unmasking to watch. Pick it as the ARC run in the Compare tab.")
    out, latency = explore.timed_sample(run, image_tokens, cfg, prompt)  # with attention, for the overlay
    record = trajectory(out, run.tokenizer)
    record["latency_s"] = latency
    return record


@takes_sampler_settings
def run_caption(run: str, state: dict | None, sampler: SamplerConfig
                ) -> tuple[dict, str, Any, Any, str, dict[str, Any]]:
    """Caption the current image; show the final canvas, the step slider at its end, the heatmap, a summary, and
    return the same data as JSON for scripts (``/caption``'s last output: what ``/caption_json`` answers).
    The parameters after `state` are :data:`SAMPLER_FIELDS` (their names are the ``/caption`` API's)."""
    run_key, run, cfg = run, get_run(run), sampler
    start = time.perf_counter()
    image_tokens = _image_tokens(run, state)
    record = _unmask(run, image_tokens, cfg, explore.prompt_ids(run, state))
    record["prompt"] = state.get("prompt") or None
    total = time.perf_counter() - start
    n_steps = len(record["steps"])
    summary = (f"**{html.escape(record['caption'])}** &nbsp; &middot; {run.label}: N' = {len(record['tokens'])}, "
               f"{n_steps} steps of k = {cfg.tokens_per_step}{explore.unmask_prompt_summary(record)} &middot; "
               f"sampling {record['latency_s'] * 1000:.0f} ms, with image encoding {total * 1000:.0f} ms (CPU)")
    state = {**state, "record": record, "run": run_key}
    data = {"run": run_key, "source": state.get("source"), **trajectory_json(record, run.tokenizer)}
    return (state, trajectory_view.chips_html(record, n_steps),
            gr.Slider(minimum=0, maximum=n_steps, value=n_steps, step=1), trajectory_view.heatmap_figure(record),
            summary, data)


def show_step(step: float | None, state: dict | None) -> str:
    """The canvas after `step` steps of the last trajectory."""
    record = (state or {}).get("record")
    if record is None:
        return ""
    return trajectory_view.chips_html(record, min(max(step_number(step), 0), len(record["steps"])))


def trajectory_json(record: dict[str, Any], tokenizer: CaptionTokenizer) -> dict[str, Any]:
    """A :func:`~mdc_workbench.viz.animation.trajectory` record as plain JSON for scripts (the ``/caption_json``
    API): the caption, its tokens, the sampler settings, and per step the tokens it revealed with their confidences
    (most confident first), the tokens it masked again (remasking) and the canvas after it (``[MASK]`` where
    masked) with its text; the last step's text is the caption. Attention weights and top guesses are left out."""
    ids = [MASK_ID] * len(record["token_ids"])
    for p in record["fixed"]:
        ids[p] = record["token_ids"][p]
    steps = []
    for step in record["steps"]:
        for r in step["remasked"]:
            ids[r["position"]] = MASK_ID
        for r in step["revealed"]:
            ids[r["position"]] = r["token_id"]
        steps.append({"step": step["step"],
                      "revealed": [{k: r[k] for k in ("position", "token", "confidence")} for r in step["revealed"]],
                      "remasked": [{k: r[k] for k in ("position", "token")} for r in step["remasked"]],
                      "canvas": tokenizer.token_strings(ids), "text": tokenizer.decode(ids)})
    return {"caption": record["caption"], "tokens": record["tokens"], "fixed": record["fixed"],
            "settings": record["settings"], "latency_s": record.get("latency_s"), "steps": steps}


@takes_sampler_settings
def caption_json(run: str, sampler: SamplerConfig, image: str | None = None, scene: float | None = None,
                 prompt: str | None = "") -> dict[str, Any]:
    """Caption the image file `image` (opened by :func:`open_upload`, as an upload is; else scene number `scene` of
    the held-out split) with `run` and return the caption and its trajectory as JSON (:func:`trajectory_json`, plus
    ``run`` and ``source``). `prompt` fixes words as the "fix some words" box does. This is the ``/caption_json``
    API endpoint; the page never calls it."""
    if image:
        state = {"image": open_upload(image), "source": "image"}
    elif scene is not None:
        state = show_scene(scene, run, None)[0]
    else:
        raise refuse("give an image or a scene number")
    state["prompt"] = (prompt or "").strip()
    loaded = get_run(run)
    record = _unmask(loaded, _image_tokens(loaded, state), sampler, explore.prompt_ids(loaded, state))
    return {"run": run, "source": state["source"], **trajectory_json(record, loaded.tokenizer)}


def start_play(state: dict | None) -> tuple[Any, Any]:
    """Rewind to step 0 and start the animation timer."""
    if not (state or {}).get("record"):
        raise refuse("caption an image first")
    return gr.Slider(value=0), gr.Timer(active=True)


def play_tick(step: float | None, state: dict | None) -> tuple[Any, Any]:
    """One animation frame: advance the step slider; stop the timer at the last step."""
    record = (state or {}).get("record")
    if record is None:
        return gr.Slider(), gr.Timer(active=False)
    nxt = min(step_number(step) + 1, len(record["steps"]))
    return gr.Slider(value=nxt), gr.Timer(active=nxt < len(record["steps"]))


def length_shown(state: dict | None) -> Any:
    """The caption length slider at the N' of the last caption (a prompt sets N' to its word count)."""
    record = (state or {}).get("record")
    return gr.Slider(value=len(record["tokens"])) if record else gr.skip()


def shown_download(save: Callable[..., str]) -> Callable[..., Any]:
    """`save` (:func:`mdc_app.explore.save_gif` or ``save_json``: a file's path) for the page: the download box
    shown with the file, in one update."""
    @functools.wraps(save)
    def shown(*args: Any) -> Any:
        return gr.File(value=save(*args), visible=True)

    return shown


def hide_download() -> Any:
    """The download box emptied and hidden: a new caption makes the last download stale. ("hidden", not False:
    a box taken out of the page came back empty when shown with a file.)"""
    return gr.File(value=None, visible="hidden")


def on_run_change(run_key: str) -> Any:
    """Fit the length slider to the chosen model's context."""
    run = get_run(run_key)
    hi = next(o for o in sampler_inputs() if o.name == "length").range[1]
    return gr.Slider(maximum=min(hi, run.cfg.model.context_length - 2))


# ------------------------------------------------------------------------------------------------------------
# compare and score


def _arc_rows(arc_key: str, state: dict | None) -> list[list[str]]:
    arc = get_run(arc_key)
    image_tokens, rows = _image_tokens(arc, state), []
    for mode, method, kw in (("greedy", "greedy", {}), ("beam 4", "beam", {"beam_size": 4})):
        start = time.perf_counter()
        with user_errors():
            out = ar_decode(arc.model, image_tokens, method, **kw)
        ms = (time.perf_counter() - start) * 1000
        n = int(out.lengths[0])
        probs = out.token_logprobs[0, :n].exp().tolist()
        rows.append([f"ARC {html.escape(arc.label)}, {mode}",
                     render.mini_caption_html(arc.tokenizer.token_strings(out.tokens[0, :n]), probs),
                     f"{sum(probs) / max(n, 1):.3f}", f"{ms:.0f}"])
    return rows


@takes_sampler_settings
def compare_lengths(run: str, arc_run: str | None, state: dict | None, sampler: SamplerConfig) -> str:
    """Captions of the MDC run at N' = 10 / 15 / 20 side by side (and the ARC run's, if one is chosen); the
    sampler's `length` is unused (the table sets it), its other settings apply."""
    arc_key = arc_run
    run = get_run(run) if run else None
    arc = get_run(arc_key) if arc_key else None
    if arc is not None and not arc.is_arc:
        raise refuse(f"{arc.label} is not an ARC run (objective {arc.cfg.objective.name!r})")
    cfg = sampler
    rows = []
    if run is not None and not run.is_arc:
        image_tokens = _image_tokens(run, state)
        for length in COMPARE_LENGTHS:
            if length > run.cfg.model.context_length - 2:
                rows.append([f"N' = {length}", "<i>longer than this model's context</i>", "", ""])
                continue
            rec = _unmask(run, image_tokens, dataclasses.replace(cfg, length=length))
            confs = [0.0] * length
            for r in trajectory_view.reveal_order(rec):
                confs[r["position"]] = r["confidence"]
            rows.append([f"MDC N' = {length}", render.mini_caption_html(rec["tokens"], confs),
                         f"{sum(confs) / length:.3f}", f"{rec['latency_s'] * 1000:.0f}"])
    if arc_key:
        rows += _arc_rows(arc_key, state)
    if not rows:
        raise refuse("choose an MDC run (top) or an ARC run (here) to compare")
    return render.table_html(["model", "caption (MDC: confidence when revealed; ARC: p of each token)",
                              "mean conf.", "ms"], rows)


def _check_vocab(run: LoadedRun, captions: list[str]) -> None:
    limit = run.cfg.model.context_length - 2
    for text in captions:
        with user_errors():  # a caption or a word past the tokenizer's bounds: refused before BPE, echo cut
            ids = run.tokenizer.encode_text(text)
        if not ids:
            raise refuse(f"caption {shown(text)} has no tokens")
        if len(ids) > limit:
            raise refuse(f"caption {shown(text)} has {len(ids)} tokens; this model holds {limit}")
        if run.model.restricted:
            unknown = [run.tokenizer.token_string(i) for i in ids if int(run.model.output_index[i]) < 0]
            if unknown:
                raise refuse(f"caption {shown(text)} uses words this model never saw in training: "
                             f"{', '.join(unknown[:8])}")


def score_own(run: str, state: dict | None, captions: str, methods: list[str] | None, mc_samples: float
              ) -> tuple[str, dict[str, Any]]:
    """Score typed captions (one per line) against the image; rank them; show the heuristic path's log-probs. The
    table, and its data as JSON for scripts: ``{"run", "source", "ranked_by", "captions": [{"rank", "caption",
    "tokens", "scores": {method: {"score", "stderr" (mc), "token_logprobs", "order" (heuristic)}}}]}``, best
    first."""
    text, run_key = captions, run
    run = get_run(run_key)
    captions = [line.strip() for line in (text or "").splitlines() if line.strip()]
    if not captions:
        raise refuse("type one or more captions, one per line")
    if len(captions) > MAX_SCORED:
        raise refuse(f"at most {MAX_SCORED} captions at once, got {len(captions)}")
    methods = list(methods or ["heuristic"])
    _check_vocab(run, captions)
    image_tokens = _image_tokens(run, state)
    results, ms = {}, {}
    for method in methods:
        start = time.perf_counter()
        with user_errors():
            results[method] = scoring.score_captions(run.model, image_tokens, captions, method,
                                                     samples=int(mc_samples))
        ms[method] = (time.perf_counter() - start) * 1000
    rank_by = methods[0]
    path = next((m for m in ("heuristic", *methods) if m in results and "token_logprobs" in results[m][0]), None)
    order = sorted(range(len(captions)), key=lambda i: -results[rank_by][i]["score"])
    rows, ranked = [], []
    for rank, i in enumerate(order, 1):
        ranked.append({"rank": rank, "caption": captions[i], "tokens": results[rank_by][i]["tokens"],
                       "scores": {m: {k: v for k, v in results[m][i].items() if k not in ("caption", "tokens")}
                                  for m in methods}})
        cells = [str(rank), html.escape(captions[i])]
        for m in methods:
            r = results[m][i]
            err = f" &plusmn; {r['stderr']:.2f}" if "stderr" in r else ""
            cells.append(f"{r['score']:.3f}{err}")
        if path:
            r = results[path][i]
            cells.append(render.logprob_chips_html(r["tokens"], r["token_logprobs"], r.get("order")))
        rows.append(cells)
    timing = ", ".join(f"{m} {ms[m]:.0f} ms" for m in methods)
    headers = ["#", "caption", *[f"{m} score" for m in methods]]
    if path:
        headers.append(f"{path} path: per-token log p" + (" (#n = reveal order)" if path == "heuristic" else ""))
    table = (render.table_html(headers, rows)
             + f'<p style="font-size:12px;color:#6b7280">ranked by {rank_by} (log-likelihood; higher is better) '
               f"&middot; {timing}</p>")
    return table, {"run": run_key, "source": state.get("source"), "ranked_by": rank_by, "captions": ranked}


def rescan_runs(root: str | None, current: str, current_arc: str | None) -> tuple[Any, Any]:
    """Look for new run folders under the root: the run menu (MDC runs) and the Compare tab's ARC menu."""
    return (gr.Dropdown(choices=run_choices(root, arc=False) or run_choices(root), value=current),
            gr.Dropdown(choices=[("(none)", ""), *run_choices(root, arc=True)], value=current_arc or ""))
