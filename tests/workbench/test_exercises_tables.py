"""The checks of notebooks 02-05's exercises accept the answer mdc_core computes and reject wrong ones (a wrong
number, a wrong conclusion, a wrong formula, a wrong rule); the closed form of the no-mask probability is checked
against hand-computed values and against Alg. 1's masking. (The notebooks' hidden solutions run through the same
checks where the suite executes the notebooks.)"""

from __future__ import annotations

import dataclasses
import statistics

import pytest
import torch

from mdc_core.config import RunConfig, SamplerConfig
from mdc_core.model import Captioner
from mdc_core.objectives import apply_mask, trim_padding
from mdc_core.tokenizer import CaptionTokenizer, build_output_vocab
from mdc_workbench.notebooks import exercises as ex
from mdc_workbench.notebooks.exercises import tables
from mdc_workbench.notebooks.notebook import loss_draws
from tests.conftest import micro_config

WORDS = "a an of the image photo drawing red blue green circle square triangle star cross on left right big small"
CAPTIONS = ["a red circle", "a blue square on the left", "a green star", "a small cross"]


@pytest.fixture(scope="module")
def micro():
    torch.manual_seed(0)
    ids = build_output_vocab([WORDS])
    model = Captioner(micro_config(output_vocab="corpus", output_vocab_size=len(ids)), output_ids=ids).eval()
    cfg = RunConfig(model=model.cfg, sampler=SamplerConfig(length=6)).validate()
    images = torch.randn(len(CAPTIONS), 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        image_tokens = model.encode_image(images)
    return model, cfg, images, image_tokens


def test_the_new_checks_are_registered() -> None:
    assert {"02.no_t_spread", "02.no_mask_chance", "03.headroom_share", "03.random_row", "04.mc_elbo", "04.blind",
            "05.confidence_rule", "05.length_repetition"} <= set(ex.CHECKS)
    for name, right in (("03.random_row", "c"), ("04.blind", "b")):
        assert ex.check(name, right).ok is True and ex.check(name, "a").ok is False


def test_no_t_spread_check(micro) -> None:
    model, cfg, images, _ = micro

    def spread(name):
        run = dataclasses.replace(cfg, objective=dataclasses.replace(cfg.objective, name=name, t_low=0.5, t_high=1.0))
        return statistics.stdev(loss_draws(model, run, images, CAPTIONS, draws=8, seed=0))

    right = {"std_with": spread("mdc"), "std_without": spread("mdc_no_t")}
    right["larger"] = "with" if right["std_with"] > right["std_without"] else "without"
    context = dict(model=model, cfg=cfg, images=images, captions=CAPTIONS, draws=8)
    assert ex.check("02.no_t_spread", right, **context).ok is True
    swapped = {**right, "std_with": right["std_without"], "std_without": right["std_with"]}
    assert ex.check("02.no_t_spread", swapped, **context).ok is False
    other = "without" if right["larger"] == "with" else "with"
    assert ex.check("02.no_t_spread", {**right, "larger": other}, **context).ok is False


def test_no_mask_probability_by_hand_and_by_alg1() -> None:
    assert tables.no_mask_probability(0.0, 1.0, 5) == pytest.approx(1 / 6)  # int_0^1 (1-t)^5 dt
    assert tables.no_mask_probability(0.5, 1.0, 5) == pytest.approx(2 * 0.5 ** 6 / 6)
    assert tables.no_mask_probability(0.4, 0.4, 4) == pytest.approx(0.6 ** 4)  # a fixed t
    gen = torch.Generator().manual_seed(0)
    n, lo, hi = 40000, 0.0, 1.0
    tokens = torch.tensor([[49406, 320, 736, 2860, 530, 320, 49407]]).repeat(n, 1)  # <sot> 5 words <eot>
    t = lo + (hi - lo) * torch.rand(n, generator=gen)
    _, mask = apply_mask(tokens, t, generator=gen)
    assert float((mask.sum(dim=1) == 0).float().mean()) == pytest.approx(tables.no_mask_probability(lo, hi, 5),
                                                                         abs=0.01)
    assert ex.check("02.no_mask_chance", tables.no_mask_probability).ok is True
    assert ex.check("02.no_mask_chance", lambda lo, hi, n: (1 - (lo + hi) / 2) ** n).ok is False  # (1 - E[t])^L


def test_mc_elbo_check(micro) -> None:
    model, _, _, image_tokens = micro
    tokenizer = CaptionTokenizer(model.cfg.context_length)
    context = dict(model=model, image_tokens=image_tokens[:1], captions=CAPTIONS[:2], samples=64)

    def right(model, image_tokens, tokens, samples):
        return statistics.mean(tables.mc_elbo_draws(model, image_tokens, tokens, samples, seed=5))

    def unweighted(model, image_tokens, tokens, samples):  # forgets the n / l weight
        n = tokens.shape[1] - 2
        gen = torch.Generator().manual_seed(5)
        total = 0.0
        for _ in range(samples):
            count = int(torch.randint(1, n + 1, (), generator=gen))
            total += right(model, image_tokens, tokens, 1) * count / n
        return total / samples

    tokens = trim_padding(tokenizer([CAPTIONS[1]]))
    assert len(tables.mc_elbo_draws(model, image_tokens[:1], tokens, 3)) == 3
    assert ex.check("04.mc_elbo", right, **context).ok is True
    assert ex.check("04.mc_elbo", unweighted, **context).ok is False
    assert ex.check("04.mc_elbo", lambda *a: 0.0, **context).ok is False


def test_confidence_rule_and_length_repetition_checks(micro) -> None:
    model, _, _, image_tokens = micro

    def eq6(probs, masked):
        conf, best = probs.max(dim=-1)
        position = int(conf.masked_fill(~masked, -1.0).argmax())
        return position, int(best[position])

    def left_to_right(probs, masked):
        position = int(masked.nonzero()[0, 0])
        return position, int(probs[position].argmax())

    context = dict(model=model, image_tokens=image_tokens[:2], length=5)
    assert ex.check("05.confidence_rule", eq6, **context).ok is True
    assert ex.check("05.confidence_rule", left_to_right, **context).ok is False
    assert ex.check("05.confidence_rule", lambda p, m: (-99, 0), **context).ok is False  # raises: reported

    rate = lambda n: tables.length_repetition(model, image_tokens, n)  # noqa: E731
    answer = {"rate": rate, "higher": "long" if rate(12) > rate(3) else "short" if rate(3) > rate(12) else "neither"}
    context = dict(model=model, image_tokens=image_tokens, lengths=(3, 12))
    assert ex.check("05.length_repetition", answer, **context).ok is True
    assert ex.check("05.length_repetition", {**answer, "rate": lambda n: rate(n) + 0.25}, **context).ok is False
