"""Untrusted input: garbage, truncated and oversized frames, and peers without the
cluster's CURVE keys, are refused; the proc keeps serving its real controller. A home,
secret or journal file other users could write is refused before it is read, and the
secret goes only to peers that prove they hold it."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from regent import wire
from regent.controller import Session
from regent.controller.replay import CALL, START
from regent.journal import GroupCommitWriter, open_journal
from regent.wire import Kind
from regent.wire.security import Credentials, is_loopback, load_credentials, secure_server
from regent.worker import Actor, endpoint
from tests.runtime.fakeagent import ListenerWithoutSecret
from tests.runtime.rawpeer import RawPeer


class Echo(Actor):
    @endpoint
    def echo(self, x):
        return x


@pytest.fixture()
def secure_home(own_home):
    """A separate REGENT_HOME with CURVE on and a 1 MiB message cap: its own host agent."""
    return own_home(REGENT_SECURE="1", REGENT_MAX_MESSAGE_BYTES=str(1 << 20))


def _still_serves(mesh) -> None:
    assert mesh.echo.call_one("alive").get(timeout=10) == "alive"


def test_malformed_frames_are_dropped_and_the_proc_keeps_serving(secure_home):
    with Session("hostile") as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("echo", Echo)
        addr = mesh._procs[0].address
        peer = RawPeer(load_credentials())  # an authenticated peer gone wrong
        try:
            bad = [
                [b"garbage"],
                [b""],
                [b"RG\x01\x01\x00\x00\x10\x00" + b"\x80"],  # metadata length beyond the frame
                [b"RG\x09\x01\x00\x00\x00\x01\xc0"],  # wire version 9
                [b"RG\x01\x63\x00\x00\x00\x01\xc0"],  # unknown kind
                [b"RG\x01\x01\x00\x00\x00\x03\xa2hi"],  # metadata is not a map
                wire.encode(Kind.CALL, {"sid": s.sid}),  # fields missing
                wire.encode(Kind.CALL, {"sid": s.sid, "e": "one", "s": 1}),  # wrong types
            ]
            for frames in bad:
                peer.send(addr, frames)
            # A well-formed call whose pickle payload is truncated: an error reply, not a crash.
            frames = wire.dumps((("x" * 1000,), {}))
            meta = {"sid": s.sid, "e": s.epoch, "s": 7000, "a": "echo", "m": "echo",
                    "d": wire.digest(frames), "rt": peer.address, "pt": 0}
            peer.send(addr, wire.encode(Kind.CALL, meta, [frames[0][:20]]))
            kind, reply, _ = peer.recv()
            assert kind is Kind.RESULT and reply["st"] == "err"
            _still_serves(mesh)
            # Oversized: above the 1 MiB cap, the transport disconnects the sender.
            peer.send(addr, [b"x" * (2 << 20)])
            time.sleep(0.2)
            _still_serves(mesh)
        finally:
            peer.close()
        log = (secure_home / "host.log").read_text()
        assert log.count("dropped malformed message") >= len(bad)


def test_a_peer_without_the_cluster_keys_is_refused(secure_home):
    with Session("keys") as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("echo", Echo)
        addr = mesh._procs[0].address
        # Right PLAIN secret but no CURVE keys: the handshake fails, nothing is delivered.
        plain = RawPeer(Credentials(load_credentials().secret))
        try:
            plain.call(addr, s.sid, s.epoch, 8000, "echo", "echo", ("sneaky",))
            with pytest.raises(TimeoutError):
                plain.recv(timeout=1.0)
        finally:
            plain.close()
        # A socket with no security at all.
        ctx = zmq.Context()
        try:
            sock = ctx.socket(zmq.PUSH)
            sock.linger = 0
            sock.connect(addr)
            sock.send_multipart(wire.encode(Kind.PING, {"rt": "tcp://127.0.0.1:1", "n": 1}))
        finally:
            ctx.destroy(linger=0)
        _still_serves(mesh)


def test_binding_beyond_loopback_requires_curve_keys(tmp_path, monkeypatch):
    monkeypatch.setenv("REGENT_HOME", str(tmp_path / "h"))
    ctx = zmq.Context()
    try:
        with pytest.raises(RuntimeError, match="regent keys init"):
            secure_server(ctx.socket(zmq.PULL), Credentials(b"s"), "0.0.0.0")
    finally:
        ctx.destroy(linger=0)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and not is_loopback("10.1.2.3")


# --- $REGENT_HOME, the journal file and the secret: private to their user ----------------

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture()
def umask_022():
    old = os.umask(0o022)  # the common default, under which new files were 0644
    yield
    os.umask(old)


def test_a_fresh_home_is_0700_and_its_journal_wal_shm_and_secret_are_0600(tmp_path, monkeypatch, umask_022):
    home = tmp_path / "not" / "yet" / "home"
    monkeypatch.setenv("REGENT_HOME", str(home))
    with Session("fresh") as s:
        s.now()  # a durable record: the WAL and its index exist while the session runs
        files = {name: home / name for name in ("journal.db", "journal.db-wal", "journal.db-shm", "secret")}
        modes = {name: _mode(p) for name, p in files.items()}
    assert _mode(home) == 0o700
    assert modes == dict.fromkeys(files, 0o600)


@pytest.mark.parametrize("mode", [0o777, 0o770])
def test_a_home_others_can_write_is_refused_with_the_fix(tmp_path, monkeypatch, mode):
    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, mode)
    monkeypatch.setenv("REGENT_HOME", str(home))
    with pytest.raises(PermissionError, match=re.escape(f"chmod 700 {home}")):
        Session("shared-home")
    with pytest.raises(PermissionError, match=re.escape(f"chmod 700 {home}")):
        load_credentials()
    assert not (home / "secret").exists()


@root_only
def test_a_home_another_user_owns_is_refused(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    os.chown(home, NOBODY, NOBODY)
    monkeypatch.setenv("REGENT_HOME", str(home))
    with pytest.raises(PermissionError, match=f"belongs to uid {NOBODY}"):
        Session("foreign-home")
    with pytest.raises(PermissionError, match=f"belongs to uid {NOBODY}.*chmod 700"):
        load_credentials()


def test_a_home_only_others_can_read_is_made_private(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, 0o755)
    monkeypatch.setenv("REGENT_HOME", str(home))
    load_credentials()
    assert _mode(home) == 0o700 and _mode(home / "secret") == 0o600


def test_a_secret_others_could_read_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("REGENT_HOME", str(tmp_path / "home"))
    load_credentials()
    secret = tmp_path / "home" / "secret"
    os.chmod(secret, 0o644)
    with pytest.raises(PermissionError, match=re.escape(f"rm {secret}")):
        load_credentials()


# A program whose side effect's journaled value runs code when unpickled: replay of a
# journal someone else wrote would run it. Run twice: killed after journaling, then replayed.
_PLANTED = """
import os, signal, sys
from regent import Session

