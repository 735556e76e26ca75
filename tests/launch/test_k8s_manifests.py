"""`regent launch k8s`: the manifests hold what they must (read as data), and every container's
command line, with the environment and volumes the manifests give it, run in namespace hosts
standing in for pods, forms a working cluster that runs a program through a failover. No
cluster manager is involved: the pods' names, addresses, DNS and volumes are made here."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from regent.chaos.netns import NamespaceHosts
from regent.controller.edge import STANDING_BY
from regent.journal import open_journal
from regent.journal.hosts import registered_hosts, run_ended
from tests.failover.harness import check_exactly_once
from tests.support.etcd import skip_unless_namespace_hosts_and_etcd

REPO = Path(__file__).resolve().parents[2]
MIXED = REPO / "tests" / "failover" / "programs" / "mixed.py"
STEPS = 150


def _launch(*args: str, home: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "regent.cli", "launch", "k8s", *args], capture_output=True,
                          text=True, env={**os.environ, "REGENT_HOME": str(home)}, timeout=60)


def _objects(text: str) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(text) if o}


def _containers(obj: dict) -> list[dict]:
    spec = obj["spec"]["template"]["spec"]
    return spec.get("initContainers", []) + spec["containers"]


def test_the_manifests_hold_what_they_must(home: Path) -> None:
    done = _launch("train.py", "--hosts", "3", "--image", "reg.example/train:1", "--namespace", "ml", "--gpus",
                   "8", "--cpu", "16", "--memory", "64Gi", "--env", "WANDB_MODE=offline", "--", "--steps", "9",
                   home=home)
    assert done.returncode == 0, done.stderr
    objs = _objects(done.stdout)
    assert set(objs) == {("Secret", "train-keys"), ("Service", "train-etcd"), ("StatefulSet", "train-etcd"),
                         ("Service", "train-hosts"), ("StatefulSet", "train-host"), ("Deployment", "train-controller")}
    assert all(o["metadata"]["namespace"] == "ml" for o in objs.values())
    for svc in ("train-etcd", "train-hosts"):  # headless: stable per-pod names
        assert objs["Service", svc]["spec"]["clusterIP"] == "None"
    hosts, etcd = objs["StatefulSet", "train-host"], objs["StatefulSet", "train-etcd"]
    assert hosts["spec"]["replicas"] == 3 and hosts["spec"]["serviceName"] == "train-hosts"
    assert etcd["spec"]["replicas"] == 3 and etcd["spec"]["serviceName"] == "train-etcd"
    assert etcd["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert objs["Deployment", "train-controller"]["spec"]["replicas"] == 2
    secret = objs["Secret", "train-keys"]["data"]
    import base64

    assert base64.b64decode(secret["regent.key_secret"]) == (home / "keys" / "regent.key_secret").read_bytes()
    journal = "etcd://train-etcd-0.train-etcd:2379,train-etcd-1.train-etcd:2379,train-etcd-2.train-etcd:2379"
    agent = hosts["spec"]["template"]["spec"]["containers"][0]
    assert agent["resources"] == {"requests": {"cpu": "16", "memory": "64Gi"},
                                  "limits": {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": 8}}
    assert agent["readinessProbe"]["tcpSocket"]["port"] == agent["ports"][0]["containerPort"]
    assert etcd["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/health"
    assert agent["command"][agent["command"].index("--advertise") + 1] == "$(POD_IP)"
    ctl = objs["Deployment", "train-controller"]["spec"]["template"]["spec"]["containers"][0]
    assert ctl["command"][-4:] == ["python3", "train.py", "--steps", "9"]
    assert ctl["command"][3:5] == ["launch", "once"]
    for c in (agent, ctl):
        env = {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
        assert env["REGENT_CLUSTER"] == "train" and env["REGENT_JOURNAL"] == journal
        assert env["REGENT_SECURE"] == "1" and env["WANDB_MODE"] == "offline"
        assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert {e["name"]: e["value"] for e in ctl["env"] if "value" in e}["REGENT_ADVERTISE"] == "$(POD_IP)"
    amd = _objects(_launch("train.py", "--hosts", "1", "--image", "x", "--gpus", "2", "--gpu-vendor", "amd",
                           "--journal", "etcd://etcd.ml:2379", home=home).stdout)
    assert ("StatefulSet", "train-etcd") not in amd  # the journal named is used
    limits = amd["StatefulSet", "train-host"]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"amd.com/gpu": 2}


def test_bad_input_fails_with_one_line(home: Path, tmp_path: Path) -> None:
    for args, said in ((["t.py", "--hosts", "0", "--image", "x"], "at least one host pod"),
                       (["t.py", "--hosts", "2", "--image", "x", "--journal", "sqlite:///x.db"], "needs etcd"),
                       (["t.py", "--hosts", "2", "--image", "x", "--env", "NOEQUALS"], "KEY=VALUE")):
        done = _launch(*args, home=home)
        assert done.returncode == 2 and said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done
    done = _launch("t.py", "--hosts", "2", "--image", "x", home=tmp_path / "no-keys")
    assert done.returncode == 2 and "regent keys init" in done.stderr


# --- the containers, run as pods in namespace hosts -------------------------------------------

class Pods:
    """Pods of the manifests as namespace hosts: a name and address each, DNS for the headless
    Services' pod names, their volumes bind-mounted in a mount namespace of their own."""

    MOUNTS = ("/var/run/regent", "/etc/regent/keys", "/var/lib/etcd")

    def __init__(self, objs: dict, workdir: Path, image_env: dict[str, str]):
        self.objs, self.workdir, self.image_env = objs, workdir, image_env
        self.pods: dict[str, tuple[dict, str]] = {}  # pod name -> (pod template, headless service)
        for (kind, name), o in objs.items():
            if kind == "StatefulSet":
                for i in range(o["spec"]["replicas"]):
                    self.pods[f"{name}-{i}"] = (o["spec"]["template"], o["spec"]["serviceName"])
            elif kind == "Deployment":
                for i in range(o["spec"]["replicas"]):
                    self.pods[f"{name}-{'abcdef'[i]}"] = (o["spec"]["template"], "")
        self.net = NamespaceHosts(list(self.pods))
        self.procs: dict[str, subprocess.Popen] = {}
        self._made: list[Path] = []

    def __enter__(self) -> Pods:
        self.net.create()
        lines = ["127.0.0.1 localhost"] + [
            f"{self.net.address(p)} {p}.{svc} {p}" for p, (_, svc) in self.pods.items() if svc]
        for pod in self.pods:
            d = Path("/etc/netns") / self.net.netns(pod)
            d.mkdir(parents=True, exist_ok=True)
            (d / "hosts").write_text("\n".join(lines) + "\n")
            self._made.append(d)
        for m in self.MOUNTS:
            p = Path(m)
            top = next((q for q in [p, *p.parents] if q.parent.exists() and not q.exists()), None)
            if top is not None:
                p.mkdir(parents=True)
                self._made.append(top)
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
        self.net.close()
        for d in reversed(self._made):
            shutil.rmtree(d, ignore_errors=True)

    def _volumes(self, pod: str, template: dict) -> dict[str, Path]:
        out = {}
        for v in template["spec"].get("volumes", []) + [{"name": "data", "emptyDir": {}}]:
            d = self.workdir / pod / v["name"]
            if not d.exists():
                d.mkdir(parents=True)
                if "secret" in v:  # the Secret's items, as a secret volume holds them
                    data = self.objs["Secret", v["secret"]["secretName"]]["data"]
                    import base64

                    for item in v["secret"]["items"]:
                        f = d / item["path"]
                        f.parent.mkdir(parents=True, exist_ok=True)
                        f.write_bytes(base64.b64decode(data[item["key"]]))
                        f.chmod(v["secret"]["defaultMode"])
            out[v["name"]] = d
        return out

    def _env(self, pod: str, container: dict) -> dict[str, str]:
        env = dict(self.image_env)
        for e in container.get("env", []):
            if "value" in e:
                env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), e["value"])
            else:
                field = e["valueFrom"]["fieldRef"]["fieldPath"]
                env[e["name"]] = {"metadata.name": pod, "status.podIP": self.net.address(pod)}[field]
        return env

    def run(self, pod: str, container: dict, wait: bool = False) -> subprocess.Popen:
        template, _ = self.pods[pod]
        env = self._env(pod, container)
        argv = [re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), x) for x in container["command"]]
        vols = self._volumes(pod, template)
        binds = "".join(f"mount --bind {vols[m['name']]} {m['mountPath']} && "
                        for m in container.get("volumeMounts", []))
        log = self.workdir / f"{pod}.{container['name']}.log"
        p = self.net.popen(pod, ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                                 binds + 'exec "$@"', "sh", *argv], env=env, log_path=log)
        if wait:
            assert p.wait(60) == 0, log.read_text()
        else:
            self.procs[f"{pod}/{container['name']}"] = p
        return p

    def start(self, pod: str) -> None:
        template, _ = self.pods[pod]
        for c in template["spec"].get("initContainers", []):
            self.run(pod, c, wait=True)
        for c in template["spec"]["containers"]:
            self.run(pod, c)

    def log(self, pod: str, container: str) -> str:
        return (self.workdir / f"{pod}.{container}.log").read_text()


