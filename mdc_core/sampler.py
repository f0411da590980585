"""Confidence-ordered unmasking sampler (paper Eq. 6) with its full trajectory.

Start from the canvas ``<sot> [MASK]*N' <eot>``. At every step the decoder predicts all positions; a masked
position's confidence is its top probability over the allowed tokens (``<sot>``/``<eot>`` excluded, ``[MASK]`` has no
output row, so the caption is always N' real tokens), and the k most confident masked positions are revealed with
their argmax tokens (k = 1 in the paper: N' steps). Revealed tokens never change. Each option of
:class:`~mdc_core.config.SamplerConfig` (k, temperature and top-k, Fast-dLLM's threshold) says there what it changes.

Infilling (``prompt``, read from text by :func:`~mdc_core.tokenizer.parse_prompt`): the canvas may start with some
positions fixed (``[MASK]`` at the slots); fixed tokens are never changed, revealed or remasked, nor in the record.

Revisable tokens (opt-in, ``remask_threshold`` > 0 and ``remask_steps`` > 0): ReMDM-conf's confidence score in a
ReMDM-loop phase (Wang et al., 2025, arXiv:2503.00307), made deterministic as Mask-Predict (Ghazvininejad et al.,
2019) by remasking the least confident tokens. Once a caption has no mask left, each extra step masks again its k
least confident revealed tokens among those revealed with confidence below ``remask_threshold`` and predicts them
anew; a token that comes back unchanged is not picked again until another token of its caption changes. A caption
stops when nothing qualifies or after ``remask_steps`` extra steps. With the defaults (0, 0) the sampler is Eq. 6.

Sampling a batch gives exactly the trajectories of sampling its images one by one (greedy; with temperature the
batch shares the random draws). The image cross-attention keys/values are computed once per batch, exactly.

**Precision** (``auto`` | ``fp32`` | ``bf16``): ``auto`` is bf16 autocast on a CUDA device that supports it, fp32
elsewhere (a CPU runs bf16 matmuls hundreds of times slower); confidences, softmaxes and likelihoods are fp32.
``precision=None`` (sampling and scoring) means the current default: ``auto``, or what a caller set for a block with
:func:`default_inference_precision` (how ``mdc ... --precision`` reaches the eval verbs).

Reading order: :func:`sample` is the loop of Eq. 6 (remask, predict, propose, reveal, record); each decision is a
small object chosen once from the settings: the proposed token (:func:`greedy` or :class:`TemperatureDraw`), which
proposals to reveal (:class:`ConfidenceReveal`), which revealed tokens to revise (:class:`NoRemasking` or
:class:`Remasking`); :class:`Recorder` keeps the trajectory (what the app, the notebooks and the GIFs replay); the
precision follows.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from .config import PRECISIONS, SamplerConfig
from .model import Captioner
from .tokenizer import EOT_ID, MASK_ID, SOT_ID


@dataclass
class SampleOutput:
    """Batched result of :func:`sample`. S = number of steps the batch took (rows may finish earlier: after its
    last step a row has nothing left to do, see :attr:`row_steps`), N = caption length N', Ly = decoder layers,
    h = heads, M = image tokens."""

    tokens: torch.Tensor  # (B, N) final caption ids
    reveal_step: torch.Tensor  # (B, N) step at which each position was (last) revealed, -1 for fixed positions
    reveal_confidence: torch.Tensor  # (B, N) its confidence when (last) revealed, 0 for fixed positions
    step_top_token: torch.Tensor  # (S, B, N) per step, each still-masked position's top-1 token (0 elsewhere)
    step_top_confidence: torch.Tensor  # (S, B, N) and its confidence (0 elsewhere)
    step_masked: torch.Tensor  # (S, B, N) bool: position masked at the start of the step (after any remasking)
    settings: dict[str, Any] = field(default_factory=dict)
    fixed: torch.Tensor | None = None  # (B, N) bool: positions fixed by the prompt (never sampled)
    step_revealed: torch.Tensor | None = None  # (S, B, N) bool: revealed at the step
    step_token: torch.Tensor | None = None  # (S, B, N) the token revealed there (0 elsewhere)
    step_confidence: torch.Tensor | None = None  # (S, B, N) its confidence (0 elsewhere)
    step_remasked: torch.Tensor | None = None  # (S, B, N) bool: masked again at the start of the step
    step_attention: torch.Tensor | None = None  # (S, B, N, Ly, h, M) cross-attention of the tokens revealed there

    @property
    def num_steps(self) -> int:
        return self.step_masked.shape[0]

    @property
    def row_steps(self) -> torch.Tensor:
        """(B,) steps each caption took (its last reveal step + 1; 0 when the prompt fixed every position)."""
        if self.step_revealed is None or self.num_steps == 0:
            return self.reveal_step.max(dim=1).values + 1
        s = torch.arange(1, self.num_steps + 1, device=self.step_revealed.device)[:, None]  # (S, 1)
        return (self.step_revealed.any(dim=2) * s).amax(dim=0)


def canvas(batch: int, length: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(B, N'+2) fully masked canvas ``<sot> [MASK]*N' <eot>``."""
    x = torch.full((batch, length + 2), MASK_ID, dtype=torch.long, device=device)
    x[:, 0], x[:, -1] = SOT_ID, EOT_ID
    return x


