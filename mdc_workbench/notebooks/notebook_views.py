"""The notebooks' views: images, caption lengths, masks, loss draws, tables, trajectories and infilling slots as the
lessons show them (re-exported by :mod:`mdc_workbench.notebooks.notebook`, where notebooks call them as ``wb.NAME``)."""

from __future__ import annotations

from typing import Any

from mdc_core.config import RunConfig


def figure_png(fig: Any) -> Any:
    """`fig` (a matplotlib Figure, with or without pyplot) as an ``IPython.display.Image`` PNG; the figure is
    closed when pyplot manages it, so it is not shown a second time at the end of the cell."""
    import io

    from IPython.display import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    _close(fig)
    return Image(data=buf.getvalue(), format="png")


def show_figure(fig: Any) -> None:
    """Show `fig` in the notebook as a picture. A Figure built without pyplot (the app's heatmap, the attention
    grid) would otherwise print as ``<Figure size ...>`` when pyplot was never imported in the kernel."""
    from IPython.display import display

    display(figure_png(fig))


def _close(fig: Any) -> None:
    import sys

    plt = sys.modules.get("matplotlib.pyplot")  # only a figure pyplot made is known to pyplot
    if plt is not None and getattr(fig, "number", None) in plt.get_fignums():
        plt.close(fig)


