"""Workers: host agents, procs, and the actors they host.

The controller talks to workers; workers never import the controller.
"""

from regent.worker.actor import (
    Actor,
    ActorContext,
    concurrent_endpoint,
    context,
    current_actor_name,
    current_rank,
    current_size,
    endpoint,
)
from regent.worker.errors import (
    ActorError,
    DeadlockError,
    DivergenceError,
    FencedError,
    MessageTooLarge,
    ProtocolError,
    RegentError,
    SupervisionError,
)
from regent.worker.ports import Accumulator, Channel, Port, PortReceiver
from regent.worker.remote import (
    ActorMeshRef,
    ProcMeshRef,
    RemoteFuture,
    get_or_spawn_controller,
    send,
    this_host,
    this_proc,
)
from regent.worker.shape import Point, ValueMesh
from regent.worker.supervision import RestartPolicy

__all__ = [
    "Accumulator", "Actor", "ActorContext", "ActorError", "ActorMeshRef", "Channel", "DeadlockError", "DivergenceError",
    "FencedError", "MessageTooLarge", "Point", "Port", "PortReceiver", "ProcMeshRef", "ProtocolError", "RegentError", "RemoteFuture", "RestartPolicy", "SupervisionError",
    "ValueMesh", "concurrent_endpoint", "context", "current_actor_name", "current_rank", "current_size", "endpoint",
    "get_or_spawn_controller", "send", "this_host",
    "this_proc",
]
