"""``mdc bench``: training, captioning and scoring speed of MDC, ARC and OpenCLIP CoCa in one run.

:func:`run_bench` measures everything on one machine with one set of dimensions (the preset's encoder, decoder
width/depth/heads and image size; one batch of embedded-data images and captions) and returns a JSON-ready
dict; :func:`format_report` renders it as tables. Timings are medians over repeats after warm-up; the matmul
peak that the model FLOPs utilisation (MFU) is measured against is taken in the same run, in the precision the
training step runs in (fp32 on CPU; bf16 on CUDA, where training uses bf16 autocast). Every captioning and
scoring row (image encoding included, MDC, ARC and CoCa alike) runs in ``BenchConfig.precision`` (``--precision``;
``auto``: bf16 autocast on a GPU with bf16, fp32 elsewhere), named in the report as ``inference_precision``.

Sections: ``train`` (:mod:`mdc_workbench.bench.training`, one fresh process per row), ``caption`` and ``scoring``
(:mod:`mdc_workbench.bench.decoding`), ``quality`` (only with trained runs), and ``targets`` (issue 6's goals, each
marked reached / missed / not measured). A piece of the workbench that is missing is reported as
``{"available": false, "note": ...}``, never as a number.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mdc_core.config import load_preset
from mdc_core.sampler import bf16_enabled, default_inference_precision, inference_autocast

from .core import BenchConfig, bench_inputs, datasheet_peak, machine_info, matmul_peak, resolve_device

# ----------------------------------------------------------------------------------------------------------
# the whole run


def run_bench(bench: BenchConfig, progress: Callable[[str], None] | None = None,
              save: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Measure everything described in the module docstring; returns the JSON-ready report. `save` is called
    with the report so far after each section (``mdc bench --out`` writes it): an interrupted run keeps it."""
    from .decoding import caption_speed, quality_comparison, scoring_speed
    from .training import profile_train_step, run_train_bench

    say = progress or (lambda msg: None)
    keep = save or (lambda report: None)
    if bench.threads > 0:
        torch.set_num_threads(bench.threads)
    device = resolve_device(bench.device)
    cfg = load_preset(bench.preset, bench.overrides)
    report: dict[str, Any] = {"machine": machine_info(device), "settings": dataclasses.asdict(bench)}
    say("building inputs")
    payload = bench_inputs(cfg, cfg.train.batch_size)
    m = cfg.model
    report["dimensions"] = {"preset": bench.preset, "encoder": m.encoder, "encoder_kwargs": m.encoder_kwargs,
                            "image_size": m.image_size, "decoder_width": m.text_width,
                            "decoder_layers": m.text_layers, "decoder_heads": m.text_heads,
                            "train_batch": cfg.train.batch_size, "caption_tokens": int(payload["tokens"].ne(0).sum(1)
                                                                                       .max()),
                            "output_vocab": m.output_vocab,
                            "output_vocab_size": len(payload["output_ids"]) if payload["output_ids"] is not None
                            else 49408}

    dtype = torch.bfloat16 if bf16_enabled(cfg.train.precision, device) else torch.float32  # as the training step
    say(f"{str(dtype).removeprefix('torch.')} matmul peak")
    n = bench.matmul_size or (8192 if device.type == "cuda" else 2048)
    report["matmul_peak"] = matmul_peak(device, n, dtype=dtype)

    with tempfile.TemporaryDirectory(prefix="mdc_bench_") as tmp:
        path = Path(tmp) / "payload.pt"
        torch.save(payload, path)
        say(f"training steps: {', '.join(bench.train_rows)}" + (" (one process each)" if bench.isolate else ""))
        train = run_train_bench(list(bench.train_rows), path, steps=bench.train_steps, warmup=bench.train_warmup,
                                device=str(device), threads=torch.get_num_threads(), isolate=bench.isolate,
                                timeout_s=bench.row_timeout_s, count_ops=bench.count_ops)
    report["datasheet_peak"] = datasheet_peak(report["machine"].get("gpu", ""))  # None on the CPU
    add_mfu(train, report["matmul_peak"], report["datasheet_peak"])
    report["train"] = train
    keep(report)

    # every inference row (image encoding, MDC, ARC and CoCa decoding, scoring) in the same precision
    report["inference_precision"] = "bf16 autocast" if bf16_enabled(bench.precision, device) else "fp32"
    with default_inference_precision(bench.precision), inference_autocast(bench.precision, device):
        say(f"caption latency and throughput ({report['inference_precision']})" if "caption" in bench.sections else
            "captioning: skipped (--sections)")
        report["caption"] = caption_speed(cfg, payload, bench, device, say) if "caption" in bench.sections else {}
        keep(report)
        say("scoring throughput")
        report["scoring"] = scoring_speed(cfg, payload, bench, device) if "scoring" in bench.sections else {}
        keep(report)
        report["quality"] = quality_comparison(bench, device, say) if "quality" in bench.sections else \
            {"available": False, "note": "section not asked for (--sections)"}
    if bench.profile_rows > 0:
        say(f"profiling the {bench.profile_row} training step (training precision)")
        report["profile"] = profile_train_step(payload, name=bench.profile_row, rows=bench.profile_rows,
                                               device=str(device))
    report["targets"] = targets(report)
    report["machine"]["load_average_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    keep(report)
    return report


def add_mfu(rows: dict[str, dict[str, Any]], measured: dict[str, Any], datasheet: dict[str, Any] | None) -> None:
    """Each measured training row's model FLOP/s and MFU twice: ``mfu`` against the `measured` matmul peak (what
    this machine's matmuls reach) and ``mfu_datasheet`` against the GPU's `datasheet` peak (what published MFU
    figures divide by; None where the device has none: a CPU, an unknown GPU)."""
    for row in rows.values():
        if "error" not in row:
            row["model_flops_per_s"] = row["flops_per_step"] / row["step_s"]
            row["mfu"] = row["model_flops_per_s"] / measured["flops_per_s"]
            row["mfu_datasheet"] = row["model_flops_per_s"] / datasheet["flops_per_s"] if datasheet else None


# ----------------------------------------------------------------------------------------------------------
# targets (issue 6) and the printed report


def _get(report: dict[str, Any], *keys: str) -> float | None:
    node: Any = report
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return float(node) if isinstance(node, (int, float)) and not isinstance(node, bool) else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _best(report: dict[str, Any], prefix: str, key: str) -> float | None:
    """The largest `key` over the training rows named `prefix` or ``prefix_*`` ("mdc": mdc, mdc_compiled,
    mdc_graphs, ...; not the full-vocabulary row, whose head differs), or None when none measured it."""
    values = [_get(report, "train", name, key) for name in report.get("train", {})
              if (name == prefix or name.startswith(prefix + "_")) and "full_vocab" not in name]
    values = [v for v in values if v is not None]
    return max(values) if values else None


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 6's goals: each with its measured value (None = not measured) and whether it was reached."""
    big = max((int(k.split("_")[1]) for k in report.get("caption", {}) if k.startswith("batch_")), default=0)
    cap_big = report.get("caption", {}).get(f"batch_{big}", {})
    quality = report.get("quality", {})
    rows = [
        ("MDC training samples/s vs CoCa (equal dims)", 1.3,
         _ratio(_get(report, "train", "mdc", "samples_per_s"), _get(report, "train", "coca", "samples_per_s"))),
        ("cached vs uncached greedy MDC decoding speed-up (batch 1)", 3.0,
         _ratio(_get(report, "caption", "batch_1", "mdc_uncached", "latency_s"),
                _get(report, "caption", "batch_1", "mdc_cached", "latency_s"))),
        (f"MDC cached batch-{big} captions/s vs CoCa greedy generate", 1.0,
         _ratio(_get(cap_big, "mdc_cached", "captions_per_s"), _get(cap_big, "coca_generate", "captions_per_s"))),
        ("threshold decoding captions/s vs ARC + KV cache at equal quality (trained runs)", 1.0,
         _ratio(_get(quality, "mdc_threshold", "captions_per_s"), _get(quality, "arc_kv", "captions_per_s"))
         if quality.get("equal_quality") else None),
        ("1024-sample Monte Carlo score of one pair, seconds (lower is better)", 1.0,
         _get(report, "scoring", "mc", "latency_one_pair_s")
         if report.get("scoring", {}).get("mc", {}).get("samples") == 1024 else None),
        ("MDC training step MFU vs measured matmul peak (training precision)", 0.30,
         _get(report, "train", "mdc", "mfu")),
        ("best MDC row samples/s vs best ARC row (same compile options available)", 1.0,
         _ratio(_best(report, "mdc", "samples_per_s"), _best(report, "arc", "samples_per_s"))),
        ("best MDC row samples/s vs CoCa", 2.5,
         _ratio(_best(report, "mdc", "samples_per_s"), _get(report, "train", "coca", "samples_per_s"))),
        ("best MDC row MFU", 0.35 if report.get("dimensions", {}).get("train_batch", 0) >= 256 else 0.25,
         _best(report, "mdc", "mfu")),
    ]
    out = []
    for name, goal, value in rows:
        lower_better = "lower is better" in name
        reached = None if value is None else (value < goal if lower_better else value >= goal)
        out.append({"target": name, "goal": goal, "value": value, "reached": reached})
    return out


def _fmt(x: Any, digits: int = 3) -> str:
    if isinstance(x, bool) or x is None:
        return "-" if x is None else str(x)
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) < 1e4 else f"{x:.3e}"
    return str(x)


