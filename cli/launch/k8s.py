"""`regent launch k8s`: Kubernetes manifests for a regent job (printed, or applied with the
user's kubectl).

- the cluster's CURVE keys as a Secret, mounted into every regent container;
- unless --journal names one, a 3-member etcd: a StatefulSet with a headless Service, whose
  pods have stable names (`<job>-etcd-0.<job>-etcd`) that make the journal's url;
- the host agents: a StatefulSet of --hosts pods with a headless Service, each advertising its
  pod IP and named after its pod, with the resources and GPUs asked for;
- the controller: a 2-replica Deployment, primary and standby through the journal's election.
  Its container runs the program under `regent launch once`, which records the run's end in
  the store: a Deployment restarts whatever exits, and a controller that started anew after
  the end would run the program again; one that finds the end recorded idles instead.
"""

from __future__ import annotations

import argparse
import base64
import subprocess
import sys
from pathlib import Path
from typing import Any

from regent.cli.launch.common import LaunchError, check_keys
from regent.journal.hosts import check_name

PROG = "regent launch k8s"
AGENT_PORT = 26100
HOME = "/var/run/regent"
SECRET_DIR = "/etc/regent/keys"  # the Secret, read-only; copied into HOME/keys, private, at pod start
KEY_ITEMS = (("regent.key", "regent.key"), ("regent.key_secret", "regent.key_secret"),
             ("authorized-regent.key", "authorized/regent.key"))
