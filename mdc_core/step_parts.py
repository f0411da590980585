"""The parts the training step is made of (the step itself is ``Trainer.step`` in :mod:`mdc_core.train`),
each built so that the step never waits on the device: host-side batches, the loss step, fused AdamW, a sync-free
EMA, lazy non-finite checks, compilation.

On CUDA, the host queues kernels and runs ahead of the GPU until it needs a value the GPU has not computed yet:
``.item()``, ``float()``/``int()``/``bool()`` of a tensor, ``.tolist()``, ``.cpu()``, ``nonzero``, boolean-mask
indexing, or a blocking host-to-device copy. Each of those drains the queue (a host-device synchronisation), and the
GPU idles while the host catches up. :mod:`mdc_core.train` does none of them between logging steps:

- the captions are tokenized, trimmed, masked, checked and mapped to embedding and head rows on the host
  (:class:`HostBatches`, :func:`mdc_core.objectives.prepare_batch`) and copied without blocking;
- the loss, metrics and gradient norm stay on the device until a logging or checkpoint step reads them at once;
- a non-finite loss or gradient norm is noted on the device (:class:`NonFiniteWatch`) and raised at that next read,
  before anything is written (``train.nonfinite=skip`` has to decide every step, so it reads every step);
- :func:`ema_update` is :class:`torch.optim.swa_utils.AveragedModel`'s update without its blocking copy of the
  update count (and with integer buffers copied: averaging token-id tables rounds them to other ids);
- :func:`build_optimizer` takes PyTorch's fused AdamW kernel on CUDA (one kernel for all parameters); on the CPU
  the default implementation, so CPU runs keep their numbers to the bit.

``tests/test_step_parts.py`` counts the calls that would synchronise during a non-logging step for every objective.

:class:`LossStep` is one micro-batch's forward and loss as the trainer and ``mdc bench`` run it: host batch, bf16
autocast on CUDA, and ``train.compile``: forward + loss compile as one graph (the same test file checks it with
``torch._dynamo.explain``) and AOTAutograd compiles the backward with it; with ``train.static_shapes``
(:func:`mdc_core.objectives.prepare_batch`) the shapes repeat, so the step compiles once per caption-length
bucket and never recompiles after (tests/test_static_step.py counts dynamo's compiles), and
``compile="reduce-overhead"`` replays forward and backward as CUDA graphs on CUDA: a few launches per step
instead of hundreds, which is what sets the speed of a small model on a GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim.swa_utils import AveragedModel

from . import distributed as dist
from .config import ObjectiveConfig, TrainConfig
from .objectives import PreparedBatch, compute_loss, id_tables, loss_function, loss_terms, objective_spec, prepare_batch


@dataclass
class DeviceStep:
    """One optimizer step as the device holds it (nothing read yet)."""

    loss_sum: torch.Tensor  # this rank's sum over micro-batches of loss x loss terms (float64)
    denom: float | torch.Tensor  # the global count of loss terms (a device scalar under torchrun)
    metrics: dict[str, torch.Tensor]  # compute_loss's other metrics, mean over micro-batches, / world (float64)
    grad_norm: torch.Tensor  # global gradient norm before clipping


class StepSums:
    """A step's device values summed over its micro-batches as they come, nothing read: the loss x its loss terms,
    and the mean of every other metric; :meth:`done` makes the :class:`DeviceStep`."""

    def __init__(self, device: torch.device, micro_batches: int) -> None:
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.means: dict[str, torch.Tensor] = {}
        self.micro_batches = micro_batches

    def add(self, loss: torch.Tensor, metrics: dict[str, torch.Tensor], terms: int) -> None:
        self.loss_sum += loss.detach().double() * terms
        for k, v in metrics.items():
            if k != "loss":
                self.means[k] = self.means.get(k, 0) + v.detach().double() / self.micro_batches

    def done(self, denom: float | torch.Tensor, grad_norm: torch.Tensor, world: int) -> DeviceStep:
        return DeviceStep(self.loss_sum, denom, {k: v / world for k, v in sorted(self.means.items())}, grad_norm)


def global_terms(ctx: dist.DistContext, terms: int) -> float | torch.Tensor:
    """A step's loss terms summed over ranks, at least 1: a number in one process; under torchrun a device scalar,
    all-reduced without the host waiting for it."""
    if not ctx.distributed:
        return max(float(terms), 1.0)
    total = torch.full((), float(terms), dtype=torch.float64, device=ctx.device)
    return dist.all_reduce(ctx, total, "sum", "loss normalisation").clamp(min=1.0)


def agree_flags(ctx: dist.DistContext, stop: bool, due: bool) -> tuple[bool, bool]:
    """(stop, checkpoint due) of this rank; under torchrun, of any rank (the ranks must stop and save at the same
    step: one tiny all-reduce per step, which the host reads)."""
    if not ctx.distributed:
        return stop, due
    total = dist.all_reduce_named(ctx, {"stop": float(stop), "due": float(due)}, "stop/checkpoint flags")
    return total["stop"] > 0, total["due"] > 0


def build_optimizer(param_groups: list[dict[str, Any]], tcfg: TrainConfig, device: torch.device
                    ) -> torch.optim.Optimizer:
    """AdamW with the run's lr and betas: the fused kernel on CUDA (all parameters floating point on one device),
    the default implementation elsewhere."""
    params = [p for g in param_groups for p in g["params"]]
    fused = device.type == "cuda" and all(p.is_cuda and p.is_floating_point() for p in params)
    return torch.optim.AdamW(param_groups, lr=tcfg.lr, betas=tcfg.betas, **({"fused": True} if fused else {}))


@torch.no_grad()
def ema_update(ema: AveragedModel, model: torch.nn.Module, decay: float) -> None:
    """One EMA step of `ema` (``use_buffers=True``) towards `model`: the first copies, later ones move every
    floating-point parameter and buffer by ``1 - decay`` (``torch._foreach_lerp_``, as
    ``get_ema_multi_avg_fn``); integer buffers are copied. The update count lives on the CPU, so nothing waits."""
    first = int(ema.n_averaged) == 0  # a CPU tensor (AveragedModel's default): no device read
    pairs = list(zip([*ema.module.parameters(), *ema.module.buffers()], [*model.parameters(), *model.buffers()],
                     strict=True))
    groups: dict[tuple[torch.device, torch.dtype], tuple[list, list]] = {}
    for avg, cur in pairs:
        if first or not avg.is_floating_point():
            avg.copy_(cur)
        else:
            a, c = groups.setdefault((avg.device, avg.dtype), ([], []))
            a.append(avg)
            c.append(cur)
    for a, c in groups.values():
        torch._foreach_lerp_(a, c, 1.0 - decay)
    ema.n_averaged += 1


class StepClock:
    """The phases of the trainer's step, as the trainer marks them (``with clock.phase("read"): ...``). This clock
    does nothing, which is how the trainer runs; ``mdc bench step`` passes one that times each phase, waiting for
    the device at every boundary, and counts host synchronisations.

    A step is the phases from one ``read`` to the next: ``read`` (take the micro-batches with their tokens),
    ``prepare`` (masking seeds, :func:`~mdc_core.objectives.prepare_batch`, loss denominators, the copy of the
    prepared batch), ``forward_backward``, ``clip_optimizer`` (gradient clipping, AdamW, zero_grad, schedule),
    ``ema``, ``metrics_logging`` (the step's device values, the non-finite watch, the logging step's read and
    record) and ``checkpoint``."""

    PHASES = ("read", "prepare", "forward_backward", "clip_optimizer", "ema", "metrics_logging", "checkpoint")

    def watch(self, modules: Iterable[torch.nn.Module]) -> None:
        """Told once which modules (the model, its EMA copy) the step trains."""

    def phase(self, name: str) -> contextlib.AbstractContextManager:
        return _NO_PHASE


_NO_PHASE = contextlib.nullcontext()


class NonFiniteWatch:
    """The first step whose loss or gradient norm was not finite, its loss and norm, kept on the device."""

    def __init__(self, device: torch.device) -> None:
        self.first_step = torch.full((), -1, dtype=torch.long, device=device)
        self.loss = torch.zeros((), dtype=torch.float64, device=device)
        self.grad_norm = torch.zeros((), dtype=torch.float64, device=device)

    def note(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """Record step `step` if it is the first non-finite one (device ops only)."""
        first = (self.first_step < 0) & ~(torch.isfinite(loss) & torch.isfinite(grad_norm))
        self.first_step = torch.where(first, step, self.first_step)
        self.loss = torch.where(first, loss.double(), self.loss)
        self.grad_norm = torch.where(first, grad_norm.double(), self.grad_norm)

    def flag(self) -> torch.Tensor:
        """1.0 if some step was not finite, else 0.0 (a device scalar, to read with the step's other values)."""
        return (self.first_step >= 0).double()

    def describe(self) -> str:
        """What happened, for the error message (reads the device)."""
        return f"loss became {float(self.loss)} (grad norm {float(self.grad_norm)}) at step {int(self.first_step)}"


@dataclass
class ReadyBatch:
    """One micro-batch prepared on the host (:meth:`LossStep.prepare`) and on its way to the device."""

    tokens: torch.Tensor  # (B, L') on the device: the captions as the loss takes them
    prepared: PreparedBatch | None  # on the device; None for an objective that draws its noise in its own loss
    seed: int  # the micro-batch's masking seed
    gen_state: torch.Tensor | None  # the host generator after the preparation's draws (the loss's draws follow)
    terms: int  # what its loss is divided by (objectives.loss_terms), counted on the host from these masks


class HostBatches:
    """Prepares each micro-batch on the host and copies it to the device without blocking.

    Calling it with CPU tokens (B, L) and the micro-batch's seed gives a :class:`ReadyBatch`:
    :func:`~mdc_core.objectives.prepare_batch` with a CPU generator seeded by `seed` (the masks are drawn there,
    once) and CPU copies of the model's id tables (made once), and the batch's loss terms counted on the host
    before the copy (a per-masked-token objective's from those masks); nothing prepared for an objective that draws
    its noise on the device itself. :meth:`generator` gives the draws a loss makes on the device (a condition
    transform's): on the CPU the host generator where that batch's preparation left it, on an accelerator a device
    generator seeded alike.
    """

    def __init__(self, model: torch.nn.Module, cfg: ObjectiveConfig, device: torch.device, static: str = "off",
                 length_bucket: int = 8) -> None:
        self.cfg, self.device, self.spec = cfg, device, objective_spec(cfg.name)
        self.prepared = self.spec.prepared
        self.shapes = {"static": static, "length_bucket": length_bucket}
        self.tables = {k: None if v is None else v.detach().to("cpu", copy=True) for k, v in id_tables(model).items()}
        self.gen = torch.Generator()
        self.device_gen = self.gen if device.type == "cpu" else torch.Generator(device=device)

    def __call__(self, tokens: torch.Tensor, seed: int) -> ReadyBatch:
        self.gen.manual_seed(seed)
        if not self.prepared:
            return ReadyBatch(tokens.to(self.device, non_blocking=True), None, seed, self._state(),
                              loss_terms(self.spec, tokens, self.cfg.normalization))
        prepared = prepare_batch(tokens, self.cfg, self.gen, **self.tables, **self.shapes)
        mask = prepared.loss_mask if self.spec.per_masked_token else None  # these draws: counted once, here
        terms = loss_terms(self.spec, tokens, self.cfg.normalization, mask=mask)
        prepared = prepared.to(self.device, non_blocking=True)
        return ReadyBatch(prepared.tokens, prepared, seed, self._state(), terms)

    def _state(self) -> torch.Tensor | None:
        return self.gen.get_state() if self.device_gen is self.gen else None

    def generator(self, batch: ReadyBatch) -> torch.Generator:
        """The generator of the draws `batch`'s loss makes on the device, set where its preparation left off."""
        if batch.gen_state is not None:
            self.gen.set_state(batch.gen_state)
        else:
            self.device_gen.manual_seed(batch.seed)
        return self.device_gen


class Objective(torch.nn.Module):
    """:func:`~mdc_core.objectives.compute_loss` as a module, so that DistributedDataParallel's forward and
    ``nn.Module.compile`` see every micro-batch; the model itself stays unwrapped (its state-dict keys, the
    checkpoints and the EMA copy are unchanged)."""

    def __init__(self, model: torch.nn.Module, cfg: ObjectiveConfig):
        super().__init__()
        self.model, self.cfg = model, cfg
        # the objective's loss function, resolved once: resolving it imports its module, which would break a graph
        self.loss_fn = loss_function(objective_spec(cfg.name))

    def forward(self, images: torch.Tensor, tokens: torch.Tensor, generator: torch.Generator,
                prepared: PreparedBatch | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if prepared is None:
            out = compute_loss(self.model, images, tokens, self.cfg, generator)
        else:  # compute_loss's prepared path, with the function in hand
            out = self.loss_fn(self.model, images, tokens, self.cfg, generator, prepared=prepared)
        return out.loss, out.metrics


def uses_cudagraphs(mode: str | None, device: torch.device) -> bool:
    """Whether torch.compile's `mode` replays the step as CUDA graphs on `device` (never on the CPU)."""
    return device.type == "cuda" and mode in ("reduce-overhead", "max-autotune")


class LossStep:
    """Forward and loss of one micro-batch exactly as the trainer runs it (``mdc bench`` times the same object).

    ``step(images, tokens, seed)`` is :meth:`prepare` (the CPU `tokens` (B, L) on the host: :class:`HostBatches`,
    with the run's static shapes) then :meth:`forward` (:class:`Objective` under bf16 autocast when `bf16`), and
    returns (loss, metrics) on the device; the caller runs the backward. With a compile mode (``train.compile``,
    "auto" resolved for the device by :meth:`~mdc_core.config.TrainConfig.compile_mode`) the :class:`Objective` is
    compiled in place
    (``dynamic=False`` with static shapes: one graph per shape, never a dynamic one), and with CUDA graphs each
    call marks a new step for cudagraph trees (the loss and metrics of the last call stay readable until the next).
    `module` is what the trainer wraps in DistributedDataParallel. `backend`: torch.compile's (tests use
    ``aot_eager``, which traces forward and backward like inductor without generating code).
    """

    def __init__(self, model: torch.nn.Module, cfg: ObjectiveConfig, tcfg: TrainConfig, device: torch.device,
                 bf16: bool, backend: str = "inductor", distributed: bool = False) -> None:
        prepared = objective_spec(cfg.name).prepared  # an objective that draws its own noise is not compiled by auto
        self.device, self.bf16 = device, bf16
        self.mode = tcfg.compile_mode(device.type, distributed) if prepared or tcfg.compile != "auto" else None
        if uses_cudagraphs(self.mode, device) and tcfg.grad_accum > 1:  # pytorch/pytorch#169545: silently wrong grads
            raise ValueError(f"train.compile={self.mode} replays the backward as a CUDA graph, and a second "
                             "micro-batch would overwrite the first one's gradients (CUDA graph trees hand .grad "
                             "their output buffers); use train.grad_accum=1 or train.compile=true")
        static = tcfg.static_mode(self.mode) if prepared else "off"
        if static != "off" and tcfg.static_shapes == "auto" and getattr(getattr(model, "cfg", None), "attend_to_pads",
                                                                     False):
            static = "off"  # padding would be visible to such a model (explicit static shapes are refused by validate)
        self.static = static
        if device.type == "cuda":  # one image shape per run: let cuDNN pick its fastest kernels for it once
            torch.backends.cudnn.benchmark = True
        self.batches = HostBatches(model, cfg, device, static, tcfg.length_bucket)
        self.module: torch.nn.Module = Objective(model, cfg)
        if self.mode is not None:
            options = {"mode": self.mode} if backend == "inductor" else {}  # modes are inductor's
            self.module.compile(backend=backend, dynamic=False if static != "off" else None, **options)
        self.cudagraphs = uses_cudagraphs(self.mode, device)
        # static_shapes=padded gives up to objectives.TERM_BUCKETS term counts per caption-length bucket: compiled
        # with that one dimension symbolic they share one graph (CUDA graphs still record one replay per count)
        self.terms_dynamic = self.mode is not None and static == "padded"

    def __call__(self, images: torch.Tensor, tokens: torch.Tensor, seed: int
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return self.forward(images, self.prepare(tokens, seed))

    def prepare(self, tokens: torch.Tensor, seed: int) -> ReadyBatch:
        """The host part: CPU `tokens` (B, L) prepared with masking seed `seed` and copied to the device."""
        return self.batches(tokens, seed)

    def forward(self, images: torch.Tensor, batch: ReadyBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(loss, metrics) of images (B, 3, H, W) and a batch :meth:`prepare` made."""
        prepared = batch.prepared
        if self.terms_dynamic and prepared is not None:  # one graph for all of padded's term counts
            for x in (prepared.index, prepared.owner, prepared.targets, prepared.valid):
                torch._dynamo.mark_dynamic(x, 0)
        if self.cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        generator = self.batches.generator(batch)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            return self.module(images.to(self.device, non_blocking=True), batch.tokens, generator, prepared)
