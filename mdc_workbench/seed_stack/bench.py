"""Seconds per member-step of a seed stack against solo steps, and peak memory per member (issue 63 item 5).

``python -m mdc_workbench.seed_stack.bench --members 1 4 16`` measures, each row in a fresh process (so that its peak
memory is its own): ``solo``, the trainer's step of one model (:class:`~mdc_core.loss_step.LossStep`, backward,
``clip_grad_norm_``, AdamW, EMA) cycling over the members' batches; then per K, :meth:`SeedStack.step
<mdc_workbench.seed_stack.step.SeedStack.step>` of K members, each on its own batch, in mode ``each`` (the members'
forwards one after another, the solo kernels) and ``vmap`` (one vmapped forward, the CPU's math attention), and
``vmap_fused``: vmap with the CPU's fused attention kernel, which vmap cannot batch and loops over (what the math
attention avoids). The batches are the first ``batch x K`` training examples of the embedded generator
(:func:`mdc_workbench.bench.core.bench_inputs`), one batch per member.

A row's ``member_step_s`` is its median step time (wall) divided by its members, ``member_cpu_s`` the same in this
process's CPU time (steadier beside other jobs); ``vs_solo`` is the solo step's wall time over ``member_step_s``
(above 1: the stack trains a seed faster than a solo run), ``cpu_vs_solo`` the same in CPU time. ``peak_mib`` is
the peak resident set during the timed steps minus the resident set before the first (CPU), or
``torch.cuda.max_memory_allocated`` (CUDA); ``per_member_mib`` that over the members; every solo process also
pays its ``base_mib`` (the resident set of a process that has loaded torch, the model and the data) once per seed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from mdc_core.config import load_preset
from mdc_core.distributed import sync
from mdc_core.factory import create_model
from mdc_core.loss_step import LossStep
from mdc_core.sampler import bf16_enabled
from mdc_core.train import build_optimizer, ema_update, param_groups, seed_everything
from mdc_workbench.bench.core import bench_inputs
from mdc_workbench.bench.training import _status_mib, peak_rss_mib, reset_peak_rss

from .step import SeedStack

ROWS = ("solo", "each", "vmap", "vmap_fused")  # the module docstring says what each measures


def measure(row: str, members: int, *, preset: str = "tiny_fast", batch: int = 64, steps: int = 5, warmup: int = 2,
            threads: int = 1, device: str = "cpu", pool: int = 0) -> dict[str, Any]:
    """Figures of one row (one of :data:`ROWS`) with `members` batches; meant for a fresh
    process (:func:`run` arranges that). `pool`: the examples the corpus table is built from (at least the batches';
    :func:`run` gives every row the same, so every row has one head)."""
    if row not in ROWS:
        raise ValueError(f"unknown row {row!r}; use one of {', '.join(ROWS)}")
    if threads > 0:
        torch.set_num_threads(threads)
    dev = torch.device(device)
    cfg = load_preset(preset, [f"train.batch_size={batch}", f'train.device="{device}"', "train.ema_decay=0.999"])
    payload = bench_inputs(cfg, batch * members, max(pool, 500))  # sets cfg's corpus table size
    images = payload["images"].view(members, batch, *payload["images"].shape[1:])  # (K, B, 3, H, W)
    tokens = payload["tokens"].view(members, batch, -1)  # (K, B, L)
    seeds = list(range(members))
    models = []
    for seed in seeds[:1] if row == "solo" else seeds:
        seed_everything(seed)
        models.append(create_model(cfg, cfg.objective.name, payload["output_ids"]).to(dev).train())
    if row == "solo":
        take_step = _solo_step(cfg, models[0], images, tokens, dev)
    else:
        stack = SeedStack(cfg, models, seeds, dev, mode="each" if row == "each" else "vmap")
        stack.objective.math_attention = row != "vmap_fused"
        micro = [[{"image": images[k], "tokens": tokens[k]}] for k in range(members)]

        def take_step() -> None:
            stack.step(micro)

    base = _status_mib("VmRSS") or 0.0
    for _ in range(warmup):
        take_step()
    sync(dev)
    was_reset = reset_peak_rss()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    times, cpu = [], []
    for _ in range(steps):
        start, start_cpu = time.perf_counter(), time.process_time()
        take_step()
        sync(dev)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    peak = (torch.cuda.max_memory_allocated(dev) / 2**20 if dev.type == "cuda" else peak_rss_mib(was_reset) - base)
    k = 1 if row == "solo" else members
    step_s = statistics.median(times)
    return {"row": row, "members": k, "batch": batch, "preset": preset, "threads": torch.get_num_threads(),
            "device": device, "step_s": step_s, "member_step_s": step_s / k, "step_s_all": times,
            "member_cpu_s": statistics.median(cpu) / k, "peak_mib": peak, "per_member_mib": peak / k,
            "base_mib": base}


def _solo_step(cfg: Any, model: torch.nn.Module, images: torch.Tensor, tokens: torch.Tensor, dev: torch.device):
    """The trainer's step of one model (:mod:`mdc_core.train`), over the members' batches in turn."""
    tcfg = cfg.train
    loss_step = LossStep(model, cfg.objective, tcfg, dev, bf16_enabled(tcfg.precision, dev))
    opt = build_optimizer(param_groups(model, tcfg.weight_decay), tcfg, dev)
    ema = torch.optim.swa_utils.AveragedModel(model, use_buffers=True)
    state = {"n": 0}

    def step() -> None:
        k = state["n"] % images.shape[0]
        loss, _ = loss_step(images[k], tokens[k], state["n"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
        opt.step()
        opt.zero_grad(set_to_none=True)
        ema_update(ema, model, tcfg.ema_decay)
        state["n"] += 1

    return step


def run(members: list[int], *, fused: bool = True, rows: tuple[str, ...] = ROWS, **options: Any
        ) -> list[dict[str, Any]]:
    """The solo row (over the largest stack's batches) and, per K in `members`, the stack rows of `rows` (all of
    :data:`ROWS` by default; ``vmap_fused`` only with `fused`); each row in its own process. `options`:
    :func:`measure`'s."""
    unknown = sorted(set(rows) - set(ROWS))
    if unknown or "solo" not in rows:
        raise ValueError(f"bench rows {list(rows)}: choose from {', '.join(ROWS)}, solo included (the reference)")
    rows = [("solo", max(members))] + [(r, k) for k in members for r in ROWS[1:]
                                       if r in rows and (fused or r != "vmap_fused")]
    options = {**options, "pool": options.get("batch", 64) * max(members)}
    out = []
    for row, k in rows:
        args = [sys.executable, "-m", "mdc_workbench.seed_stack.bench", "--child", row, "--members", str(k)]
        args += [f"--{name}={value}" for name, value in options.items()]
        done = subprocess.run(args, capture_output=True, text=True, check=False)
        if done.returncode:
            raise RuntimeError(f"bench row {row} K={k} failed: {done.stderr.strip().splitlines()[-1:]}")
        out.append(json.loads(done.stdout.strip().splitlines()[-1]))
    for r in out:
        r["vs_solo"] = out[0]["member_step_s"] / r["member_step_s"]
        r["cpu_vs_solo"] = out[0]["member_cpu_s"] / r["member_cpu_s"]
    return out


