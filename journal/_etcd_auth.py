"""How one EtcdStore gets into etcd: the TLS channel credentials its url asks for, the auth
token every one of its clients sends (fetched again when etcd stops accepting it), and access
failures translated into JournalAccessDenied worded for a person. It sends no journal requests.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import grpc
import pyetcd
import structlog
from pyetcd import etcdrpc

from ._etcd_errors import details, is_transient, rpc_error, tls_refused, token_rejected
from .errors import JournalAccessDenied
from .etcd_target import ENV_CA, ENV_CERT, ENV_KEY, ENV_PASSWORD, EtcdTarget

log = structlog.get_logger("journal.etcd")

T = TypeVar("T")


class EtcdAuth:
    """The credentials and the shared auth token of one store's clients."""

    def __init__(self, target: EtcdTarget) -> None:
        self.target = target
        self.url = target.url
        self.credentials = self._channel_credentials()
        # The auth token every client of the store sends; replaced when etcd stops taking it.
        self._token_lock = threading.Lock()
        self._token: str | None = None
        self._clients: list[pyetcd.MultiEndpointEtcd3Client] = []

    def _channel_credentials(self) -> grpc.ChannelCredentials | None:
        tls = self.target.tls
        if tls is None:
            return None
        pem: dict[str, bytes | None] = {}
        for name, what in (("ca", "CA certificate"), ("cert", "client certificate"),
                           ("key", "client key")):  # fmt: skip
            path = getattr(tls, name)
            if path is None:
                pem[name] = None
                continue
            try:
                pem[name] = path.read_bytes()
            except OSError as exc:
                raise JournalAccessDenied(
                    f"etcd journal {self.url}: cannot read the {what} {path} (from "
                    f"{tls.source(name)}): {exc.strerror or exc}; point {tls.source(name)} at a "
                    "readable PEM file"
                ) from None
            if b"-----BEGIN" not in pem[name]:
                raise JournalAccessDenied(
                    f"etcd journal {self.url}: the {what} {path} (from {tls.source(name)}) is "
                    "not a PEM file; give the PEM file etcd's certificates were made with"
                )
        return grpc.ssl_channel_credentials(pem["ca"], pem["key"], pem["cert"])

    def attach(self, client: pyetcd.MultiEndpointEtcd3Client) -> None:
        """Have `client` send the current token, and every token that replaces it."""
        with self._token_lock:
            client.metadata = None if self._token is None else (("token", self._token),)
            self._clients.append(client)

    def authenticate(self, client: pyetcd.MultiEndpointEtcd3Client, stale: str | None) -> None:
        """Get a fresh auth token through `client` and hand it to every attached client,
        unless another thread already replaced the token `stale` that etcd refused."""
        user, password = self.target.user, self.target.password
        if user is None or password is None:
            return
        with self._token_lock:
            if self._token != stale:
                return
            try:
                token = self._fetch_token(client, user, password)
            except grpc.RpcError as exc:
                if "authentication is not enabled" in (exc.details() or ""):
                    log.warning(
                        "etcd does not have auth enabled; connecting without a user",
                        etcd=self.url,
                    )
                    return
                raise
            self._token = token
            for each in self._clients:
                each.metadata = (("token", token),)

    @staticmethod
    def _fetch_token(client: pyetcd.MultiEndpointEtcd3Client, user: str, password: str) -> str:
        # Asked of each endpoint in turn, the one in use first: pyetcd fails over only inside
        # its own request methods, and it has none for Authenticate. Any member's token is
        # good cluster-wide (etcd applies each authentication through raft).
        request = etcdrpc.AuthenticateRequest(name=user, password=password)
        endpoints = [client.endpoint_in_use]
        endpoints += [ep for ep in client.endpoints.values() if ep is not endpoints[0]]
        for i, endpoint in enumerate(endpoints):
            try:
                return etcdrpc.AuthStub(endpoint.channel).Authenticate(request, client.timeout).token
            except grpc.RpcError as exc:
                if i == len(endpoints) - 1 or not is_transient(exc):
                    raise
        raise AssertionError("unreachable")

    def with_token(self, client: pyetcd.MultiEndpointEtcd3Client, fn: Callable[[], T]) -> T:
        """Run `fn`; if etcd refuses the token it sent, authenticate again and run it once more."""
        sent = self._token
        try:
            return fn()
        except grpc.RpcError as exc:
            if self.target.user is None or not token_rejected(exc):
                raise
            log.info("etcd refused the auth token; authenticating again", etcd=self.url,
                     user=self.target.user, reason=exc.details())  # fmt: skip
        self.authenticate(client, sent)
        return fn()

    def close(self) -> None:
        """Close every attached client."""
        with self._token_lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()

    def denied(self, exc: BaseException, what: str) -> JournalAccessDenied | None:
        """The access error `exc` stands for, worded for a person, or None if it is not one."""
        rpc = rpc_error(exc)
        if rpc is None:
            return None
        code, found = rpc.code(), rpc.details() or ""
        user = self.target.user
        if "invalid user ID or password" in found:
            return JournalAccessDenied(
                f"etcd at {self.url} refused user {user!r}: wrong password or no such user "
                f"({found}); set ${ENV_PASSWORD} to that user's password, or fix ?user="
            )
        if "user name is empty" in found:
            return JournalAccessDenied(
                f"etcd at {self.url} has auth enabled and needs a user ({found}): add "
                f"?user=NAME to the journal url and export ${ENV_PASSWORD}"
            )
        if code == grpc.StatusCode.PERMISSION_DENIED:
            return JournalAccessDenied(
                f"etcd at {self.url} denied user {user!r} the {what} ({found}): grant its role "
                "read-write on the journal's keys, e.g. `etcdctl role grant-permission ROLE "
                "--prefix=true readwrite /regent/`"
            )
        if code == grpc.StatusCode.UNAUTHENTICATED or token_rejected(rpc):
            return JournalAccessDenied(
                f"etcd at {self.url} did not accept a fresh auth token for user {user!r} "
                f"({found}); check the user exists and etcd's --auth-token setting"
            )
        return None

    def tls_error(self, exc: BaseException) -> JournalAccessDenied | None:
        """The TLS refusal `exc` stands for, worded for a person, or None if it is not one."""
        tls = self.target.tls
        found = details(exc)
        if tls is None or not tls_refused(exc):
            return None
        host = self.target.addresses[0][0]
        if "CERTIFICATE_VERIFY_FAILED" in found or "Peer name" in found:
            trusted = "the system's CA roots" if tls.ca is None else f"the CA in {tls.ca}"
            return JournalAccessDenied(
                f"etcd at {self.url} presented a certificate that {trusted} does not accept "
                f"({found}); set {tls.source('ca')} to the CA that signed etcd's --cert-file, "
                f"and check that certificate names {host}"
            )
        if "WRONG_VERSION_NUMBER" in found:
            return JournalAccessDenied(
                f"etcd at {self.url} does not speak TLS ({found}); if it serves http, use "
                f"etcd://{self.target.address_text} with ${ENV_CA}, ${ENV_CERT} and ${ENV_KEY} "
                "unset"
            )
        if tls.cert is None:
            return JournalAccessDenied(
                f"etcd at {self.url} refused the TLS connection ({found}): it requires a "
                f"client certificate (--client-cert-auth); give cert= and key= in the url, or "
                f"set ${ENV_CERT} and ${ENV_KEY}"
            )
        return JournalAccessDenied(
            f"etcd at {self.url} refused the client certificate {tls.cert} ({found}): it must "
            "be signed by the CA in etcd's --trusted-ca-file"
        )
