"""structlog setup for regent processes: human-readable lines on stderr, never stdout
(a program's stdout is its own); in a proc, the actor's identity on its `logging` records."""

from __future__ import annotations

import logging
import os
import sys

import structlog

from regent.worker.actor import _current


def configure_logging(only_if_unconfigured: bool = False) -> None:
    if only_if_unconfigured and structlog.is_configured():
        return
    level = getattr(logging, os.environ.get("REGENT_LOG_LEVEL", "INFO").upper(), logging.INFO)
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.format_exc_info,
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(_Stderr()),
        cache_logger_on_first_use=True,
    )


class _Stderr:
    """Whatever sys.stderr is at the moment of writing: a test runner or a program may
    swap (and close) the stream a logger was configured with."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def prefix_actor_logs() -> None:
    """Start each `logging` record made inside an actor with the actor's identity,
    `[actor=trainers{'hosts': 0/1, 'procs': 2/4}] ...`, as Monarch does: a proc hosts several
    actors and its output interleaves them. Records with an empty message are left alone
    (torch.compile's structured traces need them empty). For the proc's own process only."""
    make = logging.getLogRecordFactory()
    if getattr(make, "regent_actor_prefix", False):
        return

    def record(*args: object, **kwargs: object) -> logging.LogRecord:
        rec = make(*args, **kwargs)
        ctx = _current.get()
        if ctx is not None and isinstance(rec.msg, str) and rec.msg:
            prefix = f"[actor={ctx}] "
            rec.msg = (prefix.replace("%", "%%") if rec.args else prefix) + rec.msg
        return rec

    record.regent_actor_prefix = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(record)
