"""The numbered notebooks: thin, one `parameters` cell, committed without outputs, and each one executes through
papermill with tiny parameters (micro model, few steps, tiny data) and writes its metrics JSON and figures."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import nbformat
import pytest

from mdc_workbench.runs.plans import ensure_kernel, notebook_parameters
from tests.workbench.test_teaching_notebooks import assert_figures_shown_as_pictures

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
NAMES = ["01_pretraining", "02_noise_schedule_ablation", "03_linear_probing", "04_compositionality", "05_captioning"]
NOTEBOOKS = [NOTEBOOK_DIR / f"{name}.ipynb" for name in NAMES]

MICRO = {"model.encoder_kwargs": {"patch_size": 8, "embed_dim": 32, "depth": 1, "num_heads": 2},
         "model.text_width": 32, "model.text_layers": 1, "model.text_heads": 2, "train.batch_size": 16,
         "train.warmup_steps": 2, "train.log_every": 2}
COMMON = {"n_train": 200, "n_eval": 32, "image_size": 32, "steps": 6, "overrides": MICRO}
PAPER_DATA = {"preset": "tiny", "difficulty": "paper"}  # 02-05 default to make demo's `easy` data and `tiny_fast`
TINY = {  # per notebook: parameters on top of COMMON
    "01_pretraining": {"n_show": 4},
    "02_noise_schedule_ablation": {"schedules": [[0.0, 1.0], [0.5, 1.0]], "cosine_schedules": [[0.0, 1.0]],
                                   "bert_ratios": [1.0], "variance_draws": 3,
                                   "probe_tasks": ["shape", "colour"], "probe_limit": 0, **PAPER_DATA},
    "03_linear_probing": {"position_limit": 8, "probe_tasks": ["shape", "colour"], "probe_limit": 0,
                          "captions": "mixed", **PAPER_DATA},
    "04_compositionality": {"limit": 6, "samples": 4, "captions": "mixed", **PAPER_DATA},
    "05_captioning": {"limit": 6, "n_explore": 2, "beam": 2, "lengths": [4, 6, "median", "oracle", "auto", "arc"],
                      "auto_range": "2-6", "explore_length": 4, "captions": "mixed", **PAPER_DATA},
}
EXPECTED = {  # what each notebook's metrics.json must hold: metric keys and paper tables
    "01_pretraining": ({"final_loss", "final_masked_acc", "single_object_accuracy"}, set()),
    "02_noise_schedule_ablation": ({"probe/[0.0, 1.0]", "probe/[0.5, 1.0]", "probe/CMLM (w/o 1/t, per masked token)",
                                    "probe/Parallel (r = 1)", "loss_std/[0.0, 1.0]", "probe/random init",
                                    "probe/cosine [0.0, 1.0]", "loss_std/cosine [0.0, 1.0]"},
                                   {"table4", "table5", "fig4"}),
    "03_linear_probing": ({"probe/CLIP", "probe/ARC", "probe/MDC", "probe/random init (CLS)",
                           "probe/random init (GAP)", "probe_gain/MDC", "central_claim/ARC/short gradient: slope",
                           "central_claim/MDC/clauses gradient: slope, predictable - unpredictable"},
                          {"table1_mixed", "central_claim"}),  # mixed captions: no Table 1 claim
    "04_compositionality": ({"MDC (Heuristic)/relation", "MDC (Monte Carlo)/attribute", "ARC/order", "CLIP/add"},
                            {"table2"}),
    "05_captioning": ({"MDC-4/BLEU@4", "MDC-6/CIDEr", "ARC/ROUGE-L", "MDC (median length)/CIDEr",
                       "MDC (oracle length)/length", "MDC (auto length)/repetition"}, {"table3"}),
}

CELL_TIMEOUT_S = 600  # papermill fails a cell that runs longer: a hung cell fails its test instead of CI

OPTIONAL_TABLES: dict[str, set[str]] = {}  # tables a notebook writes only when its models show something


def test_the_five_notebooks_are_there() -> None:
    assert all(p.is_file() for p in NOTEBOOKS) and NAMES == list(TINY)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_notebook_is_thin_and_committed_without_outputs(path: Path) -> None:
    nb = nbformat.read(str(path), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "commit notebooks without outputs"
    assert nb.metadata["kernelspec"]["name"] == "mdc"
    tagged = [i for i, c in enumerate(code) if "parameters" in c.metadata.get("tags", [])]
    assert tagged == [1], "exactly one parameters cell, right after the imports cell"
    imports = ast.parse(code[0].source)
    assert all(isinstance(node, (ast.Import, ast.ImportFrom)) for node in imports.body)
    for cell in code:
        tree = ast.parse(re.sub(r"^[%!].*$", "", cell.source, flags=re.M))
        assert not any(isinstance(node, ast.ClassDef) for node in ast.walk(tree)), "no classes in notebooks"
        assert "nn.Module" not in cell.source
    params = code[1].source.strip().splitlines()
    for line in params:  # typed literal defaults with a trailing comment, no derived values
        assert re.fullmatch(r"\w+: (int|float|str|bool|list|dict) = .+  # .+", line), line
        ast.literal_eval(line.split(" = ", 1)[1].split("  # ")[0])
    declared = notebook_parameters(path)
    assert len(declared) == len(params) and "output_dir" in declared
    assert set(TINY[path.stem]) | set(COMMON) <= set(declared)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for the data sets and model cache, so later notebooks reuse the earlier ones' models."""
    ensure_kernel()
    return tmp_path_factory.mktemp("notebooks")


