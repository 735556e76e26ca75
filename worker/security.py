"""Who may talk to a regent process: authentication for every bound socket.

Loopback sockets authenticate with ZMQ PLAIN against a per-user secret file (like
a notebook token); any non-loopback bind requires CURVE keys from `regent keys
init`. Payloads are unpickled only after the transport authenticated the peer.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path

import structlog
import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

log = structlog.get_logger("regent.security")

_USER = b"regent"


def regent_home() -> Path:
    """Where regent keeps per-user state: $REGENT_HOME, else ~/.regent."""
    home = Path(os.environ.get("REGENT_HOME") or Path.home() / ".regent")
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    return home


def local_secret() -> bytes:
    """The per-user secret for loopback peers; created on first use, mode 0600."""
    path = regent_home() / "secret"
    if not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        try:
            os.link(tmp, path)  # first writer wins; others read its secret
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return path.read_text().strip().encode()


def keys_dir() -> Path:
    return regent_home() / "keys"


def init_keys(force: bool = False) -> Path:
    """Create the cluster's CURVE keypair and authorise its public key."""
    d = keys_dir()
    secret_file = d / "regent.key_secret"
    if secret_file.exists() and not force:
        return d
    (d / "authorized").mkdir(parents=True, exist_ok=True, mode=0o700)
    public_file, secret_file = zmq.auth.create_certificates(str(d), "regent")
    os.chmod(secret_file, 0o600)
    (d / "authorized" / "regent.key").write_bytes(Path(public_file).read_bytes())
    return d


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Credentials:
    """How this process authenticates: PLAIN secret always, CURVE keys when secure."""

    secret: bytes
    curve_public: bytes | None = None
    curve_secret: bytes | None = None

    @property
    def secure(self) -> bool:
        return self.curve_secret is not None


def load_credentials(secure: bool | None = None) -> Credentials:
    """Credentials for this process. secure=None means: CURVE if REGENT_SECURE=1."""
    if secure is None:
        secure = os.environ.get("REGENT_SECURE", "") == "1"
    if not secure:
        return Credentials(local_secret())
    secret_file = keys_dir() / "regent.key_secret"
    if not secret_file.exists():
        raise RuntimeError(
            f"CURVE keys not found at {secret_file}: run `regent keys init` (and copy "
            f"{keys_dir()} to every host of the cluster)"
        )
    public, secret = zmq.auth.load_certificate(str(secret_file))
    return Credentials(local_secret(), public, secret)


_auth_lock = threading.Lock()
_authenticators: dict[int, ThreadAuthenticator] = {}


def _ensure_authenticator(ctx: zmq.Context, creds: Credentials) -> None:
    with _auth_lock:
        if id(ctx) in _authenticators:
            return
        auth = ThreadAuthenticator(ctx, log=_QuietLog())
        auth.start()
        auth.configure_plain(domain="*", passwords={_USER.decode(): creds.secret.decode()})
        if creds.secure:
            auth.configure_curve(domain="*", location=str(keys_dir() / "authorized"))
        _authenticators[id(ctx)] = auth


def stop_authenticator(ctx: zmq.Context) -> None:
    with _auth_lock:
        auth = _authenticators.pop(id(ctx), None)
    if auth is not None:
        auth.stop()


def secure_server(sock: zmq.Socket, creds: Credentials, host: str) -> None:
    """Configure a socket about to bind on host."""
    if not is_loopback(host) and not creds.secure:
        raise RuntimeError(
            f"refusing to bind {host} without CURVE keys: run `regent keys init` and set "
            "REGENT_SECURE=1 (plaintext is allowed on loopback only)"
        )
    _ensure_authenticator(sock.context, creds)
    if creds.secure:
        sock.curve_secretkey = creds.curve_secret
        sock.curve_publickey = creds.curve_public
        sock.curve_server = True
    else:
        sock.plain_server = True


def secure_client(sock: zmq.Socket, creds: Credentials) -> None:
    """Configure a socket about to connect to a regent server."""
    if creds.secure:
        sock.curve_secretkey = creds.curve_secret
        sock.curve_publickey = creds.curve_public
        sock.curve_serverkey = creds.curve_public
    else:
        sock.plain_username = _USER
        sock.plain_password = creds.secret


class _QuietLog:
    """Adapter so the authenticator's refusals go to structlog with the peer."""

    def debug(self, *a, **k) -> None:
        pass

    def info(self, msg, *args, **k) -> None:
        text = msg % args if args else msg
        if "DENIED" in text or "denied" in text.lower():
            log.warning("peer refused by authentication", detail=text)

    warning = info
    error = info
    exception = info
