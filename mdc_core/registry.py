"""The plug-in point: the tables the core chooses variants from, which extensions fill when they are imported.

The core declares its own rows (the objectives MDC, its baselines, ARC and CLIP) and never names an extension. An
extension that adds a variant the core must be able to build (an objective, an image encoder, configuration keys,
a transform of the image condition during training) registers it when its module is imported, and names that
module under the entry-point group ``mdc_core.plugins`` (the workbench names its MC-Diffusion plug-in there).
The core imports them (:func:`load_plugins`) only when it meets a name it does not know: an objective, a config key
or an image encoder that is no timm model. So an MDC run never loads MC-Diffusion, and an old run folder whose
``config.json`` carries an extension's keys still loads. A plug-in module stays light (no torch at import): it
names its functions as ``"module:attribute"`` strings or wraps them in small functions that import on call.

This module imports nothing but the standard library (the command line builds its choices from it); like a row's
loss, the tensor helpers :meth:`ObjectiveSpec.loss_denominator` counts with are named as ``"module:function"``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

ENTRY_POINT_GROUP = "mdc_core.plugins"  # [project.entry-points."mdc_core.plugins"] name = "module"


def resolve_ref(ref: str | Callable[..., Any]) -> Any:
    """The object a ``"package.module:attribute"`` string names, importing the module on first use (a callable is
    returned as it is): how a table row names a function without importing its module."""
    if callable(ref):
        return ref
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


FAMILIES = ("masked", "causal", "contrastive")  # how a captioner's tokens are predicted, or no captioner at all
DECODERS = ("unmask", "left_to_right", "ancestral", "none")  # how a run's captions are produced (sample, eval)
# family -> (caption scores the compositionality evaluation allows for it, the ones it runs by default)
SCORING: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "masked": (("mc", "heuristic", "ar"), ("mc", "heuristic")),
    "causal": (("ar",), ("ar",)),
    "contrastive": (("cosine",), ("cosine",)),
}


@dataclass(frozen=True)
class ObjectiveSpec:
    """One row of the objective table: everything the rest of the code asks about an objective.

    Its family (:attr:`family`), how many loss terms a batch carries (:meth:`loss_denominator`,
    :meth:`expected_loss_terms`), its display label, its model-card sentence, its default decoder and the
    masking ratios it is scored at (:meth:`scoring_ratios`) are all read from here, never from its name."""

    causal: bool  # decoder self-attention is causal (teacher forcing) instead of bidirectional
    masking: str  # "time": t ~ U[t_low, t_high] per caption; "fixed": t = mask_ratio; "all": t = 1; "none";
    # "custom": the loss draws its own noise (an extension's process; prepared=False)
    inv_t_weight: bool  # weight each caption's masked CE by 1/t (the diffusion ELBO weight)
    loss: str | Callable[..., Any]  # the batch loss (model, images, tokens, cfg, generator) -> LossOutput, or its
    # "module:function" (resolved on use, so that registering a row imports nothing)
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

    @property
    def family(self) -> str:
        """"contrastive" (no caption decoder), "causal" (left to right) or "masked" (tokens masked and predicted)."""
        return "contrastive" if self.model != "captioner" else "causal" if self.causal else "masked"

    @property
    def scoring(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(compositionality scores that apply, the default ones) for this objective's family."""
        return SCORING[self.family]

    def loss_fn(self) -> Callable[..., Any]:
        return resolve_ref(self.loss)

    def loss_denominator(self, tokens: Any, normalization: str, mask: Any = None) -> int:
        """What the loss of a micro-batch `tokens` (B, L) is divided by: its loss-carrying positions (``per_token``:
        caption tokens + ``<eot>`` when nothing is masked, the masked tokens `mask` (B, L') of a
        :attr:`per_masked_token` objective, else the maskable positions) or its captions with any
        (``per_sequence``); the batch size for a contrastive objective."""
        if self.family == "contrastive":
            return tokens.shape[0]  # a mean over the batch
        if self.masking == "none":  # next-token targets: every token after <sot> that is not padding
            valid = ~resolve_ref("mdc_core.model:padding_mask")(tokens)[:, 1:]  # (B, L - 1)
        elif self.per_masked_token:  # the draws decide it: the caller passes them
            if mask is None:
                raise ValueError("this objective divides its loss by the masked tokens: pass the batch's mask")
            valid = mask
        else:
            valid = resolve_ref("mdc_core.objectives:maskable_positions")(tokens)  # (B, L)
        per_caption = valid.sum(dim=1)  # (B,)
        return int(per_caption.sum()) if normalization == "per_token" else int((per_caption > 0).sum())

    def expected_loss_terms(self, lengths: Sequence[int], cfg: Any) -> float:
        """Expected loss-carrying tokens of captions of `lengths` caption tokens (no ``<sot>``/``<eot>``) under
        objective settings `cfg` (an ObjectiveConfig); 0 for a contrastive objective."""
        n = float(sum(lengths))
        if self.family == "contrastive":
            return 0.0
        if self.masking == "none":
            return n + len(lengths)  # every caption token and <eot>
        if self.masking == "time":
            return (cfg.t_low + cfg.t_high) / 2 * n
        if self.masking == "fixed":
            return cfg.mask_ratio * n
        return n  # "all", and a custom process (D3PM noises all): every position carries a loss term

    def scoring_ratios(self, cfg: Any) -> tuple[float, ...]:
        """Masking ratios inside the range a run of objective settings `cfg` was trained on: its fixed ratio
        ("fixed"; 1 for "all"), else three evenly spaced ratios of [t_low, t_high] (ratio 0 left out)."""
        if self.masking == "all":
            return (1.0,)
        if self.masking == "fixed":
            return (float(cfg.mask_ratio),)
        steps = [cfg.t_low + k * (cfg.t_high - cfg.t_low) / 2 for k in range(3)]
        return tuple(round(r, 4) for r in steps if r > 0)

    def display(self, name: str) -> str:
        """The label of objective `name` (this row) in tables."""
        return self.label or name


