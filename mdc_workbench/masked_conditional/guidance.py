"""Guidance for image-conditioned masked-diffusion captioners (MC-Diffusion, Definitions 1 and 2).

In this module ``cfg`` names classifier-free guidance only (the option value ``"cfg"``, as users type it);
a config is called by what it configures (``objective``, ``guidance``).

Training (``objective.guidance``), applied to the image tokens y (B, M, D) before the decoder sees them:

* ``cfg``  classifier-free guidance: in a ``p_cond`` fraction of the examples the whole condition is dropped
  (every image token replaced by the null token);
* ``mcs``  masked condition strategy: in a ``p_cond`` fraction of the examples each image token is replaced by
  the ``[MASK]`` image token with probability ``p_mask`` (paper Alg. 1).

The null / ``[MASK]`` image token is the encoder's learned ``mask_token`` when it has one (the VQ-VAE encoder),
else the zero vector (the paper's "replacing the condition with zeros"). Using one token for both makes CFG
exactly MCS with ``p_mask = 1``, so the two differ only in how much they mask.

Sampling (:class:`GuidanceConfig`), combining log-probabilities of x_0 with guidance scale w as the paper writes:

* ``cfg``: ``(1 - w) log p(x | null) + w log p(x | y)`` (Def. 1; w = 1 is the conditional model);
* ``mcs``: ``w log p(x | y_[M], y_o) + (1 - w) log p(x | y)`` (Def. 2 as printed; w = 1 is the partially
  masked model, w > 1 moves past it, away from the full condition);
* ``mcs_cfg``: Def. 1's form with the masked condition as the reference,
  ``(1 - w) log p(x | y_[M], y_o) + w log p(x | y)`` (the other reading of Def. 2; w = 1 is the conditional model).

The masked reference condition is drawn afresh (each token masked with ``p_mask``) at every decoder call, or
once per image cache. :class:`GuidedCaptioner` wraps a captioner so that any sampler (MDC's confidence sampler
:func:`mdc_core.sampler.sample` and the D3PM sampler of :mod:`mdc_workbench.masked_conditional.diffusion`) uses guided
predictions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

# objective.guidance: plugin.GUIDANCE_TRAINING_MODES (the plug-in, which imports this module when training, keeps
# its own torch-free copy for the config check; tests/workbench/test_masked_conditional_cli.py holds the two equal)
TRAINING_MODES = ("none", "cfg", "mcs")
# sampling: mode -> (weight of log p(x | y), weight of log p(x | reference)) as functions of the scale w
GUIDANCE_FORMS: dict[str, Any] = {
    "cfg": lambda w: (w, 1.0 - w),
    "mcs": lambda w: (1.0 - w, w),
    "mcs_cfg": lambda w: (w, 1.0 - w),
}
REFERENCE_MASK: dict[str, Any] = {  # mode -> probability that a reference image token is masked
    "cfg": lambda p_mask: 1.0,
    "mcs": lambda p_mask: p_mask,
    "mcs_cfg": lambda p_mask: p_mask,
}


def condition_mask_value(model: Any) -> torch.Tensor:
    """(D,) the null / ``[MASK]`` image token of `model`: its encoder's learned ``mask_token``, else zeros."""
    token = getattr(model.encoder, "mask_token", None)
    if token is not None:
        return token
    param = next(model.parameters())
    return torch.zeros(model.encoder.width, device=param.device, dtype=param.dtype)


def mask_tokens(image_tokens: torch.Tensor, token_mask: torch.Tensor, mask_value: torch.Tensor) -> torch.Tensor:
    """Replace image tokens where token_mask (B, M) is True by mask_value (D,): (B, M, D) -> (B, M, D)."""
    return torch.where(token_mask[..., None], mask_value.to(image_tokens.dtype), image_tokens)


