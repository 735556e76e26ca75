"""Checkpoints bound the journal and the replay; watermarks bound the workers' memory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from regent import wire
from regent.controller import Session
from regent.journal import open_journal
from regent.wire import Kind
from regent.worker import Actor, endpoint
from tests.failover.harness import Cluster
from tests.runtime.rawpeer import RawPeer


def test_takeover_resumes_from_the_checkpoint_and_compaction_keeps_the_journal_valid(tmp_path):
    url = f"sqlite://{tmp_path / 'journal.db'}"
    steps = 200
    c = Cluster(f"ckpt-{os.getpid()}", url, tmp_path, program="checkpointed.py", steps=steps)
    try:
        c.start()
        c.start()
        first = c.wait_leader(1)
        c.wait_step(first, 125)
        os.kill(first, signal.SIGKILL)
        c.by_pid(first).wait()
        result = c.finish(c.by_pid(c.wait_leader(2)))
    finally:
        c.stop_all()
    assert result["acc"] == sum(4 * i for i in range(steps))
    for seen in result["reports"]:
        assert {int(k): v for k, v in seen.items()} == {
            **{i: 1 for i in range(steps)}, **{-1 - i: 1 for i in range(steps)}}
    # Only what followed the last checkpoint came from the journal: the prologue (host,
    # procs, 2 spawn results) and at most 10 steps of 4 results, not the 125 steps before.
    assert result["stats"]["replayed"] <= 4 + 4 * 10
    j = open_journal(url)
    try:
        before = j.session_info(c.session).records
        removed = subprocess.run(
            [sys.executable, "-m", "regent.cli", "journal", "--journal", url, "compact", c.session],
            capture_output=True, text=True, check=True).stdout
        after = j.session_info(c.session).records
        assert after < before / 4, (before, after, removed)
        assert j.verify(c.session).ok
        shown = subprocess.run(
            [sys.executable, "-m", "regent.cli", "journal", "--journal", url, "show", c.session],
            capture_output=True, text=True, check=True).stdout
        assert "spawn acc.__init__" in shown  # the prologue survives compaction
    finally:
        j.close()


class Echo(Actor):
    @endpoint
    def echo(self, x):
        return x


def test_workers_drop_results_once_the_journal_holds_them(tmp_path):
    with Session("watermarks", journal=f"sqlite://{tmp_path / 'j.db'}") as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("echo", Echo)
        for i in range(300):
            mesh.echo.call_one(i).get()
        big = mesh.echo.call_one(b"x" * (256 * 1024)).get()
        assert len(big) == 256 * 1024
        peer = RawPeer()
        try:
            deadline = time.monotonic() + 10
            while True:
                peer.send(mesh._procs[0].address, wire.encode(
                    Kind.PING, {"rt": peer.address, "n": 1}))
                _, pong, _ = peer.recv()
                # The small results are released; the large one waits for a checkpoint.
                if pong["cached"] <= 2:
                    break
                assert time.monotonic() < deadline, f"proc still caches {pong['cached']} results"
                time.sleep(0.1)
            assert pong["cached"] >= 1
            s.checkpoint({"done": True})
            deadline = time.monotonic() + 10
            while True:
                peer.send(mesh._procs[0].address, wire.encode(
                    Kind.PING, {"rt": peer.address, "n": 2}))
                _, pong, _ = peer.recv()
                if pong["cached"] == 0:
                    break
                assert time.monotonic() < deadline, f"proc still caches {pong['cached']} after a checkpoint"
                time.sleep(0.1)
        finally:
            peer.close()


def test_the_watermark_reads_its_marks_while_replies_add_more(tmp_path):
    """The watermark is computed while replies add marks, each on the thread that drives at
    the time (the timer's event, and a reply read by a program thread in wait_until): one
    driver at a time, so the watermark never meets a deque changed under its iteration, which
    cost it its turn when both ran at once."""
    import threading

    with Session("watermark-marks", journal=f"sqlite://{tmp_path / 'j.db'}") as s:
        never = 1 << 62  # marks that are never durable: the deque only grows
        with s._drive:
            for seq in range(20_000):
                s._engine.journaled_at(seq, never)
        stop = threading.Event()

        def add() -> None:
            seq = 20_000
            while not stop.is_set():
                with s._drive:
                    s._engine.journaled_at(seq, never)
                seq += 1

        adder = threading.Thread(target=add)
        adder.start()
        try:
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:
                with s._drive:
                    assert s._recorder.release_through() == -1
        finally:
            stop.set()
            adder.join()
