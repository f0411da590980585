"""Linear probing of a run's frozen image encoder on labelled image sets read from local paths (paper Table 1).

Data formats (``fmt``; ``"auto"`` picks by what the folder holds):

* ``synth``: a folder written by ``mdc data synth``; the tasks are the scene labels in each sample's json
  (:data:`~mdc_workbench.data.scene.LABEL_NAMES`: shape, colour, size, position, count, background), class indices
  from the manifest's vocabularies; split ``train`` trains the probe and ``test`` scores it.
* ``folder``: ImageNet-style class folders ``root/train/CLASS/*.jpg`` and ``root/val/CLASS/*.jpg`` (or
  ``root/test/``); task ``class``; class indices are the sorted training class names.
* ``cifar``: CIFAR-10 python pickles (``data_batch_*``, ``test_batch``, ``batches.meta``, as the
  ``cifar-10-python.tar.gz`` tarball unpacks; the ``cifar-10-batches-py`` folder or its parent) or CIFAR-100
  (``train``, ``test``, ``meta``, fine labels). The pickles are read with an unpickler that only builds plain
  containers and numpy arrays, so a crafted file cannot run code; they are still assumed to be the genuine files.

Features: the run's encoder, frozen, in eval mode; GAP over patch tokens for captioners and the CLS token for
CLIP (:data:`~mdc_workbench.eval.probe_pool.PROBE_POOL`); images preprocessed as for evaluation at the run's image size.
They are extracted once per (run, data, split, task) and cached with
:func:`~mdc_workbench.eval.probe.cached_features` in ``<run>/probe_features/`` (the fingerprint holds the checkpoint,
its weights' size and mtime, the data files' sizes and mtimes, pooling and image size, so any change recomputes).
The probe is :func:`~mdc_workbench.eval.probe.linear_probe` on L2-normalised features (default: converged L-BFGS
logistic regression; ``protocol="clip_benchmark"``: CLIP-benchmark's AdamW protocol). ``init="random"`` probes the
same architecture untrained and ``init="pixels"`` the raw pixels (:mod:`mdc_workbench.eval.probe_baselines`).
"""

from __future__ import annotations

import hashlib
import json
import pickle
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset
from tqdm.auto import tqdm

from mdc_core.checkpoint import CKPT_DIR, resolve_checkpoint
from mdc_core.config import DataConfig
from mdc_core.data import build_loader
from mdc_core.factory import load_model
from mdc_core.transforms import eval_transform, load_image
from mdc_workbench.data import LABEL_NAMES, read_manifest
from mdc_workbench.eval.probe import cached_features, linear_probe
from mdc_workbench.eval.probe_baselines import INITS, PixelFeatures, random_init_model
from mdc_workbench.eval.probe_pool import probe_pool

PROBE_FORMATS = ("synth", "folder", "cifar")
FOLDER_TEST_SPLITS = ("val", "test")  # ImageNet's held-out folder is "val"
CACHE_VERSION = 1  # bump when feature extraction changes
Batches = Iterator[tuple[Tensor, dict[str, Tensor]]]  # (images (B, 3, S, S), {task: labels (B,)})


@dataclass
class ProbeDataset:
    """One split of a labelled image set. ``read(image_size, batch_size)`` yields batches in a fixed order."""

    format: str  # synth | folder | cifar
    split: str  # "train" or "test" (the probe's roles; the folder name may differ, e.g. val)
    root: Path
    classes: dict[str, list[str]]  # task -> class names; label j of the task means classes[task][j]
    files: list[Path]  # files the split is read from (their sizes and mtimes go into the cache fingerprint)
    read: Callable[[int, int], Batches]
    skipped: list[str] = field(default_factory=list)  # unreadable images passed over by the last read (folder)

    def stamp(self) -> str:
        """Digest of the split's files (name, size, mtime): changes when the data does."""
        h = hashlib.sha1()
        for f in sorted(self.files):
            st = f.stat()
            h.update(f"{f}|{st.st_size}|{st.st_mtime_ns}\n".encode())
        return h.hexdigest()


# ----------------------------------------------------------------------------------------------------------
# formats


