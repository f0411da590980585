"""The noise schedules (mdc_core.registry) against their definitions: each loss weight is -alpha'_t / (1 - alpha_t)
of its own alpha_t (a finite difference), each expected loss-term count is what the masking draws give (Monte
Carlo), scoring needs no schedule (Eq. 8's weight 1/l for every schedule), the linear one is the paper's to the
bit, and a micro run trains with the cosine schedule (objective mdc_cosine)."""

import math

import pytest
import torch
import torch.nn.functional as F

from mdc_core.config import ConfigError, ObjectiveConfig, RunConfig
from mdc_core.factory import load_model
from mdc_core.objectives import apply_mask, compute_loss, maskable_positions, prepare_batch, trim_padding
from mdc_core.registry import (
    OBJECTIVES,
    T_MIN,
    AllMasked,
    CosineSchedule,
    FixedRatio,
    LinearSchedule,
    TeacherForcing,
    sample_t,
)
from mdc_core.tokenizer import EOT_ID, MASK_ID, PAD_ID, SOT_ID
from mdc_core.train import train
from tests.train_helpers import micro_run, one_thread, read_metrics, write_micro_data  # noqa: F401 - a fixture

TIME_SCHEDULES = [LinearSchedule(), CosineSchedule()]


def alpha(schedule, t):
    """alpha_t: the probability that a token survives to time t."""
    return 1 - schedule.mask_rate(t)


@pytest.mark.parametrize("schedule", TIME_SCHEDULES, ids=["linear", "cosine"])
def test_the_weight_is_minus_the_derivative_of_alpha_over_one_minus_alpha(schedule):
    t = torch.linspace(0.01, 0.99, 99, dtype=torch.float64)
    h = 1e-6
    derivative = (alpha(schedule, t + h) - alpha(schedule, t - h)) / (2 * h)  # central difference of alpha_t
    expected = -derivative / (1 - alpha(schedule, t))
    assert torch.allclose(schedule.weight(t), expected, rtol=1e-6)
    assert alpha(schedule, 0.0) == pytest.approx(1.0) and alpha(schedule, 1.0) == pytest.approx(0.0, abs=1e-12)


def test_the_cosine_schedule_by_hand():
    cosine = CosineSchedule()
    assert cosine.mask_rate(0.5) == pytest.approx(1 - math.cos(math.pi / 4))  # 0.2929
    assert cosine.weight(0.5) == pytest.approx((math.pi / 2) * math.sin(math.pi / 4) / (1 - math.cos(math.pi / 4)))
    assert cosine.weight(1.0) == pytest.approx(math.pi / 2)  # alpha'_1 = -pi/2, 1 - alpha_1 = 1
    assert cosine.weight(1e-4) == pytest.approx(2 / 1e-4, rel=1e-6)  # about 2/t near 0
    assert cosine.mask_rate(1e-4) == pytest.approx(math.pi ** 2 / 8 * 1e-8, rel=1e-6)  # no cancellation at small t
    assert CosineSchedule(weighted=False).weight(torch.tensor([0.3, 0.9])).tolist() == [1.0, 1.0]


@pytest.mark.parametrize("schedule", TIME_SCHEDULES, ids=["linear", "cosine"])
def test_scoring_needs_no_schedule_eq8_weights_a_count_of_l_masks_by_1_over_l(schedule):
    """Over t in [0, 1], the weight times the chance that exactly l of n tokens are masked integrates to 1/l for
    every schedule (substitute u = 1 - alpha_t), the weight of Eq. 8 that scoring.py's Monte Carlo ELBO uses."""
    n, steps = 6, 200_000
    t = (torch.arange(steps, dtype=torch.float64) + 0.5) / steps  # midpoint rule on [0, 1]
    u = schedule.mask_rate(t)
    for count in range(1, n + 1):
        p = math.comb(n, count) * u ** count * (1 - u) ** (n - count)  # P(|mask| = count | t)
        assert float((schedule.weight(t) * p).mean()) == pytest.approx(1 / count, rel=1e-4)


def captions(lengths: list[int], copies: int) -> torch.Tensor:
    """`copies` rows of each caption length (tokens 100.., <sot>/<eot>, pads)."""
    width = max(lengths) + 2
    rows = [[SOT_ID, *range(100, 100 + n), EOT_ID] + [PAD_ID] * (width - n - 2) for n in lengths]
    return torch.tensor(rows).repeat(copies, 1)


@pytest.mark.parametrize("name,settings", [
    ("mdc", {"t_low": 0.2, "t_high": 0.9}), ("mdc_cosine", {"t_low": 0.0, "t_high": 1.0}),
    ("mdc_cosine", {"t_low": 0.5, "t_high": 1.0, "antithetic_t": True}), ("bert", {"mask_ratio": 0.3}),
    ("parallel", {})])
