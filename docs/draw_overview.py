"""Draw docs/mdc_overview.png, the README's picture of masked diffusion captioning.

    PYTHONPATH=. python docs/draw_overview.py [--out docs/mdc_overview.png]

The image, its caption and the caption's BPE pieces come from the workbench itself (the embedded generator's
test scene 0 and :class:`mdc_core.tokenizer.CaptionTokenizer`); the training row masks them with
:func:`mdc_core.objectives.apply_mask` at t = 0.7 (seed 3). The sampling rows are a schematic: their reveal
order is made up to show the rule (one most-confident token per step); ``mdc sample --json`` prints a trained
model's real order.
"""

from __future__ import annotations

import argparse
import io
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402
from PIL import Image  # noqa: E402

from mdc_core.objectives import apply_mask  # noqa: E402
from mdc_core.tokenizer import MASK_ID, CaptionTokenizer  # noqa: E402
from mdc_workbench.data import make_example  # noqa: E402

MASKED, REVEALED, PLAIN, NEW = "#c9c9c9", "#a6d96a", "#ffffff", "#fdae61"
REVEAL_ORDER = (2, 6, 1, 5, 3, 0, 4)  # schematic: position revealed at step 1, 2, ... (caption of 7 tokens)


def box(ax, x: float, y: float, w: float, h: float, text: str, face: str = "#eef3fb", size: float = 9,
        edge: str = "#4a6fa5", weight: str = "normal") -> None:
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.6", fc=face, ec=edge))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size, weight=weight)


def arrow(ax, a: tuple[float, float], b: tuple[float, float], text: str = "", style: str = "-|>") -> None:
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle=style, mutation_scale=12, color="#333333", lw=1.2,
                                 zorder=3))
    if text:
        ax.text((a[0] + b[0]) / 2, (a[1] + b[1]) / 2 + 0.8, text, ha="center", va="bottom", fontsize=8)


