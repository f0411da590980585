"""The variance budget of a deciding difference: how much of its spread is training seed, test items and probe fit
(torch-free: numpy only). docs/evidence.md, "The variance budget", states the method for readers.

**Design.** Per-item values ``y[s, i, f]`` of one quantity (a model's per-test-image score, or a per-image
difference of two models, e.g. MDC - ARC in points): ``S`` training seeds, ``I`` test items scored by every seed
(item i is the same image in every seed: items are *crossed* with seeds, as the plans score them), ``F`` probe fits
per seed (refits of the probe on the same frozen features with other split / initialisation seeds: fits are
*nested* in seeds; ``F = 1`` when there are none). The random-effects model::

    y[s, i, f] = mu + S_s + I_i + SI_si + F_sf + e_sif

with independent zero-mean effects of variances ``seed``, ``item``, ``seed_item`` (the seed's own reading of an
item), ``fit`` (a refit's shift of the whole test set) and ``residual`` (a refit's reading of an item).

**Method: balanced ANOVA, method of moments** (the expected-mean-squares estimators). Why: the plans' designs are
balanced (every seed scores every item, the same number of fits), where these estimators are unbiased, have closed
forms a reader can check by hand, need no iterative solver, and agree with REML whenever no estimate is negative
(REML would need statsmodels' MixedLM, which fits crossed effects of 512 items only slowly and is not a dependency).
Their weakness is that an estimate can be negative; it is then **truncated at 0 and flagged** (``truncated``),
which biases that component upward: a flagged component is one the data cannot tell from 0. Mean squares (df)::

    MS_S  (S-1)            = I F seed + F seed_item + I fit + residual
    MS_I  (I-1)            = S F item + F seed_item + residual
    MS_SI ((S-1)(I-1))     = F seed_item + residual
    MS_F  (S(F-1))         = I fit + residual
    MS_e  (S(I-1)(F-1))    = residual

With one fit per seed (``F = 1``) the probe fit cannot be told apart from the seed (its shift of the whole test set
is inside ``seed``) and its reading of an item is inside ``seed_item``: ``fit`` and ``residual`` are then 0 and
named in ``confounded``.

**The variance of a mean difference under a design** (:func:`mean_variance`): with ``s`` seeds, ``i`` items and
``f`` fits, the grand mean of the *paired* per-item differences (both models of a seed share its seed, data order
and test items) has variance ``seed/s + item/i + seed_item/(s i) + fit/(s f) + residual/(s i f)`` from the
components of the difference. Unpaired (each model its own seeds, the same test items): each model's components
but the item term, ``sum over models of (seed/s + seed_item/(s i) + fit/(s f) + residual/(s i f))`` plus the
difference's ``item/i`` (the items are still shared). The test items' term does not shrink with more seeds: with
shared test items, only more items reduce it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

COMPONENTS = ("seed", "item", "seed_item", "fit", "residual")
METHOD = "balanced ANOVA, method of moments (negative estimates truncated at 0 and flagged)"


@dataclass(frozen=True)
class Components:
    """Variance components of one quantity (module docstring), in its units squared."""

    mean: float  # the grand mean of the values
    seed: float
    item: float
    seed_item: float
    fit: float
    residual: float
    n_seeds: int
    n_items: int
    n_fits: int
    truncated: tuple[str, ...] = ()  # components whose moment estimate was negative (set to 0)
    raw: dict[str, float] = field(default_factory=dict)  # the moment estimates before truncation
    confounded: tuple[str, ...] = ()  # components the design cannot estimate (0 here, inside others)
    method: str = METHOD

    def per_seed_variance(self, n_items: int | None = None, n_fits: int | None = None) -> float:
        """Variance of one seed's mean over `n_items` items and `n_fits` fits about the grand mean of the items
        (what a t-interval over seeds sees): ``seed + seed_item/i + fit/f + residual/(i f)``; the shared items'
        ``item`` term is not in it (every seed scores the same items)."""
        i, f = _sizes(self, n_items, n_fits)
        return self.seed + self.seed_item / i + self.fit / f + self.residual / (i * f)

    def shares(self) -> dict[str, float]:
        """Each component's share of the variance of *one* seed's mean over this design's items and fits, with the
        shared item term ``item/I`` counted: where the spread of a per-seed number comes from."""
        i, f = self.n_items, self.n_fits
        parts = {"seed": self.seed, "item": self.item / i, "seed_item": self.seed_item / i, "fit": self.fit / f,
                 "residual": self.residual / (i * f)}
        total = sum(parts.values())
        return {k: (v / total if total > 0 else 0.0) for k, v in parts.items()}

    def to_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, **{k: getattr(self, k) for k in COMPONENTS}, "n_seeds": self.n_seeds,
                "n_items": self.n_items, "n_fits": self.n_fits, "truncated": list(self.truncated),
                "raw": dict(self.raw), "confounded": list(self.confounded), "method": self.method}


def _sizes(c: Components, n_items: int | None, n_fits: int | None) -> tuple[int, int]:
    i = c.n_items if n_items is None else n_items
    f = c.n_fits if n_fits is None else n_fits
    if i < 1 or f < 1:
        raise ValueError(f"a design needs >= 1 item and >= 1 fit, got {i} and {f}")
    return i, f


def _grid(values: Any) -> np.ndarray:
    """(S, I, F) float array of the values: (S, I) means one fit per seed. ValueError on a ragged, too small or
    non-finite input."""
    try:
        y = np.asarray(values, dtype=float)
    except ValueError as err:  # ragged lists
        raise ValueError(f"the variance budget needs a balanced design (every seed the same items and fits): "
                         f"{err}") from None
    if y.ndim == 2:
        y = y[:, :, None]
    if y.ndim != 3:
        raise ValueError(f"values must be (seeds, items) or (seeds, items, fits), got shape {y.shape}")
    s, i, _ = y.shape
    if s < 2 or i < 2:
        raise ValueError(f"the variance budget needs >= 2 seeds and >= 2 items, got {s} seeds and {i} items")
    if not np.isfinite(y).all():
        raise ValueError("values must be finite (a missing item or fit makes the design unbalanced)")
    return y


def components(values: Any) -> Components:
    """The variance components of per-item `values`, shape (seeds, items) or (seeds, items, fits), by balanced
    ANOVA (module docstring). Example (S = 2, I = 3, F = 1): ``[[1, 2, 3], [3, 4, 8]]`` has MS_S = 13.5,
    MS_I = 6.5, MS_SI = 1.5, so seed = (13.5 - 1.5) / 3 = 4, item = (6.5 - 1.5) / 2 = 2.5, seed_item = 1.5."""
    y = _grid(values)
    s, i, f = y.shape
    grand = y.mean()
    m_s = y.mean(axis=(1, 2))  # (S,)
    m_i = y.mean(axis=(0, 2))  # (I,)
    m_si = y.mean(axis=2)  # (S, I)
    m_sf = y.mean(axis=1)  # (S, F)
    ss_s = i * f * ((m_s - grand) ** 2).sum()
    ss_i = s * f * ((m_i - grand) ** 2).sum()
    ss_si = f * ((m_si - m_s[:, None] - m_i[None, :] + grand) ** 2).sum()
    ms_s, ms_i, ms_si = ss_s / (s - 1), ss_i / (i - 1), ss_si / ((s - 1) * (i - 1))
    if f > 1:
        ss_f = i * ((m_sf - m_s[:, None]) ** 2).sum()
        ss_e = ((y - m_si[:, :, None] - m_sf[:, None, :] + m_s[:, None, None]) ** 2).sum()
        ms_f, ms_e = ss_f / (s * (f - 1)), ss_e / (s * (i - 1) * (f - 1))
        raw = {"seed": (ms_s - ms_si - ms_f + ms_e) / (i * f), "item": (ms_i - ms_si) / (s * f),
               "seed_item": (ms_si - ms_e) / f, "fit": (ms_f - ms_e) / i, "residual": ms_e}
        confounded: tuple[str, ...] = ()
    else:
        raw = {"seed": (ms_s - ms_si) / i, "item": (ms_i - ms_si) / s, "seed_item": ms_si, "fit": 0.0,
               "residual": 0.0}
        confounded = ("fit", "residual")
    raw = {k: float(v) for k, v in raw.items()}
    tol = 1e-12 * max(1.0, float(np.abs(y).max()) ** 2)  # rounding of an exact 0 is not a negative estimate
    truncated = tuple(k for k in COMPONENTS if raw[k] < -tol)
    kept = {k: max(0.0, v) for k, v in raw.items()}
    return Components(float(grand), **kept, n_seeds=s, n_items=i, n_fits=f, truncated=truncated, raw=raw,
                      confounded=confounded)


def seed_components(per_seed: Any) -> Components:
    """Components from per-seed values only (no per-item data, as in the committed summaries): all their spread is
    counted as ``seed`` (the sample variance, ddof 1), so the item and fit terms it holds are not separated
    (``confounded``). Use it for a first budget; per-item files give the real split."""
    v = np.asarray(per_seed, dtype=float).ravel()
    if v.size < 2 or not np.isfinite(v).all():
        raise ValueError(f"need >= 2 finite per-seed values, got {v.tolist()}")
    var = float(v.var(ddof=1))
    return Components(float(v.mean()), var, 0.0, 0.0, 0.0, 0.0, n_seeds=int(v.size), n_items=1, n_fits=1,
                      raw={"seed": var}, confounded=("item", "seed_item", "fit", "residual"),
                      method="per-seed values only: every source of spread counted as the seed's")


@dataclass(frozen=True)
class Budget:
    """The variance budget of a difference a - b: the components of the paired per-item difference, and, for an
    unpaired design, of each side (None when only the difference is known)."""

    difference: Components
    a: Components | None = None
    b: Components | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"difference": self.difference.to_dict(), "a": None if self.a is None else self.a.to_dict(),
                "b": None if self.b is None else self.b.to_dict()}


def budget(a: Any, b: Any) -> Budget:
    """The budget of a - b from both sides' per-item values on the same seeds, items and fits (same shapes)."""
    ya, yb = _grid(a), _grid(b)
    if ya.shape != yb.shape:
        raise ValueError(f"a and b need the same seeds, items and fits, got shapes {ya.shape} and {yb.shape}")
    return Budget(components(ya - yb), components(ya), components(yb))


