"""Measuring primitives of ``mdc bench``: its settings, the device, median timings, the matmul peak, one batch of
embedded-data inputs and the machine's description. :mod:`mdc_workbench.bench.run` puts them together."""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mdc_core.config import RunConfig
from mdc_core.distributed import sync
from mdc_core.tokenizer import CaptionTokenizer, build_output_vocab


@dataclass
class BenchConfig:
    """What ``mdc bench`` measures and how long it tries."""

    preset: str = "tiny_vit"  # model dimensions, batch size and image size come from this preset (a plain ViT,
    # which open_clip's CoCa can mirror)
    overrides: list[str] = field(default_factory=list)  # section.key=value applied to the preset
    device: str = "auto"  # auto | cpu | cuda
    precision: str = "auto"  # captioning and scoring rows: auto (bf16 on GPUs with bf16, else fp32) | fp32 | bf16
    threads: int = 0  # torch.set_num_threads (0 = torch's default)
    train_rows: tuple[str, ...] = ("mdc", "mdc_full_vocab", "mdc_compiled", "arc", "coca", "coca_open_clip_layout")
    train_steps: int = 10  # timed optimizer steps per row (median)
    train_warmup: int = 3  # untimed steps first (compilation happens here)
    caption_length: int = 20  # N' of the speed table
    caption_batches: tuple[int, ...] = (1, 64)
    threshold: float = 0.9  # confidence threshold of parallel decoding (Fast-dLLM's default)
    repeats: int = 5  # timed repeats of every decoding/scoring measurement (median)
    score_pairs: int = 64  # image-caption pairs for the heuristic scorer's throughput
    mc_samples: int = 1024  # Monte Carlo samples per pair
    mc_pairs: int = 8  # pairs for the Monte Carlo throughput (latency is measured on one)
    matmul_size: int = 0  # n of the n x n matmul peak (0 = 2048 on CPU, 8192 on CUDA)
    mdc_run: str = ""  # optional trained MDC run: adds the quality comparison of parallel decoding
    arc_run: str = ""  # optional trained ARC run for the same comparison
    quality_images: int = 256  # test images for the quality comparison
    profile_rows: int = 0  # > 0: add a torch.profiler top-ops table of the training step of row `profile_row`
    profile_row: str = "mdc"  # the training row the profile shows (mdc_workbench.bench.training.TRAIN_SPECS)
    count_ops: bool = False  # add each training row's host operations per step (profiler counts)
    sections: tuple[str, ...] = ("caption", "scoring", "quality")  # measured besides the training rows
    row_timeout_s: float = 600.0  # a training row (compile, warm-up, timed steps) running longer is an error
    isolate: bool = True  # one fresh process per training row (exact peak memory; costs an import each)

    @classmethod
    def quick(cls, **kw: Any) -> BenchConfig:
        """Seconds instead of minutes: few steps and repeats, small batches, no torch.compile row."""
        base = dict(train_rows=("mdc", "arc", "coca"), train_steps=2, train_warmup=1, caption_batches=(1, 4),
                    repeats=1, score_pairs=4, mc_samples=32, mc_pairs=2, matmul_size=256, quality_images=16)
        return cls(**{**base, **kw})


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {name} but CUDA is not available on this machine")
    return torch.device(name)


def median_time(fn: Callable[[], Any], *, repeats: int, warmup: int = 1,
                device: torch.device | None = None) -> tuple[float, Any]:
    """(median seconds of `repeats` calls of `fn` after `warmup` untimed calls, the last call's result)."""
    device = device or torch.device("cpu")
    out = None
    for _ in range(warmup):
        out = fn()
    sync(device)
    times = []
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        out = fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


