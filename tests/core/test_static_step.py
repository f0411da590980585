"""Static shapes in the training step (``train.static_shapes``) and the compiled step (``train.compile``).

A static-shape batch gives the loss and gradients of the plain batch on the same masks (the padding is invisible);
a compiled step over 50 batches of varying masks and caption lengths compiles once per shape bucket, never
recompiles and never breaks its graph (dynamo's own counters).
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from mdc_core.config import ConfigError
from mdc_core.factory import create_model
from mdc_core.loss_step import LossStep, compile_mode, static_mode
from mdc_core.objectives import (
    bucket_length,
    compute_loss,
    id_tables,
    prepare_batch,
    term_capacity,
)
from mdc_core.tokenizer import CaptionTokenizer, build_output_vocab
from tests.numerics import assert_close_to_scale
from tests.train_helpers import micro_run, write_micro_data

WORDS = "a red blue green circle square star triangle small large on the left right above below of two".split()
CONTEXT = 24


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_micro_data(tmp_path_factory.mktemp("static_data"), 16)


def captions(seed: int, batch: int = 6, low: int = 2, high: int = 12) -> list[str]:
    """`batch` random captions of `low`..`high` words (varying lengths, so varying trimmed widths)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high + 1, (batch,), generator=g)
    return [" ".join(WORDS[int(i)] for i in torch.randint(len(WORDS), (int(n),), generator=g)) for n in lengths]


def build(data, objective: str, *overrides: str):
    tok = CaptionTokenizer(CONTEXT)
    ids = build_output_vocab([" ".join(WORDS)], tok)
    cfg = micro_run(data, f"objective.name={objective}", f"model.output_vocab_size={len(ids)}",
                    f"model.context_length={CONTEXT}", *overrides)
    torch.manual_seed(0)
    return cfg, create_model(cfg, objective, ids).train(), tok


def test_bucket_length_and_term_capacity_by_hand():
    assert [bucket_length(n, 8, 77) for n in (1, 8, 9, 16, 17, 76, 77)] == [8, 8, 16, 16, 24, 77, 77]
    assert bucket_length(5, 4, 6) == 6  # never past the context
    # 64 captions x 12 positions = 768: terms round up to a multiple of 768 / 8 = 96
    assert [term_capacity(n, 768, "padded") for n in (0, 1, 96, 97, 480, 767, 768)] == [96, 96, 96, 192, 480, 768,
                                                                                       768]
    assert term_capacity(5, 10, "padded") == 6  # step ceil(10 / 8) = 2
    assert term_capacity(3, 768, "dense") == 768
    with pytest.raises(ValueError, match="unknown static_shapes"):
        term_capacity(3, 768, "off")


@pytest.mark.parametrize("objective", ["mdc", "bert", "parallel", "arc", "clip"])
@pytest.mark.parametrize("static", ["padded", "dense"])
def test_static_shapes_leave_loss_and_gradients_unchanged(data, objective, static):
    cfg, model, tok = build(data, objective, "objective.normalization=per_sequence" if objective == "bert" else
                            "objective.antithetic_t=true")
    tokens = tok.tokenize_batch(captions(3))[0]
    images = torch.randn(len(tokens), 3, 32, 32)
    results = []
    for mode in ("off", static):
        p = prepare_batch(tokens, cfg.objective, torch.Generator().manual_seed(7), **id_tables(model),
                          static=mode, length_bucket=8)
        model.zero_grad(set_to_none=True)
        out = compute_loss(model, images, p.tokens, cfg.objective, None, prepared=p)
        out.loss.backward()
        grads = [q.grad.clone() for q in model.parameters() if q.grad is not None]
        results.append((p, out, grads))
    (plain, out0, g0), (fixed, out1, g1) = results
    assert fixed.tokens.shape[1] % 8 == 0 and fixed.tokens.shape[1] >= plain.tokens.shape[1]
    if plain.index is not None:
        assert len(fixed.index) >= len(plain.index) and int(fixed.valid.sum()) == len(plain.index)
        assert bool((fixed.loss_mask[:, :plain.loss_mask.shape[1]] == plain.loss_mask).all())  # the same masks
    # padding changes the reduction order, so compare within a tolerance scaled to each tensor's magnitude
    assert_close_to_scale(out1.loss, out0.loss, rel=1e-5)
    for k in out0.metrics:
        assert_close_to_scale(out1.metrics[k], out0.metrics[k], rel=1e-5, msg=k)
    assert len(g0) == len(g1)
    for a, b in zip(g0, g1, strict=True):
        assert_close_to_scale(b, a, rel=1e-4)


def test_padded_terms_carry_no_loss_even_with_wrong_targets(data):
    """A guard that must fail: if padding terms counted, corrupting their targets would change the loss."""
    cfg, model, tok = build(data, "mdc")
    tokens = tok.tokenize_batch(captions(5))[0]
    images = torch.randn(len(tokens), 3, 32, 32)
    p = prepare_batch(tokens, cfg.objective, torch.Generator().manual_seed(1), **id_tables(model), static="padded")
    pad = ~p.valid
    assert bool(pad.any()), "this batch should need padding terms"
    with torch.no_grad():
        loss = compute_loss(model, images, p.tokens, cfg.objective, None, prepared=p).loss
        p.targets[pad] = 3
        p.index[pad] = 5
        assert torch.equal(compute_loss(model, images, p.tokens, cfg.objective, None, prepared=p).loss, loss)
        p.valid[pad] = True  # now they count: the loss must move
        assert not torch.equal(compute_loss(model, images, p.tokens, cfg.objective, None, prepared=p).loss, loss)


