#!/usr/bin/env bash
# Install etcd (the journal's production store) if it is missing, without leaving a system etcd
# running: regent's tests and benches start their own on free loopback ports.
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

stop_system_etcd() {
    # The Debian package enables and starts etcd.service; a stray server on 2379 would
    # silently serve journals meant for another etcd.
    if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
        $SUDO systemctl disable --now etcd.service >/dev/null 2>&1 || true
    elif command -v service >/dev/null 2>&1; then
        $SUDO service etcd stop >/dev/null 2>&1 || true
    fi
    if command -v update-rc.d >/dev/null 2>&1; then
        $SUDO update-rc.d etcd disable >/dev/null 2>&1 || true
    fi
}

if command -v etcd >/dev/null 2>&1; then
    echo "etcd already installed: $(etcd --version 2>/dev/null | head -n1)"
    stop_system_etcd
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "etcd is not installed and apt-get is unavailable; install etcd 3.4+ from" \
         "https://github.com/etcd-io/etcd/releases and put it on PATH" >&2
    exit 1
fi

# Keep the package's maintainer scripts from starting the service where policy-rc.d is honoured.
POLICY=/usr/sbin/policy-rc.d
CREATED_POLICY=0
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
    $SUDO chmod +x "$POLICY"
    CREATED_POLICY=1
fi
cleanup() {
    if [ "$CREATED_POLICY" -eq 1 ]; then
        $SUDO rm -f "$POLICY"
    fi
}
trap cleanup EXIT

$SUDO apt-get update
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y etcd-server
stop_system_etcd
echo "installed: $(etcd --version | head -n1)"
