"""TensorBoard for a training run (``train.tensorboard=true``): what an open_clip or Lightning user looks for.

Rank 0 writes the event files (``events.out.tfevents.*``) into the run folder itself, so ``tensorboard --logdir
papermill_runs/`` names each run by its folder:

* ``train/<key>``: each number of a ``metrics.jsonl`` record that moves along the run (loss, the accuracy, lr,
  grad_norm, samples_per_s, ...) at its step (:meth:`TensorBoardLog.record`). Counters that only accumulate are no
  curves: ``truncated`` is drawn as ``train/truncated_share`` (captions cut to the context / captions read since the
  previous log), ``skipped`` and ``nonfinite_skipped`` as ``train/<key>_per_step``; ``epoch`` and
  ``global_batch`` are not drawn. Their totals are the text ``run/counters`` at the end of the run.
* ``val/loss``: the objective's own loss on the first :data:`VAL_IMAGES` images of the validation split under fixed
  noise draws (comparable along the run and between runs of one objective), at every checkpoint step
  (:meth:`TensorBoardLog.checkpoint`); ``val/captions`` (text): greedy captions of the first :data:`CAPTION_IMAGES`
  of them beside their references; ``val/unmasking`` (image, masked objectives): the confidence of the top guess at
  each masked position of the first caption, step by step, with its reveal order (the picture the app's heatmap
  draws). Data without a separate validation split get a ``val/note`` text saying so instead.
* hparams (the hparams plugin): the run's config flattened (``train.lr``, ``model.text_width``, ...), with
  ``train/loss`` and ``val/loss`` as its metrics (TensorBoard shows their last values: the final metrics).

The evaluation forks the random number generators and puts the model back in training mode, so a run with
TensorBoard trains exactly as one without (``tests/workbench/test_tensorboard.py`` compares them).

Resuming. A run killed after logging past its last checkpoint resumes from that checkpoint and logs those steps
again; ``metrics.jsonl`` is truncated to the checkpoint's step. Event files are append-only records, so
:func:`drop_steps_after` rewrites each one that holds later steps without them (record by record with tensorboard's
own reader and writer, then an atomic rename) before the new writer appends: the files themselves hold each step
once, for any reader, instead of relying on a reader's purge of "orphaned" steps.

:class:`TensorBoardLog` is a run hook of the core's trainer (:class:`mdc_core.run_state.RunHook`), installed under the
name ``tensorboard`` in the entry-point group ``mdc_core.run_hooks`` (pyproject.toml), which the trainer loads when a
run's config asks for it; ``train(cfg, out, hooks=[TensorBoardLog])`` passes it by hand. Needs the ``tensorboard``
package (the ``[tensorboard]`` extra).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mdc_core.config import ConfigError, RunConfig

TAG_PREFIX = "train/"
VAL_IMAGES = 64  # validation images whose loss is val/loss
VAL_DRAWS = 4  # fixed noise draws per image for val/loss
CAPTION_IMAGES = 4  # validation images captioned into val/captions
COUNTERS = ("skipped", "truncated", "nonfinite_skipped")  # run totals in a metrics record: drawn as rates
NOT_DRAWN = ("step", "epoch", "global_batch", *COUNTERS)  # metrics.jsonl keys that get no train/<key> curve


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


def quiet_writer_threads() -> None:
    """Keep tensorboard's event-writer thread from printing its own traceback for an OSError (a full disk): the
    thread keeps the error and re-raises it in the training thread at its next write or flush, which reports it in
    one line (``mdc: error: no space left ...``); the thread's traceback would follow that line. Other threads and
    other errors go to the previous :func:`threading.excepthook`. Installed once per process."""
    import threading

    previous = threading.excepthook
    if getattr(previous, "quiet_writer_threads", False):
        return

    def hook(args: Any) -> None:
        kind = type(args.thread)  # tensorboard.summary.writer.event_file_writer._AsyncWriterThread (private)
        writer = kind.__name__ == "_AsyncWriterThread" and kind.__module__.startswith("tensorboard.")
        if not (writer and isinstance(args.exc_value, OSError)):
            previous(args)

    hook.quiet_writer_threads = True  # type: ignore[attr-defined]
    threading.excepthook = hook


def flat_hparams(cfg: RunConfig) -> dict[str, int | float | str | bool]:
    """The run config as hparams: ``section.key`` -> value; lists, tuples and dicts as their text."""
    out: dict[str, int | float | str | bool] = {}
    for section, values in dataclasses.asdict(cfg).items():
        items = values.items() if isinstance(values, dict) else [("", values)]
        for key, value in items:
            name = f"{section}.{key}" if key else section
            out[name] = value if isinstance(value, int | float | str | bool) else str(value)
    return out


class TensorBoardLog:
    """A run's TensorBoard events in `run_dir` (module docstring), continuing after `start_step` (the step the run
    starts or resumes from: later events of an earlier attempt are dropped). Without `cfg` only the ``train/``
    scalars are written (no validation, no hparams). A run hook: the trainer calls :meth:`record`, :meth:`checkpoint`
    and :meth:`close`."""

    def __init__(self, run_dir: str | Path, start_step: int = 0, cfg: RunConfig | None = None) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise ConfigError("train.tensorboard=true needs the tensorboard package: pip install -c constraints.txt "
                              f"'mdc-workbench[tensorboard]' (or drop --tensorboard); {err}") from err
        drop_steps_after(run_dir, start_step)
        quiet_writer_threads()
        self.writer = SummaryWriter(log_dir=str(run_dir))
        self.cfg = cfg
        # counters at the previous record (for the rates); unknown after a resume until its first record
        self.previous: dict[str, float] | None = dict.fromkeys(("step", *COUNTERS), 0) if start_step == 0 else None
        self.last_record: dict[str, Any] = {}
        self.val: ValidationImages | None = None
        self.val_problem = ""
        if cfg is not None:
            self.val_problem = validation_problem(cfg)
            if self.val_problem:
                self.writer.add_text("val/note", f"no val/* curves: {self.val_problem}", start_step)
            self._start_hparams(start_step)

    def record(self, record: dict[str, Any]) -> None:
        """One metrics.jsonl record: its numbers as ``train/<key>`` at ``record["step"]``, its counters as rates
        (module docstring); flushed, so that a live TensorBoard shows it and a crash loses nothing that
        metrics.jsonl kept."""
        step = int(record["step"])
        for key, value in record.items():
            if key not in NOT_DRAWN and isinstance(value, int | float) and not isinstance(value, bool):
                self.writer.add_scalar(TAG_PREFIX + key, value, global_step=step)
        for key, rate in counter_rates(self.previous, record).items():
            self.writer.add_scalar(TAG_PREFIX + key, rate, global_step=step)
        self.previous = {k: float(record.get(k, 0)) for k in ("step", *COUNTERS)}
        self.last_record = record
        self.writer.flush()

    def checkpoint(self, step: int, model: torch.nn.Module) -> None:
        """``val/loss``, ``val/captions`` and (masked objectives) ``val/unmasking`` of `model` at `step`; nothing
        without a config or a validation split. The model is left in training mode and the random states as
        they were."""
        if self.cfg is None or self.val_problem:
            return
        from mdc_core.objectives import objective_spec
        device = next(model.parameters()).device
        if self.val is None:
            try:
                with _rng_kept(device):
                    self.val = ValidationImages.load(self.cfg, model)
            except ValueError as err:  # no validation caption the model can represent: say so, train on
                self.val_problem = str(err)
                self.writer.add_text("val/note", f"no val/* curves: {err}", global_step=step)
                return
        with _rng_kept(device), torch.no_grad():
            model.eval()
            try:
                self.writer.add_scalar("val/loss", self.val.loss(model, self.cfg), global_step=step)
                decoder = objective_spec(self.cfg.objective.name).decoder
                if decoder in ("unmask", "left_to_right"):
                    captions, figure = self.val.captions(model, self.cfg, decoder)
                    self.writer.add_text("val/captions", captions, global_step=step)
                    if figure is not None:
                        self.writer.add_image("val/unmasking", figure, global_step=step, dataformats="HWC")
            finally:
                model.train()
        self.writer.flush()

    def close(self) -> None:
        """The run's counters as text and the hparams session's end, then close the files."""
        record = self.last_record
        if record:
            lines = [f"| {k} | {record[k]} |" for k in ("step", "epoch", "global_batch", *COUNTERS) if k in record]
            self.writer.add_text("run/counters", "| counter | total |\n|---|---|\n" + "\n".join(lines),
                                 int(record["step"]))
        if self.cfg is not None:
            from torch.utils.tensorboard.summary import hparams
            self.writer.file_writer.add_summary(hparams(flat_hparams(self.cfg), self._metric_tags())[2],
                                                int(record.get("step", 0)))
        self.writer.close()

    def _metric_tags(self) -> dict[str, float]:
        """The hparams' metrics: tags of scalars this run writes (their values are the scalars' own)."""
        return {f"{TAG_PREFIX}loss": 0.0, **({} if self.val_problem else {"val/loss": 0.0})}

    def _start_hparams(self, step: int) -> None:
        from torch.utils.tensorboard.summary import hparams
        experiment, session_start, _ = hparams(flat_hparams(self.cfg), self._metric_tags())
        self.writer.file_writer.add_summary(experiment, step)
        self.writer.file_writer.add_summary(session_start, step)


def counter_rates(previous: dict[str, float] | None, record: dict[str, Any]) -> dict[str, float]:
    """The run-total counters of `record` as rates since the `previous` record's (None: unknown, no rates):
    ``truncated_share`` (truncated captions / captions read, taking ``global_batch`` captions per step) and
    ``<counter>_per_step`` for the others."""
    steps = float(record["step"]) - previous["step"] if previous is not None else 0.0
    if steps <= 0:
        return {}
    rates = {f"{k}_per_step": (float(record[k]) - previous[k]) / steps for k in COUNTERS
             if k in record and k != "truncated"}
    if "truncated" in record and record.get("global_batch"):
        rates["truncated_share"] = (float(record["truncated"]) - previous["truncated"]) / (
            steps * float(record["global_batch"]))
    return rates


def validation_problem(cfg: RunConfig) -> str:
    """Why the run's data has no validation split of its own to log val/* from, or "" when it has one."""
    from mdc_core.sources import resolve_source
    data = cfg.data
    try:
        val = resolve_source(data.path, data.format, "val", data.images or None)
        train = resolve_source(data.path, data.format, "train", data.images or None)
    except (FileNotFoundError, ValueError) as err:
        return f"no validation split ({err})"
    if (val.location, val.shards, len(val.rows)) == (train.location, train.shards, len(train.rows)):
        return f"{data.path} has no validation split apart from its training data"
    return ""


