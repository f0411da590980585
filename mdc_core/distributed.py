"""Process groups for ``torchrun``: setup/teardown, rank helpers and the few collectives the trainer needs.

:func:`setup` reads the variables ``torchrun`` sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, the rendezvous) and
joins the default process group (NCCL on CUDA, gloo on CPU) with a timeout, so a collective waiting on a dead or
hung rank fails instead of hanging; without them (plain ``mdc train``) every helper is a no-op, one code path.
:class:`StopRequest` turns SIGINT/SIGTERM into a flag the trainer reads at a step boundary. Every collective, and
the trainer's DDP forward/backward, runs under :func:`guard`, which turns a backend error or timeout into
:class:`RankFailure` saying what happened and what to look at.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


class RankFailure(RuntimeError):
    """A collective failed or timed out: another rank died or hangs."""


@dataclass(frozen=True)
class DistContext:
    """Where this process sits in the job. ``world == 1`` means no process group."""

    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")
    timeout_s: int = 600

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1


def setup(device_name: str = "auto", timeout_s: int = 600) -> DistContext:
    """Join the process group torchrun describes (or return a one-process context) and pick this rank's device.

    `device_name` is ``TrainConfig.device``: ``auto`` takes ``cuda:LOCAL_RANK`` when CUDA is available, else the
    CPU; ``cpu`` forces gloo even on a GPU machine; ``cuda`` means ``cuda:LOCAL_RANK`` under torchrun."""
    cuda = torch.cuda.is_available()
    if device_name.startswith("cuda") and not cuda:
        raise RuntimeError(f"train.device={device_name!r} but CUDA is not available on this machine")
    on_gpu = device_name.startswith("cuda") or (device_name == "auto" and cuda)
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:  # not launched by torchrun
        device = torch.device("cuda" if device_name == "auto" else device_name) if on_gpu else torch.device("cpu")
        return DistContext(device=device, timeout_s=timeout_s)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if on_gpu:
        if device_name.startswith("cuda:"):
            raise ValueError(f"train.device={device_name!r} under torchrun: use 'auto' or 'cuda' (each rank takes "
                             "cuda:LOCAL_RANK)")
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} CUDA devices: "
                               "lower --nproc_per_node")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if on_gpu else "gloo", timeout=timedelta(seconds=timeout_s),
                                **({"device_id": device} if on_gpu else {}))
    return DistContext(rank=rank, world=world, device=device, timeout_s=timeout_s)


def teardown(ctx: DistContext) -> None:
    if ctx.distributed and dist.is_initialized():
        dist.destroy_process_group()


_COMM_WORDS = ("gloo", "nccl", "connection", "timed out", "timeout", "socket", "peer")


@contextlib.contextmanager
def guard(ctx: DistContext, what: str) -> Iterator[None]:
    """Turn a communication failure inside the block (also DDP's own gradient all-reduce) into RankFailure."""
    try:
        yield
    except RuntimeError as err:  # dist.DistError is one
        comm = isinstance(err, dist.DistError) or any(w in str(err).lower() for w in _COMM_WORDS)  # not a model bug
        if not (ctx.distributed and comm):
            raise
        raise RankFailure(f"rank {ctx.rank} of {ctx.world}: {what} failed ({str(err).splitlines()[0][:200]}). "
                          f"Another rank probably died or hangs (timeout train.dist_timeout_s={ctx.timeout_s}); "
                          "look for the first error in the other ranks' output. Stopping this rank.") from err


def all_reduce(ctx: DistContext, values: torch.Tensor, what: str = "all-reduce") -> torch.Tensor:
    """`values` (any shape) summed over ranks in place and returned."""
    if ctx.distributed:
        with guard(ctx, what):
            dist.all_reduce(values)
    return values


def all_reduce_named(ctx: DistContext, values: Mapping[str, torch.Tensor | float], what: str = "all-reduce"
                     ) -> dict[str, float]:
    """Named scalars summed over ranks by one collective (in float64), by name (every rank passes the same names):
    the trainer's step metrics each have a name instead of a position in a vector."""
    if not ctx.distributed and not any(isinstance(v, torch.Tensor) for v in values.values()):
        return {k: float(v) for k, v in values.items()}  # host numbers: nothing to reduce, no device round trip
    keys = list(values)
    vec = torch.stack([torch.as_tensor(values[k], dtype=torch.float64, device=ctx.device).reshape(())
                       for k in keys])  # (len(keys),)
    return dict(zip(keys, all_reduce(ctx, vec, what).tolist(), strict=True))


def all_agree(ctx: DistContext, flag: bool, what: str = "agreement") -> bool:
    """True only if `flag` is true on every rank (one tiny all-reduce)."""
    return all_reduce_named(ctx, {"flag": float(flag)}, what)["flag"] == ctx.world


def sync(device: torch.device) -> None:
    """Wait until `device` has finished its queued work (CUDA kernels run asynchronously), so that a wall-clock
    timing around it measures the work; nothing to wait for on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def barrier(ctx: DistContext, what: str = "barrier") -> None:
    if ctx.distributed:
        with guard(ctx, what):
            dist.barrier()


def broadcast_object(ctx: DistContext, obj: T, what: str = "broadcast") -> T:
    """Rank 0's `obj` on every rank (a picklable value)."""
    if not ctx.distributed:
        return obj
    box = [obj]
    with guard(ctx, what):
        dist.broadcast_object_list(box, src=0)
    return box[0]


class StopRequest:
    """While entered (in the main thread), SIGINT and SIGTERM only set :attr:`signum`; the trainer reads it at
    the next step boundary, checkpoints and stops. With `repeat_aborts`, a second Ctrl-C aborts at once (under
    torchrun it does not: torchrun forwards the terminal's Ctrl-C again, and escalates to SIGKILL itself)."""

    def __init__(self, repeat_aborts: bool = True):
        self.signum, self.repeat_aborts = 0, repeat_aborts
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum and signum == signal.SIGINT and self.repeat_aborts:
            raise KeyboardInterrupt
        if not self.signum:
            again = " (Ctrl-C again: stop at once, without it)" if self.repeat_aborts else ""
            sys.stderr.write(f"\nmdc: got {signal.Signals(signum).name}; finishing this step and writing a "
                             f"checkpoint{again}\n")
        self.signum = signum
