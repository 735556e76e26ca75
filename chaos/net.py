"""A named set of network links, each one Toxiproxy proxy, that chaos can poison.

A link is named for who talks to whom ("controller->etcd", "controller->proc/3");
its user connects to ``net.link(name, upstream)``'s address instead of the real
one. Link names are mapped to proxy names Toxiproxy can route ('/' is not).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import structlog

from regent.chaos.faults import FaultLog
from regent.chaos.toxiproxy import Proxy, Toxic, ToxiproxyClient, ToxiproxyServer

__all__ = ["ChaosNet", "UnknownLinkError"]

log = structlog.get_logger("chaos.net")

_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")


class UnknownLinkError(KeyError):
    """A link name that was never created with ChaosNet.link()."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class ChaosNet:
    """The links of one chaos run, on one Toxiproxy server.

    ``net.link("controller->etcd", "127.0.0.1:2379")`` returns the address to dial
    instead; ``net["controller->etcd"]`` is its Proxy. Every change made through the
    net is recorded in ``net.faults`` (a FaultLog) unless the net is told otherwise.
    """

    def __init__(
        self,
        server: ToxiproxyServer | ToxiproxyClient,
        *,
        faults: FaultLog | None = None,
        prefix: str = "",
    ) -> None:
        self._api = server.client if isinstance(server, ToxiproxyServer) else server
        self.faults = faults if faults is not None else FaultLog()
        self._prefix = prefix
        self._links: dict[str, Proxy] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> ChaosNet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ChaosNet({sorted(self._links)})"

    def link(self, name: str, upstream: str, listen: str = "127.0.0.1:0") -> str:
        """Create the link ``name`` to ``upstream`` ('host:port'); return its 'host:port'."""
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"a link name must be a non-empty string, got {name!r}")
        with self._lock:
            if name in self._links:
                existing = self._links[name]
                raise ValueError(
                    f"link {name!r} already exists (listening on {existing.listen}, to "
                    f"{existing.upstream}); remove it with net.remove({name!r}) first"
                )
            proxy = self._api.create_proxy(self._proxy_name(name), upstream, listen)
            self._links[name] = proxy
        log.info("link created", link=name, listen=proxy.listen, upstream=upstream)
        return proxy.listen

    def adopt(self, name: str, proxy_name: str) -> str:
        """Make the existing proxy ``proxy_name`` (created by another process, say a
        controller routing its own connections) link ``name`` of this net; return its
        'host:port'. Several names may share one proxy; close() deletes it once."""
        proxy = self._api.proxy(proxy_name)
        with self._lock:
            self._links[name] = proxy
        return proxy.listen

    def _proxy_name(self, name: str) -> str:
        base = self._prefix + _UNSAFE.sub("_", name)
        taken = {p.name for p in self._links.values()}
        candidate, n = base, 1
        while candidate in taken:
            n += 1
            candidate = f"{base}~{n}"
        return candidate

    def __getitem__(self, name: str) -> Proxy:
        try:
            return self._links[name]
        except KeyError:
            known = ", ".join(sorted(self._links)) or "none yet"
            raise UnknownLinkError(
                f"no link named {name!r} (links: {known}); create it with net.link(name, upstream)"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._links

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._links))

    def __len__(self) -> int:
        return len(self._links)

    def address(self, name: str) -> str:
        """The 'host:port' clients of link ``name`` dial."""
        return self[name].listen

    def partition(self, name: str, *, note: Mapping[str, Any] | None = None) -> None:
        """Take link ``name`` down: new connections are refused, open ones are closed."""
        self[name].disable()
        self.faults.record("down", name, dict(note or {}))

    def heal(self, name: str, *, note: Mapping[str, Any] | None = None) -> None:
        """Bring link ``name`` back up (its toxics stay; see clear())."""
        self[name].enable()
        self.faults.record("up", name, dict(note or {}))

    def add_toxic(
        self,
        name: str,
        kind: str,
        stream: str = "downstream",
        toxicity: float = 1.0,
        *,
        toxic_name: str | None = None,
        note: Mapping[str, Any] | None = None,
        **attributes: int,
    ) -> Toxic:
        """Add a toxic to link ``name`` and record it (``note`` joins the event's detail)."""
        toxic = self[name].add_toxic(kind, stream, toxicity, name=toxic_name, **attributes)
        self.faults.record("toxic_add", name, {**_toxic_detail(toxic), **dict(note or {})})
        return toxic

    def remove_toxic(
        self, name: str, toxic_name: str, *, note: Mapping[str, Any] | None = None
    ) -> None:
        self[name].remove_toxic(toxic_name)
        self.faults.record("toxic_remove", name, {"toxic": toxic_name, **dict(note or {})})

    def clear(self) -> None:
        """Remove every toxic from every link and bring every link up."""
        for name in self:
            self._links[name].reset()
        self.faults.record("clear", "*", {"links": sorted(self._links)})

    def remove(self, name: str) -> None:
        """Delete link ``name``'s proxy; its address stops answering."""
        proxy = self[name]
        with self._lock:
            del self._links[name]
            shared = any(p.name == proxy.name for p in self._links.values())
        if not shared:
            proxy.delete()

    def close(self) -> None:
        """Delete every proxy this net created (the server itself keeps running)."""
        for name in list(self._links):
            try:
                self.remove(name)
            except Exception as exc:  # the server may already be gone at teardown
                log.warning("link not removed", link=name, error=str(exc))
                self._links.pop(name, None)


def _toxic_detail(toxic: Toxic) -> dict[str, Any]:
    return {
        "toxic": toxic.name,
        "type": toxic.kind,
        "stream": toxic.stream,
        "toxicity": toxic.toxicity,
        **dict(toxic.attributes),
    }