def test_static_shapes_refuse_visible_pads(data):
    with pytest.raises(ConfigError, match="attend_to_pads"):
        micro_run(data, "model.attend_to_pads=true", "train.static_shapes=padded")
    micro_run(data, "model.attend_to_pads=true")  # auto without compile: off, accepted


def test_compile_accepts_auto_false_true_and_modes_only(data):
    t = micro_run(data).train
    assert t.compile == "auto" and compile_mode(t, "cpu") is None and static_mode(t, None) == "off"  # CPU: eager
    assert compile_mode(t, "cuda") == "reduce-overhead" and static_mode(t, "reduce-overhead") == "padded"
    assert compile_mode(t, "cuda", distributed=True) is None  # DDP is not measured with CUDA graphs
    assert compile_mode(micro_run(data, "train.grad_accum=2").train, "cuda") is None  # graphs cannot accumulate
    assert compile_mode(micro_run(data, "train.compile=false").train, "cuda") is None
    assert compile_mode(micro_run(data, "train.compile=true").train, "cuda") == "default"
    cfg = micro_run(data, "train.compile=reduce-overhead")
    assert compile_mode(cfg.train, "cpu") == "reduce-overhead"  # on the CPU inductor compiles it without graphs
    assert static_mode(micro_run(data, "train.static_shapes=dense").train, "default") == "dense"
    for bad in ("train.compile=fast", "train.compile=1", "train.static_shapes=yes", "train.length_bucket=0"):
        with pytest.raises(ConfigError, match=bad.split("=")[0]):
            micro_run(data, bad)


def test_auto_static_shapes_stay_off_for_a_model_that_sees_pads(data):
    cfg, model, _ = build(data, "mdc", "model.attend_to_pads=true", "train.compile=true")
    step = LossStep(model, cfg.objective, cfg.train, torch.device("cpu"), bf16=False, backend="aot_eager")
    assert step.mode == "default" and step.static == "off"


def test_config_key_ignores_how_the_step_runs(data, tmp_path):
    """A model cached by the notebooks serves a run that differs only in compile / static shapes."""
    from mdc_workbench.notebooks.notebook import config_key

    base = micro_run(data)
    assert config_key(base) == config_key(micro_run(data, "train.compile=reduce-overhead",
                                                   "train.static_shapes=dense", "train.length_bucket=16"))
    assert config_key(base) != config_key(micro_run(data, "train.lr=0.01"))  # what it computes still counts


@pytest.mark.parametrize("objective,static", [("mdc", "padded"), ("arc", "padded"), ("mdc", "dense")])
def test_fifty_compiled_steps_never_recompile(data, objective, static):
    """Captions of 2-12 words (trimmed widths 5-14 tokens: one 16-token bucket), new masks every step: dense has
    one term count, padded several (its term dimension is compiled symbolic), and neither recompiles."""
    cfg, model, tok = build(data, objective, "train.compile=true", f"train.static_shapes={static}",
                            "train.length_bucket=16")
    torch._dynamo.reset()
    counters.clear()
    step = LossStep(model, cfg.objective, cfg.train, torch.device("cpu"), bf16=False, backend="aot_eager")
    widths, terms = set(), set()
    with torch._dynamo.config.patch(error_on_recompile=True):
        for i in range(50):
            batch = tok.tokenize_batch(captions(100 + i, low=2 + i % 5, high=12 - i % 3))[0]
            widths.add(int((batch != 0).sum(dim=1).max()))
            terms.add(len(step.batches(batch, i).prepared.index))  # the step's own draw (the same seed)
            loss, _ = step(torch.randn(len(batch), 3, 32, 32), batch, seed=i)
            loss.backward()
            model.zero_grad(set_to_none=True)
    assert len(widths) > 3  # the caption lengths did vary
    assert len(terms) == (1 if static == "dense" else len(terms)) and (static == "dense" or len(terms) > 1)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["graph_break"], dict(counters["graph_break"])


def test_each_length_bucket_compiles_once(data):
    """Two buckets of 8 tokens: exactly two graphs over 20 steps that alternate between them."""
    cfg, model, tok = build(data, "mdc", "train.compile=true", "train.static_shapes=dense", "train.length_bucket=8")
    torch._dynamo.reset()
    counters.clear()
    step = LossStep(model, cfg.objective, cfg.train, torch.device("cpu"), bf16=False, backend="aot_eager")
    for i in range(20):
        short = i % 2 == 0  # <= 6 words: width <= 8; else 8-12 words: width 10-14
        batch = tok.tokenize_batch(captions(i, low=2 if short else 8, high=6 if short else 12))[0]
        step(torch.randn(len(batch), 3, 32, 32), batch, seed=i)[0].backward()
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])
    assert not counters["graph_break"]


def test_cuda_graphs_refuse_gradient_accumulation(data):
    """CUDA graph trees hand .grad their output buffers, so a second micro-batch would overwrite the first one's
    gradients without an error (pytorch/pytorch#169545): the step refuses before building anything."""
    cfg, model, _ = build(data, "mdc", "train.compile=reduce-overhead", "train.grad_accum=2")
    with pytest.raises(ValueError, match="grad_accum=1"):
        LossStep(model, cfg.objective, cfg.train, torch.device("cuda"), bf16=True)
    LossStep(model, cfg.objective, cfg.train, torch.device("cpu"), bf16=False, backend="aot_eager")  # no graphs
