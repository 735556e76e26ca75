"""A SIGKILLed host agent is replaced at its own address, and the new one adopts the
procs the dead one left: it supervises them, answers replayed spawns with them, stops
them at session end or as orphans. Real host agents and procs, each test in its own
REGENT_HOME (so its own agent)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from regent import wire
from regent.controller import Session, SupervisionError
from regent.wire import Kind
from regent.wire.security import load_credentials
from regent.worker import Actor, context, endpoint
from regent.worker.discovery import ensure_local_host
from regent.worker.fencing import FenceStore
from regent.worker.procinfo import running
from regent.worker.supervision import RestartPolicy
from tests.runtime.rawpeer import RawPeer
from tests.support.agenthome import agent_record as _agent
from tests.support.agenthome import ask as _ask
from tests.support.agenthome import successor as _successor
from tests.support.agenthome import wait_for as _wait

ORPHAN_PROGRAM = Path(__file__).resolve().parent.parent / "supervision" / "orphan_program.py"


class Counter(Actor):
    def __init__(self) -> None:
        self.n = 0

    @endpoint
    def incr(self) -> tuple[int, int, int]:
        self.n += 1
        return os.getpid(), context().incarnation, self.n


def _retry(mesh, rank: int, timeout: float = 20.0):
    """The first call to `rank` that succeeds (calls in flight at a crash fail)."""
    deadline = time.monotonic() + timeout
    failures = 0
    while True:
        try:
            return mesh.slice(procs=rank).incr.call_one().get(timeout=timeout), failures
        except SupervisionError:
            failures += 1
            assert time.monotonic() < deadline, "the killed member never came back"
            time.sleep(0.05)


def _counters_then_kill_the_agent(s: Session, home: Path, procs: int):
    """A supervised Counter on each of `procs` procs, then SIGKILL of the host agent.
    Returns the mesh, the procs' pids and the dead agent's host.json record."""
    mesh = s.spawn_procs(per_host={"procs": procs}).spawn("c", Counter, restart=RestartPolicy(restart="permanent"))
    pids = [pid for pid, _, _ in mesh.incr.call().get(timeout=10).values()]
    dead = _agent(home)
    os.kill(dead["pid"], signal.SIGKILL)
    return mesh, pids, dead


def test_a_sigkilled_host_agent_is_replaced_at_its_address_and_supervises_the_procs_it_left(home):
    with Session("agent-restart", journal="off") as s:
        mesh, pids, dead = _counters_then_kill_the_agent(s, home, 3)
        # Calls go straight to the procs: they flow while the agent is replaced.
        calls = 1
        deadline = time.monotonic() + 10
        while True:
            values = mesh.incr.call().get(timeout=10).values()
            calls += 1
            try:
                new = _agent(home)
                if new["pid"] != dead["pid"] and running(new["pid"]):
                    break
            except (OSError, ValueError):
                pass
            assert time.monotonic() < deadline, "no new host agent within 10 s"
            time.sleep(0.05)
        assert new["address"] == dead["address"], "the new agent must serve at the old address"
        assert values == [(pid, 0, calls) for pid in pids], "the same processes, their state intact"

        peer = RawPeer(load_credentials())
        try:
            def adopted() -> bool:
                listed = peer.ask_host(new["address"], s.sid, s.epoch, "list")["procs"]
                return sorted(p["pid"] for p in listed if p["alive"]) == sorted(pids)

            _wait(adopted, 10, "the new agent lists the procs it adopted")
        finally:
            peer.close()

        # An adopted proc dies: the new agent reports it, the policy restarts it.
        os.kill(pids[1], signal.SIGKILL)
        (pid, incarnation, n), _ = _retry(mesh, 1)
        assert pid != pids[1] and incarnation == 1 and n == 1
        after = mesh.incr.call().get(timeout=10).values()
        assert [after[0], after[2]] == [(pids[0], 0, calls + 1), (pids[2], 0, calls + 1)]
        assert any(e["ev"] == "restart" for e in s._supervisor.events)
        everyone = [*pids, pid]
    # stop_session went to the new agent, which stopped what it adopted and what it started.
    assert [p for p in everyone if running(p)] == [], "procs left running after the session ended"


def test_a_proc_that_dies_while_no_host_agent_runs_is_reported_by_the_new_one_and_restarted(home):
    with Session("agent-restart-gap", journal="off") as s:
        mesh, pids, dead = _counters_then_kill_the_agent(s, home, 2)
        os.kill(pids[0], signal.SIGKILL)  # before any new agent can adopt it: nobody saw it die
        _successor(home, dead)
        (pid, incarnation, n), _ = _retry(mesh, 0, timeout=30)
        assert pid != pids[0] and incarnation == 1 and n == 1
        assert mesh.slice(procs=1).incr.call_one().get(timeout=10) == (pids[1], 0, 2)
        everyone = [*pids, pid]
    assert [p for p in everyone if running(p)] == []


def test_a_replayed_spawn_gets_the_procs_the_dead_agent_started(home):
    """Spawn dedupe survives the agent: the adopted procs say which request started them."""
    sid = f"agent-restart-dedupe-{os.getpid()}"
    host = ensure_local_host()
    peer = RawPeer(load_credentials())
    env = [{"REGENT_PROC_RANK": str(i), "REGENT_PROC_DIM": "procs"} for i in range(2)]
    try:
        kept = _ask(peer, host, sid, "spawn_procs", s=1, count=2, envs=env)["procs"]
        replaced = _ask(peer, host, sid, "respawn_proc", old="some-dead-proc", idx=7, env=env[0])["procs"]
        halved = _ask(peer, host, sid, "spawn_procs", s=2, count=2, envs=env)["procs"]
        dead = _agent(home)
        os.kill(dead["pid"], signal.SIGKILL)
        os.kill(halved[1]["pid"], signal.SIGKILL)  # dies with the agent, never adopted
        assert _successor(home, dead)["address"] == host
        # Asked again under the same call ids: the same processes, nothing started twice.
        assert _ask(peer, host, sid, "spawn_procs", s=1, count=2, envs=env)["procs"] == kept
        assert _ask(peer, host, sid, "respawn_proc", old="some-dead-proc", idx=7, env=env[0])["procs"] == replaced
        # Half of a spawn survived: its dead half is started afresh, at the same index.
        again = _ask(peer, host, sid, "spawn_procs", s=2, count=2, envs=env)["procs"]
        assert again[0] == halved[0]
        assert again[1]["idx"] == halved[1]["idx"] and again[1]["pid"] != halved[1]["pid"]
        fresh = _ask(peer, host, sid, "spawn_procs", s=3, count=1, envs=env[:1])["procs"]
        everyone = [p["pid"] for p in kept + replaced + again + fresh]
        assert len(set(everyone)) == 6 and all(running(p) for p in everyone)
        _ask(peer, host, sid, "stop_session")
        assert [p for p in everyone if running(p)] == []
    finally:
        peer.close()


def test_a_replacement_that_dies_while_starting_is_started_afresh_when_asked_again(home, tmp_path):
    """The supervisor (or a new leader) asks again for a proc whose replacement died before
    it was ready: it gets a new process, not that failure for ever."""
    sid = f"agent-respawn-retry-{os.getpid()}"
    crash = tmp_path / "crash-once"
    crash.write_text("")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os\n"
        f"if os.path.exists({str(crash)!r}):\n"
        f"    os.unlink({str(crash)!r})\n"
        "    os._exit(3)\n")
    host = ensure_local_host()
    peer = RawPeer(load_credentials())
    try:
        fields = {"old": "gone-0", "idx": 0, "env": {}, "path": [str(site)]}
        n = 1
        peer.send(host, wire.encode(Kind.HOST_REQ, {"sid": sid, "e": 1, "op": "respawn_proc", "n": n,
                                                     "rt": peer.address, **fields}))
        while (got := peer.recv(20))[0] is not Kind.HOST_REP:
            assert got[0] is Kind.HOST_EVENT and got[1]["ev"] == "proc_died", got
        reply = got[1]
        assert reply["st"] == "err", reply
        assert "exited with status 3 while starting" in reply["em"]
        again = _ask(peer, host, sid, "respawn_proc", **fields)["procs"]
        assert len(again) == 1 and running(again[0]["pid"])
        assert _ask(peer, host, sid, "respawn_proc", **fields)["procs"] == again  # now deduped
        _ask(peer, host, sid, "stop_session")
    finally:
        peer.close()


def test_a_restarted_agent_reports_deaths_it_saw_before_any_controller_said_hello(home):
    sid = f"agent-restart-hello-{os.getpid()}"
    host = ensure_local_host()
    peer = RawPeer(load_credentials())
    try:
        procs = _ask(peer, host, sid, "spawn_procs", s=1, count=3, envs=[{}] * 3)["procs"]
        dead = _agent(home)
        os.kill(dead["pid"], signal.SIGKILL)
        os.kill(procs[2]["pid"], signal.SIGKILL)  # dies unwatched
        _successor(home, dead)
        _wait(lambda: len([p for p in _ask(peer, host, sid, "list")["procs"] if p["alive"]]) == 2, 10,
              "the two survivors adopted")
        os.kill(procs[0]["pid"], signal.SIGKILL)  # dies adopted, before any hello
        _wait(lambda: len(_ask(peer, host, sid, "list")["procs"]) == 1, 10, "the agent saw it die")
        time.sleep(5.5)  # past the adoption grace: the agent's list is complete
        reply = _ask(peer, host, sid, "hello")
        assert reply["complete"] is True and reply["at"] == host
        assert [p["id"] for p in reply["procs"]] == [procs[1]["id"]]  # the one that died unwatched is absent
        kind, event, _ = peer.recv()
        assert kind is Kind.HOST_EVENT and event["ev"] == "proc_died"
        assert event["id"] == procs[0]["id"] and event["status"] is None  # adopted: no exit status
        _ask(peer, host, sid, "stop_session")
        assert not running(procs[1]["pid"])
    finally:
        peer.close()


def test_procs_adopted_while_no_controller_is_connected_are_stopped_after_the_orphan_timeout(home):
    program = subprocess.Popen([sys.executable, str(ORPHAN_PROGRAM), f"agent-orphans-{os.getpid()}", "3", "600"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        pids = json.loads(program.stdout.readline())["pids"]
    finally:
        program.kill()
        program.wait()
    dead = _agent(home)
    os.kill(dead["pid"], signal.SIGKILL)
    _successor(home, dead)
    time.sleep(1.0)
    # Adopted (the orphan timeout counts from adoption: no controller has spoken to this agent) ...
    assert all(running(p) for p in pids), "stopped before the orphan timeout"
    # ... and stopped once the session's own orphan timeout (3 s, carried by the procs) has passed.
    _wait(lambda: not any(running(p) for p in pids), 15, "orphaned procs stopped")


def _env(count: int) -> list[dict]:
    return [{"REGENT_PROC_RANK": str(i), "REGENT_PROC_DIM": "procs"} for i in range(count)]


def _alive(peer: RawPeer, host: str, sid: str, epoch: int = 1) -> list[dict]:
    return [p for p in _ask(peer, host, sid, "list", epoch=epoch)["procs"] if p["alive"]]


def test_a_spawn_call_id_reused_for_another_spawn_is_a_divergence_and_starts_nothing(home):
    sid = f"agent-spawn-divergence-{os.getpid()}"
    host = ensure_local_host()
    peer = RawPeer(load_credentials())
    try:
        first = _ask(peer, host, sid, "spawn_procs", s=1, count=2, envs=_env(2), d=b"two")["procs"]
        for other in ({"count": 1, "envs": _env(1), "d": b"two"}, {"count": 2, "envs": _env(2), "d": b"else"}):
            reply = _ask(peer, host, sid, "spawn_procs", expect="divergence", s=1, **other)
            assert "call seq 1 was first asked as spawn_procs of 2 procs" in reply["em"], reply
        assert _ask(peer, host, sid, "spawn_procs", s=1, count=2, envs=_env(2), d=b"two")["procs"] == first
        # In flight: the second request is refused at once, not joined to the first one's answer.
        for n, count in ((101, 1), (102, 2)):
            peer.send(host, wire.encode(Kind.HOST_REQ, {"sid": sid, "e": 1, "op": "spawn_procs", "n": n,
                                                         "rt": peer.address, "s": 2, "count": count,
                                                         "envs": _env(count), "d": b"x"}))
        replies = []
        while len(replies) < 2:
            kind, reply, _ = peer.recv(20)
            if kind is Kind.HOST_REP:
                replies.append(reply)
        assert [(r["n"], r["st"]) for r in replies] == [(102, "divergence"), (101, "ok")], replies
        assert len(replies[1]["procs"]) == 1
        replaced = _ask(peer, host, sid, "respawn_proc", old="gone-0", idx=5, env={})["procs"]
        reply = _ask(peer, host, sid, "respawn_proc", expect="divergence", old="gone-0", idx=6, env={})
        assert "respawn_proc at index 5" in reply["em"] and "index 6" in reply["em"], reply
        assert sorted(p["pid"] for p in _alive(peer, host, sid)) == sorted(
            p["pid"] for p in first + replies[1]["procs"] + replaced), "a divergent request started a proc"
        _ask(peer, host, sid, "stop_session")
    finally:
        peer.close()


def test_a_restarted_agent_refuses_a_spawn_call_id_reused_for_another_spawn(home):
    """The spawn's identity comes back with the procs that adopt the new agent."""
    sid = f"agent-restart-divergence-{os.getpid()}"
    host = ensure_local_host()
    peer = RawPeer(load_credentials())
    try:
        first = _ask(peer, host, sid, "spawn_procs", s=1, count=2, envs=_env(2), d=b"two")["procs"]
        dead = _agent(home)
        os.kill(dead["pid"], signal.SIGKILL)
        _successor(home, dead)
        _wait(lambda: len(_alive(peer, host, sid)) == 2, 10, "both procs adopted")
        reply = _ask(peer, host, sid, "spawn_procs", expect="divergence", s=1, count=2, envs=_env(2), d=b"else")
        assert "digest " + b"two".hex() in reply["em"], reply
        assert _ask(peer, host, sid, "spawn_procs", s=1, count=2, envs=_env(2), d=b"two")["procs"] == first
        _ask(peer, host, sid, "stop_session")
    finally:
        peer.close()