def allowed_rows(model: Captioner) -> torch.Tensor:
    """(V_out,) bool: head rows the canvas may take (everything but ``<sot>``/``<eot>``)."""
    ids = model.output_ids
    return (ids != SOT_ID) & (ids != EOT_ID)


def _prompt_canvas(prompt: torch.Tensor, fixed: torch.Tensor | None, batch: int, model: Any,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The starting canvas (B, N+2) and fixed mask (B, N) of a prompt (N,) or (B, N) of caption ids."""
    prompt = prompt.to(device).long()
    prompt = prompt[None].expand(batch, -1) if prompt.ndim == 1 else prompt
    if prompt.ndim != 2 or prompt.shape[0] != batch or prompt.shape[1] == 0:
        raise ValueError(f"prompt of shape {tuple(prompt.shape)} does not fit {batch} images: give (N,) or (B, N)")
    fixed = (prompt != MASK_ID) if fixed is None else fixed.to(device).bool().expand_as(prompt)
    if bool((fixed & (prompt == MASK_ID)).any()):
        raise ValueError("a fixed prompt position holds [MASK]; fixed positions need real tokens")
    if bool((fixed & ((prompt == SOT_ID) | (prompt == EOT_ID))).any()):
        raise ValueError("a prompt may not fix <sot> or <eot> inside the caption")
    x = canvas(batch, prompt.shape[1], device)
    x[:, 1:-1] = torch.where(fixed, prompt, MASK_ID)
    if bool(fixed.any()) and hasattr(model, "embedding_rows"):
        model.embedding_rows(x)  # ValueError naming fixed words a corpus-restricted model cannot represent
    return x, fixed


@torch.no_grad()
def sample(model: Captioner, image_tokens: torch.Tensor, cfg: SamplerConfig, *, cache: Any = None,
           prompt: torch.Tensor | None = None, fixed: torch.Tensor | None = None,
           attention: bool = False, precision: str | None = None) -> SampleOutput:
    """Generate captions of ``cfg.length`` tokens for image_tokens (B, M, D) by confidence unmasking.

    Args:
        cache: the images' :meth:`Captioner.image_cache`, when the caller already has it (e.g. for several N').
        prompt: infilling: caption ids (N,) for every image or (B, N) per image, ``[MASK]`` at the slots to
            fill; N replaces ``cfg.length``. Every other position is fixed (never changed).
        fixed: (N,) or (B, N) bool, the fixed positions of `prompt` (default: its non-``[MASK]`` positions);
            positions not fixed are masked whatever `prompt` holds there.
        attention: also return the cross-attention weights of every revealed token (``step_attention``).
        precision: ``auto``, ``fp32`` or ``bf16``; None: the current default (module docstring, "Precision")."""
    x, fixed = _start(model, image_tokens, cfg, prompt, fixed)  # (B, N+2) canvas, (B, N) fixed positions
    B, N, device = fixed.shape[0], fixed.shape[1], image_tokens.device
    free = int((~fixed).sum(dim=1).max())  # most slots any row fills
    max_steps = math.ceil(free / cfg.tokens_per_step) + (cfg.remask_steps if cfg.remasking else 0)
    autocast = inference_autocast(precision, device)  # around each forward call
    if cache is None:
        with autocast:
            cache = model.image_cache(image_tokens)  # cross-attention keys/values, once for all steps
    choose = (TemperatureDraw(cfg.temperature, cfg.top_k, torch.Generator(device=device).manual_seed(cfg.seed))
              if cfg.temperature > 0 else greedy)  # the token proposed at each masked position: a draw or the argmax
    reveal_rule = ConfidenceReveal(cfg.tokens_per_step, cfg.threshold)  # which proposals to place (Eq. 6)
    remask = Remasking(cfg, fixed) if cfg.remasking else NoRemasking(fixed)  # which revealed tokens to revise
    record = Recorder(max_steps, B, N, device)
    steps = max_steps
    for s in range(max_steps):
        again = remask.apply(x)  # (B, N) revealed tokens masked again in x (none unless remasking is on)
        masked = x[:, 1:-1] == MASK_ID  # (B, N)
        if not bool(masked.any()):  # every row finished early
            steps = s
            break
        select = F.pad(masked, (1, 1))  # (B, N+2): the output head runs at the n masked positions only
        att: list[torch.Tensor] | None = [] if attention else None  # per layer (n, h, M) cross-attention weights
        with autocast:  # `attention=` only when asked, so that any model with a ``decode`` samples
            logits = model.decode(x, None, cache=cache, select=select, **({} if att is None else {"attention": att}))
        logits = logits.float().masked_fill(~allowed_rows(model), float("-inf"))
        probs = logits.softmax(dim=-1)
        conf, best = probs.max(dim=-1)  # (n,) Eq. 6: a position's confidence is its top-1 probability
        cand, cand_conf = choose(logits, probs, best, conf)  # (n,) the proposed rows and their probabilities
        conf, best, cand, cand_conf = (torch.zeros(B, N, dtype=v.dtype, device=device).masked_scatter(masked, v)
                                       for v in (conf, best, cand, cand_conf))  # (B, N), 0 where not masked
        reveal = reveal_rule(cand_conf, masked)  # (B, N)
        new = model.output_ids[cand]  # (B, N) token ids
        x[:, 1:-1] = torch.where(reveal, new, x[:, 1:-1])
        remask.update(reveal, again, new, cand_conf)
        record.step(s, masked, again, model.output_ids[best], conf, reveal, new, cand_conf, att)
    settings = {**dataclasses.asdict(cfg), "length": N, "steps": steps}  # every option, N' as sampled
    if attention:
        settings["attention_prefix_tokens"] = int(getattr(getattr(model, "encoder", None), "num_prefix_tokens", 0))
    return record.output(x[:, 1:-1].clone(), fixed, steps, settings)


def _start(model: Captioner, image_tokens: torch.Tensor, cfg: SamplerConfig, prompt: torch.Tensor | None,
           fixed: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The starting canvas (B, N+2) and its fixed positions (B, N), after checking the settings and the model."""
    cfg.validate()
    if model.causal:
        raise ValueError("this model is autoregressive (ARC); unmasking sampling needs a bidirectional model")
    B, device = image_tokens.shape[0], image_tokens.device
    if prompt is None:
        x, fixed = canvas(B, cfg.length, device), torch.zeros(B, cfg.length, dtype=torch.bool, device=device)
    else:
        x, fixed = _prompt_canvas(prompt, fixed, B, model, device)
    if x.shape[1] > model.cfg.context_length:
        raise ValueError(f"caption length {x.shape[1] - 2} exceeds the model's context "
                         f"({model.cfg.context_length - 2} tokens)")
    return x, fixed


