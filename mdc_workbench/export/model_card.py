"""The model card of an exported encoder (``README.md``): what trained it, on what, how to load it, what it measured.

A card states what the run's folder can prove: the objective, preset, data, steps and seed from its ``config.json``;
the training loss at the exported step from ``metrics.jsonl``; the command that reproduces the configuration
(:func:`rebuild_command`, rebuilt from ``config.json``, so it exists for runs trained from a notebook as well); and the
evaluations that name the run (:func:`find_measurements`), each with the step it was measured at. The licence is left
for the user: the weights inherit the terms of the data they were trained on, which only the user knows.

Where runs record evaluations, and so where :func:`find_measurements` looks:

* result files given explicitly (``mdc export --metrics FILE``), e.g. what ``mdc probe --out FILE`` or ``mdc eval
  captioning --out DIR`` wrote;
* JSON files in the run folder itself (``mdc probe --out RUN/probe.json``);
* ``report.json`` beside ``RUN`` = ``OUT/run`` (``mdc demo --out OUT``);
* for a run a plan trained (``papermill_runs/<plan>/_models/<run>``), the plan's notebook results
  ``papermill_runs/<plan>/*/metrics.json`` (01: single-object captions; 03: linear probes).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from mdc_core.config import RunConfig, list_presets, load_preset
from mdc_core.registry import objective_spec

SKIPPED_KEYS = {("model", "output_vocab_size"), ("data", "path"), ("data", "images"), ("data", "path_as_given"),
                ("objective", "name"), ("train", "steps")}  # given as flags, or filled in by the trainer


@dataclass
class Measurement:
    """One evaluation result that names the run."""

    what: str  # e.g. "linear probe top-1, shape" or "CIDEr, MDC N'=10"
    value: float
    step: int | None  # the checkpoint step it was measured at (None: not recorded)
    source: str  # the file it came from
    detail: str = ""  # protocol, data, split ...


def rebuild_command(cfg: RunConfig, run_dir: str | Path) -> str:
    """An ``mdc train`` command whose configuration equals `cfg` (every key that differs from the preset becomes a
    ``--set``); the preset ``tiny`` stands in for a config that names no registered preset."""
    preset = cfg.preset if cfg.preset in list_presets() else "tiny"
    base, mine = load_preset(preset).to_dict(), cfg.to_dict()
    words = ["mdc", "train", "--preset", preset, "--data", _shown(cfg.data.path_as_given or cfg.data.path)]
    if cfg.data.images:
        words += ["--images", _shown(cfg.data.images)]
    words += ["--objective", cfg.objective.name, "--steps", str(cfg.train.steps), "--out", Path(run_dir).name]
    for section, values in mine.items():
        if not isinstance(values, dict):
            continue
        for key, value in values.items():
            if (section, key) not in SKIPPED_KEYS and value != base[section].get(key):
                words += ["--set", f"{section}.{key}={_override_text(value)}"]
    return shlex.join(words)


def _shown(path: str | Path) -> str:
    """`path` as a card may show it: relative to the working folder when under it, else its last two parts (a card
    is shared; the absolute path of the machine that wrote it is true nowhere else)."""
    path = Path(path)
    if not path.is_absolute():
        return str(path)
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(Path(*path.parts[-2:]))


def encoder_title(cfg: RunConfig, trunk: Any) -> str:
    """What the encoder is, from the built timm model `trunk` (not the timm name the config starts from, whose
    default size the encoder_kwargs overrode): e.g. "ViT, depth 4, width 128, patch 8, 64 px, conv stem"."""
    m = cfg.model
    blocks, width = getattr(trunk, "blocks", None), getattr(trunk, "embed_dim", None)
    if blocks is None or width is None:
        return f"timm {m.encoder}, {m.image_size} px"
    patch = m.encoder_kwargs.get("patch_size") or trunk.patch_embed.patch_size[0]
    stem = ", early-convolution stem" if "conv_stem" in m.encoder_kwargs else ""
    return f"ViT, depth {len(blocks)}, width {width}, patch {patch}, {m.image_size} px{stem}"


def _override_text(value: Any) -> str:
    """`value` as ``--set`` parses it back (JSON, except a string that does not parse as JSON, given as is)."""
    if isinstance(value, str):
        try:
            json.loads(value)
        except json.JSONDecodeError:
            return value
    return json.dumps(value)


def _same_run(recorded: Any, run_dir: Path) -> bool:
    """`recorded` (a path a result file wrote: the run, or one of its checkpoints) names `run_dir`."""
    if not isinstance(recorded, str) or not recorded:
        return False
    path = Path(recorded)
    if path.parent.name == "checkpoints" and path.name.startswith("step_"):
        path = path.parent.parent
    if path.is_absolute():
        return path.resolve() == run_dir.resolve()
    parts = [p for p in path.parts if p not in (".", "..")]
    return bool(parts) and list(run_dir.resolve().parts[-len(parts):]) == parts


def _probe_rows(data: dict[str, Any], run_dir: Path, source: str) -> list[Measurement]:
    """``mdc probe`` results: {"runs": [{"run", "step", "init", "protocol", "data", "tasks": {task: {"top1"}}}]}."""
    rows = []
    for entry in data.get("runs", []):
        if not isinstance(entry, dict) or not (_same_run(entry.get("run"), run_dir)
                                               or _same_run(entry.get("checkpoint"), run_dir)):
            continue
        init = entry.get("init", "trained")  # the baselines beside it: what a probe gets without this training
        baseline = {"trained": "", "random": ", baseline: this architecture untrained",
                    "pixels": ", baseline: raw pixels"}.get(init, f", baseline: {init}")
        detail = (f"{entry.get('protocol', '')} probe of the {entry.get('pool', '')} feature on "
                  f"{_shown(entry.get('data', ''))}")
        detail += ", EMA weights" if entry.get("ema") and not baseline else ""
        for task, result in entry.get("tasks", {}).items():
            if isinstance(result, dict) and isinstance(result.get("top1"), int | float):
                rows.append(Measurement(f"linear probe top-1 %, {task}{baseline}", 100 * float(result["top1"]),
                                        entry.get("step"), source, detail))
    return rows


def _captioning_rows(data: dict[str, Any], run_dir: Path, source: str) -> list[Measurement]:
    """``mdc eval captioning`` results: {"results": [{"run", "label", "length", "metrics": {name: value}}]}."""
    rows = []
    for entry in data.get("results", []):
        if not isinstance(entry, dict) or not _same_run(entry.get("run"), run_dir):
            continue
        tuned = f", after {data.get('finetune_steps')} fine-tuning steps" if data.get("finetune_steps") else ""
        detail = f"{data.get('n_images', '?')} test images of {_shown(data.get('data', ''))}{tuned}"
        for name, value in entry.get("metrics", {}).items():
            if isinstance(value, int | float):
                rows.append(Measurement(f"{name}, {entry.get('label', '')}", float(value), None, source, detail))
    return rows


def _notebook_rows(data: dict[str, Any], run_dir: Path, source: str) -> list[Measurement]:
    """A plan notebook's metrics.json: 01 names its run (``run_dir``), 03 its runs by label (``runs``)."""
    metrics = data.get("metrics", {})
    if _same_run(data.get("run_dir"), run_dir) and isinstance(metrics.get("single_object_accuracy"), int | float):
        return [Measurement("single-object captions naming the right colour and shape", metrics[
            "single_object_accuracy"], metrics.get("steps"), source, f"notebook {data.get('notebook', '')}")]
    labels = [label for label, path in (data.get("runs") or {}).items() if _same_run(path, run_dir)]
    rows = []
    for label in labels:
        for key, value in metrics.items():
            prefix = f"probe/{label}"
            if (key == prefix or key.startswith(prefix + "/")) and isinstance(value, int | float):
                task = key[len(prefix) + 1:] or f"mean of {', '.join(data.get('mean_tasks', []))}"
                rows.append(Measurement(f"linear probe top-1 %, {task}", float(value), None, source,
                                        f"notebook {data.get('notebook', '')}, {data.get('probe_protocol', '')}"))
    return rows


