"""``summary.png`` of ``mdc runs``: every panel of a realistic plan (the paper's tables as the notebooks write them,
three training seeds each) renders with no text outside the figure, and the checker catches text that is."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mdc_workbench.runs.evidence import display_tables, gather_runs
from mdc_workbench.runs.summary import RunResult, clipped_texts, metric_unit, read_metrics, summary_figure

TASKS = ("colour", "shape", "count", "position", "size")
PROBE_METRIC = (f"probe top-1 % and gain over random init (mean over {', '.join(TASKS)}), short captions, probed on "
                "held-out images")
ABLATION_METRIC = (f"mean probe top-1 % and gain over random init ({', '.join(TASKS)}), short captions, probed on "
                   "held-out images")
CAPTION_METRIC = ("scores x 100, repetition % and mean length (tokens) on the test captions; MDC-N: N tokens, median "
                  "length: N' = 9 for every image, oracle: each image's reference length, auto: MDC picks its own, "
                  "ARC's length: each image at the length of ARC's beam caption; ARC: beam search (the paper's row) "
                  "and greedy")
PARAMS = {"preset": "tiny_fast", "steps": 400, "n_train": 20000, "difficulty": "easy", "captions": "short"}


def _probe(rows: dict[str, float], rng: np.random.Generator) -> dict:
    """A probe table as probe_report.probe_table writes it: top-1, gain and gain per task, with per-image items."""
    values, items = {}, {}
    for row, top1 in rows.items():
        items[row] = {"top-1": list((rng.random(40) < top1 / 100) * 100.0)}  # each test image right or wrong
        values[row] = {"top-1": float(np.mean(items[row]["top-1"]))}  # the items' mean, as the notebooks write
        if not row.startswith("random init"):
            items[row]["gain"] = list(rng.normal(top1 - 30, 20, 40))
            values[row]["gain"] = float(np.mean(items[row]["gain"]))
            for t in TASKS:
                values[row][f"gain {t}"] = top1 - 30 + rng.normal(0, 5)
    return {"values": values, "items": items}


def realistic_metrics(seed: int) -> dict[str, dict]:
    """metrics.json of the notebooks of a paper-reproduction plan (notebook -> its record) for training seed `seed`."""
    rng = np.random.default_rng(seed)
    schedules = {"[0.0, 1.0]": 41.0, "[0.3, 0.8]": 44.0, "[0.4, 0.9]": 46.0, "[0.5, 1.0]": 47.0,
                 "random init (ViT)": 30.0}
    table3 = {row: {"BLEU@4": b + rng.normal(0, 1), "METEOR": 20 + rng.normal(0, 1), "ROUGE-L": 45.0,
                    "CIDEr": 80 + b, "SPICE": 15.0, "repetition": 3 + rng.normal(0, 1), "length": n}
              for row, b, n in (("ARC", 20.0, 9.1), ("ARC (greedy)", 18.0, 8.7), ("MDC-5", 10.0, 5.0),
                                ("MDC-10", 17.0, 10.0), ("MDC (median length)", 19.0, 9.0),
                                ("MDC (oracle length)", 22.0, 9.3), ("MDC (auto length)", 18.5, 8.8))}
    return {
        "02_noise_schedule_ablation": {
            "table5": {"metric": ABLATION_METRIC, **_probe(schedules, rng)},
            "table4": {"metric": ABLATION_METRIC, **_probe({"MDC (w/o 1/t)": 45.0, "MDC": 47.0,
                                                           "random init (ViT)": 30.0}, rng)},
            "fig4": {"metric": ABLATION_METRIC, **_probe({"BERT (mask 0.15)": 40.0, "BERT (mask 0.4)": 43.0,
                                                         "MDC": 47.0, "random init (ViT)": 30.0}, rng)}},
        "03_linear_probing": {
            "table1": {"metric": PROBE_METRIC, **_probe({"CLIP": 50.0, "ARC": 48.0, "MDC": 47.0,
                                                        "random init (ViT)": 30.0, "raw pixels": 25.0}, rng)},
            "position_signal": {"metric": "signal fade along the caption (nats; per caption its later half minus its "
                                          "earlier half, mean over captions)",
                                "values": {"ARC": -0.4 + rng.normal(0, 0.05), "MDC": 0.02 + rng.normal(0, 0.05)}},
            "visual_signal": {"metric": "visual learning signal: per-caption slope of the normalised per-token "
                                        "measure against the position along the caption; mean over captions",
                              "values": {"ARC": -0.3 + rng.normal(0, 0.05), "MDC": rng.normal(0, 0.05)}}},
        "04_compositionality": {
            "table2": {"metric": "pick-the-true-caption accuracy %, embedded negatives (columns: its categories)",
                       "values": {r: {c: 50 + 40 * rng.random() for c in ("relation", "attribute", "colour swap",
                                                                            "shape swap", "count", "order")}
                                  for r in ("CLIP", "ARC", "MDC (Monte Carlo)", "MDC (Heuristic)")}}},
        "05_captioning": {"table3": {"metric": CAPTION_METRIC, "values": table3}},
    }


def realistic_plan(root: Path, seeds: tuple[int, ...] = (0, 1, 2)) -> list[RunResult]:
    """Run folders with the notebooks' metrics.json, one per notebook and seed."""
    results = []
    for seed in seeds:
        for notebook, tables in realistic_metrics(seed).items():
            run = root / f"{notebook}_s{seed}"
            run.mkdir(parents=True)
            (run / "metrics.json").write_text(json.dumps({"notebook": notebook, "metrics": {"seed": seed},
                                                          "tables": tables}))
            results.append(RunResult(f"{notebook}_s{seed}", notebook, "done", run, duration_s=60.0 + seed,
                                     parameters={**PARAMS, "train_seed": seed}))
    return results


