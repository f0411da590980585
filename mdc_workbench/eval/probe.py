"""Linear probing of frozen features, plus an on-disk feature cache.

Two protocols (``linear_probe(..., protocol=...)``, ``mdc probe --protocol``):

* ``lbfgs`` (default): multinomial logistic regression trained to convergence with L-BFGS, the inverse
  regularisation C chosen on a validation split, then refit on train + validation (OpenAI CLIP appendix A.3;
  :mod:`mdc_workbench.eval.probe_lbfgs`). Its result does not depend on the probe set's size through a step budget.
* ``clip_benchmark``: the protocol below, kept for comparability with the paper's code base. It is sized for
  ImageNet (10 epochs = ~200k steps) and under-fits sets of a few thousand images.

The CLIP-benchmark protocol is that of LAION-AI/CLIP_benchmark (``clip_benchmark/metrics/linear_probe.py``), whose
implementation asserts CUDA and so cannot run here; it is reimplemented faithfully:

* features are L2-normalised (its ``Featurizer(normalize=True)``);
* the probe is a single ``nn.Linear`` trained with AdamW (lr 0.1, default betas, weight decay on all
  parameters), cross-entropy, batch 64, 10 epochs, a per-step cosine schedule without warmup;
* the weight decay is chosen on a validation split carved at random from the training set (its
  ``--val_proportion``, 0.2): a log grid ``logspace(-6, 2, 97)`` is probed at 7 points, then refined around the
  best by steps of 8, 4, 2, 1 grid points (OpenAI CLIP appendix A.3, with AdamW instead of L-BFGS);
* the probe is retrained on train + validation with the chosen weight decay and scored on the test set.

Deliberate differences, all minor: labels are remapped to the sorted distinct training labels (CLIP-benchmark
uses ``max(label) + 1`` outputs; the two agree for contiguous labels); top-5 is top-``min(5, n_classes)``
(CLIP-benchmark reports NaN below 5 classes); training is fp32 (no autocast) so CPU and CUDA agree; the
best-on-validation search starts from the first candidate rather than grid index 0 (CLIP-benchmark falls back
to 1e-6 when every candidate scores 0); a weight decay already scored is not retrained (training is
deterministic, so this only saves time). Accuracies are fractions in [0, 1], not percent.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from sklearn.metrics import balanced_accuracy_score
from torch import Tensor
from tqdm.auto import tqdm

from mdc_workbench.eval.probe_lbfgs import C_GRID, lbfgs_probe

CLIP_BENCHMARK_WD_GRID: tuple[float, ...] = tuple(np.logspace(-6, 2, num=97).tolist())  # its `wd_list`
_INIT_POINTS = 7  # coarse pass: logspace(-6, 2, 7) = every 16th grid point
_EVAL_BATCH = 4096  # rows per forward pass when scoring (memory only; no effect on results)
PROTOCOLS = ("lbfgs", "clip_benchmark")  # the first is the default
@dataclass
class ProbeResult:
    """Outcome of :func:`linear_probe`. Accuracies are fractions in [0, 1]."""

    top1: float  # test top-1 accuracy
    top5: float  # test top-k accuracy with k = top5_k
    top5_k: int  # min(5, n_classes)
    balanced_accuracy: float  # mean per-class recall on test (sklearn balanced_accuracy_score)
    weight_decay: float | None  # weight decay of the final probe (clip_benchmark; None for lbfgs)
    val_scores: list[tuple[float, float]] = field(default_factory=list)  # (wd or C, val top-1), in search order
    n_train: int = 0  # training rows (train + val) used by the final probe
    n_val: int = 0  # rows held out for the weight-decay search (0 when there was no search)
    n_test: int = 0  # test rows
    n_classes: int = 0  # distinct training labels = probe outputs
    epochs: int = 10
    lr: float = 0.1
    batch_size: int = 64
    seed: int = 0
    protocol: str = "clip_benchmark"  # lbfgs | clip_benchmark
    C: float | None = None  # lbfgs: inverse L2 regularisation of the final probe
    converged: bool | None = None  # lbfgs: the final fit met its tolerance within its iteration budget
    test_correct: list[int] = field(default_factory=list)  # 0/1 per test row (top-1), for bootstrap intervals
    test_label: list[int] = field(default_factory=list)  # per test row its label (the caller's label values)
    test_pred: list[int] = field(default_factory=list)  # per test row the probe's top-1 prediction (label values)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``val_scores`` as a list of ``[wd, acc]`` pairs)."""
        out = asdict(self)
        out["val_scores"] = [[float(wd), float(acc)] for wd, acc in self.val_scores]
        return out


