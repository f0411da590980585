"""Seed stacks (mdc_workbench.seed_stack): K members trained in one step equal K solo runs.

Mode "each" (the members' forwards one after another with the solo kernels) gives the solo runs' numbers to the bit;
mode "vmap" (one vmapped forward) gives them up to rounding, within tolerances scaled to each tensor. The step-level
tests compare one stacked step with the trainer's own step pieces (LossStep, clip_grad_norm_, AdamW and its schedule);
the run-level test with three solo runs of the trainer.
"""

import copy
import math
import warnings
from pathlib import Path

import pytest
import torch

from mdc_core import checkpoint as ck
from mdc_core.data import BatchStream
from mdc_core.distributed import DistContext
from mdc_core.factory import load_model
from mdc_core.loss_step import LossStep
from mdc_core.run_folder import resolve_data_paths
from mdc_core.train import build_optimizer, lr_lambda, param_groups, step_seed, train
from mdc_workbench.seed_stack import SeedStack, clip_members_, init_members, member_config, member_step, stack_models
from mdc_workbench.seed_stack.stacked import OutOfPlaceIndexAdd
from mdc_workbench.seed_stack.step import MemberRandom
from tests.numerics import assert_close_to_scale
from tests.train_helpers import micro_run, one_thread, read_metrics, write_micro_data  # noqa: F401 - a fixture

pytestmark = pytest.mark.usefixtures("one_thread")

SEEDS = [3, 5, 8]  # the members' train.seed: any distinct seeds, as a plan's seeds list gives them


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_micro_data(tmp_path_factory.mktemp("stack_data"), 32)


def micro_batches(cfg, seeds, steps):
    """Each member's micro-batches of `steps` steps, read as its solo run reads them (its own BatchStream)."""
    streams = [BatchStream(member_config(cfg, s), DistContext(), 0, 0, lambda epoch: None) for s in seeds]
    return [[stream.take(cfg.train.grad_accum) for stream in streams] for _ in range(steps)]


def logged(step, k):
    """Member k's values of a stacked step as the trainer's RunLog computes them for metrics.jsonl."""
    m = member_step(step, k)
    return {"loss": float(m.loss_sum) / float(m.denom), "grad_norm": float(m.grad_norm),
            **{name: float(v) for name, v in m.metrics.items()}}


# ----------------------------------------------------------------------------------------------------------
# the optimizer step's parts


def test_one_adamw_over_stacked_parameters_is_k_adamws():
    torch.manual_seed(0)
    k, shapes = 4, [(33, 17), (17,), (5, 7, 3), ()]
    stacked = [torch.randn(k, *s, requires_grad=True) for s in shapes]
    solo = [[p[i].detach().clone().requires_grad_() for p in stacked] for i in range(k)]

    def adamw(params):
        return torch.optim.AdamW([{"params": params[:2], "weight_decay": 0.05},
                                  {"params": params[2:], "weight_decay": 0.0}], lr=1e-3, betas=(0.9, 0.98))

    opt, opts = adamw(stacked), [adamw(s) for s in solo]
    for scale in (1e-9, 1.0, 1e3, 1e-6, 1e2):  # gradients over many magnitudes, some below eps
        grads = [torch.randn(k, *s) * scale for s in shapes]
        for p, g in zip(stacked, grads, strict=True):
            p.grad = g.clone()
        for i in range(k):
            for p, g in zip(solo[i], grads, strict=True):
                p.grad = g[i].clone()
        opt.step()
        for o in opts:
            o.step()
    for i in range(k):
        for j in range(len(shapes)):
            assert torch.equal(stacked[j][i], solo[i][j]), (i, shapes[j])
            for moment in ("exp_avg", "exp_avg_sq"):
                assert torch.equal(opt.state[stacked[j]][moment][i], opts[i].state[solo[i][j]][moment])