def test_an_actors_spawn_is_keyed_by_seq_and_origin_and_a_restarted_agent_knows_it_again(home):
    """An actor's spawn_procs carries the derived id's origin: under the controller's seq it is
    another request, answered with the same procs when asked again, by this agent or (from
    the procs' own account) by its successor."""
    sid = f"agent-actor-spawn-{os.getpid()}"
    host = ensure_local_host()
    peer = RawPeer(load_credentials())
    try:
        mine = _ask(peer, host, sid, "spawn_procs", s=4, count=1, envs=_env(1), d=b"one")["procs"]
        actors = _ask(peer, host, sid, "spawn_procs", s=4, o="trainer[0]#0", count=1, envs=_env(1), d=b"one")["procs"]
        assert {p["id"] for p in mine}.isdisjoint(p["id"] for p in actors)
        again = _ask(peer, host, sid, "spawn_procs", s=4, o="trainer[0]#0", count=1, envs=_env(1), d=b"one")["procs"]
        assert again == actors
        dead = _agent(home)
        os.kill(dead["pid"], signal.SIGKILL)
        _successor(home, dead)
        _wait(lambda: len(_alive(peer, host, sid)) == 2, 10, "both procs adopted")
        after = _ask(peer, host, sid, "spawn_procs", s=4, o="trainer[0]#0", count=1, envs=_env(1), d=b"one")["procs"]
        assert [p["id"] for p in after] == [p["id"] for p in actors]
        reply = _ask(peer, host, sid, "spawn_procs", expect="divergence", s=4, o="trainer[0]#0", count=2,
                     envs=_env(2), d=b"one")
        assert "spawn_procs of 1 procs" in reply["em"], reply
        _ask(peer, host, sid, "stop_session")
    finally:
        peer.close()


