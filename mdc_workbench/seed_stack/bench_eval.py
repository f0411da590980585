"""Seconds per member of a seed stack's central-claim measure against K solo measures (issue 63, item 3).

``python -m mdc_workbench.seed_stack.bench_eval --members 1 4`` times, in one process on `threads` threads, the
central claim's measure (:func:`~mdc_workbench.eval.central_claim.score_captions`: gradient and PMI of every
token of the captions of the first `limit` examples of the embedded generator
(:func:`mdc_workbench.bench.core.bench_inputs`), `draws` mask draws, a PMI pool of `pool` other images) of K members
of `preset` (K seeds' initialisations: the measure's cost does not depend on training) three ways: ``solo``, K solo
measures one after another, each with its own read of the captions (what ``central_claim_runs`` does per run);
``each`` and ``vmap``, :func:`~mdc_workbench.seed_stack.claim.stacked_claim_scores` of the K members from one read.
A row's ``member_s`` is its wall time over K, ``member_cpu_s`` the same in this process's CPU time (steadier beside
other jobs); ``vs_solo`` / ``cpu_vs_solo``: the solo row's of the same K over this row's (above 1: faster per
member).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from typing import Any

import torch

from mdc_core.config import ObjectiveConfig, load_preset
from mdc_core.factory import create_model
from mdc_core.train import seed_everything
from mdc_workbench.bench.core import bench_inputs
from mdc_workbench.eval.central_claim import score_captions

from .claim import stacked_claim_scores

ROWS = ("solo", "each", "vmap")  # the module docstring says what each measures


def claim_rows(members: list[int], *, preset: str = "tiny_fast", objective: str = "mdc", limit: int = 32,
               batch: int = 16, draws: int = 2, pool: int = 7, threads: int = 1, device: str = "cpu",
               overrides: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The rows of :data:`ROWS` for every K in `members` (module docstring); `overrides`: ``section.key=value`` on
    the preset."""
    if threads > 0:
        torch.set_num_threads(threads)
    cfg = load_preset(preset, [f'train.device="{device}"', *overrides])
    payload = bench_inputs(cfg, limit)  # sets cfg's corpus table size
    models = []
    for seed in range(max(members)):
        seed_everything(seed)
        models.append(create_model(cfg, objective, payload["output_ids"]).to(device).eval())

    def batches() -> list[tuple[torch.Tensor, torch.Tensor, list[str]]]:  # as caption_batches gives them
        images, tokens = payload["images"].clone(), payload["tokens"].clone()  # a read: a copy
        return [(images[i:i + batch], tokens[i:i + batch], ["all"] * len(images[i:i + batch]))
                for i in range(0, limit, batch)]

    settings = {"objective": ObjectiveConfig(name=objective), "draws": draws, "pool": pool}
    out = []
    for k in members:
        calls = {"solo": lambda k=k: [score_captions(m, batches(), seed=0, **settings) for m in models[:k]],
                 "each": lambda k=k: stacked_claim_scores(models[:k], batches(), seeds=0, mode="each", **settings),
                 "vmap": lambda k=k: stacked_claim_scores(models[:k], batches(), seeds=0, mode="vmap", **settings)}
        for row, call in calls.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            call()
            wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
            out.append({"row": row, "members": k, "preset": preset, "objective": objective, "limit": limit,
                        "draws": draws, "pool": pool, "threads": torch.get_num_threads(), "device": device,
                        "seconds": wall, "member_s": wall / k, "member_cpu_s": cpu / k})
    for r in out:
        solo = next(s for s in out if s["row"] == "solo" and s["members"] == r["members"])
        r["vs_solo"], r["cpu_vs_solo"] = solo["member_s"] / r["member_s"], solo["member_cpu_s"] / r["member_cpu_s"]
    return out


def format_rows(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table."""
    lines = ["| row | K | s | s per member | vs solo | CPU s per member | vs solo (CPU) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['row']} | {r['members']} | {r['seconds']:.2f} | {r['member_s']:.2f} | "
                     f"{r['vs_solo']:.2f}x | {r['member_cpu_s']:.2f} | {r['cpu_vs_solo']:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--preset", default="tiny_fast")
    parser.add_argument("--objective", default="mdc", help="the members' objective (mdc: masked; arc: causal)")
    parser.add_argument("--limit", type=int, default=32, help="test captions measured")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--draws", type=int, default=2)
    parser.add_argument("--pool", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    rows = claim_rows(args.members, preset=args.preset, objective=args.objective, limit=args.limit, batch=args.batch,
                      draws=args.draws, pool=args.pool, threads=args.threads, device=args.device)
    print(json.dumps(rows))
    print(format_rows(rows))


if __name__ == "__main__":
    main()
