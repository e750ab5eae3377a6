#!/usr/bin/env bash
# Creates .venv and installs the package with the given extras (idempotent).
#
# Run as root, sandboxed children drop to an unprivileged uid, which must be able to read the
# interpreter: an interpreter under /root (pyenv's) is not, so root gets the system Python.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"

reachable_by_others() {  # every folder from / down to $1 is world-searchable
    local dir
    dir=$(dirname "$(readlink -f "$1")")
    while [ "$dir" != "/" ]; do
        [ "$(( $(stat -c '0%a' "$dir") & 1 ))" = 1 ] || return 1
        dir=$(dirname "$dir")
    done
}

python=${PYTHON:-python3}
if [ -z "${PYTHON:-}" ] && [ "$(id -u)" = 0 ]; then
    real=$("$python" -c 'import sys, os; print(os.path.realpath(sys.executable))')
    if ! reachable_by_others "$real"; then
        if ! /usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null; then
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv
        fi
        python=/usr/bin/python3
    fi
fi
if [ -x .venv/bin/python ] && [ "$(id -u)" = 0 ] && [ -z "${PYTHON:-}" ] \
        && ! reachable_by_others "$(readlink -f .venv/bin/python)"; then
    echo "setup: recreating .venv on an interpreter the sandbox's unprivileged user can read" >&2
    rm -rf .venv
fi
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
quiet_pip() {  # pip's own exit status; its warnings about absent local mirrors are noise
    .venv/bin/python -m pip install --quiet --disable-pip-version-check "$@" 2>&1 \
        | { grep -v "^WARNING: Location" || true; }
    return "${PIPESTATUS[0]}"
}
quiet_pip --upgrade pip
quiet_pip -e ".${extras:+[$extras]}"
case ",$extras," in
    *,test,*)
        # The approval wrapper PydanticAI users put around a toolset, for the drop-in tests.
        # It asks for the whole `pydantic-ai` (every model provider's SDK); the `pydantic_ai`
        # module it imports comes with pydantic-ai-slim, which the test extra installs.
        quiet_pip --no-deps "pydantic-ai-blocking-approval==0.8.0"
        bash scripts/system_deps.sh  # Chromium and Node.js for the test suite
        # JupyterHub's proxy, for the multi-user test (JupyterHub itself is a test extra).
        if [ ! -x .venv/hub-proxy/node_modules/.bin/configurable-http-proxy ]; then
            npm install --silent --no-audit --no-fund --prefix .venv/hub-proxy \
                configurable-http-proxy@4 >/dev/null
        fi ;;
esac
.venv/bin/python -c "import sandbox_kernel_ext" >/dev/null
