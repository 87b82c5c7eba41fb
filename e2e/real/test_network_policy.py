"""The jobs' NetworkPolicies enforced on the kind cluster by kube-router (the node image's CNI,
e2e/cluster/kind/kube-router.yaml: iptables and ipset on each node), across nodes:

- a pod of another namespace is refused by a parameter server's gRPC port, while a worker of the
  same job (on the GPU node) connects;
- the chief's progress port answers the operator's namespace and refuses every other pod, the
  job's own included;
- `spec.networkPolicy.enabled: false` on the running job lets the other namespace in; enabled
  again, it is refused again;
- deleting the job removes its rules and sets from the nodes;
- a hostile tenant gets nothing of a running job: a pod of another namespace and a pod of the
  operator's namespace that is not the operator are refused by the chief's progress port (GET
  /progress, POST /checkpoint with a hold of an hour, with and without a guessed token) and by
  the chief's and a parameter server's gRPC ports; a host-network pod on the chief's node, which no
  NetworkPolicy isolates, gets 401 from the progress port; the operator still reads the step and
  gets its checkpoint before a suspend.

The example trains to Succeeded with its policies enforced in test_training.py.

The rules are read where kube-router writes them (e2e/real/enforcers.py). On a cluster whose CNI
is not kube-router (kind's stock kindnetd) these tests are unavailable, with the reason.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from e2e import psjobs
from e2e.kubectl import _kubectl, kubectl
from e2e.real import enforcers, example
from e2e.real.conftest import OPERATOR_IMAGE, Figures, operator_pod
from e2e.real.enforcers import Enforcer
from e2e.util import unavailable, wait_for
from psoperator.contract import DEFAULT_PROGRESS_PORT, PROGRESS_PATH

LONG = 1_000_000  # steps: trains for as long as the test probes
# A connection the policies refuse is rejected at once; one they allow is accepted at once.
CONNECT_TIMEOUT = 3
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def enforcer(kubeconfig: Path, k8s: client.ApiClient) -> Iterator[Enforcer]:
    """kube-router ready on every node; at the end, none of its pods restarted meanwhile."""
    found = enforcers.find(kubeconfig, k8s)
    if found is None:
        unavailable("this cluster's CNI is not kube-router (kind.sh's node image runs it)")
    before = found.restarts()
    yield found
    assert found.restarts() == before, "kube-router restarted during the tests"


@pytest.fixture
def outsider(k8s: client.ApiClient, kubeconfig: Path, images: dict[str, str]) -> Iterator[tuple[str, str]]:
    """A pod in a namespace of its own (the operator's image: it has Python), as (namespace, pod)."""
    namespace = f"e2e-outsider-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(k8s)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "outsider"},
        "spec": {
            "containers": [
                {
                    "name": "probe",
                    "image": images["operator"],
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", "import time; time.sleep(3600)"],
                }
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }
    kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(pod))
    kubectl(kubeconfig, "wait", "-n", namespace, "--for=condition=Ready", "pod/outsider", "--timeout=120s")
    yield namespace, "outsider"
    core.delete_namespace(namespace)


def _probe_pod(kubeconfig: Path, namespace: str, name: str, spec: Obj, container: Obj, labels: Obj) -> None:
    """A pod of the operator's image (it has Python) that sleeps, created and Ready."""
    sleeper = {
        "name": "probe",
        "image": OPERATOR_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["python", "-c", "import time; time.sleep(3600)"],
        **container,
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [sleeper], "terminationGracePeriodSeconds": 0, **spec},
    }
    kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(pod))
    kubectl(kubeconfig, "wait", "-n", namespace, "--for=condition=Ready", f"pod/{name}", "--timeout=120s")


@pytest.fixture
def impostor(kubeconfig: Path, release: str, images: dict[str, str]) -> Iterator[tuple[str, str]]:
    """A pod in the operator's namespace that is not the operator (as Pod Security `restricted`,
    which that namespace enforces, wants it), as (namespace, pod)."""
    restricted = {"runAsNonRoot": True, "runAsUser": 10001, "seccompProfile": {"type": "RuntimeDefault"}}
    locked = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    labels = {"app.kubernetes.io/name": "impostor"}
    _probe_pod(
        kubeconfig, release, "impostor", {"securityContext": restricted}, {"securityContext": locked}, labels
    )
    yield release, "impostor"
    kubectl(kubeconfig, "delete", "pod", "-n", release, "impostor", "--wait=false")


def _host_network_pod(kubeconfig: Path, namespace: str, node: str) -> str:
    """A host-network pod on `node` (no NetworkPolicy isolates the node's own traffic); its name."""
    _probe_pod(kubeconfig, namespace, "host-network", {"hostNetwork": True, "nodeName": node}, {}, {})
    return "host-network"


