"""Procs forked from the host agent's zygote (the default; REGENT_FORK=0 turns it off; worker/zygote.py): the same
procs to the controller, to supervision, to adoption and to `kill_host` as procs started as
fresh processes, but their host imports torch once. Real agents and procs, each test in a
REGENT_HOME of its own."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch  # imported here so the controller asks its hosts' zygotes to preload it

from regent.chaos.faults import host_processes, kill_host
from regent.controller import Session, SupervisionError
from regent.worker import Actor, endpoint
from regent.worker.procinfo import proc_info, running
from regent.worker.supervision import RestartPolicy
from regent.worker.zygote import wanted_preload
from tests.support.agenthome import agent_record, successor, wait_for


class Probe(Actor):
    @endpoint
    def who(self) -> dict:

        return {"pid": os.getpid(), "ppid": os.getppid(), "rank": os.environ.get("REGENT_PROC_RANK"),
                "seed": torch.initial_seed(),
                "sid": os.getsid(0)}

    @endpoint
    def has(self, module: str) -> bool:
        return module in sys.modules

    @endpoint
    def scanned(self, module: str) -> bool:
        """Whether a full collection in this proc would look at `module`'s namespace."""
        import gc

        namespace = sys.modules[module].__dict__
        return any(o is namespace for o in gc.get_objects())

    @endpoint
    def exit_with(self, code: int) -> None:
        os._exit(code)


def _cmdline(pid: int) -> list[str]:
    return psutil.Process(pid).cmdline()


def _mapped(pid: int, library: str) -> bool:
    return library in Path(f"/proc/{pid}/maps").read_text()


@pytest.fixture()
def forking(own_home) -> Path:
    return own_home(REGENT_FORK="1")


def _who(mesh) -> list[dict]:
    return sorted(mesh.who.call().get(timeout=60).values(), key=lambda w: w["rank"])


def test_procs_are_forked_from_one_zygote_that_imported_torch_once(forking):
    assert "torch" in wanted_preload()
    with Session("fork-basic", journal="off") as s:
        mesh = s.spawn_procs(per_host={"procs": 3}).spawn("p", Probe)
        who = _who(mesh)
        agent = agent_record(forking)["pid"]
        zygotes = {w["ppid"] for w in who}
        assert len(zygotes) == 1, who  # one zygote for the three procs
        zygote = zygotes.pop()
        assert zygote != agent and "regent.worker.zygote" in _cmdline(zygote)
        assert psutil.Process(zygote).ppid() == agent
        assert [w["rank"] for w in who] == ["0", "1", "2"]  # each its own environment
        assert _mapped(zygote, "libtorch")  # the zygote imported torch; its children came with it
        assert len({w["seed"] for w in who}) == 3  # reseeded: no two share a generator
        assert len({w["sid"] for w in who}) == 3 and all(w["sid"] == w["pid"] for w in who)
        for w in who:  # its command line is the one a fresh proc has: adoption and kill_host read it
            argv = _cmdline(w["pid"])
            assert argv[1:3] == ["-m", "regent.worker.proc"] and argv[argv.index("--host-pid") + 1] == str(agent)
            info = proc_info(w["pid"])
            assert info is not None and info.session == s.sid and info.index == int(w["rank"])
        assert sorted(host_processes(agent)) == sorted([zygote, *(w["pid"] for w in who)])
        # A second mesh of the same environment forks from the same zygote, without waiting.
        started = time.monotonic()
        more = _who(s.spawn_procs(per_host={"procs": 2}).spawn("q", Probe))
        assert {w["ppid"] for w in more} == {zygote}
        assert time.monotonic() - started < 30


def test_what_a_proc_imported_is_out_of_its_collections_scans(own_home):
    # Forked: torch, which the zygote imported (~200k objects: ~90 ms a full collection, and a
    # collection writing to their pages would copy them out of the zygote's). Fresh: its imports.
    for fork in ("1", "0"):
        own_home(REGENT_FORK=fork)
        with Session(f"fork-gc-{fork}", journal="off") as s:
            mesh = s.spawn_procs(per_host={"procs": 2}).spawn("p", Probe)
            assert mesh.scanned.call("regent.worker.proccore").get(timeout=60).values() == [False, False]
            if fork == "1":
                assert mesh.scanned.call("torch").get(timeout=60).values() == [False, False]
            assert mesh.scanned.call(__name__).get(timeout=60).values() == [True, True]  # imported later


def test_a_forked_proc_that_dies_is_reported_with_its_status_and_restarted(forking):
    with Session("fork-death", journal="off") as s:
        mesh = s.spawn_procs(per_host={"procs": 2}).spawn("p", Probe, restart=RestartPolicy(restart="permanent"))
        before = _who(mesh)
        with pytest.raises(SupervisionError, match="exited with status 7"):
            mesh.slice(procs=0).exit_with.call_one(7).get(timeout=20)
        os.kill(before[1]["pid"], signal.SIGKILL)
        after = wait_for(lambda: _alive_who(mesh, before), 60, "both procs restarted")
        assert {w["ppid"] for w in after} == {before[0]["ppid"]}  # forked again by the zygote


