"""The training loop: schedule, loss normalisation, accumulation == bigger batch, clipping, EMA, NaN policy,
corrupt data counted per epoch."""

import logging
import math
from pathlib import Path

import pytest
import torch
import webdataset as wds
from safetensors.torch import load_file

import mdc_core.train as train_mod
from mdc_core import checkpoint as ck
from mdc_core import loss_step
from mdc_core.config import ConfigError, ObjectiveConfig
from mdc_core.loss_step import HostBatches
from mdc_core.objectives import prepare_batch
from mdc_core.tokenizer import CaptionTokenizer
from mdc_core.train import TrainingDiverged, lr_lambda, step_seed, train
from mdc_workbench.data import make_example
from tests.train_helpers import (
    micro_run,
    one_thread,  # noqa: F401 - a fixture
    read_metrics,
    write_micro_data,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("train_data")
    return write_micro_data(root, 32)


def test_lr_schedule_hand_values():
    # warm-up 10 steps to the peak, cosine over the remaining 100 steps to min_ratio
    assert lr_lambda(0, 10, 110, 0.0) == pytest.approx(0.1)
    assert lr_lambda(9, 10, 110, 0.0) == pytest.approx(1.0)
    assert lr_lambda(10, 10, 110, 0.0) == pytest.approx(1.0)
    assert lr_lambda(60, 10, 110, 0.0) == pytest.approx(0.5)  # half-way: (1 + cos(pi/2)) / 2
    assert lr_lambda(35, 10, 110, 0.0) == pytest.approx((1 + math.cos(math.pi / 4)) / 2)
    assert lr_lambda(110, 10, 110, 0.0) == pytest.approx(0.0)
    assert lr_lambda(60, 10, 110, 0.1) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_lambda(500, 10, 110, 0.1) == pytest.approx(0.1)  # past the end: the floor
    assert lr_lambda(0, 0, 100, 0.0) == pytest.approx(1.0)  # no warm-up


def host_terms(model, tokens: torch.Tensor, objective: ObjectiveConfig, seed: int = 0) -> int:
    """What the trainer divides a micro-batch's summed loss by: the terms HostBatches counts (ReadyBatch.terms)."""
    return HostBatches(model, objective, torch.device("cpu"))(tokens, seed).terms


def test_the_trainers_loss_terms_hand_values(tiny_model):
    tokens, _ = CaptionTokenizer(8).tokenize_batch(["a red circle", "a"])  # <sot> a red circle <eot> / <sot> a <eot>
    model = tiny_model()
    assert host_terms(model, tokens, ObjectiveConfig(name="mdc")) == 3 + 1  # maskable caption tokens
    assert host_terms(model, tokens, ObjectiveConfig(name="mdc", normalization="per_sequence")) == 2
    assert host_terms(tiny_model(causal=True), tokens, ObjectiveConfig(name="arc")) == 4 + 2  # next tokens + <eot>
    assert step_seed(0, 5, 1) == step_seed(0, 5, 1) != step_seed(0, 5, 2) != step_seed(0, 6, 1)


@pytest.mark.parametrize("normalization", ["per_token", "per_sequence"])
def test_a_per_masked_token_denominator_counts_the_losss_own_draws(normalization, tiny_model):
    """cmlm divides by its masked tokens: the trainer counts them from the micro-batch's masking seed, and they
    are the masks prepare_batch draws from that seed."""
    tokens, _ = CaptionTokenizer(12).tokenize_batch(["a red circle left of a blue square", "a", "two small stars"])
    cfg = ObjectiveConfig(name="cmlm", normalization=normalization)
    model, out_index = tiny_model(), torch.arange(49409)
    counts = []
    for seed in range(6):
        mask = prepare_batch(tokens, cfg, torch.Generator().manual_seed(seed), output_index=out_index).loss_mask
        want = int(mask.sum()) if normalization == "per_token" else int((mask.sum(dim=1) > 0).sum())
        counts.append(host_terms(model, tokens, cfg, seed))
        assert counts[-1] == want
    assert len(set(counts)) > 1  # the draws, not the captions, decide it


def test_config_rejects_unknown_nonfinite_policy(data):
    with pytest.raises(ConfigError, match="train.nonfinite"):
        micro_run(data, nonfinite="ignore")


@pytest.mark.parametrize("objective,normalization", [("arc", "per_token"), ("parallel", "per_sequence"),
                                                     ("mdc", "per_token"), ("cmlm", "per_token")])
def test_accumulation_equals_one_bigger_batch(data, tmp_path, objective, normalization):
    # the same 8 samples as 1 batch of 8 or 2 micro-batches of 4: same loss, same gradient, same update
    # (the captions differ in length, so dividing each micro-batch by its own token count would not agree)
    common = [f"objective.name={objective}", f"objective.normalization={normalization}"]
    big = micro_run(data, *common, steps=2, batch_size=8, grad_accum=1, ckpt_every=2)
    acc = micro_run(data, *common, steps=2, batch_size=4, grad_accum=2, ckpt_every=2)
    if objective in ("mdc", "cmlm"):  # masks drawn per micro-batch: compare at t ~ 1
        big = micro_run(data, *common, "objective.t_low=0.999", steps=2, batch_size=8, ckpt_every=2)
        acc = micro_run(data, *common, "objective.t_low=0.999", steps=2, batch_size=4, grad_accum=2, ckpt_every=2)
    train(big, tmp_path / "big", progress=False)
    train(acc, tmp_path / "acc", progress=False)
    for a, b in zip(read_metrics(tmp_path / "big"), read_metrics(tmp_path / "acc"), strict=True):
        for key in ("loss", "grad_norm"):
            tol = 1e-5 if objective not in ("mdc", "cmlm") else 2e-2  # t ~ 1: almost every token masked either way
            assert a[key] == pytest.approx(b[key], rel=tol), key
    if objective not in ("mdc", "cmlm"):
        wa, wb = (load_file(str(ck.latest_checkpoint(tmp_path / r) / "model.safetensors")) for r in ("big", "acc"))
        assert all(torch.allclose(wa[k], wb[k], atol=1e-5) for k in wa)


class _RecordingAdamW(torch.optim.AdamW):
    seen: list[float] = []

    def step(self, closure=None):
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        _RecordingAdamW.seen.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))
        return super().step(closure)


