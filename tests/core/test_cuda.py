"""The CUDA path: bf16 autocast training, CPU/GPU agreement of the loss, sampler and scorers (fp32), bf16
inference as the CUDA default and its agreement with fp32, fused AdamW and train.compile on the GPU, a CUDA-trained
run reloaded on the CPU, and the CLI under torchrun on one GPU. Skipped without a GPU (CI has none); on a GPU
machine run ``pytest tests/core/test_cuda.py`` (``tests/core/test_step_parts.py`` adds the step's sync checks on
CUDA)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mdc_core import checkpoint as ck
from mdc_core.config import ObjectiveConfig, SamplerConfig
from mdc_core.distributed import setup as dist_setup
from mdc_core.factory import load_model
from mdc_core.objectives import compute_loss
from mdc_core.sampler import bf16_enabled, sample
from mdc_core.scoring import score_tokens
from mdc_core.tokenizer import CaptionTokenizer
from mdc_core.train import train
from tests.core.test_precision import trained  # noqa: F401 - the fixture of the bf16 inference test
from tests.train_helpers import micro_run, read_metrics, write_micro_data

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CAPTIONS = ["a red circle", "two blue squares on the left", "a small green triangle above a yellow star", "a"]


@pytest.fixture(autouse=True)
def exact_fp32():
    """CPU/GPU comparisons in true fp32: TF32 matmuls would differ from the CPU by ~1e-3."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_micro_data(tmp_path_factory.mktemp("cuda_data"), 64)


def _batch(n: int = 4, size: int = 32, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    images = torch.randn(n, 3, size, size, generator=gen)
    tokens, _ = CaptionTokenizer(24).tokenize_batch(CAPTIONS[:n])
    return images, tokens


def test_loss_cuda_fp32_matches_cpu_and_bf16_is_close(tiny_model):
    model = tiny_model()
    images, tokens = _batch()
    cfg = ObjectiveConfig(name="mdc")
    # the masks are drawn on the CPU generator and moved: the same noisy captions on both devices
    cpu = compute_loss(model, images, tokens, cfg, torch.Generator().manual_seed(3)).loss
    gpu_model = model.cuda()
    gen = torch.Generator(device="cuda").manual_seed(3)
    fp32 = compute_loss(gpu_model, images.cuda(), tokens.cuda(), cfg, gen).loss
    gen = torch.Generator(device="cuda").manual_seed(3)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        bf16 = compute_loss(gpu_model, images.cuda(), tokens.cuda(), cfg, gen).loss
    assert torch.isfinite(fp32) and torch.isfinite(bf16)
    assert bf16.dtype == torch.float32  # the cross-entropy is taken in fp32 even under autocast
    assert bf16.item() == pytest.approx(fp32.item(), rel=3e-2)
    # CPU and CUDA generators differ, so compare the deterministic objective (every caption token masked)
    full = ObjectiveConfig(name="parallel")
    cpu = compute_loss(model.cpu(), images, tokens, full).loss
    gpu = compute_loss(model.cuda(), images.cuda(), tokens.cuda(), full).loss
    assert gpu.item() == pytest.approx(cpu.item(), rel=1e-4)


def test_sampler_and_scorers_cuda_match_cpu(tiny_model):
    model = tiny_model(seed=1)
    images, tokens = _batch(seed=1)
    cfg = SamplerConfig(length=6)
    cpu = sample(model, model.encode_image(images), cfg)
    gpu_model = model.cuda()
    gpu = sample(gpu_model, gpu_model.encode_image(images.cuda()), cfg, precision="fp32")  # CUDA's default: bf16
    assert torch.equal(gpu.tokens.cpu(), cpu.tokens)
    assert torch.equal(gpu.reveal_step.cpu(), cpu.reveal_step)
    torch.testing.assert_close(gpu.reveal_confidence.cpu(), cpu.reveal_confidence, rtol=1e-4, atol=1e-5)
    for method in ("heuristic", "mc"):
        a = score_tokens(model.cpu(), model.encode_image(images), tokens, method, samples=64, seed=0)
        b = score_tokens(model.cuda(), model.encode_image(images.cuda()), tokens.cuda(), method, samples=64, seed=0,
                         precision="fp32")
        if method == "heuristic":  # deterministic: the same order, the same log-probabilities
            torch.testing.assert_close(b.score.cpu(), a.score, rtol=1e-4, atol=1e-4)
        else:  # the masks come from each device's own generator: agree within the estimators' noise
            gap = (b.score.cpu() - a.score).abs()
            assert (gap <= 4 * (a.stderr + b.stderr.cpu()) + 1e-3).all(), (a.score, b.score)


def test_bf16_training_on_cuda_learns_and_reloads_on_cpu(data, tmp_path):
    """120 steps: at 40 the rule failed on an H200 (4.11 -> 3.35) exactly as fp32 on the CPU does with the same seeds
    and data (4.11 -> 3.32, benchmarks/precision_curves.py): that budget was too small, bf16 was not slower. At 120
    steps fp32 on the CPU reaches 4.11 -> 2.16."""
    cfg = micro_run(data, 'train.device="cuda"', steps=120, batch_size=16, lr=3e-3, ckpt_every=60)
    result = train(cfg, tmp_path / "run", progress=False)
    rows = read_metrics(tmp_path / "run")
    assert rows and all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    first, last = sum(r["loss"] for r in rows[:5]) / 5, sum(r["loss"] for r in rows[-5:]) / 5
    assert last < 0.8 * first, (first, last)  # bf16 autocast trains, it does not just run
    model, saved = load_model(result.run_dir)
    assert next(model.parameters()).device.type == "cpu" and saved.train.device == "cuda"
    images, _ = _batch()
    out = sample(model, model.encode_image(images), saved.sampler)
    assert out.tokens.shape == (4, saved.sampler.length)
    # the CUDA-trained weights caption identically on the GPU (fp32) and the CPU
    gpu = load_model(tmp_path / "run", device="cuda")[0]
    gpu_out = sample(gpu, gpu.encode_image(images.cuda()), saved.sampler, precision="fp32")
    assert torch.equal(gpu_out.tokens.cpu(), out.tokens)


def test_bf16_is_the_cuda_inference_default_and_agrees_with_fp32(trained):  # noqa: F811 - the imported fixture
    model, image_tokens, tokens, _ = trained
    model, image_tokens, tokens = model.cuda(), image_tokens.cuda(), tokens.cuda()
    assert bf16_enabled("auto", "cuda")
    cfg = SamplerConfig(length=len(CaptionTokenizer(24).encode_text("a red circle on the left")))
    default, bf16, fp32 = (sample(model, image_tokens, cfg, precision=p) for p in (None, "bf16", "fp32"))
    assert torch.equal(default.tokens, bf16.tokens) and torch.equal(default.reveal_confidence, bf16.reveal_confidence)
    assert (bf16.tokens == fp32.tokens).float().mean() >= 0.99
    a, b = (score_tokens(model, image_tokens, tokens, "mc", samples=128, seed=0, precision=p) for p in ("fp32", None))
    assert ((b.score - a.score).abs() <= 2 * a.stderr).all()


def test_fused_adamw_and_compiled_training_on_cuda(data, tmp_path):
    result = train(micro_run(data, 'train.device="cuda"', "train.compile=true", steps=6, batch_size=8,
                             ckpt_every=6, ema_decay=0.9), tmp_path / "compiled", progress=False)
    rows = read_metrics(tmp_path / "compiled")
    assert result.steps == 6 and all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)


