"""notebooks/06_mc_diffusion.ipynb runs end to end under papermill with tiny parameters and writes its outputs."""

import json
from pathlib import Path

import nbformat
import papermill as pm
from jupyter_client.kernelspec import KernelSpecManager

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "06_mc_diffusion.ipynb"

TINY = dict(n_train=48, n_eval=6, image_size=32, vq_steps=3, codebook_size=8, clip_steps=2, caption_steps=2,
            batch_size=8, text_layers=1, text_width=32, diffusion_steps=4, scales=[1.0, 3.0], length=4,
            mcs_cfg_form=True)


def _kernel() -> str:
    return "mdc" if "mdc" in KernelSpecManager().find_kernel_specs() else "python3"


def test_notebook_follows_the_conventions():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    tagged = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and nb.cells[tagged[0] - 1].cell_type == "code"  # right after the imports
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code")  # no outputs committed
    assert not any("class " in c.source or "nn.Module" in c.source for c in nb.cells if c.cell_type == "code")
    declared = pm.inspect_notebook(str(NOTEBOOK))
    written = {line.split(":")[0] for line in nb.cells[tagged[0]].source.splitlines() if line.strip()}
    assert set(declared) == written  # papermill parses every parameter line (an "=" in a comment breaks it)
    assert set(TINY) <= set(declared) and "output_dir" in declared


def test_notebook_runs_with_tiny_parameters(tmp_path):  # about 15 s: runs in CI
    params = {**TINY, "output_dir": str(tmp_path / "out"), "data_dir": str(tmp_path / "data"),
              "models_dir": str(tmp_path / "models")}
    pm.execute_notebook(str(NOTEBOOK), str(tmp_path / "executed.ipynb"), parameters=params, kernel_name=_kernel(),
                        cwd=str(ROOT), progress_bar=False, execution_timeout=600)  # a hung cell fails
    record = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert record["notebook"] == "06_mc_diffusion"
    rows = record["rows"]
    combos = {(r["model"], r["mode"]) for r in rows}
    assert combos == {("MC-Diffusion", "cfg"), ("MC-Diffusion", "mcs"), ("MC-Diffusion", "mcs_cfg"),
                      ("MDC", "cfg"), ("MDC", "mcs"), ("MDC", "mcs_cfg")}
    assert all(len(r["examples"]) == 3 and 0.0 <= r["CLIPScore"] <= 2.5 for r in rows)
    assert {r["scale"] for r in rows} == {1.0, 3.0}
    assert (tmp_path / "out" / "figures" / "guidance_tradeoff.png").is_file()
    assert (tmp_path / "out" / "figures" / "vqvae_reconstructions.png").is_file()
