"""A session's view of the clusters it uses: hosts picked from the store's registrations
(the pick is journaled by the caller), attached (a hello), and watched.

A host whose registration vanishes (its agent died, or it was cut off from the store, for a
lease TTL) is lost: its procs are marked dead, so their pending and later calls fail with
SupervisionError, and the loss is a journaled supervision record. A host that registers again
is a new incarnation; the procs the session gave up there are stopped. The store is judged
only when it answers: a store outage is not a host loss.
"""

from __future__ import annotations

import ipaddress
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from regent.journal.hosts import HostRecord, registered_hosts
from regent.wire.security import is_loopback
from regent.worker.errors import SupervisionError

log = structlog.get_logger("regent.controller")

WATCH_INTERVAL_S = 0.25
PICK_POLL_S = 0.2
# A picked agent has HELLO_S to answer; one still registered at the same address that did not
# (a loaded machine, a pause) is asked once more for HELLO_AGAIN_S before the mesh fails.
HELLO_S = 3.0
HELLO_AGAIN_S = 15.0


def _entry(h: HostRecord) -> dict:
    """What the journal keeps of a picked host."""
    return {"id": h.id, "addr": h.address, "inc": h.incarnation, "hostname": h.hostname}


@dataclass
class _Watched:
    cluster: str
    id: str
    addr: str
    inc: str
    lost: str | None = None  # why, once lost


