"""Run folders and checkpoints, written atomically and loaded without executing pickles.

Layout of a run folder::

    RUN/config.json                 full RunConfig (rebuilds the model)
    RUN/metrics.jsonl               one JSON object per logged step (rank 0; truncated to the step on resume)
    RUN/epochs.jsonl                one JSON object per finished epoch: corrupt records skipped, by reason
    RUN/checkpoints/step_00001500/  model.safetensors, ema.safetensors (optional), config.json,
                                    state.pt (optimizer, scheduler, RNG, data position,
                                    world size, counters), meta.json
    RUN/checkpoints/latest          name of the newest complete checkpoint

A checkpoint is assembled in a hidden temporary folder and renamed into place (atomic on POSIX), and
``meta.json`` is written last, so a crash mid-write leaves either the previous checkpoint or a complete new
one; :func:`latest_checkpoint` skips any folder without a valid ``meta.json``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from .config import RunConfig
from .factory import create_model

CKPT_DIR = "checkpoints"
FILES = ("model.safetensors", "config.json", "state.pt")


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _state_for_safetensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu").contiguous() for k, v in state.items()}


def save_checkpoint(run_dir: str | Path, step: int, cfg: RunConfig, model: torch.nn.Module, *,
                    ema_state: dict[str, torch.Tensor] | None = None, train_state: dict[str, Any] | None = None,
                    keep_last: int = 2) -> Path:
    """Write checkpoint `step` of `run_dir` atomically, point ``latest`` at it and prune old ones."""
    root = Path(run_dir) / CKPT_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:08d}"
    tmp = root / f".tmp_step_{step:08d}_{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    save_file(_state_for_safetensors(model.state_dict()), str(tmp / "model.safetensors"))
    if ema_state is not None:
        save_file(_state_for_safetensors(ema_state), str(tmp / "ema.safetensors"))
    cfg.save(tmp / "config.json")
    torch.save(train_state or {}, tmp / "state.pt")
    (tmp / "meta.json").write_text(json.dumps({"step": step, "complete": True, "files": sorted(
        p.name for p in tmp.iterdir())}))
    for p in tmp.iterdir():
        with open(p, "rb") as fh:
            os.fsync(fh.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _atomic_write_text(root / "latest", final.name + "\n")
    for old in list_checkpoints(run_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _is_complete(path: Path) -> bool:
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return bool(meta.get("complete")) and all((path / f).is_file() for f in meta.get("files", FILES))


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (half-written ones are left out)."""
    root = Path(run_dir) / CKPT_DIR
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step_*") if p.is_dir() and _is_complete(p))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint: the one ``latest`` names if it is intact, else the newest intact one."""
    root = Path(run_dir) / CKPT_DIR
    pointer = root / "latest"
    if pointer.is_file():
        named = root / pointer.read_text().strip()
        if named.is_dir() and _is_complete(named):
            return named
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def resolve_checkpoint(path: str | Path) -> Path:
    """Accept a run folder or a checkpoint folder; return the checkpoint folder, or raise a clear error."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"run or checkpoint folder not found: {path}")
    if (path / "model.safetensors").is_file():
        if not _is_complete(path):
            raise ValueError(f"checkpoint {path} is incomplete (no valid meta.json): it was cut off mid-write")
        return path
    ckpt = latest_checkpoint(path)
    if ckpt is None:
        raise FileNotFoundError(f"{path} holds no complete checkpoint (expected {CKPT_DIR}/step_*/model.safetensors)")
    return ckpt


def load_model(path: str | Path, *, device: str | torch.device = "cpu", ema: bool = False
               ) -> tuple[torch.nn.Module, RunConfig]:
    """Rebuild a model from a run or checkpoint folder: its ``config.json`` builds the architecture and the
    safetensors weights fill it (no pickle is executed). ``ema=True`` loads the EMA weights if saved."""
    ckpt = resolve_checkpoint(path)
    cfg = RunConfig.load(ckpt / "config.json")
    weights = ckpt / ("ema.safetensors" if ema else "model.safetensors")
    if not weights.is_file():
        raise FileNotFoundError(f"{weights} not found" + (" (the run was trained without EMA)" if ema else ""))
    state = load_file(str(weights))
    arch = dataclasses.replace(cfg.model, pretrained=False, pretrained_path="")  # weights come from the checkpoint
    model = create_model(arch, cfg.objective.name)  # a Captioner, or a CLIPModel for objective "clip"
    model.load_state_dict(state)
    return model.to(device).eval(), cfg


def load_train_state(ckpt: Path) -> dict[str, Any]:
    """Optimizer/scheduler/RNG/data-position state, loaded with ``weights_only=True`` (no code execution)."""
    return torch.load(ckpt / "state.pt", map_location="cpu", weights_only=True)


def rng_state() -> dict[str, Any]:
    """The torch, Python, NumPy and CUDA generator states (for ``state.pt``; loads with ``weights_only``)."""
    np_state = np.random.get_state()
    return {"torch": torch.get_rng_state(), "python": list(random.getstate()[1]),
            "python_version": random.getstate()[0],
            "numpy": [np_state[0], torch.from_numpy(np_state[1].copy()), *np_state[2:]],
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` saved."""
    torch.set_rng_state(state["torch"])
    random.setstate((state["python_version"], tuple(state["python"]), None))
    np_state = state["numpy"]
    np.random.set_state((np_state[0], np_state[1].numpy(), *np_state[2:]))
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def truncate_jsonl(path: Path, step: int) -> None:
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
    _atomic_write_text(path, "".join(x + "\n" for x in keep))
