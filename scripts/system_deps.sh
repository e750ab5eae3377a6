#!/usr/bin/env bash
# Installs the Debian packages the test suite needs when they are missing (idempotent):
# Chromium for the browser tests and Node.js for the JS unit tests.
#
# Playwright drives this system browser through executable_path; nothing downloads a browser
# (never `playwright install`).
set -euo pipefail
missing=()
[ -x /usr/bin/chromium ] || missing+=(chromium fonts-dejavu-core)
command -v node >/dev/null || missing+=(nodejs)
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
