"""A session's log read from etcd as it stood at one revision (EtcdStore.read_log): the
compaction note, checkpoint and batches all from that revision, paged lazily.

It reads and never writes; requests go through the store's retry, which also renews tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

import grpc
import pyetcd
import structlog
from pyetcd.utils import prefix_range_end

from ._etcd_keys import checkpoint_key, compacted_key, log_key, log_prefix
from .backend import LogSnapshot
from .errors import JournalError

log = structlog.get_logger("journal.etcd")

T = TypeVar("T")


class Retry(Protocol):
    """The store's way of sending one request: retried while etcd is briefly away."""

    def __call__(self, fn: Callable[[], T], *, what: str) -> T: ...


class SnapshotReader:
    """Reads one session's log at one revision through `client`."""

    def __init__(
        self, client: pyetcd.MultiEndpointEtcd3Client, retry: Retry, read_page: int | None
    ) -> None:
        self._client = client
        self._retry = retry
        # Keys per page; None sizes pages to a few MiB.
        self._read_page = read_page

    def _range(self, start: bytes, end: bytes, **kwargs: Any) -> Any:
        return self._retry(
            lambda: self._client.get_range_response(start, end, **kwargs), what="read log"
        )

    def read_log(self, session: str, start_lsn: int = 0) -> LogSnapshot:
        # Every page reads at the revision the compaction note was read at, so a compaction
        # (or anything else) committed meanwhile is not seen halfway.
        while True:
            resp = self._retry(
                lambda: self._client.get_response(compacted_key(session)), what="read log"
            )
            revision = resp.header.revision
            compacted = resp.kvs[0].value if resp.kvs else None
            try:
                resp = self._retry(
                    lambda rev=revision: self._client.get_response(
                        checkpoint_key(session), revision=rev
                    ),
                    what="read log",
                )
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.OUT_OF_RANGE:
                    raise
                continue  # etcd compacted that revision at once: nothing read yet, begin again
            checkpoint = resp.kvs[0].value if resp.kvs else None
            snapshot = LogSnapshot(compacted, checkpoint, iter(()))
            snapshot.batches = self._log_pages(session, start_lsn, revision, snapshot)
            return snapshot

    def _log_pages(
        self, session: str, start_lsn: int, revision: int, snapshot: LogSnapshot
    ) -> Iterator[tuple[int, bytes]]:
        prefix = log_prefix(session)
        end = prefix_range_end(prefix)
        start_key = log_key(session, start_lsn)
        from_key: bytes | None = None
        limit = self._read_page or 64
        cut = len(prefix)
        while True:
            try:
                if from_key is None:
                    # The batch holding start_lsn may begin before it.
                    resp = self._range(
                        prefix, start_key + b"\0", sort_order="descend", limit=1,
                        keys_only=True, revision=revision,
                    )
                    from_key = resp.kvs[0].key if resp.kvs else start_key
                resp = self._range(from_key, end, limit=limit, revision=revision)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.OUT_OF_RANGE:
                    raise
                revision = self._after_revision_compacted(session, revision, snapshot)
                continue
            size = 0
            for kv in resp.kvs:
                size += len(kv.value)
                yield int(kv.key[cut:], 16), kv.value
            if not resp.more or not resp.kvs:
                return
            from_key = resp.kvs[-1].key + b"\0"
            if self._read_page is None:
                # Aim for pages of a few MiB whatever the batch size.
                per_key = max(1, size // len(resp.kvs))
                limit = max(16, min(4096, (4 << 20) // per_key))

    def _after_revision_compacted(self, session: str, revision: int, snapshot: LogSnapshot) -> int:
        """etcd compacted its history past the revision a log read pages at: go on at the
        current revision if the session's log can only have grown since (the compaction note
        is the same: journal compaction notes before it deletes), else raise."""
        resp = self._retry(
            lambda: self._client.get_response(compacted_key(session)), what="read log"
        )
        note = resp.kvs[0].value if resp.kvs else None
        if note != snapshot.compacted:
            raise JournalError(
                f"session {session!r}: its log was compacted while it was being read, and etcd "
                f"compacted its own history past revision {revision}, where the read began; "
                "nothing read is wrong, but the read cannot go on: read it again"
            )
        log.info("etcd compacted the revision a log read was at; reading on at the current one",
                 session=session, revision=revision, now=resp.header.revision)
        return resp.header.revision
