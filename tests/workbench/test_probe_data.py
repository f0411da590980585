"""`mdc probe`: data formats (synthetic labels, class folders, CIFAR pickles), cached features, the CLI."""

import json
import os
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from mdc_core.checkpoint import save_checkpoint
from mdc_core.config import DataConfig, ObjectiveConfig, RunConfig
from mdc_core.data import build_loader
from mdc_core.factory import CLIPModel, create_model
from mdc_core.transforms import eval_transform, load_image
from mdc_workbench.cli import main
from mdc_workbench.data import vocabularies, write_synthetic_dataset
from mdc_workbench.eval import probe_data
from mdc_workbench.eval.probe_data import extract_features, load_cifar_pickle, open_probe_dataset, probe_run
from tests.conftest import micro_config

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (40, 50, 220)}


def micro_run(folder, objective="mdc", seed=0):
    torch.manual_seed(seed)
    cfg = RunConfig(model=micro_config(), objective=ObjectiveConfig(name=objective))
    model = create_model(cfg, objective).eval()
    save_checkpoint(folder, 1, cfg, model)
    return model


def solid(colour, seed, size=40):
    rng = np.random.default_rng(seed)
    arr = np.clip(np.array(colour)[None, None] + rng.normal(0, 12, (size, size, 3)), 0, 255).astype(np.uint8)
    return Image.fromarray(arr)


@pytest.fixture
def class_folders(tmp_path):
    root = tmp_path / "imagenet_like"
    for split, n in (("train", 6), ("val", 3)):
        for name, colour in COLOURS.items():
            (root / split / name).mkdir(parents=True)
            for i in range(n):
                solid(colour, hash((split, name, i)) % 1000).save(root / split / name / f"{i}.png")
    return root


def write_cifar(folder, n_per_batch=12, protocol=2):
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in ("data_batch_1", "data_batch_2", "test_batch"):
        labels = [i % 10 for i in range(n_per_batch)]
        data = rng.integers(0, 256, (n_per_batch, 3072), dtype=np.uint8)
        with open(folder / name, "wb") as fh:
            pickle.dump({b"batch_label": name.encode(), b"labels": labels, b"data": data,
                         b"filenames": [f"{i}.png".encode() for i in range(n_per_batch)]}, fh, protocol=protocol)
    with open(folder / "batches.meta", "wb") as fh:
        pickle.dump({b"label_names": [f"c{i}".encode() for i in range(10)], b"num_vis": 3072}, fh, protocol=protocol)


def test_synth_all_tasks_probe_and_cache(tmp_path, monkeypatch):
    data = tmp_path / "synth"
    write_synthetic_dataset(data, 96, image_size=32, n_val=4, n_test=32, n_compgen=4, progress=False, workers=1)
    micro_run(tmp_path / "run")
    result = probe_run(tmp_path / "run", data, weight_decay=1e-4, protocol="clip_benchmark")
    assert result["format"] == "synth" and result["pool"] == "gap" and result["objective"] == "mdc"
    assert set(result["tasks"]) == set(vocabularies())
    for task, r in result["tasks"].items():
        assert r["classes"] == [str(v) for v in vocabularies()[task]]
        assert r["n_test"] == 32 and r["n_train"] == 96
        assert 0.0 <= r["balanced_accuracy"] <= 1.0 and r["top1"] <= r["top5"] <= 1.0
    cached = sorted(p.name for p in (tmp_path / "run" / "probe_features").glob("*.safetensors"))
    assert len(cached) == 12  # 6 tasks x (train, test)

    def boom(*a, **k):
        raise AssertionError("features should come from the cache")

    monkeypatch.setattr(probe_data, "extract_features", boom)
    again = probe_run(tmp_path / "run", data, weight_decay=1e-4, protocol="clip_benchmark")
    assert again["tasks"] == result["tasks"]


def test_synth_labels_match_sample_json(tmp_path):
    data = tmp_path / "synth"
    write_synthetic_dataset(data, 8, image_size=32, n_val=1, n_test=5, n_compgen=1, progress=False, workers=1)
    ds = open_probe_dataset(data, "test", limit=3)
    batches = list(ds.read(32, 2))
    assert [len(b[0]) for b in batches] == [2, 1]  # limit cuts the second batch
    colours = torch.cat([b[1]["colour"] for b in batches])
    metas = next(iter(build_loader(DataConfig(path=str(data)), split="test", image_size=32, batch_size=3,
                                   shuffle=False)))["meta"]
    assert colours.tolist() == [vocabularies()["colour"].index(m["labels"]["colour"]) for m in metas]


