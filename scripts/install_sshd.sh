#!/usr/bin/env bash
# Install OpenSSH's server and client if missing, without leaving the package's sshd running:
# the launcher tests start their own sshd per namespace host, with their own config, host keys
# and authorized keys (tests/support/sshd.py). An installation already there is left as it is,
# a running sshd included: the tests' sshds listen only on their namespace hosts' addresses.
set -euo pipefail

# sshd lives in /usr/sbin, which a non-root PATH may lack.
export PATH="$PATH:/usr/sbin:/sbin"

if command -v sshd >/dev/null 2>&1 && command -v ssh >/dev/null 2>&1; then
    echo "openssh already installed: $(ssh -V 2>&1)"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    # The SSH launcher tests run their sshds as root and are skipped without it.
    echo "OpenSSH is not installed and this is not root: the SSH launcher tests will be skipped" >&2
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "OpenSSH is not installed and apt-get is unavailable; install its server (sshd) and" \
         "client (ssh) with this system's package manager" >&2
    exit 1
fi

# Keep the package's maintainer scripts from starting the service where policy-rc.d is honoured.
POLICY=/usr/sbin/policy-rc.d
CREATED_POLICY=0
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$POLICY"
    chmod +x "$POLICY"
    CREATED_POLICY=1
fi
cleanup() {
    if [ "$CREATED_POLICY" -eq 1 ]; then
        rm -f "$POLICY"
    fi
}
trap cleanup EXIT

PACKAGES=(openssh-server openssh-client)
if ! apt-get update || ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${PACKAGES[@]}"; then
    echo "apt-get could not install ${PACKAGES[*]} (its output is above);" \
         "the SSH launcher tests will be skipped until they are installed" >&2
    exit 1
fi

# Where it was started anyway (a policy-rc.d of the machine's own allowed it), stop and disable the
# sshd the package just installed: nobody asked for one on the machine's port 22.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    systemctl disable --now ssh.service ssh.socket >/dev/null 2>&1 || true
elif command -v service >/dev/null 2>&1; then
    service ssh stop >/dev/null 2>&1 || true
fi
if command -v update-rc.d >/dev/null 2>&1; then
    update-rc.d ssh disable >/dev/null 2>&1 || true
fi

if ! command -v sshd >/dev/null 2>&1 || ! command -v ssh >/dev/null 2>&1; then
    echo "apt-get finished but sshd or ssh is still missing" >&2
    exit 1
fi
echo "installed: $(ssh -V 2>&1)"
