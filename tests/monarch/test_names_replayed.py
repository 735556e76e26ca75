"""Whether a mesh name may be spawned again depends on what the leader saw (its mesh alive, or
its procs dead); a replay of the journal makes the leader's decision, refusal included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from regent.controller.audit import replay_program
from regent.journal import open_journal

PROGRAM = Path(__file__).parent / "programs" / "names_reused.py"


@pytest.mark.timeout(180)
def test_a_replay_refuses_a_name_the_leader_refused_and_respawns_one_it_respawned(tmp_path, monkeypatch, capsys):
    url, session = f"sqlite://{tmp_path / 'j.db'}", f"names-{os.getpid()}"
    env = {**os.environ, "REGENT_TEST_SESSION": session, "REGENT_TEST_JOURNAL": url}
    live = subprocess.run([sys.executable, str(PROGRAM)], capture_output=True, text=True, env=env, timeout=150)
    assert live.returncode == 0, live.stderr
    recorded = json.loads(live.stdout.strip().splitlines()[-1])
    assert "already exists" in recorded["refused"] and recorded["crashed"] and recorded["again"] == "ok", recorded
    with open_journal(url) as j:
        records, checkpoint = list(j.read(session)), j.read_checkpoint(session)
    monkeypatch.setenv("REGENT_TEST_SESSION", session)
    monkeypatch.setenv("REGENT_TEST_JOURNAL", url)
    report = replay_program(str(PROGRAM), session, records, checkpoint, progress=False)
    assert report.ok, report.render()
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == recorded
