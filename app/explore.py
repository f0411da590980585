"""The app's infilling, attention, GIF and replay callbacks (named module-level functions, tested without a server).

* "fix some words": a prompt such as ``a [MASK] square on the _`` kept in the user's ``gr.State``; the next
  unmasking fills only its slots (:func:`mdc_core.sampler.sample` with ``prompt=``).
* attention: for the step shown, the image with the cross-attention of the token that step revealed (mean over
  heads of the last layer by default; layer and head selectable), from the trajectory record.
* shareable trajectories: the GIF of the unmasking and the JSON record (seed, settings and the image inside),
  and the replay of such a JSON file (from the app or ``mdc sample --json``).
"""

from __future__ import annotations

import html
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import gradio as gr
import torch
from PIL import Image

from mdc_core.config import SamplerConfig, sampler_options
from mdc_core.tokenizer import parse_prompt
from mdc_workbench.viz import animation, trajectory_view

from .runs import LoadedRun, get_run, refuse, step_number, uploaded_path, user_errors

MEAN, LAST = "mean", "last"
MAX_JSON_BYTES = 20 * 2**20


def set_prompt(text: str | None, state: dict | None) -> dict:
    """Keep the "fix some words" prompt in the user's state ("" = no prompt: every position is generated)."""
    return {**(state or {}), "prompt": (text or "").strip()}


def clear_prompt() -> str:
    """Empty the prompt box: a new image drops the words fixed for the previous one (the state's prompt goes with
    the image, see :func:`mdc_app.callbacks.show_scene`)."""
    return ""


def prompt_ids(run: LoadedRun, state: dict | None) -> torch.Tensor | None:
    """The state's prompt as caption ids (N,) with ``[MASK]`` at the slots, or None; gr.Error for a bad prompt."""
    text = (state or {}).get("prompt") or ""
    if not text:
        return None
    with user_errors():
        return parse_prompt(text, run.tokenizer, run.model)[0]


def layer_choices(run: LoadedRun) -> tuple[list[str], list[str]]:
    """Choices of the layer and head menus: "last" / "mean" / 1..L, and "mean" / 1..h."""
    cfg = run.cfg.model
    return [LAST, MEAN, *map(str, range(1, cfg.text_layers + 1))], [MEAN, *map(str, range(1, cfg.text_heads + 1))]


def _pick(layer: str | None, head: str | None) -> tuple[int | str, int | str]:
    lay = -1 if layer in (None, LAST) else MEAN if layer == MEAN else int(layer) - 1
    return lay, (MEAN if head in (None, MEAN) else int(head) - 1)


def attention_view(step: float | None, layer: str | None, head: str | None, state: dict | None
                   ) -> tuple[Image.Image | None, str]:
    """The image with the attention of the token revealed at `step` (the step the canvas shows), and its label."""
    state = state or {}
    record, image = state.get("record"), state.get("image")
    if record is None or image is None:
        return None, ""
    s = min(max(step_number(step), 0), len(record["steps"]))
    lay, hd = _pick(layer, head)
    try:
        grid, label = animation.step_attention(record, s, lay, hd)
    except (ValueError, IndexError) as err:
        raise refuse(f"no attention map for this choice: {err}") from None
    shown = animation.overlay(image, grid, 256)
    text = (f"where the token just revealed looks: {html.escape(label, quote=False)}" if grid is not None
            else f"<i>{html.escape(label)}</i>")
    return shown, f'<div style="font-size:13px;color:#4b5563">{text}</div>'


_TEMP: tempfile.TemporaryDirectory | None = None  # the app's own temporary folder, removed when the process exits
_TEMP_LOCK = threading.Lock()


def temp_folder() -> Path:
    """The process's ``mdc-app-*`` temporary folder (created on first use), deleted when the app stops
    (:func:`cleanup_temp`) or, at the latest, when the process exits (TemporaryDirectory's finalizer)."""
    global _TEMP
    with _TEMP_LOCK:
        if _TEMP is None:
            _TEMP = tempfile.TemporaryDirectory(prefix="mdc-app-")
        return Path(_TEMP.name)


def _out_dir() -> Path:
    """A new folder for one download (so that two users never overwrite each other's file) in :func:`temp_folder`."""
    return Path(tempfile.mkdtemp(dir=temp_folder()))


