"""Checkpoints: written atomically, verified, found and read without executing pickles or trusting a file.

    RUN/checkpoints/step_00001500/  model.safetensors, ema.safetensors (optional), config.json (rebuilds the
                                    model), state.pt (mdc_core.run_state.TrainState), meta.json
    RUN/checkpoints/latest          name of the newest complete checkpoint

**Written atomically.** A checkpoint is assembled in a hidden temporary folder and renamed into place, ``meta.json``
last, so a crash leaves the previous checkpoint or a complete new one, and a ``step_*`` folder without a valid
``meta.json`` is damaged, never half-written; a disk too full for a checkpoint is a :class:`DiskFullError`.

**Verified.** ``meta.json`` records the size and SHA-256 of every file; readers verify the files they read
(:func:`diagnose`), so a file damaged later raises :class:`CheckpointError` naming it instead of a decoder
traceback or a silent fallback. Weights are decoded with one-line errors (:func:`load_weights`); no pickle runs.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import resource
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from .config import RunConfig
from .sources import file_sha256

CKPT_DIR = "checkpoints"
FILES = ("model.safetensors", "config.json", "state.pt")
CORRUPT_PREFIX = "corrupt_"  # a checkpoint --resume found damaged is renamed corrupt_step_... (kept, never loaded)
TMP_PREFIX = ".tmp_step_"  # a checkpoint being written: .tmp_step_<step>_<pid>, renamed step_<step> when complete
WEIGHTS_ONLY = ("state.pt",)  # what a checkpoint can lack and still give its weights (a weights-only resume)
HUB_PREFIXES = ("hf-hub:", "hf_hub:")  # timm model names it resolves on the Hugging Face Hub (network)


class CheckpointError(ValueError):
    """A checkpoint file is damaged (its size or SHA-256 differs from meta.json, or it cannot be decoded)."""


class DiskFullError(OSError):
    """Too little free space for a checkpoint (found before writing it, or ENOSPC while writing it)."""

    def __init__(self, message: str):
        super().__init__(errno.ENOSPC, message)

    def __str__(self) -> str:
        return self.strerror


# -- written -----------------------------------------------------------------------------------------------------------

def atomic_write_text(path: Path, text: str) -> None:
    """Write `path` whole or not at all: a temporary file beside it, synced, renamed over it."""
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
    """Write checkpoint `step` of `run_dir` atomically, point ``latest`` at it and prune old ones.

    Raises :class:`DiskFullError` when the free space is short of the checkpoint's size (after pruning what this
    save would prune anyway) or the disk fills while writing; the temporary folder is removed either way and the
    previous checkpoints stay as they were."""
    root = Path(run_dir) / CKPT_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:08d}"
    tmp = root / f"{TMP_PREFIX}{step:08d}_{os.getpid()}"
    weights = {"model.safetensors": _state_for_safetensors(model.state_dict())}
    if ema_state is not None:
        weights["ema.safetensors"] = _state_for_safetensors(ema_state)
    need = int(1.01 * (_nbytes(weights) + _nbytes(train_state))) + (64 << 10)  # + config.json, meta.json
    _ensure_space(run_dir, root, step, need, keep_last)
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        tmp.mkdir()
        cfg.save(tmp / "config.json")
        mode = (tmp / "config.json").stat().st_mode & 0o777  # what the umask gives every other file
        for name, tensors in weights.items():
            save_file(tensors, str(tmp / name))
            os.chmod(tmp / name, mode)  # the safetensors writer creates its files 0600
        torch.save(train_state or {}, tmp / "state.pt")
        files = sorted(p.name for p in tmp.iterdir())
        (tmp / "meta.json").write_text(json.dumps({"step": step, "complete": True, "files": files,
                                                   "bytes": {f: (tmp / f).stat().st_size for f in files},
                                                   "sha256": {f: file_sha256(tmp / f) for f in files}}))
        for p in tmp.iterdir():
            with open(p, "rb") as fh:
                os.fsync(fh.fileno())
    except BaseException as err:
        full = _disk_full(err, root, need)
        shutil.rmtree(tmp, ignore_errors=True)
        if full:
            raise DiskFullError(f"the disk holding {root} filled up while writing checkpoint {final.name} "
                                f"(about {_mb(need)} needed; or a file size limit, ulimit -f, was reached): removed "
                                f"the partial checkpoint; {_last_good(run_dir)}. Free some space, then continue with "
                                "--resume") from err
        raise
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    atomic_write_text(root / "latest", final.name + "\n")
    for old in list_checkpoints(run_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _nbytes(obj: Any) -> int:
    """Bytes torch.save or safetensors write for the tensors and arrays in a (nested) dict/list/tuple: their data
    and about 256 bytes of framing each (a zip record or a header entry, aligned)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size() + 256
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v) for v in obj)
    return 0


