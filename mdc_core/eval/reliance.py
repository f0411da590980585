"""Visual reliance along the caption: normalisation, per-caption slopes, binned profiles (torch-free).

The scores come from :mod:`mdc_core.eval.visual_reliance`: for caption b and its caption position i (0 = the first
token after ``<sot>``; ``<eot>`` is not scored) the *visual reliance*

    rel[b][i] = log p(token | true image) - log p(token | reference image)     (nats; > 0: the image helps)

with the reference a mismatched image (or a blank one). This module turns them into the test of the paper's
central argument:

* **Normalisation.** Each model's reliances are divided by its *mean reliance* ``m`` (over every scored token of
  every caption evaluated, all groups together), so two models whose overall visual signal differs compare on
  the shape of their profile, not on raw nats. A model whose mean reliance is not resolved above 0 (the lower
  end of its 95% bootstrap interval <= 0: it does not measurably use the image) has no shape to compare: its
  normalised values are None (dividing by a mean near 0 would blow its noise up to any size).
* **Relative position.** Token i of a caption with K tokens stands at ``x = i / (K - 1)`` (0 = first, 1 = last).
* **Per-caption slope.** The least-squares slope of the caption's normalised reliance against x over its scored
  tokens (units: the model's mean reliance per caption length; -1 = the reliance falls by the model's mean from
  the first to the last token; < 0: it falls). None for captions with fewer than two scored tokens.
* **Binned profile.** Per caption, the mean normalised reliance of its tokens in each of `bins` equal bins of x;
  per bin the mean over the captions with a token there.
* **Intervals.** 95% percentile bootstrap over captions, resampled within each caption group, with ``m``
  recomputed in every resample (the normaliser is estimated from the same captions). Differences between runs are
  paired (the same resampled captions for both).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

CONFIDENCE = 0.95
N_BOOT = 2000
DEFAULT_BINS = 5
SLOPE_UNITS = ("per-caption least-squares slope of visual reliance against relative caption position (0 = first "
               "token, 1 = last), reliance in units of the model's mean reliance (< 0: it falls along the caption)")

Reliance = Sequence[float | None]  # one caption: reliance per caption position (None: position not scored)


def relative_positions(length: int) -> np.ndarray:
    """x = i / (K - 1) for the K tokens of a caption (a one-token caption: [0.0])."""
    if length < 1:
        raise ValueError(f"a caption has at least one token, got length {length}")
    return np.zeros(1) if length == 1 else np.arange(length) / (length - 1)


def _scored(values: Reliance) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of the scored positions of one caption."""
    x = relative_positions(len(values)) if values else np.zeros(0)
    keep = np.array([v is not None and math.isfinite(v) for v in values], dtype=bool)
    y = np.array([v if k else 0.0 for v, k in zip(values, keep, strict=True)], dtype=float)
    return x[keep], y[keep]


def caption_slope(values: Reliance) -> float | None:
    """Least-squares slope of a caption's values against its relative positions; None with < 2 scored tokens."""
    x, y = _scored(values)
    if len(x) < 2:
        return None
    dx = x - x.mean()
    return float((dx * (y - y.mean())).sum() / (dx * dx).sum())


def mean_reliance(captions: Sequence[Reliance]) -> float:
    """The model's mean reliance: the mean over every scored token of every caption (NaN when none is scored)."""
    total, count = 0.0, 0
    for values in captions:
        y = _scored(values)[1]
        total, count = total + float(y.sum()), count + len(y)
    return total / count if count else math.nan


def binned(values: Reliance, bins: int = DEFAULT_BINS) -> list[float | None]:
    """Mean of a caption's scored values in each of `bins` equal bins of relative position (None: empty bin)."""
    x, y = _scored(values)
    which = np.minimum((x * bins).astype(int), bins - 1)
    return [float(y[which == k].mean()) if (which == k).any() else None for k in range(bins)]


def bin_centres(bins: int = DEFAULT_BINS) -> list[float]:
    return [(k + 0.5) / bins for k in range(bins)]


