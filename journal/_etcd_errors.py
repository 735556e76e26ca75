"""What an etcd failure is: worth sending again (is_transient), a stale auth token, or a TLS
handshake refused on a certificate; and the gRPC details pyetcd buries in its own exceptions.

Classification only: nothing here sends a request or decides what to do about one.
"""

from __future__ import annotations

import grpc
from pyetcd import exceptions as etcd_exc

_TRANSIENT_CODES = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.ABORTED,
}
_TRANSIENT_TYPES = (
    etcd_exc.ConnectionFailedError,
    etcd_exc.ConnectionTimeoutError,
    etcd_exc.NoServerAvailableError,
    etcd_exc.InternalServerError,
)

# What etcd answers when it no longer accepts a token (it expired, etcd restarted, or the auth
# store changed since the token was issued); a fresh token fixes all three.
_STALE_TOKEN = ("invalid auth token", "revision of auth store is old")


def is_transient(exc: BaseException) -> bool:
    """True for errors that may go away if the same request is sent again."""
    if isinstance(exc, _TRANSIENT_TYPES):
        return True
    return isinstance(exc, grpc.RpcError) and exc.code() in _TRANSIENT_CODES


def rpc_error(exc: BaseException) -> grpc.RpcError | None:
    """The gRPC error behind `exc`: pyetcd raises its own exceptions from inside an
    `except grpc.RpcError`, which leaves the original (and its details) as the context."""
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            return None
        if isinstance(seen, grpc.RpcError) and hasattr(seen, "details"):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def details(exc: BaseException) -> str:
    rpc = rpc_error(exc)
    return (rpc.details() or "") if rpc is not None else ""


def describe(exc: BaseException) -> str:
    found = details(exc)
    text = f"{type(exc).__name__}: {exc}"
    return f"{text} ({found})" if found and found not in text else text


def token_rejected(exc: BaseException) -> bool:
    return isinstance(exc, grpc.RpcError) and any(
        marker in (exc.details() or "") for marker in _STALE_TOKEN
    )


def tls_refused(exc: BaseException) -> bool:
    """A TLS handshake that failed on a certificate: sending again cannot succeed."""
    found = details(exc)
    return any(
        marker in found
        for marker in ("CERTIFICATE_VERIFY_FAILED", "TSI_DATA_CORRUPTED", "BAD_CERTIFICATE",
                       "CERTIFICATE_REQUIRED", "Peer name", "WRONG_VERSION_NUMBER")
    )  # fmt: skip