@pytest.mark.parametrize("name", TINY)  # every notebook, in CI too (about 15 s each with these parameters)
def test_notebook_executes_with_tiny_parameters(name: str, shared: Path) -> None:
    import papermill

    out = shared / "runs" / name
    out.mkdir(parents=True)
    params = {**COMMON, **TINY[name], "output_dir": str(out), "models_dir": str(shared / "models"),
              "data_dir": str(shared / ("data_short" if name.startswith("02") else "data_mixed"))}
    papermill.execute_notebook(str(NOTEBOOK_DIR / f"{name}.ipynb"), str(out / f"{name}.ipynb"), parameters=params,
                               kernel_name="mdc", progress_bar=False, cwd=str(shared),
                               execution_timeout=CELL_TIMEOUT_S)
    record = json.loads((out / "metrics.json").read_text())
    keys, tables = EXPECTED[name]
    assert record["notebook"] == name
    assert keys <= set(record["metrics"]), sorted(record["metrics"])
    assert tables <= set(record["tables"]) <= tables | OPTIONAL_TABLES.get(name, set())
    for table in record["tables"].values():
        assert table["metric"] and table["values"]
    probe_table = {"02_noise_schedule_ablation": "table5", "03_linear_probing": "table1_mixed"}.get(name)
    if probe_table:  # every probe table has the untrained encoder's row, and per-item scores for intervals
        table = record["tables"][probe_table]
        assert any(row.startswith("random init") for row in table["values"]), list(table["values"])
        assert set(table["items"]) == set(table["values"])
        models = [row for row in table["values"] if not row.startswith("random init")]
        assert all({"top-1", "gain"} <= set(table["values"][row]) for row in models)  # raw and chance-corrected
    if name == "02_noise_schedule_ablation":  # probed on a held-out set: images no model was pretrained on
        assert record["probe_data"].endswith("data_short_probe")
        assert "cosine [0.0, 1.0]" in record["tables"]["table5"]["values"]  # the cosine row sits in Table 5
    assert list((out / "figures").glob("*.png")), "every notebook saves figures"
    assert_figures_shown_as_pictures(out / f"{name}.ipynb")  # never "<Figure size ...>" or "PosixPath(...)"
    cells = nbformat.read(str(out / f"{name}.ipynb"), as_version=4).cells
    shown = "\n".join(str(o.get("data", {}).get("text/markdown", "")) + o.get("text", "")
                      for c in cells for o in c.get("outputs", []))
    solutions = 3 if name == "01_pretraining" else 2  # each hidden solution ran through its check
    assert shown.count("the hidden solution passes this check") == solutions
    if name == "05_captioning":  # Table 3's CIDEr carries per-image scores: a one-seed interval and a verdict
        items = record["tables"]["table3"]["items"]
        assert set(items) == set(record["tables"]["table3"]["values"]) and all(
            len(v["CIDEr"]) == record["n_images"] for v in items.values())
    if name == "03_linear_probing":  # the central claim on both caption kinds, the same captions in both rows
        central = record["tables"]["central_claim"]
        assert set(central["items"]) == {"ARC", "MDC"}
        assert {c.split(" ")[0] for c in central["values"]["ARC"]} == {"short", "clauses"}
        assert record["central_claim_data"]["short"].endswith("data_mixed_short")
        assert_items_rebuild_the_tables(out, record, {"table1_mixed", "central_claim"})


