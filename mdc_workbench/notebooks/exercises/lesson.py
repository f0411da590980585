"""The checks of the lesson and the pretraining and MC-Diffusion notebooks (00, 01, 06); see
:mod:`mdc_workbench.notebooks.exercises` for the four cells of an exercise."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .registry import (  # noqa: F401
    MESSAGE_LIMIT,
    NotAnswered,
    Verdict,
    call_answer,
    caption_text,
    choice,
    exercise,
    fit,
    is_close,
)


@exercise("00.heuristic_score")
def _heuristic_score(answer: Callable[..., Any], *, model: Any, image_tokens: Any, captions: list[str]) -> Verdict:
    """`answer(model, image_tokens (1, M, D), tokens (1, L))` -> the heuristic score (a float) of one caption."""
    from mdc_core.objectives import trim_padding
    from mdc_core.scoring import score_tokens
    from mdc_core.tokenizer import CaptionTokenizer

    tokenizer = CaptionTokenizer(model.cfg.context_length)
    for caption in captions:
        tokens = trim_padding(tokenizer([caption]))  # (1, L): <sot> words <eot>, no padding
        want = float(score_tokens(model, image_tokens, tokens, "heuristic").score[0])
        got = float(call_answer(answer, model, image_tokens, tokens))
        if not is_close(got, want, 1e-4, 1e-3):
            return False, (f"for {caption!r} your score is {got:.4f}, the heuristic gives {want:.4f}. Start from "
                           "every caption token masked; at each step reveal the masked position whose top "
                           "probability (over the tokens the canvas may hold) is highest, add log p of the true "
                           "token there, then put the true token in")
    return True, f"your scores equal mdc_core.scoring's heuristic on all {len(captions)} captions"


class PassCounter:
    """`model` as an attempt sees it, counting its decoder passes (calls of ``decode`` or of the model itself): a
    check can then tell k reveals per step from one, whatever the captions happen to be."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self.passes = 0

    def decode(self, *args: Any, **kwargs: Any) -> Any:
        self.passes += 1
        return self._model.decode(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.passes += 1
        return self._model(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # everything else (cfg, output_ids, parameters, ...) as the model's
        return getattr(self._model, name)


@exercise("00.parallel_unmasking")
def _parallel_unmasking(answer: Callable[..., Any], *, model: Any, image_tokens: Any, length: int = 10,
                        ks: tuple[int, ...] = (2, 3)) -> Verdict:
    """`answer(model, image_tokens (1, M, D), length, k)` -> the caption's token ids (length,), k reveals a step.
    Right when, for every k of `ks` and every image of `image_tokens` (B, M, D), the ids equal the sampler's with
    ``tokens_per_step = k`` and the attempt made ceil(length / k) decoder passes (one a step): the captions alone
    cannot tell a k-per-step loop from a one-per-step one on an image where both orders give the same words."""
    import torch

    from mdc_core.config import SamplerConfig
    from mdc_core.sampler import sample

    for k in ks:
        steps = math.ceil(length / k)
        for i in range(image_tokens.shape[0]):
            image = image_tokens[i:i + 1]
            want = sample(model, image, SamplerConfig(length=length, tokens_per_step=k)).tokens[0]
            counted = PassCounter(model)
            got = torch.as_tensor(call_answer(answer, counted, image, length, k)).flatten().cpu()
            if got.shape != want.shape or not torch.equal(got, want.cpu()):
                return False, (f"with k = {k} your caption {fit(caption_text(model, got), 90)} differs from the "
                               f"sampler's {fit(caption_text(model, want), 90)}: each step reveals the k masked "
                               "positions with the highest confidence (fewer when fewer are left), each with its "
                               "argmax token")
            if counted.passes != steps:
                return False, (f"with k = {k} your loop made {counted.passes} decoder passes for {length} words; "
                               f"k reveals a step take ceil({length} / {k}) = {steps} (one pass a step: reveal the "
                               "k most confident masked positions from the same pass)")
    done = ", ".join(f"k = {k}: {math.ceil(length / k)} passes" for k in ks)
    return True, (f"the same captions as mdc_core.sampler.sample with tokens_per_step = k on "
                  f"{image_tokens.shape[0]} image(s), in {done} instead of {length}")


ARC_SIGNAL = {
    "a": "later words of a caption are rarer, so the loss there is noisier",
    "b": "the causal decoder sees the words before each token, so later tokens are more and more predictable from "
         "the caption prefix alone and their loss needs the image less",
    "c": "the image encoder is trained less on the last tokens because of the 1/t weight",
    "d": "cross-attention is applied only to the first tokens of the caption",
}


def central_claim_status() -> str:
    """The central claim's verdict in one sentence, from docs/central_claim.json (the one results file every text
    about it cites; mdc_workbench.runs.central_story); its other verdicts are in the file and section 9."""
    from mdc_workbench.runs.central_story import CLAIM_KEYS, RESULTS, load_results, verdict_lines

    try:
        results = load_results(RESULTS)
    except FileNotFoundError:  # an installed package without the checkout's docs/
        return "see docs/central_claim.json in the workbench's checkout"
    claims = results.get("claims", {})  # the central claim alone; the others and the observations: the file, 03
    results = {**results, "claims": {k: claims[k] for k in CLAIM_KEYS[:1] if k in claims}}
    lines = [line.removeprefix("- ").replace("**", "").replace("`", "") for line in verdict_lines(results)]
    return " ".join(lines) + " (the others: docs/central_claim.json)"


ARC_SIGNAL_WHY = ("the paper's argument (Sec. 1): teacher forcing shows token i the true words before it, which late "
                  "in a caption leave little to guess, so little gradient reaches the image there; MDC masks a "
                  "random share of every caption. Measured here: ")


@exercise("00.arc_signal")
def _arc_signal(answer: Any) -> Verdict:
    return choice(answer, "b", ARC_SIGNAL,
                  ARC_SIGNAL_WHY + fit(central_claim_status(), MESSAGE_LIMIT - len(ARC_SIGNAL_WHY)),
                  hint="think again about what the decoder can see")


# --------------------------------------------------------------------------------------------------------------
# 01: pretraining


@exercise("01.schedule_variance")
def _schedule_variance(answer: dict[str, Any], *, model: Any, cfg: Any, images: Any, captions: list[str],
                       draws: int = 32) -> Verdict:
    """answer: {"std_0_1": float, "std_05_1": float, "variance": "larger" | "smaller"}: the [0, 1] schedule's loss
    spread (standard deviation, ddof 0 or 1) over `draws` noise draws of one batch (wb.loss_draws, seed 0) against
    the [0.5, 1] schedule's. Notebook 01 passes its untrained model, on which the gap is robust (its loss per word
    is about log V at every t); a trained model's loss at small t is near zero and the two spreads come close."""
    import dataclasses

    import numpy as np

    from mdc_workbench.notebooks.notebook import loss_draws

    want = {}
    for key, low in (("std_0_1", 0.0), ("std_05_1", 0.5)):
        run = dataclasses.replace(cfg, objective=dataclasses.replace(cfg.objective, t_low=low, t_high=1.0))
        losses = loss_draws(model, run, images, captions, draws=draws, seed=0)
        want[key] = {ddof: float(np.std(losses, ddof=ddof)) for ddof in (1, 0)}
    ddofs = [d for d in (1, 0) if all(is_close(answer[k], want[k][d], 1e-3, 1e-4) for k in want)]
    if not ddofs:
        key = next(k for k in want if not any(is_close(answer[k], v, 1e-3, 1e-4) for v in want[k].values()))
        return False, (f"{key} = {float(answer[key]):.4f}, expected {want[key][1]:.4f} (ddof 1; {want[key][0]:.4f} "
                       f"with ddof 0): the standard deviation of wb.loss_draws(model, cfg with objective.t_low set, "
                       f"images, captions, draws={draws}, seed=0)")
    wide, narrow = want["std_0_1"][ddofs[0]], want["std_05_1"][ddofs[0]]
    right = "larger" if wide > narrow else "smaller"
    if str(answer["variance"]).strip().lower() != right:
        return False, f"the numbers are right, but they say the [0, 1] spread is {right}"
    if right == "larger":
        return True, (f"{wide:.3f} against {narrow:.3f}: with t near 0 a caption has almost no masked word and its "
                      "weight 1/t is huge, so single captions dominate the batch loss; [0.5, 1] caps the weight at 2 "
                      "(the paper's default; Table 5)")
    return True, (f"{wide:.3f} against {narrow:.3f}: on this model and batch the [0, 1] spread is the smaller one. "
                  "The captions drawn near t = 0 carry a large weight 1/t, but a weight multiplies the loss of the "
                  "few masked words: a model that fills a lone masked word from its neighbours has little loss there "
                  "to multiply")


@exercise("01.fully_masked_accuracy")
def _fully_masked_accuracy(answer: dict[str, Any], *, model: Any, cfg: Any, images: Any, captions: list[str],
                           draws: int = 8) -> Verdict:
    """answer: {"acc_t1": float, "acc_t05": float, "higher": "t=1" | "t=0.5"}: masked-token accuracy of the model
    on one batch with every caption token masked (t = 1) and with half of them (t = 0.5), mean over draws."""
    want = masked_accuracy(model, cfg, images, captions, 1.0, draws), \
        masked_accuracy(model, cfg, images, captions, 0.5, draws)
    for key, value in zip(("acc_t1", "acc_t05"), want, strict=True):
        if abs(float(answer[key]) - value) > 0.05:
            return False, (f"{key} = {float(answer[key]):.3f}, expected about {value:.3f}: the acc_masked metric of "
                           "mdc_core.objectives.compute_loss with objective.t_low = t_high = t, averaged over draws")
    right = "t=1" if want[0] > want[1] else "t=0.5"
    if str(answer["higher"]).replace(" ", "").lower() != right:
        return False, f"the numbers are right, but they say the accuracy is higher at {right}"
    return True, (f"{want[0]:.3f} with every word masked against {want[1]:.3f} with half: with context the decoder "
                  "fills words from the caption's other words; alone it must read everything from the image, which "
                  "is the hardest and most visual part of the task")


def masked_accuracy(model: Any, cfg: Any, images: Any, captions: list[str], t: float, draws: int = 8) -> float:
    """Mean masked-token accuracy of `model` on one batch with each caption token masked with probability `t`."""
    import dataclasses

    import torch

    from mdc_core.objectives import compute_loss
    from mdc_core.tokenizer import CaptionTokenizer

    objective = dataclasses.replace(cfg.objective, name="mdc", t_low=t, t_high=t)
    tokens, _ = CaptionTokenizer(cfg.model.context_length).tokenize_batch(captions)
    device = next(model.parameters()).device
    values = []
    with torch.no_grad():
        for d in range(draws):
            gen = torch.Generator(device=device).manual_seed(d)
            out = compute_loss(model, images.to(device), tokens.to(device), objective, gen)
            values.append(float(out.metrics["acc_masked"]))
    return sum(values) / len(values)


FIRST_KINDS = ("colour", "shape", "other")


def word_kind(word: str) -> str:
    """"colour" for a word of ``mdc_workbench.data.COLOURS``, "shape" for one of ``SHAPES`` or its plural ("circles",
    "crosses"), "other" for anything else (a BPE piece of a longer word included)."""
    from mdc_workbench.data import COLOURS, SHAPES

    plurals = {s + ("es" if s.endswith(("s", "x")) else "s") for s in SHAPES}
    return "colour" if word in COLOURS else "shape" if word in SHAPES or word in plurals else "other"


def first_revealed_kinds(model: Any, images: Any, length: int) -> dict[str, float]:
    """Share of captions (greedy, N' = `length`) whose first revealed word is a colour, a shape, or anything else."""
    import torch

    from mdc_core.config import SamplerConfig
    from mdc_core.sampler import sample
    from mdc_core.tokenizer import CaptionTokenizer

    tokenizer = CaptionTokenizer(model.cfg.context_length)
    device = next(model.parameters()).device
    with torch.no_grad():
        out = sample(model, model.encode_image(images.to(device)), SamplerConfig(length=length))
    counts = dict.fromkeys(FIRST_KINDS, 0)
    for row, steps in zip(out.tokens, out.reveal_step, strict=True):
        word = tokenizer.token_string(int(row[int(steps.argmin())])).strip()
        counts[word_kind(word)] += 1
    return {k: v / len(out.tokens) for k, v in counts.items()}


@exercise("01.first_revealed")
def _first_revealed(answer: dict[str, Any], *, model: Any, images: Any, length: int = 10) -> Verdict:
    """answer: {"colour": share, "shape": share, "other": share, "most": kind}: which kind of word Eq. 6 reveals
    first, over the greedy captions of `images`."""
    want = first_revealed_kinds(model, images, length)
    for kind in FIRST_KINDS:
        if abs(float(answer[kind]) - want[kind]) > 1e-6:
            return False, (f"share of {kind} = {float(answer[kind]):.3f}, expected {want[kind]:.3f}: the first "
                           "revealed position of a caption is where reveal_step is 0")
    most = max(want, key=want.get)
    if str(answer["most"]).strip().lower() != most:
        return False, f"the shares are right, but the largest one is {most!r}"
    return True, (f"{most} words first in {want[most]:.0%} of the captions: the sampler commits first to what it is "
                  "surest of; " + ("the caption's template words, which any image shares, so the words that need "
                                   "the image are decided last, with the most context" if most == "other" else
                                   "here the image makes that word the surest, before the template around it"))


# --------------------------------------------------------------------------------------------------------------
# 06: MC-Diffusion


@exercise("06.cfg_formula")
def _cfg_formula(answer: Callable[..., Any], *, scales: tuple[float, ...] = (1.0, 2.0, 3.5)) -> Verdict:
    """`answer(cond_logits, null_logits, w)` -> CFG's guided log-probabilities (Def. 1)."""
    import torch

    from mdc_workbench.masked_conditional.guidance import guided_log_probs

    gen = torch.Generator().manual_seed(0)
    cond, null = torch.randn(4, 7, generator=gen), torch.randn(4, 7, generator=gen)
    for w in scales:
        want = guided_log_probs(cond, null, "cfg", w)
        got = torch.as_tensor(call_answer(answer, cond, null, w)).float()
        if got.shape != want.shape or not torch.allclose(got, want, atol=1e-5):
            return False, (f"at w = {w} your values differ from (1 - w) log p(x | null) + w log p(x | y) "
                           "(log_softmax of each model's logits first)")
    return True, "equal to mdc_workbench.masked_conditional.guidance.guided_log_probs(..., 'cfg', w) at every w tried"


CFG_W1 = {"a": "the unconditional model p(x | null)", "b": "the conditional model p(x | y)",
          "c": "the average of the two models", "d": "a model that ignores the caption's other words"}


@exercise("06.cfg_w1")
def _cfg_w1(answer: Any) -> Verdict:
    return choice(answer, "b", CFG_W1, "at w = 1 the weight of log p(x | null) is 1 - w = 0: plain conditional "
                                       "sampling; w > 1 extrapolates away from the unconditional model",
                  hint="put w = 1 into (1 - w) log p(x | null) + w log p(x | y): what weight is left on each model?")


@exercise("06.cfg_is_mcs")
def _cfg_is_mcs(answer: Any) -> Verdict:
    p = float(answer)
    if not 0.0 <= p <= 1.0:
        return False, (f"p_mask = {p:g} is not a probability: give it between 0 and 1 (100% is 1.0)")
    if is_close(p, 1.0, 0, 1e-9):
        return True, ("masking every image token with the [MASK] image token is dropping the whole condition: CFG is "
                      "MCS with p_mask = 1, so the two strategies differ only in how much of the image they hide")
    return False, (f"with p_mask = {p:g} some image tokens stay visible; CFG replaces the whole condition by the null "
                   "token (here the same token as MCS's [MASK])")