def items_budget(a: Mapping[int, Sequence[float]], b: Mapping[int, Sequence[float]] | float) -> Budget:
    """The budget of a - b from per-seed item lists (a gathered cell's ``items``: seed -> per-test-item values, one
    probe fit), or of a against a constant `b` (a slope against 0: the difference's components are a's). The seeds
    must match and every seed must score the same number of items."""
    seeds = sorted(a)
    if not isinstance(b, Mapping):
        return Budget(components(_grid([a[s] for s in seeds]) - float(b)))
    if sorted(b) != seeds:
        raise ValueError(f"a and b need the same seeds, got {seeds} and {sorted(b)}")
    return budget([a[s] for s in seeds], [b[s] for s in seeds])


def mean_variance(b: Budget | Components, seeds: int, items: int, fits: int = 1, paired: bool = True) -> float:
    """Variance of the estimated mean difference under a design of `seeds` seeds (per model), `items` test items
    (shared by every seed and model) and `fits` probe fits per seed (module docstring)."""
    if seeds < 1 or items < 1 or fits < 1:
        raise ValueError(f"a design needs >= 1 seed, item and fit, got {seeds}, {items}, {fits}")
    diff = b if isinstance(b, Components) else b.difference
    if paired:
        return _own(diff, seeds, items, fits) + diff.item / items
    if isinstance(b, Components) or b.a is None or b.b is None:
        raise ValueError("an unpaired design needs each model's components (budget(a, b)), not only the difference's")
    return _own(b.a, seeds, items, fits) + _own(b.b, seeds, items, fits) + diff.item / items


