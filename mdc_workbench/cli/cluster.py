"""The flags of ``--executor slurm`` that ``mdc runs`` and ``mdc train`` share (:mod:`mdc_workbench.runs.executor`)."""

from __future__ import annotations

import argparse
from typing import Any

EXECUTORS = ("local", "slurm")


def cluster_flags(gpus_help: str) -> argparse.ArgumentParser:
    """A parent parser: ``--executor`` and what each SLURM job asks for (None: the plan's or the default)."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("cluster (--executor slurm; needs the [cluster] extra)")
    group.add_argument("--executor", choices=EXECUTORS, default="local", help="local: this machine (default); "
                       "slurm: submit SLURM jobs through submitit (docs/training_at_scale.md)")
    group.add_argument("--gpus", "--gpus-per-node", dest="gpus", type=int, metavar="G", help=gpus_help)
    group.add_argument("--cpus", "--cpus-per-task", dest="cpus", type=int, metavar="C",
                       help="CPU cores per task, its torch threads (default 1)")
    group.add_argument("--mem-gb", type=float, metavar="GB", help="memory per node (default: the partition's)")
    group.add_argument("--timeout-min", type=int, metavar="MIN", help="wall-clock limit of a job (default 60); "
                       "pre-emption or the limit requeues it")
    group.add_argument("--partition", help="SLURM partition")
    group.add_argument("--account", help="SLURM account")
    return parent


def resource_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The resource flags given (:class:`mdc_workbench.runs.executor.Resources` keywords; None: not given)."""
    return {"gpus": args.gpus, "cpus": args.cpus, "mem_gb": args.mem_gb, "timeout_min": args.timeout_min,
            "partition": args.partition, "account": args.account}


def check_local(args: argparse.Namespace, verb: str, *extra: str) -> None:
    """Cluster flags without ``--executor slurm`` are a mistake, not something to ignore."""
    given = [name for name, value in {**resource_flags(args), **{e: getattr(args, e) for e in extra}}.items()
             if value is not None]
    if args.executor == "local" and given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise SystemExit(f"mdc {verb}: {flags} {'needs' if len(given) == 1 else 'need'} --executor slurm")
