#!/usr/bin/env bash
# make gpu-check: the GPU check (mdc_workbench/runs/gpu_check.py) on this machine, with the machine's own torch.
# On an offline GPU machine, bring the repository and its wheelhouse (`make wheelhouse` on a machine with the package
# index: .wheelhouse/), then `bash scripts/gpu_check.sh [OUT_DIR]`: the wheels install into a scratch folder put on
# PYTHONPATH (nothing in the machine's environment changes), then the check runs within BUDGET_S seconds (default
# 480: with the machine's start, a 10-minute loan). Without CUDA it runs the same phases at a budget of seconds (--tiny).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu_check_out}
py=${PYTHON:-python3}
if [ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ]; then py=.venv/bin/python; fi
site=${MDC_SITE:-/tmp/mdc_site}
tiny=$("$py" -c "import torch; print('' if torch.cuda.is_available() else '--tiny')") || exit 1
if [ -z "$tiny" ] && compgen -G ".wheelhouse/*.whl" > /dev/null; then  # the GPU machine's missing packages
    "$py" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        .wheelhouse/*.whl || { echo "gpu-check: could not install .wheelhouse/ into $site" >&2; exit 1; }
    export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
exec "$py" -m mdc_workbench.runs.gpu_check --out "$out" --budget-s "${BUDGET_S:-480}" $tiny