def test_clip_members_clips_each_member_by_its_own_norm():
    a = torch.zeros(2, 2, 2, requires_grad=True)
    b = torch.zeros(2, 4, requires_grad=True)
    a.grad = torch.stack([torch.full((2, 2), 3.0), torch.full((2, 2), 0.1)])  # member 0: 8 entries of 3 ...
    b.grad = torch.stack([torch.full((4,), 3.0), torch.zeros(4)])  # ... so its norm is sqrt(72); member 1: 0.2
    for exact in (False, True):
        ga, gb = a.grad.clone(), b.grad.clone()
        norms = clip_members_([a, b], 1.0, exact=exact)
        torch.testing.assert_close(norms, torch.tensor([math.sqrt(72.0), 0.2]))
        coef = 1.0 / (math.sqrt(72.0) + 1e-6)
        torch.testing.assert_close(a.grad[0], ga[0] * coef)
        torch.testing.assert_close(b.grad[0], gb[0] * coef)
        assert torch.equal(a.grad[1], ga[1]) and torch.equal(b.grad[1], gb[1])  # under the limit: untouched
        a.grad, b.grad = ga, gb
    before = [a.grad.clone(), b.grad.clone()]
    clip_members_([a, b], math.inf)
    assert torch.equal(a.grad, before[0]) and torch.equal(b.grad, before[1])  # no limit: the scale is exactly 1
    with pytest.raises(ValueError, match="no gradients"):
        clip_members_([torch.zeros(2, 3, requires_grad=True)], 1.0)


def test_exact_clip_members_is_clip_grad_norm_of_each_member_to_the_bit():
    torch.manual_seed(1)
    stacked = [torch.zeros(3, *s, requires_grad=True) for s in [(31, 7), (7,), (4, 4, 5)]]
    for p in stacked:
        p.grad = torch.randn_like(p) * 0.3
    solo = [[torch.zeros(p.shape[1:], requires_grad=True) for p in stacked] for _ in range(3)]
    for i, params in enumerate(solo):
        for p, q in zip(params, stacked, strict=True):
            p.grad = q.grad[i].clone()
    norms = clip_members_(stacked, 0.5, exact=True)
    for i, params in enumerate(solo):
        assert torch.equal(norms[i], torch.nn.utils.clip_grad_norm_(params, 0.5))
        assert all(torch.equal(p.grad, q.grad[i]) for p, q in zip(params, stacked, strict=True))


def test_member_random_keeps_each_members_stream_and_the_process_own():
    random = MemberRandom(torch.device("cpu"), 2)
    random.seed([11, 12])
    torch.manual_seed(99)
    own = torch.rand(3)
    torch.manual_seed(99)
    with random.member(0):
        a1 = torch.rand(4)
    with random.member(1):
        b1 = torch.rand(4)
    with random.member(0):
        a2 = torch.rand(4)
    assert torch.equal(torch.rand(3), own)  # the process's stream went on as if nothing had drawn
    torch.manual_seed(11)
    assert torch.equal(torch.cat([a1, a2]), torch.rand(8))  # member 0's stream: its solo run's, uninterrupted
    torch.manual_seed(12)
    assert torch.equal(b1, torch.rand(4))
    assert torch.equal(random.states[1], torch.get_rng_state())  # where member 1's solo run leaves it
    with pytest.raises(ValueError, match="never seeded"):
        with MemberRandom(torch.device("cpu"), 1).member(0):
            pass


def test_out_of_place_index_add_only_answers_what_vmap_refuses():
    with OutOfPlaceIndexAdd():
        x = torch.zeros(3)
        x.index_add_(0, torch.tensor([0, 2]), torch.tensor([1.0, 2.0]))  # outside vmap: in place, as always
        assert x.tolist() == [1.0, 0.0, 2.0]

        def per_member(source):
            return torch.zeros(3).index_add_(0, torch.tensor([1, 1]), source)  # what normalized_token_loss does

        out = torch.vmap(per_member)(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    assert out.tolist() == [[0.0, 3.0, 0.0], [0.0, 7.0, 0.0]]
    with pytest.raises(RuntimeError, match="index_add_"):  # without it, vmap refuses that call
        torch.vmap(per_member)(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))


# ----------------------------------------------------------------------------------------------------------
# what a stack refuses


