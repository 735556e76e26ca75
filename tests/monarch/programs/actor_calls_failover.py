"""A controller program for the actor-call failover test: actors that call other actors
through meshes they were given (at spawn, as arguments), spawn their own child meshes, and
call with every adverb, clean up with calls when the program stops them, send values into a port the controller opened (their own, and their
answers to Monarch's send()) and receive what the program sends into theirs; the program also
calls a mesh an actor spawned and uses a proc of its own (this_proc()), while the test
SIGKILLs successive primaries.

`Store` counts every call it runs by token; each token names one call an actor made, so a
count above 1 is a call run twice. Configured by environment as tests/failover/programs/mixed.py
is (REGENT_TEST_SESSION, REGENT_TEST_JOURNAL, REGENT_TEST_STEPS, REGENT_TEST_LEADER_FILE,
REGENT_TEST_TTL); prints "step i" for each step run live, then one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from regent.controller import Session
from regent.worker import (
    Actor,
    ActorMeshRef,
    Channel,
    Port,
    current_rank,
    endpoint,
    send,
    this_proc,
)


class Store(Actor):
    def __init__(self) -> None:
        self.seen: dict[str, int] = {}
        self.waiting: list = []

    @endpoint
    def put(self, token: str, x: int) -> int:
        """Its answer depends on the call alone: three relays call a store member in any order."""
        self.seen[token] = self.seen.get(token, 0) + 1
        time.sleep(0.002)
        return 2 * x

    @endpoint
    async def put_async(self, token: str, x: int) -> int:
        """An async endpoint, which a relay's sync endpoint on the same proc waits on."""
        self.seen[token] = self.seen.get(token, 0) + 1
        await asyncio.sleep(0.002)
        return 3 * x

    @endpoint
    def echo_into(self, port: Port, token: str) -> None:
        """Into a channel an actor opened."""
        self.seen[token] = self.seen.get(token, 0) + 1
        port.send(token)

    @endpoint(explicit_response_port=True)
    def later(self, port: Port, token: str) -> None:
        """Answered through its port, from another call (release)."""
        self.seen[token] = self.seen.get(token, 0) + 1
        self.waiting.append((port, token))

    @endpoint
    def release(self, token: str) -> int:
        self.seen[token] = self.seen.get(token, 0) + 1
        waiting, self.waiting = self.waiting, []
        for port, t in waiting:
            port.send(f"released {t}")
        return len(waiting)

    @endpoint
    def report(self) -> dict[str, int]:
        return dict(self.seen)


class Temp(Actor):
    """Spawned and stopped by the program; its __cleanup__ calls every store member, under ids
    derived from the stop, so a stop sent again by a new leader makes none of them twice."""

    def __init__(self, store: ActorMeshRef, token: str) -> None:
        self.store, self.token = store, token

    def __cleanup__(self, exc: BaseException | None) -> None:
        self.store.put.call(self.token, 1).get(timeout=60)


