"""Checkpoints: the program's state snapshotted, so a takeover skips what came before.

A checkpoint is a barrier: every earlier call must have completed (broadcasts included) and be
journaled before the snapshot is stored, since a takeover resumes after it without replaying
them. `resume` marks where the program picks its state back up.
"""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING, Any

from regent.controller.replay import CALL

if TYPE_CHECKING:
    from regent.controller.session import Session


class Checkpoints:
    """`Session.checkpoint` and `Session.resume` for one session."""

    def __init__(self, s: Session):
        self.s = s
        self.resumed = False
        self.resume_lsn: int | None = None  # where `resume` was journaled in this run

    def save(self, state: Any) -> None:
        s = self.s
        seq, jc = s._begin("checkpoint", "checkpoint", "checkpoint")
        if jc is not None:
            s._finished(seq)
            s._edge.replayed_checkpoint(seq, state)
            return
        blob = pickle.dumps(state, protocol=5)
        engine = s._engine
        s.runtime.wait_until(lambda: not engine.outstanding_before(seq) or s._failed() is not None, None)
        s._check_live()
        lsn = s._append(CALL, {"s": seq, "k": "checkpoint", "a": "checkpoint", "m": "checkpoint", "v": None},
                        durable=True)
        s.lead.checkpoint({"seq": seq, "run": s.run_id, "state": blob, "resume_lsn": self.resume_lsn}, lsn=lsn + 1)
        s._finished(seq)
        s.runtime.checkpoint_seq = seq

    def resume(self, default: Any) -> Any:
        s = self.s
        if self.resumed:
            raise RuntimeError("resume() may be called once per session")
        self.resumed = True
        seq, jc = s._begin("resume", "resume", "resume")
        if jc is None:
            self.resume_lsn = s._append(CALL, {"s": seq, "k": "resume", "a": "resume", "m": "resume", "v": None},
                                        durable=True)
            s._finished(seq)
            return default
        s._finished(seq)
        ckpt = s.journal.read_checkpoint(s.name)
        data = ckpt["data"] if ckpt else None
        self.resume_lsn = data.get("resume_lsn") if data else None
        if not data or data.get("run") != s.run_id or data["seq"] <= seq or not s._edge.resume_from(seq, data):
            return default
        # Skip the calls the checkpoint covers: the program continues after it.
        with s._drive.lock:
            went_live = s._engine.skip_to(data["seq"])
            if s._catchup is not None:  # standing by still: what follows is the journal's, when it comes
                s._engine.replaying, went_live = True, False
        s._faults.skip_to(data["seq"])
        s.runtime.checkpoint_seq = data["seq"]
        if went_live:
            s._edge.live(s._engine)
        return pickle.loads(data["state"])
