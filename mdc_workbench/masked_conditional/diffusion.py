"""MC-Diffusion on the workbench's captioner: the D3PM training loss of a batch and the T-step ancestral sampler.

The captioner is MDC's (:class:`~mdc_core.model.Captioner`; with ``model.encoder = "vqvae"`` it is conditioned
on discrete VQ-VAE image tokens as in the paper), trained with ``objective.name = "d3pm"``. Conventions:

* **States.** The D3PM states are the output-head rows a caption may contain (every row except ``<sot>`` and
  ``<eot>``; K of them, the corpus vocabulary with ``model.output_vocab = "corpus"``) plus ``[MASK]`` (state K).
  ``<sot>``, ``<eot>`` and pads are never noised and never in the loss, as for MDC.
* **Network.** The decoder predicts p_theta(x_0 | x_t, y) at every caption position (time-independent, like
  MDC's decoder; the posterior carries the time step). Its reverse step is the posterior mixed over that
  prediction (:func:`mdc_workbench.masked_conditional.d3pm.q_posterior`).
* **Loss** (paper Eq. 7): per caption t ~ U{1..T}; per token the VLB term L_{t-1} plus ``d3pm_aux_weight`` times
  the x_0 cross-entropy, averaged over the caption tokens of the batch. The logged ``vlb`` is T * E[L_{t-1}]
  + the prior term, an estimate of the full bound in nats per token.
* **Sampler.** From the all-``[MASK]`` canvas ``<sot> [MASK]*N <eot>`` (the forward process ends there with
  probability gamma_bar_T = 0.99999), T ancestral steps (or every `stride`-th), each drawing x_{t-1} from
  p_theta(x_{t-1} | x_t); the last step (s = 0) leaves no mask. Guidance: pass a
  :class:`~mdc_workbench.masked_conditional.guidance.GuidedCaptioner` as the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from mdc_core.config import ObjectiveConfig
from mdc_core.objectives import LossOutput, encode_condition, maskable_positions
from mdc_core.tokenizer import EOT_ID, MASK_ID, SOT_ID
from mdc_workbench.masked_conditional import d3pm


@dataclass
class StateTable:
    """Map between token ids, head rows and D3PM states for one model."""

    rows: torch.Tensor  # (K,) head row of each content state
    token_ids: torch.Tensor  # (K+1,) token id of each state; state K is [MASK]
    state_of_token: torch.Tensor  # (EMBED_SIZE,) token id -> state (-1 for ids that are not states)

    @property
    def num_classes(self) -> int:
        return len(self.rows)


def state_table(model: Any) -> StateTable:
    ids = model.output_ids
    allowed = (ids != SOT_ID) & (ids != EOT_ID)
    rows = allowed.nonzero()[:, 0]  # (K,)
    token_ids = torch.cat([ids[rows], torch.tensor([MASK_ID], device=ids.device)])  # (K+1,)
    state_of_token = torch.full((MASK_ID + 1,), -1, dtype=torch.long, device=ids.device)
    state_of_token[token_ids] = torch.arange(len(token_ids), device=ids.device)
    return StateTable(rows, token_ids, state_of_token)


def schedule_for(cfg: ObjectiveConfig) -> d3pm.MaskReplaceSchedule:
    return d3pm.mask_replace_schedule(cfg.d3pm_steps)


def d3pm_objective(model: Any, images: torch.Tensor, tokens: torch.Tensor, cfg: ObjectiveConfig,
                   generator: torch.Generator | None = None) -> LossOutput:
    """The ``d3pm`` row of the core's objective table: images (B, 3, H, W) -> (guidance-corrupted) image tokens
    -> :func:`d3pm_loss` (VLB term + auxiliary x_0 cross-entropy)."""
    return LossOutput(*d3pm_loss(model, encode_condition(model, images, cfg, generator), tokens, cfg, generator))


def d3pm_loss(model: Any, image_tokens: torch.Tensor, tokens: torch.Tensor, cfg: ObjectiveConfig,
              generator: torch.Generator | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(loss, metrics) of a batch: image_tokens (B, M, D) (already guidance-corrupted), tokens (B, L)."""
    sched = schedule_for(cfg)
    table = state_table(model)
    K, T = table.num_classes, sched.steps
    valid = maskable_positions(tokens)  # (B, L) caption tokens
    x0 = table.state_of_token[tokens[valid]]  # (n,)
    if bool((x0 < 0).any()):
        bad = tokens[valid][x0 < 0].unique()[:5].tolist()
        raise ValueError(f"caption token ids {bad} have no row in the model's output vocabulary")
    B = tokens.shape[0]
    t_caption = torch.randint(1, T + 1, (B,), generator=generator, device=tokens.device)  # (B,)
    t = t_caption[:, None].expand_as(tokens)[valid]  # (n,) time step of each token
    x_t = d3pm.q_sample(x0, t, sched, K, generator)  # (n,) noisy states
    noisy = tokens.clone()
    noisy[valid] = table.token_ids[x_t]
    logits = model.decode(noisy, image_tokens, select=valid, causal=False)[:, table.rows]  # (n, K)
    vb, ce = d3pm.vlb_terms(x0, x_t, logits, t, sched)  # (n,) each
    n = valid.sum().clamp(min=1)
    loss = (vb.sum() + cfg.d3pm_aux_weight * ce.sum()) / n
    with torch.no_grad():
        metrics = {
            "loss": loss.detach(),
            "vb": vb.sum() / n,
            "vlb": T * vb.sum() / n + d3pm.prior_kl(x0[:1], sched, K).sum(),
            "ce_masked": ce.sum() / n,  # x_0 cross-entropy at every caption token (named as the trainer logs)
            "acc_masked": (logits.argmax(-1) == x0).float().sum() / n,
            "masked_frac": (x_t == K).float().sum() / n,
            "t_mean": t_caption.float().mean() / T,
        }
    return loss, metrics