def test_a_stack_refuses_what_it_cannot_train_as_the_solo_runs(data):
    cfg = resolve_data_paths(micro_run(data, steps=2, batch_size=8))
    models, saved = init_members(cfg, SEEDS[:2])
    with pytest.raises(ValueError, match="2 models was given 3 seeds"):
        SeedStack(saved, models, SEEDS)
    with pytest.raises(ValueError, match="repeat"):
        SeedStack(saved, models, [4, 4])
    with pytest.raises(ValueError, match="mode 'fast'"):
        SeedStack(saved, models, SEEDS[:2], mode="fast")
    dropout = micro_run(data, "model.dropout=0.1", steps=2, batch_size=8)
    with pytest.raises(ValueError, match="model.dropout=0.1"):
        SeedStack(dropout, models, SEEDS[:2], mode="vmap")
    with pytest.raises(ValueError, match="draws its noise"):
        SeedStack(micro_run(data, 'objective.name="d3pm"', steps=2, batch_size=8), models, SEEDS[:2])
    other = copy.deepcopy(models[1])
    other.output_ids[0] += 1  # another corpus table
    with pytest.raises(ValueError, match="output_ids differ"):
        stack_models([models[0], other])
    with pytest.raises(ValueError, match="one architecture"):
        stack_models([models[0], init_members(micro_run(data, "model.text_layers=1"), [0])[0][0]])
    with pytest.raises(ValueError, match="at least one member"):
        stack_models([])
    with pytest.raises(ValueError, match="at least one seed"):
        init_members(cfg, [])
    stack = SeedStack(saved, models, SEEDS[:2])
    with pytest.raises(ValueError, match="1 micro-batch"):
        stack.step(micro_batches(saved, SEEDS[:1], 1)[0])


def test_a_vmapped_stack_refuses_random_draws_in_the_forward(data):
    cfg = resolve_data_paths(micro_run(data, 'objective.guidance="cfg"', "objective.p_cond=0.5", steps=2,
                                       batch_size=8))
    models, saved = init_members(cfg, SEEDS[:2])
    stack = SeedStack(saved, models, SEEDS[:2], mode="vmap")
    with pytest.raises(ValueError, match="random numbers"):
        stack.step(micro_batches(saved, SEEDS[:2], 1)[0])


# ----------------------------------------------------------------------------------------------------------
# one step: the stack against the trainer's step pieces


def solo_step(cfg, model, seed, batches):
    """One optimizer step of the trainer's math (mdc_core.train.Trainer.step in one process), on `model` in place.
    Returns (loss, metrics, grad norm, optimizer)."""
    tcfg = cfg.train
    loss_step = LossStep(model, cfg.objective, tcfg, torch.device("cpu"), False)
    opt = build_optimizer(param_groups(model, tcfg.weight_decay), tcfg, torch.device("cpu"))
    torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_lambda(s, tcfg.warmup_steps, tcfg.steps, tcfg.min_lr_ratio))
    ready = [loss_step.prepare(b["tokens"], step_seed(seed, 0, a)) for a, b in enumerate(batches)]
    denom = max(float(sum(r.terms for r in ready)), 1.0)
    torch.manual_seed(step_seed(seed, 0, 0, stream=1))
    total, metrics = 0.0, {}
    for b, r in zip(batches, ready, strict=True):
        loss, m = loss_step.forward(b["image"], r)
        (loss * (r.terms / denom)).backward()
        total += float(loss.detach().double()) * r.terms
        for name, v in m.items():
            if name != "loss":  # the step's loss is the terms-weighted one above (StepSums)
                metrics[name] = metrics.get(name, 0.0) + float(v.double()) / len(batches)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg.grad_clip or float("inf"))
    opt.step()
    return total / denom, metrics, float(grad_norm), opt


@pytest.mark.parametrize("objective", ["mdc", "arc", "clip"])
@pytest.mark.parametrize("mode", ["each", "vmap"])
def test_one_stacked_step_equals_each_members_solo_step(data, objective, mode):
    cfg = resolve_data_paths(micro_run(data, f'objective.name="{objective}"', steps=4, batch_size=8, grad_accum=2,
                                       grad_clip=0.05))
    models, saved = init_members(cfg, SEEDS)
    solo_models = [copy.deepcopy(m) for m in models]
    micro = micro_batches(saved, SEEDS, 1)[0]
    stack = SeedStack(saved, models, SEEDS, mode=mode)
    step = stack.step(micro)
    for k, (model, seed) in enumerate(zip(solo_models, SEEDS, strict=True)):
        loss, metrics, grad_norm, opt = solo_step(member_config(saved, seed), model, seed, micro[k])
        got = logged(step, k)
        state = stack.member_state(k)
        solo_moments = [opt.state[p]["exp_avg"] for g in opt.param_groups for p in g["params"]]
        stack_moments = [state["optimizer"]["state"][i]["exp_avg"] for i in range(len(solo_moments))]
        if mode == "each":  # the solo kernels: the solo numbers to the bit
            assert got == {"loss": loss, "grad_norm": grad_norm, **metrics}
            assert all(torch.equal(state["model"][n], v) for n, v in model.state_dict().items())
            assert all(torch.equal(a, b) for a, b in zip(stack_moments, solo_moments, strict=True))
        else:  # batched kernels: the same up to rounding
            assert got.keys() == {"loss", "grad_norm", *metrics}
            for name, value in {"loss": loss, "grad_norm": grad_norm, **metrics}.items():
                assert got[name] == pytest.approx(value, rel=1e-5, abs=1e-7), name
            for a, b in zip(stack_moments, solo_moments, strict=True):  # the clipped gradients x (1 - beta1)
                assert_close_to_scale(a, b, rel=1e-4)


