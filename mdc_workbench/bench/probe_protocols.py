"""Converged (L-BFGS) vs CLIP-benchmark probe on the same cached features of the `tiny` preset's encoder,
randomly initialised (seed 0), over a 2000-image embedded set with 512 test images (docs/evidence.md).

    OMP_NUM_THREADS=1 python -m mdc_workbench.bench.probe_protocols [WORK_DIR]   # default /tmp/probe_protocols
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from mdc_core.checkpoint import save_checkpoint
from mdc_core.config import load_preset
from mdc_core.factory import create_model
from mdc_workbench.data import write_synthetic_dataset
from mdc_workbench.eval.probe_data import probe_run

TASKS = ["shape", "colour", "count", "position", "background"]


def main(work: Path = Path("/tmp/probe_protocols")) -> dict:
    """Write the data set and the random-init run under `work` (once), then time both probe protocols on the same
    cached features; returns (and prints) each protocol's top-1 per task and its wall and CPU seconds."""
    data, run = work / "data", work / "tiny_random"
    if not (data / "manifest.json").exists():
        write_synthetic_dataset(data, 2000, image_size=64, captions="short", n_val=64, n_test=512, n_compgen=16,
                                progress=False)
    if not run.exists():
        cfg = load_preset("tiny", [f'data.path="{data}"', 'model.output_vocab="full"'])
        torch.manual_seed(cfg.train.seed)  # the model training would start from
        save_checkpoint(run, 0, cfg, create_model(cfg, "mdc"))
    probe_run(run, data, task=TASKS, c=1.0)  # extracts and caches the features: the timings below are the probes
    out = {}
    for protocol in ("lbfgs", "clip_benchmark"):
        wall, cpu = time.perf_counter(), time.process_time()
        res = probe_run(run, data, task=TASKS, protocol=protocol)
        out[protocol] = {"top1 %": {t: round(100 * r["top1"], 1) for t, r in res["tasks"].items()},
                         "wall_s": round(time.perf_counter() - wall, 1),
                         "cpu_s": round(time.process_time() - cpu, 1)}
        print(protocol, json.dumps(out[protocol]), flush=True)
    return out


if __name__ == "__main__":
    main(*(Path(a) for a in sys.argv[1:2]))
