"""`regent demo --hosts 3 --spares 1`, shortened: training on three loopback hosts with a spare;
one host SIGKILLed (its agent and every proc) and, later, the controller; the run ends with
the same weights, losses and evaluations, bit for bit, as a run without faults, and only the
step in flight when the host died is redone (its replica healed from a healthy one)."""

from __future__ import annotations

import os

from tests.support.train_demo import load_demo


def test_training_through_a_host_kill_and_a_controller_kill_ends_bit_identical(own_home, tmp_path, monkeypatch):
    own_home(REGENT_HIPCORE_BACKEND="cpu")
    demo = load_demo()
    url = f"sqlite://{tmp_path / 'journal.db'}"
    cluster = f"train{os.getpid()}"
    monkeypatch.setenv("REGENT_CLUSTER", cluster)
    args = ["--tiny", "--steps", "16", "--step-delay", "0.1", "--hosts", "3", "--spares", "1"]
    agents = demo.start_agents(url, cluster, ["h0", "h1", "h2", "h3"], tmp_path)
    kill = demo.HostKill("h1", 5)
    failed, ref = demo.with_and_without_faults("hosts", tmp_path, args, [10], kill, agents, journal=url,
                                               progress=False, timeout=300)
    a, b = failed.result, ref.result
    assert kill.at and kill.next_step_at > kill.at
    assert a["role"] == "standby-took-over" and len(failed.takeovers) == 1
    assert a["weights_sha256"] == b["weights_sha256"] and a["replicas_agree"]
    assert a["losses"] == b["losses"] and a["evals"] == b["evals"]
    assert a["redone"] <= 2, a["redone"]  # the step in flight (retried once more if the retry met the rebuild)
    assert [h["from"] for h in a["healed"]] and all(h["from"] != "checkpoint" for h in a["healed"]), a["healed"]