def _mb(n: float) -> str:
    return f"{n / 2**20:.1f} MB" if n < 2**30 else f"{n / 2**30:.2f} GB"


def _last_good(run_dir: str | Path) -> str:
    last = latest_checkpoint(run_dir)
    return f"the last good checkpoint is {last}" if last else "no checkpoint was written yet"


def _ensure_space(run_dir: str | Path, root: Path, step: int, need: int, keep_last: int) -> None:
    """Raise :class:`DiskFullError` unless `need` bytes are free under `root`; before giving up, prune the old
    checkpoints this save would prune anyway (never the newest, so a failed save still leaves one)."""
    free = shutil.disk_usage(root).free
    if free >= need:
        return
    old = list_checkpoints(run_dir)
    for ckpt in old[:max(0, len(old) - max(keep_last - 1, 1))]:
        shutil.rmtree(ckpt, ignore_errors=True)
    free = shutil.disk_usage(root).free
    if free < need:
        raise DiskFullError(f"not enough free space for checkpoint step_{step:08d} in {root}: it needs about "
                            f"{_mb(need)}, {_mb(free)} are free; {_last_good(run_dir)}. Free some space (older "
                            f"step_* folders in {root} may go: --resume needs only the last good one), then "
                            "continue with --resume")


def _disk_full(err: BaseException, root: Path, need: int) -> bool:
    """Whether `err` (raised while writing a checkpoint) means the disk or the quota is full. safetensors and
    torch.save report ENOSPC in their own words: "os error 28", "unexpected pos" (a short write)."""
    for e in (err, err.__cause__, err.__context__):
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            return True
    text = str(err)
    if any(words in text for words in ("No space left", "os error 28", "Disk quota", "File too large",
                                       "os error 27")):  # 27: EFBIG, a file size limit (ulimit -f)
        return True
    try:
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]  # ulimit -f: a short write like a full disk's
        short = shutil.disk_usage(root).free < need or limit != resource.RLIM_INFINITY and limit < need
        return "unexpected pos" in text and short
    except OSError:
        return False


def remove_stale_temporaries(run_dir: str | Path) -> list[str]:
    """Remove the half-written checkpoints (``.tmp_step_<step>_<pid>``) and temporary files that writers which are
    no longer running left in `run_dir`; return their names. Call it holding the run folder's lock."""
    root = Path(run_dir) / CKPT_DIR
    removed = []
    for path in [*root.glob(TMP_PREFIX + "*"), *root.glob(".*.tmp*"), *Path(run_dir).glob(".*.tmp*")]:
        pid = path.name.rsplit("_" if path.name.startswith(TMP_PREFIX) else "tmp", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and _alive(int(pid)):
            continue  # a running writer's (one that takes no lock: an older mdc)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path.name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


# -- verified and found ------------------------------------------------------------------------------------------------

def diagnose(ckpt: str | Path, files: tuple[str, ...] | None = None, *, digests: bool = True) -> str:
    """What is wrong with checkpoint folder `ckpt`, in one line naming the file ('' when nothing is).

    Checks ``meta.json`` and then `files` (default: every file it lists): each must exist and, with `digests`,
    match the size and SHA-256 that ``meta.json`` records (``config.json`` stays hand-editable: only its presence
    is checked; checkpoints written before digests were recorded are checked for presence only)."""
    ckpt = Path(ckpt)
    meta_file = ckpt / "meta.json"
    if not meta_file.is_file():
        return (f"checkpoint {ckpt} has no meta.json (a checkpoint is renamed into place only after meta.json is "
                "written, so the file was deleted or the folder copied incompletely)")
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, ValueError) as err:
        return f"checkpoint file {meta_file} is damaged ({type(err).__name__}: {str(err)[:120]})"
    if not isinstance(meta, dict) or not meta.get("complete") or not isinstance(meta.get("files", []), list):
        return f"checkpoint file {meta_file} is damaged (it does not record a complete checkpoint)"
    sha, sizes = meta.get("sha256", {}), meta.get("bytes", {})
    for name in files if files is not None else tuple(meta.get("files", FILES)):
        path = ckpt / name
        if not path.is_file():
            return f"checkpoint file {path} is missing"
        if not digests or name == "config.json" or name not in sha:
            continue
        size = path.stat().st_size
        if size != sizes.get(name, size) or file_sha256(path) != sha[name]:
            return (f"checkpoint file {path} is corrupt ({size} bytes; its SHA-256 or size differs from meta.json: "
                    "truncated or overwritten)")
    return ""