# Datasheet peaks of dense bf16 tensor-core matmuls (no structured sparsity: half the "with sparsity" figure the
# datasheets print first), TFLOP/s, by a pattern of the name torch.cuda.get_device_name gives. The figure
# nanoGPT-style MFU reports divide by; the first pattern that matches the name wins (NVL and PCIe before SXM).
DATASHEET_BF16_TFLOPS: tuple[tuple[str, float, str], ...] = (
    (r"\bH200 NVL\b", 835.5, "NVIDIA H200 NVL datasheet: 1,671 TFLOPS BF16 with sparsity"),
    (r"\bH200\b", 989.5, "NVIDIA H200 SXM datasheet: 1,979 TFLOPS BF16 with sparsity"),
    (r"\bGH200\b", 989.5, "NVIDIA GH200 datasheet (H100/H200 GPU): 1,979 TFLOPS BF16 with sparsity"),
    (r"\bH100 NVL\b", 835.5, "NVIDIA H100 NVL datasheet: 1,671 TFLOPS BF16 with sparsity"),
    (r"\bH100 PCIe\b", 756.5, "NVIDIA H100 PCIe datasheet: 1,513 TFLOPS BF16 with sparsity"),
    (r"\bH100\b", 989.5, "NVIDIA H100 SXM datasheet: 1,979 TFLOPS BF16 with sparsity"),
    (r"\bB200\b", 2250.0, "NVIDIA HGX B200 datasheet, per GPU: 4.5 PFLOPS BF16 with sparsity"),
    (r"\bA100\b", 312.0, "NVIDIA A100 datasheet: 312 TFLOPS BF16 (624 with sparsity)"),
    (r"\bL40S\b", 362.05, "NVIDIA L40S datasheet: 362.05 TFLOPS BF16 (733 with sparsity)"),
    (r"\bL40\b", 181.05, "NVIDIA L40 datasheet: 181.05 TFLOPS BF16 (362.1 with sparsity)"),
    (r"\bL4\b", 121.0, "NVIDIA L4 datasheet: 242 TFLOPS BF16 with sparsity"),
    (r"\bA10\b", 125.0, "NVIDIA A10 datasheet: 125 TFLOPS BF16 (250 with sparsity)"),
)


def datasheet_peak(device_name: str) -> dict[str, Any] | None:
    """The datasheet's dense bf16 peak of the GPU named `device_name` (:data:`DATASHEET_BF16_TFLOPS`): its FLOP/s,
    the pattern it matched and the source of the figure; None for a device the table does not know (a CPU)."""
    for pattern, tflops, source in DATASHEET_BF16_TFLOPS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return {"device": device_name, "flops_per_s": tflops * 1e12, "dtype": "bfloat16 dense",
                    "matched": pattern, "source": source}
    return None


def matmul_peak(device: torch.device, n: int, repeats: int = 5, dtype: torch.dtype = torch.float32
                ) -> dict[str, Any]:
    """Measured matmul throughput in `dtype`: the median of `repeats` (n x n) @ (n x n) products (TF32 off)."""
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        seconds, _ = median_time(lambda: torch.mm(a, b), repeats=repeats, warmup=2, device=device)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return {"n": n, "dtype": str(dtype).removeprefix("torch."), "seconds": seconds, "flops_per_s": 2 * n**3 / seconds}


# ----------------------------------------------------------------------------------------------------------
# inputs: one fixed batch of the embedded data set


def bench_inputs(cfg: RunConfig, batch: int, vocab_examples: int = 500) -> dict[str, Any]:
    """The payload every measurement shares: images (B, 3, H, W) and tokens (B, L) of the first `batch`
    training examples of the embedded generator (seed 0), the corpus output vocabulary built from the short
    and long captions of `vocab_examples` examples, and the run config as a dict."""
    from mdc_core.transforms import load_image
    from mdc_workbench.data import make_example

    tokenizer = CaptionTokenizer(cfg.model.context_length)
    examples = [make_example(0, "train", i, image_size=cfg.model.image_size)
                for i in range(max(batch, vocab_examples))]
    metas = [json.loads(e["json"]) for e in examples]
    images = torch.stack([load_image(e["jpg"], cfg.model.image_size) for e in examples[:batch]])
    tokens = tokenizer([e["txt"] for e in examples[:batch]])
    output_ids = None
    if cfg.model.output_vocab == "corpus":
        output_ids = build_output_vocab((c for m in metas for c in (m["short_caption"], m["long_caption"])),
                                        tokenizer)
        cfg.model.output_vocab_size = len(output_ids)
    return {"run_config": cfg.to_dict(), "images": images, "tokens": tokens, "output_ids": output_ids}


def machine_info(device: torch.device) -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        names = [ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                 if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    info = {"cpu": cpu, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(), "device": str(device),
            "load_average_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    try:
        import open_clip
        info["open_clip"] = open_clip.__version__
    except ImportError:
        info["open_clip"] = None
    return info
