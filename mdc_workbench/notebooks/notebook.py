"""Helpers the numbered notebooks share, so that the notebooks themselves only set parameters, call and plot.

* paths: :func:`project_path` reads a relative path against the repository root, so a notebook behaves the
  same under papermill (cwd = repository root) and in JupyterLab (cwd = ``notebooks/``);
* data: :func:`ensure_dataset` writes the embedded data set once and reuses it;
* concurrency: both hold a file lock (:func:`cache_lock`) on the folder they write, so notebooks run at once
  (``mdc runs`` with ``jobs``) never write the same data set or train the same model twice: one trains, the
  others wait and then load;
* models: :func:`train_cached` trains a config into ``models_dir/<objective>-<config hash>`` or loads the
  finished run from there, so notebooks of one plan share their models; :func:`live_train` trains while a
  loss curve redraws in the notebook;
* outputs: :func:`save_figure` and :func:`write_metrics` write the files :mod:`mdc_workbench.runs.runner` collects;
* views: images, tables, masks and trajectories as the lessons show them live in
  :mod:`mdc_workbench.notebooks.notebook_views`, re-exported here (notebooks call them as ``wb.image_grid`` etc.).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mdc_core.config import RunConfig, load_preset
from mdc_workbench.notebooks.notebook_views import FUNCTION_WORDS as FUNCTION_WORDS  # the views, re-exported: wb.NAME
from mdc_workbench.notebooks.notebook_views import caption_lengths as caption_lengths
from mdc_workbench.notebooks.notebook_views import confidence_heatmap as confidence_heatmap
from mdc_workbench.notebooks.notebook_views import figure_png as figure_png
from mdc_workbench.notebooks.notebook_views import image_grid as image_grid
from mdc_workbench.notebooks.notebook_views import infill_slots as infill_slots
from mdc_workbench.notebooks.notebook_views import loss_draws as loss_draws
from mdc_workbench.notebooks.notebook_views import markdown_table as markdown_table
from mdc_workbench.notebooks.notebook_views import mask_figure as mask_figure
from mdc_workbench.notebooks.notebook_views import show_figure as show_figure
from mdc_workbench.notebooks.notebook_views import to_pixels as to_pixels
from mdc_workbench.notebooks.notebook_views import trajectory_html as trajectory_html
from mdc_workbench.runs.progress import follow_thread_share, report, target_set, watch_training

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # mdc_workbench/notebooks/notebook.py -> the checkout
OUTPUT_ROOT_ENV = "MDC_OUTPUT_ROOT"  # when set, the notebooks' relative folders lie under it (project_path)
LOCK_WAIT_REPORT_S = 2.0  # a notebook waiting this long for another's lock says so in the runner's bar
RUNNER_REFRESH_S = 30.0  # live_train's redraw interval in a kernel `mdc runs` started (nobody watches it live)

follow_thread_share()  # in a kernel of `mdc runs`: take over idle cores when the runner hands them out


def project_path(path: str | Path) -> Path:
    """`path` if absolute, else relative to the output root ``$MDC_OUTPUT_ROOT`` when it is set (where notebooks
    then write and look for their data, models and outputs: outside the repository, say), else to the repository
    root (when this package runs from a checkout, i.e. an editable install) or to the working directory (an
    installed package)."""
    path = Path(path).expanduser()
    if path.is_absolute():
        return path
    if os.environ.get(OUTPUT_ROOT_ENV):
        return Path(os.environ[OUTPUT_ROOT_ENV]).expanduser().resolve() / path
    base = PROJECT_ROOT if (PROJECT_ROOT / "pyproject.toml").is_file() else Path.cwd()
    return base / path


def output_folder(output_dir: str | Path) -> Path:
    """The notebook's output folder (created), with its ``figures/`` sub-folder."""
    out = project_path(output_dir)
    (out / "figures").mkdir(parents=True, exist_ok=True)
    return out