class ClusterHosts:
    """The hosts one live session uses, by (cluster, host id). `note(ev, **data)` journals a
    supervision record; `post(fn)` runs fn on the session's driver."""

    def __init__(self, backend: Any, runtime: Any, note: Callable[..., None], post: Callable[[Callable], None]):
        self.backend = backend
        self.runtime = runtime
        self.note = note
        self.post = post
        self.watched: dict[tuple[str, str], _Watched] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._listed: dict[str, tuple[Any, dict[str, HostRecord]]] = {}  # cluster -> (version, hosts)

    def registered(self, cluster: str) -> list[HostRecord]:
        return registered_hosts(self.backend, cluster)

    def pick(self, cluster: str, n: int, timeout_s: float) -> list[dict]:
        """The first `n` registered hosts of `cluster` (by name), once that many are registered."""
        deadline = time.monotonic() + timeout_s
        said = 0.0
        while True:
            hosts = self.registered(cluster)
            if len(hosts) >= n:
                return [_entry(h) for h in hosts[:n]]
            now = time.monotonic()
            if now >= deadline:
                names = ", ".join(h.id for h in hosts) or "none"
                raise TimeoutError(
                    f"cluster {cluster!r} has {len(hosts)} of the {n} hosts asked for registered in "
                    f"{self.backend.url} after {timeout_s:g} s (registered: {names}): start an agent on "
                    f"each further node with `regent host --cluster {cluster} --store {self.backend.url} "
                    "--advertise <the node's IP>`, or ask for fewer hosts")
            if now - said >= 5.0:
                said = now
                log.info("waiting for hosts to register", cluster=cluster, registered=len(hosts), wanted=n)
            time.sleep(PICK_POLL_S)

    def host_at(self, addr: str) -> tuple[str, str] | None:
        """(cluster, host id) of a watched host by its agent's address."""
        with self._lock:
            return next(((w.cluster, w.id) for w in self.watched.values() if w.addr == addr), None)

    def unused(self, cluster: str, n: int, timeout_s: float, why: str) -> list[dict]:
        """The first `n` registered hosts of `cluster` (by name) that this session does not use,
        once that many are registered: spares for lost hosts, or new hosts for a mesh that grows.
        TimeoutError after `timeout_s`, saying `why` they were wanted."""
        deadline = time.monotonic() + timeout_s
        while True:
            hosts = self.registered(cluster)
            free = self._free(cluster, hosts)
            if len(free) >= n:
                return [_entry(h) for h in free[:n]]
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"{why}: cluster {cluster!r} has {len(free)} of the {n} unused hosts needed ({len(hosts)} "
                    f"registered, {len(hosts) - len(free)} in use by this session) after {timeout_s:g} s; start "
                    f"one with `regent host --cluster {cluster} --store {self.backend.url} --advertise <the node's IP>`")
            time.sleep(PICK_POLL_S)

    def spares(self, cluster: str, n: int) -> list[dict]:
        """The hosts unused() would pick now, at most `n`, without waiting for more."""
        return [_entry(h) for h in self._free(cluster, self.registered(cluster))[:n]]

    def _free(self, cluster: str, hosts: list[HostRecord]) -> list[HostRecord]:
        with self._lock:
            used = {w.id for w in self.watched.values() if w.cluster == cluster}
        return [h for h in hosts if h.id not in used]

    def attach(self, cluster: str, entries: list[dict], replaying: bool) -> list[str]:
        """Say hello to the picked hosts and watch them; their addresses. A journaled host that
        is gone (on replay) is taken for lost: its procs are dead to this session."""
        registered = {h.id: h for h in self.registered(cluster)}  # one read of the store for all
        # Every agent greeted at once; one that does not answer is looked at on its own. One this
        # leader greeted already (a takeover's fence did, a moment ago) is not asked again.
        greeted: list[object] = [{} for _ in entries]
        ask = [k for k, e in enumerate(entries) if e["addr"] not in self.runtime.hosts]
        replies = self.runtime.host_requests([(entries[k]["addr"], "hello", {}) for k in ask], timeout=HELLO_S,
                                             timeouts=True)
        for k, reply in zip(ask, replies, strict=True):
            greeted[k] = reply
        # A replay takes a silent agent for lost at once (a takeover must not wait on the dead).
        slow = [] if replaying else [k for k in ask if isinstance(greeted[k], TimeoutError) and (
            (rec := registered.get(entries[k]["id"])) is not None and rec.address == entries[k]["addr"])]
        if slow:
            log.warning("registered host agents did not answer in time; asking them again", cluster=cluster,
                        hosts=[entries[k]["id"] for k in slow][:20], count=len(slow), timeout_s=HELLO_AGAIN_S)
            again = self.runtime.host_requests([(entries[k]["addr"], "hello", {}) for k in slow],
                                               timeout=HELLO_AGAIN_S, timeouts=True)
            for k, reply in zip(slow, again, strict=True):
                greeted[k] = reply
        addresses = [self._attach_one(cluster, entry, registered.get(entry["id"]), replaying, reply)
                     for entry, reply in zip(entries, greeted, strict=True)]
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="regent-host-watch", daemon=True)
            self._thread.start()
        return addresses

    def _attach_one(self, cluster: str, entry: dict, current: HostRecord | None, replaying: bool,
                    greeted: object) -> str:
        """`greeted`: the agent's answer to the hello attach() sent (a TimeoutError if none)."""
        addr = entry["addr"]
        if isinstance(greeted, TimeoutError):
            if current is not None and current.address != addr:
                log.warning("the journaled host agent moved; using its new address", cluster=cluster,
                            host=entry["id"], was=addr, now=current.address)
                addr = current.address
                self.runtime.host_moved(entry["addr"], addr)
                self.runtime.host_request(addr, "hello", timeout=10.0)
            elif not replaying:
                raise SupervisionError(f"host {entry['id']} of cluster {cluster!r} at {addr} is registered but "
                                       f"does not answer: {greeted} (asked twice); see its agent's log, or "
                                       f"stop it so that its registration goes") from None
            else:
                current = None
        with self._lock:  # a host an earlier host_mesh attached is watched once
            w = self.watched.setdefault((cluster, entry["id"]), _Watched(
                cluster, entry["id"], addr, current.incarnation if current else entry["inc"]))
        if current is None:  # taken for lost before anything of the program's goes on there
            self._lost(w, f"host {w.id} of cluster {cluster!r} ({addr}) is gone: it is no longer registered",
                       at_once=True)
        else:
            self.runtime.register_host(addr)
        return addr

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # --- the watch thread -------------------------------------------------------------------

    def _watch(self) -> None:
        failing = 0
        while not self._stop.wait(WATCH_INTERVAL_S):
            with self._lock:
                by_cluster: dict[str, list[_Watched]] = {}
                for w in self.watched.values():
                    by_cluster.setdefault(w.cluster, []).append(w)
            for cluster, hosts in by_cluster.items():
                try:
                    now = self._registrations(cluster)
                    failing = 0
                except Exception as e:
                    failing += 1
                    if failing in (1, 20) or failing % 200 == 0:
                        log.warning("cannot read the cluster's registrations; hosts are not judged meanwhile",
                                    cluster=cluster, error=str(e)[:300])
                    continue
                for w in hosts:
                    self._judge(w, now.get(w.id))

    def _registrations(self, cluster: str) -> dict[str, HostRecord]:
        """`cluster`'s hosts by id: listed again only when the store says they changed (a
        listing of 512 hosts four times a second was a controller's largest idle cost)."""
        version = self.backend.cluster_version(cluster)
        seen = self._listed.get(cluster)
        if version is not None and seen is not None and seen[0] == version:
            return seen[1]
        now = {h.id: h for h in self.registered(cluster)}
        self._listed[cluster] = (version, now)
        return now

    def _judge(self, w: _Watched, h: HostRecord | None) -> None:
        if h is None:
            self._lost(w, f"host {w.id} of cluster {w.cluster!r} ({w.addr}) is lost: its registration "
                          "expired (its agent died, or it was cut off for longer than its lease TTL)")
        elif h.incarnation != w.inc:
            was, w.inc = w.inc, h.incarnation
            if w.lost is not None:
                self._back(w, h, was)
            else:  # its agent restarted within the TTL: its procs adopt the new one
                self.note("host_restarted", cluster=w.cluster, host=w.id, addr=h.address, inc=h.incarnation,
                          was=was)

    def _lost(self, w: _Watched, reason: str, at_once: bool = False) -> None:
        """`at_once`: on a thread that may take the drive (the program's), not the watch thread."""
        with self._lock:  # the program's attach and the watch thread may both find it gone
            if w.lost is not None:
                return
            w.lost = reason
        log.error("host lost", cluster=w.cluster, host=w.id, addr=w.addr, incarnation=w.inc)
        self.note("host_lost", cluster=w.cluster, host=w.id, addr=w.addr, inc=w.inc, reason=reason)
        if at_once:
            with self.runtime.drive:
                self.runtime.host_lost(w.addr, reason)
        else:
            self.post(lambda: self.runtime.host_lost(w.addr, reason))

    def _back(self, w: _Watched, h: HostRecord, was: str) -> None:
        """A lost host registered again: a new incarnation. What this session had there is
        dead to it, so it is stopped; the host serves new spawns."""
        w.lost, old_addr, w.addr = None, w.addr, h.address
        log.warning("lost host registered again as a new incarnation", cluster=w.cluster, host=w.id,
                    addr=h.address, incarnation=h.incarnation)
        self.note("host_back", cluster=w.cluster, host=w.id, addr=h.address, inc=h.incarnation, was=was)
        self.post(lambda: self.runtime.host_back(old_addr, h.address))


ADVERTISE_ENV = "REGENT_ADVERTISE"


def controller_address(journal_url: str, secure: bool) -> str:
    """Where this controller listens, and the address workers reply to: $REGENT_ADVERTISE
    (a literal IP, set by launchers); else, with CURVE keys, the local address that routes to
    a non-loopback etcd (in a cluster the store is reachable from every node, and so is that
    address); else loopback."""
    named = os.environ.get(ADVERTISE_ENV)
    if named:
        try:
            return str(ipaddress.ip_address(named))
        except ValueError:
            raise ValueError(f"${ADVERTISE_ENV}={named!r} is not a literal IP address: set it to the "
                             "address of this machine that the hosts reach") from None
    if not secure or not journal_url.startswith(("etcd://", "etcds://")):
        return "127.0.0.1"
    from regent.journal.etcd_target import local_address_toward, parse_etcd_url

    if is_loopback(parse_etcd_url(journal_url).addresses[0][0]):
        return "127.0.0.1"
    found = local_address_toward(journal_url)
    if found is None:
        log.warning("cannot tell which local address reaches the store; listening on loopback", store=journal_url)
        return "127.0.0.1"
    return found