def test_grad_clipping_caps_the_norm_the_optimizer_sees(data, tmp_path, monkeypatch):
    monkeypatch.setattr(train_mod.torch.optim, "AdamW", _RecordingAdamW)
    _RecordingAdamW.seen = []
    train(micro_run(data, steps=3, batch_size=4, grad_clip=0.05, ckpt_every=3), tmp_path / "clip", progress=False)
    logged = [r["grad_norm"] for r in read_metrics(tmp_path / "clip")]  # the norm before clipping
    assert all(n > 0.05 for n in logged)
    assert _RecordingAdamW.seen == pytest.approx([0.05] * 3, rel=1e-4)
    _RecordingAdamW.seen = []
    train(micro_run(data, steps=2, batch_size=4, ckpt_every=2), tmp_path / "free", progress=False)
    assert _RecordingAdamW.seen == pytest.approx([r["grad_norm"] for r in read_metrics(tmp_path / "free")], rel=1e-4)


def test_ema_is_the_exponential_average_of_the_weights(data, tmp_path):
    run = tmp_path / "ema"
    train(micro_run(data, steps=2, batch_size=4, ckpt_every=1, keep_last=2, ema_decay=0.75), run, progress=False)
    first, second = ck.list_checkpoints(run)
    w1, w2 = load_file(str(first / "model.safetensors")), load_file(str(second / "model.safetensors"))
    ema = load_file(str(second / "ema.safetensors"))
    for k in w1:  # the first update copies the weights, the second averages: 0.75 * w1 + 0.25 * w2
        if w1[k].is_floating_point():
            assert torch.allclose(ema[k], 0.75 * w1[k] + 0.25 * w2[k], atol=1e-6), k


