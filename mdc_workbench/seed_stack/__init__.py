"""Seed stacks (issue 63): K seeds of one run config trained and evaluated in one process, one step for all of them.

:mod:`~mdc_workbench.seed_stack.stacked` stacks the members' parameters and runs the core's loss over all of them
(``torch.vmap`` over ``functional_call``), and says what vmap cannot carry; :mod:`~mdc_workbench.seed_stack.step` is the
optimizer step (each member's own data, masks, gradient clipping, AdamW and EMA, as its solo run has them);
:mod:`~mdc_workbench.seed_stack.train` trains a stack into one run folder per member, each what the solo run of its
seed writes (``mdc train --members K``); :mod:`~mdc_workbench.seed_stack.bench` measures seconds per member-step
against solo steps.

Evaluation, every member from one read of the data, with the results its solo run gets (mode ``each``: the solo
kernels, to the bit; ``vmap``: one vmapped forward over the stacked weights, within rounding; ``auto``: each on the
CPU, vmap elsewhere): :mod:`~mdc_workbench.seed_stack.features` gives the members' probe features,
:mod:`~mdc_workbench.seed_stack.claim` their central-claim measure (:func:`central_claim_members`,
:func:`stacked_claim_scores`), :mod:`~mdc_workbench.seed_stack.captioning` their captions and Table 3 results
(:func:`captioning_members`; vmap carries the encoder, the decoding runs per member) and
:mod:`~mdc_workbench.seed_stack.items` writes each member's per-item file as its solo run's
(:func:`write_member_items`); :mod:`~mdc_workbench.seed_stack.bench_eval` times the measure against solo measures.
"""

from .captioning import captioning_members
from .claim import central_claim_members, stacked_claim_scores
from .items import write_member_items
from .stacked import StackedObjective, check_stackable, member_state_dict, stack_models
from .step import SeedStack, clip_members_, init_members, member_config, member_step
from .train import member_dir, train_stack

__all__ = ["SeedStack", "StackedObjective", "captioning_members", "central_claim_members", "check_stackable",
           "clip_members_", "init_members", "member_config", "member_dir", "member_state_dict", "member_step",
           "stack_models", "stacked_claim_scores", "train_stack", "write_member_items"]
