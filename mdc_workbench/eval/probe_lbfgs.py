"""The converged linear probe: L-BFGS multinomial logistic regression (OpenAI CLIP, appendix A.3).

On L2-normalised frozen features (the caller normalises), standardised per dimension with the mean and standard
deviation of the rows each fit trains on, scikit-learn's ``LogisticRegression(solver="lbfgs")`` is trained to
convergence for each inverse regularisation strength ``C`` of a log grid, scored on a validation
split carved from the training rows, and the best ``C`` is refined around the peak; the probe with that ``C`` is
then refit on train + validation and scored on the test set. The search is CLIP-benchmark's ``find_peak`` (7
evenly spaced grid points, then steps of 8, 4, 2, 1 grid points around the best), here over ``C`` in
``logspace(-3, 6, 97)`` (steps of x1.24); ties go to the smaller ``C`` (the stronger regularisation). Each fit of
the search starts from the previous solution (``warm_start``) and is capped at 300 iterations (the final fit at
1000): on a random-init ``tiny`` encoder's features the chosen probes scored the same within noise in half the time.

Why standardise: L2-normalised features of a small encoder often vary by ~1e-3 per dimension around a large
shared component. L-BFGS then meets its gradient tolerance long before the optimum (its gradients are tiny) and
the search picks the weakest useful fit: on a randomly initialised ``tiny`` encoder, 12% colour top-1 unscaled
vs 48% standardised (chance 15%). Standardising is an affine map of the features, so the probe is still a linear
classifier of them; only the L2 penalty is measured in the standardised coordinates.

Unlike the CLIP-benchmark protocol (AdamW, 10 epochs; :mod:`mdc_workbench.eval.probe`), nothing here depends on the
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
from threadpoolctl import threadpool_limits

C_GRID: tuple[float, ...] = tuple(np.logspace(-3, 6, num=97).tolist())  # inverse L2 strengths searched
MAX_ITER = 1000  # L-BFGS iterations of the final fit (CLIP's appendix A.3 uses 1000)
SEARCH_MAX_ITER = 300  # per fit of the C search: the same chosen accuracy within noise, half the time (measured)
TOL = 1e-4  # L-BFGS projected-gradient tolerance (sklearn's default; 1e-6 took 2-3x the time, same accuracy)


def standardise(fit_x: np.ndarray, *others: np.ndarray) -> list[np.ndarray]:
    """Centre and scale every column by the mean and standard deviation of `fit_x` (N, D); constant columns are
    only centred. Returns [fit_x, *others] transformed, float64."""
    mean = fit_x.mean(axis=0)
    std = fit_x.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    return [(a.astype(np.float64) - mean) / std for a in (fit_x, *others)]


def fit_logistic(x: np.ndarray, t: np.ndarray, c: float, *, max_iter: int = MAX_ITER, tol: float = TOL,
                 model: LogisticRegression | None = None) -> tuple[LogisticRegression, bool]:
    """One multinomial logistic regression, x (N, D) float, t (N,) int targets; returns (model, converged).
    Passing a fitted `model` built with ``warm_start=True`` starts from its solution."""
    model = model or LogisticRegression(solver="lbfgs", max_iter=max_iter, tol=tol)
    model.set_params(C=c)
    # One BLAS / OpenMP thread: a probe's matrices are small, and in a process whose torch thread pool is
    # already spun up, scikit-learn's OpenMP loss and OpenBLAS threads contend with it (the probes of a
    # notebook ran several times slower with two threads than with one on the 2-core machine).
    with warnings.catch_warnings(record=True) as caught, threadpool_limits(limits=1):
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
    if val is not None:
        fit_x, val_x = standardise(fit[0], val[0])
    path = LogisticRegression(solver="lbfgs", max_iter=SEARCH_MAX_ITER, tol=TOL, warm_start=True)  # warm path

    def val_top1(c: float) -> float:
        if c not in cache:
            model, _ = fit_logistic(fit_x, fit[1], c, model=path)
            cache[c] = float((model.predict(val_x) == val[1]).mean())
            scores.append((c, cache[c]))
            if on_fit:
                on_fit()
        return cache[c]

    if val is None or len(c_grid) == 1:
        best = float(c_grid[0])
    else:
        best = float(find_peak_search(list(c_grid), val_top1))
    full_x, test_x = standardise(full[0], test_x)
    model, converged = fit_logistic(full_x, full[1], best)
    if on_fit:
        on_fit()
    logits = model.decision_function(test_x).astype(np.float32)
    if logits.ndim == 1:  # two classes: sklearn gives the logit of class 1; as two columns, softmax-equivalent
        logits = np.stack([np.zeros_like(logits), logits], axis=1)
    return logits, best, scores, converged
