"""A hand-over asked for through the store (`regent upgrade`): the new program, standing by,
writes a request naming the epoch it wants handed over; the primary of that epoch, watching
for it, steps down at its next safe point as a SIGTERM would make it (controller/edge.py,
Handoff), wherever it runs. The request lives among the store's cluster values, in a space of
the session's own ("session:<name>", which no cluster name can be), one per epoch.

Both the request and a journal record the new program writes once it leads name the program
(its main file's sha256), so a standby of the old program refuses to take over (`other_program`)
rather than replay the new history with the old code and diverge.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from regent.controller.replay import PATCH, NonDeterminismError
from regent.controller.replay import PROGRAM as PROGRAM_RECORD
from regent.journal.standbys import standbys, watch_standbys

if TYPE_CHECKING:
    from regent.controller.session import Session

log = structlog.get_logger("regent.upgrade")

# Set by `regent upgrade` for the program it runs: the session it upgrades (its primary, whatever
# its epoch when this program stands by, is asked to hand over).
UPGRADE_ENV = "REGENT_UPGRADE"
WATCH_INTERVAL_S = 0.02  # a primary's look for a hand-over request: one listing of the session's standbys
# Where the store notifies the primary of its session's changes (etcd's watch), it looks on
# each notification and otherwise once a second: fifty listings a second were 4% of a core.
WATCHED_LOOK_S = 1.0
# The exit status of a controller that would not take over a session another program now runs.
EXIT_OTHER_PROGRAM = 3


def _main_program() -> dict | None:
    """This process's program, {"path", "digest"} (sha256 of its main file), or None when it
    has no file (python -c, a notebook)."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            return {"path": os.path.abspath(path)[:500], "digest": hashlib.sha256(f.read()).hexdigest()}
    except OSError:
        return None


# Read once, as the program starts (regent is imported at its top): a file edited in place
# later, as `regent upgrade S train.py` after editing train.py, must not pass for the code
# this process runs.
THIS_PROGRAM = _main_program()


class ProgramChanged(SystemExit):
    """This controller runs another program than the one its session now runs (`regent
    upgrade` changed it): it exits rather than take over and diverge."""

    def __init__(self, message: str):
        super().__init__(EXIT_OTHER_PROGRAM)
        self.message = message
        sys.stderr.write(message + "\n")


def _space(session: str) -> str:
    return f"session:{session}"


def _name(epoch: int, by: str) -> str:
    """A request's key: one per epoch and requester (a store's value is written once)."""
    return f"handover-{epoch}-{hashlib.sha256(by.encode()).hexdigest()[:24]}"


def upgrading(session: str) -> bool:
    """Whether this process was started by `regent upgrade` to take `session` over."""
    return os.environ.get(UPGRADE_ENV) == session


def request_handover(backend: Any, session: str, epoch: int, by: str) -> float:
    """Ask the primary of `epoch` to hand `session` over to this program (standing by as `by`);
    when the request was made (time.time())."""
    at = time.time()
    backend.claim_cluster_value(_space(session), _name(epoch, by),
                                json.dumps({"by": by, "at": at, "program": THIS_PROGRAM}).encode())
    return at


def handover_request(backend: Any, session: str, epoch: int) -> dict | None:
    """The request to hand over `epoch` of a standby still standing by (its record in the store,
    journal/standbys.py: a requester that died or was stopped asks nothing any more), if one was
    made: {"by": holder, "at": time, "program": {"path", "digest"} | None}. The store's values
    are untrusted: anything but that shape is taken for no request (and logged)."""
    for standby in standbys(backend, session):
        by = standby["holder"]
        raw = backend.cluster_value(_space(session), _name(epoch, by))
        if raw is None:
            continue
        try:
            value = json.loads(raw)
            if (isinstance(value, dict) and value.get("by") == by and isinstance(value.get("at"), int | float)):
                return {"by": by, "at": float(value["at"]), "program": _program(value.get("program"))}
        except ValueError:
            pass
        log.warning("ignoring a malformed hand-over request in the store", session=session, epoch=epoch,
                    value=raw[:200])
    return None


def _program(value: Any) -> dict | None:
    """A program named by the store or the journal, checked: {"path": str, "digest": str}."""
    if isinstance(value, dict) and isinstance(value.get("path"), str) and isinstance(value.get("digest"), str):
        return {"path": value["path"][:500], "digest": value["digest"][:64]}
    return None


def announce_program(writer: Any, by: str) -> int:
    """Journal that this program leads the run from here (the lsn to wait for): written by the
    program `regent upgrade` started, before its first live call."""
    named = THIS_PROGRAM or {"path": "?", "digest": ""}
    return writer.submit(PROGRAM_RECORD, {**named, "by": by, "ts": time.time()})


