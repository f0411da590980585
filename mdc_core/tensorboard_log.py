"""TensorBoard events beside ``metrics.jsonl`` (``train.tensorboard=true``): its scalars, one event per logged step.

The trainer (rank 0 only) hands each ``metrics.jsonl`` record to :meth:`TensorBoardLog.write`: every number in it
becomes the scalar ``train/<key>`` at global step ``record["step"]`` (loss, the accuracy, lr, grad_norm,
samples_per_s, ...). The event files (``events.out.tfevents.*``) lie in the run folder itself, so
``tensorboard --logdir papermill_runs/`` names each run by its folder.

Resuming. A run killed after logging past its last checkpoint resumes from that checkpoint and logs those steps
again; ``metrics.jsonl`` is truncated to the checkpoint's step. Event files are append-only records, so
:func:`drop_steps_after` rewrites each one that holds later steps without them (record by record with tensorboard's
own reader and writer, then an atomic rename) before the new writer appends: the files themselves hold each step
once, for any reader, instead of relying on a reader's purge of "orphaned" steps.

Needs the ``tensorboard`` package (the ``[tensorboard]`` extra); imported only when a run asks for it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .config import ConfigError

TAG_PREFIX = "train/"


def drop_steps_after(run_dir: str | Path, step: int) -> int:
    """Rewrite the event files in `run_dir` without the events of steps after `step`; return how many went."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter

    dropped = 0
    for path in sorted(Path(run_dir).glob("*tfevents*")):
        records = list(RawEventFileLoader(str(path)).Load())
        keep = [r for r in records if Event.FromString(r).step <= step]
        if len(keep) == len(records):
            continue
        tmp = path.with_name(f".rewrite.tmp{os.getpid()}")  # no "tfevents" in the name: readers ignore it
        with open(tmp, "wb") as fh:
            writer = RecordWriter(fh)
            for record in keep:
                writer.write(record)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        dropped += len(records) - len(keep)
    return dropped


class TensorBoardLog:
    """The scalars of a run's ``metrics.jsonl`` records as TensorBoard events in `run_dir`, continuing after
    `start_step` (the step the run starts or resumes from: later events of an earlier attempt are dropped)."""

    def __init__(self, run_dir: str | Path, start_step: int = 0) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise ConfigError("train.tensorboard=true needs the tensorboard package: pip install -c constraints.txt "
                              f"'mdc-workbench[tensorboard]' (or drop --tensorboard); {err}") from err
        drop_steps_after(run_dir, start_step)
        self.writer = SummaryWriter(log_dir=str(run_dir))

    def write(self, record: dict[str, Any]) -> None:
        """One metrics.jsonl record: each number but ``step`` as scalar ``train/<key>`` at that step; flushed, so
        that a live TensorBoard shows it and a crash loses nothing that metrics.jsonl kept."""
        step = int(record["step"])
        for key, value in record.items():
            if key != "step" and isinstance(value, int | float) and not isinstance(value, bool):
                self.writer.add_scalar(TAG_PREFIX + key, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
