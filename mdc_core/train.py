"""The training loop: AdamW, warm-up + cosine, accumulation, clipping, EMA, bf16 on CUDA, atomic checkpoints.

``train(cfg, out)`` runs a :class:`RunConfig` into the run folder `out` (layout in :mod:`mdc_core.checkpoint`).
A resumed run restores model, optimizer, scheduler, EMA, RNG states and the data position, so it continues
exactly where it stopped. A non-finite loss stops the run with :class:`TrainingDiverged` before anything is
written, so the last checkpoint on disk is the last good one.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from tqdm.auto import tqdm

from . import checkpoint as ckpt_io
from .config import RunConfig
from .data import build_loader, iter_captions
from .model import Captioner
from .objectives import compute_loss, objective_spec
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


def build_model(cfg: RunConfig, progress: bool = False) -> Captioner:
    """A fresh model for `cfg`; for ``output_vocab="corpus"`` the id table is built from the training captions
    and its size is written into ``cfg.model.output_vocab_size`` (so ``config.json`` rebuilds the same shape)."""
    output_ids = None
    if cfg.model.output_vocab == "corpus":
        captions = iter_captions(cfg.data, split="train")
        if progress:
            captions = tqdm(captions, desc="corpus vocabulary", unit=" captions", leave=False)
        output_ids = build_output_vocab(captions, CaptionTokenizer(cfg.model.context_length))
        cfg.model.output_vocab_size = len(output_ids)
    return Captioner(cfg.model, causal=objective_spec(cfg.objective.name).causal, output_ids=output_ids)


def _rng_state(gen: torch.Generator) -> dict[str, Any]:
    np_state = np.random.get_state()
    return {"torch": torch.get_rng_state(), "python": list(random.getstate()[1]), "python_version": random.getstate()[0],
            "numpy": [np_state[0], torch.from_numpy(np_state[1].copy()), *np_state[2:]],
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [], "mask": gen.get_state()}


def _set_rng_state(state: dict[str, Any], gen: torch.Generator) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate((state["python_version"], tuple(state["python"]), None))
    np_state = state["numpy"]
    np.random.set_state((np_state[0], np_state[1].numpy(), *np_state[2:]))
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    gen.set_state(state["mask"])


def train(cfg: RunConfig, out: str | Path, *, resume: bool = False, progress: bool = True) -> TrainResult:
    """Train `cfg` into run folder `out`. With `resume`, continue from its latest complete checkpoint."""
    out = Path(out)
    cfg.validate()
    if not cfg.data.path:
        raise ValueError("data.path is empty: pass --data DIR (e.g. a folder written by `mdc data synth`)")
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

    torch.manual_seed(cfg.train.seed)
    random.seed(cfg.train.seed)
    np.random.seed(cfg.train.seed)
    device = resolve_device(cfg.train.device)
    bf16 = use_bf16(cfg.train.precision, device)
    if start_ckpt is None:
        model = build_model(cfg, progress=progress)
    else:
        model, _ = ckpt_io.load_model(start_ckpt)
    model.to(device).train()
    out.mkdir(parents=True, exist_ok=True)
    cfg.save(out / "config.json")

    opt = torch.optim.AdamW(param_groups(model, cfg.train.weight_decay), lr=cfg.train.lr, betas=cfg.train.betas)
    t = cfg.train
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_lambda(s, t.warmup_steps, t.steps, t.min_lr_ratio))
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(t.ema_decay), use_buffers=True) \
        if t.ema_decay > 0 else None
    gen = torch.Generator(device=device).manual_seed(t.seed + 1)
    tokenizer = CaptionTokenizer(cfg.model.context_length)

    step, epoch, batch_in_epoch = 0, 0, 0
    skipped: Counter[str] = Counter()
    truncated = 0
    if start_ckpt is not None:
        state = ckpt_io.load_train_state(start_ckpt)
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        if ema is not None and (start_ckpt / "ema.safetensors").is_file():
            ema.module.load_state_dict(ckpt_io.load_file(str(start_ckpt / "ema.safetensors")))
            ema.n_averaged.fill_(state.get("ema_n_averaged", 1))
        _set_rng_state(state["rng"], gen)
        step, epoch, batch_in_epoch = state["step"], state["epoch"], state["batch_in_epoch"]
        skipped.update(state.get("skipped", {}))
        truncated = state.get("truncated", 0)

    def save() -> Path:
        train_state = {"optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "rng": _rng_state(gen),
                       "step": step, "epoch": epoch, "batch_in_epoch": batch_in_epoch,
                       "skipped": dict(skipped), "truncated": truncated,
                       "ema_n_averaged": int(ema.n_averaged) if ema is not None else 0}
        ema_state = ema.module.state_dict() if ema is not None else None
        return ckpt_io.save_checkpoint(out, step, cfg, model, ema_state=ema_state, train_state=train_state,
                                       keep_last=t.keep_last)

    def batches():
        nonlocal epoch, batch_in_epoch
        while True:
            loader = build_loader(cfg.data, split="train", image_size=cfg.model.image_size,
                                  batch_size=t.batch_size, seed=t.seed, epoch=epoch, skip_batches=batch_in_epoch)
            n = 0
            for batch in loader:
                batch_in_epoch += 1
                n += 1
                yield batch
            if n == 0 and batch_in_epoch == 0:
                raise ValueError(f"data at {cfg.data.path} produced no batch of {t.batch_size} (too few valid "
                                 "samples, or all corrupt); lower train.batch_size or check the data")
            if progress and skipped:
                tqdm.write(f"epoch {epoch}: skipped so far {dict(skipped)}")
            epoch, batch_in_epoch = epoch + 1, 0

    metrics_file = open(out / "metrics.jsonl", "a")
    stream = batches()
    bar = tqdm(total=t.steps, initial=step, desc=f"train {cfg.objective.name}", unit="step", disable=not progress)
    last_ckpt = start_ckpt
    loss_value = float("nan")
    window_start, window_samples = time.perf_counter(), 0
    try:
        while step < t.steps:
            sums: dict[str, torch.Tensor] = {}
            for _ in range(t.grad_accum):
                batch = next(stream)
                skipped.update(batch.get("skipped", {}))
                tokens, n_cut = tokenizer.tokenize_batch(batch["caption"])
                truncated += n_cut
                images = batch["image"].to(device, non_blocking=True)
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                    result = compute_loss(model, images, tokens.to(device), cfg.objective, gen)
                (result.loss / t.grad_accum).backward()
                for k, v in result.metrics.items():
                    sums[k] = sums.get(k, 0) + v / t.grad_accum
                window_samples += len(batch["caption"])
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip if t.grad_clip > 0 else
                                                       float("inf"))
            loss_value = float(sums["loss"])
            if not math.isfinite(loss_value) or not math.isfinite(float(grad_norm)):
                where = f"last good checkpoint: {last_ckpt}" if last_ckpt else "no checkpoint was written yet"
                raise TrainingDiverged(f"loss became {loss_value} (grad norm {float(grad_norm)}) at step {step}; "
                                       f"stopping without saving. {where}. Try a lower train.lr or "
                                       "train.grad_clip=1.0")
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
            if ema is not None:
                ema.update_parameters(model)
            step += 1
            bar.update(1)
            if step % t.log_every == 0 or step == t.steps:
                elapsed = time.perf_counter() - window_start
                record = {"step": step, "epoch": epoch, "lr": sched.get_last_lr()[0], "grad_norm": float(grad_norm),
                          **{k: float(v) for k, v in sums.items()},
                          "samples_per_s": window_samples / max(elapsed, 1e-9),
                          "skipped": sum(skipped.values()), "truncated": truncated}
                metrics_file.write(json.dumps(record) + "\n")
                metrics_file.flush()
                bar.set_postfix(loss=f"{loss_value:.3f}", acc=f"{record['acc_masked']:.2f}")
                window_start, window_samples = time.perf_counter(), 0
            if step % t.ckpt_every == 0 or step == t.steps:
                last_ckpt = save()
    finally:
        bar.close()
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
