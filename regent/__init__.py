"""regent: a fault-tolerant single-controller runtime for PyTorch clusters.

    from regent import Session, Actor, endpoint, RestartPolicy

The parts are subpackages: regent.controller, regent.worker, regent.journal, regent.hipcore,
regent.chaos. In the wheel they are folders inside regent/; in a checkout they stay top-level
folders and regent/ holds a relative symlink to each (regent/controller -> ../controller), so
that the checkout imports them under the regent.* names only, exactly as installed.

The names below are loaded on first use, so that `python -m regent.worker.proc` or
`import regent.hipcore` does not import the controller.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> the public module it comes from.
_EXPORTS = {
    **dict.fromkeys(
        ("Actor", "ActorError", "ActorMesh", "DivergenceError", "Endpoint", "FencedError",
         "Future", "HostMesh", "LeadershipLost", "MeshFailure", "MessageTooLarge", "NonDeterminismError",
         "Point", "ProcMesh", "RegentError", "Session", "SupervisionError", "ValueMesh",
         "concurrent_endpoint", "context", "current_rank", "current_size", "endpoint"),
        "regent.controller"),
    "RestartPolicy": "regent.worker.supervision",
    **dict.fromkeys(("Accumulator", "ActorMeshRef", "Channel", "Port", "PortReceiver", "ProcMeshRef",
                     "current_actor_name", "get_or_spawn_controller", "send", "this_host", "this_proc"),
                    "regent.worker"),
}

__all__ = [
    "Accumulator", "Actor", "ActorError", "ActorMesh", "ActorMeshRef", "Channel", "Port", "PortReceiver",
    "ProcMeshRef", "current_actor_name", "get_or_spawn_controller", "send", "this_host", "this_proc", "DivergenceError", "Endpoint", "FencedError", "Future",
    "HostMesh", "LeadershipLost", "MeshFailure", "MessageTooLarge", "NonDeterminismError", "Point", "ProcMesh",
    "RegentError", "RestartPolicy", "Session", "SupervisionError", "ValueMesh", "concurrent_endpoint",
    "context", "current_rank", "current_size", "endpoint",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'regent' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:
    from regent.controller import (
        Actor,
        ActorError,
        ActorMesh,
        DivergenceError,
        Endpoint,
        FencedError,
        Future,
        HostMesh,
        LeadershipLost,
        MeshFailure,
        MessageTooLarge,
        NonDeterminismError,
        Point,
        ProcMesh,
        RegentError,
        Session,
        SupervisionError,
        ValueMesh,
        concurrent_endpoint,
        context,
        current_rank,
        current_size,
        endpoint,
    )
    from regent.worker import (
        Accumulator,
        ActorMeshRef,
        Channel,
        Port,
        PortReceiver,
        ProcMeshRef,
        current_actor_name,
        get_or_spawn_controller,
        send,
        this_host,
        this_proc,
    )
    from regent.worker.supervision import RestartPolicy
