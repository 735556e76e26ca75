"""Leaders for election tests: a campaign on a thread, and a leader in a process of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from regent.journal import Journal

ROOT = Path(__file__).resolve().parents[2]


def campaign_in_thread(
    journal: Journal, session: str, holder: str, **kwargs: Any
) -> tuple[threading.Thread, dict[str, Any]]:
    """Campaign on a thread; `result` gets "lead" and "at" (monotonic), or "error"."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["lead"] = journal.campaign(session, holder, **kwargs)
            result["at"] = time.monotonic()
        except BaseException as exc:
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


_LEADER = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {root!r})
    from regent.journal import open_journal
    lead = open_journal({url!r}).campaign({session!r}, "victim", ttl_s={ttl!r})
    lead.append([("call", {{"i": 0}})])
    print("LEADER", lead.epoch, lead.ttl_s, lead.beacon, flush=True)
    time.sleep(600)
    """
)


@dataclass
class LeaderProcess:
    """A process leading a session as holder "victim", with one record appended."""

    proc: subprocess.Popen[str]
    epoch: int
    ttl_s: float
    beacon: str | None

    def send(self, sig: signal.Signals) -> float:
        """Send `sig`; return the monotonic time it was sent."""
        at = time.monotonic()
        os.kill(self.proc.pid, sig)
        return at


@contextmanager
def leader_process(
    journal_url: str, session: str, *, ttl_s: float, env: dict[str, str] | None = None
) -> Iterator[LeaderProcess]:
    """Start a process that leads `session` and stays; killed on exit."""
    script = _LEADER.format(root=str(ROOT), url=journal_url, session=session, ttl=ttl_s)
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )
    try:
        words: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:  # structlog may print here too
            words = line.split()
            if words[:1] == ["LEADER"]:
                break
        assert words[:1] == ["LEADER"], "the leader process exited before it led"
        beacon = None if words[3] == "None" else words[3]
        yield LeaderProcess(proc, int(words[1]), float(words[2]), beacon)
    finally:
        proc.kill()  # SIGKILL ends a stopped process too
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
