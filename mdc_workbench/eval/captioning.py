"""Captioning evaluation (paper Sec. 4.2, Table 3): optional fine-tuning, then caption the test split.

* Fine-tuning (:func:`mdc_workbench.eval.finetune.finetune`) continues a run on a caption data set with
  :func:`mdc_core.train.train`: the run's own config (objective, optimizer, batch size ...) with ``data.path`` set to
  the new data, a fresh optimizer and schedule of ``steps`` steps (warm-up cut to at most a tenth of them), starting
  from the run's weights (``train(..., init_from=run)``). The fine-tuned run is an ordinary run folder under
  ``<out>/finetune/`` named after the run, the steps and :func:`~mdc_workbench.eval.finetune.finetune_key` (the source
  run's weights, the fine-tuning data's fingerprint and the fine-tuning config), which ``finetune_source.json`` in it
  records: an existing one of the same key that is complete is reused, an unfinished one is resumed; a folder made
  from anything else is never reused.
* Decoding: MDC-family captioners by greedy confidence unmasking (:func:`mdc_core.sampler.sample`) at each fixed
  length N' (10 / 15 / 20 in the paper) and at lengths taken from the test set (:data:`LENGTH_MODES`):
  ``median`` (the test captions' median token length, one N' for all), ``oracle`` (each image at its own
  reference's length: information ARC does not get), ``auto`` (MDC picks its own length,
  :func:`mdc_core.scoring.sample_auto_length`) and ``arc`` (each image at the length of ARC's beam-search caption of
  it: the matched length, so MDC and ARC write equally many tokens per image; needs an ARC run among the runs, which is
  decoded first); ARC by greedy and beam search (beam 6 in the paper, :mod:`mdc_core.ar_decode`). CLIP cannot
  caption. The paper calls MDC-N vs ARC "not directly comparable" (MDC is told the length) and claims no order,
  so :func:`table3` keeps the lengths apart and the workbench reports every row descriptively (no verdict).
* Metrics: :func:`mdc_workbench.eval.caption_metrics.caption_metrics` (pycocoevalcap with its PTB tokenizer; a
  metric that cannot run, such as SPICE without its jars, is reported unavailable; one METEOR process serves every
  decoder), the repetition rate (:func:`mdc_workbench.eval.repetition.repetition_rate`: the fraction of captions that
  repeat a word) and the mean caption length in tokens.

Data (``data`` / ``finetune_data``): a Karpathy split json (``dataset_coco.json``: ``images[].split``,
``filename``, ``sentences[].raw``; fine-tuning reads ``train`` + ``restval``, evaluation ``test``), a COCO caption
json (e.g. from :func:`mdc_workbench.data.export_coco`; it has no splits, so fine-tuning needs its own file), a
CSV/TSV, or the embedded data set folder (``train/`` and ``test/`` shards; references of a test image are its
short and long captions).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from mdc_core.config import RunConfig, SamplerConfig
from mdc_core.registry import objective_spec
from mdc_core.sources import iter_shard_records, resolve_source
from mdc_core.tokenizer import EOT_ID, SOT_ID, CaptionTokenizer
from mdc_workbench.eval.caption_metrics import ALL_METRICS, MeteorSession, score_captions
from mdc_workbench.eval.composition_sets import image_pixels
from mdc_workbench.eval.finetune import FINETUNE_SOURCE, _has_splits, finetune, finetune_key  # noqa: F401 - its names
from mdc_workbench.eval.repetition import repeated_words, repetition_rate

PAPER_LENGTHS = (10, 15, 20)
PAPER_BEAM = 6
LENGTH_MODES = ("median", "oracle", "auto", "arc")  # MDC lengths taken from the test set or ARC (module docstring)
AUTO_RANGE = "3-20"  # N' tried by the auto length
TABLE3_METRICS = (("B@4", "BLEU@4"), ("M", "METEOR"), ("C", "CIDEr"), ("S", "SPICE"), ("RL", "ROUGE-L"))
# % of captions repeating a word (mdc_workbench.eval.repetition); not in the paper
REPETITION = ("Rep", "repetition_rate")
ITEM_METRICS = ("ROUGE-L", "CIDEr")  # per-image scores that average to the corpus score (bootstrap items)


@dataclass(frozen=True)
class CaptionItem:
    """One test image and its reference captions."""

    key: str
    image: str | bytes  # file path, or encoded bytes (embedded data shards)
    references: tuple[str, ...]
    caption: str = ""  # the image's own caption where the data set has one (embedded data: in its caption style)


def _round_half_up(x: float) -> int:
    return int(np.floor(x + 0.5))


def reference_lengths(items: Sequence[CaptionItem], tokenizer: CaptionTokenizer) -> list[int]:
    """Per image, the token length of its reference: its own caption where it has one (the embedded data, whose
    references also hold the other caption style), else the median over its references; at least 1, at most
    the tokenizer's context - 2."""
    limit = tokenizer.context_length - 2
    out = []
    for it in items:
        texts = [it.caption] if it.caption else list(it.references)
        n = _round_half_up(float(np.median([len(tokenizer.encode_text(t)) for t in texts])))
        out.append(min(max(n, 1), limit))
    return out


