#!/usr/bin/env bash
# Set-up and the main job: a tour of the policy and the file toolset on a temporary folder.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m sandbox_kernel_ext.demo "$@"
