"""Backend discovery: which runtime (ROCm/HIP, CUDA or the CPU emulation) hipcore drives, and why.

ROCm and CUDA builds of PyTorch both expose the GPU as the ``cuda`` device type;
``torch.version.hip`` tells them apart. Only this module decides the backend;
everything else asks ``backend()``.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any, Literal

from regent.hipcore.errors import BackendUnavailableError

BackendName = Literal["cpu", "cuda", "hip"]
BACKEND_ENV = "REGENT_HIPCORE_BACKEND"
BACKEND_NAMES: tuple[BackendName, ...] = ("cpu", "cuda", "hip")


@dataclass(frozen=True)
class BackendInfo:
    """The backend in use and the evidence for it."""

    name: BackendName
    reason: str
    forced: bool
    device_count: int
    torch_version: str | None

    @property
    def is_gpu(self) -> bool:
        return self.name != "cpu"


def import_torch() -> Any | None:
    """Return the torch module, or None when it is not installed."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def require_torch(what: str) -> Any:
    torch = import_torch()
    if torch is None:
        raise BackendUnavailableError(
            f"{what} needs PyTorch, which is not installed in this interpreter "
            "(pip install torch)"
        )
    return torch


def _gpu_flavour(torch: Any) -> BackendName | None:
    if getattr(torch.version, "hip", None):
        return "hip"
    if getattr(torch.version, "cuda", None):
        return "cuda"
    return None


def detect_backend(forced: str | None = None) -> BackendInfo:
    """Decide the backend from ``forced`` (or ``$REGENT_HIPCORE_BACKEND``) and what torch sees.

    Forcing ``cpu`` never imports torch. Forcing a GPU backend that this machine
    cannot run raises ``BackendUnavailableError`` naming what is missing.
    """
    if forced is None:
        forced = os.environ.get(BACKEND_ENV) or None
    if forced is not None:
        forced = forced.strip().lower()
        if forced not in BACKEND_NAMES:
            raise BackendUnavailableError(
                f"{BACKEND_ENV}={forced!r} is not a backend; use one of {', '.join(BACKEND_NAMES)}"
            )
    if forced == "cpu":
        return BackendInfo("cpu", f"forced by {BACKEND_ENV}=cpu", True, 1, None)

    torch = import_torch()
    if torch is None:
        if forced is not None:
            raise BackendUnavailableError(
                f"{BACKEND_ENV}={forced} but PyTorch is not installed; install a "
                f"{'ROCm' if forced == 'hip' else 'CUDA'} build of torch or use {BACKEND_ENV}=cpu"
            )
        return BackendInfo("cpu", "PyTorch is not installed", False, 1, None)

    flavour = _gpu_flavour(torch)
    version = str(torch.__version__)
    if forced is not None and flavour != forced:
        built = (
            f"ROCm/HIP {torch.version.hip}" if flavour == "hip"
            else f"CUDA {torch.version.cuda}" if flavour == "cuda" else "CPU only"
        )
        raise BackendUnavailableError(
            f"{BACKEND_ENV}={forced} but torch {version} is built for {built}; install a "
            f"{'ROCm' if forced == 'hip' else 'CUDA'} build of torch or unset {BACKEND_ENV}"
        )
    if flavour is None:
        return BackendInfo("cpu", f"torch {version} is a CPU-only build", False, 1, version)

    toolkit = torch.version.hip if flavour == "hip" else torch.version.cuda
    visible_var = "HIP_VISIBLE_DEVICES" if flavour == "hip" else "CUDA_VISIBLE_DEVICES"
    if not torch.cuda.is_available():
        why = (
            f"torch {version} is built for {flavour.upper()} {toolkit}, yet "
            f"torch.cuda.is_available() is False (no GPU or driver visible; "
            f"{visible_var}={os.environ.get(visible_var, '<unset>')})"
        )
        if forced is not None:
            raise BackendUnavailableError(
                f"{BACKEND_ENV}={forced}: {why}; run on a GPU machine or use {BACKEND_ENV}=cpu"
            )
        return BackendInfo("cpu", why, False, 1, version)

    count = int(torch.cuda.device_count())
    why = f"torch {version} built for {flavour.upper()} {toolkit} sees {count} GPU(s)"
    if forced is not None:
        why = f"forced by {BACKEND_ENV}={forced}; {why}"
    return BackendInfo(flavour, why, forced is not None, count, version)


@functools.cache
def backend() -> BackendInfo:
    """The backend this process uses (decided once, on first call)."""
    return detect_backend()


def reset_backend() -> None:
    """Forget the cached decision so the next ``backend()`` re-reads the environment."""
    backend.cache_clear()