def corrupt_condition(image_tokens: torch.Tensor, mode: str, p_cond: float, p_mask: float,
                      mask_value: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Training-time condition corruption (see the module docstring); ``mode="none"`` returns the input and draws
    no random numbers. image_tokens (B, M, D) -> (B, M, D)."""
    if mode not in TRAINING_MODES:
        raise ValueError(f"unknown guidance training mode {mode!r}; choose one of {', '.join(TRAINING_MODES)}")
    if mode == "none":
        return image_tokens
    B, M, _ = image_tokens.shape
    chosen = torch.rand(B, generator=generator, device=image_tokens.device) < p_cond  # (B,) examples to corrupt
    rate = 1.0 if mode == "cfg" else p_mask
    token_mask = chosen[:, None] & (torch.rand(B, M, generator=generator, device=image_tokens.device) < rate)
    return mask_tokens(image_tokens, token_mask, mask_value)


def corrupt_training_condition(model: Any, image_tokens: torch.Tensor, objective: Any,
                               generator: torch.Generator | None = None) -> torch.Tensor:
    """:func:`corrupt_condition` with the settings of ObjectiveConfig `objective` and `model`'s null token: the
    hook the core's losses call (through the plug-in's condition transform) when ``objective.guidance`` is set."""
    return corrupt_condition(image_tokens, objective.guidance, objective.p_cond, objective.p_mask,
                             condition_mask_value(model), generator)


def reference_condition(image_tokens: torch.Tensor, mode: str, p_mask: float, mask_value: torch.Tensor,
                        generator: torch.Generator | None = None) -> torch.Tensor:
    """The condition of the reference model at sampling: all tokens masked (cfg) or each with p_mask (mcs)."""
    rate = REFERENCE_MASK[mode](p_mask)
    B, M, _ = image_tokens.shape
    token_mask = torch.rand(B, M, generator=generator, device=image_tokens.device) < rate
    return mask_tokens(image_tokens, token_mask, mask_value)


def guided_log_probs(cond_logits: torch.Tensor, ref_logits: torch.Tensor, mode: str, scale: float) -> torch.Tensor:
    """Combine the two models' log-probabilities (..., V) with the paper's weights (unnormalised log-probs)."""
    if mode not in GUIDANCE_FORMS:
        raise ValueError(f"unknown guidance mode {mode!r}; choose one of {', '.join(GUIDANCE_FORMS)}")
    a, b = GUIDANCE_FORMS[mode](scale)
    return a * cond_logits.float().log_softmax(-1) + b * ref_logits.float().log_softmax(-1)


@dataclass
class GuidanceConfig:
    """Guided sampling: which combination, its scale w, and the masked reference's mask rate."""

    mode: str = "none"  # none | cfg | mcs | mcs_cfg (see the module docstring)
    scale: float = 1.0  # guidance scale w (the paper sweeps 1..5)
    p_mask: float = 0.1  # mcs/mcs_cfg: probability that a reference image token is masked (training's p_mask)
    seed: int = 0  # seeds the masks of the reference condition

    def validate(self) -> GuidanceConfig:
        if self.mode != "none" and self.mode not in GUIDANCE_FORMS:
            raise ValueError(f"guidance mode must be none or one of {', '.join(GUIDANCE_FORMS)}; got {self.mode!r}")
        if self.scale < 0:
            raise ValueError(f"guidance scale must be >= 0, got {self.scale}")
        if not 0.0 <= self.p_mask <= 1.0:
            raise ValueError(f"guidance p_mask must be in [0, 1], got {self.p_mask}")
        return self


@dataclass
class GuidedCache:
    """Image caches of the condition and of the reference condition (see ``Captioner.image_cache``)."""

    cond: Any
    ref: Any

    @property
    def batch(self) -> int:
        return self.cond.batch


class GuidedCaptioner:
    """A captioner whose ``decode`` returns guided log-probabilities; samplers use it in place of the model.

    Everything else (``causal``, the model config ``cfg``, ``output_ids``, ``encode_image`` ...) is the wrapped
    model's. With mode ``none``, or a scale that gives the reference model weight 0, ``decode`` is the model's own.
    """

    def __init__(self, model: Any, guidance: GuidanceConfig) -> None:
        self.model = model
        self.guidance = guidance.validate()
        self._generators: dict[str, torch.Generator] = {}

    def __getattr__(self, name: str) -> Any:  # delegate causal, the model config, output_ids, encode_image, ...
        model = self.__dict__.get("model")
        if model is None:
            raise AttributeError(name)
        return getattr(model, name)

    @property
    def active(self) -> bool:
        g = self.guidance
        return g.mode != "none" and GUIDANCE_FORMS[g.mode](g.scale)[1] != 0.0

    def _generator(self, device: torch.device) -> torch.Generator:
        key = str(device)
        if key not in self._generators:
            self._generators[key] = torch.Generator(device=device).manual_seed(self.guidance.seed)
        return self._generators[key]

    def reference(self, image_tokens: torch.Tensor) -> torch.Tensor:
        g = self.guidance
        return reference_condition(image_tokens, g.mode, g.p_mask, condition_mask_value(self.model),
                                   self._generator(image_tokens.device))

    def image_cache(self, image_tokens: torch.Tensor) -> Any:
        if not self.active:
            return self.model.image_cache(image_tokens)
        return GuidedCache(self.model.image_cache(image_tokens), self.model.image_cache(self.reference(image_tokens)))

    def decode(self, tokens: torch.Tensor, image_tokens: torch.Tensor | None, *, select: torch.Tensor | None = None,
               causal: bool | None = None, cache: Any = None, **kwargs: Any) -> torch.Tensor:
        """As ``Captioner.decode``: (B, L, V_out) (or (n, V_out) with `select`), guided log-probabilities."""
        if not self.active:
            return self.model.decode(tokens, image_tokens, select=select, causal=causal, cache=cache, **kwargs) \
                if cache is not None else self.model.decode(tokens, image_tokens, select=select, causal=causal)
        if isinstance(cache, GuidedCache):
            cond = self.model.decode(tokens, None, select=select, causal=causal, cache=cache.cond, **kwargs)
            kwargs.pop("attention", None)  # the attention reported is the conditional model's
            ref = self.model.decode(tokens, None, select=select, causal=causal, cache=cache.ref, **kwargs)
        else:
            if image_tokens is None:
                raise ValueError("guided decoding needs image_tokens or a cache from GuidedCaptioner.image_cache")
            B = tokens.shape[0]
            conditions = torch.cat([image_tokens, self.reference(image_tokens)])  # (2B, M, D)
            both = self.model.decode(torch.cat([tokens, tokens]), conditions,
                                     select=None if select is None else torch.cat([select, select]), causal=causal)
            cond, ref = (both[:B], both[B:]) if select is None else both.split(len(both) // 2)
        return guided_log_probs(cond, ref, self.guidance.mode, self.guidance.scale)
