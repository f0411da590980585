# Two commands for a fresh clone; each bootstraps the virtual environment .venv on first use.
#   make demo   the main job on the embedded data (synthesize, train the tiny MDC model, caption test images)
#   make test   the test suite (what CI runs)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-all lint setup clean-outputs kernel runs-demo

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --progress-bar off -c constraints.txt -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m mdc_core demo

kernel: $(STAMP)  # register this venv as the Jupyter kernel "mdc" (what the notebooks and `mdc runs` use)
	$(PY) -m ipykernel install --sys-prefix --name mdc --display-name "MDC workbench"

runs-demo: kernel  # all five notebooks on CPU via papermill; summary in papermill_runs/cpu_demo/summary.md
	$(PY) -m mdc_core runs plans/cpu_demo.yaml

test: $(STAMP)
	$(PY) -m pytest -m "not slow" -q

test-all: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check mdc_core app tests

clean-outputs:
	rm -rf outputs
