"""Every exercise check is a test subject: the notebook's own hidden solution (its solution cell, executed with the
notebook's imports on a micro model) passes, and at least two plausible wrong answers a student writes fail:
ignoring `k`, one reveal per step, the left-to-right order, np.std's ddof=0, a flipped conclusion, the raw score
instead of the gain, the logits instead of the log-probabilities... A check registered without a case here fails
`test_every_check_has_its_case`."""

from __future__ import annotations

import dataclasses
import math
import statistics
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch

from mdc_core.config import RunConfig, SamplerConfig
from mdc_core.model import Captioner
from mdc_core.objectives import maskable_positions, trim_padding
from mdc_core.sampler import sample
from mdc_core.scoring import score_tokens
from mdc_core.tokenizer import EOT_ID, MASK_ID, SOT_ID, CaptionTokenizer, build_output_vocab
from mdc_workbench.notebooks import exercises as ex
from mdc_workbench.notebooks.exercises import tables
from mdc_workbench.notebooks.notebook import loss_draws
from tests.conftest import micro_config

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
WORDS = "a an of the image photo drawing red blue green circle square triangle star cross on left right big small"
CAPTIONS = ["a red circle", "a blue square on the left", "a green star", "a small cross"]
COVERED: set[str] = set()


def covers(*names: str):
    """Mark a test as the case of the checks `names` (see test_every_check_has_its_case)."""
    COVERED.update(names)
    return lambda fn: fn


class ContextFree(Captioner):
    """A captioner that ignores the caption's other words: every position is predicted from the all-masked canvas.
    Its confidences never change between steps, so revealing k words a step or one gives the same caption."""

    def decode(self, tokens, image_tokens, **kwargs):
        kwargs["rows"] = None
        return super().decode(tokens.masked_fill(maskable_positions(tokens), MASK_ID), image_tokens, **kwargs)


def _build(cls=Captioner):
    torch.manual_seed(0)
    ids = build_output_vocab([WORDS])
    return cls(micro_config(output_vocab="corpus", output_vocab_size=len(ids)), output_ids=ids).eval()