@contextlib.contextmanager
def cache_lock(folder: str | Path, what: str = "") -> Iterator[None]:
    """Hold an exclusive inter-process lock on `folder` (the file ``<folder>.lock`` beside it) for the block.
    While another process holds it, wait, telling the runner (``waiting for <what>``) after
    :data:`LOCK_WAIT_REPORT_S` seconds."""
    from filelock import FileLock, Timeout

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(folder) + ".lock")
    try:
        lock.acquire(timeout=LOCK_WAIT_REPORT_S)
    except Timeout:
        report(detail=f"waiting for {what or folder.name} (another notebook is writing it)")
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def ensure_dataset(root: str | Path, n: int, *, captions: str = "mixed", image_size: int = 64, seed: int = 0,
                   n_eval: int | None = None, progress: bool = False, difficulty: str = "paper") -> dict[str, Any]:
    """The embedded data set at `root` with these parameters: reused if its manifest matches, else written.
    `n_eval` images per val/test/compgen split (default: the generator's ``max(64, n // 20)``); `difficulty`
    ``paper`` or ``easy`` (:data:`mdc_workbench.data.scene.DIFFICULTIES`)."""
    root = project_path(root)
    with cache_lock(root, f"the data set {root.name}"):
        return _ensure_dataset(root, n, captions=captions, image_size=image_size, seed=seed, n_eval=n_eval,
                               progress=progress, difficulty=difficulty)


def _ensure_dataset(root: Path, n: int, *, captions: str, image_size: int, seed: int, n_eval: int | None,
                    progress: bool, difficulty: str) -> dict[str, Any]:
    from mdc_workbench.data import read_manifest, write_synthetic_dataset

    try:
        manifest = read_manifest(root)
        p = manifest["params"]
        wanted = {"n": n, "captions": captions, "image_size": image_size, "seed": seed}
        wanted_difficulty = p.get("difficulty", "paper") == difficulty  # manifests before the option: paper
        if (all(p.get(k) == v for k, v in wanted.items()) and wanted_difficulty
                and (n_eval is None or p.get("n_test") == n_eval)):
            return manifest
    except (FileNotFoundError, ValueError, KeyError):
        pass
    return write_synthetic_dataset(root, n, seed=seed, image_size=image_size, captions=captions, n_val=n_eval,
                                   n_test=n_eval, n_compgen=n_eval, progress=progress, difficulty=difficulty)


def make_config(preset: str, data_dir: str | Path, objective: str, steps: int,
                overrides: dict[str, Any] | None = None, device: str = "cpu") -> RunConfig:
    """A preset with `overrides` (``{"section.key": value}``, e.g. ``{"model.text_width": 64}``) applied, then
    the data path, objective, steps and device."""
    pairs = {**(overrides or {}), "data.path": str(project_path(data_dir)), "objective.name": objective,
             "train.steps": steps, "train.device": device}
    return load_preset(preset, [f"{k}={json.dumps(v)}" for k, v in pairs.items()])


STEP_ONLY_KEYS = ("compile", "static_shapes", "length_bucket")  # train keys that config_key leaves out


def checkout_relative(path: str | Path) -> str:
    """`path` relative to the checkout (``PROJECT_ROOT``) when it lies inside it, as given otherwise: what a cache
    key may contain, so that a copied or moved checkout finds the models it trained, and what a notebook prints,
    so that its page does not show the folder of the machine that executed it."""
    if not path:
        return str(path)
    resolved = Path(path).expanduser().resolve()
    return resolved.relative_to(PROJECT_ROOT).as_posix() if resolved.is_relative_to(PROJECT_ROOT) else str(path)


