"""The host work around the model in a training step (issue 53): the masks are drawn once per micro-batch, the
in-memory data set is served as ready tensors (no tokenizer on the step's path), and the trainer reads as a loop
of read -> step -> maybe log / checkpoint / stop."""

import ast
import inspect

import pytest
import torch

import mdc_core.objectives as objectives_mod
import mdc_core.train as train_mod
from mdc_core.config import DataConfig
from mdc_core.data import build_loader
from mdc_core.tokenizer import CaptionTokenizer
from tests.train_helpers import micro_run, one_thread, write_micro_data  # noqa: F401 - a fixture

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_micro_data(tmp_path_factory.mktemp("host_work_data"), 32)


def _count_calls(monkeypatch, owner, name: str) -> list[int]:
    calls, real = [0], getattr(owner, name)

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


@pytest.mark.parametrize("objective", ["cmlm", "mdc"])
def test_the_masks_of_a_micro_batch_are_drawn_once(data, tmp_path, monkeypatch, objective):
    """cmlm divides its loss by the masks it draws: the denominator counts the prepared batch's masks instead of
    drawing them a second time on a CPU generator."""
    draws = _count_calls(monkeypatch, objectives_mod, "apply_mask")  # what every mask draw calls
    cfg = micro_run(data, f"objective.name={objective}", steps=3, batch_size=4, grad_accum=2, ckpt_every=3)
    train_mod.train(cfg, tmp_path / "run", progress=False)
    assert draws[0] == 3 * 2  # steps x micro-batches


def test_the_in_memory_set_is_tokenized_once_and_served_as_ready_tensors(data, tmp_path, monkeypatch):
    calls = _count_calls(monkeypatch, CaptionTokenizer, "__call__")
    cfg = micro_run(data, "data.in_memory=true", steps=6, batch_size=4, ckpt_every=6)
    train_mod.train(cfg, tmp_path / "run", progress=False)
    assert calls[0] == 1  # the whole split at once, not once per batch

    calls[0] = 0  # the shard loader's batches are tokenized as they come
    train_mod.train(micro_run(data, steps=3, batch_size=4, ckpt_every=3), tmp_path / "shards", progress=False)
    assert calls[0] == 3


def test_ready_tokens_are_what_the_tokenizer_gives_each_batch(data):
    """Bitwise the tokens and truncation counts of tokenizing each batch's captions (context 12: some are cut)."""
    tokenizer = CaptionTokenizer(12)
    loader = build_loader(DataConfig(path=str(data), in_memory=True), image_size=32, batch_size=5, seed=3,
                          drop_last=False, context_length=12)
    truncated = 0
    for batch in loader:
        tokens, cut = tokenizer.tokenize_batch(batch["caption"])
        assert torch.equal(batch["tokens"], tokens) and batch["truncated"] == cut
        truncated += cut
    assert truncated > 0
    plain = next(iter(build_loader(DataConfig(path=str(data), in_memory=True), image_size=32, batch_size=5)))
    assert "tokens" not in plain  # only asked for


def test_the_trainer_is_a_loop_around_one_step():
    """nanoGPT's shape: at most 7 methods and about 150 lines, and one method that takes the whole step."""
    tree = ast.parse(inspect.getsource(train_mod.Trainer))
    cls = tree.body[0]
    methods = [n.name for n in cls.body if isinstance(n, ast.FunctionDef)]
    assert len(methods) <= 7 and "step" in methods and "run" in methods, methods
    assert cls.end_lineno - cls.lineno + 1 <= 165
