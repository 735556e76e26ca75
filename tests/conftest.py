"""Suite-wide isolation: every test run gets its own REGENT_HOME, so it has its own
host agent, secret and keys, and leaves nothing running behind it."""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

_HOME = tempfile.mkdtemp(prefix="regent-test-home-")
os.environ["REGENT_HOME"] = _HOME
os.environ.setdefault("REGENT_HOST_IDLE_EXIT_S", "20")


def _kill_host_agents(home: str) -> None:
    path = Path(home) / "host.json"
    try:
        pid = json.loads(path.read_text())["pid"]
        os.kill(int(pid), signal.SIGTERM)
    except (OSError, ValueError, KeyError):
        pass


@pytest.fixture(scope="session", autouse=True)
def _regent_home():
    yield Path(_HOME)
    _kill_host_agents(_HOME)


@pytest.fixture()
def own_home(tmp_path, monkeypatch):
    """``own_home(**env)``: a REGENT_HOME of the test's own, with keys and the given
    environment (so its own host agent, stopped at the end)."""
    homes: list[Path] = []

    def make(**env: str) -> Path:
        from regent.wire.security import init_keys

        home = tmp_path / f"home{len(homes) or ''}"
        monkeypatch.setenv("REGENT_HOME", str(home))
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        init_keys()
        homes.append(home)
        return home

    yield make
    for home in homes:
        _kill_host_agents(str(home))
