#!/usr/bin/env bash
# Set-up and the whole test suite (three groups side by side: scripts/run_groups.py).
# Extra arguments go to one pytest run instead: `bash scripts/test.sh tests/test_runner.py -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
if [ "$#" -eq 0 ]; then
    exec .venv/bin/python scripts/run_groups.py
fi
exec .venv/bin/python -m pytest "$@"
