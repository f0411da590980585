"""The exercise checks say "right" only to right answers: each accepts the answer mdc_core computes and rejects
wrong ones (a wrong number, a wrong conclusion, a wrong formula, a function that raises), reports an untouched
attempt as not answered, and turns a failing hidden solution into an error. (The notebooks' own solutions run
through these checks where the suite executes the notebooks.)"""

from __future__ import annotations

import dataclasses
import statistics

import pytest
import torch

from mdc_core.config import ModelConfig, RunConfig, SamplerConfig
from mdc_core.model import Captioner
from mdc_core.objectives import trim_padding
from mdc_core.sampler import sample
from mdc_core.scoring import score_tokens
from mdc_core.tokenizer import CaptionTokenizer, build_output_vocab
from mdc_workbench.notebooks import exercises as ex
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
        image_tokens = model.encode_image(images[:1])
    return model, cfg, images, image_tokens


def test_the_registry_and_the_result_lines() -> None:
    assert {"00.heuristic_score", "00.parallel_unmasking", "00.arc_signal", "01.schedule_variance",
            "01.fully_masked_accuracy", "01.first_revealed", "06.cfg_formula", "06.cfg_w1", "06.cfg_is_mcs"} <= set(
        ex.CHECKS)
    with pytest.raises(KeyError, match="no exercise"):
        ex.check("00.nothing", 1)
    right, wrong, empty = ex.check("00.arc_signal", "b"), ex.check("00.arc_signal", "(a)"), ex.check("00.arc_signal",
                                                                                                    None)
    assert (right.ok, wrong.ok, empty.ok) == (True, False, None)
    assert right._repr_markdown_().startswith("\u2714") and wrong._repr_markdown_().startswith("\u2718")
    assert "not answered yet" in str(empty) and "one of" in ex.check("00.arc_signal", "z").message
    with pytest.raises(AssertionError, match="fails its own check"):
        ex.check("00.arc_signal", "a", solution=True)
    with pytest.raises(AssertionError, match="fails its own check"):
        ex.check("00.arc_signal", None, solution=True)
    assert ex.check("00.arc_signal", "B", solution=True).ok is True


def _heuristic(model, image_tokens, tokens):
    return float(score_tokens(model, image_tokens, tokens, "heuristic").score[0])


def test_heuristic_score_check(micro) -> None:
    model, _, _, image_tokens = micro
    kw = dict(model=model, image_tokens=image_tokens, captions=CAPTIONS[:2])
    assert ex.check("00.heuristic_score", _heuristic, **kw).ok is True
    left_to_right = lambda m, v, t: float(score_tokens(m, v, t, "ar").score[0])  # another order: another number
    assert ex.check("00.heuristic_score", left_to_right, **kw).ok is False
    assert ex.check("00.heuristic_score", lambda m, v, t: None, **kw).ok is None  # an untouched `...` body

    def raises(m, v, t):
        raise IndexError("index 70 is out of bounds")
    result = ex.check("00.heuristic_score", raises, **kw)
    assert result.ok is False and "IndexError" in result.message


def test_parallel_unmasking_check(micro) -> None:
    model, _, _, image_tokens = micro
    right = lambda m, v, n, k: sample(m, v, SamplerConfig(length=n, tokens_per_step=k)).tokens[0]
    kw = dict(model=model, image_tokens=image_tokens, length=6)
    assert ex.check("00.parallel_unmasking", right, **kw).ok is True
    assert ex.check("00.parallel_unmasking", lambda m, v, n, k: torch.zeros(n, dtype=torch.long), **kw).ok is False
    assert ex.check("00.parallel_unmasking", lambda m, v, n, k: right(m, v, n + 1, k), **kw).ok is False


def test_schedule_variance_check(micro) -> None:
    model, cfg, images, _ = micro
    cfg = dataclasses.replace(cfg, objective=dataclasses.replace(cfg.objective, name="mdc"))
    spread = {}
    for key, low in (("std_0_1", 0.0), ("std_05_1", 0.5)):
        run = dataclasses.replace(cfg, objective=dataclasses.replace(cfg.objective, t_low=low))
        spread[key] = statistics.stdev(loss_draws(model, run, images, CAPTIONS, draws=32, seed=0))
    larger = "larger" if spread["std_0_1"] > spread["std_05_1"] else "smaller"
    kw = dict(model=model, cfg=cfg, images=images, captions=CAPTIONS)
    assert ex.check("01.schedule_variance", {**spread, "variance": larger}, **kw).ok is True
    flipped = {"larger": "smaller", "smaller": "larger"}[larger]
    assert ex.check("01.schedule_variance", {**spread, "variance": flipped}, **kw).ok is False
    assert ex.check("01.schedule_variance", {**spread, "std_0_1": spread["std_0_1"] * 1.1, "variance": larger},
                    **kw).ok is False
    assert ex.check("01.schedule_variance", {**spread, "variance": None}, **kw).ok is None


def test_fully_masked_accuracy_and_first_revealed_checks(micro) -> None:
    model, cfg, images, _ = micro
    acc = {"acc_t1": ex.masked_accuracy(model, cfg, images, CAPTIONS, 1.0),
           "acc_t05": ex.masked_accuracy(model, cfg, images, CAPTIONS, 0.5)}
    higher = "t=1" if acc["acc_t1"] > acc["acc_t05"] else "t=0.5"
    kw = dict(model=model, cfg=cfg, images=images, captions=CAPTIONS)
    assert ex.check("01.fully_masked_accuracy", {**acc, "higher": higher.upper()}, **kw).ok is True
    assert ex.check("01.fully_masked_accuracy", {**acc, "acc_t1": acc["acc_t1"] + 0.2, "higher": higher},
                    **kw).ok is False
    shares = ex.first_revealed_kinds(model, images, 6)
    assert sum(shares.values()) == pytest.approx(1.0)
    most = max(shares, key=shares.get)
    assert ex.check("01.first_revealed", {**shares, "most": most}, model=model, images=images, length=6).ok is True
    shifted = {**shares, "colour": shares["colour"] + 0.25, "most": most}
    assert ex.check("01.first_revealed", shifted, model=model, images=images, length=6).ok is False


def test_guidance_checks() -> None:
    def cfg_form(cond, null, w):
        return (1 - w) * null.log_softmax(-1) + w * cond.log_softmax(-1)

    assert ex.check("06.cfg_formula", cfg_form).ok is True
    assert ex.check("06.cfg_formula", lambda c, n, w: (1 - w) * n + w * c).ok is False  # logits, not log-probs
    assert ex.check("06.cfg_formula", lambda c, n, w: cfg_form(n, c, w)).ok is False  # the two models swapped
    assert ex.check("06.cfg_w1", "b").ok is True and ex.check("06.cfg_w1", "a").ok is False
    assert ex.check("06.cfg_is_mcs", 1).ok is True and ex.check("06.cfg_is_mcs", 0.1).ok is False


def test_heuristic_score_check_passes_unpadded_captions(micro) -> None:
    """The check hands the attempt `<sot> words <eot>` without padding, as the exercise says."""
    model, _, _, image_tokens = micro
    seen = []

    def spy(m, v, tokens):
        seen.append(tokens)
        return _heuristic(m, v, tokens)

    ex.check("00.heuristic_score", spy, model=model, image_tokens=image_tokens, captions=CAPTIONS[:1])
    want = trim_padding(CaptionTokenizer(model.cfg.context_length)(CAPTIONS[:1]))
    assert torch.equal(seen[0], want) and isinstance(model.cfg, ModelConfig)
