"""Host registration: the agents of a cluster announce themselves in the store under a lease.

An agent joins with a record (its literal address, hostname, cores, memory, devices) and keeps
its lease alive; when the lease runs out (the agent died, or it was cut off from the store for
a TTL) its entry vanishes, and a controller takes the host for dead. Each registration is a new
incarnation: an agent that joins again after its entry vanished is, to a controller, a new host
with the same name. Records are read back as untrusted input: a malformed one is logged and
skipped, never raised.
"""

from __future__ import annotations

import ipaddress
import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import structlog

from .backend import Backend, HostLease
from .errors import HostTaken, JournalError

log = structlog.get_logger("journal.hosts")

DEFAULT_HOST_TTL_S = 3.0
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_ADDRESS = re.compile(r"tcp://(?P<ip>\[[0-9a-fA-F:.]+\]|[0-9.]+):(?P<port>[0-9]{1,5})")


def check_name(name: object, what: str) -> str:
    """A cluster or host name: letters, digits, '.', '_' and '-', at most 100 characters."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"{what} {name!r} must be 1-100 letters, digits, '.', '_' or '-' "
                         "(starting with a letter or digit)")
    return name


def literal_address(address: object) -> bool:
    """tcp://<literal IP>:<port>: the only form a host may advertise (a hostname can resolve
    one way on the node and another on its peers)."""
    m = _ADDRESS.fullmatch(address) if isinstance(address, str) else None
    if m is None or not 0 < int(m["port"]) < 65536:
        return False
    try:
        ipaddress.ip_address(m["ip"].strip("[]"))
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class HostRecord:
    """What a registered host agent says of itself."""

    id: str
    address: str  # tcp://<literal IP>:<port> of the agent's inbox
    hostname: str
    incarnation: str  # new at every registration
    pid: int
    cores: int
    memory_bytes: int
    backend: str  # hipcore's backend: cpu, cuda or rocm; "hollow" for a hollow host (regent host --hollow)
    devices: list[str] = field(default_factory=list)
    since: float = 0.0  # wall-clock time of this registration

    def encode(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def decode(cls, host_id: str, value: bytes) -> HostRecord | None:
        """The record stored for `host_id`, or None (logged) if it is not a valid one."""
        try:
            d = json.loads(value)
            rec = cls(
                id=d["id"], address=d["address"], hostname=d["hostname"], incarnation=d["incarnation"],
                pid=d["pid"], cores=d["cores"], memory_bytes=d["memory_bytes"], backend=d["backend"],
                devices=list(d.get("devices") or []), since=float(d.get("since", 0.0)),
            )
            ok = (rec.id == host_id and literal_address(rec.address)
                  and all(isinstance(v, str) and len(v) <= 256 for v in (rec.hostname, rec.incarnation, rec.backend))
                  and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                          for v in (rec.pid, rec.cores, rec.memory_bytes))
                  and all(isinstance(v, str) and len(v) <= 256 for v in rec.devices) and len(rec.devices) <= 1024)
        except (ValueError, TypeError, KeyError, AttributeError):
            ok = False
        if not ok:
            log.warning("dropped a malformed host registration", host=host_id[:100], size=len(value))
            return None
        return rec

    def age_s(self, now: float | None = None) -> float:
        return max(0.0, (time.time() if now is None else now) - self.since)


def registered_hosts(backend: Backend, cluster: str) -> list[HostRecord]:
    """The live, well-formed registrations of `cluster`, by host id."""
    check_name(cluster, "cluster name")
    return [rec for host_id, value in backend.cluster_hosts(cluster)
            if (rec := HostRecord.decode(host_id, value)) is not None]


class HostNameInUse(JournalError):
    """Another live agent holds this host name in the cluster: two agents must never share one
    registration (each would take it from the other, over and over)."""


def _in_use(cluster: str, host_id: str, holder: HostRecord | None) -> HostNameInUse:
    who = (f"the agent at {holder.address} (pid {holder.pid} on {holder.hostname}, incarnation "
           f"{holder.incarnation}, registered {holder.age_s():.0f} s ago)") if holder else "another agent"
    return HostNameInUse(
        f"host name {host_id!r} of cluster {cluster!r} is registered by {who}, whose lease is live: "
        f"give this agent another name (--name), or stop that agent; a registration is taken over "
        f"only once its lease has run out")


class HostMembership:
    """Keeps one agent registered: joins, renews every third of the TTL, and joins again (as a
    new incarnation) once its entry is gone, e.g. after a store outage longer than the TTL.

    `describe(incarnation)` builds the record to register. `predecessor` is the dead agent this
    one succeeds on its machine ({"pid", "address"} from its host file), whose registration it
    takes over at once, at whatever address it now serves."""

    def __init__(self, backend: Backend, cluster: str, host_id: str,
                 describe: Callable[[str], HostRecord], ttl_s: float = DEFAULT_HOST_TTL_S,
                 predecessor: dict | None = None):
        self.backend = backend
        self.predecessor = predecessor
        self.cluster = check_name(cluster, "cluster name")
        self.host_id = check_name(host_id, "host name")
        self.describe = describe
        self.ttl_s = ttl_s
        self.lease: HostLease | None = None
        self.record: HostRecord | None = None
        self.joined = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="regent-host-membership", daemon=True)

    def start(self) -> HostMembership:
        """Join now, raising HostNameInUse where a live agent holds the name, then keep the
        registration alive from a thread (which also retries a join the store refused)."""
        try:
            self._join()
        except HostNameInUse:
            raise
        except Exception as e:
            log.warning("cannot reach the store to register this host; retrying", cluster=self.cluster,
                        host=self.host_id, store=self.backend.url, error=str(e)[:300])
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop renewing and remove the registration (peers see the host leave at once)."""
        self._stop.set()
        self._thread.join(timeout=self.ttl_s + 5)
        if self.lease is not None:
            try:
                self.backend.leave_cluster(self.lease)
            except Exception as e:  # it expires anyway
                log.info("could not withdraw the host registration", cluster=self.cluster, error=str(e))
            self.lease = None

    def _run(self) -> None:
        renewed = time.monotonic()
        failures = 0
        while not self._stop.is_set():
            try:
                if self.lease is None:
                    self._join()
                elif not self.backend.renew_host(self.lease):
                    log.warning("host registration expired or was replaced; joining again as a new incarnation",
                                cluster=self.cluster, host=self.host_id,
                                incarnation=self.record.incarnation if self.record else None)
                    self.lease = None
                    continue
                renewed, failures = time.monotonic(), 0
            except HostNameInUse as e:
                # Taken while this agent's own lease had run out (cut off from the store): it
                # stays unregistered until that agent goes, never taking the name back from it.
                failures += 1
                (log.error if failures in (1, 10) or failures % 100 == 0 else log.debug)(
                    "this host's name was taken by another live agent; waiting for it to go", error=str(e))
            except Exception as e:
                failures += 1
                (log.warning if failures in (1, 10) or failures % 100 == 0 else log.debug)(
                    "cannot reach the store to keep this host registered; retrying",
                    cluster=self.cluster, host=self.host_id, store=self.backend.url, error=str(e)[:300])
                if self.lease is not None and time.monotonic() - renewed > self.lease.ttl_s:
                    self.lease = None  # expired meanwhile: controllers took this host for dead
            self._stop.wait(self.ttl_s / 3 if failures == 0 else min(0.5, self.ttl_s / 6))

    def _succeeds(self, holder: HostRecord, record: HostRecord) -> bool:
        """Whether `holder` is known dead to this agent: it advertised the address this agent is
        bound to now, or it is the predecessor this agent's host file named (found not running)."""
        if holder.address == record.address:
            return True
        pred = self.predecessor or {}
        return pred.get("pid") == holder.pid and pred.get("address") == holder.address

    def _join(self) -> None:
        record = self.describe(uuid.uuid4().hex[:12])
        if record.id != self.host_id or not literal_address(record.address):
            raise ValueError(f"host record {record} must carry id {self.host_id!r} and a literal tcp://IP:port")
        try:
            self.lease = self.backend.join_cluster(self.cluster, self.host_id, record.encode(), self.ttl_s)
        except HostTaken as taken:
            holder = HostRecord.decode(self.host_id, taken.holder)
            if holder is None or not self._succeeds(holder, record):
                raise _in_use(self.cluster, self.host_id, holder) from None
            # The holder is dead: this agent serves at its address, or succeeds it on its machine
            # (restarted by its procs); it takes the registration over at once.
            self.lease = self.backend.join_cluster(self.cluster, self.host_id, record.encode(), self.ttl_s,
                                                   replace=taken.holder)
            log.info("took over the registration of a dead agent at this address", cluster=self.cluster,
                     host=self.host_id, dead_pid=holder.pid, dead_incarnation=holder.incarnation)
        self.record = record
        self.joined.set()
        log.info("host registered", cluster=self.cluster, host=self.host_id, address=record.address,
                 incarnation=record.incarnation, store=self.backend.url, ttl_s=self.ttl_s)


RUN_ENDED = "run-ended"


def end_run(backend: Backend, cluster: str, status: int, by: str) -> dict:
    """Record that `cluster`'s run ended with `status` (the first to say so wins); what is
    recorded. Launchers whose controllers a scheduler restarts (a Kubernetes Deployment) read
    it so that a controller started after the end does not start the program anew."""
    check_name(cluster, "cluster name")
    value = json.dumps({"status": int(status), "by": by, "at": time.time()}).encode()
    return _run_end(backend.claim_cluster_value(cluster, RUN_ENDED, value)) or {"status": status, "by": by}


def run_ended(backend: Backend, cluster: str) -> dict | None:
    """{"status", "by", "at"} once `cluster`'s run has ended, else None."""
    check_name(cluster, "cluster name")
    value = backend.cluster_value(cluster, RUN_ENDED)
    return None if value is None else _run_end(value)


def _run_end(value: bytes) -> dict | None:
    try:
        data = json.loads(value)
        if isinstance(data, dict) and isinstance(data.get("status"), int) and isinstance(data.get("by"), str):
            return data
    except (ValueError, UnicodeDecodeError):
        pass
    log.warning("a malformed run-ended record in the store was ignored", value=value[:200])
    return None