_MASKED, _AR = "mdc_core.objectives:masked_token_loss", "mdc_core.objectives:autoregressive_loss"
# the core's rows, in the order the command line lists them; extensions append theirs (register_objective)
OBJECTIVES: dict[str, ObjectiveSpec] = {
    "mdc": ObjectiveSpec(  # masked diffusion captioning
        causal=False, masking="time", inv_t_weight=True, loss=_MASKED, label="MDC",
        description="masked diffusion captioning (Feng, Wei, Owens 2025): each caption token masked with probability "
                    "t ~ U[{t_low}, {t_high}], the masked tokens predicted from the image, the loss weighted by 1/t"),
    "mdc_no_t": ObjectiveSpec(  # Eq. 5 without its weight: divided by the caption tokens, as mdc is
        causal=False, masking="time", inv_t_weight=False, loss=_MASKED, label="MDC (w/o 1/t), per caption token",
        description="masked diffusion captioning without the 1/t weight, the masked tokens' loss divided by the "
                    "caption tokens (as MDC's): t ~ U[{t_low}, {t_high}]"),
    "cmlm": ObjectiveSpec(  # Table 4's "MDC (w/o t)": Alg. 1 without 1/t, which "essentially becomes CMLM"
        causal=False, masking="time", inv_t_weight=False, loss=_MASKED, per_masked_token=True,
        label="CMLM (w/o 1/t, per masked token)",
        description="CMLM (the paper's MDC without the 1/t weight, Table 4): the mean cross-entropy of the masked "
                    "tokens, each caption token masked with probability t ~ U[{t_low}, {t_high}]"),
    "bert": ObjectiveSpec(  # image-conditioned BERT, r
        causal=False, masking="fixed", inv_t_weight=False, loss=_MASKED, label="BERT",
        description="image-conditioned BERT: a fixed fraction {mask_ratio} of the caption tokens masked and predicted"),
    "parallel": ObjectiveSpec(  # r = 1, CapPa parallel
        causal=False, masking="all", inv_t_weight=False, loss=_MASKED, label="Parallel",
        description="parallel captioning (CapPa): every caption token masked and predicted at once from the image"),
    "arc": ObjectiveSpec(  # autoregressive captioning
        causal=True, masking="none", inv_t_weight=False, loss=_AR, label="ARC",
        description="autoregressive captioning: the next caption token predicted from the image and the tokens "
                    "before it"),
    "clip": ObjectiveSpec(  # contrastive baseline
        causal=True, masking="none", inv_t_weight=False, model="clip", loss="mdc_core.objectives:clip_loss",
        label="CLIP", description="contrastive image-text training (CLIP) with a text transformer of the decoder's "
                                  "shape"),
}
CORE_OBJECTIVES = tuple(OBJECTIVES)
# image encoders besides timm (the default for any other model.encoder): name -> class built from a ModelConfig
ENCODERS: dict[str, str | Callable[..., Any]] = {}
# config sections extensions add keys to: section -> settings dataclasses (see config.ObjectiveConfig)
SETTINGS: dict[str, list[type]] = {}
# transforms of the image tokens during training, in registration order: (model, image_tokens, objective config,
# generator) -> image_tokens; each returns its input unchanged, drawing nothing, when its settings leave it off
CONDITION_TRANSFORMS: list[Callable[..., Any]] = []


