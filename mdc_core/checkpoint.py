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
one; :func:`latest_checkpoint` skips any folder without a valid ``meta.json``. ``meta.json`` also records the
size and SHA-256 of every file; loading verifies the files it reads (:func:`verify_checkpoint`), so a file damaged
later (a full disk, a killed copy) raises :class:`CheckpointError` naming it instead of a decoder traceback, and
:func:`latest_intact_checkpoint` (used by ``--resume``) falls back to the newest checkpoint that verifies.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from .config import RunConfig
from .factory import create_model

CKPT_DIR = "checkpoints"
FILES = ("model.safetensors", "config.json", "state.pt")
CORRUPT_PREFIX = "corrupt_"  # a checkpoint --resume found damaged is renamed corrupt_step_... (kept, never loaded)


class CheckpointError(ValueError):
    """A checkpoint file is damaged (its size or SHA-256 differs from meta.json, or it cannot be decoded)."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


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
    files = sorted(p.name for p in tmp.iterdir())
    (tmp / "meta.json").write_text(json.dumps({"step": step, "complete": True, "files": files,
                                               "bytes": {f: (tmp / f).stat().st_size for f in files},
                                               "sha256": {f: _sha256(tmp / f) for f in files}}))
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


def verify_checkpoint(ckpt: str | Path, files: tuple[str, ...] | None = None) -> None:
    """Check `files` of checkpoint folder `ckpt` (default: the binary ones, every file ``meta.json`` lists but
    ``config.json``, which stays editable and whose errors the config loader reports) against the sizes and
    SHA-256 digests in ``meta.json``; raise :class:`CheckpointError` naming the first damaged file. Checkpoints
    written before digests were recorded pass unchecked."""
    ckpt = Path(ckpt)
    try:
        meta = json.loads((ckpt / "meta.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise CheckpointError(f"checkpoint {ckpt}: meta.json is missing or damaged ({err})") from err
    digests, sizes = meta.get("sha256", {}), meta.get("bytes", {})
    for name in files or tuple(f for f in digests if f != "config.json"):
        path = ckpt / name
        if name not in digests:
            continue
        if not path.is_file():
            raise CheckpointError(f"checkpoint file {path} is missing")
        size = path.stat().st_size
        if size != sizes.get(name, size) or _sha256(path) != digests[name]:
            raise CheckpointError(f"checkpoint file {path} is corrupt ({size} bytes; its SHA-256 or size differs "
                                  "from meta.json: truncated or overwritten)")


def _damaged(ckpt: Path, files: tuple[str, ...] | None = None) -> str:
    """'' when `ckpt` verifies, else the CheckpointError message."""
    try:
        verify_checkpoint(ckpt, files)
    except CheckpointError as err:
        return str(err)
    return ""


def latest_intact_checkpoint(run_dir: str | Path, *, set_aside: bool = False) -> Path | None:
    """The newest checkpoint of `run_dir` whose files all verify (None: no complete checkpoint at all).

    Each newer damaged one is reported with a warning and, with `set_aside`, renamed ``corrupt_step_...`` so that
    it is never loaded or pruned in place of a good one. Raises :class:`CheckpointError` when every complete
    checkpoint is damaged.
    """
    found = list_checkpoints(run_dir)
    latest = latest_checkpoint(run_dir)
    if latest is not None and latest in found:  # `latest` first, then the rest newest first
        found.remove(latest)
        found.append(latest)
    problems = []
    for ckpt in reversed(found):
        problem = _damaged(ckpt)
        if not problem:
            if problems:
                warnings.warn(f"{'; '.join(problems)}; using the newest intact checkpoint, {ckpt.name}", stacklevel=2)
            return ckpt
        problems.append(problem)
        if set_aside:
            os.replace(ckpt, ckpt.with_name(CORRUPT_PREFIX + ckpt.name))
    if problems:
        raise CheckpointError(f"{problems[0]}; no intact checkpoint left in {run_dir}")
    return None


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


def _previous_hint(ckpt: Path) -> str:
    """'; the newest intact checkpoint is X' for a damaged checkpoint of a run folder ('' if none)."""
    older = [c for c in list_checkpoints(ckpt.parent.parent) if c.name < ckpt.name]
    intact = next((c for c in reversed(older) if not _damaged(c, ("model.safetensors",))), None)
    return f"; the newest intact checkpoint is {intact} (pass it as --run)" if intact else ""


def load_model(path: str | Path, *, device: str | torch.device = "cpu", ema: bool = False
               ) -> tuple[torch.nn.Module, RunConfig]:
    """Rebuild a model from a run or checkpoint folder: its ``config.json`` builds the architecture and the
    safetensors weights fill it (no pickle is executed). ``ema=True`` loads the EMA weights if saved."""
    ckpt = resolve_checkpoint(path)
    weights = ckpt / ("ema.safetensors" if ema else "model.safetensors")
    if not weights.is_file():
        raise FileNotFoundError(f"{weights} not found" + (" (the run was trained without EMA)" if ema else ""))
    problem = _damaged(ckpt, (weights.name,))
    if problem:
        raise CheckpointError(problem + _previous_hint(ckpt))
    cfg = RunConfig.load(ckpt / "config.json")
    state = load_weights(weights)
    arch = dataclasses.replace(cfg.model, pretrained=False, pretrained_path="")  # weights come from the checkpoint
    model = create_model(arch, cfg.objective.name)  # a Captioner, or a CLIPModel for objective "clip"
    model.load_state_dict(state)
    return model.to(device).eval(), cfg


def load_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors; a file that cannot be decoded raises :class:`CheckpointError` naming it."""
    try:
        return load_file(str(path))
    except Exception as err:  # safetensors raises SafetensorError (not an OSError) for truncated headers/data
        raise CheckpointError(f"checkpoint file {path} cannot be read ({type(err).__name__}: "
                              f"{str(err).splitlines()[0][:200]}): truncated or not a safetensors file") from err


def load_train_state(ckpt: Path) -> dict[str, Any]:
    """Optimizer/scheduler/RNG/data-position state, loaded with ``weights_only=True`` (no code execution)."""
    try:
        return torch.load(ckpt / "state.pt", map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, ValueError) as err:  # PytorchStreamReader failures are RuntimeErrors
        raise CheckpointError(f"checkpoint file {ckpt / 'state.pt'} cannot be read ({type(err).__name__}: "
                              f"{str(err).splitlines()[0][:200]})") from err


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