def test_cuda_graph_step_trains_like_the_eager_step(data, tmp_path):
    """train.compile=reduce-overhead (static shapes, CUDA graphs) gives the eager step's losses in fp32, and under
    bf16 trains with finite losses."""
    losses = {}
    for name, extra in (("eager", []), ("graphs", ["train.compile=reduce-overhead"])):
        cfg = micro_run(data, 'train.device="cuda"', 'train.precision="fp32"', *extra, steps=8, batch_size=8,
                        ckpt_every=8, ema_decay=0.9)
        train(cfg, tmp_path / name, progress=False)
        losses[name] = torch.tensor([r["loss"] for r in read_metrics(tmp_path / name)])
    torch.testing.assert_close(losses["graphs"], losses["eager"], rtol=2e-3, atol=2e-3)
    cfg = micro_run(data, 'train.device="cuda"', "train.compile=reduce-overhead", steps=8, batch_size=8, ckpt_every=8)
    train(cfg, tmp_path / "bf16", progress=False)
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in read_metrics(tmp_path / "bf16"))


def test_cli_trains_on_cuda_under_torchrun(data, tmp_path):
    """`torchrun --nproc_per_node=1 -m mdc_workbench train` on a GPU machine: the run lands on cuda:0 with bf16."""
    run = tmp_path / "torchrun"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1", "--master_port=29531",
           "-m", "mdc_workbench", "train", "--preset", "tiny", "--data", str(data), "--out", str(run), "--steps", "6",
           "--set", "model.image_size=32", "--set", "train.batch_size=8", "--set", "train.log_every=1",
           "--set", "train.ckpt_every=6", "--set", "train.warmup_steps=1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "(cuda)" in proc.stderr + proc.stdout  # the trainer's "global batch ... devices (cuda)" line
    rows = read_metrics(run)
    assert rows[-1]["step"] == 6 and all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    assert ck.latest_checkpoint(run) is not None


def test_more_ranks_than_gpus_is_a_clear_error(monkeypatch):
    # what `torchrun --nproc_per_node=N` with N > GPUs looks like to the rank that has no GPU of its own
    n = torch.cuda.device_count()
    monkeypatch.setenv("RANK", str(n))
    monkeypatch.setenv("WORLD_SIZE", str(n + 1))
    monkeypatch.setenv("LOCAL_RANK", str(n))
    with pytest.raises(RuntimeError, match="lower --nproc_per_node"):
        dist_setup("auto")
