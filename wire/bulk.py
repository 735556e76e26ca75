"""Large payload frames between processes of one host, out of band, through shared memory.

A message to a peer on this host (a loopback address) whose payload has frames of at least
REGENT_BULK_BYTES (default 256 KiB; 0 turns this off) goes as a BULK envelope: the control
message with those frames left empty, and for each a segment in /dev/shm that holds its bytes
(created 0600 by this user, written once). The receiver maps each segment copy-on-write (a
tensor or array over it needs no copy, and a receiver that writes to it changes only its own
pages), unlinks it at once, and handles the message as if the bytes had come inline. The
envelope itself travels on the CURVE socket like any message, so only an authenticated peer
names a segment; the receiver still checks each name, owner, mode and size before mapping.

Lifetimes. A mapping lives as long as something holds it (the tensor the program got, say),
since the name is gone once mapped. A segment nobody mapped is unlinked by its sender when
it learns the receiver is gone (`forget`: a dead proc, a deposed controller, a peer closed), at
its exit, and after SEGMENT_TTL_S in any case; by `sweep` (the host agent runs it) once its
sender is dead. A receiver that finds a segment gone drops
the message, as for any message lost: a controller sends an unanswered call again, and a proc
answers it again from its results.

To a peer on another host the same envelope names the sender's data port instead, and the
receiver fetches the frames over TCP, AES-GCM encrypted under a key only the envelope carries
(wire.bulk_tcp). `route` says which path a peer gets.
"""

from __future__ import annotations

import atexit
import collections
import mmap
import os
import re
import secrets
import stat
import threading
import time
from typing import Any

import structlog

from regent.wire import bulk_tcp, protocol
from regent.wire.errors import BulkError
from regent.wire.protocol import Kind

log = structlog.get_logger("regent.transport")

SHM_DIR = "/dev/shm"
DEFAULT_BULK_BYTES = 256 * 1024
# A segment its receiver has not mapped by then is given up by its sender (a backstop: a receiver
# known to be gone has its segments given up at once, `forget`).
SEGMENT_TTL_S = bulk_tcp.TTL_S
DEAD_SENDER_GRACE_S = 5.0  # `sweep` leaves a dead sender's segment this long (it may be in flight)
_NAME = re.compile(r"regent-(\d+)-(\d+)-(\d+)-[0-9a-f]{8}")
ROUTE_ENV = "REGENT_BULK_ROUTE"


def bulk_bytes(path: str = "shm") -> int:
    """The smallest frame sent out of band on `path` ($REGENT_BULK_BYTES; 0: never)."""
    raw = os.environ.get("REGENT_BULK_BYTES", "")
    if not raw:
        return DEFAULT_BULK_BYTES if path == "tcp" or os.path.isdir(SHM_DIR) else 0
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"REGENT_BULK_BYTES={raw!r} must be a number of bytes (0 turns bulk frames off)") from None
    if value < 0 or (0 < value < 4096):
        raise ValueError(f"REGENT_BULK_BYTES={raw!r} must be 0 (off) or at least 4096")
    return value


def is_local(address: str) -> bool:
    """Whether an inbox address is on this host as far as the address says (loopback)."""
    return address.startswith(("tcp://127.", "tcp://[::1]", "tcp://localhost:"))


def route(address: str) -> str:
    """How large frames go to the inbox at `address`: "shm" on this host, "tcp" to another.
    $REGENT_BULK_ROUTE=tcp sends every peer's over TCP, as if each were on another host (the
    cross-host path's tests and benchmarks on one machine)."""
    forced = os.environ.get(ROUTE_ENV, "")
    if forced not in ("", "auto", "tcp"):
        raise ValueError(f"{ROUTE_ENV}={forced!r} must be 'auto' (shared memory on this host, TCP to "
                         "others) or 'tcp' (TCP to every peer)")
    return "shm" if forced != "tcp" and is_local(address) else "tcp"


