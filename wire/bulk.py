"""Large payload frames between processes of one host, out of band, through shared memory.

A message to a peer on this host (a loopback address) whose payload has frames of at least
REGENT_BULK_BYTES (default 256 KiB; 0 turns this off) goes as a BULK envelope: the control
message with those frames left empty, and for each a segment in /dev/shm (created 0600 by this
user) that holds its bytes after a header page. The receiver maps the frame copy-on-write (a
tensor or array over it needs no copy, and a receiver that writes to it changes only its own
pages) and handles the message as if the bytes had come inline. The envelope itself travels on
the CURVE socket like any message, so only an authenticated peer names a segment; the receiver
still checks each name, owner, mode, size and generation before mapping.

Reuse. The header holds three generations: the one the sender handed out, the one a receiver
took, the one it released. A receiver writes its release when its mapping is collected (nothing
holds a tensor, array or view over it any more); the sender then writes the next frame of that
size class into the same pages, already allocated, at the speed of a memory copy rather than
tmpfs's page allocation (REGENT_BULK_POOL_BYTES of free segments are kept, 256 MiB by default and
at most an eighth of /dev/shm; one idle for POOL_IDLE_S is given back, and all of them when
/dev/shm is full).

Lifetimes. A mapping lives as long as something holds it, whatever the sender does. A segment
nobody took is unlinked by its sender when it learns the receiver is gone (`forget`: a dead proc,
a deposed controller, a peer closed), at its exit, and after SEGMENT_TTL_S in any case; every
segment of a dead sender by `sweep` (the host agent runs it). A receiver that finds a segment gone
drops the message, as for any message lost: a controller sends an unanswered call again, and a
proc answers it again from its results.

To a peer on another host the same envelope names the sender's data port instead, and the
receiver fetches the frames over TCP, AES-GCM encrypted under a key only the envelope carries
(wire.bulk_tcp). `route` says which path a peer gets.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import mmap
import os
import re
import secrets
import stat
import struct
import threading
import time
import weakref
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
HEADER = mmap.PAGESIZE  # a segment's first page: its generations; the frame's bytes follow
_GENERATIONS = struct.Struct("<QQQ")  # handed out (by the sender), taken, released (by its receiver)
_TAKEN, _RELEASED = 8, 16
MIN_CAPACITY = 64 * 1024
POOL_ENV = "REGENT_BULK_POOL_BYTES"
DEFAULT_POOL_BYTES = 256 << 20
POOL_IDLE_S = 30.0  # a free segment unused this long is given back to the system


def pool_bytes() -> int:
    """How many bytes of released segments a sender keeps for reuse ($REGENT_BULK_POOL_BYTES)."""
    raw = os.environ.get(POOL_ENV, "")
    try:
        value = int(raw) if raw else DEFAULT_POOL_BYTES
    except ValueError:
        raise ValueError(f"{POOL_ENV}={raw!r} must be a number of bytes (0 keeps no segment for reuse)") from None
    if value < 0:
        raise ValueError(f"{POOL_ENV}={raw!r} must be 0 or more")
    return value


def _capacity(size: int) -> int:
    """The size class of a segment holding `size` bytes: a power of two, so a reused segment fits
    the next frame of about the same size (tmpfs allocates only the pages written)."""
    return max(MIN_CAPACITY, 1 << (size - 1).bit_length())


@functools.cache
def _have_shm() -> bool:
    """Whether this machine has /dev/shm (looked at once: a peer is made per proc, a thousand in
    a takeover, where a stat each took a third of a second in all)."""
    return os.path.isdir(SHM_DIR)


def bulk_bytes(path: str = "shm") -> int:
    """The smallest frame sent out of band on `path` ($REGENT_BULK_BYTES; 0: never)."""
    raw = os.environ.get("REGENT_BULK_BYTES", "")
    if not raw:
        return DEFAULT_BULK_BYTES if path == "tcp" or _have_shm() else 0
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


class _Segment:
    __slots__ = ("name", "capacity", "map", "inode", "gen", "to", "since")

    def __init__(self, name: str, capacity: int, mapping: mmap.mmap, inode: int) -> None:
        self.name, self.capacity, self.map, self.inode = name, capacity, mapping, inode
        self.gen, self.to, self.since = 0, "", 0.0

    def still_named(self) -> bool:
        """Whether its name still leads to its file (nothing else unlinked or replaced it)."""
        try:
            return os.stat(os.path.join(SHM_DIR, self.name)).st_ino == self.inode
        except OSError:
            return False

    def generations(self) -> tuple[int, int, int]:
        return _GENERATIONS.unpack_from(self.map, 0)

    def drop(self) -> None:
        _unlink(self.name)
        with contextlib.suppress(BufferError):
            self.map.close()  # a view of it still being written keeps it until collected


class _Segments:
    """A sender's segments: those handed out to receivers, by name, and the released ones kept
    for reuse (least recently used first). A segment is reused only once its receiver wrote its
    release (its mapping is gone); one never taken is unlinked after SEGMENT_TTL_S, and those
    sent to a receiver that is gone are unlinked at once, never reused."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.out: dict[str, _Segment] = {}
        self.free: list[_Segment] = []
        self.count = 0
        self.registered = False
        self.trimming = False
        self.shm_bytes: int | None = None  # the size of /dev/shm, once looked up
        self.pid = os.getpid()

    def new_name(self) -> str:
        self.count += 1
        if not self.registered:
            atexit.register(self.remove_all)
            self.registered = True
        return f"regent-{os.getuid()}-{os.getpid()}-{self.count}-{secrets.token_hex(4)}"

    def write(self, data: Any, to: str) -> _Segment:
        """A segment holding `data`, handed out to the inbox at `to`."""
        view = memoryview(data).cast("B")
        size = len(view)
        with self.lock:
            self._collect(time.monotonic())
            seg = next((s for s in self.free if s.capacity == _capacity(size)), None)
            if seg is not None:
                self.free.remove(seg)
            name = self.new_name()
        if seg is not None and not seg.still_named():  # unlinked by hand: its name would lead nowhere
            seg.drop()
            seg = None
        if seg is not None:
            seg.map[HEADER:HEADER + size] = view  # pages written before: a copy at memory speed
        else:
            try:
                seg = self._create(name, view)
            except OSError as e:  # /dev/shm full: give the free segments' room back, once
                if e.errno != errno.ENOSPC or not self._drop_free():
                    raise
                with self.lock:
                    name = self.new_name()
                seg = self._create(name, view)
        seg.gen += 1
        _GENERATIONS.pack_into(seg.map, 0, seg.gen, 0, 0)
        seg.to, seg.since = to, time.monotonic()
        with self.lock:
            self.out[seg.name] = seg
        return seg

    def _create(self, name: str, view: memoryview) -> _Segment:
        capacity = _capacity(len(view))
        fd = os.open(os.path.join(SHM_DIR, name), os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, HEADER + capacity)
            at = 0
            while at < len(view):  # into fresh pages, write(2) is faster than faulting a mapping
                at += os.pwrite(fd, view[at:at + (1 << 30)], HEADER + at)
            return _Segment(name, capacity, mmap.mmap(fd, HEADER + capacity), os.fstat(fd).st_ino)
        except BaseException:
            _unlink(name)
            raise
        finally:
            os.close(fd)

    def _collect(self, now: float) -> None:
        """Move released segments to the free list; unlink those never taken within the TTL and
        the free ones beyond the pool's bound or idle too long. Called with the lock held."""
        for name, seg in list(self.out.items()):
            gen, taken, released = seg.generations()
            if released == seg.gen:
                del self.out[name]
                seg.since = now
                self.free.append(seg)
            elif taken != seg.gen and now - seg.since > SEGMENT_TTL_S:
                del self.out[name]
                seg.drop()
        keep, kept = pool_bytes(), 0
        if self.shm_bytes is None:
            self.shm_bytes = _filesystem_bytes(SHM_DIR)
        if self.shm_bytes:  # a container's /dev/shm may be 64 MiB: keep at most an eighth of it idle
            keep = min(keep, self.shm_bytes // 8)
        for seg in reversed(list(self.free)):
            kept += seg.capacity
            if kept > keep or now - seg.since > POOL_IDLE_S:
                self.free.remove(seg)
                seg.drop()
        if self.free and not self.trimming:
            self.trimming = True
            threading.Thread(target=self._trim, name="regent-bulk-trim", daemon=True).start()

    def _trim(self) -> None:
        """Give idle free segments back while any are kept (the process may send no more)."""
        while True:
            time.sleep(POOL_IDLE_S / 3)
            with self.lock:
                self._collect(time.monotonic())
                if not self.free:
                    self.trimming = False
                    return

    def _drop_free(self) -> bool:
        """Unlink every free segment; whether there was any."""
        with self.lock:
            free, self.free = self.free, []
        for seg in free:
            seg.drop()
        return bool(free)

    def remove_all(self) -> None:
        if os.getpid() != self.pid:
            return  # at the exit of a child forked with these: they are its parent's
        self.remove(lambda to: True)
        self._drop_free()

    def remove(self, which: Any) -> None:
        with self.lock:
            gone = [s for s in self.out.values() if which(s.to)]
            for seg in gone:
                del self.out[seg.name]
        for seg in gone:
            seg.drop()

    def give_back(self, name: str) -> None:
        """An envelope not sent after all: its segment is free again."""
        with self.lock:
            seg = self.out.pop(name, None)
            if seg is not None:
                _GENERATIONS.pack_into(seg.map, 0, seg.gen, seg.gen, seg.gen)
                seg.since = time.monotonic()
                self.free.append(seg)


def _filesystem_bytes(path: str) -> int:
    try:
        st = os.statvfs(path)
    except OSError:
        return 0
    return st.f_blocks * st.f_frsize


def _release(name: str, gen: int, pid: int) -> None:
    """A receiver's mapping of segment `name` is gone: its sender may reuse it. Only in the
    process that took it: a child forked while it was mapped (a data loader's worker, say) that
    drops its copy must not release what its parent still maps."""
    if os.getpid() != pid:
        return
    try:
        fd = os.open(os.path.join(SHM_DIR, name), os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return  # its sender gave it up (or died and it was swept)
    try:
        os.pwrite(fd, struct.pack("<Q", gen), _RELEASED)
    except OSError:
        pass
    finally:
        os.close(fd)


_segments = _Segments()


def _after_fork_in_child() -> None:
    """A forked child (a proc from its host's zygote) holds none of its parent's segments."""
    global _segments
    _segments = _Segments()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _unlink(name: str) -> bool:
    try:
        os.unlink(os.path.join(SHM_DIR, name))
        return True
    except OSError:
        return False  # gone already (or another user's, in the sticky /dev/shm)


def forget(address: str) -> None:
    """The inbox at `address` is gone: give up the segments and transfers sent to it that it
    never took."""
    _segments.remove(lambda to: to == address)
    bulk_tcp.forget(address)


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
            seg = _segments.write(inner[i], to)
            segments.append([i, seg.name, len(inner[i]), seg.gen])
            body[i] = b""
    except OSError as e:  # /dev/shm full or missing: the bytes go inline, as they always could
        for _, name, _, _ in segments:
            _segments.give_back(name)
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
            for _, name, _, _ in meta["seg"]:
                _segments.give_back(name)
            return


def _map(name: str, size: Any, gen: Any, limit: int) -> memoryview:
    """Segment `name`'s frame, mapped copy-on-write, marked taken; its release is written when
    the mapping is collected (nothing holds a view of it any more)."""
    if not isinstance(size, int) or not 0 < size <= limit or not isinstance(gen, int) or gen <= 0:
        raise BulkError(f"segment {name!r} of {size!r} bytes, generation {gen!r}, is not one this "
                        f"process takes (limit {limit})")
    try:
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise BulkError(f"segment {name} is gone (its sender gave it up; set REGENT_BULK_BYTES=0 on both "
                        "sides if this host's processes do not share /dev/shm)") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            _unlink(name)  # a symbolic link: not a segment any sender of this user made
        raise BulkError(f"cannot open segment {name}: {e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077 \
                or st.st_size < HEADER + size:
            _unlink(name)  # not a segment any sender of this user made: nobody should take it
            raise BulkError(f"segment {name} is not a private file of this user of {size} bytes or more")
        handed, taken, _ = _GENERATIONS.unpack(os.pread(fd, _GENERATIONS.size, 0))
        if handed != gen or taken == gen:
            raise BulkError(f"segment {name} was taken already or reused (generation {handed}, "
                            f"taken {taken}, this envelope's {gen})")
        os.pwrite(fd, struct.pack("<Q", gen), _TAKEN)
        mapping = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE,
                            offset=HEADER)
    finally:
        os.close(fd)
    weakref.finalize(mapping, _release, name, gen, os.getpid())
    return memoryview(mapping)


def take(frames: list, meta: Any, limit: int) -> list:
    """The message inside a BULK envelope (`frames` its payload, `meta` its metadata), its
    frames mapped from their segments (or fetched from the sender's data port, bulk_tcp.take).
    Raises BulkError, having given back to its sender every segment it did not map, when it cannot."""
    if isinstance(meta, dict) and "tcp" in meta:
        return bulk_tcp.take(frames, meta, limit)
    segments = meta.get("seg") if isinstance(meta, dict) else None
    names = [s[1] for s in segments if isinstance(s, list) and len(s) == 4 and isinstance(s[1], str)
             and (m := _NAME.fullmatch(s[1])) and int(m.group(1)) == os.getuid()] \
        if isinstance(segments, list) else []
    mapped = set()
    try:
        if not names or len(names) != len(segments) or len(segments) > len(frames):
            raise BulkError("a bulk envelope whose 'seg' is not a list of [frame, name, size, generation] "
                            "naming segments of this user")
        if sum(s[2] for s in segments if isinstance(s[2], int)) > limit:
            raise BulkError(f"a bulk envelope of more than {limit} bytes (REGENT_MAX_MESSAGE_BYTES)")
        out = list(frames)
        for index, name, size, gen in segments:
            if not isinstance(index, int) or not 1 <= index < len(out) or len(out[index]):
                raise BulkError(f"a bulk envelope names frame {index!r}, not an empty payload frame")
            out[index] = _map(name, size, gen, limit)
            mapped.add(name)
        return out
    except BulkError:
        for seg in segments if names else ():
            if seg[1] not in mapped:
                _refuse(seg[1], seg[3])
        raise


def _refuse(name: str, gen: Any) -> None:
    """Give a segment of a refused envelope back to its sender at once (taken and released),
    unless another receiver took it or it was reused."""
    try:
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        handed, taken, _ = _GENERATIONS.unpack(os.pread(fd, _GENERATIONS.size, 0).ljust(_GENERATIONS.size, b"\0"))
        if isinstance(gen, int) and handed == gen and taken != gen:
            os.pwrite(fd, _GENERATIONS.pack(gen, gen, gen), 0)
    except OSError:
        pass
    finally:
        os.close(fd)


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



def in_use(pid: int | None = None) -> list[str]:
    """Those of `held(pid)` not released by a receiver: in flight, or mapped by one (a sender's
    free segments, kept for reuse, are left out)."""
    out = []
    for name in held(pid):
        try:
            with open(os.path.join(SHM_DIR, name), "rb") as f:
                handed, _, released = _GENERATIONS.unpack(f.read(_GENERATIONS.size).ljust(_GENERATIONS.size, b"\0"))
        except OSError:
            continue
        if handed != released:
            out.append(name)
    return out
