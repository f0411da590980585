"""Runs the app can show: a process-wide cache of loaded models keyed by run folder, and run discovery.

A run is loaded once (``mdc_core.factory.load_model``: config.json + safetensors, no pickle) and shared by
every user; :func:`user_errors` turns errors a user can fix into a readable ``gr.Error`` (:func:`refuse`: no
traceback in the server log).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gradio as gr
import torch

from mdc_core.checkpoint import latest_checkpoint
from mdc_core.config import RunConfig
from mdc_core.factory import load_model
from mdc_core.model import Captioner
from mdc_core.registry import objective_spec
from mdc_core.tokenizer import CaptionTokenizer


@dataclasses.dataclass
class LoadedRun:
    """A model ready to caption, with the config that built it."""

    key: str  # cache key: resolved run folder, or the name it was registered under
    label: str  # what the run menu shows
    model: Captioner
    cfg: RunConfig
    tokenizer: CaptionTokenizer
    scenes: dict = dataclasses.field(default_factory=dict)  # generator parameters of its training data ({}: unknown)
    folder: Path | None = None  # the run or checkpoint folder it was loaded from (None: registered without one)

    @property
    def is_arc(self) -> bool:
        return bool(self.model.causal)


_CACHE: dict[str, LoadedRun] = {}  # key -> loaded run (each run folder is loaded once per process)
_FOLDERS: dict[str, tuple[Path, str]] = {}  # key -> (run folder not loaded yet, its label)
_LOCK = threading.Lock()


def register_run(key: str, model: torch.nn.Module, cfg: RunConfig, label: str | None = None,
                 folder: str | Path | None = None) -> LoadedRun:
    """Put a loaded model in the cache under `key` (returns the cache entry); `folder` is its run or checkpoint
    folder, where a ``data_manifest.json`` may say which scenes it was trained on."""
    if not isinstance(model, Captioner):
        raise ValueError(f"run {label or key} holds a {type(model).__name__} (objective {cfg.objective.name!r}), "
                         "not a captioner: it has no caption decoder to show")
    run = LoadedRun(key, label or key, model.eval(), cfg, CaptionTokenizer(cfg.model.context_length),
                    training_scenes(cfg, folder), Path(folder) if folder else None)
    with _LOCK:
        _CACHE[key] = run
    return run


def get_run(key: str) -> LoadedRun:
    """The cached run `key`, loading its folder (safetensors, no pickle) on first use."""
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
    if key not in _FOLDERS:
        raise refuse(f"unknown run {key!r}; pick one from the run menu")
    folder, label = _FOLDERS[key]
    with user_errors():
        model, cfg = load_model(folder)
        return register_run(key, model, cfg, label=label, folder=folder)


def training_scenes(cfg: RunConfig, folder: str | Path | None = None) -> dict:
    """The embedded generator's parameters (``difficulty``, ``seed``, ``captions``, ...) of the data a run was
    trained on: from the data folder's ``manifest.json``, else from ``data_manifest.json`` in the run's own folder
    (the shipped model carries one); {} for real data or a data folder that is gone."""
    places = [Path(cfg.data.path) / "manifest.json"] if cfg.data.path else []
    places += [Path(folder) / "data_manifest.json"] if folder else []
    for path in places:
        try:
            params = json.loads(path.read_text())["params"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(params, dict):
            return params
    return {}


def _walk(root: Path, max_depth: int) -> Iterator[tuple[Path, list[str], list[str]]]:
    """os.walk of `root` down to `max_depth` levels, in name order, hidden and data folders skipped; a run folder
    (one with ``checkpoints/``) is not entered."""
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        yield here, dirs, files
        if "checkpoints" in dirs or len(here.relative_to(root).parts) >= max_depth:
            dirs.clear()
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in ("data", "shards"))


def discover_runs(root: str | Path, max_depth: int = 4) -> dict[str, Path]:
    """Run folders (with a complete checkpoint) under `root`: resolved path -> folder. Data folders are skipped."""
    root = Path(root)
    if not root.is_dir():
        return {}
    return {str(here.resolve()): here for here, dirs, _ in _walk(root, max_depth)
            if "checkpoints" in dirs and latest_checkpoint(here) is not None}


def run_notebooks(root: str | Path, max_depth: int = 4) -> dict[str, str]:
    """Resolved run folder -> the notebook whose ``metrics.json`` (under `root`, e.g. ``papermill_runs/PLAN/NB/``)
    names it as its ``run_dir`` or among its ``runs``: which notebook trained or used a cached run such as
    ``_models/mdc-7030b7bbf4``. Relative paths count from `root`; the first notebook in name order wins."""
    root = Path(root)
    found: dict[str, str] = {}
    if not root.is_dir():
        return found
    for here, _, files in _walk(root, max_depth):
        if "metrics.json" not in files:
            continue
        try:
            record = json.loads((here / "metrics.json").read_text())
            paths = [record.get("run_dir"), *(record.get("runs") or {}).values()]
            notebook = str(record["notebook"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        for path in filter(None, paths):
            found.setdefault(str((root / str(path)).resolve()), notebook)
    return found


def describe_run(objective: str, preset: str, steps: int | None, notebook: str | None) -> str:
    """What the run menu says of a run besides its folder: "mdc · preset tiny_lean · 1500 steps · notebook
    01_pretraining" (the parts that are known)."""
    parts = [objective, f"preset {preset}" if preset else "", f"{steps} steps" if steps is not None else "",
             f"notebook {notebook}" if notebook else ""]
    return " · ".join(p for p in parts if p)