def load_caption_set(path: str | Path, split: str = "test", limit: int | None = None,
                     images: str | Path | None = None) -> list[CaptionItem]:
    """The images of `split` (one item per image, all its captions as references), in storage order; `images`:
    the image folder of a caption json or table (default: found, see :mod:`mdc_core.sources`)."""
    source = resolve_source(str(path), "auto", split, str(images) if images else None)
    items: list[CaptionItem] = []
    if source.kind == "wds":
        for rec in iter_shard_records(source.shards):
            if limit is not None and len(items) >= limit:
                break
            ext = next((e for e in ("jpg", "jpeg", "png", "webp") if e in rec), None)
            if "__skip__" in rec or ext is None:
                continue
            meta = json.loads(rec["json"]) if "json" in rec else {}
            refs = [meta.get("short_caption"), meta.get("long_caption")] if "short_caption" in meta else []
            refs = [r for r in refs if r] or [rec.get("txt", b"").decode("utf-8", "replace").strip()]
            own = meta.get("caption") or ""
            if any(refs):
                items.append(CaptionItem(rec["__key__"], rec[ext], tuple(dict.fromkeys(r for r in refs if r)), own))
        return items
    grouped: dict[str, list[str]] = {}
    for row in source.rows:
        caption = str(row["caption"]).strip()
        if caption:
            grouped.setdefault(row["image"], []).append(caption)
    names = [Path(image).name for image in grouped]
    unique = len(set(names)) == len(names)  # keys are file names, or full paths when names repeat
    for image, refs in list(grouped.items())[:limit]:
        items.append(CaptionItem(Path(image).name if unique else image, image, tuple(refs)))
    return items


# ----------------------------------------------------------------------------------------------------------
# decoding


def parse_lengths(values: Sequence[int | str]) -> list[int | str]:
    """MDC lengths: whole numbers N' and the names of :data:`LENGTH_MODES` (``"10"`` -> 10); ValueError else."""
    out: list[int | str] = []
    for v in values:
        text = str(v).strip()
        if text in LENGTH_MODES:
            out.append(text)
        elif text.isdigit() and int(text) >= 1:
            out.append(int(text))
        else:
            raise ValueError(f"caption length {v!r}: give a number of tokens N' or one of {', '.join(LENGTH_MODES)}")
    return out


def parse_range(text: str, context_length: int) -> list[int]:
    """``"LO-HI"`` (inclusive) or a comma list ``"5,10,15"`` -> lengths, each within the model's context."""
    try:
        if "-" in text:
            lo, hi = (int(v) for v in text.split("-", 1))
            lengths = list(range(lo, hi + 1))
        else:
            lengths = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as err:
        raise ValueError(f"caption length range must look like 3-20 or 5,10,15, got {text!r}") from err
    limit = context_length - 2
    if not lengths or min(lengths) < 1 or max(lengths) > limit:
        raise ValueError(f"caption lengths must lie in 1..{limit} (the model's context), got {text!r}")
    return sorted(set(lengths))