def _poison(monkeypatch, bad_calls: set[int]) -> None:
    """The step's loss (loss_step.Objective) is NaN on the given call numbers (1-based micro-batches)."""
    real, calls = loss_step.Objective.forward, [0]

    def poisoned(self, *args, **kwargs):
        calls[0] += 1
        loss, metrics = real(self, *args, **kwargs)
        if calls[0] in bad_calls or (-1 in bad_calls and calls[0] > 2):
            loss = loss * float("nan")
        return loss, metrics

    monkeypatch.setattr(loss_step.Objective, "forward", poisoned)


def test_nan_stops_and_keeps_the_last_good_checkpoint(data, tmp_path, monkeypatch):
    _poison(monkeypatch, {3})
    run = tmp_path / "nan"
    with pytest.raises(TrainingDiverged, match=r"loss became nan.*at step 2.*train.nonfinite=stop.*step_00000002"):
        train(micro_run(data, steps=5, batch_size=4, ckpt_every=2), run, progress=False)
    assert ck.latest_checkpoint(run).name == "step_00000002"
    assert [r["step"] for r in read_metrics(run)] == [1, 2]


def test_nan_skip_policy_skips_the_update_and_says_so(data, tmp_path, monkeypatch, capsys):
    _poison(monkeypatch, {3})
    result = train(micro_run(data, steps=4, batch_size=4, ckpt_every=4, nonfinite="skip"), tmp_path / "skip",
                   progress=False)
    assert result.steps == 4 and math.isfinite(result.final_loss)
    records = read_metrics(tmp_path / "skip")
    assert [r["step"] for r in records] == [1, 2, 3, 4] and records[-1]["nonfinite_skipped"] == 1
    assert ck.load_train_state(ck.latest_checkpoint(tmp_path / "skip"))["nonfinite_skipped"] == 1

    _poison(monkeypatch, {-1})  # every update from the second on is non-finite
    with pytest.raises(TrainingDiverged, match="train.max_skipped_steps=2"):
        train(micro_run(data, steps=6, batch_size=4, nonfinite="skip", max_skipped_steps=2), tmp_path / "skip2",
              progress=False)


def test_corrupt_records_and_unreadable_shards_are_counted_per_epoch(tmp_path, caplog):
    d = tmp_path / "data"
    d.mkdir()
    good = [make_example(0, "train", i, 32, captions="short") for i in range(8)]
    (d / "a_unreadable.tar").write_bytes(b"\x00not a tar file" * 50)
    with wds.TarWriter(str(d / "b_mixed.tar")) as w:
        for s in [{"__key__": "bad_truncated", "jpg": good[0]["jpg"][: len(good[0]["jpg"]) // 2], "txt": "a cat"},
                  {"__key__": "bad_encoding", "jpg": good[1]["jpg"], "txt": b"caf\xe9 \xff"},
                  {"__key__": "bad_no_txt", "jpg": good[2]["jpg"]}, *good[:4]]:
            w.write(s)
    with wds.TarWriter(str(d / "c_good.tar")) as w:
        for s in good[4:]:
            w.write(s)
    caplog.set_level(logging.WARNING, logger="mdc_core.data")
    # 8 good samples / batch 4 = 2 steps per epoch; step 5 is in epoch 2, so epochs 0 and 1 are complete
    result = train(micro_run(d, steps=5, batch_size=4, ckpt_every=5), tmp_path / "run", progress=False)
    per_epoch = {"bad_shard": 1, "bad_image": 1, "bad_caption_encoding": 1, "missing_caption": 1}
    epochs = read_metrics(tmp_path / "run", "epochs.jsonl")
    assert [e["epoch"] for e in epochs] == [0, 1] and all(e["skipped"] == per_epoch for e in epochs)
    assert all(2 * v <= result.skipped[k] <= 3 * v for k, v in per_epoch.items())  # + part of epoch 2
    assert read_metrics(tmp_path / "run")[-1]["skipped"] == sum(result.skipped.values())
    assert "a_unreadable.tar" in caplog.text  # the unreadable shard is reported by name
