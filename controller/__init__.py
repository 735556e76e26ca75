"""The controller: the user's program drives a cluster through a Session.

    from regent import Session, Actor, endpoint
"""

from regent.controller.faults import MeshFailure
from regent.controller.futures import Future, Point, ValueMesh
from regent.controller.mesh import ActorMesh, Endpoint, HostMesh, ProcMesh
from regent.controller.replay import NonDeterminismError
from regent.controller.session import Session
from regent.journal import LeadershipLost
from regent.worker.actor import (
    Actor,
    concurrent_endpoint,
    context,
    current_rank,
    current_size,
    endpoint,
)
from regent.worker.errors import (
    ActorError,
    DivergenceError,
    FencedError,
    MessageTooLarge,
    RegentError,
    SupervisionError,
)
from regent.worker.supervision import RestartPolicy

__all__ = [
    "Actor", "ActorError", "ActorMesh", "DivergenceError", "Endpoint", "FencedError", "Future",
    "HostMesh", "LeadershipLost", "MeshFailure", "MessageTooLarge", "NonDeterminismError", "Point", "ProcMesh", "RegentError", "RestartPolicy", "Session", "SupervisionError", "ValueMesh",
    "concurrent_endpoint", "context", "current_rank", "current_size", "endpoint",
]
