"""The checks of the table notebooks 02-05 (the noise schedule, linear probes, compositionality, captioning); see
:mod:`mdc_workbench.notebooks.exercises` for the four cells of an exercise.

Each check recomputes the right answer with ``mdc_core`` from the notebook's own objects (its trained model, its
probe table, its test images), so an answer is right for the run at hand, whatever a plan made of it.
"""


from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Any

from .registry import (  # noqa: F401
    NotAnswered,
    Verdict,
    call_answer,
    caption_text,
    choice,
    exercise,
    fit,
    is_close,
)

# --------------------------------------------------------------------------------------------------------------
# 02: the noise schedule and the 1/t weight


@exercise("02.no_t_spread")
def _no_t_spread(answer: dict[str, Any], *, model: Any, cfg: Any, images: Any, captions: list[str],
                 draws: int = 32) -> Verdict:
    """answer: {"std_with": float, "std_without": float, "larger": "with" | "without"}: the spread (standard
    deviation, ddof 1) of the batch loss over `draws` noise draws (wb.loss_draws, seed 0) at t ~ U[0.5, 1] with the
    1/t weight (objective ``mdc``) and without it (``mdc_no_t``, Table 4)."""
    import dataclasses

    from mdc_workbench.notebooks.notebook import loss_draws

    want = {}
    for key, name in (("std_with", "mdc"), ("std_without", "mdc_no_t")):
        objective = dataclasses.replace(cfg.objective, name=name, t_low=0.5, t_high=1.0)
        run = dataclasses.replace(cfg, objective=objective)
        want[key] = statistics.stdev(loss_draws(model, run, images, captions, draws=draws, seed=0))
    for key, value in want.items():
        if not is_close(answer[key], value, 1e-3, 1e-4):
            name = "mdc" if key == "std_with" else "mdc_no_t"
            return False, (f"{key} = {float(answer[key]):.4f}, expected {value:.4f}: the standard deviation (ddof=1) "
                           f"of wb.loss_draws(model, cfg with objective name {name} and t in [0.5, 1], images, "
                           f"captions, draws={draws}, seed=0)")
    right = "with" if want["std_with"] > want["std_without"] else "without"
    if str(answer["larger"]).strip().lower() != right:
        return False, f"the numbers are right, but they say the spread is larger {right} the 1/t weight"
    ratio = want["std_with"] / max(want["std_without"], 1e-12)
    return True, (f"{want['std_with']:.4f} with 1/t against {want['std_without']:.4f} without ({ratio:.2f}x). "
                  "Without the weight the batch loss follows the share t of words masked; with it (Eq. 5) it is a "
                  "loss per word, scaled up by at most 2 at [0.5, 1]: the two spreads are close there, which is why "
                  "Table 4's gap is small (at [0, 1] the weight reaches 1000)")


def no_mask_probability(w_low: float, w_high: float, length: int) -> float:
    """P(no token of a caption of `length` maskable tokens is masked) when t ~ U[w_low, w_high] and each token is
    masked with probability t (Alg. 1): the mean of (1 - t)^L over t, in closed form."""
    if w_high == w_low:
        return (1.0 - w_low) ** length
    return ((1.0 - w_low) ** (length + 1) - (1.0 - w_high) ** (length + 1)) / ((length + 1) * (w_high - w_low))


@exercise("02.no_mask_chance")
def _no_mask_chance(answer: Callable[..., Any], *,
                    cases: tuple[tuple[float, float, int], ...] = ((0.0, 1.0, 5), (0.5, 1.0, 5), (0.3, 0.8, 3),
                                                                   (0.0, 1.0, 12), (0.4, 0.4, 4))) -> Verdict:
    """`answer(w_low, w_high, L)` -> the probability that a caption of L maskable tokens has no token masked."""
    for lo, hi, n in cases:
        want = no_mask_probability(lo, hi, n)
        got = float(call_answer(answer, lo, hi, n))
        if not is_close(got, want, 1e-3, 1e-6):
            return False, (f"for t ~ U[{lo}, {hi}] and L = {n} your probability is {got:.5f}, the right one "
                           f"{want:.5f}: given t, all L tokens stay unmasked with probability (1 - t)^L; average that "
                           "over t")
    short = {s: no_mask_probability(*s) for s in ((0.0, 1.0, 5), (0.5, 1.0, 5))}
    return True, (f"a 5-word caption is left unmasked {short[(0.0, 1.0, 5)]:.1%} of the time at [0, 1] and "
                  f"{short[(0.5, 1.0, 5)]:.2%} at [0.5, 1]: at [0, 1] one short caption in six teaches nothing, and "
                  "those with a single masked word and a tiny t carry a weight 1/t in the hundreds: the noise the "
                  "paper removes by starting the schedule at 0.5")