@pytest.fixture
def k8s_ready() -> None:
    skip_unless_namespace_hosts_and_etcd()
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")


def test_the_containers_form_a_cluster_that_runs_a_program_through_a_failover(k8s_ready, home: Path,
                                                                                tmp_path: Path) -> None:
    session = f"k8s-{uuid.uuid4().hex[:8]}"
    leaders = tmp_path / "leaders"
    done = _launch(str(MIXED), "--hosts", "3", "--image", "this-checkout", "--python", sys.executable,
                   "--name", "job", "--env", f"REGENT_TEST_SESSION={session}", "--env", "REGENT_TEST_HOSTS=3",
                   "--env", f"REGENT_TEST_STEPS={STEPS}", "--env", f"REGENT_TEST_LEADER_FILE={leaders}",
                   "--env", "REGENT_TEST_TTL=3.0",  # a lease a loaded machine keeps
                   "--env", "REGENT_TEST_STEP_S=0.05", home=home)  # >= 7.5 s live: the kill lands mid-run
    assert done.returncode == 0, done.stderr
    objs = _objects(done.stdout)
    image_env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "HOME": str(tmp_path)}
    with Pods(objs, tmp_path / "pods", image_env) as pods:
        for i in range(3):
            pods.start(f"job-etcd-{i}")
        url = f"etcd://{pods.net.address('job-etcd-0')}:2379"
        deadline = time.monotonic() + 60
        journal = None
        while journal is None:
            try:
                journal = open_journal(url)
                journal.backend.session_names()
            except Exception:
                journal = None
                assert time.monotonic() < deadline, pods.log("job-etcd-0", "etcd")
                time.sleep(0.5)
        try:
            for i in range(3):
                pods.start(f"job-host-{i}")
            while len(registered_hosts(journal.backend, "job")) < 3:
                assert time.monotonic() < deadline + 30, pods.log("job-host-0", "agent")
                time.sleep(0.2)
            pods.start("job-controller-a")
            pods.start("job-controller-b")
            while not leaders.exists() or not leaders.read_text().strip():
                assert time.monotonic() < deadline + 60, pods.log("job-controller-a", "controller")
                time.sleep(0.1)
            first = int(leaders.read_text().split()[0])
            while not any(re.search(r"^step 3$", pods.log(p, "controller"), re.M)
                          for p in ("job-controller-a", "job-controller-b")):
                assert time.monotonic() < deadline + 90, pods.log("job-controller-a", "controller")
                time.sleep(0.02)
            while not any(STANDING_BY in pods.log(p, "controller") for p in ("job-controller-a", "job-controller-b")):
                assert time.monotonic() < deadline + 90, pods.log("job-controller-b", "controller")
                time.sleep(0.02)  # the other controller waits behind the primary before the kill
            os.kill(first, signal.SIGKILL)  # the primary's program dies mid-run; its wrapper restarts it
            while (ended := run_ended(journal.backend, "job")) is None:
                assert time.monotonic() < deadline + 180, pods.log("job-controller-b", "controller")
                time.sleep(0.2)
            assert ended["status"] == 0, ended
            logs = {p: pods.log(p, "controller") for p in ("job-controller-a", "job-controller-b")}
            results = [json.loads(line) for text in logs.values() for line in text.splitlines()
                       if line.startswith("{") and '"reports"' in line]
            assert len(results) == 1, logs
            assert results[0]["role"] == "standby-took-over"
            check_exactly_once(results[0], STEPS)
            restarted = [p for p, text in logs.items() if "starting it again as a standby" in text]
            assert len(restarted) == 1, logs
            time.sleep(2.0)  # the restarted controller finds the end recorded and idles
            for pod in logs:
                wrapper = pods.procs[f"{pod}/controller"]
                assert wrapper.poll() is None, f"{pod} exited: a Deployment would start it again\n{logs[pod]}"
                assert "idling so that it is not started again" in pods.log(pod, "controller")
                wrapper.send_signal(signal.SIGTERM)
                assert wrapper.wait(10) == 0
        finally:
            journal.close()