def config_key(cfg: RunConfig) -> str:
    """Stable short hash of everything that defines a training run (the corpus vocabulary size excluded). For an
    embedded data set the generator's parameters (its manifest's ``params``) count too: the notebooks rewrite a
    data folder whose parameters changed, and a model trained on the old contents must not be reused. Other data
    (no manifest: a caption table, shards from elsewhere) count by their content fingerprint
    (:func:`mdc_core.sources.data_fingerprint`) when readable. Paths inside the checkout count relative to it
    (:func:`checkout_relative`): the key does not depend on where it lives."""
    data = cfg.to_dict()
    data["model"]["output_vocab_size"] = 0
    data["preset"] = ""
    for key in STEP_ONLY_KEYS:  # how the step runs, not what it computes (a cached model serves either way)
        data["train"].pop(key, None)
    for key in ("path", "images"):
        data["data"][key] = checkout_relative(data["data"][key])
    data["data"]["path_as_given"] = ""
    data["model"]["pretrained_path"] = checkout_relative(data["model"]["pretrained_path"])
    manifest = Path(cfg.data.path) / "manifest.json"
    if manifest.is_file():
        data["data_params"] = json.loads(manifest.read_text()).get("params")
    else:
        from mdc_core.sources import data_fingerprint

        fingerprint = data_fingerprint(cfg.data)
        if fingerprint is not None:  # unreadable data keep the key they had (training will name the problem)
            data["data_fingerprint"] = fingerprint
    return hashlib.sha1(json.dumps(data, sort_keys=True).encode()).hexdigest()[:10]


def cached_run_dir(models_dir: str | Path, cfg: RunConfig) -> Path:
    return project_path(models_dir) / f"{cfg.objective.name}-{config_key(cfg)}"


def _finished(run_dir: Path, steps: int) -> bool:
    from mdc_core.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(run_dir)
    return ckpt is not None and json.loads((ckpt / "meta.json").read_text())["step"] >= steps


def train_cached(cfg: RunConfig, models_dir: str | Path, *, live: bool = False, progress: bool = False):
    """Train `cfg` into its cache folder (resuming a partial run) unless it is finished there; return
    ``(model, cfg, run_dir)`` with the model loaded in eval mode on ``cfg.train.device``. With `live`, the
    notebook shows the loss curve: redrawn while it trains (:func:`live_train`), or at once for a finished run.

    Damaged checkpoints never end the notebook: each is found (its files against ``meta.json``, its train state
    against its step: :func:`mdc_core.run_folder.resume_point`) and set aside as ``corrupt_step_*`` (kept as
    found), and the model goes on from the newest intact checkpoint; when none is intact, it is trained again
    from step 0 in the same folder, its old logs kept beside the new ones. Each case is printed."""
    from mdc_core.checkpoint import CheckpointError, latest_checkpoint
    from mdc_core.factory import load_model
    from mdc_core.train import train

    run_dir = cached_run_dir(models_dir, cfg)
    with cache_lock(run_dir, f"the model {run_dir.name}"):  # another notebook may be training this very run
        retrain = _set_damage_aside(run_dir)
        if _finished(run_dir, cfg.train.steps):
            print(f"reusing the trained run {run_dir.name} in {models_dir} (the same config and data; delete the "
                  "folder to train it again)")
            rows = read_train_metrics(run_dir)
            if live and rows and _in_ipython():  # the cell shows its curve, trained now or before
                show_figure(loss_figure(rows, title=f"{cfg.objective.name}: {rows[-1]['step']} / {cfg.train.steps} "
                                                    "steps (trained before)"))
        else:
            latest = latest_checkpoint(run_dir)
            resume = latest is not None
            if resume:
                print(f"resuming {run_dir.name} from its checkpoint {latest.name}")
            elif retrain:
                from mdc_core.run_folder import set_logs_aside
                kept = set_logs_aside(run_dir)
                print(f"the cached model {run_dir.name} in models_dir={models_dir} has no intact checkpoint (the "
                      f"damaged ones are kept as {', '.join(retrain)}{'; its log as ' if kept else ''}"
                      f"{', '.join(kept)}): training it again from step 0")
            elif run_dir.exists():  # stopped before its first checkpoint: start it over, unless its checkpoints
                import shutil  # were deleted: then it stays as found

                from mdc_core.run_folder import refuse_start_over
                refuse_start_over(run_dir, cfg.train.ckpt_every, asked="the cached model",
                                  remedy="delete the folder to train this model again")
                if run_dir.is_symlink() or run_dir.resolve().parent != project_path(models_dir).resolve():
                    raise ValueError(f"the cached model folder {run_dir} leads outside {models_dir}: not clearing it")
                shutil.rmtree(run_dir)
            # the runner shows the step (mdc_workbench.runs.progress)
            with watch_training(run_dir, cfg.train.steps):
                if live:
                    live_train(cfg, run_dir, resume=resume)
                else:
                    train(cfg, run_dir, resume=resume, progress=progress)
    device = "cpu" if cfg.train.device == "auto" else cfg.train.device
    try:
        model, saved = load_model(run_dir, device=device)
    except CheckpointError as err:  # damaged since it was checked above: the notebook's words, not the CLI's flag
        message = str(err).replace(" (pass it as --run)", "")
        raise CheckpointError(f"the cached model {run_dir.name} in models_dir={models_dir}: {message}. Run the cell "
                              "again (it sets the damage aside) or set the notebook parameter models_dir to another "
                              "folder") from None
    return model, saved, run_dir


