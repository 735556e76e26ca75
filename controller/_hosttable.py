"""The controller's table of host agents: the agents a session uses, where a successor moved
one, which are lost, and requests to them (answered through the inbox by request id).
Mixed into Runtime (controller/_runtime.py), whose sockets and procs these methods use."""

from __future__ import annotations

import itertools
import time
from typing import Any

from regent import wire
from regent.controller.futures import Future
from regent.controller.refs import ProcTable
from regent.wire import Kind
from regent.wire.transport import Outbox


class _HostTable:
    """Host agents by the address they serve at. `hosts`: those the session uses (greeted
    every second); `moved_hosts`: a journaled address -> where its successor serves;
    `lost_hosts`: address -> why it is lost (requests to it fail at once)."""

    session: str
    epoch: int
    reply_address: str
    outbox: Outbox
    procs: ProcTable
    hosts: dict[str, str]
    moved_hosts: dict[str, str]
    lost_hosts: dict[str, str]
    fenced: str | None
    orphan_timeout_s: float | None
    _requests: dict[int, Future]
    _req_ids: itertools.count
    _unproven: dict
    relay: bool
    relaying: set[str]

    def host_request(self, host: str, op: str, timeout: float = 60.0, **fields: Any) -> dict:
        """A request to a host agent, answered through the inbox."""
        return self.host_requests([(host, op, fields)], timeout)[0]

    def host_requests(self, asks: list[tuple[str, str, dict]], timeout: float = 60.0,
                      timeouts: bool = False) -> list[Any]:
        """Requests (host, op, fields) to several agents, every one sent before any answer is
        awaited, so the agents work at once (a spawn over many hosts takes the time of one);
        the replies in order. A lost host fails the lot before anything is sent; otherwise
        the first failure, in order, is raised once the answers before it are in. With
        `timeouts`, an agent that does not answer in time gets its TimeoutError in the list."""
        from regent.worker.errors import DivergenceError, FencedError, SupervisionError

        targets = [self.moved_hosts.get(host, host) for host, _, _ in asks]
        for host, (_, op, _) in zip(targets, asks, strict=True):
            if host in self.lost_hosts:
                raise SupervisionError(f"cannot ask host agent at {host} to {op!r}: {self.lost_hosts[host]}")
        sent: list[tuple[int, Future]] = []
        try:
            self.flush()
            for host, (_, op, fields) in zip(targets, asks, strict=True):
                n = next(self._req_ids)
                fut: Future = Future()
                self._requests[n] = fut
                sent.append((n, fut))
                meta = {"sid": self.session, "e": self.epoch, "op": op, "n": n, "rt": self.reply_address,
                        "orphan_s": self.orphan_timeout_s, **fields}
                self.outbox.peer(host).send(wire.encode(Kind.HOST_REQ, meta))
            deadline = time.monotonic() + timeout
            replies = []
            for host, (_, op, _), (_, fut) in zip(targets, asks, sent, strict=True):
                if not fut.wait(max(0.0, deadline - time.monotonic())):
                    if not timeouts:
                        raise TimeoutError(self._no_answer(host, op, timeout))
                    replies.append(TimeoutError(self._no_answer(host, op, timeout)))
                    continue
                reply = fut.get()
                if reply.get("rl") is True and self.relay:
                    self.relaying.add(host)  # before any message to its procs: one route for each
                if reply.get("st") == "fenced":
                    self.fenced = reply.get("em", "fenced by the host agent")
                    raise FencedError(f"host agent at {host} refused {op!r}: {self.fenced}")
                if reply.get("st") == "divergence":
                    raise DivergenceError(f"host agent at {host} refused {op!r}: {reply.get('em')}")
                replies.append(reply)
            return replies
        finally:
            for n, _ in sent:
                self._requests.pop(n, None)

    def _no_answer(self, host: str, op: str, timeout: float) -> str:
        what = f"host agent at {host} did not answer {op!r} within {timeout:.0f} s"
        why = self._unproven.get(self.outbox.route_of(host))
        if why is None:
            return what
        return (f"{what}: {why}, so nothing was sent to it. Whatever listens there has not proven "
                "it holds this user's regent secret ($REGENT_HOME/secret) or the cluster keys: "
                "another program may have taken the agent's port, or an agent started before an "
                "upgrade still runs there. Stop it, or start the agent again")

    def register_host(self, host: str) -> None:
        self.hosts[host] = host

    def host_moved(self, was: str, now: str) -> None:
        """The agent journaled at `was` serves at `now` (a successor that could not take its
        address): requests for the procs it owns go there."""
        self.moved_hosts[was] = now

    def host_lost(self, host: str, reason: str) -> None:
        """A cluster host is gone (controller/cluster.py): its procs are dead to this session and
        requests to it fail at once. Caller holds the drive."""
        self.lost_hosts[host] = reason
        self.hosts.pop(host, None)
        for proc in list(self.procs.on_host(host)):
            self.mark_dead(proc, f"proc {proc.id} (pid {proc.pid}) is unreachable: {reason}")

    def host_back(self, old: str, new: str) -> None:
        """A lost host registered again: it serves new requests, and the procs this session gave
        up there are told to stop (if the agent never hears it, their orphan timeout ends them).
        Caller holds the drive."""
        self.lost_hosts.pop(old, None)
        self.lost_hosts.pop(new, None)
        if old != new:  # the procs it owned are replaced through the new agent, not the dead address
            for was, now in list(self.moved_hosts.items()):
                if now == old:
                    self.moved_hosts[was] = new
            self.moved_hosts[old] = new
        self.register_host(new)
        stale = [p.id for p in self.procs.on_host(old) if not p.alive]
        if stale:
            stop = {"sid": self.session, "e": self.epoch, "op": "stop_procs", "n": 0, "rt": self.reply_address,
                    "ids": stale}
            self.outbox.peer(new).try_send(wire.encode(Kind.HOST_REQ, stop))

    def _reconcile(self, reply: dict) -> None:
        """A host agent's answer to the periodic hello lists every live proc it has of this
        session: one of ours it lacks died unreported (say, while its agent was being restarted).
        The agent sends that answer after any death event, so a reported death is seen first."""
        host, listed = reply.get("at"), reply.get("procs")
        if not isinstance(host, str) or not isinstance(listed, list):
            return
        alive = {p["id"] for p in listed if isinstance(p, dict) and p.get("alive") and isinstance(p.get("id"), str)}
        for proc in list(self.procs.on_host(host)):
            if proc.alive and not proc.stopped and proc.id not in alive:
                self.mark_dead(proc, f"proc {proc.id} (pid {proc.pid}) is gone: its host agent at {host} "
                                     "no longer lists it (it died unreported, e.g. while no agent watched it)")