@dataclasses.dataclass
class ValidationImages:
    """The fixed validation batch: the first :data:`VAL_IMAGES` images of the split whose captions the model's
    vocabulary can represent, on the model's device."""

    images: torch.Tensor  # (B, 3, H, W)
    tokens: torch.Tensor  # (B, L)
    references: list[str]  # their captions

    @classmethod
    def load(cls, cfg: RunConfig, model: torch.nn.Module) -> ValidationImages:
        from mdc_core.data import build_loader
        from mdc_core.tokenizer import CaptionTokenizer
        device = next(model.parameters()).device
        data = dataclasses.replace(cfg.data, num_workers=0)
        loader = build_loader(data, split="val", image_size=cfg.model.image_size, batch_size=VAL_IMAGES,
                              shuffle=False, drop_last=False)
        batch = next(iter(loader))
        tokens, _ = CaptionTokenizer(cfg.model.context_length).tokenize_batch(batch["caption"])
        known = in_vocabulary(model, tokens)
        if not bool(known.any()):
            raise ValueError(f"no caption among the first {VAL_IMAGES} validation images of {cfg.data.path} is "
                             "in the model's vocabulary")
        captions = [c for c, k in zip(batch["caption"], known.tolist(), strict=True) if k]
        return cls(batch["image"][known].to(device), tokens[known].to(device), captions)

    def loss(self, model: torch.nn.Module, cfg: RunConfig) -> float:
        """Mean objective loss over the batch under :data:`VAL_DRAWS` draws seeded by ``train.seed``."""
        from mdc_core.objectives import compute_loss
        total = 0.0
        for d in range(VAL_DRAWS):
            gen = torch.Generator(device=self.images.device).manual_seed(cfg.train.seed + d)
            total += float(compute_loss(model, self.images, self.tokens, cfg.objective, gen).loss)
        return total / VAL_DRAWS

    def captions(self, model: Any, cfg: RunConfig, decoder: str) -> tuple[str, np.ndarray | None]:
        """A markdown table of greedy captions of the first :data:`CAPTION_IMAGES` images beside their references,
        and for ``decoder == "unmask"`` the unmasking image (H, W, 3) uint8 of the first."""
        from mdc_core.ar_decode import greedy
        from mdc_core.sampler import sample
        from mdc_core.tokenizer import CaptionTokenizer
        tok = CaptionTokenizer(cfg.model.context_length)
        images = self.images[:CAPTION_IMAGES]
        image_tokens = model.encode_image(images)
        figure = None
        if decoder == "unmask":
            out = sample(model, image_tokens, dataclasses.replace(cfg.sampler, temperature=0.0))
            texts = tok.batch_decode(out.tokens)
            figure = unmasking_image(out, tok)
            how = f"greedy unmasking, N' = {out.tokens.shape[1]}"
        else:
            texts = tok.batch_decode(greedy(model, image_tokens).tokens)
            how = "greedy left to right"
        rows = [f"| {i} | {ref} | {text} |" for i, (ref, text) in enumerate(zip(self.references, texts, strict=False))]
        return f"{how}\n\n| image | reference | caption |\n|---|---|---|\n" + "\n".join(rows), figure


