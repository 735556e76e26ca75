"""The training example over 2 namespace hosts, one proc each (gloo all-reduce and the
weights' RDMA buffer cross hosts), its primary controller in one host and its standby in
another: a SIGKILLed primary, and the run ends bit-identical to one without failure."""

from __future__ import annotations

import uuid
from pathlib import Path

from regent.chaos.netcluster import MultiHost
from tests.support.train_demo import load_demo


def test_training_over_two_hosts_through_a_failover_is_bit_identical(multihost: MultiHost, tmp_path: Path) -> None:
    demo = load_demo()

    def where(n: int) -> tuple[list[str], dict[str, str]]:
        host = "c1" if n == 0 else "c2"
        return multihost.net.command(host, []), multihost.env(host)

    args = ["--tiny", "--steps", "16", "--step-delay", "0.1", "--hosts", "2"]
    session = f"mht-{uuid.uuid4().hex[:8]}"
    failed = demo.run_controllers(session, tmp_path, args, [7], journal=multihost.url, progress=False,
                                  timeout=240, where=where)
    ref = demo.run_reference(f"{session}-ref", tmp_path, args, journal=multihost.url, progress=False,
                             timeout=240, where=where)
    a, b = failed.result, ref.result
    (takeover,) = failed.takeovers
    assert takeover.killed_at_step == 7
    assert a["role"] == "standby-took-over" and b["role"] == "primary"
    assert a["weights_sha256"] == b["weights_sha256"]
    assert a["replicas_agree"] and b["replicas_agree"]
    assert a["losses"] == b["losses"] and len(a["losses"]) == 16
    assert a["evals"] == b["evals"]