def linear_probe(
    train_x: Tensor,
    train_y: Tensor,
    test_x: Tensor,
    test_y: Tensor,
    *,
    epochs: int = 10,
    lr: float = 0.1,
    batch_size: int = 64,
    wd_grid: Sequence[float] | None = None,
    val_fraction: float = 0.2,
    normalize: bool = True,
    seed: int = 0,
    device: str | torch.device = "cpu",
    cpu_threads: int | None = 1,
    progress: bool = False,
    protocol: str = "lbfgs",
    c_grid: Sequence[float] | None = None,
) -> ProbeResult:
    """Train and score a linear probe on frozen features (``protocol``: see the module docstring).

    Args:
        train_x: (N, D) float training features (e.g. mean-pooled encoder tokens, or CLS for CLIP).
        train_y: (N,) integer class labels; any integer values, remapped to their sorted distinct values.
        test_x: (M, D) float test features.
        test_y: (M,) integer labels; every one must occur in ``train_y``.
        epochs, lr, batch_size: probe training; defaults are CLIP-benchmark's.
        wd_grid: weight decays to choose from. ``None``: CLIP-benchmark's coarse-to-fine search over
            ``logspace(-6, 2, 97)``. A sequence: every value is tried (ties go to the earlier one). A single
            value: no search and no validation split; that value is used on the whole training set.
        val_fraction: share of the training rows held out (at random, seeded) to choose the weight decay.
        normalize: L2-normalise every feature row first (CLIP-benchmark's default).
        seed: seeds the validation split, the probe's initialisation and the batch order.
        device: where the probe trains ("cpu", "cuda", ...). Results are bitwise reproducible on CPU.
        cpu_threads: torch intra-op threads while running on CPU, restored afterwards (``None``: leave as is).
            The probe's small matmuls are fastest on one thread; with 2 threads on a 2-core machine shared with
            another job they ran ~8x slower. One thread also makes CPU results independent of the core count.
        progress: show a tqdm bar over the probe trainings.
        protocol: ``lbfgs`` (converged logistic regression, default) or ``clip_benchmark``. With ``lbfgs``,
            `epochs`, `lr`, `batch_size`, `wd_grid` and `device` do not apply (it runs on CPU, scikit-learn).
        c_grid: lbfgs only: candidate inverse regularisations C (``None``: ``logspace(-3, 6, 97)`` searched
            coarse-to-fine; one value: no search, fit on the whole training set).

    Returns:
        A :class:`ProbeResult`.

    Raises:
        ValueError: mismatched shapes or lengths, an empty split, fewer than two training classes, test labels
            absent from training, non-finite features, or a validation split that leaves a part empty.
    """
    train_x, train_y = _check_split("train", train_x, train_y)
    test_x, test_y = _check_split("test", test_x, test_y)
    classes = _check_labels(train_x, train_y, test_x, test_y)  # sorted distinct labels; output j <-> classes[j]
    if epochs < 1 or batch_size < 1 or lr <= 0:
        raise ValueError(f"need epochs >= 1, batch_size >= 1, lr > 0; got {epochs}, {batch_size}, {lr}")
    grid = CLIP_BENCHMARK_WD_GRID if wd_grid is None else tuple(float(w) for w in wd_grid)
    if not grid or any(w < 0 or not math.isfinite(w) for w in grid):
        raise ValueError(f"wd_grid must hold finite non-negative values, got {list(grid)}")
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown probe protocol {protocol!r}; choose one of {', '.join(PROTOCOLS)}")
    if normalize:
        train_x, test_x = F.normalize(train_x, dim=-1), F.normalize(test_x, dim=-1)
    train_t = torch.searchsorted(classes, train_y)  # (N,) targets in [0, n_classes)
    test_t = torch.searchsorted(classes, test_y)  # (M,)
    if protocol == "lbfgs":
        return _lbfgs(train_x, train_t, test_x, test_y, test_t, classes, c_grid, val_fraction, seed, progress)
    hp = dict(epochs=epochs, lr=lr, batch_size=batch_size, seed=seed, device=torch.device(device))

    with _cpu_threads(cpu_threads if hp["device"].type == "cpu" else None):
        return _probe(train_x, train_t, test_x, test_y, test_t, classes, grid, wd_grid is None, val_fraction, hp,
                      progress)