def detect_format(root: Path) -> str:
    """``synth``, ``cifar`` or ``folder`` from the folder's contents; ValueError when none fits."""
    if (root / "manifest.json").is_file():
        return "synth"
    if _cifar_dir(root) is not None:
        return "cifar"
    if (root / "train").is_dir() and any(p.is_dir() for p in (root / "train").iterdir()):
        return "folder"
    raise ValueError(f"cannot tell the format of {root}: expected a synthetic data set (manifest.json), CIFAR "
                     "python pickles (data_batch_*/test_batch or train/test) or class folders root/train/CLASS/; "
                     "pass --format")


def _open_synth(root: Path, split: str, limit: int | None) -> ProbeDataset:
    manifest = read_manifest(root)
    vocab = manifest.get("vocab") or {}
    missing = [t for t in LABEL_NAMES if t not in vocab]
    if missing:
        raise ValueError(f"{root}/manifest.json has no vocabularies for labels {missing}")
    classes = {t: [str(v) for v in vocab[t]] for t in LABEL_NAMES}
    index = {t: {str(v): i for i, v in enumerate(vocab[t])} for t in LABEL_NAMES}
    folder = root / split
    files = sorted(folder.glob("*.tar")) if folder.is_dir() else []
    if not files:
        raise FileNotFoundError(f"{folder} holds no .tar shards: the synthetic data set has no {split!r} split")

    def read(image_size: int, batch_size: int) -> Batches:
        cfg = DataConfig(path=str(root), format="wds", shuffle_buffer=0)
        loader = build_loader(cfg, split=split, image_size=image_size, batch_size=batch_size, shuffle=False,
                              drop_last=False)
        seen = 0
        for batch in loader:
            labels = {t: [] for t in LABEL_NAMES}
            for key, meta in zip(batch["key"], batch["meta"], strict=True):
                values = meta.get("labels")
                if not isinstance(values, dict) or any(t not in values for t in LABEL_NAMES):
                    raise ValueError(f"sample {key} of {folder} has no scene labels in its json")
                for t in LABEL_NAMES:
                    if str(values[t]) not in index[t]:
                        raise ValueError(f"sample {key}: label {t}={values[t]!r} is not in the manifest vocabulary")
                    labels[t].append(index[t][str(values[t])])
            images, labels = batch["image"], {t: torch.tensor(v) for t, v in labels.items()}
            if limit is not None and seen + len(images) > limit:
                keep = limit - seen
                images, labels = images[:keep], {t: v[:keep] for t, v in labels.items()}
            seen += len(images)
            if len(images):
                yield images, labels
            if limit is not None and seen >= limit:
                return

    return ProbeDataset("synth", split, root, classes, [*files, root / "manifest.json"], read)


def _open_folder(root: Path, split: str, limit: int | None) -> ProbeDataset:
    train_dir = root / "train"
    if not train_dir.is_dir():
        raise FileNotFoundError(f"{train_dir} not found: class folders must sit in root/train/CLASS/")
    names, class_to_idx = find_classes(str(train_dir))
    if split == "train":
        folder = train_dir
    else:
        found = [root / s for s in FOLDER_TEST_SPLITS if (root / s).is_dir()]
        if not found:
            raise FileNotFoundError(f"{root} has no held-out class folders ({' or '.join(FOLDER_TEST_SPLITS)}/CLASS/)")
        folder = found[0]
        extra = sorted(set(find_classes(str(folder))[0]) - set(names))
        if extra:
            raise ValueError(f"{folder} has classes absent from {train_dir}: {extra[:5]}; a probe cannot learn them")
    present = {c: class_to_idx[c] for c in find_classes(str(folder))[0]}
    samples = make_dataset(str(folder), present, extensions=IMG_EXTENSIONS)  # [(path, label)], sorted
    samples = samples[:limit] if limit is not None else samples

    def read(image_size: int, batch_size: int) -> Batches:
        dataset.skipped.clear()
        for start in range(0, len(samples), batch_size):
            images, labels = [], []
            for path, label in samples[start:start + batch_size]:
                try:  # an unreadable image is skipped and counted, as training does
                    images.append(load_image(path, image_size))
                    labels.append(label)
                except ValueError as err:
                    warnings.warn(f"skipped {err}", stacklevel=2)
                    dataset.skipped.append(path)
            if images:
                yield torch.stack(images), {"class": torch.tensor(labels)}

    dataset = ProbeDataset("folder", split, root, {"class": list(names)}, [Path(p) for p, _ in samples], read)
    return dataset


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles plain containers and numpy arrays only: anything else (a crafted pickle's code) is refused."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
               ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}  # _codecs: bytes in protocol 2

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}: a CIFAR pickle holds only numpy "
                                         "arrays, lists and dicts")
        return super().find_class(module, name)


