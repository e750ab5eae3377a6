#!/usr/bin/env bash
# Set-up and the main job: the tour notebook (notebooks/tour.ipynb), run headless.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh tour
exec .venv/bin/python -m sandbox_kernel_ext.demo "$@"
