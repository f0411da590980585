"""The notebook support draws with the same code as the app and takes the paper's numbers from the one table."""

import ast
import json
from pathlib import Path

from matplotlib.figure import Figure

from mdc_workbench.eval.paper import PAPER
from mdc_workbench.notebooks import notebook as wb
from mdc_workbench.viz import trajectory_view

ROOT = Path(__file__).resolve().parents[2]


def _record() -> dict:
    """A 2-token trajectory by hand: position 1 revealed first, then position 0."""
    return {"token_ids": [5, 6], "tokens": ["red", "dot"], "caption": "red dot", "steps": [
        {"step": 0, "revealed": [{"position": 1, "token": "dot", "confidence": 0.8}],
         "masked": [{"position": 0, "top_token": "big", "top_confidence": 0.4},
                    {"position": 1, "top_token": "dot", "top_confidence": 0.8}]},
        {"step": 1, "revealed": [{"position": 0, "token": "red", "confidence": 0.7}],
         "masked": [{"position": 0, "top_token": "red", "top_confidence": 0.7}]}]}


def test_notebook_trajectory_and_heatmap_are_the_apps():
    record = _record()
    for step in range(3):
        assert wb.trajectory_html(record, step) == trajectory_view.chips_html(record, step)
    fig = wb.confidence_heatmap(record, title="t")
    assert isinstance(fig, Figure)
    image = fig.axes[0].images[0].get_array()
    assert image.shape == (2, 2) and float(image[0, 0]) == 0.4 and float(image[0, 1]) == 0.8
    assert bool(image.mask[1, 1])  # revealed at step 0: no confidence shown at step 1


def _paper_numbers() -> set[float]:
    numbers: set[float] = set()
    for table in PAPER.values():
        for value in table.values.values():
            numbers |= set(value.values()) if isinstance(value, dict) else {value}
    return numbers


def test_notebooks_hold_no_copy_of_the_papers_numbers():
    paper = _paper_numbers()
    assert 68.7 in paper and 39.2 in paper
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            source = "".join(cell["source"])
            code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
            floats = {n.value for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Constant)
                      and isinstance(n.value, float)}
            assert not floats & paper, f"{path.name}: the paper's numbers {floats & paper} (use workbench.paper)"


def test_project_path_is_relative_to_the_checkout_or_the_stated_output_root(tmp_path, monkeypatch):
    monkeypatch.delenv(wb.OUTPUT_ROOT_ENV, raising=False)
    assert wb.PROJECT_ROOT == ROOT
    assert wb.project_path("papermill_runs/x") == ROOT / "papermill_runs" / "x"
    assert wb.project_path(tmp_path) == tmp_path
    monkeypatch.setenv(wb.OUTPUT_ROOT_ENV, str(tmp_path / "class"))  # a lecturer's output root: nothing in the repo
    assert wb.project_path("papermill_runs/x") == tmp_path / "class" / "papermill_runs" / "x"
    assert wb.output_folder("outputs/05") == tmp_path / "class" / "outputs" / "05"
    assert (tmp_path / "class" / "outputs" / "05" / "figures").is_dir()
    assert wb.project_path(tmp_path / "abs") == tmp_path / "abs"  # an absolute path stays


def test_cache_lock_makes_a_second_writer_wait_and_says_so(tmp_path, monkeypatch):
    import threading
    import time

    from mdc_workbench.runs import progress

    monkeypatch.setattr(wb, "LOCK_WAIT_REPORT_S", 0.05)
    monkeypatch.setenv(progress.ENV, str(tmp_path / "progress.json"))
    order, held = [], threading.Event()

    def first():
        with wb.cache_lock(tmp_path / "model", "the model m"):
            held.set()
            time.sleep(0.5)
            order.append("first done")

    thread = threading.Thread(target=first)
    thread.start()
    held.wait()
    with wb.cache_lock(tmp_path / "model", "the model m"):
        order.append("second in")
    thread.join()
    assert order == ["first done", "second in"]
    assert "waiting for the model m" in progress.describe(tmp_path / "progress.json")


def test_notebooks_at_once_write_the_data_set_once(tmp_path, monkeypatch):
    import threading

    import mdc_workbench.data as data

    calls, real = [], data.write_synthetic_dataset

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(data, "write_synthetic_dataset", counted)
    manifests = []
    threads = [threading.Thread(target=lambda: manifests.append(
        wb.ensure_dataset(tmp_path / "d", 32, captions="short", n_eval=8, difficulty="easy"))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(manifests) == 2 and manifests[0]["params"] == manifests[1]["params"]


def test_a_cached_model_belongs_to_the_data_set_it_was_trained_on(tmp_path):
    """The model cache key follows the embedded data's generator parameters: a data folder rewritten with other
    parameters (n_train, difficulty, caption style) gives its models a new key, so no stale model is reused."""
    data = tmp_path / "data"
    data.mkdir()
    cfg = wb.make_config("tiny_fast", data, "mdc", 10)
    bare = wb.config_key(cfg)  # no manifest (real data): the configuration alone
    (data / "manifest.json").write_text(json.dumps({"params": {"n": 200, "captions": "long"}}))
    first = wb.config_key(cfg)
    assert first != bare and wb.config_key(cfg) == first  # stable while the data stay
    (data / "manifest.json").write_text(json.dumps({"params": {"n": 100, "captions": "long"}}))
    assert wb.config_key(cfg) not in (first, bare)
    assert wb.cached_run_dir(tmp_path / "models", cfg).name == f"mdc-{wb.config_key(cfg)}"


def test_the_model_cache_key_does_not_depend_on_where_the_checkout_lives(tmp_path, monkeypatch):
    """A copied checkout finds the models its notebooks trained: paths inside the checkout enter the key relative to
    it; a data folder elsewhere, or another folder inside, gives another key."""
    keys = {}
    for name in ("original", "copy"):
        root = tmp_path / name
        (root / "outputs" / "data").mkdir(parents=True)
        (root / "outputs" / "data" / "manifest.json").write_text(json.dumps({"params": {"n": 200}}))
        monkeypatch.setattr(wb, "PROJECT_ROOT", root)
        keys[name] = wb.config_key(wb.make_config("tiny_fast", root / "outputs" / "data", "mdc", 10))
        assert wb.checkout_relative(str(root / "outputs" / "data")) == "outputs/data"
        assert wb.checkout_relative(root / "outputs" / "data") == "outputs/data"  # a Path, as notebooks print it
    assert keys["original"] == keys["copy"]
    (tmp_path / "copy" / "outputs" / "other").mkdir()
    (tmp_path / "copy" / "outputs" / "other" / "manifest.json").write_text(json.dumps({"params": {"n": 200}}))
    assert wb.config_key(wb.make_config("tiny_fast", tmp_path / "copy" / "outputs" / "other", "mdc", 10)) != \
        keys["copy"]
    monkeypatch.setattr(wb, "PROJECT_ROOT", tmp_path / "elsewhere")  # the data outside the checkout: as given
    outside = wb.make_config("tiny_fast", tmp_path / "original" / "outputs" / "data", "mdc", 10)
    assert wb.checkout_relative(outside.data.path) == outside.data.path and wb.config_key(outside) != keys["original"]
    assert wb.checkout_relative("") == ""
