"""Where a session's journal lives in etcd's key space (the layout etcd_store.py describes).

Names only: no requests. The store and its log reader both build keys here.
"""

from __future__ import annotations

ROOT = b"/regent/"


def session_prefix(session: str) -> bytes:
    return ROOT + session.encode() + b"/"


def leader_key(session: str) -> bytes:
    return session_prefix(session) + b"leader"


def log_prefix(session: str) -> bytes:
    return session_prefix(session) + b"log/"


def log_key(session: str, lsn: int) -> bytes:
    """The etcd key of the batch whose first record has this lsn."""
    return log_prefix(session) + b"%016x" % lsn


def checkpoint_key(session: str) -> bytes:
    return session_prefix(session) + b"checkpoint"


def compacted_key(session: str) -> bytes:
    return session_prefix(session) + b"compacted"


# Clusters live beside the sessions: /regent/clusters/<cluster>/hosts/<host id> (and /values/<name>).
CLUSTERS = ROOT + b"clusters/"


def host_prefix(cluster: str) -> bytes:
    return CLUSTERS + cluster.encode() + b"/hosts/"


def host_key(cluster: str, host_id: str) -> bytes:
    return host_prefix(cluster) + host_id.encode()


def cluster_value_key(cluster: str, name: str) -> bytes:
    """/regent/clusters/<cluster>/values/<name>: facts about a cluster, beside its hosts."""
    return CLUSTERS + cluster.encode() + b"/values/" + name.encode()
