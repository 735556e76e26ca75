"""structlog setup for regent processes: human-readable lines on stderr, never stdout
(a program's stdout is its own)."""

from __future__ import annotations

import logging
import os
import sys

import structlog


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