@dataclass
class D3PMSampleOutput:
    tokens: torch.Tensor  # (B, N) caption token ids
    masked_per_step: list[float] = field(default_factory=list)  # fraction of [MASK] after each step
    settings: dict[str, Any] = field(default_factory=dict)


@torch.no_grad()
def d3pm_sample(model: Any, image_tokens: torch.Tensor, length: int, *, steps: int = 100, stride: int = 1,
                temperature: float = 1.0, seed: int = 0) -> D3PMSampleOutput:
    """Ancestral sampling of captions of `length` tokens for image_tokens (B, M, D) with T = `steps`.

    `model` is a Captioner or a :class:`~mdc_workbench.masked_conditional.guidance.GuidedCaptioner`. `temperature`
    divides the x_0 log-probabilities before the posterior (1 = the model's distribution). `stride` > 1 jumps
    t -> t - stride with the multi-step posterior (fewer network calls).
    """
    if getattr(model, "causal", False):
        raise ValueError("this model is autoregressive (ARC); D3PM sampling needs a bidirectional model")
    if length + 2 > model.cfg.context_length:
        raise ValueError(f"caption length {length} exceeds the model's context ({model.cfg.context_length - 2})")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    sched = d3pm.mask_replace_schedule(steps)
    table = state_table(model)
    K, device, B = table.num_classes, image_tokens.device, image_tokens.shape[0]
    gen = torch.Generator(device=device).manual_seed(seed)
    states = torch.full((B, length), K, dtype=torch.long, device=device)  # x_T: all [MASK]
    x = torch.full((B, length + 2), MASK_ID, dtype=torch.long, device=device)
    x[:, 0], x[:, -1] = SOT_ID, EOT_ID
    masked = []
    cache = model.image_cache(image_tokens) if hasattr(model, "image_cache") else None  # once for all T steps
    for t, s in d3pm.reverse_times(steps, stride):
        logits = (model.decode(x, image_tokens) if cache is None else model.decode(x, None, cache=cache))
        logits = logits[:, 1:-1, table.rows].float()  # (B, N, K)
        p0 = (logits.log_softmax(-1) / temperature).softmax(-1)
        probs = d3pm.q_posterior(states, p0, torch.tensor(t), torch.tensor(s), sched)  # (B, N, K+1)
        states = d3pm.sample_states(probs, gen)
        x[:, 1:-1] = table.token_ids[states]
        masked.append(float((states == K).float().mean()))
    settings = {"length": length, "steps": steps, "stride": stride, "temperature": temperature, "seed": seed}
    return D3PMSampleOutput(x[:, 1:-1].clone(), masked, settings)
