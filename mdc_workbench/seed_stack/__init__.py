"""Seed stacks (issue 63): K seeds of one run config trained in one process, one step for all of them.

:mod:`~mdc_workbench.seed_stack.stacked` stacks the members' parameters and runs the core's loss over all of them
(``torch.vmap`` over ``functional_call``), and says what vmap cannot carry; :mod:`~mdc_workbench.seed_stack.step` is the
optimizer step (each member's own data, masks, gradient clipping, AdamW and EMA, as its solo run has them);
:mod:`~mdc_workbench.seed_stack.train` trains a stack into one run folder per member, each what the solo run of its
seed writes (``mdc train --members K``); :mod:`~mdc_workbench.seed_stack.features` gives every member's probe features
in one pass over the images; :mod:`~mdc_workbench.seed_stack.bench` measures seconds per member-step against solo
steps.
"""

from .stacked import StackedObjective, check_stackable, member_state_dict, stack_models
from .step import SeedStack, clip_members_, init_members, member_config, member_step
from .train import member_dir, train_stack

__all__ = ["SeedStack", "StackedObjective", "check_stackable", "clip_members_", "init_members", "member_config",
           "member_dir", "member_state_dict", "member_step", "stack_models", "train_stack"]
