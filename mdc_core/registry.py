"""The tables the core chooses variants from: the objective table, the noise processes its rows name, and the
plug-in point extensions fill when they are imported.

**The objective table** (:data:`OBJECTIVES`): the core's rows (MDC, its baselines, ARC and CLIP), each an
:class:`ObjectiveSpec` that says everything callers ask about an objective; its loss is its family's
(:data:`mdc_core.objectives.LOSSES`) unless it brings its own function.

**The noise process** (:class:`NoiseSchedule`; MDLM's ``noise_schedule.py`` is the model). Each row names one
schedule object, which every caller asks: the time ``t`` (uniform on ``[objective.t_low, objective.t_high]``, i.i.d.
or stratified by ``objective.antithetic_t``, clamped at :data:`T_MIN`), the probability ``1 - alpha_t`` that a
caption token is masked, the loss weight ``w(t) = -alpha'_t / (1 - alpha_t)`` (``1 / t`` for the paper's linear
``alpha_t = 1 - t``, ``(pi / 2) / tan(pi t / 4)`` for MDLM's cosine ``alpha_t = cos(pi t / 2)``), the expected loss
terms and the masking ratios a run was trained on. The derivations, and why likelihood scoring (Eq. 8) needs no
schedule: docs/design.md, "The noise schedule". :class:`FixedRatio` (BERT), :class:`AllMasked` (parallel decoding)
and :class:`TeacherForcing` (ARC) have no time; CLIP's row has no schedule.

**The plug-in point** (docs/design.md "Core and workbench"). The core never names an extension. An extension
registers its variants (an objective, an image encoder, configuration keys, a transform of the image condition
during training) when its module is imported, and names that module under :data:`ENTRY_POINT_GROUP`; the core
imports them (:func:`load_plugins`) only when it meets a name it does not know. A plug-in module stays light (no
torch at import): the functions it registers import their own modules when called.

This module imports no torch at the top, so the command line builds its choices from it.
"""

from __future__ import annotations

import importlib
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch

T_MIN = 1e-3  # t is clamped here so that every weight stays finite for a range starting at 0 (MDLM's eps=1e-3)


def sample_t(batch: int, low: float, high: float, *, antithetic: bool = False,
             generator: torch.Generator | None = None, device: torch.device | str = "cpu") -> torch.Tensor:
    """(B,) times in [low, high): i.i.d. uniform, or stratified one per 1/B-bin (MDLM's low-discrepancy
    sampler: u_b = (b + U) / B), which keeps the marginal uniform and lowers the batch loss variance."""
    import torch  # on first draw: the command line reads this module without torch

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
    """The paper's: ``alpha_t = 1 - t``, tokens masked with probability t (the base class's rate), weight 1/t
    (Eq. 5)."""

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


# -- the objective table and the plug-in point ------------------------------------------------------------------

ENTRY_POINT_GROUP = "mdc_core.plugins"  # [project.entry-points."mdc_core.plugins"] name = "module"
DECODERS = ("unmask", "left_to_right", "ancestral", "none")  # how a run's captions are produced (sample, eval)


