"""ChaosNet: named links over one Toxiproxy server, partitions, heals and clearing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from chaos_sockets import EchoServer, connect, round_trip

from regent.chaos import ChaosNet, ToxiproxyServer, UnknownLinkError


@pytest.fixture
def net(toxiproxy: ToxiproxyServer) -> Iterator[ChaosNet]:
    with ChaosNet(toxiproxy) as net:
        yield net


def test_links_named_like_the_design_route_traffic(net: ChaosNet, echo_server: EchoServer) -> None:
    names = ["controller->etcd", "standby->etcd", "controller->proc/3", "controller->proc_3"]
    addresses = {name: net.link(name, echo_server.address) for name in names}
    assert len(set(addresses.values())) == len(names)
    assert len({net[name].name for name in names}) == len(names)  # distinct proxies
    for name in names:
        assert net.address(name) == addresses[name]
        round_trip(addresses[name])
    assert sorted(net) == sorted(names) and "standby->etcd" in net


def test_partition_cuts_one_link_and_heal_restores_it(
    net: ChaosNet, echo_server: EchoServer
) -> None:
    cut = net.link("controller->etcd", echo_server.address)
    kept = net.link("standby->etcd", echo_server.address)
    net.partition("controller->etcd")
    with pytest.raises(ConnectionRefusedError):
        connect(cut, timeout_s=1)
    round_trip(kept)
    net.heal("controller->etcd")
    round_trip(cut)
    assert [(e.kind, e.target) for e in net.faults.events()] == [
        ("down", "controller->etcd"),
        ("up", "controller->etcd"),
    ]


def test_clear_removes_every_toxic_and_heals_every_link(
    net: ChaosNet, echo_server: EchoServer
) -> None:
    a = net.link("a->b", echo_server.address)
    net.link("c->d", echo_server.address)
    net.add_toxic("a->b", "latency", latency=5000)
    net.add_toxic("c->d", "timeout", stream="upstream", timeout=0)
    net.partition("c->d")
    net.clear()
    assert all(net[name].toxics() == [] and net[name].refresh().enabled for name in net)
    round_trip(a)
    kinds = [e.kind for e in net.faults.events()]
    assert kinds == ["toxic_add", "toxic_add", "down", "clear"]
    assert net.faults.events()[0].detail["latency"] == 5000


def test_unknown_and_duplicate_links_are_explained(net: ChaosNet, echo_server: EchoServer) -> None:
    net.link("controller->etcd", echo_server.address)
    with pytest.raises(
        UnknownLinkError, match=r"no link named 'host->etcd' \(links: controller->etcd\)"
    ):
        net["host->etcd"]
    with pytest.raises(ValueError, match="link 'controller->etcd' already exists"):
        net.link("controller->etcd", echo_server.address)


def test_close_deletes_the_proxies_it_created(
    toxiproxy: ToxiproxyServer, echo_server: EchoServer
) -> None:
    net = ChaosNet(toxiproxy, prefix="t1-")
    address = net.link("x->y", echo_server.address)
    assert list(toxiproxy.proxies()) == ["t1-x-_y"]
    net.close()
    assert toxiproxy.proxies() == {}
    with pytest.raises(ConnectionRefusedError):
        connect(address, timeout_s=1)
