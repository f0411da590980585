"""The noise process: which masking rate each caption of a training batch gets, and what follows from it.

Each row of the objective table (:data:`mdc_core.registry.OBJECTIVES`) names one schedule object (MDLM's
``noise_schedule.py`` is the model), and every caller asks it instead of switching on the objective: the draw of
the time ``t`` (:meth:`NoiseSchedule.draw`), the probability that a caption token is masked at that time
(:meth:`~NoiseSchedule.mask_rate`), the weight of a caption's loss (:meth:`~NoiseSchedule.weight`), the expected
number of loss terms (:meth:`~NoiseSchedule.expected_loss_terms`) and the masking ratios a run was trained on
(:meth:`~NoiseSchedule.scoring_ratios`).

Convention (docs/design.md "Decisions", the noise schedule). At time ``t`` in [0, 1] each maskable caption token is kept
with probability ``alpha_t`` and masked with probability ``1 - alpha_t``; ``alpha_0 = 1`` (clean), ``alpha_1 = 0``
(all masked). The NELBO of masked diffusion (MDLM Eq. 10, the paper's Eq. 5) weights the masked tokens'
cross-entropy at time ``t`` by ``w(t) = -alpha'_t / (1 - alpha_t)``:

* linear (the paper's): ``alpha_t = 1 - t``, tokens masked with probability ``t``, ``w(t) = 1 / t``.
* cosine (MDLM's ``CosineNoise`` with eps = 0; MaskGIT's mask ratio ``cos(pi r / 2)`` read with ``r = 1 - t``
  would be another schedule): ``alpha_t = cos(pi t / 2)``, masked with probability
  ``1 - cos(pi t / 2) = 2 sin^2(pi t / 4)``, and ``alpha'_t = -(pi / 2) sin(pi t / 2)``, so
  ``w(t) = (pi / 2) sin(pi t / 2) / (1 - cos(pi t / 2)) = (pi / 2) / tan(pi t / 4)`` (half-angle:
  ``sin x / (1 - cos x) = 1 / tan(x / 2)``); near 0 it is about ``2 / t``, twice the linear weight, because the
  cosine masks about ``pi^2 t^2 / 8`` of the tokens where the linear schedule masks ``t``.

``t`` is drawn uniformly from ``[objective.t_low, objective.t_high]`` (the paper's ``[w_l, w_u]``), i.i.d. or
stratified (``objective.antithetic_t``), and clamped at :data:`T_MIN` so that every weight stays finite. Over the
whole range [0, 1] every schedule's NELBO is the same number (substitute ``u = 1 - alpha_t``: ``int w(t) f(1 -
alpha_t) dt = int f(u) / u du``), which is why likelihood scoring (:mod:`mdc_core.scoring`, Eq. 8) needs no
schedule; on a narrower range the schedules differ in which masking rates training sees, which is what the
paper's Table 5 and notebook 02 vary.

The rows without a time are schedules too: :class:`FixedRatio` (BERT: every caption masked at
``objective.mask_ratio``), :class:`AllMasked` (parallel decoding) and :class:`TeacherForcing` (ARC: nothing
masked, every next token a target). CLIP's row has no schedule (None): it predicts no caption tokens.

This module imports no torch at the top (the objective table imports it, and the command line reads the table
without torch); the methods take and return tensors, and the float ones (expected terms, ratios) plain numbers.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch

T_MIN = 1e-3  # t is clamped here so that every weight stays finite for a range starting at 0 (MDLM's eps=1e-3)


def sample_t(batch: int, low: float, high: float, *, antithetic: bool = False,
             generator: torch.Generator | None = None, device: torch.device | str = "cpu") -> torch.Tensor:
    """(B,) times in [low, high): i.i.d. uniform, or stratified one per 1/B-bin (MDLM's low-discrepancy
    sampler: u_b = (b + U) / B), which keeps the marginal uniform and lowers the batch loss variance."""
    import torch  # on first draw: the objective table imports this module without torch (module docstring)

    u = torch.rand(batch, generator=generator, device=device)
    if antithetic:
        u = (torch.arange(batch, device=device) + u) / batch
        u = u[torch.randperm(batch, generator=generator, device=device)]  # no order correlation with data
    return low + (high - low) * u


def _full(batch: int, value: float, device: torch.device | str) -> torch.Tensor:
    """(B,) tensor of `value` (the same time for every caption)."""
    import torch  # as in sample_t

    return torch.full((batch,), value, device=device)


def _sin(x: Any) -> Any:
    return math.sin(x) if isinstance(x, (int, float)) else x.sin()


def _tan(x: Any) -> Any:
    return math.tan(x) if isinstance(x, (int, float)) else x.tan()


class NoiseSchedule(ABC):
    """What a training objective's noise process decides; each method is one question callers ask.

    `cfg` is the run's :class:`~mdc_core.config.ObjectiveConfig` (``t_low``, ``t_high``, ``antithetic_t``,
    ``mask_ratio``); `t` a (B,) tensor of the times :meth:`draw` returned (or a float)."""

    masks: ClassVar[bool] = True  # tokens are masked and predicted (False: teacher forcing, nothing is masked)

    @abstractmethod
    def draw(self, cfg: Any, batch: int, generator: torch.Generator | None = None,
             device: torch.device | str = "cpu") -> torch.Tensor:
        """(B,) time of each caption's noise (drawn from `generator`, on `device`)."""

    def mask_rate(self, t: Any) -> Any:
        """Probability ``1 - alpha_t`` that each maskable token is masked at time `t` (here: t itself)."""
        return t

    def weight(self, t: Any) -> Any:
        """The factor of each caption's masked-token loss: 1 unless the schedule is a weighted time schedule."""
        return 1.0 if isinstance(t, (int, float)) else t.new_ones(t.shape)

    @abstractmethod
    def expected_rate(self, cfg: Any) -> float:
        """The expected masking rate over the draws of `cfg`."""

    def expected_loss_terms(self, lengths: Sequence[int], cfg: Any) -> float:
        """Expected loss-carrying tokens of captions of `lengths` caption tokens (no ``<sot>``/``<eot>``)."""
        return self.expected_rate(cfg) * float(sum(lengths))

    @abstractmethod
    def scoring_ratios(self, cfg: Any) -> tuple[float, ...]:
        """Masking ratios inside the range a run of objective settings `cfg` was trained on (ratio 0 left out)."""

    def label_suffix(self, cfg: Any) -> str:
        """What a table adds after the objective's label to tell its runs apart ("" for most)."""
        return ""


