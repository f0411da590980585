"""Device check of the central claim's measure (mdc_workbench.eval.central_claim), not yet run on a GPU.

Builds randomly initialised `tiny` ARC and MDC captioners (full vocabulary), scores random captions on random
images with the image-gradient norm and the in-distribution PMI on the CPU and on CUDA (the same weights and mask
draws: the values must agree to float32 precision, `max_rel_diff`), then times 1024 captions with 8 mask draws and
a pool of 16 images on CUDA. Writes $OUT/gpu_check_p39.json (or ./gpu_check_p39.json).

    python -m mdc_workbench.bench.central_claim_device_check 32   # 32 captions for the CPU/CUDA check
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

from mdc_core.config import load_preset
from mdc_core.factory import create_model
from mdc_core.tokenizer import EOT_ID, PAD_ID, SOT_ID
from mdc_workbench.eval.central_claim import score_captions


def batches(n, B=32, L=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(0, n, B):
        toks = torch.full((B, L), PAD_ID)
        k = torch.randint(8, L - 2, (B,), generator=g)
        for b in range(B):
            kb = int(k[b])
            toks[b, 0], toks[b, kb + 1] = SOT_ID, EOT_ID
            toks[b, 1:kb + 1] = torch.randint(1, 400, (kb,), generator=g)
        out.append((torch.randn(B, 3, 64, 64, generator=g), toks, ["predictable", "unpredictable"] * (B // 2)))
    return out


def run(obj, device, n, draws):
    torch.manual_seed(0)
    cfg = load_preset("tiny", ["model.output_vocab=full", f"objective.name={obj}"])
    model = create_model(cfg, obj).to(device).eval()
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    s = score_captions(model, batches(n), objective=cfg.objective, draws=draws, pool=15)
    if device == "cuda":
        torch.cuda.synchronize()
    return s, time.perf_counter() - t0


def flat(rows):
    return torch.tensor([v for r in rows for v in r if v is not None], dtype=torch.float64)


def main(small: int) -> dict:
    """Compare CPU and CUDA on `small` captions per objective, time 1024 captions on CUDA, write the JSON file."""
    if not torch.cuda.is_available():
        raise SystemExit("central_claim_device_check needs a CUDA device (it compares CPU and CUDA scores)")
    out = {}
    for obj in ("arc", "mdc"):
        cpu, t_cpu = run(obj, "cpu", small, 2)
        gpu, t_gpu = run(obj, "cuda", small, 2)
        for m in ("gradient", "pmi"):
            a, b = flat(getattr(cpu, m)), flat(getattr(gpu, m))
            same = a.shape == b.shape
            out[f"{obj}/{m}"] = {"n": len(a), "same_positions": same, "max_rel_diff":
                                 float(((a - b).abs() / a.abs().clamp(min=1e-3)).max()) if same else None}
        out[f"{obj}/seconds_small"] = {"cpu": round(t_cpu, 2), "cuda": round(t_gpu, 2)}
        _, t_big = run(obj, "cuda", 1024, 8)
        out[f"{obj}/seconds_1024_captions_8_draws_cuda"] = round(t_big, 2)
        print(obj, out, flush=True)
    out["device"] = torch.cuda.get_device_name(0)
    os.makedirs(os.environ.get("OUT", "."), exist_ok=True)
    with open(os.path.join(os.environ.get("OUT", "."), "gpu_check_p39.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main(int(sys.argv[1]))
