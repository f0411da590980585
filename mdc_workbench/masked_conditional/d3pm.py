"""D3PM with VQ-Diffusion's mask-and-replace transition (MC-Diffusion, Sec. "Discrete Diffusion Forward Process").

Pure tensor functions; the captioner glue lives in :mod:`mdc_workbench.masked_conditional.diffusion`.

States: K content states ``0..K-1`` (the caption tokens the model may write) and the absorbing ``[MASK]`` state K.
One forward step ``s -> t`` keeps a content token with probability ``alpha + beta``, turns it into each other
content token with probability ``beta``, and masks it with probability ``gamma``; ``[MASK]`` stays ``[MASK]``::

    Q[i, i] = alpha + beta,  Q[i, j] = beta (j != i, j < K),  Q[i, K] = gamma,  Q[K, K] = 1,
    K * beta = 1 - alpha - gamma.

The product of such matrices has the same form, so the cumulative transition ``Qbar_t = Q_1 ... Q_t`` is given by
its own ``alpha_bar_t = prod_s alpha_s`` and ``1 - gamma_bar_t = prod_s (1 - gamma_s)``. The schedule fixes the
cumulative values linearly in t (VQ-Diffusion's ``alpha_schedule``): ``alpha_bar`` from 0.99999 at t = 1 to
0.000009 at t = T and ``gamma_bar`` from 0.000009 to 0.99999, with ``alpha_bar_0 = 1, gamma_bar_0 = 0``.

Posterior (paper Eq. 4, VQ-Diffusion's ``q_posterior``): with a distribution p0 over x_0,
``q(x_s | x_t, p0) = sum_{x0} q(x_s | x_t, x0) p0(x0)`` and ``q(x_s | x_t, x0) = Q_{s->t}[x_s, x_t] Qbar_s[x0, x_s]
/ Qbar_t[x0, x_t]``, computed here in O(K) per token from the closed form (no (K+1)^2 matrix). The network's
reverse step is this posterior with p0 = p_theta(x_0 | x_t, y).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

EPS = 1e-30  # floor inside logs of probabilities that can be exactly 0


@dataclass(frozen=True)
class MaskReplaceSchedule:
    """Cumulative keep/mask probabilities for t = 0..T (float64 tables, index = time step)."""

    alpha_bar: torch.Tensor  # (T+1,) probability that x_t is still x_0 through the "keep" branch
    gamma_bar: torch.Tensor  # (T+1,) probability that x_t is [MASK]

    @property
    def steps(self) -> int:
        return len(self.alpha_bar) - 1


def mask_replace_schedule(steps: int = 100, alpha_bar_1: float = 0.99999, alpha_bar_T: float = 0.000009,
                          gamma_bar_1: float = 0.000009, gamma_bar_T: float = 0.99999) -> MaskReplaceSchedule:
    """VQ-Diffusion's linear cumulative schedule with T = `steps` (the paper uses T = 100)."""
    if steps < 1:
        raise ValueError(f"the diffusion needs at least one step, got steps={steps}")
    if not (0 < alpha_bar_T <= alpha_bar_1 <= 1 and 0 <= gamma_bar_1 <= gamma_bar_T < 1
            and alpha_bar_1 + gamma_bar_1 <= 1 and alpha_bar_T + gamma_bar_T <= 1):
        raise ValueError("need 0 < alpha_bar_T <= alpha_bar_1 <= 1, 0 <= gamma_bar_1 <= gamma_bar_T < 1 and "
                         "alpha_bar + gamma_bar <= 1 at both ends")
    frac = torch.arange(steps, dtype=torch.float64) / max(steps - 1, 1)  # (T,) 0 .. 1
    alpha = alpha_bar_1 + frac * (alpha_bar_T - alpha_bar_1)
    gamma = gamma_bar_1 + frac * (gamma_bar_T - gamma_bar_1)
    one, zero = torch.ones(1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)
    return MaskReplaceSchedule(torch.cat([one, alpha]), torch.cat([zero, gamma]))