@dataclass(frozen=True)
class TimeSchedule(NoiseSchedule):
    """A continuous-time schedule: t ~ U[t_low, t_high], masking rate ``1 - alpha_t``, weight
    ``-alpha'_t / (1 - alpha_t)`` when `weighted` (the NELBO's), else 1. Subclasses give ``alpha_t`` through
    :meth:`mask_rate`, the weight through :meth:`elbo_weight` and the rate's antiderivative
    :meth:`rate_integral` (for the expected rate)."""

    weighted: bool = True  # multiply each caption's loss by the NELBO weight (False: MDC without 1/t)

    def draw(self, cfg: Any, batch: int, generator: torch.Generator | None = None,
             device: torch.device | str = "cpu") -> torch.Tensor:
        t = sample_t(batch, cfg.t_low, cfg.t_high, antithetic=cfg.antithetic_t, generator=generator, device=device)
        return t.clamp(min=T_MIN)

    @abstractmethod
    def elbo_weight(self, t: Any) -> Any:
        """``-alpha'_t / (1 - alpha_t)``."""

    @abstractmethod
    def rate_integral(self, t: float) -> float:
        """An antiderivative of :meth:`mask_rate` at `t`."""

    def weight(self, t: Any) -> Any:
        return self.elbo_weight(t) if self.weighted else super().weight(t)

    def expected_rate(self, cfg: Any) -> float:
        """``1 / (t_high - t_low) * int_{t_low}^{t_high} (1 - alpha_t) dt`` (the clamp at T_MIN, which moves it by
        less than 1e-6, left out)."""
        return (self.rate_integral(cfg.t_high) - self.rate_integral(cfg.t_low)) / (cfg.t_high - cfg.t_low)

    def scoring_ratios(self, cfg: Any) -> tuple[float, ...]:
        """The masking rates at three evenly spaced times of [t_low, t_high]."""
        times = [cfg.t_low + k * (cfg.t_high - cfg.t_low) / 2 for k in range(3)]
        return tuple(round(float(self.mask_rate(t)), 4) for t in times if t > 0)