def _table(header: list[str], rows: list[list[Any]]) -> str:
    cells = [header] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def _datasheet_line(peak: dict[str, Any] | None) -> str:
    if not peak:
        return "datasheet peak: none for this device (MFU datasheet: -)"
    return f"datasheet peak: {peak['flops_per_s'] / 1e12:.1f} TFLOP/s {peak['dtype']} ({peak['source']})"


def format_report(report: dict[str, Any]) -> str:
    """Human-readable tables of a :func:`run_bench` report."""
    mach, dims, peak = report["machine"], report["dimensions"], report["matmul_peak"]
    parts = [f"machine: {mach['cpu']} ({mach['cpu_count']} cores, torch {mach['torch']}, "
             f"{mach['torch_threads']} threads, device {mach['device']}); load average at start "
             f"{_fmt(mach.get('load_average_start'))}",
             f"dimensions: {json.dumps(dims)}",
             f"{peak.get('dtype', 'float32')} matmul peak: {peak['flops_per_s'] / 1e9:.1f} GFLOP/s (n={peak['n']})",
             _datasheet_line(report.get("datasheet_peak")), ""]
    rows = []
    for name, r in report["train"].items():
        if "error" in r:
            rows.append([name, "error: " + r["error"][:80], None, None, None, None, None])
            continue
        rows.append([name, r["samples_per_s"], r["step_s"] * 1e3, r["peak_mem_mib"], r["flops_per_step"] / 1e9,
                     r["mfu"], r.get("mfu_datasheet")])
    parts += ["training step (MFU: of the measured matmul peak; MFU datasheet: of the GPU's datasheet peak)",
              _table(["model", "samples/s", "step ms", "peak MiB", "GFLOP/step", "MFU", "MFU datasheet"], rows), ""]
    parts += [f"captioning and scoring in {report.get('inference_precision', 'fp32')}", ""]
    for key, section in report["caption"].items():
        rows = [[name, r.get("latency_s", 0) * 1e3, r.get("captions_per_s"), r.get("steps"), r.get("note", "")]
                if r.get("available", True) else [name, None, None, None, "not available: " + r["note"]]
                for name, r in section.items()]
        parts += [f"captioning, N'={report['settings']['caption_length']}, {key.replace('_', ' ')}",
                  _table(["method", "latency ms", "captions/s", "steps", "note"], rows), ""]
    rows = [[name, r.get("captions_per_s"), r.get("latency_one_pair_s"), r.get("samples"), r.get("note", "")]
            if r.get("available", True) else [name, None, None, None, "not available: " + r["note"]]
            for name, r in report["scoring"].items()]
    parts += ["scoring", _table(["method", "captions/s", "one pair s", "samples", "note"], rows), ""]
    quality = report.get("quality", {})
    if quality.get("available", True) and quality:
        rows = [[k, v.get("accuracy"), v.get("captions_per_s"), v.get("mean_steps")] for k, v in quality.items()
                if isinstance(v, dict)]
        parts += [f"quality (single-object colour+shape accuracy, trained runs, N'={quality.get('length')})",
                  _table(["method", "accuracy", "captions/s", "mean steps"], rows),
                  f"equal quality: {quality.get('equal_quality')} {quality.get('note', '')}", ""]
    else:
        parts += [f"quality comparison: not measured ({quality.get('note', '')})", ""]
    rows = [[t["target"], t["goal"], t["value"], {True: "reached", False: "missed", None: "not measured"}[t["reached"]]]
            for t in report["targets"]]
    parts += ["targets", _table(["target", "goal", "value", "status"], rows)]
    if "profile" in report:
        parts += ["", f"profile of the {report['settings'].get('profile_row', 'mdc')} training step in the training "
                  "precision (top ops by self device time on CUDA, self CPU time elsewhere)", report["profile"]]
    rows = [[name, r["host_ops"]["aten_ops_per_step"], r["host_ops"]["events_per_step"]]
            for name, r in report["train"].items() if r.get("host_ops")]
    if rows:
        parts += ["", "host operations per training step (torch.profiler counts, 2 steps after the timed ones)",
                  _table(["row", "aten ops", "profiler events"], rows)]
    return "\n".join(parts)
