"""The small per-item sample committed under tests/items_sample/ (three seeds of one constructed run), for the test of
the recompute core (tests/workbench/test_items.py). Regenerate it with ``python -m tests.items_sample``
(deterministic; the
test checks that the committed files equal what this writes).

Each seed holds: a Table 1 probe (ARC, MDC and the random-init row; shape and colour; 40 test images), the
feature-order probes (ARC and MDC after each caption order) and the central claim's signal on 24 generated captions
per kind, built so the answers are known: ARC's signal falls along the caption (1 + 0.8 (0.5 - x)), MDC's is flat,
so the paper's sentence holds; ARC's probe is right on 80% of the images, MDC's on 78%, the random row's on 30%.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from mdc_core.tokenizer import CaptionTokenizer
from mdc_workbench.data.captions import clause_caption, short_caption
from mdc_workbench.data.scene import example_rng, sample_scene
from mdc_workbench.eval.items import RunItems, add_central_claim, add_feature_order, add_probe_table, write_items

ROOT = Path(__file__).resolve().parent / "items_sample"
SEEDS = (0, 1, 2)
N_IMAGES, N_CAPTIONS = 40, 24
TASKS = ("shape", "colour")
METRIC = "probe top-1 % (sample)"


def _result(rng: np.random.Generator, labels: dict[str, np.ndarray], right: float, pool: str, init: str
            ) -> dict[str, Any]:
    tasks = {}
    for task, y in labels.items():
        pred = np.where(rng.random(len(y)) < right, y, (y + 1 + rng.integers(0, 3, len(y))) % 5)
        correct = (pred == y).astype(int)
        tasks[task] = {"top1": float(correct.mean()), "test_correct": correct.tolist(), "test_label": y.tolist(),
                       "test_pred": pred.tolist()}
    return {"pool": pool, "init": init, "tasks": tasks}


def _captions(kind: str) -> list[tuple[str, list[int]]]:
    tok = CaptionTokenizer(77)
    out = []
    for i in range(N_CAPTIONS):
        rng = example_rng(0, "test", i)
        scene = sample_scene(rng, set(), difficulty="easy")
        if kind == "short":
            text, group = short_caption(scene, rng)[1], "all"
        else:
            text, group = clause_caption(scene, rng)[:2]
        out.append((group, tok.encode_text(text)))
    return out


def build(seed: int) -> tuple[RunItems, dict[str, Any]]:
    """One seed's per-item record, and the in-memory inputs it was made from (``probe``: a probe_models-like
    result; ``orders``: the feature-order probe results; ``scored``: ClaimScores per kind and row)."""
    from mdc_workbench.eval.central_claim import ClaimScores

    rng = np.random.default_rng(100 + seed)
    labels = {t: rng.integers(0, 5, N_IMAGES) for t in TASKS}
    results = {"ARC": _result(rng, labels, 0.8, "gap", "trained"), "MDC": _result(rng, labels, 0.78, "gap", "trained"),
               "random init": _result(rng, labels, 0.3, "gap", "random")}
    orders = {order: {row: _result(rng, labels, right, "gap", "trained") for row, right in (("ARC", r1), ("MDC", r2))}
              for order, r1, r2 in (("shape_last", 0.6, 0.75), ("colour_last", 0.85, 0.8))}
    scored = {}
    for kind in ("short", "clauses"):
        caps = _captions(kind)
        rows = {}
        for row, fall in (("ARC", 0.8), ("MDC", 0.0)):
            grads, pmis = [], []
            for _, ids in caps:
                x = np.arange(len(ids)) / (len(ids) - 1)
                g = 1 + fall * (0.5 - x) + 0.03 * rng.standard_normal(len(ids))
                vals: list[float | None] = [float(v) for v in g]
                if row == "MDC":
                    vals[int(rng.integers(len(ids)))] = None  # a position no mask draw covered
                grads.append(vals)
                pmis.append([None if v is None else math.log(v) for v in vals])
            rows[row] = ClaimScores("teacher_forcing" if row == "ARC" else "masked", [g for g, _ in caps],
                                    [ids for _, ids in caps], grads, pmis)
        scored[kind] = rows
    items = RunItems(f"03_sample__seed={seed}", seed)
    add_probe_table(items, "table1", {"results": results}, metric=METRIC, rows=["ARC", "MDC", "random init"],
                    tasks=TASKS, mean_tasks=TASKS)
    add_feature_order(items, orders)
    add_central_claim(items, scored)
    return items, {"results": results, "orders": orders, "scored": scored}


def main() -> None:
    for seed in SEEDS:
        items, _ = build(seed)
        print(write_items(items, ROOT / items.run_id / "items.npz"))


if __name__ == "__main__":
    main()
