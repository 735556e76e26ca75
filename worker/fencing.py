"""Worker-side epoch fencing (DESIGN invariants 5 and 9).

A worker remembers the highest controller epoch it has seen and refuses anything
older, so a paused or partitioned deposed primary cannot drive it. `EpochFence` is the
pure rule; `FenceStore` keeps a host agent's fences on disk, so that the agent its procs
start after it died refuses what the dead one refused, before any proc has adopted it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import structlog

log = structlog.get_logger("regent.fencing")

# Fences of sessions a host agent no longer serves are kept on disk up to this many.
FENCES_KEPT = 4096


class EpochFence:
    def __init__(self, epoch: int = 0) -> None:
        self.epoch = epoch
        self.rejected = 0

    def admit(self, epoch: int) -> bool:
        """True if a message of this epoch may proceed; raises the fence on a newer one."""
        if epoch < self.epoch:
            self.rejected += 1
            return False
        self.epoch = epoch
        return True


class FenceStore:
    """One file per session under `directory` (mode 0600) holding the highest epoch seen.

    A file is written, by atomic rename, only when a session's fence rises (once per
    leader), and before the message that raised it is acted on. What is read back is
    validated: a file that is not ours, or not one of these, counts as no fence."""

    def __init__(self, directory: Path, kept: int = FENCES_KEPT) -> None:
        self.directory = directory
        self.kept = kept

    def _path(self, sid: str) -> Path:
        # Session ids come from the network: the name is a hash, never the id itself.
        return self.directory / f"{hashlib.sha256(sid.encode()).hexdigest()[:32]}.fence"

    def load(self, sid: str) -> int:
        path = self._path(sid)
        try:
            raw = path.read_text()
        except FileNotFoundError:
            return 0
        except OSError as e:
            log.error("cannot read a session's epoch fence; starting it at 0", session=sid, path=str(path),
                      error=str(e))
            return 0
        try:
            data = json.loads(raw)
        except ValueError:
            data = None
        epoch = data.get("epoch") if isinstance(data, dict) and data.get("sid") == sid else None
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            log.error("ignored an epoch fence file that does not hold this session's epoch", session=sid,
                      path=str(path), content=raw[:200])
            return 0
        return epoch

    def save(self, sid: str, epoch: int, keep: frozenset[str] | set[str] = frozenset()) -> None:
        """Record `epoch` for `sid`. Raises OSError when it cannot (the caller decides what
        to refuse then). A new session's file may prune the oldest of other sessions'
        beyond `kept`, never those of sessions in `keep`."""
        path = self._path(sid)
        fresh = not path.exists()
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"sid": sid, "epoch": epoch}, f)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        if fresh:
            self._prune({self._path(s).name for s in keep} | {path.name})

    def _prune(self, keep: set[str]) -> None:
        try:
            files = [(p.stat().st_mtime, p) for p in self.directory.glob("*.fence") if p.name not in keep]
        except OSError:
            return  # a file went away while we looked: prune next time
        excess = len(files) + len(keep) - self.kept
        for _, p in sorted(files)[:max(0, excess)]:
            p.unlink(missing_ok=True)
