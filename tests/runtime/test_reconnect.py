"""A broken TCP link loses what was on the wire (zmq reconnects, it does not
retransmit). The controller resends outstanding calls under the same call id when
the link comes back; workers dedupe, so nothing hangs and nothing runs twice."""

from __future__ import annotations

import time

import pytest

from regent.chaos import ToxiproxyServer, find_toxiproxy_server
from regent.chaos.links import ProxiedLinks, proxy_name
from regent.controller import Session
from regent.worker import Actor, endpoint


class Slow(Actor):
    def __init__(self) -> None:
        self.runs: dict[int, int] = {}

    @endpoint
    def work(self, i: int, pad: bytes, delay: float) -> int:
        self.runs[i] = self.runs.get(i, 0) + 1
        time.sleep(delay)
        return i, len(pad), pad

    @endpoint
    def runs_of(self) -> dict[int, int]:
        return self.runs


@pytest.fixture(scope="module")
def toxiproxy():
    try:
        find_toxiproxy_server()
    except Exception as e:  # the suite's install step builds it; say so if it did not
        pytest.skip(f"toxiproxy-server not installed (scripts/install_toxiproxy.sh): {e}")
    with ToxiproxyServer() as server:
        yield server


@pytest.mark.parametrize("direction", ["proc->controller", "controller->proc"])
def test_calls_cut_off_on_the_wire_are_resent_and_run_exactly_once(toxiproxy, direction):
    links = ProxiedLinks(toxiproxy.url)
    with Session(f"reconnect-{direction.replace('->', '-')}", journal="off", links=links) as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("slow", Slow)
        mesh.work.call_one(-1, b"", 0.0).get(timeout=10)
        link = next(name for name in links.routes if name.startswith(direction))
        proxy = toxiproxy.proxy(proxy_name(link))
        # Each connection on the link now dies after 6 kB: a message is cut mid-frame, the
        # connection is closed, zmq reconnects; what was on the wire is gone.
        with proxy.toxic("limit_data", stream="upstream", bytes=6000):
            futs = [mesh.work.call_one(i, b"x" * 2000, 0.01) for i in range(12)]
            time.sleep(0.5)
        assert [f.get(timeout=20)[0] for f in futs] == list(range(12))
        runs = mesh.runs_of.call_one().get(timeout=10)
        assert all(n == 1 for n in runs.values()), runs
        assert sorted(runs) == list(range(-1, 12))
