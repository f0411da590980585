"""In-memory data (data.in_memory): the shard loader's samples, bitwise; order, ranks, resume, skips, errors."""

import io
import tarfile
from collections import Counter
from pathlib import Path

import pytest
import torch

from mdc_core.config import ConfigError, DataConfig
from mdc_core.data import MemoryBatches, build_loader, decode_split
from mdc_core.sources import resolve_source
from mdc_core.transforms import eval_transform, normalise_batch
from mdc_workbench.data import write_synthetic_dataset


@pytest.fixture(scope="module")
def synth_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("synth_mem")
    write_synthetic_dataset(root, 40, seed=0, image_size=32, n_val=12, n_test=8, n_compgen=8, shard_size=12,
                            progress=False, workers=1)
    return root


def _all(loader) -> dict:
    batches = list(loader)
    return {"image": torch.cat([b["image"] for b in batches]), "caption": [c for b in batches for c in b["caption"]],
            "key": [k for b in batches for k in b["key"]], "meta": [m for b in batches for m in b["meta"]]}


@pytest.mark.parametrize("split", ["train", "val"])
def test_same_samples_as_the_shard_loader(synth_root, split):
    kw = dict(split=split, image_size=32, batch_size=5, shuffle=False, drop_last=False)
    shards = _all(build_loader(DataConfig(path=str(synth_root)), **kw))
    memory = _all(build_loader(DataConfig(path=str(synth_root), in_memory=True), **kw))
    assert memory["key"] == shards["key"] and len(memory["key"]) == (40 if split == "train" else 12)
    assert memory["caption"] == shards["caption"]
    assert memory["meta"] == shards["meta"]
    assert torch.equal(memory["image"], shards["image"])  # bitwise: same decode, geometry and normalisation


def test_normalise_batch_is_bitwise_the_per_image_transform():
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (3, 3, 8, 8), generator=g, dtype=torch.uint8)
    from torchvision.transforms import functional as TF
    one_by_one = torch.stack([eval_transform(8)(TF.to_pil_image(im)) for im in images])
    assert torch.equal(normalise_batch(images), one_by_one)
    assert normalise_batch(torch.full((1, 3, 2, 2), 255, dtype=torch.uint8))[0, 0, 0, 0].item() == pytest.approx(
        (1 - 0.48145466) / 0.26862954)


def test_shuffled_epochs_cover_every_sample_once_and_differ(synth_root):
    cfg = DataConfig(path=str(synth_root), in_memory=True)
    kw = dict(image_size=32, batch_size=8, seed=3)
    e0, e0_again = _all(build_loader(cfg, epoch=0, **kw))["key"], _all(build_loader(cfg, epoch=0, **kw))["key"]
    e1 = _all(build_loader(cfg, epoch=1, **kw))["key"]
    assert e0 == e0_again and e0 != e1  # a function of (seed, epoch)
    assert sorted(e0) == sorted(e1) and len(set(e0)) == 40  # 40 = 5 full batches of 8: every sample once
    assert e0 != sorted(e0)
    partial = _all(build_loader(cfg, epoch=0, image_size=32, batch_size=16, seed=3))["key"]
    assert len(partial) == 32  # drop_last: 2 full batches of 16 out of 40


def test_ranks_deal_batches_and_skip_resumes(synth_root):
    cfg = DataConfig(path=str(synth_root), in_memory=True)
    kw = dict(image_size=32, batch_size=4, seed=1, epoch=2)
    one = [b["key"] for b in build_loader(cfg, **kw)]
    ranks = [[b["key"] for b in build_loader(cfg, rank=r, world=2, **kw)] for r in range(2)]
    assert ranks[0] == one[0::2] and ranks[1] == one[1::2]  # rank r's a-th batch = one process's batch 2a + r
    assert [b["key"] for b in build_loader(cfg, skip_batches=3, **kw)] == one[3:]


def test_corrupt_records_are_skipped_and_counted_once_per_epoch(tmp_path, synth_root):
    src = next((synth_root / "val").glob("*.tar"))
    bad = tmp_path / "bad.tar"
    with tarfile.open(src) as tin, tarfile.open(bad, "w") as tout:
        for member in tin.getmembers():
            data = tin.extractfile(member).read()
            if member.name.endswith(".jpg") and member.name.startswith(("100000000", "100000001")):
                data = b"not a jpeg"
            member.size = len(data)
            tout.addfile(member, io.BytesIO(data))
    cfg = DataConfig(path=str(bad), in_memory=True)
    batches = list(build_loader(cfg, split=None, image_size=32, batch_size=3, shuffle=False, drop_last=False))
    assert sum(len(b["key"]) for b in batches) == 10
    assert batches[0]["skipped"] == {"bad_image": 2} and batches[0]["n_skipped"] == 2
    assert all(b["n_skipped"] == 0 for b in batches[1:])
    rank1 = list(build_loader(cfg, split=None, image_size=32, batch_size=3, shuffle=False, rank=1, world=1 + 1))
    assert sum(Counter(b["skipped"]).total() for b in rank1) == 0  # only rank 0 reports


def test_decoded_once_per_process(synth_root):
    source = resolve_source(str(synth_root), "auto", "test")
    first = decode_split(source, 32)
    assert decode_split(source, 32) is first and first["images"].dtype == torch.uint8
    assert first["images"].shape == (8, 3, 32, 32)
    batches = MemoryBatches(source, image_size=32, batch_size=8, seed=0, epoch=0, skip_batches=0, shuffle=False,
                            drop_last=True)
    assert len(list(batches)) == 1


def test_in_memory_needs_no_augmentation():
    with pytest.raises(ConfigError, match="data.in_memory .* needs data.augment='none'"):
        DataConfig(path="x", in_memory=True, augment="rrc").validate()


def test_too_large_a_split_is_refused(synth_root):
    source = resolve_source(str(synth_root), "auto", "compgen")
    with pytest.raises(ValueError, match="data.in_memory is for small sets, set data.in_memory=false"):
        decode_split(source, 16, max_bytes=3 * 16 * 16 * 5)  # room for 5 images of 16 px
