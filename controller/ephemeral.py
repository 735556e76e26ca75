"""`journal="off"`: a session without a journal, for programs (and benchmarks) that
accept dying with their controller, as in plain Monarch. Same interface as the
journal's leadership and writer; nothing is stored, nobody stands by."""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Iterator
from typing import Any


class NoJournal:
    url = "off"

    def campaign(self, session: str, holder: str, **_: Any) -> NoLeadership:
        return NoLeadership(session, holder)

    def read(self, session: str, start_lsn: int = 0) -> Iterator[Any]:
        return iter(())

    def read_checkpoint(self, session: str) -> None:
        return None

    def close(self) -> None:
        pass


class NoLeadership:
    epoch = 1
    next_lsn = 0

    def __init__(self, session: str, holder: str):
        self.session = session
        self.holder = holder

    def on_lost(self, cb: Callable[[str], None]) -> None:
        pass

    def checkpoint(self, data: dict, *, lsn: int | None = None) -> None:
        pass

    def resign(self) -> None:
        pass

    def close(self) -> None:
        pass


class NoWriter:
    """Every record is 'durable' the moment it is submitted: there is nothing to wait for."""

    def __init__(self, lead: Any = None):
        self._lsn = itertools.count()
        self.durable_lsn = -1

    def submit(self, kind: str, data: dict, *, lazy: bool = False) -> int:
        self.durable_lsn = next(self._lsn)
        return self.durable_lsn

    def collector(self, kind: str) -> Callable[[Any], None]:
        return collections.deque(maxlen=0).append  # keeps nothing, and costs no Python frame

    def ticket(self) -> int:
        return 0

    def bound(self, ticket: int) -> int | None:
        return self.durable_lsn

    def seal(self) -> int:
        return self.durable_lsn

    def wait_durable(self, lsn: int, timeout: float | None = None) -> None:
        pass

    def flush(self, timeout: float | None = None) -> int:
        return self.durable_lsn

    def close(self) -> None:
        pass


class RefusingWriter:
    """A writer for a session that must not write (an audit, a standby catching up): every
    record it is given raises `refuse(kind)`; nothing is ever pending or durable."""

    durable_lsn = -1

    def __init__(self, refuse: Callable[[str], BaseException]):
        self._refuse = refuse

    def submit(self, kind: str, data: dict, *, lazy: bool = False) -> int:
        raise self._refuse(kind)

    def collector(self, kind: str) -> Callable[[Any], None]:
        def refuse(item: Any) -> None:
            raise self._refuse(kind)
        return refuse

    def ticket(self) -> int:
        return 0

    def bound(self, ticket: int) -> int | None:
        return -1

    def seal(self) -> int:
        return -1

    def wait_durable(self, lsn: int, timeout: float | None = None) -> None:
        pass

    def flush(self, timeout: float | None = None) -> int:
        return -1

    def close(self) -> None:
        pass