# --------------------------------------------------------------------------------------------------------------
# 03: linear probes


def headroom_share(probes: dict[str, dict[str, float]], row: str, baseline: str, tasks: list[str]) -> float:
    """The mean over `tasks` of the share of its headroom that `row` closed over `baseline` (the untrained encoder),
    in %: ``100 * (top1[row] - top1[baseline]) / (100 - top1[baseline])`` per task. A task the baseline already
    decodes perfectly has no headroom: ValueError naming it."""
    full = [t for t in tasks if probes[baseline][t] >= 100.0]
    if full:
        raise ValueError(f"{baseline!r} already scores 100% on {', '.join(full)}: no headroom to share")
    return sum(100.0 * (probes[row][t] - probes[baseline][t]) / (100.0 - probes[baseline][t])
               for t in tasks) / len(tasks)


@exercise("03.headroom_share")
def _headroom_share(answer: Any, *, probes: dict[str, dict[str, float]], row: str, baseline: str,
                    mean_tasks: list[str]) -> Verdict:
    """answer: the mean over `mean_tasks` of the share (%) of each task's headroom above the `baseline` row (the
    untrained encoder) that `row` closed (:func:`headroom_share`). The table above prints the gain in points, not
    this share. Right within 0.05 of it (the solution prints it with one decimal), or of the share computed from
    the table's printed values (one decimal each, as ``wb.markdown_table`` shows them)."""
    want = headroom_share(probes, row, baseline, mean_tasks)
    printed = {r: {t: float(f"{probes[r][t]:.1f}") for t in mean_tasks} for r in (row, baseline)}
    from_table = headroom_share(printed, row, baseline, mean_tasks)
    got = float(answer)
    if any(abs(got - value) <= 0.05 + 1e-9 for value in (want, from_table)):
        gain = sum(probes[row][t] - probes[baseline][t] for t in mean_tasks) / len(mean_tasks)
        return True, (f"{row} closed {want:.1f}% of the headroom its untrained encoder left (a gain of {gain:+.1f} "
                      "points). The same points are worth more where the untrained encoder is already good: the "
                      "share says how far pretraining went towards a perfect probe, task by task")
    gain = sum(probes[row][t] - probes[baseline][t] for t in mean_tasks) / len(mean_tasks)
    room = sum(100.0 - probes[baseline][t] for t in mean_tasks) / len(mean_tasks)
    if is_close(got, gain, 1e-4, 0.01):
        return False, "that is the gain in points (the table's `gain`); divide each task's gain by its headroom first"
    if is_close(got, 100.0 * gain / room, 1e-4, 0.01):
        return False, ("that is the mean gain over the mean headroom; take the share task by task, then the mean "
                       "(a task with little headroom then counts as much as one with a lot)")
    return False, (f"got {got:.2f}, expected {want:.2f}: for each task in {mean_tasks}, 100 * (probes[{row!r}][task] "
                   f"- probes[{baseline!r}][task]) / (100 - probes[{baseline!r}][task]), then the mean")


RANDOM_ROW = {
    "a": "to show how much the probe's regularisation matters",
    "b": "because a random encoder is what the paper compares MDC with in Table 1",
    "c": "an untrained encoder's features already decode colour, count and position well above chance, so a raw "
         "top-1 mixes what pretraining learned with what the architecture gives for free",
    "d": "to check that the probe images were not seen in pretraining",
}


@exercise("03.random_row")
def _random_row(answer: Any) -> Verdict:
    return choice(answer, "c", RANDOM_ROW,
                   "random convolutions and patch embeddings keep colour and layout: a linear probe reads them off "
                   "without any training. The gain over that row (the chance-corrected score) is what each objective "
                   "taught the encoder, and the only number the verdicts compare")