@pytest.mark.parametrize("mode", ["each", "vmap"])
def test_each_member_keeps_its_own_batch_norm_statistics(data, mode):
    """tiny_fast's convolutional stem normalises by batch statistics and updates running ones in place."""
    stem = '{"patch_size": 8, "embed_dim": 32, "depth": 1, "num_heads": 2, "conv_stem": [8, 16]}'
    cfg = resolve_data_paths(micro_run(data, f"model.encoder_kwargs={stem}", steps=4, batch_size=8))
    models, saved = init_members(cfg, SEEDS[:2])
    solo_models = [copy.deepcopy(m) for m in models]
    micro = micro_batches(saved, SEEDS[:2], 1)[0]
    stack = SeedStack(saved, models, SEEDS[:2], mode=mode)
    stack.step(micro)
    names = [n for n, _ in solo_models[0].named_buffers() if "running" in n]
    assert names
    for k, (model, seed) in enumerate(zip(solo_models, SEEDS, strict=False)):
        solo_step(member_config(saved, seed), model, seed, micro[k])
        ours, theirs = stack.member_state(k)["model"], model.state_dict()
        for name in names:
            assert not torch.equal(theirs[name], models[k].state_dict()[name])  # the step moved them
            if mode == "each":
                assert torch.equal(ours[name], theirs[name]), name
            else:
                assert_close_to_scale(ours[name], theirs[name], rel=1e-5, msg=name)


def test_the_vmapped_step_needs_no_loop_over_members(data):
    cfg = resolve_data_paths(micro_run(data, steps=2, batch_size=8))
    models, saved = init_members(cfg, SEEDS[:2])
    micro = micro_batches(saved, SEEDS[:2], 1)[0]
    stack = SeedStack(saved, models, SEEDS[:2], mode="vmap")
    for math_attention, fallback in ((True, False), (False, True)):
        stack.objective.math_attention = math_attention
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            stack.step(micro)
        assert any("batching rule" in str(w.message) for w in seen) == fallback  # the CPU's fused attention loops


# ----------------------------------------------------------------------------------------------------------
# a few steps: the stack against three solo runs of the trainer


