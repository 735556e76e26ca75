"""The controller: the user's program drives a cluster through a Session.

    from controller import Session, Actor, endpoint
"""

from controller.futures import Future, Point, ValueMesh
from controller.mesh import ActorMesh, Endpoint, HostMesh, ProcMesh
from controller.replay import NonDeterminismError
from controller.session import Session
from journal import LeadershipLost
from worker.actor import Actor, context, current_rank, endpoint
from worker.errors import (
    ActorError,
    DivergenceError,
    FencedError,
    MessageTooLarge,
    RegentError,
    SupervisionError,
)
from worker.supervision import RestartPolicy

__all__ = [
    "Actor", "ActorError", "ActorMesh", "DivergenceError", "Endpoint", "FencedError", "Future",
    "HostMesh", "LeadershipLost", "MessageTooLarge", "NonDeterminismError", "Point", "ProcMesh", "RegentError", "RestartPolicy", "Session", "SupervisionError", "ValueMesh",
    "context", "current_rank", "endpoint",
]
