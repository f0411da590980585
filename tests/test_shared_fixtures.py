"""The shared test set-ups of tests/conftest.py: the check that keeps the session's trained run read-only and the
opt-in count of the suite's trainings."""

import pytest

from tests.conftest import _counted, changed_files, file_digests


def test_changed_files_names_every_file_written_added_or_removed_and_nothing_else(tmp_path):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    for name in ("run/metrics.jsonl", "run/checkpoints/model.safetensors", "run/config.json"):
        (tmp_path / name).write_text(name)
    before = file_digests(tmp_path)
    assert sorted(before) == ["run/checkpoints/model.safetensors", "run/config.json", "run/metrics.jsonl"]
    assert changed_files(before, file_digests(tmp_path)) == []  # read, not written
    (tmp_path / "run" / "metrics.jsonl").write_text("run/metrics.jsonl")  # the same bytes written again
    assert changed_files(before, file_digests(tmp_path)) == []
    (tmp_path / "run" / "checkpoints" / "model.safetensors").write_bytes(b"x")  # same size: other bytes
    (tmp_path / "run" / "config.json").unlink()
    (tmp_path / "run" / "probe.json").write_text("{}")
    assert changed_files(before, file_digests(tmp_path)) == [
        "run/checkpoints/model.safetensors", "run/config.json", "run/probe.json"]


def test_a_counted_training_notes_its_kind_and_test_and_returns_what_the_training_returns(tmp_path, monkeypatch):
    log = tmp_path / "count.log"
    calls = []

    def fake_train(cfg, out, *, resume=False):
        calls.append((cfg, out, resume))
        return "result"

    counted = _counted(str(log), "train", fake_train)
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/core/test_x.py::test_y[a b] (call)")
    assert counted("cfg", "out", resume=True) == "result" and calls == [("cfg", "out", True)]
    monkeypatch.delenv("PYTEST_CURRENT_TEST")
    assert counted("cfg", "out") == "result"
    assert log.read_text().splitlines() == ["train tests/core/test_x.py::test_y[a b]", "train ?"]

    def refused(cfg, out):
        raise FileExistsError("already holds a run")

    log.write_text("")
    with pytest.raises(FileExistsError, match="already holds a run"):
        _counted(str(log), "train", refused)("cfg", "out")
    assert log.read_text().splitlines() == ["train ?", "raised ?"]