def _own(c: Components, s: int, i: int, f: int) -> float:
    """The terms of a mean over s seeds, i items and f fits that are not shared with the other model."""
    return c.seed / s + c.seed_item / (s * i) + c.fit / (s * f) + c.residual / (s * i * f)


def budget_markdown(b: Budget, unit: str = "points") -> str:
    """The table docs/evidence.md shows: per component its variance (unit squared) and its share of one seed's
    variance, for the difference (and each side when known); flagged and confounded components marked."""
    rows = [("difference", b.difference)] + [(n, c) for n, c in (("a", b.a), ("b", b.b)) if c is not None]
    lines = [f"| quantity | mean | {' | '.join(COMPONENTS)} | seeds x items x fits |",
             "|---|---|" + "---|" * len(COMPONENTS) + "---|"]
    for name, c in rows:
        shares = c.shares()
        cells = []
        for k in COMPONENTS:
            mark = " (0: truncated)" if k in c.truncated else " (not separable)" if k in c.confounded else ""
            cells.append(f"{getattr(c, k):.4g} ({100 * shares[k]:.0f}%){mark}")
        lines.append(f"| {name} | {c.mean:+.3g} | " + " | ".join(cells) + f" | {c.n_seeds} x {c.n_items} x "
                     f"{c.n_fits} |")
    lines.append(f"\nVariances in {unit} squared; in brackets each one's share of one seed's variance (the item "
                 "term divided by the items, the others as they enter one seed's mean). Method: "
                 f"{b.difference.method}.")
    return "\n".join(lines)


def standard_error(b: Budget | Components, seeds: int, items: int, fits: int = 1, paired: bool = True) -> float:
    """The square root of :func:`mean_variance`."""
    return math.sqrt(mean_variance(b, seeds, items, fits, paired))
