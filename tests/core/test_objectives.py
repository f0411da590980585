"""The MDC objective against hand-computed values (paper Alg. 1 / Eq. 5, docs/design.md "Decisions")."""

import math

import pytest
import torch
import torch.nn.functional as F

from mdc_core.config import ObjectiveConfig
from mdc_core.objectives import (
    LOSSES,
    apply_mask,
    compute_loss,
    loss_function,
    maskable_positions,
    normalized_token_loss,
    prepare_batch,
    trim_padding,
)
from mdc_core.registry import CORE_OBJECTIVES, OBJECTIVES, T_MIN, objective_names, sample_t
from mdc_core.run_state import logged_accuracy
from mdc_core.tokenizer import EOT_ID, MASK_ID, PAD_ID, SOT_ID


def mask_rates(cfg: ObjectiveConfig, batch: int, generator: torch.Generator) -> torch.Tensor:
    """(B,) masking rates of objective `cfg`'s schedule, drawn as the loss draws them."""
    schedule = OBJECTIVES[cfg.name].schedule
    return schedule.mask_rate(schedule.draw(cfg, batch, generator, "cpu"))


def caption(n: int, length: int) -> list[int]:
    """<sot>, n caption tokens (ids 100..), <eot>, pads up to `length`. Token id 0 ("!") is used inside the
    caption on purpose: it equals the pad id and must still be treated as a real token."""
    body = [0 if i == 1 else 100 + i for i in range(n)]
    return [SOT_ID, *body, EOT_ID] + [PAD_ID] * (length - n - 2)


def batch(*ns: int, length: int = 12) -> torch.Tensor:
    return torch.tensor([caption(n, length) for n in ns])


def test_maskable_excludes_specials_and_pads_but_not_exclamation_mark():
    tokens = batch(3)
    assert maskable_positions(tokens)[0].tolist() == [False, True, True, True] + [False] * 8
    assert tokens[0, 2] == PAD_ID  # the real "!" token at position 2 is maskable


def test_trim_padding_keeps_longest_caption():
    tokens = batch(2, 5, length=20)
    assert trim_padding(tokens).shape == (2, 7)


def test_sample_t_range_and_antithetic_strata():
    g = torch.Generator().manual_seed(0)
    t = sample_t(10_000, 0.5, 1.0, generator=g)
    assert t.min() >= 0.5 and t.max() < 1.0
    assert abs(t.mean().item() - 0.75) < 0.01
    t = sample_t(8, 0.0, 1.0, antithetic=True, generator=g)
    assert sorted((t * 8).floor().long().tolist()) == list(range(8))  # exactly one draw per 1/8 bin


def test_mask_rate_is_binomial_in_t():
    g = torch.Generator().manual_seed(1)
    tokens = batch(*[20] * 20_000, length=22)
    t = torch.full((tokens.shape[0],), 0.3)
    noisy, mask = apply_mask(tokens, t, generator=g)
    counts = mask.sum(1).float()
    assert abs(counts.mean().item() - 20 * 0.3) < 0.05  # Binomial(20, 0.3): mean 6
    assert abs(counts.var().item() - 20 * 0.3 * 0.7) < 0.15  # variance 4.2
    assert torch.equal(noisy == MASK_ID, mask)


def test_masked_fraction_distribution_over_t():
    """With t ~ U[0.5, 1], the masked fraction of long captions is ~ uniform on [0.5, 1]."""
    g = torch.Generator().manual_seed(2)
    tokens = batch(*[60] * 4000, length=62)
    t = mask_rates(ObjectiveConfig(), tokens.shape[0], g)
    _, mask = apply_mask(tokens, t, generator=g)
    frac = mask.sum(1) / 60.0
    assert abs(frac.mean().item() - 0.75) < 0.01
    assert abs(frac.var().item() - (0.5**2 / 12 + 0.75 * 0.25 / 60 - 0.5**2 / 12 / 60)) < 0.002
    assert frac.min() > 0.25 and frac.max() <= 1.0


def test_specials_and_pads_never_masked_even_at_t_1():
    tokens = batch(1, 4, 7)
    noisy, mask = apply_mask(tokens, torch.ones(3))
    assert torch.equal(mask, maskable_positions(tokens))
    assert (noisy[:, 0] == SOT_ID).all()
    for row, n in enumerate((1, 4, 7)):
        assert noisy[row, n + 1] == EOT_ID and (noisy[row, n + 2:] == PAD_ID).all()


