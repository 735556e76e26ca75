"""Workers: host agents, procs, and the actors they host.

The controller talks to workers; workers never import the controller.
"""

from regent.worker.actor import Actor, ActorContext, context, current_rank, endpoint
from regent.worker.errors import (
    ActorError,
    DivergenceError,
    FencedError,
    MessageTooLarge,
    ProtocolError,
    RegentError,
    SupervisionError,
)
from regent.worker.supervision import RestartPolicy

__all__ = [
    "Actor", "ActorContext", "ActorError", "DivergenceError", "FencedError", "MessageTooLarge",
    "ProtocolError", "RegentError", "RestartPolicy", "SupervisionError", "context", "current_rank", "endpoint",
]
