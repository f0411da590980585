"""The converged linear probe: L-BFGS multinomial logistic regression (OpenAI CLIP, appendix A.3).

On L2-normalised frozen features (the caller normalises), scikit-learn's ``LogisticRegression(solver="lbfgs")``
is trained to convergence for each inverse regularisation strength ``C`` of a log grid, scored on a validation
split carved from the training rows, and the best ``C`` is refined around the peak; the probe with that ``C`` is
then refit on train + validation and scored on the test set. The search is CLIP-benchmark's ``find_peak`` (7
evenly spaced grid points, then steps of 8, 4, 2, 1 grid points around the best), here over ``C`` in
``logspace(-3, 6, 97)`` (steps of x1.24); ties go to the smaller ``C`` (the stronger regularisation).

Unlike the CLIP-benchmark protocol (AdamW, 10 epochs; :mod:`mdc_core.eval.probe`), nothing here depends on the
set's size: the optimiser runs until the gradient is below ``tol`` (or ``max_iter``), so small probe sets are not
under-fitted. Accuracies are fractions in [0, 1].
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression

C_GRID: tuple[float, ...] = tuple(np.logspace(-3, 6, num=97).tolist())  # inverse L2 strengths searched
MAX_ITER = 1000  # L-BFGS iterations per fit (CLIP's appendix A.3 uses 1000)
TOL = 1e-4  # L-BFGS projected-gradient tolerance (sklearn's default; 1e-6 took 2-3x the time, same accuracy)


def fit_logistic(x: np.ndarray, t: np.ndarray, c: float, *, max_iter: int = MAX_ITER, tol: float = TOL
                 ) -> tuple[LogisticRegression, bool]:
    """One multinomial logistic regression, x (N, D) float, t (N,) int targets; returns (model, converged)."""
    model = LogisticRegression(C=c, solver="lbfgs", max_iter=max_iter, tol=tol)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        model.fit(x, t)
    converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
    return model, converged


def find_peak_search(grid: Sequence[float], score: Callable[[float], float]) -> float:
    """CLIP-benchmark's coarse-to-fine ``find_peak`` over `grid`: 7 evenly spaced points, then candidates
    ``[peak - s, peak, peak + s]`` for s = 8, 4, 2, 1 grid points (clipped). Ties keep the earlier candidate."""

    def peak(idxs: Sequence[int]) -> int:
        best_idx, best = idxs[0], -math.inf
        for i in idxs:
            value = score(grid[i])
            if value > best:
                best_idx, best = i, value
        return best_idx

    if len(grid) <= 7:
        return grid[peak(range(len(grid)))]
    p = peak(np.linspace(0, len(grid) - 1, 7).round().astype(int).tolist())
    step = 8
    while step > 0:
        p = peak([max(p - step, 0), p, min(p + step, len(grid) - 1)])
        step //= 2
    return grid[p]


def lbfgs_probe(fit: tuple[np.ndarray, np.ndarray], val: tuple[np.ndarray, np.ndarray] | None,
                full: tuple[np.ndarray, np.ndarray], test_x: np.ndarray, *, c_grid: Sequence[float] = C_GRID,
                on_fit: Callable[[], None] | None = None
                ) -> tuple[np.ndarray, float, list[tuple[float, float]], bool]:
    """Choose ``C`` on (fit, val), refit on `full` (= fit + val), return test logits.

    Args:
        fit, val: (features (N, D), targets (N,)) for the search; ``val=None`` skips it (`c_grid` must then hold
            one value).
        full: the rows the final probe trains on.
        test_x: (M, D) test features.
        c_grid: candidate ``C`` values, ascending; one value: no search.
        on_fit: called after every fit (progress).

    Returns:
        (test logits (M, n_classes) float32, chosen C, [(C, val top-1)] in search order, final fit converged).
    """
    scores: list[tuple[float, float]] = []
    cache: dict[float, float] = {}

    def val_top1(c: float) -> float:
        if c not in cache:
            model, _ = fit_logistic(*fit, c)
            cache[c] = float((model.predict(val[0]) == val[1]).mean())
            scores.append((c, cache[c]))
            if on_fit:
                on_fit()
        return cache[c]

    if val is None or len(c_grid) == 1:
        best = float(c_grid[0])
    else:
        best = float(find_peak_search(list(c_grid), val_top1))
    model, converged = fit_logistic(*full, best)
    if on_fit:
        on_fit()
    logits = model.decision_function(test_x).astype(np.float32)
    if logits.ndim == 1:  # two classes: sklearn gives the logit of class 1; as two columns, softmax-equivalent
        logits = np.stack([np.zeros_like(logits), logits], axis=1)
    return logits, best, scores, converged