def test_min_one_masked_forces_a_token():
    g = torch.Generator().manual_seed(3)
    tokens = batch(*[2] * 500)
    _, mask = apply_mask(tokens, torch.full((500,), 1e-6), generator=g, min_one=True)
    assert (mask.sum(1) == 1).all()
    assert (mask & ~maskable_positions(tokens)).sum() == 0
    _, mask = apply_mask(tokens, torch.full((500,), 1e-6), generator=g)
    assert mask.sum() == 0  # default keeps the unbiased estimator: zero masked tokens allowed


def test_loss_hand_computed_per_token_and_per_sequence():
    # two captions, 3 and 2 maskable tokens; masked: row 0 positions 1,3; row 1 position 2
    mask = torch.zeros(2, 5, dtype=torch.bool)
    mask[0, 1] = mask[0, 3] = mask[1, 2] = True
    ce = torch.tensor([1.0, 2.0, 4.0])  # row-major order of the mask
    t = torch.tensor([0.5, 0.8])
    n_valid = torch.tensor([3, 2])
    # per-token: (1/0.5 * (1 + 2) + 1/0.8 * 4) / (3 + 2) = (6 + 5) / 5 = 2.2
    assert normalized_token_loss(ce, mask, 1 / t, n_valid, "per_token").item() == pytest.approx(2.2)
    # per-sequence: mean(6 / 3, 5 / 2) = 2.25
    assert normalized_token_loss(ce, mask, 1 / t, n_valid, "per_sequence").item() == pytest.approx(2.25)
    # no 1/t weight, per caption token (mdc_no_t): (3 + 4) / 5; per sequence: mean(3 / 3, 4 / 2) = 1.5
    assert normalized_token_loss(ce, mask, torch.ones(2), n_valid, "per_token").item() == pytest.approx(1.4)
    assert normalized_token_loss(ce, mask, torch.ones(2), n_valid, "per_sequence").item() == pytest.approx(1.5)
    # no 1/t weight, per masked token (cmlm: Alg. 1 without 1/t, Eq. 1): (1 + 2 + 4) / 3; per sequence:
    # mean(3 / 2, 4 / 1) = 2.75
    n_masked = mask.sum(dim=1)
    assert normalized_token_loss(ce, mask, torch.ones(2), n_masked, "per_token").item() == pytest.approx(7 / 3)
    assert normalized_token_loss(ce, mask, torch.ones(2), n_masked, "per_sequence").item() == pytest.approx(2.75)


def test_the_three_losses_of_one_caption_by_hand():
    """One caption of 4 maskable tokens at t = 0.5, one token masked with cross-entropy 2 nats: MDC (Eq. 5)
    2 x 2 / 4 = 1; without 1/t per caption token (mdc_no_t) 2 / 4 = 0.5; per masked token (cmlm) 2 / 1 = 2."""
    mask = torch.tensor([[False, False, True, False, False, False]])  # <sot> a b c d <eot>: b masked
    ce, t, n_valid, n_masked = torch.tensor([2.0]), torch.tensor([0.5]), torch.tensor([4]), torch.tensor([1])
    for normalization in ("per_token", "per_sequence"):  # one caption: the two agree
        assert normalized_token_loss(ce, mask, 1 / t, n_valid, normalization).item() == pytest.approx(1.0)
        assert normalized_token_loss(ce, mask, torch.ones(1), n_valid, normalization).item() == pytest.approx(0.5)
        assert normalized_token_loss(ce, mask, torch.ones(1), n_masked, normalization).item() == pytest.approx(2.0)


@pytest.mark.parametrize("normalization", ["per_token", "per_sequence"])
def test_estimator_expectation_is_mean_token_ce(normalization):
    """With the model's per-token loss fixed, E[L] over t ~ U[0.5,1] and masks is the mean per-token CE."""
    g = torch.Generator().manual_seed(4)
    tokens = batch(3, 7, 1, 12, length=14)
    table = torch.rand(tokens.shape, generator=g) * 5  # fixed CE of every position
    maskable = maskable_positions(tokens)
    n_valid = maskable.sum(1)
    if normalization == "per_token":
        expected = table[maskable].sum() / n_valid.sum()
    else:
        expected = torch.stack([table[b][maskable[b]].mean() for b in range(4)]).mean()
    cfg = ObjectiveConfig()
    losses = []
    for _ in range(20_000):
        t = mask_rates(cfg, 4, g)
        _, mask = apply_mask(tokens, t, generator=g)
        losses.append(normalized_token_loss(table[mask], mask, 1 / t, n_valid, normalization))
    losses = torch.stack(losses)
    stderr = losses.std() / math.sqrt(len(losses))
    assert abs(losses.mean() - expected) < 4 * stderr


