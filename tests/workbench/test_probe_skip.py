"""`mdc probe --format folder` skips and counts unreadable images (as training does) instead of aborting."""

import json

import pytest

from mdc_workbench.cli import main
from tests.workbench.test_probe_data import class_folders, micro_run  # noqa: F401 - class_folders is a fixture


def test_an_unreadable_image_in_a_class_folder_is_skipped_and_counted(tmp_path, class_folders, capsys):  # noqa: F811
    micro_run(tmp_path / "run")
    (class_folders / "train" / "red" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    (class_folders / "val" / "blue" / "empty.jpg").write_bytes(b"")
    with pytest.warns(UserWarning, match="broken.png"):
        assert main(["probe", "--run", str(tmp_path / "run"), "--data", str(class_folders), "--format", "folder",
                     "--protocol", "clip_benchmark", "--weight-decay", "0", "--json", "--quiet"]) == 0
    result = json.loads(capsys.readouterr().out)["runs"][0]
    assert result["skipped"] == {"train": 1, "test": 1}
    assert result["tasks"]["class"]["n_train"] == 18 and result["tasks"]["class"]["n_test"] == 9
