"""Drive a real Toxiproxy server: start and stop it, and manage proxies and toxics.

The client speaks Toxiproxy's HTTP API with the standard library only, and never
honours http_proxy variables: chaos traffic stays on the loopback interface.
Arguments are validated (chaos.toxics) before any request is made.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
import tenacity

from regent.chaos.toxics import validate_toxic
from regent.hipcore.ports import free_port, listen_port

__all__ = [
    "Proxy",
    "Toxic",
    "ToxiproxyClient",
    "ToxiproxyError",
    "ToxiproxyNotInstalled",
    "ToxiproxyServer",
    "ToxiproxyWatchdog",
    "find_toxiproxy_server",
]

log = structlog.get_logger("chaos.toxiproxy")

_REPO = Path(__file__).resolve().parent.parent
_INSTALL_HINT = f"run {_REPO / 'scripts' / 'install_toxiproxy.sh'}"
_LISTEN_TRIES = 5  # proxies created on a port another process bound first
_RELISTEN_S = 5.0  # a proxy brought back up waits this long at most for its port to be free


class ToxiproxyError(RuntimeError):
    """A Toxiproxy API call failed, or the server could not be started."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ToxiproxyNotInstalled(ToxiproxyError):
    """No toxiproxy-server binary was found."""


def find_toxiproxy_server() -> Path:
    """Locate toxiproxy-server: $TOXIPROXY_SERVER, then <repo>/.tools/bin, then PATH."""
    candidates: list[Path] = []
    env = os.environ.get("TOXIPROXY_SERVER")
    if env:
        candidates.append(Path(env))
    candidates.append(_REPO / ".tools" / "bin" / "toxiproxy-server")
    on_path = shutil.which("toxiproxy-server")
    if on_path:
        candidates.append(Path(on_path))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise ToxiproxyNotInstalled(
        "toxiproxy-server not found (looked at $TOXIPROXY_SERVER, "
        f"{_REPO / '.tools' / 'bin'}, and PATH); {_INSTALL_HINT} to build it"
    )


@dataclass(frozen=True)
class Toxic:
    """A toxic as the server reports it."""

    name: str
    kind: str
    stream: str
    toxicity: float
    attributes: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def _from_api(cls, data: Mapping[str, Any]) -> Toxic:
        return cls(
            name=data["name"],
            kind=data["type"],
            stream=data["stream"],
            toxicity=float(data["toxicity"]),
            attributes=dict(data.get("attributes") or {}),
        )


