"""Shareable trajectories: the JSON record of a sampler's run, its replay, its attention maps, a GIF, a JSON file.

* :func:`trajectory` turns a :func:`mdc_core.sampler.sample` output into the record the app, the notebooks and the
  GIFs replay (plain JSON data).
* :func:`canvas_at` replays a record to the canvas after any step (fixed prompt words, reveals, remasks).
* :func:`attention_map` turns a revealed token's cross-attention (layers x heads x M image tokens) into a patch
  grid (mean over heads of the last layer by default); :func:`overlay` lays it over the image.
* :func:`trajectory_gif` draws one frame per step: the image with the attention of the token(s) just revealed,
  and the canvas as chips coloured by confidence (viridis, as the app); fixed words white, masks grey.
* :func:`with_image` / :func:`load_record` store the image the model saw inside the record and read a saved
  record back (``mdc sample --json`` output, the app's download), with one-line errors for files that are not.

Everything but :func:`trajectory` works on plain JSON data; nothing here runs a model.
"""

from __future__ import annotations

import base64
import io
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

if TYPE_CHECKING:
    from mdc_core.sampler import SampleOutput
    from mdc_core.tokenizer import CaptionTokenizer

# matplotlib's colour maps, imported where a colour is drawn: `mdc sample` records and embeds without it (a core
# install); CONFIDENCE_CMAP (confidence 0..1 in the app's chips, the heatmaps, the GIFs) and ATTENTION_CMAP
# resolve on first use (module __getattr__)
CMAPS = {"CONFIDENCE_CMAP": "viridis", "ATTENTION_CMAP": "inferno"}


def colormap(name: str) -> Any:
    """The colour map of `name` (a key of :data:`CMAPS`)."""
    import matplotlib
    return matplotlib.colormaps[CMAPS[name]]


