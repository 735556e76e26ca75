"""Bytes this process moved through RDMA buffers, readable by another process of the host.

The counts live in a small shared-memory segment of this process's own (created on the first
transfer, named after its pid and start time like every hipcore segment, swept if it dies), so
the host agent reads each proc's figures at scrape time without asking it anything (a proc
serves no metrics of its own). Counting is a struct write under a lock, once per transfer.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import threading

from regent.hipcore import _shm

KIND = "rdmastats"
_LAYOUT = struct.Struct("<4Q")  # bytes read, bytes written, reads, writes

_lock = threading.Lock()
_page: mmap.mmap | None = None


def count(read: bool, nbytes: int) -> None:
    """One transfer of `nbytes` done: into this process (`read_into`) or out of it."""
    global _page
    with _lock:
        if _page is None:
            _, _page = _shm.create(KIND, _LAYOUT.size)
        rb, wb, rn, wn = _LAYOUT.unpack_from(_page)
        if read:
            rb, rn = rb + nbytes, rn + 1
        else:
            wb, wn = wb + nbytes, wn + 1
        _LAYOUT.pack_into(_page, 0, rb, wb, rn, wn)


def read_counts(pids: set[int]) -> dict[int, tuple[int, int, int, int]]:
    """pid -> (bytes read, bytes written, reads, writes) for those of `pids` that moved any
    bytes, read from their segments. A segment of another process than its name says (a reused
    pid), or of the wrong size, is skipped."""
    out: dict[int, tuple[int, int, int, int]] = {}
    try:
        names = os.listdir(_shm.SHM_DIR)
    except OSError:
        return out
    for name in names:
        if not name.startswith(_shm.PREFIX) or f"-{KIND}-" not in name:
            continue
        try:
            pid, start = _shm.owner_of(name)
        except (ValueError, IndexError):
            continue
        if pid not in pids or _shm.process_start_time(pid) != start:
            continue
        with contextlib.suppress(OSError, ValueError), open(os.path.join(_shm.SHM_DIR, name), "rb") as f:
            raw = f.read(_LAYOUT.size + 1)
            if len(raw) == _LAYOUT.size:
                out[pid] = _LAYOUT.unpack(raw)
    return out