def _as_index(t: int | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(t, dtype=torch.long, device=like.device)


def cumulative_coefficients(sched: MaskReplaceSchedule, t: int | torch.Tensor, num_classes: int
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(alpha_bar_t, beta_bar_t, gamma_bar_t) of ``Qbar_t`` (x_0 -> x_t), float64, shaped like `t`."""
    t = _as_index(t, sched.alpha_bar)
    a, g = sched.alpha_bar[t], sched.gamma_bar[t]
    return a, (1 - a - g) / num_classes, g


def step_coefficients(sched: MaskReplaceSchedule, s: int | torch.Tensor, t: int | torch.Tensor, num_classes: int
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(alpha, beta, gamma) of the transition x_s -> x_t (s < t; s = t - 1 is the one-step ``Q_t``)."""
    s, t = _as_index(s, sched.alpha_bar), _as_index(t, sched.alpha_bar)
    a = sched.alpha_bar[t] / sched.alpha_bar[s]
    g = 1 - (1 - sched.gamma_bar[t]) / (1 - sched.gamma_bar[s])
    return a, (1 - a - g) / num_classes, g


def _matrix(alpha: float, beta: float, gamma: float, num_classes: int) -> torch.Tensor:
    K = num_classes
    q = torch.full((K + 1, K + 1), float(beta), dtype=torch.float64)
    q[:K, :K] += float(alpha) * torch.eye(K, dtype=torch.float64)
    q[:K, K] = float(gamma)
    q[K, :K] = 0.0
    q[K, K] = 1.0
    return q  # (K+1, K+1), row i = q(x_t | x_{t-1} = i)


def transition_matrix(sched: MaskReplaceSchedule, t: int, num_classes: int) -> torch.Tensor:
    """One-step ``Q_t`` (K+1, K+1); ``Q_t[i, j] = q(x_t = j | x_{t-1} = i)``. For tests and small K."""
    return _matrix(*step_coefficients(sched, t - 1, t, num_classes), num_classes)


def cumulative_matrix(sched: MaskReplaceSchedule, t: int, num_classes: int) -> torch.Tensor:
    """Closed-form ``Qbar_t = Q_1 Q_2 ... Q_t`` (K+1, K+1) (identity at t = 0)."""
    return _matrix(*cumulative_coefficients(sched, t, num_classes), num_classes)


def q_sample(x0: torch.Tensor, t: torch.Tensor, sched: MaskReplaceSchedule, num_classes: int,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw x_t ~ q(x_t | x_0) = x_0 Qbar_t for content states x0 (...) in [0, K) and times t (...) >= 0.

    Masked with probability gamma_bar_t, kept with alpha_bar_t, else a uniform content state (which may be
    x_0 itself: that is the ``beta_bar`` on the diagonal).
    """
    a, _, g = cumulative_coefficients(sched, t.to(sched.alpha_bar.device), num_classes)
    a, g = a.to(x0.device), g.to(x0.device)
    u = torch.rand(x0.shape, generator=generator, device=x0.device, dtype=torch.float64)
    uniform = torch.randint(0, num_classes, x0.shape, generator=generator, device=x0.device)
    out = torch.where(u < g + a, x0, uniform)
    return out.masked_fill(u < g, num_classes)


def q_posterior(x_t: torch.Tensor, p0: torch.Tensor, t: torch.Tensor, s: torch.Tensor,
                sched: MaskReplaceSchedule) -> torch.Tensor:
    """``sum_{x0} q(x_s | x_t, x0) p0(x0)`` (..., K+1) for states x_t (...) in [0, K], p0 (..., K), 0 <= s < t.

    A one-hot p0 gives the true posterior q(x_s | x_t, x_0); p0 = p_theta(x_0 | x_t) gives the model's reverse
    step p_theta(x_s | x_t). Computed in p0's dtype from the float64 schedule.
    """
    K = p0.shape[-1]
    dt = p0.dtype

    def coef(values: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        return [v.to(device=p0.device, dtype=dt)[..., None] for v in values]  # (..., 1) each

    t, s = t.to(sched.alpha_bar.device), s.to(sched.alpha_bar.device)
    A, Bs, G = coef(cumulative_coefficients(sched, s, K))  # x_0 -> x_s
    At, Bt, Gt = coef(cumulative_coefficients(sched, t, K))  # x_0 -> x_t
    a, b, g = coef(step_coefficients(sched, s, t, K))  # x_s -> x_t
    onehot = F.one_hot(x_t.clamp(max=K - 1), K).to(dt)  # (..., K)

    # x_t = content j: posterior over content k is (a [k=j] + b) * sum_x0 Qbar_s[x0,k] p0(x0) / Qbar_t[x0,j]
    w = p0 / (At * onehot + Bt).clamp_min(EPS)  # (..., K) p0(x0) / q(x_t = j | x0)
    u = A * w + Bs * w.sum(-1, keepdim=True)  # (..., K)
    content = torch.cat([(a * onehot + b) * u, torch.zeros_like(u[..., :1])], dim=-1)  # never back to [MASK]
    # x_t = [MASK]: q(x_t = M | x0) = gamma_bar_t for every x0
    masked = torch.cat([g * (A * p0 + Bs), G.expand_as(p0[..., :1])], dim=-1) / Gt.clamp_min(EPS)
    out = torch.where((x_t == K)[..., None], masked, content)
    return out / out.sum(-1, keepdim=True)


def vlb_terms(x0: torch.Tensor, x_t: torch.Tensor, logits: torch.Tensor, t: torch.Tensor,
              sched: MaskReplaceSchedule) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token VLB term L_{t-1} and the auxiliary x_0 cross-entropy, both (...,) in nats.

    x0 (...) true content states, x_t (...) noisy states, logits (..., K) of p_theta(x_0 | x_t, y), t (...) >= 1.
    ``L_{t-1} = KL(q(x_{t-1} | x_t, x_0) || p_theta(x_{t-1} | x_t))`` for t >= 2 and ``-log p_theta(x_0 | x_1)``
    for t = 1 (there the reverse step is p_theta(x_0 | x_1) itself, since Qbar_0 = I).
    """
    logp0 = logits.float().log_softmax(-1)  # (..., K)
    ce = -logp0.gather(-1, x0[..., None])[..., 0]  # (...,)
    K = logits.shape[-1]
    s = t - 1
    q = q_posterior(x_t, F.one_hot(x0, K).to(logp0.dtype), t, s, sched)  # (..., K+1)
    p = q_posterior(x_t, logp0.exp(), t, s, sched)
    kl = (q * (q.clamp_min(EPS).log() - p.clamp_min(EPS).log())).sum(-1)
    return torch.where(t == 1, ce, kl), ce


def prior_kl(x0: torch.Tensor, sched: MaskReplaceSchedule, num_classes: int) -> torch.Tensor:
    """KL(q(x_T | x_0) || p(x_T)) (...,) with the all-[MASK] prior the sampler starts from: -log gamma_bar_T."""
    return torch.full(x0.shape, -float(torch.log(sched.gamma_bar[-1])), device=x0.device)


def reverse_times(steps: int, stride: int = 1) -> list[tuple[int, int]]:
    """(t, s) pairs of the ancestral sampler from T to 0: T -> T-stride -> ... -> 0 (stride 1: all T steps)."""
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    ts = list(range(steps, 0, -stride)) + [0]
    return list(zip(ts[:-1], ts[1:], strict=True))


def sample_states(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One categorical draw per row of probs (..., S) -> (...,) long."""
    flat = probs.reshape(-1, probs.shape[-1]).float().clamp_min(0)
    return torch.multinomial(flat, 1, generator=generator).view(probs.shape[:-1])