def _set_damage_aside(run_dir: Path) -> list[str]:
    """Set the damaged checkpoints of cached model `run_dir` aside (:func:`mdc_core.run_folder.resume_point`, which
    also warns naming each), printing what the notebook does next; returns the names of the checkpoints set aside
    (now or before) when no intact one is left (the model is then trained again), else []."""
    from mdc_core.checkpoint import CKPT_DIR, CORRUPT_PREFIX, CheckpointError, checkpoint_folders
    from mdc_core.run_folder import resume_point

    def aside() -> list[str]:
        return sorted(p.name for p in (run_dir / CKPT_DIR).glob(CORRUPT_PREFIX + "*"))

    before, start, problem = aside(), None, ""
    if checkpoint_folders(run_dir):
        with contextlib.suppress(CheckpointError):  # every checkpoint damaged: all set aside, said below
            start, problem = resume_point(run_dir, set_aside_damaged=True)
    now = [name for name in aside() if name not in before]
    goes_on = f"it goes on from {start.name}" if start is not None else "no intact checkpoint is left"
    if now:
        print(f"the cached model {run_dir.name}: its damaged checkpoints are set aside as {', '.join(now)} (kept as "
              f"found); {goes_on}")
    if start is not None and problem:
        print(f"the cached model {run_dir.name}: {problem}; its weights are intact, so it goes on from {start.name}")
    return [] if start is not None or checkpoint_folders(run_dir) else aside()


def trained_or_shipped(cfg: RunConfig, models_dir: str | Path, *, shipped: bool = False, live: bool = False):
    """``(model, cfg, run_dir)`` for an MDC config, at once when possible: the finished run from the cache; else,
    with `shipped`, the captioner shipped with the repository (:mod:`mdc_workbench.export.shipped`: no training,
    and the notebook says so), its config given `cfg`'s data path so that evaluations read the notebook's data;
    else `cfg` trained by :func:`train_cached`. The shipped model knows only the data it was trained on
    (``shipped.data_params()``: the `easy` scenes, short captions, 64 px), so a notebook offers it on that data."""
    import dataclasses

    if shipped and cfg.objective.name != "mdc":
        raise ValueError(f"the shipped captioner is an MDC model; it cannot stand in for {cfg.objective.name!r}")
    if not shipped or _finished(cached_run_dir(models_dir, cfg), cfg.train.steps):
        return train_cached(cfg, models_dir, live=live)
    from mdc_workbench.export.shipped import SHIPPED_DIR, load_shipped

    device = "cpu" if cfg.train.device == "auto" else cfg.train.device
    model, saved = load_shipped(device)
    print(f"using the captioner shipped with the repository ({SHIPPED_DIR.name}: tiny_lean, 1500 steps on the easy "
          "scenes); nothing is trained here")
    return model, dataclasses.replace(saved, data=dataclasses.replace(saved.data, path=cfg.data.path)), SHIPPED_DIR


def read_train_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The run's ``metrics.jsonl`` records (one per logged step); [] when not written yet."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written right now
            break
    return rows