@dataclass(frozen=True)
class ObjectiveSpec:
    """One row of the objective table: everything the rest of the code asks about an objective.

    Its family (:attr:`family`), its noise process (:attr:`schedule`: the draw of t, the masking rate, the loss
    weight, the expected loss terms, the ratios it is scored at), its display label, its model-card sentence and
    its default decoder are all read from here, never from its name."""

    causal: bool  # decoder self-attention is causal (teacher forcing) instead of bidirectional
    schedule: NoiseSchedule | None  # the noise process (above); None: no caption token is predicted
    loss: Callable[..., Any] | None = None  # the batch loss (model, images, tokens, cfg, generator) -> LossOutput;
    # None: its family's (mdc_core.objectives.LOSSES); a plug-in's row brings its own
    model: str = "captioner"  # architecture (mdc_core.factory.MODELS): "captioner" or "clip" (contrastive loss)
    prepared: bool = True  # the loss takes a PreparedBatch (objectives.prepare_batch, on the host in the trainer);
    # False: it draws its noise on the device itself
    label: str = ""  # display label in tables ("MDC w/o 1/t"); "" = the objective's name
    description: str = ""  # the model card's sentence; may use {t_low}, {t_high}, {mask_ratio}; "" = the name
    decoder: str = ""  # one of DECODERS; "" = the family's (masked: unmask, causal: left_to_right, contrastive: none)
    per_masked_token: bool = False  # a masked objective's loss is divided by its masked tokens (Eq. 1, CMLM)
    # instead of the captions' maskable tokens (Eq. 5's NELBO per caption token)

    def __post_init__(self) -> None:
        if not self.decoder:
            default = {"masked": "unmask", "causal": "left_to_right", "contrastive": "none"}[self.family]
            object.__setattr__(self, "decoder", default)
        if self.decoder not in DECODERS:
            raise ValueError(f"objective decoder {self.decoder!r}: choose one of {', '.join(DECODERS)}")
        if (self.schedule is None) != (self.family == "contrastive"):
            raise ValueError("a captioner's objective names its noise schedule (a NoiseSchedule); a contrastive "
                             "one has none")

    @property
    def family(self) -> str:
        """"contrastive" (no caption decoder), "causal" (left to right) or "masked" (tokens masked and predicted)."""
        return "contrastive" if self.model != "captioner" else "causal" if self.causal else "masked"

    def expected_loss_terms(self, lengths: Sequence[int], cfg: Any) -> float:
        """Its schedule's :meth:`NoiseSchedule.expected_loss_terms` under objective settings `cfg`; 0 if it has none."""
        return 0.0 if self.schedule is None else self.schedule.expected_loss_terms(lengths, cfg)

    def display(self, name: str) -> str:
        """The label of objective `name` (this row) in tables."""
        return self.label or name


# the core's rows, in the order the command line lists them; extensions append theirs (register_objective)
OBJECTIVES: dict[str, ObjectiveSpec] = {
    "mdc": ObjectiveSpec(  # masked diffusion captioning
        causal=False, schedule=LinearSchedule(), label="MDC",
        description="masked diffusion captioning (Feng, Wei, Owens 2025): each caption token masked with probability "
                    "t ~ U[{t_low}, {t_high}], the masked tokens predicted from the image, the loss weighted by 1/t"),
    "mdc_no_t": ObjectiveSpec(  # Eq. 5 without its weight: divided by the caption tokens, as mdc is
        causal=False, schedule=LinearSchedule(weighted=False), label="MDC (w/o 1/t), per caption token",
        description="masked diffusion captioning without the 1/t weight, the masked tokens' loss divided by the "
                    "caption tokens (as MDC's): t ~ U[{t_low}, {t_high}]"),
    "cmlm": ObjectiveSpec(  # Table 4's "MDC (w/o t)": Alg. 1 without 1/t, which "essentially becomes CMLM"
        causal=False, schedule=LinearSchedule(weighted=False), per_masked_token=True,
        label="CMLM (w/o 1/t, per masked token)",
        description="CMLM (the paper's MDC without the 1/t weight, Table 4): the mean cross-entropy of the masked "
                    "tokens, each caption token masked with probability t ~ U[{t_low}, {t_high}]"),
    "mdc_cosine": ObjectiveSpec(  # MDC with MDLM's cosine schedule (CosineSchedule)
        causal=False, schedule=CosineSchedule(), label="MDC (cosine)",
        description="masked diffusion captioning with MDLM's cosine schedule: t ~ U[{t_low}, {t_high}], each caption "
                    "token masked with probability 1 - cos(pi t / 2), the loss weighted by -alpha'_t / (1 - alpha_t) "
                    "= (pi / 2) / tan(pi t / 4)"),
    "bert": ObjectiveSpec(  # image-conditioned BERT, r
        causal=False, schedule=FixedRatio(), label="BERT",
        description="image-conditioned BERT: a fixed fraction {mask_ratio} of the caption tokens masked and predicted"),
    "parallel": ObjectiveSpec(  # r = 1, CapPa parallel
        causal=False, schedule=AllMasked(), label="Parallel",
        description="parallel captioning (CapPa): every caption token masked and predicted at once from the image"),
    "arc": ObjectiveSpec(  # autoregressive captioning
        causal=True, schedule=TeacherForcing(), label="ARC",
        description="autoregressive captioning: the next caption token predicted from the image and the tokens "
                    "before it"),
    "clip": ObjectiveSpec(  # contrastive baseline
        causal=True, schedule=None, model="clip", label="CLIP",
        description="contrastive image-text training (CLIP) with a text transformer of the decoder's shape"),
}
CORE_OBJECTIVES = tuple(OBJECTIVES)
# image encoders besides timm (the default for any other model.encoder): name -> builder of a ModelConfig
ENCODERS: dict[str, Callable[..., Any]] = {}
# config sections extensions add keys to: section -> settings dataclasses (see config.ObjectiveConfig)
SETTINGS: dict[str, list[type]] = {}
# transforms of the image tokens during training, in registration order: (model, image_tokens, objective config,
# generator) -> image_tokens; each returns its input unchanged, drawing nothing, when its settings leave it off
CONDITION_TRANSFORMS: list[Callable[..., Any]] = []
_loaded_plugins: list[str] | None = None  # the modules load_plugins imported, in order (None: not called yet)