def test_expected_loss_terms_match_the_masking_draws(name, settings):
    cfg = ObjectiveConfig(name=name, **settings)
    schedule, lengths = OBJECTIVES[name].schedule, [3, 7, 12]
    tokens = captions(lengths, 4000)
    gen = torch.Generator().manual_seed(0)
    t = schedule.draw(cfg, len(tokens), gen)
    _, mask = apply_mask(tokens, schedule.mask_rate(t), generator=gen)
    per_group = mask.sum(dim=1).view(4000, len(lengths)).sum(dim=1).double()  # loss terms of each 3 captions
    stderr = float(per_group.std()) / math.sqrt(len(per_group))
    expected = OBJECTIVES[name].expected_loss_terms(lengths, cfg)
    assert abs(float(per_group.mean()) - expected) <= 4 * stderr + 1e-9
    if name == "mdc_cosine":  # the cosine schedule masks less than the linear one over the same range of t
        assert expected < OBJECTIVES["mdc"].expected_loss_terms(lengths, cfg)


def test_expected_terms_of_the_rows_without_a_time():
    cfg = ObjectiveConfig(mask_ratio=0.25)
    assert FixedRatio().expected_loss_terms([3, 5], cfg) == 2.0 and AllMasked().expected_loss_terms([3, 5], cfg) == 8
    assert TeacherForcing().expected_loss_terms([3, 5], cfg) == 8 + 2  # every token and <eot>
    assert LinearSchedule().expected_rate(ObjectiveConfig(t_low=0.5, t_high=1.0)) == pytest.approx(0.75)
    assert CosineSchedule().expected_rate(ObjectiveConfig(t_low=0.0, t_high=1.0)) == pytest.approx(1 - 2 / math.pi)


def test_the_linear_schedule_draws_the_papers_t_bit_for_bit():
    """The masking rate of the linear schedule is the drawn t itself, clamped at T_MIN, and its weight 1.0 / t:
    the draws and the loss of mdc are those of sample_t and Alg. 1 (the determinism tests hold the rest)."""
    cfg = ObjectiveConfig(t_low=0.0, t_high=0.8, antithetic_t=True)
    t = LinearSchedule().draw(cfg, 64, torch.Generator().manual_seed(3))
    by_hand = sample_t(64, 0.0, 0.8, antithetic=True, generator=torch.Generator().manual_seed(3)).clamp(min=T_MIN)
    assert torch.equal(t, by_hand) and LinearSchedule().mask_rate(t) is t
    assert torch.equal(LinearSchedule().weight(t), 1.0 / t)


def test_compute_loss_with_the_cosine_schedule_matches_manual(tiny_model):
    model = tiny_model()
    images = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    tokens = captions([3, 5, 2], 1)
    cfg = ObjectiveConfig(name="mdc_cosine", t_low=0.3)
    out = compute_loss(model, images, tokens, cfg, torch.Generator().manual_seed(9))
    gen = torch.Generator().manual_seed(9)  # replay the draws: t, then the masks at rate 1 - cos(pi t / 2)
    trimmed = trim_padding(tokens)
    t = sample_t(3, 0.3, 1.0, generator=gen).clamp(min=T_MIN)
    _, mask = apply_mask(trimmed, 1 - torch.cos(math.pi / 2 * t), generator=gen)
    assert torch.equal(prepare_batch(tokens, cfg, torch.Generator().manual_seed(9), output_index=model.output_index
                                     ).loss_mask, mask)
    logits = model.decode(trimmed.masked_fill(mask, MASK_ID), model.encode_image(images))
    ce = F.cross_entropy(logits[mask], trimmed[mask], reduction="none")
    weight = (math.pi / 2) * torch.sin(math.pi / 2 * t) / (1 - torch.cos(math.pi / 2 * t))
    expected = (torch.zeros(3).index_add_(0, mask.nonzero()[:, 0], ce) * weight).sum() / maskable_positions(
        trimmed).sum()
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert out.metrics["t_mean"].item() == pytest.approx(t.mean().item())


def test_a_draw_of_an_objective_that_masks_nothing_is_refused():
    from mdc_core.objectives import draw_masks
    with pytest.raises(ValueError, match="'arc' does not mask tokens"):
        draw_masks(captions([3], 1), ObjectiveConfig(name="arc"))
    with pytest.raises(ConfigError, match="objective.name must be one of"):
        ObjectiveConfig.from_dict({"name": "cosine"})  # the schedule is chosen by its objective row


@pytest.mark.usefixtures("one_thread")
def test_a_micro_run_trains_with_the_cosine_schedule(tmp_path):
    data = write_micro_data(tmp_path / "data", 16)
    cfg = micro_run(data, "objective.name=\"mdc_cosine\"", "objective.t_low=0.2", steps=4, batch_size=8, ckpt_every=4)
    train(cfg, tmp_path / "run", progress=False)
    rows = [r for r in read_metrics(tmp_path / "run") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(math.isfinite(r["loss"]) and 0.2 <= r["t_mean"] <= 1.0 for r in rows)
    assert all(r["grad_norm"] > 0 for r in rows)  # every step updated the weights
    _, saved = load_model(tmp_path / "run")
    assert saved.objective.name == "mdc_cosine" and saved.objective.t_low == 0.2
    assert RunConfig.from_dict(saved.to_dict()) == saved
