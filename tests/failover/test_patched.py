"""Changing a running program (docs/failover.md): `s.patched(id)` journals a marker live and,
replayed, says whether the history was made with the change, so a new version replays an old
history on the old branch and runs the new one from the hand-over on; `s.deprecate_patch`
refuses a history without the marker. Real controller processes (tests/failover/programs/
versioned.py), an audit replay (the CI check) for histories made by other versions."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from regent.controller.audit import replay_program
from regent.controller.export import export_perfetto
from regent.controller.replay import CALL, expand
from regent.controller.timeline import timeline
from regent.journal import open_journal
from tests.failover.harness import PROGRAMS, Cluster

PROGRAM = PROGRAMS / "versioned.py"
STEPS = 8


def _live(version: str, session: str, journal: str, tmp_path: Path) -> dict:
    env = {**os.environ, "REGENT_TEST_VERSION": version, "REGENT_TEST_SESSION": session,
           "REGENT_TEST_JOURNAL": journal, "REGENT_TEST_STEPS": str(STEPS)}
    done = subprocess.run([sys.executable, str(PROGRAM)], env=env, capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _records(journal: str, session: str) -> tuple[list, dict | None]:
    with open_journal(journal) as j:
        return list(expand(j.read(session))), j.read_checkpoint(session)


def _audit(version: str, session: str, journal: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("REGENT_TEST_VERSION", version)
    monkeypatch.setenv("REGENT_TEST_STEPS", str(STEPS))
    monkeypatch.setenv("REGENT_TEST_SESSION", session)
    monkeypatch.setenv("REGENT_TEST_JOURNAL", journal)
    monkeypatch.syspath_prepend(str(PROGRAMS))
    records, ckpt = _records(journal, session)
    return replay_program(str(PROGRAM), session, records, ckpt, url=journal, progress=False)


def test_a_patched_program_replays_histories_of_either_version_and_the_old_one_refuses_the_new(
        tmp_path, monkeypatch) -> None:
    journal = f"sqlite://{tmp_path / 'journal.db'}"
    old, new = f"v1-{uuid.uuid4().hex[:6]}", f"v2-{uuid.uuid4().hex[:6]}"
    assert _live("v1", old, journal, tmp_path)["n"] == STEPS
    result = _live("v2", new, journal, tmp_path)
    assert result["n"] == 11 * STEPS and result["ran"][:4] == ["a0", "x0", "a1", "x1"]

    # v2 over v1's history: the old branch at every step, nothing consumed.
    assert _audit("v2", old, journal, monkeypatch).ok
    assert _audit("v2", new, journal, monkeypatch).ok
    # v1 over v2's history: the marker is where v1 makes its next call.
    report = _audit("v1", new, journal, monkeypatch)
    assert not report.ok and "s.patched('extra')" in report.render(), report.render()
    # v4 dropped the old branch: it replays v2's history, and refuses v1's naming the change.
    assert _audit("v4", new, journal, monkeypatch).ok
    report = _audit("v4", old, journal, monkeypatch)
    assert not report.ok and "deprecate_patch('extra')" in report.render(), report.render()
    # A change without a marker is a divergence at the first changed call.
    report = _audit("v3", old, journal, monkeypatch)
    assert not report.ok and report.divergence is not None, report.render()

    # The markers, in the timeline and the trace.
    records, _ = _records(journal, new)
    markers = [r.data for r in records if r.kind == CALL and r.data.get("k") == "patch"]
    assert [m["m"] for m in markers] == ["extra"] * STEPS
    assert "patched('extra')" in "\n".join(timeline(records))
    trace = export_perfetto(records, new)["traceEvents"]
    assert sum(e.get("cat") == "patch" for e in trace) == STEPS


def test_patched_in_async_tasks_replays_in_the_journals_order(tmp_path, monkeypatch) -> None:
    journal = f"sqlite://{tmp_path / 'journal.db'}"
    session = f"v2a-{uuid.uuid4().hex[:6]}"
    result = _live("v2-async", session, journal, tmp_path)
    assert result["n"] == 11 * STEPS and sorted(result["ran"]) == sorted(
        [f"{t}{i}" for i in range(STEPS) for t in ("a" if i % 2 == 0 else "b", "xa" if i % 2 == 0 else "xb")])
    assert _audit("v2-async", session, journal, monkeypatch).ok


def test_journal_replay_checks_a_program_against_every_session_of_a_directory_or_prefix(tmp_path) -> None:
    # A CI check of a changed program: every recorded history, whichever version made it.
    journals = tmp_path / "journals"
    (journals / "b").mkdir(parents=True)
    first, second = f"sqlite://{journals / 'a.db'}", f"sqlite://{journals / 'b' / 'b.db'}"
    tag = uuid.uuid4().hex[:6]
    _live("v1", f"v1-{tag}", first, tmp_path)
    _live("v2", f"v2-{tag}", first, tmp_path)
    _live("v1", f"v1-{tag}-b", second, tmp_path)
    # The program learns its session from its arguments ({session}), as a user's would.
    program = tmp_path / "check.py"
    program.write_text(f"import os, runpy, sys\nos.environ['REGENT_TEST_SESSION'] = sys.argv[1]\n"
                       f"runpy.run_path({str(PROGRAM)!r}, run_name='__main__')\n")

    def replay(version: str, *args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "REGENT_TEST_VERSION": version, "REGENT_TEST_STEPS": str(STEPS),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(PROGRAMS), os.environ.get("PYTHONPATH")]))}
        return subprocess.run([sys.executable, "-m", "regent.cli", "journal", "--journal", str(journals), "replay",
                               "--program", str(program), *args, "--", "{session}"],
                              env=env, capture_output=True, text=True, timeout=120)

    ok = replay("v2")
    assert ok.returncode == 0 and "3 sessions replayed" in ok.stderr and "3 OK, 0 failed" in ok.stderr, ok.stderr
    old = replay("v1")
    assert old.returncode == 1 and "2 OK, 1 failed" in old.stderr, old.stderr
    assert f"FAILED  v2-{tag} (sqlite://{journals / 'a.db'})" in old.stderr and "s.patched('extra')" in old.stderr
    only = replay("v1", "--prefix", f"v1-{tag}")
    assert only.returncode == 0 and "2 sessions replayed" in only.stderr, only.stderr
    none = replay("v2", "--prefix", "nobody-")
    assert none.returncode == 2 and "nothing was checked" in none.stderr, none.stderr


def test_bad_change_ids_are_refused(tmp_path) -> None:
    from regent.controller import Session

    with Session(f"ids-{uuid.uuid4().hex[:6]}", journal=f"sqlite://{tmp_path / 'j.db'}") as s:
        for bad in ("", "x" * 201, "a\nb", 7):
            with pytest.raises(ValueError, match="change id"):
                s.patched(bad)
        assert s.patched("ok") is True


def test_a_v2_standby_takes_over_a_v1_primary_and_runs_the_new_call_only_from_there(tmp_path, journal_url) -> None:
    c = Cluster(f"upgrade-{uuid.uuid4().hex[:6]}", journal_url, tmp_path, program="versioned.py", steps=STEPS)
    hold = tmp_path / "hold"  # v1 waits after step 3 until it is killed
    hold.touch()
    try:
        c.start(REGENT_TEST_VERSION="v1", REGENT_TEST_HOLD_FILE=str(hold))
        primary = c.wait_leader(1)
        c.wait_step(primary, 3)
        standby = c.start(REGENT_TEST_VERSION="v2")
        c.wait_standby()
        os.kill(primary, signal.SIGKILL)
        hold.unlink()
        result = c.finish(standby)
    finally:
        c.stop_all()
    # v1 ran steps 0..3; v2 replayed them (the old branch: the journal's next record was the
    # next step's call, not a marker) and went live after step 3's call: its patch from there.
    assert result["role"] == "standby-took-over" and result["version"] == "v2"
    expected = ["a0", "a1", "a2", "a3"] + [t for i in range(3, STEPS) for t in ((f"x{i}", f"a{i + 1}"))]
    assert result["ran"] == expected[:-1], result["ran"]  # one actor: each call once, in order
    assert result["n"] == STEPS + 10 * (STEPS - 3)