def _register(table: dict[str, Any], kind: str, name: str, row: Any) -> None:
    if name in table and table[name] != row:
        raise ValueError(f"{kind} {name!r} is registered twice with different definitions")
    table[name] = row


def register_objective(name: str, spec: ObjectiveSpec) -> None:
    """Add a row to :data:`OBJECTIVES` (``objective.name`` and ``mdc train --objective`` then accept `name`)."""
    _register(OBJECTIVES, "objective", name, spec)


def register_encoder(name: str, build: Callable[..., Any]) -> None:
    """Add an image encoder (a class or function that builds it from a ModelConfig) chosen by ``model.encoder``."""
    _register(ENCODERS, "encoder", name, build)


def register_settings(section: str, settings: type) -> None:
    """Add the fields of dataclass `settings` as keys of config section `section` (only "objective" so far).

    Every field needs a default; an optional ``validate(self, section_config)`` raises on bad values. The keys are
    read as attributes of the section (``cfg.objective.<key>``) and saved with it in ``config.json``."""
    rows = SETTINGS.setdefault(section, [])
    if settings not in rows:
        rows.append(settings)


def register_condition_transform(transform: Callable[..., Any]) -> None:
    """Add a transform of the image condition applied by the core's losses during training."""
    if transform not in CONDITION_TRANSFORMS:
        CONDITION_TRANSFORMS.append(transform)


def load_plugins() -> list[str]:
    """Import every plug-in module (the entry points of :data:`ENTRY_POINT_GROUP`) once; they register their rows.
    Returns the modules imported."""
    global _loaded_plugins
    if _loaded_plugins is None:
        _loaded_plugins = []  # set first: a plug-in that reads a table while importing must not recurse
        for entry in entry_points(group=ENTRY_POINT_GROUP):
            importlib.import_module(entry.value)
            _loaded_plugins.append(entry.value)
    return list(_loaded_plugins)


def objective_names() -> tuple[str, ...]:
    """Every objective name: the core's, then the plug-ins' (this loads the plug-ins: it lists them all)."""
    load_plugins()
    return tuple(OBJECTIVES)


def objective_spec(name: str) -> ObjectiveSpec:
    """The row of objective `name` (the plug-ins are loaded only for a name the core lacks); ValueError listing
    the known names."""
    if name not in OBJECTIVES:
        load_plugins()
    if name not in OBJECTIVES:
        raise ValueError(f"unknown objective {name!r}; choose one of {', '.join(OBJECTIVES)}")
    return OBJECTIVES[name]


def encoder_builder(name: str) -> Callable[..., Any] | None:
    """The builder of a registered encoder `name`, or None (then ``name`` is a timm model). The plug-ins are loaded
    only for a name that is neither registered nor a timm model."""
    if name not in ENCODERS:
        import timm  # the encoder is about to be built: timm is imported anyway

        if not timm.is_model(name.split(".")[0]):
            load_plugins()
    return ENCODERS.get(name)


def settings_for(section: str) -> list[type]:
    """The settings dataclasses registered plug-ins added to config section `section`."""
    return list(SETTINGS.get(section, ()))


def condition_transforms() -> list[Callable[..., Any]]:
    """The registered transforms of the image condition (none unless a plug-in that adds one was loaded)."""
    return list(CONDITION_TRANSFORMS)
