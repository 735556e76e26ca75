"""Raw access to a journal's stored batch values, bypassing the journal, to plant defects
(bit flips, tears, swaps) that verify and read must then find. SQLite or etcd."""

from __future__ import annotations

import sqlite3


class RawStore:
    """Reads and writes stored batch values directly, bypassing the journal, to plant defects."""

    def __init__(self, url: str) -> None:
        self.url = url
        if url.startswith("etcd://"):
            import pyetcd

            host, port = url.removeprefix("etcd://").split(",")[0].split(":")
            self._etcd = pyetcd.client(host=host, port=int(port), timeout=5)
            self._sqlite = None
        else:
            self._etcd = None
            self._sqlite = sqlite3.connect(url.removeprefix("sqlite://"), isolation_level=None)

    @staticmethod
    def _key(session: str, first_lsn: int) -> str:
        return f"/regent/{session}/log/{first_lsn:016x}"

    def get(self, session: str, first_lsn: int) -> bytes:
        if self._etcd is not None:
            value, _ = self._etcd.get(self._key(session, first_lsn))
            assert value is not None, f"no batch at lsn {first_lsn}"
            return value
        row = self._sqlite.execute(
            "SELECT body FROM log WHERE session = ? AND first_lsn = ?", (session, first_lsn)
        ).fetchone()
        assert row is not None, f"no batch at lsn {first_lsn}"
        return bytes(row[0])

    def put(self, session: str, first_lsn: int, value: bytes) -> None:
        if self._etcd is not None:
            self._etcd.put(self._key(session, first_lsn), value)
            return
        self._sqlite.execute(
            "INSERT OR REPLACE INTO log (session, first_lsn, body) VALUES (?, ?, ?)",
            (session, first_lsn, value),
        )

    def delete(self, session: str, first_lsn: int) -> None:
        if self._etcd is not None:
            assert self._etcd.delete(self._key(session, first_lsn))
            return
        self._sqlite.execute(
            "DELETE FROM log WHERE session = ? AND first_lsn = ?", (session, first_lsn)
        )

    def batch_starts(self, session: str) -> list[int]:
        if self._etcd is not None:
            prefix = f"/regent/{session}/log/"
            return sorted(
                int(meta.key.decode()[len(prefix) :], 16)
                for _, meta in self._etcd.get_prefix(prefix, keys_only=True)
            )
        rows = self._sqlite.execute(
            "SELECT first_lsn FROM log WHERE session = ? ORDER BY first_lsn", (session,)
        ).fetchall()
        return [r[0] for r in rows]

    def close(self) -> None:
        if self._etcd is not None:
            self._etcd.close()
        else:
            self._sqlite.close()