def load_cifar_pickle(path: Path) -> dict[str, Any]:
    """One CIFAR python pickle (Python 2 or 3 written) -> dict with str keys."""
    try:
        with open(path, "rb") as fh:
            data = _ArrayUnpickler(fh, encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, AttributeError, ImportError) as err:
        raise ValueError(f"{path} is not a CIFAR python pickle: {err}") from err
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a CIFAR python pickle (holds a {type(data).__name__}, expected a dict)")
    return {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in data.items()}


def _cifar_dir(root: Path) -> Path | None:
    for folder in (root, root / "cifar-10-batches-py", root / "cifar-100-python"):
        if (folder / "test_batch").is_file() or ((folder / "train").is_file() and (folder / "test").is_file()):
            return folder
    return None


def _open_cifar(root: Path, split: str, limit: int | None) -> ProbeDataset:
    folder = _cifar_dir(root)
    if folder is None:
        raise FileNotFoundError(f"{root} holds no CIFAR python pickles (data_batch_1..5 + test_batch, or "
                                "train + test; also looked in cifar-10-batches-py/ and cifar-100-python/)")
    cifar100 = not (folder / "test_batch").is_file()
    if cifar100:
        files, label_key, meta_file, names_key = [folder / split], "fine_labels", folder / "meta", "fine_label_names"
    else:
        files = sorted(folder.glob("data_batch_*")) if split == "train" else [folder / "test_batch"]
        label_key, meta_file, names_key = "labels", folder / "batches.meta", "label_names"
    if not files:
        raise FileNotFoundError(f"{folder} has no data_batch_* files")
    parts = [load_cifar_pickle(f) for f in files]
    for f, part in zip(files, parts, strict=True):
        if "data" not in part or label_key not in part:
            raise ValueError(f"{f} lacks 'data' or '{label_key}'")
    pixels = np.concatenate([np.asarray(p["data"], dtype=np.uint8) for p in parts])  # (N, 3072)
    labels = np.concatenate([np.asarray(p[label_key], dtype=np.int64) for p in parts])  # (N,)
    if pixels.ndim != 2 or pixels.shape[1] != 3 * 32 * 32 or len(pixels) != len(labels):
        raise ValueError(f"{folder}: expected data of shape (N, 3072) and N labels, got {pixels.shape}, "
                         f"{labels.shape}")
    pixels, labels = (pixels[:limit], labels[:limit]) if limit is not None else (pixels, labels)
    n_classes = 100 if cifar100 else 10
    names = [str(i) for i in range(n_classes)]
    if meta_file.is_file():
        meta = load_cifar_pickle(meta_file).get(names_key)
        if isinstance(meta, list) and len(meta) == n_classes:
            names = [m.decode() if isinstance(m, bytes) else str(m) for m in meta]
    if len(labels) and (labels.min() < 0 or labels.max() >= n_classes):
        raise ValueError(f"{folder}: labels outside 0..{n_classes - 1}")

    def read(image_size: int, batch_size: int) -> Batches:
        transform = eval_transform(image_size)
        for start in range(0, len(pixels), batch_size):
            rows = pixels[start:start + batch_size].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)  # (B, 32, 32, 3)
            images = torch.stack([transform(Image.fromarray(r)) for r in rows])
            yield images, {"class": torch.from_numpy(labels[start:start + batch_size].copy())}

    return ProbeDataset("cifar", split, root, {"class": names}, [*files], read)


OPENERS: dict[str, Callable[[Path, str, int | None], ProbeDataset]] = {
    "synth": _open_synth, "folder": _open_folder, "cifar": _open_cifar,
}


