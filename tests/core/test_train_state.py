"""The training state's one home (TrainState), starting a run from given weights (train(init_from=...)) and the data
source's own fingerprint."""

import csv
import dataclasses
import hashlib
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mdc_core import checkpoint as ck
from mdc_core.config import RunConfig, apply_overrides
from mdc_core.factory import load_model
from mdc_core.run_state import Counters, TrainState, rng_state
from mdc_core.sources import Source, resolve_source
from mdc_core.train import init_from_weights, lr_lambda, param_groups, seed_everything, train
from tests.train_helpers import (
    assert_same_metrics,
    micro_run,
    one_thread,  # noqa: F401 - a fixture
    read_metrics,
    write_micro_data,
)

pytestmark = pytest.mark.usefixtures("one_thread")

# the keys of every state.pt written so far (the trainer's checkpoint before TrainState)
STATE_KEYS = {"optimizer", "scheduler", "rng", "step", "epoch", "batch_in_epoch", "world", "global_batch", "skipped",
              "skipped_epoch", "truncated", "nonfinite_skipped", "ema_n_averaged"}


@pytest.fixture(scope="module")
def source_run(tmp_path_factory) -> tuple[Path, Path]:
    """(data, a two-step run on it)."""
    root = tmp_path_factory.mktemp("state")
    data = write_micro_data(root / "data", 16)
    train(micro_run(data, steps=2, batch_size=4, ckpt_every=2), root / "src", progress=False)
    return data, root / "src"


def test_state_dict_round_trip_and_the_keys_on_disk(source_run):
    _, run = source_run
    saved = ck.load_train_state(ck.latest_checkpoint(run))
    assert set(saved) == STATE_KEYS  # same keys on disk as before TrainState
    state = TrainState.from_state_dict(saved)
    assert (state.step, state.epoch, state.world, state.global_batch) == (2, 0, 1, 4)
    assert state.batch_in_epoch == 2 and state.ema_n_averaged == 0  # two micro-batches read; no EMA
    again = state.state_dict()
    assert list(again) == list(saved)  # the same keys in the same order
    assert again["optimizer"]["param_groups"] == saved["optimizer"]["param_groups"]
    assert TrainState.from_state_dict(again) == state


def test_an_older_partial_state_takes_defaults_and_one_without_a_step_fails():
    state = TrainState.from_state_dict({"step": 5, "epoch": 1, "batch_in_epoch": 3})  # a hand-built step-5 state
    assert state.counters == Counters(5) and (state.world, state.global_batch, state.ema_n_averaged) == (1, 0, 1)
    assert (state.optimizer, state.scheduler, state.rng) == (None, None, None)
    assert set(state.state_dict()) == STATE_KEYS - {"optimizer", "scheduler", "rng"}  # lost parts are not written
    counters = Counters(3, 2, 1, Counter(bad_image=4), Counter(bad_image=1))
    assert TrainState.from_state_dict(TrainState(counters, 1, 7).state_dict()).counters == counters
    with pytest.raises(ValueError, match=r"train state without a 'step' \(keys: epoch\)"):
        TrainState.from_state_dict({"epoch": 1})


def _hand_built_step_0(out: Path, cfg: RunConfig, source: Path) -> None:
    """What eval/captioning._seed_run did before train() had init_from: a step-0 checkpoint holding the source's
    weights, a fresh AdamW and schedule and the seed's RNG state, for ``train(resume=True)`` to continue."""
    model = load_model(source)[0]
    tcfg = cfg.train
    opt = torch.optim.AdamW(param_groups(model, tcfg.weight_decay), lr=tcfg.lr, betas=tcfg.betas)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_lambda(s, tcfg.warmup_steps, tcfg.steps, tcfg.min_lr_ratio))
    seed_everything(tcfg.seed)
    state = TrainState(optimizer=opt.state_dict(), scheduler=sched.state_dict(), rng=rng_state())
    ck.save_checkpoint(out, 0, cfg, model, train_state=state.state_dict(), keep_last=tcfg.keep_last)


