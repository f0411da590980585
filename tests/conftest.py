"""Shared fixtures: a very small captioner that builds in milliseconds, and the opt-in count of the suite's trainings.

``MDC_COUNT_TRAININGS=FILE pytest ...`` writes one line to FILE for every training a test starts and prints them per
test file at the end: ``train`` (a call of :func:`mdc_core.train.train`, in the test process or in a training child
it forks: ``mdc train`` run in-process, the notebook helpers, the fine-tune, the benches), ``subprocess`` (a fresh
interpreter started with a ``train`` argument, e.g. ``python CHILD train ...``) and ``notebook`` (a papermill
execution: its kernel's trainings are not seen, so a notebook counts once whether it trains or not).
"""

import functools
import os
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import torch

from mdc_core.config import ModelConfig
from mdc_core.model import Captioner

COUNT_ENV = "MDC_COUNT_TRAININGS"

MICRO = dict(encoder="vit_base_patch32_224", image_size=32,
             encoder_kwargs={"patch_size": 8, "embed_dim": 32, "depth": 1, "num_heads": 2},
             text_width=32, text_layers=2, text_heads=2, context_length=24)


def micro_config(**overrides) -> ModelConfig:
    return ModelConfig(**{**MICRO, **overrides})


@pytest.fixture
def tiny_model():
    """Factory for a seeded micro captioner: tiny_model(causal=False, output_ids=None, **config overrides)."""

    def make(causal: bool = False, output_ids=None, seed: int = 0, **overrides) -> Captioner:
        torch.manual_seed(seed)
        cfg = micro_config(**overrides)
        if output_ids is not None:
            cfg.output_vocab, cfg.output_vocab_size = "corpus", len(output_ids)
        return Captioner(cfg, causal=causal, output_ids=output_ids).eval()

    return make


def _note_training(log: str, kind: str) -> None:
    """One line `kind test-id` (the test running now: PYTEST_CURRENT_TEST, which forked children inherit)."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "? (none)").rsplit(" (", 1)[0]
    with open(log, "a") as f:
        f.write(f"{kind} {test}\n")


def _counted(log: str, kind: str, real):
    @functools.wraps(real)
    def wrapper(*args, **kwargs):
        _note_training(log, kind)
        return real(*args, **kwargs)

    return wrapper


def pytest_configure(config: pytest.Config) -> None:
    log = os.environ.get(COUNT_ENV)
    if not log:
        return
    Path(log).write_text("")
    import mdc_core.train as train_mod
    train_mod.train = _counted(log, "train", train_mod.train)
    real_init = subprocess.Popen.__init__

    @functools.wraps(real_init)
    def popen_init(self, args, *rest, **kwargs):
        if isinstance(args, list | tuple) and "train" in map(str, args):
            _note_training(log, "subprocess")
        real_init(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = popen_init
    try:
        import papermill
    except ImportError:
        return
    papermill.execute_notebook = _counted(log, "notebook", papermill.execute_notebook)


def pytest_terminal_summary(terminalreporter) -> None:
    log = os.environ.get(COUNT_ENV)
    if not log or not Path(log).is_file():
        return
    lines = [line.split(" ", 1) for line in Path(log).read_text().splitlines() if line]
    kinds = Counter(kind for kind, _ in lines)
    per_file = Counter((test.split("::")[0], kind) for kind, test in lines)
    terminalreporter.write_sep("-", "trainings started: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))
    for (path, kind), n in sorted(per_file.items(), key=lambda item: (-item[1], item[0])):
        terminalreporter.write_line(f"{n:5d} {kind:10s} {path}")
