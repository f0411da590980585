"""The optimizer step of a seed stack: K seeds of one run config, one step for all of them.

Member k is the solo run of ``cfg`` with ``train.seed = seeds[k]`` (:func:`member_config`), and everything random
about it is drawn as that run draws it: its initial weights (:func:`init_members`: ``seed_everything(seed)`` then
the trainer's :func:`~mdc_core.train.init_model`), its data order (the caller reads each member's batches from
its own :class:`~mdc_core.data.BatchStream` of :func:`member_config`), and the masks of its micro-batch ``a``
at step ``n``, drawn on the host by the trainer's :class:`~mdc_core.loss_step.HostBatches` from
``step_seed(seeds[k], n, a)``. :meth:`SeedStack.step` then runs, in one of two modes:

* ``vmap`` (the default on CUDA): each member's micro-batch prepared on the host, the captions padded to the
  members' longest (pads are invisible to attention and carry no loss) and the loss terms to the members' most
  (terms with ``valid`` False, which carry no loss), stacked and copied to the device at once; one forward of every
  member (:class:`~mdc_workbench.seed_stack.stacked.StackedObjective`: the core's loss, vmapped), so the host pays for
  one model's operations per step: what a host-bound GPU step needs. Equal to the solo runs up to rounding.
* ``each`` (the default on the CPU, where a step is bound by arithmetic, not by the host, and vmap's batched
  operations measured slower than the solo kernels: :mod:`mdc_workbench.seed_stack.bench`): the members' forwards one
  after another on their own shapes with the solo run's kernels; the solo runs' numbers to the bit.

Then, either way, one backward for all members (each member's loss scaled by its own count of loss terms over the
step's, the trainer's normalisation), per-member gradient norms and clipping (:func:`clip_members_`), one AdamW over
the stacked parameters (AdamW is elementwise, so it is K AdamWs: ``tests/workbench/test_seed_stack.py`` proves it),
the shared
learning-rate schedule, and the EMA of the stacked model (:func:`~mdc_core.train.ema_update`, elementwise too).

The step returns a :class:`~mdc_core.train.DeviceStep` whose values have the member dimension (nothing read);
:func:`member_step` is member k's, what :meth:`mdc_core.train_log.RunLog.read` takes. :meth:`SeedStack.member_state`
gives member k's model, EMA and optimizer state in the solo run's shapes (what its checkpoint holds) and
:meth:`SeedStack.load_member_states` stacks them back (resume).

One process, one device (no torchrun), ``train.nonfinite=stop`` and no compilation yet. The loop around the step
(each member's data stream, records, checkpoints and resume, in run folders of the solo layout) is
:mod:`mdc_workbench.seed_stack.train`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.swa_utils import AveragedModel

from mdc_core.config import RunConfig
from mdc_core.loss_step import HostBatches, ReadyBatch, compile_mode, static_mode
from mdc_core.objectives import PreparedBatch, bucket_length, trim_padding
from mdc_core.sampler import bf16_enabled
from mdc_core.train import (
    DeviceStep,
    StepSums,
    build_optimizer,
    ema_update,
    init_model,
    lr_lambda,
    param_groups,
    seed_everything,
    step_seed,
)

from .stacked import StackedObjective, check_stackable, member_state_dict, stack_models


def member_config(cfg: RunConfig, seed: int) -> RunConfig:
    """The solo run a member stands for: `cfg` with ``train.seed = seed`` (its initial weights, masks, data order)."""
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seed=seed))


def init_members(cfg: RunConfig, seeds: Sequence[int], progress: bool = False
                 ) -> tuple[list[nn.Module], RunConfig]:
    """Each member's initial model as its solo run builds it (``seed_everything(seed)``, then
    :func:`~mdc_core.train.init_model`, which reads the corpus table from the training captions: once per
    member), and the run config as the members save it (with the corpus table's size; ``train.seed`` the first
    member's)."""
    if not seeds:
        raise ValueError("a seed stack needs at least one seed")
    models, configs = [], []
    for seed in seeds:
        seed_everything(seed)
        model, built = init_model(member_config(cfg, seed), progress=progress and not models)
        models.append(model)
        configs.append(built)
    return models, configs[0]


def clip_members_(params: Iterable[torch.Tensor], max_norm: float, exact: bool = False) -> torch.Tensor:
    """Gradient-norm clipping of each member on its own: member k's norm is over its slice ``grad[k]`` of every
    gradient (the solo run's ``clip_grad_norm_``: the norm of the per-tensor norms), and its slices are scaled by
    ``min(1, max_norm / (norm + 1e-6))`` as ``clip_grad_norm_`` scales them. Returns the norms before clipping, (K,).
    `max_norm` ``inf``: nothing is clipped (the scale is exactly 1). `exact`: each member's norm by
    ``torch.nn.utils.get_total_norm`` of its slices, the solo run's arithmetic to the bit (K calls); else one
    reduction per tensor for all members (the same norm up to summation order)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        raise ValueError("no gradients to clip: run the backward first")
    if exact:
        norms = torch.stack([torch.nn.utils.get_total_norm([g[k] for g in grads]) for k in range(grads[0].shape[0])])
    else:
        per_tensor = torch.stack([torch.linalg.vector_norm(g.reshape(g.shape[0], -1), dim=1) for g in grads])  # (P, K)
        norms = torch.linalg.vector_norm(per_tensor, dim=0)  # (K,)
    scale = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(scale.view(-1, *[1] * (g.ndim - 1)).to(g.dtype))
    return norms


class MemberRandom:
    """Each member's global random state (what dropout draws from) as its solo run holds it: :meth:`seed` sets
    every member's as the trainer seeds its step (``torch.manual_seed``), and inside :meth:`member` member k's
    state is the device's default generator's, kept for its next forward when the block ends; the process's own
    state is put back then. ``states[k]`` is where member k's solo run would leave it."""

    def __init__(self, device: torch.device, members: int) -> None:
        self.device = device
        self.states: list[torch.Tensor | None] = [None] * members

    def _get(self) -> torch.Tensor:
        return torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else torch.get_rng_state()

    def _set(self, state: torch.Tensor) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_rng_state(state, self.device)
        else:
            torch.set_rng_state(state)

    def seed(self, seeds: Sequence[int]) -> None:
        """Member k's state as ``torch.manual_seed(seeds[k])`` leaves the device's default generator."""
        self.states = [torch.Generator(self.device).manual_seed(s).get_state() for s in seeds]

    @contextlib.contextmanager
    def member(self, k: int) -> Iterator[None]:
        if self.states[k] is None:
            raise ValueError(f"member {k}'s random state was never seeded")
        own = self._get()
        self._set(self.states[k])
        try:
            yield
        finally:
            self.states[k] = self._get()
            self._set(own)


class StackSums(StepSums):
    """:class:`~mdc_core.train.StepSums` with a member dimension: loss x terms and metric means, each (K,)."""

    def __init__(self, device: torch.device, micro_batches: int, members: int) -> None:
        super().__init__(device, micro_batches)
        self.loss_sum = torch.zeros(members, dtype=torch.float64, device=device)


def member_step(step: DeviceStep, k: int) -> DeviceStep:
    """Member k's values of a stacked :class:`DeviceStep` (what its solo run's step returns; nothing read)."""
    denom = float(step.denom[k]) if torch.is_tensor(step.denom) else step.denom  # a host tensor: no device read
    return DeviceStep(step.loss_sum[k], denom, {name: v[k] for name, v in step.metrics.items()}, step.grad_norm[k])


@dataclass
class StackBatch:
    """One micro-batch of every member, prepared on the host (:meth:`SeedStack.prepare`)."""

    ready: list[ReadyBatch]  # each member's as HostBatches made it (mode "each": on the device, its own shapes)
    stacked: PreparedBatch | None  # mode "vmap": every member's padded to one shape, stacked (K, ...), on the device

    @property
    def terms(self) -> list[int]:
        """What each member's loss is divided by, counted from its own masks."""
        return [r.terms for r in self.ready]


def pad_terms(p: PreparedBatch, capacity: int) -> PreparedBatch:
    """`p` with `capacity` loss terms: the extra ones at position 0 with target row 0 and ``valid`` False, which
    carry no loss (as :func:`~mdc_core.objectives.prepare_batch`'s static shapes pad them)."""
    if p.index is None or p.index.shape[0] == capacity:
        return p
    extra = capacity - p.index.shape[0]
    if extra < 0:
        raise ValueError(f"a batch of {p.index.shape[0]} loss terms cannot be padded to {capacity}")
    valid = torch.ones_like(p.index, dtype=torch.bool) if p.valid is None else p.valid
    return dataclasses.replace(p, index=F.pad(p.index, (0, extra)), owner=F.pad(p.owner, (0, extra)),
                               targets=F.pad(p.targets, (0, extra)), valid=F.pad(valid, (0, extra), value=False))


def stack_prepared(batches: Sequence[PreparedBatch]) -> PreparedBatch:
    """One :class:`PreparedBatch` of K same-shaped ones, the member dimension first."""
    fields = [f.name for f in dataclasses.fields(PreparedBatch)]
    return PreparedBatch(**{name: None if getattr(batches[0], name) is None else
                            torch.stack([getattr(b, name) for b in batches]) for name in fields})


class SeedStack:
    """K members of one run config trained as one: see the module docstring. `models` are the members' initial
    models (:func:`init_members`; they become views of no one: the stack copies them), `seeds` their ``train.seed``;
    `cfg` is the run config they share (a member's ``train.seed`` aside); `mode` "vmap", "each" or "auto".
    :meth:`step` is one optimizer step of every member."""

    MODES = ("auto", "vmap", "each")  # auto: each on the CPU, vmap elsewhere (module docstring)

    def __init__(self, cfg: RunConfig, models: Sequence[nn.Module], seeds: Sequence[int],
                 device: torch.device | str = "cpu", mode: str = "auto") -> None:
        if mode not in self.MODES:
            raise ValueError(f"seed stack mode {mode!r}: choose one of {', '.join(self.MODES)}")
        device = torch.device(device)
        mode = ("each" if device.type == "cpu" else "vmap") if mode == "auto" else mode
        check_stackable(cfg, mode)
        seeds = [int(s) for s in seeds]
        if len(seeds) != len(models):
            raise ValueError(f"a seed stack of {len(models)} models was given {len(seeds)} seeds")
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"the members' seeds repeat ({seeds}): two members would be the same run")
        self.cfg, self.seeds, self.device, self.mode = cfg, seeds, device, mode
        tcfg = cfg.train
        self.bf16 = bf16_enabled(tcfg.precision, self.device)
        names = {id(p): n for n, p in models[0].named_parameters()}
        solo_groups = param_groups(models[0], tcfg.weight_decay)  # the solo run's split, by parameter name
        # the members' masks, drawn on the host as their solo runs draw them: "each" prepares them as the solo run
        # (its static shapes, copied to the device), "vmap" pads them to one shape on the host (module docstring)
        static = static_mode(tcfg, compile_mode(tcfg, self.device.type))
        self.round_width = static != "off"  # a compiled step's caption-length buckets
        if mode == "each":
            self.batches = HostBatches(models[0], cfg.objective, self.device, static, tcfg.length_bucket)
        else:
            self.batches = HostBatches(models[0], cfg.objective, torch.device("cpu"),
                                       "dense" if static == "dense" else "padded", tcfg.length_bucket)
        self.model = stack_models([m.to(self.device).train() for m in models])
        self.objective = StackedObjective(self.model, cfg.objective)
        stacked = dict(self.model.named_parameters())
        groups = [{**g, "params": [stacked[names[id(p)]] for p in g["params"]]} for g in solo_groups]
        self.opt = build_optimizer(groups, tcfg, self.device)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: lr_lambda(s, tcfg.warmup_steps, tcfg.steps, tcfg.min_lr_ratio))
        self.ema = AveragedModel(self.model, use_buffers=True) if tcfg.ema_decay > 0 else None
        self.random = MemberRandom(self.device, len(seeds))  # mode "each": each member's dropout draws
        self.n = 0  # optimizer steps taken

    @property
    def members(self) -> int:
        return len(self.seeds)

    def prepare(self, tokens: Sequence[torch.Tensor], seeds: Sequence[int]) -> StackBatch:
        """Each member's CPU captions (B, L) prepared with its masking seed (:class:`HostBatches`: its solo run's
        draws); mode "vmap": padded to one shape, stacked and copied to the device."""
        if self.mode == "each":
            return StackBatch([self.batches(t, s) for t, s in zip(tokens, seeds, strict=True)], None)
        width = max(trim_padding(t).shape[1] for t in tokens)
        if self.round_width:
            width = bucket_length(width, self.cfg.train.length_bucket, self.cfg.model.context_length)
        self.batches.shapes["length_bucket"] = width  # every member's captions padded to this width
        ready = [self.batches(t, s) for t, s in zip(tokens, seeds, strict=True)]
        capacity = max((r.prepared.index.shape[0] for r in ready if r.prepared.index is not None), default=0)
        return StackBatch(ready, stack_prepared([pad_terms(r.prepared, capacity) for r in ready]).to(self.device))

    def forward(self, images: torch.Tensor, batch: StackBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(loss (K,), metrics {name: (K,)}) of images (K, B, 3, H, W) and a batch :meth:`prepare` made."""
        images = images.to(self.device, non_blocking=True)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            if batch.stacked is None:
                return self.objective.each(images, batch.ready, self.batches.generator, self.random.member)
            return self.objective(images, batch.stacked.tokens, batch.stacked)

    def step(self, micro: Sequence[Sequence[dict[str, Any]]]) -> DeviceStep:
        """One optimizer step of every member: ``micro[k]`` are member k's ``train.grad_accum`` micro-batches (dicts
        with ``image`` (B, 3, H, W) and ``tokens`` (B, L) on the CPU, as its BatchStream gives them). Returns the
        step's device values with the member dimension (:func:`member_step` picks one); nothing is read."""
        tcfg, n = self.cfg.train, self.n
        if len(micro) != self.members or any(len(m) != tcfg.grad_accum for m in micro):
            raise ValueError(f"a step of this stack takes {tcfg.grad_accum} micro-batch(es) for each of its "
                             f"{self.members} members; got {[len(m) for m in micro]}")
        ready = [self.prepare([m[a]["tokens"] for m in micro], [step_seed(s, n, a) for s in self.seeds])
                 for a in range(tcfg.grad_accum)]
        counts = torch.tensor([b.terms for b in ready], dtype=torch.float64).T  # (K, A) on the host
        denom = counts.sum(dim=1).clamp(min=1.0)  # (K,): the trainer's global_terms, per member
        sums = StackSums(self.device, tcfg.grad_accum, self.members)
        self.random.seed([step_seed(s, n, 0, stream=1) for s in self.seeds])  # dropout: as the trainer seeds it
        for a, batch in enumerate(ready):
            images = torch.stack([m[a]["image"] for m in micro])  # (K, B, 3, H, W)
            loss, metrics = self.forward(images, batch)
            scale = (counts[:, a] / denom).to(self.device, loss.dtype, non_blocking=True)
            (loss * scale).sum().backward()  # the members are independent: each gets its own gradient
            sums.add(loss, metrics, counts[:, a].to(self.device, non_blocking=True))
        grad_norm = clip_members_(self.model.parameters(), tcfg.grad_clip if tcfg.grad_clip > 0 else math.inf,
                                  exact=self.mode == "each")
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.sched.step()
        if self.ema is not None:
            ema_update(self.ema, self.model, tcfg.ema_decay)
        self.n += 1
        return sums.done(denom, grad_norm, 1)

    def member_state(self, k: int) -> dict[str, Any]:
        """Member k as its solo run's checkpoint holds it (copies): ``model`` and ``ema`` state dicts (``ema`` None
        without one), the ``optimizer`` state dict in the solo run's shapes and parameter order, and what the
        members share: ``scheduler``'s state, ``step`` (optimizer steps taken) and ``ema_updates``."""
        opt = self.opt.state_dict()
        state = {i: {name: v.clone() if name in SHARED_STATE else v[k].clone() for name, v in s.items()}
                 for i, s in opt["state"].items()}
        return {"model": member_state_dict(self.model, k),
                "ema": None if self.ema is None else member_state_dict(self.ema.module, k),
                "optimizer": {"state": state, "param_groups": copy.deepcopy(opt["param_groups"])},
                "scheduler": self.sched.state_dict(), "step": self.n,
                "ema_updates": 0 if self.ema is None else int(self.ema.n_averaged)}

    def load_member_states(self, states: Sequence[dict[str, Any]]) -> None:
        """Set every member from its :meth:`member_state` (one per member, in order, all at one step): the inverse,
        for a resume."""
        if len(states) != self.members:
            raise ValueError(f"a stack of {self.members} members was given {len(states)} member states")
        if len({s["step"] for s in states}) != 1:
            raise ValueError(f"the members' states are of different steps ({[s['step'] for s in states]}); a stack "
                             "resumes its members from one step")
        if self.ema is not None and any(s["ema"] is None for s in states):
            raise ValueError("this stack keeps an EMA (train.ema_decay > 0) but a member state has none")
        with torch.no_grad():
            for name, value in self.model.state_dict().items():
                value.copy_(torch.stack([s["model"][name] for s in states]))
            if self.ema is not None:
                for name, value in self.ema.module.state_dict().items():
                    value.copy_(torch.stack([s["ema"][name] for s in states]))
                self.ema.n_averaged.fill_(states[0]["ema_updates"])
        first = states[0]["optimizer"]
        merged = {i: {name: v if name in SHARED_STATE else torch.stack([s["optimizer"]["state"][i][name]
                                                                         for s in states])
                      for name, v in st.items()} for i, st in first["state"].items()}
        self.opt.load_state_dict({"state": merged, "param_groups": first["param_groups"]})
        self.sched.load_state_dict(states[0]["scheduler"])
        self.n = states[0]["step"]


SHARED_STATE = ("step",)  # AdamW's state entries every member shares (its step count); the moments are per member