class ToxiproxyClient:
    """The HTTP API of one Toxiproxy server, e.g. ``ToxiproxyClient("http://127.0.0.1:8474")``."""

    def __init__(self, url: str, *, timeout_s: float = 15.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        # An empty ProxyHandler: never route chaos control traffic via http_proxy.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def __repr__(self) -> str:
        return f"ToxiproxyClient({self.url!r})"

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """Send one API request; return the decoded JSON reply (None when empty)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        req.add_header("User-Agent", "regent-chaos")
        try:
            with self._opener.open(req, timeout=self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = _error_message(exc)
            raise ToxiproxyError(
                f"Toxiproxy {method} {path} failed with HTTP {exc.code}: {detail}",
                status=exc.code,
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ToxiproxyError(
                f"Toxiproxy API at {self.url} is unreachable ({reason}); is the server "
                f"running? start one with chaos.ToxiproxyServer() ({_INSTALL_HINT} first "
                "if the binary is missing)"
            ) from None
        if not raw.strip():
            return None
        return json.loads(raw)

    def version(self) -> str:
        return str(self.request("GET", "/version")["version"])

    def create_proxy(
        self, name: str, upstream: str, listen: str = "127.0.0.1:0", *, enabled: bool = True
    ) -> Proxy:
        """Create a proxy; ``listen`` port 0 picks a free port, read back into ``Proxy.listen``.
        That port is below the kernel's ephemeral range (`listen_port`): a proxy taken down and
        brought back listens on it again, which fails if an outgoing connection took it meanwhile."""
        if not name or "/" in name:
            raise ToxiproxyError(
                f"proxy name {name!r} is not usable in Toxiproxy's URLs; use a non-empty "
                "name without '/' (chaos.ChaosNet maps link names for you)"
            )
        _check_host_port("upstream", upstream)
        _check_host_port("listen", listen)
        host, _, port = listen.rpartition(":")
        for attempt in range(1, _LISTEN_TRIES + 1):
            at = f"{host}:{listen_port(host.strip('[]'))}" if int(port) == 0 else listen
            try:
                data = self.request(
                    "POST", "/proxies", {"name": name, "upstream": upstream, "listen": at, "enabled": enabled}
                )
                break
            except ToxiproxyError as e:
                # Another process bound the port between our check and Toxiproxy's bind.
                if int(port) != 0 or not _port_taken(e) or attempt == _LISTEN_TRIES:
                    raise
        log.debug("proxy created", proxy=name, listen=data["listen"], upstream=upstream)
        return Proxy(self, data)

    def proxy(self, name: str) -> Proxy:
        return Proxy(self, self.request("GET", f"/proxies/{_quote(name)}"))

    def proxies(self) -> dict[str, Proxy]:
        data = self.request("GET", "/proxies") or {}
        return {name: Proxy(self, item) for name, item in data.items()}

    def reset(self) -> None:
        """Enable every proxy and remove every toxic, server-wide."""
        self.request("POST", "/reset")


class Proxy:
    """One Toxiproxy proxy: a listening port that forwards to ``upstream``."""

    def __init__(self, client: ToxiproxyClient, data: Mapping[str, Any]) -> None:
        self._client = client
        self._update(data)

    def _update(self, data: Mapping[str, Any]) -> None:
        self.name: str = data["name"]
        self.listen: str = data["listen"]
        self.upstream: str = data["upstream"]
        self.enabled: bool = bool(data["enabled"])

    def __repr__(self) -> str:
        state = "enabled" if self.enabled else "disabled"
        return f"Proxy({self.name!r}, listen={self.listen!r}, upstream={self.upstream!r}, {state})"

    @property
    def _path(self) -> str:
        return f"/proxies/{_quote(self.name)}"

    def refresh(self) -> Proxy:
        self._update(self._client.request("GET", self._path))
        return self

    def toxics(self) -> list[Toxic]:
        return [Toxic._from_api(t) for t in self._client.request("GET", self._path + "/toxics")]

    def add_toxic(
        self,
        kind: str,
        stream: str = "downstream",
        toxicity: float = 1.0,
        *,
        name: str | None = None,
        **attributes: int,
    ) -> Toxic:
        """Add a toxic, e.g. ``proxy.add_toxic("latency", latency=50, jitter=10)``.

        The default name is ``<kind>_<stream>``, as Toxiproxy names it; pass ``name`` to
        stack two toxics of one kind on the same stream.
        """
        resolved = validate_toxic(kind, stream=stream, toxicity=toxicity, attributes=attributes)
        body = {
            "name": name or f"{kind}_{stream}",
            "type": kind,
            "stream": stream,
            "toxicity": float(toxicity),
            "attributes": resolved,
        }
        toxic = Toxic._from_api(self._client.request("POST", self._path + "/toxics", body))
        log.debug("toxic added", proxy=self.name, toxic=toxic.name, attributes=resolved)
        return toxic

    def update_toxic(self, name: str, *, toxicity: float | None = None, **attributes: int) -> Toxic:
        """Change a live toxic's attributes or toxicity without dropping connections."""
        current = next((t for t in self.toxics() if t.name == name), None)
        if current is None:
            raise ToxiproxyError(f"proxy {self.name!r} has no toxic named {name!r}", status=404)
        merged = {**current.attributes, **attributes}
        new_toxicity = current.toxicity if toxicity is None else toxicity
        resolved = validate_toxic(
            current.kind, stream=current.stream, toxicity=new_toxicity, attributes=merged
        )
        body = {"toxicity": float(new_toxicity), "attributes": resolved}
        data = self._client.request("PATCH", f"{self._path}/toxics/{_quote(name)}", body)
        return Toxic._from_api(data)

    def remove_toxic(self, name: str) -> None:
        self._client.request("DELETE", f"{self._path}/toxics/{_quote(name)}")
        log.debug("toxic removed", proxy=self.name, toxic=name)

    def disable(self) -> None:
        """Take the link down: close its listener and every open connection."""
        self._update(self._client.request("PATCH", self._path, {"enabled": False}))

    def enable(self) -> None:
        """Bring the link back up on the same listen address. A port held there for a moment
        (a client reconnecting to it that connected to itself) is tried again for a few seconds."""
        for attempt in tenacity.Retrying(retry=tenacity.retry_if_exception(_port_taken),
                                         stop=tenacity.stop_after_delay(_RELISTEN_S),
                                         wait=tenacity.wait_fixed(0.1), reraise=True):
            with attempt:
                self._update(self._client.request("PATCH", self._path, {"enabled": True}))

    def reset(self) -> None:
        """Remove this proxy's toxics and enable it."""
        for toxic in self.toxics():
            self.remove_toxic(toxic.name)
        if not self.refresh().enabled:
            self.enable()

    def delete(self) -> None:
        self._client.request("DELETE", self._path)

    @contextlib.contextmanager
    def toxic(
        self,
        kind: str,
        stream: str = "downstream",
        toxicity: float = 1.0,
        *,
        name: str | None = None,
        **attributes: int,
    ) -> Iterator[Toxic]:
        """``with proxy.toxic("latency", latency=50): ...`` adds the toxic for the block."""
        added = self.add_toxic(kind, stream, toxicity, name=name, **attributes)
        try:
            yield added
        finally:
            self.remove_toxic(added.name)

    @contextlib.contextmanager
    def down(self) -> Iterator[Proxy]:
        """``with proxy.down(): ...`` partitions the link for the block."""
        self.disable()
        try:
            yield self
        finally:
            self.enable()


class ToxiproxyServer:
    """A toxiproxy-server process owned by this Python process, on a loopback port.

    ``with ToxiproxyServer() as server: proxy = server.create_proxy(...)``. The process
    is stopped by ``stop()``, on leaving the ``with`` block, at interpreter exit, and
    (Linux, when started from the main thread) by the kernel if this process dies.
    """

    def __init__(
        self,
        binary: str | os.PathLike[str] | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        start_timeout_s: float = 10.0,
    ) -> None:
        self.binary = Path(binary) if binary is not None else find_toxiproxy_server()
        if not (self.binary.is_file() and os.access(self.binary, os.X_OK)):
            raise ToxiproxyNotInstalled(
                f"toxiproxy-server binary {self.binary} does not exist or is not executable; "
                f"{_INSTALL_HINT} to build one"
            )
        self.host = host
        self.port = port
        self.start_timeout_s = start_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: Any = None
        self._lock = threading.Lock()
        self._client: ToxiproxyClient | None = None

    def __enter__(self) -> ToxiproxyServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ToxiproxyServer({self.url if self._client else 'not started'})"

    @property
    def url(self) -> str:
        return self.client.url

    @property
    def client(self) -> ToxiproxyClient:
        if self._client is None:
            raise ToxiproxyError("ToxiproxyServer is not started; call start() first")
        return self._client

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> ToxiproxyServer:
        with self._lock:
            if self.running():
                return self
            attempts = 3 if self.port == 0 else 1  # a free port may be taken before we bind it
            for attempt in range(1, attempts + 1):
                port = self.port or free_port(self.host)
                try:
                    self._spawn(port)
                    break
                except ToxiproxyError:
                    self._terminate()
                    if attempt == attempts:
                        raise
            atexit.register(self.stop)
            return self

    def _spawn(self, port: int) -> None:
        self._log_file = tempfile.NamedTemporaryFile(  # closed in _terminate()
            prefix="toxiproxy-", suffix=".log", delete=False
        )
        self._proc = subprocess.Popen(
            [str(self.binary), "-host", self.host, "-port", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            preexec_fn=_pdeathsig_setter(),
        )
        self._client = ToxiproxyClient(f"http://{self.host}:{port}")
        try:
            version = self._wait_ready()
        except tenacity.RetryError:
            raise ToxiproxyError(
                f"toxiproxy-server ({self.binary}) did not answer on {self._client.url} "
                f"within {self.start_timeout_s}s; its log ({self._log_file.name}):\n"
                f"{self._log_tail()}"
            ) from None
        log.info("toxiproxy started", url=self._client.url, version=version, pid=self._proc.pid)

    def _wait_ready(self) -> str:
        assert self._proc is not None and self._client is not None
        proc, client = self._proc, self._client

        def probe() -> str:
            if proc.poll() is not None:
                raise _ServerExited(proc.returncode)
            return client.version()

        try:
            for attempt in tenacity.Retrying(
                retry=tenacity.retry_if_exception_type(ToxiproxyError),
                wait=tenacity.wait_exponential(multiplier=0.005, max=0.2),
                stop=tenacity.stop_after_delay(self.start_timeout_s),
                reraise=False,
            ):
                with attempt:
                    return probe()
        except _ServerExited as exc:
            raise ToxiproxyError(
                f"toxiproxy-server ({self.binary}) exited with status {exc.code} at start; "
                f"its log:\n{self._log_tail()}"
            ) from None
        raise AssertionError("unreachable")

    def _log_tail(self, lines: int = 20) -> str:
        if self._log_file is None:
            return ""
        try:
            text = Path(self._log_file.name).read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def revive(self, proxies: list[dict[str, Any]]) -> None:
        """Replace a stuck server: SIGKILL it, start a new one on the same API port, and
        create `proxies` again (Toxiproxy's JSON: name, listen, upstream), enabled and with
        no toxics. Every connection through them is cut, as by a reset_peer on each.

        Toxiproxy's API can stay blocked for as long as a peer of one link does not read
        (removing a toxic waits for its goroutine, which waits to write to that peer)."""
        with self._lock:
            if self._client is None:
                raise ToxiproxyError("ToxiproxyServer.revive() before start()")
            port = int(self._client.url.rsplit(":", 1)[1])
            if self._proc is not None and self._proc.poll() is None:
                self._proc.kill()  # stuck: no graceful stop
            self._terminate()
            self._spawn(port)
        if proxies:
            self.client.request("POST", "/populate", [
                {"name": p["name"], "listen": p["listen"], "upstream": p["upstream"], "enabled": True}
                for p in proxies])
        log.warning("toxiproxy revived", url=self.client.url, proxies=len(proxies), pid=self.pid)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL); safe to call twice."""
        with self._lock:
            self._terminate(timeout_s)
            atexit.unregister(self.stop)

    def _terminate(self, timeout_s: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.info("toxiproxy stopped", pid=proc.pid)
        if self._log_file is not None:
            self._log_file.close()
            with contextlib.suppress(OSError):
                os.unlink(self._log_file.name)
            self._log_file = None

    # The API, delegated so that a server can be used where a client is expected.
    def version(self) -> str:
        return self.client.version()

    def create_proxy(
        self, name: str, upstream: str, listen: str = "127.0.0.1:0", *, enabled: bool = True
    ) -> Proxy:
        return self.client.create_proxy(name, upstream, listen, enabled=enabled)

    def proxy(self, name: str) -> Proxy:
        return self.client.proxy(name)

    def proxies(self) -> dict[str, Proxy]:
        return self.client.proxies()

    def reset(self) -> None:
        self.client.reset()


class _ServerExited(Exception):
    def __init__(self, code: int | None) -> None:
        self.code = code


def _pdeathsig_setter() -> Callable[[], None] | None:
    # Ask the kernel to SIGKILL the server if the thread that started it goes away
    # without cleanup (e.g. the test runner is SIGKILLed). The kernel ties this to
    # the parent *thread*, so it is used only from the main thread. libc is looked up
    # here, not in the forked child, where importing could deadlock.
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def set_pdeathsig() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGKILL))

    return set_pdeathsig


def _quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _port_taken(exc: BaseException) -> bool:
    """Toxiproxy could not listen: another socket holds the port."""
    return isinstance(exc, ToxiproxyError) and "address already in use" in str(exc)


def _check_host_port(what: str, value: str) -> None:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ToxiproxyError(f"{what} must be 'host:port', e.g. '127.0.0.1:2379'; got {value!r}")


def _error_message(exc: urllib.error.HTTPError) -> str:
    try:
        body = exc.read().decode(errors="replace").strip()
    except OSError:
        return exc.reason or ""
    try:
        return str(json.loads(body).get("error", body))
    except (ValueError, AttributeError):
        return body or str(exc.reason)


class ToxiproxyWatchdog:
    """Keeps a server's API answering: probes it every `every_s`, remembers its proxies
    while it answers, and when `strikes` probes in a row get no answer within `timeout_s`,
    revives it with them (ToxiproxyServer.revive). The defaults (~12 s) outlast any single
    pause a chaos schedule holds a link's peer for, so only a server that stays stuck is
    replaced. ``revivals`` counts them."""

    def __init__(self, server: ToxiproxyServer, *, every_s: float = 0.5, timeout_s: float = 2.0,
                 strikes: int = 5) -> None:
        self.server = server
        self.every_s, self.strikes = every_s, strikes
        self.revivals = 0
        self._probe = ToxiproxyClient(server.url, timeout_s=timeout_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="toxiproxy-watchdog", daemon=True)

    def start(self) -> ToxiproxyWatchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._probe.timeout_s + self.every_s + 5)

    def _run(self) -> None:
        known: dict[str, dict[str, Any]] = {}
        missed = 0
        while not self._stop.wait(self.every_s):
            try:
                known = self._probe.request("GET", "/proxies") or {}
                missed = 0
                continue
            except ToxiproxyError as e:
                missed += 1
                if missed < self.strikes:
                    continue
                log.warning("toxiproxy API stuck; reviving it", url=self._probe.url, error=str(e))
            missed = 0
            try:
                self.server.revive(list(known.values()))
                self.revivals += 1
            except ToxiproxyError as e:
                log.warning("could not revive toxiproxy", url=self._probe.url, error=str(e))
