"""Loss curves of one tiny training run in fp32 and bf16 autocast, same seeds and data, side by side.

Answers whether bf16 training learns slower than fp32 or a test's budget is too small: ``tests/test_cuda.py``'s
``test_bf16_training_on_cuda_learns_and_reloads_on_cpu`` setting (the micro model, 40 steps of batch 16, lr 3e-3)
trained as fp32 on the CPU and, where CUDA exists, fp32 and bf16 on the GPU, each also at 3x the steps.

    python benchmarks/precision_curves.py --out precision_curves.json [--devices cpu,cuda]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mdc_core.train import train  # noqa: E402
from tests.train_helpers import micro_run, read_metrics, write_micro_data  # noqa: E402


def curve(data: Path, device: str, precision: str, steps: int, out: Path) -> dict:
    cfg = micro_run(data, f'train.device="{device}"', f'train.precision="{precision}"', steps=steps, batch_size=16,
                    lr=3e-3, ckpt_every=steps)
    train(cfg, out, progress=False)
    losses = [r["loss"] for r in read_metrics(out)]
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    return {"device": device, "precision": precision, "steps": steps, "loss": losses, "first5": first,
            "last5": last, "ratio": last / first, "passes_test_rule": last < 0.8 * first}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--devices", default="cpu,cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = write_micro_data(Path(tmp) / "data", 64)
        for device in args.devices.split(","):
            for precision in (["fp32"] if device == "cpu" else ["fp32", "bf16"]):
                for steps in (40, 120):
                    row = curve(data, device, precision, steps, Path(tmp) / f"{device}_{precision}_{steps}")
                    print(json.dumps({k: v for k, v in row.items() if k != "loss"}), flush=True)
                    rows.append(row)
    Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
