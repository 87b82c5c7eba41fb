"""The jobs' NetworkPolicies enforced on the kind cluster by kube-router (the node image's CNI,
e2e/cluster/kind/kube-router.yaml: iptables and ipset on each node), across nodes:

- a pod of another namespace is refused by a parameter server's gRPC port, while a worker of the
  same job (on the GPU node) connects;
- the chief's progress port answers the operator's namespace and refuses every other pod, the
  job's own included;
- `spec.networkPolicy.enabled: false` on the running job lets the other namespace in; enabled
  again, it is refused again;
- deleting the job removes its rules and sets from the nodes.

The example trains to Succeeded with its policies enforced in test_training.py.

The rules are read where kube-router writes them (e2e/real/enforcers.py). On a cluster whose CNI
is not kube-router (kind's stock kindnetd) these tests are unavailable, with the reason.
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

from e2e import psjobs
from e2e.kubectl import _kubectl, kubectl
from e2e.real import enforcers, example
from e2e.real.conftest import Figures, operator_pod
from e2e.real.enforcers import Enforcer
from e2e.util import unavailable, wait_for
from psoperator.contract import DEFAULT_PROGRESS_PORT

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
        lambda: enforcer.enforces(namespace, name),
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
