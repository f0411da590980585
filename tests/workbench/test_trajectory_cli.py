"""``mdc sample`` with --prompt, --remask-*, --attention, --gif: the record, the GIF, and the one-line errors."""

import json

import pytest
from PIL import Image

from mdc_workbench.cli import main
from mdc_workbench.viz.animation import load_record, record_image
from tests.workbench.test_cli import MICRO_SETS


@pytest.fixture(scope="module")
def run_and_image(tmp_path_factory):
    import webdataset as wds

    root = tmp_path_factory.mktemp("traj")
    data, run = root / "data", root / "run"
    assert main(["data", "synth", "--out", str(data), "--n", "24", "--seed", "3", "--image-size", "32",
                 "--captions", "short"]) == 0
    assert main(["train", "--preset", "tiny", "--data", str(data), "--out", str(run), "--steps", "2", "--quiet",
                 *MICRO_SETS, "--set", "model.output_vocab=full"]) == 0
    record = next(iter(wds.WebDataset(str(data / "test" / "000000.tar"), shardshuffle=False)))
    image = root / "img.jpg"
    image.write_bytes(record["jpg"])
    return run, image


def test_prompt_fixes_words_and_json_replays(run_and_image, tmp_path, capsys):
    run, image = run_and_image
    capsys.readouterr()
    assert main(["sample", "--run", str(run), "--image", str(image), "--prompt", "a [MASK] square on the _",
                 "--json", "--attention", "--seed", "4"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fixed"] == [0, 2, 3, 4] and out["tokens"][2] == "square" and out["tokens"][0] == "a"
    assert len(out["steps"]) == 2 and {s["position"] for s in out["steps"]} == {1, 5}
    assert out["settings"]["seed"] == 4 and out["prompt"] == "a [MASK] square on the _"
    assert len(out["steps"][0]["revealed"][0]["attention"]) == 1  # one decoder layer
    saved = tmp_path / "t.json"
    saved.write_text(json.dumps(out))
    assert load_record(saved)["caption"] == out["caption"]
    assert record_image(out).size == (32, 32)  # the image the model saw travels with the record


def test_gif_and_remasking_flags(run_and_image, tmp_path, capsys):
    run, image = run_and_image
    gif = tmp_path / "out.gif"
    assert main(["sample", "--run", str(run), "--image", str(image), "--length", "5", "--gif", str(gif),
                 "--remask-threshold", "0.99", "--remask-steps", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert 5 <= len(out["steps"]) <= 8 and out["settings"]["remask_steps"] == 3
    assert "attention" not in out["steps"][0]["revealed"][0]  # only with --attention
    with Image.open(gif) as g:
        assert g.n_frames == len(out["steps"])


@pytest.mark.parametrize("argv,message", [
    (["--prompt", "a red square"], "no slot"),
    (["--prompt", "a _ square", "--length", "4"], "drop --length"),
    (["--remask-steps", "3"], "remask_threshold"),
    (["--gif", "out.png"], "ending in .gif"),
])
def test_bad_flags_are_one_line_errors(run_and_image, argv, message, capsys):
    run, image = run_and_image
    assert main(["sample", "--run", str(run), "--image", str(image), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mdc: error:") and message in err and "\n" not in err


def test_score_prompt_ranks_fillings_of_the_slots(run_and_image, capsys):
    run, image = run_and_image
    capsys.readouterr()
    assert main(["score", "--run", str(run), "--image", str(image), "--prompt", "a _ square", "--caption", "red",
                 "--caption", "blue", "--method", "heuristic", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["fill"] for r in rows} == {"red", "blue"} and rows[0]["score"] >= rows[1]["score"]
    assert all(len(r["slot_logprobs"]) == 1 and r["caption"].endswith("square") for r in rows)
    assert main(["score", "--run", str(run), "--image", str(image), "--prompt", "a _ square", "--caption",
                 "dark red", "--method", "mc"]) == 2
    assert "1 slot" in capsys.readouterr().err
