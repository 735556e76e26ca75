"""Actors calling actors across namespace hosts: a mesh reference names procs by the addresses
their hosts advertise, so an actor on one host calls, spawns on and sends ports to the others."""

from __future__ import annotations

import uuid

from regent import Session
from regent.chaos.netcluster import MultiHost
from regent.worker import (
    Actor,
    ActorMeshRef,
    Channel,
    Port,
    ProcMeshRef,
    current_rank,
    endpoint,
    send,
    this_host,
)
from tests.multihost.actors import Counter


class Caller(Actor):
    def __init__(self, counters: ActorMeshRef) -> None:
        self.counters = counters

    @endpoint
    def incr_all(self) -> list[int]:
        return self.counters.incr.call().get(timeout=60).values()

    @endpoint
    def where_all(self) -> list[int]:
        return [w["netns"] for w in self.counters.where.call().get(timeout=60).values()]

    @endpoint
    def spawn_on(self, procs: ProcMeshRef) -> list[int]:
        mesh = procs.spawn("spawned-by-caller", Counter)
        return [w["netns"] for w in mesh.where.call().get(timeout=60).values()]

    @endpoint
    def spawn_procs_here(self) -> list[int]:
        """Procs of its own, on its own host (not the controller's)."""
        mesh = this_host().spawn_procs(per_host={"procs": 2}).spawn("counters-of-caller", Counter)
        return [w["netns"] for w in mesh.where.call().get(timeout=60).values()]

    @endpoint
    def gather_from(self, senders: ActorMeshRef) -> list[int]:
        port, rx = Channel.open()
        senders.send.call(port).get(timeout=60)
        return sorted(rx.recv().get(timeout=60) for _ in range(len(senders)))


class Sender(Actor):
    @endpoint
    def send(self, port: Port) -> None:
        port.send(current_rank().rank)


def test_an_actor_on_one_host_calls_spawns_and_receives_on_the_others(multihost: MultiHost) -> None:
    with multihost.controller_env(), Session(f"mhc-{uuid.uuid4().hex[:8]}") as s:
        hosts = s.host_mesh(hosts=3)
        procs = hosts.spawn_procs(per_host={"procs": 1})
        others = procs.slice(hosts=slice(1, 3))
        counters = others.spawn("counters", Counter)
        caller = procs.slice(hosts=0).spawn("caller", Caller, counters)
        assert caller.incr_all.call_one().get(timeout=60) == [1, 1]
        assert caller.where_all.call_one().get(timeout=60) == [multihost.netns_inode(h) for h in ("h2", "h3")]
        assert caller.spawn_on.call_one(others).get(timeout=60) == [multihost.netns_inode(h) for h in ("h2", "h3")]
        senders = procs.spawn("senders", Sender)
        assert caller.gather_from.call_one(senders).get(timeout=60) == [0, 1, 2]
        port, rx = s.open_port()
        senders.send.broadcast(port)
        assert sorted(rx.recv().get(timeout=60) for _ in range(3)) == [0, 1, 2]
        send(counters.incr, (), {}, port=port)  # Monarch's send(): each answer into the program's port
        assert sorted(rx.recv().get(timeout=60) for _ in range(2)) == [2, 2]
        assert caller.spawn_procs_here.call_one().get(timeout=60) == [multihost.netns_inode("h1")] * 2
