"""``train.compile_step``: the whole step (forward, loss, backward, clipping, AdamW, EMA) as one compiled region.

Over 20 steps it gives the eager step's losses, gradient norms, weights and EMA weights within tolerances scaled to
each tensor; a compiled run stopped at step 10 and resumed ends exactly where the uninterrupted compiled run ends.
The compiled runs use ``aot_eager`` (dynamo and AOTAutograd trace the region as inductor would, without generating
code), so the test measures the capture, not a CPU code generator.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mdc_core import checkpoint as ck
from mdc_core import train as train_module
from mdc_core.config import ConfigError
from mdc_core.loss_step import LossStep, WholeStep, compile_mode
from mdc_core.train import train
from tests.numerics import assert_close_to_scale
from tests.train_helpers import (  # noqa: F401 - one_thread: a fixture
    assert_same_metrics,
    micro_run,
    one_thread,
    read_metrics,
    write_micro_data,
)

pytestmark = pytest.mark.usefixtures("one_thread")
# clipping and EMA on; the lr warm-up and cosine reach the compiled step through its lr tensor
SETTINGS = dict(batch_size=4, grad_clip=0.5, ema_decay=0.9, keep_last=3)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_micro_data(tmp_path_factory.mktemp("whole_step_data"), 32)


@pytest.fixture
def aot_eager(monkeypatch):
    monkeypatch.setattr(train_module, "LossStep", functools.partial(LossStep, backend="aot_eager"))


def _weights(run: Path, name: str) -> dict[str, torch.Tensor]:
    return load_file(str(ck.latest_checkpoint(run) / name))


def test_compile_step_needs_one_micro_batch_and_the_stop_policy(data):
    with pytest.raises(ConfigError, match="train.compile_step needs train.grad_accum=1 and train.nonfinite=stop"):
        micro_run(data, compile_step=True, grad_accum=2)
    with pytest.raises(ConfigError, match="train.compile_step needs train.grad_accum=1 and train.nonfinite=stop"):
        micro_run(data, compile_step=True, nonfinite="skip")
    cfg = micro_run(data, compile_step=True).train
    assert compile_mode(cfg, "cpu") == "default"  # compiles even where train.compile=auto would not
    assert compile_mode(micro_run(data, compile_step=True, compile="max-autotune").train, "cpu") == "max-autotune"
    assert compile_mode(micro_run(data).train, "cpu") is None and not micro_run(data).train.compile_step


def test_the_lr_is_a_tensor_only_for_the_compiled_step(data):
    on, off = micro_run(data, compile_step=True).train, micro_run(data).train
    assert WholeStep.lr(0.25, off, None) == 0.25 and isinstance(WholeStep.lr(0.25, off, None), float)
    held = WholeStep.lr(0.25, on, None)
    assert torch.is_tensor(held) and float(held) == 0.25 and WholeStep.lr(held, on, None) is held


@pytest.mark.slow  # three compiled micro runs: minutes on two busy cores
def test_compiled_whole_step_matches_the_eager_step_and_resumes_exactly(data, tmp_path, aot_eager):
    eager = train(micro_run(data, steps=20, ckpt_every=20, **SETTINGS), tmp_path / "eager", progress=False)
    whole_cfg = micro_run(data, steps=20, ckpt_every=10, compile_step=True, **SETTINGS)
    whole = train(whole_cfg, tmp_path / "whole", progress=False)
    assert eager.steps == whole.steps == 20
    a, b = read_metrics(tmp_path / "eager"), read_metrics(tmp_path / "whole")
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, 21))
    for ra, rb in zip(a, b, strict=True):  # scaled to each figure: rounding differs, the arithmetic must not
        for key in ("loss", "grad_norm", "lr"):
            assert abs(ra[key] - rb[key]) <= 1e-4 * max(1.0, abs(ra[key])), (ra["step"], key, ra[key], rb[key])
    assert any(r["grad_norm"] > SETTINGS["grad_clip"] for r in a)  # clipping was active
    for name in ("model.safetensors", "ema.safetensors"):
        we, ww = _weights(tmp_path / "eager", name), _weights(tmp_path / "whole", name)
        assert we.keys() == ww.keys()
        for key in we:
            if we[key].is_floating_point():  # an attention's key bias has no gradient (softmax ignores a constant
                # per query): AdamW scales its rounding noise up to lr-sized steps, which differ between the two
                rel = 1e-3 if key.endswith("kv.bias") else 1e-4
                assert_close_to_scale(ww[key], we[key], rel=rel, msg=f"{name} {key}")
            else:  # the token-id tables
                assert torch.equal(ww[key], we[key]), (name, key)
    assert any(not torch.equal(we[k], _weights(tmp_path / "eager", "model.safetensors")[k]) for k in we)  # EMA lags

    # stopped after its step-10 checkpoint and resumed: the uninterrupted compiled run, to the bit
    with pytest.raises(Stopped):
        train(whole_cfg, tmp_path / "resumed", progress=False, hooks=[StopAt])
    assert ck.latest_checkpoint(tmp_path / "resumed").name == "step_00000010"
    train(whole_cfg, tmp_path / "resumed", resume=True, progress=False)
    assert_same_metrics(read_metrics(tmp_path / "resumed"), read_metrics(tmp_path / "whole"), rel=0.0)
    for name in ("model.safetensors", "ema.safetensors"):
        wr, ww = _weights(tmp_path / "resumed", name), _weights(tmp_path / "whole", name)
        assert all(torch.equal(wr[k], ww[k]) for k in ww), name


class Stopped(Exception):
    pass


class StopAt:
    """A run hook that stops the run (an exception, as a crash) after its step-10 checkpoint."""

    def __init__(self, run_dir, start_step, cfg) -> None:
        pass

    def record(self, record) -> None:
        pass

    def checkpoint(self, step, model) -> None:
        if step == 10:
            raise Stopped

    def close(self) -> None:
        pass


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_whole_step_with_cuda_graphs_trains_like_the_eager_step(data, tmp_path):
    """On CUDA (inductor, CUDA graphs, fused capturable AdamW with a device lr, EMA in the graph) in fp32: the eager
    step's losses and gradient norms over 8 steps."""
    rows = {}
    for name, extra in (("eager", []), ("whole", ["train.compile=reduce-overhead", "train.compile_step=true"])):
        cfg = micro_run(data, 'train.device="cuda"', 'train.precision="fp32"', *extra, steps=8, ckpt_every=8,
                        **{**SETTINGS, "batch_size": 8})
        train(cfg, tmp_path / name, progress=False)
        rows[name] = torch.tensor([[r["loss"], r["grad_norm"]] for r in read_metrics(tmp_path / name)])
    torch.testing.assert_close(rows["whole"], rows["eager"], rtol=2e-3, atol=2e-3)