def test_init_from_trains_as_the_hand_built_step_0_checkpoint_did(source_run, tmp_path):
    data, src = source_run
    cfg = apply_overrides(RunConfig.load(src / "config.json"), ["train.steps=3", "train.ckpt_every=3",
                                                                "train.seed=7"])
    _hand_built_step_0(tmp_path / "before", cfg, src)
    before = train(cfg, tmp_path / "before", resume=True, progress=False)
    after = train(cfg, tmp_path / "after", init_from=src, progress=False)
    assert (before.steps, after.steps, after.start_step) == (3, 3, 0)
    assert_same_metrics(read_metrics(tmp_path / "before"), read_metrics(tmp_path / "after"), rel=0)
    a = load_file(str(before.checkpoint / "model.safetensors"))
    b = load_file(str(after.checkpoint / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    weights = load_file(str(ck.latest_checkpoint(src) / "model.safetensors"))
    assert 0 < max((weights[k].float() - b[k].float()).abs().max().item() for k in b) < 0.01  # not re-initialised
    assert not (tmp_path / "after" / "checkpoints" / "step_00000000").exists()  # no hand-built checkpoint
    assert RunConfig.load(tmp_path / "after" / "config.json") == RunConfig.load(tmp_path / "before" / "config.json")


def test_a_run_from_given_weights_that_stopped_before_its_first_checkpoint_starts_over_from_them(source_run,
                                                                                                 tmp_path):
    _, src = source_run
    cfg = apply_overrides(RunConfig.load(src / "config.json"), ["train.steps=2", "train.ckpt_every=2"])
    clean = train(cfg, tmp_path / "clean", init_from=src, progress=False)
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    cfg.save(stopped / "config.json")
    (stopped / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 9.0}) + "\n")  # killed after step 1
    with pytest.warns(UserWarning, match="stopped before its first checkpoint; starting it over from step 0"):
        again = train(cfg, stopped, resume=True, init_from=src, progress=False)
    a = load_file(str(clean.checkpoint / "model.safetensors"))
    b = load_file(str(again.checkpoint / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)  # from the given weights again, not a fresh initialisation
    assert (stopped / "metrics_before_start_over_1.jsonl").is_file()


def test_init_from_a_different_model_fails_naming_the_key(source_run, tmp_path):
    data, src = source_run
    wider = micro_run(data, "model.text_width=48", steps=1)
    with pytest.raises(ValueError, match=r"init_from .*src: its model differs from this run's \(model.text_width "):
        init_from_weights(wider, src)
    with pytest.raises(ValueError, match=r"its model differs"):
        train(wider, tmp_path / "wider", init_from=src, progress=False)
    assert not (tmp_path / "wider").exists()  # a run that could not start leaves no folder
    clip = apply_overrides(RunConfig.load(src / "config.json"), ['objective.name="clip"'])
    with pytest.raises(ValueError, match=r"the weights of its mdc model do not fit a clip model"):
        init_from_weights(clip, src)


def test_init_from_fills_a_corpus_head_size_left_unset(source_run):
    data, src = source_run
    saved = RunConfig.load(src / "config.json")
    unset = dataclasses.replace(saved, model=dataclasses.replace(saved.model, output_vocab_size=0))
    model, cfg = init_from_weights(unset, src)
    assert cfg.model.output_vocab_size == saved.model.output_vocab_size > 0
    assert torch.equal(model.output_ids, load_model(src)[0].output_ids)


# ----------------------------------------------------------------------------------------------------------
# the data source's fingerprint


def test_a_caption_table_fingerprints_its_bytes(tmp_path):
    table = tmp_path / "pairs.csv"
    with open(table, "w", newline="") as fh:
        csv.writer(fh).writerows([["image", "caption"], ["a.png", "a red circle"], ["b.png", "a blue square"]])
    digest = hashlib.sha256(("csv\n" + hashlib.sha256(table.read_bytes()).hexdigest()).encode()).hexdigest()
    assert resolve_source(str(table)).fingerprint() == {"kind": "csv", "items": 2, "digest": digest, "version": 2}
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    shutil.copy(table, moved / "pairs.csv")
    assert resolve_source(str(moved / "pairs.csv")).fingerprint()["digest"] == digest  # no folder name in it
    table.write_text(table.read_text().replace("red", "green"))
    assert resolve_source(str(table)).fingerprint()["digest"] != digest


def test_shards_fingerprint_contents_names_and_manifest(source_run, tmp_path):
    data, _ = source_run
    source = resolve_source(str(data), split="train")
    parts = ["wds", *(f"{Path(s).name}:{hashlib.sha256(Path(s).read_bytes()).hexdigest()}" for s in source.shards),
             hashlib.sha256((data / "manifest.json").read_bytes()).hexdigest()]
    expected = hashlib.sha256("\n".join(parts).encode()).hexdigest()
    assert source.fingerprint() == {"kind": "wds", "items": len(source.shards), "digest": expected, "version": 2}
    copy = tmp_path / "copy"
    shutil.copytree(data, copy)
    assert resolve_source(str(copy), split="train").fingerprint() == source.fingerprint()
    manifest = json.loads((copy / "manifest.json").read_text())
    (copy / "manifest.json").write_text(json.dumps({**manifest, "edited": True}))
    assert resolve_source(str(copy), split="train").fingerprint() != source.fingerprint()
    shutil.copy(data / "manifest.json", copy / "manifest.json")
    shard = Path(resolve_source(str(copy), split="train").shards[0])
    flipped = bytearray(shard.read_bytes())
    flipped[700] ^= 0x01  # inside the first member: the same name and size, other content
    shard.write_bytes(bytes(flipped))
    assert resolve_source(str(copy), split="train").fingerprint() != source.fingerprint()
    remote = Source("wds", "https://host/{0..1}.tar", shards=["https://host/0.tar", "https://host/1.tar"])
    assert remote.fingerprint() is None  # remote shards cannot be listed
