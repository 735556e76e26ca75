"""Suite-wide isolation: every test process (each pytest-xdist worker) gets its own
REGENT_HOME, so it has its own host agent, secret and keys, and its own range of ports; it
leaves nothing running behind it."""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

_HOME = tempfile.mkdtemp(prefix="regent-test-home-")
os.environ["REGENT_HOME"] = _HOME


def _port_range() -> str:
    """This process's own ports (hipcore.ports): 1000 a pytest-xdist worker, below the kernel's
    ephemeral range, so parallel workers never choose the same port for their servers."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 21
    if index > 21:
        raise RuntimeError(f"pytest-xdist worker {worker}: ports are shared out to 22 workers at most; "
                           "run with fewer (-n)")
    lo = 10000 + 1000 * index
    return f"{lo}-{lo + 999}"


os.environ["REGENT_PORT_RANGE"] = _port_range()
# A worker's agent outlives the gaps between its tests (the suite stops it at the end): one that
# left while a test's controller was silent (its journal held back on purpose) was seen to drop
# the test's respawn with 20 s.
os.environ.setdefault("REGENT_HOST_IDLE_EXIT_S", "120")


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


# --- the order files run in --------------------------------------------------------------------
# pytest-xdist (--dist loadfile) hands each worker whole files, in the order collected: longest
# first, by the seconds each took in a recorded run (tests/durations.json), so the long files
# start at once and the short ones fill the gaps at the end. A file not recorded runs last.
DURATIONS = Path(__file__).parent / "durations.json"
_RECORD = os.environ.get("REGENT_RECORD_DURATIONS")  # a path: write this run's seconds per file there
_seconds: dict[str, float] = defaultdict(float)


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        known = {str(k): float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        known = {}
    first_seen = {f: i for i, f in reversed(list(enumerate(_file_of(it.nodeid) for it in items)))}
    items.sort(key=lambda it: (-known.get(_file_of(it.nodeid), 0.0), first_seen[_file_of(it.nodeid)]))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _RECORD and not os.environ.get("PYTEST_XDIST_WORKER"):
        _seconds[_file_of(report.nodeid)] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not _RECORD or os.environ.get("PYTEST_XDIST_WORKER") or not _seconds:
        return
    path = Path(_RECORD)
    try:
        merged = json.loads(path.read_text())
    except (OSError, ValueError):
        merged = {}
    merged.update({f: round(t, 1) for f, t in _seconds.items()})
    path.write_text(json.dumps(dict(sorted(merged.items(), key=lambda kv: -kv[1])), indent=1) + "\n")
