#!/usr/bin/env bash
# Idempotent: a virtual environment in .venv with regent and its dependencies, and one in
# .tools/lint-venv with the import contracts' checker (kept apart: see pyproject.toml's `lint`).
# Each is re-installed only when pyproject.toml changed since its last successful install.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
stale() {  # stale VENV: create VENV if missing; true when its install is older than pyproject.toml
  [ -x "$1/bin/python" ] || "$PY" -m venv "$1"
  [ ! -f "$1/.regent-installed" ] || [ "$(cat "$1/.regent-installed")" != "$want" ]
}
if stale .venv; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[test]"
  echo "$want" > .venv/.regent-installed
fi
if stale .tools/lint-venv; then
  # The checker reads regent's source, found through an editable install without dependencies.
  .tools/lint-venv/bin/python -m pip install -q --upgrade pip
  .tools/lint-venv/bin/python -m pip install -q --no-deps -e .
  .tools/lint-venv/bin/python -m pip install -q $(.venv/bin/python -c \
    'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["lint"])')
  echo "$want" > .tools/lint-venv/.regent-installed
fi
