"""K models of one architecture as one: parameters stacked on a leading member dimension, one vmapped forward.

:func:`stack_models` turns K members (same config, same corpus table, each initialised from its own seed) into one
module of the same class whose every parameter and buffer is the members' stacked along a new first dimension
(``torch.func.stack_module_state``), so that AdamW, :func:`~mdc_core.train.ema_update` and a state dict work on
it unchanged; it is a container, never called itself. :class:`StackedObjective` runs the trainer's own
:class:`~mdc_core.loss_step.Objective` (the core's loss, unchanged) over every member at once:
``torch.vmap`` over ``torch.func.functional_call``, each member with its own images and prepared batch.

What vmap cannot carry as the core stands, and what is done instead (costs measured by
:mod:`mdc_workbench.seed_stack.bench`):

* CPU ``scaled_dot_product_attention``: its flash kernel (``_scaled_dot_product_flash_attention_for_cpu``) has no
  batching rule, and vmap falls back to a Python loop over the members (with a warning). On the CPU the vmapped
  forward runs under ``sdpa_kernel(SDPBackend.MATH)``: the attention decomposes into matrix products and a softmax,
  which batch over the member dimension (the same function up to rounding). On CUDA the fused kernels are left to
  vmap's own batching rules (not yet measured on a GPU).
* Batched weights have no fused kernels: vmap computes a linear layer as a batched matrix product plus a separate
  bias add, a layer norm's affine as separate multiply and add. With the math attention that made the vmapped CPU
  step cost more CPU time per member than a solo step, which is why the CPU stacks "each" by default
  (:meth:`StackedObjective.each`: the members' forwards one after another with the solo kernels, one backward).
* ``objectives.normalized_token_loss`` sums each caption's terms with an in-place ``index_add_`` into a fresh
  ``torch.zeros``: under vmap that tensor has no member dimension while the terms do, and vmap refuses it.
  :class:`OutOfPlaceIndexAdd` answers that one call with the out-of-place ``torch.index_add`` (the same numbers;
  the loss uses the returned tensor). It is a stopgap: once the loss calls ``index_add`` itself, delete it.
* Random draws inside the forward: vmap would draw one tensor for all members, not each member's own. The masks
  are drawn on the host per member (:class:`~mdc_core.loss_step.HostBatches`), so the forward draws nothing for
  a prepared objective with ``model.dropout = 0`` (every preset): :func:`check_stackable` refuses dropout and an
  objective that draws its own noise, and the vmap runs with ``randomness="error"``, so any other draw (a
  condition transform's, ``objective.guidance``) is refused with a ValueError. "each" carries them all but the
  objective that draws its own noise: it gives a transform the member's own generator and dropout the member's own
  global random state (:class:`~mdc_workbench.seed_stack.step.MemberRandom`), as the solo run has them.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, stack_module_state
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.overrides import TorchFunctionMode

from mdc_core.config import ObjectiveConfig, RunConfig
from mdc_core.loss_step import Objective, ReadyBatch
from mdc_core.objectives import PreparedBatch, objective_spec


def check_stackable(cfg: RunConfig, mode: str = "vmap") -> None:
    """ValueError naming what keeps `cfg`'s members from training as a stack (`mode` "vmap" or "each") equal to
    their solo runs."""
    if not objective_spec(cfg.objective.name).prepared:
        raise ValueError(f"objective {cfg.objective.name!r} draws its noise on the device inside its loss, which a "
                         "seed stack cannot draw per member as the solo runs do; train its seeds one by one")
    if mode == "vmap" and cfg.model.dropout > 0:
        raise ValueError(f"model.dropout={cfg.model.dropout}: a vmapped stack cannot draw each member's dropout as its "
                         "solo run does (one draw for all members); stack with mode='each' or use model.dropout=0")


def stack_models(models: Sequence[nn.Module]) -> nn.Module:
    """One module holding K members: a copy of ``models[0]`` whose every parameter and buffer (persistent or not)
    is the members' stacked, (K, ...). Never called itself: :class:`StackedObjective` runs it member by member.
    ValueError if the members differ in architecture or in an integer buffer (the token ids and corpus index the
    host prepares every member's batches with; batch norm's counts): :func:`check_members`."""
    check_members(models)
    params, buffers = stack_module_state(list(models))  # (K, ...) each; parameters are new leaves
    stacked = copy.deepcopy(models[0])
    for name, value in [*params.items(), *buffers.items()]:
        owner, _, leaf = name.rpartition(".")
        module = stacked.get_submodule(owner)
        setattr(module, leaf, nn.Parameter(value) if name in params else value)
    return stacked


def check_members(models: Sequence[nn.Module]) -> None:
    """ValueError unless `models` are at least one member of one architecture (the same tensor names and shapes, and
    the same integer buffers: the corpus table the host prepares every member's batches with, batch norm's
    counts)."""
    if not models:
        raise ValueError("a seed stack needs at least one member")
    shapes = [{n: tuple(t.shape) for n, t in [*m.named_parameters(), *m.named_buffers()]} for m in models]
    if any(s != shapes[0] for s in shapes) or any(type(m) is not type(models[0]) for m in models):
        raise ValueError("the members of a seed stack must share one architecture (their tensors differ in shape)")
    tables = [dict(m.named_buffers()) for m in models]
    for name, table in tables[0].items():
        if not table.is_floating_point() and any(not torch.equal(t[name], table) for t in tables[1:]):
            raise ValueError(f"the members' {name} differ: a seed stack's members share their integer tables (one "
                             "corpus table) and counts")


def vmap_members(module: nn.Module, stacked: nn.Module, *args: Any, in_dims: tuple) -> Any:
    """``module(*args)`` of every member as one vmapped call (no gradient to the weights): `module` holds `stacked` (a
    :func:`stack_models` module) as its attribute ``model``, whose parameters and buffers are batched over their first
    dimension; `args` are batched by `in_dims` (None: shared). On the CPU under the math attention (module
    docstring); random draws refused (``randomness="error"``)."""
    params = {f"model.{n}": p.detach() for n, p in stacked.named_parameters()}
    buffers = {f"model.{n}": b for n, b in stacked.named_buffers()}

    def one(p: dict, b: dict, *a: Any) -> Any:
        return functional_call(module, (p, b), a)

    cpu = next(iter(params.values())).device.type == "cpu"
    with sdpa_kernel(SDPBackend.MATH) if cpu else contextlib.nullcontext():
        return torch.vmap(one, in_dims=(0, 0, *in_dims), randomness="error")(params, buffers, *args)


class Encode(nn.Module):
    """``model.encode_image(images)`` as a module's forward (what ``functional_call`` calls)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model.encode_image(images)


