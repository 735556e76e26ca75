"""A real etcd server for tests: free loopback ports, a temporary data dir, full lifecycle.

`EtcdServer` can be killed, stopped, restarted on the same port and data dir, and paused
(SIGSTOP) to simulate a hung server; it can serve TLS (optionally requiring client certificates)
and enforce etcd's user auth. Suites skip with a clear reason if etcd is not installed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from chaos.etcd import lost_its_port

if TYPE_CHECKING:
    from tests.support.certs import Pki

ETCD_BINARY = os.environ.get("REGENT_ETCD", "etcd")
MISSING_REASON = (
    f"etcd binary {ETCD_BINARY!r} not found on PATH; install it with scripts/install_etcd.sh "
    "(or set REGENT_ETCD to its path)"
)


def etcd_available() -> bool:
    return shutil.which(ETCD_BINARY) is not None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def held_port(port: int) -> Iterator[None]:
    """Keep a loopback port bound and listening: what another process grabbing it looks like."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        yield


class EtcdServer:
    """One single-member etcd on 127.0.0.1; use as a context manager or call start()/stop()."""

    def __init__(
        self,
        data_dir: str | Path | None = None,
        *,
        startup_timeout_s: float = 15.0,
        tls: Pki | None = None,
        client_cert_auth: bool = False,
        auth_token_ttl_s: int | None = None,
    ):
        """`tls` serves https with its server certificate; `client_cert_auth` then also
        requires a client certificate signed by its CA. `auth_token_ttl_s` shortens how long
        an idle auth token stays valid (etcd's default is 300 s)."""
        if not etcd_available():
            raise RuntimeError(MISSING_REASON)
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="regent-etcd-"))
        self.client_port = free_port()
        self.peer_port = free_port()
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.data_dir.with_name(self.data_dir.name + ".log")
        self._log_file = None
        self._started = False
        if client_cert_auth and tls is None:
            raise ValueError("client_cert_auth needs tls")
        self.tls = tls
        self.client_cert_auth = client_cert_auth
        self.auth_token_ttl_s = auth_token_ttl_s

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def url(self) -> str:
        """Journal url of this server: etcd://127.0.0.1:PORT, or with TLS
        etcds://127.0.0.1:PORT?ca=...&cert=...&key=... (the client certificate included)."""
        if self.tls is None:
            return f"etcd://{self.address}"
        return self.tls_url(client_cert=True)

    def tls_url(self, *, client_cert: bool = True, ca: Path | None = None) -> str:
        """An etcds:// url of this server trusting `ca` (default: its own CA)."""
        assert self.tls is not None, "this server does not serve TLS"
        query = f"ca={quote(str(ca or self.tls.ca))}"
        if client_cert:
            query += f"&cert={quote(str(self.tls.client_cert))}"
            query += f"&key={quote(str(self.tls.client_key))}"
        return f"etcds://{self.address}?{query}"

    @property
    def _scheme(self) -> str:
        return "http" if self.tls is None else "https"

    def _ssl_context(self) -> ssl.SSLContext | None:
        if self.tls is None:
            return None
        context = ssl.create_default_context(cafile=str(self.tls.ca))
        context.load_cert_chain(str(self.tls.client_cert), str(self.tls.client_key))
        return context

    def _command(self) -> list[str]:
        client = f"{self._scheme}://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        extra: list[str] = []
        if self.tls is not None:
            extra += ["--cert-file", str(self.tls.server_cert),
                      "--key-file", str(self.tls.server_key)]  # fmt: skip
            if self.client_cert_auth:
                extra += ["--client-cert-auth", "--trusted-ca-file", str(self.tls.ca)]
        if self.auth_token_ttl_s is not None:
            extra += ["--auth-token-ttl", str(self.auth_token_ttl_s)]
        return [
            ETCD_BINARY,
            "--name", "regent-test",
            "--data-dir", str(self.data_dir / "data"),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"regent-test={peer}",
            "--initial-cluster-state", "new",
            "--log-level", "warn",
            "--logger", "zap",
            *extra,
        ]  # fmt: skip

    def start(self) -> EtcdServer:
        if self.proc is not None and self.proc.poll() is None:
            return self
        first = not self._started
        for attempt in range(3):
            self._log_file = open(self.log_path, "ab")  # closed in _reap
            logged = self.log_path.stat().st_size
            self.proc = subprocess.Popen(
                self._command(), stdout=self._log_file, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
            try:
                self.wait_healthy()
            except RuntimeError:
                self.kill()
                # A first start takes other ports; a restart must keep its own.
                if not (first and attempt < 2 and lost_its_port(self.log_path, logged)):
                    raise
                self.client_port, self.peer_port = free_port(), free_port()
                continue
            self._started = True
            return self
        raise AssertionError("unreachable")

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        health = f"{self._scheme}://{self.address}/health"
        context = self._ssl_context()
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"etcd exited with {self.proc.returncode} while starting; see {self.log_path}"
                )
            try:
                with urllib.request.urlopen(health, timeout=1, context=context) as resp:
                    if b'"health":"true"' in resp.read():
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.05)
        raise RuntimeError(
            f"etcd on {self.address} not healthy after {self.startup_timeout_s}s; "
            f"see {self.log_path}"
        )

    def _admin_client(self) -> Any:
        """A pyetcd client of this server with no user, over TLS if it serves TLS."""
        import grpc
        import pyetcd

        creds = None
        if self.tls is not None:
            creds = grpc.ssl_channel_credentials(
                self.tls.ca.read_bytes(),
                self.tls.client_key.read_bytes(),
                self.tls.client_cert.read_bytes(),
            )
        endpoint = pyetcd.Endpoint(
            "127.0.0.1", self.client_port, secure=creds is not None, creds=creds
        )
        return pyetcd.MultiEndpointEtcd3Client(endpoints=[endpoint], timeout=5)

    def enable_auth(
        self, user: str, password: str, *, prefix: bytes = b"/regent/", root_password: str = "root-pw"
    ) -> None:
        """Create `root` and `user` (read-write on keys under `prefix` only), then turn auth on."""
        from pyetcd import etcdrpc

        range_end = prefix[:-1] + bytes([prefix[-1] + 1])
        client = self._admin_client()
        try:
            auth = client.authstub
            auth.UserAdd(etcdrpc.AuthUserAddRequest(name="root", password=root_password), 5)
            auth.RoleAdd(etcdrpc.AuthRoleAddRequest(name="root"), 5)
            auth.UserGrantRole(etcdrpc.AuthUserGrantRoleRequest(user="root", role="root"), 5)
            auth.UserAdd(etcdrpc.AuthUserAddRequest(name=user, password=password), 5)
            auth.RoleAdd(etcdrpc.AuthRoleAddRequest(name=user), 5)
            permission = etcdrpc.Permission(
                permType=etcdrpc.Permission.READWRITE, key=prefix, range_end=range_end
            )
            auth.RoleGrantPermission(
                etcdrpc.AuthRoleGrantPermissionRequest(name=user, perm=permission), 5
            )
            auth.UserGrantRole(etcdrpc.AuthUserGrantRoleRequest(user=user, role=user), 5)
            auth.AuthEnable(etcdrpc.AuthEnableRequest(), 5)
        finally:
            client.close()

    def _reap(self) -> None:
        if self.proc is not None:
            self.proc.wait(timeout=30)
            self.proc = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def kill(self) -> None:
        """SIGKILL the server (data dir kept)."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self._reap()

    def stop(self) -> None:
        """Stop the server gracefully (data dir kept)."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._reap()

    def restart(self, *, down_s: float = 0.0) -> None:
        """Stop, optionally stay down for `down_s`, and start again on the same port and data."""
        self.stop()
        if down_s:
            time.sleep(down_s)
        self.start()

    def pause(self) -> None:
        """SIGSTOP the server: connections stay open but nothing answers."""
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGCONT)

    def close(self) -> None:
        """Kill the server and remove its data dir if this object created it."""
        self.kill()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> EtcdServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