def _check_labels(train_x: Tensor, train_y: Tensor, test_x: Tensor, test_y: Tensor) -> Tensor:
    """The sorted distinct training labels; ValueError when the feature sizes differ, fewer than two classes are
    trained, or a test label never occurs in training."""
    if train_x.shape[1] != test_x.shape[1]:
        raise ValueError(f"feature sizes differ: train_x has D={train_x.shape[1]}, test_x has D={test_x.shape[1]}")
    classes = torch.unique(train_y)
    if len(classes) < 2:
        raise ValueError(f"train_y has {len(classes)} distinct class(es); a probe needs at least 2")
    unseen = sorted(set(torch.unique(test_y).tolist()) - set(classes.tolist()))
    if unseen:
        raise ValueError(f"test labels {unseen[:10]}{' ...' if len(unseen) > 10 else ''} never occur in train_y; "
                         "a probe trained on train_y cannot predict them")
    return classes


def _probe(train_x: Tensor, train_t: Tensor, test_x: Tensor, test_y: Tensor, test_t: Tensor, classes: Tensor,
           grid: tuple[float, ...], clip_benchmark: bool, val_fraction: float, hp: dict[str, Any],
           progress: bool) -> ProbeResult:
    """Body of :func:`linear_probe` on validated inputs: wd search, final fit on train + val, test scores."""
    n_classes = len(classes)
    val_scores: list[tuple[float, float]] = []
    n_val = 0
    if len(grid) == 1:
        best_wd = grid[0]
    else:
        fit_idx, val_idx = _split_indices(len(train_x), val_fraction, hp["seed"])
        n_val = len(val_idx)
        fit = (train_x[fit_idx], train_t[fit_idx])
        val = (train_x[val_idx], train_t[val_idx])
        bar = tqdm(desc="linear probe wd search", unit="fit", disable=not progress)
        cache: dict[float, float] = {}

        def val_top1(wd: float) -> float:
            if wd not in cache:
                probe = _train_probe(*fit, n_classes=n_classes, weight_decay=wd, **hp)
                logits = _predict(probe, val[0], hp["device"])
                cache[wd] = _topk_accuracy(logits, val[1], 1)
                val_scores.append((wd, cache[wd]))
                bar.update(1)
            return cache[wd]

        best_wd = _wd_search(grid, val_top1, clip_benchmark=clip_benchmark)
        bar.close()

    probe = _train_probe(train_x, train_t, n_classes=n_classes, weight_decay=best_wd, **hp)
    logits = _predict(probe, test_x, hp["device"])  # (M, n_classes)
    return ProbeResult(
        **_test_scores(logits, test_y, test_t, classes), weight_decay=best_wd, val_scores=val_scores,
        n_train=len(train_x), n_val=n_val, n_test=len(test_x), n_classes=n_classes,
        epochs=hp["epochs"], lr=hp["lr"], batch_size=hp["batch_size"], seed=hp["seed"],
    )


def _test_scores(logits: Tensor, test_y: Tensor, test_t: Tensor, classes: Tensor) -> dict[str, Any]:
    """top1, top5 (top-min(5, C)), balanced accuracy, per-row correctness, labels and predictions from (M, C) test
    logits (the per-item record of :mod:`mdc_workbench.eval.items`)."""
    k = min(5, len(classes))
    pred_t = logits.argmax(dim=1)  # (M,) probe outputs
    pred = classes[pred_t]  # (M,) original label values
    with warnings.catch_warnings():  # sklearn warns when a predicted class is absent from test_y; that is fine
        warnings.filterwarnings("ignore", message="y_pred contains classes not in y_true")
        balanced = float(balanced_accuracy_score(test_y.numpy(), pred.numpy()))
    return {"top1": _topk_accuracy(logits, test_t, 1), "top5": _topk_accuracy(logits, test_t, k), "top5_k": k,
            "balanced_accuracy": balanced, "test_correct": (pred_t == test_t).int().tolist(),
            "test_label": test_y.tolist(), "test_pred": pred.tolist()}