def live_train(cfg: RunConfig, run_dir: str | Path, *, resume: bool = False, refresh_s: float = 3.0):
    """Train while the notebook shows the loss curve from ``metrics.jsonl``, redrawn every `refresh_s` seconds in
    one display slot. Returns the :class:`~mdc_core.train.TrainResult`.

    Training runs in the calling (the notebook's main) thread and only the drawing in a background thread, so
    Kernel > Interrupt reaches the training loop: it stops at the next step boundary, writes a checkpoint and
    raises :class:`~mdc_core.train.TrainingInterrupted` (a KeyboardInterrupt) once training has really stopped;
    running the cell again resumes from that checkpoint."""
    from mdc_core.train import TrainingInterrupted, train

    run_dir = Path(run_dir)
    if target_set():  # under the runner the curve is only read afterwards: redraw rarely, leave the CPU to training
        refresh_s = max(refresh_s, RUNNER_REFRESH_S)
    slot = _display_slot()
    done = threading.Event()

    def redraw() -> None:
        rows = read_train_metrics(run_dir)
        if rows and slot is not None:
            slot.update(figure_png(loss_figure(rows, title=f"{cfg.objective.name}: {rows[-1]['step']} / "
                                                             f"{cfg.train.steps} steps")))

    def painter() -> None:
        while not done.wait(refresh_s):
            try:
                redraw()
            except Exception:  # noqa: BLE001 - a curve that cannot be drawn now must never stop the training
                pass

    thread = threading.Thread(target=painter, daemon=True, name="mdc-loss-curve")
    thread.start()
    try:
        return train(cfg, run_dir, resume=resume, progress=False)
    except TrainingInterrupted as err:
        print(f"training stopped at step {err.step} of {cfg.train.steps} and saved its checkpoint "
              f"({err.checkpoint.name if err.checkpoint else 'none'}); run this cell again to resume from there")
        raise
    finally:
        done.set()
        thread.join()
        redraw()  # the curve up to the last step trained


def _in_ipython() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return get_ipython() is not None


def _display_slot() -> Any:
    """An updatable display slot in the running notebook (None outside IPython). It is an output of the cell at
    once (showing ``None`` until it is updated): create it only to fill it."""
    if not _in_ipython():
        return None
    from IPython.display import display

    return display(None, display_id=True)


def loss_figure(rows: list[dict[str, Any]], title: str = "training loss"):
    """Loss and masked-token accuracy against the step, from ``metrics.jsonl`` records (a Figure made without
    pyplot, so a background thread may draw it)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.2), layout="constrained")
    ax = fig.add_subplot()
    steps = [r["step"] for r in rows]
    ax.plot(steps, [r["loss"] for r in rows], label="loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax2 = ax.twinx()
    from mdc_core.run_state import logged_accuracy
    accuracy = [logged_accuracy(r) for r in rows]
    if all(accuracy):
        ax2.plot(steps, [a[1] for a in accuracy], color="tab:orange", label=accuracy[-1][0])
    ax2.set_ylabel("accuracy", color="tab:orange")
    ax.set_title(title)
    return fig


def save_figure(fig: Any, output_dir: str | Path, name: str) -> None:
    """Save `fig` as ``<output_dir>/figures/<name>.png`` (the runner collects these). Returns nothing, so a cell
    that ends with this call shows its figure and no ``PosixPath(...)`` line."""
    fig.savefig(output_folder(output_dir) / "figures" / f"{name}.png", dpi=110, bbox_inches="tight")


def write_metrics(output_dir: str | Path, notebook: str, metrics: dict[str, Any],
                  tables: dict[str, dict[str, Any]] | None = None, **extra: Any) -> None:
    """Write ``<output_dir>/metrics.json`` in the layout :mod:`mdc_workbench.runs.summary` reads: flat scalar
    `metrics` and paper-style `tables` (name -> {"metric": str, "values": {row: number | {column: number}}}).
    Returns nothing (a notebook's last cell ends with it: no ``PosixPath(...)`` line)."""
    record = {"notebook": notebook, "metrics": metrics, "tables": tables or {}, **extra}
    (output_folder(output_dir) / "metrics.json").write_text(json.dumps(record, indent=2, default=float) + "\n")