# --------------------------------------------------------------------------------------------------------------
# 04: compositionality


@exercise("04.mc_elbo")
def _mc_elbo(answer: Callable[..., Any], *, model: Any, image_tokens: Any, captions: list[str],
             samples: int = 128, probe_samples: int = 256) -> Verdict:
    """`answer(model, image_tokens (1, M, D), tokens (1, L), samples)` -> a Monte Carlo estimate of Eq. 8's ELBO
    (a float). Right when it agrees with the ELBO computed exactly (every way of masking the caption,
    :func:`exact_elbo`) on three stand-in models (:class:`MaskCountModel`) and then on `captions` with `model`.
    The first stand-in gives every masked word the same log-probability c, so every draw of Eq. 8's estimator is
    exactly n c (l words, weight n / l): no Monte Carlo noise, and an estimator whose weights sum to anything else
    in expectation ((n + 1) / l, 0.9 n / l, 1 / l, ...) misses it by far more than rounding. The other two catch a
    wrong range of l, within 4 of the estimator's standard errors: l drawn from 1..n-1 (the all-masked term
    forgotten), t ~ U[0.5, 1] with weight 1/t (the training objective). On `captions`, within 4 standard errors."""
    from mdc_core.objectives import trim_padding
    from mdc_core.scoring import score_tokens
    from mdc_core.tokenizer import CaptionTokenizer

    tokenizer = CaptionTokenizer(model.cfg.context_length)
    for probe in MaskCountModel.probes(model, trim_padding(tokenizer(captions[:1]))):  # first: fast, and decisive
        want, spread = exact_elbo(probe, image_tokens, probe.tokens)
        got = float(call_answer(answer, probe, image_tokens, probe.tokens, probe_samples))
        noise = spread / math.sqrt(probe_samples)  # 0 (to rounding) on the constant stand-in
        if not math.isfinite(got) or abs(got - want) > 4.0 * noise + 1e-3 * max(1.0, abs(want)):
            exact = "exactly, every draw" if noise < 1e-6 else f"+-{noise:.3f} with {probe_samples} samples"
            return False, (f"on a stand-in model {probe.what}, a {probe.words}-word caption's ELBO is {want:.3f} "
                           f"({exact}); yours: {got:.3f}. " + _MC_RECIPE)
    shown = []
    for caption in captions:
        tokens = trim_padding(tokenizer([caption]))
        if tokens.shape[1] - 2 <= EXACT_WORDS:
            want, spread = exact_elbo(model, image_tokens, tokens)
            ref_stderr = 0.0
        else:  # too many masks to visit: a large Monte Carlo reference, and its own noise in the tolerance
            ref = score_tokens(model, image_tokens, tokens, "mc", samples=2048, seed=1)
            want, ref_stderr = float(ref.score[0]), float(ref.stderr[0])
            spread = statistics.stdev(mc_elbo_draws(model, image_tokens, tokens, 256, seed=2))
        got = float(call_answer(answer, model, image_tokens, tokens, samples))
        tolerance = 4.0 * math.sqrt(ref_stderr ** 2 + spread ** 2 / samples) + 1e-3
        if not math.isfinite(got) or abs(got - want) > tolerance:
            return False, (f"for {fit(repr(caption), 60)} your estimate is {got:.3f}, the ELBO {want:.3f} (+-"
                           f"{spread / math.sqrt(samples):.3f} with {samples} samples). " + _MC_RECIPE)
        shown.append(f"{got:.2f} vs {want:.2f}")
    return True, (f"your estimates equal the exact ELBO (every mask visited) within their noise "
                  f"({fit('; '.join(shown), 120)}), and on three stand-in models: exactly on one without noise, "
                  f"within the noise where a count l from 1..n-1 or t ~ U[0.5, 1] misses it. The ELBO took {samples} "
                  "decoder passes per caption; the heuristic score takes one per word")


EXACT_WORDS = 10  # captions up to this many words get their ELBO exactly (2^10 - 1 masks)
_MC_RECIPE = ("Per sample: l uniform in 1..n (l = n masks every word), mask l random words, add the true words' "
              "log-probabilities there, weight the sum by n / l; average over the samples")


