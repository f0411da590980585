"""The training step never makes the host wait for the device between logging steps, and the model forward
compiles without graph breaks.

On CUDA the host queues kernels and runs ahead of the GPU until it needs a value the GPU computes: ``.item()``,
``.tolist()``, ``.cpu()``/``.numpy()``, ``bool()``/``float()``/``int()`` of a tensor, ``nonzero``, boolean-mask
indexing, or a blocking host-to-device copy. :class:`~mdc_workbench.bench.step_phases.SyncCounter` (also what
``mdc bench step`` counts with) counts such calls on the CPU: device tensors are
the model's parameters, buffers and gradients, what the step moves with ``.to(device)``, and everything computed
from them (followed through a ``TorchFunctionMode``); host tensors (the tokenizer's, the host-side batch
preparation's) may be read freely. The trainer runs 3 steps with logging and checkpoints at the last only, and
the counter watches the whole second step: from its batches in hand until the third step asks for its own. Where
CUDA exists the same runs also train on the GPU under ``torch.cuda.set_sync_debug_mode("error")``.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

import mdc_core.train as train_mod
from mdc_core.data import BatchStream
from mdc_workbench.bench.step_phases import SyncCounter
from tests.train_helpers import micro_run, write_micro_data


def test_the_counter_sees_syncs_on_device_tensors_only():
    w = torch.nn.Parameter(torch.randn(3))
    host = torch.arange(3.0)
    with SyncCounter("cpu", [], [w]) as counter:
        y = w * 2  # derived from a parameter: a device tensor
        float(host.sum()), host.tolist(), host[host > 0]  # host tensors: free
        y.sum().item()
        bool((y > 0).any())
        y[y > 0]
        y.nonzero()
        host.to(torch.device("cpu"))  # blocking host -> device
        host.to(torch.device("cpu"), non_blocking=True)  # fine
        y.cpu()
        (y * host.to(torch.device("cpu"), non_blocking=True)).sum().backward()
        torch.nn.utils.clip_grad_norm_([w], 1.0)  # reads nothing
        w.grad.tolist()  # a gradient is a device tensor
    assert [c.split(" at ")[0] for c in counter.calls] == ["item()", "bool(tensor)", "boolean-mask indexing", "nonzero",
                                                           "blocking host-to-device copy", "cpu()", "tolist()"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_micro_data(tmp_path_factory.mktemp("sync_data"), 64)


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]
CASES = {  # every objective of the table that prepares its batches on the host, with the step's options
    "mdc": ["train.ema_decay=0.9", "train.grad_clip=1.0", "objective.antithetic_t=true",
            "objective.min_one_masked=true"],
    "mdc_no_t": ['model.output_vocab="full"'],
    "cmlm": ["objective.normalization=per_sequence"],
    "bert": ["objective.normalization=per_sequence"],
    "parallel": [],
    "arc": ["train.ema_decay=0.9"],
    "clip": [],
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("objective", list(CASES))
def test_a_non_logging_step_never_waits_for_the_device(data, tmp_path, monkeypatch, objective, device):
    # the eager step (grad_accum 2 keeps train.compile=auto eager on CUDA too: CUDA graphs record while warming up)
    cfg = micro_run(data, f"objective.name={objective}", f'train.device="{device}"', *CASES[objective], steps=3,
                    batch_size=4, grad_accum=2, log_every=100, ckpt_every=100)
    trainers, counters, takes = [], [], []
    real_run, real_take = train_mod.Trainer.run, BatchStream.take

    def run(self):
        trainers.append(self)
        return real_run(self)

    def take(self, n):
        if len(takes) == 2:  # the third step asks for its batches: the second step is over
            counters[0].__exit__(None, None, None)
            if device == "cuda":
                torch.cuda.set_sync_debug_mode(0)
        got = real_take(self, n)  # reading data is host work
        takes.append(n)
        if len(takes) == 2:  # the second step (neither logged nor checkpointed) starts with its batches in hand
            trainer = trainers[0]
            modules = [trainer.model] + ([trainer.ema.module] if trainer.ema is not None else [])
            counters.append(SyncCounter(trainer.device, [b for m in modules for b in m.buffers()],
                                        [p for m in modules for p in m.parameters()]))
            counters[0].__enter__()
            if device == "cuda":
                torch.cuda.set_sync_debug_mode("error")  # any real sync raises inside the step
        return got

    monkeypatch.setattr(train_mod.Trainer, "run", run)
    monkeypatch.setattr(BatchStream, "take", take)
    try:
        result = train_mod.train(cfg, tmp_path / "run", progress=False)
    finally:
        if device == "cuda":
            torch.cuda.set_sync_debug_mode(0)
    assert result.steps == 3 and len(takes) == 3
    calls = counters[0].calls
    assert not calls, f"{len(calls)} calls would synchronise with the device:\n" + "\n".join(calls[:20])


@pytest.mark.parametrize("objective", ["mdc", "arc", "clip"])
def test_the_model_forward_and_loss_compile_without_graph_breaks(data, objective):
    """torch._dynamo.explain over encoder + decoder (or both CLIP towers) and over the whole loss of a prepared
    batch: one graph each, so train.compile=true (or a whole-step compile) never falls back to Python mid-way."""
    from mdc_core.factory import create_model
    from mdc_core.objectives import compute_loss, id_tables, prepare_batch
    from mdc_core.tokenizer import CaptionTokenizer, build_output_vocab

    captions = ["a red circle on the left", "two blue squares", "a small green triangle above a yellow star", "a"]
    tok = CaptionTokenizer(24)
    ids = build_output_vocab(captions, tok)
    cfg = micro_run(data, f"objective.name={objective}", f"model.output_vocab_size={len(ids)}")
    torch.manual_seed(0)
    model = create_model(cfg, objective, ids).train()
    batch = prepare_batch(tok.tokenize_batch(captions)[0], cfg.objective, torch.Generator().manual_seed(0),
                          **id_tables(model))
    images = torch.randn(4, 3, 32, 32)
    if objective == "clip":
        def forward(images, p):
            return model.embed_image(images), model.encode_text(p.tokens, rows=p.rows)
    else:
        def forward(images, p):
            return model.decode(p.inputs, model.encode_image(images), select=p.index, rows=p.rows)

    def loss(images, p):
        return compute_loss(model, images, p.tokens, cfg.objective, None, prepared=p).loss

    for fn in (forward, loss):
        torch._dynamo.reset()
        explained = torch._dynamo.explain(fn)(images, batch)
        assert explained.graph_break_count == 0, [str(r.reason) for r in explained.break_reasons]
        assert explained.graph_count == 1


def test_adamw_is_fused_on_cuda_only(tiny_model):
    from mdc_core.config import TrainConfig
    from mdc_core.train import build_optimizer, param_groups

    model = tiny_model()
    opt = build_optimizer(param_groups(model, 0.1), TrainConfig(lr=1e-3, betas=(0.9, 0.95)), torch.device("cpu"))
    assert not opt.defaults.get("fused") and opt.defaults["betas"] == (0.9, 0.95) and opt.defaults["lr"] == 1e-3
    if torch.cuda.is_available():
        model = model.cuda()
        opt = build_optimizer(param_groups(model, 0.1), TrainConfig(), torch.device("cuda"))
        assert opt.defaults["fused"] is True


def test_ema_update_averages_floats_and_copies_integer_buffers():
    from torch.optim.swa_utils import AveragedModel

    from mdc_core.train import ema_update

    model = torch.nn.Linear(2, 2)
    model.register_buffer("ids", torch.arange(49400, 49409))  # a token-id table, like Captioner.output_ids
    ema = AveragedModel(model, use_buffers=True)
    w0 = model.weight.detach().clone()
    ema_update(ema, model, 0.9)  # the first update copies
    with torch.no_grad():
        model.weight.add_(1.0)
    ema_update(ema, model, 0.9)
    torch.testing.assert_close(ema.module.weight, 0.9 * w0 + 0.1 * (w0 + 1.0))
    assert torch.equal(ema.module.ids, model.ids) and int(ema.n_averaged) == 2  # averaging ids would round them