def _lbfgs(train_x: Tensor, train_t: Tensor, test_x: Tensor, test_y: Tensor, test_t: Tensor, classes: Tensor,
           c_grid: Sequence[float] | None, val_fraction: float, seed: int, progress: bool) -> ProbeResult:
    """The ``lbfgs`` protocol on validated, normalised inputs (see :mod:`mdc_workbench.eval.probe_lbfgs`)."""
    grid = C_GRID if c_grid is None else tuple(float(c) for c in c_grid)
    if not grid or any(c <= 0 or not math.isfinite(c) for c in grid):
        raise ValueError(f"c_grid must hold finite positive values, got {list(grid)}")
    full = (train_x.numpy(), train_t.numpy())
    val = None
    n_val = 0
    if len(grid) > 1:
        fit_idx, val_idx = _split_indices(len(train_x), val_fraction, seed)
        n_val = len(val_idx)
        fit, val = (full[0][fit_idx], full[1][fit_idx]), (full[0][val_idx], full[1][val_idx])
    else:
        fit = full
    bar = tqdm(desc="linear probe (L-BFGS, C search)", unit="fit", disable=not progress)
    logits, best_c, scores, converged = lbfgs_probe(fit, val, full, test_x.numpy(), c_grid=sorted(grid),
                                                    on_fit=lambda: bar.update(1))
    bar.close()
    return ProbeResult(
        **_test_scores(torch.from_numpy(logits), test_y, test_t, classes), weight_decay=None, val_scores=scores,
        n_train=len(train_x), n_val=n_val, n_test=len(test_x), n_classes=len(classes), seed=seed,
        protocol="lbfgs", C=best_c, converged=converged, epochs=0, lr=0.0, batch_size=0,
    )


@contextlib.contextmanager
def _cpu_threads(n: int | None) -> Iterator[None]:
    """Temporarily set torch's intra-op thread count (no-op for None)."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _wd_search(grid: tuple[float, ...], score: Callable[[float], float], clip_benchmark: bool) -> float:
    """Return the weight decay in ``grid`` with the best validation score (first one on ties).

    ``clip_benchmark=True`` reproduces CLIP-benchmark's ``find_peak`` search: 7 evenly spaced grid points, then
    candidates ``[peak - s, peak, peak + s]`` for s = 8, 4, 2, 1 (clipped to the grid). Otherwise all of ``grid``.
    """

    def find_peak(idxs: Sequence[int]) -> int:
        best_idx, best = idxs[0], -math.inf
        for i in idxs:
            acc = score(grid[i])
            if acc > best:  # strict: ties keep the earlier candidate, as in CLIP-benchmark
                best_idx, best = i, acc
        return best_idx

    if not clip_benchmark:
        return grid[find_peak(range(len(grid)))]
    init = np.linspace(0, len(grid) - 1, _INIT_POINTS).round().astype(int).tolist()  # 0, 16, ..., 96
    peak = find_peak(init)
    step = 8
    while step > 0:
        peak = find_peak([max(peak - step, 0), peak, min(peak + step, len(grid) - 1)])
        step //= 2
    return grid[peak]


def _train_probe(x: Tensor, t: Tensor, *, n_classes: int, weight_decay: float, epochs: int, lr: float,
                 batch_size: int, seed: int, device: torch.device) -> torch.nn.Linear:
    """CLIP-benchmark's ``train``: one nn.Linear, AdamW, per-step cosine lr (no warmup), cross-entropy.

    Written by hand because no maintained library exposes this exact protocol without CUDA.
    x: (N, D) features, t: (N,) targets in [0, n_classes). The global RNG is left untouched.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # as CLIP-benchmark: same init for every weight decay
        probe = torch.nn.Linear(x.shape[1], n_classes)
    probe = probe.to(device)
    gen = torch.Generator().manual_seed(seed)  # batch order (their DataLoader(shuffle=True))
    optimizer = torch.optim.AdamW(probe.parameters(), lr=lr, weight_decay=weight_decay)
    x, t = x.to(device), t.to(device)
    steps_per_epoch = math.ceil(len(x) / batch_size)
    total = epochs * steps_per_epoch
    step = 0
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=gen).to(device)
        for start in range(0, len(x), batch_size):
            idx = order[start:start + batch_size]
            for group in optimizer.param_groups:
                group["lr"] = 0.5 * (1 + math.cos(math.pi * step / total)) * lr
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(probe(x[idx]), t[idx])  # (B, C) logits vs (B,) targets
            loss.backward()
            optimizer.step()
            step += 1
    return probe


@torch.no_grad()
def _predict(probe: torch.nn.Linear, x: Tensor, device: torch.device) -> Tensor:
    """(M, D) features -> (M, C) float32 logits on CPU."""
    return torch.cat([probe(x[i:i + _EVAL_BATCH].to(device)).float().cpu() for i in range(0, len(x), _EVAL_BATCH)])


def _topk_accuracy(logits: Tensor, t: Tensor, k: int) -> float:
    """Fraction of rows whose target is among the k highest logits. logits (M, C), t (M,)."""
    topk = logits.topk(k, dim=1).indices  # (M, k)
    return int((topk == t[:, None]).any(dim=1).sum()) / len(t)