def exact_elbo(model: Any, image_tokens: Any, tokens: Any, batch_size: int = 512) -> tuple[float, float]:
    """Eq. 8's ELBO of one caption tokens (1, L) (``<sot>`` n words ``<eot>``) by visiting all 2^n - 1 masks, and
    the standard deviation of one draw of its Monte Carlo estimator (l ~ U{1..n}, l random words masked, their
    log-probabilities weighted by n / l): ``(elbo, spread)``, exact both."""
    import itertools

    import torch

    from mdc_core.tokenizer import MASK_ID

    n = tokens.shape[1] - 2
    tokens = tokens.to(image_tokens.device)
    every = torch.tensor(list(itertools.product([False, True], repeat=n))[1:])  # (2^n - 1, n)
    masks = torch.zeros(len(every), tokens.shape[1], dtype=torch.bool, device=tokens.device)
    masks[:, 1:-1] = every
    rows = model.output_index[tokens[0]].clamp(min=0)  # (L,) head rows of the true tokens (<sot> has none)
    sums = []
    with torch.no_grad():
        for start in range(0, len(masks), batch_size):
            m = masks[start:start + batch_size]  # (R, L)
            x = tokens.expand(len(m), -1).masked_fill(m, MASK_ID)
            logp = model.decode(x, image_tokens.expand(len(m), -1, -1)).float().log_softmax(dim=-1)  # (R, L, V)
            sums.append((logp.gather(-1, rows.expand(len(m), -1)[..., None])[..., 0] * m).sum(dim=1))
    draw = torch.cat(sums).double() * n / masks.sum(dim=1)  # (2^n - 1,) one draw's value for each mask
    counts = masks.sum(dim=1)
    by_l = [draw[counts == count] for count in range(1, n + 1)]  # each mask of l words is equally likely
    mean = sum(v.mean() for v in by_l) / n
    second = sum((v ** 2).mean() for v in by_l) / n
    return float(mean), float((second - mean ** 2).clamp(min=0).sqrt())


