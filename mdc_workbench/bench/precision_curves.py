"""Loss curves of one tiny training run in fp32 and bf16 autocast, same seeds and data, side by side.

Answers whether bf16 training learns slower than fp32 or a test's budget is too small: ``tests/core/test_cuda.py``'s
``test_bf16_training_on_cuda_learns_and_reloads_on_cpu`` setting (a micro model, 40 steps of batch 16, lr 3e-3)
trained as fp32 on the CPU and, where CUDA exists, fp32 and bf16 on the GPU, each also at 3x the steps.

    python -m mdc_workbench.bench.precision_curves --out precision_curves.json [--devices cpu,cuda]

(``make gpu-check`` runs it as one of its phases.)
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from mdc_core.config import RunConfig, load_preset
from mdc_core.train import train
from mdc_workbench.data.synth import write_synthetic_dataset

# the micro captioner of the test suite (tests/conftest.py MICRO): 32 px, one ViT block of width 32, two decoder layers
MICRO = dict(encoder="vit_base_patch32_224", image_size=32,
             encoder_kwargs={"patch_size": 8, "embed_dim": 32, "depth": 1, "num_heads": 2},
             text_width=32, text_layers=2, text_heads=2, context_length=24)


def micro_config(data: Path, device: str, precision: str, steps: int) -> RunConfig:
    items = [f"model.{k}={json.dumps(v)}" for k, v in MICRO.items()]
    items += ['model.output_vocab="corpus"', f"data.path={json.dumps(str(data))}", "data.shuffle_buffer=16",
              f'train.device="{device}"', f'train.precision="{precision}"', "train.warmup_steps=2",
              "train.log_every=1", "sampler.length=6", f"train.steps={steps}", "train.batch_size=16",
              "train.lr=0.003", f"train.ckpt_every={steps}"]
    return load_preset("tiny", items)


def curve(data: Path, device: str, precision: str, steps: int, out: Path) -> dict:
    train(micro_config(data, device, precision, steps), out, progress=False)
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
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
        data = Path(tmp) / "data"
        write_synthetic_dataset(data, 64, image_size=32, n_val=8, n_test=8, n_compgen=8, shard_size=8,
                                progress=False, workers=1)
        for device in args.devices.split(","):
            for precision in (["fp32"] if device == "cpu" else ["fp32", "bf16"]):
                for steps in (40, 120):
                    row = curve(data, device, precision, steps, Path(tmp) / f"{device}_{precision}_{steps}")
                    print(json.dumps({k: v for k, v in row.items() if k != "loss"}), flush=True)
                    rows.append(row)
    Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