# Run in a pod: for each target, "blocked" (no connection), "connected" (TCP only) or the HTTP status.
PROBE = """
import http.client, json, socket, sys
def one(target):
    try:
        connection = socket.create_connection((target["host"], target["port"]), timeout=%d)
    except OSError:
        return "blocked"
    if not target.get("method"):
        connection.close()
        return "connected"
    asking = http.client.HTTPConnection(target["host"], target["port"], timeout=20)
    asking.sock = connection
    asking.request(target["method"], target["path"], headers=target.get("headers") or {})
    return asking.getresponse().status
print(json.dumps([one(target) for target in json.loads(sys.argv[1])]))
"""


class Pod:
    """A container to connect from, through `kubectl exec` (each image has Python)."""

    def __init__(self, kubeconfig: Path, namespace: str, name: str, container: str) -> None:
        self.kubeconfig, self.namespace, self.name, self.container = kubeconfig, namespace, name, container

    def probe(self, targets: list[Obj]) -> list[Any]:
        """What each target answers this pod (PROBE)."""
        result = subprocess.run(
            [_kubectl(), "--kubeconfig", str(self.kubeconfig), "exec", "-n", self.namespace, self.name,
             "-c", self.container, "--", "python", "-c", PROBE % CONNECT_TIMEOUT, json.dumps(targets)],
            capture_output=True, text=True, timeout=300, check=True,
        )  # fmt: skip
        answers: list[Any] = json.loads(result.stdout)
        return answers

    def connects(self, ip: str, port: int) -> bool:
        """Whether a TCP connection to ip:port is established (not refused, not timed out)."""
        probe = (
            f"import socket; socket.create_connection(({ip!r}, {port}), timeout={CONNECT_TIMEOUT}).close()"
        )
        result = subprocess.run(
            [_kubectl(), "--kubeconfig", str(self.kubeconfig), "exec", "-n", self.namespace, self.name,
             "-c", self.container, "--", "python", "-c", probe],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        return result.returncode == 0


def _sets(rules: list[str]) -> set[str]:
    return set(re.findall(r"--match-set (\S+)", "\n".join(rules)))


def _training(kubeconfig: Path, k8s: client.ApiClient, enforcer: Enforcer, namespace: str) -> tuple[str, int]:
    """The example, applied, once the operator reads its chief's progress (from its own namespace:
    status.step advances) and the job's policies are on the nodes; its name and gRPC port."""
    docs = example.manifests(namespace, LONG)
    kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(docs))
    job = next(d for d in docs if d["kind"] == "PSTrainingJob")
    name = str(job["metadata"]["name"])
    wait_for(
        lambda: (psjobs.status(k8s, namespace, name).get("step") or 0) > 0,
        timeout=300,
        interval=1,
        message=lambda: f"status.step read by the operator; {psjobs.status(k8s, namespace, name)}",
    )
    wait_for(
        lambda: enforcer.enforces(namespace, name), timeout=60, message="the job's policies on the nodes"
    )
    return name, int(job["spec"]["port"])


def test_another_namespace_is_refused_until_the_policies_are_switched_off_and_the_rules_go_with_the_job(
    kubeconfig: Path,
    k8s: client.ApiClient,
    enforcer: Enforcer,
    namespace: str,
    release: str,
    outsider: tuple[str, str],
    figures: Figures,
) -> None:
    name, grpc = _training(kubeconfig, k8s, enforcer, namespace)
    ps_ip = psjobs.running_pod(k8s, namespace, name, "ps", 0)["status"]["podIP"]
    chief_ip = psjobs.running_pod(k8s, namespace, name, "chief")["status"]["podIP"]
    worker_pod = psjobs.running_pod(k8s, namespace, name, "worker", 0)["metadata"]["name"]
    worker = Pod(kubeconfig, namespace, worker_pod, "trainer")
    operator = Pod(kubeconfig, release, operator_pod(k8s, release)["metadata"]["name"], "operator")
    other = Pod(kubeconfig, *outsider, "probe")

    assert worker.connects(ps_ip, grpc)
    assert not other.connects(ps_ip, grpc)
    assert operator.connects(chief_ip, DEFAULT_PROGRESS_PORT)
    assert not other.connects(chief_ip, DEFAULT_PROGRESS_PORT)
    assert not worker.connects(chief_ip, DEFAULT_PROGRESS_PORT)  # the job's pods: only its gRPC port
    figures.record("NetworkPolicy: another namespace → PS gRPC, chief progress", "refused")
    figures.record("NetworkPolicy: worker → PS gRPC; operator → chief progress", "connected")

    # The policies, not something else, keep it out: switched off, the same pod gets in.
    psjobs.patch_spec(k8s, namespace, name, {"networkPolicy": {"enabled": False}})
    wait_for(
        lambda: other.connects(ps_ip, grpc) and other.connects(chief_ip, DEFAULT_PROGRESS_PORT),
        timeout=60,
        interval=1,
        message="the other namespace connects once the job's policies are switched off",
    )
    figures.record("NetworkPolicy off: another namespace → PS gRPC, chief progress", "connected")
    psjobs.patch_spec(k8s, namespace, name, {"networkPolicy": {"enabled": True}})
    wait_for(
        lambda: not other.connects(ps_ip, grpc),
        timeout=60,
        interval=1,
        message="the other namespace refused again once the policies are back",
    )

    rules = enforcer.rules(namespace)
    sets = _sets(rules)
    assert sets, rules
    client.CustomObjectsApi(k8s).delete_namespaced_custom_object(
        psjobs.GROUP, psjobs.VERSION, namespace, psjobs.PLURAL, name
    )
    wait_for(
        lambda: not enforcer.rules(namespace) and not sets & enforcer.sets(),
        timeout=180,
        interval=1,
        message=lambda: (
            f"the job's rules and sets gone: {enforcer.rules(namespace)}, {sets & enforcer.sets()}"
        ),
    )