@pytest.fixture(scope="module")
def micro():
    model = _build()
    cfg = RunConfig(model=model.cfg, sampler=SamplerConfig(length=6)).validate()
    images = torch.randn(len(CAPTIONS), 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        image_tokens = model.encode_image(images)
    return model, cfg, images, image_tokens


def run_solution(notebook: str, exercise: str, **objects) -> dict:
    """Execute `notebook`'s hidden solution cell of `exercise` in a namespace of the notebook's import cell and
    `objects`; the cell ends with ``ex.check(..., solution=True)``, which raises when the solution fails."""
    nb = nbformat.read(NOTEBOOKS / f"{notebook}.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    cell = next(c for c in code if "solution" in c.metadata.get("tags", []) and f'"{exercise}"' in c.source)
    namespace: dict = {}
    exec(code[0].source, namespace)  # noqa: S102 - the notebook's imports, from this repository
    namespace.update(objects)
    exec(cell.source, namespace)  # noqa: S102 - the notebook's own hidden solution
    return namespace


@pytest.fixture(autouse=True)
def messages_fit_the_limit(monkeypatch):
    """Every message a check gives in these cases (its solution's and the wrong answers') is at most
    ex.MESSAGE_LIMIT characters: the checks' own verdicts, recorded as they leave the check (ex.check turns an
    exception inside a check into a message, so the length is asserted afterwards)."""
    long = []

    def held(name, fn):
        def check(*args, **kwargs):
            ok, message = fn(*args, **kwargs)
            if len(message) > ex.MESSAGE_LIMIT:
                long.append((name, ok, len(message), message))
            return ok, message
        return check

    for name, fn in list(ex.CHECKS.items()):
        monkeypatch.setitem(ex.CHECKS, name, held(name, fn))
    yield
    assert not long, long


def fails(name: str, answer, **context) -> bool:
    return ex.check(name, answer, **context).ok is False


def test_every_check_has_its_case() -> None:
    assert set(ex.CHECKS) == COVERED, f"checks without a wrong-answer case: {sorted(set(ex.CHECKS) - COVERED)}"


# --------------------------------------------------------------------------------------------------------------
# 00


@covers("00.heuristic_score")
def test_heuristic_score(micro) -> None:
    model, _, _, image_tokens = micro
    context = dict(model=model, image_tokens=image_tokens[:1], captions=CAPTIONS[:2])
    run_solution("00_masked_diffusion_captioning", "00.heuristic_score", model=model, image_V=image_tokens[:1],
                 captions=CAPTIONS, wrong=CAPTIONS[1])

    def left_to_right(model, image_tokens, tokens):  # the true words revealed in reading order
        x = tokens.clone()
        x[0, 1:-1] = MASK_ID
        total = 0.0
        for i in range(1, tokens.shape[1] - 1):
            logp = model.decode(x, image_tokens)[0, i].float().log_softmax(dim=-1)
            total += float(logp[model.output_index[tokens[0, i]]])
            x[0, i] = tokens[0, i]
        return total

    def one_pass(model, image_tokens, tokens):  # every word scored with all of them masked: no reveals
        x = tokens.clone()
        x[0, 1:-1] = MASK_ID
        logp = model.decode(x, image_tokens)[0].float().log_softmax(dim=-1)
        return float(logp[torch.arange(1, tokens.shape[1] - 1), model.output_index[tokens[0, 1:-1]]].sum())

    with torch.no_grad():
        assert fails("00.heuristic_score", left_to_right, **context)
        assert fails("00.heuristic_score", one_pass, **context)
        assert fails("00.heuristic_score", lambda m, v, t: float(score_tokens(m, v, t, "ar").score[0]), **context)


def _one_per_step(model, image_tokens, length, k):
    """Section 5's loop copied as it is: one reveal per step, `k` ignored."""
    allowed = (model.output_ids != SOT_ID) & (model.output_ids != EOT_ID)
    x = torch.full((1, length + 2), MASK_ID)
    x[0, 0], x[0, -1] = SOT_ID, EOT_ID
    with torch.no_grad():
        for _ in range(length):
            eta = model.decode(x, image_tokens)[0, 1:-1].float()
            confidence, best = eta.masked_fill(~allowed, float("-inf")).softmax(dim=-1).max(dim=-1)
            confidence[x[0, 1:-1] != MASK_ID] = -1.0
            i = int(confidence.argmax())
            x[0, 1 + i] = model.output_ids[best[i]]
    return x[0, 1:-1]


@covers("00.parallel_unmasking")
def test_parallel_unmasking_rejects_a_loop_that_ignores_k() -> None:
    model = _build(ContextFree)  # a model on which the captions alone cannot tell k per step from one
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        image_tokens = model.encode_image(images)
    context = dict(model=model, image_tokens=image_tokens, length=7)
    for k in (2, 3):  # the premise: the one-per-step caption is the k-per-step one here
        want = sample(model, image_tokens[:1], SamplerConfig(length=7, tokens_per_step=k)).tokens[0]
        assert torch.equal(_one_per_step(model, image_tokens[:1], 7, k), want)
    namespace = run_solution("00_masked_diffusion_captioning", "00.parallel_unmasking", model=model,
                             image_V=image_tokens[:1], n_prime=7)
    assert ex.check("00.parallel_unmasking", namespace["solution_unmask_k"], **context).ok is True
    ignores_k = ex.check("00.parallel_unmasking", _one_per_step, **context)
    assert ignores_k.ok is False and "7 decoder passes" in ignores_k.message

    def plus_one(model, image_tokens, length, k):  # off by one: k + 1 reveals a step
        return namespace["solution_unmask_k"](model, image_tokens, length, k + 1)

    def left_to_right(model, image_tokens, length, k):  # k per step, in reading order instead of by confidence
        x = torch.full((1, length + 2), MASK_ID)
        x[0, 0], x[0, -1] = SOT_ID, EOT_ID
        allowed = (model.output_ids != SOT_ID) & (model.output_ids != EOT_ID)
        with torch.no_grad():
            for start in range(0, length, k):
                eta = model.decode(x, image_tokens)[0, 1:-1].float().masked_fill(~allowed, float("-inf"))
                for i in range(start, min(start + k, length)):
                    x[0, 1 + i] = model.output_ids[int(eta[i].argmax())]
        return x[0, 1:-1]

    assert fails("00.parallel_unmasking", plus_one, **context)
    assert fails("00.parallel_unmasking", left_to_right, model=_build(), image_tokens=image_tokens, length=7)
    _shows_words("00.parallel_unmasking", lambda m, v, n, k: torch.full((n,), 320), **context)


def _shows_words(name: str, answer, **context) -> None:
    """A check that compares captions shows a wrong one as words, not token ids: the message quotes the caption
    the answer wrote, and no id of it appears as a number."""
    from mdc_core.tokenizer import CaptionTokenizer

    result = ex.check(name, answer, **context)
    assert result.ok is False
    word = CaptionTokenizer(context["model"].cfg.context_length).token_string(320)  # "a": every wrong caption
    assert f'"{word} {word}' in result.message and "320" not in result.message, result.message


def test_parallel_unmasking_on_a_model_that_reads_its_context(micro) -> None:
    model, _, _, image_tokens = micro
    context = dict(model=model, image_tokens=image_tokens[:2], length=6)
    right = lambda m, v, n, k: sample(m, v, SamplerConfig(length=n, tokens_per_step=k)).tokens[0]  # noqa: E731
    assert ex.check("00.parallel_unmasking", right, **context).ok is True  # the sampler's own passes count too
    assert fails("00.parallel_unmasking", _one_per_step, **context)
    counter = ex.PassCounter(model)
    assert counter.output_ids is model.output_ids and counter.passes == 0


@covers("00.arc_signal", "03.random_row", "04.blind", "06.cfg_w1")
@pytest.mark.parametrize("notebook, name, wrong", [
    ("00_masked_diffusion_captioning", "00.arc_signal", "acd"), ("03_linear_probing", "03.random_row", "abd"),
    ("04_compositionality", "04.blind", "acd"), ("06_mc_diffusion", "06.cfg_w1", "acd")])
def test_multiple_choice(notebook, name, wrong) -> None:
    run_solution(notebook, name)
    for letter in wrong:
        result = ex.check(name, letter)
        assert result.ok is False and "Not quite" in result.message
    assert fails(name, "e")  # not an option


def test_hints_fit_their_question() -> None:
    """06's hint is about w, not about what the decoder can see (a hint copied from 00)."""
    assert "decoder can see" not in ex.check("06.cfg_w1", "a").message
    assert "w = 1" in ex.check("06.cfg_w1", "a").message


# --------------------------------------------------------------------------------------------------------------
# 01


@covers("01.schedule_variance")
def test_schedule_variance(micro) -> None:
    model, cfg, images, _ = micro
    cfg = dataclasses.replace(cfg, objective=dataclasses.replace(cfg.objective, name="mdc"))
    ns = run_solution("01_pretraining", "01.schedule_variance", untrained=model, cfg=cfg, images=images,
                      texts=CAPTIONS)
    right = ns["solution_schedule"]
    context = dict(model=model, cfg=cfg, images=images, captions=CAPTIONS)
    flipped = {"larger": "smaller", "smaller": "larger"}[right["variance"]]
    assert fails("01.schedule_variance", {**right, "variance": flipped}, **context)
    assert fails("01.schedule_variance", {**right, "std_0_1": right["std_0_1"] ** 2,
                                          "std_05_1": right["std_05_1"] ** 2}, **context)  # variances

    def spread(t_low, ddof=0, seed=0):
        run = dataclasses.replace(cfg, objective=dataclasses.replace(cfg.objective, t_low=t_low, t_high=1.0))
        return float(np.std(loss_draws(model, run, images, CAPTIONS, draws=32, seed=seed), ddof=ddof))

    assert fails("01.schedule_variance", {**right, "std_0_1": spread(0.0, seed=1), "std_05_1": spread(0.5, seed=1)},
                 **context)  # another seed than the question's 0
    population = ex.check("01.schedule_variance", {**right, "std_0_1": spread(0.0), "std_05_1": spread(0.5)},
                          **context)  # np.std's default ddof=0: accepted, the question says either
    assert population.ok is True


def test_schedule_variance_is_robust_on_an_untrained_model_and_its_message_follows_the_answer(micro,
                                                                                              monkeypatch) -> None:
    """On an untrained model (notebook 01 asks on `untrained`) the [0, 1] spread is the larger on every batch
    tried; where it is the smaller (a trained model may give that), the message does not explain a larger one."""
    model, cfg, _, _ = micro
    cfg = dataclasses.replace(cfg, objective=dataclasses.replace(cfg.objective, name="mdc"))
    for batch in range(4):
        images = torch.randn(len(CAPTIONS), 3, 32, 32, generator=torch.Generator().manual_seed(10 + batch))
        wide, narrow = (statistics.stdev(loss_draws(model, dataclasses.replace(cfg, objective=dataclasses.replace(
            cfg.objective, t_low=low, t_high=1.0)), images, CAPTIONS, draws=32, seed=0)) for low in (0.0, 0.5))
        assert wide > 1.5 * narrow, (batch, wide, narrow)
    import mdc_workbench.notebooks.notebook as notebook

    monkeypatch.setattr(notebook, "loss_draws", lambda m, run, *a, **k: [1.0, 1.2, 1.4] if run.objective.t_low
                        else [1.0, 1.1, 1.2])  # [0, 1] narrower
    answer = {"std_0_1": 0.1, "std_05_1": 0.2, "variance": "smaller"}
    result = ex.check("01.schedule_variance", answer, model=model, cfg=cfg, images=None, captions=CAPTIONS)
    assert result.ok is True and "smaller one" in result.message and "dominate" not in result.message


@covers("01.fully_masked_accuracy")
def test_fully_masked_accuracy(micro) -> None:
    model, cfg, images, _ = micro
    ns = run_solution("01_pretraining", "01.fully_masked_accuracy", model=model, cfg=cfg, images=images,
                      texts=CAPTIONS)
    right = ns["solution_masked"]
    context = dict(model=model, cfg=cfg, images=images, captions=CAPTIONS)
    other = {"t=1": "t=0.5", "t=0.5": "t=1"}[right["higher"]]
    assert fails("01.fully_masked_accuracy", {**right, "higher": other}, **context)
    assert fails("01.fully_masked_accuracy", {**right, "acc_t1": right["acc_t1"] + 0.2, "acc_t05": right["acc_t05"]
                                              - 0.2}, **context)  # one draw, or another metric (acc of all tokens)


def test_word_kinds() -> None:
    assert [ex.word_kind(w) for w in ("red", "cross", "crosses", "circles", "circle", "cro", "cy", "a")] == [
        "colour", "shape", "shape", "shape", "shape", "other", "other", "other"]


@covers("01.first_revealed")
def test_first_revealed(micro) -> None:
    model, cfg, images, _ = micro
    tokenizer = CaptionTokenizer(model.cfg.context_length)
    ns = run_solution("01_pretraining", "01.first_revealed", model=model, cfg=cfg, images=images,
                      tokenizer=tokenizer)
    right = ns["solution_first"]
    context = dict(model=model, images=images, length=cfg.sampler.length)
    with torch.no_grad():
        out = sample(model, model.encode_image(images), cfg.sampler)
    every = [ex.word_kind(tokenizer.token_string(int(i)).strip()) for row in out.tokens for i in row]
    every_shares = {k: every.count(k) / len(every) for k in ex.FIRST_KINDS}  # every word, not the first revealed
    assert every_shares != {k: right[k] for k in ex.FIRST_KINDS}  # the premise: they differ here
    assert fails("01.first_revealed", {**every_shares, "most": max(every_shares, key=every_shares.get)}, **context)
    counts = {k: right[k] * len(images) for k in ex.FIRST_KINDS}  # counts, not shares
    assert fails("01.first_revealed", {**counts, "most": right["most"]}, **context)
    not_most = next(k for k in ex.FIRST_KINDS if right[k] < max(right[j] for j in ex.FIRST_KINDS))
    assert fails("01.first_revealed", {**right, "most": not_most}, **context)


# --------------------------------------------------------------------------------------------------------------
# 02


@covers("02.no_t_spread")
def test_no_t_spread(micro) -> None:
    model, cfg, images, _ = micro
    ns = run_solution("02_noise_schedule_ablation", "02.no_t_spread", model=model, cfg=cfg, images=images,
                      texts=CAPTIONS)
    right = ns["solution_no_t"]
    context = dict(model=model, cfg=cfg, images=images, captions=CAPTIONS)
    assert fails("02.no_t_spread", {**right, "larger": {"with": "without", "without": "with"}[right["larger"]]},
                 **context)
    assert fails("02.no_t_spread", {**right, "std_with": right["std_with"] * (31 / 32) ** 0.5,
                                    "std_without": right["std_without"] * (31 / 32) ** 0.5}, **context)  # ddof=0


@covers("02.no_mask_chance")
def test_no_mask_chance(micro) -> None:
    model, cfg, images, _ = micro
    run_solution("02_noise_schedule_ablation", "02.no_mask_chance", model=model, cfg=cfg, texts=CAPTIONS)
    assert fails("02.no_mask_chance", lambda lo, hi, n: (1 - (lo + hi) / 2) ** n)  # (1 - E[t])^L
    assert fails("02.no_mask_chance", lambda lo, hi, n: (1 - lo) ** n)  # at the schedule's lower end only

    def no_l_plus_1(lo, hi, n):  # the integral without its 1 / (L + 1)
        return (1 - lo) ** n if hi == lo else ((1 - lo) ** (n + 1) - (1 - hi) ** (n + 1)) / (hi - lo)

    assert fails("02.no_mask_chance", no_l_plus_1)


# --------------------------------------------------------------------------------------------------------------
# 03


PROBES = {"MDC": {"shape": 60.0, "colour": 90.0, "count": 70.0, "mean": 73.3},
          "random init (GAP)": {"shape": 20.0, "colour": 50.0, "count": 70.0, "mean": 46.7}}


def test_headroom_share_by_hand() -> None:
    # shape 40 of 80 points of headroom: 50%; colour 40 of 50: 80%; count 0 of 30: 0% -> mean 43.33%
    assert tables.headroom_share(PROBES, "MDC", "random init (GAP)", ["shape", "colour", "count"]) == \
        pytest.approx(130 / 3)
    with pytest.raises(ValueError, match="already scores 100% on colour"):
        tables.headroom_share({"a": {"colour": 100.0}, "b": {"colour": 100.0}}, "a", "b", ["colour"])


@covers("03.headroom_share")
def test_headroom_share() -> None:
    context = dict(probes=PROBES, row="MDC", baseline="random init (GAP)", mean_tasks=["shape", "colour", "count"])
    run_solution("03_linear_probing", "03.headroom_share", scores=PROBES, row="MDC", baseline="random init (GAP)",
                 mean_tasks=["shape", "colour", "count"])
    gain = ex.check("03.headroom_share", 80 / 3, **context)  # the table's gain in points
    assert gain.ok is False and "gain in points" in gain.message
    pooled = ex.check("03.headroom_share", 100 * (80 / 3) / (160 / 3), **context)  # mean gain / mean headroom
    assert pooled.ok is False and "task by task" in pooled.message
    assert fails("03.headroom_share", 73.3, **context)  # the raw top-1


def test_headroom_share_accepts_what_the_notebook_displays() -> None:
    """The share printed with one decimal (the solution's .1f) and the share computed from the table's one-decimal
    values (33.24 against 33.222 in the issue) are right; the gain in points and a share half a point off are
    not. Here the two differ by 0.08 (a baseline near 100 magnifies the table's rounding)."""
    probes = {"MDC": {"shape": 95.04, "colour": 73.46}, "random init (GAP)": {"shape": 90.04, "colour": 57.46}}
    context = dict(probes=probes, row="MDC", baseline="random init (GAP)", mean_tasks=["shape", "colour"])
    want = tables.headroom_share(probes, "MDC", "random init (GAP)", ["shape", "colour"])  # 43.906
    printed = {r: {t: float(f"{v:.1f}") for t, v in row.items()} for r, row in probes.items()}
    from_table = tables.headroom_share(printed, "MDC", "random init (GAP)", ["shape", "colour"])  # 43.824
    assert abs(want - from_table) > 0.05  # the premise: the table's rounding shows
    for shown in (round(want, 1), round(from_table, 2), want):
        assert ex.check("03.headroom_share", shown, **context).ok is True, shown
    for wrong in (10.5, round(want, 1) + 0.5, round(from_table, 1) - 0.5):  # the gain in points; half a point off
        assert fails("03.headroom_share", wrong, **context)


# --------------------------------------------------------------------------------------------------------------
# 04


SCALED_WEIGHTS = {"n_plus_1": lambda n, count: (n + 1) / count, "n_minus_1": lambda n, count: (n - 1) / count,
                  "plus_10": lambda n, count: 1.1 * n / count, "minus_10": lambda n, count: 0.9 * n / count}


def mc_estimator(kind: str, seed: int):
    """A student's Monte Carlo ELBO (04.mc_elbo) drawing from `seed`: "right" (l ~ U{1..n}, weight n / l),
    "off_by_one" (``randint(1, n)``: l in 1..n-1, every word masked never drawn), "training" (t ~ U[0.5, 1], each
    word masked with probability t, weight 1/t: the training objective), "unweighted" (the n / l forgotten),
    "per_word" (the mean over the masked words: weight 1 / l), and the weights of :data:`SCALED_WEIGHTS` ((n + 1) / l,
    (n - 1) / l, 1.1 n / l, 0.9 n / l: issue 64's, which passed on two caption pairs)."""
    def estimate(model, image_tokens, tokens, samples):
        n = tokens.shape[1] - 2
        gen = torch.Generator().manual_seed(seed)
        values = []
        with torch.no_grad():
            for _ in range(samples):
                if kind == "training":
                    t = 0.5 + 0.5 * float(torch.rand((), generator=gen))
                    where = 1 + (torch.rand(n, generator=gen) < t).nonzero()[:, 0]
                    weight = 1 / t
                else:
                    count = int(torch.randint(1, n if kind == "off_by_one" else n + 1, (), generator=gen))
                    where = 1 + torch.randperm(n, generator=gen)[:count]
                    weight = {"right": n / count, "off_by_one": n / count, "unweighted": 1.0,
                              "per_word": 1.0 / count}.get(kind) or SCALED_WEIGHTS[kind](n, count)
                x = tokens.clone()
                x[0, where] = MASK_ID
                logp = model.decode(x, image_tokens)[0].float().log_softmax(dim=-1)
                values.append(float(logp[where, model.output_index[tokens[0, where]]].sum()) * weight)
        return statistics.mean(values)
    return estimate


@covers("04.mc_elbo")
def test_mc_elbo(micro) -> None:
    model, _, _, image_tokens = micro
    ns = run_solution("04_compositionality", "04.mc_elbo", model=model, image_V=image_tokens[:1], pair=CAPTIONS[:2])
    context = dict(model=model, image_tokens=image_tokens[:1], captions=CAPTIONS[:2], samples=64)
    assert ex.check("04.mc_elbo", ns["solution_mc_elbo"], **context).ok is True
    for wrong in ("unweighted", "per_word"):
        assert fails("04.mc_elbo", mc_estimator(wrong, 5), **context)
    assert fails("04.mc_elbo", lambda *a: 0.0, **context)


def test_mc_elbo_rejects_the_off_by_one_count_and_the_training_estimator_on_every_seed(micro) -> None:
    """The estimators that once passed with the shipped model (l in 1..n-1: 5 of 5 seeds; t ~ U[0.5, 1] with weight
    1/t: 2 of 5) fail on every seed: the stand-in models of the check make their bias many times their noise."""
    model, _, _, image_tokens = micro
    context = dict(model=model, image_tokens=image_tokens[:1], captions=CAPTIONS[:2])
    assert ex.check("04.mc_elbo", mc_estimator("right", 1), **context).ok is True
    for seed in range(5):
        for wrong in ("off_by_one", "training"):
            result = ex.check("04.mc_elbo", mc_estimator(wrong, seed), **context)
            assert result.ok is False and "stand-in model" in result.message, (wrong, seed, result.message)


@pytest.mark.parametrize("wrong", sorted(SCALED_WEIGHTS))
def test_mc_elbo_rejects_every_weight_but_n_over_l_on_every_seed(micro, wrong) -> None:
    """(n + 1) / l, (n - 1) / l, 1.1 n / l and 0.9 n / l were marked right (issue 64: -9.11 against -7.30 within 4
    standard errors of 128 samples); on the stand-in without Monte Carlo noise they miss the exact answer by |c|
    or 0.1 n |c| (c = log 1/4), and fail on every seed. n / l passes on every seed."""
    model, _, _, image_tokens = micro
    context = dict(model=model, image_tokens=image_tokens[:1], captions=CAPTIONS[:2])
    for seed in range(4):
        result = ex.check("04.mc_elbo", mc_estimator(wrong, seed), **context)
        assert result.ok is False and "probability 1/4" in result.message, (wrong, seed, result.message)
        if wrong == "plus_10":  # the right one, once per seed (the slowest case: every stand-in and caption)
            assert ex.check("04.mc_elbo", mc_estimator("right", seed), **context).ok is True, seed


def test_the_constant_stand_in_has_no_monte_carlo_noise(micro) -> None:
    """Every masked word has log-probability c = log 1/4 whatever is masked: each draw of Eq. 8's estimator sums l
    of them with weight n / l, exactly n c; exact_elbo says so with a spread of 0 (to rounding)."""
    model, _, _, image_tokens = micro
    tokens = trim_padding(CaptionTokenizer(model.cfg.context_length)(["a red circle"]))
    constant = tables.MaskCountModel.probes(model, tokens)[0]
    elbo, spread = tables.exact_elbo(constant, image_tokens[:1], constant.tokens)
    assert elbo == pytest.approx(4 * math.log(0.25), abs=1e-4) and spread < 1e-4
    draws = tables.mc_elbo_draws(constant, image_tokens[:1], constant.tokens, 16, seed=3)
    assert draws == pytest.approx([4 * math.log(0.25)] * 16, abs=1e-4)


def test_exact_elbo_is_the_mean_and_spread_of_every_draw(micro) -> None:
    """exact_elbo by hand on a 2-word caption: masks {1}, {2} (l = 1, weight 2) and {1, 2} (l = 2, weight 1)."""
    model, _, _, image_tokens = micro
    tokens = trim_padding(CaptionTokenizer(model.cfg.context_length)(["a star"]))
    assert tokens.shape[1] == 4
    rows = model.output_index[tokens[0]].clamp(min=0)

    def masked_sum(positions):
        x = tokens.clone()
        x[0, positions] = MASK_ID
        with torch.no_grad():
            logp = model.decode(x, image_tokens[:1])[0].float().log_softmax(dim=-1)
        return sum(float(logp[i, rows[i]]) for i in positions)

    l1 = [2 * masked_sum([1]), 2 * masked_sum([2])]  # l = 1: each mask with probability 1/2 * 1/2
    l2 = masked_sum([1, 2])  # l = 2: probability 1/2
    mean = (sum(l1) / 2 + l2) / 2
    spread = ((sum(v ** 2 for v in l1) / 2 + l2 ** 2) / 2 - mean ** 2) ** 0.5
    assert tables.exact_elbo(model, image_tokens[:1], tokens) == pytest.approx((mean, spread), rel=1e-4, abs=1e-5)


def test_mask_count_models_give_the_log_probability_they_promise(micro) -> None:
    model, _, _, image_tokens = micro
    tokens = trim_padding(CaptionTokenizer(model.cfg.context_length)(["a red circle"]))
    _, first, second = tables.MaskCountModel.probes(model, tokens)  # the constant one: the test above
    assert first.tokens.shape == (1, 6) and first.tokens[0, 4] == tokens[0, 3]  # 4 words: the last one repeated
    x = first.tokens.repeat(2, 1)
    x[0, 1:-1] = MASK_ID  # every word masked
    x[1, 1] = MASK_ID  # one word masked
    rows = model.output_index[first.tokens[0, 1]]
    for probe, want in ((first, (-3.0, math.log(0.99))), (second, (math.log(0.99), -3.0))):
        logp = probe.decode(x, image_tokens[:1]).log_softmax(dim=-1)[:, 1, rows]
        assert logp.tolist() == pytest.approx(list(want), abs=1e-4)
    # ELBO of the first: only l = n = 4 is unsure (4 * -3.0 * 4/4 = -12 per draw, probability 1/4)
    assert tables.exact_elbo(first, image_tokens[:1], first.tokens)[0] == pytest.approx(
        (3 * 4 * math.log(0.99) - 12.0) / 4, abs=1e-3)
    with pytest.raises(ValueError, match="knows one caption of 4 words"):
        first.decode(tokens, image_tokens[:1])


# --------------------------------------------------------------------------------------------------------------
# 05


@covers("05.confidence_rule")
def test_confidence_rule(micro) -> None:
    model, _, _, image_tokens = micro
    context = dict(model=model, image_tokens=image_tokens[:2], length=5)
    run_solution("05_captioning", "05.confidence_rule", model=model, image_V=image_tokens[:2], explore_length=5)

    def left_to_right(probs, masked):
        position = int(masked.nonzero()[0, 0])
        return position, int(probs[position].argmax())

    def least_sure(probs, masked):
        confidence, best = probs.max(dim=-1)
        position = int(confidence.masked_fill(~masked, 2.0).argmin())
        return position, int(best[position])

    def ignores_masked(probs, masked):  # picks revealed positions again
        confidence, best = probs.max(dim=-1)
        return int(confidence.argmax()), int(best[int(confidence.argmax())])

    assert fails("05.confidence_rule", left_to_right, **context)
    assert fails("05.confidence_rule", least_sure, **context)
    assert "revealed already" in ex.check("05.confidence_rule", ignores_masked, **context).message

    def writes_a(probs, masked):  # the first masked position, always the word "a"
        return int(masked.nonzero()[0, 0]), int(model.output_index[320])

    _shows_words("05.confidence_rule", writes_a, **context)


@covers("05.length_repetition")
def test_length_repetition(micro) -> None:
    model, _, _, image_tokens = micro
    ns = run_solution("05_captioning", "05.length_repetition", model=model, image_V=image_tokens, lengths=(3, 12),
                      tokenizer=CaptionTokenizer(model.cfg.context_length))
    right = ns["solution_repetition"]
    context = dict(model=model, image_tokens=image_tokens, lengths=(3, 12))
    rate = right["rate"]
    assert [rate(n) for n in (1, 3, 12)] != [rate(n + 2) for n in (1, 3, 12)]  # the premise of the shifted length
    other = {"short": "long", "long": "short", "neither": "long"}[right["higher"]]
    assert fails("05.length_repetition", {**right, "higher": other}, **context)
    assert fails("05.length_repetition", {**right, "rate": lambda n: rate(n + 2)}, **context)  # N' = 10 for 8
    assert fails("05.length_repetition", {**right, "rate": lambda n: rate(10)}, **context)  # n ignored


def test_length_repetition_tells_a_length_from_its_neighbour_when_the_rates_coincide(micro) -> None:
    """The issue's case: at the asked length a neighbour's rate is the same (rates move in steps of 1 / images),
    so only the other lengths the check tries reject it; a rate of the right lengths passes."""
    model, _, _, image_tokens = micro
    rate = {n: tables.length_repetition(model, image_tokens, n) for n in range(1, 19)}
    pairs = [(n, m) for n in range(3, 15) for m in (n - 2, n + 2) if rate[n] == rate[m]]
    assert pairs, "the premise: two lengths two apart with the same rate"
    n, m = pairs[0]
    lengths = (n, 16 if n < 12 else 1)
    lengths = tuple(sorted(lengths))
    context = dict(model=model, image_tokens=image_tokens, lengths=lengths)
    higher = "long" if rate[lengths[1]] > rate[lengths[0]] else "short" if rate[lengths[0]] > rate[lengths[1]] \
        else "neither"
    assert ex.check("05.length_repetition", {"rate": rate.get, "higher": higher}, **context).ok is True
    shifted = {k: rate[k + m - n] if 1 <= k + m - n <= 18 else 0.0 for k in range(1, 19)}
    assert shifted[n] == rate[n]  # the asked length alone cannot tell
    assert fails("05.length_repetition", {"rate": shifted.get, "higher": higher}, **context)


# --------------------------------------------------------------------------------------------------------------
# 06


@covers("06.cfg_formula")
def test_cfg_formula() -> None:
    run_solution("06_mc_diffusion", "06.cfg_formula")
    assert fails("06.cfg_formula", lambda c, n, w: (1 - w) * n + w * c)  # logits, not log-probabilities
    assert fails("06.cfg_formula", lambda c, n, w: (1 - w) * c.log_softmax(-1) + w * n.log_softmax(-1))  # swapped
    assert fails("06.cfg_formula", lambda c, n, w: c.log_softmax(-1) + w * (c - n).log_softmax(-1))


@covers("06.cfg_is_mcs")
def test_cfg_is_mcs() -> None:
    run_solution("06_mc_diffusion", "06.cfg_is_mcs")
    for wrong in (0.0, 0.1, 0.5):
        assert fails("06.cfg_is_mcs", wrong)
    percent = ex.check("06.cfg_is_mcs", 100)  # 100 (%) is not a probability; "some tokens stay visible" was wrong
    assert percent.ok is False and "not a probability" in percent.message and "visible" not in percent.message
    assert fails("06.cfg_is_mcs", -1)


def test_the_solution_runner_fails_a_wrong_solution(micro) -> None:
    """run_solution really runs the check: a solution cell whose answer is wrong raises."""
    with pytest.raises(AssertionError, match="fails its own check"):
        run_solution("03_linear_probing", "03.headroom_share", scores=PROBES, row="random init (GAP)",
                     baseline="MDC", mean_tasks=["count"], np=type("np", (), {"mean": staticmethod(lambda v: 1.0)}))


def test_trimmed_tokens_reach_the_heuristic_attempt(micro) -> None:
    model, _, _, image_tokens = micro
    seen = []
    ex.check("00.heuristic_score", lambda m, v, t: seen.append(t) or 0.0, model=model, image_tokens=image_tokens[:1],
             captions=CAPTIONS[:1])
    assert torch.equal(seen[0], trim_padding(CaptionTokenizer(model.cfg.context_length)(CAPTIONS[:1])))
