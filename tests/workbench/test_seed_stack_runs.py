"""A seed stack trained into run folders (mdc_workbench.seed_stack.train): each member's folder is the solo run of its
seed (mode "each": to the bit; "vmap": within tolerances scaled to each tensor), an interrupted stack resumes as if
never stopped, a member resumes alone as its solo run, and the tools open a member as a run; plans with `members`
(mdc_workbench.runs.members); every member's probe features in one pass (mdc_workbench.seed_stack.features)."""

import json
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mdc_core import checkpoint as ck
from mdc_core.factory import load_model
from mdc_core.run_folder import resolve_data_paths
from mdc_core.train import TrainingInterrupted, train
from mdc_workbench.seed_stack import member_config
from mdc_workbench.seed_stack.train import member_dir, stack_seeds, train_stack
from tests.numerics import assert_close_to_scale
from tests.train_helpers import micro_run, one_thread, read_metrics, write_micro_data  # noqa: F401 - a fixture

pytestmark = pytest.mark.usefixtures("one_thread")

SEEDS = [3, 5, 8]
STEPS = 4


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_micro_data(tmp_path_factory.mktemp("stack_run_data"), 32)


def run_config(data, dropout):
    """4 steps of 2 micro-batches, clipping, EMA, a checkpoint every 2 steps (both kept)."""
    return resolve_data_paths(micro_run(data, f"model.dropout={dropout}", steps=STEPS, batch_size=8, grad_accum=2,
                                        grad_clip=0.05, ema_decay=0.9, ckpt_every=2, keep_last=2))


