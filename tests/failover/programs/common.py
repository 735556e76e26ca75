"""What every failover test program does first: open the session the test names, and note
this process's pid in the leader file once it leads (tests/failover/harness.py reads it)."""

from __future__ import annotations

import os

from regent.controller import Session


def session_from_env(**kwargs) -> Session:
    """The session of $REGENT_TEST_SESSION on $REGENT_TEST_JOURNAL (none: the embedded store),
    with the lease TTL of $REGENT_TEST_TTL (default 1 s)."""
    return Session(os.environ["REGENT_TEST_SESSION"], journal=os.environ.get("REGENT_TEST_JOURNAL") or None,
                   lease_ttl_s=float(os.environ.get("REGENT_TEST_TTL", "1.0")), **kwargs)


def note_leader() -> None:
    """Append this process's pid to $REGENT_TEST_LEADER_FILE, if the test set one."""
    leader_file = os.environ.get("REGENT_TEST_LEADER_FILE")
    if leader_file:
        with open(leader_file, "a") as f:
            f.write(f"{os.getpid()}\n")