def test_folder_features_are_the_encoder_gap_and_colours_separate(tmp_path, class_folders):
    model = micro_run(tmp_path / "run")
    train = open_probe_dataset(class_folders, "train")
    assert train.format == "folder" and train.classes == {"class": ["blue", "green", "red"]}
    feats, labels = extract_features(model, train, pool="gap", image_size=32, batch_size=5)
    assert feats.shape == (18, 32) and labels["class"].tolist() == [0] * 6 + [1] * 6 + [2] * 6
    first = load_image(class_folders / "train" / "blue" / "0.png", 32)[None]
    with torch.no_grad():
        assert torch.allclose(feats[0], model.pooled_features(first, "gap")[0], atol=1e-5)
    result = probe_run(tmp_path / "run", class_folders, weight_decay=0.0, protocol="clip_benchmark")
    r = result["tasks"]["class"]
    assert r["n_test"] == 9 and r["n_classes"] == 3 and r["top5_k"] == 3
    assert r["top1"] >= 0.8  # solid colours are linearly separable even in a random encoder's features
    ckpt = tmp_path / "run" / "checkpoints" / "step_00000001"  # a checkpoint path shares the run's cache
    assert probe_run(ckpt, class_folders, weight_decay=0.0, protocol="clip_benchmark")["tasks"] == result["tasks"]
    assert len(list((tmp_path / "run" / "probe_features").glob("*.safetensors"))) == 2


def test_cifar_pickles_read_like_torchvision(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar(folder)
    for root in (folder, tmp_path):  # the batches folder or the folder the tarball was unpacked into
        train = open_probe_dataset(root, "train")
        assert train.format == "cifar" and train.classes["class"] == [f"c{i}" for i in range(10)]
    images, labels = next(train.read(32, 30))
    assert images.shape == (24, 3, 32, 32) and labels["class"].tolist() == [i % 10 for i in range(12)] * 2
    raw = load_cifar_pickle(folder / "data_batch_1")
    hwc = raw["data"][0].reshape(3, 32, 32).transpose(1, 2, 0)  # torchvision's CIFAR10 layout
    assert torch.allclose(images[0], eval_transform(32)(Image.fromarray(hwc)))
    test = open_probe_dataset(tmp_path, "test")
    assert sum(len(b[0]) for b in test.read(32, 5)) == 12


def test_cifar_python3_protocol_and_malicious_pickle(tmp_path):
    write_cifar(tmp_path / "c", protocol=pickle.HIGHEST_PROTOCOL)
    assert len(next(open_probe_dataset(tmp_path / "c", "test").read(32, 64))[0]) == 12

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    bad = tmp_path / "bad"
    write_cifar(bad)
    (bad / "test_batch").write_bytes(pickle.dumps({"data": Evil()}))
    with pytest.raises(ValueError, match="refusing to load"):
        open_probe_dataset(bad, "test")


def test_bad_input_errors(tmp_path, class_folders):
    with pytest.raises(FileNotFoundError, match="not found"):
        open_probe_dataset(tmp_path / "nope", "train")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="cannot tell the format"):
        open_probe_dataset(tmp_path / "empty", "train")
    micro_run(tmp_path / "run")
    with pytest.raises(ValueError, match="unknown task"):
        probe_run(tmp_path / "run", class_folders, task="shape")
    (class_folders / "val" / "purple").mkdir()
    solid((128, 0, 128), 1).save(class_folders / "val" / "purple" / "0.png")
    with pytest.raises(ValueError, match="absent from"):
        open_probe_dataset(class_folders, "test")


def test_cli_probe_table_of_a_clip_and_an_arc_run(tmp_path, class_folders, capsys):
    model = micro_run(tmp_path / "clip", objective="clip")
    assert isinstance(model, CLIPModel)
    micro_run(tmp_path / "arc", objective="arc")
    out = tmp_path / "probe.json"
    code = main(["probe", "--run", str(tmp_path / "clip"), "--run", str(tmp_path / "arc"), "--data",
                 str(class_folders), "--json", "--quiet", "--protocol", "clip_benchmark", "--weight-decay", "0",
                 "--baselines", "--out", str(out)])
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    clip, arc = printed["runs"]
    assert (clip["pool"], clip["objective"], arc["pool"], arc["objective"]) == ("cls", "clip", "gap", "arc")
    assert set(clip["tasks"]["class"]) >= {"top1", "top5", "balanced_accuracy"}
    rows = printed["table"].splitlines()
    assert rows[0] == "| run | objective | feature | class |" and len(rows) == 4
    assert rows[2] == f"| clip | clip | cls | {100 * clip['tasks']['class']['top1']:.1f} |"
    assert main(["probe", "--run", str(tmp_path / "missing"), "--data", str(class_folders)]) == 2
    assert "mdc: error:" in capsys.readouterr().err


