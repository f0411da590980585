# Two commands for a fresh clone; each bootstraps the virtual environment .venv on first use.
#   make demo   the main job: notebooks 01-05 on the embedded data through papermill (plans/cpu_demo.yaml)
#   make test   the test suite (what CI runs)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-all lint setup clean-outputs kernel quick-demo app

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --progress-bar off -c constraints.txt -e ".[dev]"
	touch $(STAMP)

demo: kernel  # summary: papermill_runs/cpu_demo/summary.md; then `make app`
	$(PY) -m mdc_core runs plans/cpu_demo.yaml

quick-demo: $(STAMP)  # one model, no notebooks: synthesize, train tiny MDC, caption held-out images (outputs/demo/)
	$(PY) -m mdc_core demo

app: $(STAMP)  # the Gradio app on 127.0.0.1, opened on the model of `make demo`
	$(PY) -m mdc_core app

kernel: $(STAMP)  # register this venv as the Jupyter kernel "mdc" (what the notebooks and `mdc runs` use)
	$(PY) -m ipykernel install --sys-prefix --name mdc --display-name "MDC workbench"

test: $(STAMP)
	$(PY) -m pytest -m "not slow" -q

test-all: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check mdc_core app tests

clean-outputs:
	rm -rf outputs