def test_linear_probing_notebook_measures_only_the_central_claim_and_the_features(shared: Path) -> None:
    """`objectives: []` with `feature_orders`: no Table 1 probe; an ARC + MDC pair per caption kind (short and
    two-clause captions, both always), and a pair per caption order of the linked data probed for shape and colour
    (what `make central-claim` runs)."""
    import papermill

    name = "03_linear_probing"
    out = shared / "runs" / "03_central_only"
    out.mkdir(parents=True)
    params = {**COMMON, "output_dir": str(out), "models_dir": str(shared / "models"), "objectives": [],
              "data_dir": str(shared / "data_short"), "position_limit": 8, "feature_orders": True,
              "position_data_dir": str(shared / "data_clauses"), "probe_limit": 0, **PAPER_DATA}
    papermill.execute_notebook(str(NOTEBOOK_DIR / f"{name}.ipynb"), str(out / f"{name}.ipynb"), parameters=params,
                               kernel_name="mdc", progress_bar=False, cwd=str(shared),
                               execution_timeout=CELL_TIMEOUT_S)
    record = json.loads((out / "metrics.json").read_text())
    assert set(record["tables"]) == {"central_claim", "feature_order"} and record["runs"] == {}
    central = record["tables"]["central_claim"]
    columns = set(central["values"]["ARC"])
    assert {"short gradient: slope", "clauses gradient: slope, predictable - unpredictable",
            "short gradient: bin 1", "clauses gradient: fall"} <= columns
    assert all(len(v) == 8 for k, v in central["items"]["ARC"].items() if k == "short gradient: slope")
    features = record["tables"]["feature_order"]
    assert set(features["values"]) == {"ARC", "MDC"} and "late penalty" in features["values"]["MDC"]
    assert (out / "figures" / "central_claim.png").is_file()
    for kind in ("clauses", "shape_last", "colour_last"):
        folder = shared / ("data_clauses" if kind == "clauses" else f"data_short_{kind}")
        assert json.loads((folder / "manifest.json").read_text())["params"]["captions"] == kind
    shown = "\n".join(str(o.get("data", {}).get("text/markdown", "")) for c in
                      nbformat.read(str(out / f"{name}.ipynb"), as_version=4).cells for o in c.get("outputs", []))
    assert "source: `docs/central_claim.json`" in shown  # the one story, from the results file
    assert_items_rebuild_the_tables(out, record, {"central_claim", "feature_order"})


def assert_items_rebuild_the_tables(out: Path, record: dict, tables: set[str]) -> None:
    """The run kept its per-item file (issue 61 item 4) and every table rebuilt from it equals the one in
    metrics.json: values and per-item scores."""
    from mdc_workbench.eval.items import read_items
    from mdc_workbench.eval.recompute import tables_from_items

    items = read_items(out / "items.npz")
    assert items.run_id == out.name and items.seed == 0
    rebuilt = json.loads(json.dumps(tables_from_items(items)))  # as metrics.json holds them
    assert set(rebuilt) == tables
    for name in tables:
        for key in ("values", "items"):  # row -> column -> a number (values) or per-item numbers (items)
            want, got = record["tables"][name][key], rebuilt[name][key]
            assert set(got) == set(want), (name, key)
            for row, cols in want.items():
                assert set(got[row]) == set(cols), (name, key, row)
                for col, v in cols.items():
                    assert got[row][col] == pytest.approx(v, nan_ok=True), (name, key, row, col)
