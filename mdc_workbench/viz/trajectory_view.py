"""The trajectory as the app and the notebooks show it: HTML token chips after any step and a confidence heatmap.

Everything here is a function of a :func:`~mdc_workbench.viz.animation.trajectory` record (plain JSON data) replayed by
:func:`mdc_workbench.viz.animation.canvas_at`, and returns data, an HTML string or a matplotlib ``Figure``;
nothing touches gradio or a model, so tests check what is shown against the sampler's own tensors. Colours: one
confidence colour map (:func:`~mdc_workbench.viz.animation.confidence_colour`, viridis 0..1) for the chips, the
heatmap, the legend and the GIF frames, so a colour means the same probability everywhere.
"""

from __future__ import annotations

import html
import math
from typing import Any

from matplotlib.colors import to_hex
from matplotlib.figure import Figure

from mdc_workbench.viz.animation import CONFIDENCE_CMAP, canvas_at, confidence_colour

MASK_BG = "#e5e7eb"  # grey of a still-masked chip
CROWDED_POSITIONS = 24  # above this many caption positions the heatmap's labels are thinned and rotated
CHIP_FONT = "ui-sans-serif, system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif"


def chip_colours(p: float) -> tuple[str, str]:
    """(background, text) hex colours of a chip for a probability p in [0, 1]."""
    rgb, light = confidence_colour(p)
    return to_hex(rgb), "#111827" if light else "#ffffff"


