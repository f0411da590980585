"""The paper's numbers (MDC, Feng et al. 2025): the one table that notebooks and plan summaries compare with.

Keys are the paper's table names (``table1`` ... ``table5``, ``fig4``, and the two measurements of its central
claim, ``position_signal`` and ``position_repeat``); a notebook reports its embedded-data
version of a table under the same key in ``metrics.json`` (:mod:`mdc_core.workbench.summary`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PaperTable:
    title: str  # what the paper's table measures
    metric: str  # the paper's metric and setting
    values: dict[str, Any]  # row -> number, or row -> {column -> number}


PAPER: dict[str, PaperTable] = {
    "table1": PaperTable("Table 1: linear probing, CLIP vs ARC vs MDC", "ImageNet-1k top-1 %, CC12M, ViT-B/32",
                         {"CLIP": 57.2, "ARC": 54.2, "MDC": 54.8}),
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
        "Table 3: captioning (MSCOCO fine-tuned)", "B@4 / C / RL x100",
        {"ARC": {"BLEU@4": 16.0, "CIDEr": 48.8, "ROUGE-L": 38.6}, "MDC-10": {"BLEU@4": 20.7, "CIDEr": 64.7,
         "ROUGE-L": 42.2}, "MDC-15": {"BLEU@4": 17.6, "CIDEr": 51.1, "ROUGE-L": 40.7},
         "MDC-20": {"BLEU@4": 13.6, "CIDEr": 24.1, "ROUGE-L": 37.0}}),
    "table4": PaperTable("Table 4: the 1/t weight", "ImageNet-1k top-1 %, CC12M, ViT-B/32 (removing 1/t: -0.8)",
                         {"MDC (w/o 1/t)": 54.0, "MDC": 54.8}),
    "table5": PaperTable("Table 5: noise schedule [w_l, w_u]", "ImageNet-1k top-1 %, CC3M, ViT-B/32",
                         {"[0.0, 1.0]": 29.3, "[0.3, 0.8]": 36.1, "[0.4, 0.9]": 38.6, "[0.5, 1.0]": 39.2}),
    "fig4": PaperTable("Fig. 4: BERT masking ratio vs MDC", "ImageNet-1k top-1 % (read off a plot; not tabulated)",
                       {}),
    "position_signal": PaperTable("Sec. 3: visual signal along the caption (central claim)",
                                  "argued, not measured: ARC's signal fades along the caption, MDC's does not", {}),
    "position_repeat": PaperTable("Sec. 3: the same word named again (central claim, word held fixed)",
                                  "argued, not measured: ARC can copy a repeated word from its prefix", {}),
}