def _demo_rows(data: dict[str, Any], source: str) -> list[Measurement]:
    """``mdc demo``'s report.json (beside its run folder): single-object caption accuracy."""
    acc = data.get("single_object_accuracy")
    if not isinstance(acc, int | float):
        return []
    return [Measurement("single-object captions naming the right colour and shape", float(acc), None, source,
                        f"{data.get('n_single_object', '?')} single-object images of the {data.get('split', '')} "
                        f"split, N'={data.get('sampler', {}).get('length', '?')}")]


def candidate_files(run_dir: Path, extra: Sequence[str | Path] = ()) -> list[Path]:
    """The result files :func:`find_measurements` reads for `run_dir` (see the module docstring), existing ones."""
    found = [Path(p) for p in extra]
    found += sorted(p for p in run_dir.glob("*.json") if p.name not in ("config.json", "meta.json"))
    if run_dir.name == "run":
        found.append(run_dir.parent / "report.json")
    if run_dir.parent.name == "_models":
        found += sorted(run_dir.parent.parent.glob("*/metrics.json"))
    unique = list(dict.fromkeys(p.resolve() for p in found))
    return [p for p in unique if p.is_file()]


def find_measurements(run_dir: str | Path, extra: Sequence[str | Path] = ()) -> list[Measurement]:
    """Every evaluation result naming `run_dir` in the files of :func:`candidate_files`; `extra` files must exist
    and hold JSON (a FileNotFoundError or ValueError names the one that does not)."""
    run_dir = Path(run_dir)
    for path in map(Path, extra):
        if not path.is_file():
            raise FileNotFoundError(f"--metrics file not found: {path}")
    rows: list[Measurement] = []
    explicit = {Path(p).resolve() for p in extra}
    for path in candidate_files(run_dir, extra):
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
            if path in explicit:  # RecursionError: nested deeper than the interpreter's stack
                problem = "nested too deeply" if isinstance(err, RecursionError) else str(err)
                raise ValueError(f"--metrics file {path} is not valid JSON ({problem})") from None
            continue
        if not isinstance(data, dict):
            continue
        source = str(path)
        if "notebook" in data:
            rows += _notebook_rows(data, run_dir, source)
        elif isinstance(data.get("runs"), list):
            rows += _probe_rows(data, run_dir, source)
        elif isinstance(data.get("results"), list):
            rows += _captioning_rows(data, run_dir, source)
        elif path.name == "report.json" and (path.parent / "run").resolve() == run_dir.resolve() or path in explicit:
            rows += _demo_rows(data, source)
    return rows