def _folder_config(folder: Path) -> tuple[str, str, int | None]:
    """(objective, preset, steps) of a run folder not loaded yet, from its latest checkpoint's config and step
    ("?", "", None where unreadable)."""
    ckpt = latest_checkpoint(folder)
    try:
        config = json.loads(((ckpt or folder) / "config.json").read_text())
        objective, preset = config["objective"]["name"], config.get("preset") or ""
    except (OSError, ValueError, KeyError, TypeError):
        objective, preset = "?", ""
    try:
        steps = int(json.loads((ckpt / "meta.json").read_text())["step"]) if ckpt else None
    except (OSError, ValueError, KeyError, TypeError):
        steps = None
    return objective, preset, steps


def is_arc_objective(objective: str) -> bool | None:
    """Whether `objective` trains a causal (ARC) captioner; None for a name the registry does not know."""
    try:
        return objective_spec(objective).family == "causal"
    except ValueError:
        return None


def run_choices(root: str | Path | None, arc: bool | None = None) -> list[tuple[str, str]]:
    """(label, key) pairs for a run menu: registered runs first, then folders found under `root`. A label says
    what the run is: its name, objective, preset, steps and the notebook that trained it (:func:`describe_run`).
    `arc` True lists only ARC (causal) runs (the Compare tab's menu), False only the others (the run menu: a folder
    whose objective is unreadable stays there, to say why when chosen), None every run."""
    notebooks = run_notebooks(root) if root else {}
    with _LOCK:
        loaded = list(_CACHE.items())
    choices = []
    for key, r in loaded:
        if arc is not None and r.is_arc != arc:
            continue
        notebook = notebooks.get(str(r.folder.resolve())) if r.folder else None
        choices.append((f"{r.label} ({describe_run(r.cfg.objective.name, r.cfg.preset, r.cfg.train.steps, notebook)})",
                        key))
    if root:
        for folder in discover_runs(root).values():
            key = os.path.relpath(folder, root)  # what the page and /config show: never an absolute path
            if key in _CACHE or any(key == k for _, k in choices):
                continue
            objective, preset, steps = _folder_config(folder)
            if arc is not None and bool(is_arc_objective(objective)) != arc:
                continue
            _FOLDERS.setdefault(key, (folder, key))
            choices.append((f"{key} ({describe_run(objective, preset, steps, notebooks.get(str(folder.resolve())))})",
                            key))
    return choices


def refuse(message: str) -> gr.Error:
    """A request the app turns down (bad input, nothing to show yet): its one-line `message` goes to the caller, and
    the server log gets no traceback (gradio prints one for every ``gr.Error`` unless told not to)."""
    return gr.Error(message, print_exception=False)


def step_number(value: Any, name: str = "step") -> int:
    """A slider's value as a whole number (None: 0); :func:`refuse` for anything else an API caller may send (a
    string, a list, NaN), in one line with a bounded echo, never a traceback."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise refuse(f"{name} must be a number, got {str(value)[:40]!r}")
    return int(value)


def uploaded_path(value: Any) -> str:
    """The path of a file gradio received (a string it gives the callback); :func:`refuse` for anything else (a
    dict naming a server path, a number): only what gradio itself stored is opened."""
    if not value:
        raise refuse("no file was uploaded")
    if not isinstance(value, str):
        raise refuse(f"expected an uploaded file, got a {type(value).__name__}")
    return value


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn the errors a user can fix (bad image, bad setting, missing file) into a readable ``gr.Error``
    (:func:`refuse`)."""
    try:
        yield
    except gr.Error:
        raise
    except (ValueError, FileNotFoundError) as err:
        raise refuse(scrub_paths(str(err))) from err


_ABSOLUTE_PATH = re.compile(r"(?<![^\s(\[\"'=])/[^\s'\"(),;/]+(?:/[^\s'\"(),;/]*)+")  # /a/b... after a space


def scrub_paths(message: str) -> str:
    """`message` without the server's absolute paths: a path under the working directory becomes relative to it,
    any other one its last component (a browser user learns nothing about the server's folders)."""
    def short(match: re.Match[str]) -> str:
        path = Path(match.group(0).rstrip(".:"))
        tail = match.group(0)[len(str(path)):]  # a sentence's full stop or colon stays
        try:
            return str(path.relative_to(Path.cwd())) + tail
        except ValueError:
            return path.name + tail
    return _ABSOLUTE_PATH.sub(short, message)