def _alive_who(mesh, before: list[dict]) -> list[dict] | None:
    try:
        who = _who(mesh)
    except SupervisionError:
        return None
    return who if all(a["pid"] != b["pid"] for a, b in zip(who, before, strict=True)) else None


def test_session_end_stops_forked_procs(forking):
    with Session("fork-stop", journal="off") as s:
        pids = [w["pid"] for w in _who(s.spawn_procs(per_host={"procs": 2}).spawn("p", Probe))]
    wait_for(lambda: not any(running(p) for p in pids), 15, "the session's forked procs stopped")


def test_kill_host_kills_the_agent_its_zygote_and_its_forked_procs_together(forking):
    with Session("fork-kill-host", journal="off") as s:
        who = _who(s.spawn_procs(per_host={"procs": 2}).spawn("p", Probe))
        agent = agent_record(forking)["pid"]
        event = kill_host(agent)
        killed = set(event.detail["procs"])
        assert {who[0]["ppid"], *(w["pid"] for w in who)} <= killed
        assert not any(running(p) for p in [agent, *killed])


def test_forked_procs_adopt_a_new_agent_when_theirs_is_sigkilled(forking):
    with Session("fork-adopt", journal="off") as s:
        mesh = s.spawn_procs(per_host={"procs": 2}).spawn("p", Probe, restart=RestartPolicy(restart="permanent"))
        before = _who(mesh)
        dead = agent_record(forking)
        os.kill(dead["pid"], signal.SIGKILL)
        new = successor(forking, dead, timeout=20)
        # The zygote goes with its agent; its children live on and adopt the successor.
        wait_for(lambda: not running(before[0]["ppid"]), 10, "the dead agent's zygote exited")
        assert [w["pid"] for w in _who(mesh)] == [w["pid"] for w in before]
        wait_for(lambda: set(host_processes(new["pid"])) >= {w["pid"] for w in before}, 20,
                 "the successor supervises the forked procs")
        os.kill(before[0]["pid"], signal.SIGKILL)  # reported by the successor, then restarted
        wait_for(lambda: _restarted(mesh, before[0]["pid"]), 60, "the killed proc restarted")


def _restarted(mesh, old_pid: int) -> bool:
    try:
        return _who(mesh)[0]["pid"] != old_pid
    except SupervisionError:
        return False


def test_a_dead_zygote_leaves_later_spawns_to_fresh_processes(forking):
    with Session("fork-fallback", journal="off") as s:
        first = _who(s.spawn_procs(per_host={"procs": 1}).spawn("p", Probe))
        zygote = first[0]["ppid"]
        os.kill(zygote, signal.SIGKILL)
        wait_for(lambda: not running(zygote), 10, "the zygote died")
        later = _who(s.spawn_procs(per_host={"procs": 2}).spawn("q", Probe))
        agent = agent_record(forking)["pid"]
        assert {w["ppid"] for w in later} == {agent}  # started as fresh processes
        assert _who(s.spawn_procs(per_host={"procs": 1}).spawn("r", Probe))  # and still later
        assert running(first[0]["pid"])  # the zygote's child outlived it


def test_regent_fork_0_starts_every_proc_as_a_fresh_process(own_home):
    home = own_home(REGENT_FORK="0")
    with Session("fork-off", journal="off") as s:
        who = _who(s.spawn_procs(per_host={"procs": 2}).spawn("p", Probe))
        agent = agent_record(home)["pid"]
        assert {w["ppid"] for w in who} == {agent}
        assert sorted(host_processes(agent)) == sorted(w["pid"] for w in who)  # no zygote


def test_regent_preload_names_modules_the_zygote_imports_for_the_actors(own_home):
    own_home(REGENT_FORK="1", REGENT_PRELOAD="email.mime.text, tomllib")
    with Session("fork-preload", journal="off") as s:
        mesh = s.spawn_procs(per_host={"procs": 2}).spawn("p", Probe)
        assert all(mesh.has.call("email.mime.text").get(timeout=60).values())
        assert all(mesh.has.call("tomllib").get(timeout=60).values())
        assert not any(mesh.has.call("xml.dom.minidom").get(timeout=60).values())


def test_a_preload_that_is_not_a_module_name_is_refused_in_the_controller(own_home, monkeypatch):
    own_home(REGENT_FORK="1")
    monkeypatch.setenv("REGENT_PRELOAD", "torch;rm -rf /")
    with pytest.raises(ValueError, match="REGENT_PRELOAD"):
        wanted_preload()
