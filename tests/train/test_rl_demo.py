"""The RL example (`regent demo --rl`'s job), shortened: an asyncio controller program whose
sampling overlaps training survives a SIGKILLed controller and a SIGKILLed sampler proc, and
ends with the same policy weights, bit for bit, as a run without failures. Real host agent,
procs, gloo all-reduce, RDMA buffers and supervision."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RL = ROOT / "examples" / "rl" / "rl.py"


def _demo():
    spec = importlib.util.spec_from_file_location("rl_demo", ROOT / "examples" / "rl" / "demo.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_rl_through_a_controller_and_a_sampler_kill_ends_bit_identical_to_a_run_without(tmp_path):
    demo = _demo()
    url = f"sqlite://{tmp_path / 'journal.db'}"
    args = ["--tiny", "--steps", "16", "--step-delay", "0.1"]
    session = f"rl-failover-{os.getpid()}"
    failed, killer = demo.run_job(session, tmp_path, args, [6], 10, journal=url, progress=False, timeout=180)
    ref = demo.run_clean(f"{session}-ref", tmp_path, args, journal=url, progress=False, timeout=180)
    a, b = failed.result, ref.result

    (takeover,) = failed.takeovers
    assert takeover.killed_at_step == 6 and takeover.live_at > takeover.killed_at
    assert a["role"] == "standby-took-over" and a["stats"]["replayed"] > 0
    assert killer.killed is not None and killer.killed[1] >= 10  # a sampler proc died mid-run
    assert a["weights_sha256"] == b["weights_sha256"]
    assert a["replicas_agree"] and b["replicas_agree"]
    assert a["rewards"] == b["rewards"] and len(a["rewards"]) == 16
    assert a["evals"] == b["evals"]
    assert a["evals"][-1]["accuracy"] > a["evals"][0]["accuracy"]  # it learns

    # The session with both failures passes an audit replay of the same async program.
    audit = subprocess.run(
        [sys.executable, "-m", "regent.cli", "journal", "--journal", url, "replay", session,
         "--program", str(RL), "--", "--session", session, *args],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert audit.returncode == 0, audit.stdout[-3000:] + audit.stderr[-3000:]