def _caption_arrays(captions: Sequence[Reliance], bins: int) -> dict[str, np.ndarray]:
    """Per caption: sum and count of scored values, raw slope (NaN: none), raw bin means (NaN: empty)."""
    sums, counts, slopes, profile = [], [], [], []
    for values in captions:
        y = _scored(values)[1]
        sums.append(float(y.sum()))
        counts.append(len(y))
        s = caption_slope(values)
        slopes.append(math.nan if s is None else s)
        profile.append([math.nan if v is None else v for v in binned(values, bins)])
    return {"sum": np.array(sums, dtype=float), "count": np.array(counts, dtype=float),
            "slope": np.array(slopes, dtype=float), "bins": np.array(profile, dtype=float).reshape(-1, bins)}


def _interval(samples: np.ndarray, confidence: float) -> tuple[float | None, float | None]:
    samples = samples[np.isfinite(samples)]
    if samples.size == 0:
        return None, None
    tail = (1 - confidence) / 2
    low, high = np.quantile(samples, [tail, 1 - tail])
    return float(low), float(high)


def _resamples(groups: Sequence[str], n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, n) caption indices, each resample drawn with replacement within every group (sizes kept)."""
    rng = np.random.default_rng(seed)
    labels = np.asarray(groups, dtype=object)
    out = np.empty((n_boot, len(labels)), dtype=int)
    for g in dict.fromkeys(groups):
        members = np.flatnonzero(labels == g)
        out[:, members] = members[rng.integers(0, len(members), size=(n_boot, len(members)))]
    return out


def _nanmean(a: np.ndarray, axis: int) -> np.ndarray:
    n = np.isfinite(a).sum(axis=axis)
    total = np.where(np.isfinite(a), a, 0.0).sum(axis=axis)
    return np.where(n > 0, total / np.maximum(n, 1), np.nan)


def summarise_runs(runs: Sequence[Sequence[Reliance]], groups: Sequence[str], *, bins: int = DEFAULT_BINS,
                   n_boot: int = N_BOOT, seed: int = 0, confidence: float = CONFIDENCE,
                   contrast: tuple[str, str] | None = None) -> dict[str, Any]:
    """Normalised slopes and profiles of several runs scored on the same captions (module docstring).

    `runs`: per run, per caption its reliances; `groups`: each caption's group (e.g. ``predictable``). Returns
    ``{"groups": [group names], "runs": [{"mean_reliance", "mean_reliance_interval", "normalised" (bool: the mean
    is resolved above 0), "slopes": per caption (normalised,
    None where undefined), "slope": {group: {"mean", "low", "high", "n"}}, "profile": {group: {"mean", "low",
    "high", "n"}}} per run], "differences": {group: [{"run", "minus", "mean", "low", "high", "n"}]}, "bins",
    "bin_centres"}``; a difference is each later run minus the first, paired by caption. With ``contrast = (a, b)``
    (two group names) also ``"contrasts"``: per run its slope on group a minus on group b, and per later run that
    contrast minus the first run's (the interaction: is the fall specific to group a more for one model?), each
    ``{"run", "minus" (None for a run's own contrast), "groups", "mean", "low", "high"}``.
    """
    n = len(groups)
    if not runs or any(len(r) != n for r in runs):
        raise ValueError(f"every run needs a reliance list for each of the {n} captions")
    if n == 0:
        raise ValueError("no caption to summarise")
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    names = list(dict.fromkeys(groups))
    labels = np.asarray(groups, dtype=object)
    idx = _resamples(groups, n_boot, seed)  # shared by all runs: paired differences
    summaries = [_summarise_run(_caption_arrays(r, bins), idx, labels, names, bins, confidence) for r in runs]
    out_runs = [run for run, _ in summaries]
    boot_slopes = [boot for _, boot in summaries]
    out = {"groups": names, "runs": out_runs, "differences": _differences(out_runs, boot_slopes, labels, names,
                                                                          confidence),
           "bins": bins, "bin_centres": bin_centres(bins), "confidence": confidence, "n_boot": n_boot}
    if contrast is not None and all(g in names for g in contrast):
        out["contrasts"] = _contrasts(out_runs, boot_slopes, contrast, confidence)
    return out


def _summarise_run(arr: dict[str, np.ndarray], idx: np.ndarray, labels: np.ndarray, names: Sequence[str],
                   bins: int, confidence: float) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """One run's entry of :func:`summarise_runs` and its bootstrap slopes per group ({group: (n_boot,)})."""
    m = float(arr["sum"].sum() / arr["count"].sum()) if arr["count"].sum() else math.nan
    m_boot = arr["sum"][idx].sum(axis=1) / np.maximum(arr["count"][idx].sum(axis=1), 1)  # (n_boot,)
    m_low, m_high = _interval(m_boot, confidence)
    ok = math.isfinite(m) and m > 0 and m_low is not None and m_low > 0
    m_boot = np.where(m_boot > 0, m_boot, np.nan)
    run: dict[str, Any] = {"mean_reliance": m, "mean_reliance_interval": [m_low, m_high], "normalised": ok,
                           "slopes": [None if not ok or math.isnan(s) else float(s / m) for s in arr["slope"]],
                           "slope": {}, "profile": {}}
    per_group: dict[str, np.ndarray] = {}
    for g in names:
        members = labels == g
        cols = idx[:, members]  # (n_boot, n_g) resampled captions of this group
        slopes, prof = arr["slope"][members], arr["bins"][members]
        per_group[g] = _nanmean(arr["slope"][cols], axis=1) / m_boot
        if not ok:
            run["slope"][g] = {"mean": None, "low": None, "high": None, "n": int(np.isfinite(slopes).sum())}
            run["profile"][g] = {"mean": [None] * bins, "low": [None] * bins, "high": [None] * bins,
                                 "n": np.isfinite(prof).sum(axis=0).tolist()}
            continue
        low, high = _interval(per_group[g], confidence)
        mean = _nanmean(slopes[None], axis=1)[0] / m
        run["slope"][g] = {"mean": None if math.isnan(mean) else float(mean), "low": low, "high": high,
                           "n": int(np.isfinite(slopes).sum())}
        prof_boot = _nanmean(arr["bins"][cols], axis=1) / m_boot[:, None]  # (n_boot, bins)
        bounds = [_interval(prof_boot[:, k], confidence) for k in range(bins)]
        centre = _nanmean(prof, axis=0) / m
        run["profile"][g] = {"mean": [None if math.isnan(v) else float(v) for v in centre],
                             "low": [b[0] for b in bounds], "high": [b[1] for b in bounds],
                             "n": np.isfinite(prof).sum(axis=0).tolist()}
    return run, per_group


def _differences(out_runs: Sequence[dict[str, Any]], boot_slopes: Sequence[dict[str, np.ndarray]],
                 labels: np.ndarray, names: Sequence[str], confidence: float) -> dict[str, list[dict[str, Any]]]:
    """Each later run's normalised slope minus the first run's, per group, paired by caption."""
    differences: dict[str, list[dict[str, Any]]] = {g: [] for g in names}
    for j in range(1, len(out_runs)):
        if not (out_runs[j]["normalised"] and out_runs[0]["normalised"]):
            continue
        for g in names:
            a, b = out_runs[j]["slope"][g]["mean"], out_runs[0]["slope"][g]["mean"]
            if a is None or b is None:
                continue
            low, high = _interval(boot_slopes[j][g] - boot_slopes[0][g], confidence)
            differences[g].append({"run": j, "minus": 0, "mean": a - b, "low": low, "high": high,
                                   "n": int((labels == g).sum())})
    return differences


def _contrasts(out_runs: Sequence[dict[str, Any]], boot_slopes: Sequence[dict[str, np.ndarray]],
               contrast: tuple[str, str], confidence: float) -> list[dict[str, Any]]:
    """Per run its slope on group a minus on group b, and per later run that contrast minus the first run's."""
    a, b = contrast
    own = [boot[a] - boot[b] for boot in boot_slopes]
    means = [None if r["slope"][a]["mean"] is None or r["slope"][b]["mean"] is None
             else r["slope"][a]["mean"] - r["slope"][b]["mean"] for r in out_runs]
    rows = []
    for j, mean in enumerate(means):
        if mean is not None:
            rows.append({"run": j, "minus": None, "groups": [a, b], "mean": mean,
                         **dict(zip(("low", "high"), _interval(own[j], confidence), strict=True))})
        if j and mean is not None and means[0] is not None:
            rows.append({"run": j, "minus": 0, "groups": [a, b], "mean": mean - means[0],
                         **dict(zip(("low", "high"), _interval(own[j] - own[0], confidence), strict=True))})
    return rows


def slope_table(slopes: Sequence[Sequence[float | None]], groups: Sequence[str], rows: Sequence[str]
                ) -> dict[str, Any]:
    """The ``reliance_slope`` table of a notebook's metrics.json: rows = runs (`rows` names them), columns = caption
    groups, value = mean normalised slope, items = the per-caption slopes in caption order. Captions whose slope
    any run lacks are left out of every row, so the rows' items pair up caption by caption. Runs whose slopes
    are all None (no normalisation possible) are left out."""
    if len(slopes) != len(rows):
        raise ValueError(f"{len(slopes)} runs of slopes but {len(rows)} row names")
    kept = [(name, s) for name, s in zip(rows, slopes, strict=True) if any(v is not None for v in s)]
    values: dict[str, dict[str, float]] = {name: {} for name, _ in kept}
    items: dict[str, dict[str, list[float]]] = {name: {} for name, _ in kept}
    for g in dict.fromkeys(groups):
        keep = [i for i, gi in enumerate(groups) if gi == g and all(s[i] is not None for _, s in kept)]
        if not keep:
            continue
        for name, s in kept:
            col = [float(s[i]) for i in keep]  # type: ignore[arg-type]
            items[name][g] = col
            values[name][g] = sum(col) / len(col)
    return {"metric": f"reliance slope: {SLOPE_UNITS}; mean over captions",
            "values": {k: v for k, v in values.items() if v}, "items": {k: v for k, v in items.items() if v}}


# ----------------------------------------------------------------------------------------------------------
# the caption split, checked on the text alone


def clause_text_check(facts: Sequence[tuple[str, Sequence[dict[str, str]]]]) -> dict[str, Any]:
    """How predictable each clause's scene words are from the words before them, from caption text alone.

    `facts`: per caption (group, [facts of clause 1, facts of clause 2]) as
    :func:`mdc_core.data.captions.parse_clause_caption` reads them (fact -> word). Per group and clause:
    ``restated`` the share of the clause's scene words that repeat the word of the same fact in the earlier
    clause (a deterministic continuation), and ``entropy_bits`` the plug-in conditional entropy of a word given
    its fact and the earlier clause's word for that fact (if it names one): 0 bits means the earlier words
    determine it; about the fact's marginal entropy means they say nothing about it.
    """
    out: dict[str, Any] = {}
    by_group: dict[str, list[Sequence[dict[str, str]]]] = defaultdict(list)
    for group, clauses in facts:
        by_group[group].append(clauses)
    for group, captions in by_group.items():
        out[group] = {"captions": len(captions)}
        for c, clause in enumerate(("first", "second")):
            contexts: dict[tuple[str, str | None], Counter[str]] = defaultdict(Counter)
            restated = total = 0
            for clauses in captions:
                earlier = clauses[0] if c == 1 else {}
                for fact, word in clauses[c].items():
                    contexts[(fact, earlier.get(fact))][word] += 1
                    restated += earlier.get(fact) == word
                    total += 1
            bits = 0.0
            for counter in contexts.values():
                k = sum(counter.values())
                bits += sum(-v * math.log2(v / k) for v in counter.values())
            out[group][clause] = {"words": total, "restated": restated / total if total else None,
                                  "entropy_bits": bits / total if total else None}
    return out