def _figure_for(root: Path, seeds: tuple[int, ...] = (0, 1, 2), keep: tuple[str, ...] = ()):
    results = realistic_plan(root, seeds)
    gathered = gather_runs([(r.run_id, r.parameters, read_metrics(r.run_dir)) for r in results])
    tables = display_tables(gathered)
    if keep:
        tables = {k: v for k, v in tables.items() if k in keep}
    return tables, summary_figure(results, tables)


def test_every_panel_of_a_realistic_plan_fits_and_says_what_it_shows(tmp_path):
    tables, fig = _figure_for(tmp_path)
    assert clipped_texts(fig) == []
    axes = [ax for ax in fig.axes if ax.get_title()]
    titles = [ax.get_title() for ax in axes]
    units = {ax.get_title().splitlines()[0]: ax.get_ylabel().replace("\n", " ") for ax in axes}
    assert len(axes) == 10 + 1  # 8 tables, Table 3 in three units, and the runs
    assert not any("MSCOCO" in t for t in titles)  # the paper's data set is not ours
    assert all("embedded data: tiny_fast models, 400 steps" in t.replace("\n", " ") for t in titles[:-1])
    assert units["Table 1: linear probing on alt-text captions"] == "probe top-1 % and gain over random init"
    assert units["Table 4: the 1/t weight"] == "mean probe top-1 % and gain over random init"
    assert units["Table 3: captioning: scores"] == "scores x 100"
    assert units["Table 3: captioning: repetition"] == "captions repeating a word (%)"
    assert units["Table 3: captioning: length"] == "mean caption length (tokens)"
    scores = next(ax for ax in axes if ax.get_title().startswith("Table 3: captioning: scores"))
    assert [t.get_text() for t in scores.get_xticklabels()] == ["BLEU@4", "METEOR", "ROUGE-L", "CIDEr", "SPICE"]
    for ax in axes[:-1]:
        legend = ax.get_legend()
        assert min(t.get_fontsize() for t in legend.get_texts()) >= 8
        below = legend.get_window_extent(fig.canvas.get_renderer()).transformed(ax.transData.inverted()).y0
        assert ax.dataLim.y1 < below  # no bar or error bar reaches into the legend


def test_one_seed_one_table_and_a_paper_column_fit_too(tmp_path):
    tables, fig = _figure_for(tmp_path, seeds=(0,), keep=("table3",))
    assert clipped_texts(fig) == [] and len([ax for ax in fig.axes if ax.get_title()]) == 3 + 1
    one_d = {"table5": {"metric": "colour probe top-1 (%)", "values": {"[0.0, 1.0]": "40", "[0.5, 1.0]": "47"},
                        "means": {"[0.0, 1.0]": 40.0, "[0.5, 1.0]": 47.0},
                        "intervals": {"[0.0, 1.0]": (38.0, 42.0), "[0.5, 1.0]": (44.0, 46.0)}}}
    fig = summary_figure([], one_d)  # the paper's one column beside ours; an interval that misses its mean; no runs
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["embedded data (ours, 95% interval)", "paper"] and clipped_texts(fig) == []


def test_the_checker_finds_a_label_cut_by_the_figure_edge():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3, 2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_ylabel("a y label much too long for a figure two inches tall, left unwrapped as the old one was")
    fig.tight_layout()
    cut = clipped_texts(fig)
    assert len(cut) == 1 and cut[0].startswith("'a y label much too long")
    ax.set_ylabel("short")
    assert clipped_texts(fig) == []


def test_metric_unit_by_hand():
    assert metric_unit(PROBE_METRIC) == "probe top-1 % and gain over random init"
    assert metric_unit(CAPTION_METRIC) == "scores x 100, repetition % and mean length"
    assert metric_unit("signal fade along the caption (nats; per caption ...)") == "signal fade along the caption"
    assert metric_unit("reliance slope: nats per position; mean over captions") == "nats per position"
    assert metric_unit("") == "value"
