"""Every Toxiproxy toxic, partitions and the server's lifecycle, against a real TCP echo server."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
from chaos_sockets import EchoServer, connect, recv_exactly, round_trip

from regent.chaos import (
    Proxy,
    ToxicValidationError,
    ToxiproxyClient,
    ToxiproxyError,
    ToxiproxyNotInstalled,
    ToxiproxyServer,
    process_state,
)
from regent.chaos.toxiproxy import ToxiproxyWatchdog


@pytest.fixture
def proxy(toxiproxy: ToxiproxyServer, echo_server: EchoServer) -> Proxy:
    return toxiproxy.create_proxy("client->echo", upstream=echo_server.address)


def read_until_closed(sock: socket.socket) -> tuple[bytes, bool]:
    """Read until the peer closes; return the bytes and whether it ended with a reset."""
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        return b"".join(chunks), True
    return b"".join(chunks), False


def test_proxy_reports_the_port_it_actually_listens_on(proxy: Proxy) -> None:
    host, port = proxy.listen.rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0
    round_trip(proxy.listen)


def test_latency_delays_each_round_trip_by_at_least_the_latency(proxy: Proxy) -> None:
    with proxy.toxic("latency", latency=300, jitter=0) as toxic:
        assert toxic.name == "latency_downstream"
        assert proxy.toxics() == [toxic]
        assert round_trip(proxy.listen) >= 0.29
    assert proxy.toxics() == []


def test_upstream_latency_delays_the_request_direction(proxy: Proxy) -> None:
    with proxy.toxic("latency", stream="upstream", latency=250):
        assert round_trip(proxy.listen) >= 0.24


def test_toxicity_zero_leaves_connections_untouched(proxy: Proxy) -> None:
    with proxy.toxic("latency", toxicity=0.0, latency=2000):
        assert round_trip(proxy.listen) < 1.0


def test_bandwidth_limits_throughput_to_the_rate(proxy: Proxy) -> None:
    payload = b"x" * 50_000
    with proxy.toxic("bandwidth", rate=100):  # 100 KB/s: 50 kB takes about 0.5 s
        assert round_trip(proxy.listen, payload) >= 0.4


def test_slow_close_delays_the_close(proxy: Proxy) -> None:
    with proxy.toxic("slow_close", delay=400), connect(proxy.listen) as sock:
        sock.sendall(b"bye")
        assert recv_exactly(sock, 3) == b"bye"
        start = time.monotonic()
        sock.shutdown(socket.SHUT_WR)  # the echo server closes; the proxy holds the close
        data, _ = read_until_closed(sock)
        assert data == b""
        assert time.monotonic() - start >= 0.39


def test_reset_peer_resets_the_connection(proxy: Proxy) -> None:
    with proxy.toxic("reset_peer", stream="upstream", timeout=0), connect(proxy.listen) as sock:
        sock.sendall(b"hello")
        data, reset = read_until_closed(sock)
    assert (data, reset) == (b"", True)


def test_timeout_black_holes_data_then_closes(proxy: Proxy) -> None:
    with proxy.toxic("timeout", timeout=500), connect(proxy.listen) as sock:
        start = time.monotonic()
        sock.sendall(b"lost")
        sock.settimeout(0.2)
        with pytest.raises(TimeoutError):
            sock.recv(16)  # nothing comes back: the data is dropped
        sock.settimeout(5)
        data, _ = read_until_closed(sock)
        assert data == b""
        assert time.monotonic() - start >= 0.45


def test_slicer_delivers_every_byte_in_many_pieces(proxy: Proxy) -> None:
    payload = bytes(range(256)) * 16
    with (
        proxy.toxic("slicer", average_size=64, size_variation=16, delay=3000),
        connect(proxy.listen) as sock,
    ):
        sock.sendall(payload)
        pieces = []
        while sum(map(len, pieces)) < len(payload):
            chunk = sock.recv(65536)
            assert chunk, "connection closed before every byte arrived"
            pieces.append(chunk)
    assert b"".join(pieces) == payload
    assert len(pieces) >= 4  # about 64 slices, 3 ms apart; a busy reader may merge some


def test_limit_data_closes_after_the_byte_limit(proxy: Proxy) -> None:
    with proxy.toxic("limit_data", bytes=100), connect(proxy.listen) as sock:
        sock.sendall(b"y" * 1000)
        data, _ = read_until_closed(sock)
    assert data == b"y" * 100


def _ephemeral() -> range:
    lo, hi = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    return range(lo, hi + 1)


@pytest.mark.parametrize("own_range", [True, False], ids=["REGENT_PORT_RANGE", "unset"])
def test_a_proxy_listens_below_the_ephemeral_range_so_it_can_come_back_up(
    toxiproxy: ToxiproxyServer, echo_server: EchoServer, monkeypatch, own_range: bool
) -> None:
    # While a proxy is down, any outgoing connection (one reconnecting to the proxy itself
    # included) may take an ephemeral port as its local port; the proxy could not listen again.
    if not own_range:
        monkeypatch.delenv("REGENT_PORT_RANGE", raising=False)
    p = toxiproxy.create_proxy(f"below-{own_range}", upstream=echo_server.address)
    port = int(p.listen.rsplit(":", 1)[1])
    assert port not in _ephemeral()
    p.disable()
    p.enable()
    round_trip(p.listen)


def test_a_proxy_brought_up_while_its_port_is_held_listens_once_it_is_free(proxy: Proxy) -> None:
    host, port = proxy.listen.rsplit(":", 1)
    proxy.disable()
    squatter = socket.socket()
    squatter.bind((host, int(port)))  # what an outgoing connection from that port looks like
    release = threading.Timer(0.5, squatter.close)
    release.start()
    started = time.monotonic()
    proxy.enable()
    assert proxy.enabled and time.monotonic() - started >= 0.4
    round_trip(proxy.listen)


def test_down_refuses_connections_and_enable_restores_them(proxy: Proxy) -> None:
    with connect(proxy.listen) as open_conn:
        with proxy.down():
            assert not proxy.enabled
            data, _ = read_until_closed(open_conn)  # open connections are cut too
            assert data == b""
            with pytest.raises(ConnectionRefusedError):
                connect(proxy.listen, timeout_s=1)
    assert proxy.enabled
    round_trip(proxy.listen)


def test_two_toxics_of_one_kind_need_distinct_names(proxy: Proxy) -> None:
    proxy.add_toxic("latency", latency=10)
    with pytest.raises(ToxiproxyError, match="toxic already exists") as err:
        proxy.add_toxic("latency", latency=20)
    assert err.value.status == 409
    second = proxy.add_toxic("latency", latency=20, name="more_latency")
    assert {t.name for t in proxy.toxics()} == {"latency_downstream", second.name}


def test_update_toxic_changes_attributes_in_place(proxy: Proxy) -> None:
    proxy.add_toxic("latency", latency=10, jitter=2)
    updated = proxy.update_toxic("latency_downstream", latency=40, toxicity=0.5)
    assert dict(updated.attributes) == {"latency": 40, "jitter": 2}
    assert updated.toxicity == 0.5
    with pytest.raises(ToxicValidationError, match="'latency'.*'jitter'"):
        proxy.update_toxic("latency_downstream", jitter=-1)


def test_invalid_toxic_is_rejected_before_reaching_the_server(proxy: Proxy) -> None:
    with pytest.raises(ToxicValidationError, match="toxic 'bandwidth' has no attribute 'speed'"):
        proxy.add_toxic("bandwidth", speed=10)
    assert proxy.toxics() == []


def test_proxy_reset_and_server_reset_remove_toxics_and_enable(
    toxiproxy: ToxiproxyServer, proxy: Proxy, echo_server: EchoServer
) -> None:
    other = toxiproxy.create_proxy("other", upstream=echo_server.address)
    proxy.add_toxic("latency", latency=100)
    proxy.disable()
    proxy.reset()
    assert proxy.toxics() == [] and proxy.refresh().enabled

    proxy.add_toxic("timeout", timeout=0)
    other.add_toxic("slicer", average_size=10)
    other.disable()
    toxiproxy.reset()
    for p in (proxy, other):
        assert p.toxics() == [] and p.refresh().enabled
    round_trip(other.listen)


def test_proxy_errors_say_what_failed(toxiproxy: ToxiproxyServer, proxy: Proxy) -> None:
    with pytest.raises(ToxiproxyError, match="proxy already exists") as err:
        toxiproxy.create_proxy("client->echo", upstream="127.0.0.1:1")
    assert err.value.status == 409
    with pytest.raises(ToxiproxyError, match="HTTP 404: proxy not found"):
        toxiproxy.proxy("nope")
    with pytest.raises(ToxiproxyError, match="upstream must be 'host:port'"):
        toxiproxy.create_proxy("bad", upstream="localhost")
    with pytest.raises(ToxiproxyError, match="without '/'"):
        toxiproxy.create_proxy("a/b", upstream="127.0.0.1:1")


def test_server_stops_and_its_api_then_reports_unreachable(toxiproxy_binary) -> None:
    server = ToxiproxyServer(toxiproxy_binary).start()
    pid, url = server.pid, server.url
    assert pid is not None and server.version()
    server.stop()
    server.stop()  # idempotent
    assert process_state(pid) is None
    with pytest.raises(ToxiproxyError, match=r"unreachable .*is the server running"):
        ToxiproxyClient(url).version()


def test_a_revived_server_keeps_its_api_port_and_proxies_without_their_toxics(
    toxiproxy_binary, echo_server: EchoServer
) -> None:
    server = ToxiproxyServer(toxiproxy_binary).start()
    try:
        proxy = server.create_proxy("client->echo", upstream=echo_server.address)
        proxy.add_toxic("latency", latency=5000)
        old_pid, url, listen = server.pid, server.url, proxy.listen
        server.revive(list(server.client.request("GET", "/proxies").values()))
        assert server.pid != old_pid and process_state(old_pid) is None and server.url == url
        back = server.client.proxy(proxy.name)
        assert back.listen == listen and back.enabled and back.toxics() == []
        t0 = time.monotonic()
        round_trip(listen)  # through the same address, without the 5 s latency
        assert time.monotonic() - t0 < 2.0
    finally:
        server.stop()


def test_the_watchdog_revives_a_server_whose_api_stays_stuck(toxiproxy_binary, echo_server: EchoServer) -> None:
    server = ToxiproxyServer(toxiproxy_binary).start()
    watchdog = ToxiproxyWatchdog(server, every_s=0.1, timeout_s=0.3, strikes=3).start()
    try:
        listen = server.create_proxy("client->echo", upstream=echo_server.address).listen
        time.sleep(0.3)  # the watchdog has seen the proxy
        stuck = server.pid
        os.kill(stuck, signal.SIGSTOP)  # an API that never answers
        deadline = time.monotonic() + 10
        while watchdog.revivals == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert watchdog.revivals == 1 and server.pid != stuck
        assert process_state(stuck) is None
        assert server.client.proxy("client->echo").listen == listen
        round_trip(listen)
    finally:
        watchdog.stop()
        server.stop()


def test_missing_binary_names_the_install_script(tmp_path) -> None:
    with pytest.raises(ToxiproxyNotInstalled, match="install_toxiproxy.sh"):
        ToxiproxyServer(tmp_path / "toxiproxy-server")