def test_time_clamped_for_zero_schedule():
    cfg = ObjectiveConfig(t_low=0.0, t_high=1e-6)
    t = mask_rates(cfg, 100, torch.Generator().manual_seed(0))
    assert (t >= T_MIN).all() and torch.isfinite(1 / t).all()


def test_fixed_ratio_and_parallel_rates():
    g = torch.Generator().manual_seed(0)
    assert torch.equal(mask_rates(ObjectiveConfig(name="bert", mask_ratio=0.4), 3, g), torch.full((3,), 0.4))
    assert torch.equal(mask_rates(ObjectiveConfig(name="parallel"), 3, g), torch.ones(3))
    assert OBJECTIVES["arc"].causal and not OBJECTIVES["mdc"].causal
    t = torch.tensor([0.25, 0.5])
    assert OBJECTIVES["mdc"].schedule.weight(t).tolist() == [4.0, 2.0]
    assert [OBJECTIVES[n].schedule.weight(t).tolist() for n in ("mdc_no_t", "cmlm", "bert")] == [[1, 1]] * 3


def test_objective_table_rows_are_the_config_names_and_have_loss_functions():
    """registry.objective_names (torch-free, used by the CLI and config validation) is the table's key list, the
    core's rows first, then the plug-ins'; a core row's loss is its family's, a plug-in's row brings its own."""
    assert objective_names() == tuple(OBJECTIVES) and objective_names()[:len(CORE_OBJECTIVES)] == CORE_OBJECTIVES
    assert CORE_OBJECTIVES == ("mdc", "mdc_no_t", "cmlm", "mdc_cosine", "bert", "parallel", "arc", "clip")
    for name, spec in OBJECTIVES.items():
        assert callable(loss_function(spec)), name
    assert {loss_function(OBJECTIVES[n]).__name__ for n in ("mdc", "cmlm", "mdc_cosine", "bert", "parallel")} == {
        "masked_token_loss"}
    assert loss_function(OBJECTIVES["arc"]) is LOSSES["causal"] and loss_function(OBJECTIVES["clip"]).__name__ == \
        "clip_loss"
    assert loss_function(OBJECTIVES["d3pm"]).__module__ == "mdc_workbench.masked_conditional.plugin"  # its own


def test_compute_loss_mdc_matches_manual(tiny_model):
    model = tiny_model()
    g = torch.Generator().manual_seed(5)
    images = torch.randn(3, 3, 32, 32, generator=g)
    tokens = batch(3, 5, 2, length=16).clamp(max=model.output_ids.max())  # ids 100..104 exist in full vocab
    cfg = ObjectiveConfig()
    out = compute_loss(model, images, tokens, cfg, torch.Generator().manual_seed(9))
    # replay the same random draws by hand
    g2 = torch.Generator().manual_seed(9)
    trimmed = trim_padding(tokens)
    t = mask_rates(cfg, 3, g2)
    noisy, mask = apply_mask(trimmed, t, generator=g2)
    logits = model.decode(noisy, model.encode_image(images))  # full (B, L, V)
    ce = F.cross_entropy(logits[mask], trimmed[mask], reduction="none")
    weighted = torch.zeros(3).index_add_(0, mask.nonzero()[:, 0], ce) / t
    expected = weighted.sum() / maskable_positions(trimmed).sum()
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert out.metrics["masked_frac"].item() == pytest.approx(mask.sum().item() / 10)


@pytest.mark.parametrize("name", ["mdc_no_t", "cmlm"])
def test_compute_loss_without_the_weight_matches_manual(tiny_model, name):
    """The two losses without 1/t on a model's own logits: the masked tokens' cross-entropy summed and divided by
    the caption tokens (mdc_no_t) or by the masked tokens (cmlm, Alg. 1's mean); their ratio is the batch's
    caption tokens over its masked tokens."""
    model = tiny_model()
    images = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    tokens = batch(3, 5, 2, length=16)
    cfg = ObjectiveConfig(name=name)
    out = compute_loss(model, images, tokens, cfg, torch.Generator().manual_seed(9))
    g2 = torch.Generator().manual_seed(9)
    trimmed = trim_padding(tokens)
    t = mask_rates(cfg, 3, g2)
    noisy, mask = apply_mask(trimmed, t, generator=g2)
    logits = model.decode(noisy, model.encode_image(images))
    ce = F.cross_entropy(logits[mask], trimmed[mask], reduction="none")
    assert 0 < mask.sum() < 10  # some tokens masked, not all: the two denominators differ
    expected = ce.sum() / (mask.sum() if name == "cmlm" else 10)  # 3 + 5 + 2 caption tokens
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-5)
    other = compute_loss(model, images, tokens, ObjectiveConfig(name="cmlm" if name == "mdc_no_t" else "mdc_no_t"),
                         torch.Generator().manual_seed(9))
    per_masked, per_caption = (out, other) if name == "cmlm" else (other, out)
    assert (per_masked.loss / per_caption.loss).item() == pytest.approx(10 / mask.sum().item(), rel=1e-5)


