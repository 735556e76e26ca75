"""Fixtures for the chaos infrastructure tests: a real Toxiproxy server and a TCP echo server.

The Toxiproxy binary is built by scripts/install_toxiproxy.sh when missing; the tests
skip (with the reason) only when it cannot be built.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # the repository is not installed into the venv
    sys.path.insert(0, str(REPO))

from regent.chaos import ToxiproxyNotInstalled, ToxiproxyServer, find_toxiproxy_server  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chaos_sockets import EchoHandler, EchoServer  # noqa: E402


@pytest.fixture(scope="session")
def toxiproxy_binary() -> Path:
    try:
        return find_toxiproxy_server()
    except ToxiproxyNotInstalled:
        pass
    script = REPO / "scripts" / "install_toxiproxy.sh"
    try:
        done = subprocess.run(
            [str(script)], capture_output=True, text=True, timeout=600, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"toxiproxy-server is missing and {script} could not run: {exc}")
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-5:])
        pytest.skip(f"toxiproxy-server is missing and {script} failed to build it:\n{tail}")
    return find_toxiproxy_server()


@pytest.fixture(scope="session")
def toxiproxy_server(toxiproxy_binary: Path) -> Iterator[ToxiproxyServer]:
    with ToxiproxyServer(toxiproxy_binary) as server:
        yield server


@pytest.fixture
def toxiproxy(toxiproxy_server: ToxiproxyServer) -> Iterator[ToxiproxyServer]:
    """The session's server, emptied of proxies after each test."""
    yield toxiproxy_server
    for proxy in toxiproxy_server.proxies().values():
        proxy.delete()


@pytest.fixture
def echo_server() -> Iterator[EchoServer]:
    """A TCP echo server on 127.0.0.1, served from a thread the fixture owns."""
    server = EchoServer(("127.0.0.1", 0), EchoHandler)
    thread = threading.Thread(
        target=server.serve_forever, args=(0.05,), name="echo-server", daemon=True
    )
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(5)
