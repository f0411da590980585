"""``mdc bench [model]``: the command line of the speed benchmark (:func:`mdc_workbench.bench.run.run_bench`).

``mdc bench`` is a group: without a sub-verb (or with ``model``) it runs the model benchmark. Other benchmark
sub-verbs register themselves on the sub-parsers :func:`add_parsers` returns and in :data:`BENCH_HANDLERS`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from mdc_workbench.cli.common import check_preset, flags

BENCH_HANDLERS: dict[str, Callable[[argparse.Namespace], None]] = {}  # sub-verb -> handler (besides "model")


def add_parsers(sub: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """Add ``mdc bench`` to the top-level sub-parsers; returns its own sub-parsers for more sub-verbs."""
    p = sub.add_parser("bench", help="speed of training, captioning and scoring vs OpenCLIP CoCa (one run)",
                       parents=[flags(set="override a preset key, e.g. --set train.batch_size=32 (repeatable)",
                                      device={"default": "auto", "help": "auto | cpu | cuda"},
                                      precision="captioning and scoring rows: auto = bf16 autocast on a GPU with "
                                      "bf16 (Ampere+), else fp32; training rows follow the preset's train.precision",
                                      json="print the report as one JSON document",
                                      out={"required": False, "help": "also write the JSON report to this file"})])
    p.add_argument("--preset", default="tiny_vit",
                   help="model dimensions, batch and image size (default tiny_vit: tiny without its conv stem)")
    p.add_argument("--quick", action="store_true", help="a smoke run in seconds: few repeats, small batches")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    p.add_argument("--rows", help="training rows, comma-separated (default: all; see mdc_workbench.bench.training)")
    p.add_argument("--steps", type=int, help="timed training steps per row (default 10; warm-up: a third of it)")
    p.add_argument("--repeats", type=int, help="timed repeats per decoding/scoring figure (default 5)")
    p.add_argument("--mdc-run", default="", help="trained MDC run: adds the equal-quality comparison")
    p.add_argument("--arc-run", default="", help="trained ARC run for that comparison")
    p.add_argument("--profile", type=int, default=0, metavar="ROWS",
                   help="add a torch.profiler table (top ROWS ops) of the MDC training step")
    p.add_argument("--profile-row", default="mdc", help="the training row --profile shows (default mdc)")
    p.add_argument("--count-ops", action="store_true",
                   help="add each training row's host operations per step (profiler counts)")
    p.add_argument("--row-timeout", type=float, default=600.0, metavar="S",
                   help="a training row running longer (compile included) is reported as an error (default 600)")
    p.add_argument("--sections", default="caption,scoring,quality",
                   help="what to measure besides the training rows, comma-separated: caption, scoring, quality, or "
                   "none (default: all three)")
    verbs = p.add_subparsers(dest="bench_verb", required=False)
    verbs.add_parser("model", help="training, captioning and scoring speed (the default)")
    step = verbs.add_parser("step", help="the training step's time by phase (read, prepare, forward/backward, "
                            "optimizer, EMA, logging) and its host synchronisations")
    step.add_argument("--preset", default="tiny_fast", help="the run's preset (default tiny_fast)")
    step.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a preset key, e.g. --set train.batch_size=32 (repeatable)")
    step.add_argument("--steps", type=int, default=30, help="timed steps (default 30)")
    step.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    step.add_argument("--device", default="cpu", help="cpu | cuda (default cpu)")
    step.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    step.add_argument("--images", type=int, default=512,
                      help="embedded-data training images synthesized for the run (default 512)")
    step.add_argument("--json", action="store_true", help="print the report as one JSON document")
    step.add_argument("--count-ops", action="store_true",
                      help="add a run counting the host operations of each step (torch.profiler: aten ops, events)")
    BENCH_HANDLERS["step"] = cmd_bench_step
    return verbs


def cmd_bench_step(args: argparse.Namespace) -> None:
    from mdc_workbench.bench.step_phases import format_phases, measure_step_phases

    if args.device.startswith("cuda"):
        import torch
        if not torch.cuda.is_available():
            raise ValueError(f"--device {args.device} but CUDA is not available on this machine")
    report = measure_step_phases(args.preset, args.set, steps=args.steps, warmup=args.warmup,
                                 device=args.device, threads=args.threads, images=args.images,
                                 count_ops=args.count_ops)
    print(json.dumps(report) if args.json else format_phases(report))


def cmd_bench(args: argparse.Namespace) -> None:
    verb = getattr(args, "bench_verb", None)
    if verb not in (None, "model"):
        BENCH_HANDLERS[verb](args)
        return
    from mdc_workbench.bench.core import BenchConfig
    from mdc_workbench.bench.run import format_report, run_bench
    from mdc_workbench.bench.training import TRAIN_SPECS

    kw = {"preset": args.preset, "overrides": list(args.set), "device": args.device, "threads": args.threads,
          "precision": args.precision,
          "mdc_run": args.mdc_run, "arc_run": args.arc_run, "profile_rows": args.profile,
          "profile_row": args.profile_row, "count_ops": args.count_ops, "row_timeout_s": args.row_timeout}
    sections = tuple(x.strip() for x in args.sections.split(",") if x.strip() and x.strip() != "none")
    unknown = [x for x in sections if x not in ("caption", "scoring", "quality")]
    if unknown:
        raise ValueError(f"unknown --sections {unknown}; choose from caption, scoring, quality, none")
    kw["sections"] = sections
    if args.profile_row not in TRAIN_SPECS:
        raise ValueError(f"unknown --profile-row {args.profile_row!r}; choose from {', '.join(TRAIN_SPECS)}")
    if args.rows:
        rows = tuple(r.strip() for r in args.rows.split(",") if r.strip())
        unknown = [r for r in rows if r not in TRAIN_SPECS]
        if unknown:
            raise ValueError(f"unknown training rows {unknown}; choose from {', '.join(TRAIN_SPECS)}")
        kw["train_rows"] = rows
    if args.steps is not None:
        if args.steps < 1:
            raise ValueError(f"--steps must be >= 1, got {args.steps}")
        kw["train_steps"], kw["train_warmup"] = args.steps, max(1, args.steps // 3)
    if args.repeats is not None:
        if args.repeats < 1:
            raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
        kw["repeats"] = args.repeats
    if bool(args.mdc_run) != bool(args.arc_run):
        raise ValueError("--mdc-run and --arc-run go together (the comparison needs both trained runs)")
    for run in (args.mdc_run, args.arc_run):
        if run and not Path(run).exists():
            raise FileNotFoundError(f"run folder not found: {run}")
    bench = BenchConfig.quick(**kw) if args.quick else BenchConfig(**kw)
    def save(report: dict) -> None:  # after each section: an interrupted run keeps what it measured
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(args.out).with_suffix(".partial")
            tmp.write_text(json.dumps(report, indent=1) + "\n")
            tmp.replace(args.out)

    report = run_bench(bench, progress=lambda msg: print(f"mdc bench: {msg}", file=sys.stderr, flush=True),
                       save=save)
    print(json.dumps(report) if args.json else format_report(report))


HANDLERS = {"bench": cmd_bench}
CHECKS = {"bench": check_preset}  # run before the heavy imports (mdc_workbench.cli.main)
