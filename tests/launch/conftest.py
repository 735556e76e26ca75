"""Fixtures for the launcher tests: a real Slurm cluster and real sshds on namespace hosts (as
root; skipped with the reason otherwise)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from tests.support.slurm import SlurmCluster, slurm_unavailable_reason  # noqa: E402
from tests.support.sshd import SshHosts, sshd_unavailable_reason  # noqa: E402


@pytest.fixture
def slurm(tmp_path: Path) -> Iterator[SlurmCluster]:
    """Slurm with nodes n1 and n2 (2 CPUs each), idle, in partition `debug`."""
    reason = slurm_unavailable_reason()
    if reason:
        pytest.skip(reason)
    with SlurmCluster(tmp_path / "slurm", nodes=["n1", "n2"], cpus_per_node=2) as cluster:
        yield cluster


@pytest.fixture
def ssh_hosts(tmp_path: Path) -> Iterator[SshHosts]:
    """Hosts h1, h2 and h3, each a namespace running an sshd that takes the test's key."""
    reason = sshd_unavailable_reason()
    if reason:
        pytest.skip(reason)
    with SshHosts(tmp_path / "ssh", names=["h1", "h2", "h3"]) as hosts:
        yield hosts


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A REGENT_HOME holding the cluster's CURVE keys (`regent keys init`), as a user has."""
    h = tmp_path / "home"
    subprocess.run([sys.executable, "-m", "regent.cli", "keys", "init"], check=True, capture_output=True,
                   env={**os.environ, "REGENT_HOME": str(h)})
    return h