def reveal_order(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Every reveal in order (by step, then by confidence within a step), numbered from 1."""
    order = []
    for step in record["steps"]:
        for r in step["revealed"]:
            order.append({**r, "step": step["step"], "order": len(order) + 1})
    return order


def _chip(cell: dict[str, Any]) -> str:
    token, conf = html.escape(str(cell["token"])), float(cell.get("confidence", 1.0))  # what a record says: escaped
    cell = {**cell, **{k: html.escape(str(cell[k])) for k in ("position", "order", "step") if k in cell}}
    base = ("display:inline-flex;flex-direction:column;align-items:center;justify-content:center;min-width:52px;"
            "padding:5px 9px 6px;border-radius:10px;line-height:1.15;")
    if cell["state"] == "fixed":
        return (f'<div class="mdc-chip" data-pos="{cell["position"]}" data-state="fixed" data-token="{token}" '
                f'title="position {cell["position"]}: fixed by the prompt" style="{base}background:#ffffff;'
                f'color:#111827;border:2px solid #9ca3af"><span style="font-size:11px;opacity:.75;color:#6b7280">'
                f'fixed</span><span style="font-size:19px;font-weight:650;color:#111827">{token}</span></div>')
    if cell["state"] == "revealed":
        bg, fg = chip_colours(conf)
        ring = "box-shadow:0 0 0 3px #f97316;" if cell.get("just") else ""
        ring += "outline:2px dashed #dc2626;outline-offset:2px;" if cell.get("remask_next") else ""
        return (f'<div class="mdc-chip" data-pos="{cell["position"]}" data-state="revealed" data-token="{token}" '
                f'data-order="{cell["order"]}" data-confidence="{conf:.4f}" title="position {cell["position"]}, '
                f'revealed at step {cell["step"]} with p={conf:.3f}" style="{base}background:{bg};color:{fg};{ring}">'
                f'<span style="font-size:11px;opacity:.85;color:{fg}">#{cell["order"]} &middot; {conf:.2f}</span>'
                f'<span style="font-size:19px;font-weight:650;color:{fg}">{token}</span></div>')
    border = "2px dashed #f97316" if cell.get("next") else "2px solid transparent"
    return (f'<div class="mdc-chip" data-pos="{cell["position"]}" data-state="masked" data-token="{token}" '
            f'data-confidence="{conf:.4f}" title="position {cell["position"]}: masked; top guess {token!s} '
            f'p={conf:.3f}" style="{base}background:{MASK_BG};color:#6b7280;border:{border}">'
            f'<span style="font-size:11px;opacity:.75;color:#6b7280">[MASK]</span>'
            f'<span style="font-size:15px;font-style:italic;opacity:.55;color:#6b7280">{token} {conf:.2f}</span></div>')


def legend_html() -> str:
    """A horizontal colour bar for the confidence colour map."""
    stops = ", ".join(f"{chip_colours(i / 10)[0]} {i * 10}%" for i in range(11))
    return ('<div style="display:flex;align-items:center;gap:8px;font-size:12px;color:#4b5563;margin-top:10px">'
            f'<span>confidence 0</span><div style="width:180px;height:10px;border-radius:5px;'
            f'background:linear-gradient(90deg, {stops})"></div><span>1</span>'
            '<span style="margin-left:14px">#n = reveal order &middot; orange ring = just revealed &middot; '
            'dashed = revealed next &middot; grey = masked (faint: top guess) &middot; white = fixed by the prompt '
            '&middot; red dashes = masked again next (remasking)</span></div>')


def chips_html(record: dict[str, Any], step: int) -> str:
    """The canvas after `step` steps as a row of token chips, with a header line and a legend."""
    cells = canvas_at(record, step)
    n_steps, n_rev = len(record["steps"]), sum(c["state"] == "revealed" for c in cells)
    text = " ".join(c["token"] if c["state"] in ("revealed", "fixed") else "\u2581" for c in cells)  # \u2581: masked
    head = (f'<div style="font-size:14px;color:#374151;margin-bottom:8px"><b>step {step} / {n_steps}</b> '
            f'&middot; {n_rev} of {len(cells)} tokens revealed &middot; <span style="font-family:monospace">'
            f'{html.escape(text)}</span></div>')
    row = "".join(_chip(c) for c in cells)
    return (f'<div class="mdc-canvas" data-step="{step}" style="font-family:{CHIP_FONT}">{head}'
            f'<div style="display:flex;flex-wrap:wrap;gap:7px">{row}</div>{legend_html()}</div>')


def heatmap_matrix(record: dict[str, Any]) -> list[list[float]]:
    """(S, N) top-guess confidence of every still-masked position at the start of each step; NaN if revealed."""
    n = len(record["token_ids"])
    rows = []
    for step in record["steps"]:
        row = [math.nan] * n
        for m in step["masked"]:
            row[m["position"]] = m["top_confidence"]
        rows.append(row)
    return rows


def heatmap_figure(record: dict[str, Any], title: str = "") -> Figure:
    """Steps x positions heatmap of the masked positions' confidence, the reveal order traced on it."""
    import numpy as np
    grid = np.array(heatmap_matrix(record), dtype=float)  # (S, N)
    n_steps, n = grid.shape
    fig = Figure(figsize=(min(2.5 + 0.6 * n, 14.0), min(1.4 + 0.22 * n_steps, 8.0)), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    cmap = CONFIDENCE_CMAP.with_extremes(bad="#f3f4f6")  # revealed cells
    im = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto",
                   interpolation="nearest")
    order = reveal_order(record)
    xs, ys = [r["position"] for r in order], [r["step"] for r in order]
    crowded = n > CROWDED_POSITIONS  # long captions: one rotated label per position, every k-th step labelled
    ax.plot(xs, ys, color="#f97316", lw=1.6, alpha=0.9, zorder=2)
    ax.scatter(xs, ys, s=30 if crowded else 95, facecolor="white", edgecolor="#f97316", lw=1.6, zorder=3)
    if not crowded:
        for r in order:
            ax.annotate(str(r["order"]), (r["position"], r["step"]), ha="center", va="center", fontsize=7, zorder=4)
    if crowded:
        ax.set_xticks(range(n), [f"{t} {p}" for p, t in enumerate(record["tokens"])], fontsize=6, rotation=90)
    else:
        ax.set_xticks(range(n), [f'{p}\n{t}' for p, t in enumerate(record["tokens"])], fontsize=8)
    every = max(1, -(-n_steps // 30))  # at most 30 step labels
    ax.set_yticks(range(0, n_steps, every), [str(s) for s in range(0, n_steps, every)], fontsize=7)
    ax.set_xlabel("caption position (final token)")
    ax.set_ylabel("denoising step")
    ax.set_title(title or "confidence of the top guess at each masked position; circles: reveal order", fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.04, pad=0.01, label="confidence")
    return fig
