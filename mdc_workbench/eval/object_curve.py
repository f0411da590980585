"""Object-naming accuracy over training: when does a run learn to name colour and shape?

Every complete checkpoint of an MDC-family run captions the same held-out images of the embedded data set
(greedy, paper Eq. 6, at one or more canvas lengths N'); :func:`mdc_workbench.eval.report.caption_report` scores the
single-object scenes: a caption is right when it names the object's colour and its shape. On the embedded data
the colour words come early and the shape words late and abruptly, so a curve over the checkpoints shows where a
run stands far better than its final figure (``mdc eval objects``; ``train.keep_last`` decides how many
checkpoints a run keeps).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mdc_core.checkpoint import list_checkpoints
from mdc_core.factory import load_model
from mdc_core.objectives import objective_spec
from mdc_workbench.eval.figures import save_png
from mdc_workbench.eval.report import caption_report


def object_accuracy_curve(run: str | Path, *, data: str | Path | None = None, lengths: Sequence[int] = (),
                          split: str = "test", limit: int = 512, batch_size: int = 64, device: str = "cpu",
                          ema: bool = False, progress: bool = True) -> dict[str, Any]:
    """Single-object colour+shape accuracy of `run`'s greedy captions at each of its checkpoints.

    `data` defaults to the run's own ``data.path``; `lengths` (N') to the run's ``sampler.length``. Returns a
    JSON-ready dict ``{"run", "data", "split", "points": [{"step", "length", "accuracy", "n_single_object"}],
    "examples": [...]}``; `examples` are the last checkpoint's captions at the first length.
    """
    run = Path(run)
    ckpts = list_checkpoints(run)
    if not ckpts:
        raise FileNotFoundError(f"{run} holds no complete checkpoint (is it a run folder of `mdc train`?)")
    if limit < 1 or batch_size < 1:
        raise ValueError(f"limit and batch_size must be >= 1, got {limit} and {batch_size}")
    if any(n < 1 for n in lengths):
        raise ValueError(f"caption lengths N' must be >= 1, got {list(lengths)}")
    points: list[dict[str, Any]] = []
    examples: list[dict[str, Any]] = []
    for ckpt in ckpts:
        model, cfg = load_model(ckpt, device=device, ema=ema)
        if objective_spec(cfg.objective.name).decoder != "unmask":  # ARC, CLIP, MC-Diffusion
            raise ValueError(f"{run} is a {cfg.objective.name} run: this curve needs an MDC-family captioner "
                             "(mdc, mdc_no_t, bert, parallel)")
        data_cfg = cfg.data if data is None else dataclasses.replace(cfg.data, path=str(data))
        step = json.loads((ckpt / "meta.json").read_text())["step"]
        for n in lengths or (cfg.sampler.length,):
            report = caption_report(model, data_cfg, dataclasses.replace(cfg.sampler, length=n), split=split,
                                    limit=limit, batch_size=batch_size, device=device, progress=progress)
            if not report["n_single_object"]:
                raise ValueError(f"{data_cfg.path} ({split}) has no single-object scenes with colour/shape labels "
                                 "among its first images: this curve needs the embedded data set "
                                 "(`mdc data synth`)")
            points.append({"step": step, "length": n, "accuracy": report["single_object_accuracy"],
                           "n_single_object": report["n_single_object"]})
            if ckpt == ckpts[-1] and not examples:
                examples = report["captions"][:16]
    return {"run": str(run), "data": str(data_cfg.path), "split": split, "limit": limit, "ema": ema,
            "points": points, "examples": examples}


def curve_table(result: dict[str, Any]) -> str:
    """Markdown table: one row per checkpoint step, one column per N'."""
    lengths = sorted({p["length"] for p in result["points"]})
    steps = sorted({p["step"] for p in result["points"]})
    acc = {(p["step"], p["length"]): p for p in result["points"]}
    rows = ["| step | " + " | ".join(f"N'={n}" for n in lengths) + " |", "|---" * (len(lengths) + 1) + "|"]
    for s in steps:
        cells = [f"{acc[s, n]['accuracy']:.1%} of {acc[s, n]['n_single_object']}" if (s, n) in acc else "-"
                 for n in lengths]
        rows.append(f"| {s} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def plot_object_curves(results: Sequence[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """Accuracy against training step, one line per (run, N'); a PNG at `path`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for result in results:
        name = result.get("label") or Path(result["run"]).name
        for n in sorted({p["length"] for p in result["points"]}):
            pts = sorted((p["step"], p["accuracy"]) for p in result["points"] if p["length"] == n)
            ax.plot([s for s, _ in pts], [100 * a for _, a in pts], marker="o", ms=3, label=f"{name}, N'={n}")
    ax.axhline(90, color="grey", lw=0.8, ls="--")
    ax.set_ylim(0, 100)
    ax.set_xlabel("training step")
    ax.set_ylabel("single-object scenes named right (%)")
    ax.set_title(title or "greedy captions naming colour and shape")
    ax.legend(fontsize=7)
    return save_png(fig, path)
