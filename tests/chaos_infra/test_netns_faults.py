"""Packet-level faults between namespace hosts, checked with UDP probes: netem delay and loss
on a host's link, a one-way block, a partition into groups, loss and duplication by nftables,
overlapping faults, and healing."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from regent.chaos.netns import (
    NamespaceHosts,
    netem_unavailable_reason,
    nft_unavailable_reason,
    unavailable_reason,
)

pytestmark = pytest.mark.slow  # namespaces, nftables and netem: left to `make test`

PROBE = str(Path(__file__).with_name("udp_probe.py"))
PORT = 9999


@pytest.fixture
def hosts() -> Iterator[NamespaceHosts]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    with NamespaceHosts(["h1", "h2", "h3"]) as net:
        for h in net.names:
            net.popen(h, [sys.executable, PROBE, "echo", str(PORT)])
        time.sleep(0.5)
        yield net


def _ping(net: NamespaceHosts, src: str, dst: str, count: int = 5, timeout_s: float = 0.5) -> dict:
    out = subprocess.run(net.command(src, [sys.executable, PROBE, "ping", net.address(dst), str(PORT), str(count),
                                           str(timeout_s)]), capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def test_netem_delays_and_drops_what_a_host_sends(hosts: NamespaceHosts) -> None:
    reason = netem_unavailable_reason()
    if reason:
        pytest.skip(reason)
    base = statistics.median(_ping(hosts, "h1", "h2")["rtt_ms"])
    hosts.netem("h1", delay_ms=80)
    delayed = statistics.median(_ping(hosts, "h1", "h2")["rtt_ms"])
    assert 80 <= delayed < base + 300, (base, delayed)
    hosts.netem("h1", loss_pct=100)
    assert _ping(hosts, "h1", "h2", count=3, timeout_s=0.3)["replies"] == 0
    hosts.heal()
    assert _ping(hosts, "h1", "h2")["replies"] == 5


def test_a_block_a_partition_into_groups_random_drops_and_healing(hosts: NamespaceHosts) -> None:
    reason = nft_unavailable_reason()
    if reason:
        pytest.skip(reason)
    hosts.block("h1", "h2")  # h1's datagrams to h2 vanish; h3 is untouched
    assert _ping(hosts, "h1", "h2", count=3, timeout_s=0.3)["replies"] == 0
    assert _ping(hosts, "h1", "h3")["replies"] == 5
    assert _ping(hosts, "h2", "h3")["replies"] == 5
    hosts.unblock("h1", "h2")
    assert _ping(hosts, "h1", "h2")["replies"] == 5
    hosts.partition(["h1"], ["h2", "h3"])
    assert _ping(hosts, "h1", "h2", count=2, timeout_s=0.3)["replies"] == 0
    assert _ping(hosts, "h3", "h1", count=2, timeout_s=0.3)["replies"] == 0
    assert _ping(hosts, "h2", "h3")["replies"] == 5
    hosts.heal()
    assert all(_ping(hosts, a, b)["replies"] == 5 for a, b in (("h1", "h2"), ("h3", "h1")))
    hosts.drop("h2", 50)  # half of what reaches h2 (a ping is lost on the way there or back)
    replies = _ping(hosts, "h1", "h2", count=200, timeout_s=0.05)["replies"]
    assert 20 < replies < 180, replies
    hosts.drop("h2", 0)
    assert _ping(hosts, "h1", "h2")["replies"] == 5


def test_overlapping_faults_are_counted_and_duplication_doubles_datagrams(hosts: NamespaceHosts) -> None:
    reason = nft_unavailable_reason()
    if reason:
        pytest.skip(reason)
    first = hosts.partition(["h1"], ["h2", "h3"])
    second = hosts.partition(["h1", "h3"], ["h2"])  # h1-h2 blocked by both
    hosts.unblock_pairs(first)
    assert _ping(hosts, "h1", "h2", count=2, timeout_s=0.3)["replies"] == 0  # the second still holds
    assert _ping(hosts, "h1", "h3")["replies"] == 5  # only the first cut h1 from h3
    hosts.unblock_pairs(second)
    assert _ping(hosts, "h1", "h2")["replies"] == 5
    hosts.add_loss("h2", 100)
    hosts.add_loss("h2", 10)
    hosts.remove_loss("h2", 100)  # 10 % is left
    assert _ping(hosts, "h1", "h2", count=40, timeout_s=0.1)["replies"] >= 20
    hosts.remove_loss("h2", 10)
    hosts.add_duplicate("h1", 50)  # half of h1's datagrams reach h2 twice
    got = _ping(hosts, "h1", "h2", count=100, timeout_s=0.3)
    assert got["replies"] == 100 and 20 < got["copies"] < 80, got
    hosts.remove_duplicate("h1", 50)
    assert _ping(hosts, "h1", "h2", count=50, timeout_s=0.3)["copies"] == 0