GPU_RESOURCE = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("program", help="the controller program, as a path inside the image; arguments after -- go to it")
    p.add_argument("--hosts", type=int, required=True, help="host agent pods (one per machine you want)")
    p.add_argument("--image", required=True, help="the image with regent and the program in it")
    p.add_argument("--namespace", "-n", default="default")
    p.add_argument("--name", default=None, help="the job's name, prefixing every object (default: the program's)")
    p.add_argument("--journal", default=None, help="etcd://HOST:2379[,...] (default: a 3-member etcd of the job's own)")
    p.add_argument("--etcd-image", default="quay.io/coreos/etcd:v3.5.17")
    p.add_argument("--etcd-storage", default="1Gi", help="each etcd member's volume (default 1Gi)")
    p.add_argument("--cpu", default=None, help="CPU request and limit of each host pod (e.g. 8)")
    p.add_argument("--memory", default=None, help="memory request and limit of each host pod (e.g. 64Gi)")
    p.add_argument("--gpus", type=int, default=0, help="GPUs per host pod")
    p.add_argument("--gpu-vendor", choices=sorted(GPU_RESOURCE), default="nvidia",
                   help="nvidia.com/gpu or amd.com/gpu (default nvidia)")
    p.add_argument("--python", default="python3", help="the Python in the image (default python3)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="an environment variable of the controller and agent containers (repeatable)")
    p.add_argument("--apply", action="store_true", help="apply them with kubectl (default: print them)")


def manifests(a: argparse.Namespace, args: list[str], keys: Path) -> list[dict[str, Any]]:
    """The objects of the job, as the API takes them."""
    if a.hosts < 1:
        raise LaunchError(f"--hosts {a.hosts}: a job needs at least one host pod")
    name = check_name(a.name or Path(a.program).stem.replace("_", "-").lower(), "job name (give --name)")
    ns, cluster = a.namespace, name
    etcd_svc, host_svc = f"{name}-etcd", f"{name}-hosts"
    journal = a.journal or "etcd://" + ",".join(f"{etcd_svc}-{i}.{etcd_svc}:2379" for i in range(3))
    labels = lambda part: {"app.kubernetes.io/name": "regent", "app.kubernetes.io/instance": name,  # noqa: E731
                           "app.kubernetes.io/component": part}
    meta = lambda n, part: {"name": n, "namespace": ns, "labels": labels(part)}  # noqa: E731
    env = [{"name": "REGENT_CLUSTER", "value": cluster}, {"name": "REGENT_JOURNAL", "value": journal},
           {"name": "REGENT_HOME", "value": HOME}, {"name": "REGENT_SECURE", "value": "1"},
           {"name": "PYTHONUNBUFFERED", "value": "1"},
           {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    for extra in a.env:
        key, sep, value = extra.partition("=")
        if not sep or not key:
            raise LaunchError(f"--env {extra!r}: write KEY=VALUE")
        env.append({"name": key, "value": value})
    mounts = [{"name": "home", "mountPath": HOME}]
    volumes = [{"name": "home", "emptyDir": {}},
               {"name": "keys", "secret": {"secretName": f"{name}-keys", "defaultMode": 0o400,
                                           "items": [{"key": k, "path": p} for k, p in KEY_ITEMS]}}]
    # The keys must be private files in a private directory (regent checks): a Secret volume
    # is neither, so an init container copies them into the pod's own REGENT_HOME.
    copy_keys = {"name": "keys", "image": a.image, "volumeMounts": [*mounts, {"name": "keys", "mountPath": SECRET_DIR,
                                                                             "readOnly": True}],
                 "command": ["sh", "-c", f"umask 077 && mkdir -p {HOME}/keys/authorized && " + " && ".join(
                     f"cp {SECRET_DIR}/{p} {HOME}/keys/{p}" for _, p in KEY_ITEMS)]}
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": meta(f"{name}-keys", "keys"), "type": "Opaque",
              "data": {k: base64.b64encode((keys / p).read_bytes()).decode() for k, p in KEY_ITEMS}}
    resources: dict[str, Any] = {}
    for key, value in (("cpu", a.cpu), ("memory", a.memory)):
        if value:
            resources.setdefault("requests", {})[key] = value
            resources.setdefault("limits", {})[key] = value
    if a.gpus:
        resources.setdefault("limits", {})[GPU_RESOURCE[a.gpu_vendor]] = a.gpus
    agent = {
        "name": "agent", "image": a.image, "env": env, "volumeMounts": mounts,
        "command": [a.python, "-m", "regent.cli", "host", "--cluster", cluster, "--store", journal,
                    "--advertise", "$(POD_IP)", "--name", "$(POD_NAME)", "--port", str(AGENT_PORT)],
        "ports": [{"name": "agent", "containerPort": AGENT_PORT}],
        "readinessProbe": {"tcpSocket": {"port": AGENT_PORT}, "periodSeconds": 2},
        "livenessProbe": {"tcpSocket": {"port": AGENT_PORT}, "periodSeconds": 10, "failureThreshold": 6},
    }
    if resources:
        agent["resources"] = resources
    hosts = {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta(f"{name}-host", "host"),
        "spec": {"serviceName": host_svc, "replicas": a.hosts, "podManagementPolicy": "Parallel",
                 "selector": {"matchLabels": labels("host")},
                 "template": {"metadata": {"labels": labels("host")},
                              "spec": {"initContainers": [copy_keys], "containers": [agent],
                                       "volumes": volumes}}},
    }
    controller = {
        "name": "controller", "image": a.image,
        "env": [*env, {"name": "REGENT_ADVERTISE", "value": "$(POD_IP)"}], "volumeMounts": mounts,
        "command": [a.python, "-m", "regent.cli", "launch", "once", "--cluster", cluster, "--store", journal,
                    "--", a.python, a.program, *args],
    }
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(f"{name}-controller", "controller"),
        "spec": {"replicas": 2, "selector": {"matchLabels": labels("controller")},
                 "template": {"metadata": {"labels": labels("controller")},
                              "spec": {"initContainers": [copy_keys], "containers": [controller],
                                       "volumes": volumes}}},
    }
    objects: list[dict[str, Any]] = [secret, _headless(meta(host_svc, "host"), labels("host"),
                                                       [("agent", AGENT_PORT)]), hosts, deployment]
    if not a.journal:
        objects[1:1] = _etcd(a, meta, labels, etcd_svc)
    return objects


def _headless(metadata: dict, selector: dict, ports: list[tuple[str, int]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata,
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": selector,
                     "ports": [{"name": n, "port": p} for n, p in ports]}}


def _etcd(a: argparse.Namespace, meta: Any, labels: Any, svc: str) -> list[dict[str, Any]]:
    """A 3-member etcd: pods <svc>-0..2 find each other by their stable names."""
    peers = ",".join(f"{svc}-{i}=http://{svc}-{i}.{svc}:2380" for i in range(3))
    container = {
        "name": "etcd", "image": a.etcd_image,
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "command": ["etcd", "--name", "$(POD_NAME)", "--data-dir", "/var/lib/etcd/data",
                    "--listen-client-urls", "http://0.0.0.0:2379",
                    "--advertise-client-urls", f"http://$(POD_NAME).{svc}:2379",
                    "--listen-peer-urls", "http://0.0.0.0:2380",
                    "--initial-advertise-peer-urls", f"http://$(POD_NAME).{svc}:2380",
                    "--initial-cluster", peers, "--initial-cluster-state", "new",
                    "--initial-cluster-token", svc],
        "ports": [{"name": "client", "containerPort": 2379}, {"name": "peer", "containerPort": 2380}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": 2379}, "periodSeconds": 2},
        "volumeMounts": [{"name": "data", "mountPath": "/var/lib/etcd"}],
    }
    stateful = {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta(svc, "etcd"),
        "spec": {"serviceName": svc, "replicas": 3, "podManagementPolicy": "Parallel",
                 "selector": {"matchLabels": labels("etcd")},
                 "template": {"metadata": {"labels": labels("etcd")}, "spec": {"containers": [container]}},
                 "volumeClaimTemplates": [{"metadata": {"name": "data"},
                                           "spec": {"accessModes": ["ReadWriteOnce"],
                                                    "resources": {"requests": {"storage": a.etcd_storage}}}}]},
    }
    return [_headless(meta(svc, "etcd"), labels("etcd"), [("client", 2379), ("peer", 2380)]), stateful]


def _check_form(url: str) -> None:
    from regent.journal.etcd_target import parse_etcd_url

    if not url.startswith(("etcd://", "etcds://")):
        raise LaunchError(f"--journal {url}: a job on Kubernetes needs etcd (etcd://HOST:2379[,...])")
    try:
        parse_etcd_url(url)
    except ValueError as e:
        raise LaunchError(str(e)) from None


def render(objects: list[dict[str, Any]]) -> str:
    import yaml

    class Plain(yaml.SafeDumper):  # objects shared between containers are written out each time
        def ignore_aliases(self, data: Any) -> bool:
            return True

    return "".join("---\n" + yaml.dump(o, Dumper=Plain, sort_keys=False) for o in objects)


def run(a: argparse.Namespace, rest: list[str]) -> int:
    try:
        keys = check_keys()
        if a.journal:  # in the cluster's network, maybe not reachable from here: its form only
            _check_form(a.journal)
        text = render(manifests(a, rest, keys))
        if not a.apply:
            print(text, end="")
            return 0
        try:
            done = subprocess.run(["kubectl", "apply", "-f", "-"], input=text, capture_output=True, text=True,
                                  timeout=120)
        except FileNotFoundError:
            raise LaunchError("kubectl is not installed here: install it, or print the manifests and apply "
                              "them where it is") from None
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or ["no reason given"])[-1]
            raise LaunchError(f"kubectl apply failed: {why}")
        print(done.stdout, end="")
        return 0
    except LaunchError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
