"""`regent dashboard`: a read-only web page on a journal's sessions (docs/observability.md).

A Starlette app served by uvicorn: the page (cli/_dashboard_page.py) polls a small JSON API
built on `regent status` (controller/status.py): the sessions of the journal, and for one its
leader, epochs, meshes, hosts, timeline and call rate; its Perfetto trace is one link away. It
only reads the journal and the store: it never writes, takes a lease or messages a worker
(invariant 16). Bound to loopback by default; bound elsewhere, it asks for a token.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import sys
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported when the dashboard runs, not by every `regent` command's parser
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response


def add_parser(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("dashboard", help="a read-only web dashboard of a journal's sessions")
    d.add_argument("--journal", default=os.environ.get("REGENT_JOURNAL"),
                   help="the journal (default: $REGENT_JOURNAL, else the embedded store)")
    d.add_argument("--store", default=None, help="where cluster hosts register, if not the journal's store")
    d.add_argument("--bind", default="127.0.0.1:8265", metavar="ADDR",
                   help="HOST:PORT to serve on (default 127.0.0.1:8265; port 0 takes a free one)")
    d.add_argument("--token", default=os.environ.get("REGENT_DASHBOARD_TOKEN"),
                   help="the token a browser must give (?token=...); made up and printed when bound off "
                        "loopback without one")
    d.add_argument("--refresh", type=float, default=1.0, help="how often the page polls, in seconds")


class _Reader:
    """The journal and store, opened once and read under one lock (a SQLite connection and an
    etcd client are not shared between threads safely); a session's status is read again only
    when its journal or leadership changed since the last look."""

    def __init__(self, journal_url: str | None, store_url: str | None):
        self.journal_url, self.store_url = journal_url, store_url
        self._lock = threading.Lock()
        self._journal: Any = None
        self._store: Any = None
        self._cache: dict[str, tuple[tuple, dict]] = {}

    def _open(self) -> Any:
        from regent.journal import open_journal

        if self._journal is None:
            self._journal = open_journal(self.journal_url)
            self._store = open_journal(self.store_url) if self.store_url else None
        return self._journal

    def _reset(self) -> None:
        for j in (self._journal, self._store):
            if j is not None:
                try:
                    j.close()
                except Exception:  # noqa: BLE001, S110 - closing a store that already failed
                    pass
        self._journal = self._store = None

    @contextlib.contextmanager
    def _opened(self) -> Iterator[Any]:
        """The journal, under the lock; one that failed is closed and opened again next time."""
        with self._lock:
            try:
                yield self._open()
            except BaseException:
                self._reset()
                raise

    def sessions(self) -> tuple[str, list[dict]]:
        with self._opened() as j:
            infos = j.sessions()
            return j.url, [{"name": i.name, "records": i.records, "last_write": i.last_write, "ended": i.ended,
                            "leader": i.leader, "epoch": i.epoch, "problem": i.problem} for i in infos]

    def status(self, session: str) -> dict | None:
        from regent.controller.status import session_status
        from regent.journal.standbys import standbys

        with self._opened() as j:
            if session not in j.backend.session_names():
                return None
            info = j.session_info(session)
            waiting = tuple(w["holder"] for w in standbys(j.backend, session))
            key = (info.last_lsn, info.leader, info.epoch, waiting, int(time.time() // 10))
            cached = self._cache.get(session)
            if cached is None or cached[0] != key:
                st = session_status(j, session, window_s=float("inf"), store=self._store)
                self._cache[session] = cached = (key, st)
        st = dict(cached[1])
        st["now"] = time.time()
        return st

    def trace(self, session: str) -> dict | None:
        from regent.controller.export import export_perfetto

        with self._opened() as j:
            if session not in j.backend.session_names():
                return None
            return export_perfetto(j.read(session), session)


def make_app(journal_url: str | None, store_url: str | None = None, token: str | None = None,
             refresh_s: float = 1.0) -> Starlette:
    """The dashboard's app: the page at /, the JSON API under /api."""
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import Route

    from regent.cli._dashboard_page import PAGE

    reader = _Reader(journal_url, store_url)

    def allowed(request: Request) -> bool:
        if token is None:
            return True
        given = request.query_params.get("token") or request.headers.get("authorization", "").removeprefix("Bearer ")
        return secrets.compare_digest(given.encode(), token.encode())

    def guarded(handler: Any) -> Any:
        def endpoint(request: Request) -> Response:
            if not allowed(request):
                return JSONResponse({"error": "this dashboard needs its token: open it as /?token=..."}, 401)
            try:
                return handler(request)
            except Exception as e:  # noqa: BLE001 - a store that does not answer is said, not a crash
                where = journal_url or "the embedded store"
                return JSONResponse({"error": f"the journal {where} did not answer: {type(e).__name__}: "
                                              f"{str(e)[:500]}"}, 503)
        return endpoint

    def page(request: Request) -> Response:
        return HTMLResponse(PAGE.replace("__REFRESH_MS__", str(int(refresh_s * 1000))))

    def sessions(request: Request) -> Response:
        url, found = reader.sessions()
        return JSONResponse({"journal": url, "sessions": found})

    def one(request: Request) -> Response:
        name = request.path_params["name"]
        st = reader.status(name)
        if st is None:
            return JSONResponse({"error": f"no session {name!r} in {journal_url or 'the embedded store'}"}, 404)
        return Response(json.dumps(st, default=str), media_type="application/json")

    def trace(request: Request) -> Response:
        name = request.path_params["name"]
        got = reader.trace(name)
        if got is None:
            return JSONResponse({"error": f"no session {name!r}"}, 404)
        return Response(json.dumps(got), media_type="application/json",
                        headers={"Content-Disposition": f'attachment; filename="{name}.perfetto.json"'})

    return Starlette(routes=[
        Route("/", guarded(page)),
        Route("/api/sessions", guarded(sessions)),
        Route("/api/sessions/{name}", guarded(one)),
        Route("/api/sessions/{name}/trace", guarded(trace)),
    ])


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from regent.wire.security import is_loopback
    from regent.worker.metrics import parse_address

    try:
        host, port = parse_address(args.bind)
    except ValueError as e:
        print(f"regent dashboard: --bind: {e}", file=sys.stderr)
        return 2
    token = args.token
    if token is None and not is_loopback(host):
        token = secrets.token_urlsafe(16)  # off loopback, nobody reads a journal without it
    app = make_app(args.journal, args.store, token, args.refresh)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    shown = f"[{host}]" if ":" in host else host

    def announce() -> None:
        while not server.started:
            time.sleep(0.05)
        bound = server.servers[0].sockets[0].getsockname()[1] if server.servers else port
        print(f"regent dashboard: http://{shown}:{bound}/" + (f"?token={token}" if token else ""), flush=True)

    threading.Thread(target=announce, daemon=True).start()
    server.run()
    return 0
