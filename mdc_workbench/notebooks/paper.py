"""The paper's numbers (MDC, Feng et al. 2025): the one table that notebooks and plan summaries compare with.

Keys are the workbench's table names (``table1`` ... ``table5``, ``table1_long``, ``fig4``, and the measurements of
its central claim, ``central_claim``, and of its consequence for features, ``feature_order``); a notebook reports its
embedded-data version of a table under the same key in ``metrics.json`` (:mod:`mdc_workbench.notebooks.summary`).
Each number is quoted from the column that matches the workbench's metric: a probe table's mean over tasks is
the paper's Table 1 "Average" column (Tables 4 and 5 report ImageNet-1k only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PaperTable:
    title: str  # what the paper's table measures
    metric: str  # the paper's metric and setting
    values: dict[str, Any]  # row -> number, or row -> {column -> number}


_AVERAGE = "Average top-1 % over ImageNet-1k, Food101, CIFAR-10, CIFAR-100 and Pets (Table 1's Average column)"

PAPER: dict[str, PaperTable] = {
    "table1": PaperTable(
        "Table 1: linear probing on alt-text captions (CLIP vs ARC vs MDC)", f"{_AVERAGE}, pretrained on CC12M",
        {"CLIP": {"ViT-B/32": 71.7, "ViT-B/16": 78.5, "ViT-L/14": 81.0},
         "ARC": {"ViT-B/32": 69.5, "ViT-B/16": 77.4, "ViT-L/14": 80.2},
         "MDC": {"ViT-B/32": 68.7, "ViT-B/16": 77.2, "ViT-L/14": 80.6}}),
    "table1_long": PaperTable(
        "Table 1: linear probing on long descriptive captions", f"{_AVERAGE}, pretrained on Recap-DataComp-10M "
        "(CLIP-LB: twice the batch size)",
        {"CLIP-LB": {"ViT-B/32": 70.9, "ViT-B/16": 76.2, "ViT-L/14": 77.7},
         "CLIP": {"ViT-B/32": 69.7, "ViT-B/16": 74.8, "ViT-L/14": 76.3},
         "ARC": {"ViT-B/32": 76.3, "ViT-B/16": 80.6, "ViT-L/14": 83.3},
         "MDC": {"ViT-B/32": 74.6, "ViT-B/16": 80.2, "ViT-L/14": 83.1}}),
    "table2": PaperTable(
        "Table 2: compositionality (pick the true caption)", "accuracy %, ARO and SugarCrepe",
        {"CLIP": {"relation": 53.6, "attribute": 59.7, "coco order": 27.2, "flickr30k order": 29.5, "add": 66.5,
                  "replace": 72.8, "swap": 61.3},
         "ARC": {"relation": 82.7, "attribute": 76.0, "coco order": 97.7, "flickr30k order": 98.4, "add": 97.6,
                 "replace": 77.4, "swap": 76.9},
         "MDC (Monte Carlo)": {"relation": 85.1, "attribute": 84.3, "coco order": 89.0, "flickr30k order": 89.0,
                               "add": 85.6, "replace": 75.8, "swap": 75.2},
         "MDC (Heuristic)": {"relation": 84.6, "attribute": 81.2, "coco order": 98.4, "flickr30k order": 98.8,
                             "add": 97.8, "replace": 77.9, "swap": 78.5}}),
    "table3": PaperTable(
        "Table 3: captioning (MSCOCO, after fine-tuning)",
        "scores x 100 on MSCOCO; LLM: Qwen2.5-VL's selection rate %; ARC: beam search, beam 6; MDC-N: N tokens",
        {"ARC": {"BLEU@4": 16.0, "METEOR": 23.9, "CIDEr": 48.8, "SPICE": 17.4, "ROUGE-L": 38.6, "LLM": 33.9},
         "MDC-10": {"BLEU@4": 20.7, "METEOR": 14.3, "CIDEr": 64.7, "SPICE": 16.0, "ROUGE-L": 42.2, "LLM": 19.2},
         "MDC-15": {"BLEU@4": 17.6, "METEOR": 23.1, "CIDEr": 51.1, "SPICE": 18.3, "ROUGE-L": 40.7, "LLM": 23.6},
         "MDC-20": {"BLEU@4": 13.6, "METEOR": 31.9, "CIDEr": 24.1, "SPICE": 18.6, "ROUGE-L": 37.0, "LLM": 23.3}}),
    "table4": PaperTable("Table 4: the 1/t weight", "ImageNet-1k top-1 % (the only column), ViT-B/32",
                         {"CMLM (w/o 1/t, per masked token)": {"CC12M": 54.0, "Recap-DataComp-10M": 59.5},
                          "MDC": {"CC12M": 54.8, "Recap-DataComp-10M": 60.7}}),
    "table5": PaperTable("Table 5: noise schedule [w_l, w_u]",
                         "ImageNet-1k top-1 % (the only column), pretrained on CC3M, ViT-B/32",
                         {"[0.0, 1.0]": {"ImageNet-1k": 29.3}, "[0.3, 0.8]": {"ImageNet-1k": 36.1},
                          "[0.4, 0.9]": {"ImageNet-1k": 38.6}, "[0.5, 1.0]": {"ImageNet-1k": 39.2}}),
    "fig4": PaperTable("Fig. 4: BERT masking ratio vs MDC", "ImageNet-1k top-1 % (read off a plot; not tabulated)",
                       {}),
    "central_claim": PaperTable("Sec. 1: the visual learning signal along the caption (central claim)",
                                "argued, not measured: ARC's visual learning signal weakens at later positions, "
                                "MDC's does not depend on position", {}),
    "feature_order": PaperTable("Sec. 1: the consequence for features (ours)",
                                "argued, not measured: a signal that does not depend on position gives better "
                                "features", {}),
}