def config_problem(ckpt: str | Path) -> str:
    """What keeps checkpoint `ckpt`'s ``config.json`` from building its model, in one line ('' when nothing does):
    :func:`diagnose` only checks that it exists, since it stays hand-editable."""
    path = Path(ckpt) / "config.json"
    try:
        RunConfig.load(path)
    except (OSError, ValueError) as err:  # ConfigError and JSONDecodeError are ValueErrors
        return f"checkpoint file {path} is damaged ({type(err).__name__}: {str(err)[:120]})"
    return ""


def step_problem(ckpt: str | Path) -> str:
    """What is inconsistent about checkpoint `ckpt`'s step, in one line ('' when nothing is): ``meta.json``'s step
    must be an integer and the folder's name (``step_00000020``) that step. Call it on a folder :func:`diagnose`
    passed."""
    ckpt = Path(ckpt)
    step = json.loads((ckpt / "meta.json").read_text()).get("step")
    if isinstance(step, bool) or not isinstance(step, int) or ckpt.name != f"step_{step:08d}":
        return f"checkpoint {ckpt}: its meta.json records step {step!r}, which is not the step its folder is named for"
    return ""


def verify_checkpoint(ckpt: str | Path, files: tuple[str, ...] | None = None) -> None:
    """Raise :class:`CheckpointError` naming what :func:`diagnose` finds wrong with `ckpt` (default: every file)."""
    problem = diagnose(ckpt, files)
    if problem:
        raise CheckpointError(problem)


