"""A program that ends on an uncaught LeadershipLost (deposed) exits with its own status, so
supervisors wait for the standby; any other failure exits 1, as Python does."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from regent.cli.launch.common import ended_the_run
from regent.controller.session import DEPOSED_EXIT_STATUS

PROGRAM = textwrap.dedent("""
    import sys
    from regent.controller import FencedError, LeadershipLost, Session
    with Session("exit-status", journal="off"):
        pass
    raise {"lost": LeadershipLost("leadership lost: a test"), "fenced": FencedError("fenced: a test"),
           "other": ValueError("a failed run")}[sys.argv[1]]
""")


@pytest.mark.parametrize(("how", "status"), [("lost", DEPOSED_EXIT_STATUS), ("fenced", DEPOSED_EXIT_STATUS),
                                             ("other", 1)])
def test_a_deposed_program_exits_with_its_own_status(tmp_path: Path, how: str, status: int) -> None:
    (tmp_path / "p.py").write_text(PROGRAM)
    done = subprocess.run([sys.executable, str(tmp_path / "p.py"), how], capture_output=True, text=True,
                          env={"REGENT_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert done.returncode == status, done.stderr
    assert "Traceback" in done.stderr  # the traceback is still printed


def test_who_ends_a_run() -> None:
    assert ended_the_run(0, others_running=True)
    assert ended_the_run(1, others_running=True)  # a failed run ends (its END record is written)
    assert not ended_the_run(DEPOSED_EXIT_STATUS, others_running=True)
    assert not ended_the_run(-9, others_running=True) and not ended_the_run(137, others_running=True)
    assert ended_the_run(DEPOSED_EXIT_STATUS, others_running=False)  # nobody left to carry it on
    # Through ssh a SIGKILLed controller (or a cut connection) exits 255: gone, not the run's end.
    assert not ended_the_run(255, others_running=True, over_ssh=True)
    assert ended_the_run(255, others_running=True) and ended_the_run(255, others_running=False, over_ssh=True)


class _Exited:
    """A stand-in for a Popen that has exited (or not) with a given status."""

    def __init__(self, code: int | None) -> None:
        self.returncode = code
        self.stopped = False

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        self.stopped = True
        self.returncode = -9

    def wait(self) -> int | None:
        return self.returncode


def test_supervise_takes_the_status_of_the_controller_that_ended_the_run() -> None:
    from regent.cli.launch.common import supervise

    # The killed primary and the standby that finished are seen together: the standby's counts.
    assert supervise([_Exited(-9), _Exited(0)]) == 0
    assert supervise([_Exited(DEPOSED_EXIT_STATUS), _Exited(1)]) == 1
    standby = _Exited(None)
    assert supervise([_Exited(0), standby]) == 0 and standby.stopped  # the run ended: the standby stops
    assert supervise([_Exited(-9)]) == -9  # nobody carried it on
