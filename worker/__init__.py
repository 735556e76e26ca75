"""Workers: host agents, procs, and the actors they host.

The controller talks to workers; workers never import the controller.
"""

from worker.actor import Actor, ActorContext, context, current_rank, endpoint
from worker.errors import (
    ActorError,
    DivergenceError,
    FencedError,
    MessageTooLarge,
    ProtocolError,
    RegentError,
    SupervisionError,
)

__all__ = [
    "Actor", "ActorContext", "ActorError", "DivergenceError", "FencedError", "MessageTooLarge",
    "ProtocolError", "RegentError", "SupervisionError", "context", "current_rank", "endpoint",
]
