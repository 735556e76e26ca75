"""Which etcd a journal url names, and how to reach it: endpoints, TLS files, user.

Pure parsing: reads the url and the REGENT_ETCD_* variables, opens no socket and reads no
certificate. The password only ever comes from REGENT_ETCD_PASSWORD and never appears in
`EtcdTarget.url`, in a repr, or in an error.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlsplit

ENV_CA = "REGENT_ETCD_CA"
ENV_CERT = "REGENT_ETCD_CERT"
ENV_KEY = "REGENT_ETCD_KEY"
ENV_PASSWORD = "REGENT_ETCD_PASSWORD"

DEFAULT_PORT = 2379
USAGE = (
    "etcd://host:port[,host:port...][?user=NAME] or "
    "etcds://host:port[,host:port...][?ca=PATH&cert=PATH&key=PATH&user=NAME]"
)
_QUERY_KEYS = ("ca", "cert", "key", "user")


@dataclass(frozen=True)
class EtcdTls:
    """PEM files for a TLS connection. No `ca`: trust the system's roots. `cert` and `key`
    (both or neither) are the client certificate an etcd with --client-cert-auth asks for."""

    ca: Path | None
    cert: Path | None
    key: Path | None
    # Where each path came from ("?ca=" or "$REGENT_ETCD_CA"), for errors that say what to fix.
    origin: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def source(self, name: str) -> str:
        return self.origin.get(name, f"?{name}=")


@dataclass(frozen=True)
class EtcdTarget:
    """A parsed etcd journal url."""

    addresses: tuple[tuple[str, int], ...]
    tls: EtcdTls | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)

    @property
    def address_text(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.addresses)

    @property
    def url(self) -> str:
        """The url without secrets, complete enough to open the same store elsewhere (TLS
        files as absolute paths, the user; the password still comes from the environment)."""
        query: list[str] = []
        if self.tls is not None:
            for name in ("ca", "cert", "key"):
                path = getattr(self.tls, name)
                if path is not None:
                    query.append(f"{name}={quote(str(path))}")
        if self.user is not None:
            query.append(f"user={quote(self.user, safe='')}")
        scheme = "etcd" if self.tls is None else "etcds"
        return f"{scheme}://{self.address_text}" + (f"?{'&'.join(query)}" if query else "")


def redact(url: str) -> str:
    """`url` with any password in it (user:PASSWORD@ or password=...) replaced by ***.

    Everything up to the last '@' goes if a ':' precedes it: a password typed unencoded may
    hold '/', '?' or '@' itself."""
    scheme, sep, rest = url.partition("://")
    at = rest.rfind("@")
    if at != -1 and ":" in rest[:at]:
        rest = "***" + rest[at:]
    netloc, qmark, query = rest.partition("?")
    found = _PASSWORD_QUERY.search(query)
    if found is not None:
        # Blank everything from password= on: a password may itself hold '&'.
        query = query[: found.start()] + found.group() + "***"
    return f"{scheme}{sep}{netloc}{qmark}{query}"


_PASSWORD_QUERY = re.compile(r"(?:^|&)password=", re.IGNORECASE)


def parse_etcd_url(url: str, env: Mapping[str, str] | None = None) -> EtcdTarget:
    """Parse an etcd:// or etcds:// journal url (see USAGE); `env` defaults to os.environ.

    TLS is used for etcds://, and for etcd:// when REGENT_ETCD_CA, _CERT or _KEY is set;
    values in the url take precedence over the variables. Raises ValueError, naming the url
    with any password blanked out and what to write instead.
    """
    env = os.environ if env is None else env
    shown = redact(url)
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("etcd", "etcds"):
        raise ValueError(f"journal url {shown!r} is not an etcd url: use {USAGE}")
    if "@" in rest:
        if ":" in rest[: rest.rfind("@")]:
            raise _password_in_url(shown)
        raise ValueError(
            f"journal url {shown!r}: give the etcd user as a query, {scheme}://HOST:PORT?user=NAME "
            f"(an '@' in the name written as %40), and its password in ${ENV_PASSWORD}"
        )
    netloc, _, query_text = rest.partition("?")
    netloc = netloc.rstrip("/")
    if _PASSWORD_QUERY.search(query_text):
        raise _password_in_url(shown)
    query = _parse_query(query_text, shown)
    addresses = tuple(_parse_address(part, shown) for part in netloc.split(","))

    from_url = {name: query[name] for name in ("ca", "cert", "key") if name in query}
    if scheme == "etcd" and from_url:
        raise ValueError(
            f"journal url {shown!r}: ca=, cert= and key= belong to TLS urls; write "
            f"etcds://{netloc}?{query_text}"
        )
    from_env = {
        name: env[var]
        for name, var in (("ca", ENV_CA), ("cert", ENV_CERT), ("key", ENV_KEY))
        if env.get(var)
    }
    tls = None
    if scheme == "etcds" or from_env:
        tls = _tls(from_url, from_env, shown)

    user = query.get("user") or None
    password = None
    if user is not None:
        password = env.get(ENV_PASSWORD)
        if not password:
            raise ValueError(
                f"journal url {shown!r} names etcd user {user!r} but ${ENV_PASSWORD} is not set: "
                f"export {ENV_PASSWORD} with that user's password (it is never taken from the url)"
            )
    return EtcdTarget(addresses, tls, user, password)


def _password_in_url(shown: str) -> ValueError:
    return ValueError(
        f"journal url {shown!r} carries a password; urls end up in logs and process lists, so "
        f"regent refuses them: put the user in the url (?user=NAME) and the password in "
        f"${ENV_PASSWORD}"
    )


def _parse_query(text: str, shown: str) -> dict[str, str]:
    if not text:
        return {}
    try:
        pairs = parse_qsl(text, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise ValueError(f"journal url {shown!r}: bad query {redact('?' + text)!r}") from None
    query: dict[str, str] = {}
    for name, value in pairs:
        if name not in _QUERY_KEYS:
            raise ValueError(
                f"journal url {shown!r}: unknown parameter {name!r} (known: "
                f"{', '.join(_QUERY_KEYS)})"
            )
        if name in query:
            raise ValueError(f"journal url {shown!r}: {name}= given twice")
        query[name] = value
    return query


def _parse_address(part: str, shown: str) -> tuple[str, int]:
    try:
        split = urlsplit(f"//{part}")
        port = split.port
    except ValueError:
        split, port = None, None
    if split is None or not split.hostname:
        raise ValueError(f"bad etcd address {part!r} in journal url {shown!r}: use {USAGE}")
    return split.hostname, port or DEFAULT_PORT


def _tls(from_url: dict[str, str], from_env: dict[str, str], shown: str) -> EtcdTls:
    paths: dict[str, Path | None] = {}
    origin: dict[str, str] = {}
    env_names = {"ca": ENV_CA, "cert": ENV_CERT, "key": ENV_KEY}
    for name in ("ca", "cert", "key"):
        if from_url.get(name):
            paths[name], origin[name] = Path(from_url[name]), f"?{name}="
        elif from_env.get(name):
            paths[name], origin[name] = Path(from_env[name]), f"${env_names[name]}"
        else:
            paths[name] = None
    if (paths["cert"] is None) != (paths["key"] is None):
        have, lack = ("cert", "key") if paths["key"] is None else ("key", "cert")
        raise ValueError(
            f"journal url {shown!r}: a client certificate needs both cert= and key= "
            f"(or ${ENV_CERT} and ${ENV_KEY}); {have} is given ({origin[have]}) but {lack} is not"
        )
    resolved = {
        name: None if path is None else path.expanduser().resolve() for name, path in paths.items()
    }
    return EtcdTls(resolved["ca"], resolved["cert"], resolved["key"], origin)


def local_address_toward(url: str) -> str | None:
    """The local address this machine reaches the first etcd member of `url` from (the
    route's source address: sends nothing), or None when that member is on loopback or no
    route leads there. An address that reaches the store is one the cluster reaches too."""
    import socket

    host, port = parse_etcd_url(url).addresses[0]
    if host in ("localhost", "") or host.startswith("127.") or host == "::1":
        return None
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return str(s.getsockname()[0])
    except OSError:
        return None
