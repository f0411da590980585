"""Compositionality as pick-the-true-caption accuracy (paper Sec. 4.2, Table 2).

For every example (:class:`~mdc_workbench.eval.composition_sets.Example`) the image is encoded once and all its
candidate captions (the true one and every false one) are scored in one batch; the example is correct for a task when
the true caption scores strictly higher than each false caption of that task (ties count as wrong).

Scores by objective family (:data:`SCORING`, read through the objective's spec's ``family``):

* captioners trained with a masked objective (MDC, MDC w/o 1/t, BERT, parallel): ``mc`` (Monte Carlo ELBO of
  Eq. 8) and ``heuristic`` (the paper's greedy-order score) by default; ``ar`` (fixed left-to-right order) on
  request. All come from :func:`mdc_core.scoring.score_tokens`.
* ARC: ``ar``, the exact chain rule (Eq. 7).
* CLIP: ``cosine``, the cosine similarity of the image and caption embeddings.

Two controls show which columns a model can pass without looking at the image. The **blind** rows score the same
captions with the image replaced by the mean image (every pixel the CLIP mean colour, i.e. an all-zero input
tensor): a column a blind model passes measures a caption prior, not grounding (e.g. SugarCrepe's "add" negatives
are longer than the truth, and a likelihood prefers shorter text, so even an untrained model passes them). The
**per-token** rows (``length_norm``) divide every likelihood score by the caption's number of tokens, which
removes that length preference (cosine scores are not length-sums and get no per-token row).

A caption a model cannot represent (longer than its context, or, for a corpus-vocabulary model, holding a word
outside its corpus) is never guessed: when it is the true caption the example is left out (counted under
``skipped[reason]``); when it is a false caption, only the tasks it belongs to are left out for that example
(``skipped["<task>/<reason>"]``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from mdc_core.config import RunConfig
from mdc_core.registry import objective_spec
from mdc_core.tokenizer import CaptionTokenizer
from mdc_workbench.eval.composition_sets import COLUMN_ORDER, COLUMNS, Example, example_pixels, load_benchmark

# objective family -> (the caption scores that apply to it, the ones run by default)
SCORING: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "masked": (("mc", "heuristic", "ar"), ("mc", "heuristic")),
    "causal": (("ar",), ("ar",)),
    "contrastive": (("cosine",), ("cosine",)),
}
MASKED_METHODS = SCORING["masked"][0]  # the likelihood scores ("mc", "heuristic", "ar")
METHOD_LABELS = {"mc": "Monte Carlo", "heuristic": "Heuristic", "ar": "left-to-right", "cosine": ""}


def check_methods(objective: str, methods: Sequence[str] | None) -> tuple[str, ...]:
    """The methods to run for a model of `objective`: its defaults when `methods` is None or empty; a method
    that does not apply to the objective (e.g. ``ar`` on a CLIP run) is a ValueError."""
    spec = objective_spec(objective)
    allowed, default = SCORING[spec.family]
    if not methods:
        return default
    bad = [m for m in methods if m not in allowed]
    if bad:
        raise ValueError(f"method(s) {', '.join(bad)} do not apply to a {spec.display(objective)} "
                         f"run (objective {objective!r}); it can be scored with: {', '.join(allowed)}")
    return tuple(dict.fromkeys(methods))


def row_label(objective: str, method: str, cfg: RunConfig | None = None, *, blind: bool = False,
              per_token: bool = False) -> str:
    """Table 2 row name, e.g. "MDC (Heuristic)", "ARC", "CLIP", "BERT r=0.15 (Monte Carlo)"; the controls add
    "per token" and "blind" (e.g. "MDC (Monte Carlo, per token), blind")."""
    spec = objective_spec(objective)
    name = spec.display(objective)
    if spec.schedule is not None and cfg is not None:
        name += spec.schedule.label_suffix(cfg.objective)  # BERT's " r=0.15"
    detail = [METHOD_LABELS[method]] if spec.family == "masked" else []
    detail += ["per token"] if per_token else []
    name += f" ({', '.join(detail)})" if detail else ""
    return name + (", blind" if blind else "")


def unscorable(model: torch.nn.Module, tokenizer: CaptionTokenizer, caption: str) -> str | None:
    """Why `caption` cannot be scored by `model` ("empty_caption", "too_long", "out_of_vocabulary"), or None."""
    ids = tokenizer.encode_text(caption)
    if not ids:
        return "empty_caption"
    if len(ids) > tokenizer.context_length - 2:
        return "too_long"
    index = getattr(model, "input_index", None) if getattr(model, "restricted", False) else None
    if index is not None and bool((index[torch.tensor(ids, device=index.device)] < 0).any()):
        return "out_of_vocabulary"
    return None


# ----------------------------------------------------------------------------------------------------------
# scorers: (model, image (1, 3, S, S), captions, tokens (C, L), image_tokens (1, M, D) or None, options)
#   -> (scores (C,), standard errors (C,) or None)

Scorer = Callable[..., tuple[list[float], list[float] | None]]


def _cosine(model: Any, image: torch.Tensor, captions: list[str], tokens: torch.Tensor, **_: Any
            ) -> tuple[list[float], None]:
    img = F.normalize(model.embed_image(image), dim=-1)  # (1, E)
    txt = F.normalize(model.encode_text(tokens), dim=-1)  # (C, E)
    return (txt @ img[0]).tolist(), None


def _likelihood(method: str) -> Scorer:
    def score(model: Any, image: torch.Tensor, captions: list[str], tokens: torch.Tensor, *,
              image_tokens: torch.Tensor, samples: int, seed: int, **_: Any) -> tuple[list[float], list[float] | None]:
        from mdc_core.scoring import score_tokens
        out = score_tokens(model, image_tokens, tokens, method, samples=samples, seed=seed)
        return out.score.tolist(), (out.stderr.tolist() if out.stderr is not None else None)
    return score


SCORERS: dict[str, Scorer] = {"cosine": _cosine, **{m: _likelihood(m) for m in MASKED_METHODS}}


# ----------------------------------------------------------------------------------------------------------
# evaluation


@torch.no_grad()
def evaluate_model(model: torch.nn.Module, cfg: RunConfig, examples: Sequence[Example],
                   methods: Sequence[str] | None = None, *, samples: int = 1024, seed: int = 0,
                   device: str | torch.device = "cpu", run_name: str = "", progress: bool = True,
                   blind: bool = False, length_norm: bool = False) -> list[dict[str, Any]]:
    """Pick-the-true-caption accuracy of one model on `examples`, one result dict per method (and, with
    `length_norm`, one more per likelihood method: the scores divided by each caption's token count). `blind`
    replaces every image by the mean image (all-zero input).

    Each result: ``run``, ``objective``, ``method``, ``label`` (Table 2 row), ``tasks`` (task -> ``correct``,
    ``n``, ``accuracy``), ``columns`` (Table 2 column -> accuracy, SugarCrepe sub-tasks averaged),
    ``n_examples``, ``skipped`` (reason -> examples left out), ``seconds`` and ``examples`` (per example: ``key``,
    ``captions`` (the true one first), ``scores``, ``stderr`` for ``mc``, ``correct`` per task); ``blind`` and
    ``per_token`` say which control a result is.
    """
    objective = cfg.objective.name
    methods = check_methods(objective, methods)
    contrastive = objective_spec(objective).family == "contrastive"
    model = model.to(device).eval()
    tokenizer = CaptionTokenizer(cfg.model.context_length)
    rows = [(m, False) for m in methods] + [(m, True) for m in methods if length_norm and m != "cosine"]
    tallies = {row: {"tasks": {}, "examples": [], "seconds": 0.0} for row in rows}
    skipped: dict[str, int] = {}
    for ex in tqdm(examples, desc=f"scoring {run_name or objective}", unit="ex", disable=not progress):
        captions, tasks = ex.candidates()
        reasons = [unscorable(model, tokenizer, c) for c in captions]
        if reasons[0] or not tasks:  # the true caption itself cannot be scored: the whole example goes
            reason = reasons[0] or "no_negative"
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        for task in [t for t, idx in tasks.items() if any(reasons[i] for i in idx)]:  # only this task goes
            reason = f"{task}/{next(reasons[i] for i in tasks.pop(task) if reasons[i])}"
            skipped[reason] = skipped.get(reason, 0) + 1
        if not tasks:
            continue
        keep = sorted({0, *(i for idx in tasks.values() for i in idx)})
        where = {old: new for new, old in enumerate(keep)}
        captions = [captions[i] for i in keep]
        tasks = {t: [where[i] for i in idx] for t, idx in tasks.items()}
        image = example_pixels(ex, cfg.model.image_size)[None].to(device)  # (1, 3, S, S)
        if blind:
            image = torch.zeros_like(image)  # the mean image: every pixel the CLIP mean colour, normalised
        tokens = tokenizer(captions, truncate=False).to(device)  # (C, L)
        n_tokens = [len(tokenizer.encode_text(c)) for c in captions]
        image_tokens = model.encode_image(image) if not contrastive else None  # once per example
        for method in methods:
            start = time.perf_counter()
            scores, stderr = SCORERS[method](model, image, captions, tokens, image_tokens=image_tokens,
                                             samples=samples, seed=seed)
            tallies[(method, False)]["seconds"] += time.perf_counter() - start
            _tally(tallies[(method, False)], ex.key, captions, tasks, scores, stderr)
            if (method, True) in tallies:  # the same scores per token: no extra model call
                per = [s / n for s, n in zip(scores, n_tokens, strict=True)]
                per_err = None if stderr is None else [e / n for e, n in zip(stderr, n_tokens, strict=True)]
                _tally(tallies[(method, True)], ex.key, captions, tasks, per, per_err)
    results = []
    for (method, per_token), tally in tallies.items():
        task_acc = {k: {**v, "accuracy": v["correct"] / v["n"]} for k, v in sorted(tally["tasks"].items())}
        results.append({
            "run": run_name, "objective": objective, "method": method, "blind": blind, "per_token": per_token,
            "label": row_label(objective, method, cfg, blind=blind, per_token=per_token),
            "tasks": task_acc, "columns": column_accuracies(task_acc), "n_examples": len(tally["examples"]),
            "skipped": dict(skipped), "seconds": round(tally["seconds"], 3),
            "settings": {"samples": samples, "seed": seed} if method == "mc" else {},
            "examples": tally["examples"],
        })
    return results


def _tally(tally: dict[str, Any], key: str, captions: list[str], tasks: dict[str, list[int]], scores: list[float],
           stderr: list[float] | None) -> None:
    """Count one example into `tally`: a task is correct when the true caption (index 0) beats each negative."""
    correct = {task: all(scores[0] > scores[i] for i in idx) for task, idx in tasks.items()}
    for task, ok in correct.items():
        t = tally["tasks"].setdefault(task, {"correct": 0, "n": 0})
        t["correct"] += int(ok)
        t["n"] += 1
    record = {"key": key, "captions": captions, "scores": scores, "correct": correct}
    if stderr is not None:
        record["stderr"] = stderr
    tally["examples"].append(record)


def column_accuracies(tasks: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Table 2 column -> accuracy: the unweighted mean of its tasks' accuracies (SugarCrepe's add = mean of
    add_obj and add_att, replace of its three sub-tasks, swap of its two), in :data:`COLUMN_ORDER`."""
    groups: dict[str, list[float]] = {}
    for task, t in tasks.items():
        column = COLUMNS.get(task, ("", task))[1]
        groups.setdefault(column, []).append(t["accuracy"])
    order = {c: i for i, c in enumerate(COLUMN_ORDER)}
    return {c: sum(v) / len(v) for c, v in sorted(groups.items(), key=lambda kv: order.get(kv[0], len(order)))}


def compositionality_table(results: Sequence[dict[str, Any]]) -> str:
    """A markdown table like the paper's Table 2 (accuracy in %): one row per (run, method) result, one column
    per Table 2 column any result has. Results of several benchmarks for the same run and method are merged
    into one row, so the JSON of separate ``mdc eval compositionality`` calls can be combined."""
    rows: dict[tuple[str, str, bool, bool], dict[str, Any]] = {}
    for r in results:
        key = (r["run"], r["method"], r.get("per_token", False), r.get("blind", False))
        row = rows.setdefault(key, {"label": r["label"], "run": r["run"], "cols": {}, "n": {}})
        row["cols"].update(r["columns"])
    present = {c for row in rows.values() for c in row["cols"]}
    columns = [c for c in COLUMN_ORDER if c in present] + sorted(present - set(COLUMN_ORDER))
    group = {c: g for g, c in COLUMNS.values()}
    head = ["method", "run", *(f"{group.get(c, '')} {c}".strip() for c in columns)]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * len(columns)]  # as many cells as the header
    for row in rows.values():
        cells = [row["label"], row["run"], *(f"{100 * row['cols'][c]:.1f}" if c in row["cols"] else "-"
                                             for c in columns)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def compositionality(runs: Sequence[str | Path], benchmark: str, data: str | Path, *,
                     methods: Sequence[str] | None = None, samples: int = 1024, limit: int | None = None,
                     images: str | Path | None = None, split: str = "test", seed: int = 0,
                     device: str = "cpu", progress: bool = True, blind: bool = True,
                     length_norm: bool = False) -> dict[str, Any]:
    """Evaluate every run on one benchmark. `methods` (None: each run's defaults) must apply to every run.
    `blind` also scores every run with the mean image (rows "..., blind"); `length_norm` adds per-token rows.

    Returns ``{"benchmark", "data", "n_examples", "results": [per run and method, see evaluate_model],
    "blind": [the same with the mean image], "table": markdown (results, then blind rows)}``.
    """
    from mdc_core.factory import load_model
    if not runs:
        raise ValueError("no run given: pass at least one --run RUN")
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    loaded = []
    for run in runs:  # check every run's methods before any scoring starts
        model, cfg = load_model(run, device=device)
        check_methods(cfg.objective.name, methods)
        loaded.append((run, model, cfg))
    examples = load_benchmark(benchmark, data, images=images, limit=limit, split=split, seed=seed)
    results: list[dict[str, Any]] = []
    blind_results: list[dict[str, Any]] = []
    for run, model, cfg in loaded:
        for is_blind, out in ((False, results), (True, blind_results)) if blind else ((False, results),):
            out += evaluate_model(model, cfg, examples, methods, samples=samples, seed=seed, device=device,
                                  run_name=str(run), progress=progress, blind=is_blind, length_norm=length_norm)
    for r in results + blind_results:
        r["benchmark"] = benchmark
    return {"benchmark": benchmark, "data": str(data), "n_examples": len(examples), "results": results,
            "blind": blind_results, "table": compositionality_table(results + blind_results)}
