#!/usr/bin/env bash
# Install iproute2 (`ip netns`, veth, bridges, tc) and nftables (blocks and partitions between
# hosts) if missing: the multi-host and packet-fault tests build their hosts as network
# namespaces with them. They need root; without it (or without the tools) they are skipped.
set -euo pipefail

missing=()
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v nft >/dev/null 2>&1 || missing+=(nftables)
if [ ${#missing[@]} -eq 0 ]; then
    echo "namespace tools already installed: $(ip -V 2>/dev/null | head -n1); $(nft --version 2>/dev/null)"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "missing ${missing[*]} and this is not root: the multi-host tests will be skipped" >&2
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "missing ${missing[*]} and apt-get is unavailable: install them for the multi-host tests" >&2
    exit 0
fi
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"