@pytest.fixture(scope="module")
def solo_runs(data, tmp_path_factory):
    """Three solo runs of 3 steps (2 micro-batches each, clipping, EMA, dropout): the members of the stacks below.
    On one thread, as the stacks (a module's fixture is set up before the tests' one_thread)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    cfg = resolve_data_paths(micro_run(data, "model.dropout=0.1", steps=3, batch_size=8, grad_accum=2,
                                       grad_clip=0.05, ema_decay=0.9, ckpt_every=3))
    root = tmp_path_factory.mktemp("solo_runs")
    for seed in SEEDS:
        train(member_config(cfg, seed), root / f"seed{seed}", progress=False)
    torch.set_num_threads(threads)
    return cfg, root


@pytest.mark.parametrize("mode", ["each", "vmap"])
def test_a_stack_of_three_trains_as_its_three_solo_runs(solo_runs, mode):
    cfg, root = solo_runs
    if mode == "vmap":  # vmap cannot draw each member's dropout: compare with solo runs without it
        cfg = copy.deepcopy(cfg)
        cfg.model.dropout = 0.0
        root = root.parent / "solo_runs_no_dropout"
        for seed in SEEDS:
            if not (root / f"seed{seed}").exists():
                train(member_config(cfg, seed), root / f"seed{seed}", progress=False)
    models, saved = init_members(cfg, SEEDS)
    stack = SeedStack(saved, models, SEEDS, mode=mode)
    records = [[] for _ in SEEDS]
    for micro in micro_batches(saved, SEEDS, 3):
        step = stack.step(micro)
        for k in range(len(SEEDS)):
            records[k].append(logged(step, k))
    for k, seed in enumerate(SEEDS):
        run = root / f"seed{seed}"
        solo = read_metrics(run)
        assert len(solo) == len(records[k]) == 3
        ckpt = ck.latest_checkpoint(run)
        solo_state = ck.load_train_state(ckpt)
        state = stack.member_state(k)
        weights = {"model": load_model(ckpt)[0].state_dict(), "ema": load_model(ckpt, ema=True)[0].state_dict()}
        moments = [solo_state["optimizer"]["state"][i][m] for i in sorted(solo_state["optimizer"]["state"])
                   for m in ("exp_avg", "exp_avg_sq")]
        ours = [state["optimizer"]["state"][i][m] for i in sorted(state["optimizer"]["state"])
                for m in ("exp_avg", "exp_avg_sq")]
        assert state["optimizer"]["param_groups"] == solo_state["optimizer"]["param_groups"]
        assert state["scheduler"] == solo_state["scheduler"] and state["step"] == solo_state["step"] == 3
        assert state["ema_updates"] == solo_state["ema_n_averaged"]
        assert torch.equal(stack.random.states[k], solo_state["rng"]["torch"])  # dropout's stream ends where solo's
        if mode == "each":
            for got, rec in zip(records[k], solo, strict=True):
                assert got == {name: rec[name] for name in got}
            for which, solo_weights in weights.items():
                assert all(torch.equal(state[which][n], v) for n, v in solo_weights.items()), which
            assert all(torch.equal(a, b) for a, b in zip(ours, moments, strict=True))
        else:
            for got, rec in zip(records[k], solo, strict=True):
                for name, value in got.items():
                    assert value == pytest.approx(rec[name], rel=1e-5, abs=1e-7), name
            for which, solo_weights in weights.items():
                for n, v in solo_weights.items():
                    if v.is_floating_point():  # Adam's step of a near-zero gradient amplifies rounding: 1e-3
                        assert_close_to_scale(state[which][n], v, rel=1e-3, msg=f"{which} {n}")
            for a, b in zip(ours, moments, strict=True):
                assert_close_to_scale(a, b, rel=1e-3)


def test_dropout_needs_each_members_own_random_stream(solo_runs):
    """The guard of the equality above: a stack whose members all draw dropout from one stream differs."""
    cfg, root = solo_runs
    models, saved = init_members(cfg, SEEDS)
    stack = SeedStack(saved, models, SEEDS, mode="each")
    stack.random.member = lambda k: torch.random.fork_rng()  # every member from the process's one stream
    step = stack.step(micro_batches(saved, SEEDS, 1)[0])
    first = read_metrics(root / f"seed{SEEDS[1]}")[0]
    assert logged(step, 1)["loss"] != first["loss"]


def test_member_states_resume_a_stack_exactly(data):
    cfg = resolve_data_paths(micro_run(data, steps=3, batch_size=8, grad_clip=0.05, ema_decay=0.9))
    batches = micro_batches(cfg, SEEDS[:2], 3)
    models, saved_cfg = init_members(cfg, SEEDS[:2])
    stack = SeedStack(saved_cfg, models, SEEDS[:2])
    stack.step(batches[0])
    saved = [stack.member_state(k) for k in range(2)]
    straight = [stack.step(micro) for micro in batches[1:]]
    resumed = SeedStack(saved_cfg, init_members(cfg, SEEDS[:2])[0], SEEDS[:2])
    resumed.load_member_states(saved)
    again = [resumed.step(micro) for micro in batches[1:]]
    for a, b in zip(straight, again, strict=True):
        assert [logged(a, k) for k in range(2)] == [logged(b, k) for k in range(2)]
    for k in range(2):
        one, two = stack.member_state(k), resumed.member_state(k)
        assert all(torch.equal(one["model"][n], two["model"][n]) for n in one["model"])
        assert all(torch.equal(one["ema"][n], two["ema"][n]) for n in one["ema"])
    with pytest.raises(ValueError, match="was given 1 member states"):
        resumed.load_member_states(saved[:1])
    with pytest.raises(ValueError, match="different steps"):
        resumed.load_member_states([saved[0], stack.member_state(1)])
