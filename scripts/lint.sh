#!/usr/bin/env bash
# ruff over every part, then the layering contracts in pyproject.toml (import-linter).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check regent controller worker wire hipcore journal chaos cli tests bench examples
.tools/lint-venv/bin/lint-imports
