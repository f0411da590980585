"""The training loop: AdamW, warm-up + cosine, accumulation, clipping, EMA, bf16 on CUDA, DDP, atomic checkpoints.

``train(cfg, out)`` runs a :class:`RunConfig` into the run folder `out` (layout in :mod:`mdc_core.checkpoint`).
Under ``torchrun`` it runs DistributedDataParallel (NCCL on CUDA, gloo on CPU; :mod:`mdc_core.distributed`):
each rank reads its own shards, the global batch is ``batch_size x world x grad_accum``, only rank 0 writes.

Exactness. The loss of a step is normalised by the GLOBAL count of its loss terms (:func:`loss_denominator`
summed over micro-batches and ranks), and every random draw of micro-batch ``a`` on rank ``r`` is seeded by
``(seed, step, a * world + r)``; with the data split of :mod:`mdc_core.data.loaders` this makes ``world`` ranks
with accumulation A compute the same updates as one process with ``world x`` the workers and accumulation
``world * A`` (up to floating-point summation order), and makes accumulation equal to one bigger batch.

A resumed run restores model, optimizer, scheduler, EMA, RNG states, counters and the data position (epoch,
batches read), and truncates ``metrics.jsonl``/``epochs.jsonl`` to the checkpoint's step, so it continues as if
never stopped. A non-finite loss or gradient norm either stops the run with :class:`TrainingDiverged` before
anything is written, so the last checkpoint on disk is the last good one (``train.nonfinite=stop``), or
skips that update (``skip``; at most ``train.max_skipped_steps`` in a row). Records skipped as corrupt are
counted per epoch in ``epochs.jsonl``.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from tqdm.auto import tqdm

from . import checkpoint as ckpt_io
from . import distributed as dist
from .config import ObjectiveConfig, RunConfig
from .data import SKIP_REASONS, build_loader, iter_captions, resolve_source
from .factory import create_model
from .model import padding_mask
from .objectives import compute_loss, maskable_positions, objective_spec
from .tokenizer import CaptionTokenizer, build_output_vocab


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


@dataclass
class TrainResult:
    run_dir: Path
    steps: int
    final_loss: float
    checkpoint: Path
    skipped: dict[str, int] = field(default_factory=dict)  # corrupt records skipped, by reason
    truncated: int = 0  # captions cut to the context length


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"train.device={name!r} but CUDA is not available on this machine")
    return torch.device(name)


def use_bf16(precision: str, device: torch.device) -> bool:
    """bf16 autocast on CUDA by default; fp32 on CPU (bf16 matmul there is ~250x slower)."""
    return precision == "bf16" or (precision == "auto" and device.type == "cuda")


def lr_lambda(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Multiplier of the peak lr: linear warm-up over `warmup` steps, then cosine decay to `min_ratio`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Decay matrices only: biases, norms, embeddings and position tables are not decayed (as open_clip)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        skip = p.ndim < 2 or "emb" in name or "pos_embed" in name or "cls_token" in name or "norm" in name
        (no_decay if skip else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_model(cfg: RunConfig, progress: bool = False) -> torch.nn.Module:
    """A fresh model for `cfg` (a captioner, or CLIP for objective "clip"; see :mod:`mdc_core.factory`); for
    ``output_vocab="corpus"`` the id table is built from the training captions and its size is written into
    ``cfg.model.output_vocab_size`` (so ``config.json`` rebuilds the same shape)."""
    output_ids = None
    if cfg.model.output_vocab == "corpus":
        captions = iter_captions(cfg.data, split="train")
        if progress:
            captions = tqdm(captions, desc="corpus vocabulary", unit=" captions", leave=False)
        output_ids = build_output_vocab(captions, CaptionTokenizer(cfg.model.context_length))
        cfg.model.output_vocab_size = len(output_ids)
    return create_model(cfg, cfg.objective.name, output_ids)


def step_seed(seed: int, step: int, index: int, stream: int = 0) -> int:
    """A 63-bit seed for micro-batch `index` (global, see the module docstring) of optimizer step `step`; stream
    0 is the masking draws, stream 1 dropout (index = rank). Every random draw of a step derives from these, so
    it depends neither on the rank that draws it nor on a resume."""
    entropy = [seed, stream, step, index]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0] >> np.uint64(1))


def loss_denominator(tokens: torch.Tensor, objective: ObjectiveConfig) -> int:
    """What :func:`compute_loss` divides a micro-batch's summed (weighted) cross-entropy by: its maskable tokens
    (``per_token``; caption tokens + ``<eot>`` for arc) or its captions with any (``per_sequence``); the batch
    size for the contrastive objective. tokens (B, L). Summed over the global batch it makes accumulation and
    DDP give the gradient of one big batch."""
    spec = objective_spec(objective.name)
    if spec.model != "captioner":
        return tokens.shape[0]  # a mean over the batch
    valid = ~padding_mask(tokens)[:, 1:] if spec.masking == "none" else maskable_positions(tokens)  # (B, L')
    per_caption = valid.sum(dim=1)  # (B,)
    return int(per_caption.sum()) if objective.normalization == "per_token" else int((per_caption > 0).sum())


class _Objective(torch.nn.Module):
    """:func:`compute_loss` as a module, so that DistributedDataParallel's forward sees every micro-batch."""

    def __init__(self, model: torch.nn.Module, cfg: ObjectiveConfig):
        super().__init__()
        self.model, self.cfg = model, cfg

    def forward(self, images: torch.Tensor, tokens: torch.Tensor, generator: torch.Generator
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        out = compute_loss(self.model, images, tokens, self.cfg, generator)
        return out.loss, out.metrics


class _BatchStream:
    """This rank's micro-batches, epoch after epoch, from the data position (epoch, batch_in_epoch).

    :meth:`take` returns n micro-batches of the current epoch or, when any rank cannot fill its n (the end of the
    epoch; ranks agree by one all-reduce), drops what it got, calls ``on_epoch_end`` and starts the next epoch.
    Skipped-record counts met on this rank accumulate in `pending` until the trainer sums them over ranks.
    """

    def __init__(self, cfg: RunConfig, ctx: dist.DistContext, epoch: int, batch_in_epoch: int,
                 on_epoch_end: Any):
        self.cfg, self.ctx, self.on_epoch_end = cfg, ctx, on_epoch_end
        self.epoch, self.batch_in_epoch = epoch, batch_in_epoch
        self.pending: Counter[str] = Counter()
        self._it: Iterator[dict[str, Any]] | None = None

    def _open(self) -> Iterator[dict[str, Any]]:
        t = self.cfg.train
        return iter(build_loader(self.cfg.data, split="train", image_size=self.cfg.model.image_size,
                                 batch_size=t.batch_size, seed=t.seed, epoch=self.epoch,
                                 skip_batches=self.batch_in_epoch, rank=self.ctx.rank, world=self.ctx.world))

    def take(self, n: int) -> list[dict[str, Any]]:
        while True:
            if self._it is None:
                self._it = self._open()
            got = list(islice(self._it, n))
            for batch in got:
                self.pending.update(batch.get("skipped", {}))
            if dist.all_agree(self.ctx, len(got) == n, "end-of-epoch agreement"):
                self.batch_in_epoch += n
                return got
            if self.batch_in_epoch == 0:
                t = self.cfg.train
                raise ValueError(f"data at {self.cfg.data.path} gave a rank fewer than {n} batches of {t.batch_size} "
                                 f"in a whole epoch (too few valid samples or shards for {self.ctx.world} ranks x "
                                 "grad_accum, or all corrupt); lower train.batch_size or check the data")
            self._it = None  # a DataLoader's workers stop with their iterator
            self.on_epoch_end(self.epoch)
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0


def _rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    return {"torch": torch.get_rng_state(), "python": list(random.getstate()[1]),
            "python_version": random.getstate()[0],
            "numpy": [np_state[0], torch.from_numpy(np_state[1].copy()), *np_state[2:]],
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate((state["python_version"], tuple(state["python"]), None))
    np_state = state["numpy"]
    np.random.set_state((np_state[0], np_state[1].numpy(), *np_state[2:]))
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _truncate_jsonl(path: Path, step: int) -> None:
    """Keep the lines of `path` logged at or before `step` (a killed run may have logged past its checkpoint)."""
    if not path.is_file():
        return
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    keep = []
    for line in lines:
        try:
            if json.loads(line).get("step", 0) <= step:
                keep.append(line)
        except json.JSONDecodeError:  # a line cut off by the kill
            continue
    ckpt_io._atomic_write_text(path, "".join(x + "\n" for x in keep))


def train(cfg: RunConfig, out: str | Path, *, resume: bool = False, progress: bool = True) -> TrainResult:
    """Train `cfg` into run folder `out`. With `resume`, continue from its latest complete checkpoint.

    Under ``torchrun`` every rank calls this: DistributedDataParallel (NCCL on CUDA, gloo on CPU), each rank
    reading its share of the data; the global batch is ``batch_size x world x grad_accum``. Only rank 0 writes.
    """
    cfg.validate()
    ctx = dist.setup(cfg.train.device, cfg.train.dist_timeout_s)
    try:
        return _train(cfg, Path(out), resume, progress, ctx)
    finally:
        dist.teardown(ctx)


def _train(cfg: RunConfig, out: Path, resume: bool, progress: bool, ctx: dist.DistContext) -> TrainResult:
    if not cfg.data.path:
        raise ValueError("data.path is empty: pass --data DIR (e.g. a folder written by `mdc data synth`)")
    resolve_source(cfg.data.path, cfg.data.format, "train")  # a missing or unusable path fails here, before any work
    start_ckpt = None
    if resume:
        start_ckpt = ckpt_io.latest_checkpoint(out)
        if start_ckpt is None:
            raise FileNotFoundError(f"--resume: {out} holds no complete checkpoint to resume from")
        saved = RunConfig.load(start_ckpt / "config.json")
        _check_resume_config(saved, cfg)
        cfg = saved if saved.train.steps == cfg.train.steps else _with_steps(saved, cfg.train.steps)
    elif ckpt_io.list_checkpoints(out) or (out / "metrics.jsonl").exists():
        raise FileExistsError(f"run folder {out} already holds a run; pass --resume to continue it or choose "
                              "another --out (nothing was overwritten)")
    dist.barrier(ctx, "start-up")  # every rank has checked the run folder before rank 0 writes to it

    t = cfg.train
    torch.manual_seed(t.seed)  # the same initial weights on every rank
    random.seed(t.seed)
    np.random.seed(t.seed)
    device, main = ctx.device, ctx.is_main
    bf16 = use_bf16(t.precision, device)
    model = build_model(cfg, progress=progress and main) if start_ckpt is None else ckpt_io.load_model(start_ckpt)[0]
    model.to(device).train()
    for part in (model.encoder, *model.decoder.layers) if t.compile and hasattr(model, "decoder") else ():
        part.compile()  # in place: state-dict keys, checkpoints and the EMA copy are unchanged
    if main:
        out.mkdir(parents=True, exist_ok=True)
        cfg.save(out / "config.json")
    objective = _Objective(model, cfg.objective)
    if ctx.distributed:
        objective = DistributedDataParallel(objective, device_ids=[device.index] if device.type == "cuda" else None)

    opt = torch.optim.AdamW(param_groups(model, t.weight_decay), lr=t.lr, betas=t.betas)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_lambda(s, t.warmup_steps, t.steps, t.min_lr_ratio))
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(t.ema_decay), use_buffers=True) \
        if t.ema_decay > 0 else None
    gen = torch.Generator(device=device)
    tokenizer = CaptionTokenizer(cfg.model.context_length)
    global_batch = t.batch_size * ctx.world * t.grad_accum

    step, epoch, batch_in_epoch, truncated, nonfinite_skipped = 0, 0, 0, 0, 0
    skipped: Counter[str] = Counter()  # over the run, all ranks
    skipped_epoch: Counter[str] = Counter()  # this epoch, all ranks
    if start_ckpt is not None:
        state = ckpt_io.load_train_state(start_ckpt)
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        if ema is not None and (start_ckpt / "ema.safetensors").is_file():
            ema.module.load_state_dict(ckpt_io.load_file(str(start_ckpt / "ema.safetensors")))
            ema.n_averaged.fill_(state.get("ema_n_averaged", 1))
        _set_rng_state(state["rng"])
        step, epoch, batch_in_epoch = state["step"], state["epoch"], state["batch_in_epoch"]
        saved_world = state.get("world", 1)
        if saved_world != ctx.world:  # the same number of samples of this epoch, but not the same samples
            batch_in_epoch = batch_in_epoch * saved_world // ctx.world
            warnings.warn(f"resuming a {saved_world}-rank run on {ctx.world} ranks: the global batch and the data "
                          "order of the current epoch change; metrics will not match an uninterrupted run",
                          stacklevel=2)
        skipped.update(state.get("skipped", {}))
        skipped_epoch.update(state.get("skipped_epoch", {}))
        truncated, nonfinite_skipped = state.get("truncated", 0), state.get("nonfinite_skipped", 0)
        if main:
            _truncate_jsonl(out / "metrics.jsonl", step)
            _truncate_jsonl(out / "epochs.jsonl", step)

    def reduce_pending() -> None:  # add every rank's newly met skipped records to the run/epoch counts
        counts = torch.tensor([float(stream.pending[r]) for r in SKIP_REASONS], dtype=torch.float64, device=device)
        dist.all_reduce(ctx, counts, "sum", "skipped-record counts")
        new = Counter({r: int(c) for r, c in zip(SKIP_REASONS, counts.tolist(), strict=True) if c})
        skipped.update(new)
        skipped_epoch.update(new)
        stream.pending.clear()

    def end_epoch(finished: int) -> None:
        reduce_pending()
        if main:
            with open(out / "epochs.jsonl", "a") as fh:
                fh.write(json.dumps({"epoch": finished, "step": step, "skipped": dict(skipped_epoch),
                                     "n_skipped": sum(skipped_epoch.values())}) + "\n")
            if skipped_epoch and progress:
                tqdm.write(f"epoch {finished}: skipped {dict(skipped_epoch)}")
        skipped_epoch.clear()

    def save() -> Path:
        train_state = {"optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "rng": _rng_state(),
                       "step": step, "epoch": stream.epoch, "batch_in_epoch": stream.batch_in_epoch,
                       "world": ctx.world, "global_batch": global_batch, "skipped": dict(skipped),
                       "skipped_epoch": dict(skipped_epoch), "truncated": truncated,
                       "nonfinite_skipped": nonfinite_skipped,
                       "ema_n_averaged": int(ema.n_averaged) if ema is not None else 0}
        ema_state = ema.module.state_dict() if ema is not None else None
        return ckpt_io.save_checkpoint(out, step, cfg, model, ema_state=ema_state, train_state=train_state,
                                       keep_last=t.keep_last)

    stream = _BatchStream(cfg, ctx, epoch, batch_in_epoch, end_epoch)
    metrics_file = open(out / "metrics.jsonl", "a") if main else None
    if main and progress:
        tqdm.write(f"global batch {global_batch} = {t.batch_size} per device x {ctx.world} devices "
                   f"({device.type}) x {t.grad_accum} accumulation")
    bar = tqdm(total=t.steps, initial=step, desc=f"train {cfg.objective.name}", unit="step",
               disable=not (progress and main))
    last_ckpt = start_ckpt
    loss_value = float("nan")
    window_start, window_samples = time.perf_counter(), 0.0
    consecutive_skips = 0
    try:
        while step < t.steps:
            micro = stream.take(t.grad_accum)
            tokens, n_cut = [], 0
            for batch in micro:
                tok, cut = tokenizer.tokenize_batch(batch["caption"])
                tokens.append(tok)
                n_cut += cut
            counts = [loss_denominator(tok, cfg.objective) for tok in tokens]
            denom = dist.all_reduce(ctx, torch.tensor([float(sum(counts))], dtype=torch.float64, device=device),
                                    "sum", "loss normalisation")
            denom_value = max(float(denom.item()), 1.0)
            sums: dict[str, torch.Tensor] = {}
            loss_sum = torch.zeros((), dtype=torch.float64, device=device)
            torch.manual_seed(step_seed(t.seed, step, ctx.rank, stream=1))  # dropout: per step and rank
            for a, (batch, tok, n) in enumerate(zip(micro, tokens, counts, strict=True)):
                gen.manual_seed(step_seed(t.seed, step, a * ctx.world + ctx.rank))  # = one process's micro-batch
                last = a == len(micro) - 1
                sync = objective.no_sync() if ctx.distributed and not last else contextlib.nullcontext()
                with dist.guard(ctx, "DDP forward/backward (gradient all-reduce)"), sync:
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                        loss, metrics = objective(batch["image"].to(device, non_blocking=True), tok.to(device), gen)
                    # DDP averages gradients over ranks: x world makes that a sum, / denom the global normalisation
                    (loss * (n * ctx.world / denom_value)).backward()
                loss_sum += loss.detach().double() * n
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0) + v.detach().double() / len(micro)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip if t.grad_clip > 0 else
                                                       float("inf"))
            keys = sorted(k for k in sums if k != "loss")
            local_samples = float(sum(len(b["caption"]) for b in micro))
            vec = torch.cat([torch.stack([loss_sum, *(sums[k] / ctx.world for k in keys)]),
                               torch.tensor([local_samples, float(n_cut)], dtype=torch.float64, device=device)])
            vec = dist.all_reduce(ctx, vec, "sum", "metrics").tolist()  # one collective for all step metrics
            loss_value = vec[0] / denom_value
            step_metrics = {"loss": loss_value, **dict(zip(keys, vec[1:1 + len(keys)], strict=True))}
            window_samples += vec[-2]
            truncated += int(vec[-1])  # every count kept here is the all-rank total, the same on every rank
            reduce_pending()
            if not math.isfinite(loss_value) or not math.isfinite(float(grad_norm)):
                opt.zero_grad(set_to_none=True)
                what = f"loss became {loss_value} (grad norm {float(grad_norm)}) at step {step}"
                where = f"last good checkpoint: {last_ckpt}" if last_ckpt else "no checkpoint was written yet"
                consecutive_skips += 1
                if t.nonfinite == "stop" or consecutive_skips > t.max_skipped_steps:
                    why = ("train.nonfinite=stop" if t.nonfinite == "stop" else
                           f"train.nonfinite=skip, but {consecutive_skips} updates in a row were non-finite "
                           f"(train.max_skipped_steps={t.max_skipped_steps})")
                    raise TrainingDiverged(f"{what}; stopping without saving ({why}). {where}. Try a lower "
                                           "train.lr or train.grad_clip=1.0")
                nonfinite_skipped += 1
                if main:
                    tqdm.write(f"{what}; skipped this update (train.nonfinite=skip; {nonfinite_skipped} so far)")
                continue
            consecutive_skips = 0
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
            if ema is not None:
                ema.update_parameters(model)
            step += 1
            bar.update(1)
            if main and (step % t.log_every == 0 or step == t.steps):
                elapsed = time.perf_counter() - window_start
                record = {"step": step, "epoch": stream.epoch, "lr": sched.get_last_lr()[0],
                          "grad_norm": float(grad_norm), **step_metrics, "global_batch": global_batch,
                          "samples_per_s": window_samples / max(elapsed, 1e-9), "skipped": sum(skipped.values()),
                          "truncated": truncated, "nonfinite_skipped": nonfinite_skipped}
                metrics_file.write(json.dumps(record) + "\n")
                metrics_file.flush()
                bar.set_postfix(loss=f"{loss_value:.3f}", acc=f"{record.get('acc_masked', float('nan')):.2f}")
                window_start, window_samples = time.perf_counter(), 0.0
            if step % t.ckpt_every == 0 or step == t.steps:
                if main:
                    last_ckpt = save()
                else:
                    last_ckpt = out / ckpt_io.CKPT_DIR / f"step_{step:08d}"
        dist.barrier(ctx, "end of training")
    finally:
        bar.close()
        if metrics_file is not None:
            metrics_file.close()
    if last_ckpt is None:  # resumed a run that was already complete
        last_ckpt = ckpt_io.latest_checkpoint(out)
    return TrainResult(out, step, loss_value, last_ckpt, dict(skipped), truncated)


def _with_steps(cfg: RunConfig, steps: int) -> RunConfig:
    data = cfg.to_dict()
    data["train"]["steps"] = steps
    return RunConfig.from_dict(data)


def _check_resume_config(saved: RunConfig, given: RunConfig) -> None:
    """Resuming keeps the saved config; a different one given now (other than train.steps) is an error."""
    a, b = saved.to_dict(), given.to_dict()
    a["train"]["steps"] = b["train"]["steps"]
    a["model"]["output_vocab_size"] = b["model"]["output_vocab_size"] = 0
    a["preset"] = b["preset"] = ""
    diffs = [f"{s}.{k}: saved {a[s][k]!r}, given {b[s][k]!r}" for s in a if isinstance(a[s], dict)
             for k in a[s] if a[s][k] != b[s].get(k)]
    if diffs:
        raise ValueError("--resume with a config that differs from the run's saved config.json: " +
                         "; ".join(diffs[:5]) + ". Resume with the same options (only --steps may change).")
