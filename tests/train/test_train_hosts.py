"""`regent demo --hosts 3 --spares 1`, shortened: training on three loopback hosts with a spare;
one host SIGKILLed (its agent and every proc) and, later, the controller; the run ends with
the same weights, losses and evaluations, bit for bit, as a run without faults, and only the
step in flight when the host died is redone (its replica healed from a healthy one)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _demo():
    spec = importlib.util.spec_from_file_location("train_demo_hosts", ROOT / "examples" / "train" / "demo.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_training_through_a_host_kill_and_a_controller_kill_ends_bit_identical(own_home, tmp_path, monkeypatch):
    own_home(REGENT_HIPCORE_BACKEND="cpu")
    demo = _demo()
    url = f"sqlite://{tmp_path / 'journal.db'}"
    cluster = f"train{os.getpid()}"
    monkeypatch.setenv("REGENT_CLUSTER", cluster)
    args = ["--tiny", "--steps", "16", "--step-delay", "0.1", "--hosts", "3", "--spares", "1"]
    agents = demo.start_agents(url, cluster, ["h0", "h1", "h2", "h3"], tmp_path)
    kill = demo.HostKill("h1", 5)
    try:
        failed = demo.run_with_host_kill("hosts", tmp_path, args, [10], kill, agents, journal=url, progress=False,
                                         timeout=300)
        ref = demo.run_reference("hosts-ref", tmp_path, args, journal=url, progress=False, timeout=300)
    finally:
        for agent in agents.values():
            agent.terminate()
        for agent in agents.values():
            agent.wait(30)
    a, b = failed.result, ref.result
    assert kill.at and kill.next_step_at > kill.at
    assert a["role"] == "standby-took-over" and len(failed.takeovers) == 1
    assert a["weights_sha256"] == b["weights_sha256"] and a["replicas_agree"]
    assert a["losses"] == b["losses"] and a["evals"] == b["evals"]
    assert a["redone"] <= 2, a["redone"]  # the step in flight (retried once more if the retry met the rebuild)
    assert [h["from"] for h in a["healed"]] and all(h["from"] != "checkpoint" for h in a["healed"]), a["healed"]
