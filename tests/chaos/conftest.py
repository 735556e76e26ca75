"""The chaos suite's shared pieces: one Toxiproxy server and one etcd per module, and a
fault-free result per workload shape (computed once, compared with every chaos run)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from regent.chaos import ToxiproxyNotInstalled, ToxiproxyServer, find_toxiproxy_server
from regent.chaos.etcd import LocalEtcd, etcd_binary
from regent.chaos.run import fault_free
from tests.support.porcupine import porcupine_binary


@pytest.fixture(scope="module")
def toxiproxy() -> Iterator[ToxiproxyServer]:
    try:
        binary = find_toxiproxy_server()
    except ToxiproxyNotInstalled as e:
        pytest.skip(f"{e} (build it with scripts/install_toxiproxy.sh)")
    with ToxiproxyServer(binary) as server:
        yield server


@pytest.fixture(scope="module", autouse=True)
def porcupine():
    """regent-porcupine, which checks every run's register history (built when missing)."""
    return porcupine_binary()


@pytest.fixture(scope="module")
def etcd() -> Iterator[LocalEtcd]:
    if etcd_binary() is None:
        pytest.skip("etcd is not on PATH (scripts/install_etcd.sh, or set REGENT_ETCD)")
    with LocalEtcd() as server:
        yield server


_BASELINES: dict[tuple, dict] = {}


@pytest.fixture(scope="module")
def baseline(toxiproxy, etcd, tmp_path_factory):
    """baseline(steps=..., **env): the fault-free result of the workload in that shape."""

    def get(steps: int, n_procs: int = 3, **env: str) -> dict:
        key = (steps, n_procs, tuple(sorted(env.items())))
        if key not in _BASELINES:
            wd = tmp_path_factory.mktemp("baseline")
            name = f"baseline-{os.getpid()}-{len(_BASELINES)}"
            _BASELINES[key] = fault_free(toxiproxy, etcd, wd, name, steps=steps, n_procs=n_procs,
                                         proxied_workers=False, env=env)
        return _BASELINES[key]

    return get