def test_cli_probe_has_random_init_rows_by_default(tmp_path, class_folders, capsys):
    """The default probe table: the converged L-BFGS probe, plus one untrained row per feature kind (CLS, GAP)
    and, asked for, the raw pixels."""
    micro_run(tmp_path / "clip", objective="clip", seed=1)
    micro_run(tmp_path / "mdc", objective="mdc", seed=2)
    code = main(["probe", "--run", str(tmp_path / "clip"), "--run", str(tmp_path / "mdc"), "--data",
                 str(class_folders), "--json", "--quiet", "--baselines", "random", "pixels"])
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    inits = [(r["init"], r["pool"], r["protocol"]) for r in printed["runs"]]
    assert inits == [("trained", "cls", "lbfgs"), ("trained", "gap", "lbfgs"), ("random", "cls", "lbfgs"),
                     ("random", "gap", "lbfgs"), ("pixels", "pixels", "lbfgs")]
    rows = printed["table"].splitlines()
    assert rows[4].startswith("| random init (clip architecture) | clip | cls |")
    assert rows[5].startswith("| random init (mdc architecture) | mdc | gap |")
    assert rows[6].startswith("| raw pixels | - | pixels |")
    pixels = printed["runs"][4]["tasks"]["class"]
    assert pixels["top1"] == 1.0 and pixels["C"] is not None  # solid colours: raw pixels separate them
    assert len(pixels["test_correct"]) == pixels["n_test"] == 9
    assert main(["probe", "--run", str(tmp_path / "mdc"), "--data", str(class_folders), "--weight-decay", "0"]) == 2
    assert "clip_benchmark" in capsys.readouterr().err


def test_random_init_features_are_the_untrained_architecture(tmp_path, class_folders):
    from mdc_core.checkpoint import resolve_checkpoint
    from mdc_workbench.eval.probe_baselines import random_init_model

    trained = micro_run(tmp_path / "run", seed=3)  # weights drawn under seed 3; the config's train.seed is 0
    cfg = RunConfig.load(resolve_checkpoint(tmp_path / "run") / "config.json")
    result = probe_run(tmp_path / "run", class_folders, init="random")
    assert result["init"] == "random" and result["protocol"] == "lbfgs"
    cached = sorted(p.name for p in (tmp_path / "run" / "probe_features").glob("*.safetensors"))
    assert cached and all("-random-" in name for name in cached)
    fresh = random_init_model(cfg)
    torch.manual_seed(cfg.train.seed)
    reference = create_model(cfg, "mdc")
    pairs = list(zip(fresh.state_dict().values(), reference.state_dict().values(), strict=True))
    assert all(torch.equal(a, b) for a, b in pairs), "random init must equal the model training starts from"
    assert any(not torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), trained.state_dict().values(),
                                                     strict=True))


def test_probe_run_takes_a_list_of_tasks(tmp_path):
    data = tmp_path / "synth"
    write_synthetic_dataset(data, 48, image_size=32, n_val=4, n_test=24, n_compgen=4, progress=False, workers=1)
    micro_run(tmp_path / "run")
    result = probe_run(tmp_path / "run", data, task=["shape", "colour"], c=1.0)
    assert list(result["tasks"]) == ["shape", "colour"] and result["tasks"]["shape"]["C"] == 1.0
    with pytest.raises(ValueError, match="unknown task 'hue'"):
        probe_run(tmp_path / "run", data, task=["shape", "hue"])


def test_heldout_refuses_the_runs_own_pretraining_images(tmp_path):
    """A probe that trains on the images the run was pretrained on says so (seen_in_pretraining); --heldout makes it
    an error. A set written with another seed is not seen."""
    data, other = tmp_path / "synth", tmp_path / "synth_probe"
    write_synthetic_dataset(data, 24, image_size=32, n_val=2, n_test=12, n_compgen=2, progress=False, workers=1)
    write_synthetic_dataset(other, 24, seed=1000, image_size=32, n_val=2, n_test=12, n_compgen=2, progress=False,
                            workers=1)
    torch.manual_seed(0)
    cfg = RunConfig(model=micro_config(), data=DataConfig(path=str(data)))
    save_checkpoint(tmp_path / "run", 1, cfg, create_model(cfg, "mdc").eval())
    seen = probe_run(tmp_path / "run", data, task="shape", c=1.0)
    assert seen["seen_in_pretraining"] is True
    with pytest.raises(ValueError, match="pretrained on"):
        probe_run(tmp_path / "run", data, task="shape", c=1.0, heldout=True)
    assert main(["probe", "--run", str(tmp_path / "run"), "--data", str(data), "--task", "shape", "--heldout",
                 "--quiet"]) == 2
    fresh = probe_run(tmp_path / "run", other, task="shape", c=1.0, heldout=True)
    assert fresh["seen_in_pretraining"] is False
    assert probe_data.seen_in_pretraining(data, data / "train") and not probe_data.seen_in_pretraining(data, other)
