#!/usr/bin/env bash
# The full test suite, installing what it needs first (Python deps, etcd, Toxiproxy).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
scripts/install_etcd.sh
scripts/install_toxiproxy.sh
scripts/install_porcupine.sh
scripts/install_netns_tools.sh
scripts/install_slurm.sh
scripts/install_sshd.sh
export PATH="$PWD/.tools/bin:$PATH"
.venv/bin/ruff check regent controller worker wire hipcore journal chaos cli tests bench examples
.venv/bin/lint-imports  # the layering contracts in pyproject.toml
# The slowest tests are listed at the end: the suite must stay under 30 min on a 2-core machine.
exec .venv/bin/python -m pytest -q --durations=15 "$@"
