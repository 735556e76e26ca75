"""A local, single-member etcd on loopback that its owner faults: it can be SIGKILLed,
stopped, paused (SIGSTOP) and started again on the same ports and data, which is what a
chaos scenario's etcd faults do and what the journal's tests run against.

It can serve TLS (optionally requiring client certificates) and enforce etcd's user auth.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, Protocol
from urllib.parse import quote

from regent.chaos import faults
from regent.hipcore.ports import free_port

__all__ = ["LocalEtcd", "TlsFiles", "etcd_binary"]


def etcd_binary() -> str | None:
    return shutil.which(os.environ.get("REGENT_ETCD", "etcd"))


class TlsFiles(Protocol):
    """PEM paths of a CA, the server certificate it signed, and a client certificate."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _lost_its_port(log_path: Path, since: int) -> bool:
    """Did an etcd fail to start because its port was taken? Its log after byte `since` says.

    A port found free a moment ago (bind to port 0, close) may be bound by another process
    before etcd binds it: a first start then takes other ports and tries again."""
    try:
        with open(log_path, "rb") as f:
            f.seek(since)
            return b"address already in use" in f.read()
    except OSError:
        return False


class LocalEtcd:
    """One single-member etcd on 127.0.0.1 (or `host`); use as a context manager or call start()/close().

    `tls` serves https with its server certificate; `client_cert_auth` then also requires a
    client certificate signed by its CA. `auth_token_ttl_s` shortens how long an idle auth
    token stays valid (etcd's default is 300 s). `extra_args` go to etcd as they are."""

    def __init__(
        self,
        data_dir: str | Path | None = None,
        *,
        startup_timeout_s: float = 20.0,
        tls: TlsFiles | None = None,
        client_cert_auth: bool = False,
        auth_token_ttl_s: int | None = None,
        extra_args: Sequence[str] = (),
        host: str = "127.0.0.1",
    ) -> None:
        binary = etcd_binary()
        if binary is None:
            raise RuntimeError("etcd is not on PATH: install it with scripts/install_etcd.sh "
                               "(or set REGENT_ETCD to its path)")
        if client_cert_auth and tls is None:
            raise ValueError("client_cert_auth needs tls")
        self.binary = binary
        self.host = host  # clients reach it here (a namespace-host bridge address in multi-host tests)
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="regent-etcd-"))
        self.log_path = self.data_dir.with_name(self.data_dir.name + ".log")
        self.client_port, self.peer_port = free_port(), free_port()
        self.startup_timeout_s = startup_timeout_s
        self.tls = tls
        self.client_cert_auth = client_cert_auth
        self.auth_token_ttl_s = auth_token_ttl_s
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self._started = False  # once started, restarts keep the ports: clients know them
        self._lock = threading.Lock()  # start, reap and stop come from different threads

    @property
    def address(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def url(self) -> str:
        """Journal url of this server: etcd://127.0.0.1:PORT, or with TLS
        etcds://127.0.0.1:PORT?ca=...&cert=...&key=... (the client certificate included)."""
        if self.tls is None:
            return f"etcd://{self.address}"
        return self.tls_url(client_cert=True)

    def tls_url(self, *, client_cert: bool = True, ca: Path | None = None) -> str:
        """An etcds:// url of this server trusting `ca` (default: its own CA)."""
        if self.tls is None:
            raise ValueError(f"etcd on {self.address} does not serve TLS")
        query = f"ca={quote(str(ca or self.tls.ca))}"
        if client_cert:
            query += f"&cert={quote(str(self.tls.client_cert))}"
            query += f"&key={quote(str(self.tls.client_key))}"
        return f"etcds://{self.address}?{query}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    @property
    def running(self) -> bool:
        return self.pid is not None

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> LocalEtcd:
        with self._lock:
            if self.running:
                return self
            for attempt in range(3):
                logged = self.log_path.stat().st_size if self.log_path.exists() else 0
                try:
                    self._spawn()
                except RuntimeError:
                    self._kill()
                    # A first start takes other ports; a restart must keep its own.
                    if self._started or attempt == 2 or not _lost_its_port(self.log_path, logged):
                        raise
                    self.client_port, self.peer_port = free_port(), free_port()
                    continue
                self._started = True
                return self
            raise AssertionError("unreachable")

    def reap(self) -> bool:
        """True if etcd was running and has died (it is then ready to start again).
        False while a start is under way: that start reports its own failure."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self.proc is not None and self.proc.poll() is not None:
                self._reap()
                return True
            return False
        finally:
            self._lock.release()

    def kill(self) -> None:
        """SIGKILL the server (data kept)."""
        with self._lock:
            self._kill()

    def stop(self) -> None:
        """Stop the server gracefully, SIGKILL after 10 s (data kept)."""
        with self._lock:
            if self.proc is not None and self.proc.poll() is None:
                faults.release(self.proc.pid)  # a paused etcd cannot act on SIGTERM
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
            self._reap()

    def restart(self, *, down_s: float = 0.0) -> None:
        """Stop, optionally stay down for `down_s`, and start again on the same ports and data."""
        self.stop()
        if down_s:
            time.sleep(down_s)
        self.start()

    def pause(self) -> None:
        """SIGSTOP the server: connections stay open but nothing answers."""
        if self.pid is not None:
            faults.pause(self.pid, target="etcd")

    def resume(self) -> None:
        if self.pid is not None:
            faults.resume(self.pid, target="etcd")

    def close(self) -> None:
        """Kill the server and remove its data; its log too if the data dir was not given."""
        self.kill()
        shutil.rmtree(self.data_dir, ignore_errors=True)
        if self._own_dir:
            self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> LocalEtcd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- auth --------------------------------------------------------------------------

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
            self.host, self.client_port, secure=creds is not None, creds=creds
        )
        return pyetcd.MultiEndpointEtcd3Client(endpoints=[endpoint], timeout=5)

    # --- the process (callers hold the lock) --------------------------------------------

    @property
    def _scheme(self) -> str:
        return "http" if self.tls is None else "https"

    def _command(self) -> list[str]:
        client = f"{self._scheme}://{self.address}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        extra: list[str] = []
        if self.tls is not None:
            extra += ["--cert-file", str(self.tls.server_cert), "--key-file", str(self.tls.server_key)]
            if self.client_cert_auth:
                extra += ["--client-cert-auth", "--trusted-ca-file", str(self.tls.ca)]
        if self.auth_token_ttl_s is not None:
            extra += ["--auth-token-ttl", str(self.auth_token_ttl_s)]
        return [
            self.binary,
            "--name", "regent",
            "--data-dir", str(self.data_dir / "data"),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"regent={peer}",
            "--initial-cluster-state", "new",
            "--log-level", "warn",
            "--logger", "zap",
            *extra,
            *self.extra_args,
        ]  # fmt: skip

    def _spawn(self) -> None:
        self._log_file = open(self.log_path, "ab")  # closed in _reap
        self.proc = subprocess.Popen(self._command(), stdout=self._log_file, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self._wait_healthy(self.proc)

    def _wait_healthy(self, proc: subprocess.Popen[bytes]) -> None:
        health = f"{self._scheme}://{self.address}/health"
        context = None
        if self.tls is not None:
            context = ssl.create_default_context(cafile=str(self.tls.ca))
            context.load_cert_chain(str(self.tls.client_cert), str(self.tls.client_key))
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:  # e.g. a chaos schedule killed it while it started
                raise RuntimeError(f"etcd exited with {proc.returncode} while starting; see {self.log_path}")
            try:
                with urllib.request.urlopen(health, timeout=1, context=context) as resp:
                    if b'"health":"true"' in resp.read():
                        return
            except OSError:  # URLError, refused, reset, timed out
                pass
            time.sleep(0.05)
        raise RuntimeError(f"etcd on {self.address} not healthy after {self.startup_timeout_s} s; "
                           f"see {self.log_path}")

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # SIGKILL ends a paused etcd too
        self._reap()

    def _reap(self) -> None:
        if self.proc is not None:
            self.proc.wait(timeout=30)
            self.proc = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
