"""Per-proc device binding through the host agent: proc i of a `{"gpus": N}` mesh sees
device i only (docs/hipcore.md). On a machine without a GPU the CPU backend's
REGENT_CPU_DEVICE carries the binding; on a GPU machine CUDA/HIP_VISIBLE_DEVICES do."""

from __future__ import annotations

import json
import os
import signal

import pytest

from regent import hipcore
from regent.controller import Session, SupervisionError
from regent.hipcore import binding
from regent.worker import Actor, endpoint

WATCHED = (*binding.BINDING_VARS,)


class Where(Actor):
    @endpoint
    def binding(self) -> dict:
        dev = hipcore.current_device()
        return {
            "env": {k: os.environ.get(k) for k in WATCHED},
            "backend": hipcore.backend().name,
            "kind": dev.kind,
            "index": dev.index,
            "physical_ids": dev.physical_ids,
        }


def _backend() -> str:
    # What the host agent (a fresh process with this environment) decides.
    return hipcore.detect_backend().name


def test_each_proc_of_a_gpus_mesh_is_bound_to_its_own_device():
    name = _backend()
    if name != "cpu" and hipcore.detect_backend().device_count < 2:
        pytest.skip("needs 2 GPUs (or none, for the CPU backend)")
    var = binding.VISIBLE_DEVICES_ENV[name]
    with Session("hipcore-actors-binding-gpus") as s:
        procs = s.spawn_procs(per_host={"gpus": 2})
        assert procs.dims == {"hosts": 1, "gpus": 2}
        seen = procs.spawn("where", Where).binding.call().get().values()
    for i, got in enumerate(seen):
        env = got["env"]
        assert env[var] == str(i), got
        assert env[binding.PROC_DEVICES_ENV] == str(i)
        assert env[binding.BACKEND_ENV] == name == got["backend"]
        others = {v for v in binding.VISIBLE_DEVICES_ENV.values() if v != var}
        assert all(env[v] is None for v in others), got  # inherited bindings were removed
        assert got["physical_ids"] == [str(i)]
        if name == "cpu":
            assert (got["kind"], got["index"]) == ("cpu", i)
        else:  # the proc sees one GPU, its own, as device 0
            assert (got["kind"], got["index"]) == (name, 0)


def test_a_procs_mesh_is_not_bound():
    with Session("hipcore-actors-binding-procs") as s:
        seen = s.spawn_procs(per_host={"procs": 2}).spawn("where", Where).binding.call().get().values()
    for got in seen:
        assert got["env"][binding.CPU_DEVICE_ENV] is None
        assert got["env"][binding.PROC_DEVICES_ENV] is None
        assert got["physical_ids"] == []


@pytest.fixture()
def own_host_agent(tmp_path, monkeypatch):
    """A REGENT_HOME of this test's own, so the Session starts a host agent with this
    test's environment; the agent is stopped afterwards."""
    monkeypatch.setenv("REGENT_HOME", str(tmp_path))
    yield monkeypatch
    try:
        os.kill(int(json.loads((tmp_path / "host.json").read_text())["pid"]), signal.SIGTERM)
    except (OSError, ValueError, KeyError):
        pass


def test_a_binding_the_host_cannot_give_fails_the_spawn_with_the_reason(own_host_agent):
    info = hipcore.detect_backend()
    if info.is_gpu:  # more procs than GPUs
        count, reason = info.device_count + 1, f"has {info.device_count}"
    else:  # a GPU backend forced on a host without one
        own_host_agent.setenv(binding.BACKEND_ENV, "cuda")
        count, reason = 1, "REGENT_HIPCORE_BACKEND=cuda"
    with Session("hipcore-actors-binding-refused") as s:
        with pytest.raises(SupervisionError) as err:
            s.spawn_procs(per_host={"gpus": count})
        assert "cannot bind procs to devices on this host" in str(err.value)
        assert reason in str(err.value)
        # the host agent serves on: a mesh without a binding still starts
        assert len(s.spawn_procs(per_host={"procs": 1})) == 1