def in_vocabulary(model: Any, tokens: torch.Tensor) -> torch.Tensor:
    """(B,) bool: captions whose every token has a row in the model's input and output tables (all True for a
    model with the full vocabulary)."""
    from mdc_core.tokenizer import PAD_ID, SOT_ID
    ok = torch.ones(tokens.shape[0], dtype=torch.bool)
    targets = (tokens != PAD_ID) & (tokens != SOT_ID)  # (B, L) what the output head predicts
    for name, where in (("input_index", torch.ones_like(targets)), ("output_index", targets)):
        index = getattr(model, name, None)
        if index is not None:
            ok &= ((index.cpu()[tokens] >= 0) | ~where).all(dim=1)
    return ok


def unmasking_image(out: Any, tokenizer: Any, index: int = 0) -> np.ndarray:
    """(H, W, 3) uint8: caption `index` of a sampler output, steps x positions, each cell the top guess's
    confidence while the position was masked (blank once revealed), the reveal order circled and numbered."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    masked = out.step_masked[:, index].cpu().numpy()  # (S, N)
    grid = np.where(masked, out.step_top_confidence[:, index].float().cpu().numpy(), np.nan)
    steps, n = grid.shape
    reveal = out.reveal_step[index].cpu().numpy()  # (N,) step each position was revealed at
    fig = Figure(figsize=(min(2.5 + 0.6 * n, 14.0), min(1.6 + 0.22 * steps, 8.0)), dpi=80, layout="constrained")
    ax = fig.add_subplot()
    im = ax.imshow(np.ma.masked_invalid(grid), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto",
                   interpolation="nearest")
    order = sorted((int(s), p) for p, s in enumerate(reveal) if s >= 0)
    ax.plot([p for _, p in order], [s for s, _ in order], color="#f97316", lw=1.5, marker="o", ms=13, mfc="white")
    for rank, (s, p) in enumerate(order, start=1):
        ax.annotate(str(rank), (p, s), ha="center", va="center", fontsize=7)
    tokens = [tokenizer.token_string(int(i)) for i in out.tokens[index]]
    ax.set_xticks(range(n), [f"{p}\n{t}" for p, t in enumerate(tokens)], fontsize=8)
    ax.set_xlabel("caption position (final token)")
    ax.set_ylabel("denoising step")
    ax.set_title("confidence of the top guess at each masked position; circles: reveal order", fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.04, pad=0.01, label="confidence")
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


@contextlib.contextmanager
def _rng_kept(device: torch.device) -> Iterator[None]:
    """Run the block with the torch (CPU and `device`), numpy and random states restored afterwards."""
    states = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        yield
    random.setstate(states[0])
    np.random.set_state(states[1])
