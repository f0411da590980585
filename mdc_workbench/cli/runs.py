"""``mdc runs PLAN``: execute a plan's notebooks with papermill over its parameter grid, then summarise;
``mdc recompute PATH``: every table and verdict again from the kept per-item files (or a summary's per-seed values)."""

from __future__ import annotations

import argparse
import json

from mdc_workbench.cli.cluster import check_local, cluster_flags, resource_flags
from mdc_workbench.cli.common import flags

LOG_TAIL_LINES = 20  # of a failed run's error (a cluster job's log tail) printed under it


def add_parsers(sub: argparse._SubParsersAction) -> None:
    runs = sub.add_parser("runs", help="execute notebooks with papermill over a plan's parameter grid",
                          parents=[flags(quiet=True), cluster_flags("GPUs per run (default 0)")])
    runs.add_argument("plan", help="plan YAML file (see plans/)")
    runs.add_argument("--dry-run", action="store_true", help="check the plan, parameters and notebooks; run nothing "
                      "(with --executor slurm: the jobs it would submit, with their resources)")
    runs.add_argument("--status", action="store_true", help="each run's state from the plan folder: done, failed, "
                      "running, queued (submitted), pending")
    runs.add_argument("--array-parallelism", type=int, metavar="N", help="--executor slurm: at most N runs at once "
                      "(default: the plan's cluster.array_parallelism, else SLURM's)")
    runs.add_argument("--jobs", type=int, help="notebooks executed at once, each with cpu_count // jobs threads "
                      "(default: the plan's 'jobs', else 1)")
    runs.add_argument("--underpowered-ok", action="store_true", help="start a plan whose seeds fall short of 80%% "
                      "power for a claim it declares in 'decides' (refused otherwise; its summary says so)")
    runs.add_argument("--deadline", type=float, metavar="S", help="stop after S seconds: no run starts later, the "
                      "running ones are stopped and marked FAILED, the summary holds what finished (default: the "
                      "plan's 'deadline_s', else none)")


    rec = sub.add_parser("recompute", help="every table interval and verdict again from kept data, on a CPU: the "
                         "per-item files (items.npz) under a folder, or a plan's summary.json (per-seed values only)")
    rec.add_argument("path", help="a folder holding items.npz files (searched recursively) or a summary.json")
    rec.add_argument("--json", metavar="OUT", help="also write the tables and verdicts as JSON to OUT")


def cmd_recompute(args: argparse.Namespace) -> None:
    from pathlib import Path

    from mdc_workbench.eval.recompute import recompute, recompute_json, recompute_markdown, summary_runs

    path = Path(args.path)
    if not path.exists():
        raise FileNotFoundError(f"mdc recompute: {path} does not exist")
    result = recompute(summary_runs(path) if path.is_file() else path)
    print(recompute_markdown(result))
    if args.json:
        Path(args.json).write_text(json.dumps(recompute_json(result), indent=2, default=str) + "\n")


def cmd_runs(args: argparse.Namespace) -> None:
    from mdc_workbench.runs.plans import load_plan
    from mdc_workbench.runs.powered import refusal
    from mdc_workbench.runs.runner import describe_plan, run_plan

    plan = load_plan(args.plan)
    check_local(args, "runs", "array_parallelism")
    if args.status:
        from mdc_workbench.runs.executor import describe_status
        print(describe_status(plan))
        return
    checks = plan.power_checks()
    for c in checks:  # power before the run (mdc_workbench.runs.powered)
        print(f"power: {c.text()}")
    short = refusal(checks)
    if args.executor == "slurm":
        if short and not args.underpowered_ok and not args.dry_run:
            raise SystemExit(f"mdc runs: plan {plan.name}: {short}")
        _submit(plan, args)
        return
    if args.dry_run:
        print(describe_plan(plan))
        print("\nplan is valid (nothing was run)")
        return
    if args.jobs is not None and args.jobs < 1:
        raise SystemExit(f"mdc runs: --jobs must be a positive integer, got {args.jobs}")
    if args.deadline is not None and args.deadline <= 0:
        raise SystemExit(f"mdc runs: --deadline must be a positive number of seconds, got {args.deadline}")
    if short and not args.underpowered_ok:
        raise SystemExit(f"mdc runs: plan {plan.name}: {short}")
    results = run_plan(plan, progress=not args.quiet, jobs=args.jobs, deadline_s=args.deadline,
                       underpowered_ok=args.underpowered_ok)
    _report(plan, results)


def _submit(plan, args: argparse.Namespace) -> None:
    """``--executor slurm``: every pending run as one job of a SLURM array, waited for and gathered."""
    from mdc_workbench.runs.executor import JOBS_DIR, describe_submission, make_executor, plan_resources, submit_plan

    if args.jobs is not None:
        raise SystemExit("mdc runs: --jobs is the local runner's; with --executor slurm use --array-parallelism")
    resources = plan_resources(plan, array_parallelism=args.array_parallelism, **resource_flags(args))
    if args.dry_run:
        print(describe_submission(plan, resources))
        print("\nplan is valid (nothing was submitted)")
        return
    if args.deadline is not None and args.deadline <= 0:
        raise SystemExit(f"mdc runs: --deadline must be a positive number of seconds, got {args.deadline}")
    executor = make_executor("slurm", plan.out_dir / JOBS_DIR, resources, name=f"mdc-{plan.name}")
    _report(plan, submit_plan(plan, executor, progress=not args.quiet, deadline_s=args.deadline))


def _report(plan, results) -> None:
    failed = [r for r in results if r.status == "failed"]
    print(f"plan {plan.name}: {len(results) - len(failed)} of {len(results)} runs finished; "
          f"summary: {plan.out_dir / 'summary.md'}")
    for r in failed:
        first, *rest = r.error.splitlines() or [""]
        print(f"  FAILED {r.run_id}: {first[:200]}  (see {r.run_dir})")
        for line in rest[-LOG_TAIL_LINES:]:  # a cluster job that died before its notebook could say why: its log
            print(f"    | {line[:200]}")
    for r in results:  # notebooks that name the model they trained (01) point at the app
        try:
            model_dir = json.loads((r.run_dir / "metrics.json").read_text())["run_dir"]
        except (OSError, ValueError, KeyError):
            continue
        print(f"watch {r.run_id}'s model caption: mdc app --run {model_dir}")
    if failed:
        raise SystemExit(1)


HANDLERS = {"runs": cmd_runs, "recompute": cmd_recompute}