@dataclass
class _Plugins:
    loaded: list[str] = field(default_factory=list)  # modules imported by load_plugins, in order
    done: bool = False


_PLUGINS = _Plugins()


def _register(table: dict[str, Any], kind: str, name: str, row: Any) -> None:
    if name in table and table[name] != row:
        raise ValueError(f"{kind} {name!r} is registered twice with different definitions")
    table[name] = row


def register_objective(name: str, spec: ObjectiveSpec) -> None:
    """Add a row to :data:`OBJECTIVES` (``objective.name`` and ``mdc train --objective`` then accept `name`)."""
    _register(OBJECTIVES, "objective", name, spec)


def register_encoder(name: str, build: str | Callable[..., Any]) -> None:
    """Add an image encoder (a class or ``"module:class"`` built from a ModelConfig) chosen by ``model.encoder``."""
    _register(ENCODERS, "encoder", name, build)


def register_settings(section: str, settings: type) -> None:
    """Add the fields of dataclass `settings` as keys of config section `section` (only "objective" so far).

    Every field needs a default; an optional ``validate(self, section_config)`` raises on bad values. The keys are
    read as attributes of the section (``cfg.objective.<key>``) and saved with it in ``config.json``.
    """
    rows = SETTINGS.setdefault(section, [])
    if settings not in rows:
        rows.append(settings)


def register_condition_transform(transform: Callable[..., Any]) -> None:
    """Add a transform of the image condition applied by the core's losses during training."""
    if transform not in CONDITION_TRANSFORMS:
        CONDITION_TRANSFORMS.append(transform)


def plugin_modules() -> list[str]:
    """The modules :func:`load_plugins` imports: the entry points of :data:`ENTRY_POINT_GROUP`."""
    return [ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)]


def load_plugins() -> list[str]:
    """Import every plug-in module once (they register their rows); returns the modules imported."""
    if not _PLUGINS.done:
        _PLUGINS.done = True  # set first: a plug-in that reads a table while importing must not recurse
        for module in plugin_modules():
            importlib.import_module(module)
            _PLUGINS.loaded.append(module)
    return list(_PLUGINS.loaded)


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
    if name not in ENCODERS and not _is_timm_model(name):
        load_plugins()
    return resolve_ref(ENCODERS[name]) if name in ENCODERS else None


def _is_timm_model(name: str) -> bool:
    import timm  # the encoder is about to be built: timm is imported anyway

    return bool(timm.is_model(name.split(".")[0]))


def settings_for(section: str) -> list[type]:
    """The settings dataclasses registered plug-ins added to config section `section`."""
    return list(SETTINGS.get(section, ()))


def condition_transforms() -> list[Callable[..., Any]]:
    """The registered transforms of the image condition (none unless a plug-in that adds one was loaded)."""
    return list(CONDITION_TRANSFORMS)
