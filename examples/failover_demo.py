"""A small failover demo on counters (`python examples/failover_demo.py`; `regent demo`
runs the training one): a primary and a standby run the same job on the embedded journal; the primary is SIGKILLed midway; the standby takes over,
replays the journal and finishes. Then the journal is verified, and the result
is compared with what a run without failure computes."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = Path(__file__).with_name("counter_job.py")


def main() -> int:
    steps = 60
    session = f"demo-{int(time.time())}"
    work = Path(tempfile.mkdtemp(prefix="regent-demo-"))
    leader_file = work / "leaders"
    env = {**os.environ, "REGENT_DEMO_SESSION": session, "REGENT_DEMO_STEPS": str(steps),
           "REGENT_DEMO_LEADER_FILE": str(leader_file), "PYTHONUNBUFFERED": "1"}
    kill_at = random.randint(10, steps - 20)
    print(f"regent demo: session {session!r}, {steps} steps on 4 actors, embedded journal")
    a = subprocess.Popen([sys.executable, str(JOB)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.3)
    b = subprocess.Popen([sys.executable, str(JOB)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while not leader_file.exists() or not leader_file.read_text().strip():
        time.sleep(0.01)
    primary_pid = int(leader_file.read_text().split()[0])
    primary, standby = (a, b) if a.pid == primary_pid else (b, a)
    print(f"  primary pid {primary.pid}, standby pid {standby.pid} (waiting inside Session(...))")
    for line in primary.stderr:
        if line.startswith("step "):
            print("  primary  " + line.rstrip())
            if line.startswith(f"step {kill_at}/"):
                break
    killed_at = time.time()
    os.kill(primary.pid, signal.SIGKILL)
    primary.wait()
    print(f"  >>> SIGKILL primary at step {kill_at}")
    out, err = standby.communicate(timeout=120)
    for line in err.splitlines():
        if line.startswith("step "):
            print("  standby  " + line)
    if standby.returncode != 0:
        print(err[-4000:])
        print("demo FAILED: the standby did not finish")
        return 1
    result = json.loads(out.strip().splitlines()[-1])
    took_over = float(leader_file.read_text().splitlines()[1].split()[1])
    expected_total = 4 * sum(range(steps))
    calls = [a["calls"] for a in result["actors"]]
    verify = subprocess.run([sys.executable, "-m", "regent.cli", "journal", "verify", session],
                            capture_output=True, text=True, env=env)
    print()
    print(f"takeover: standby led {took_over - killed_at:.2f} s after the kill (lease 1 s)")
    print(f"replay: {result['stats']['replayed']} results answered from the journal, "
          f"{result['stats']['resent']} re-sent to workers (deduped), {result['stats']['live']} issued live")
    print(f"actors ran add() {calls} times: each exactly {steps} = exactly once per call")
    print(f"final total {result['total']} (a run without failure computes {expected_total})")
    print(f"journal verify: {verify.stdout.strip()}")
    ok = result["total"] == expected_total and all(c == steps for c in calls) and verify.returncode == 0
    print("demo OK" if ok else "demo FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
