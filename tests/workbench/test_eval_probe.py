"""Tests for mdc_workbench.eval.probe: the converged (L-BFGS) and CLIP-benchmark linear probes, and the feature
cache."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from mdc_workbench.eval import probe_lbfgs
from mdc_workbench.eval.probe import C_GRID, CLIP_BENCHMARK_WD_GRID, _wd_search, cached_features, linear_probe

clip_probe = functools.partial(linear_probe, protocol="clip_benchmark")  # the default protocol is lbfgs
SMALL_GRID = (1e-6, 1e-4, 1e-2)  # keeps the tests fast where the default 97-point search is not under test


def gaussian_clusters(n: int, n_classes: int, dim: int, spread: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n points around n_classes random centres (scale ``spread``) with unit Gaussian noise and a shared offset."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(n_classes, dim, generator=g) * spread
    y = torch.randint(0, n_classes, (n,), generator=g)
    x = centres[y] + torch.randn(n, dim, generator=g) + 0.5  # offset: L2 normalisation must not be a no-op
    return x, y


def test_separable_clusters_reach_100_percent() -> None:
    x, y = gaussian_clusters(600, n_classes=4, dim=16, spread=8.0, seed=0)
    r = clip_probe(x[:400], y[:400], x[400:], y[400:], wd_grid=SMALL_GRID)
    assert r.top1 == 1.0 and r.balanced_accuracy == 1.0
    assert r.top5 == 1.0 and r.top5_k == 4
    assert r.weight_decay in SMALL_GRID and len(r.val_scores) == len(SMALL_GRID)
    assert (r.n_train, r.n_val, r.n_test, r.n_classes) == (400, 80, 200, 4)


def test_matches_sklearn_logistic_regression_on_overlapping_classes() -> None:
    """CLIP-benchmark protocol (97-point coarse-to-fine wd search) vs sklearn on the same L2-normalised features."""
    x, y = gaussian_clusters(4000, n_classes=10, dim=64, spread=0.3, seed=1)
    train_x, train_y, test_x, test_y = x[:3000], y[:3000], x[3000:], y[3000:]
    r = clip_probe(train_x, train_y, test_x, test_y)
    clf = LogisticRegression(max_iter=2000).fit(F.normalize(train_x, dim=-1).numpy(), train_y.numpy())
    sk_top1 = float((clf.predict(F.normalize(test_x, dim=-1).numpy()) == test_y.numpy()).mean())
    assert 0.5 < sk_top1 < 0.95, "the problem should be neither trivial nor hopeless"
    assert abs(r.top1 - sk_top1) <= 0.03, (r.top1, sk_top1)
    assert r.top5 >= r.top1 and r.top5_k == 5
    # the CLIP-benchmark search: 7 coarse points + at most 2 new per refinement step (8, 4, 2, 1)
    assert 7 <= len(r.val_scores) <= 15
    assert all(wd in CLIP_BENCHMARK_WD_GRID for wd, _ in r.val_scores)
    # a local search: the chosen wd never scores below the best coarse point (not necessarily the global best)
    scores = dict(r.val_scores)
    assert scores[r.weight_decay] >= max(acc for _, acc in r.val_scores[:7])
    json.dumps(r.to_dict())


def test_balanced_accuracy_on_hand_made_example() -> None:
    """Three classes on the axes; one test point of class 7 sits on class 3's axis, so it is misclassified.

    top-1 = 7/8; per-class recall: class 3: 4/4, class 7: 1/2, class 9: 2/2 -> balanced = (1 + 0.5 + 1) / 3.
    """
    eye = torch.eye(3)
    g = torch.Generator().manual_seed(0)
    train_x = eye.repeat_interleave(20, dim=0) + 0.05 * torch.randn(60, 3, generator=g)
    train_y = torch.tensor([3, 7, 9]).repeat_interleave(20)  # non-contiguous labels are remapped internally
    test_x = eye[[0, 0, 0, 0, 1, 0, 2, 2]]
    test_y = torch.tensor([3, 3, 3, 3, 7, 7, 9, 9])
    r = clip_probe(train_x, train_y, test_x, test_y, wd_grid=[0.0])
    assert r.top1 == pytest.approx(7 / 8)
    assert r.balanced_accuracy == pytest.approx((1 + 0.5 + 1) / 3)
    assert r.top5_k == 3 and r.top5 == 1.0
    assert r.val_scores == [] and r.n_val == 0 and r.weight_decay == 0.0


def test_same_seed_same_result_and_global_state_untouched() -> None:
    x, y = gaussian_clusters(500, n_classes=5, dim=8, spread=0.8, seed=2)
    state, threads = torch.get_rng_state(), torch.get_num_threads()
    a = clip_probe(x[:400], y[:400], x[400:], y[400:], wd_grid=SMALL_GRID, seed=3)
    b = clip_probe(x[:400], y[:400], x[400:], y[400:], wd_grid=SMALL_GRID, seed=3)
    assert a.to_dict() == b.to_dict()
    assert torch.equal(state, torch.get_rng_state()) and torch.get_num_threads() == threads


def test_clip_benchmark_search_finds_the_peak_of_a_unimodal_score() -> None:
    calls: list[float] = []

    def score(wd: float) -> float:
        calls.append(wd)
        return -abs(CLIP_BENCHMARK_WD_GRID.index(wd) - 43)

    assert _wd_search(CLIP_BENCHMARK_WD_GRID, score, clip_benchmark=True) == CLIP_BENCHMARK_WD_GRID[43]
    assert calls[:7] == [CLIP_BENCHMARK_WD_GRID[i] for i in (0, 16, 32, 48, 64, 80, 96)]
    assert len(calls) == 7 + 4 * 3  # uncached here: each refinement step scores [left, peak, right]


def test_converged_probe_separates_a_linearly_separable_fixture() -> None:
    """Default protocol: L-BFGS logistic regression, C searched on a validation split, refit on train + val."""
    g = torch.Generator().manual_seed(5)
    w = torch.randn(3, 20, generator=g)  # three linear scores; the label is the argmax: linearly separable
    x = torch.randn(900, 20, generator=g)
    y = (x @ w.T).argmax(dim=1)
    r = linear_probe(x[:600], y[:600], x[600:], y[600:])
    assert r.protocol == "lbfgs" and r.C in C_GRID and r.converged
    assert r.top1 >= 0.95, r.top1
    assert len(r.test_correct) == 300 and sum(r.test_correct) / 300 == pytest.approx(r.top1)
    assert 7 <= len(r.val_scores) <= 15 and (r.n_train, r.n_val, r.weight_decay) == (600, 120, None)
    json.dumps(r.to_dict())


def test_converged_probe_matches_a_direct_sklearn_fit_at_the_chosen_c() -> None:
    """Independent check of the search + refit: a separate sklearn pipeline (StandardScaler + LogisticRegression)
    at the chosen C on all training rows (tighter tolerance, more iterations) scores within 1 point."""
    x, y = gaussian_clusters(3000, n_classes=10, dim=64, spread=0.3, seed=1)
    train_x, train_y, test_x, test_y = x[:2000], y[:2000], x[2000:], y[2000:]
    r = linear_probe(train_x, train_y, test_x, test_y)
    clf = make_pipeline(StandardScaler(), LogisticRegression(C=r.C, max_iter=10000, tol=1e-10))
    clf.fit(F.normalize(train_x, dim=-1).numpy(), train_y.numpy())
    sk_top1 = float((clf.predict(F.normalize(test_x, dim=-1).numpy()) == test_y.numpy()).mean())
    assert 0.5 < sk_top1 < 0.95, "the problem should be neither trivial nor hopeless"
    assert abs(r.top1 - sk_top1) <= 0.01, (r.top1, sk_top1)
    scores = dict(r.val_scores)
    assert scores[r.C] >= max(acc for _, acc in r.val_scores[:7])  # the refinement never loses the coarse peak


def test_converged_probe_with_one_c_and_two_classes() -> None:
    x, y = gaussian_clusters(300, n_classes=2, dim=8, spread=3.0, seed=6)
    r = linear_probe(x[:200], y[:200] + 4, x[200:], y[200:] + 4, c_grid=[10.0])  # labels 4, 5: remapped
    assert r.C == 10.0 and r.val_scores == [] and r.n_val == 0 and r.top5_k == 2 and r.top1 > 0.9
    with pytest.raises(ValueError, match="unknown probe protocol"):
        linear_probe(x[:200], y[:200], x[200:], y[200:], protocol="sgd")
    with pytest.raises(ValueError, match="c_grid"):
        linear_probe(x[:200], y[:200], x[200:], y[200:], c_grid=[0.0])


@pytest.mark.parametrize("args, message", [
    ((torch.zeros(5, 3), torch.zeros(4, dtype=torch.long)), "5 rows but train_y has 4"),
    ((torch.zeros(0, 3), torch.zeros(0, dtype=torch.long)), "train split is empty"),
    ((torch.randn(10, 3), torch.zeros(10, dtype=torch.long)), "at least 2"),
    ((torch.full((10, 3), float("nan")), torch.arange(10) % 2), "NaN"),
    ((torch.randn(10, 3), (torch.arange(10) % 2).float()), "integer"),
])
def test_errors_on_bad_train_split(args: tuple[torch.Tensor, torch.Tensor], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        clip_probe(*args, torch.randn(4, 3), torch.tensor([0, 1, 0, 1]), wd_grid=[0.0])


def test_errors_on_bad_test_split() -> None:
    train_x, train_y = torch.randn(20, 3), torch.arange(20) % 2
    with pytest.raises(ValueError, match=r"test labels \[5\] never occur in train_y"):
        clip_probe(train_x, train_y, torch.randn(2, 3), torch.tensor([0, 5]), wd_grid=[0.0])
    with pytest.raises(ValueError, match="test split is empty"):
        clip_probe(train_x, train_y, torch.zeros(0, 3), torch.zeros(0, dtype=torch.long), wd_grid=[0.0])
    with pytest.raises(ValueError, match="feature sizes differ"):
        clip_probe(train_x, train_y, torch.randn(2, 4), torch.tensor([0, 1]), wd_grid=[0.0])
    with pytest.raises(ValueError, match="empty train or validation"):
        clip_probe(train_x[:3], train_y[:3], torch.randn(2, 3), torch.tensor([0, 1]), wd_grid=SMALL_GRID)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu() -> None:
    x, y = gaussian_clusters(800, n_classes=5, dim=32, spread=0.5, seed=4)
    cpu = clip_probe(x[:600], y[:600], x[600:], y[600:], wd_grid=SMALL_GRID)
    gpu = clip_probe(x[:600], y[:600], x[600:], y[600:], wd_grid=SMALL_GRID, device="cuda")
    assert abs(cpu.top1 - gpu.top1) <= 0.02


def test_cached_features_roundtrip_and_invalidation(tmp_path: Path) -> None:
    path = tmp_path / "feats" / "train.safetensors"
    calls = []

    def compute() -> tuple[torch.Tensor, torch.Tensor]:
        calls.append(1)
        return torch.arange(12.0).view(4, 3), torch.tensor([0, 1, 0, 2])

    fp = {"checkpoint": "ckpt.pt", "split": "train", "image_size": 64}
    x1, y1 = cached_features(path, compute, fp)
    x2, y2 = cached_features(path, compute, dict(reversed(fp.items())))  # key order does not matter
    assert len(calls) == 1 and torch.equal(x1, x2) and torch.equal(y1, y2)
    assert json.loads((tmp_path / "feats" / "train.safetensors.json").read_text()) == fp
    cached_features(path, compute, {**fp, "image_size": 32})  # stale fingerprint -> recompute
    assert len(calls) == 2
    path.write_bytes(b"not a safetensors file")  # corrupt -> recompute, no crash
    x3, _ = cached_features(path, compute, fp)
    assert len(calls) == 3 and torch.equal(x3, x1)
    assert sorted(p.name for p in path.parent.iterdir()) == ["train.safetensors", "train.safetensors.json"]
    with pytest.raises(TypeError):
        cached_features(path, compute, {"bad": object()})


def test_converged_probe_is_not_fooled_by_tiny_feature_variations(monkeypatch: pytest.MonkeyPatch) -> None:
    """Features around a large shared component (as a small encoder's L2-normalised features are): the class
    signal lives in variations ~1e-3. Standardising before L-BFGS recovers it; unscaled, L-BFGS met its tolerance
    early and stayed near chance."""
    g = torch.Generator().manual_seed(7)
    y = torch.randint(0, 4, (1200,), generator=g)
    centres = torch.randn(4, 32, generator=g)
    x = 100.0 * torch.ones(32) + 0.02 * (centres[y] + 0.5 * torch.randn(1200, 32, generator=g))
    r = linear_probe(x[:900], y[:900], x[900:], y[900:])
    assert r.top1 >= 0.9, r.top1
    unscaled = lambda *arrays: [a.astype("float64") for a in arrays]  # noqa: E731  (the probe without the fix)
    monkeypatch.setattr(probe_lbfgs, "standardise", unscaled)
    assert linear_probe(x[:900], y[:900], x[900:], y[900:]).top1 < 0.4  # measured: 0.27, chance 0.25
