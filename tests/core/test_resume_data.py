"""``--resume --data NEW`` compares content, not names and sizes (issue 49 item 3): re-captioned shards of the same
sizes are refused and the refusal writes nothing; a run recorded before contents were hashed still resumes on
unchanged data and records their content; each shard is read once (its digest kept with its size and mtime)."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from mdc_core import sources
from mdc_core.run_folder import FINGERPRINT_FILE, known_digests
from mdc_core.sources import resolve_source
from mdc_workbench.cli import main


def _recaption(shard: Path) -> None:
    """Rewrite `shard` with each caption's characters reversed: every member and the file keep their sizes."""
    size = shard.stat().st_size
    with tarfile.open(shard) as tar:
        members = [(info, tar.extractfile(info).read() if info.isfile() else None) for info in tar.getmembers()]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for info, payload in members:
            if info.name.endswith(".txt"):
                payload = payload[::-1]
            tar.addfile(info, io.BytesIO(payload) if payload is not None else None)
    shard.write_bytes(buffer.getvalue().ljust(size, b"\0"))
    assert shard.stat().st_size == size


def _snapshot(run: Path) -> dict[str, bytes]:
    return {p.relative_to(run).as_posix(): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()
            and p.name != ".mdc.lock"}


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("mdc: error:") and "\n" not in err, err
    return err


def test_recaptioned_shards_of_the_same_sizes_are_refused_and_nothing_is_written(trained_run, tmp_path, capsys):
    data, run, _ = trained_run
    copy, other = tmp_path / "run", tmp_path / "recaptioned"
    shutil.copytree(run, copy)
    shutil.copytree(data, other)
    shards = resolve_source(str(other), split="train").shards
    for shard in shards:
        _recaption(Path(shard))
    old, new = resolve_source(str(data), split="train"), resolve_source(str(other), split="train")
    assert old.names_and_sizes() == new.names_and_sizes()  # what the fingerprint was: it took them for the same
    before = _snapshot(copy)
    assert main(["train", "--out", str(copy), "--resume", "--data", str(other), "--steps", "6", "--quiet"]) == 2
    assert "is not the data this run trained on" in _one_line(capsys)
    assert _snapshot(copy) == before  # config.json, data_fingerprint.json, logs and checkpoints as they were
    # the same with the run's old location gone: still refused, still nothing written
    saved = json.loads((copy / "config.json").read_text())
    saved["data"]["path"] = str(tmp_path / "gone")
    for cfg_file in (copy / "config.json", *copy.glob("checkpoints/step_*/config.json")):
        cfg_file.write_text(json.dumps(saved))
    before = _snapshot(copy)
    assert main(["train", "--out", str(copy), "--resume", "--data", str(other), "--steps", "6", "--quiet"]) == 2
    assert "their content fingerprints differ" in _one_line(capsys)
    assert _snapshot(copy) == before


def _legacy_record(run: Path, data: Path) -> None:
    """data_fingerprint.json as runs wrote it before contents were hashed (names and sizes, no version)."""
    record = json.loads((run / FINGERPRINT_FILE).read_text())
    legacy = resolve_source(str(data), split="train").names_and_sizes()
    assert "version" not in legacy
    (run / FINGERPRINT_FILE).write_text(json.dumps({"path": record["path"], "images": record["images"],
                                                    "fingerprint": legacy}))


def test_a_run_recorded_before_contents_were_hashed_resumes_on_unchanged_data(trained_run, tmp_path, capsys):
    data, run, _ = trained_run
    copy, moved = tmp_path / "run", tmp_path / "moved"
    shutil.copytree(run, copy)
    _legacy_record(copy, data)
    # in place: accepted, and the content is recorded from now on
    assert main(["train", "--out", str(copy), "--resume", "--steps", "5", "--quiet"]) == 0
    record = json.loads((copy / FINGERPRINT_FILE).read_text())
    assert record["fingerprint"]["version"] == 2 and len(record["shards"]) == len(
        resolve_source(str(data), split="train").shards)
    # moved, the old location gone: names and sizes compared (all the old record holds), the warning says so
    _legacy_record(copy, data)
    shutil.copytree(data, moved)
    saved = json.loads((copy / "config.json").read_text())
    saved["data"]["path"] = str(tmp_path / "gone")
    for cfg_file in (copy / "config.json", *copy.glob("checkpoints/step_*/config.json")):
        cfg_file.write_text(json.dumps(saved))
    with pytest.warns(UserWarning, match="shard names and sizes checked, not their bytes"):
        assert main(["train", "--out", str(copy), "--resume", "--data", str(moved), "--steps", "6", "--quiet"]) == 0
    assert json.loads((copy / FINGERPRINT_FILE).read_text())["fingerprint"] == \
        resolve_source(str(moved), split="train").fingerprint()
    # an old record while the old location still exists: the contents of both are compared
    copy2, other = tmp_path / "run2", tmp_path / "recaptioned"
    shutil.copytree(run, copy2)
    _legacy_record(copy2, data)
    shutil.copytree(data, other)
    for shard in resolve_source(str(other), split="train").shards:
        _recaption(Path(shard))
    before = _snapshot(copy2)
    assert main(["train", "--out", str(copy2), "--resume", "--data", str(other), "--steps", "6", "--quiet"]) == 2
    assert "data.path: saved" in _one_line(capsys)
    assert _snapshot(copy2) == before


def test_each_shard_is_read_once_and_again_only_when_it_changes(trained_run, tmp_path, monkeypatch):
    data, run, _ = trained_run
    reads = []
    original = sources.file_sha256
    monkeypatch.setattr(sources, "file_sha256", lambda path: reads.append(Path(path).name) or original(path))
    monkeypatch.setattr(sources, "_SHA256_MEMO", {})
    copy = tmp_path / "data"
    shutil.copytree(data, copy)
    source = resolve_source(str(copy), split="train")
    known: dict = {}
    first = source.fingerprint(known)
    assert sorted(reads) == sorted([*(Path(s).name for s in source.shards), "manifest.json"])
    reads.clear()
    monkeypatch.setattr(sources, "_SHA256_MEMO", {})  # another process: only the recorded digests
    assert source.fingerprint(known) == first and reads == ["manifest.json"]
    shard = Path(source.shards[0])
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 10**9))  # touched: read again
    assert source.fingerprint(known) == first and reads == ["manifest.json", shard.name, "manifest.json"]
    recorded = known_digests(run)  # the run folder keeps its shards' digests with their sizes and mtimes
    assert set(recorded) == {str(Path(s).resolve()) for s in resolve_source(str(data), split="train").shards}
    assert all(set(entry) == {"bytes", "mtime_ns", "ctime_ns", "sha256"} for entry in recorded.values())