class _Segments:
    """The segments this process created and no receiver has taken yet, oldest first."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.made: collections.deque[tuple[float, str, str]] = collections.deque()  # when, name, to
        self.count = 0
        self.registered = False

    def new_name(self) -> str:
        with self.lock:
            self.count += 1
            if not self.registered:
                atexit.register(self.remove_all)
                self.registered = True
            return f"regent-{os.getuid()}-{os.getpid()}-{self.count}-{secrets.token_hex(4)}"

    def keep(self, name: str, to: str) -> None:
        now = time.monotonic()
        with self.lock:
            self.made.append((now, name, to))
            expired = []
            while self.made and now - self.made[0][0] > SEGMENT_TTL_S:
                expired.append(self.made.popleft()[1])
        for old in expired:
            _unlink(old)

    def remove_all(self) -> None:
        self.remove(lambda to: True)

    def remove(self, which: Any) -> None:
        with self.lock:
            names = [n for _, n, to in self.made if which(to)]
            self.made = collections.deque(m for m in self.made if not which(m[2]))
        for name in names:
            _unlink(name)


_segments = _Segments()


def _unlink(name: str) -> bool:
    try:
        os.unlink(os.path.join(SHM_DIR, name))
        return True
    except FileNotFoundError:
        return False  # its receiver took it


def forget(address: str) -> None:
    """The inbox at `address` is gone: give up the segments and transfers sent to it that it
    never took."""
    _segments.remove(lambda to: to == address)
    bulk_tcp.forget(address)


def _write_segment(data: Any, to: str) -> tuple[str, int]:
    view = memoryview(data).cast("B")
    name = _segments.new_name()
    fd = os.open(os.path.join(SHM_DIR, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    try:
        at = 0
        while at < len(view):
            at += os.write(fd, view[at:at + (1 << 30)])
    except BaseException:
        os.close(fd)
        _unlink(name)
        raise
    os.close(fd)
    _segments.keep(name, to)
    return name, len(view)


def export(frames: list, threshold: int, to: str) -> list:
    """`frames`, for the inbox at `to`, with payload frames of `threshold` bytes or more moved to
    segments, as a BULK envelope (inside a RELAY's, which the agent passes on untouched);
    `frames` itself if there is none."""
    outer: list = []
    inner = frames
    if protocol.kind_byte(frames[0]) == Kind.RELAY:
        outer, inner = [frames[0]], frames[1:]
        to = str(protocol.decode([frames[0]])[1].get("to"))
    big = [i for i in range(1, len(inner)) if len(inner[i]) >= threshold]
    if not big:
        return frames
    segments = []
    body = list(inner)
    try:
        for i in big:
            name, size = _write_segment(inner[i], to)
            segments.append([i, name, size])
            body[i] = b""
    except OSError as e:  # /dev/shm full or missing: the bytes go inline, as they always could
        for _, name, _ in segments:
            _unlink(name)
        log.warning("could not put a large frame in shared memory; sending it inline", error=str(e))
        return frames
    return [*outer, *protocol.encode(Kind.BULK, {"seg": segments}, body)]


def discard(frames: list) -> None:
    """Give up the segments (or the transfer) of an envelope `export` (or bulk_tcp's) made that
    will not be sent after all."""
    for f in frames[:2]:
        if protocol.kind_byte(f) == Kind.BULK:
            _, meta, _ = protocol.decode([f])
            if "tcp" in meta:
                bulk_tcp.discard(frames)
                return
            for _, name, _ in meta["seg"]:
                _unlink(name)
            return


def _map(name: Any, size: Any, limit: int) -> memoryview:
    if not isinstance(name, str) or not isinstance(size, int) or not 0 < size <= limit:
        raise BulkError(f"segment {name!r} of {size!r} bytes is not one this process takes (limit {limit})")
    match = _NAME.fullmatch(name)
    if match is None or int(match.group(1)) != os.getuid():
        raise BulkError(f"segment name {name!r} is not a regent segment of this user")
    try:
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise BulkError(f"segment {name} is gone (its sender gave it up, or it was taken already; set "
                        "REGENT_BULK_BYTES=0 on both sides if this host's processes do not share /dev/shm)") from None
    except OSError as e:
        raise BulkError(f"cannot open segment {name}: {e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077 or st.st_size != size:
            raise BulkError(f"segment {name} is not a private file of this user of {size} bytes")
        flags = mmap.MAP_PRIVATE
        mapping = mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
        _unlink(name)
    return memoryview(mapping)


def take(frames: list, meta: Any, limit: int) -> list:
    """The message inside a BULK envelope (`frames` its payload, `meta` its metadata), its
    frames mapped from their segments (or fetched from the sender's data port, bulk_tcp.take).
    Raises BulkError, having unlinked every segment it names, when it cannot."""
    if isinstance(meta, dict) and "tcp" in meta:
        return bulk_tcp.take(frames, meta, limit)
    segments = meta.get("seg") if isinstance(meta, dict) else None
    names = [s[1] for s in segments if isinstance(s, list) and len(s) == 3] if isinstance(segments, list) else []
    try:
        if not names or len(names) != len(segments) or len(segments) > len(frames):
            raise BulkError("a bulk envelope whose 'seg' is not a list of [frame, name, size]")
        if sum(s[2] for s in segments if isinstance(s[2], int)) > limit:
            raise BulkError(f"a bulk envelope of more than {limit} bytes (REGENT_MAX_MESSAGE_BYTES)")
        out = list(frames)
        for index, name, size in segments:
            if not isinstance(index, int) or not 1 <= index < len(out) or len(out[index]):
                raise BulkError(f"a bulk envelope names frame {index!r}, not an empty payload frame")
            out[index] = _map(name, size, limit)
        return out
    except BulkError:
        for name in names:
            if isinstance(name, str) and _NAME.fullmatch(name):
                _unlink(name)
        raise


def sweep(grace_s: float = DEAD_SENDER_GRACE_S) -> int:
    """Unlink this user's segments whose sender is dead (for `grace_s` at least, as far as the
    file's age says): what a process killed with segments in flight left. Returns how many."""
    uid, now, removed = os.getuid(), time.time(), 0
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return 0
    for name in names:
        match = _NAME.fullmatch(name)
        if match is None or int(match.group(1)) != uid:
            continue
        pid = int(match.group(2))
        try:
            os.kill(pid, 0)
            continue  # its sender lives: it gives the segment up itself
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        try:
            if now - os.stat(os.path.join(SHM_DIR, name)).st_mtime < grace_s:
                continue
        except FileNotFoundError:
            continue
        removed += _unlink(name)
    return removed


def held(pid: int | None = None) -> list[str]:
    """This user's segments in /dev/shm (of sender `pid` only, if given): for tests and tools."""
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return []
    uid = os.getuid()
    return sorted(n for n in names if (m := _NAME.fullmatch(n)) and int(m.group(1)) == uid
                  and (pid is None or int(m.group(2)) == pid))