def to_pixels(images: Any) -> Any:
    """Normalised image tensors (B, 3, S, S) back to displayable (B, S, S, 3) floats in [0, 1]."""
    import torch

    from mdc_core.transforms import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD

    mean = torch.tensor(OPENAI_DATASET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(OPENAI_DATASET_STD).view(1, 3, 1, 1)
    return (images.detach().cpu().float() * std + mean).clamp(0, 1).permute(0, 2, 3, 1).numpy()


def image_grid(images: Any, captions: list[str], cols: int = 4, width: int = 28, numbered: bool = False):
    """A grid of images (B, 3, S, S) with their captions wrapped underneath; `numbered` puts each image's index
    (0, 1, ...) before its caption, for a menu that picks images by number."""
    import textwrap

    import matplotlib.pyplot as plt

    pixels = to_pixels(images)
    rows = max(1, -(-len(pixels) // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.0 * cols, 3.3 * rows), squeeze=False)
    for ax in axes.ravel():
        ax.axis("off")
    for i, (ax, img, text) in enumerate(zip(axes.ravel(), pixels, captions, strict=False)):
        text = f"{i}: {text}" if numbered else text
        ax.imshow(img)
        ax.set_title("\n".join(textwrap.wrap(text, width)[:4]), fontsize=7)
    fig.tight_layout()
    return fig


def caption_lengths(data_cfg: Any, tokenizer: Any, *, split: str = "train", limit: int = 2000) -> dict[str, list[int]]:
    """Token lengths (without ``<sot>``/``<eot>``) of the first `limit` captions of `split`, by caption style
    (``short``/``long`` from the embedded data's metadata; ``caption`` for data without that field)."""
    from mdc_core.data import build_loader

    out: dict[str, list[int]] = {}
    seen = 0
    for batch in build_loader(data_cfg, split=split, image_size=16, batch_size=256, shuffle=False,
                              drop_last=False):
        for caption, meta in zip(batch["caption"], batch["meta"], strict=True):
            style = meta.get("caption_style", "caption") if isinstance(meta, dict) else "caption"
            out.setdefault(style, []).append(len(tokenizer.encode_text(caption)))
        seen += len(batch["caption"])
        if seen >= limit:
            break
    return out


def mask_figure(tokenizer: Any, tokens: Any, masks: Any, ratios: list[float]):
    """One caption's tokens (L,) as a row of cells per masking ratio; masked cells dark. masks: (R, L) bool."""
    import matplotlib.pyplot as plt

    words = tokenizer.token_strings(tokens)
    n = len(words)
    fig, ax = plt.subplots(figsize=(max(6, 0.75 * n), 0.6 * len(ratios) + 0.8))
    for r, mask in enumerate(masks):
        for i, word in enumerate(words):
            hidden = bool(mask[i + 1])  # words start after <sot>
            ax.add_patch(plt.Rectangle((i, -r - 0.45), 0.95, 0.9, color="0.25" if hidden else "0.9"))
            ax.text(i + 0.47, -r, "[MASK]" if hidden else word, ha="center", va="center", fontsize=7,
                    color="white" if hidden else "black")
    ax.set_xlim(0, n)
    ax.set_ylim(-len(ratios) + 0.4, 0.6)
    ax.set_yticks([-r for r in range(len(ratios))], [f"t = {t:.2f}" for t in ratios])
    ax.set_xticks([])
    ax.set_title("tokens masked at ratio t (dark: [MASK], the positions in the loss)")
    fig.tight_layout()
    return fig


def loss_draws(model: Any, cfg: RunConfig, images: Any, captions: list[str], draws: int = 32, seed: int = 0
               ) -> list[float]:
    """The objective's batch loss on one fixed batch under `draws` independent noise draws (t and masks): the
    spread of these numbers is the variance the noise schedule puts into every training step."""
    import torch

    from mdc_core.objectives import compute_loss
    from mdc_core.tokenizer import CaptionTokenizer

    tokens, _ = CaptionTokenizer(cfg.model.context_length).tokenize_batch(captions)
    device = next(model.parameters()).device
    out = []
    with torch.no_grad():
        for d in range(draws):
            gen = torch.Generator(device=device).manual_seed(seed + d)
            out.append(float(compute_loss(model, images.to(device), tokens.to(device), cfg.objective, gen).loss))
    return out


def markdown_table(rows: dict[str, dict[str, Any]], first: str = "", digits: int = 1) -> str:
    """A markdown table: one row per key of `rows`, one column per key of the inner dicts (in first-seen order);
    numbers rounded to `digits`. Show it with ``IPython.display.Markdown``."""
    columns = list(dict.fromkeys(c for r in rows.values() for c in r))

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.{digits}f}"
        return "–" if v is None else str(v)

    lines = ["| " + " | ".join([first, *columns]) + " |", "|---" * (len(columns) + 1) + "|"]
    lines += ["| " + " | ".join([str(k), *(cell(r.get(c)) for c in columns)]) + " |" for k, r in rows.items()]
    return "\n".join(lines)


def trajectory_html(record: dict[str, Any], step: int) -> str:
    """The canvas of one :func:`~mdc_workbench.viz.animation.trajectory` record after `step` denoising steps, as the
    app's HTML token chips (:func:`mdc_workbench.viz.trajectory_view.chips_html`: one drawing for the app and the
    notebooks)."""
    from mdc_workbench.viz.trajectory_view import chips_html

    return chips_html(record, step)


def confidence_heatmap(record: dict[str, Any], title: str = "") -> Any:
    """Steps x positions: each masked position's top-guess confidence per step, the reveal order traced on it
    (:func:`mdc_workbench.viz.trajectory_view.heatmap_figure`); shown in the notebook's output when run inside
    one, and returned."""
    from mdc_workbench.viz.trajectory_view import heatmap_figure

    fig = heatmap_figure(record, title)
    try:
        from IPython import get_ipython
    except ImportError:
        return fig
    if get_ipython() is not None:
        show_figure(fig)  # as a picture even before pyplot was imported (it would print "<Figure size ...>")
    return fig


FUNCTION_WORDS = frozenset({"a", "an", "the", "on", "in", "of", "and", "with", "at", "to", "is", "are", "image",
                            "picture", "photo", "background"})


def infill_slots(words: list[str], infill_mask: list[str], tokenizer: Any, model: Any) -> tuple[list[int], list[str]]:
    """The infilling example of notebook 05: which positions of a caption (`words`) to mask again, and the words to
    rank for the first of them.

    `infill_mask` ``["colour"]`` or ``["shape"]`` masks every colour (shape) word, anything else the words listed.
    When the caption holds none of them, the first colour word is masked, else the first shape word, else the
    first word that is not a function word ("a", "on", ...). The candidates are the words of the first slot's
    kind (every colour for a colour word, every shape for a shape word; both otherwise) that the model can say
    as one token; the slot's own word when none can be."""
    from mdc_workbench.data import COLOURS, SHAPES

    kinds = {"colour": set(COLOURS), "shape": set(SHAPES)}
    wanted = kinds.get(infill_mask[0], set(infill_mask)) if len(infill_mask) == 1 else set(infill_mask)
    slots = [i for i, w in enumerate(words) if w in wanted]
    for group in (kinds["colour"], kinds["shape"]):
        slots = slots or [i for i, w in enumerate(words) if w in group][:1]
    slots = slots or [i for i, w in enumerate(words) if w not in FUNCTION_WORDS][:1] or [len(words) // 2]
    first = words[slots[0]]
    pool = next((sorted(g) for g in kinds.values() if first in g), sorted(kinds["colour"] | kinds["shape"]))

    def sayable(word: str) -> bool:
        ids = tokenizer.encode_text(word)
        return len(ids) == 1 and int(model.output_index[ids[0]]) >= 0

    return slots, [w for w in pool if sayable(w)] or [first]