def format_rows(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table."""
    lines = ["| row | K | step s | s per member-step | vs solo | CPU s per member-step | vs solo (CPU) | peak MiB | "
             "per member MiB | process MiB |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['row']} | {r['members']} | {r['step_s']:.3f} | {r['member_step_s']:.3f} | "
                     f"{r['vs_solo']:.2f}x | {r['member_cpu_s']:.3f} | {r['cpu_vs_solo']:.2f}x | {r['peak_mib']:.0f} | "
                     f"{r['per_member_mib']:.0f} | {r['base_mib']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--preset", default="tiny_fast")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--pool", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--no-fused", action="store_true", help="skip the vmap_fused rows")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"rows to measure, solo included (default "
                                                               f"{','.join(ROWS)})")
    parser.add_argument("--out", default="", help="also write the rows as JSON to this file (with the machine)")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    options = {"preset": args.preset, "batch": args.batch, "steps": args.steps, "warmup": args.warmup,
               "threads": args.threads, "device": args.device}
    if args.child:
        options["pool"] = args.pool
        print(json.dumps(measure(args.child, args.members[0], **options)))
        return
    rows = run(args.members, fused=not args.no_fused, rows=tuple(args.rows.split(",")), **options)
    print(json.dumps(rows))
    print(format_rows(rows))
    if args.out:
        machine = {"torch": torch.__version__, "cpu_count": os.cpu_count(), "threads": args.threads}
        if torch.cuda.is_available() and args.device.startswith("cuda"):
            machine["gpu"] = torch.cuda.get_device_name(0)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"command": "python -m mdc_workbench.seed_stack.bench " + " ".join(
            argv if argv is not None else sys.argv[1:]), "machine": machine, "date": time.strftime("%Y-%m-%d"),
            "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