def training_record(run_dir: Path, step: int) -> dict[str, Any]:
    """The last ``metrics.jsonl`` record at or before `step` ({} when the run logged none)."""
    path = run_dir / "metrics.jsonl"
    best: dict[str, Any] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                continue
            if isinstance(record, dict) and record.get("step", 0) <= step:
                best = record
    return best


def _number(value: float) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _table(rows: Iterable[tuple[str, str]]) -> list[str]:
    return ["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]


def card_data(cfg: RunConfig, run_dir: Path, fmt: str, measurements: Sequence[Measurement]) -> ModelCardData:
    """The card's metadata (its YAML front matter) as huggingface_hub writes it: library, pipeline, tags, no licence
    (left for the user), and each measurement as an eval result (a model-index entry the Hub displays)."""
    data_name = Path(cfg.data.path).name or "local data"
    results = [EvalResult(task_type="image-feature-extraction" if "probe" in r.what else "image-to-text",
                          dataset_type=data_name, dataset_name=r.detail or data_name, metric_type=_slug(r.what),
                          metric_name=r.what, metric_value=r.value)
               for r in measurements]
    return ModelCardData(library_name="timm" if fmt == "timm" else "mdc-workbench",
                         pipeline_tag="image-feature-extraction",
                         tags=["image-feature-extraction", "masked-diffusion-captioning", cfg.objective.name]
                         + ([] if fmt == "timm" else ["pytorch_model_hub_mixin", "model_hub_mixin"]),
                         model_name=run_dir.name, eval_results=results or None)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text.lower()).strip("_")[:60]


