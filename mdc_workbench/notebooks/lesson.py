"""Figures of the lesson notebook (00): a caption's unmasking drawn step by step, attention masks, and the loss
at fixed noise levels t.

The figures return a matplotlib ``Figure`` built without pyplot (show it with
:func:`mdc_workbench.notebooks.notebook.show_figure`, save it with ``save_figure``); only :func:`loss_by_t` runs a
model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mdc_workbench.viz.animation import canvas_at, confidence_colour


def unmasking_figure(record: dict[str, Any], image: Any = None, title: str = "") -> Any:
    """One row per step of a :func:`~mdc_workbench.viz.animation.trajectory` record (row 0: all masked, row S: the
    caption), one column per caption position. A revealed token is coloured by its confidence when revealed
    (viridis, as the app) and framed in orange at the step that reveals it; a masked position is grey with the
    model's current top guess in small italics. `image` (a PIL image) is drawn on the left."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    steps = len(record["steps"])
    n = len(record["token_ids"])
    width = 1.05 * n + (2.4 if image is not None else 0.6)
    fig = Figure(figsize=(width, 0.42 * (steps + 1) + 1.1), layout="constrained")
    if image is not None:
        grid = fig.add_gridspec(1, 2, width_ratios=[1.9, 1.05 * n])
        ax_img, ax = fig.add_subplot(grid[0]), fig.add_subplot(grid[1])
        ax_img.imshow(np.asarray(image))
        ax_img.set_axis_off()
        ax_img.set_title("the image", fontsize=9)
    else:
        ax = fig.add_subplot()
    for s in range(steps + 1):
        for cell in canvas_at(record, s):
            x, y = cell["position"], s
            if cell.get("state") == "revealed":
                colour, light = confidence_colour(cell["confidence"])
                ax.add_patch(Rectangle((x - 0.47, y - 0.42), 0.94, 0.84, facecolor=colour,
                                       edgecolor="#f97316" if cell.get("just") else "none", linewidth=2.2))
                ax.text(x, y, cell["token"], ha="center", va="center", fontsize=8,
                        color="#111827" if light else "white", fontweight="bold" if cell.get("just") else "normal")
            elif cell.get("state") == "fixed":
                ax.add_patch(Rectangle((x - 0.47, y - 0.42), 0.94, 0.84, facecolor="white", edgecolor="#9ca3af"))
                ax.text(x, y, cell["token"], ha="center", va="center", fontsize=8)
            else:
                ax.add_patch(Rectangle((x - 0.47, y - 0.42), 0.94, 0.84, facecolor="#e5e7eb", edgecolor="none"))
                ax.text(x, y, cell.get("token", ""), ha="center", va="center", fontsize=6.5, color="#9ca3af",
                        style="italic")
    ax.set_xlim(-0.55, n - 0.45)
    ax.set_ylim(steps + 0.55, -0.55)
    ax.set_xticks(range(n), [str(p) for p in range(n)], fontsize=7)
    ax.set_yticks(range(steps + 1), ["start"] + [f"after step {s}" for s in range(1, steps + 1)], fontsize=7)
    ax.set_xlabel("caption position (grey: still [MASK], with the model's current top guess in italics)", fontsize=8)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(title or f"greedy unmasking (Eq. 6): one token per step, the most confident first; "
                          f"colour = confidence when revealed; final: {record['caption']!r}", fontsize=9)
    return fig


def attention_mask_figure(labels: list[str], masks: dict[str, Any], title: str = "") -> Any:
    """Side-by-side (L, L) boolean matrices, `masks` = {name: matrix}: row i (the position predicted) may attend to
    column j when True (dark). `labels` name the L positions."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.2 * len(masks), 4.4), layout="constrained")
    for k, (name, matrix) in enumerate(masks.items()):
        ax = fig.add_subplot(1, len(masks), k + 1)
        ax.imshow(np.asarray(matrix, dtype=float), cmap="Greys", vmin=0, vmax=1.25)
        ax.set_xticks(range(len(labels)), labels, rotation=60, fontsize=7, ha="right")
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.set_xlabel("attends to (key position j)", fontsize=8)
        ax.set_ylabel("output at position i", fontsize=8)
        ax.set_title(name, fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def loss_by_t(model: Any, objective: Any, images: Any, tokens: Any, ts: Sequence[float], draws: int = 8,
              seed: int = 0) -> dict[float, float]:
    """The batch loss of `objective` (its 1/t weight included for ``mdc``) with every caption masked at the fixed
    noise level t (``t_low = t_high = t``), for each t of `ts`: the mean over `draws` mask draws (generator seeds
    `seed`, `seed` + 1, ...). images (B, 3, S, S), tokens (B, L) as the tokenizer gives them.

    The 1/t weight makes up for the fraction t of words masked, so a predictor that ignores the caption's other
    words has the same expected loss at every t; a trained one reads the unmasked words, and its loss rises with t.
    """
    import dataclasses

    import torch

    from mdc_core.objectives import compute_loss

    device = next(model.parameters()).device
    out = {}
    with torch.no_grad():
        for t in ts:
            fixed = dataclasses.replace(objective, t_low=float(t), t_high=float(t))
            losses = [float(compute_loss(model, images.to(device), tokens.to(device), fixed,
                                         torch.Generator(device=device).manual_seed(seed + d)).loss)
                      for d in range(draws)]
            out[float(t)] = sum(losses) / len(losses)
    return out


def loss_by_t_figure(curves: dict[str, dict[float, float]], title: str = "") -> Any:
    """Loss against the noise level t, one line per entry of `curves` = {label: {t: loss}} (:func:`loss_by_t`)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.2, 3.4), layout="constrained")
    ax = fig.add_subplot()
    for label, curve in curves.items():
        ax.plot(list(curve), list(curve.values()), marker="o", label=label)
    ax.set_xlabel("noise level t (fraction of words masked)")
    ax.set_ylabel("batch loss at fixed t")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or "Eq. 5 at fixed t: the 1/t weight does not make the loss flat", fontsize=9)
    return fig
