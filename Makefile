# Two commands for a fresh clone; each bootstraps the virtual environment .venv on first use.
#   make demo   the main job: notebooks 01-05 on the embedded data through papermill (plans/cpu_demo.yaml)
#   make evidence  the comparisons with 3 training seeds, budget curves, LR sweep, parity (plans/cpu_evidence.yaml)
#   make test   the test suite (what CI runs)
#   make lab    JupyterLab on the notebooks (127.0.0.1), with the project's kernel "mdc"
#   make gpu-check  on a CUDA machine: CUDA tests, the vit_b32 bench, the GPU evidence plan (docs/training_at_scale.md)
#   make wheelhouse  the wheels an offline GPU machine needs (.wheelhouse/; GPU_PYTHON=3.12)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
KERNEL := mdc# the Jupyter kernel the notebooks name (their metadata.kernelspec.name; mdc_workbench.runs.plans)
EXTRAS := dev,app,notebooks,eval,export,bench,vqgan,tensorboard,cluster# everything but [lab] (pyproject.toml's optional-dependencies)

GPU_PYTHON ?= 3.12# the offline GPU machine's Python (make wheelhouse)

.PHONY: demo evidence evidence-1600 evidence-more central-claim test test-all lint setup clean-outputs kernel quick-demo app lab notebooks-html gpu-check gpu-check-estimate wheelhouse

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --progress-bar off -c constraints.txt -e ".[$(EXTRAS)]"
	touch $(STAMP)

demo: kernel  # summary: papermill_runs/cpu_demo/summary.md; then `make app`
	$(PY) -m mdc_workbench runs plans/cpu_demo.yaml

evidence: kernel  # summary: papermill_runs/cpu_evidence/summary.md (about 90 min on 2 cores; docs/results.md)
	$(PY) -m mdc_workbench runs plans/cpu_evidence.yaml

# The two deciding plans below are short of 80% power (mdc runs prints the power and the seeds it needs, and refuses);
# run them as they are with RUNS_FLAGS=--underpowered-ok, which their summary then states.
evidence-1600: kernel  # Table 1's deciding CPU budget: ARC and MDC, 1600 steps, 5 seeds, LR re-chosen (~1.7 h)
	$(PY) -m mdc_workbench runs plans/cpu_table1_1600.yaml $(RUNS_FLAGS)

central-claim: kernel  # the central claim on both caption kinds and its consequence for features, 1600 steps, 3 seeds (~3.3 h)
	$(PY) -m mdc_workbench runs plans/cpu_central_claim.yaml $(RUNS_FLAGS)
	$(PY) -m mdc_workbench.runs.central_story papermill_runs/cpu_central_claim/summary.json  # docs/central_claim.json

evidence-more: kernel  # after `make evidence`: annealed budget curve, Table 5's middle schedules, Tables 2, 1-long (~2 h)
	$(PY) -m mdc_workbench runs plans/cpu_evidence_more.yaml

quick-demo: $(STAMP)  # one model, no notebooks: synthesize, train tiny MDC, caption held-out images (outputs/demo/)
	$(PY) -m mdc_workbench demo

app: $(STAMP)  # the Gradio app on 127.0.0.1, opened on the model of `make demo`, else on the shipped model
	$(PY) -m mdc_workbench app

kernel: $(STAMP)  # register this venv as the Jupyter kernel "mdc" (what the notebooks and `mdc runs` use)
	$(PY) -m ipykernel install --sys-prefix --name $(KERNEL) --display-name "MDC workbench"

lab: kernel  # install the [lab] extra, then JupyterLab in notebooks/ on 127.0.0.1 (--allow-root only as root)
	$(PY) -m pip install --progress-bar off -c constraints.txt -e ".[lab]"
	$(PY) -m jupyterlab --notebook-dir=notebooks --ip=127.0.0.1 --no-browser \
		$$(if [ "$$(id -u)" = 0 ]; then echo --allow-root; fi)

notebooks-html: kernel  # every notebook run with its defaults (papermill_runs/notebooks/), as pages in docs/notebooks_html/
	$(PY) docs/notebooks_html.py

gpu-check:  # CUDA tests, bench, GPU evidence plan in BUDGET_S (480) s into gpu_check_out/; without CUDA: --tiny
	bash scripts/gpu_check.sh gpu_check_out

gpu-check-estimate: $(STAMP)  # the minutes each part of gpu-check takes under BUDGET_S, from benchmarks/*.json
	$(PY) -m mdc_workbench.runs.gpu_check --estimate $(if $(BUDGET_S),--budget-s $(BUDGET_S))

wheelhouse: $(STAMP)  # every wheel the core and [notebooks] need that the GPU image lacks, for Python $(GPU_PYTHON)
	$(PY) scripts/wheelhouse.py --python-version $(GPU_PYTHON) --out .wheelhouse

test: $(STAMP)
	$(PY) -m pytest -m "not slow" -q

test-all: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check mdc_core mdc_workbench app tests docs

clean-outputs:
	rm -rf outputs
