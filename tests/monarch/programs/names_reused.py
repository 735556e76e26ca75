"""A controller program for the names-replayed test: a mesh name spawned again while its mesh
lives (refused: the program catches the ValueError and goes on), and again after a SIGSEGV
killed its procs (spawned). A standby or an audit replaying the journal must make the same
decisions. Configured by REGENT_TEST_SESSION and REGENT_TEST_JOURNAL; prints one JSON line."""

from __future__ import annotations

import ctypes
import json
import os

from regent.controller import Session
from regent.worker import Actor, SupervisionError, endpoint


class Fault(Actor):
    @endpoint
    def sigsegv(self) -> None:
        ctypes.string_at(0)

    @endpoint
    def check(self) -> str:
        return "ok"


def main() -> None:
    with Session(os.environ["REGENT_TEST_SESSION"], journal=os.environ["REGENT_TEST_JOURNAL"],
                 on_unhandled_fault=lambda failure: None) as s:
        procs = s.spawn_procs(per_host={"procs": 1})
        first = procs.spawn("fault", Fault)
        try:
            procs.spawn("fault", Fault)
            refused = ""
        except ValueError as e:
            refused = str(e)
        checked = first.check.call_one().get(timeout=30)
        try:
            first.sigsegv.call_one().get(timeout=60)
            crashed = False
        except SupervisionError:
            crashed = True
        again = s.spawn_procs(per_host={"procs": 1}).spawn("fault", Fault)
        print(json.dumps({"refused": refused, "checked": checked, "crashed": crashed,
                          "again": again.check.call_one().get(timeout=30)}), flush=True)


if __name__ == "__main__":
    main()
