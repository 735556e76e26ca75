"""Audit replay, export and the journal timeline, on a session recorded once with a real
controller failover (primary SIGKILLed, standby finishes): the journal as a test fixture."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import zmq

from regent.controller.audit import replay_program
from regent.controller.export import export_jsonl, export_perfetto
from regent.controller.replay import expand
from regent.journal import Record, open_journal
from tests.failover.harness import Cluster

LEDGER = Path(__file__).parent / "programs" / "ledger.py"
STEPS = 30


@dataclass
class Recorded:
    session: str
    url: str
    records: list
    checkpoint: dict | None
    result: dict


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Recorded:
    tmp = tmp_path_factory.mktemp("audit")
    url = f"sqlite://{tmp / 'journal.db'}"
    c = Cluster(f"audit-{os.getpid()}", url, tmp, program=str(LEDGER), steps=STEPS,
                extra_env={"REGENT_TEST_DELAY": "0.05"})
    try:
        c.start()
        c.start()
        first = c.wait_leader(1)
        c.wait_step(first, 14)
        os.kill(first, signal.SIGKILL)
        c.by_pid(first).wait()
        result = c.finish(c.by_pid(c.wait_leader(2)))
    finally:
        c.stop_all()
    with open_journal(url) as j:
        # Calls and results one record each (replay.expand), as the tests below take them apart.
        return Recorded(c.session, url, list(expand(j.read(c.session))), j.read_checkpoint(c.session), result)


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children()}


@pytest.fixture
def sealed(monkeypatch, tmp_path):
    """This process may neither open a socket, create a zmq context nor start a process;
    REGENT_HOME is an empty folder that must stay empty (no host agent registers there)."""
    home = tmp_path / "empty-home"
    home.mkdir()
    monkeypatch.setenv("REGENT_HOME", str(home))

    def refuse(what):
        def refused(*args, **kwargs):
            raise AssertionError(f"an audit replay must not {what}")
        return refused

    monkeypatch.setattr(socket, "socket", refuse("open a socket"))
    monkeypatch.setattr(socket, "create_connection", refuse("open a socket"))
    monkeypatch.setattr(zmq.Context, "__init__", refuse("create a zmq context"))
    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("start a process"))
    monkeypatch.setattr(os, "fork", refuse("fork"))
    before = _children()
    yield home
    assert list(home.iterdir()) == [], "the audit wrote to REGENT_HOME (a host agent?)"
    assert _children() <= before, "the audit started a process"


def _replay(rec: Recorded, monkeypatch, **env: str):
    monkeypatch.setenv("REGENT_TEST_SESSION", rec.session)
    monkeypatch.setenv("REGENT_TEST_STEPS", str(STEPS))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return replay_program(str(LEDGER), rec.session, rec.records, rec.checkpoint, progress=False)


def test_the_recorded_session_has_a_failover(recorded):
    assert len({r.epoch for r in recorded.records}) == 2
    assert recorded.result["state"]["step"] == STEPS


def test_audit_of_the_unchanged_program_succeeds_with_no_process_socket_or_host_agent(
        recorded, sealed, monkeypatch, capsys):
    report = _replay(recorded, monkeypatch)
    assert report.ok, report.render()
    calls = sum(1 for r in recorded.records if r.kind == "call")
    assert report.calls == calls
    # The program saw what the session saw: its own summary line is reproduced exactly.
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["state"] == recorded.result["state"]
    assert out["counts"] == recorded.result["counts"]
    assert out["started"] == recorded.result["started"]


def test_audit_of_a_changed_program_fails_at_the_seq_of_the_change(recorded, sealed, monkeypatch):
    posts = [r.data["s"] for r in recorded.records if r.kind == "call" and r.data.get("m") == "post"
             and r.data.get("k") == "call"]
    expected_seq = posts[17]  # one post call per step: step 17's
    report = _replay(recorded, monkeypatch, REGENT_AUDIT_CHANGE_AT="17")
    assert not report.ok
    assert report.divergence["seq"] == expected_seq
    assert report.divergence["journaled"]["method"] == report.divergence["new"]["method"] == "post"
    assert report.divergence["journaled"]["digest"] != report.divergence["new"]["digest"]
    text = report.render()
    assert f"non-determinism at seq {expected_seq}" in text
    assert "! digest" in text and "! method" not in text


def test_a_result_the_journal_does_not_hold_is_reported_not_invented(recorded, sealed, monkeypatch):
    # As if the step-5 results had been large: digest and size in the journal, bytes on the worker.
    seq = [r.data["s"] for r in recorded.records if r.kind == "call" and r.data.get("m") == "post"
           and r.data.get("k") == "call"][5]
    records = [r._replace(data={"s": seq, "pt": r.data["pt"], "st": "ok", "big": [b"\0" * 16, 300_000]})
               if r.kind == "result" and r.data["s"] == seq else r for r in recorded.records]
    monkeypatch.setenv("REGENT_TEST_SESSION", recorded.session)
    report = replay_program(str(LEDGER), recorded.session, records, recorded.checkpoint, progress=False)
    assert not report.ok
    assert f"seq {seq} ledger.post" in report.outcome
    assert "300000-byte result, kept by the worker" in "\n".join(report.gaps)


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "regent.cli", "journal", *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=120)


def test_journal_replay_command_reports_ok_then_the_divergence_then_ok_after_compaction(recorded):
    env = {"REGENT_TEST_SESSION": recorded.session, "REGENT_TEST_STEPS": str(STEPS)}
    ok = _cli("--journal", recorded.url, "replay", recorded.session, "--program", str(LEDGER), env=env)
    assert ok.returncode == 0, ok.stderr
    assert "OK" in ok.stderr and "from the start of the run" in ok.stderr
    bad = _cli("--journal", recorded.url, "replay", recorded.session, "--program", str(LEDGER),
               env={**env, "REGENT_AUDIT_CHANGE_AT": "3"})
    assert bad.returncode == 1
    assert "first divergence at seq" in bad.stderr and "FAILED" in bad.stderr
    # Compacted: the calls a checkpoint covers are gone, and the audit starts from it.
    assert _cli("--journal", recorded.url, "compact", recorded.session).returncode == 0
    after = _cli("--journal", recorded.url, "replay", recorded.session, "--program", str(LEDGER), env=env)
    assert after.returncode == 0, after.stderr
    assert "from the checkpoint at seq" in after.stderr


def test_perfetto_export_has_a_track_per_actor_spans_for_calls_and_markers(recorded, tmp_path):
    sup = Record(recorded.records[-1].lsn + 1, recorded.records[-1].epoch, "sup",
                 {"ev": "restart", "mesh": "ledger", "rank": 1, "t": 0.0}, recorded.records[-1].ts)
    trace = json.loads(json.dumps(export_perfetto([*recorded.records, sup], recorded.session)))
    events = trace["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert {"ledger[0]", "ledger[1]", "program"} <= set(names.values())
    spans = [e for e in events if e["ph"] == "X"]
    for track in ("ledger[0]", "ledger[1]"):
        mine = sorted((e for e in spans if names[(e["pid"], e["tid"])] == track), key=lambda e: e["ts"])
        assert sum(1 for e in mine if e["name"] == "post") >= STEPS
        for a, b in zip(mine, mine[1:], strict=False):  # slices of a track never overlap
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-3
    refused = [e for e in spans if e["name"] == "refuse"]
    assert refused and all(e["args"]["status"] == "err" for e in refused)
    failovers = [e for e in events if e.get("cat") == "failover"]
    assert len(failovers) == 1 and failovers[0]["ph"] == "i"
    assert failovers[0]["args"]["to_epoch"] > failovers[0]["args"]["from_epoch"]
    assert len([e for e in events if e.get("cat") == "checkpoint"]) >= STEPS // 10
    restarts = [e for e in events if e.get("cat") == "restart"]
    assert len(restarts) == 1 and names[(restarts[0]["pid"], restarts[0]["tid"])] == "ledger[1]"
    # The command writes the same format to a file.
    out = tmp_path / "trace.json"
    done = _cli("--journal", recorded.url, "export", recorded.session, "--format", "perfetto", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert {e["ph"] for e in json.loads(out.read_text())["traceEvents"]} >= {"M", "X", "i"}


def test_jsonl_export_is_one_record_per_line(recorded):
    lines = [json.loads(line) for line in export_jsonl(recorded.records)]
    assert [x["lsn"] for x in lines] == [r.lsn for r in recorded.records]
    assert {x["kind"] for x in lines} >= {"start", "call", "result", "session_end"}
    done = _cli("--journal", recorded.url, "export", recorded.session, "--format", "jsonl")
    assert done.returncode == 0, done.stderr
    assert all(json.loads(line)["kind"] for line in done.stdout.splitlines())


def test_journal_show_filters_by_actor_endpoint_errors_and_time(recorded):
    def show(*flags: str) -> list[str]:
        done = _cli("--journal", recorded.url, "show", recorded.session, *flags)
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    with open_journal(recorded.url) as j:
        records = list(expand(j.read(recorded.session)))  # another test may have compacted it
    everything = show()
    assert len(everything) == len(records)
    ledger = show("--actor", "ledger")
    assert ledger and all("ledger" in line for line in ledger) and len(ledger) < len(everything)
    refuse = show("--endpoint", "refuse")
    calls = sum(1 for r in records if r.kind == "call" and r.data.get("m") == "refuse")
    assert len(refuse) == 2 * calls and all(".refuse" in line for line in refuse)  # call + result
    errors = show("--errors")
    assert len(errors) == calls and all("ERR ValueError" in line for line in errors)
    assert show("--actor", "nobody") == []
    mid = records[len(records) // 2]
    later = show("--since", repr(mid.ts))
    # A batched record (one lsn) stands for several calls and results, each with its own time.
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    for r in records:
        first[r.lsn], last[r.lsn] = min(first.get(r.lsn, r.ts), r.ts), max(last.get(r.lsn, r.ts), r.ts)
    shown = [int(line.split()[0]) for line in later]
    assert shown and all(last[lsn] >= mid.ts for lsn in shown) and mid.lsn in shown
    earlier = [int(line.split()[0]) for line in show("--until", repr(mid.ts))]
    assert all(first[lsn] <= mid.ts for lsn in earlier) and len(earlier) + len(shown) >= len(everything)


def test_a_run_that_has_not_ended_passes_up_to_where_its_journal_stops(recorded, sealed, monkeypatch):
    # The journal as a standby would find it mid-run: the first 60% of the records, no end.
    cut = recorded.records[: len(recorded.records) * 6 // 10]
    assert all(r.kind != "session_end" for r in cut)
    monkeypatch.setenv("REGENT_TEST_SESSION", recorded.session)
    monkeypatch.setenv("REGENT_TEST_STEPS", str(STEPS))
    report = replay_program(str(LEDGER), recorded.session, cut, None, progress=False)
    assert report.ok, report.render()
    assert "has not ended" in report.outcome
    assert report.calls == sum(1 for r in cut if r.kind == "call")


def _post_seqs(rec: Recorded) -> list[int]:
    return [r.data["s"] for r in rec.records if r.kind == "call" and r.data.get("m") == "post"
            and r.data.get("k") == "call"]


def test_a_run_that_has_not_ended_passes_up_to_a_result_not_journaled_yet(recorded, sealed, monkeypatch):
    # The journal of a live run, as `regent upgrade` checks it: the call of step 12 is journaled,
    # its results not yet (group commit writes them after the fact). That is the live end.
    seq = _post_seqs(recorded)[12]
    first_result = next(i for i, r in enumerate(recorded.records) if r.kind == "result" and r.data["s"] == seq)
    cut = recorded.records[:first_result]
    monkeypatch.setenv("REGENT_TEST_SESSION", recorded.session)
    monkeypatch.setenv("REGENT_TEST_STEPS", str(STEPS))
    report = replay_program(str(LEDGER), recorded.session, cut, None, progress=False)
    assert report.ok, report.render()
    assert f"waits for the result of seq {seq} ledger.post" in report.outcome and "has not ended" in report.outcome
    assert not report.gaps, report.gaps


def test_a_result_missing_from_a_run_that_ended_is_still_a_gap(recorded, sealed, monkeypatch):
    seq = _post_seqs(recorded)[12]
    records = [r for r in recorded.records if not (r.kind == "result" and r.data["s"] == seq)]
    monkeypatch.setenv("REGENT_TEST_SESSION", recorded.session)
    monkeypatch.setenv("REGENT_TEST_STEPS", str(STEPS))
    report = replay_program(str(LEDGER), recorded.session, records, recorded.checkpoint, progress=False)
    assert not report.ok
    assert f"seq {seq} ledger.post" in report.outcome and "journal does not hold" in report.outcome


def test_a_program_that_stops_early_diverges_where_the_journal_goes_on(recorded, sealed, monkeypatch):
    report = _replay(recorded, monkeypatch, REGENT_TEST_STEPS=str(STEPS - 5))
    assert not report.ok
    posts = [r.data["s"] for r in recorded.records if r.kind == "call" and r.data.get("m") == "post"
             and r.data.get("k") == "call"]
    assert report.divergence["seq"] == posts[STEPS - 5]
    assert (report.divergence["journaled"]["method"], report.divergence["new"]["method"]) == ("post", "count")


def test_a_stream_deadline_that_passed_is_replayed_where_it_happened(tmp_path, monkeypatch, capsys):
    program = Path(__file__).parent / "programs" / "deadline.py"
    url, session = f"sqlite://{tmp_path / 'j.db'}", f"deadline-{os.getpid()}"
    env = {**os.environ, "REGENT_TEST_SESSION": session, "REGENT_TEST_JOURNAL": url}
    live = subprocess.run([sys.executable, str(program)], capture_output=True, text=True, env=env, timeout=120)
    assert live.returncode == 0, live.stderr
    recorded = json.loads(live.stdout.strip().splitlines()[-1])
    assert recorded["timed_out"] and 2 not in recorded["seen"], recorded
    with open_journal(url) as j:
        records, checkpoint = list(j.read(session)), j.read_checkpoint(session)
    assert any(r.kind == "obs" and r.data.get("w") == "timeout" for r in records)
    monkeypatch.setenv("REGENT_TEST_SESSION", session)
    monkeypatch.setenv("REGENT_TEST_JOURNAL", url)
    report = replay_program(str(program), session, records, checkpoint, progress=False)
    assert report.ok, report.render()
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == recorded