def open_probe_dataset(path: str | Path, split: str, fmt: str = "auto", limit: int | None = None) -> ProbeDataset:
    """The ``train`` or ``test`` split of the labelled image set at `path` (see the module docstring)."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"probe data folder not found: {root}")
    if split not in ("train", "test"):
        raise ValueError(f"split must be train or test, got {split!r}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    fmt = detect_format(root) if fmt == "auto" else fmt
    if fmt not in OPENERS:
        raise ValueError(f"unknown probe data format {fmt!r}; choose auto or one of {', '.join(PROBE_FORMATS)}")
    return OPENERS[fmt](root, split, limit)


# ----------------------------------------------------------------------------------------------------------
# features and the probe


@torch.no_grad()
def extract_features(model: torch.nn.Module, data: ProbeDataset, *, pool: str, image_size: int,
                     batch_size: int = 64, device: str | torch.device = "cpu",
                     progress: bool = False) -> tuple[Tensor, dict[str, Tensor]]:
    """Frozen features (N, D) float32 (``model.pooled_features(images, pool)``) and labels {task: (N,)}."""
    model.eval()
    feats: list[Tensor] = []
    labels: dict[str, list[Tensor]] = {t: [] for t in data.classes}
    for images, batch_labels in tqdm(data.read(image_size, batch_size), desc=f"features {data.split}",
                                     unit="batch", disable=not progress, leave=False):
        feats.append(model.pooled_features(images.to(device), pool).float().cpu())  # (B, D)
        for t in labels:
            labels[t].append(batch_labels[t])
    if not feats:
        raise ValueError(f"the {data.split} split of {data.root} holds no usable image")
    return torch.cat(feats), {t: torch.cat(v) for t, v in labels.items()}


def probe_run(run: str | Path, data: str | Path, *, task: str | Sequence[str] = "all", fmt: str = "auto",
              device: str = "cpu", batch_size: int = 64, cache_dir: str | Path | None = None, ema: bool = False,
              limit: int | None = None, weight_decay: float | None = None, progress: bool = False,
              protocol: str = "lbfgs", c: float | None = None, init: str = "trained",
              heldout: bool = False, features: dict[str, tuple[Tensor, dict[str, Tensor]]] | None = None
              ) -> dict[str, Any]:
    """Linear-probe the frozen encoder of `run` on the labelled data at `data`; a JSON-ready result.

    Args:
        run: run or checkpoint folder.
        data: data folder (see the module docstring); `fmt` is ``auto``, ``synth``, ``folder`` or ``cifar``.
        task: a label of the synthetic data (shape, colour, size, position, count, background) or ``all`` for
            each of them, or a list of labels; for folder / CIFAR data only ``class`` (``all`` means ``class``).
        device: where features are extracted and the probe trains.
        cache_dir: feature cache folder (default ``<run folder>/probe_features``, also for a checkpoint path).
        limit: use only the first `limit` images of each split (quick looks; part of the cache key).
        weight_decay: clip_benchmark protocol: a fixed weight decay instead of its search on a validation split.
        protocol: ``lbfgs`` (converged logistic regression, default) or ``clip_benchmark``.
        c: lbfgs protocol: a fixed inverse regularisation C instead of its search on a validation split.
        init: ``trained`` (the run's weights), ``random`` (its architecture, untrained) or ``pixels`` (raw pixels).
        heldout: refuse to probe when the probe trains on the run's own pretraining images (`data` is the
            folder the run was trained on, see :func:`seen_in_pretraining`).
        features: the run's frozen features of the train and test splits computed elsewhere (``{"train": (N, D)
            features, {task: labels}), "test": ...}``, e.g. a seed stack's, :func:`mdc_workbench.seed_stack.
            features.stacked_features`), used (and cached) instead of a pass of the model over the images.

    Returns:
        ``{"run", "checkpoint", "step", "objective", "pool", "init", "protocol", "data", "format",
        "seen_in_pretraining", "tasks": {task: result}}`` where each
        result is :meth:`ProbeResult.to_dict` (top1, top5, balanced_accuracy, ...) plus ``classes``.
    """
    if features is not None and (init != "trained" or set(features) != {"train", "test"}):
        raise ValueError(f"given features are a trained model's train and test splits; got {sorted(features)} with "
                         f"init={init!r}")
    ckpt = resolve_checkpoint(run)
    train_set = open_probe_dataset(data, "train", fmt, limit)
    test_set = open_probe_dataset(data, "test", train_set.format, limit)
    tasks = _probe_tasks(train_set, task, init, protocol, weight_decay, c)
    model, cfg = load_model(ckpt, device=device, ema=ema)
    seen = seen_in_pretraining(cfg.data.path, train_set.root)
    if heldout and seen:
        raise ValueError(f"the probe would train on {train_set.root}, the images {run} was pretrained on; probe a "
                         "set it never saw (e.g. `mdc data synth --out DIR --seed N` with another seed and the same "
                         "settings), or drop --heldout")
    pool = probe_pool(cfg.objective.name)
    if init == "random":
        model = random_init_model(cfg, device)
    elif init == "pixels":
        model, pool = PixelFeatures(), "pixels"
    run_root = ckpt.parent.parent if ckpt.parent.name == CKPT_DIR else ckpt  # RUN/checkpoints/step_N -> RUN
    source = _FeatureSource(model, pool, cfg, ckpt, init, ema, limit, batch_size, device, progress,
                            Path(cache_dir) if cache_dir is not None else run_root / "probe_features",
                            hashlib.sha1(str(train_set.root.resolve()).encode()).hexdigest()[:8], features or {})
    train_feats, test_feats = source.features(train_set, tasks), source.features(test_set, tasks)
    results = {}
    for t in tasks:
        (tx, ty), (vx, vy) = train_feats[t], test_feats[t]
        res = linear_probe(tx, ty, vx, vy, device=device, progress=progress, protocol=protocol,
                           wd_grid=None if weight_decay is None else [weight_decay], c_grid=None if c is None else [c])
        results[t] = {**res.to_dict(), "classes": train_set.classes[t]}
    meta = json.loads((ckpt / "meta.json").read_text())
    return {"run": str(run), "checkpoint": str(ckpt), "step": meta.get("step"), "objective": cfg.objective.name,
            "pool": pool, "init": init, "protocol": protocol, "data": str(data), "format": train_set.format,
            "ema": ema, "seen_in_pretraining": seen, "tasks": results,
            "skipped": {"train": len(train_set.skipped), "test": len(test_set.skipped)}}  # unreadable images


def _probe_tasks(train_set: ProbeDataset, task: str | Sequence[str], init: str, protocol: str,
                 weight_decay: float | None, c: float | None) -> list[str]:
    """The labels to probe (`task` resolved against the data set's), after checking the probe's settings."""
    tasks = list(train_set.classes) if task == "all" else [task] if isinstance(task, str) else list(task)
    unknown = [t for t in tasks if t not in train_set.classes]
    if unknown or not tasks:
        raise ValueError(f"unknown task {(unknown or [task])[0]!r} for {train_set.format} data; choose all or one "
                         f"of {', '.join(train_set.classes)}")
    if init not in INITS:
        raise ValueError(f"unknown probe init {init!r}; choose one of {', '.join(INITS)}")
    if (protocol == "lbfgs" and weight_decay is not None) or (protocol != "lbfgs" and c is not None):
        raise ValueError("a fixed weight decay belongs to the clip_benchmark protocol and a fixed C to lbfgs; "
                         f"got protocol={protocol!r} with weight_decay={weight_decay}, C={c}")
    return tasks


@dataclass
class _FeatureSource:
    """The features one probe reads: which model and pooling made them, and the cache they are kept in (one file
    per split and task, keyed by everything that changes them)."""

    model: Any
    pool: str
    cfg: Any  # the run's RunConfig
    ckpt: Path
    init: str
    ema: bool
    limit: int | None
    batch_size: int
    device: str
    progress: bool
    cache: Path
    tag: str  # short hash of the probe data folder
    given: dict[str, tuple[Tensor, dict[str, Tensor]]] = field(default_factory=dict)  # split -> features, labels

    def features(self, ds: ProbeDataset, tasks: list[str]) -> dict[str, tuple[Tensor, Tensor]]:
        """task -> (features (N, D), labels (N,)) of split `ds`, from the cache or one pass over its images."""
        memo: dict[str, Any] = {}

        def compute(t: str) -> tuple[Tensor, Tensor]:
            if "out" not in memo and ds.split in self.given:  # computed elsewhere (a seed stack's one pass)
                memo["out"] = self.given[ds.split]
            if "out" not in memo:  # one pass over the images serves every task
                memo["out"] = extract_features(self.model, ds, pool=self.pool, image_size=self.cfg.model.image_size,
                                               batch_size=self.batch_size, device=self.device,
                                               progress=self.progress)
            feats, labels = memo["out"]
            return feats, labels[t]

        weights = self.ckpt / ("ema.safetensors" if self.ema else "model.safetensors")
        kind = {"trained": "-ema" if self.ema else "", "random": "-random", "pixels": "-pixels"}[self.init]
        out = {}
        for t in tasks:
            fingerprint = {"version": CACHE_VERSION, "checkpoint": str(self.ckpt.resolve()), "weights": weights.name,
                           "weights_size": weights.stat().st_size, "weights_mtime_ns": weights.stat().st_mtime_ns,
                           "data": str(ds.root.resolve()), "format": ds.format, "split": ds.split, "task": t,
                           "data_stamp": ds.stamp(), "pool": self.pool, "image_size": self.cfg.model.image_size,
                           "limit": self.limit, "init": self.init, "train_seed": self.cfg.train.seed}
            name = f"{ds.format}-{ds.root.name}-{self.tag}-{self.ckpt.name}{kind}-{ds.split}-{t}.safetensors"
            out[t] = cached_features(self.cache / name, lambda t=t: compute(t), fingerprint)
        return out


def seen_in_pretraining(pretraining_data: str | Path, probe_root: str | Path) -> bool:
    """Whether a probe that trains on the folder `probe_root` trains on the images a run was pretrained on
    (its ``data.path``): the same folder, or one inside the other."""
    try:
        pre, probe = Path(pretraining_data).expanduser().resolve(), Path(probe_root).expanduser().resolve()
    except (OSError, RuntimeError):
        return False
    return pre == probe or pre in probe.parents or probe in pre.parents


def probe_runs(runs: list[str | Path], data: str | Path, *, baselines: Sequence[str] = ("random",),
               **kwargs: Any) -> dict[str, Any]:
    """:func:`probe_run` for each run on the same data (keyword arguments as there), then the `baselines` rows:
    ``random``: the first run of each feature kind (CLS / GAP) with its architecture untrained; ``pixels``: the
    raw pixels once. One JSON-ready dict ``{"data", "runs": [probe_run result, ...], "table": markdown}``
    (paper Table 1: runs x tasks, baselines last)."""
    if not runs:
        raise ValueError("give at least one run")
    unknown = sorted(set(baselines) - {"random", "pixels"})
    if unknown:
        raise ValueError(f"unknown probe baseline(s) {unknown}; choose from random, pixels")
    results = [probe_run(run, data, **kwargs) for run in runs]
    pools: set[str] = set()
    for run, res in zip(runs, list(results), strict=True):
        if "random" in baselines and res["pool"] not in pools:
            pools.add(res["pool"])
            results.append(probe_run(run, data, init="random", **kwargs))
    if "pixels" in baselines:
        results.append(probe_run(runs[0], data, init="pixels", **kwargs))
    return {"data": str(data), "runs": results, "table": probe_table(results)}


def probe_table(results: list[dict[str, Any]], metric: str = "top1") -> str:
    """Markdown table of `metric` (a fraction, shown in %) with one row per run and one column per task."""
    tasks = list(dict.fromkeys(t for r in results for t in r["tasks"]))
    lines = ["| run | objective | feature | " + " | ".join(tasks) + " |", "|---|---|---|" + "---:|" * len(tasks)]
    for r in results:
        cells = [f"{100 * r['tasks'][t][metric]:.1f}" if t in r["tasks"] else "" for t in tasks]
        objective = "-" if r.get("init") == "pixels" else r["objective"]  # raw pixels come from no model
        lines.append(f"| {row_name(r)} | {objective} | {r['pool']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def row_name(result: dict[str, Any]) -> str:
    """A probe table's row label: the run's folder name, or the baseline it stands for."""
    init = result.get("init", "trained")
    if init == "pixels":
        return "raw pixels"
    name = Path(result["run"]).name
    return f"random init ({result['objective']} architecture)" if init == "random" else name


