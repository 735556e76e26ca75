"""regent-porcupine for the tests that need it: found, or built with scripts/install_porcupine.sh.

A missing Go toolchain is a reason to skip; a build that fails with Go present is an error.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from regent.chaos.linearizability import PorcupineNotInstalled, find_porcupine

__all__ = ["porcupine_binary"]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "install_porcupine.sh"


def _go() -> str | None:
    return os.environ.get("GO") or shutil.which("go") or (
        "/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else None)


def porcupine_binary() -> Path:
    """The checker's binary, built from chaos/porcupine by the install script when it is missing
    or stale (the script rebuilds only when the sources changed)."""
    if _go() is None:
        try:
            return find_porcupine()
        except PorcupineNotInstalled as e:
            pytest.skip(f"no Go toolchain to build regent-porcupine with ({e})")
    done = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        pytest.fail(f"{SCRIPT} failed:\n{(done.stdout + done.stderr)[-2000:]}")
    return find_porcupine()