@dataclass(frozen=True)
class LinearSchedule(TimeSchedule):
    """The paper's: ``alpha_t = 1 - t``, tokens masked with probability t, weight 1/t (Eq. 5)."""

    def mask_rate(self, t: Any) -> Any:
        return t  # 1 - alpha_t, exactly the drawn t

    def elbo_weight(self, t: Any) -> Any:
        return 1.0 / t

    def rate_integral(self, t: float) -> float:
        return t * t / 2


@dataclass(frozen=True)
class CosineSchedule(TimeSchedule):
    """MDLM's cosine schedule: ``alpha_t = cos(pi t / 2)``, weight ``(pi / 2) / tan(pi t / 4)`` (module
    docstring). Both are written with ``pi t / 4`` (``1 - cos(2x) = 2 sin^2 x``), which keeps small rates exact."""

    def mask_rate(self, t: Any) -> Any:
        return 2 * _sin(math.pi / 4 * t) ** 2

    def elbo_weight(self, t: Any) -> Any:
        return (math.pi / 2) / _tan(math.pi / 4 * t)

    def rate_integral(self, t: float) -> float:
        return t - 2 / math.pi * math.sin(math.pi / 2 * t)


@dataclass(frozen=True)
class FixedRatio(NoiseSchedule):
    """Image-conditioned BERT: every caption masked with probability ``objective.mask_ratio``, no weight."""

    def draw(self, cfg: Any, batch: int, generator: torch.Generator | None = None,
             device: torch.device | str = "cpu") -> torch.Tensor:
        return _full(batch, cfg.mask_ratio, device)

    def expected_rate(self, cfg: Any) -> float:
        return float(cfg.mask_ratio)

    def scoring_ratios(self, cfg: Any) -> tuple[float, ...]:
        return (float(cfg.mask_ratio),)

    def label_suffix(self, cfg: Any) -> str:
        return f" r={cfg.mask_ratio:g}"


@dataclass(frozen=True)
class AllMasked(NoiseSchedule):
    """Parallel decoding (CapPa): every caption token masked (rate 1), no weight."""

    def draw(self, cfg: Any, batch: int, generator: torch.Generator | None = None,
             device: torch.device | str = "cpu") -> torch.Tensor:
        return _full(batch, 1.0, device)

    def expected_rate(self, cfg: Any) -> float:
        return 1.0

    def scoring_ratios(self, cfg: Any) -> tuple[float, ...]:
        return (1.0,)


@dataclass(frozen=True)
class TeacherForcing(NoiseSchedule):
    """Autoregressive captioning: nothing masked; token i + 1 predicted from tokens <= i, so every caption token
    and ``<eot>`` is a target. Its "time" is 1 for every caption (what the loss logs as ``t_mean``)."""

    masks: ClassVar[bool] = False

    def draw(self, cfg: Any, batch: int, generator: torch.Generator | None = None,
             device: torch.device | str = "cpu") -> torch.Tensor:
        return _full(batch, 1.0, device)

    def mask_rate(self, t: Any) -> Any:
        return t * 0

    def expected_rate(self, cfg: Any) -> float:
        return 0.0

    def expected_loss_terms(self, lengths: Sequence[int], cfg: Any) -> float:
        return float(sum(lengths)) + len(lengths)  # every caption token and <eot>

    def scoring_ratios(self, cfg: Any) -> tuple[float, ...]:
        return ()
