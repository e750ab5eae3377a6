#!/usr/bin/env bash
# Installs the Debian packages the test suite needs when they are missing (idempotent):
# Chromium for the browser tests, Node.js for the JS unit tests, and for the container-condition
# tests the seccomp profiles of Docker (golang-github-docker-docker-dev) and Podman
# (golang-github-containers-common) with libseccomp's Python bindings (python3-seccomp).
#
# Playwright drives this system browser through executable_path; nothing downloads a browser
# (never `playwright install`).
set -euo pipefail
missing=()
[ -x /usr/bin/chromium ] || missing+=(chromium fonts-dejavu-core)
command -v node >/dev/null || missing+=(nodejs)
[ -f /usr/share/gocode/src/github.com/docker/docker/profiles/seccomp/default.json ] \
    || missing+=(golang-github-docker-docker-dev)
[ -f /usr/share/containers/seccomp.json ] || missing+=(golang-github-containers-common)
/usr/bin/python3 -c 'import seccomp' 2>/dev/null || missing+=(python3-seccomp)
if [ ${#missing[@]} = 0 ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "system_deps: missing ${missing[*]}; run this script as root to apt-get them" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
