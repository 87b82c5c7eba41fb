"""Jobs the API server accepts that can never run: an image that does not exist, a checkpoint claim
that does not exist, a GPU request no node satisfies, a node selector nothing matches.

Each ends with a clear condition and event and a bounded outcome (Failed, its pods stopped), the
operator neither crashes nor spins. KWOK plays the kubelet that cannot pull an image under the
reserved `.invalid` TLD (e2e/cluster/kwok-stages.yaml); the scheduler and the operator are real.
"""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client

from e2e import psjobs
from e2e.operator_process import OperatorProcess
from e2e.util import condition, free_port, holds_for, wait_for

pytestmark = pytest.mark.usefixtures("kwok_only")

MISSING_CLAIM = {"dir": "/checkpoints", "volume": {"persistentVolumeClaim": {"claimName": "missing"}}}
NOWHERE = {
    "template": {
        "spec": {"nodeSelector": {"psoperator.io/pool": "nowhere"}, "containers": [{"name": "trainer"}]}
    }
}
GPU_CHIEF = {
    "template": {
        "spec": {
            "tolerations": [psjobs.GPU_TOLERATION],
            "containers": [{"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": 64}}}],
        }
    }
}


@dataclass(frozen=True)
class NeverRuns:
    id: str
    spec: dict[str, Any]
    reason: str  # of the Failed condition and lastFailure
    says: str  # in the condition's message: the cause, in the scheduler's or the kubelet's words
    pod_reason: str = "Unschedulable"  # status.lastFailure.reason: what the pod showed


UNSCHEDULABLE = {"failurePolicy": {"schedulingTimeoutSeconds": 3}}
CASES = [
    NeverRuns("missing-claim", {"checkpoint": MISSING_CLAIM, **UNSCHEDULABLE}, "Unschedulable",
              'persistentvolumeclaim "missing" not found'),
    NeverRuns("gpu-no-node-has", {"chief": GPU_CHIEF, **UNSCHEDULABLE}, "Unschedulable",
              "Insufficient nvidia.com/gpu"),
    NeverRuns("node-selector-matches-nothing", {"ps": NOWHERE, **UNSCHEDULABLE}, "Unschedulable",
              "didn't match Pod's node affinity/selector"),
    NeverRuns("image-does-not-exist", {"image": "registry.invalid/ctr-trainer:1",
                                       "failurePolicy": {"startupErrorGraceSeconds": 2}},
              "StartupError", "ErrImagePull", pod_reason="ErrImagePull"),
]  # fmt: skip


def _warnings(k8s: client.ApiClient, namespace: str) -> dict[str, int]:
    """Warning events on the job, reason -> count (the API server aggregates repeats into count)."""
    events = client.CoreV1Api(k8s).list_namespaced_event(namespace, field_selector="involvedObject.name=ctr")
    counts: dict[str, int] = {}
    for event in events.items:
        if event.type == "Warning":
            reason = str(event.reason)
            counts[reason] = counts.get(reason, 0) + (event.count or 1)
    return counts


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_job_that_can_never_run_fails_with_the_cause(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess, case: NeverRuns
) -> None:
    psjobs.create(k8s, namespace, psjobs.manifest("ctr", **case.spec))
    status = psjobs.wait_phase(k8s, namespace, "ctr", "Failed", timeout=60)
    failed = condition(status, "Failed")
    assert failed is not None and failed["reason"] == case.reason, failed
    assert case.says in failed["message"], failed["message"]
    assert status["lastFailure"]["reason"] == case.pod_reason
    # Events follow the status write that decided them.
    wait_for(lambda: case.reason in _warnings(k8s, namespace), timeout=10, message=f"a {case.reason} event")
    # Bounded: the parameter servers and workers are scaled down, and nothing comes back.
    apps = client.AppsV1Api(k8s)

    def scaled_down() -> bool:
        sets = [apps.read_namespaced_stateful_set(f"ctr-{role}", namespace) for role in ("ps", "worker")]
        return all(s.spec.replicas == 0 for s in sets)

    wait_for(scaled_down, timeout=30, message="the PS and worker StatefulSets scaled to 0")
    holds_for(lambda: psjobs.status(k8s, namespace, "ctr")["phase"] == "Failed", 3, message="stays Failed")
    assert operator.running


def _reconciles(port: int, outcome: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    series = f'psoperator_reconciles_total{{outcome="{outcome}"}} '
    [value] = [float(x.removeprefix(series)) for x in text.splitlines() if x.startswith(series)]
    return value


# The operator's default --resync-seconds; how long the waiting job is left to settle after its
# condition is written, then watched.
RESYNC_SECONDS, SETTLE, WATCHED = 10, 5, 20


def test_without_a_scheduling_timeout_a_job_waits_told_once_and_without_spinning(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """No schedulingTimeoutSeconds: pods wait for room (an autoscaler may add it); the condition and
    one event say why, and the operator reconciles at its resync pace, not in a loop."""
    port = free_port()
    operator.stop()
    operator.extra_args += ["--metrics-port", str(port)]
    operator.start()
    psjobs.create(k8s, namespace, psjobs.manifest("ctr", checkpoint=MISSING_CLAIM))

    def unschedulable() -> dict[str, Any] | None:
        found = condition(psjobs.status(k8s, namespace, "ctr"), "Unschedulable")
        return found if found and found["status"] == "True" else None

    told = wait_for(unschedulable, timeout=60, message="the Unschedulable condition")
    assert 'persistentvolumeclaim "missing" not found' in told["message"]

    def waits() -> bool:
        return psjobs.status(k8s, namespace, "ctr")["phase"] in ("Pending", "Creating")

    holds_for(waits, SETTLE)  # the reconciles that follow the condition's own write come first
    before = _reconciles(port, "ok")
    holds_for(waits, WATCHED)
    done = _reconciles(port, "ok") - before  # one a resync; a loop would make dozens
    assert done <= WATCHED / RESYNC_SECONDS + 1, f"{done:.0f} reconciles in {WATCHED} s of a job that waits"
    assert _warnings(k8s, namespace) == {"Unschedulable": 1}
    assert _reconciles(port, "error") == 0