def __getattr__(name: str) -> Any:
    if name in CMAPS:
        return colormap(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
RECORD_KEYS = ("tokens", "token_ids", "steps", "settings")


def confidence_colour(p: float) -> tuple[tuple[float, float, float], bool]:
    """(r, g, b) in [0, 1] of confidence p on :data:`CONFIDENCE_CMAP`, and whether it is light (then dark text goes
    on it; by perceived luminance). Every drawing of a confidence takes its colour from here."""
    r, g, b, _ = colormap("CONFIDENCE_CMAP")(min(max(p, 0.0), 1.0))
    return (r, g, b), 0.299 * r + 0.587 * g + 0.114 * b > 0.55


def trajectory(out: SampleOutput, tokenizer: CaptionTokenizer, index: int = 0, *, digits: int = 4) -> dict[str, Any]:
    """JSON-ready record of caption `index`: text, tokens, and one entry per step.

    Each step lists every token it revealed (``revealed``, most confident first), every position that was
    masked when it began with the model's top guess there (``masked``), and the tokens it masked again first
    (``remasked``, with the token each held; empty unless remasking is on); ``position``, ``token`` and
    ``confidence`` repeat the step's most confident reveal (the only one when k = 1). Positions count caption
    tokens from 0 (``<sot>`` excluded). ``fixed`` lists the positions a prompt fixed (never in a step). Only the
    steps this caption took are listed (other captions of the batch may have needed more). When the sampler ran
    with ``attention=True`` each reveal carries ``attention``: per decoder layer, per head, the weights over the
    M image tokens (the first ``settings["attention_prefix_tokens"]`` are class tokens), rounded to `digits`."""
    ids = out.tokens[index].tolist()
    fixed = [] if out.fixed is None else out.fixed[index].nonzero()[:, 0].tolist()
    current: dict[int, int] = {p: ids[p] for p in fixed}  # position -> token on the canvas, replayed step by step
    steps = []
    for s in range(int(out.row_steps[index])):
        remasked = [{"position": p, "token": tokenizer.token_string(current[p]), "token_id": current.pop(p)}
                    for p in out.step_remasked[s, index].nonzero()[:, 0].tolist()]
        revealed = []
        for p in out.step_revealed[s, index].nonzero()[:, 0].tolist():
            tok = int(out.step_token[s, index, p])
            current[p] = tok
            rec = {"position": p, "token": tokenizer.token_string(tok), "token_id": tok,
                   "confidence": float(out.step_confidence[s, index, p])}
            if out.step_attention is not None:
                rec["attention"] = out.step_attention[s, index, p].round(decimals=digits).tolist()
            revealed.append(rec)
        revealed.sort(key=lambda r: -r["confidence"])
        masked = [
            {"position": p, "top_token": tokenizer.token_string(int(out.step_top_token[s, index, p])),
             "top_token_id": int(out.step_top_token[s, index, p]),
             "top_confidence": float(out.step_top_confidence[s, index, p])}
            for p in out.step_masked[s, index].nonzero()[:, 0].tolist()
        ]
        first = revealed[0]
        steps.append({"step": s, "position": first["position"], "token": first["token"],
                      "confidence": first["confidence"], "revealed": revealed, "masked": masked,
                      "remasked": remasked})
    return {
        "caption": tokenizer.decode(ids),
        "tokens": [tokenizer.token_string(i) for i in ids],
        "token_ids": ids,
        "fixed": fixed,
        "steps": steps,
        "settings": dict(out.settings),
    }


def canvas_at(record: dict[str, Any], step: int) -> list[dict[str, Any]]:
    """The canvas after `step` steps (0 = before the first, S = the final caption), one dict per position.

    A revealed position has ``state="revealed"``, its ``token``, ``confidence`` when revealed, reveal ``order``
    (1-based, counting every reveal of the trajectory) and ``step``; ``just`` marks the reveals of the last step
    shown, ``revised`` a position revealed before (remasking), ``remask_next`` one that step `step` masks again.
    A masked position has ``state="masked"`` and the model's top guess there at the start of step `step`
    (``token``, ``confidence``); ``next`` marks the positions step `step` reveals. A prompt's fixed word has
    ``state="fixed"`` and its ``token``.
    """
    steps = record["steps"]
    if not 0 <= step <= len(steps):
        raise ValueError(f"step must be in [0, {len(steps)}], got {step}")
    cells: list[dict[str, Any]] = [{"position": p} for p in range(len(record["token_ids"]))]
    for p in record.get("fixed", []):
        cells[p].update(state="fixed", token=record["tokens"][p])
    seen: set[int] = set()
    order = 0
    for st in steps[:step]:
        for r in st.get("remasked", []):
            cells[r["position"]] = {"position": r["position"]}
        for r in st["revealed"]:
            order += 1
            p = r["position"]
            cells[p] = {"position": p, "state": "revealed", "token": r["token"], "confidence": r["confidence"],
                        "order": order, "step": st["step"], "just": st["step"] == step - 1}
            if p in seen:
                cells[p]["revised"] = True
            seen.add(p)
    if step < len(steps):
        upcoming = {r["position"] for r in steps[step]["revealed"]}
        for r in steps[step].get("remasked", []):
            cells[r["position"]]["remask_next"] = True
        for m in steps[step]["masked"]:
            if "state" not in cells[m["position"]]:
                cells[m["position"]].update(state="masked", token=m["top_token"], confidence=m["top_confidence"],
                                            next=m["position"] in upcoming)
    return cells


# ------------------------------------------------------------------------------------------------------------
# attention


def attention_map(attention: Any, prefix: int = 0, layer: int | str = -1, head: int | str = "mean") -> np.ndarray:
    """Patch grid (g, g) of one token's cross-attention `attention` (layers, heads, M): layer `layer` (an index, -1 =
    last, or "mean"), head `head` (an index or "mean"); the first `prefix` (class) tokens are dropped and the rest,
    g * g patch tokens in raster order, renormalised to sum to 1."""
    a = np.asarray(attention, dtype=float)
    if a.ndim != 3:
        raise ValueError(f"attention must be (layers, heads, M), got shape {a.shape}")
    a = a.mean(axis=0) if layer == "mean" else a[int(layer)]  # (h, M)
    a = a.mean(axis=0) if head == "mean" else a[int(head)]  # (M,)
    a = a[prefix:]
    g = math.isqrt(len(a))
    if g * g != len(a) or g == 0:
        raise ValueError(f"{len(a)} image tokens (after {prefix} class tokens) do not form a square grid")
    total = a.sum()
    return (a / total if total > 0 else a).reshape(g, g)


def overlay(image: Image.Image, grid: np.ndarray | None, size: int = 192, alpha: float = 0.6) -> Image.Image:
    """The image at `size` x `size` px with `grid` (g, g) drawn over it as a heat map, scaled from its minimum
    (transparent) to its maximum (brightest, `alpha` opaque); patch borders stay sharp (nearest-neighbour
    upsampling), so each cell is one image token."""
    base = image.convert("RGB").resize((size, size), Image.Resampling.NEAREST)
    if grid is None:
        return base
    span = float(grid.max() - grid.min())
    norm = (grid - grid.min()) / span if span > 0 else np.zeros_like(grid)
    heat = (colormap("ATTENTION_CMAP")(norm)[..., :3] * 255).astype(np.uint8)  # (g, g, 3)
    heat_img = Image.fromarray(heat).resize((size, size), Image.Resampling.NEAREST)
    weight = Image.fromarray((np.clip(norm, 0, 1) * 255 * alpha).astype(np.uint8)).resize(
        (size, size), Image.Resampling.NEAREST)  # strong attention covers more of the image
    return Image.composite(heat_img, base, weight)


def step_attention(record: dict[str, Any], step: int, layer: int | str = -1, head: int | str = "mean"
                   ) -> tuple[np.ndarray | None, str]:
    """The attention grid of the most confident token revealed at step `step` (1-based: the step just shown) and a
    label naming it; (None, reason) when there is none (step 0, or a record without attention)."""
    if step < 1 or step > len(record["steps"]):
        return None, "no token revealed yet"
    first = record["steps"][step - 1]["revealed"][0]
    if "attention" not in first:
        return None, "sampled without attention"
    prefix = int(record["settings"].get("attention_prefix_tokens", 0))
    grid = attention_map(first["attention"], prefix, layer, head)
    where = "last layer" if layer == -1 else "mean over layers" if layer == "mean" else f"layer {int(layer) + 1}"
    who = "mean over heads" if head == "mean" else f"head {int(head) + 1}"
    return grid, f"'{first['token']}' (position {first['position']}): {where}, {who}"


# ------------------------------------------------------------------------------------------------------------
# GIF


def _font(size: int) -> ImageFont.FreeTypeFont:
    from matplotlib import font_manager
    return ImageFont.truetype(font_manager.findfont("DejaVu Sans"), size)


def _hex(rgb: tuple[float, ...]) -> tuple[int, int, int]:
    return tuple(int(round(255 * c)) for c in rgb[:3])  # type: ignore[return-value]


def _chip_colours(cell: dict[str, Any]) -> tuple[tuple[int, int, int], tuple[int, int, int], str, str]:
    """(background, text colour, main text, small text) of one canvas cell."""
    if cell.get("state") == "revealed":
        rgb, light = confidence_colour(cell["confidence"])
        text = (17, 24, 39) if light else (255, 255, 255)
        return _hex(rgb), text, cell["token"], f"#{cell['order']} {cell['confidence']:.2f}"
    if cell.get("state") == "fixed":
        return (255, 255, 255), (17, 24, 39), cell["token"], "fixed"
    guess = cell.get("token", "")
    return (229, 231, 235), (107, 114, 128), guess, "[MASK]"


def frame(record: dict[str, Any], step: int, image: Image.Image | None, *, layer: int | str = -1,
          head: int | str = "mean", width: int = 720) -> Image.Image:
    """One picture of the trajectory after `step` steps: the image (with the attention of the token just revealed,
    when the record has attention) on the left, the step header and the canvas chips on the right."""
    side = 192 if image is not None else 0
    cells = canvas_at(record, step)
    font, small, head_font = _font(17), _font(10), _font(14)
    pad, gap, chip_h = 12, 6, 44
    x0 = side + (2 * pad if side else pad)
    lines, x, y = [], x0, 0
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    for c in cells:  # wrap the chips into lines
        bg, fg, main, tiny = _chip_colours(c)
        w = max(measure.textlength(main, font=font), measure.textlength(tiny, font=small)) + 16
        if x + w > width - pad and x > x0:
            x, y = x0, y + chip_h + gap
        lines.append((c, x, y, w))
        x += w + gap
    height = max(side + 2 * pad, 40 + y + chip_h + pad)
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    label = ""
    if image is not None:
        grid, label = step_attention(record, step, layer, head)
        img.paste(overlay(image, grid, side), (pad, pad))
    n_rev = sum(c.get("state") == "revealed" for c in cells)
    draw.text((x0, pad), f"step {step} / {len(record['steps'])} · {n_rev} revealed", fill=(55, 65, 81), font=head_font)
    if label and image is not None:
        draw.text((x0, pad + 18), f"attention: {label}", fill=(107, 114, 128), font=small)
    for c, cx, cy, w in lines:
        bg, fg, main, tiny = _chip_colours(c)
        top = 40 + pad + cy
        outline = (249, 115, 22) if c.get("just") else (209, 213, 219) if c.get("state") == "fixed" else None
        draw.rounded_rectangle((cx, top, cx + w, top + chip_h), radius=8, fill=bg, outline=outline,
                               width=3 if c.get("just") else 1)
        draw.text((cx + w / 2, top + 11), tiny, fill=fg, font=small, anchor="mm")
        draw.text((cx + w / 2, top + 29), main, fill=fg, font=font, anchor="mm")
    return img


def trajectory_gif(record: dict[str, Any], out: str | Path, image: Image.Image | None = None, *,
                   layer: int | str = -1, head: int | str = "mean", ms_per_step: int = 600) -> Path:
    """Write the trajectory as an animated GIF with one frame per step (frame s: the canvas after step s, with the
    attention of the token revealed there). `image` defaults to the record's embedded image (:func:`with_image`)."""
    if not record["steps"]:
        raise ValueError("the trajectory has no steps (every position was fixed), so there is nothing to animate")
    image = image if image is not None else record_image(record)
    frames = [frame(record, s, image, layer=layer, head=head) for s in range(1, len(record["steps"]) + 1)]
    size = (max(f.width for f in frames), max(f.height for f in frames))
    frames = [f if f.size == size else _padded(f, size) for f in frames]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    durations = [ms_per_step] * (len(frames) - 1) + [ms_per_step * 4]  # linger on the final caption
    frames[0].save(out, save_all=True, append_images=frames[1:], duration=durations, loop=0, optimize=False,
                   disposal=1)
    return out


def _padded(img: Image.Image, size: tuple[int, int]) -> Image.Image:
    canvas = Image.new("RGB", size, "white")
    canvas.paste(img, (0, 0))
    return canvas


# ------------------------------------------------------------------------------------------------------------
# JSON records


def with_image(record: dict[str, Any], image: Image.Image, max_size: int = 256) -> dict[str, Any]:
    """The record with the image embedded as a base64 PNG (at most `max_size` px), so a saved file replays alone."""
    img = image.convert("RGB")
    img.thumbnail((max_size, max_size))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return {**record, "image_png": base64.b64encode(buf.getvalue()).decode("ascii")}


def record_image(record: dict[str, Any]) -> Image.Image | None:
    """The image embedded by :func:`with_image`, or None; opened as an upload is
    (:func:`mdc_core.transforms.open_image`: too large or a decompression bomb refused before decoding,
    16-bit scaled, not saturated), since a record file may come from anyone. ValueError (one line) otherwise."""
    data = record.get("image_png")
    if not data:
        return None
    from mdc_core.transforms import open_image  # torchvision: only when a record holds an image
    try:
        raw = base64.b64decode(data, validate=True)
    except (ValueError, TypeError) as err:  # binascii.Error is a ValueError; a number or a list is a TypeError
        raise ValueError(f"the record's embedded image is not base64 text ({type(err).__name__})") from err
    return open_image(raw, "the record's embedded image")


def load_record(path: str | Path) -> dict[str, Any]:
    """A trajectory record saved as JSON (``mdc sample --json > FILE``, or the app's download), checked."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"trajectory file not found: {path}")
    try:
        record = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path.name} is not a JSON trajectory: {err}") from err
    except RecursionError:  # what json raises for nesting deeper than the interpreter's stack
        raise ValueError(f"{path.name} is not a JSON trajectory: it is nested too deeply") from None
    if not isinstance(record, dict) or any(k not in record for k in RECORD_KEYS):
        missing = [k for k in RECORD_KEYS if not isinstance(record, dict) or k not in record]
        raise ValueError(f"{path.name} is not a trajectory saved by `mdc sample --json` or the app "
                         f"(missing {', '.join(missing)})")
    try:
        check_record(record)
        canvas_at(record, len(record["steps"]))
    except (KeyError, TypeError, ValueError, RecursionError, AttributeError) as err:
        raise ValueError(f"{path.name} holds a damaged trajectory: {str(err)[:200]}") from err
    return record


MAX_RECORD_POSITIONS = 4096  # a caption's positions (the largest context a config may have)
MAX_RECORD_STEPS = 4096  # steps of a trajectory (a sampler reveals at least one position a step, remasking aside)
MAX_RECORD_ENTRIES = 200_000  # revealed, masked and remasked entries of all steps together


def check_record(record: dict[str, Any]) -> None:
    """Check a trajectory record's shape and types in place, bounded before any work: at most
    :data:`MAX_RECORD_POSITIONS` tokens, :data:`MAX_RECORD_STEPS` steps and :data:`MAX_RECORD_ENTRIES` entries; each
    step's ``step`` and each entry's ``position`` (and ``order``) an integer in range, ``confidence`` a finite
    number, ``token`` a string. What the HTML views insert is then what this checked (they escape it too).
    ValueError naming the first problem."""
    tokens, ids, steps = record["tokens"], record["token_ids"], record["steps"]
    if not isinstance(ids, list) or not isinstance(tokens, list) or not isinstance(steps, list):
        raise ValueError("tokens, token_ids and steps must be lists")
    if len(ids) > MAX_RECORD_POSITIONS or len(steps) > MAX_RECORD_STEPS:
        raise ValueError(f"{len(ids)} positions and {len(steps)} steps, more than a trajectory has (at most "
                         f"{MAX_RECORD_POSITIONS} and {MAX_RECORD_STEPS})")
    if not all(isinstance(t, str) for t in tokens) or not all(_integer(i) for i in ids):
        raise ValueError("tokens must be strings and token_ids integers")
    n, entries = len(ids), 0
    for k, st in enumerate(steps):
        if not isinstance(st, dict) or not _integer(st.get("step")):
            raise ValueError(f"step {k} is not a record with an integer step")
        for key in ("revealed", "masked", "remasked"):
            group = st.get(key, [])
            if not isinstance(group, list):
                raise ValueError(f"step {k}: {key} must be a list")
            entries += len(group)
            if entries > MAX_RECORD_ENTRIES:
                raise ValueError(f"more than {MAX_RECORD_ENTRIES} revealed/masked entries")
            for r in group:
                if not isinstance(r, dict) or not _integer(r.get("position")) or not 0 <= r["position"] < n:
                    raise ValueError(f"step {k}: a {key} entry without a position inside the caption of {n} tokens")
                for name in ("confidence", "top_confidence"):
                    if name in r and not (_number(r[name]) and math.isfinite(r[name])):
                        raise ValueError(f"step {k}: {name} {str(r[name])[:20]!r} is not a finite number")
                for name in ("token", "top_token"):
                    if name in r and not isinstance(r[name], str):
                        raise ValueError(f"step {k}: {name} must be a string")


def _integer(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def attention_grid(record: dict[str, Any], image: Image.Image, *, layer: int | str = -1, head: int | str = "mean",
                   cols: int = 5, title: str = "") -> Any:
    """A matplotlib Figure with one panel per caption position: the image with the attention of that token at its
    (last) reveal, titled with the token, its reveal order and confidence; fixed prompt words get a plain panel."""
    from matplotlib.figure import Figure
    prefix = int(record["settings"].get("attention_prefix_tokens", 0))
    last: dict[int, tuple[int, dict[str, Any]]] = {}
    order = 0
    for st in record["steps"]:
        for r in st["revealed"]:
            order += 1
            last[r["position"]] = (order, r)
    n = len(record["token_ids"])
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(2.0 * min(cols, n), 2.25 * rows), dpi=100, layout="constrained")
    for p in range(n):
        ax = fig.add_subplot(rows, min(cols, n), p + 1)
        ax.set_axis_off()
        if p in last and "attention" in last[p][1]:
            k, r = last[p]
            ax.imshow(overlay(image, attention_map(r["attention"], prefix, layer, head), 128))
            ax.set_title(f"{r['token']}\n#{k} p={r['confidence']:.2f}", fontsize=9)
        else:
            ax.imshow(image.convert("RGB").resize((128, 128), Image.Resampling.NEAREST))
            ax.set_title(f"{record['tokens'][p]}\n(fixed)", fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig
