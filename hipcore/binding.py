"""Per-proc device binding: which GPU(s) a proc sees, expressed as environment variables.

The host agent calls ``child_env`` (or ``proc_env``) when it spawns proc ``i`` so
that ``spawn_procs(per_host={"gpus": N})`` maps proc ``i`` to GPUs
``[i*N, (i+1)*N)`` of the host; inside the proc, ``hipcore.current_device()``
reads the same variables back. Pure functions of their arguments: no torch here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from regent.hipcore.backend import BACKEND_ENV, BACKEND_NAMES, BackendName
from regent.hipcore.backend import backend as detected_backend

CPU_DEVICE_ENV = "REGENT_CPU_DEVICE"
PROC_DEVICES_ENV = "REGENT_PROC_DEVICES"
VISIBLE_DEVICES_ENV: dict[BackendName, str] = {
    "cuda": "CUDA_VISIBLE_DEVICES",
    "hip": "HIP_VISIBLE_DEVICES",
    "cpu": CPU_DEVICE_ENV,
}
# Every variable a binding may set; child_env removes inherited ones first so that
# a ROCm proc is never filtered twice by a stray CUDA_VISIBLE_DEVICES.
BINDING_VARS: tuple[str, ...] = (
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    CPU_DEVICE_ENV,
    PROC_DEVICES_ENV,
    BACKEND_ENV,
)


def _parse_ids(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [part.strip() for part in value.split(",") if part.strip()]


def proc_devices(
    proc_index: int, gpus_per_proc: int, host_devices: list[str] | None = None
) -> list[str]:
    """The host device ids proc ``proc_index`` owns: slice ``[i*n, (i+1)*n)`` of ``host_devices``."""
    if proc_index < 0 or gpus_per_proc < 0:
        raise ValueError(
            f"proc_index ({proc_index}) and gpus_per_proc ({gpus_per_proc}) must be >= 0"
        )
    first = proc_index * gpus_per_proc
    wanted = range(first, first + gpus_per_proc)
    if host_devices is None:
        return [str(i) for i in wanted]
    if wanted and wanted[-1] >= len(host_devices):
        raise ValueError(
            f"proc {proc_index} with {gpus_per_proc} GPU(s) each needs host devices "
            f"{first}..{wanted[-1]}, but only {len(host_devices)} are visible "
            f"({','.join(host_devices) or 'none'}); spawn fewer procs or fewer GPUs per proc"
        )
    return [host_devices[i] for i in wanted]


def proc_env(
    proc_index: int,
    gpus_per_proc: int = 1,
    backend: str | None = None,
    *,
    parent_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Environment variables that bind proc ``proc_index`` to its device(s).

    - ``cuda``: ``CUDA_VISIBLE_DEVICES=<ids>``; ``hip``: ``HIP_VISIBLE_DEVICES=<ids>``;
      ``cpu``: ``REGENT_CPU_DEVICE=<ids>`` (logical CPU devices, same numbering).
    - ``REGENT_PROC_DEVICES=<ids>`` (the host-level ids, for logs) and
      ``REGENT_HIPCORE_BACKEND=<backend>`` so the proc does not re-detect differently.
    - If the parent is itself restricted (its own ``*_VISIBLE_DEVICES``), the ids are
      taken from that list, so proc 0 of an agent limited to ``4,5`` gets ``4``.
    - ``gpus_per_proc=0`` on a GPU backend gives a proc with no GPU: it runs the CPU backend.
    """
    env = os.environ if parent_env is None else parent_env
    name = backend if backend is not None else detected_backend().name
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown backend {name!r}; use one of {', '.join(BACKEND_NAMES)}")
    var = VISIBLE_DEVICES_ENV[name]  # type: ignore[index]
    if name != "cpu" and gpus_per_proc == 0:
        return {
            var: "",
            CPU_DEVICE_ENV: str(proc_index),
            PROC_DEVICES_ENV: "",
            BACKEND_ENV: "cpu",
        }
    host_devices = _parse_ids(env.get(var)) if name != "cpu" else None
    ids = ",".join(proc_devices(proc_index, gpus_per_proc, host_devices))
    return {var: ids, PROC_DEVICES_ENV: ids, BACKEND_ENV: name}


def child_env(
    base_env: Mapping[str, str],
    proc_index: int,
    gpus_per_proc: int = 1,
    backend: str | None = None,
) -> dict[str, str]:
    """A complete environment for a proc: ``base_env`` minus inherited bindings, plus ``proc_env``."""
    binding = proc_env(proc_index, gpus_per_proc, backend, parent_env=base_env)
    env = {k: v for k, v in base_env.items() if k not in BINDING_VARS}
    env.update(binding)
    return env


def bound_cpu_device() -> int:
    """The logical CPU device index this proc was bound to (0 when unbound)."""
    ids = _parse_ids(os.environ.get(CPU_DEVICE_ENV))
    if not ids:
        return 0
    try:
        return int(ids[0])
    except ValueError:
        raise ValueError(
            f"{CPU_DEVICE_ENV}={os.environ[CPU_DEVICE_ENV]!r} is not a list of integers"
        ) from None


def bound_physical_devices() -> list[str]:
    """Host-level device ids of this proc (from ``REGENT_PROC_DEVICES``), empty when unbound."""
    return _parse_ids(os.environ.get(PROC_DEVICES_ENV)) or []