def takeover_check(backend: Any, session: str, index: Any) -> tuple[str | None, bool]:
    """Before this process takes over `session`, whose unfinished run the journal `index` holds:
    why it must not (the run is being handed over to another program: a request for the
    journal's last epoch names it; or another program leads it since an upgrade: its PROGRAM
    record), else None; and whether it is to journal itself as the run's program (it is the one
    `regent upgrade` started, or the one the request named and the journal does not yet)."""
    if upgrading(session):
        return None, True  # checked by replaying the journal before it was started
    theirs, how = index.program, "runs another program since `regent upgrade`"
    if index.epochs:
        try:
            request = handover_request(backend, session, index.epochs[-1])
        except Exception as e:  # the store is down: the journal's record still says which runs it
            log.warning("cannot read the session's hand-over request", session=session, error=str(e))
            request = None
        if request is not None and request["program"] is not None:
            theirs, how = request["program"], ("is being handed over to another program by `regent upgrade` "
                                                f"(asked by {request['by']})")
    if theirs is None or THIS_PROGRAM is None:
        return None, False  # no upgrade named a program, or this one has no file to compare
    if theirs["digest"] == THIS_PROGRAM["digest"]:
        return None, index.program is None or index.program["digest"] != theirs["digest"]
    return (f"session {session!r} {how}: {theirs['path']} (sha256 {theirs['digest'][:16]}); this controller runs "
            f"{THIS_PROGRAM['path']} (sha256 {THIS_PROGRAM['digest'][:16]}). It exits rather than take the session "
            "over and diverge from the new program's history: stop the old program's standbys and start "
            "standbys of the new one (or `regent upgrade` to this program)."), False


class HandoverWatch:
    """The primary's side: polls the store every WATCH_INTERVAL_S for a request for its epoch,
    and calls `on_request(request)` once per requester. Store errors are retried (a transient
    outage must not end the run); `close` stops it. `asked()`, at the moment of handing over: a
    requester gone since (stopped, killed) is not handed the session, unless another asks now."""

    def __init__(self, backend: Any, session: str, epoch: int, on_request: Callable[[dict], None]):
        self._backend, self._session, self._epoch = backend, session, epoch
        self._on_request = on_request
        self._reported: str | None = None
        self._stop = threading.Event()
        self._woken = threading.Event()  # the store said the session's space changed, or close()
        self._cancel: Callable[[], None] | None = None  # the store's watch, while it holds
        self._watch_again_at = 0.0
        self._thread = threading.Thread(target=self._run, name=f"regent-handover-{session}", daemon=True)
        self._thread.start()

    def _changed(self, alive: bool) -> None:
        if not alive:
            self._cancel = None  # broken (the store went away): poll, and watch again later
        self._woken.set()

    def _wait(self) -> bool:
        """Until the next look: a change the store reported (at most WATCHED_LOOK_S) while it
        watches, WATCH_INTERVAL_S otherwise. True once closed."""
        now = time.monotonic()
        if self._cancel is None and now >= self._watch_again_at:
            self._watch_again_at = now + WATCHED_LOOK_S
            self._cancel = watch_standbys(self._backend, self._session, self._changed)
        if self._cancel is not None:
            self._woken.wait(WATCHED_LOOK_S)
        else:
            self._stop.wait(WATCH_INTERVAL_S)
        self._woken.clear()  # before the look: a change during it wakes the next wait
        return self._stop.is_set()

    def _run(self) -> None:
        failing = False
        while not self._wait():
            try:
                request = handover_request(self._backend, self._session, self._epoch)
                failing = False
            except Exception as e:  # the store is down or closing: look again later
                if not failing and not self._stop.is_set():
                    log.warning("cannot read hand-over requests from the store; retrying", session=self._session,
                                error=str(e))
                failing = True
                continue
            if request is not None and request["by"] != self._reported:
                self._reported = request["by"]
                self._on_request(request)

    def asked(self) -> bool:
        """Whether a requester still stands by asking (one read of the store; if the store does
        not answer, the hand-over goes ahead as asked). Any requester, not only the one that
        was seen: an upgrade that started over asks again under a new name, possibly while
        this look runs, after the watch reported it (the pending hand-over must not then be
        dropped for the first requester's absence)."""
        try:
            now = handover_request(self._backend, self._session, self._epoch)
        except Exception as e:  # noqa: BLE001 - the request was valid when seen
            log.warning("cannot check the hand-over request again; handing over as asked", session=self._session,
                        error=str(e))
            return True
        return now is not None

    def close(self) -> None:
        self._stop.set()
        self._woken.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        if (cancel := self._cancel) is not None:
            self._cancel = None
            cancel()


def patch_marker(s: Session, change_id: str, deprecated: bool) -> bool:
    """`s.patched(change_id)` (and `s.deprecate_patch`): whether this run takes the change's
    branch here; live, its marker is journaled."""
    s._check_live()
    engine = s._engine
    if s._catchup is not None:
        s._catchup.at_next_seq()
    with s._drive.lock:
        jc = engine.next_journaled()
    if jc is not None and not (jc.kind == PATCH and jc.method == change_id):
        if deprecated:
            raise NonDeterminismError(
                jc.seq, jc.describe(),
                f"s.deprecate_patch({change_id!r}): this history was made by a program without the "
                f"change, which only a program still calling s.patched({change_id!r}) replays")
        return False
    seq, jc = s._begin(PATCH, PATCH, change_id)
    if jc is None:
        s._do(engine.value_record(seq, PATCH, change_id, actor=PATCH, method=change_id))
    else:
        s.stats["replayed"] += 1
    s._finished(seq)
    return True