def cleanup_temp() -> None:
    """Delete the app's temporary folder now (``serve`` calls it when the server stops)."""
    global _TEMP
    with _TEMP_LOCK:
        if _TEMP is not None:
            _TEMP.cleanup()
            _TEMP = None


def save_gif(state: dict | None, layer: str | None = LAST, head: str | None = MEAN) -> str:
    """Write the current trajectory as an animated GIF (one frame per step); returns its path for download."""
    state = state or {}
    if not state.get("record"):
        raise refuse("caption an image first: there is no trajectory to animate")
    lay, hd = _pick(layer, head)
    with user_errors():
        path = animation.trajectory_gif(state["record"], _out_dir() / "mdc_trajectory.gif", state.get("image"),
                                        layer=lay, head=hd)
    return str(path)


def save_json(state: dict | None) -> str:
    """Write the current trajectory record (seed, settings, prompt and the image inside) as JSON for download."""
    state = state or {}
    if not state.get("record"):
        raise refuse("caption an image first: there is no trajectory to save")
    record = dict(state["record"])
    if state.get("image") is not None:
        record = animation.with_image(record, state["image"])
    record.update(source=state.get("source"), run=state.get("run"))
    path = _out_dir() / "mdc_trajectory.json"
    path.write_text(json.dumps(record))
    return str(path)


def load_replay(path: str | None, state: dict | None) -> tuple[dict, Image.Image | None, str, str, Any, Any, str,
                                                                  str]:
    """Replay a saved JSON trajectory: its image, canvas (at the last step), heatmap and summary, and its prompt.
    The record's seed and settings are shown, so pressing "unmask" with them reproduces it on the same run."""
    path = uploaded_path(path)
    name = Path(path).name
    if Path(path).stat().st_size > MAX_JSON_BYTES:
        raise refuse(f"{name} is larger than {MAX_JSON_BYTES // 2**20} MB; not a trajectory saved by the app")
    with user_errors():
        record = animation.load_record(path)
        image = animation.record_image(record)
    n = len(record["steps"])
    settings = record["settings"]
    shown = ", ".join(f"{o.name} = {settings[o.name]}" for o in sampler_options() if o.name in settings)
    summary = (f"**replay of {html.escape(name)}**: *{html.escape(record.get('caption', ''))}* &middot; {n} steps "
               f"&middot; settings: {html.escape(shown)}" + (f" &middot; run {html.escape(str(record['run']))}"
                                                            if record.get("run") else ""))
    state = {**(state or {}), "record": record, "image": image, "source": f"replay of {name}",
             "prompt": record.get("prompt") or ""}
    info = f"**{html.escape(name)}** (replayed trajectory)" + ("" if image is not None else " &middot; no image inside")
    return (state, image, info, trajectory_view.chips_html(record, n), gr.Slider(minimum=0, maximum=n, value=n, step=1),
            trajectory_view.heatmap_figure(record), summary, record.get("prompt") or "")


def unmask_prompt_summary(record: dict[str, Any]) -> str:
    """A summary fragment for a run with a prompt or with remasks ("" when neither)."""
    parts = []
    if record.get("fixed"):
        parts.append(f"{len(record['fixed'])} words fixed by the prompt")
    remasks = sum(len(s.get("remasked", [])) for s in record["steps"])
    if record["settings"].get("remask_steps"):
        parts.append(f"{remasks} tokens remasked and predicted again")
    return "".join(f" &middot; {p}" for p in parts)


def timed_sample(run: LoadedRun, image_tokens: torch.Tensor, cfg: SamplerConfig, prompt: torch.Tensor | None
                 ) -> tuple[Any, float]:
    """The sampler with attention on (the overlay needs it) and the prompt, timed."""
    from mdc_core.sampler import sample
    start = time.perf_counter()
    with user_errors():
        out = sample(run.model, image_tokens, cfg, prompt=prompt, attention=True)
    return out, time.perf_counter() - start


def reload_run(run_key: str) -> tuple[Any, Any]:
    """Fit the layer and head menus to the chosen run."""
    layers, heads = layer_choices(get_run(run_key))
    return gr.Dropdown(choices=layers, value=LAST), gr.Dropdown(choices=heads, value=MEAN)
