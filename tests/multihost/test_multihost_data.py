"""Data across namespace hosts: RDMA buffers read and written over TCP (chosen by itself:
shared memory cannot reach another host), a large tensor in a call and its result out of band
over the senders' data ports (wire.bulk_tcp), and a gloo all-reduce over a 3-host mesh."""

from __future__ import annotations

import uuid

import pytest
import torch

from regent import ActorError, Session
from regent.chaos.netcluster import MultiHost
from tests.hipcore_actors.patterns import expected
from tests.hipcore_actors.test_process_group import Reducer
from tests.hipcore_actors.test_rdma_actors import Owner, Peer
from tests.runtime.test_bulk_xhost import Offers

KiB, MiB = 1 << 10, 1 << 20


def test_rdma_between_actors_on_two_hosts_goes_over_tcp(multihost: MultiHost) -> None:
    with multihost.controller_env(), Session(f"mhd-{uuid.uuid4().hex[:8]}") as s:
        hosts = s.host_mesh(hosts=2)
        owner = hosts.slice(hosts=0).spawn_procs(per_host={"procs": 1}).spawn("owner", Owner)
        peer = hosts.slice(hosts=1).spawn_procs(per_host={"procs": 1}).spawn("peer", Peer)
        for i, size in enumerate([1, 4 * KiB, 1 * MiB, 64 * MiB]):
            buf = owner.make.call_one(f"b{i}", size, seed=i, memory="shared").get()  # shm-capable memory
            with pytest.raises(ActorError, match="cannot reach"):
                peer.read.call_one(buf, transport="shm").get()  # another host: no shared memory
            assert peer.read.call_one(buf).get() == expected(size, i), f"read of {size} bytes"
            assert peer.write.call_one(buf, seed=100 + i).get() == expected(size, 100 + i)
            assert owner.checksum.call_one(f"b{i}").get() == expected(size, 100 + i), f"write of {size} bytes"
            owner.drop.call_one(f"b{i}").get()


def test_a_large_tensor_in_a_call_and_its_result_cross_hosts_over_the_data_ports(multihost: MultiHost) -> None:
    from regent.wire import bulk_tcp

    value = torch.randn(16 * MiB)  # 64 MiB
    with multihost.controller_env(), Session(f"mhd-{uuid.uuid4().hex[:8]}") as s:
        echo = s.host_mesh(hosts=1).spawn_procs(per_host={"procs": 1}).spawn("echo", Offers)
        served = bulk_tcp.served()
        for _ in range(2):
            got = echo.echo.call_one(value).get(timeout=120)
            assert got.dtype == value.dtype and torch.equal(got, value)
        assert bulk_tcp.served() == served + 2  # the arguments went out of band, from here
        offered, proc_served = echo.offered.call_one().get()
        assert proc_served == 2  # and the results, from the proc on h1
        # Nothing is left offered, unless a call went again (a 64 MiB transfer under load can
        # outlast the resend): the proc then answers from its result cache with a new offer, which
        # nobody fetches once the first answer has arrived; it expires (wire.bulk_tcp.TTL_S).
        resent = s.runtime.resends["link"] + s.runtime.resends["overdue"]
        assert offered <= resent, f"{offered} transfers left offered with {s.runtime.resends} resends"


def test_gloo_all_reduce_over_a_three_host_mesh(multihost: MultiHost) -> None:
    with multihost.controller_env(), Session(f"mhd-{uuid.uuid4().hex[:8]}") as s:
        procs = s.host_mesh(hosts=3).spawn_procs(per_host={"procs": 1})
        assert procs.init_process_group(timeout_s=60) == "gloo"
        reduced = procs.spawn("r", Reducer).all_reduce.call().get().values()
        assert [r[2] for r in reduced] == [6.0, 6.0, 6.0]
        assert sorted(r[0] for r in reduced) == [0, 1, 2]