def listed_files(ckpt: Path, skip: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """The files `ckpt`'s meta.json lists, but `skip` (None: no readable meta.json)."""
    try:
        listed = json.loads((ckpt / "meta.json").read_text()).get("files", FILES)
    except (OSError, ValueError, AttributeError):
        return None
    return tuple(f for f in listed if f not in skip)


def set_aside(ckpt: Path) -> Path:
    """Rename damaged checkpoint `ckpt` to ``corrupt_<name>`` (``.1``, ``.2``... if taken): kept for inspection,
    never loaded, pruned or overwritten."""
    target = ckpt.with_name(CORRUPT_PREFIX + ckpt.name)
    n = 0
    while target.exists():
        n += 1
        target = ckpt.with_name(f"{CORRUPT_PREFIX}{ckpt.name}.{n}")
    os.replace(ckpt, target)
    return target


def checkpoint_folders(run_dir: str | Path) -> list[Path]:
    """Every checkpoint folder ``step_*`` of a run, intact or damaged, oldest first."""
    root = Path(run_dir) / CKPT_DIR
    if not root.is_dir():
        return []
    # iterdir, not glob: a folder this user may not read is a PermissionError naming it, never "no checkpoint"
    return sorted(p for p in root.iterdir() if p.name.startswith("step_") and p.is_dir())


def run_holding(folder: str | Path) -> Path | None:
    """The run folder whose checkpoints folder `folder` is (or is inside), after links and ``..``, or None: no
    run folder, export or other output may be there (pruning old checkpoints would delete it)."""
    folder = Path(folder).resolve()
    for inner in (folder, *folder.parents):
        run = inner.parent
        if inner.name == CKPT_DIR and ((run / "config.json").is_file() or (run / "metrics.jsonl").is_file()
                                       or any(inner.glob("step_*"))):
            return run
    return None


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first: a ``meta.json`` and every file it lists (damaged ones are left
    out; :func:`checkpoint_folders` lists them too). Pruning removes only these."""
    return [p for p in checkpoint_folders(run_dir) if not diagnose(p, digests=False)]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint (None: none). A newer checkpoint folder that is not complete (damaged: a
    checkpoint is renamed into place only once complete) is named in a warning."""
    found = list_checkpoints(run_dir)
    newer = [c for c in checkpoint_folders(run_dir) if found and c.name > found[-1].name]
    if newer:
        warnings.warn(f"{diagnose(newer[-1], digests=False)}; using the newest complete checkpoint, {found[-1].name}",
                      stacklevel=2)
    return found[-1] if found else None


def resolve_checkpoint(path: str | Path) -> Path:
    """Accept a run folder or a checkpoint folder; return the checkpoint folder to read weights from, or raise a
    one-line error: :class:`CheckpointError` when that checkpoint (a run's newest) is damaged, naming what is
    wrong and the newest intact one. A missing ``state.pt`` does not matter here (readers need the weights)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"run or checkpoint folder not found: {path}")
    folders = checkpoint_folders(path)
    if not folders and not (path / CKPT_DIR).is_dir() and (
            (path / "meta.json").exists() or (path / "model.safetensors").exists()):
        folders = [path]  # a checkpoint folder itself
    if not folders:
        raise FileNotFoundError(f"{path} holds no complete checkpoint (expected {CKPT_DIR}/step_*/model.safetensors)")
    ckpt = folders[-1]
    problem = diagnose(ckpt, listed_files(ckpt, WEIGHTS_ONLY), digests=False)
    if problem:
        raise CheckpointError(problem + _previous_hint(ckpt))
    return ckpt


def _previous_hint(ckpt: Path) -> str:
    """'; the newest intact checkpoint is X' for a damaged checkpoint of a run folder ('' if none)."""
    older = [c for c in list_checkpoints(ckpt.parent.parent) if c.name < ckpt.name]
    intact = next((c for c in reversed(older) if not diagnose(c, ("model.safetensors", "config.json"))), None)
    return f"; the newest intact checkpoint is {intact} (pass it as --run)" if intact else ""


# -- loaded ------------------------------------------------------------------------------------------------------------

def weights_file(path: str | Path, ema: bool = False) -> Path:
    """The weights file (``model.safetensors``, or ``ema.safetensors`` with `ema`) of a run or checkpoint folder's
    checkpoint (:func:`resolve_checkpoint`), verified against its ``meta.json``; one-line errors otherwise."""
    ckpt = resolve_checkpoint(path)
    weights = ckpt / ("ema.safetensors" if ema else "model.safetensors")
    if not weights.is_file():
        raise FileNotFoundError(f"{weights} not found" + (" (the run was trained without EMA)" if ema else ""))
    problem = diagnose(ckpt, (weights.name,))
    if problem:
        raise CheckpointError(problem + _previous_hint(ckpt))
    return weights


def unsafe_pickle(path: Path) -> str:
    """The one line for a file that ``torch.load(weights_only=True)`` refuses for the objects it holds (its own
    message advises ``weights_only=False``, which would run the file's code: never taken here)."""
    return (f"checkpoint file {path} holds objects other than tensors and plain values (refused: a train state "
            "never holds any, and loading it would run code from the file); set the checkpoint aside and resume "
            "from another, or train into another --out")


def load_train_state(ckpt: Path) -> dict[str, Any]:
    """Optimizer/scheduler/RNG/data-position state, loaded with ``weights_only=True`` (no code execution)."""
    try:
        return torch.load(ckpt / "state.pt", map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(unsafe_pickle(ckpt / "state.pt")) from None
    except (RuntimeError, EOFError, OSError, ValueError) as err:  # PytorchStreamReader failures are RuntimeErrors
        raise CheckpointError(f"checkpoint file {ckpt / 'state.pt'} cannot be read ({type(err).__name__}: "
                              f"{str(err).splitlines()[0][:200]})") from err


def refuse_hub_encoder(cfg: RunConfig, where: str | Path) -> None:
    """Raise ``ValueError`` when the config read from `where` (a local folder) names a Hub encoder: timm would
    fetch its architecture from the network although the weights are right here. No saved model needs one."""
    if cfg.model.encoder.lower().startswith(HUB_PREFIXES):
        raise ValueError(f"{where}: model.encoder {cfg.model.encoder!r} is a Hugging Face Hub name, which timm would "
                         "resolve on the network; a model loaded from a local folder is never resolved there (its "
                         "config.json was edited or is not a workbench run's)")


def weight_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape in safetensors file `path`, read from its header (no tensor is loaded)."""
    try:
        with safe_open(str(path), framework="pt") as fh:
            return {k: tuple(fh.get_slice(k).get_shape()) for k in fh.keys()}  # noqa: SIM118 (not a dict)
    except Exception as err:  # SafetensorError for a damaged header
        raise CheckpointError(f"checkpoint file {path} cannot be read ({type(err).__name__}: "
                              f"{str(err).splitlines()[0][:200]}): truncated or not a safetensors file") from err


def load_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors; a file that cannot be decoded raises :class:`CheckpointError` naming it."""
    try:
        return load_file(str(path))
    except Exception as err:  # safetensors raises SafetensorError (not an OSError) for truncated headers/data
        raise CheckpointError(f"checkpoint file {path} cannot be read ({type(err).__name__}: "
                              f"{str(err).splitlines()[0][:200]}): truncated or not a safetensors file") from err
