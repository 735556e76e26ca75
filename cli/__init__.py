"""The `regent` command line, at the top of the program: it may use every other package
(controller, journal, worker, chaos); none of them imports it."""

from regent.cli.main import main

__all__ = ["main"]