def _split_indices(n: int, val_fraction: float, seed: int) -> tuple[Tensor, Tensor]:
    """Seeded random split of range(n) into (fit, val) with floor(n * val_fraction) validation rows."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1) to choose a weight decay, got {val_fraction}; "
                         "pass a single-value wd_grid to skip the search")
    n_val = int(n * val_fraction)
    if n_val == 0 or n_val == n:
        raise ValueError(f"val_fraction={val_fraction} of {n} training rows leaves an empty train or validation "
                         "split; use more data, another val_fraction, or a single-value wd_grid")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[n_val:], perm[:n_val]


def _check_split(name: str, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Validate one split; return (float32 (N, D) CPU features, int64 (N,) CPU labels)."""
    if not isinstance(x, Tensor) or not isinstance(y, Tensor):
        raise ValueError(f"{name}_x and {name}_y must be torch Tensors, got {type(x).__name__}, {type(y).__name__}")
    if x.ndim != 2:
        raise ValueError(f"{name}_x must be 2-D (N, D), got shape {tuple(x.shape)}")
    if y.ndim != 1:
        raise ValueError(f"{name}_y must be 1-D (N,), got shape {tuple(y.shape)}")
    if len(x) != len(y):
        raise ValueError(f"{name}_x has {len(x)} rows but {name}_y has {len(y)} labels")
    if len(x) == 0:
        raise ValueError(f"the {name} split is empty")
    if x.is_complex() or y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise ValueError(f"{name}_x must be real and {name}_y integer, got {x.dtype} and {y.dtype}")
    x = x.detach().float().cpu()
    if not torch.isfinite(x).all():
        bad = int((~torch.isfinite(x)).any(dim=1).sum())
        raise ValueError(f"{name}_x has NaN or infinite values in {bad} row(s)")
    return x, y.detach().long().cpu()


def cached_features(
    cache_path: Path | str,
    compute: Callable[[], tuple[Tensor, Tensor]],
    fingerprint: dict[str, Any],
) -> tuple[Tensor, Tensor]:
    """Load (features, labels) from ``cache_path``, or compute and save them when absent or stale.

    The file is a safetensors file holding ``features`` (N, D) and ``labels`` (N,), with ``fingerprint``
    (canonical JSON, sorted keys) in its metadata; a readable copy is written to ``<cache_path>.json``. The cache
    is used only when the stored fingerprint equals ``fingerprint`` (put in it everything the features depend
    on: checkpoint, data split, image size, pooling ...); otherwise ``compute()`` runs and the file is replaced.
    Writes go to a temporary file in the same folder, then ``os.replace``, so a reader never sees half a file.

    Args:
        cache_path: where to keep the cache (e.g. ``runs/x/features/cifar10-train.safetensors``).
        compute: returns (features (N, D), labels (N,)); called only on a miss.
        fingerprint: JSON-serialisable description of what produced the features.

    Returns:
        (features, labels) as CPU tensors.
    """
    cache_path = Path(cache_path)
    key = json.dumps(fingerprint, sort_keys=True)  # raises TypeError for non-JSON values, before any work
    if cache_path.exists():
        try:
            with safe_open(str(cache_path), framework="pt") as f:
                if (f.metadata() or {}).get("fingerprint") == key:
                    return f.get_tensor("features"), f.get_tensor("labels")
        except Exception:  # unreadable or foreign file: recompute and overwrite it
            pass
    out = compute()
    if not (isinstance(out, tuple) and len(out) == 2 and all(isinstance(v, Tensor) for v in out)):
        raise ValueError("compute() must return a (features, labels) tuple of tensors")
    features, labels = (v.detach().cpu().contiguous() for v in out)
    if features.ndim != 2 or labels.ndim != 1 or len(features) != len(labels):
        raise ValueError(f"compute() returned features {tuple(features.shape)} and labels {tuple(labels.shape)}; "
                         "expected (N, D) and (N,)")
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(cache_path, lambda tmp: save_file({"features": features, "labels": labels}, tmp,
                                                    metadata={"fingerprint": key}))
    sidecar = cache_path.with_name(cache_path.name + ".json")
    _atomic_write(sidecar, lambda tmp: Path(tmp).write_text(json.dumps(fingerprint, sort_keys=True, indent=2)))
    return features, labels


def _atomic_write(path: Path, write: Callable[[str], Any]) -> None:
    """Call ``write(tmp_name)`` on a temp file beside ``path``, then atomically rename it onto ``path``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
