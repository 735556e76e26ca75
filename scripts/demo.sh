#!/usr/bin/env bash
# The main job: see README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec .venv/bin/regent demo "$@"
