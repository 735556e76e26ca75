"""Workers: host agents, procs, and the actors they host.

The controller talks to workers; workers never import the controller.
"""

from regent.worker.actor import (
    Actor,
    ActorContext,
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
    ProtocolError,
    RegentError,
    SupervisionError,
)
from regent.worker.shape import Point
from regent.worker.supervision import RestartPolicy

__all__ = [
    "Actor", "ActorContext", "ActorError", "DivergenceError", "FencedError", "MessageTooLarge",
    "Point", "ProtocolError", "RegentError", "RestartPolicy", "SupervisionError", "concurrent_endpoint", "context",
    "current_rank", "current_size", "endpoint",
]