# ----------------------------------------------------------------------------------------------------------
# the decisions of a step: the proposed token, which proposals to reveal, which revealed tokens to revise


def greedy(logits: torch.Tensor, probs: torch.Tensor, best: torch.Tensor,
           conf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Propose the most probable row, with its probability (paper Eq. 6): (n,), (n,)."""
    return best, conf


@dataclass
class TemperatureDraw:
    """Propose a row drawn from softmax(logits / temperature), among the top_k when top_k > 0; its confidence is
    its untempered probability. One generator for the whole call, so a batch shares its draws."""

    temperature: float
    top_k: int
    generator: torch.Generator

    def __call__(self, logits: torch.Tensor, probs: torch.Tensor, best: torch.Tensor,
                 conf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scaled = logits / self.temperature  # (n, V)
        if self.top_k > 0:
            kth = scaled.topk(min(self.top_k, scaled.shape[-1]), dim=-1).values[..., -1:]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        flat = scaled.softmax(dim=-1).reshape(-1, scaled.shape[-1])
        cand = torch.multinomial(flat, 1, generator=self.generator).view(logits.shape[:-1])  # (n,)
        return cand, probs.gather(-1, cand[..., None])[..., 0]


@dataclass
class ConfidenceReveal:
    """Reveal the k most confident masked positions of each row (fewer if fewer are masked), plus, with
    threshold > 0, every masked position whose confidence is >= threshold (Fast-dLLM's parallel decoding)."""

    k: int
    threshold: float = 0.0

    def __call__(self, conf: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        """conf, masked: (B, N) -> (B, N) bool."""
        score = conf.masked_fill(~masked, float("-inf"))
        top = score.topk(min(self.k, score.shape[1]), dim=-1).indices  # (B, k) most confident first
        reveal = torch.zeros_like(masked).scatter_(1, top, True) & masked
        if self.threshold > 0:
            reveal |= masked & (conf >= self.threshold)
        return reveal


class NoRemasking:
    """Revealed tokens never change (the paper's sampler): the canvas is left as it is."""

    def __init__(self, fixed: torch.Tensor) -> None:
        self.none = torch.zeros_like(fixed)  # (B, N) bool

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        return self.none

    def update(self, reveal: torch.Tensor, again: torch.Tensor, new: torch.Tensor, conf: torch.Tensor) -> None:
        pass


class Remasking:
    """Revisable tokens (see the module docstring): per row, once nothing is masked, mask again the k least
    confident revealed tokens below the threshold, for at most ``remask_steps`` extra steps."""

    def __init__(self, cfg: SamplerConfig, fixed: torch.Tensor) -> None:
        self.threshold, self.budget, self.k = cfg.remask_threshold, cfg.remask_steps, cfg.tokens_per_step
        self.fixed = fixed  # (B, N)
        self.before = torch.zeros(fixed.shape, dtype=torch.long, device=fixed.device)  # (B, N) tokens before apply
        self.used = torch.zeros(fixed.shape[0], dtype=torch.long, device=fixed.device)  # (B,) extra steps taken
        self.checked = torch.zeros_like(fixed)  # (B, N) re-predicted from the present context, came back unchanged
        self.conf = torch.zeros(fixed.shape, device=fixed.device)  # (B, N) each token's confidence when revealed

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """Mask again in canvas x (B, N+2) the tokens :meth:`pick` chooses; returns them, (B, N) bool."""
        self.before = x[:, 1:-1].clone()
        again = self.pick(self.before == MASK_ID)
        x[:, 1:-1] = self.before.masked_fill(again, MASK_ID)
        return again

    def pick(self, masked: torch.Tensor) -> torch.Tensor:
        """(B, N) bool: the tokens to mask again this step, in rows that have no mask left and budget to spend."""
        rows = ~masked.any(dim=1) & (self.used < self.budget)  # (B,)
        cand = rows[:, None] & ~self.fixed & ~masked & (self.conf < self.threshold) & ~self.checked  # (B, N)
        score = self.conf.masked_fill(~cand, float("inf"))
        low = (-score).topk(min(self.k, score.shape[1]), dim=-1).indices  # (B, k) least confident first
        again = torch.zeros_like(cand).scatter_(1, low, True) & cand
        self.used += again.any(dim=1).long()
        return again

    def update(self, reveal: torch.Tensor, again: torch.Tensor, new: torch.Tensor, conf: torch.Tensor) -> None:
        """After a step (all (B, N); `conf`: the proposals' confidences): re-predicted tokens are checked against
        the tokens before :meth:`apply`; in a row where one of them changed, the context of the others changed,
        so they may be revised again."""
        redone = again & reveal
        changed = (redone & (new != self.before)).any(dim=1, keepdim=True)  # (B, 1)
        self.checked = (self.checked & ~changed) | redone
        self.conf = torch.where(reveal, conf, self.conf)


# -- the record of what each step did, apart from the decisions --------------------------------------------------------


class Recorder:
    """Fills the per-step tensors of :class:`SampleOutput` (at most S steps, B rows, N positions)."""

    def __init__(self, steps: int, batch: int, length: int, device: torch.device | str) -> None:
        shape = (steps, batch, length)
        self.reveal_step = torch.full((batch, length), -1, dtype=torch.long, device=device)
        self.reveal_confidence = torch.zeros(batch, length, device=device)
        self.top_token = torch.zeros(shape, dtype=torch.long, device=device)
        self.token = torch.zeros(shape, dtype=torch.long, device=device)
        self.top_confidence, self.confidence = torch.zeros(shape, device=device), torch.zeros(shape, device=device)
        self.masked, self.revealed, self.remasked = (torch.zeros(shape, dtype=torch.bool, device=device)
                                                     for _ in range(3))
        self.attention: list[torch.Tensor] = []

    def step(self, s: int, masked: torch.Tensor, again: torch.Tensor, top: torch.Tensor, top_conf: torch.Tensor,
             reveal: torch.Tensor, new: torch.Tensor, conf: torch.Tensor, att: list[torch.Tensor] | None) -> None:
        """Step s (all (B, N)): the masked positions with their top guess and its confidence, the positions
        masked again, the reveals with their tokens and confidences, and with `att` the reveals' attention."""
        self.masked[s], self.remasked[s] = masked, again
        self.top_token[s], self.top_confidence[s] = torch.where(masked, top, 0), top_conf
        self.revealed[s], self.token[s] = reveal, torch.where(reveal, new, 0)
        self.confidence[s] = torch.where(reveal, conf, 0)
        self.reveal_step[reveal] = s
        self.reveal_confidence[reveal] = conf[reveal]
        if att is not None:
            grid = torch.stack(att, dim=1).float()  # (n, Ly, h, M) for the masked positions, in row-major order
            full = grid.new_zeros(*masked.shape, *grid.shape[1:]).masked_scatter_(masked[..., None, None, None], grid)
            self.attention.append(full * reveal[..., None, None, None])  # (B, N, Ly, h, M), revealed positions only

    def output(self, tokens: torch.Tensor, fixed: torch.Tensor, steps: int, settings: dict[str, Any]) -> SampleOutput:
        return SampleOutput(
            tokens=tokens, reveal_step=self.reveal_step, reveal_confidence=self.reveal_confidence,
            step_top_token=self.top_token[:steps], step_top_confidence=self.top_confidence[:steps],
            step_masked=self.masked[:steps], settings=settings, fixed=fixed, step_revealed=self.revealed[:steps],
            step_token=self.token[:steps], step_confidence=self.confidence[:steps],
            step_remasked=self.remasked[:steps],
            step_attention=torch.stack(self.attention) if self.attention else None)


# -- precision -------------------------------------------------------------------------------------------------------

_DEFAULT: contextvars.ContextVar[str] = contextvars.ContextVar("mdc_inference_precision", default="auto")


def check_precision(precision: str) -> str:
    """`precision` if it is one of :data:`~mdc_core.config.PRECISIONS`; ValueError naming the choices otherwise."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    return precision


def bf16_enabled(precision: str, device: torch.device | str) -> bool:
    """Whether `precision` (``train.precision`` or inference's) means bf16 autocast on `device`. ``auto``: on a CUDA
    GPU with bf16 in hardware (Ampere and newer); fp32 on the CPU (bf16 matmul there is ~250x slower) and on older
    GPUs, where torch only emulates bf16."""
    device = torch.device(device)
    if check_precision(precision) == "auto":
        return device.type == "cuda" and torch.cuda.is_available() and \
            torch.cuda.is_bf16_supported(including_emulation=False)
    return precision == "bf16"


@contextlib.contextmanager
def default_inference_precision(precision: str) -> Iterator[None]:
    """Within the block, sampling and scoring called with ``precision=None`` use `precision`."""
    token = _DEFAULT.set(check_precision(precision))
    try:
        yield
    finally:
        _DEFAULT.reset(token)


def inference_precision(precision: str | None = None) -> str:
    """`precision`, or the current default when None (see :func:`default_inference_precision`)."""
    return _DEFAULT.get() if precision is None else check_precision(precision)


def inference_autocast(precision: str | None, device: torch.device | str) -> torch.autocast:
    """The autocast context of inference in `precision` (None: the current default) on `device`. For fp32 it is
    a disabled autocast, so that fp32 also holds inside a caller's bf16 region."""
    device = torch.device(device)
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16_enabled(inference_precision(precision),
                                                                                  device))
