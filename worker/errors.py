"""Errors that cross the wire between workers and the controller.

They live in `worker` because the controller imports worker types, never the
reverse. Each carries enough context for a person to act on it. The wire's own errors
(and their base, RegentError) live in `wire.errors`, below both, and are re-exported here.
"""

from __future__ import annotations

import traceback

from regent.wire.errors import MessageTooLarge, ProtocolError, RegentError

__all__ = [
    "ActorError", "ActorExit", "DeadlockError", "DivergenceError", "FencedError", "MessageTooLarge",
    "ProtocolError", "RegentError", "SupervisionError",
]


class ActorError(RegentError):
    """An endpoint raised: carries the remote exception type, message and traceback.

    The actor keeps serving; only this call failed.
    """

    def __init__(self, actor: str, endpoint: str, exc_type: str, message: str, traceback: str):
        self.actor = actor
        self.endpoint = endpoint
        self.exc_type = exc_type
        self.message = message
        self.remote_traceback = traceback
        super().__init__(
            f"{actor}.{endpoint} raised {exc_type}: {message}\n"
            f"--- remote traceback ---\n{traceback}"
        )

    def __reduce__(self):
        return (
            ActorError,
            (self.actor, self.endpoint, self.exc_type, self.message, self.remote_traceback),
        )


class SupervisionError(RegentError):
    """The actor (or its process) failed, so the call cannot complete there."""

    def __init__(self, message: str, *, actor: str = "", reason: str = ""):
        self.actor = actor
        self.reason = reason
        super().__init__(message)

    def __reduce__(self):
        return (_rebuild_supervision, (str(self), self.actor, self.reason))


def _rebuild_supervision(message: str, actor: str, reason: str) -> SupervisionError:
    return SupervisionError(message, actor=actor, reason=reason)


class FencedError(RegentError):
    """A worker refused a message from a deposed controller (epoch below the highest seen)."""


class DivergenceError(RegentError):
    """The same call id arrived with a different argument digest: the program is not
    deterministic, or two controllers disagree. The call was not run again."""


class DeadlockError(RegentError):
    """An actor waited for an answer only its own later work could give (a call to itself)."""


class ActorExit(Exception):  # noqa: N818 - a way out, like SystemExit
    """Raised by an endpoint to stop its actor. normal=False (the default) is an
    abnormal exit: the mesh's restart policy decides what happens next."""

    def __init__(self, reason: str = "", normal: bool = False):
        self.reason = reason
        self.normal = normal
        super().__init__(reason)


def outcome_error(status: str, meta: dict, actor: str, method: str) -> RegentError | None:
    """The error a caller raises for a call's answer of this status (None: ok, or the caller's
    own case, such as "fenced"): ActorError for an endpoint's exception, SupervisionError for
    an actor or proc gone, DivergenceError for an id reused. `actor` names the point."""
    if status == "err":
        return ActorError(actor, method, str(meta.get("et")), str(meta.get("em")), str(meta.get("tb", "")))
    if status in ("dead", "noactor", "exit"):
        return SupervisionError(f"{actor}.{method} failed: {meta.get('em')}", actor=actor, reason=status)
    if status == GROUP_FAILED:
        return SupervisionError(f"{actor}.{method} failed: {meta.get('em')}", actor=actor, reason="group")
    if status == "divergence":
        return DivergenceError(f"{actor}.{method}: {meta.get('em')}")
    return None


# An endpoint's collective failed because another member of its process group is gone: that
# member's failure, which the controller names (controller._runtime), not this actor's error.
GROUP_FAILED = "grp"


def group_failure(e: BaseException) -> bool:
    """Whether an endpoint's exception is a collective whose peer is gone (hipcore decides:
    it knows what gloo and NCCL raise); False in a proc that never imported torch.distributed."""
    import sys

    if "torch.distributed" not in sys.modules:
        return False
    from regent.hipcore.distributed import is_peer_failure

    return is_peer_failure(e)


def error_fields(e: BaseException) -> dict[str, str]:
    """What an answer says of an exception: its type, message and traceback (each bounded)."""
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return {"et": type(e).__qualname__, "em": str(e)[:4000], "tb": tb[-16000:]}

