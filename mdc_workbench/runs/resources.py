"""What one cluster job asks for (``--executor slurm``): a plan's ``cluster`` section, or ``mdc train``'s flags.

Read by :func:`mdc_workbench.runs.plans.load_plan` (a bad section is refused when the plan loads, executor or not) and
turned into submitit's parameters by :mod:`mdc_workbench.runs.executor`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any


@dataclass(frozen=True)
class Resources:
    """What one job asks the cluster for: the plan's ``cluster`` section, overridden by the command's flags."""

    gpus: int = 0  # GPUs per run (mdc train: per node, one task each)
    cpus: int = 1  # CPU cores per task; the run's torch threads (OMP_NUM_THREADS)
    mem_gb: float | None = None  # memory per node in GB (None: the partition's default)
    timeout_min: int = 60  # wall-clock limit of one job; a run past it is requeued once per pre-emption/timeout
    partition: str | None = None  # SLURM partition (None: the cluster's default)
    account: str | None = None  # SLURM account to charge (None: the user's default)
    array_parallelism: int | None = None  # at most this many of the plan's runs at once (SLURM's array %N)

    @classmethod
    def parse(cls, value: Any, where: str) -> Resources:
        """The plan's ``cluster`` mapping checked key by key (None: the defaults); ValueError naming the key."""
        if value is None:
            return cls()
        if not isinstance(value, dict):
            raise ValueError(f"{where} must be a mapping of resources ({', '.join(cls.keys())}), got "
                             f"{type(value).__name__}")
        unknown = sorted(set(value) - set(cls.keys()))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; allowed: {', '.join(cls.keys())}")
        return cls().replace(where=where, **value)

    @staticmethod
    def keys() -> tuple[str, ...]:
        return tuple(f.name for f in fields(Resources))

    def replace(self, *, where: str = "resources", **given: Any) -> Resources:
        """A copy with the given values (None: keep this one's), each checked: counts are positive integers (gpus
        may be 0), mem_gb a positive number, partition and account non-empty strings."""
        values = {k: v for k, v in given.items() if v is not None}
        for key, v in values.items():
            if key in ("partition", "account"):
                ok = isinstance(v, str) and bool(v.strip())
                need = "a non-empty string"
            elif key == "mem_gb":
                ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
                need = "a positive number (GB)"
            else:
                low = 0 if key == "gpus" else 1
                ok = isinstance(v, int) and not isinstance(v, bool) and v >= low
                need = f"an integer >= {low}"
            if not ok:
                raise ValueError(f"{where}: {key} must be {need}, got {v!r}")
        return replace(self, **values)

    def executor_parameters(self, *, name: str, nodes: int = 1, tasks_per_node: int = 1) -> dict[str, Any]:
        """The keywords of ``submitit.AutoExecutor.update_parameters`` (its cluster-independent names; the
        ``slurm_`` ones are ignored by the local executor)."""
        params: dict[str, Any] = {"name": name, "timeout_min": self.timeout_min, "nodes": nodes,
                                  "tasks_per_node": tasks_per_node, "cpus_per_task": self.cpus,
                                  "gpus_per_node": self.gpus}
        if self.mem_gb is not None:
            params["mem_gb"] = self.mem_gb
        for key in ("partition", "account", "array_parallelism"):
            if getattr(self, key) is not None:
                params[f"slurm_{key}"] = getattr(self, key)
        return params

    def describe(self) -> str:
        """One line: what each job asks for."""
        mem = "default" if self.mem_gb is None else f"{self.mem_gb:g}GB"
        parts = [f"gpus={self.gpus}", f"cpus={self.cpus}", f"mem={mem}", f"time={self.timeout_min}min"]
        parts += [f"{k}={getattr(self, k)}" for k in ("partition", "account") if getattr(self, k) is not None]
        return " ".join(parts)
