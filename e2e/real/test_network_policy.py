"""The jobs' NetworkPolicies enforced on the kind cluster by kube-router (the node image's CNI,
e2e/cluster/kind/kube-router.yaml: iptables and ipset on each node), across nodes:

- a pod of another namespace is refused by a parameter server's gRPC port, while a worker of the
  same job (on the GPU node) connects;
- the chief's progress port answers the operator's namespace and refuses every other pod, the
  job's own included;
- `spec.networkPolicy.enabled: false` on the running job lets the other namespace in; enabled
  again, it is refused again;
- deleting the job removes its rules and sets from the nodes;
- the example trains to Succeeded with its policies enforced (its cluster forms over cluster DNS).

The rules are read where kube-router writes them, through its pods (host network: the node's
iptables and ipsets). On a cluster whose CNI is not kube-router (kind's stock kindnetd) they are
unavailable, with the reason.
"""

from __future__ import annotations

import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e import psjobs
from e2e.kubectl import _kubectl, kubectl
from e2e.real import example
from e2e.real.conftest import Figures, operator_pod
from e2e.util import as_json, unavailable, wait_for
from psoperator.contract import DEFAULT_PROGRESS_PORT

LONG = 1_000_000  # steps: trains for as long as the test probes
TRAIN_STEPS = 1_200
ENFORCER_NS, ENFORCER = "kube-system", "kube-router"
ENFORCER_PODS = "app.kubernetes.io/name=kube-router"
# A connection the policies refuse is rejected at once; one they allow is accepted at once.
CONNECT_TIMEOUT = 3
Obj = dict[str, Any]


class Enforcer:
    """kube-router's pods, one per node: whether all are ready, and what they wrote on the nodes."""

    def __init__(self, kubeconfig: Path, k8s: client.ApiClient) -> None:
        self.kubeconfig, self.k8s = kubeconfig, k8s

    def pods(self) -> list[Obj]:
        listed = client.CoreV1Api(self.k8s).list_namespaced_pod(ENFORCER_NS, label_selector=ENFORCER_PODS)
        return [as_json(self.k8s, p) for p in listed.items]

    def not_ready(self) -> str:
        """Why the enforcer is not ready on every node ("" when it is)."""
        found = client.AppsV1Api(self.k8s).read_namespaced_daemon_set(ENFORCER, ENFORCER_NS)
        status = as_json(self.k8s, found)["status"]
        ready, wanted = status.get("numberReady", 0), status.get("desiredNumberScheduled", 0)
        return "" if ready == wanted > 0 else f"{ready} of {wanted} kube-router pods ready"

    def restarts(self) -> dict[str, int]:
        return {
            p["metadata"]["name"]: sum(c["restartCount"] for c in p["status"].get("containerStatuses", []))
            for p in self.pods()
        }

    def on_nodes(self, *command: str) -> str:
        """A command's output from every node, in kube-router's container (it has the tools)."""
        exec_in = ("exec", "-n", ENFORCER_NS, "-c", ENFORCER)
        return "\n".join(
            kubectl(self.kubeconfig, *exec_in, p["metadata"]["name"], "--", *command) for p in self.pods()
        )

    def rules(self, namespace: str) -> list[str]:
        """The filter rules kube-router wrote for the namespace's pods and policies (their comments
        name it: "... namespace: NS" for a pod, "... namespace NS" for a policy)."""
        named = re.compile(rf'namespace:? {re.escape(namespace)}[" ]')
        saved = self.on_nodes("iptables-save", "-t", "filter")
        return [line for line in saved.splitlines() if named.search(line)]

    def sets(self) -> set[str]:
        return set(self.on_nodes("ipset", "list", "-n").split())


@pytest.fixture(scope="module")
def enforcer(kubeconfig: Path, k8s: client.ApiClient) -> Iterator[Enforcer]:
    """kube-router ready on every node; at the end, none of its pods restarted meanwhile."""
    found = Enforcer(kubeconfig, k8s)
    try:
        found.not_ready()
    except ApiException as e:
        if e.status != 404:
            raise
        unavailable("this cluster's CNI is not kube-router (kind.sh's node image runs it)")
    wait_for(lambda: not found.not_ready(), timeout=120, message=found.not_ready)
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


class Pod:
    """A container to connect from, through `kubectl exec` (each image has Python)."""

    def __init__(self, kubeconfig: Path, namespace: str, name: str, container: str) -> None:
        self.kubeconfig, self.namespace, self.name, self.container = kubeconfig, namespace, name, container

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


def _apply(kubeconfig: Path, namespace: str, steps: int) -> tuple[str, int]:
    """The example, applied; its name and gRPC port."""
    docs = example.manifests(namespace, steps)
    kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(docs))
    job = next(d for d in docs if d["kind"] == "PSTrainingJob")
    return str(job["metadata"]["name"]), int(job["spec"]["port"])


def _policies_enforced(enforcer: Enforcer, namespace: str, name: str) -> bool:
    rules = "\n".join(enforcer.rules(namespace))
    policies = (f"{name}-peers", f"{name}-chief-progress")
    return all(f"policy name {policy} namespace" in rules for policy in policies)


def test_another_namespace_is_refused_until_the_policies_are_switched_off_and_the_rules_go_with_the_job(
    kubeconfig: Path,
    k8s: client.ApiClient,
    enforcer: Enforcer,
    namespace: str,
    release: str,
    outsider: tuple[str, str],
    figures: Figures,
) -> None:
    name, grpc = _apply(kubeconfig, namespace, LONG)
    # The operator, in its own namespace, reads the chief's progress: the step advances.
    wait_for(
        lambda: (psjobs.status(k8s, namespace, name).get("step") or 0) > 0,
        timeout=300,
        interval=1,
        message=lambda: f"status.step read by the operator; {psjobs.status(k8s, namespace, name)}",
    )
    ps_ip = psjobs.running_pod(k8s, namespace, name, "ps", 0)["status"]["podIP"]
    chief_ip = psjobs.running_pod(k8s, namespace, name, "chief")["status"]["podIP"]
    worker_pod = psjobs.running_pod(k8s, namespace, name, "worker", 0)["metadata"]["name"]
    worker = Pod(kubeconfig, namespace, worker_pod, "trainer")
    operator = Pod(kubeconfig, release, operator_pod(k8s, release)["metadata"]["name"], "operator")
    other = Pod(kubeconfig, *outsider, "probe")
    wait_for(
        lambda: _policies_enforced(enforcer, namespace, name),
        timeout=60,
        message="the job's policies on the nodes",
    )

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


@pytest.mark.usefixtures("release")
def test_the_example_trains_to_succeeded_with_its_policies_enforced(
    kubeconfig: Path, k8s: client.ApiClient, enforcer: Enforcer, namespace: str, figures: Figures
) -> None:
    name, _ = _apply(kubeconfig, namespace, TRAIN_STEPS)
    wait_for(
        lambda: _policies_enforced(enforcer, namespace, name),
        timeout=120,
        interval=1,
        message="the job's policies on the node",
    )
    done = psjobs.wait_phase(k8s, namespace, name, "Succeeded", timeout=600)
    assert done.get("step") == TRAIN_STEPS, done
    figures.record("NetworkPolicy enforced: the example trains", "Succeeded")
