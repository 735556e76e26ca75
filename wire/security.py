"""Who may talk to a regent process: authentication for every bound socket, and the
per-user files (home, secret) that authentication rests on.

Every socket is ZMQ CURVE. On loopback the keys are derived from a per-user secret in
$REGENT_HOME/secret (like a notebook token): a client checks that the server holds the
secret before it sends anything, the server checks the client the same way, and the
secret itself never crosses a socket. Any non-loopback bind requires the cluster keys
from `regent keys init`. Payloads are unpickled only after the transport authenticated
the peer. A home or secret that another user owns or can write is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
import stat
import threading
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import structlog
import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

log = structlog.get_logger("regent.security")

# Labels that make the server's and the client's loopback keypairs differ (one secret, two keys).
_SERVER_LABEL = b"regent loopback curve server key v1"
_CLIENT_LABEL = b"regent loopback curve client key v1"


class UnsafePermissions(PermissionError):
    """A file or directory regent trusts is owned by another user, or others may write it."""


def _mode(st: os.stat_result) -> str:
    return oct(stat.S_IMODE(st.st_mode))


def _owner_problem(path: Path, st: os.stat_result, what: str) -> str | None:
    me = os.geteuid()
    if st.st_uid == me:
        return None
    return (f"{what} {path} belongs to uid {st.st_uid}, not to you (uid {me}): its owner can "
            "read and replace what regent keeps there")


def ensure_private_dir(path: Path, what: str = "REGENT_HOME") -> Path:
    """Create `path` mode 0700, or check an existing one: refused (UnsafePermissions) if
    another user owns it or group/others may write it; made 0700 if others may only read it."""
    try:
        path.mkdir(parents=True, mode=0o700)
    except FileExistsError:
        pass
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePermissions(f"{what} {path} is not a directory: set REGENT_HOME to a directory of your own")
    problem = _owner_problem(path, st, what)
    if problem:
        raise UnsafePermissions(f"{problem}. Use a directory of your own (set REGENT_HOME), or "
                                f"`chown {os.geteuid()} {path} && chmod 700 {path}`")
    if st.st_mode & 0o022:
        raise UnsafePermissions(
            f"{what} {path} is writable by group or others (mode {_mode(st)}): they could "
            f"replace its secret, keys or journal. Fix it with `chmod 700 {path}` (and check "
            "what it holds), or set REGENT_HOME to a private directory")
    if st.st_mode & 0o077:
        os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)
        log.warning("made the regent home private (it was readable by others)", path=str(path),
                    was=_mode(st), now="0o700")
    return path


def check_secret_file(path: Path) -> None:
    """A secret must be ours and readable by no one else (else it may have leaked)."""
    st = os.stat(path)
    problem = _owner_problem(path, st, "secret file")
    if problem:
        raise UnsafePermissions(f"{problem}. Remove it (`rm {path}`; a new one is made) and "
                                "restart this user's host agents")
    if st.st_mode & 0o077:
        raise UnsafePermissions(
            f"secret file {path} is open to group or others (mode {_mode(st)}), so it may have "
            f"been read: remove it (`rm {path}`; a new one is made on the next start) and restart "
            "this user's host agents; `chmod 600` it only if you know no one read it")


def regent_home() -> Path:
    """Where regent keeps per-user state: $REGENT_HOME, else ~/.regent; mode 0700, ours."""
    return ensure_private_dir(Path(os.environ.get("REGENT_HOME") or Path.home() / ".regent"))


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
    check_secret_file(path)
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


def _derived_keypair(secret: bytes, label: bytes) -> tuple[bytes, bytes]:
    """A CURVE keypair (z85 public, z85 secret) that only a holder of `secret` can compute."""
    raw = hmac.new(secret, label, hashlib.sha256).digest()
    secret_key = z85.encode(raw)
    return zmq.curve_public(secret_key), secret_key


@dataclass(frozen=True)
class LoopbackKeys:
    """The two keypairs every holder of the per-user secret derives: one a server binds
    with, one a client connects with. A client pins the server's public key, the server
    admits only the client's: each side proves it holds the secret, and nothing of it is sent."""

    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes

    @classmethod
    def derive(cls, secret: bytes) -> LoopbackKeys:
        sp, ss = _derived_keypair(secret, _SERVER_LABEL)
        cp, cs = _derived_keypair(secret, _CLIENT_LABEL)
        return cls(sp, ss, cp, cs)


