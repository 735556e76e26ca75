"""Controllers started together open one new SQLite journal at the same instant."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

OPEN = """
import sys, time
from regent.journal.sqlite_store import SqliteStore
start = float(sys.argv[2])
while time.time() < start:
    pass
SqliteStore(sys.argv[1]).close()
print("opened")
"""


@pytest.mark.slow
def test_processes_opening_a_new_journal_at_once_all_get_it(tmp_path):
    # SQLite answers some of them "database is locked" at once, without waiting (it skips
    # its busy handler where waiting could deadlock); the store tries again.
    failures = []
    for round_ in range(10):
        path = tmp_path / f"journal-{round_}.db"
        start = time.time() + 0.6  # after every process has imported
        procs = [subprocess.Popen([sys.executable, "-c", OPEN, str(path), repr(start)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(3)]
        for p in procs:
            out, err = p.communicate(timeout=30)
            if "opened" not in out:
                failures.append(err.strip().splitlines()[-1] if err.strip() else f"exit {p.returncode}")
    assert failures == []