@pytest.fixture(scope="module")
def solo(data, tmp_path_factory):
    """{dropout: (config, folder of the three solo runs)}: with dropout (what mode "each" carries) and without
    (what "vmap" carries)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    runs = {}
    for dropout in (0.1, 0.0):
        cfg, root = run_config(data, dropout), tmp_path_factory.mktemp(f"solo_{dropout}")
        for seed in SEEDS:
            train(member_config(cfg, seed), member_dir(root, seed), progress=False)
        runs[dropout] = (cfg, root)
    torch.set_num_threads(threads)
    return runs


def records(run):
    return [{k: v for k, v in r.items() if k != "samples_per_s"} for r in read_metrics(run)]


def unique(lines):
    """The records of a log, each once: a resume from the step that ended an epoch logs that epoch's end again (the
    core's resume does the same: the epoch ends in the next step's read, logged with the step before it)."""
    return list({json.dumps(r, sort_keys=True): r for r in lines}.values())


def assert_same_run(got: Path, want: Path, exact: bool) -> None:
    """Run folder `got` holds what run folder `want` holds: config, logs, checkpoints (weights, EMA, the train
    state), to the bit (`exact`) or within tolerances scaled to each tensor."""
    assert json.loads((got / "config.json").read_text()) == json.loads((want / "config.json").read_text())
    assert unique(read_metrics(got, "epochs.jsonl")) == unique(read_metrics(want, "epochs.jsonl"))
    mine, theirs = records(got), records(want)
    assert [r["step"] for r in mine] == [r["step"] for r in theirs] == list(range(1, STEPS + 1))
    for a, b in zip(mine, theirs, strict=True):
        if exact:
            assert a == b
        else:
            assert a.keys() == b.keys()
            for name, value in a.items():
                assert value == pytest.approx(b[name], rel=1e-5, abs=1e-7), (a["step"], name)
    names = [c.name for c in ck.checkpoint_folders(got)]
    assert names == [c.name for c in ck.checkpoint_folders(want)] == ["step_00000002", "step_00000004"]
    for name in names:
        a, b = got / ck.CKPT_DIR / name, want / ck.CKPT_DIR / name
        assert not ck.diagnose(a)
        for weights in ("model.safetensors", "ema.safetensors"):
            x, y = ck.load_weights(a / weights), ck.load_weights(b / weights)
            assert x.keys() == y.keys()
            for key in x:
                if exact or not y[key].is_floating_point():
                    assert torch.equal(x[key], y[key]), (name, weights, key)
                else:  # Adam's step of a near-zero gradient amplifies rounding: 1e-3 of each tensor's scale
                    assert_close_to_scale(x[key], y[key], rel=1e-3, msg=f"{name} {weights} {key}")
        sa, sb = ck.load_train_state(a), ck.load_train_state(b)
        assert {k: v for k, v in sa.items() if k not in ("optimizer", "rng")} == \
            {k: v for k, v in sb.items() if k not in ("optimizer", "rng")}
        assert sa["optimizer"]["param_groups"] == sb["optimizer"]["param_groups"]
        for i, moments in sb["optimizer"]["state"].items():
            for m, value in moments.items():
                if exact or m == "step":
                    assert torch.equal(sa["optimizer"]["state"][i][m], value), (name, i, m)
                else:
                    assert_close_to_scale(sa["optimizer"]["state"][i][m], value, rel=1e-3)
        for g in ("torch", "python", "numpy"):  # where each generator's state is as the solo run leaves it
            assert str(sa["rng"][g]) == str(sb["rng"][g]), (name, g)


@pytest.mark.parametrize("mode", ["each", "vmap"])
def test_each_member_folder_is_its_solo_run(solo, tmp_path, mode):
    cfg, root = solo[0.1 if mode == "each" else 0.0]
    results = train_stack(cfg, tmp_path / "stack", seeds=SEEDS, mode=mode, progress=False)
    assert [r.run_dir for r in results] == [member_dir(tmp_path / "stack", s) for s in SEEDS]
    assert all(r.steps == STEPS and r.start_step == 0 for r in results)
    for seed, result in zip(SEEDS, results, strict=True):
        assert result.checkpoint == member_dir(tmp_path / "stack", seed) / ck.CKPT_DIR / "step_00000004"
        assert_same_run(member_dir(tmp_path / "stack", seed), member_dir(root, seed), exact=mode == "each")
        assert result.final_loss == records(member_dir(root, seed))[-1]["loss"] or mode == "vmap"


def interrupt_at(step):
    """A run hook that sends this process SIGINT when the record of `step` is written (a Ctrl-C mid-run): the run
    stops at the end of the next step (the step's stop flag was read before its record), as a solo run does."""
    class Hook:
        def __init__(self, run_dir, start, cfg):
            self.first = str(run_dir).endswith(f"seed_{SEEDS[0]}")

        def record(self, record):
            if self.first and record["step"] == step:
                os.kill(os.getpid(), signal.SIGINT)

        def checkpoint(self, step, model):
            pass

        def close(self):
            pass

    return Hook


@pytest.mark.parametrize("mode", ["each", "vmap"])
def test_an_interrupted_stack_resumes_as_if_never_stopped(solo, tmp_path, mode):
    cfg, root = solo[0.1 if mode == "each" else 0.0]
    straight = tmp_path / "straight"
    if mode == "vmap":  # its own numbers (rounding differs from the solo runs'): an uninterrupted vmap stack
        train_stack(cfg, straight, seeds=SEEDS, mode=mode, progress=False)
    else:  # mode "each" is the solo runs to the bit (above)
        straight = root
    out = tmp_path / "stack"
    with pytest.raises(TrainingInterrupted) as stopped:
        train_stack(cfg, out, seeds=SEEDS, mode=mode, progress=False, hooks=[interrupt_at(2)])
    assert stopped.value.step == 3 and stopped.value.signum == signal.SIGINT
    for seed in SEEDS:  # every member stopped at the step boundary with a checkpoint off the cadence
        assert [c.name for c in ck.checkpoint_folders(member_dir(out, seed))] == ["step_00000002", "step_00000003"]
        assert [r["step"] for r in read_metrics(member_dir(out, seed))] == [1, 2, 3]
    results = train_stack(cfg, out, seeds=SEEDS, mode=mode, resume=True, progress=False)
    assert all(r.start_step == 3 and r.steps == STEPS for r in results)
    for seed in SEEDS:
        got, want = member_dir(out, seed), member_dir(straight, seed)
        assert records(got) == records(want)
        for name in ("step_00000004",):
            for weights in ("model.safetensors", "ema.safetensors"):
                x = ck.load_weights(got / ck.CKPT_DIR / name / weights)
                y = ck.load_weights(want / ck.CKPT_DIR / name / weights)
                assert all(torch.equal(x[k], y[k]) for k in y), (seed, name, weights)


def test_a_member_resumes_alone_as_its_solo_run(solo, tmp_path):
    cfg, root = solo[0.1]
    out = tmp_path / "stack"
    with pytest.raises(TrainingInterrupted):
        train_stack(cfg, out, seeds=SEEDS, progress=False, hooks=[interrupt_at(1)])
    member = member_dir(out, SEEDS[1])
    result = train(member_config(cfg, SEEDS[1]), member, resume=True, progress=False)
    assert result.start_step == 2 and result.steps == STEPS
    assert_same_run(member, member_dir(root, SEEDS[1]), exact=True)


def test_members_a_kill_left_ahead_go_back_to_the_others_step(solo, tmp_path):
    cfg, root = solo[0.1]
    out = tmp_path / "stack"
    for seed in SEEDS:  # a kill while the stack wrote its step-4 checkpoints: the first member had written its own
        shutil.copytree(member_dir(root, seed), member_dir(out, seed))
        if seed != SEEDS[0]:
            shutil.rmtree(member_dir(out, seed) / ck.CKPT_DIR / "step_00000004")
    with pytest.warns(UserWarning, match="goes back to step_00000002"):
        results = train_stack(cfg, out, seeds=SEEDS, resume=True, progress=False)
    assert all(r.start_step == 2 for r in results)
    for seed in SEEDS:
        assert_same_run(member_dir(out, seed), member_dir(root, seed), exact=True)
    for seed in SEEDS[1:]:  # no common step left: refused, naming the member, nothing written
        shutil.rmtree(member_dir(out, seed) / ck.CKPT_DIR / "step_00000004")
    shutil.rmtree(member_dir(out, SEEDS[0]) / ck.CKPT_DIR / "step_00000002")
    before = (member_dir(out, SEEDS[1]) / "metrics.jsonl").read_text()
    with pytest.raises(ValueError, match=f"seed_{SEEDS[0]} keeps no intact checkpoint of step 2"):
        train_stack(cfg, out, seeds=SEEDS, resume=True, progress=False)
    assert (member_dir(out, SEEDS[1]) / "metrics.jsonl").read_text() == before


def test_what_a_stack_refuses(data, tmp_path):
    cfg = run_config(data, 0.0)
    assert stack_seeds(cfg, members=3) == [cfg.train.seed, cfg.train.seed + 1, cfg.train.seed + 2]
    assert stack_seeds(cfg, seeds=[7, 2]) == [7, 2]
    for kwargs, message in (({}, "either members=K or seeds"), ({"members": 2, "seeds": [1, 2]}, "not both"),
                            ({"members": 0}, "positive number"), ({"members": True}, "positive number"),
                            ({"seeds": [1, 1]}, "distinct"), ({"seeds": []}, "distinct"),
                            ({"seeds": [-1]}, "distinct")):
        with pytest.raises(ValueError, match=message):
            stack_seeds(cfg, **kwargs)
    skip = resolve_data_paths(micro_run(data, steps=2, batch_size=8, nonfinite="skip"))
    with pytest.raises(ValueError, match="train.nonfinite='skip'"):
        train_stack(skip, tmp_path / "skip", members=2, progress=False)
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        train_stack(cfg, tmp_path / "none", members=2, resume=True, progress=False)
    assert not (tmp_path / "none").exists() and not (tmp_path / "skip").exists()  # a stack that never started
    with pytest.raises(ValueError, match="draws its noise"):
        train_stack(resolve_data_paths(micro_run(data, 'objective.name="d3pm"', steps=2, batch_size=8)),
                    tmp_path / "d3pm", members=2, progress=False)
    assert not (tmp_path / "d3pm").exists()


def test_the_tools_open_a_member_as_a_run(solo, data, tmp_path, capsys):
    from mdc_workbench.cli.main import main

    cfg, _ = solo[0.0]
    cfg = member_config(cfg, 0)
    cfg.train.steps = 2
    out = tmp_path / "stack"
    assert main(["train", "--data", str(data), "--out", str(out), "--members", "2", "--quiet",
                 *[f"--set={k}={json.dumps(v)}" for k, v in flat_config(cfg)]]) == 0
    said = capsys.readouterr().out
    assert "seed_0" in said and "seed_1" in said
    assert sorted(p.name for p in out.iterdir()) == ["seed_0", "seed_1"]
    member = member_dir(out, 1)
    assert json.loads((member / "config.json").read_text())["train"]["seed"] == 1
    image = tmp_path / "scene.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(image)
    assert main(["sample", "--run", str(member), "--image", str(image), "--length", "4", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["tokens"]) == 4
    assert main(["probe", "--run", str(member), "--data", str(data), "--task", "shape", "--json",
                 "--quiet", "--baselines", "--protocol", "clip_benchmark", "--weight-decay", "0"]) == 0
    probed = json.loads(capsys.readouterr().out)["runs"][0]
    assert probed["run"] == str(member) and probed["step"] == 2 and 0.0 <= probed["tasks"]["shape"]["top1"] <= 1.0
    model, saved = load_model(member, ema=True)
    assert saved.train.seed == 1 and sum(p.numel() for p in model.parameters()) > 0
    pytest.importorskip("gradio")
    from mdc_app.runs import discover_runs

    assert sorted(p.name for p in discover_runs(out).values()) == ["seed_0", "seed_1"]
    # --resume with --members reads the members' saved config: nothing left to train
    assert main(["train", "--out", str(out), "--members", "2", "--resume", "--quiet"]) == 0
    assert "nothing to train" in capsys.readouterr().out


def flat_config(cfg):
    """The micro run's model and train settings as --set KEY=VALUE pairs."""
    d = cfg.to_dict()
    return [(f"{s}.{k}", v) for s in ("model", "train", "objective") for k, v in d[s].items()
            if k not in ("seed", "device") and not (s == "model" and k == "output_vocab_size")]


STACK_NOTEBOOK = """\
import json, pathlib
from mdc_core.config import RunConfig
from mdc_workbench.seed_stack.train import train_stack
out = pathlib.Path(output_dir)
results = train_stack(RunConfig.load(config), out / "stack", seeds=train_seeds, progress=False)
members = {str(s): {"metrics": {"final_loss": r.final_loss},
                    "tables": {"stack_toy": {"metric": "final training loss", "values": {"mdc": r.final_loss}}}}
           for s, r in zip(train_seeds, results)}
(out / "metrics.json").write_text(json.dumps({"notebook": "stack_toy", "members": members}))
"""


def test_a_plan_with_members_trains_stacks_and_gathers_members_as_seeds(data, tmp_path):
    from mdc_workbench.runs.plans import load_plan
    from mdc_workbench.runs.runner import run_plan
    from tests.workbench.test_runs import write_notebook

    cfg = resolve_data_paths(micro_run(data, steps=2, batch_size=8))
    cfg.save(tmp_path / "micro.json")
    write_notebook(tmp_path / "stack.ipynb", 'output_dir: str = "."  # run folder\nconfig: str = ""  # RunConfig JSON\n'
                   'train_seeds: list = []  # the seeds of one stack', STACK_NOTEBOOK)
    plan_file = tmp_path / "stacks.yaml"
    plan_file.write_text(f"output_root: {tmp_path / 'out'}\nparameters: {{config: {tmp_path / 'micro.json'}}}\n"
                         "notebooks:\n  - path: stack.ipynb\n    seeds: [3, 5, 8]\n    members: 3\n")
    plan = load_plan(plan_file, root=tmp_path)
    assert [(r.run_id, r.parameters["train_seeds"]) for r in plan.runs] == [("stack__seeds=3-5-8", [3, 5, 8])]
    assert [r.status for r in run_plan(plan, progress=False, cwd=tmp_path)] == ["done"]
    runs = tmp_path / "out" / "stacks"
    losses = {s: read_metrics(member_dir(runs / "stack__seeds=3-5-8" / "stack", s))[-1]["loss"] for s in (3, 5, 8)}
    summary = json.loads((runs / "summary.json").read_text())
    table = summary["tables"]["stack_toy"]
    assert table["means"]["mdc"] == pytest.approx(sum(losses.values()) / 3, rel=1e-9)  # 3 members = 3 seeds
    low, high = table["intervals"]["mdc"]
    assert low < min(losses.values()) and max(losses.values()) < high  # a t-interval over the 3 seeds
    assert [r["run_id"] for r in summary["runs"]] == ["stack__seeds=3-5-8"]


@pytest.mark.parametrize(("entry", "message"), [
    ("    seeds: [1, 2]\n    members: 0\n", "members must be a positive integer"),
    ("    members: 2\n", "give 'seeds'"),
    ("    seeds: [1, 2]\n    members: 2\n    parameters: {train_seeds: [1]}\n", "through 'seeds'"),
])
def test_a_plan_entry_with_members_is_checked(tmp_path, entry, message):
    from mdc_workbench.runs.plans import load_plan
    from tests.workbench.test_runs import write_notebook

    write_notebook(tmp_path / "stack.ipynb", 'output_dir: str = "."  # run folder\ntrain_seeds: list = []  # seeds',
                   "pass")
    write_notebook(tmp_path / "solo.ipynb", 'output_dir: str = "."  # run folder\ntrain_seed: int = 0  # seed', "pass")
    tmp_path.joinpath("p.yaml").write_text(f"notebooks:\n  - path: stack.ipynb\n{entry}")
    with pytest.raises(ValueError, match=message):
        load_plan(tmp_path / "p.yaml", root=tmp_path)
    tmp_path.joinpath("r.yaml").write_text("seeds: [3, 5, 8]\nnotebooks:\n  - path: stack.ipynb\n    members: 2\n")
    assert [(r.run_id, r.parameters) for r in load_plan(tmp_path / "r.yaml", root=tmp_path).runs] == [
        ("stack__seeds=3-5", {"train_seeds": [3, 5]}), ("stack__seeds=8", {"train_seeds": [8]})]  # the plan's seeds
    tmp_path.joinpath("q.yaml").write_text("notebooks:\n  - path: solo.ipynb\n    seeds: [1, 2]\n    members: 2\n")
    with pytest.raises(ValueError, match="needs a 'train_seeds' parameter"):
        load_plan(tmp_path / "q.yaml", root=tmp_path)


def test_expand_members_gives_each_member_as_the_run_of_its_seed(capsys):
    from mdc_workbench.runs.members import expand_members, member_stacks

    assert member_stacks([1, 2, 3, 4, 5], 2, "e") == [[1, 2], [3, 4], [5]]
    assert member_stacks([1, 2], 4, "e") == [[1, 2]]
    solo = ("solo__seed=0", {"train_seed": 0, "steps": 2}, {"tables": {"t": {"values": {"a": 1.0}}}})
    stacked = ("s__seeds=1-2", {"train_seeds": [1, 2], "steps": 2},
               {"members": {"1": {"tables": {"t": {"values": {"a": 2.0}}}}, "2": {"metrics": {"x": 3}}, "two": {}}})
    assert expand_members([solo, stacked]) == [
        solo, ("s__seeds=1-2/seed=1", {"steps": 2, "train_seed": 1}, {"tables": {"t": {"values": {"a": 2.0}}}}),
        ("s__seeds=1-2/seed=2", {"steps": 2, "train_seed": 2}, {"metrics": {"x": 3}})]
    assert "member 'two'" in capsys.readouterr().out


@pytest.mark.parametrize("mode", ["each", "vmap"])
def test_stacked_probe_features_are_each_members_own(solo, data, mode):
    from mdc_workbench.eval.probe_data import extract_features, open_probe_dataset
    from mdc_workbench.seed_stack.features import stacked_features

    _, root = solo[0.1]
    models = [load_model(member_dir(root, s))[0] for s in SEEDS]
    split = open_probe_dataset(data, "test", limit=8)
    feats, labels = stacked_features(models, split, pool="gap", image_size=32, batch_size=3, mode=mode)
    assert feats.shape[:2] == (len(SEEDS), 8)
    for k, model in enumerate(models):
        want, want_labels = extract_features(model, split, pool="gap", image_size=32, batch_size=3)
        assert labels.keys() == want_labels.keys() and all(torch.equal(labels[t], want_labels[t]) for t in labels)
        if mode == "each":
            assert torch.equal(feats[k], want)
        else:
            assert_close_to_scale(feats[k], want, rel=1e-5)
    assert not torch.allclose(feats[0], feats[1])  # the members' own encoders, not one member's K times
    with pytest.raises(ValueError, match="mode 'fast'"):
        stacked_features(models, split, pool="gap", image_size=32, mode="fast")
