"""Shared fixtures: a very small captioner that builds in milliseconds, one trained micro run for the whole session
(``trained_run``: read it, copy it before changing it) and the opt-in count of the suite's trainings.

``MDC_COUNT_TRAININGS=FILE pytest ...`` writes one line to FILE for every training a test starts and prints them per
test file at the end: ``train`` (a call of :func:`mdc_core.train.train`, in the test process or in a training child
it forks: ``mdc train`` run in-process, the notebook helpers, the fine-tune, the benches; ``raised`` counts those of
them that ended in an exception: a refusal before the first step, an interrupt, a divergence), ``subprocess`` (a fresh
interpreter started with a ``train`` argument, e.g. ``python CHILD train ...``) and ``notebook`` (a papermill
execution: its kernel's trainings are not seen, so a notebook counts once whether it trains or not).
"""

import functools
import hashlib
import os
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

from mdc_core.config import ModelConfig
from mdc_core.model import Captioner

COUNT_ENV = "MDC_COUNT_TRAININGS"

MICRO = dict(encoder="vit_base_patch32_224", image_size=32,
             encoder_kwargs={"patch_size": 8, "embed_dim": 32, "depth": 1, "num_heads": 2},
             text_width=32, text_layers=2, text_heads=2, context_length=24)


# the micro model as `mdc train --set` flags on the tiny preset (one decoder layer, the preset's corpus head)
MICRO_SETS = [
    "--set", 'model.encoder_kwargs={"patch_size": 8, "embed_dim": 32, "depth": 1, "num_heads": 2}',
    "--set", "model.image_size=32", "--set", "model.text_width=32", "--set", "model.text_layers=1",
    "--set", "model.text_heads=2", "--set", "train.batch_size=8", "--set", "train.warmup_steps=1",
    "--set", "train.log_every=1", "--set", "train.ckpt_every=2", "--set", "sampler.length=5",
]


def micro_config(**overrides) -> ModelConfig:
    return ModelConfig(**{**MICRO, **overrides})


class TrainedRun(NamedTuple):
    """The session's one trained micro run (``data, run, image = trained_run``). Tests read it; a test that changes a
    run copies it first (``shutil.copytree(trained_run.run, tmp_path / "run")``): the session's end checks that
    nothing in it changed."""

    data: Path  # `mdc data synth --n 24 --seed 3 --image-size 32 --captions short`: 24 training pairs in one shard
    run: Path  # `mdc train --preset tiny --steps 4` on it with MICRO_SETS: a metrics line a step, checkpoints 2 and 4
    image: Path  # the first test image of `data`, as a JPEG


def file_digests(root: Path) -> dict[str, str]:
    """sha256 of every file under `root`, by its path relative to `root`."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def changed_files(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The paths written, added or removed between two :func:`file_digests`."""
    return sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrainedRun]:
    """Synthetic data and a 4-step micro run on it, built once per session for the tests that need some finished
    run (a run to sample, score, export, damage a copy of or resume a copy of); read-only to them."""
    import webdataset as wds

    from mdc_workbench.cli import main

    root = tmp_path_factory.mktemp("trained_run")
    shared = TrainedRun(root / "data", root / "run", root / "img.jpg")
    assert main(["data", "synth", "--out", str(shared.data), "--n", "24", "--seed", "3", "--image-size", "32",
                 "--captions", "short"]) == 0
    assert main(["train", "--preset", "tiny", "--data", str(shared.data), "--out", str(shared.run), "--steps", "4",
                 "--quiet", *MICRO_SETS]) == 0
    record = next(iter(wds.WebDataset(str(shared.data / "test" / "000000.tar"), shardshuffle=False)))
    shared.image.write_bytes(record["jpg"])
    before = file_digests(root)
    yield shared
    changed = changed_files(before, file_digests(root))
    assert not changed, f"a test changed the session's trained_run in {root}: {changed} (copy it first)"


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
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" (", 1)[0]
    with open(log, "a") as f:
        f.write(f"{kind} {test}\n")


def _counted(log: str, kind: str, real):
    """`real`, noting `kind` when it is called and ``raised`` when it ends in an exception."""

    @functools.wraps(real)
    def wrapper(*args, **kwargs):
        _note_training(log, kind)
        try:
            return real(*args, **kwargs)
        except BaseException:
            _note_training(log, "raised")
            raise

    return wrapper


def pytest_configure(config: pytest.Config) -> None:
    # A suite started in the background of a non-interactive shell (`make test &`, `nohup ... &`) inherits SIGINT
    # ignored, and python then installs no KeyboardInterrupt handler: the tests that press Ctrl-C on a plan (and the
    # processes they start, which inherit the disposition) would wait out their sleeping notebooks instead.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    log = os.environ.get(COUNT_ENV)
    if not log:
        return
    Path(log).write_text("")
    os.chmod(log, 0o666)  # the children tests/workbench/test_permissions.py forks run as another user
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
    said = ", ".join(f"{kinds[k]} {k}" for k in ("train", "raised", "subprocess", "notebook") if kinds[k])
    terminalreporter.write_sep("-", f"trainings started ({COUNT_ENV}): {said}")
    for (path, kind), n in sorted(per_file.items(), key=lambda item: (-item[1], item[0])):
        terminalreporter.write_line(f"{n:5d} {kind:10s} {path}")