def member_state_dict(stacked: nn.Module, k: int) -> dict[str, torch.Tensor]:
    """Member `k`'s state dict (the solo model's keys and shapes), as copies."""
    return {name: value[k].clone() for name, value in stacked.state_dict().items()}


class OutOfPlaceIndexAdd(TorchFunctionMode):
    """Turns ``x.index_add_(dim, index, source)`` on a tensor `x` without the member dimension, with a `source` that
    has it (what vmap refuses), into the out-of-place ``torch.index_add``: right where the caller uses the result,
    as ``objectives.normalized_token_loss`` does. Every other call, and every call outside vmap, runs unchanged."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.index_add_ and len(args) >= 4 and _batched(args[3]) and not _batched(args[0]):
            return torch.index_add(*args, **kwargs)
        return func(*args, **kwargs)


def _batched(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and torch._C._functorch.is_batchedtensor(x)  # inside vmap: has a member dim


class StackedObjective(nn.Module):
    """The trainer's :class:`~mdc_core.loss_step.Objective` over a :func:`stack_models` module, every member at once.

    :meth:`forward` vmaps it: images (K, B, 3, H, W), tokens (K, B, L) and a :class:`PreparedBatch` whose every
    tensor has the member dimension first (one shape for all members: :class:`~mdc_workbench.seed_stack.step.SeedStack`
    pads them alike) -> (loss (K,), metrics {name: (K,)}); member k's values are those of its solo ``Objective`` on
    its own batch up to rounding (batched matrix products, the math attention). :meth:`each` runs the members one
    after another on their own shapes with the solo run's kernels, and gives the solo run's numbers to the bit; both
    make one backward for all members."""

    def __init__(self, stacked: nn.Module, cfg: ObjectiveConfig, math_attention: bool = True) -> None:
        super().__init__()
        self.objective = Objective(stacked, cfg)  # its parameters and buffers: "model.<name>", (K, ...)
        self.math_attention = math_attention  # on the CPU: False keeps the fused kernel (vmap loops over members)

    def forward(self, images: torch.Tensor, tokens: torch.Tensor, prepared: PreparedBatch
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        params, buffers = dict(self.objective.named_parameters()), dict(self.objective.named_buffers())
        fields = {f.name: getattr(prepared, f.name) for f in dataclasses.fields(prepared)
                  if getattr(prepared, f.name) is not None}  # vmap takes a dict of tensors

        def one(p: dict, b: dict, image: torch.Tensor, token: torch.Tensor, batch: dict) -> tuple:
            return functional_call(self.objective, (p, b), (image, token, None, PreparedBatch(**batch)))

        math = self.math_attention and images.device.type == "cpu"
        attention = sdpa_kernel(SDPBackend.MATH) if math else contextlib.nullcontext()
        try:
            with attention, OutOfPlaceIndexAdd():
                return torch.vmap(one, randomness="error")(params, buffers, images, tokens, fields)
        except RuntimeError as err:
            if "randomness" not in str(err):
                raise
            raise ValueError("the stacked forward draws random numbers (a condition transform such as "
                             "objective.guidance, or dropout), which vmap cannot draw per member as the solo runs "
                             "do; stack with mode='each'") from err

    def each(self, images: Sequence[torch.Tensor], batches: Sequence[ReadyBatch],
             generator: Callable[[ReadyBatch], torch.Generator],
             scope: Callable[[int], contextlib.AbstractContextManager] | None = None
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The members one after another: member k's images (B, 3, H, W) and its batch as
        :class:`~mdc_core.loss_step.HostBatches` prepared it (its solo run's shapes), with ``generator(batch)`` for
        the draws its loss makes itself (:meth:`HostBatches.generator`, as the solo step), inside ``scope(k)`` (the
        member's global random state, which dropout draws from) -> (loss (K,), metrics {name: (K,)}). Each member's
        parameters are views of the stacked ones (``unbind``), so the one backward of all losses gives every
        stacked gradient at once."""
        params = {n: p.unbind(0) for n, p in self.objective.named_parameters()}
        buffers = {n: b.unbind(0) for n, b in self.objective.named_buffers()}  # batch norm updates them in place
        out = []
        for k, batch in enumerate(batches):
            state = ({n: v[k] for n, v in params.items()}, {n: v[k] for n, v in buffers.items()})
            with contextlib.nullcontext() if scope is None else scope(k):
                out.append(functional_call(self.objective, state, (images[k], batch.tokens, generator(batch),
                                                                   batch.prepared)))
        return torch.stack([loss for loss, _ in out]), {name: torch.stack([m[name] for _, m in out])
                                                        for name in out[0][1]}
