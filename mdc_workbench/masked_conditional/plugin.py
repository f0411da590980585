"""What MC-Diffusion adds to the core (:mod:`mdc_core.registry`), imported by the registry on first use.

* the objective ``d3pm`` (mask-and-replace D3PM, :func:`~mdc_workbench.masked_conditional.diffusion.d3pm_objective`);
* the image encoders ``vqvae`` and ``vqgan`` (discrete image tokens of a frozen VQ-VAE / diffusers VQModel);
* the objective keys of :class:`MaskedConditionalSettings` (``objective.d3pm_steps``, ``objective.guidance``, ...);
* the training-time corruption of the image condition for guided sampling (``objective.guidance = cfg | mcs``).

Light on purpose: the functions registered here import their modules when first called, so loading the plug-ins
imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mdc_core import registry
from mdc_core.config import ConfigError
from mdc_core.registry import NoiseSchedule

GUIDANCE_TRAINING_MODES = ("none", "cfg", "mcs")  # objective.guidance: condition corruption while training
GUIDANCE_MODES = ("none", "cfg", "mcs", "mcs_cfg")  # mdc sample --guidance: "none" + guidance.GUIDANCE_FORMS


@dataclass
class MaskedConditionalSettings:
    """MC-Diffusion's keys of the objective section (read as ``cfg.objective.<key>``)."""

    d3pm_steps: int = 100  # d3pm: T, discrete diffusion steps of the mask-and-replace process (MC-Diffusion: 100)
    d3pm_aux_weight: float = 0.01  # d3pm: weight lambda of the auxiliary x_0 cross-entropy added to the VLB term
    guidance: str = "none"  # train for guided sampling: none | cfg (drop the whole image condition) | mcs (mask)
    p_cond: float = 0.1  # cfg/mcs: fraction of examples whose condition is dropped (cfg) or partially masked (mcs)
    p_mask: float = 0.1  # mcs: probability that each image token of such an example is masked

    def validate(self, objective: Any) -> None:
        """Raise ConfigError for a bad value; `objective` is the whole section (its ``name``)."""
        if self.guidance not in GUIDANCE_TRAINING_MODES:
            raise ConfigError(f"objective.guidance must be one of {', '.join(GUIDANCE_TRAINING_MODES)}; "
                              f"got {self.guidance!r}")
        if self.guidance != "none" and objective.name == "clip":
            raise ConfigError("objective.guidance applies to captioners; the clip objective has no image condition")
        if self.d3pm_steps <= 0:
            raise ConfigError(f"objective.d3pm_steps must be > 0, got {self.d3pm_steps}")
        if self.d3pm_aux_weight < 0:
            raise ConfigError(f"objective.d3pm_aux_weight must be >= 0, got {self.d3pm_aux_weight}")
        if not (0.0 <= self.p_cond <= 1.0 and 0.0 <= self.p_mask <= 1.0):
            raise ConfigError(f"objective.p_cond and objective.p_mask must be in [0, 1], got {self.p_cond}, "
                              f"{self.p_mask}")


def corrupt_for_guidance(model: Any, image_tokens: Any, objective: Any, generator: Any = None) -> Any:
    """The condition transform: unchanged (no draws) unless ``objective.guidance`` is cfg or mcs."""
    if objective.guidance == "none":
        return image_tokens
    from mdc_workbench.masked_conditional.guidance import corrupt_training_condition

    return corrupt_training_condition(model, image_tokens, objective, generator)


def d3pm_loss(*args: Any, **kwargs: Any) -> Any:
    """The ``d3pm`` row's batch loss: :func:`mdc_workbench.masked_conditional.diffusion.d3pm_objective`."""
    from mdc_workbench.masked_conditional.diffusion import d3pm_objective

    return d3pm_objective(*args, **kwargs)


def vqvae_encoder(cfg: Any) -> Any:
    """``model.encoder = vqvae``: the discrete tokens of a frozen VQ-VAE (:mod:`.vqvae`)."""
    from mdc_workbench.masked_conditional.vqvae import VQImageEncoder

    return VQImageEncoder(cfg)


def vqgan_encoder(cfg: Any) -> Any:
    """``model.encoder = vqgan``: the discrete tokens of a local diffusers VQModel (:mod:`.vqgan`)."""
    from mdc_workbench.masked_conditional.vqgan import DiffusersVQEncoder

    return DiffusersVQEncoder(cfg)


@dataclass(frozen=True)
class MaskAndReplace(NoiseSchedule):
    """D3PM's noise process, which :func:`d3pm_loss` draws itself (T discrete steps of masking and replacing
    tokens, :mod:`.d3pm`): to the core's questions it answers that every caption position carries a loss term."""

    def draw(self, cfg: Any, batch: int, generator: Any = None, device: Any = "cpu") -> Any:
        raise ValueError(f"objective {cfg.name!r} draws its noise inside its own loss (D3PM's T steps)")

    def expected_rate(self, cfg: Any) -> float:
        return 1.0  # every position carries a loss term (the VLB and the x_0 cross-entropy)

    def scoring_ratios(self, cfg: Any) -> tuple[float, ...]:
        return ()  # no masking ratio: the noise is D3PM's own


registry.register_objective("d3pm", registry.ObjectiveSpec(  # MC-Diffusion's mask-and-replace D3PM
    causal=False, schedule=MaskAndReplace(), prepared=False, decoder="ancestral", loss=d3pm_loss,
    description="MC-Diffusion: mask-and-replace discrete diffusion (D3PM) over caption tokens"))
registry.register_encoder("vqvae", vqvae_encoder)  # frozen VQ-VAE tokens
registry.register_encoder("vqgan", vqgan_encoder)  # local diffusers VQModel
registry.register_settings("objective", MaskedConditionalSettings)
registry.register_condition_transform(corrupt_for_guidance)
