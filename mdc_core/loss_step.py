"""One micro-batch's forward and loss exactly as the trainer's step runs it (``mdc bench`` times the same object).

:class:`LossStep` is :meth:`~LossStep.prepare` on the host, then :meth:`~LossStep.forward` on the device:

* **Prepared on the host.** :class:`HostBatches` trims, masks, checks and maps the captions to embedding and head
  rows (:func:`mdc_core.objectives.prepare_batch`, masks drawn from the micro-batch's seed), counts the loss terms
  from those masks (:attr:`ReadyBatch.terms`) and copies the batch without blocking, so the step never waits.
* **Compiled.** With ``train.compile`` the :class:`Objective` (:func:`~mdc_core.objectives.compute_loss` as a
  module) compiles forward + loss as one graph and AOTAutograd the backward with it; with ``train.static_shapes``
  the step compiles once per caption-length bucket and never after, and ``"reduce-overhead"`` replays it as CUDA
  graphs. ``train.compile_step`` (:class:`WholeStep`) adds clipping, AdamW and the EMA to the compiled region.
* **bf16 autocast** on a GPU with bf16 by default (:func:`mdc_core.sampler.bf16_enabled`), fp32 on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.optim.swa_utils import AveragedModel

from .config import ObjectiveConfig, TrainConfig
from .objectives import (
    PreparedBatch,
    compute_loss,
    id_tables,
    loss_function,
    loss_terms,
    objective_spec,
    prepare_batch,
)


@dataclass
class ReadyBatch:
    """One micro-batch prepared on the host (:meth:`LossStep.prepare`) and on its way to the device."""

    tokens: torch.Tensor  # (B, L') on the device: the captions as the loss takes them
    prepared: PreparedBatch | None  # on the device; None for an objective that draws its noise in its own loss
    seed: int  # the micro-batch's masking seed
    gen_state: torch.Tensor | None  # the host generator after the preparation's draws (the loss's draws follow)
    terms: int  # what its loss is divided by (objectives.loss_terms), counted on the host from these masks


class HostBatches:
    """Prepares each micro-batch on the host and copies it to the device without blocking: called with CPU tokens
    (B, L) and the micro-batch's seed, it runs :func:`~mdc_core.objectives.prepare_batch` with a CPU generator
    seeded by `seed` (the masks are drawn there, once) and CPU copies of the model's id tables, and counts the loss
    terms from those masks before the copy (a :class:`ReadyBatch`); an objective that draws its noise on the device
    gets nothing prepared. :meth:`generator` gives the draws a loss makes on the device (a condition transform's):
    on the CPU the host generator where the batch's preparation left it, on an accelerator a device one seeded alike."""

    def __init__(self, model: torch.nn.Module, cfg: ObjectiveConfig, device: torch.device, static: str = "off",
                 length_bucket: int = 8) -> None:
        self.cfg, self.device, self.spec = cfg, device, objective_spec(cfg.name)
        self.shapes = {"static": static, "length_bucket": length_bucket}
        self.tables = {k: None if v is None else v.detach().to("cpu", copy=True) for k, v in id_tables(model).items()}
        self.gen = torch.Generator()
        self.device_gen = self.gen if device.type == "cpu" else torch.Generator(device=device)

    def __call__(self, tokens: torch.Tensor, seed: int) -> ReadyBatch:
        self.gen.manual_seed(seed)
        if not self.spec.prepared:
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


def compile_mode(tcfg: TrainConfig, device_type: str = "cpu", distributed: bool = False) -> str | None:
    """torch.compile's mode for ``train.compile`` on a `device_type` device, or None when the step runs eagerly.
    "auto" is "reduce-overhead" (CUDA graphs) for one CUDA process with grad_accum 1, where it measured 2.3x the
    eager ViT-B/32 step on an H200 (benchmarks/README.md), and off elsewhere (on the CPU compiling does not pay,
    CUDA graphs cannot accumulate gradients, DDP is not measured with them); "default" for off with compile_step."""
    if tcfg.compile == "auto":
        single = device_type == "cuda" and not distributed and tcfg.grad_accum == 1
        return "reduce-overhead" if single else "default" if tcfg.compile_step else None
    return "default" if tcfg.compile is True or (tcfg.compile_step and not tcfg.compile) else tcfg.compile or None


def static_mode(tcfg: TrainConfig, mode: str | None) -> str:
    """``train.static_shapes`` with "auto" resolved: padded when the step compiles (`mode`), else off."""
    if tcfg.static_shapes != "auto":
        return tcfg.static_shapes
    return "off" if mode is None else "padded"


class LossStep:
    """``step(images, tokens, seed)`` is :meth:`prepare` (the CPU `tokens` (B, L) on the host: :class:`HostBatches`,
    with the run's static shapes) then :meth:`forward` (:class:`Objective` under bf16 autocast when `bf16`), and
    returns (loss, metrics) on the device; the caller runs the backward. With a compile mode (:func:`compile_mode`)
    the :class:`Objective` is compiled in place (``dynamic=False`` with static shapes: one graph per shape), and
    with CUDA graphs each call marks a new step for cudagraph trees (the last call's loss and metrics stay readable).
    `module` is what the trainer wraps in DistributedDataParallel. `backend`: torch.compile's (tests use
    ``aot_eager``, which traces forward and backward like inductor without generating code)."""

    def __init__(self, model: torch.nn.Module, cfg: ObjectiveConfig, tcfg: TrainConfig, device: torch.device,
                 bf16: bool, backend: str = "inductor", distributed: bool = False) -> None:
        prepared = objective_spec(cfg.name).prepared  # an objective that draws its own noise is not compiled by auto
        self.device, self.bf16 = device, bf16
        compiles = prepared or tcfg.compile != "auto" or tcfg.compile_step
        self.mode = compile_mode(tcfg, device.type, distributed) if compiles else None
        self.cudagraphs = device.type == "cuda" and self.mode in ("reduce-overhead", "max-autotune")  # never on CPU
        if self.cudagraphs and tcfg.grad_accum > 1:  # pytorch/pytorch#169545: silently wrong grads
            raise ValueError(f"train.compile={self.mode} replays the backward as a CUDA graph, and a second "
                             "micro-batch would overwrite the first one's gradients (CUDA graph trees hand .grad "
                             "their output buffers); use train.grad_accum=1 or train.compile=true")
        # a model that attends to pads would see the padding (explicit static shapes are refused by validate)
        pads_seen = tcfg.static_shapes == "auto" and getattr(getattr(model, "cfg", None), "attend_to_pads", False)
        self.static = static = static_mode(tcfg, self.mode) if prepared and not pads_seen else "off"
        if device.type == "cuda":  # one image shape per run: let cuDNN pick its fastest kernels for it once
            torch.backends.cudnn.benchmark = True
        self.batches = HostBatches(model, cfg, device, static, tcfg.length_bucket)
        self.module: torch.nn.Module = Objective(model, cfg)
        # the options of torch.compile: this module's, or the whole step's with train.compile_step (train.WholeStep)
        self.options = {"backend": backend, "dynamic": False if static != "off" else None,
                        **({"mode": self.mode} if backend == "inductor" else {})}  # modes are inductor's
        if self.mode is not None and not tcfg.compile_step:
            self.module.compile(**self.options)
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
        return self.objective(images, batch, self.ready(batch))

    def ready(self, batch: ReadyBatch) -> torch.Generator:
        """What the host does before the compiled part (dynamic dimensions, a CUDA-graph step): the generator."""
        prepared = batch.prepared
        if self.terms_dynamic and prepared is not None:  # one graph for all of padded's term counts
            for x in (prepared.index, prepared.owner, prepared.targets, prepared.valid):
                torch._dynamo.mark_dynamic(x, 0)
        if self.cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        return self.batches.generator(batch)

    def objective(self, images: torch.Tensor, batch: ReadyBatch, generator: torch.Generator
                  ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The device part of :meth:`forward` (what the whole step's compiled region traces)."""
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            return self.module(images.to(self.device, non_blocking=True), batch.tokens, generator, batch.prepared)


class WholeStep:
    """train.compile_step: a micro-batch's forward, loss and backward, gradient clipping, the AdamW update and the
    EMA update as one ``torch.compile`` region (the :class:`LossStep`'s options), PyTorch's compiled-optimizer recipe:
    the lr is a tensor the schedule fills (:meth:`lr`), so a new lr recompiles nothing. ``whole(images, batch,
    scale)`` after :meth:`LossStep.prepare` returns the detached (loss, metrics, grad norm); the schedule and the
    EMA's count stay on the host. Dynamo cuts the region at the backward call: forward and backward are one graph,
    clipping, AdamW and EMA another. Its numbers agree with the eager step's to rounding, not to the bit."""

    def __init__(self, loss_step: LossStep, opt: torch.optim.Optimizer, ema: AveragedModel | None, tcfg: TrainConfig):
        self.loss_step, self.opt, self.ema, self.decay = loss_step, opt, ema, tcfg.ema_decay
        self.params = [p for g in opt.param_groups for p in g["params"]]
        self.clip = tcfg.grad_clip if tcfg.grad_clip > 0 else float("inf")
        for g in opt.param_groups:  # a checkpoint of an eager run holds a number
            g["lr"] = self.lr(g["lr"], tcfg, self.params[0].device if opt.defaults.get("fused") else None)
        opt._opt_called = True  # what the schedule's wrapper of opt.step (which dynamo skips) would have set
        model = loss_step.module.model
        pairs = [] if ema is None else list(zip([*ema.module.parameters(), *ema.module.buffers()],
                                                [*model.parameters(), *model.buffers()], strict=True))
        self.averaged = [[a for a, _ in pairs if a.is_floating_point()], [c for a, c in pairs if a.is_floating_point()]]
        self.copied = [(a, c) for a, c in pairs if not a.is_floating_point()]  # token-id tables (as train.ema_update)
        self.region = torch.compile(self._step, **loss_step.options)

    @staticmethod
    def lr(lr: float | torch.Tensor, tcfg: TrainConfig, device: torch.device | None) -> float | torch.Tensor:
        """The lr as AdamW holds it: a float, or with train.compile_step a tensor (on `device`; None: the CPU)."""
        return torch.tensor(float(lr), device=device) if tcfg.compile_step and not torch.is_tensor(lr) else lr

    def __call__(self, images: torch.Tensor, batch: ReadyBatch, scale: float
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
        first = self.ema is not None and int(self.ema.n_averaged) == 0  # the EMA's first update copies: weight 1
        out = self.region(images, batch, self.loss_step.ready(batch), scale, 1.0 if first else 1.0 - self.decay)
        if self.ema is not None:
            self.ema.n_averaged += 1
        return out

    def _step(self, images, batch, generator, scale, ema_weight):
        loss, metrics = self.loss_step.objective(images, batch, generator)
        (loss * scale).backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        type(self.opt).step(self.opt)  # not opt.step: the schedule's wrapper of it stops dynamo
        for p in self.params:
            p.grad = None
        with torch.no_grad():  # train.ema_update's (a lerp by 1 gives the end exactly)
            if self.averaged[0]:
                torch._foreach_lerp_(*self.averaged, ema_weight)
            for avg, cur in self.copied:
                avg.copy_(cur)
        return loss.detach(), {k: v.detach() for k, v in metrics.items()}, grad_norm
