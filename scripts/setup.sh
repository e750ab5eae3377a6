#!/usr/bin/env bash
# Creates .venv and installs the package with the given extras (idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".${extras:+[$extras]}"