def render_card(*, cfg: RunConfig, run_dir: Path, step: int, ema: bool, fmt: str, usage: str, params: int,
                measurements: Sequence[Measurement], searched: Sequence[Path], title: str = "") -> ModelCard:
    """The README.md of an export as a huggingface_hub ModelCard: the metadata of :func:`card_data`, then load /
    training / measured / reproduce / licence sections. `usage` is the Python snippet that loads the export, `title`
    what the encoder is (:func:`encoder_title`)."""
    m, o, tcfg = cfg.model, cfg.objective, cfg.train
    sentence = objective_spec(o.name).description or o.name
    objective = sentence.format(t_low=o.t_low, t_high=o.t_high, mask_ratio=o.mask_ratio)
    stem = m.encoder_kwargs.get("conv_stem")
    encoder = f"`{m.encoder}` ({json.dumps(m.encoder_kwargs)})" + (
        f" with an early-convolution stem {stem} (timm's ConvStem in a timm export)" if stem else "")
    data = f"`{_shown(cfg.data.path_as_given or cfg.data.path)}` (format {cfg.data.format})"
    manifest = Path(cfg.data.path) / "manifest.json"
    if manifest.is_file():
        try:
            info = json.loads(manifest.read_text())
            synth = info.get("params", {})
            data += (f"; the embedded synthetic data: {info.get('counts', {}).get('train', '?')} training pairs, "
                     f"captions {synth.get('captions', '?')}, seed {synth.get('seed', '?')}")
        except (json.JSONDecodeError, AttributeError):
            pass
    record = training_record(run_dir, step)
    from mdc_core.run_state import logged_accuracy
    accuracy = logged_accuracy(record)
    logged = ", ".join(([f"loss {_number(record['loss'])}"] if "loss" in record else []) +
                       ([f"{accuracy[0]} {_number(accuracy[1])}"] if accuracy else []))
    weights = f"EMA of the weights (decay {tcfg.ema_decay})" if ema else "the trained weights" + (
        " (the run also kept an EMA; exported without it)" if tcfg.ema_decay > 0 else " (the run kept no EMA)")
    rows = [("objective", f"`{o.name}`: {objective}"), ("preset", f"`{cfg.preset or '(none)'}`"),
            ("encoder", f"{encoder}; {params / 1e6:.2f} M parameters; {m.image_size} px input"),
            ("data", data), ("steps", f"{step} (checkpoint step; the run was configured for {tcfg.steps})"),
            ("batch", f"{tcfg.batch_size} per device x {tcfg.grad_accum} accumulation"
                      + (f" (global batch {record['global_batch']})" if "global_batch" in record else "")),
            ("optimiser", f"AdamW lr {tcfg.lr}, betas {list(tcfg.betas)}, weight decay {tcfg.weight_decay}, "
                          f"{tcfg.warmup_steps} warm-up steps, cosine to {tcfg.min_lr_ratio} x lr"),
            ("seed", str(tcfg.seed)), ("weights", weights)]
    if logged:
        rows.append(("training metrics at that step", f"{logged} (step {record.get('step')}, metrics.jsonl)"))
    lines = ["---", card_data(cfg, run_dir, fmt, measurements).to_yaml(), "---", "",
             f"# {run_dir.name}: a `{o.name}` image encoder ({title or m.encoder + ', ' + str(m.image_size) + ' px'})",
             "",
             f"An image encoder trained by {objective.split(':')[0].split(' (')[0]} with the MDC workbench, exported "
             f"as a {'plain timm model' if fmt == 'timm' else 'Hugging Face-style folder'} at step {step}.", "",
             "## Load it", "", "```python", usage.strip(), "```", "", "## Training", "", *_table(rows), ""]
    lines += ["## Measured", ""]
    if measurements:
        lines += ["| metric | value | step | detail | source |", "|---|---|---|---|---|"]
        lines += [f"| {r.what} | {_number(r.value)} | {'?' if r.step is None else r.step} | {r.detail} | "
                  f"`{_shown(r.source)}` |" for r in measurements]
        if any(r.step is not None and r.step != step for r in measurements):
            lines += ["", f"Rows measured at another step than the exported {step} describe other weights."]
    else:
        where = ", ".join(f"`{_shown(p)}`" for p in searched) or "the run folder"
        lines += [f"No probe or caption metrics name this run (looked in {where}). Measure them, e.g. "
                  f"`mdc probe --run {run_dir.name} --data DATA --out {run_dir.name}/probe.json`, then export again."]
    lines += ["", "## Reproduce", "", "The configuration of this run, as one command (rebuilt from its config.json):",
              "", "```bash", rebuild_command(cfg, run_dir), "```", "",
              "## Licence", "", "Not set: add a `license` field above (e.g. mit, apache-2.0, cc-by-4.0). The weights "
              "inherit the terms of the training data and of the code that trained them.", ""]
    return ModelCard("\n".join(lines), ignore_metadata_errors=False)