class Plant:
    def __reduce__(self):
        return (os.mkdir, ({marker!r},))

with Session("planted", journal={url!r}) as s:
    s.side_effect(Plant)
    if sys.argv[1] == "first":
        os.kill(os.getpid(), signal.SIGKILL)
print("replayed")
"""


def _run(script: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("tamper", [
    "none",
    "journal writable by others",
    "wal writable by group",
    pytest.param("journal owned by another user", marks=root_only),
])
def test_a_journal_file_others_could_write_is_refused_before_anything_is_unpickled(
        tmp_path, monkeypatch, tamper):
    monkeypatch.setenv("REGENT_HOME", str(tmp_path / "home"))
    db = tmp_path / "journals" / "j.db"
    marker = tmp_path / "the-journal-ran-code"
    script = tmp_path / "planted.py"
    script.write_text(_PLANTED.format(marker=str(marker), url=f"sqlite://{db}"))
    first = _run(script, "first")
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert Path(f"{db}-wal").exists() and not marker.exists()
    if tamper == "journal writable by others":
        os.chmod(db, 0o666)
    elif tamper == "wal writable by group":
        os.chmod(f"{db}-wal", 0o660)
    elif tamper == "journal owned by another user":
        os.chown(db, NOBODY, NOBODY)
    second = _run(script, "second")
    if tamper == "none":  # the control: a journal of one's own replays, and so unpickles
        assert second.returncode == 0 and "replayed" in second.stdout, second.stderr
        assert marker.exists()
        return
    assert second.returncode != 0 and "replayed" not in second.stdout
    assert "UntrustedJournal" in second.stderr
    fix = f"belongs to uid {NOBODY}" if "owned" in tamper else "chmod 600"
    assert fix in second.stderr, second.stderr
    assert not marker.exists(), "the journal's pickle ran before the file was checked"


def test_a_journal_in_a_directory_others_can_write_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("REGENT_HOME", str(tmp_path / "home"))
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # no sticky bit: anyone may replace the file
    with pytest.raises(PermissionError, match=re.escape(f"chmod go-w {shared}")):
        Session("shared-dir", journal=f"sqlite://{shared / 'j.db'}")


# --- mutual authentication: the secret goes only to peers that prove they hold it --------


def test_a_listener_without_the_secret_never_receives_it_and_the_request_fails_clearly(own_home):
    own_home()
    secret = load_credentials().secret
    with ListenerWithoutSecret() as lure, Session("lure", journal="off") as s:
        with pytest.raises(TimeoutError) as refused:
            s.runtime.host_request(lure.address, "hello", timeout=2.0)
        assert lure.wait_for_handshake(), "the controller never tried the listener"
        received = bytes(lure.received)
    assert secret not in received
    assert b"regent" not in received  # not even the PLAIN username
    assert "has not proven it holds this user's regent secret" in str(refused.value)


def test_a_takeover_never_sends_the_secret_to_the_address_a_journal_names(own_home):
    """The journal names a host agent whose port another program now holds: the standby
    sends it nothing secret, then carries on with this machine's real agent."""
    home = own_home()
    secret = load_credentials().secret
    url = f"sqlite://{home / 'journal.db'}"
    with ListenerWithoutSecret() as lure:
        with open_journal(url) as journal:  # what the dead primary had journaled
            lead = journal.campaign("named", "the-old-primary")
            writer = GroupCommitWriter(lead)
            writer.submit(START, {"run": "r0", "ts": time.time()})
            writer.submit(CALL, {"s": 0, "k": "this_host", "a": "this_host", "m": "this_host",
                                 "v": lure.address})
            writer.flush(timeout=10)
            writer.close()
            lead.resign()
            lead.close()
        with Session("named", journal=url) as s:
            assert s.replaying
            mesh = s.spawn_procs(per_host={"procs": 1}).spawn("echo", Echo)
            assert mesh.echo.call_one("real").get(timeout=30) == "real"
            assert s._lifecycle.hosts and s._lifecycle.hosts[0] != lure.address
        assert lure.wait_for_handshake(), "the standby never tried the journal's address"
        received = bytes(lure.received)
    assert secret not in received
    assert lure.mechanisms and set(lure.mechanisms) == {b"CURVE"}


def test_a_client_without_the_secret_is_refused_on_loopback(own_home):
    own_home()
    with Session("intruder") as s:
        mesh = s.spawn_procs(per_host={"procs": 1}).spawn("echo", Echo)
        stranger = RawPeer(Credentials(b"not this user's secret"))
        try:
            stranger.call(mesh._procs[0].address, s.sid, s.epoch, 9000, "echo", "echo", ("in",))
            with pytest.raises(TimeoutError):
                stranger.recv(timeout=1.0)
        finally:
            stranger.close()
        _still_serves(mesh)
