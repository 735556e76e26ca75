"""A proc's output, forwarded: what its process writes to stdout and stderr (the file
descriptors, so C extensions and child processes are caught as well as print) goes on to
where it went before (the host agent's log, kept per host), each line prefixed with the host
and the proc's index there, and to the session's current controller, which prints it.

A thread of its own reads the pipes, so an endpoint that prints much is never stalled by a
loop busy running it; it has its own socket (zmq sockets are not shared between threads).
Lines for a controller that cannot take them are dropped, never queued without bound: the
agent's log keeps every line.
"""

from __future__ import annotations

import os
import select
import sys
import threading
from collections.abc import Callable

import zmq

from regent import wire
from regent.wire import Kind
from regent.wire.schema import MAX_LOG_LINE, MAX_LOG_LINES
from regent.wire.security import Credentials
from regent.wire.transport import RECEIVER_MAX_PEERS, Outbox

_READ = 65536
_MESSAGE_TEXT = 32 * 1024  # text per LOG message, well under the metadata limit


def forwarding_enabled() -> bool:
    return os.environ.get("REGENT_FORWARD_OUTPUT", "1") not in ("0", "off", "no")


class OutputForwarder:
    """Tees fds 1 and 2 of this process. `target()` names the controller to send lines to
    (None: nobody yet)."""

    def __init__(self, ctx: zmq.Context, creds: Credentials, session: str, proc_id: str, host: str, index: int,
                 target: Callable[[], str | None]):
        self.session, self.proc_id, self.host, self.index = session, proc_id, host, index
        self.target = target
        self.prefix = f"[{host} {index}] ".encode()
        self._outbox = Outbox(ctx, creds, max_peers=RECEIVER_MAX_PEERS)
        self._saved: dict[int, int] = {}  # stream (0 stdout, 1 stderr) -> the fd it wrote to before
        self._reads: dict[int, int] = {}  # pipe read fd -> stream
        self._partial: dict[int, bytes] = {0: b"", 1: b""}
        self._teeing = {0, 1}  # streams whose old destination still takes lines
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="regent-output", daemon=True)

    def start(self) -> OutputForwarder:
        for stream, fd in ((0, 1), (1, 2)):
            r, w = os.pipe()
            self._saved[stream] = os.dup(fd)
            os.dup2(w, fd)
            os.close(w)
            self._reads[r] = stream
        # print() to a pipe is block-buffered: lines would reach the controller in bursts.
        for f in (sys.stdout, sys.stderr):
            try:
                f.reconfigure(line_buffering=True)  # type: ignore[union-attr]
            except (AttributeError, ValueError):
                pass
        self._thread.start()
        return self

    def stop(self) -> None:
        """Put the original fds back and forward what is left."""
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except (OSError, ValueError):
                pass
        for stream, fd in ((0, 1), (1, 2)):
            if stream in self._saved:
                os.dup2(self._saved[stream], fd)  # closes our pipe's write end: the reader sees EOF
        os.write(self._stop_w, b"x")
        self._thread.join(timeout=2)
        self._outbox.close()

    def _run(self) -> None:
        fds = [*self._reads, self._stop_r]
        stopping = False
        while self._reads:
            try:
                readable, _, _ = select.select(fds, [], [], None if not stopping else 0.2)
            except OSError:
                return
            if not readable and stopping:
                return
            lines: list[tuple[int, str]] = []
            for fd in readable:
                if fd == self._stop_r:
                    stopping = True
                    fds.remove(fd)
                    continue
                data = os.read(fd, _READ)
                stream = self._reads[fd]
                if not data:  # EOF: the fd was given back; what is left is a last line
                    fds.remove(fd)
                    del self._reads[fd]
                    rest, self._partial[stream] = self._partial[stream], b""
                    data = rest + b"\n" if rest else b""
                else:
                    data, self._partial[stream] = self._split(stream, data)
                if data:
                    lines += [(stream, text) for text in self._emit(stream, data)]
            if lines:
                self._forward(lines)

    def _split(self, stream: int, data: bytes) -> tuple[bytes, bytes]:
        """(complete lines, the rest): a line longer than MAX_LOG_LINE is cut there."""
        buf = self._partial[stream] + data
        end = buf.rfind(b"\n") + 1
        if end == 0 and len(buf) >= MAX_LOG_LINE:
            return buf + b"\n", b""
        return buf[:end], buf[end:]

    def _emit(self, stream: int, data: bytes) -> list[str]:
        """Write the lines on, prefixed, to where they went before; their text."""
        raw = data.rstrip(b"\n").split(b"\n")
        if stream in self._teeing:
            try:
                os.write(self._saved[stream], b"".join(self.prefix + line + b"\n" for line in raw))
            except OSError:  # the agent's log is gone: stop writing there; the controller still gets them
                self._teeing.discard(stream)
        return [line.decode("utf-8", "replace")[:MAX_LOG_LINE] for line in raw]

    def _forward(self, lines: list[tuple[int, str]]) -> None:
        to = self.target()
        if not to:
            return
        while lines:
            chunk, size = [], 0
            while lines and len(chunk) < MAX_LOG_LINES and size < _MESSAGE_TEXT:
                chunk.append(lines.pop(0))
                size += len(chunk[-1][1])
            msg = wire.encode(Kind.LOG, {"sid": self.session, "id": self.proc_id, "h": self.host,
                                         "i": self.index, "lines": chunk})
            try:
                if not self._outbox.peer(to).try_send(msg):
                    return  # the controller is slow or gone: the agent's log has these lines
            except Exception:  # never let forwarding take the proc down (nor log: that is output too)
                return