def test_a_restarted_agent_refuses_an_epoch_below_one_its_predecessor_saw_and_so_do_its_procs(home):
    """Epoch 7 reached only the agent (a hello); after its SIGKILL the procs start a new one,
    which refuses epoch 3 (stop_procs, hello) and tells the procs it adopts of epoch 7."""
    sid = f"agent-restart-fence-{os.getpid()}"
    host = ensure_local_host()
    peer = RawPeer(load_credentials())
    try:
        procs = _ask(peer, host, sid, "spawn_procs", s=1, count=2, envs=_env(2))["procs"]
        _ask(peer, host, sid, "hello", epoch=7)
        dead = _agent(home)
        os.kill(dead["pid"], signal.SIGKILL)
        _successor(home, dead)
        reply = _ask(peer, host, sid, "stop_procs", epoch=3, expect="fenced", ids=[p["id"] for p in procs])
        assert reply["e"] == 7 and "deposed" in reply["em"]
        _ask(peer, host, sid, "hello", epoch=3, expect="fenced")  # no subscribing to the leader's events
        _wait(lambda: len(_alive(peer, host, sid, epoch=7)) == 2, 10, "both procs adopted")
        assert all(running(p["pid"]) for p in procs)
        for p in procs:  # each adopted proc learns epoch 7 from the agent that adopted it
            # That notice and this call come from two senders, in no set order: until the
            # notice lands the proc answers that no such actor exists (it runs nothing either way).
            deadline, seq = time.monotonic() + 10, 10
            while True:
                seq += 1  # a new call each time: a repeated id would get the first answer again
                peer.call(p["addr"], sid, 3, seq, "nobody", "m", point=p["idx"])
                kind, meta, _ = peer.recv()
                if (kind, meta["st"]) != (Kind.RESULT, "noactor") or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert (kind, meta["st"], meta.get("e")) == (Kind.RESULT, "fenced", 7), meta
        _ask(peer, host, sid, "stop_session", epoch=7)
    finally:
        peer.close()