@dataclass(frozen=True)
class Credentials:
    """How this process authenticates: the cluster's CURVE keys when secure, else the
    loopback keys derived from the per-user secret."""

    secret: bytes
    curve_public: bytes | None = None
    curve_secret: bytes | None = None

    @property
    def secure(self) -> bool:
        return self.curve_secret is not None

    @cached_property
    def loopback(self) -> LoopbackKeys:
        return LoopbackKeys.derive(self.secret)


def secure_requested() -> bool:
    """REGENT_SECURE=1: this process uses the cluster's CURVE keys (any non-loopback socket must)."""
    return os.environ.get("REGENT_SECURE", "") == "1"


def load_credentials(secure: bool | None = None) -> Credentials:
    """Credentials for this process. secure=None means: CURVE if REGENT_SECURE=1."""
    if secure is None:
        secure = secure_requested()
    if not secure:
        return Credentials(local_secret())
    secret_file = keys_dir() / "regent.key_secret"
    if not secret_file.exists():
        raise RuntimeError(
            f"CURVE keys not found at {secret_file}: run `regent keys init` (and copy "
            f"{keys_dir()} to every host of the cluster)"
        )
    check_secret_file(secret_file)
    public, secret = zmq.auth.load_certificate(str(secret_file))
    return Credentials(local_secret(), public, secret)


class _AllowedKeys:
    """ZAP check of a CURVE client: its long-term public key must be one we expect."""

    def __init__(self, keys: set[bytes]) -> None:
        self.keys = keys

    def callback(self, domain: str, key: bytes) -> bool:
        if key in self.keys:
            return True
        log.warning("peer refused by authentication: unknown CURVE client key",
                    key=key.decode("ascii", "replace"))
        return False


_auth_lock = threading.Lock()
_authenticators: dict[int, ThreadAuthenticator] = {}


def _ensure_authenticator(ctx: zmq.Context, creds: Credentials) -> None:
    with _auth_lock:
        if id(ctx) in _authenticators:
            return
        if creds.secure:
            authorized = ensure_private_dir(keys_dir() / "authorized", "authorized keys directory")
            allowed = set(zmq.auth.load_certificates(str(authorized)))
        else:
            allowed = {creds.loopback.client_public}
        auth = ThreadAuthenticator(ctx, log=_QuietLog())
        auth.start()
        auth.configure_curve_callback(domain="*", credentials_provider=_AllowedKeys(allowed))
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
            "REGENT_SECURE=1 (the per-user loopback keys are for loopback only)"
        )
    _ensure_authenticator(sock.context, creds)
    if creds.secure:
        sock.curve_secretkey = creds.curve_secret
        sock.curve_publickey = creds.curve_public
    else:
        keys = creds.loopback
        sock.curve_secretkey = keys.server_secret
        sock.curve_publickey = keys.server_public
    sock.curve_server = True


def secure_client(sock: zmq.Socket, creds: Credentials) -> None:
    """Configure a socket about to connect to a regent server. The handshake fails, and
    nothing is sent, unless the server proves it holds the matching secret key."""
    if creds.secure:
        sock.curve_secretkey = creds.curve_secret
        sock.curve_publickey = creds.curve_public
        sock.curve_serverkey = creds.curve_public
    else:
        keys = creds.loopback
        sock.curve_secretkey = keys.client_secret
        sock.curve_publickey = keys.client_public
        sock.curve_serverkey = keys.server_public


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
