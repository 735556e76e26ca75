"""The proc's side of adoption: it watches its host agent through a pidfd on the loop and,
when the agent dies, finds or starts this machine's next one and asks to be adopted
(PROC_ADOPT) until one acknowledges. Nothing here runs on the call path."""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import psutil
import structlog
import tenacity

from regent import wire
from regent.wire import Kind
from regent.worker.discovery import ensure_local_host

log = structlog.get_logger("regent.proc")

ADOPT_ACK_TIMEOUT_S = 3.0


class _HostWatch:
    """Mixed into ProcRuntime, whose loop, fence and outbox these methods use."""

    host_env: dict[str, str] | None  # the agent's environment, for a successor started from here
    _host_fd: int | None  # pidfd of the agent watched
    _adoption: asyncio.Task | None  # the adoption under way, if any
    _acks: dict[int, asyncio.Future]  # adoption requests awaiting the agent's reply, by "n"
    _ack_ids: itertools.count

    def _watch_host(self, pid: int, parent: bool = False) -> None:
        """Call _on_host_gone when agent `pid` exits: its pidfd turns readable."""
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # already gone
            self.loop.call_soon(self._on_host_gone)
            return
        if parent and os.getppid() != pid:  # it died before we watched (we were reparented)
            os.close(fd)
            self.loop.call_soon(self._on_host_gone)
            return
        self._host_fd = fd
        self.loop.add_reader(fd, self._on_host_gone)

    def _on_host_gone(self) -> None:
        if self._host_fd is not None:
            self.loop.remove_reader(self._host_fd)
            os.close(self._host_fd)
            self._host_fd = None
        if self.stopping or self._adoption is not None:
            return
        log.warning("host agent is gone; starting or finding another to supervise this proc",
                    proc=self.proc_id, agent=self.host_inbox)
        self._adoption = self.loop.create_task(self._adopt())

    async def _adopt(self) -> None:
        """Until some agent acknowledges this proc: find (or start) this machine's agent, ask it."""
        retrying = tenacity.AsyncRetrying(
            wait=tenacity.wait_exponential(multiplier=0.2, max=5.0),
            retry=tenacity.retry_if_exception_type(Exception),
            before_sleep=lambda rs: log.warning(
                "adoption by a new host agent failed; retrying", proc=self.proc_id,
                attempt=rs.attempt_number, error=str(rs.outcome.exception()) if rs.outcome else ""),
        )
        try:
            async for attempt in retrying:
                with attempt:
                    address = await self._in_thread(partial(ensure_local_host, env=self.host_env))
                    pid = await self._ask_adoption(address)
        finally:
            self._adoption = None
        if address != self.host_inbox:
            log.warning("the new host agent runs at another address; controllers that knew the old "
                        "one cannot reach it", proc=self.proc_id, old=self.host_inbox, new=address)
            self.host_inbox = address
        if not self.stopping:
            log.info("adopted by a new host agent", proc=self.proc_id, agent=address, agent_pid=pid)
            self._watch_host(pid)

    async def _ask_adoption(self, address: str) -> int:
        """Send PROC_ADOPT to the agent at `address`; its pid once it has acknowledged."""
        n = next(self._ack_ids)
        ack = self._acks[n] = self.loop.create_future()
        meta = {"sid": self.session, "id": self.proc_id, "idx": self.index, "pid": os.getpid(),
                "addr": self.inbox.address, "n": n, "e": self.fence.epoch, **self.origin}
        try:
            self._send(address, wire.encode(Kind.PROC_ADOPT, meta))
            try:
                reply = await asyncio.wait_for(ack, ADOPT_ACK_TIMEOUT_S)
            except TimeoutError:
                raise TimeoutError(f"host agent at {address} did not acknowledge the adoption within "
                                   f"{ADOPT_ACK_TIMEOUT_S:g} s (see its log in $REGENT_HOME/host.log)") from None
        finally:
            self._acks.pop(n, None)
        seen = reply.get("e")  # the new agent's fence for this session: never below our own
        if isinstance(seen, int) and not isinstance(seen, bool) and seen > self.fence.epoch:
            self.fence.admit(seen)
        if reply.get("st") == "stopped":
            log.info("the session was stopped while this proc had no host agent; stopping",
                     proc=self.proc_id)
        return wire.require(reply, "pid", int)

    def _on_assigned(self, meta: dict) -> None:
        """This warm proc now replaces proc `old` (its agent says so): it remembers that, for a
        successor agent, and acknowledges with PROC_READY naming `old`. Said twice, the same."""
        old = meta.get("old")
        if not self.origin.get("warm") or not isinstance(old, str) or not old or meta.get("sid") != self.session \
                or self.origin.get("old", old) != old:
            log.warning("ignored an assignment this proc cannot take", proc=self.proc_id, old=str(old)[:80],
                        had=str(self.origin.get("old"))[:80])
            return
        self.origin["old"] = old
        self._send(self.host_inbox, wire.encode(Kind.PROC_READY, {
            "sid": self.session, "id": self.proc_id, "pid": os.getpid(), "addr": self.inbox.address, "old": old}))

    def _on_host_reply(self, meta: dict) -> None:
        n = meta.get("n")
        ack = self._acks.get(n) if isinstance(n, int) else None
        if ack is None or ack.done():  # e.g. an answer to an attempt that already timed out
            log.debug("ignored a host agent reply that answers nothing pending", proc=self.proc_id, n=str(n)[:40])
            return
        ack.set_result(meta)

    def _in_thread(self, fn: Callable[[], Any]) -> asyncio.Future:
        """Run blocking fn off the loop (on a daemon thread, which a stopping proc does not wait for)."""
        fut = self.loop.create_future()

        def settle(ok: bool, value: Any) -> None:
            if not fut.done():
                (fut.set_result if ok else fut.set_exception)(value)

        def run() -> None:
            try:
                result = (True, fn())
            except Exception as e:
                result = (False, e)
            try:
                self.loop.call_soon_threadsafe(settle, *result)
            except RuntimeError:  # the loop closed: the proc is stopping
                pass

        threading.Thread(target=run, name="regent-find-host", daemon=True).start()
        return fut


def _environment_of(pid: int) -> dict[str, str]:
    """The environment process `pid` started with; this process's own minus the proc's
    rank and device binding if the kernel will not say."""
    try:
        return psutil.Process(pid).environ()
    except psutil.Error as e:
        log.warning("cannot read the host agent's environment; a successor gets this proc's",
                    pid=pid, error=str(e))
        from regent.hipcore.binding import BINDING_VARS

        return {k: v for k, v in os.environ.items() if not k.startswith("REGENT_PROC_") and k not in BINDING_VARS}