def decoders_for(objective: str, lengths: Sequence[int | str] = PAPER_LENGTHS, beam: int = PAPER_BEAM
                 ) -> list[str]:
    """Decoder names for a run: ``mdc-N`` per length (``mdc-median``, ``mdc-oracle``, ``mdc-auto``, ``mdc-arc``
    for the :data:`LENGTH_MODES`) for masked captioners; ``greedy`` and ``beam-B`` for left-to-right ones (ARC):
    the objective spec's decoder."""
    spec = objective_spec(objective)
    if spec.decoder == "none":
        raise ValueError(f"a {spec.display(objective)} run cannot caption images; captioning evaluates MDC-family "
                         "and ARC runs")
    if spec.decoder == "left_to_right":
        if beam < 1:
            raise ValueError(f"beam must be >= 1, got {beam}")
        return ["greedy"] + ([f"beam-{beam}"] if beam > 1 else [])
    if not lengths:
        raise ValueError("no caption length given (--lengths 10 15 20)")
    return [f"mdc-{n}" for n in parse_lengths(lengths)]


def _pad_rows(rows: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Rows of different lengths as one (B, T) tensor, filled with ``<eot>`` (where decoding stops)."""
    out = torch.full((len(rows), max(len(r) for r in rows)), EOT_ID, dtype=torch.long, device=device)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


@torch.no_grad()
def decode(model: torch.nn.Module, image_tokens: torch.Tensor, decoder: str, *, max_length: int | None = None,
           lengths: Sequence[int] | None = None, auto_range: str = AUTO_RANGE) -> torch.Tensor:
    """Caption ids (B, T) for image_tokens (B, M, D) with one decoder name of :func:`decoders_for`; ARC rows may
    hold ``<eot>`` and padding (the tokenizer's ``decode`` cuts them). `max_length`: ARC's most generated tokens,
    ``<eot>`` included (default: the context after ``<sot>``). `lengths`: per image N' for ``mdc-oracle`` and
    ``mdc-arc`` (images of one length are sampled together), and for ``mdc-median`` the length is ``lengths[0]``;
    `auto_range`: the N' that ``mdc-auto`` tries (``LO-HI`` or a list)."""
    kind, _, arg = decoder.partition("-")
    if kind == "mdc":
        from mdc_core.sampler import sample
        if arg == "auto":
            from mdc_core.scoring import sample_auto_length
            out = sample_auto_length(model, image_tokens, SamplerConfig(),
                                     parse_range(auto_range, model.cfg.context_length))
            return _pad_rows([out.tokens(i) for i in range(image_tokens.shape[0])], image_tokens.device)
        if arg in ("median", "oracle", "arc"):
            if lengths is None or len(lengths) != image_tokens.shape[0]:
                raise ValueError(f"{decoder} needs one target length per image")
            if arg == "median":
                return sample(model, image_tokens, SamplerConfig(length=int(lengths[0]))).tokens
            rows: list[torch.Tensor] = [torch.empty(0, dtype=torch.long)] * len(lengths)
            for n in sorted(set(lengths)):  # the sampler writes one N' per batch
                idx = [i for i, m in enumerate(lengths) if m == n]
                ids = sample(model, image_tokens[idx], SamplerConfig(length=int(n))).tokens
                for j, i in enumerate(idx):
                    rows[i] = ids[j]
            return _pad_rows(rows, image_tokens.device)
        return sample(model, image_tokens, SamplerConfig(length=int(arg))).tokens
    from mdc_core.ar_decode import beam_search, greedy
    if kind == "greedy":
        return greedy(model, image_tokens, max_tokens=max_length).tokens
    if kind == "beam":
        return beam_search(model, image_tokens, beam_size=int(arg), max_tokens=max_length).tokens
    raise ValueError(f"unknown decoder {decoder!r}")


def caption_items(model: torch.nn.Module, cfg: RunConfig, items: Sequence[CaptionItem], decoders: Sequence[str], *,
                  batch_size: int = 32, max_length: int | None = None, device: str | torch.device = "cpu",
                  progress: bool = True, lengths: Sequence[int] | None = None, median: int | None = None,
                  auto_range: str = AUTO_RANGE, arc_lengths: Sequence[int] | None = None
                  ) -> dict[str, dict[str, Any]]:
    """decoder -> {"captions": {key: text}, "tokens": {key: caption tokens generated}, "seconds": decoding time};
    each image batch is encoded once and shared by all decoders. `lengths`: per item N' for ``mdc-oracle``;
    `median`: N' of ``mdc-median``; `arc_lengths`: per item N' for ``mdc-arc`` (ARC's caption lengths)."""
    model = model.to(device).eval()
    tok = CaptionTokenizer(cfg.model.context_length)
    out = decoded_empty(decoders)
    bar = tqdm(total=len(items), desc="captioning", unit="img", disable=not progress)
    for start in range(0, len(items), batch_size):
        chunk = items[start:start + batch_size]
        with torch.no_grad():
            image_tokens = model.encode_image(chunk_pixels(chunk, cfg.model.image_size).to(device))  # (B, M, D)
        decode_chunk(model, image_tokens, chunk, start, decoders, out, tok, max_length=max_length, lengths=lengths,
                     median=median, auto_range=auto_range, arc_lengths=arc_lengths)
        bar.update(len(chunk))
    bar.close()
    return out


def decoded_empty(decoders: Sequence[str]) -> dict[str, dict[str, Any]]:
    """:func:`caption_items`' result before the first image."""
    return {d: {"captions": {}, "tokens": {}, "seconds": 0.0} for d in decoders}


def chunk_pixels(chunk: Sequence[CaptionItem], image_size: int) -> torch.Tensor:
    """The images of `chunk`, read and normalised: (B, 3, S, S)."""
    return torch.stack([image_pixels(it.image, image_size, name=it.key) for it in chunk])


def decode_chunk(model: torch.nn.Module, image_tokens: torch.Tensor, chunk: Sequence[CaptionItem], start: int,
                 decoders: Sequence[str], out: dict[str, dict[str, Any]], tok: CaptionTokenizer, *,
                 max_length: int | None = None, lengths: Sequence[int] | None = None, median: int | None = None,
                 auto_range: str = AUTO_RANGE, arc_lengths: Sequence[int] | None = None) -> None:
    """Caption the items `chunk` (at `start` in the item list) from their image tokens (B, M, D) with every decoder,
    into `out` (:func:`caption_items`' result, the other arguments as there)."""
    for d in decoders:
        t0 = time.perf_counter()
        targets = None
        if d == "mdc-oracle":
            targets = list(lengths[start:start + len(chunk)]) if lengths is not None else None
        elif d == "mdc-median":
            targets = [median] * len(chunk) if median is not None else None
        elif d == "mdc-arc":
            targets = list(arc_lengths[start:start + len(chunk)]) if arc_lengths is not None else None
        ids = decode(model, image_tokens, d, max_length=max_length, lengths=targets, auto_range=auto_range)
        out[d]["seconds"] += time.perf_counter() - t0
        for it, row in zip(chunk, ids.cpu(), strict=True):
            out[d]["captions"][it.key] = tok.decode(row)
            out[d]["tokens"][it.key] = _token_count(row)


def _token_count(row: torch.Tensor) -> int:
    """Caption tokens in one decoded row: ``<sot>`` not counted, counting stops at ``<eot>``."""
    ids = [int(i) for i in row if int(i) != SOT_ID]
    return ids.index(EOT_ID) if EOT_ID in ids else len(ids)


def decoder_label(objective: str, decoder: str, median: int | None = None,
                  auto_range: str = AUTO_RANGE) -> tuple[str, str]:
    """(Table 3 method, sequence length column) for a decoder, e.g. ("MDC", "10"), ("MDC", "8 (median)"),
    ("MDC", "per image (oracle)"), ("ARC (beam 6)", "-")."""
    kind, _, arg = decoder.partition("-")
    name = objective_spec(objective).display(objective)
    if kind == "mdc":
        length = {"median": f"{median} (median)", "oracle": "per image (oracle)",
                  "auto": f"auto ({auto_range})", "arc": "per image (ARC's)"}.get(arg, arg)
        return name, length
    return (f"{name} (greedy)" if kind == "greedy" else f"{name} (beam {arg})"), "-"


def captioning_table(results: Sequence[dict[str, Any]]) -> str:
    """A markdown table like the paper's Table 3 (metrics x 100; "n/a" for an unavailable metric), with the
    repetition rate (%) and the mean caption length (tokens) where measured."""
    columns = TABLE3_METRICS + ((REPETITION,) if any(REPETITION[1] in r["metrics"] for r in results) else ())
    tokens = any("mean_length" in r["metrics"] for r in results)
    head = "| method | run | sequence length | " + " | ".join(short for short, _ in columns) + \
        (" | tokens |" if tokens else " |")
    lines = [head, "|---|---|---:|" + "---:|" * (len(columns) + tokens)]
    for r in results:
        cells = [f"{100 * r['metrics'][key]:.1f}" if r["metrics"].get(key) is not None else "n/a"
                 for _, key in columns]
        if tokens:
            cells.append(f"{r['metrics']['mean_length']:.1f}" if r["metrics"].get("mean_length") is not None
                         else "n/a")
        lines.append(f"| {r['label']} | {r['run']} | {r['length']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table3_row(result: dict[str, Any]) -> str:
    """The row name of one :func:`captioning` result in the workbench's Table 3: ``MDC-10``, ``MDC (median
    length)``, ``MDC (oracle length)``, ``MDC (auto length)``, ``MDC (ARC's length)``, ``ARC (greedy)`` and
    ``ARC`` (beam search, the paper's ARC row); other MDC-family objectives keep their label (``BERT-10``)."""
    kind, _, arg = result["decoder"].partition("-")
    if kind == "mdc":
        name = result["label"]
        if arg == "arc":
            return f"{name} (ARC's length)"
        return f"{name} ({arg} length)" if arg in LENGTH_MODES else f"{name}-{arg}"
    return "ARC" if kind == "beam" else result["label"]


def table3(result: dict[str, Any]) -> dict[str, Any]:
    """Table 3 for ``metrics.json`` from a :func:`captioning` result: per row (:func:`table3_row`) the metrics x 100
    (BLEU@4, METEOR, ROUGE-L, CIDEr, SPICE where computed), ``repetition`` (% of captions repeating a word) and
    ``length`` (mean tokens); per-image items for the columns whose mean is the corpus score (ROUGE-L, CIDEr,
    repetition, length), so that one seed still gets intervals and paired differences."""
    values: dict[str, dict[str, float]] = {}
    items: dict[str, dict[str, list[float]]] = {}
    for r in result["results"]:
        row = table3_row(r)
        m = r["metrics"]
        values[row] = {k: 100.0 * m[k] for k in ("BLEU@4", "METEOR", "ROUGE-L", "CIDEr", "SPICE")
                       if m.get(k) is not None}
        if m.get("repetition_rate") is not None:
            values[row]["repetition"] = 100.0 * m["repetition_rate"]
        if m.get("mean_length") is not None:
            values[row]["length"] = m["mean_length"]
        per = r.get("per_image", {})
        items[row] = {k: [100.0 * x for x in per[k]] for k in ITEM_METRICS if per.get(k)}
        items[row].update({k: list(per[k]) for k in ("repetition", "length") if per.get(k)})
    median = result.get("median_length")
    metric = ("scores x 100, repetition % and mean length (tokens) on the test captions; MDC-N: N tokens, "
              f"median length: N' = {median} for every image, oracle: each image's reference length, auto: MDC "
              "picks its own, ARC's length: each image at the length of ARC's beam caption; ARC: beam search (the "
              "paper's row) and greedy")
    return {"metric": metric, "values": values, "items": items}


def captioning(runs: Sequence[str | Path], data: str | Path, *, lengths: Sequence[int | str] = PAPER_LENGTHS,
               beam: int = PAPER_BEAM, finetune_steps: int = 0, finetune_data: str | Path | None = None,
               finetune_overrides: Sequence[str] = (), out: str | Path = "outputs/eval", limit: int | None = None,
               metrics: Sequence[str] = ALL_METRICS, batch_size: int = 32, max_length: int | None = None,
               device: str = "cpu", progress: bool = True, images: str | Path | None = None,
               auto_range: str = AUTO_RANGE) -> dict[str, Any]:
    """Fine-tune (when `finetune_steps` > 0) and caption the test split of `data` with every run. `images`: the
    image folder of `data` (a caption json or table; default: found), also used to fine-tune on `data`.
    `lengths`: MDC's N' values and :data:`LENGTH_MODES` (``median``, ``oracle``, ``auto`` over `auto_range`,
    ``arc``: ARC's caption length per image, which needs an ARC run among `runs`).

    Returns ``{"data", "n_images", "median_length", "results": [one per run and decoder: run, finetuned_run,
    objective, decoder, label, length, metrics, per_image, unavailable, seconds, captions], "table": markdown}``.
    ``per_image`` holds per image, in the order of ``captions``, CIDEr and ROUGE-L (when computed: their means are
    the corpus scores), ``repetition`` (100 if the caption repeats a word, else 0) and ``length`` (tokens); every
    decoder's lists cover the same images in the same order, so two decoders can be compared by a paired
    bootstrap over images. ``median_length`` is the test captions' median token length (:func:`reference_lengths`).
    """
    if not runs:
        raise ValueError("no run given: pass at least one --run RUN")
    lengths = parse_lengths(lengths)
    plans = plan_runs(runs, lengths, beam)  # everything checked before any fine-tuning or decoding starts
    train_data = str(finetune_data or data)
    images = str(images) if images else None
    train_images = None if finetune_data else images
    if finetune_steps > 0 and not finetune_data and not _has_splits(train_data, images):
        raise ValueError(f"{data} has no separate train and test splits (a plain COCO json or CSV); pass "
                         "--finetune-data TRAIN for fine-tuning, or fine-tune with a Karpathy json / split folders")
    items = caption_test_set(data, limit, images)
    references = {it.key: list(it.references) for it in items}
    results: list[dict[str, Any]] = []
    meteor = MeteorSession() if "METEOR" in metrics else contextlib.nullcontext()
    with meteor:
        median = _caption_runs(plans, items, references, results, finetune_steps=finetune_steps,
                               train_data=train_data, out=out, finetune_overrides=finetune_overrides,
                               train_images=train_images, progress=progress, device=device, batch_size=batch_size,
                               max_length=max_length, metrics=metrics, auto_range=auto_range)
    return {"data": str(data), "n_images": len(items), "finetune_steps": finetune_steps, "median_length": median,
            "results": results, "table": captioning_table(results)}


def plan_runs(runs: Sequence[str | Path], lengths: Sequence[int | str], beam: int) -> list[tuple[Any, list[str]]]:
    """(run, its decoders) of every run; ValueError for a length beyond a run's context, or the length ``arc``
    without an ARC run."""
    from mdc_core.factory import load_model
    plans = []
    for run in runs:
        _, cfg = load_model(run)
        decoders = decoders_for(cfg.objective.name, lengths, beam)
        fixed = [n for n in lengths if isinstance(n, int)]
        too_long = [n for n in fixed if n + 2 > cfg.model.context_length] \
            if objective_spec(cfg.objective.name).decoder != "left_to_right" else []
        if too_long:
            raise ValueError(f"caption length(s) {too_long} exceed the context of {run} "
                             f"({cfg.model.context_length - 2} tokens)")
        plans.append((run, decoders))
    if "arc" in lengths and not any(d[0] == "greedy" for _, d in plans):
        raise ValueError("the length 'arc' (MDC at ARC's caption length per image) needs an ARC run among the runs")
    return plans


def caption_test_set(data: str | Path, limit: int | None, images: str | None) -> list[CaptionItem]:
    """The test images of `data` (at most `limit`); ValueError for a bad limit or none."""
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    items = load_caption_set(data, "test", limit, images)
    if not items:
        raise ValueError(f"{data} has no test images with captions")
    return items


def arc_first(plans: Sequence[tuple[Any, list[str]]]) -> list[int]:
    """The order in which `plans` are decoded: ARC runs first, so that ``mdc-arc`` knows ARC's lengths."""
    return sorted(range(len(plans)), key=lambda i: plans[i][1][0] != "greedy")


def target_lengths(items: Sequence[CaptionItem], cfg: RunConfig, arc_lengths: Sequence[int] | None
                   ) -> tuple[list[int], int, list[int] | None]:
    """(per item N' of ``mdc-oracle``, the median N', per item N' of ``mdc-arc`` within the run's context)."""
    targets = reference_lengths(items, CaptionTokenizer(cfg.model.context_length))
    limit_n = cfg.model.context_length - 2
    own_arc = None if arc_lengths is None else [min(max(1, n), limit_n) for n in arc_lengths]
    return targets, _round_half_up(float(np.median(targets))), own_arc


def arc_lengths_of(decoded: dict[str, dict[str, Any]], decoders: Sequence[str], items: Sequence[CaptionItem]
                   ) -> list[int] | None:
    """ARC's caption length per item (its beam caption's, or greedy's) from an ARC run's decoding; None for MDC."""
    return [decoded[decoders[-1]]["tokens"][it.key] for it in items] if decoders[0] == "greedy" else None


def _caption_runs(plans: list[tuple[Any, list[str]]], items: list[CaptionItem], references: dict[str, list[str]],
                  results: list[dict[str, Any]], *, finetune_steps: int, train_data: str, out: str | Path,
                  finetune_overrides: Sequence[str], train_images: str | None, progress: bool, device: str,
                  batch_size: int, max_length: int | None, metrics: Sequence[str], auto_range: str) -> int | None:
    """Fine-tune, decode and score every (run, decoders) of `plans` into `results` (in the order of `plans`; ARC
    runs are decoded first, so that ``mdc-arc`` knows ARC's lengths); returns the median length."""
    from mdc_core.factory import load_model
    median, arc_lengths = None, None
    per_plan: dict[int, list[dict[str, Any]]] = {}
    for i in arc_first(plans):
        run, decoders = plans[i]
        eval_run = Path(run)
        if finetune_steps > 0:
            eval_run = finetune(run, train_data, Path(out) / "finetune" / f"{i}_{Path(run).name}_{finetune_steps}",
                                finetune_steps, overrides=finetune_overrides, images=train_images,
                                progress=progress, key_in_name=True)
        model, cfg = load_model(eval_run, device=device)
        targets, median, own_arc = target_lengths(items, cfg, arc_lengths)
        decoded = caption_items(model, cfg, items, decoders, batch_size=batch_size, max_length=max_length,
                                device=device, progress=progress, lengths=targets, median=median,
                                auto_range=auto_range, arc_lengths=own_arc)
        if arc_lengths is None:  # ARC's beam caption (or greedy) sets the matched length
            arc_lengths = arc_lengths_of(decoded, decoders, items)
        per_plan[i] = scored_results(run, eval_run if finetune_steps > 0 else None, cfg, decoded, references,
                                     metrics=metrics, median=median, auto_range=auto_range)
    for i in range(len(plans)):
        results.extend(per_plan[i])
    return median


def scored_results(run: str | Path, finetuned: str | Path | None, cfg: RunConfig, decoded: dict[str, dict[str, Any]],
                   references: dict[str, list[str]], *, metrics: Sequence[str], median: int | None,
                   auto_range: str) -> list[dict[str, Any]]:
    """One :func:`captioning` result per decoder of `decoded` (:func:`caption_items`' output for run `run`,
    fine-tuned into `finetuned` or not): its metrics, per-image items and captions."""
    done = []
    for d, one in decoded.items():
        captions = one["captions"]
        scores = score_captions(captions, references, metrics=metrics,
                                 per_image=[m for m in ITEM_METRICS if m in metrics])
        per_image = {name: [per[k] for k in captions] for name, per in scores.get("per_image", {}).items()}
        per_image["repetition"] = [100.0 * bool(repeated_words(c)) for c in captions.values()]
        per_image["length"] = [float(one["tokens"][k]) for k in captions]
        label, length = decoder_label(cfg.objective.name, d, median, auto_range)
        done.append({
            "run": str(run), "finetuned_run": None if finetuned is None else str(finetuned),
            "objective": cfg.objective.name, "decoder": d, "label": label, "length": length,
            "metrics": {**{k: v for k, v in scores.items()
                           if k not in ("unavailable", "tokenizer", "n_images", "per_image")},
                        "repetition_rate": repetition_rate(captions.values()),
                        "mean_length": float(np.mean(per_image["length"]))},
            "per_image": per_image,
            "unavailable": scores["unavailable"], "tokenizer": scores["tokenizer"],
            "seconds": round(one["seconds"], 3),
            "captions": [{"key": k, "caption": c, "references": references[k]} for k, c in captions.items()],
        })
    return done
