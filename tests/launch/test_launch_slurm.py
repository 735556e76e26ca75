"""`regent launch slurm --submit` on a real Slurm (three nodes, each a namespace host): the job
runs an unmodified program over its nodes' agents with a journal of its own; the primary
controller SIGKILLed mid-run, the standby on the second node finishes it (every call once);
the job's exit status is the program's; bad input fails with one line and starts nothing."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from regent.controller.edge import STANDING_BY
from tests.failover.harness import check_exactly_once
from tests.support.leftovers import left_running
from tests.support.slurm import SlurmCluster, slurm_unavailable_reason

REPO = Path(__file__).resolve().parents[2]
MIXED = REPO / "tests" / "failover" / "programs" / "mixed.py"
STEPS = 150

EXIT_3 = """
import sys
from regent.controller import Session
with Session("slurm-exit-status") as s:
    hosts = s.host_mesh(hosts=3)
    print(f"found {len(hosts)} hosts", flush=True)
sys.exit(3)
"""


@pytest.fixture
def slurm3(tmp_path: Path) -> Iterator[SlurmCluster]:
    reason = slurm_unavailable_reason()
    if reason:
        pytest.skip(reason)
    with SlurmCluster(tmp_path / "s", nodes=["n1", "n2", "n3"], cpus_per_node=2) as cluster:
        yield cluster


def _launch(slurm: SlurmCluster, home: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "regent.cli", "launch", "slurm", *args], capture_output=True,
                          text=True, timeout=60, cwd=slurm.workdir,
                          env=slurm.env({"REGENT_HOME": str(home), "PYTHONPATH": str(REPO), **env}))


def _job_out(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_a_job_runs_through_the_primarys_sigkill_and_the_standby_finishes(slurm3: SlurmCluster, home: Path,
                                                                           tmp_path: Path) -> None:
    out, leaders, session = tmp_path / "job.out", tmp_path / "leaders", f"sl-{uuid.uuid4().hex[:8]}"
    hold = tmp_path / "hold"  # the primary waits at step 3 until the kill: it cannot finish first
    hold.touch()
    done = _launch(slurm3, home, str(MIXED), "--nodes", "3", "--standby", "--submit", "--output", str(out),
                   REGENT_TEST_SESSION=session, REGENT_TEST_HOSTS="3",
                   REGENT_TEST_STEPS=str(STEPS), REGENT_TEST_LEADER_FILE=str(leaders),
                   REGENT_TEST_TTL="3.0",  # a lease a loaded machine keeps
                   REGENT_TEST_STEP_S="0.05", REGENT_TEST_HOLD_FILE=str(hold))
    assert done.returncode == 0, done.stderr
    job = int(done.stdout.strip())
    assert "submitted job" in done.stderr and "a standby on the second node" in done.stderr
    deadline = time.monotonic() + 120
    while not re.search(r"^step 3$", _job_out(out), re.M):
        assert time.monotonic() < deadline and slurm3.job(job)["JobState"] in ("PENDING", "RUNNING"), \
            (slurm3.job(job), _job_out(out))
        time.sleep(0.05)
    # The standby's node may start its controller late on a loaded machine: kill the primary only
    # once the standby stands by, or the "standby" finds no leader and simply starts as primary.
    while STANDING_BY not in _job_out(out):
        assert time.monotonic() < deadline, ("the standby never stood by", _job_out(out))
        time.sleep(0.05)
    primary = int(leaders.read_text().split()[0])
    assert psutil.Process(primary).cmdline()[-1] == str(MIXED)
    journal = re.search(r"journal (etcd://\S+):", _job_out(out))[1]
    listed = subprocess.run([sys.executable, "-m", "regent.cli", "hosts", "ls", "--cluster", f"slurm-{job}",
                             "--store", journal], capture_output=True, text=True, timeout=30)
    assert sorted(line.split()[0] for line in listed.stdout.splitlines()[1:]) == ["n1", "n2", "n3"], \
        f"exit {listed.returncode}\nstdout:\n{listed.stdout}\nstderr:\n{listed.stderr}"
    os.kill(primary, signal.SIGKILL)
    hold.unlink()
    record = slurm3.wait_job(job, timeout_s=180)
    text = _job_out(out)
    assert (record["JobState"], record["ExitCode"]) == ("COMPLETED", "0:0"), (record, text)
    result = json.loads(next(line for line in text.splitlines() if line.startswith("{") and '"reports"' in line))
    assert result["role"] == "standby-took-over"
    check_exactly_once(result, STEPS)
    assert "a single etcd member on n1" not in done.stderr  # said in the job's output, where it runs:
    assert re.search(r"journal etcd://\S+: one etcd member on n1 that lives as long as this job", text), text
    assert "a standby carries the run on" in text
    assert "host agents of cluster slurm-" in text and "on n1 n2 n3" in text
    # The job's processes are gone with it: no agent, proc, controller or etcd left.
    time.sleep(1.0)
    assert left_running([session, f"slurm-{job}"]) == []


def test_the_jobs_exit_status_is_the_programs(slurm3: SlurmCluster, home: Path, tmp_path: Path) -> None:
    program, out = tmp_path / "exit3.py", tmp_path / "exit.out"
    program.write_text(EXIT_3)
    done = _launch(slurm3, home, str(program), "--nodes", "3", "--submit", "--output", str(out))
    assert done.returncode == 0, done.stderr
    record = slurm3.wait_job(int(done.stdout.strip()), timeout_s=120)
    assert (record["JobState"], record["ExitCode"]) == ("FAILED", "3:0"), (record, _job_out(out))
    assert "found 3 hosts" in _job_out(out)  # REGENT_CLUSTER and REGENT_JOURNAL reached the program


def test_bad_input_fails_with_one_line_and_starts_nothing(slurm3: SlurmCluster, home: Path, tmp_path: Path) -> None:
    cases = [
        ([str(tmp_path / "missing.py"), "--nodes", "2", "--submit"], "no program at"),
        ([str(MIXED), "--nodes", "2", "--partition", "nope", "--submit"], "sbatch refused the job"),
        ([str(MIXED), "--nodes", "2", "--journal", "etcd://127.0.0.1:1", "--submit"], "does not answer"),
        ([str(MIXED), "--nodes", "0", "--submit"], "at least one node"),
    ]
    for args, said in cases:
        done = _launch(slurm3, home, *args)
        assert done.returncode == 2 and said in done.stderr, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    no_keys = _launch(slurm3, tmp_path / "no-keys", str(MIXED), "--nodes", "2", "--submit")
    assert no_keys.returncode == 2 and "regent keys init" in no_keys.stderr
    queue = slurm3.run(["squeue", "-h"]).stdout
    assert queue.strip() == "", queue  # nothing was submitted


def test_print_writes_a_script_that_bash_accepts(home: Path, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "regent.cli", "launch", "slurm", str(MIXED), "--nodes", "4",
                           "--gpus-per-node", "8", "--partition", "gpu", "--time", "4:00:00", "--standby",
                           "--journal", "", "--", "--lr", "3e-4"], capture_output=True, text=True,
                          env={**os.environ, "REGENT_HOME": str(home)}, timeout=60)
    assert done.returncode == 0, done.stderr
    script = done.stdout
    for line in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --partition=gpu", "#SBATCH --time=4:00:00"):
        assert line in script
    assert "srun --overlap --nodes=1 --ntasks=1 -w \"$STANDBY_NODE\"" in script
    assert "scontrol show hostnames" in script and f"{MIXED} --lr 3e-4" in script
    (tmp_path / "job.sh").write_text(script)
    assert subprocess.run(["bash", "-n", str(tmp_path / "job.sh")]).returncode == 0
