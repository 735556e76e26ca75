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
# shellcheck source=lib/apt_daemons.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/apt_daemons.sh"
install_without_daemons "SSH launcher" "ssh.service ssh.socket" openssh-server openssh-client

if ! command -v sshd >/dev/null 2>&1 || ! command -v ssh >/dev/null 2>&1; then
    echo "apt-get finished but sshd or ssh is still missing" >&2
    exit 1
fi
echo "installed: $(ssh -V 2>&1)"