def test_a_restarted_agent_refuses_a_lower_epoch_before_any_proc_has_adopted_it(home):
    """No procs at all: only the fence on disk can tell the new agent about epoch 7."""
    sid = f"agent-restart-fence-disk-{os.getpid()}"
    host = ensure_local_host()
    peer = RawPeer(load_credentials())
    try:
        _ask(peer, host, sid, "hello", epoch=7)
        dead = _agent(home)
        os.kill(dead["pid"], signal.SIGKILL)
        _wait(lambda: not running(dead["pid"]), 5, "the agent died")
        assert ensure_local_host() == host  # a successor at the same address, with nothing to adopt
        reply = _ask(peer, host, sid, "hello", epoch=3, expect="fenced")
        assert reply["e"] == 7
        _ask(peer, host, sid, "hello", epoch=8)
        assert FenceStore(home / "fences").load(sid) == 8
        files = list((home / "fences").iterdir())
        assert len(files) == 1 and files[0].stat().st_mode & 0o777 == 0o600, files
        assert (home / "fences").stat().st_mode & 0o777 == 0o700
    finally:
        peer.close()


def test_a_restarted_agent_takes_the_epoch_its_procs_saw_when_they_adopt_it(home):
    """Epoch 9 reached only the procs (a takeover's fence): they report it on adoption."""
    sid = f"agent-restart-fence-adopt-{os.getpid()}"
    host = ensure_local_host()
    peer = RawPeer(load_credentials())
    try:
        procs = _ask(peer, host, sid, "spawn_procs", s=1, count=2, envs=_env(2))["procs"]
        for p in procs:
            peer.send(p["addr"], wire.encode(Kind.FENCE, {"sid": sid, "e": 9, "rt": peer.address, "n": 1}))
            assert peer.recv()[1]["e"] == 9
        dead = _agent(home)
        os.kill(dead["pid"], signal.SIGKILL)
        _successor(home, dead)

        def raised() -> bool:  # epoch 1 is what the agent had seen itself: asking at it raises nothing
            reply = _ask(peer, host, sid, "list", expect=None)
            return reply["st"] == "fenced" and reply["e"] == 9

        _wait(raised, 10, "an adopted proc raised the new agent's fence to 9")
        reply = _ask(peer, host, sid, "stop_procs", epoch=5, expect="fenced", ids=[p["id"] for p in procs])
        assert reply["e"] == 9
        assert all(running(p["pid"]) for p in procs)
        _ask(peer, host, sid, "stop_session", epoch=9)
    finally:
        peer.close()


def test_a_proc_started_to_replace_another_refuses_an_epoch_below_its_session_s(home):
    """A new process knows its session's fence from the agent that starts it."""
    sid = f"agent-respawn-fence-{os.getpid()}"
    host = ensure_local_host()
    peer = RawPeer(load_credentials())
    try:
        _ask(peer, host, sid, "spawn_procs", s=1, count=1, envs=_env(1))
        _ask(peer, host, sid, "hello", epoch=7)
        (new,) = _ask(peer, host, sid, "respawn_proc", epoch=7, old="gone-0", idx=0, env={})["procs"]
        peer.call(new["addr"], sid, 3, 10, "nobody", "m")
        kind, meta, _ = peer.recv()
        assert (kind, meta["st"], meta.get("e")) == (Kind.RESULT, "fenced", 7), meta
        _ask(peer, host, sid, "stop_session", epoch=7)
    finally:
        peer.close()