class MaskCountModel:
    """A stand-in captioner for checking an ELBO estimator: the log-probability it gives the true word at a masked
    position depends only on how many of the caption's n words are masked, through `logp(l, n)`, so an estimator
    that draws the wrong numbers of masked words misses its ELBO by a known margin. It knows one caption,
    `tokens` (1, L); everything but ``decode`` (output_index, output_ids, cfg, ...) is the wrapped model's."""

    def __init__(self, model: Any, tokens: Any, logp: Callable[[int, int], float], what: str) -> None:
        self._model = model
        self.tokens = tokens
        self.words = tokens.shape[1] - 2
        self.what = what
        self._logp = logp

    @classmethod
    def probes(cls, model: Any, caption: Any, words: int = 4) -> list[MaskCountModel]:
        """The three stand-ins of the 04.mc_elbo check on a caption of `words` words cut from (or padded with the
        last word of) `caption` (1, L): one that gives every masked word probability 1/4 whatever is masked (every
        draw of Eq. 8's estimator is then exactly n log(1/4): a wrong weight shows without noise), one unsure only
        when every word is masked (the l = n term of Eq. 8), one unsure only when fewer than half are (mask ratios
        the training schedule t ~ U[0.5, 1] never draws)."""
        import torch

        body = caption[0, 1:-1]
        body = torch.cat([body, body[-1:].repeat(max(0, words - len(body)))])[:words]
        tokens = torch.cat([caption[0, :1], body, caption[0, -1:]])[None]
        sure, unsure = math.log(0.99), -3.0
        return [cls(model, tokens, lambda count, n: math.log(0.25), "that gives every masked word probability 1/4"),
                cls(model, tokens, lambda count, n: unsure if count == n else sure,
                    "that knows every word unless all of them are masked"),
                cls(model, tokens, lambda count, n: unsure if count < n / 2 else sure,
                    "that knows every word only when at least half of them are masked")]

    def decode(self, tokens: Any, image_tokens: Any = None, *, select: Any = None, **_: Any) -> Any:
        """tokens (B, L) -> logits (B, L, V_out): zero everywhere but at each position's true row of `self.tokens`,
        set so that the true word's log-probability is ``logp(masked words of the row, n)``; with `select` (B, L)
        bool, only those positions (K, V_out), as :meth:`Captioner.decode` does."""
        import torch

        from mdc_core.tokenizer import MASK_ID

        if tokens.shape[1] != self.tokens.shape[1]:
            raise ValueError(f"this stand-in model knows one caption of {self.words} words; got {tokens.shape[1]} "
                             "positions")
        counts = (tokens[:, 1:-1] == MASK_ID).sum(dim=1).tolist()  # (B,) masked words per row
        target = torch.tensor([self._logp(c, self.words) for c in counts], device=tokens.device)  # (B,)
        others = len(self._model.output_ids) - 1
        logit = target + math.log(others) - torch.log1p(-target.exp())  # log p = logit - log(e^logit + others)
        logits = torch.zeros(*tokens.shape, others + 1, device=tokens.device)  # (B, L, V_out)
        index = self._model.output_index  # token id -> head row
        rows = index[self.tokens[0].to(index.device)].clamp(min=0).to(tokens.device)
        logits[:, torch.arange(tokens.shape[1], device=tokens.device), rows] = logit[:, None]  # rows: (L,)
        return logits if select is None else logits[select]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def mc_elbo_draws(model: Any, image_tokens: Any, tokens: Any, samples: int, seed: int = 0) -> list[float]:
    """`samples` single-draw estimates of Eq. 8's ELBO of one caption tokens (1, L) (``<sot>`` words ``<eot>``):
    each masks l ~ U{1..n} random words and weights the masked words' true log-probabilities by n / l."""
    import torch

    from mdc_core.tokenizer import MASK_ID

    gen = torch.Generator().manual_seed(seed)
    n = tokens.shape[1] - 2
    x = tokens.repeat(samples, 1)  # (S, L): one masked copy of the caption per draw
    weights = torch.empty(samples)
    for s in range(samples):
        count = int(torch.randint(1, n + 1, (), generator=gen))
        x[s, 1 + torch.randperm(n, generator=gen)[:count]] = MASK_ID  # the masked caption positions
        weights[s] = n / count
    with torch.no_grad():
        logp = model.decode(x, image_tokens.expand(samples, -1, -1))[:, 1:-1].float().log_softmax(dim=-1)
    rows = model.output_index[tokens[0, 1:-1]].expand(samples, -1)  # (S, n) head rows of the true words
    masked = (x[:, 1:-1] == MASK_ID).float()
    return ((logp.gather(-1, rows[..., None])[..., 0] * masked).sum(dim=1) * weights).tolist()


BLIND = {
    "a": "the models were trained on these negatives",
    "b": "the image is not needed there: a negative of that kind is a word order or a caption no training caption "
         "resembles, and the language model alone gives it a low likelihood",
    "c": "the mean image still shows the objects faintly",
    "d": "the scorers are exact on short captions",
}


@exercise("04.blind")
def _blind(answer: Any) -> Verdict:
    return choice(answer, "b", BLIND,
                   "a blind scorer that passes a column shows the column measures grammar, not grounding: the "
                   "shuffled word orders are text no caption ever had. Only the margin above the blind row counts, "
                   "which is why Table 2's verdicts here compare only the columns a blind scorer fails")


# --------------------------------------------------------------------------------------------------------------
# 05: captioning


def greedy_with_rule(rule: Callable[..., Any], model: Any, image_tokens: Any, length: int) -> Any:
    """Caption one image (image_tokens (1, M, D)) by revealing, step by step, the (position, head row) `rule`
    returns for the current probabilities (N', V_out) (zero at rows the canvas may not hold) and masked (N',)
    bool. Returns the caption's token ids (N',) and the positions in the order revealed."""
    import torch

    from mdc_core.sampler import allowed_rows, canvas
    from mdc_core.tokenizer import MASK_ID

    allowed = allowed_rows(model)
    x = canvas(1, length, image_tokens.device)
    order = []
    with torch.no_grad():
        for _ in range(length):
            masked = x[0, 1:-1] == MASK_ID
            logits = model.decode(x, image_tokens)[0, 1:-1].float()  # (N', V_out)
            probs = logits.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
            position, row = (int(v) for v in call_answer(rule, probs, masked.clone()))
            if not bool(masked[position]):
                raise ValueError(f"position {position} is revealed already; reveal a masked one")
            x[0, 1 + position] = model.output_ids[row]
            order.append(position)
    return x[0, 1:-1], order


