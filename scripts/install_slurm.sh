#!/usr/bin/env bash
# Install Slurm (slurmctld, slurmd, the client commands) and MUNGE if missing, without leaving
# the packages' daemons running: the launcher tests start their own munged and Slurm daemons,
# with their own key, socket, config and ports, on namespace hosts (tests/support/slurm.py).
# An installation already there is left as it is, running daemons included: the tests' own
# daemons do not meet it.
set -euo pipefail

have_all() {
    command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 \
        && command -v sbatch >/dev/null 2>&1 && command -v munged >/dev/null 2>&1
}

# The daemons live in /usr/sbin, which a non-root PATH may lack.
export PATH="$PATH:/usr/sbin:/sbin"

if have_all; then
    echo "slurm already installed: $(slurmctld -V 2>/dev/null); $(munged --version 2>/dev/null | head -n1)"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    # The Slurm launcher tests run their daemons as root and are skipped without it.
    echo "Slurm and MUNGE are not installed and this is not root: the Slurm launcher tests will be skipped" >&2
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "Slurm is not installed and apt-get is unavailable; install slurmctld, slurmd, the Slurm" \
         "client commands and munge with this system's package manager" >&2
    exit 1
fi

# Keep the packages' maintainer scripts from starting the services where policy-rc.d is honoured.
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

PACKAGES=(slurmctld slurmd slurm-client munge)
if ! apt-get update || ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${PACKAGES[@]}"; then
    echo "apt-get could not install ${PACKAGES[*]} (its output is above);" \
         "the Slurm launcher tests will be skipped until they are installed" >&2
    exit 1
fi

# Where they were started anyway (a policy-rc.d of the machine's own allowed it), stop and disable
# what the packages just installed: nobody asked for a system munged, slurmctld or slurmd.
for service in munge slurmctld slurmd; do
    if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
        systemctl disable --now "$service.service" >/dev/null 2>&1 || true
    elif command -v service >/dev/null 2>&1; then
        service "$service" stop >/dev/null 2>&1 || true
    fi
    if command -v update-rc.d >/dev/null 2>&1; then
        update-rc.d "$service" disable >/dev/null 2>&1 || true
    fi
done

if ! have_all; then
    echo "apt-get finished but slurmctld, slurmd, sbatch or munged is still missing" >&2
    exit 1
fi
echo "installed: $(slurmctld -V); $(munged --version | head -n1)"
