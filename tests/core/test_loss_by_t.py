"""The loss at a fixed noise level t (lesson.loss_by_t, notebook 00's loss-vs-t plot): at t = 1 it is the mean
cross-entropy of every word with all of them masked, computed here by hand; for a predictor that ignores the
caption's other words the 1/t-weighted loss has the same expectation at every t, and the unweighted one t times
it. (That a trained model's loss rises with t is checked on the shipped model where the lesson runs:
tests/workbench/test_teaching_notebooks.py.)"""

from __future__ import annotations

import dataclasses
import math
import statistics

import pytest
import torch

from mdc_core.config import ObjectiveConfig
from mdc_core.objectives import maskable_positions
from mdc_core.tokenizer import MASK_ID, CaptionTokenizer
from mdc_workbench.notebooks import lesson
from tests.workbench.test_exercise_answers import CAPTIONS, ContextFree, _build


@pytest.fixture(scope="module")
def context_free():
    model = _build(ContextFree)
    images = torch.randn(len(CAPTIONS), 3, 32, 32, generator=torch.Generator().manual_seed(2))
    tokens = CaptionTokenizer(model.cfg.context_length)(CAPTIONS)
    return model, images, tokens


def test_loss_at_t_1_by_hand(context_free) -> None:
    model, images, tokens = context_free
    words = maskable_positions(tokens)
    with torch.no_grad():
        logp = model.decode(tokens.masked_fill(words, MASK_ID), model.encode_image(images)).float().log_softmax(-1)
    rows = model.output_index[tokens].clamp(min=0)
    ce = -logp.gather(-1, rows[..., None])[..., 0]  # (B, L)
    by_hand = float(ce[words].sum() / words.sum())  # 1/t = 1, per caption token of the batch
    assert lesson.loss_by_t(model, ObjectiveConfig(), images, tokens, [1.0], draws=2)[1.0] == pytest.approx(
        by_hand, rel=1e-5)


def test_a_context_free_predictor_has_the_same_expected_loss_at_every_t(context_free) -> None:
    model, images, tokens = context_free
    objective = ObjectiveConfig()
    at_1 = lesson.loss_by_t(model, objective, images, tokens, [1.0], draws=1)[1.0]
    draws = [lesson.loss_by_t(model, objective, images, tokens, [0.5], draws=1, seed=s)[0.5] for s in range(200)]
    stderr = statistics.stdev(draws) / math.sqrt(len(draws))
    assert abs(statistics.mean(draws) - at_1) < 4 * stderr  # 1/t makes up for the fraction masked
    no_t = dataclasses.replace(objective, name="mdc_no_t")
    plain = [lesson.loss_by_t(model, no_t, images, tokens, [0.5], draws=1, seed=s)[0.5] for s in range(200)]
    assert abs(statistics.mean(plain) - 0.5 * at_1) < 4 * statistics.stdev(plain) / math.sqrt(len(plain))
    assert abs(statistics.mean(plain) - at_1) > 8 * statistics.stdev(plain) / math.sqrt(len(plain))  # not flat


def test_loss_by_t_averages_its_draws_and_draws_the_figure(context_free) -> None:
    model, images, tokens = context_free
    objective = ObjectiveConfig()
    single = [lesson.loss_by_t(model, objective, images, tokens, [0.5], draws=1, seed=s)[0.5] for s in (3, 4, 5)]
    assert lesson.loss_by_t(model, objective, images, tokens, [0.5], draws=3, seed=3)[0.5] == pytest.approx(
        statistics.mean(single))
    fig = lesson.loss_by_t_figure({"with 1/t": {0.5: 1.0, 1.0: 2.0}, "without": {0.5: 0.5, 1.0: 2.0}})
    assert len(fig.axes[0].lines) == 2 and fig.axes[0].get_xlabel().startswith("noise level t")