def _http(ip: str, method: str, path: str, headers: dict[str, str] | None = None) -> Obj:
    return {"host": ip, "port": DEFAULT_PROGRESS_PORT, "method": method, "path": path, "headers": headers}


def test_a_hostile_tenant_gets_nothing_of_a_running_jobs_chief_nor_its_grpc_ports(
    kubeconfig: Path,
    k8s: client.ApiClient,
    enforcer: Enforcer,
    namespace: str,
    release: str,
    outsider: tuple[str, str],
    impostor: tuple[str, str],
    figures: Figures,
) -> None:
    name, grpc = _training(kubeconfig, k8s, enforcer, namespace)
    chief = psjobs.running_pod(k8s, namespace, name, "chief")
    chief_ip, chief_node = chief["status"]["podIP"], chief["spec"]["nodeName"]
    ps_ip = psjobs.running_pod(k8s, namespace, name, "ps", 0)["status"]["podIP"]
    worker_pod = psjobs.running_pod(k8s, namespace, name, "worker", 0)["metadata"]["name"]

    guessed = {"Authorization": f"Bearer {secrets.token_hex(32)}"}
    hold = "/checkpoint?holdSeconds=3600&deadlineSeconds=5"
    asks = [
        _http(chief_ip, "GET", PROGRESS_PATH),
        _http(chief_ip, "GET", PROGRESS_PATH, guessed),
        _http(chief_ip, "POST", hold),
        _http(chief_ip, "POST", hold, guessed),
    ]
    grpc_ports = [{"host": chief_ip, "port": grpc}, {"host": ps_ip, "port": grpc}]
    # The targets answer whom the policies let in: the job's worker its gRPC ports, the operator
    # the progress port, which still wants the job's token from it.
    assert Pod(kubeconfig, namespace, worker_pod, "trainer").probe(grpc_ports) == ["connected"] * 2
    operator = Pod(kubeconfig, release, operator_pod(k8s, release)["metadata"]["name"], "operator")
    assert operator.probe(asks) == [401] * 4

    for who, (pod_namespace, pod) in (
        ("another namespace", outsider),
        ("the operator's namespace", impostor),
    ):
        answers = Pod(kubeconfig, pod_namespace, pod, "probe").probe(asks + grpc_ports)
        assert answers == ["blocked"] * 6, (who, answers)
        figures.record(f"hostile pod of {who} → chief progress, chief and PS gRPC", "blocked")
    host = Pod(kubeconfig, outsider[0], _host_network_pod(kubeconfig, outsider[0], chief_node), "probe")
    assert host.probe(asks) == [401] * 4
    figures.record("host-network pod on the chief's node → chief progress (4 asks)", "401")
    [reached] = host.probe(grpc_ports[:1])
    figures.record("host-network pod on the chief's node → chief gRPC (no policy isolates it)", reached)

    # Nothing held the chief: it trains on, and the operator reads its step (the STEP column).
    step = psjobs.status(k8s, namespace, name)["step"]
    wait_for(
        lambda: psjobs.status(k8s, namespace, name)["step"] > step,
        timeout=120,
        interval=1,
        message="the step moving on after the hostile requests",
    )
    row = kubectl(kubeconfig, "get", "psjob", name, "-n", namespace).splitlines()
    assert int(row[1].split()[row[0].split().index("STEP")]) > step, row
    # And the operator's own checkpoint request is answered before a suspend.
    psjobs.patch_spec(k8s, namespace, name, {"runPolicy": {"suspend": True}})
    psjobs.wait_phase(k8s, namespace, name, "Suspended", timeout=120)
    stop = psjobs.status(k8s, namespace, name)["lastPlannedStop"]
    assert stop["cause"] == "Suspend" and stop["checkpointStep"] > step, stop