class Relay(Actor):
    """Holds the store it was spawned with, and a child mesh of its own on its proc."""

    def __init__(self, store: ActorMeshRef) -> None:
        self.store = store
        self.me = current_rank().rank
        self.child = this_proc().spawn(f"aux{self.me}", Store)
        self.port, self.rx = Channel.open()  # the controller program sends into it

    @endpoint
    def inbox(self) -> Port:
        return self.port

    @endpoint
    def aux(self) -> ActorMeshRef:
        return self.child

    @endpoint
    def drain(self, n: int) -> list:
        return [self.rx.recv().get(timeout=60) for _ in range(n)]

    def _token(self, tag: str, i: int) -> str:
        return f"{tag}{i}r{self.me}"

    @endpoint
    def forward(self, tag: str, i: int) -> int:
        """A call to every store member, one to a chosen member and one to the async endpoint of
        the member on its own proc, from a sync endpoint."""
        every = self.store.put.call(self._token(tag, i), i).get(timeout=60).values()
        picked = self.store.put.choose(self._token(tag + "c", i), 1).get(timeout=60)
        # The store member on this relay's own proc, async: the proc serves it while this waits.
        near = self.store.slice(procs=self.me).put_async.call_one(self._token(tag + "n", i), i).get(timeout=60)
        return sum(every) + picked + near

    @endpoint
    async def forward_async(self, tag: str, i: int) -> int:
        one = await self.store.slice(procs=i // 6 % 3).put.call_one(self._token(tag, i), i)
        aux = await self.child.put.call_one(self._token(tag + "x", i), i)
        return one + aux

    @endpoint
    def through(self, other: ActorMeshRef, tag: str, i: int) -> list[int]:
        """A mesh passed as an argument, streamed."""
        return sorted(v for _, v in other.put.stream(self._token(tag, i), 1))

    @endpoint
    async def collect(self, tag: str, i: int) -> list[str]:
        """A channel of its own, which every store member sends into, and a call answered
        through a response port."""
        port, rx = Channel.open()
        await self.store.echo_into.call(port, self._token(tag, i))
        got = sorted([await rx.recv() for _ in range(len(self.store))])
        one = self.store.slice(procs=i // 6 % 3)
        later = one.later.call_one(self._token(tag + "l", i))
        await one.release.call_one(self._token(tag + "r", i))
        return [*got, await later]

    @endpoint
    def produce_into(self, port: Port, i: int) -> None:
        """Two values into the controller's port."""
        port.send((i, self.me, 0))
        port.send((i, self.me, 1))

    @endpoint
    def children(self) -> dict[str, int]:
        return self.child.report.call_one().get(timeout=60)


def main() -> None:
    steps = int(os.environ.get("REGENT_TEST_STEPS", "40"))
    with Session(os.environ["REGENT_TEST_SESSION"], journal=os.environ["REGENT_TEST_JOURNAL"],
                 lease_ttl_s=float(os.environ.get("REGENT_TEST_TTL", "1.0"))) as s:
        with open(os.environ["REGENT_TEST_LEADER_FILE"], "a") as f:
            f.write(f"{os.getpid()}\n")
        procs = s.spawn_procs(per_host={"procs": 3})
        store = procs.spawn("store", Store)
        relay = procs.spawn("relay", Relay, store)
        port, rx = s.open_port()
        mine = this_proc().spawn("mine", Store)  # the program's own proc, on this machine
        inbox = relay.slice(procs=0).inbox.call_one().get()
        aux = relay.slice(procs=1).aux.call_one().get()  # a mesh an actor spawned, called by the program
        out: list = []
        for i in range(steps):
            k = i % 6
            if k == 0:
                out.append(relay.forward.call("f", i).get().values())
            elif k == 1:
                out.append(relay.slice(procs=i // 6 % 3).forward_async.call_one("a", i).get())
            elif k == 2:
                out.append(relay.slice(procs=(i // 6 + 1) % 3).through.call_one(store, "t", i).get())
            elif k == 3:
                relay.forward.broadcast("b", i)
                procs.slice(procs=i // 6 % 3).spawn(f"temp{i}", Temp, store, f"cl{i}").stop()
            elif k == 5:
                out.append(relay.slice(procs=(i // 6 + 2) % 3).collect.call_one("p", i).get())
            elif i // 6 % 2 == 0:  # every relay sends two values to the controller's port
                relay.produce_into.broadcast(port, i)
                out.append(sorted(rx.recv().get() for _ in range(6)))
            else:  # Monarch's send(), answers into the port; the program's own port sends and proc
                send(store.put, (f"s{i}", i), {}, port=port)
                send(mine.put, (f"sc{i}", i + 1), {}, port=port, selection="choose")
                inbox.send((i, "from the program"))
                got = sorted(rx.recv().get() for _ in range(4))
                out.append([got, relay.slice(procs=0).drain.call_one(1).get(), mine.put.call_one(f"m{i}", i).get(),
                            aux.put.call_one(f"x{i}", i).get()])
            if not s.replaying:
                print(f"step {i}", file=sys.stderr, flush=True)
        # Each relay answers after its broadcast forwards finished (per-sender FIFO), so the
        # stores' reports, read after, count every call.
        children = relay.children.call().get().values()
        reports = store.report.call().get().values() + [mine.report.call_one().get()]
        print(json.dumps({"out": out, "reports": reports, "children": children, "role": s.role,
                          "replayed": s.stats["replayed"]}), flush=True)


if __name__ == "__main__":
    main()