def chips(ax, x: float, y: float, words: list[str], faces: list[str], w: float = 5.2, h: float = 2.4,
          notes: list[str] | None = None) -> float:
    """One row of token chips from (x, y); returns the x where the row ends."""
    for i, (word, face) in enumerate(zip(words, faces, strict=True)):
        box(ax, x + i * (w + 0.4), y, w, h, word, face=face, size=7.5, edge="#777777")
        if notes and notes[i]:
            ax.text(x + i * (w + 0.4) + w / 2, y + h + 0.3, notes[i], ha="center", va="bottom", fontsize=6.5,
                    color="#b35806")
    return x + len(words) * (w + 0.4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/mdc_overview.png")
    args = parser.parse_args()

    example = make_example(0, "test", 0, image_size=128, captions="short")
    caption = json.loads(example["json"])["short_caption"]
    tok = CaptionTokenizer()
    ids = tok(caption)
    words = tok.token_strings(ids[0])
    noisy, mask = apply_mask(ids, torch.tensor([0.7]), generator=torch.Generator().manual_seed(3))
    masked_words = ["[MASK]" if i == MASK_ID else w for i, w in zip(noisy[0, 1:len(words) + 1].tolist(), words,
                                                                      strict=True)]

    fig, ax = plt.subplots(figsize=(13.5, 7.4))
    ax.set_xlim(0, 133)
    ax.set_ylim(0, 74)
    ax.axis("off")

    # encoder: image -> ViT -> image tokens V
    image = Image.open(io.BytesIO(example["jpg"]))
    ax.imshow(image, extent=(1, 17, 47, 63))
    ax.text(9, 64, "image (embedded generator)", ha="center", fontsize=8)
    arrow(ax, (17.5, 55), (20.5, 55))
    box(ax, 21, 50, 12, 10, "ViT encoder f\n(timm; tokens,\nno pooling)", size=8.5)
    arrow(ax, (33.5, 55), (36.5, 55))
    for r in range(4):
        for c in range(4):
            ax.add_patch(plt.Rectangle((37 + c * 1.6, 51.8 + r * 1.6), 1.4, 1.4, fc="#9ecae1", ec="#3182bd"))
    ax.text(40.2, 50.8, "image tokens V\n(M x D)", ha="center", va="top", fontsize=8)
    arrow(ax, (43.8, 53.5), (51.8, 50.5))
    ax.text(34.5, 47, "its keys/values are computed\nonce per image and reused\nin every step", ha="left", va="top",
            fontsize=6.5, color="#3182bd")

    # decoder
    box(ax, 50, 37, 30, 25, "", face="#f7f7f7", edge="#555555")
    ax.text(63, 63.6, "text decoder g\n(L pre-LN layers, no time input)", ha="center", va="bottom", fontsize=9,
            weight="bold")
    box(ax, 52, 53.5, 26, 5.5, "self-attention over the caption\n(bidirectional; ARC baseline: causal)",
        size=7.5)
    box(ax, 52, 46.5, 26, 5.5, "cross-attention to V", face="#deebf7", size=8)
    box(ax, 52, 39.5, 26, 5.5, "MLP -> logits over\nthe caption vocabulary", size=7.5)

    # training row
    ax.text(85, 68.5, "Training: mask each caption token with probability t ~ U[0.5, 1]", fontsize=10,
            weight="bold")
    full = ["<sot>", *words, "<eot>"]
    chips(ax, 86, 63.5, full, [PLAIN] * len(full), w=4.6)
    ax.text(85, 64.7, "x", ha="right", va="center", fontsize=9)
    noisy_row = ["<sot>", *masked_words, "<eot>"]
    faces = [PLAIN] + [MASKED if w == "[MASK]" else PLAIN for w in masked_words] + [PLAIN]
    end = chips(ax, 86, 58, noisy_row, faces, w=4.6)
    ax.text(85, 59.2, "x_t", ha="right", va="center", fontsize=9)
    ax.text(end - 0.5, 56.5, "t = 0.7 in this draw; <sot>, <eot> and pads are never masked", ha="right",
            va="top", fontsize=7.5)
    arrow(ax, (86, 58.5), (80.3, 56))
    arrow(ax, (80.3, 42), (85.5, 42))
    box(ax, 86, 37.5, 45, 9, "predict the original token at every [MASK]\n"
        "loss = (1/t) * sum of cross-entropies over masked tokens\n/ number of caption tokens in the batch",
        face="#fff7e6", edge="#d08c20", size=8)

    # sampling rows
    ax.text(1, 34, "Sampling (greedy unmasking): start from <sot> [MASK] x N' <eot>; each step reveals the one "
            "masked position the model is most confident about; revealed tokens never change",
            fontsize=10, weight="bold")
    n = len(words)
    revealed: set[int] = set()
    for step in range(n + 1):
        y = 28.5 - step * 3.7
        row, faces, notes = ["<sot>"], [PLAIN], [""]
        for p in range(n):
            row.append(words[p] if p in revealed else "[MASK]")
            faces.append(NEW if step and p == REVEAL_ORDER[step - 1] else REVEALED if p in revealed else MASKED)
            notes.append("")
        row.append("<eot>")
        faces.append(PLAIN)
        ax.text(14, y + 1.2, "canvas" if step == 0 else f"step {step}", ha="right", va="center", fontsize=8)
        chips(ax, 15, y, row, faces, w=5.6, h=2.6)
        if step < n:
            revealed.add(REVEAL_ORDER[step])
    ax.text(72, 20, "each step runs decoder g (same image tokens V) on the whole canvas\n"
            f"N' = {n} here ({n} steps; the paper uses N' in {{10, 15, 20}})\n"
            "orange: revealed this step (argmax token); green: revealed earlier\n"
            "the order shown is schematic: `mdc sample --json` prints a trained model's\n"
            "`mdc sample --threshold T` reveals every token >= T at once (fewer steps)",
            fontsize=8, va="center")
    fig.savefig(args.out, dpi=110, bbox_inches="tight")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
