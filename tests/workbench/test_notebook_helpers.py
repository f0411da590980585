"""The notebook helpers a student sees the output of: figures show as pictures (never ``<Figure size ...>`` or a
``PosixPath(...)`` line), the explorer's grid is numbered like its menu, and 05's infilling example masks a word
worth asking about."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from matplotlib.figure import Figure

from mdc_core.tokenizer import CaptionTokenizer
from mdc_workbench.notebooks import notebook as wb


def test_save_figure_writes_the_png_and_returns_nothing(tmp_path: Path) -> None:
    fig = Figure()
    fig.add_subplot().plot([0, 1])
    assert wb.save_figure(fig, tmp_path, "x") is None  # a cell ending with it prints no PosixPath line
    assert (tmp_path / "figures" / "x.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_figure_without_pyplot_is_shown_as_a_png(monkeypatch: pytest.MonkeyPatch) -> None:
    from IPython.display import Image

    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj, **kw: shown.append(obj))
    fig = Figure()
    fig.add_subplot().plot([0, 1])
    wb.show_figure(fig)
    assert isinstance(shown[0], Image) and shown[0].format == "png" and shown[0].data[:4] == b"\x89PNG"
    curve = wb.loss_figure([{"step": 1, "loss": 2.0, "acc_masked": 0.1}, {"step": 2, "loss": 1.5, "acc_masked": 0.2}])
    assert isinstance(curve, Figure)  # drawn without pyplot, so the painter thread may draw it


def test_the_image_grid_numbers_its_panels_on_request() -> None:
    images = torch.zeros(3, 3, 8, 8)
    titles = [ax.get_title() for ax in wb.image_grid(images, ["a", "b", "c"], numbered=True).axes[:3]]
    assert titles == ["0: a", "1: b", "2: c"]
    assert [ax.get_title() for ax in wb.image_grid(images, ["a", "b", "c"]).axes[:3]] == ["a", "b", "c"]


@pytest.fixture(scope="module")
def full_vocab_model():
    from mdc_core.model import Captioner
    from tests.conftest import micro_config

    torch.manual_seed(0)
    return Captioner(micro_config()).eval()


@pytest.mark.parametrize("caption, mask, slots, kind", [
    ("a red circle on a gray background", ["colour"], [1], "colour"),
    ("a small circle on the left", ["colour"], [2], "shape"),  # no colour word: the shape, never "a"
    ("a small thing on the left", ["colour"], [1], "both"),  # neither: the first content word
    ("a red circle and a blue star", ["shape"], [2, 6], "shape"),
    ("a red circle and a blue star", ["blue"], [5], "colour"),
])
def test_infill_slots_mask_a_word_worth_asking_about(full_vocab_model, caption, mask, slots, kind) -> None:
    from mdc_workbench.data import COLOURS, SHAPES

    words = caption.split()
    got, candidates = wb.infill_slots(words, mask, CaptionTokenizer(24), full_vocab_model)
    assert got == slots
    pool = {"colour": set(COLOURS), "shape": set(SHAPES), "both": set(COLOURS) | set(SHAPES)}[kind]
    assert candidates and set(candidates) <= pool and words[got[0]] not in wb.FUNCTION_WORDS


def test_trained_or_shipped_opens_on_the_shipped_model_only_when_nothing_is_cached(tmp_path: Path, capsys) -> None:
    from mdc_workbench.export.shipped import SHIPPED_DIR, SHIPPED_SHA256, sha256
    from tests.train_helpers import micro_run, write_micro_data

    data = write_micro_data(tmp_path / "data", 16)
    cfg = micro_run(data, steps=2, batch_size=4)
    model, saved, run_dir = wb.trained_or_shipped(cfg, tmp_path / "models", shipped=True)
    assert run_dir == SHIPPED_DIR and sha256(run_dir / "model.safetensors") == SHIPPED_SHA256
    assert saved.data.path == cfg.data.path and saved.preset == "tiny_lean" and not (tmp_path / "models").exists()
    assert "nothing is trained here" in capsys.readouterr().out
    trained = wb.train_cached(cfg, tmp_path / "models")[2]  # once the notebook's own run is trained, it is used
    assert wb.trained_or_shipped(cfg, tmp_path / "models", shipped=True)[2] == trained
    assert "reusing the trained run" in capsys.readouterr().out
    arc = micro_run(data, 'objective.name="arc"', steps=2, batch_size=4)
    with pytest.raises(ValueError, match="MDC model"):
        wb.trained_or_shipped(arc, tmp_path / "models", shipped=True)



def test_a_cached_model_whose_checkpoints_were_set_aside_is_kept_and_trained_again(tmp_path: Path, capsys) -> None:
    """A cache folder without an intact checkpoint is trained again from step 0 in place, saying so: damaged
    checkpoints set aside stay where they are (kept as found), its old log beside the new one."""
    from mdc_core.checkpoint import CKPT_DIR, CORRUPT_PREFIX
    from tests.train_helpers import micro_run, write_micro_data

    data = write_micro_data(tmp_path / "data", 16)
    cfg = micro_run(data, steps=2, batch_size=4)
    run_dir = wb.cached_run_dir(tmp_path / "models", cfg)
    aside = run_dir / CKPT_DIR / f"{CORRUPT_PREFIX}step_00000002"
    aside.mkdir(parents=True)
    (aside / "model.safetensors").write_bytes(b"damaged")
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 9.0}\n')
    assert wb.train_cached(cfg, tmp_path / "models")[2] == run_dir
    out = capsys.readouterr().out
    assert f"models_dir={tmp_path / 'models'} has no intact checkpoint (the damaged ones are kept as " \
           "corrupt_step_00000002; its log as metrics_before_start_over_1.jsonl): training it again from step 0" in out
    assert (aside / "model.safetensors").read_bytes() == b"damaged" and wb._finished(run_dir, cfg.train.steps)
    assert (run_dir / "metrics_before_start_over_1.jsonl").read_text() == '{"step": 1, "loss": 9.0}\n'

    import shutil
    shutil.rmtree(run_dir / CKPT_DIR)  # stopped before its first checkpoint: nothing to keep, trained from scratch
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 9.0}\n')
    assert wb.train_cached(cfg, tmp_path / "models")[2] == run_dir
    assert wb._finished(run_dir, cfg.train.steps)


def test_a_cached_model_whose_final_checkpoint_is_damaged_goes_on_from_the_previous_or_again(tmp_path: Path,
                                                                                             capsys) -> None:
    """The final checkpoint byte-flipped: set aside, the model trained on from the previous intact checkpoint;
    when it was the only one, trained again from step 0. Said each time; never "pass it as --run"."""
    import warnings

    from mdc_core.checkpoint import CKPT_DIR, CORRUPT_PREFIX
    from tests.train_helpers import micro_run, write_micro_data

    def flip(ckpt: Path) -> None:
        weights = ckpt / "model.safetensors"
        data = bytearray(weights.read_bytes())
        data[-50] ^= 0xFF
        weights.write_bytes(bytes(data))

    data = write_micro_data(tmp_path / "data", 16)
    cfg = micro_run(data, steps=4, batch_size=4, ckpt_every=2)
    models = tmp_path / "models"
    run_dir = wb.train_cached(cfg, models)[2]
    flip(run_dir / CKPT_DIR / "step_00000004")
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert wb.train_cached(cfg, models)[2] == run_dir
    out = capsys.readouterr().out
    assert "its damaged checkpoints are set aside as corrupt_step_00000004 (kept as found); it goes on from " \
           "step_00000002" in out and "resuming" in out and "--run" not in out
    assert wb._finished(run_dir, 4) and (run_dir / CKPT_DIR / f"{CORRUPT_PREFIX}step_00000004").is_dir()

    one = micro_run(data, steps=2, batch_size=4, ckpt_every=2, seed=5)  # a single checkpoint, the final one
    only = wb.train_cached(one, models)[2]
    flip(only / CKPT_DIR / "step_00000002")
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert wb.train_cached(one, models)[2] == only
    out = capsys.readouterr().out
    assert "no intact checkpoint is left" in out and "training it again from step 0" in out and "--run" not in out
    assert wb._finished(only, 2)


def test_a_reused_model_shows_its_loss_curve_and_no_empty_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys) -> None:
    """01's cell, run again on a cached model in a kernel, shows the curve of the earlier training and nothing else:
    no display slot created only to ask whether there is a kernel (it printed ``None`` on 01's page)."""
    from IPython.display import Image

    from tests.train_helpers import micro_run, write_micro_data

    data = write_micro_data(tmp_path / "data", 16)
    cfg = micro_run(data, steps=2, batch_size=4)
    wb.train_cached(cfg, tmp_path / "models")
    shown = []
    monkeypatch.setattr("IPython.get_ipython", lambda: object())  # as in a kernel
    monkeypatch.setattr("IPython.display.display", lambda obj, **kw: shown.append(obj))
    wb.train_cached(cfg, tmp_path / "models", live=True)
    assert "reusing the trained run" in capsys.readouterr().out
    assert len(shown) == 1 and isinstance(shown[0], Image), shown
