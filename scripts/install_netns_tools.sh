#!/usr/bin/env bash
# Install iproute2 (`ip netns`, veth, bridges) if it is missing: the multi-host tests build
# their hosts as network namespaces with it. They need root; without it they are skipped.
set -euo pipefail

if command -v ip >/dev/null 2>&1; then
    echo "iproute2 already installed: $(ip -V 2>/dev/null | head -n1)"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "iproute2 is missing and this is not root: the multi-host tests will be skipped" >&2
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "iproute2 is missing and apt-get is unavailable: install iproute2 for the multi-host tests" >&2
    exit 0
fi
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y iproute2