def test_compute_loss_arc_is_teacher_forced_ce(tiny_model):
    model = tiny_model(causal=True)
    images = torch.randn(2, 3, 32, 32)
    tokens = batch(3, 1, length=8)
    out = compute_loss(model, images, tokens, ObjectiveConfig(name="arc"))
    trimmed = trim_padding(tokens)
    logits = model.decode(trimmed[:, :-1], model.encode_image(images), causal=True)
    targets = trimmed[:, 1:]
    valid = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)  # 3 tokens + eot, 1 token + eot
    expected = F.cross_entropy(logits[valid], targets[valid])
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-5)
    accuracy = (logits[valid].argmax(-1) == targets[valid]).float().mean()
    assert "acc_masked" not in out.metrics and out.metrics["acc_next"].item() == pytest.approx(accuracy.item())


def test_each_accuracy_has_its_own_name_and_old_records_still_read():
    assert logged_accuracy({"loss": 1.0, "acc_next": 0.25}) == ("next-token accuracy", 0.25)
    assert logged_accuracy({"acc_retrieval": 0.5}) == ("retrieval accuracy", 0.5)
    assert logged_accuracy({"acc_masked": 0.75}) == ("masked-token accuracy", 0.75)  # also ARC/CLIP runs logged before
    assert logged_accuracy({"loss": 1.0}) is None


def test_prepare_batch_hand_example():
    tokens = batch(3, 1, length=8)  # <sot> a b c <eot> pad pad pad / <sot> a <eot> pad ...
    out_index = torch.arange(49409).masked_fill(torch.arange(49409) >= 49408, -1)  # the full head: id -> row
    arc = prepare_batch(tokens, ObjectiveConfig(name="arc"), output_index=out_index)
    assert arc.tokens.shape == (2, 5) and torch.equal(arc.inputs, arc.tokens[:, :-1])
    assert arc.index.tolist() == [0, 1, 2, 3, 4, 5]  # (B, 4) grid: row 0 predicts a b c <eot>, row 1 a <eot>
    assert arc.owner.tolist() == [0, 0, 0, 0, 1, 1]
    assert arc.targets.tolist() == [100, 0, 102, EOT_ID, 100, EOT_ID]
    par = prepare_batch(tokens, ObjectiveConfig(name="parallel"), output_index=out_index)  # every token masked
    assert par.index.tolist() == [1, 2, 3, 6] and par.owner.tolist() == [0, 0, 0, 1]
    assert par.targets.tolist() == [100, 0, 102, 100] and (par.inputs[par.loss_mask] == MASK_ID).all()
    with pytest.raises(ValueError, match=r"target token ids \[102\] have no row"):
        prepare_batch(tokens, ObjectiveConfig(name="parallel"), output_index=out_index.masked_fill(
            torch.arange(49409) == 102, -1))
    with pytest.raises(ValueError, match="takes no prepared batch"):
        prepare_batch(tokens, ObjectiveConfig(name="d3pm"), output_index=out_index)


@pytest.mark.parametrize("name", ["mdc", "cmlm", "bert", "parallel", "arc", "clip"])
def test_a_prepared_batch_gives_the_loss_of_the_same_draws(tiny_model, name):
    from mdc_core.factory import create_model
    from mdc_core.objectives import id_tables
    from tests.conftest import micro_config

    ids = torch.tensor(sorted({100, 0, 102, 103, 104, EOT_ID}))
    cfg = ObjectiveConfig(name=name)
    torch.manual_seed(0)
    model = create_model(micro_config(output_vocab="corpus", output_vocab_size=len(ids)), name, ids) \
        if name == "clip" else tiny_model(causal=name == "arc", output_ids=ids)
    images, tokens = torch.randn(3, 3, 32, 32), batch(3, 5, 2, length=16)
    direct = compute_loss(model, images, tokens, cfg, torch.Generator().manual_seed(4))
    prepared = prepare_batch(tokens, cfg, torch.Generator().manual_seed(4), **id_tables(model))
    via = compute_loss(model, images, prepared.tokens, cfg, None, prepared=prepared)
    assert torch.equal(direct.loss, via.loss)
    assert all(torch.equal(direct.metrics[k], via.metrics[k]) for k in direct.metrics)
