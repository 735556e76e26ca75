#!/usr/bin/env bash
# Install Debian's Chromium if missing: the dashboard's tests drive it with Playwright, which
# cannot download a browser of its own here (tests/observability). Without root or apt-get
# those tests are skipped, saying why.
set -euo pipefail

if command -v chromium >/dev/null 2>&1; then
    echo "chromium already installed: $(chromium --version 2>/dev/null | head -n1)"
    exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "chromium is missing and cannot be installed here (needs root and apt-get): the dashboard's" \
         "browser tests will be skipped" >&2
    exit 0
fi
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium
echo "installed: $(chromium --version 2>/dev/null | head -n1)"
