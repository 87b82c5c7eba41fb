"""The jobs' NetworkPolicies enforced on the real node, by kube-router's policy controller (iptables
and ipset, started by e2e/cluster/realnode.sh; the CNI bridge plugin enforces none):

- a pod of another namespace is refused by a parameter server's gRPC port, while a worker of the
  same job connects;
- the chief's progress port answers the operator's namespace and refuses every other pod, the
  job's own included;
- `spec.networkPolicy.enabled: false` on the running job lets the other namespace in; enabled
  again, it is refused again;
- deleting the job removes its rules and sets from the node;
- the example trains to Succeeded with its policies enforced (its cluster forms over cluster DNS).

They skip, with the reason, only where the kernel cannot load kube-router's rules (`realnode.sh
enforcer` tries them in a throw-away network namespace); a missing enforcer fails in CI.
"""

from __future__ import annotations

import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from e2e import psjobs
from e2e.kubectl import _kubectl, kubectl
from e2e.real import example
from e2e.real.commands import REALNODE_SH
from e2e.real.conftest import Figures, operator_pod
from e2e.util import unavailable, wait_for
from psoperator.contract import DEFAULT_PROGRESS_PORT

LONG = 1_000_000  # steps: trains for as long as the test probes
TRAIN_STEPS = 1_200
# `realnode.sh enforcer`: 0 ready, 1 not ready, 2 not built or installed, 3 this kernel cannot run it.
READY, MISSING, KERNEL_CANNOT = 0, 2, 3
# A connection the policies refuse is rejected at once; one they allow is accepted at once.
CONNECT_TIMEOUT = 3


def _enforcer() -> tuple[int, str]:
    result = subprocess.run(
        ["bash", str(REALNODE_SH), "enforcer"], capture_output=True, text=True, timeout=60, check=False
    )
    return result.returncode, (result.stdout + result.stderr).strip()


@pytest.fixture(scope="module")
def enforcer(kubeconfig: Path) -> None:
    """The node's enforcer, synced and serving; the test is skipped where the kernel cannot run it."""
    code, why = _enforcer()
    if code == KERNEL_CANNOT:  # the host's kernel, not a missing install: nothing to fix here
        pytest.skip(why)
    if code == MISSING:
        unavailable(why)
    wait_for(lambda: _enforcer()[0] == READY, timeout=60, message=lambda: f"the enforcer: {_enforcer()[1]}")


def _still_ready() -> None:
    """Asserted at the end of each test: no sync of the enforcer was aborted meanwhile."""
    code, why = _enforcer()
    assert code == READY, why


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


def _rules(namespace: str) -> list[str]:
    """The node's filter rules that kube-router wrote for the namespace's pods and policies (their
    comments name it: "... namespace: NS" for a pod, "... namespace NS" for a policy)."""
    saved = subprocess.run(
        ["iptables-save", "-t", "filter"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    named = re.compile(rf'namespace:? {re.escape(namespace)}[" ]')
    return [line for line in saved.splitlines() if named.search(line)]


def _sets(rules: list[str]) -> set[str]:
    return set(re.findall(r"--match-set (\S+)", "\n".join(rules)))


def _live_sets() -> set[str]:
    listed = subprocess.run(["ipset", "list", "-n"], capture_output=True, text=True, timeout=30, check=True)
    return set(listed.stdout.split())


def _apply(kubeconfig: Path, namespace: str, steps: int) -> tuple[str, int]:
    """The example, applied; its name and gRPC port."""
    docs = example.manifests(namespace, steps)
    kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(docs))
    job = next(d for d in docs if d["kind"] == "PSTrainingJob")
    return str(job["metadata"]["name"]), int(job["spec"]["port"])


def _policies_enforced(namespace: str, name: str) -> bool:
    rules = "\n".join(_rules(namespace))
    policies = (f"{name}-peers", f"{name}-chief-progress")
    return all(f"policy name {policy} namespace" in rules for policy in policies)


@pytest.mark.usefixtures("enforcer")
def test_another_namespace_is_refused_until_the_policies_are_switched_off_and_the_rules_go_with_the_job(
    kubeconfig: Path,
    k8s: client.ApiClient,
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
        lambda: _policies_enforced(namespace, name), timeout=60, message="the job's policies on the node"
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

    rules = _rules(namespace)
    sets = _sets(rules)
    assert sets, rules
    client.CustomObjectsApi(k8s).delete_namespaced_custom_object(
        psjobs.GROUP, psjobs.VERSION, namespace, psjobs.PLURAL, name
    )
    wait_for(
        lambda: not _rules(namespace) and not sets & _live_sets(),
        timeout=180,
        interval=1,
        message=lambda: f"the job's rules and sets gone: {_rules(namespace)}, {sets & _live_sets()}",
    )
    _still_ready()


@pytest.mark.usefixtures("enforcer", "release")
def test_the_example_trains_to_succeeded_with_its_policies_enforced(
    kubeconfig: Path, k8s: client.ApiClient, namespace: str, figures: Figures
) -> None:
    name, _ = _apply(kubeconfig, namespace, TRAIN_STEPS)
    wait_for(
        lambda: _policies_enforced(namespace, name),
        timeout=120,
        interval=1,
        message="the job's policies on the node",
    )
    done = psjobs.wait_phase(k8s, namespace, name, "Succeeded", timeout=600)
    assert done.get("step") == TRAIN_STEPS, done
    figures.record("NetworkPolicy enforced: the example trains", "Succeeded")
    _still_ready()
