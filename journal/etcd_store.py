"""The production journal backend: etcd v3, through pyetcd (python-etcd3 API).

Layout under /regent/<session>/: `leader` (holder name and beacon address, attached to a
lease; its create revision is the epoch), `log/<first lsn, 16 hex digits>` (one batch of
records per key), `checkpoint`, `compacted`. Every write is one transaction conditioned on
the leader key, and is idempotent, so a retry after an ambiguous failure (etcd restarted
mid-request) neither loses nor duplicates records.

Connections use TLS and etcd user auth as the url says (journal/etcd_target.py); an auth
token that etcd stops accepting (it expired, or etcd restarted) is replaced by a fresh one
and the request sent again (journal/_etcd_auth.py). The key names are in _etcd_keys.py, the
error classification in _etcd_errors.py, the log read at one revision in _etcd_snapshot.py.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc
import pyetcd
import structlog
from pyetcd import exceptions as etcd_exc
from pyetcd.utils import prefix_range_end
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_delay,
    wait_exponential,
)

from ._etcd_auth import EtcdAuth
from ._etcd_errors import describe, details, is_transient, rpc_error, tls_refused
from ._etcd_keys import (
    CLUSTERS,
    ROOT,
    checkpoint_key,
    cluster_value_key,
    compacted_key,
    host_key,
    host_prefix,
    leader_key,
    log_key,
    log_prefix,
    session_prefix,
)
from ._etcd_snapshot import SnapshotReader
from .backend import Grant, HostLease, Incumbent, LogSnapshot, parse_stored_holder, stored_holder
from .batching import Batch
from .errors import HostTaken, JournalError, JournalUnavailable, LeadershipLost
from .etcd_target import ENV_CA, EtcdTarget

log = structlog.get_logger("journal.etcd")

T = TypeVar("T")

_GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 256 << 20),
    ("grpc.max_send_message_length", 16 << 20),
    # etcd restarts in well under a second; don't let gRPC back off for longer than that.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
]


def start_hint(address: str, *, tls: bool = False) -> str:
    if tls:
        return (
            f"start one with: etcd --data-dir /tmp/etcd --listen-client-urls https://{address} "
            f"--advertise-client-urls https://{address} --cert-file SERVER.pem "
            "--key-file SERVER-KEY.pem"
        )
    return (
        f"start one with: etcd --data-dir /tmp/etcd --listen-client-urls http://{address} "
        f"--advertise-client-urls http://{address}"
    )


class EtcdStore:
    """Backend over an etcd cluster (one or more client endpoints, tried in turn)."""

    poll_interval_s = 0.05

    def __init__(
        self,
        target: EtcdTarget,
        *,
        op_timeout_s: float = 5.0,
        retry_s: float = 10.0,
        connect_timeout_s: float = 2.0,
        read_page: int | None = None,
    ) -> None:
        if not target.addresses:
            raise ValueError("an etcd journal url needs at least one host:port")
        self.target = target
        self.addresses = list(target.addresses)
        self.address_text = target.address_text
        # Carries no password: safe for logs, errors and other processes' command lines.
        self.url = target.url
        self._op_timeout_s = op_timeout_s
        self._retry_s = retry_s
        self._auth = EtcdAuth(target)
        self._client = self._make_client(op_timeout_s)
        # Keys per page of a log read; None sizes pages to a few MiB.
        self._snapshots = SnapshotReader(self._client, self._retry, read_page)
        self._keepalive_client: pyetcd.MultiEndpointEtcd3Client | None = None
        self._check_reachable(connect_timeout_s)

    def _make_client(self, timeout: float) -> pyetcd.MultiEndpointEtcd3Client:
        # pyetcd marks a failed endpoint unusable for `time_retry` seconds; with one endpoint
        # that would turn a one-second etcd restart into minutes of errors.
        several = len(self.addresses) > 1
        credentials = self._auth.credentials
        secure = credentials is not None
        endpoints = [
            pyetcd.Endpoint(
                host, port, secure=secure, creds=credentials,
                time_retry=0.5 if several else 0.0, opts=_GRPC_OPTIONS,
            )
            for host, port in self.addresses
        ]  # fmt: skip
        # The user and password are not handed to pyetcd: it would send the token as call
        # credentials, which gRPC refuses over plain connections. The token goes as request
        # metadata instead, which pyetcd sends with every call (see EtcdAuth.attach).
        client = pyetcd.MultiEndpointEtcd3Client(
            endpoints=endpoints, timeout=timeout, failover=several
        )
        self._auth.attach(client)
        return client

    def _first_contact(self) -> None:
        self._auth.authenticate(self._client, None)
        self._client.status()

    def _check_reachable(self, connect_timeout_s: float) -> None:
        tls = self.target.tls is not None
        try:
            self._retry(
                self._first_contact,
                what="status",
                within_s=connect_timeout_s,
                quiet=True,
                retry_if=lambda exc: is_transient(exc) and not tls_refused(exc),
            )
        except JournalUnavailable as exc:
            cause = exc.__cause__
            first = self.addresses[0]
            address = f"{first[0]}:{first[1]}"
            where = self.url if tls or self.target.user else self.address_text
            rpc = rpc_error(exc)
            timed_out = rpc is not None and rpc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            if timed_out or isinstance(cause, etcd_exc.ConnectionTimeoutError):
                problem = (
                    f"did not answer within {connect_timeout_s:g}s (is it paused or overloaded?"
                )
            elif not tls and "Socket closed" in details(exc):
                problem = (
                    "closed the connection at once (if it serves TLS, use "
                    f"etcds://{self.address_text}?ca=PATH or set ${ENV_CA}; if not,"
                )
            else:
                problem = "refused the connection (is etcd running?"
            self.close()
            raise JournalUnavailable(
                f"etcd at {where} {problem} {start_hint(address, tls=tls)})"
            ) from cause
        except BaseException:
            self.close()
            raise

    def _retry(
        self,
        fn: Callable[[], T],
        *,
        what: str,
        within_s: float | None = None,
        quiet: bool = False,
        retry_if: Callable[[BaseException], bool] = is_transient,
    ) -> T:
        call = fn if self.target.user is None else lambda: self._auth.with_token(self._client, fn)
        try:
            return self._retry_transient(
                call, what=what, within_s=within_s, quiet=quiet, retry_if=retry_if
            )
        except (grpc.RpcError, etcd_exc.Etcd3Exception) as exc:
            denied = self._auth.tls_error(exc) or self._auth.denied(exc, what)
            if denied is not None:
                raise denied from exc
            raise

    def _retry_transient(
        self,
        fn: Callable[[], T],
        *,
        what: str,
        within_s: float | None,
        quiet: bool,
        retry_if: Callable[[BaseException], bool],
    ) -> T:
        limit = self._retry_s if within_s is None else within_s
        # The first attempt runs bare: building a Retrying costs more than a local etcd
        # round trip, and on a healthy cluster almost every request succeeds at once.
        try:
            return fn()
        except Exception as exc:
            if not retry_if(exc):
                raise
            (log.debug if quiet else log.warning)(
                "etcd request failed, retrying", request=what, etcd=self.url, attempt=1,
                error=describe(exc))

        def note(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            log.debug(
                "etcd request failed, retrying",
                request=what,
                etcd=self.url,
                attempt=state.attempt_number + 1,
                error=None if exc is None else describe(exc),
            )

        retrying = Retrying(
            stop=stop_after_delay(limit),
            wait=wait_exponential(multiplier=0.05, min=0.05, max=0.5),
            retry=retry_if_exception(retry_if),
            before_sleep=note,
            reraise=True,
        )
        try:
            return retrying(fn)
        except Exception as exc:
            if retry_if(exc):
                raise JournalUnavailable(
                    f"etcd at {self.address_text} did not complete {what} within {limit:g}s "
                    f"({describe(exc)}); check that etcd is running and reachable"
                ) from exc
            raise

    def _txn(self, compare: list[Any], success: list[Any], failure: list[Any]) -> tuple[bool, list]:
        return self._client.transaction(compare=compare, success=success, failure=failure)

    # leadership

    def try_acquire(
        self, session: str, holder: str, ttl_s: float, *, beacon: str | None = None
    ) -> Grant | None:
        key = leader_key(session)
        value, _ = self._retry(lambda: self._client.get(key), what="read leader")
        if value is not None:
            return None
        ttl = max(1, math.ceil(ttl_s))
        requested_at = time.monotonic()
        lease = self._retry(lambda: self._client.lease(ttl), what="grant lease")
        t = self._client.transactions
        try:
            _, responses = self._retry(
                lambda: self._txn(
                    [t.create(key) == 0],
                    [t.put(key, stored_holder(holder, beacon).encode(), lease.id), t.get(key)],
                    [t.get(key)],
                ),
                what="campaign",
            )
        except BaseException:
            self._revoke_quietly(lease.id)
            raise
        kvs = responses[-1]
        # Compare the lease rather than trusting `succeeded`: a retried campaign whose first
        # attempt committed lands in the failure branch, yet the key is ours.
        if kvs and kvs[0][1].lease_id == lease.id:
            return Grant(
                session,
                holder,
                kvs[0][1].create_revision,
                lease.id,
                float(lease.ttl),
                requested_at,
                beacon,
            )
        self._revoke_quietly(lease.id)
        return None

    def _revoke_quietly(self, lease_id: int) -> None:
        try:
            self._client.revoke_lease(lease_id)
        except Exception as exc:
            log.info("could not revoke etcd lease", lease=lease_id, error=str(exc))

    def refresh(self, grant: Grant) -> bool:
        if self._keepalive_client is None:
            timeout = max(0.2, min(grant.ttl_s / 4, 2.0))
            self._keepalive_client = self._make_client(timeout)
        client = self._keepalive_client
        responses = self._auth.with_token(
            client, lambda: list(client.refresh_lease(grant.lease_id))
        )
        return bool(responses) and responses[0].TTL > 0

    def release(self, grant: Grant, *, within_s: float = 3.0) -> None:
        # Through the keep-alive client: its attempts are short and it has followed the lease
        # to a live member, where the main client may still hold a partitioned one and spend
        # the whole budget on one attempt there.
        client = self._keepalive_client or self._client
        try:
            self._retry(
                lambda: client.revoke_lease(grant.lease_id),
                what="revoke lease",
                within_s=within_s,
            )
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise

    def incumbent(self, session: str) -> Incumbent | None:
        value, meta = self._retry(
            lambda: self._client.get(leader_key(session)), what="read leader"
        )
        if value is None:
            return None
        return Incumbent.from_stored(value.decode(), meta.create_revision)

    def leader(self, session: str) -> tuple[str, int] | None:
        current = self.incumbent(session)
        return None if current is None else (current.holder, current.epoch)

    def evict(self, session: str, leader: Incumbent) -> bool:
        # Revoking the lease (rather than deleting the key) leaves nothing of the evicted
        # leadership behind. The lease id comes from the same read that matched holder and
        # epoch, and every campaign grants a fresh lease, so revoking it can only ever end
        # `leader`'s leadership, even if the key changed hands since that read.
        key = leader_key(session)
        value, meta = self._retry(lambda: self._client.get(key), what="read leader", within_s=2.0)
        if value is None or meta.create_revision != leader.epoch:
            return False
        if value != leader.stored_holder.encode():
            return False
        try:
            self._retry(
                lambda: self._client.revoke_lease(meta.lease_id),
                what="revoke the evicted leader's lease",
                within_s=2.0,
            )
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return False  # it expired or was released meanwhile
            raise
        return True

    def _fence(self, grant: Grant) -> list[Any]:
        t = self._client.transactions
        key = leader_key(grant.session)
        return [t.create(key) == grant.epoch, t.value(key) == grant.stored_holder.encode()]

    def _lost(self, grant: Grant, leader_kvs: list, what: str) -> LeadershipLost:
        if leader_kvs:
            value, meta = leader_kvs[0]
            holder = parse_stored_holder(value.decode())[0]
            now_held = f"{holder!r} holds it in epoch {meta.create_revision}"
        else:
            now_held = "nobody holds it now"
            try:
                ttl = self._client.get_lease_info(grant.lease_id).TTL
                now_held += f"; its lease {grant.lease_id:x} has ttl {ttl}s left"
            except Exception as exc:
                log.debug("could not read lease info", lease=grant.lease_id, error=str(exc))
        return LeadershipLost(
            f"{what} refused: {grant.holder!r} no longer leads session {grant.session!r} "
            f"(its epoch {grant.epoch} lease expired or was taken over; {now_held})"
        )

    # log

    def put_batches(self, grant: Grant, batches: list[Batch]) -> None:
        t = self._client.transactions
        first_key = log_key(grant.session, batches[0].first_lsn)
        compare = [*self._fence(grant), t.create(first_key) == 0]
        success = [t.put(log_key(grant.session, b.first_lsn), b.value) for b in batches]
        failure = [t.get(leader_key(grant.session)), t.get(first_key)]

        def attempt() -> None:
            ok, responses = self._txn(compare, success, failure)
            if ok:
                return
            leader_kvs, first_kvs = responses
            if first_kvs and first_kvs[0][0] == batches[0].value:
                log.info(
                    "append was already committed by an earlier attempt",
                    session=grant.session,
                    lsn=batches[0].first_lsn,
                )
                return
            if first_kvs and leader_kvs and leader_kvs[0][1].create_revision == grant.epoch:
                raise JournalError(
                    f"session {grant.session!r}: lsn {batches[0].first_lsn} is already written "
                    f"with other content; two writers share epoch {grant.epoch}"
                )
            raise self._lost(grant, leader_kvs, "append")

        self._retry(attempt, what=f"append at lsn {batches[0].first_lsn}")

    def put_checkpoint(self, grant: Grant, value: bytes) -> None:
        t = self._client.transactions

        def attempt() -> None:
            ok, responses = self._txn(
                self._fence(grant),
                [t.put(checkpoint_key(grant.session), value)],
                [t.get(leader_key(grant.session))],
            )
            if not ok:
                raise self._lost(grant, responses[0], "checkpoint")

        self._retry(attempt, what="checkpoint")

    def get_checkpoint(self, session: str) -> bytes | None:
        value, _ = self._retry(
            lambda: self._client.get(checkpoint_key(session)), what="read checkpoint"
        )
        return value

    def _range(self, start: bytes, end: bytes, **kwargs: Any) -> Any:
        return self._retry(
            lambda: self._client.get_range_response(start, end, **kwargs), what="read log"
        )

    def iter_batches(self, session: str, start_lsn: int = 0) -> Iterator[tuple[int, bytes]]:
        with self.read_log(session, start_lsn) as snapshot:
            yield from snapshot

    def read_log(self, session: str, start_lsn: int = 0) -> LogSnapshot:
        return self._snapshots.read_log(session, start_lsn)

    def _edge_batch(self, session: str, order: str) -> tuple[int, bytes] | None:
        prefix = log_prefix(session)
        resp = self._range(prefix, prefix_range_end(prefix), sort_order=order, limit=1)
        if not resp.kvs:
            return None
        kv = resp.kvs[0]
        return int(kv.key[len(prefix) :], 16), kv.value

    def first_batch(self, session: str) -> tuple[int, bytes] | None:
        return self._edge_batch(session, "ascend")

    def last_batch(self, session: str) -> tuple[int, bytes] | None:
        return self._edge_batch(session, "descend")

    def delete_batches(self, session: str, lo_lsn: int, hi_lsn: int) -> None:
        start, end = log_key(session, lo_lsn), log_key(session, hi_lsn)
        t = self._client.transactions
        self._retry(lambda: self._txn([], [t.delete(start, end)], []), what="compact")

    def drop_tail(self, grant: Grant, batches: list[tuple[int, bytes]]) -> None:
        if not batches:
            return
        t = self._client.transactions
        prefix = log_prefix(grant.session)
        first_key = log_key(grant.session, batches[0][0])
        # The exact values, read with their revisions: the delete compares each revision, so
        # a batch that changed since it was inspected is never dropped.
        resp = self._range(first_key, prefix_range_end(prefix))
        stored = {kv.key: kv for kv in resp.kvs}
        keys = [log_key(grant.session, first) for first, _ in batches]
        for key, (first, value) in zip(keys, batches, strict=True):
            kv = stored.get(key)
            if kv is None or kv.value != value:
                raise JournalError(
                    f"repair of session {grant.session!r} refused: the batch at lsn {first} "
                    "changed while it was inspected; nothing was dropped, run it again"
                )
        extra = sorted(set(stored) - set(keys))
        if extra:
            raise JournalError(
                f"repair of session {grant.session!r} refused: a batch at lsn "
                f"{int(extra[0][len(prefix):], 16)} follows what was inspected as the tail; "
                "nothing was dropped, run it again"
            )
        compare = [*self._fence(grant), *(t.mod(key) == stored[key].mod_revision for key in keys)]
        ok, responses = self._retry(
            lambda: self._txn(
                compare, [t.delete(key) for key in keys], [t.get(leader_key(grant.session))]
            ),
            what="repair",
        )
        if ok:
            return
        leader_kvs = responses[0]
        if leader_kvs and leader_kvs[0][1].create_revision == grant.epoch:
            raise JournalError(
                f"repair of session {grant.session!r} refused: a batch of the tail changed "
                "while it was inspected; nothing was dropped, run it again"
            )
        raise self._lost(grant, leader_kvs, "repair")

    def get_compacted(self, session: str) -> bytes | None:
        value, _ = self._retry(
            lambda: self._client.get(compacted_key(session)), what="read compaction note"
        )
        return value

    def put_compacted(self, session: str, value: bytes) -> None:
        self._retry(
            lambda: self._client.put(compacted_key(session), value), what="note compaction"
        )

    def session_names(self) -> list[str]:
        # Skip from one session's keys to the next instead of listing every log key.
        names: list[str] = []
        start, end = ROOT, prefix_range_end(ROOT)
        while True:
            resp = self._range(start, end, limit=1, keys_only=True)
            if not resp.kvs:
                return names
            name = resp.kvs[0].key[len(ROOT) :].split(b"/", 1)[0]
            if ROOT + name + b"/" != CLUSTERS:  # host registrations, not a session
                names.append(name.decode())
            start = ROOT + name + b"0"  # "0" sorts right after "/"

    # host registration

    def join_cluster(self, cluster: str, host_id: str, value: bytes, ttl_s: float,
                     replace: bytes | None = None) -> HostLease:
        key = host_key(cluster, host_id)
        t = self._client.transactions
        # An entry lives exactly as long as its lease: one there is a live registration.
        free = [t.create(key) == 0] if replace is None else [t.value(key) == replace]
        lease = self._retry(lambda: self._client.lease(max(1, math.ceil(ttl_s))), what="grant host lease")
        try:
            ok, responses = self._retry(lambda: self._txn(free, [t.put(key, value, lease.id)], [t.get(key)]),
                                        what="register host")
            if not ok:
                kvs = responses[-1] if responses else []
                if replace is None and not kvs:
                    # The entry vanished between the compare and now: try again, as free.
                    self._revoke_quietly(lease.id)
                    return self.join_cluster(cluster, host_id, value, ttl_s)
                holder = kvs[0][0] if kvs else b""
                if holder != value:  # a retry whose first try committed finds its own value
                    raise HostTaken(cluster, host_id, holder)
        except BaseException:
            self._revoke_quietly(lease.id)
            raise
        return HostLease(cluster, host_id, lease.id, float(lease.ttl))

    def renew_host(self, lease: HostLease) -> bool:
        grant = Grant(lease.cluster, lease.host_id, 0, int(lease.lease_id), lease.ttl_s, 0.0)
        if not self.refresh(grant):
            return False
        # The entry is ours only while it still carries our lease (an agent started again
        # under the same id has replaced it).
        _, meta = self._auth.with_token(
            self._keepalive_client, lambda: self._keepalive_client.get(host_key(lease.cluster, lease.host_id)))
        return meta is not None and meta.lease_id == lease.lease_id

    def leave_cluster(self, lease: HostLease) -> None:
        self._revoke_quietly(int(lease.lease_id))

    def cluster_hosts(self, cluster: str) -> list[tuple[str, bytes]]:
        prefix = host_prefix(cluster)
        found = self._retry(lambda: list(self._client.get_prefix(prefix)), what="list hosts")
        return sorted((meta.key[len(prefix):].decode("utf-8", "replace"), value) for value, meta in found)

    def cluster_version(self, cluster: str) -> tuple[int, int] | None:
        # (how many records, the newest record's revision): a join or rejoin writes a newer
        # revision, a leave or an expiry deletes one; a renewal writes nothing. Two small
        # requests whatever the cluster's size, where a listing carries every record.
        prefix = host_prefix(cluster)

        def look() -> tuple[int, int]:
            count = self._client.get_prefix_response(prefix, count_only=True).count
            newest = self._client.get_prefix_response(prefix, keys_only=True, limit=1, sort_order="descend",
                                                      sort_target="mod")
            return int(count), (int(newest.kvs[0].mod_revision) if newest.kvs else 0)

        return self._retry(look, what="look at hosts")

    def watch_cluster(self, cluster: str, changed: Callable[[bool], None]) -> Callable[[], None] | None:
        prefix = CLUSTERS + cluster.encode() + b"/"  # its hosts and its values

        def on_response(response: Any) -> None:
            changed(not isinstance(response, Exception))  # an error ends pyetcd's watch

        try:
            watch_id = self._auth.with_token(
                self._client, lambda: self._client.add_watch_prefix_callback(prefix, on_response))
        except Exception as e:  # the store is down: the caller looks as it would without a watch
            log.info("cannot watch the store", cluster=cluster, error=str(e)[:300])
            return None

        def cancel() -> None:
            try:
                self._client.cancel_watch(watch_id)
            except Exception as e:  # closed with the store, or broken already
                log.debug("could not cancel a watch", cluster=cluster, error=str(e)[:200])
        return cancel

    def claim_cluster_value(self, cluster: str, name: str, value: bytes) -> bytes:
        key = cluster_value_key(cluster, name)
        t = self._client.transactions
        ok, responses = self._retry(lambda: self._txn([t.create(key) == 0], [t.put(key, value)], [t.get(key)]),
                                    what="claim a cluster value")
        kvs = responses[-1] if not ok and responses else []
        return kvs[0][0] if kvs else value  # a retry whose first try committed finds its own value

    def cluster_value(self, cluster: str, name: str) -> bytes | None:
        value, _ = self._retry(lambda: self._client.get(cluster_value_key(cluster, name)), what="read a cluster value")
        return value

    def delete_session(self, session: str) -> None:
        prefix = session_prefix(session)
        self._retry(lambda: self._client.delete_prefix(prefix), what="delete session")

    def close(self) -> None:
        self._auth.close()