@exercise("05.confidence_rule")
def _confidence_rule(answer: Callable[..., Any], *, model: Any, image_tokens: Any, length: int) -> Verdict:
    """`answer(probs (N', V_out), masked (N',) bool)` -> (position, head row) to reveal: Eq. 6's rule."""
    import torch

    from mdc_core.config import SamplerConfig
    from mdc_core.sampler import sample

    for i in range(image_tokens.shape[0]):
        core = sample(model, image_tokens[i:i + 1], SamplerConfig(length=length))
        want, want_order = core.tokens[0], core.reveal_step[0].argsort().tolist()
        got, order = greedy_with_rule(answer, model, image_tokens[i:i + 1], length)
        if not torch.equal(got.cpu(), want.cpu()) or order != want_order:
            return False, (f"image {i}: your rule writes {fit(caption_text(model, got), 80)} revealing positions "
                           f"{fit(str(order), 40)}, Eq. 6 writes {fit(caption_text(model, want), 80)} in the order "
                           f"{fit(str(want_order), 40)}: take the masked position whose largest probability is "
                           "largest, and reveal its most probable row there")
    return True, (f"your rule writes the same {image_tokens.shape[0]} captions as mdc_core.sampler.sample, in the "
                  "same order: Eq. 6 is "
                  "an argmax over positions of an argmax over words")


@exercise("05.length_repetition")
def _length_repetition(answer: dict[str, Any], *, model: Any, image_tokens: Any, lengths: tuple[int, int]) -> Verdict:
    """answer: {"rate": function N' -> the repetition rate (``repetition_rate``) of the greedy captions of
    `image_tokens` at that N', "higher": "short" | "long"} (which of N' = lengths[0], lengths[1] repeats more).
    The function is checked at both lengths and at their neighbours (N' - 2 .. N' + 2): with a few images a rate
    moves in steps of 1 / images, so one length alone cannot tell N' from N' + 2."""
    short, long = lengths
    tried = sorted({n for n in (*range(short - 2, short + 3), *range(long - 2, long + 3)) if n >= 1})
    want = {n: length_repetition(model, image_tokens, n) for n in tried}
    for n in tried:
        got = float(call_answer(answer["rate"], n))
        if not is_close(got, want[n], 1e-6, 1e-6):
            return False, (f"at N' = {n} your rate is {got:.3f}, expected {want[n]:.3f}: repetition_rate of the "
                           f"decoded captions of sample(model, image_tokens, SamplerConfig(length={n}))")
    right = "long" if want[long] > want[short] else "short" if want[short] > want[long] else "neither"
    if str(answer["higher"]).strip().lower() != right:
        return False, (f"the rates are right ({want[short]:.0%} at N' = {short}, {want[long]:.0%} at N' = {long}), "
                       f"but they say the repetition is higher at the {right} length" if right != "neither" else
                       f"the rates are right, and equal at both lengths ({want[short]:.0%}): answer \"neither\"")
    if right == "long":
        why = ("MDC fills all N' slots; when the scene needs fewer words, the spare slots, decided in much the same "
               "context, take the same confident words again")
    else:
        why = "on these images the spare slots found words of their own (try more images, or a longer N')"
    return True, (f"{want[short]:.0%} at N' = {short}, {want[long]:.0%} at N' = {long}. {why}. ARC stops when it is "
                  "done: Table 3's matched row gives MDC ARC's own length per image")


def length_repetition(model: Any, image_tokens: Any, length: int) -> float:
    """Repetition rate of the greedy captions of image_tokens (B, M, D) at N' = `length`."""
    import torch

    from mdc_core.config import SamplerConfig
    from mdc_core.sampler import sample
    from mdc_core.tokenizer import CaptionTokenizer
    from mdc_workbench.eval.repetition import repetition_rate

    tokenizer = CaptionTokenizer(model.cfg.context_length)
    with torch.no_grad():
        out = sample(model, image_tokens, SamplerConfig(length=length))
    return float(repetition_rate(tokenizer.decode(row) for row in out.tokens))
