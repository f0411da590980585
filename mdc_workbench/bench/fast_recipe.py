"""Accuracy against training time on the CPU: the measurements behind docs/fast_recipe.md.

Verbs (run from the repository root)::

    python -m mdc_workbench.bench.fast_recipe run --preset tiny --data DATA --out RUN [--steps N] [--set K=V ...]
    python -m mdc_workbench.bench.fast_recipe eval RUN [--limit 512]
    python -m mdc_workbench.bench.fast_recipe profile --preset tiny --data DATA [--set K=V ...] [--threads 1]
    python -m mdc_workbench.bench.fast_recipe probe RUN [RUN ...] --data DATA
    python -m mdc_workbench.bench.fast_recipe plot --out docs/fast_recipe_curves.png RUN [RUN ...] [--label RUN=NAME]

``run`` trains in this process with ``torch.set_num_threads(--threads)`` (default 2) and a checkpoint every
``--every`` steps (all kept), while a watcher thread notes, the moment each checkpoint appears, the wall time and
the process CPU time (``time.process_time``: every thread of this process) since training started, in
``RUN/timing.jsonl``. It then runs ``eval``: the single-object colour+shape accuracy of every checkpoint
(:func:`mdc_workbench.eval.report.caption_report` on the first ``--limit`` test images, greedy, the run's N', as
``mdc eval objects``), merged with the timings into ``RUN/recipe_curve.json``; ``eval`` can also follow a run
that is still training (only new checkpoints are captioned). ``plot`` draws accuracy against the *idle-machine
estimate* ``cpu_s / threads`` (on a shared machine the wall time is inflated by the other processes; CPU time
much less so), or with ``--clock RUN`` against the wall time that RUN, timed alone on the idle machine, took to
reach the same step; it writes the table beside the PNG as JSON and markdown. ``probe`` fits converged linear probes
(scikit-learn L-BFGS logistic regression) on the mean-pooled encoder features of every checkpoint and of the
same architecture at random initialisation.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any


def _watch(run: Path, t0: float, c0: float, stop: threading.Event, log: Path) -> None:
    """Append {step, wall_s, cpu_s} to `log` for every complete checkpoint of `run` as soon as it appears."""
    from mdc_core.checkpoint import list_checkpoints

    seen: set[str] = set()
    with open(log, "a") as fh:
        while True:
            done = stop.is_set()
            for ckpt in list_checkpoints(run):
                if ckpt.name not in seen:
                    seen.add(ckpt.name)
                    step = int(ckpt.name.split("_")[-1])
                    fh.write(json.dumps({"step": step, "wall_s": round(time.perf_counter() - t0, 2),
                                         "cpu_s": round(time.process_time() - c0, 2)}) + "\n")
                    fh.flush()
            if done:
                return
            stop.wait(0.2)


def cmd_run(args: argparse.Namespace) -> None:
    import torch

    from mdc_core.config import load_preset
    from mdc_core.train import train

    torch.set_num_threads(args.threads)
    sets = [f"data.path={args.data}", f"train.ckpt_every={args.every}", "train.keep_last=1000",
            "train.device=cpu", f"train.seed={args.seed}", *args.set]
    if args.steps:
        sets.append(f"train.steps={args.steps}")
    cfg = load_preset(args.preset, sets)
    run = Path(args.out)
    run.mkdir(parents=True, exist_ok=True)
    log = run / "timing.jsonl"
    log.unlink(missing_ok=True)
    (run / "recipe_curve.json").unlink(missing_ok=True)
    start = {"preset": args.preset, "sets": sets, "threads": args.threads, "command": " ".join(sys.argv)}
    (run / "timing_start.json").write_text(json.dumps(start, indent=1) + "\n")
    stop = threading.Event()
    t0, c0 = time.perf_counter(), time.process_time()
    watcher = threading.Thread(target=_watch, args=(run, t0, c0, stop, log), daemon=True)
    watcher.start()
    try:
        train(cfg, run, progress=not args.quiet)
    finally:
        stop.set()
        watcher.join()
    meta = {**start, "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}
    (run / "timing_meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"trained {run}: {meta['wall_s']:.0f} s wall, {meta['cpu_s']:.0f} s CPU ({args.threads} threads)")
    if not args.no_eval:
        evaluate(run, args.limit, args.threads)


def evaluate(run: Path, limit: int, threads: int) -> dict[str, Any]:
    """Accuracy of every checkpoint of `run` not evaluated yet (a run still training can be evaluated again),
    merged with its timings into ``RUN/recipe_curve.json``."""
    import torch

    from mdc_core.checkpoint import list_checkpoints
    from mdc_core.factory import load_model
    from mdc_workbench.eval.report import caption_report

    torch.set_num_threads(threads)
    out = run / "recipe_curve.json"
    old = {p["step"]: p for p in json.loads(out.read_text())["points"]} if out.is_file() else {}
    timing = {r["step"]: r for r in map(json.loads, (run / "timing.jsonl").read_text().splitlines())}
    meta_file = run / "timing_meta.json"
    meta = json.loads(meta_file.read_text()) if meta_file.is_file() else {
        **json.loads((run / "timing_start.json").read_text()), "running": True}
    examples: list[dict[str, Any]] = []
    for ckpt in list_checkpoints(run):
        step = int(ckpt.name.split("_")[-1])
        if step in old or step not in timing:
            continue
        model, cfg = load_model(ckpt, device="cpu")
        report = caption_report(model, cfg.data, cfg.sampler, split="test", limit=limit, batch_size=64,
                                device="cpu", progress=False)
        t = timing[step]
        old[step] = {"step": step, "length": cfg.sampler.length, "accuracy": report["single_object_accuracy"],
                     "n_single_object": report["n_single_object"], "wall_s": t["wall_s"], "cpu_s": t["cpu_s"],
                     "idle_min_est": round(t["cpu_s"] / meta["threads"] / 60, 2)}
        examples = report["captions"][:8]
    points = [old[s] for s in sorted(old)]
    result = {"run": str(run), **meta, "limit": limit, "points": points}
    if examples:
        result["examples"] = examples
    out.write_text(json.dumps(result, indent=1) + "\n")
    for p in points:
        print(f"{run.name} step {p['step']:5d}  acc {p['accuracy']:.3f}  wall {p['wall_s'] / 60:6.1f} min  "
              f"cpu/{meta['threads']} {p['idle_min_est']:6.1f} min")
    return result


def cmd_eval(args: argparse.Namespace) -> None:
    for run in args.run:
        evaluate(Path(run), args.limit, args.threads)


def cmd_profile(args: argparse.Namespace) -> None:
    """CPU time per training step, split into data (next batch + tokenising) and model (forward, backward,
    AdamW), after 2 warm-up steps; and the FLOPs of one step (torch's FlopCounterMode)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from mdc_core.config import load_preset
    from mdc_core.data import build_loader
    from mdc_core.objectives import compute_loss
    from mdc_core.tokenizer import CaptionTokenizer
    from mdc_core.train import init_model, param_groups

    torch.set_num_threads(args.threads)
    cfg = load_preset(args.preset, [f"data.path={args.data}", *args.set])
    torch.manual_seed(0)
    model, cfg = init_model(cfg)
    model.train()
    opt = torch.optim.AdamW(param_groups(model, cfg.train.weight_decay), lr=cfg.train.lr)
    tok, gen = CaptionTokenizer(cfg.model.context_length), torch.Generator().manual_seed(0)
    batches = iter(build_loader(cfg.data, split="train", image_size=cfg.model.image_size,
                                batch_size=cfg.train.batch_size))
    cost = {"data_wall": 0.0, "data_cpu": 0.0, "model_wall": 0.0, "model_cpu": 0.0}
    for i in range(args.steps + 2):
        w0, c0 = time.perf_counter(), time.process_time()
        batch = next(batches)
        tokens, _ = tok.tokenize_batch(batch["caption"])
        w1, c1 = time.perf_counter(), time.process_time()
        compute_loss(model, batch["image"], tokens, cfg.objective, gen).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        w2, c2 = time.perf_counter(), time.process_time()
        if i >= 2:
            for k, v in (("data_wall", w1 - w0), ("data_cpu", c1 - c0), ("model_wall", w2 - w1),
                         ("model_cpu", c2 - c1)):
                cost[k] += v / args.steps
    with FlopCounterMode(display=False) as flops:
        compute_loss(model, batch["image"], tokens, cfg.objective, gen).loss.backward()
    opt.zero_grad(set_to_none=True)
    row = {"preset": args.preset, "sets": args.set, "threads": args.threads, "batch": cfg.train.batch_size,
           **{f"{k}_ms": round(1000 * v, 1) for k, v in cost.items()},
           "gflop_per_step": round(flops.get_total_flops() / 1e9, 1)}
    print(json.dumps(row))
    if args.out:
        with open(args.out, "a") as fh:
            fh.write(json.dumps(row) + "\n")


PROBE_TASKS = ("shape", "count", "position", "colour", "background")


def _fit_probe(tx: Any, ty: Any, vx: Any, vy: Any, seed: int = 0) -> float:
    """Test accuracy of an L-BFGS logistic regression on standardised features, trained to convergence, with
    the inverse regularisation C picked on a 20% validation split of the training features."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(seed)
    order = rng.permutation(len(tx))
    n_val = len(tx) // 5
    val, fit = order[:n_val], order[n_val:]

    def model(c: float, x: Any, y: Any) -> Any:
        scaler = StandardScaler().fit(x)
        clf = LogisticRegression(C=c, max_iter=3000, tol=1e-5).fit(scaler.transform(x), y)
        return lambda z: clf.predict(scaler.transform(z))

    scores = {c: float((model(c, tx[fit], ty[fit])(tx[val]) == ty[val]).mean()) for c in (0.01, 0.1, 1.0, 10.0)}
    best = max(scores, key=scores.get)
    return float((model(best, tx, ty)(vx) == vy).mean())


def cmd_probe(args: argparse.Namespace) -> None:
    """Linear probes (shape, count, position, colour, background) of the mean-pooled encoder features of each
    checkpoint of each run and of the same architecture at random initialisation (step 0)."""
    import warnings

    import torch

    from mdc_core.checkpoint import list_checkpoints
    from mdc_core.config import RunConfig
    from mdc_core.factory import load_model
    from mdc_core.train import init_model
    from mdc_workbench.eval.probe_data import extract_features, open_probe_dataset

    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=UserWarning)
    train_set = open_probe_dataset(args.data, "train", "synth", args.n_train)
    test_set = open_probe_dataset(args.data, "test", "synth", args.n_test)
    for run in map(Path, args.run):
        cfg = RunConfig.load(run / "config.json")
        torch.manual_seed(cfg.train.seed + 1000)  # an untrained model of the same architecture
        models = [(0, init_model(cfg)[0].eval())]
        ckpts = list_checkpoints(run)
        chosen = ckpts if not args.steps else [c for c in ckpts if int(c.name.split("_")[-1]) in args.steps]
        models += [(int(c.name.split("_")[-1]), c) for c in chosen]
        rows = []
        for step, model in models:
            if not isinstance(model, torch.nn.Module):
                model = load_model(model, device="cpu")[0]
            tx, ty = extract_features(model, train_set, pool="gap", image_size=cfg.model.image_size)
            vx, vy = extract_features(model, test_set, pool="gap", image_size=cfg.model.image_size)
            row = {"step": step, **{t: _fit_probe(tx.numpy(), ty[t].numpy(), vx.numpy(), vy[t].numpy())
                                    for t in PROBE_TASKS}}
            rows.append(row)
            print(f"{run.name} step {step:5d}  " + "  ".join(f"{t} {row[t]:.3f}" for t in PROBE_TASKS), flush=True)
        out = {"run": str(run), "objective": cfg.objective.name, "data": args.data, "n_train": args.n_train,
               "n_test": args.n_test, "pool": "gap", "probe": "sklearn LogisticRegression (lbfgs), standardised, "
               "C in {0.01, 0.1, 1, 10} picked on 20% of train", "rows": rows}
        (run / "probe_curve.json").write_text(json.dumps(out, indent=1) + "\n")


def cmd_plot(args: argparse.Namespace) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    labels = dict(x.split("=", 1) for x in args.label)
    results = [json.loads((Path(r) / "recipe_curve.json").read_text()) for r in args.run]
    clocks = dict(c.split("=", 1) if "=" in c else ("", c) for c in args.clock)  # run -> clock run, "" = default
    for run, res in zip(args.run, results, strict=True):  # time axis = an idle run of the same model, same step
        clock = clocks.get(run, clocks.get(""))
        if clock is None:
            continue
        timed = sorted((p["step"], p["wall_s"]) for p in json.loads(
            (Path(clock) / "recipe_curve.json").read_text())["points"])
        steps, walls = np.array([s for s, _ in timed], float), np.array([w for _, w in timed], float)
        rate = (walls[-1] - walls[0]) / (steps[-1] - steps[0])  # s per step past the clock's last checkpoint
        for p in res["points"]:
            wall = np.interp(p["step"], steps, walls) if p["step"] <= steps[-1] else \
                walls[-1] + rate * (p["step"] - steps[-1])
            p["idle_min_est"] = round(float(wall) / 60, 2)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    rows = []
    for run, res in zip(args.run, results, strict=True):
        name = labels.get(run, Path(run).name)
        pts = sorted(res["points"], key=lambda p: p["step"])
        ax.plot([p["idle_min_est"] for p in pts], [100 * p["accuracy"] for p in pts], marker="o", ms=3,
                label=name)
        first90 = next((p for p in pts if p["accuracy"] >= 0.9), None)
        rows.append({"label": name, "run": run, "command": res.get("command", ""), "steps": pts[-1]["step"],
                     "final_accuracy": pts[-1]["accuracy"], "final_idle_min_est": pts[-1]["idle_min_est"],
                     "final_wall_min": round(pts[-1]["wall_s"] / 60, 2),
                     "first_90": None if first90 is None else {k: first90[k] for k in
                                                               ("step", "accuracy", "idle_min_est", "wall_s")},
                     "points": [{k: p[k] for k in ("step", "accuracy", "idle_min_est", "wall_s", "cpu_s")}
                                for p in pts]})
    if args.reference:  # accuracy by step from elsewhere (e.g. GPU runs of the same recipe) x CPU s per step here
        ref = json.loads(Path(args.reference).read_text())
        for i, r in enumerate(r for r in ref["runs"] if args.reference_match in r["label"]):
            pts = sorted((p["step"], p["accuracy"]) for p in r["points"])
            ax.plot([s * args.reference_s_per_step / 60 for s, _ in pts], [100 * a for _, a in pts], color="grey",
                    lw=0.8, alpha=0.7, label=f"{args.reference_label} (step x {args.reference_s_per_step} s)"
                    if i == 0 else None)
    ax.axhline(90, color="grey", lw=0.8, ls="--")
    ax.axvline(11, color="grey", lw=0.8, ls=":")
    ax.set_ylim(0, 100)
    ax.set_xlabel("wall minutes of an idle timed run of the same model at the same step" if clocks
                  else "training time, idle estimate: process CPU s / threads / 60 (min)")
    ax.set_ylabel("single-object scenes named right (%)")
    ax.set_title(args.title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    out = Path(args.out)
    fig.savefig(out, dpi=120)
    out.with_suffix(".json").write_text(json.dumps({"runs": rows}, indent=1) + "\n")
    table = ["| run | steps | first >= 90% (step, idle min est.) | final acc | final idle min est. | final wall min |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        f90 = "-" if r["first_90"] is None else f"{r['first_90']['step']}, {r['first_90']['idle_min_est']:.1f}"
        table.append(f"| {r['label']} | {r['steps']} | {f90} | {r['final_accuracy']:.1%} | "
                     f"{r['final_idle_min_est']:.1f} | {r['final_wall_min']:.1f} |")
    out.with_suffix(".md").write_text("\n".join(table) + "\n")
    print("\n".join(table))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m mdc_workbench.bench.fast_recipe", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="verb", required=True)
    run = sub.add_parser("run", help="train with timed checkpoints, then evaluate every checkpoint")
    run.add_argument("--preset", default="tiny")
    run.add_argument("--data", required=True)
    run.add_argument("--out", required=True)
    run.add_argument("--steps", type=int)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--every", type=int, default=250, help="steps between (timed) checkpoints")
    run.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    run.add_argument("--threads", type=int, default=2)
    run.add_argument("--limit", type=int, default=512, help="test images captioned per checkpoint")
    run.add_argument("--no-eval", action="store_true")
    run.add_argument("--quiet", action="store_true")
    ev = sub.add_parser("eval", help="(re-)evaluate the checkpoints of finished runs")
    ev.add_argument("run", nargs="+")
    ev.add_argument("--limit", type=int, default=512)
    ev.add_argument("--threads", type=int, default=2)
    pf = sub.add_parser("profile", help="CPU ms per training step (data vs model) and GFLOP per step")
    pf.add_argument("--preset", default="tiny")
    pf.add_argument("--data", required=True)
    pf.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    pf.add_argument("--steps", type=int, default=10, help="timed steps (after 2 warm-up steps)")
    pf.add_argument("--threads", type=int, default=2)
    pf.add_argument("--out", help="append the row (JSON) to this file")
    pr = sub.add_parser("probe", help="converged linear probes of every checkpoint and of random initialisation")
    pr.add_argument("run", nargs="+")
    pr.add_argument("--data", required=True)
    pr.add_argument("--n-train", type=int, default=2000, help="training images of the probe")
    pr.add_argument("--n-test", type=int, default=1000, help="test images of the probe")
    pr.add_argument("--steps", type=int, nargs="*", help="only these checkpoint steps (default: all)")
    pr.add_argument("--threads", type=int, default=1)
    pl = sub.add_parser("plot", help="accuracy against estimated idle time, PNG + JSON + markdown table")
    pl.add_argument("run", nargs="+")
    pl.add_argument("--out", required=True)
    pl.add_argument("--label", action="append", default=[], metavar="RUN=NAME")
    pl.add_argument("--reference", help="JSON {runs: [{label, points: [{step, accuracy}]}]} drawn in grey")
    pl.add_argument("--reference-match", default="", help="only reference runs whose label contains this")
    pl.add_argument("--reference-s-per-step", type=float, default=1.0, help="CPU seconds per step of the reference")
    pl.add_argument("--reference-label", default="reference")
    pl.add_argument("--title", default="single-object colour+shape accuracy against CPU training time")
    pl.add_argument("--clock", action="append", default=[], metavar="[RUN=]CLOCK_RUN",
                    help="a run timed on the idle machine: its wall time at each step (extrapolated at its mean rate "
                    "past its last checkpoint) becomes the time axis of RUN, or of every run without its own clock "
                    "(runs of the same model cost the same per step; accuracy differs by seed and schedule)")
    args = p.parse_args(argv)
    {"run": cmd_run, "eval": cmd_eval, "profile": cmd_profile, "probe": cmd_probe, "plot": cmd_plot}[args.verb](args)


if __name__ == "__main__":
    main()
