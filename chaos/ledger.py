"""The actors' own account of what they executed, kept where a SIGKILL cannot erase it.

An actor that notes each execution here appends one line per call to a file of its
own (one file per mesh, rank and process), so the count survives the process. Each
line names the call by the digest the controller journals for its arguments, which
is how the checker joins executions to journaled calls. Only the journal's digest
contract is used (wire.call_digest); nothing of the worker.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from regent import wire

__all__ = ["Execution", "Ledger", "in_flight_marker", "read_ledger"]


@dataclass(frozen=True)
class Execution:
    """One execution of an endpoint on one actor, as the actor recorded it."""

    mesh: str
    rank: int
    method: str
    digest: str  # hex, as the journal's call record has it
    pid: int
    incarnation: int


class Ledger:
    """Append-only execution log of one actor (cheap: one write(2) per call)."""

    def __init__(self, directory: str | os.PathLike, mesh: str, rank: int, incarnation: int = 0) -> None:
        self.mesh, self.rank, self.incarnation = mesh, rank, incarnation
        Path(directory).mkdir(parents=True, exist_ok=True)
        path = Path(directory) / f"{mesh}.{rank}.{os.getpid()}.{incarnation}.jsonl"
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def note(self, method: str, *args: Any, **kwargs: Any) -> None:
        """Record one execution of `method(*args, **kwargs)`; call it first thing in the endpoint."""
        frames = wire.dumps((args, kwargs))
        digest = wire.call_digest((args, kwargs), frames).hex()
        line = json.dumps({"m": self.mesh, "r": self.rank, "e": method, "d": digest,
                           "p": os.getpid(), "i": self.incarnation})
        os.write(self._fd, (line + "\n").encode())


def in_flight_marker(directory: str | os.PathLike, pid: int) -> Path:
    """The file that exists while process `pid` runs a call its caller waits for (an actor
    creates it on entry and removes it on return): how a chaos run kills a proc mid-call."""
    return Path(directory) / "in-flight" / str(pid)


def read_ledger(directory: str | os.PathLike) -> list[Execution]:
    """Every execution recorded under `directory` (a torn last line is skipped)."""
    out: list[Execution] = []
    for path in sorted(Path(directory).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                d = json.loads(line)
            except ValueError:
                continue
            out.append(Execution(d["m"], d["r"], d["e"], d["d"], d["p"], d.get("i", 0)))
    return out


def counts(executions: list[Execution]) -> Counter:
    """(mesh, method, digest, rank) -> how many times it ran."""
    return Counter((e.mesh, e.method, e.digest, e.rank) for e in executions)
