"""Fixtures shared by the runtime tests."""

from tests.support.agenthome import home  # noqa: F401 (a fixture: a REGENT_HOME with its own agent)
