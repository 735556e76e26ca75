"""A local, single-member etcd that a chaos run owns: it can be SIGKILLed and started
again on the same ports and data, which is what the etcd faults of a scenario do."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

__all__ = ["LocalEtcd", "etcd_binary", "lost_its_port"]


def etcd_binary() -> str | None:
    return shutil.which(os.environ.get("REGENT_ETCD", "etcd"))


def lost_its_port(log_path: Path, since: int) -> bool:
    """Did an etcd fail to start because its port was taken? Its log after byte `since` says.

    A port found free a moment ago (bind to port 0, close) may be bound by another process
    before etcd binds it: a first start then takes other ports and tries again."""
    try:
        with open(log_path, "rb") as f:
            f.seek(since)
            return b"address already in use" in f.read()
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalEtcd:
    def __init__(self, data_dir: str | Path | None = None) -> None:
        binary = etcd_binary()
        if binary is None:
            raise RuntimeError("etcd is not on PATH (set REGENT_ETCD to its path, or use scripts/install_etcd.sh)")
        self.binary = binary
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="regent-chaos-etcd-"))
        self.client_port, self.peer_port = _free_port(), _free_port()
        self.proc: subprocess.Popen | None = None
        self._started = False  # once started, restarts keep the ports: clients know them
        self._lock = threading.Lock()  # start, reap and stop come from different threads

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def url(self) -> str:
        return f"etcd://{self.address}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    @property
    def running(self) -> bool:
        return self.pid is not None

    def start(self, timeout_s: float = 20.0) -> LocalEtcd:
        with self._lock:
            return self._start(timeout_s)

    def _start(self, timeout_s: float) -> LocalEtcd:
        if self.running:
            return self
        log_path = self.data_dir.with_suffix(".log")
        for attempt in range(3):
            logged = log_path.stat().st_size if log_path.exists() else 0
            try:
                self._spawn(timeout_s)
            except RuntimeError:
                # A first start takes other ports; a restart must keep its own.
                if self._started or attempt == 2 or not lost_its_port(log_path, logged):
                    raise
                self.proc = None
                self.client_port, self.peer_port = _free_port(), _free_port()
                continue
            self._started = True
            return self
        raise AssertionError("unreachable")

    def _spawn(self, timeout_s: float) -> None:
        client, peer = f"http://{self.address}", f"http://127.0.0.1:{self.peer_port}"
        log = open(self.data_dir.with_suffix(".log"), "ab")
        self.proc = proc = subprocess.Popen(
            [self.binary, "--name", "chaos", "--data-dir", str(self.data_dir / "data"),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"chaos={peer}", "--log-level", "error"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:  # e.g. a chaos schedule killed it while it started
                raise RuntimeError(f"etcd exited with {proc.returncode}; see {self.data_dir.with_suffix('.log')}")
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=1) as r:
                    if b'"health":"true"' in r.read():
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"etcd on {self.address} not healthy after {timeout_s} s")

    def reap(self) -> bool:
        """True if etcd was running and has died (it is then ready to start again).
        False while a start is under way: that start reports its own failure."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self.proc is not None and self.proc.poll() is not None:
                self.proc = None
                return True
            return False
        finally:
            self._lock.release()

    def stop(self) -> None:
        with self._lock:
            if self.proc is not None:
                if self.proc.poll() is None:
                    self.proc.kill()
                self.proc.wait()
                self.proc = None

    def __enter__(self) -> LocalEtcd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)
