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
# shellcheck source=lib/apt_daemons.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/apt_daemons.sh"
install_without_daemons "Slurm launcher" "munge.service slurmctld.service slurmd.service" slurmctld slurmd slurm-client munge

if ! have_all; then
    echo "apt-get finished but slurmctld, slurmd, sbatch or munged is still missing" >&2
    exit 1
fi
echo "installed: $(slurmctld -V); $(munged --version | head -n1)"
