"""The training example (`regent demo`'s job), shortened: a controller SIGKILLed mid-training
hands over to a standby, and the run ends with the same weights, bit for bit, as a run
without failure. Real host agent, procs, gloo all-reduce and RDMA buffers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from tests.support.train_demo import load_demo

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "train" / "train.py"


def test_training_through_a_controller_failover_ends_bit_identical_to_a_run_without(tmp_path):
    demo = load_demo()
    url = f"sqlite://{tmp_path / 'journal.db'}"
    args = ["--tiny", "--steps", "16", "--step-delay", "0.1"]
    session = f"train-failover-{os.getpid()}"
    failed = demo.run_controllers(session, tmp_path, args, [7], journal=url, progress=False, timeout=120)
    ref = demo.run_reference(f"{session}-ref", tmp_path, args, journal=url, progress=False, timeout=120)
    a, b = failed.result, ref.result

    (takeover,) = failed.takeovers
    assert takeover.killed_at_step == 7 and takeover.live_at > takeover.killed_at
    assert a["role"] == "standby-took-over" and b["role"] == "primary"
    assert a["stats"]["replayed"] > 0  # the standby answered the replayed prefix from the journal

    assert a["weights_sha256"] == b["weights_sha256"]
    assert a["replicas_agree"] and b["replicas_agree"]  # the two data-parallel replicas agree
    assert a["losses"] == b["losses"] and len(a["losses"]) == 16
    assert a["evals"] == b["evals"]
    assert sum(a["losses"][-4:]) < sum(a["losses"][:4])  # it trains
    # The checkpoint actor's files hold the same weights in both runs.
    for x, y in zip(a["saved"], b["saved"], strict=True):
        sx, sy = torch.load(x)["model"], torch.load(y)["model"]
        assert sx.keys() == sy.keys() and all(torch.equal(sx[k], sy[k]) for k in sx)

    # The session with the failover passes an audit replay of the same program.
    audit = subprocess.run(
        [sys.executable, "-m", "regent.cli", "journal", "--journal", url, "replay", session,
         "--program", str(TRAIN), "--", "--session", session, *args, "--checkpoint-dir",
         str(tmp_path / f"{session}.ckpt")], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert audit.returncode == 0, audit.stderr[-3000:]
