"""The Slurm fixture is a real cluster: jobs run on the nodes they are given, in those nodes'
namespaces, their exit status is recorded, and close() leaves nothing behind."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.support.slurm import SlurmCluster, slurm_unavailable_reason

SHOW_HOST = 'echo "$(hostname) $(hostname -I)"'


def test_srun_runs_one_task_on_each_node_in_that_nodes_namespace(slurm: SlurmCluster) -> None:
    done = slurm.run(["srun", "-N2", "--ntasks-per-node=1", "sh", "-c", SHOW_HOST])
    seen = sorted(line.split() for line in done.stdout.splitlines())
    assert seen == [["n1", slurm.node_address("n1")], ["n2", slurm.node_address("n2")]]


def test_a_batch_jobs_exit_status_is_recorded(slurm: SlurmCluster) -> None:
    failed = slurm.wait_job(slurm.sbatch("#!/bin/sh\nexit 3\n"))
    ok = slurm.wait_job(slurm.sbatch("#!/bin/sh\ntrue\n"))
    assert (failed["JobState"], failed["ExitCode"]) == ("FAILED", "3:0")
    assert (ok["JobState"], ok["ExitCode"]) == ("COMPLETED", "0:0")


def test_a_step_inside_a_batch_job_runs_on_the_node_it_names(slurm: SlurmCluster, tmp_path: Path) -> None:
    out = tmp_path / "step.out"
    script = f"#!/bin/sh\nsrun --overlap -N1 -n1 -w n2 sh -c '{SHOW_HOST}' > {out}\n"
    job = slurm.wait_job(slurm.sbatch(script, "-N2", f"--output={tmp_path / 'job.out'}"))
    assert job["JobState"] == "COMPLETED", (job, (tmp_path / "job.out").read_text())
    assert job["BatchHost"] == "n1"
    assert out.read_text().split() == ["n2", slurm.node_address("n2")]


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout


def test_close_leaves_no_daemon_namespace_bridge_or_mount(tmp_path: Path) -> None:
    reason = slurm_unavailable_reason()
    if reason:
        pytest.skip(reason)
    workdir = tmp_path / "slurm"
    with SlurmCluster(workdir, nodes=["n1", "n2"]) as cluster:
        pids = cluster.daemon_pids()
        namespaces = [cluster.net.netns(n) for n in cluster.nodes]
        # A job still running at close() is cancelled with the rest.
        job = cluster.sbatch("#!/bin/sh\nsleep 600\n")
        deadline = time.monotonic() + 20
        while cluster.job(job)["JobState"] != "RUNNING":
            assert time.monotonic() < deadline, cluster.job(job)
            time.sleep(0.2)
        assert len(pids) == 4 and all(psutil.pid_exists(p) for p in pids)
        assert all(ns in _namespaces() for ns in namespaces)
    assert [p for p in pids if psutil.pid_exists(p)] == []
    assert [ns for ns in namespaces if ns in _namespaces()] == []
    assert [p.pid for p in psutil.process_iter(["cmdline"]) if str(workdir) in " ".join(p.info["cmdline"] or [])] == []
    assert str(workdir) not in Path("/proc/self/mounts").read_text()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert cluster.net.bridge not in links
